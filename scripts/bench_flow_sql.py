#!/usr/bin/env python3
"""Flow-Join through SQL on an emulated cluster (needs root).

Builds `gyre cluster up --nodes N --link LINK --cpus C`, loads a build table with
unique keys and two probe tables (keys with a power-law skew of exponent 1.25, and
uniform keys), then runs the same partitioned join with `gyre.skew_detection` on
and off, alternating, REPEAT times each. Reports the median time, the per-worker
probe rows each join received (from EXPLAIN ANALYZE) and their imbalance
(largest / mean), as a table and as JSON.

Skewed keys: floor(u^-4) - 1 for uniform u in (0, 1] has P(key >= k) ~ (k+1)^(-1/4),
so key frequencies fall as k^-1.25 (a continuous stand-in for Zipf 1.25; key 0 gets
~16% of the rows); keys beyond the build domain wrap around (modulo).

With `--build-side shuffled` the build table is placed by another column, so the
join shuffles it and the Flow-Join routes it too (build-side detection); with
`--build-side skewed` its keys follow a power law too: floor(u^-a) - 1 with a chosen
so that key 0 holds `--build-key0-share` of the build rows (0.16 gives a = 4, the probe
table's law; 0.4 gives a = 1.36), and only the uniform probe table is joined (a key
heavy on both sides would make a cross product of 10^11 rows). When the build side
is shuffled, a third configuration runs between the two: skew detection on with
`gyre.skew_build_side = off` (probe-side detection only).

With `--build-side both`, key 0 is in 1% of the build rows and 1% of the probe rows
of a third probe table (the rest unique and uniform): heavy on both sides, joined
by SFR on a grid; the configuration in between is then `gyre.skew_sfr = off`, which
broadcasts the probe rows of such keys. Key 0 alone makes build/100 x probe/100
output rows, so keep the inputs small (e.g. --build 50000 --probe 4000000).

Usage: scripts/bench_flow_sql.py [--nodes 4] [--cpus 0.45] [--link 10gbit]
       [--build 1000000] [--probe 8000000] [--repeat 3] [--json PATH]
       [--build-side colocated|shuffled|skewed|both] [--build-key0-share 0.16]
       [--set gyre.skew_every=0 ...]
"""

import argparse
import json
import math
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emulated_cluster import Cluster, Failure, parse_time  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--cpus", default="0.45")
    p.add_argument("--link", default="10gbit")
    p.add_argument("--build", type=int, default=1_000_000)
    p.add_argument("--probe", type=int, default=8_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--name", default="flowsql")
    p.add_argument("--join", choices=["inner", "left", "right", "semi", "full"], default="inner",
                   help="left: build LEFT JOIN probe; semi: build rows with a probe row (EXISTS); "
                        "both build-preserving joins whose heavy build rows' matches are "
                        "combined across workers; right: build RIGHT JOIN probe, whose probe "
                        "rows broadcast for build-heavy keys are combined the same way; full: "
                        "build FULL JOIN probe, both")
    p.add_argument("--build-side", choices=["colocated", "shuffled", "skewed", "both"],
                   default="colocated",
                   help="colocated: build placed by its unique key (no build shuffle); "
                        "shuffled: placed by another column; skewed: that, with power-law keys; "
                        "both: key 0 heavy in build and probe (SFR)")
    p.add_argument("--build-key0-share", type=float, default=0.16,
                   help="with --build-side skewed: the share of build rows with key 0")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a session setting for every run (repeatable), e.g. gyre.skew_every=0")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/gyre-target"))
    p.add_argument("--gyre", default=os.path.join(target, "release", "gyre"))
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_flow_sql.py builds an emulated cluster: run it as root")

    settings = []
    for kv in a.set:
        key, sep, value = kv.partition("=")
        if not sep or not re.fullmatch(r"[a-z_.]+", key.strip()):
            sys.exit(f"--set {kv!r}: expected KEY=VALUE, e.g. gyre.skew_every=0")
        settings.append(f"SET {key.strip()} = '{value.strip()}';")
    cluster = Cluster(a.gyre, a.name, "10.213.0.0", a.nodes, a.cpus, a.link)
    cluster.start()
    try:

        def sql(text):
            return cluster.sql(text)[0]

        t0 = time.time()
        print(f"loading {a.build} build rows and 2 x {a.probe} probe rows...", file=sys.stderr)
        build_key = {
            "colocated": "value",
            "shuffled": "value",
            "skewed": f"(CAST(floor(LEAST(power(1.0 - random(), {-build_exponent(a):.4f}), 1e15)) "
                      f"AS BIGINT) - 1) % {a.build}",
            "both": "CASE WHEN value % 100 = 0 THEN 0 ELSE value END",
        }[a.build_side]
        placed_by = "k" if a.build_side == "colocated" else "v"
        if a.build_side == "both":
            sql(f"""
                CREATE TABLE probe_both (id BIGINT, k BIGINT) PARTITION BY id;
                INSERT INTO probe_both SELECT value, CASE WHEN value % 100 = 0 THEN 0
                    ELSE CAST(random() * {a.build} AS BIGINT) % {a.build} END
                  FROM generate_series(1, {a.probe}) AS t(value);
            """)
        sql(f"""
            CREATE TABLE build (k BIGINT, v BIGINT) PARTITION BY {placed_by};
            INSERT INTO build SELECT {build_key}, value * 3 FROM generate_series(0, {a.build - 1}) AS t(value);
            CREATE TABLE probe_skewed (id BIGINT, k BIGINT) PARTITION BY id;
            INSERT INTO probe_skewed SELECT value,
                (CAST(floor(LEAST(power(1.0 - random(), -4.0), 1e15)) AS BIGINT) - 1) % {a.build}
              FROM generate_series(1, {a.probe}) AS t(value);
            CREATE TABLE probe_uniform (id BIGINT, k BIGINT) PARTITION BY id;
            INSERT INTO probe_uniform SELECT value, CAST(random() * {a.build} AS BIGINT) % {a.build}
              FROM generate_series(1, {a.probe}) AS t(value);
        """)
        print(f"  loaded in {time.time() - t0:.1f} s", file=sys.stderr)
        runs = []
        for i in range(a.repeat):
            for table in tables(a):
                for skew in configurations(a):
                    out = sql(f"""
                        SET gyre.join_strategy = 'shuffle';
                        SET gyre.skew_detection = '{"off" if skew == "off" else "on"}';
                        SET gyre.skew_build_side = '{"off" if skew == "probe-only" else "on"}';
                        SET gyre.skew_sfr = '{"off" if skew == "no-sfr" else "on"}';
                        SET gyre.skew_build_preserving = all;
                        {" ".join(settings)}
                        EXPLAIN ANALYZE {QUERIES[a.join].format(table=table)}
                    """)
                    secs = float(re.search(r"rows in ([0-9.]+) s", out).group(1))
                    rows = [parse_count(m) for m in re.findall(
                        r"HashJoinExec: mode=Partitioned.*?[, \[]input_rows=([0-9.]+ ?[KMB]?)", out)]
                    output = [parse_count(m) for m in re.findall(
                        r"HashJoinExec: mode=Partitioned.*?metrics=\[output_rows=([0-9.]+ ?[KMB]?)", out)]
                    heavy = re.search(r"(?<![a-z_])heavy_hitters=(\d+)", out)
                    build_heavy = re.search(r"build_heavy_hitters=(\d+)", out)
                    sfr = re.search(r"sfr=\d+ \[([^\]]*)\]", out)
                    build_rows = [parse_count(m) for m in re.findall(
                        r"HashJoinExec: mode=Partitioned.*?build_input_rows=([0-9.]+ ?[KMB]?)", out)]
                    waits = [parse_time(v, u) for v, u in
                             re.findall(r"first_round_wait=([0-9.]+)(ns|µs|ms|s)", out)]
                    runs.append({"table": table, "skew_detection": skew, "seconds": secs,
                                 "probe_rows_per_worker": rows,
                                 "heavy_hitters": int(heavy.group(1)) if heavy else 0,
                                 "build_rows_per_worker": build_rows,
                                 "output_rows_per_worker": output,
                                 "sfr_grids": sfr.group(1) if sfr else None,
                                 "build_heavy_hitters": int(build_heavy.group(1)) if build_heavy else 0,
                                 "first_round_wait_max_s": max(waits) if waits else 0.0})
                    print(f"  {table:14} skew_detection={skew:10}: {secs:.3f} s, probe rows per "
                          f"worker {[human(r) for r in rows]}, build rows {[human(r) for r in build_rows]}"
                          + (f", first-round wait up to {max(waits) * 1e3:.1f} ms" if waits else "")
                          + (f", SFR grids [{sfr.group(1)}]" if sfr else ""),
                          file=sys.stderr)
        report(a, runs)
    except Failure as e:
        sys.exit(f"FAILED: {e}")
    finally:
        cluster.stop()


QUERIES = {
    "inner": "SELECT count(*), sum(b.v + p.id) FROM build b JOIN {table} p ON b.k = p.k",
    "left": "SELECT count(*), count(p.id), sum(b.v + coalesce(p.id, 0)) "
            "FROM build b LEFT JOIN {table} p ON b.k = p.k",
    "right": "SELECT count(*), count(b.v), sum(coalesce(b.v, 0) + p.id) "
             "FROM build b RIGHT JOIN {table} p ON b.k = p.k",
    "semi": "SELECT count(*), sum(b.v) FROM build b "
            "WHERE EXISTS (SELECT 1 FROM {table} p WHERE p.k = b.k)",
    "full": "SELECT count(*), count(b.v), count(p.id), sum(coalesce(b.v, 0) + coalesce(p.id, 0)) "
            "FROM build b FULL JOIN {table} p ON b.k = p.k",
}


def parse_count(text):
    text = text.strip()
    scale = {"K": 1e3, "M": 1e6, "B": 1e9}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    return int(float(number) * scale)


def human(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def tables(a):
    return {"skewed": ["probe_uniform"], "both": ["probe_both"]}.get(
        a.build_side, ["probe_skewed", "probe_uniform"])


def build_exponent(a):
    """The exponent a of floor(u^-a) - 1 that gives key 0 the share s: P(u^-a < 2) = s."""
    if not 0 < a.build_key0_share < 1:
        sys.exit(f"--build-key0-share {a.build_key0_share}: expected a share in (0, 1)")
    return math.log(2) / -math.log(1 - a.build_key0_share)


def configurations(a):
    """Skew detection off and on; probe-side only in between when the build side is routed."""
    return {"colocated": ["off", "on"], "both": ["off", "no-sfr", "on"]}.get(
        a.build_side, ["off", "probe-only", "on"])


def report(a, runs):
    print(f"\n{a.join} join, {a.nodes} hosts, {a.link}, {a.cpus} CPU each; build {a.build} "
          f"({a.build_side}" + (f", key 0 in {a.build_key0_share:.0%}" if a.build_side == "skewed" else "")
          + f"), probe {a.probe}; median of {a.repeat}")
    print("| probe keys | skew detection | time (s) | probe rows per worker | largest / mean | "
          "build rows per worker | join output rows per worker | heavy hitters (build-side) |")
    print("|---|---|---|---|---|---|---|---|")
    summary = []
    for table in tables(a):
        for skew in configurations(a):
            sel = [r for r in runs if r["table"] == table and r["skew_detection"] == skew]
            med = statistics.median(r["seconds"] for r in sel)
            rows = sel[0]["probe_rows_per_worker"]
            imb = max(rows) / (sum(rows) / len(rows)) if rows and sum(rows) else float("nan")
            summary.append({"table": table, "skew_detection": skew, "median_seconds": med,
                            "imbalance": imb, "probe_rows_per_worker": rows,
                            "heavy_hitters": sel[0]["heavy_hitters"],
                            "build_rows_per_worker": sel[0]["build_rows_per_worker"],
                            "output_rows_per_worker": sel[0]["output_rows_per_worker"],
                            "build_heavy_hitters": sel[0]["build_heavy_hitters"]})
            print(f"| {table.removeprefix('probe_')} | {skew} | {med:.3f} | "
                  f"{' / '.join(human(r) for r in rows)} | {imb:.2f} | "
                  f"{' / '.join(human(r) for r in sel[0]['build_rows_per_worker'])} | "
                  f"{' / '.join(human(r) for r in sel[0]['output_rows_per_worker'])} | "
                  f"{sel[0]['heavy_hitters']} ({sel[0]['build_heavy_hitters']}) |")
    for table in tables(a):
        off = next(s for s in summary if s["table"] == table and s["skew_detection"] == "off")
        on = next(s for s in summary if s["table"] == table and s["skew_detection"] == "on")
        print(f"{table.removeprefix('probe_')}: Flow-Join / plain = "
              f"{on['median_seconds'] / off['median_seconds']:.3f}")
        for middle in configurations(a)[1:-1]:
            m = next(s for s in summary if s["table"] == table and s["skew_detection"] == middle)
            print(f"{table.removeprefix('probe_')}: {middle} / plain = "
                  f"{m['median_seconds'] / off['median_seconds']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"join": a.join, "build_side": a.build_side,
                       "build_key0_share": a.build_key0_share if a.build_side == "skewed" else None,
                       "settings": a.set, "nodes": a.nodes, "link": a.link, "cpus": a.cpus, "build": a.build,
                       "probe": a.probe, "runs": runs, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
