#!/usr/bin/env bash
# Installs what the host needs for the soft-RoCE guest (scripts/rdma/README.md):
# QEMU (TCG), debootstrap, and the libibverbs/bindgen toolchain for building the
# Rust verbs binaries that run inside the guest. Idempotent and quiet: does
# nothing when everything is already installed. Needs root (or sudo) and apt.
set -euo pipefail

PKGS=(qemu-system-x86 qemu-utils debootstrap e2fsprogs libibverbs-dev clang libclang-dev cmake pkg-config)

die() { echo "install-deps.sh: error: $*" >&2; exit 1; }

command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian/Ubuntu hosts only (wanted: ${PKGS[*]})"

missing=()
for p in "${PKGS[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "not root and sudo not found; install as root: apt-get install ${missing[*]}"
  SUDO=(sudo -n)
fi

echo "install-deps.sh: installing ${missing[*]}" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! "${SUDO[@]}" apt-get update -qq >"$log" 2>&1; then
  cat "$log" >&2
  die "apt-get update failed (see above)"
fi
if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
  cat "$log" >&2
  die "apt-get install ${missing[*]} failed (see above)"
fi
for p in "${missing[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || die "package $p is still not installed after apt-get install"
done
