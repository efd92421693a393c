"""TPC-H in DuckDB, for `gyre local --tpch SF --bench tpch`.

Usage: tpch_duckdb.py SF THREADS

Generates TPC-H at scale factor SF in an in-memory DuckDB database with its tpch
extension (dbgen, the same data as Gyre's generator) and prints one JSON line:
{"tables": [[name, rows], ...]}. Then it serves timing requests, one JSON object per
stdin line, {"setup": [...], "query": "...", "teardown": [...], "iterations": N}: it
runs the setup statements, the query N times and the teardown statements, and answers
with one JSON line, {"ms": [...], "rows": R} or {"error": "..."}. DuckDB runs with
THREADS threads.
"""

import json
import os
import sys
import time

import duckdb
import duckdb_extension_tpch


def main():
    sf, threads = float(sys.argv[1]), int(sys.argv[2])
    extension = os.path.join(
        os.path.dirname(duckdb_extension_tpch.__file__),
        "extensions",
        "v" + duckdb.__version__,
        "tpch.duckdb_extension",
    )
    con = duckdb.connect(config={"threads": threads})
    # Its progress bar would write to stdout, which carries the answers.
    con.execute("SET enable_progress_bar = false")
    con.execute(f"LOAD '{extension}'")
    con.execute(f"CALL dbgen(sf={sf})")
    tables = []
    for (name,) in con.execute("SHOW TABLES").fetchall():
        rows = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
        tables.append([name, rows])
    print(json.dumps({"tables": tables}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            for s in request["setup"]:
                con.execute(s)
            times, rows = [], 0
            for _ in range(request["iterations"]):
                start = time.perf_counter()
                rows = len(con.execute(request["query"]).fetchall())
                times.append((time.perf_counter() - start) * 1e3)
            for s in request["teardown"]:
                con.execute(s)
            print(json.dumps({"ms": times, "rows": rows}), flush=True)
        except Exception as e:  # reported to the caller, which goes on without DuckDB
            print(json.dumps({"error": str(e)}), flush=True)


if __name__ == "__main__":
    main()
