"""What logins and TLS cost a client: TPC-H through ADBC on two embedded clusters
of the same size and data, one serving plain gRPC to anyone and one serving TLS to
logged-in users, with each query run on both in turn; per-query medians and the ratio
of the sums. The query texts come from DuckDB's tpch extension.

Usage: python3 scripts/bench_front_door.py [--gyre BIN] [--sf 1] [--workers 4]
       [--iterations 3]
Installs what it needs with pip (adbc-driver-flightsql, pyarrow, cryptography, duckdb
and its tpch extension, the last two into ~/.cache/gyre/python-duckdb-tpch-1.5.5).
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DUCKDB_DIR = os.path.expanduser("~/.cache/gyre/python-duckdb-tpch-1.5.5")


def install():
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(pip + ["adbc-driver-flightsql", "pyarrow", "cryptography"], check=True)
    if not os.path.isdir(DUCKDB_DIR):
        subprocess.run(
            pip + ["--target", DUCKDB_DIR, "duckdb==1.5.5", "duckdb-extension-tpch==1.5.5"],
            check=True,
        )
    sys.path.insert(0, DUCKDB_DIR)
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def tpch_queries():
    import duckdb
    import duckdb_extension_tpch

    extension = os.path.join(
        os.path.dirname(duckdb_extension_tpch.__file__),
        "extensions", "v" + duckdb.__version__, "tpch.duckdb_extension",
    )
    con = duckdb.connect()
    con.execute(f"LOAD '{extension}'")
    return dict(con.execute("SELECT query_nr, query FROM tpch_queries()").fetchall())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gyre", default=os.path.expanduser("~/.cache/gyre-target/release/gyre"))
    parser.add_argument("--sf", default="1")
    parser.add_argument("--workers", default="4")
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    install()
    import adbc_driver_flightsql
    import adbc_driver_flightsql.dbapi as flightsql
    from test_adbc_auth import make_ca_and_cert

    queries = tpch_queries()
    with tempfile.TemporaryDirectory() as directory:
        paths = make_ca_and_cert(directory)
        users = os.path.join(directory, "users")
        with open(users, "wb") as f:
            f.write(subprocess.run([args.gyre, "passwd", "bench"], input=b"bench password\n",
                                   capture_output=True, check=True).stdout)
        plain_port, tls_port = free_port(), free_port()
        common = [args.gyre, "local", "--workers", args.workers, "--tpch", args.sf]
        procs = [
            subprocess.Popen(common + ["--listen", f"127.0.0.1:{plain_port}"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True),
            subprocess.Popen(common + ["--listen", f"127.0.0.1:{tls_port}", "--users", users,
                                       "--tls-cert", paths["cert.pem"],
                                       "--tls-key", paths["key.pem"]],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True),
        ]
        try:
            # Tables exist before they are filled: wait for each cluster's "ready" line,
            # then pass its log through.
            for p in procs:
                for line in p.stderr:
                    sys.stderr.write(line)
                    if " ready in " in line:
                        break
                else:
                    raise RuntimeError(f"gyre exited with {p.wait()} before its data was ready")
                threading.Thread(
                    target=lambda s=p.stderr: [sys.stderr.write(l) for l in s], daemon=True
                ).start()
            with open(paths["ca.pem"]) as f:
                ca = f.read()
            tls_options = {
                adbc_driver_flightsql.DatabaseOptions.TLS_ROOT_CERTS.value: ca,
                "username": "bench", "password": "bench password",
            }
            targets = {
                "plain": (f"grpc://127.0.0.1:{plain_port}", {}),
                "login+TLS": (f"grpc+tls://localhost:{tls_port}", tls_options),
            }
            conns = {}
            deadline = time.time() + 900
            for name, (uri, options) in targets.items():
                while True:
                    try:
                        conn = flightsql.connect(uri, db_kwargs=options)
                        with conn.cursor() as cur:
                            cur.execute("select count(*) from lineitem")
                            cur.fetchall()
                        conns[name] = conn
                        break
                    except flightsql.Error:
                        if time.time() > deadline or any(p.poll() is not None for p in procs):
                            raise
                        time.sleep(1)
            print(f"TPC-H SF {args.sf}, {args.workers} workers, median of {args.iterations}, "
                  "through ADBC", flush=True)
            print(f"{'query':>5} {'plain ms':>10} {'login+TLS ms':>13} {'ratio':>6}")
            sums = {name: 0.0 for name in targets}
            for nr in sorted(queries):
                times = {name: [] for name in targets}
                rows = {}
                for i in range(args.iterations):
                    # Each goes first in turn, so that neither gains from the other's warm caches.
                    order = list(conns.items())
                    for name, conn in order if i % 2 == 0 else reversed(order):
                        with conn.cursor() as cur:
                            start = time.perf_counter()
                            cur.execute(queries[nr])
                            rows[name] = len(cur.fetchall())
                            times[name].append((time.perf_counter() - start) * 1e3)
                if rows["plain"] != rows["login+TLS"]:
                    raise AssertionError(f"q{nr}: {rows}")
                medians = {name: statistics.median(t) for name, t in times.items()}
                for name in targets:
                    sums[name] += medians[name]
                print(f"{nr:>5} {medians['plain']:>10.1f} {medians['login+TLS']:>13.1f} "
                      f"{medians['login+TLS'] / medians['plain']:>6.3f}", flush=True)
            print(f"{'sum':>5} {sums['plain']:>10.1f} {sums['login+TLS']:>13.1f} "
                  f"{sums['login+TLS'] / sums['plain']:>6.3f}")
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=60)


if __name__ == "__main__":
    main()
