#!/usr/bin/env bash
# Lints the builds that leave out a default cargo feature: a server without the
# benchmark handlers (gyre-cluster's `bench`) and Neo-Join without HiGHS (gyre-join's
# `milp`; scripts/test.sh lints this one too, it is cheap). Checking one crate alone
# unifies its dependencies' features differently from the workspace, so much of
# DataFusion is checked again: minutes, not seconds, on a clean clone.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gyre-target}"
cargo clippy --release -p gyre-cluster --no-default-features -- -D warnings
cargo clippy --release -p gyre-join --no-default-features -- -D warnings
