"""DuckDB for Gyre's TPC-H and TPC-DS benchmarks: data, query texts and DuckDB's times.

Usage:
  duckdb_bench.py tpcds SF OUT_DIR THREADS   for `gyre bench tpcds`
  duckdb_bench.py tpch SF THREADS            for `gyre local --tpch SF --bench tpch`

tpcds: generates TPC-DS at scale factor SF with the tpcds extension in an in-memory
database, writes each of the 24 tables to OUT_DIR/TABLE.parquet and the 99 query
texts to OUT_DIR/queries/NN.sql, and prints one JSON line: {"tables": [[name, rows],
...]}. Then it serves timing requests, one per stdin line, "QUERY ITERATIONS",
answering each with one JSON line: {"ms": [...]} or {"error": "..."}.

tpch: generates TPC-H at scale factor SF with the tpch extension (dbgen, the same data
as Gyre's generator) and prints {"tables": [[name, rows], ...]}. Then it serves timing
requests, one JSON object per stdin line, {"setup": [...], "query": "...", "teardown":
[...], "iterations": N}: it runs the setup statements, the query N times and the
teardown statements, and answers {"ms": [...], "rows": R} or {"error": "..."}.

DuckDB runs in memory with THREADS threads.
"""

import json
import os
import sys
import time

import duckdb


def connect(extension_module, name, threads):
    """An in-memory database with the extension `name` loaded from its pip package."""
    extension = os.path.join(
        os.path.dirname(extension_module.__file__),
        "extensions",
        "v" + duckdb.__version__,
        f"{name}.duckdb_extension",
    )
    con = duckdb.connect(config={"threads": threads})
    # Its progress bar would write to stdout, which carries the answers.
    con.execute("SET enable_progress_bar = false")
    con.execute(f"LOAD '{extension}'")
    return con


def table_rows(con):
    return [
        [name, con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]]
        for (name,) in con.execute("SHOW TABLES").fetchall()
    ]


def tpcds(sf, out_dir, threads):
    import duckdb_extension_tpcds

    con = connect(duckdb_extension_tpcds, "tpcds", threads)
    con.execute(f"CALL dsdgen(sf={sf})")
    tables = table_rows(con)
    for name, _ in tables:
        path = os.path.join(out_dir, f"{name}.parquet")
        con.execute(f"COPY {name} TO '{path}' (FORMAT parquet)")
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


def tpch(sf, threads):
    import duckdb_extension_tpch

    con = connect(duckdb_extension_tpch, "tpch", threads)
    con.execute(f"CALL dbgen(sf={sf})")
    print(json.dumps({"tables": table_rows(con)}), flush=True)
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
    if sys.argv[1] == "tpcds":
        tpcds(float(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        tpch(float(sys.argv[2]), int(sys.argv[3]))
