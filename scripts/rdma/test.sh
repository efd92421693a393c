#!/usr/bin/env bash
# Gyre over real verbs: builds the ibverbs carrier (cargo feature `verbs`) on the
# host, then in the soft-RoCE guest (run-in-guest.sh) runs
#   1. the carrier's primitives (send/receive, write, read, write with
#      immediate, datagrams, the errors), then every endpoint-design test of
#      gyre-transport on the ibverbs carrier (`design::tests`, one carrier per
#      node, each on its own address of rxe0),
#   2. every design between processes (tests/processes.rs): four processes,
#      each a node, moving a repartition, a broadcast and a multicast-group
#      exchange, checked message by message, ended exactly,
#   3. TPC-H queries at scale factor 0.01 on `gyre local` with three workers
#      whose exchanges run over rxe0 in every design, checked against
#      DataFusion (gyre local --bench tpch fails on any difference).
# Exits non-zero if any of them fails. Needs root (debootstrap) the first time;
# the guest image is cached in ${GYRE_RDMA_CACHE:-~/.cache/gyre-rdma}.
#
# Settings: GYRE_RDMA_QUERIES (TPC-H queries, default 3,5,10,12),
# GYRE_RDMA_TIMEOUT (seconds for the guest, default 1500).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=scripts/rdma
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/gyre-target}
QUERIES=${GYRE_RDMA_QUERIES:-3,5,10,12}

"$HERE/install-deps.sh"
"$HERE/guest-image.sh"

echo "rdma/test.sh: linting and building the tests and gyre with the ibverbs carrier" >&2
cargo clippy --release -p gyre-transport --features verbs --all-targets -- -D warnings
json=$(cargo test --release -p gyre-transport --features verbs --no-run --message-format=json)
exe_of() {
  echo "$json" | grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' \
    | grep "/$1-[0-9a-f]*$" | head -n 1
}
lib=$(exe_of gyre_transport)
procs=$(exe_of processes)
[ -x "$lib" ] && [ -x "$procs" ] || { echo "rdma/test.sh: test binaries not found" >&2; exit 1; }
cargo build --release --bin gyre --features verbs

share=$(mktemp -d "${TMPDIR:-/tmp}/gyre-rdma-share.XXXXXX")
trap 'rm -rf "$share"' EXIT
# Without debug information the guest reads a fraction of the bytes over 9p.
strip -o "$share/transport-tests" "$lib"
strip -o "$share/processes" "$procs"
strip -o "$share/gyre" "$CARGO_TARGET_DIR/release/gyre"
cat > "$share/run.sh" <<EOF
#!/bin/bash
set -u
fail=0
step() { echo; echo "=== \$*"; date +%T; }
# Nodes 1..4 on the first four addresses of rxe0.
export GYRE_VERBS_GIDS=1=10.0.2.15,2=10.0.2.16,3=10.0.2.17,4=10.0.2.18
cp transport-tests processes gyre /tmp/ && cd /tmp
step "1. the carrier's primitives, then every design's endpoint tests, on rxe0"
./transport-tests --include-ignored rdma:: || fail=1
./transport-tests design::tests || fail=1
step "2. every design between four processes"
GYRE_PROC_CARRIERS=verbs GYRE_PROC_NODES=4 GYRE_PROC_MESSAGES=12 ./processes || fail=1
step "3. TPC-H SF 0.01, queries $QUERIES, exchanges over rxe0 in every design"
./gyre local --workers 3 --tpch 0.01 --bench tpch --no-duckdb --iterations 1 --queries $QUERIES \\
  --shuffle-designs tcp,memq-sr,semq-sr,mesq-sr,sesq-sr,memq-rd,semq-rd,memq-wr,semq-wr \\
  --verbs 10.0.2.15,10.0.2.16,10.0.2.17,10.0.2.18 || fail=1
step "done: \$fail"
exit \$fail
EOF
chmod +x "$share/run.sh"
# Room for gyre local's four nodes and their registered regions (3G ran out).
GYRE_RDMA_MEM=${GYRE_RDMA_MEM:-6G} "$HERE/run-in-guest.sh" "$share" "${GYRE_RDMA_TIMEOUT:-1500}"
