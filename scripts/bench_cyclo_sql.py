#!/usr/bin/env python3
"""Cyclo-join through SQL on an emulated cluster (needs root).

Builds `gyre cluster up --nodes N --link LINK --cpus C` and loads deterministic
pseudo-random BIGINT tables (the same rows on every run and every cluster), then runs
each join with `gyre.join_strategy` set to 'cyclo' (CycloJoinExec) and to the other
strategies, alternating, REPEAT times each:

  band-small  r.x BETWEEN s.y - 1000 AND s.y + 1000, 50K x 50K: cyclo (sort-merge band)
              vs broadcast (DataFusion's NestedLoopJoinExec, one input broadcast)
  band-full   the same as a FULL JOIN (both inputs' unmatched rows kept), 50K x 50K:
              cyclo vs DataFusion's NestedLoopJoinExec (which cannot broadcast a full join)
  band-strings the band-small join over tables that also hold a string column (5-50
              bytes) that both sides return: cyclo (the strings travel the ring in the
              fragments' heaps) vs broadcast nested loops
  band-large  r.x BETWEEN s.y - 10 AND s.y + 10, 2M x 2M: cyclo only (the nested-loop
              join would take minutes)
  theta-lt    r.x < s.y with s.y in [0, 20000), 50K x 50K: cyclo (sort-merge inequality)
              vs broadcast nested loops
  theta-mod   (r.x + s.y) % 100000 = 0, 20K x 20K: cyclo (all pairs, a cross product) vs
              broadcast nested loops
  equi        r.x = s.y, 4M x 4M (r.x unique): cyclo (radix hash) vs shuffle (partitioned
              hash join, Flow-Join skew detection left on, the default) vs broadcast hash
  equi-sparse the same keys times 1000003: no longer a dense range, so DataFusion's hash
              join cannot index them directly (its ArrayMap) and hashes them instead

Keys are x = u^2 mod (2^31 - 1) mod DOMAIN with u = (n * 48271 + seed) mod (2^31 - 1).
Every plan is checked with EXPLAIN first. Times are the wall time of `gyre sql -c` (client
start and connection included; `SELECT 1` is timed too, as the floor). Every variant of a
query must return the same count(*) and sum (exit status 1 otherwise). After the timed
runs, EXPLAIN ANALYZE runs once per variant for the server-side time and the cyclo-join's
per-worker setup_time, join_time and sync_time. With --single-node the same tables and queries also
run on a one-host cluster with the CPU of all N hosts together (N x C), in the same
alternation.

Usage: scripts/bench_cyclo_sql.py [--nodes 4] [--cpus 0.45] [--link 10gbit] [--repeat 3]
       [--single-node] [--only band-small,equi] [--json PATH]
"""

import argparse
import csv
import io
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulated_cluster import Cluster, Failure, parse_time  # noqa: E402

P = 2147483647  # 2^31 - 1
SELECT = "SELECT count(*), sum(r.a + s.b) FROM {r} r {join} {s} s ON {on}"


def keys(n, seed, domain):
    """n rows (k, id): k pseudo-random in [0, domain), id = 1..n."""
    return (f"SELECT (u * u) % {P} % {domain}, value FROM (SELECT (value * 48271 + {seed}) % {P} "
            f"AS u, value FROM generate_series(1, {n}) AS t(value))")


def cases(a):
    """name -> tables (name, columns, rows SQL), ON clause, [(strategy, plan regex)]."""
    nlj = ("broadcast", r"NestedLoopJoinExec: join_type=Inner.*broadcast nested-loop join")
    equi_variants = dict(
        variants=[("cyclo", r"CycloJoinExec: kernel=radix hash"),
                  ("shuffle", r"FlowJoinExec: skew detection(.|\n)*HashJoinExec: mode=Partitioned"),
                  ("broadcast", r"HashJoinExec: mode=CollectLeft.*broadcast join")],
        # one worker: 'shuffle' and 'broadcast' both plan DataFusion's CollectLeft hash join
        variants1=[("cyclo", r"CycloJoinExec: kernel=radix hash"),
                   ("shuffle", r"HashJoinExec: mode=CollectLeft")])
    return {
        "band-small": dict(
            rows=(a.band_small, a.band_small),
            tables=[("r_bs", "x", keys(a.band_small, 11, 10**8)),
                    ("s_bs", "y", keys(a.band_small, 22, 10**8))],
            on="r.x BETWEEN s.y - 1000 AND s.y + 1000",
            variants=[("cyclo", r"CycloJoinExec: kernel=sort-merge band"), nlj]),
        "band-full": dict(
            rows=(a.band_small, a.band_small),
            tables=[("r_bf", "x", keys(a.band_small, 12, 10**8)),
                    ("s_bf", "y", keys(a.band_small, 23, 10**8))],
            join="FULL JOIN",
            on="r.x BETWEEN s.y - 1000 AND s.y + 1000",
            variants=[("cyclo", r"CycloJoinExec: kernel=sort-merge band.*join_type=Full"),
                      ("broadcast", r"NestedLoopJoinExec: join_type=Full")]),
        "band-strings": dict(
            rows=(a.band_small, a.band_small),
            tables=[("r_bt", "x", keys(a.band_small, 13, 10**8)),
                    ("s_bt", "y", keys(a.band_small, 24, 10**8))],
            strings=True,
            select="SELECT count(*), sum(length(r.t) + length(s.t)) FROM {r} r {join} {s} s "
                   "ON {on}",
            on="r.x BETWEEN s.y - 1000 AND s.y + 1000",
            variants=[("cyclo", r"CycloJoinExec: kernel=sort-merge band"), nlj]),
        "band-large": dict(
            rows=(a.band_large, a.band_large),
            tables=[("r_bl", "x", keys(a.band_large, 33, 10**8)),
                    ("s_bl", "y", keys(a.band_large, 44, 10**8))],
            on="r.x BETWEEN s.y - 10 AND s.y + 10",
            variants=[("cyclo", r"CycloJoinExec: kernel=sort-merge band")]),
        "theta-lt": dict(
            rows=(a.theta, a.theta),
            tables=[("r_lt", "x", keys(a.theta, 55, 10**8)),
                    ("s_lt", "y", keys(a.theta, 66, 20000))],
            on="r.x < s.y",
            variants=[("cyclo", r"CycloJoinExec: kernel=sort-merge \(l < r\)"), nlj]),
        "theta-mod": dict(
            rows=(a.allpairs, a.allpairs),
            tables=[("r_md", "x", keys(a.allpairs, 77, 10**8)),
                    ("s_md", "y", keys(a.allpairs, 88, 10**8))],
            on="(r.x + s.y) % 100000 = 0",
            variants=[("cyclo", r"CycloJoinExec: kernel=nested loops \(all pairs"), nlj]),
        "equi": dict(
            rows=(a.equi, a.equi),
            tables=[("r_eq", "x", f"SELECT (value * 2654435761) % {a.equi}, value "
                                  f"FROM generate_series(1, {a.equi}) AS t(value)"),
                    ("s_eq", "y", keys(a.equi, 99, a.equi))],
            on="r.x = s.y", **equi_variants),
        "equi-sparse": dict(
            rows=(a.equi, a.equi),
            tables=[("r_es", "x", f"SELECT (value * 2654435761) % {a.equi} * 1000003, value "
                                  f"FROM generate_series(1, {a.equi}) AS t(value)"),
                    ("s_es", "y", f"SELECT k * 1000003, id FROM ({keys(a.equi, 99, a.equi)}) "
                                  f"AS q(k, id)")],
            on="r.x = s.y", **equi_variants),
    }


def variants(case, label):
    return case.get("variants1", case["variants"]) if label == "1 host" else case["variants"]


def setting(strategy):
    return f"SET gyre.join_strategy = '{strategy}';\n"


def result(stdout):
    rows = list(csv.reader(io.StringIO(stdout.strip())))
    return [int(v) if v else None for v in rows[-1]]


def cyclo_metrics(text):
    """Per worker: the CycloJoinExec's metrics (times in seconds)."""
    workers = []
    for m in re.finditer(r"CycloJoinExec: .*?metrics=\[([^\]]*)\]", text):
        w = {}
        for k, v in re.findall(r"(\w+)=([^,]+)", m.group(1)):
            t = re.fullmatch(r"([0-9.]+)(ns|µs|ms|s)", v.strip())
            w[k] = parse_time(*t.groups()) if t else v.strip()
        workers.append(w)
    return workers


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--cpus", default="0.45")
    p.add_argument("--link", default="10gbit")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--band-small", type=int, default=50_000)
    p.add_argument("--band-large", type=int, default=2_000_000)
    p.add_argument("--theta", type=int, default=50_000)
    p.add_argument("--allpairs", type=int, default=20_000)
    p.add_argument("--equi", type=int, default=4_000_000)
    p.add_argument("--only", help="comma-separated cases (default: all)")
    p.add_argument("--single-node", action="store_true",
                   help="also run on one host with NODES x CPUS CPU")
    p.add_argument("--timeout", type=int, default=300, help="seconds per statement")
    p.add_argument("--json")
    p.add_argument("--name", default="cyclosql")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/gyre-target"))
    p.add_argument("--gyre", default=os.path.join(target, "release", "gyre"))
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_cyclo_sql.py builds an emulated cluster: run it as root")
    todo = cases(a)
    if a.only:
        todo = {k: todo[k] for k in a.only.split(",")}

    clusters = {f"{a.nodes} hosts": Cluster(a.gyre, a.name, "10.213.0.0", a.nodes, a.cpus, a.link,
                                            a.timeout)}
    if a.single_node:
        total = f"{a.nodes * float(a.cpus):g}"
        clusters["1 host"] = Cluster(a.gyre, a.name + "1", "10.214.0.0", 1, total, a.link,
                                     a.timeout)
    started = []
    try:
        for c in clusters.values():
            started.append(c)
            c.start()
        out = run(a, todo, clusters)
    except Failure as e:
        print(f"\nFAILED: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        for c in started:
            c.stop()
    report(a, todo, out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if out["mismatches"]:
        print("\nRESULTS DIFFER:", file=sys.stderr)
        for m in out["mismatches"]:
            print(" ", m, file=sys.stderr)
        sys.exit(1)


def run(a, todo, clusters):
    t0 = time.time()
    for label, c in clusters.items():
        stmts = []
        for case in todo.values():
            for table, key, rows in case["tables"]:
                other = "a" if key == "x" else "b"
                if case.get("strings"):
                    stmts.append(
                        f"CREATE TABLE {table} ({key} BIGINT, {other} BIGINT, t VARCHAR) "
                        f"PARTITION BY {other};\nINSERT INTO {table} SELECT k, id, 'row-' || "
                        f"repeat('x', CAST(id % 40 AS INT)) || CAST(id AS VARCHAR) "
                        f"FROM ({rows}) AS q(k, id);")
                else:
                    stmts.append(f"CREATE TABLE {table} ({key} BIGINT, {other} BIGINT) "
                                 f"PARTITION BY {other};\nINSERT INTO {table} {rows};")
        print(f"{label}: loading...", file=sys.stderr)
        c.sql("\n".join(stmts))
    print(f"  loaded in {time.time() - t0:.1f} s", file=sys.stderr)

    out = {"nodes": a.nodes, "cpus": a.cpus, "link": a.link, "repeat": a.repeat,
           "single_node_cpus": f"{a.nodes * float(a.cpus):g}" if a.single_node else None,
           "cases": {}, "plans": {}, "analyze": [], "runs": [], "floor": [], "mismatches": []}
    for name, case in todo.items():
        r, s = case["tables"][0][0], case["tables"][1][0]
        case["sql"] = case.get("select", SELECT).format(r=r, s=s, join=case.get("join", "JOIN"),
                                                       on=case["on"])
        out["cases"][name] = {"sql": case["sql"], "rows": case["rows"]}
        # check every plan first
        for label, c in clusters.items():
            for strategy, want in variants(case, label):
                plan, _ = c.sql(setting(strategy) + "EXPLAIN " + case["sql"])
                joins = [ln.strip(' "') for ln in plan.splitlines() if "Join" in ln]
                out["plans"][f"{name}/{label}/{strategy}"] = joins
                if not re.search(want, plan):
                    raise Failure(f"{name} on {label} with '{strategy}': expected /{want}/ "
                                  f"in the plan, got:\n{plan}")
    for i in range(a.repeat):
        for label, c in clusters.items():
            _, secs = c.sql("SELECT 1")
            out["floor"].append({"cluster": label, "seconds": secs})
        for name, case in todo.items():
            for label, c in clusters.items():
                order = variants(case, label)
                for strategy, _ in (order if i % 2 == 0 else order[::-1]):
                    stdout, secs = c.sql(setting(strategy) + case["sql"])
                    count, total = result(stdout)
                    out["runs"].append({"case": name, "cluster": label, "strategy": strategy,
                                        "repeat": i, "seconds": secs, "count": count,
                                        "sum": total})
                    print(f"  [{i + 1}/{a.repeat}] {name:10} {label:7} {strategy:9} "
                          f"{secs:7.3f} s  count {count} sum {total}", file=sys.stderr)
    # one EXPLAIN ANALYZE per variant, after the timed runs (warm), for the metrics
    for name, case in todo.items():
        for label, c in clusters.items():
            for strategy, _ in variants(case, label):
                text, _ = c.sql(setting(strategy) + "EXPLAIN ANALYZE " + case["sql"])
                server = float(re.search(r"rows in ([0-9.]+) s", text).group(1))
                workers = cyclo_metrics(text) if strategy == "cyclo" else []
                out["analyze"].append({"case": name, "cluster": label, "strategy": strategy,
                                       "server_seconds": server, "workers": workers})
                extra = ""
                if workers:
                    mx = {k: max(w[k] for w in workers)
                          for k in ("setup_time", "join_time", "sync_time")}
                    extra = (f"; setup {mx['setup_time']:.3f} join {mx['join_time']:.3f} "
                             f"sync {mx['sync_time']:.3f} s (max over workers)")
                print(f"  {name:10} {label:7} {strategy:9} EXPLAIN ANALYZE {server:.3f} s{extra}",
                      file=sys.stderr)

    for name in todo:
        seen = {(r["count"], r["sum"]) for r in out["runs"] if r["case"] == name}
        if len(seen) != 1:
            out["mismatches"].append(
                f"{name}: " + "; ".join(f"{r['cluster']} {r['strategy']} #{r['repeat']}: "
                                         f"{r['count']}, {r['sum']}"
                                         for r in out["runs"] if r["case"] == name))
    out["summary"] = summarise(out)
    return out


def summarise(out):
    summary = []
    for name, case in out["cases"].items():
        for label in dict.fromkeys(r["cluster"] for r in out["runs"]):
            for strategy in dict.fromkeys(r["strategy"] for r in out["runs"]
                                          if (r["case"], r["cluster"]) == (name, label)):
                sel = [r for r in out["runs"] if (r["case"], r["cluster"], r["strategy"])
                       == (name, label, strategy)]
                an = next(x for x in out["analyze"] if (x["case"], x["cluster"], x["strategy"])
                          == (name, label, strategy))
                row = {"case": name, "cluster": label, "strategy": strategy,
                       "median_seconds": statistics.median(r["seconds"] for r in sel),
                       "seconds": [r["seconds"] for r in sel], "count": sel[0]["count"],
                       "sum": sel[0]["sum"], "analyze_seconds": an["server_seconds"]}
                if an["workers"]:
                    for k in ("setup_time", "join_time", "sync_time"):
                        row[k + "_max"] = max(w[k] for w in an["workers"])
                    row["sync_over_join"] = row["sync_time_max"] / row["join_time_max"]
                summary.append(row)
    return summary


def report(a, todo, out):
    floors = {}
    for f in out["floor"]:
        floors.setdefault(f["cluster"], []).append(f["seconds"])
    print(f"\n{a.nodes} hosts, {a.link}, {a.cpus} CPU each; median of {a.repeat}; wall time of "
          "`gyre sql -c` (SELECT 1: " + ", ".join(f"{k} {statistics.median(v):.3f} s"
                                                   for k, v in floors.items()) + ")")
    print("| query | R x S | result rows | cluster | strategy | time s | / cyclo | "
          "EXPLAIN ANALYZE s |")
    print("|---|---|--:|---|---|--:|--:|--:|")
    sm = out["summary"]
    for row in sm:
        cy = next(x for x in sm if (x["case"], x["cluster"], x["strategy"])
                  == (row["case"], row["cluster"], "cyclo"))
        r, s = out["cases"][row["case"]]["rows"]
        print(f"| {row['case']} | {r:,} x {s:,} | {row['count']:,} | {row['cluster']} | "
              f"{row['strategy']} | {row['median_seconds']:.3f} | "
              f"{row['median_seconds'] / cy['median_seconds']:.2f} | "
              f"{row['analyze_seconds']:.3f} |")
    print("\ncyclo-join, one EXPLAIN ANALYZE, largest over the workers (s)")
    print("| query | cluster | setup | join | sync | sync / join |")
    print("|---|---|--:|--:|--:|--:|")
    for row in sm:
        if "join_time_max" in row:
            print(f"| {row['case']} | {row['cluster']} | {row['setup_time_max']:.3f} | "
                  f"{row['join_time_max']:.3f} | {row['sync_time_max']:.3f} | "
                  f"{100 * row['sync_over_join']:.0f}% |")


if __name__ == "__main__":
    main()
