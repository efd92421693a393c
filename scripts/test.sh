#!/usr/bin/env bash
# The test command: formatting, lints, unit and end-to-end tests (TPC-H at SF 0.1
# for 1-4 workers, SF 1 against the official answers), and an ADBC client test.
# Installs what it needs. Set GYRE_QUICK=1 to skip the SF 1 and Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gyre-target}"
export CARGO_TERM_COLOR=never

command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --release --workspace
if [ "${GYRE_QUICK:-0}" != "1" ]; then
  echo "== TPC-H SF 1 against DataFusion and the official answers"
  cargo test --release --test tpch_sf1 -- --ignored --test-threads 1
  echo "== ADBC (Python) client"
  python3 -m pip install --quiet --disable-pip-version-check adbc-driver-flightsql pyarrow
  GYRE_BIN="$CARGO_TARGET_DIR/release/gyre" python3 tests/python/test_adbc.py
fi
