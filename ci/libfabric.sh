#!/usr/bin/env bash
# Build (once) and cache a libfabric release from ../shared/libfabric, with its fabtests.
#
#   ci/libfabric.sh VERSION            prints the install prefix; builds it first if missing
#   ci/libfabric.sh 1.17 --fabtests    fabtests 1.17.1 against the system libfabric (Debian's
#                                      1.17), for reference runs; prints their prefix
#
# Installs go to $LIBFABRIC_CACHE (default ~/.cache/rdma-bench/libfabric), one folder per
# version, reused while the tarball and this script are unchanged. Providers: shm, tcp, rxm,
# sockets, udp (no hardware ones). On a GPU host, LIBFABRIC_CUDA=/usr/local/cuda adds
# `--with-cuda --enable-cuda-dlopen` (a separate cache folder); LIBFABRIC_VERBS=1 adds the
# verbs provider (rdma-core's headers: libibverbs-dev, librdmacm-dev; a separate cache folder),
# which ci/compare-ref.sh's libfabric row runs over Soft-RoCE in the VM.
#
# Use an install with
#   PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig LD_LIBRARY_PATH=$PREFIX/lib cargo test ...
set -euo pipefail
cd "$(dirname "$0")/.."
V=${1:?usage: ci/libfabric.sh VERSION [--fabtests]}
MODE=${2:-}
SRC=${LIBFABRIC_SRC:-$PWD/../shared/libfabric}
CACHE=${LIBFABRIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-bench/libfabric}
JOBS=$(nproc)

log() { echo "libfabric.sh: $*" >&2; }

# The source tarball for a version; "1.17" means Debian's 1.17.0, whose fabtests are 1.17.1's.
case "$V" in
  1.17|1.17.*) TARBALL=$SRC/libfabric-1.17.1.tar.xz; MODE=--fabtests ;;
  *) TARBALL=$SRC/libfabric-$V.tar.xz ;;
esac
[ -f "$TARBALL" ] || { log "no source tarball $TARBALL (../shared/libfabric holds the releases)"; exit 1; }

suffix=${LIBFABRIC_CUDA:+-cuda}${LIBFABRIC_VERBS:+-verbs}
if [ "$MODE" = --fabtests ]; then PREFIX=$CACHE/fabtests-$V$suffix; else PREFIX=$CACHE/$V$suffix; fi
# The stamp names what built the cache: the tarball's and this script's contents (hashes, not
# the tarball's time: ../shared is copied afresh onto a new machine, and a new time alone
# rebuilt every cache).
STAMP="$(sha256sum "$TARBALL" | cut -c1-16) $(sha256sum "$0" | cut -c1-16) ${LIBFABRIC_CUDA:-} ${LIBFABRIC_VERBS:-}"
if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$STAMP" ]; then
  echo "$PREFIX"; exit 0
fi

log "building $(basename "$TARBALL") into $PREFIX (a few minutes, once)"
rm -rf "$PREFIX"
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
tar xf "$TARBALL" -C "$WORK"
TREE=$(echo "$WORK"/libfabric-*)
quiet() { "$@" >"$WORK/log" 2>&1 || { tail -40 "$WORK/log" >&2; log "failed: $*"; exit 1; }; }

if [ "$MODE" = --fabtests ]; then
  # Against the system libfabric (pkg-config finds Debian's headers in /usr/include).
  (cd "$TREE/fabtests" && quiet ./configure --prefix="$PREFIX" && quiet make -j"$JOBS" install)
else
  cuda=()
  [ -n "${LIBFABRIC_CUDA:-}" ] && cuda=(--with-cuda="$LIBFABRIC_CUDA" --enable-cuda-dlopen)
  verbs=(--disable-verbs)
  [ -n "${LIBFABRIC_VERBS:-}" ] && verbs=(--enable-verbs)
  (cd "$TREE" && quiet ./configure --prefix="$PREFIX" --disable-efa "${verbs[@]}" \
      --disable-usnic --disable-psm2 --disable-psm3 --disable-opx --disable-psm \
      --disable-ucx --disable-lpp --disable-cxi "${cuda[@]}" &&
    quiet make -j"$JOBS" install)
  (cd "$TREE/fabtests" && quiet ./configure --prefix="$PREFIX" --with-libfabric="$PREFIX" &&
    quiet make -j"$JOBS" install)
fi
echo "$STAMP" > "$PREFIX/.stamp"
log "done: $PREFIX"
echo "$PREFIX"
