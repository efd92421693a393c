"""An emulated cluster for the SQL benchmark scripts (needs root): `gyre cluster up`
on its own subnet, SQL through the client namespace, `gyre cluster down`."""

import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Failure(Exception):
    """A statement failed or did not answer in time."""


class Cluster:
    def __init__(self, gyre, name, subnet, nodes, cpus, link, timeout=None):
        self.gyre, self.name, self.nodes, self.timeout = gyre, name, nodes, timeout
        self.addr = subnet.rsplit(".", 1)[0] + ".1:50050"
        self.up = [gyre, "cluster", "up", "--name", name, "--nodes", str(nodes), "--link", link,
                   "--cpus", cpus, "--subnet", subnet + "/24"]

    def start(self):
        warn_if_stale(self.gyre)
        print("+", " ".join(self.up), file=sys.stderr)
        subprocess.run(self.up, check=True)

    def stop(self):
        subprocess.run([self.gyre, "cluster", "down", "--name", self.name], check=False)

    def sql(self, text):
        """(stdout, wall seconds); raises Failure with the statement and stderr on failure
        or timeout (`timeout` None: wait as long as it takes)."""
        cmd = ["ip", "netns", "exec", f"gyre-{self.name}-c", self.gyre, "sql", "--connect",
               self.addr, "--format", "csv", "-c", text]
        t0 = time.perf_counter()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"{self.name}: no answer after {self.timeout} s (hang?) to:\n{text}")
        secs = time.perf_counter() - t0
        if out.returncode != 0:
            raise Failure(f"{self.name}: exit {out.returncode} for:\n{text}\nstderr:\n{out.stderr}")
        return out.stdout, secs


def warn_if_stale(gyre):
    """Warns when `gyre` is older than a source file of this checkout: the default
    binary comes from CARGO_TARGET_DIR (else ~/.cache/gyre-target, where
    scripts/test.sh builds), which may hold another build than the one measured."""
    built = os.path.getmtime(gyre)
    newer = [
        os.path.join(root, f)
        for top in ("crates", "src")
        for root, _, files in os.walk(os.path.join(REPO, top))
        for f in files
        if f.endswith(".rs") and os.path.getmtime(os.path.join(root, f)) > built
    ]
    if newer:
        print(f"warning: {gyre} is older than {len(newer)} source file(s), e.g. "
              f"{os.path.relpath(newer[0], REPO)}: rebuild it or pass --gyre", file=sys.stderr)


def parse_time(value, unit):
    """Seconds of a DataFusion metric value such as ("1.5", "ms")."""
    return float(value) * {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
