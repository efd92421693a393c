"""TPC-DS from DuckDB's tpcds extension, for `gyre bench tpcds`.

Usage: tpcds_duckdb.py SF OUT_DIR THREADS

Generates TPC-DS at scale factor SF in an in-memory DuckDB database, writes each of
the 24 tables to OUT_DIR/TABLE.parquet and the 99 query texts to
OUT_DIR/queries/NN.sql, and prints one JSON line: {"tables": [[name, rows], ...]}.
Then it serves timing requests, one per stdin line, "QUERY ITERATIONS", answering
each with one JSON line: {"ms": [...]} or {"error": "..."}. DuckDB runs the queries
on the same generated data, in memory, with THREADS threads.
"""

import json
import os
import sys
import time

import duckdb
import duckdb_extension_tpcds


def main():
    sf, out_dir, threads = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    extension = os.path.join(
        os.path.dirname(duckdb_extension_tpcds.__file__),
        "extensions",
        "v" + duckdb.__version__,
        "tpcds.duckdb_extension",
    )
    con = duckdb.connect(config={"threads": threads})
    # Its progress bar would write to stdout, which carries the answers.
    con.execute("SET enable_progress_bar = false")
    con.execute(f"LOAD '{extension}'")
    con.execute(f"CALL dsdgen(sf={sf})")
    tables = []
    for (name,) in con.execute("SHOW TABLES").fetchall():
        path = os.path.join(out_dir, f"{name}.parquet")
        con.execute(f"COPY {name} TO '{path}' (FORMAT parquet)")
        rows = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
        tables.append([name, rows])
    queries = {}
    os.makedirs(os.path.join(out_dir, "queries"), exist_ok=True)
    for nr, text in con.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall():
        queries[nr] = text
        with open(os.path.join(out_dir, "queries", f"{nr:02}.sql"), "w") as f:
            f.write(text)
    print(json.dumps({"tables": tables}), flush=True)
    for line in sys.stdin:
        nr, iterations = (int(x) for x in line.split())
        try:
            times = []
            for _ in range(iterations):
                start = time.perf_counter()
                con.execute(queries[nr]).fetchall()
                times.append((time.perf_counter() - start) * 1e3)
            print(json.dumps({"ms": times}), flush=True)
        except Exception as e:  # reported to the caller, which goes on without DuckDB
            print(json.dumps({"error": str(e)}), flush=True)


if __name__ == "__main__":
    main()
