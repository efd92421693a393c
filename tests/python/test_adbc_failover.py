"""An ADBC client (unchanged) of three voting coordinators: a standby answers with an
error naming the primary, the client connects there and its retry works; after
kill -9 of the primary, the survivors name the new one and the retry works again,
and the new primary has loaded the table on files again from the replicated
catalog."""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import adbc_driver_flightsql.dbapi as flightsql

NAMED = re.compile(r"the primary is at ([0-9.]+:[0-9]+)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(addr, sql):
    """The rows of `sql` on the coordinator at `addr` (errors raise)."""
    conn = flightsql.connect(f"grpc://{addr}")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def through_named_primary(addrs, sql, timeout=60):
    """Runs `sql` as a client that knows only `addrs` would: on an error naming the
    primary it connects there and tries again. Returns the rows, the address that
    answered and the errors seen on the way."""
    deadline = time.time() + timeout
    errors = []
    while time.time() < deadline:
        for addr in addrs:
            try:
                return run(addr, sql), addr, errors
            except Exception as e:  # noqa: BLE001 - any refusal is retried
                errors.append(str(e))
                named = NAMED.search(str(e))
                if named is None:
                    continue
                try:
                    return run(named.group(1), sql), named.group(1), errors
                except Exception as again:  # noqa: BLE001
                    errors.append(str(again))
        time.sleep(0.3)
    raise RuntimeError(f"no primary answered within {timeout} s: {errors[-5:]}")


def main():
    gyre = os.environ.get("GYRE_BIN", "target/release/gyre")
    env = dict(os.environ, GYRE_SECRET="adbc failover test's cluster secret")
    clients = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    voters = ",".join(f"{c}/127.0.0.1:{free_port()}" for c in clients)
    dirs = [tempfile.mkdtemp(prefix="gyre-voter-") for _ in clients]
    procs = {}

    def voter(i):
        procs[i] = subprocess.Popen(
            [gyre, "coordinator", "--listen", clients[i], "--data-dir", dirs[i],
             "--voters", voters],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
        )

    for i in range(3):
        voter(i)
    worker = subprocess.Popen(
        [gyre, "worker", "--coordinator", ",".join(clients), "--threads", "1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
    )
    try:
        rows, primary, _ = through_named_primary(
            clients, "SELECT count(*) FROM gyre_workers()"
        )
        # A standby refuses, naming the primary.
        standby = next(c for c in clients if c != primary)
        try:
            run(standby, "SELECT 1")
            raise AssertionError("a standby answered a query")
        except flightsql.Error as e:
            named = NAMED.search(str(e))
            assert named is not None and named.group(1) == primary, e
        run(primary, "CREATE TABLE acc (id BIGINT PRIMARY KEY, b BIGINT) "
                     "WITH (replication = 'full')")
        run(primary, "INSERT INTO acc VALUES (1, 100), (2, 100)")
        # A table on a file: its definition is in the replicated catalog.
        csv = os.path.join(dirs[0], "ext.csv")
        with open(csv, "w") as f:
            f.write("a\n" + "\n".join(str(i) for i in range(1, 1001)) + "\n")
        run(primary, f"CREATE EXTERNAL TABLE ext (a BIGINT) STORED AS CSV LOCATION '{csv}' "
                     "OPTIONS ('format.has_header' 'true')")
        # kill -9 of the primary: the others elect a new one and name it.
        dead = clients.index(primary)
        procs[dead].kill()
        procs[dead].wait()
        left = [c for c in clients if c != primary]
        rows, new_primary, errors = through_named_primary(
            left, "SELECT sum(b) FROM acc"
        )
        assert rows == [(200,)], rows
        assert new_primary in left, new_primary
        # The new primary loads the table on the file again.
        rows, _, _ = through_named_primary(left, "SELECT count(*), sum(a) FROM ext")
        assert rows == [(1000, 500500)], rows
        run(new_primary, "UPDATE acc SET b = b - 10 WHERE id = 1")
        assert run(new_primary, "SELECT b FROM acc ORDER BY id") == [(90,), (100,)]
        print(f"3 passed, 0 failed (after the kill, {len(errors)} refusals before "
              f"the new primary at {new_primary} answered)")
    finally:
        worker.kill()
        for p in procs.values():
            p.kill()
            p.wait()
        worker.wait()


if __name__ == "__main__":
    sys.exit(main())
