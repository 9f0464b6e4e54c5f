#!/usr/bin/env bash
# Run a command with simulated EFA devices (efa-sim/): libfabric's unmodified efa provider
# over a user-space stand-in for rdma-core's libibverbs.so.1 and libefa.so.1. No hardware,
# no root, no kernel module. It models semantics, not speed: never quote a figure from it
# as EFA performance.
#
#   ci/efa-sim.sh [--devices NAME|FILE] [--expect | --expect-knobs "KNOBS"] CMD ARGS...
#     --devices   a file of efa-sim/devices (minimal [default], minimal-nouwr, p5, p5en, p6)
#                 or a path to a device file
#     --expect    fail unless every fault knob that some process had on acted at least once
#     --expect-knobs "reorder delay_us ..."   fail unless these knobs were on and acted
#                 (efa-sim/stats.sh: what each knob did, from the processes' exit lines)
#   ci/efa-sim.sh --build-only   build (or check) the cache and exit
#
# Builds once and caches under $EFA_SIM_CACHE (default ~/.cache/rdma-bench/efa-sim):
#   rdma-core 56.1 (the orig tarball from Debian 13 trixie's sources, fetched through a
#   private apt configuration; its headers and libraries are what libfabric builds against),
#   libfabric 2.6.0 from ../shared/libfabric with --enable-efa against it, plus fabtests,
#   and the simulator's two libraries (rebuilt whenever efa-sim/ changes).
# Then runs CMD with:
#   LD_LIBRARY_PATH   the simulator first, then the efa-enabled libfabric
#   PKG_CONFIG_PATH   that libfabric (a `cargo` inside builds against it)
#   PATH              its fabtests (fi_rdm_pingpong, fi_rma_bw, ...), fi_info, and the
#                     simulator's test programs (efa-sim-hazards: efa-sim/hazards.sh;
#                     efa-sim-inorder128)
#   SYSFS_PATH        a private sysfs tree for the devices (removed afterwards)
#   EFA_SIM_DEVICES   the device file
#   EFA_SIM_STATS     unless set: a file of the run where each process that opened a device
#                     writes what the device and each fault knob did; summed at the end
#   RDMA_BENCH_TOPOLOGY  the hwloc export of the machine the devices stand in for, where the
#                     device file names one ("# topology: PATH"): rdma-bench's NIC groups
#   FI_EFA_ENABLE_SHM_TRANSFER=0  unless set: peers on this host go through the device,
#                     not libfabric's shm provider
#   CARGO_TARGET_DIR  target-efa-sim unless set (a separate build against this libfabric)
# Fault knobs (seeded, reproducible): EFA_SIM_SEED, EFA_SIM_REORDER (window),
# EFA_SIM_DELAY_US, EFA_SIM_RNR_PERMILLE, EFA_SIM_DIE_AFTER, EFA_SIM_TIMEOUT_MS,
# EFA_SIM_LOSE_WRITE_PERMILLE,
# EFA_SIM_LOG (0-3). See efa-sim/README.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${EFA_SIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-bench/efa-sim}
LF_SRC=${LIBFABRIC_SRC:-$ROOT/../shared/libfabric}
LF_VERSION=2.6.0
RC_VERSION=56.1
RC_TARBALL=rdma-core_$RC_VERSION.orig.tar.gz
RC_SHA256=63ce7f2baa7242c2dbc76375dac957c420187dd27f8c5e148efc07971ee522a8
JOBS=${EFA_SIM_JOBS:-2}

log() { echo "efa-sim.sh: $*" >&2; }
die() { log "$*"; exit 1; }

DEVICES=minimal
BUILD_ONLY=
EXPECT=
while [ $# -gt 0 ]; do
  case "$1" in
    --expect) EXPECT=(--expect); shift ;;
    --expect-knobs) EXPECT=(--expect-knobs "${2:?--expect-knobs needs knob names}"); shift 2 ;;
    --devices) DEVICES=${2:?--devices needs a name or a file}; shift 2 ;;
    --devices=*) DEVICES=${1#--devices=}; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[ -n "$BUILD_ONLY" ] || [ $# -gt 0 ] || die "usage: ci/efa-sim.sh [--devices NAME|FILE] CMD ARGS..."
if [ -f "$DEVICES" ]; then DEVFILE=$(cd "$(dirname "$DEVICES")" && pwd)/$(basename "$DEVICES")
elif [ -f "$ROOT/efa-sim/devices/$DEVICES" ]; then DEVFILE=$ROOT/efa-sim/devices/$DEVICES
else die "no device file $DEVICES (efa-sim/devices has: $(ls "$ROOT/efa-sim/devices" | tr '\n' ' '))"
fi

mkdir -p "$CACHE"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/efa-sim-build.XXXXXX")
RUN=
cleanup() { rm -rf "$WORK"; [ -z "$RUN" ] || rm -rf "$RUN"; }
trap cleanup EXIT
quiet() { "$@" >"$WORK/log" 2>&1 || { tail -40 "$WORK/log" >&2; die "failed: $*"; }; }
fresh() { [ -f "$1/.stamp" ] && [ "$(cat "$1/.stamp")" = "$2" ]; }

# --- rdma-core 56.1: fetched once from Debian 13's sources (a private apt set-up) ---
fetch_rdma_core() {
  local tb=$CACHE/src/$RC_TARBALL apt=$CACHE/apt
  if [ -f "$tb" ] && echo "$RC_SHA256  $tb" | sha256sum -c --status; then return; fi
  command -v apt-get >/dev/null || die "apt-get is needed to fetch $RC_TARBALL (or put it in $CACHE/src)"
  log "fetching $RC_TARBALL from Debian trixie's sources (a private apt configuration)"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$CACHE/src" "$WORK/dl"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    > "$apt/sources.list"
  local opts=(-q -o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
              -o Dir::Etc::parts=/nonexistent -o "Dir::State::Lists=$apt/lists"
              -o "Dir::Cache=$apt/cache" -o Debug::NoLocking=1)
  [ "$(id -u)" -ne 0 ] || opts+=(-o APT::Sandbox::User=root)
  quiet apt-get "${opts[@]}" update
  # The .dsc answers 404 on the mirror; the orig tarball is what is needed.
  (cd "$WORK/dl" && apt-get "${opts[@]}" source --download-only rdma-core >"$WORK/log" 2>&1) || true
  [ -f "$WORK/dl/$RC_TARBALL" ] || { tail -20 "$WORK/log" >&2; die "could not fetch $RC_TARBALL"; }
  echo "$RC_SHA256  $WORK/dl/$RC_TARBALL" | sha256sum -c --status || die "$RC_TARBALL: checksum mismatch"
  mv "$WORK/dl/$RC_TARBALL" "$tb"
}

RC=$CACHE/rdma-core-$RC_VERSION
RC_STAMP="rdma-core $RC_VERSION $RC_SHA256 cmake -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 -DENABLE_STATIC=0"
if ! fresh "$RC" "$RC_STAMP"; then
  fetch_rdma_core
  for t in cmake ninja pkg-config; do command -v $t >/dev/null || die "$t is missing (SETUP_EFA_SIM=1 ci/setup.sh installs it)"; done
  log "building rdma-core $RC_VERSION into $RC (about a minute, once)"
  t0=$SECONDS
  rm -rf "$RC"
  tar xzf "$CACHE/src/$RC_TARBALL" -C "$WORK"
  mkdir -p "$WORK/rdma-core-$RC_VERSION/build"
  (cd "$WORK/rdma-core-$RC_VERSION/build" &&
    quiet cmake -GNinja -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 -DENABLE_STATIC=0 \
      -DCMAKE_INSTALL_PREFIX="$RC" .. &&
    quiet ninja -j"$JOBS" && quiet ninja install)
  echo "$RC_STAMP" > "$RC/.stamp"
  log "rdma-core built in $((SECONDS - t0)) s"
fi

# --- libfabric 2.6.0 with the efa provider, and its fabtests ---
LF_TARBALL=$LF_SRC/libfabric-$LF_VERSION.tar.xz
[ -f "$LF_TARBALL" ] || die "no $LF_TARBALL (../shared/libfabric holds the releases)"
LF=$CACHE/libfabric-$LF_VERSION-efa
# The tarball's contents, not its time (../shared is copied afresh onto a new machine).
LF_STAMP="libfabric $(sha256sum "$LF_TARBALL" | cut -c1-16) --enable-efa rdma-core $RC_VERSION v1"
if ! fresh "$LF" "$LF_STAMP"; then
  log "building libfabric $LF_VERSION with efa, and fabtests, into $LF (a few minutes, once)"
  t0=$SECONDS
  rm -rf "$LF"
  tar xf "$LF_TARBALL" -C "$WORK"
  (cd "$WORK/libfabric-$LF_VERSION" &&
    quiet ./configure --prefix="$LF" --enable-efa="$RC" --disable-verbs --disable-usnic \
      --disable-psm2 --disable-psm3 --disable-opx --disable-psm --disable-ucx --disable-lpp \
      --disable-cxi CPPFLAGS="-I$RC/include" LDFLAGS="-L$RC/lib -Wl,-rpath-link,$RC/lib" &&
    quiet make -j"$JOBS" install)
  grep -q '^#define HAVE_EFA 1' "$WORK/libfabric-$LF_VERSION/config.h" || die "libfabric configured without efa"
  (cd "$WORK/libfabric-$LF_VERSION/fabtests" &&
    quiet ./configure --prefix="$LF" --with-libfabric="$LF" &&
    quiet make -j"$JOBS" install)
  echo "$LF_STAMP" > "$LF/.stamp"
  log "libfabric and fabtests built in $((SECONDS - t0)) s"
fi

# --- the simulator's libraries, rebuilt when its sources change ---
SIM_HASH=$(cat "$ROOT"/efa-sim/*.c "$ROOT"/efa-sim/tests/*.c "$ROOT"/efa-sim/*.h "$ROOT"/efa-sim/*.map \
  "$ROOT"/efa-sim/Makefile | sha256sum | cut -c1-16)
SIM=$CACHE/sim-$SIM_HASH
if [ ! -f "$SIM/efa-sim-inorder128" ]; then
  log "building the simulator into $SIM"
  # Other checkouts share this cache and may be running theirs: only builds nobody used for
  # a day go (each run touches its own).
  find "$CACHE" -maxdepth 1 -name 'sim-*' -type d -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
  quiet make -C "$ROOT/efa-sim" RDMA_CORE="$RC" LIBFABRIC="$LF" OUT="$WORK/sim"
  mkdir -p "$SIM" && cp "$WORK"/sim/{libibverbs.so.1,libefa.so.1,efa-sim-hazards,efa-sim-gpu,efa-sim-inorder128} "$SIM/"
  cp -r "$WORK/sim/fakecuda" "$SIM/" # a stand-in libcuda.so.1 for efa-sim/gpu.sh
fi
touch "$SIM"
if [ -n "$BUILD_ONLY" ]; then
  log "ready: rdma-core $RC, libfabric $LF, simulator $SIM"
  exit 0
fi

# --- run ---
RUN=$(mktemp -d "${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/efa-sim.XXXXXX")
export SYSFS_PATH=$RUN/sysfs
export EFA_SIM_DEVICES=$DEVFILE
# The machine the devices stand in for, for rdma-bench's NIC groups (--topology): live hwloc
# sees no simulated device. A device file names it with a "# topology: PATH" line (relative
# to the checkout); unless RDMA_BENCH_TOPOLOGY is set already.
if [ -z "${RDMA_BENCH_TOPOLOGY:-}" ]; then
  topo=$(sed -n 's/^# topology: *//p' "$DEVFILE" | head -1)
  [ -n "$topo" ] && [ -f "$ROOT/$topo" ] && export RDMA_BENCH_TOPOLOGY=$ROOT/$topo
fi
export LD_LIBRARY_PATH=$SIM:$LF/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$LF/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export PATH=$SIM:$LF/bin:$PATH
export FI_EFA_ENABLE_SHM_TRANSFER=${FI_EFA_ENABLE_SHM_TRANSFER:-0}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-efa-sim}
OWN_STATS=
if [ -z "${EFA_SIM_STATS:-}" ]; then
  export EFA_SIM_STATS=$RUN/stats OWN_STATS=1
fi
log "devices $(basename "$DEVFILE") ($(grep -c '^device ' "$DEVFILE") NICs); sysfs $SYSFS_PATH"
set +e
"$@"
rc=$?
set -e
if [ -n "$OWN_STATS" ] && { [ -s "$EFA_SIM_STATS" ] || [ -n "$EXPECT" ]; }; then
  if [ -n "$EXPECT" ]; then
    "$ROOT/efa-sim/stats.sh" "${EXPECT[@]}" "$EFA_SIM_STATS" "efa-sim.sh" || [ $rc -ne 0 ] || rc=1
  else
    "$ROOT/efa-sim/stats.sh" "$EFA_SIM_STATS" "efa-sim.sh"
  fi
elif [ -n "$EXPECT" ]; then
  log "--expect: EFA_SIM_STATS was set by the caller ($EFA_SIM_STATS): check it there"; rc=1
fi
exit $rc
