#!/usr/bin/env bash
# Run the install commands docs/install.md gives for one distribution, exactly as written
# there, inside a fresh minimal root of that distribution; then build rdma-bench with them and
# run a verified shm loopback. The doc cannot drift from what works: its command blocks are
# read from the file itself.
#
#   ci/distro-check.sh ubuntu-24.04      (also: ubuntu-22.04, debian-12)
#
# - docs/install.md marks each command block this script runs with a comment line
#   `<!-- distro-check: NAME -->` right above the block's opening fence; the blocks of NAME
#   run in the order of the file, in one bash (`set -euxo pipefail`), as root, from the
#   checkout's top folder. A distribution with no marked block is an error, not a pass.
# - Not run here, said so in the doc: the rustup step (the host's toolchain is bound in, as
#   ci/fresh-root.sh does: nothing can fetch it in a bare root here) and the EFA installer
#   (no EFA device); the distribution's libfabric-dev stands in for the installer's.
# - The root: debootstrap --variant=minbase of the distribution, made once and cached as a
#   tarball in $CACHE, unpacked anew every run. Ubuntu's archive keyring is not packaged in
#   Debian 12, so the Ubuntu bootstrap itself runs with --no-check-gpg unless
#   /usr/share/keyrings/ubuntu-archive-keyring.gpg exists here; every apt-get inside the
#   root then checks the archive's signatures with the root's own ubuntu-keyring.
# - The root's sudo is a shim that runs its command (the doc's commands say sudo; the root
#   is run as root and has no sudo package in minbase).
# - Builds go to a folder of the root bound over the checkout's target/, so the doc's
#   `./target/release/rdma-bench` works and the host's target/ is never touched.
# Needs root (mount, chroot) and debootstrap.
# Env: FRESH_ROOT_CACHE (default ~/.cache/rdma-bench), DISTRO_CHECK_DIR (default
#      /var/tmp/rdma-bench-distro-NAME), DISTRO_CHECK_KEEP=1 keeps the root afterwards.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: ci/distro-check.sh ubuntu-24.04|ubuntu-22.04|debian-12" >&2; exit 2; }
NAME=$1
case "$NAME" in
  ubuntu-24.04) SUITE=noble;    MIRROR=http://archive.ubuntu.com/ubuntu ;;
  ubuntu-22.04) SUITE=jammy;    MIRROR=http://archive.ubuntu.com/ubuntu ;;
  debian-12)    SUITE=bookworm; MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
                MIRROR=${MIRROR:-http://deb.debian.org/debian} ;;
  *) echo "distro-check: unknown distribution '$NAME'" >&2; exit 2 ;;
esac
REPO=$(cd "$(dirname "$0")/.." && pwd)
DOC=$REPO/docs/install.md
CACHE=${FRESH_ROOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-bench}
ROOT=${DISTRO_CHECK_DIR:-/var/tmp/rdma-bench-distro-$NAME}
TARBALL=$CACHE/debootstrap-$SUITE-minbase.tar
RH=${RUSTUP_HOME:-$HOME/.rustup}
CH=${CARGO_HOME:-$HOME/.cargo}
log() { echo "distro-check: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "needs root (mount, chroot)"; exit 2; }

# The doc's blocks for NAME, in order: the lines between the fences that follow a marker.
steps=$(awk -v want="$NAME" '
  /^<!-- distro-check: .* -->$/ { split($0, w, " "); armed = armed || (w[3] == want); next }
  /^```/ && !inside { inside = 1; run = armed; armed = 0; n += run; next }
  /^```/ && inside { inside = 0; next }
  inside && run { print }
  !inside { armed = 0 }
  END { if (n == 0) exit 1 }' "$DOC") || { log "docs/install.md marks no block for $NAME"; exit 1; }

mkdir -p "$CACHE/apt-archives-$SUITE/partial"
if [ ! -f "$TARBALL" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  opts=(--variant=minbase)
  if [ "$SUITE" != bookworm ]; then
    opts+=(--components=main,universe)
    if [ -f /usr/share/keyrings/ubuntu-archive-keyring.gpg ]; then
      opts+=(--keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg)
    else
      opts+=(--no-check-gpg)
    fi
  fi
  # Debian 12's debootstrap has no script named noble; every Ubuntu release since 7.10 uses
  # the gutsy one.
  script=()
  [ -e "/usr/share/debootstrap/scripts/$SUITE" ] || script=(/usr/share/debootstrap/scripts/gutsy)
  tmp=$(mktemp -d /var/tmp/debootstrap.XXXXXX)
  log "debootstrap ${opts[*]} $SUITE (once; cached in $TARBALL)"
  debootstrap "${opts[@]}" "$SUITE" "$tmp" "$MIRROR" "${script[@]}" >"$CACHE/debootstrap-$SUITE.log" 2>&1 ||
    { tail -20 "$CACHE/debootstrap-$SUITE.log" >&2; rm -rf --one-file-system "$tmp"; exit 1; }
  tar -C "$tmp" -cf "$TARBALL.part" . && mv "$TARBALL.part" "$TARBALL"
  rm -rf --one-file-system "$tmp"
fi

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
cleanup() { if [ -n "${DISTRO_CHECK_KEEP:-}" ]; then unmount_all; else remove_root; fi; }
trap cleanup EXIT
mnt() { mkdir -p "$ROOT$2"; mount --bind "$1" "$ROOT$2"; [ "${3:-}" != ro ] || mount -o remount,bind,ro "$ROOT$2"; }

remove_root
mkdir -p "$ROOT"
tar -C "$ROOT" -xf "$TARBALL"
chmod 755 "$ROOT"
case "$SUITE" in
  bookworm) cp /etc/apt/sources.list.d/debian.sources "$ROOT/etc/apt/sources.list.d/" 2>/dev/null ||
              echo "deb $MIRROR bookworm main" > "$ROOT/etc/apt/sources.list" ;;
  *) printf 'deb %s %s main universe\n' "$MIRROR" "$SUITE" "$MIRROR" "$SUITE-updates" \
       "$MIRROR" "$SUITE-security" > "$ROOT/etc/apt/sources.list" ;;
esac
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$(uname -n)" > "$ROOT/etc/hosts"
CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -f "$CA" ] && cp -L "$CA" "$ROOT/etc/host-ca.crt"
printf '#!/bin/sh\n# distro-check: the root runs as root; sudo runs its command.\nexec "$@"\n' \
  > "$ROOT/usr/local/bin/sudo"
chmod 755 "$ROOT/usr/local/bin/sudo"
printf 'set -euxo pipefail\n%s\n' "$steps" > "$ROOT/root/install-steps.sh"

mount -t proc proc "$ROOT/proc"
mkdir -p "$ROOT/sys"; mount --rbind /sys "$ROOT/sys"; mount --make-rslave "$ROOT/sys"
mkdir -p "$ROOT/dev"; mount --rbind /dev "$ROOT/dev"; mount --make-rslave "$ROOT/dev"
mount -t tmpfs -o mode=1777,size=4g tmpfs "$ROOT/dev/shm"
mnt "$RH" "$RH" ro
mnt "$CH" "$CH"
mnt "$REPO" "$REPO"
mkdir -p "$REPO/target" "$ROOT/root/target"
mnt "$ROOT/root/target" "$REPO/target"
mnt "$CACHE/apt-archives-$SUITE" /var/cache/apt/archives

log "running docs/install.md's $NAME blocks in a fresh $SUITE root ($ROOT):"
sed 's/^/    /' "$ROOT/root/install-steps.sh" >&2
start=$SECONDS
rc=0
chroot "$ROOT" /usr/bin/env -i HOME=/root RUSTUP_HOME="$RH" CARGO_HOME="$CH" \
  PATH="$CH/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" TERM=dumb \
  SSL_CERT_FILE=/etc/host-ca.crt CARGO_HTTP_CAINFO=/etc/host-ca.crt \
  /bin/bash -c "cd '$REPO' && bash /root/install-steps.sh" || rc=$?
if [ "$rc" -eq 0 ]; then
  log "$NAME: PASSED (docs/install.md's blocks ran as written; $((SECONDS - start)) s)"
else
  log "$NAME: FAILED (exit $rc after $((SECONDS - start)) s)"
fi
exit "$rc"
