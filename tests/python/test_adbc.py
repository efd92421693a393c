"""A Flight SQL client (ADBC, unchanged) against an embedded Gyre cluster."""
import os
import subprocess
import sys
import time

import adbc_driver_flightsql.dbapi as flightsql


def wait_for(uri, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gyre exited early with {proc.returncode}")
        try:
            conn = flightsql.connect(uri)
            with conn.cursor() as cur:
                cur.execute("select count(*) from lineitem")
                # The table may be there before all its rows are.
                if cur.fetchall() == [(60175,)]:
                    return conn
            conn.close()
            time.sleep(0.5)
        except Exception:
            time.sleep(0.5)
    raise RuntimeError("the cluster did not come up")


def plan(cur, sql):
    cur.execute("EXPLAIN " + sql)
    return "\n".join(str(r[0]) for r in cur.fetchall())


def setting(cur, name):
    cur.execute(f"SHOW {name}")
    return cur.fetchall()[0][1]


def sessions_are_separate(uri):
    """Two ADBC connections, each with its own SETs, each get their own plans."""
    join = (
        "SELECT p_name, l_quantity FROM part JOIN lineitem "
        "ON p_partkey = l_partkey"
    )
    a, b = flightsql.connect(uri), flightsql.connect(uri)
    with a.cursor() as ca, b.cursor() as cb:
        ca.execute("SET gyre.join_strategy = 'shuffle'")
        ca.execute("SET gyre.skew_detection = off")
        ca.execute("SET datafusion.execution.batch_size = 1000")
        cb.execute("SET gyre.join_strategy = 'shuffle'")
        plan_a, plan_b = plan(ca, join), plan(cb, join)
        assert "FlowJoinExec" not in plan_a, plan_a
        assert "FlowJoinExec" in plan_b, plan_b
        assert setting(ca, "datafusion.execution.batch_size") == "1000"
        assert setting(cb, "datafusion.execution.batch_size") == "8192"
        assert setting(ca, "gyre.skew_detection") == "off"
        assert setting(cb, "gyre.skew_detection") == "on"
        for cur in (ca, cb):
            cur.execute(f"SELECT count(*) FROM ({join})")
            assert cur.fetchall() == [(60175,)]
        try:
            ca.execute("SET gyre.skew_detection = maybe")
            raise AssertionError("a wrong value must fail")
        except flightsql.Error as e:
            assert "on or off" in str(e), e
    a.close()
    b.close()


def transactions_commit_per_connection(uri):
    """BEGIN ... COMMIT on a transactional table: another connection sees the change
    only once it commits, and never a rolled-back one."""
    a, b = flightsql.connect(uri), flightsql.connect(uri)
    with a.cursor() as ca, b.cursor() as cb:
        ca.execute(
            "CREATE TABLE acc (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL) "
            "WITH (replication = 'full')"
        )
        ca.execute("INSERT INTO acc VALUES (1, 100), (2, 100)")
        ca.execute("BEGIN")
        ca.execute("UPDATE acc SET balance = balance - 10 WHERE id = 1")
        ca.execute("UPDATE acc SET balance = balance + 10 WHERE id = 2")
        ca.execute("SELECT balance FROM acc ORDER BY id")
        assert ca.fetchall() == [(90,), (110,)]
        cb.execute("SELECT balance FROM acc ORDER BY id")
        assert cb.fetchall() == [(100,), (100,)]
        ca.execute("COMMIT")
        cb.execute("SELECT balance FROM acc ORDER BY id")
        assert cb.fetchall() == [(90,), (110,)]
        ca.execute("BEGIN")
        ca.execute("DELETE FROM acc")
        ca.execute("ROLLBACK")
        cb.execute("SELECT count(*) FROM acc")
        assert cb.fetchall() == [(2,)]
    a.close()
    b.close()


def main():
    gyre = os.environ.get("GYRE_BIN", "target/release/gyre")
    port = os.environ.get("GYRE_PORT", "50071")
    proc = subprocess.Popen(
        [gyre, "local", "--workers", "2", "--tpch", "0.01", "--listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL,
    )
    try:
        conn = wait_for(f"grpc://127.0.0.1:{port}", proc)
        with conn.cursor() as cur:
            cur.execute(
                "select l_returnflag, l_linestatus, count(*) as n from lineitem "
                "group by l_returnflag, l_linestatus order by 1, 2"
            )
            table = cur.fetch_arrow_table()
            assert table.column_names == ["l_returnflag", "l_linestatus", "n"], table.column_names
            rows = table.to_pylist()
            assert len(rows) == 4, rows
            assert sum(r["n"] for r in rows) == 60175, rows
            cur.execute("create table t (k int primary key, v varchar)")
            cur.execute("insert into t values (1, 'a'), (2, 'b'), (3, null)")
            cur.execute("select k, v from t order by k")
            assert cur.fetchall() == [(1, "a"), (2, "b"), (3, None)]
            try:
                cur.execute("select no_such_column from t")
                raise AssertionError("a bad query must fail")
            except flightsql.Error as e:
                assert "no_such_column" in str(e), e
        sessions_are_separate(f"grpc://127.0.0.1:{port}")
        transactions_commit_per_connection(f"grpc://127.0.0.1:{port}")
        conn.close()
        print("3 passed, 0 failed")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
