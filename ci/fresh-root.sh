#!/usr/bin/env bash
# Run a command of this checkout inside a fresh, minimal Debian 12 root: the machine a new
# user starts from (debootstrap minbase: no compiler, no -dev package, no hwloc plugin).
# Whatever the command needs, the README's commands must install.
#
#   ci/fresh-root.sh 'ci/main.sh && ci/test.sh'
#
# - The root is unpacked anew every run from a cached debootstrap tarball (made once, a few
#   minutes): nothing installed by an earlier run survives.
# - Bound in: this checkout and ../shared (same paths, so relative paths hold), the host's
#   Rust toolchain (RUSTUP_HOME, CARGO_HOME: none can be fetched in a bare root here), and
#   caches that hold downloads and builds, never installed packages: apt's .deb archive,
#   ci/libfabric.sh's libfabric builds, ci/efa-sim.sh's rdma-core/libfabric/simulator
#   builds, the VM's kernel packages (ci/.vm/work is in the checkout).
# - Cargo builds into the root (CARGO_TARGET_DIR=/root/target), never reusing the host's.
# Needs root (mount, chroot) and debootstrap (installed when missing).
# Env: FRESH_ROOT_CACHE (default ~/.cache/rdma-bench), FRESH_ROOT_DIR (default
#      /var/tmp/rdma-bench-fresh-root), FRESH_ROOT_KEEP=1 keeps the root afterwards.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: ci/fresh-root.sh 'COMMAND'" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=$(cd "$REPO/.." && pwd)/shared
CACHE=${FRESH_ROOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-bench}
ROOT=${FRESH_ROOT_DIR:-/var/tmp/rdma-bench-fresh-root}
TARBALL=$CACHE/debootstrap-bookworm-minbase.tar
RH=${RUSTUP_HOME:-$HOME/.rustup}
CH=${CARGO_HOME:-$HOME/.cargo}
log() { echo "fresh-root: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "needs root (mount, chroot)"; exit 2; }
mkdir -p "$CACHE/apt-archives/partial" "$CACHE/libfabric" "$CACHE/efa-sim"

if [ ! -f "$TARBALL" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  tmp=$(mktemp -d /var/tmp/debootstrap.XXXXXX)
  log "debootstrap --variant=minbase bookworm (once; cached in $TARBALL)"
  debootstrap --variant=minbase bookworm "$tmp" ${MIRROR:+"$MIRROR"} >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf "$tmp"; exit 1; }
  tar -C "$tmp" -cf "$TARBALL.part" . && mv "$TARBALL.part" "$TARBALL"
  rm -rf "$tmp"
fi

mnt() { # mnt SRC DEST [ro]
  mkdir -p "$ROOT$2"
  mount --bind "$1" "$ROOT$2"
  [ "${3:-}" != ro ] || mount -o remount,bind,ro "$ROOT$2"
}
# Unmount everything under the root, then delete it, never while anything is still mounted
# there: the checkout is bound in from the same filesystem, which --one-file-system would
# not stop at.
unmount_all() {
  local m
  awk -v r="$ROOT" 'index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
remove_root() {
  unmount_all
  if awk -v r="$ROOT" 'index($2, r "/") == 1 {found = 1} END {exit !found}' /proc/mounts; then
    log "still mounted under $ROOT; not deleting it"
    return 1
  fi
  rm -rf --one-file-system "$ROOT"
}
cleanup() {
  if [ -n "${FRESH_ROOT_KEEP:-}" ]; then unmount_all; else remove_root; fi
}
trap cleanup EXIT

# A previous run killed before its cleanup may have left its root and mounts behind.
remove_root
mkdir -p "$ROOT"
tar -C "$ROOT" -xf "$TARBALL"
# tar restores the mode of the tree's top, a mktemp folder (0700): the root's / must be
# traversable by its non-root users (apt's _apt, munge's postinst under su).
chmod 755 "$ROOT"
cp /etc/apt/sources.list.d/debian.sources "$ROOT/etc/apt/sources.list.d/" 2>/dev/null || true
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
# A real install names its own host in /etc/hosts (Debian's installer does); debootstrap does
# not, and MPI and Slurm look the name up.
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$(uname -n)" > "$ROOT/etc/hosts"
CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -f "$CA" ] && cp -L "$CA" "$ROOT/etc/host-ca.crt"

mount -t proc proc "$ROOT/proc"
mkdir -p "$ROOT/sys"; mount --rbind /sys "$ROOT/sys"; mount --make-rslave "$ROOT/sys"
mkdir -p "$ROOT/dev"; mount --rbind /dev "$ROOT/dev"; mount --make-rslave "$ROOT/dev"
# A /dev/shm of its own, as a booted system has: libfabric's shm regions left by processes
# the tests kill stay inside the run, and the host's leftovers cannot collide with its names.
mount -t tmpfs -o mode=1777,size=4g tmpfs "$ROOT/dev/shm"
mnt "$RH" "$RH" ro
mnt "$CH" "$CH"
mnt "$REPO" "$REPO"
[ -d "$SHARED" ] && mnt "$SHARED" "$SHARED" ro
mnt "$CACHE/apt-archives" /var/cache/apt/archives
mnt "$CACHE/libfabric" /root/.cache/rdma-bench/libfabric
mnt "$CACHE/efa-sim" /root/.cache/rdma-bench/efa-sim

log "running in a fresh Debian 12 root ($ROOT): $1"
chroot "$ROOT" /usr/bin/env -i HOME=/root RUSTUP_HOME="$RH" CARGO_HOME="$CH" \
  PATH="$CH/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" TERM=dumb \
  CI="${CI:-}" CARGO_TARGET_DIR=/root/target SSL_CERT_FILE=/etc/host-ca.crt \
  CARGO_HTTP_CAINFO=/etc/host-ca.crt /bin/bash -c "cd '$REPO' && $1"
