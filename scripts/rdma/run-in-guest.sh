#!/usr/bin/env bash
# Usage: scripts/rdma/run-in-guest.sh SHARE_DIR [TIMEOUT_SECONDS]
#
# Boots the cached soft-RoCE guest (guest-image.sh builds it first if it is
# missing or out of date) with SHARE_DIR mounted at /mnt/host (9p), runs
# /mnt/host/run.sh there (cwd /mnt/host, rxe0 set up by rxe-init), prints the
# guest console as it goes (also saved as SHARE_DIR/console.log) and exits with
# run.sh's exit code, which the guest writes to SHARE_DIR/exit-code.
# The whole run is killed after TIMEOUT_SECONDS (default 1200).
#
# Environment: GYRE_RDMA_CACHE (image cache), GYRE_RDMA_ACCEL (default
# "-accel tcg,thread=multi"; e.g. "-enable-kvm" on a host with real VT-x/AMD-V),
# GYRE_RDMA_CPU (default "max"; "host" with KVM), GYRE_RDMA_SMP (2), GYRE_RDMA_MEM (3G).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${GYRE_RDMA_CACHE:-$HOME/.cache/gyre-rdma}

die() { echo "run-in-guest.sh: error: $*" >&2; exit 1; }
say() { echo "run-in-guest.sh: $*" >&2; }

[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 SHARE_DIR [TIMEOUT_SECONDS]"
[ -d "$1" ] || die "$1 is not a directory"
SHARE=$(cd "$1" && pwd)
TIMEOUT=${2:-1200}
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "TIMEOUT_SECONDS must be a positive integer, not '$TIMEOUT'"
[ -f "$SHARE/run.sh" ] || die "$SHARE/run.sh not found"
{ command -v qemu-system-x86_64 >/dev/null && command -v qemu-img >/dev/null; } \
  || die "qemu-system-x86_64/qemu-img not found: run scripts/rdma/install-deps.sh"

# Build or refresh the image (a no-op when the cache is up to date).
"$HERE/guest-image.sh"

start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/gyre-rdma-run.XXXXXX")
qpid=
tpid=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  if [ -n "$qpid" ]; then kill "$qpid" 2>/dev/null || true; fi
  if [ -n "$tpid" ]; then kill "$tpid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A throwaway overlay per run keeps the cached image clean.
qemu-img create -q -f qcow2 -b "$CACHE/guest.qcow2" -F qcow2 "$work/overlay.qcow2" \
  || die "qemu-img create (overlay) failed"
rm -f "$SHARE/exit-code" "$SHARE/exit-code.tmp"
console="$SHARE/console.log"
: >"$console"

# shellcheck disable=SC2086
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
  ${GYRE_RDMA_ACCEL:--accel tcg,thread=multi} -cpu "${GYRE_RDMA_CPU:-max}" \
  -smp "${GYRE_RDMA_SMP:-2}" -m "${GYRE_RDMA_MEM:-3G}" \
  -display none -monitor none -serial "file:$console" -no-reboot \
  -kernel "$CACHE/vmlinuz" -initrd "$CACHE/initrd.img" \
  -append "console=ttyS0 root=/dev/vda rw init=/sbin/rxe-init panic=-1 loglevel=4 net.ifnames=0" \
  -drive "file=$work/overlay.qcow2,format=qcow2,if=virtio,cache=unsafe" \
  -nic user,model=virtio-net-pci,restrict=on \
  -virtfs "local,path=$SHARE,mount_tag=host0,security_model=none,id=host0" \
  </dev/null &
qpid=$!
# Print the console as it goes (without the serial line's carriage returns).
tail -n +1 -F --pid="$qpid" "$console" 2>/dev/null | sed -u 's/\r$//' &
tpid=$!
set +e
wait "$qpid"
qrc=$?
set -e
qpid=
wait "$tpid" 2>/dev/null || true
tpid=

elapsed=$((SECONDS - start))
if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
  say "timed out after $TIMEOUT s: qemu killed"
elif [ "$qrc" -ne 0 ]; then
  say "qemu-system-x86_64 exited with $qrc"
fi
if [ ! -s "$SHARE/exit-code" ]; then
  say "the guest did not finish (no $SHARE/exit-code after $elapsed s; console in $console)"
  exit 1
fi
rc=$(tr -dc '0-9' <"$SHARE/exit-code")
[ -n "$rc" ] || { say "the guest did not finish (bad exit-code file)"; exit 1; }
say "guest run.sh exited with $rc (boot + run $elapsed s)"
exit "$rc"
