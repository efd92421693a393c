#!/usr/bin/env bash
# Builds the Debian bookworm guest for the soft-RoCE (rdma_rxe) tests, or does
# nothing when the cached one is up to date (scripts/rdma/README.md).
#
# Cache: ${GYRE_RDMA_CACHE:-$HOME/.cache/gyre-rdma}/
#   vmlinuz, initrd.img   the guest kernel and initramfs (booted with -kernel/-initrd)
#   guest.qcow2           the compressed root file system (never written by runs)
#   inputs.sha256         hash of this script and rxe-init; a change rebuilds
# Needs root (debootstrap) and the packages of install-deps.sh.
# GYRE_RDMA_MIRROR overrides the Debian mirror (default: the one apt uses here).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${GYRE_RDMA_CACHE:-$HOME/.cache/gyre-rdma}
SUITE=bookworm
INCLUDE=linux-image-amd64,initramfs-tools,kmod,rdma-core,ibverbs-utils,ibverbs-providers,perftest,rdmacm-utils,iproute2,udev,procps,libgcc-s1

die() { echo "guest-image.sh: error: $*" >&2; exit 1; }
say() { echo "guest-image.sh: $*" >&2; }

[ -f "$HERE/rxe-init" ] || die "$HERE/rxe-init not found"
hash=$(cat "$HERE/guest-image.sh" "$HERE/rxe-init" | sha256sum | cut -d' ' -f1)

up_to_date() {
  [ -s "$CACHE/vmlinuz" ] && [ -s "$CACHE/initrd.img" ] && [ -s "$CACHE/guest.qcow2" ] \
    && [ "$(cat "$CACHE/inputs.sha256" 2>/dev/null)" = "$hash" ]
}

mkdir -p "$CACHE"
up_to_date && exit 0

# One build at a time; a second caller waits and then finds the image built.
exec 9>"$CACHE/.lock"
flock 9
up_to_date && exit 0

[ "$(id -u)" -eq 0 ] || die "building the guest image needs root (debootstrap); run as root or with sudo"
for t in debootstrap qemu-img mkfs.ext4 flock findmnt; do
  command -v "$t" >/dev/null || die "$t not found: run scripts/rdma/install-deps.sh"
done

# The Debian mirror apt already uses: the first enabled "deb" source for $SUITE,
# in one-line (*.list) or deb822 (*.sources) format.
find_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      /^[[:space:]]*deb[[:space:]]/ {
        sub(/^[[:space:]]*deb[[:space:]]+/, "")
        if ($0 ~ /^\[/) sub(/^\[[^]]*\][[:space:]]*/, "")
        if ($2 == suite) { print $1; exit }
      }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      function flush() {
        if (deb && enabled && uri != "" && (" " suites " ") ~ (" " suite " ")) { print uri; found = 1; exit }
        deb = 0; enabled = 1; uri = ""; suites = ""
      }
      BEGIN { enabled = 1 }
      /^[[:space:]]*#/ { next }
      /^[[:space:]]*$/ { flush(); next }
      tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { suites = ""; for (i = 2; i <= NF; i++) suites = suites " " $i }
      tolower($1) == "enabled:" { enabled = (tolower($2) != "no") }
      END { if (!found) flush() }' "$f"
  done
}
MIRROR=${GYRE_RDMA_MIRROR:-$(find_mirror | head -n 1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

# Delete a build directory. debootstrap mounts proc/sys inside the root file
# system: unmount anything left there first, and never cross into another file system.
purge() {
  findmnt -n -l -o TARGET | awk -v d="$1/" 'index($0, d) == 1' | sort -r \
    | while read -r m; do umount -l "$m" || true; done || true
  rm -rf --one-file-system "$1"
}
# Leftovers of a build that was killed (we hold the lock, so none is running).
for d in "$CACHE"/build.*; do
  if [ -d "$d" ]; then purge "$d"; fi
done
build=$(mktemp -d "$CACHE/build.XXXXXX")
cleanup() { purge "$build"; }
trap cleanup EXIT

start=$SECONDS
say "building the guest image in $CACHE (mirror $MIRROR); this takes about 1.5 minutes"
log="$build/debootstrap.log"
if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$build/rootfs" "$MIRROR" >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  [ -f "$build/rootfs/debootstrap/debootstrap.log" ] && tail -n 40 "$build/rootfs/debootstrap/debootstrap.log" >&2
  die "debootstrap failed (see above)"
fi
say "debootstrap done after $((SECONDS - start)) s"

root="$build/rootfs"
install -m 0755 "$HERE/rxe-init" "$root/sbin/rxe-init"
echo rxe-guest >"$root/etc/hostname"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log

kernel=$(ls "$root"/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
[ -n "$kernel" ] || die "no kernel in $root/boot"
initrd="$root/boot/initrd.img-${kernel##*/vmlinuz-}"
[ -s "$initrd" ] || die "no initramfs $initrd"
cp "$kernel" "$build/vmlinuz"
cp "$initrd" "$build/initrd.img"

# Room for what the guest writes to / (runs use a throwaway overlay anyway).
size_mb=$(( $(du -sm --one-file-system "$root" | cut -f1) * 5 / 4 + 512 ))
truncate -s "${size_mb}M" "$build/guest.img"
mkfs.ext4 -q -F -L rxe-root -d "$root" "$build/guest.img" || die "mkfs.ext4 -d failed"
# The root file system is not needed any more: free its disk before compressing.
purge "$root"
qemu-img convert -c -O qcow2 "$build/guest.img" "$build/guest.qcow2" || die "qemu-img convert failed"
rm -f "$build/guest.img"

# Replace the cached files (renames, so a guest already running keeps its open files).
rm -f "$CACHE/inputs.sha256"
mv -f "$build/vmlinuz" "$CACHE/vmlinuz"
mv -f "$build/initrd.img" "$CACHE/initrd.img"
mv -f "$build/guest.qcow2" "$CACHE/guest.qcow2"
echo "$hash" >"$CACHE/inputs.sha256"
say "guest image ready after $((SECONDS - start)) s: $(du -sh "$CACHE" | cut -f1) in $CACHE (kernel ${kernel##*/vmlinuz-})"
