#!/usr/bin/env python3
"""Neo-Join on TPC-H in generation order, on an emulated cluster (needs root).

Writes TPC-H Parquet files in generation order (dbgen's parts, with `gyre bench
load`'s writer) when DATA holds none, builds `gyre cluster up --nodes N --link LINK
--cpus C --data-root DATA`, and loads every table where its files are read: worker i
reads the i-th run of each table's files, so orders and lineitem of one order-key
range share a worker and part is clustered by part key (the time-of-creation
clustering the thesis exploits; lineitem has none on the part key). Then runs the
queries (default Q12, Q14, Q19; `agg18` is Q18's GROUP BY l_orderkey on its own,
whose groups lie on one worker each, `aggcust` a GROUP BY o_custkey, whose groups
are spread over all) with each `gyre.join_strategy` in turn (default neo,
shuffle, broadcast; `auto:off` is auto with gyre.neo_min_saving = off, so auto
without run-time Neo-Joins), REPEAT rounds, the strategies' order rotating from round to
round. Times are `gyre sql --timing`'s: statement sent to results fetched, through
Flight SQL from the client host. Every answer is checked against DuckDB's on the same
files (query texts from DuckDB's tpch extension).

Reports per query and strategy the median time and, paired within each round, the
speedup of neo over each other strategy (their time over neo's), as a table and JSON.

Usage: scripts/bench_neo_tpch.py [--nodes 4] [--cpus 0.45] [--link 1gbit] [--sf 1]
       [--files 8] [--data /tmp/tpch-sf1-gen] [--queries 12,14,19]
       [--strategies neo,shuffle,broadcast] [--repeat 3] [--json PATH]
"""

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from emulated_cluster import Cluster, Failure  # noqa: E402

TABLES = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"]
DUCKDB_DIR = os.path.expanduser("~/.cache/gyre/python-duckdb-1.5.5")
# Queries beside TPC-H's, by name.
EXTRA = {
    "agg18": "SELECT l_orderkey, sum(l_quantity) AS q FROM lineitem GROUP BY l_orderkey "
             "HAVING sum(l_quantity) > 300 ORDER BY l_orderkey",
    # Groups spread over every worker (orders lie by order key): no locality.
    "aggcust": "SELECT o_custkey, count(*) AS n, sum(o_totalprice) AS p FROM orders "
               "GROUP BY o_custkey HAVING count(*) > 30 ORDER BY o_custkey",
}


def ensure_files(gyre, data, sf, files):
    """TPC-H Parquet files in DATA/<table>/part-<i>.parquet, written if missing."""
    lineitem = os.path.join(data, "lineitem")
    if os.path.isdir(lineitem) and any(f.endswith(".parquet") for f in os.listdir(lineitem)):
        return
    print(f"writing TPC-H SF {sf} as {files} files per table to {data} ...", file=sys.stderr)
    subprocess.run(
        [gyre, "bench", "load", "--tpch-parquet", data, "--sf", str(sf), "--files", str(files),
         "--workers", "1", "--repeat", "1", "--placement", "chunked", "--no-duckdb"],
        check=True, stdout=subprocess.DEVNULL,
    )


def duckdb_reference(data, queries):
    """{q: (text, rows)}: DuckDB's query text and its answer over the same files."""
    if not os.path.isdir(DUCKDB_DIR):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", DUCKDB_DIR,
             "duckdb==1.5.5", "duckdb-extension-tpch==1.5.5"],
            check=True,
        )
    sys.path.insert(0, DUCKDB_DIR)
    import duckdb_extension_tpch
    from duckdb_bench import connect

    con = connect(duckdb_extension_tpch, "tpch", 2)
    for t in TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{data}/{t}/*.parquet')")
    out = {}
    for q in queries:
        if q in EXTRA:
            text = EXTRA[q]
        else:
            (text,) = con.execute(
                f"SELECT query FROM tpch_queries() WHERE query_nr = {q}").fetchone()
        out[q] = (text, [tuple(r) for r in con.execute(text).fetchall()])
    return out


def same_answer(csv_text, expected):
    """Whether Gyre's CSV answer has DuckDB's rows (numbers to the cent, as TPC-H's
    answer checks round money, or to a relative 1e-6)."""
    rows = list(csv.reader(io.StringIO(csv_text)))[1:]
    if len(rows) != len(expected):
        return False
    for got, want in zip(rows, expected):
        if len(got) != len(want):
            return False
        for g, w in zip(got, want):
            if isinstance(w, (int, float)) or type(w).__name__ == "Decimal":
                w = float(w)
                if abs(float(g) - w) > max(0.005, 1e-6 * abs(w)):
                    return False
            elif str(w) != g:
                return False
    return True


def split_output(out):
    """`gyre sql --format csv --timing` output: [(csv text, ms)] per statement."""
    parts, current = [], []
    for line in out.splitlines(keepends=True):
        if line.startswith("Time: ") and line.rstrip().endswith(" ms"):
            parts.append(("".join(current), float(line[len("Time: "):-len(" ms") - 1])))
            current = []
        else:
            current.append(line)
    return parts


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--cpus", default="0.45")
    p.add_argument("--link", default="1gbit")
    p.add_argument("--sf", type=float, default=1.0)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--data", default="/tmp/tpch-sf1-gen")
    p.add_argument("--queries", default="12,14,19")
    p.add_argument("--strategies", default="neo,shuffle,broadcast")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--name", default="neotpch")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/gyre-target"))
    p.add_argument("--gyre", default=os.path.join(target, "release", "gyre"))
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_neo_tpch.py builds an emulated cluster: run it as root")
    queries = [q if q in EXTRA else int(q) for q in a.queries.split(",")]
    strategies = a.strategies.split(",")
    data = os.path.abspath(a.data)
    ensure_files(a.gyre, data, a.sf, a.files)
    reference = duckdb_reference(data, queries)

    cluster = Cluster(a.gyre, a.name, "10.214.0.0", a.nodes, a.cpus, a.link)
    cluster.up.extend(["--data-root", data])
    cluster.start()
    times = {(q, s): [] for q in queries for s in strategies}
    try:
        for t in TABLES:
            cluster.sql(f"CREATE EXTERNAL TABLE {t} STORED AS PARQUET LOCATION '{data}/{t}/'")
        for rnd in range(a.repeat + 1):  # round 0 warms up, unreported
            for i in range(len(strategies)):
                s = strategies[(i + rnd) % len(strategies)]
                strategy, _, saving = s.partition(":")
                settings = [f"SET gyre.join_strategy = '{strategy}'"]
                if saving:
                    settings.append(f"SET gyre.neo_min_saving = '{saving}'")
                script = ";\n".join(settings + [
                    reference[q][0].rstrip().rstrip(";") for q in queries]) + ";"
                cmd = ["ip", "netns", "exec", f"gyre-{a.name}-c", a.gyre, "sql", "--connect",
                       cluster.addr, "--format", "csv", "--timing", "-c", script]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    raise Failure(f"{s}: exit {out.returncode}\n{out.stderr}")
                parts = split_output(out.stdout)[len(settings):]  # the SETs first
                if len(parts) != len(queries):
                    raise Failure(f"{s}: {len(parts)} timed answers for {len(queries)} queries")
                for q, (answer, ms) in zip(queries, parts):
                    if not same_answer(answer, reference[q][1]):
                        raise Failure(f"Q{q} with {s}: Gyre answered\n{answer}\n"
                                      f"DuckDB: {reference[q][1]}")
                    if rnd > 0:
                        times[(q, s)].append(ms)
                print(f"round {rnd}, {s}: " + ", ".join(
                    f"Q{q} {ms:.0f} ms" for q, (_, ms) in zip(queries, parts)), file=sys.stderr)
    finally:
        cluster.stop()

    base = strategies[0]
    rows = []
    for q in queries:
        for s in strategies:
            speedups = [o / b for o, b in zip(times[(q, s)], times[(q, base)])]
            rows.append({"query": q, "strategy": s, "median_ms": statistics.median(times[(q, s)]),
                         "times_ms": times[(q, s)],
                         f"speedup_of_{base}": statistics.median(speedups), "speedups": speedups})
    print(f"TPC-H SF {a.sf} in generation order, {a.nodes} hosts at {a.link}, {a.cpus} CPU "
          f"each; medians of {a.repeat} rounds; answers checked against DuckDB")
    print(f"{'query':>5} {'strategy':>10} {'median ms':>10} {'speedup of ' + base:>18}  (per round)")
    for r in rows:
        print(f"{r['query']:>5} {r['strategy']:>10} {r['median_ms']:>10.1f} "
              f"{r[f'speedup_of_{base}']:>18.2f}  "
              + ", ".join(f"{x:.2f}" for x in r["speedups"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"nodes": a.nodes, "link": a.link, "cpus": a.cpus, "sf": a.sf,
                       "rounds": a.repeat, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
