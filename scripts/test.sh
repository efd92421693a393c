#!/usr/bin/env bash
# The test command: formatting, lints, unit and end-to-end tests (TPC-H at SF 0.1
# for 1-4 workers, SF 1 against the official answers), an ADBC client test, TPC-DS
# answers at SF 0.01 and tables on an S3-compatible server (moto's); GYRE_AFL=1 adds a short AFL++ run.
# Installs what it needs. Set GYRE_QUICK=1 to skip the SF 1, Python and S3 parts.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gyre-target}"
export CARGO_TERM_COLOR=never
# Every section header says how long the run has taken so far, so a slow CI log shows where.
start=$SECONDS
section() { printf '== %s  [%dm%02ds]\n' "$1" $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)); }
trap 'section "test.sh ended"' EXIT

command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# HiGHS (Neo-Join's assignment solver, crates/join) builds with cmake and a C++
# compiler; its bindings are generated with libclang.
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null \
  || ! ldconfig -p | grep -q 'libclang-[0-9.]*\.so '; then
  apt-get update -qq && apt-get install -y -qq cmake g++ libclang-dev >/dev/null
fi

section "cargo fmt"
cargo fmt --all -- --check
section "cargo clippy"
cargo clippy --release --workspace --all-targets -- -D warnings
# A server built without the benchmark handlers (cargo feature `bench`) is linted by
# scripts/lint-features.sh: checking one crate alone re-checks much of DataFusion
# with other features (5 1/2 minutes on a clean clone), too much for every run.
# Without HiGHS, Neo-Join assigns greedily.
cargo clippy --release -p gyre-join --no-default-features -- -D warnings
section "cargo test"
cargo test --release --workspace
if [ "${GYRE_QUICK:-0}" != "1" ]; then
  section "TPC-H SF 1 against DataFusion and the official answers"
  cargo test --release --test tpch_sf1 -- --ignored --test-threads 1
  section "ADBC (Python) client"
  python3 -m pip install --quiet --disable-pip-version-check adbc-driver-flightsql pyarrow cryptography
  GYRE_BIN="$CARGO_TARGET_DIR/release/gyre" python3 tests/python/test_adbc.py
  # Three voting coordinators: a standby's error names the primary, also after a kill.
  GYRE_BIN="$CARGO_TARGET_DIR/release/gyre" python3 tests/python/test_adbc_failover.py
  section "ADBC and JDBC clients log in over TLS"
  # The Flight SQL JDBC driver (Maven fetches it) logs in as ADBC does.
  if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    apt-get update -qq && apt-get install -y -qq default-jdk-headless maven >/dev/null
  fi
  jdbc=org.apache.arrow:flight-sql-jdbc-driver:18.3.0
  mvn -q dependency:get -Dartifact="$jdbc"
  GYRE_JDBC_JAR="$HOME/.m2/repository/org/apache/arrow/flight-sql-jdbc-driver/18.3.0/flight-sql-jdbc-driver-18.3.0.jar" \
    GYRE_BIN="$CARGO_TARGET_DIR/release/gyre" python3 tests/python/test_adbc_auth.py
  section "TPC-DS SF 0.01: the 99 queries' answers against DataFusion (DuckDB makes the data)"
  # Three runs each: plans with several Flow-Joins (q75 has four) once hung now and then.
  # Run-time filters (off by default) are on, so that their answers are checked too.
  "$CARGO_TARGET_DIR/release/gyre" bench tpcds --sf 0.01 --iterations 3 --no-duckdb \
    --gyre-timeout 120 -c "SET gyre.runtime_filters = on"
  # Once more over each primitive of the RDMA-aware shuffle's designs on the
  # shared-memory carrier (about 5 s each).
  for design in memq-sr mesq-sr memq-rd semq-wr; do
    "$CARGO_TARGET_DIR/release/gyre" bench tpcds --sf 0.01 --iterations 1 --no-duckdb \
      --gyre-timeout 120 -c "SET gyre.shuffle_design = '$design'" | tail -1
  done
  section "small queries through Flight SQL, answers against DataFusion"
  "$CARGO_TARGET_DIR/release/gyre" bench latency --rows 100000 --iterations 20
  section "S3 tables on moto's S3 server"
  python3 -m pip install --quiet --disable-pip-version-check 'moto[server]' boto3
  port=$((20000 + RANDOM % 20000))
  python3 -m moto.server -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
  moto=$!
  trap 'kill $moto 2>/dev/null || true; section "test.sh ended"' EXIT
  python3 - "$port" <<'PY'
import sys, time, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}",
                  aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
for _ in range(100):
    try:
        s3.create_bucket(Bucket="gyre-test")
        break
    except Exception:
        time.sleep(0.2)
else:
    sys.exit("moto's S3 server did not come up")
PY
  GYRE_TEST_S3="http://127.0.0.1:$port" cargo test --release --test object_store -- --ignored
  kill $moto
  # The AFL++ smoke run builds cargo-afl, AFL++ and an instrumented copy of the
  # decoders from nothing (about 10 minutes on a clean clone), which CI's 90 minutes
  # no longer hold after a cold build of about 65: it runs with GYRE_AFL=1, and the
  # full run (every target, 10 million inputs each) is `scripts/fuzz.sh`. The
  # mutation fuzzer over the same targets runs in `cargo test` (tests/fuzz.rs).
  if [ "${GYRE_AFL:-0}" = "1" ]; then
    section "AFL++ smoke run: the transport and Flow-Join decoders, coverage-guided"
    ./scripts/fuzz.sh --smoke
  fi
fi
