#!/usr/bin/env python3
"""How fast could a strategy be next to the plain join when the hosts are CPU-bound?

Reads reports of `gyre bench join --json` (emulated hosts with a CPU quota) and, per
file, Zipf exponent and strategy, prints the medians over the runs of the join's time, the busiest
host's CPU seconds and the mean host's CPU seconds. When every host is CPU-bound
at the same quota, the plain join takes as long as its busiest host needs, and a
perfectly balanced strategy as long as its mean host needs. So

    bound = strategy's mean host CPU / plain join's busiest host CPU

is the smallest time ratio (strategy / plain) the strategy's own CPU cost allows,
however well it balances. "measured" is the median over the repetitions of the
time ratio within one repetition (the k-th run of each strategy), as `gyre bench
join` reports it.

Usage: scripts/flow_cpu_bound.py REPORT.json [REPORT.json ...]
"""

import json
import statistics
import sys


def summarise(path: str) -> None:
    with open(path) as f:
        report = json.load(f)
    by_zipf: dict[float, dict[str, list[tuple[float, float, float]]]] = {}
    for run in report["runs"]:
        cpu = [w["process_cpu_s"] for w in run["workers"]]
        if not cpu or any(c is None for c in cpu):
            sys.exit(f"{path}: a run of {run['strategy']} has no per-host CPU figures")
        by_zipf.setdefault(run["zipf"], {}).setdefault(run["strategy"], []).append(
            (run["elapsed_s"], max(cpu), sum(cpu) / len(cpu))
        )
    for zipf, runs in by_zipf.items():
        if "hash" not in runs:
            sys.exit(f"{path}: no runs of the plain join (strategy hash) at Zipf {zipf}")
        print_bounds(f"{path}, Zipf {zipf} (quota {report.get('cpus')} CPU per host)", runs)


def print_bounds(title: str, runs: dict[str, list[tuple[float, float, float]]]) -> None:

    def median(strategy: str, i: int) -> float:
        return statistics.median(r[i] for r in runs[strategy])

    plain_busiest = median("hash", 1)
    print(title)
    print(f"  {'strategy':<12} {'time s':>7} {'busiest CPU s':>14} {'mean CPU s':>11} {'bound':>6} {'measured':>9}")
    for strategy in runs:
        time, busiest, mean = (median(strategy, i) for i in range(3))
        paired = statistics.median(
            r[0] / p[0] for r, p in zip(runs[strategy], runs["hash"], strict=True)
        )
        print(
            f"  {strategy:<12} {time:7.3f} {busiest:14.3f} {mean:11.3f} "
            f"{mean / plain_busiest:6.3f} {paired:9.3f}"
        )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        summarise(p)
