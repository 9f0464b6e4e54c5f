#!/usr/bin/env bash
# GPU memory through libfabric 2.6.0's unmodified efa provider on the simulated EFA device
# (efa-sim/), on the GPU host (a CUDA toolkit and a compiler; no Rust, no rdma-core, no
# network). The simulator takes dmabuf and GPU-address registrations and moves their bytes
# with CUDA copies (efa-sim/gpu.c), so the provider runs its FI_HMEM CUDA path as on a p5:
# p2p (device RDMA) reported, FI_OPT_CUDA_API_PERMITTED off, dmabuf at the page-aligned base.
# It models semantics, not speed: no figure from here is EFA performance.
#
#   ci/gpu-efa-sim.sh pack    on the dev box (ci/gpu-host.sh pack calls it): rdma-core 56.1's
#                             tarball into gpu-carry/ (the simulator's sources travel with the
#                             checkout; libfabric-2.6.0.tar.xz and rdma-bench are gpu-host.sh's)
#   ci/gpu-efa-sim.sh build   build only, into gpu-carry/build/efa-sim (cached): rdma-core 56.1
#                             (cmake + make), the simulator, libfabric 2.6.0 with
#                             --enable-efa=<rdma-core> --with-cuda --enable-cuda-dlopen, fabtests
#   ci/gpu-efa-sim.sh run     on the GPU host (ci/gpu-host.sh run with STEPS=efasim calls it):
#                             build, then on the p5 device file (32 NICs; GPU 0's group of 4,
#                             the host has one GPU):
#                               device     efa-sim-gpu: the device alone (rdma-core's API), GPU
#                                          memory by address and as a dmabuf, WRITE and READ,
#                                          every byte checked after its completion
#                               providers  fi_info -p efa: 32 domains, FI_HMEM, no p2p warning
#                               loopback   rdma-bench loopback --provider efa --mem cuda, paged
#                                          and single buffer, every byte verified
#                               twoproc    rdma-bench server + client --mem cuda (simulated
#                                          hosts 0 and 1), every byte verified
#                               fabtests   fi_rma_bw -p efa -D cuda (write, read, writedata)
#                                          and fi_rdm_tagged_bw -D cuda, data verified (-v);
#                                          fi_rma_bw -o write again with FI_HMEM_CUDA_USE_DMABUF=0
#                                          (GPU memory registered by address)
#                             each check also needs the simulator's counts to show GPU memory
#                             registered and bytes moved by CUDA copies in both directions
#                             (gpu_mrs, gpu_put, gpu_get), so a run that bounced through host
#                             memory cannot pass.
#
# Env: CUDA (/usr/local/cuda; CUDA=none builds libfabric without CUDA: a dry run of the build
#      on a machine without it), MEM (cuda; MEM=host with CUDA=none: a dry run of `run`
#      itself without a GPU, host memory, no GPU counts: the plumbing only), CHECKS (device,providers,loopback,twoproc,fabtests), JOBS (nproc),
#      RDMA_BENCH (gpu-carry/bin/rdma-bench), EFA_SIM_CACHE (pack: where ci/efa-sim.sh keeps
#      the tarball, ~/.cache/rdma-bench/efa-sim), GPU_CARRY (gpu-carry).
# Prints "efasim: PASS <check> ..." or "efasim: FAIL <check> ..." per check and
# "efasim: N passed, M failed"; exit status 0 only when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source ci/listening.sh
CARRY=${GPU_CARRY:-$ROOT/gpu-carry}
B=$CARRY/build/efa-sim
RC_VERSION=56.1
RC_TARBALL=rdma-core_$RC_VERSION.orig.tar.gz
RC_SHA256=63ce7f2baa7242c2dbc76375dac957c420187dd27f8c5e148efc07971ee522a8
LF_VERSION=2.6.0
CUDA=${CUDA:-/usr/local/cuda}
JOBS=${JOBS:-$(nproc)}
MODE=${1:-}

log() { echo "efasim: $*" >&2; }
die() { log "$*"; exit 1; }
fresh() { [ -f "$1/.stamp" ] && [ "$(cat "$1/.stamp")" = "$2" ]; }
# Run quietly into a log; on failure show its tail and stop.
quiet() { "$@" >"$B/log" 2>&1 || { tail -40 "$B/log" >&2; die "failed: $*"; }; }

pack() {
  local src=${EFA_SIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-bench/efa-sim}/src/$RC_TARBALL
  [ -f "$src" ] || die "no $src: ci/efa-sim.sh --build-only fetches it"
  echo "$RC_SHA256  $src" | sha256sum -c --status || die "$src: checksum mismatch"
  mkdir -p "$CARRY"
  cp "$src" "$CARRY/"
  log "packed $RC_TARBALL ($(du -k "$CARRY/$RC_TARBALL" | cut -f1) KiB)"
}

build() {
  mkdir -p "$B"
  local tb=$CARRY/$RC_TARBALL
  RC=$B/rdma-core-$RC_VERSION
  local stamp="rdma-core $RC_VERSION $RC_SHA256 make NEIGH=0"
  if ! fresh "$RC" "$stamp"; then
    [ -f "$tb" ] || die "no $tb: run 'ci/gpu-host.sh pack' (or ci/gpu-efa-sim.sh pack) on the dev box"
    echo "$RC_SHA256  $tb" | sha256sum -c --status || die "$tb: checksum mismatch"
    command -v cmake >/dev/null || die "cmake is needed"
    log "building rdma-core $RC_VERSION into $RC (cmake, make -j$JOBS)"
    local t0=$SECONDS src=$B/src
    rm -rf "$RC" "$src/rdma-core-$RC_VERSION"; mkdir -p "$src"
    tar xzf "$tb" -C "$src"
    local bd=$src/rdma-core-$RC_VERSION/build extra=()
    mkdir -p "$bd"
    # rdma-core's cmake insists on pkg-config; with neighbour resolution off (no libnl) it
    # asks it only for libdrm, which is optional: a stand-in that knows nothing will do.
    if ! command -v pkg-config >/dev/null; then
      printf '#!/bin/sh\n[ "$1" = --version ] && echo 0.29.2 && exit 0\nexit 1\n' > "$B/pkg-config"
      chmod +x "$B/pkg-config"
      extra=(-DPKG_CONFIG_EXECUTABLE="$B/pkg-config")
    fi
    (cd "$bd" && quiet cmake -G "Unix Makefiles" -DNO_PYVERBS=1 -DNO_MAN_PAGES=1 -DENABLE_STATIC=0 \
      -DENABLE_RESOLVE_NEIGH=0 -DCMAKE_INSTALL_PREFIX="$RC" -DCMAKE_INSTALL_LIBDIR=lib \
      "${extra[@]}" .. && quiet make -j"$JOBS" && quiet make install)
    [ -f "$RC/include/infiniband/efadv.h" ] && [ -e "$RC/lib/libefa.so" ] ||
      die "rdma-core installed no efadv.h or libefa.so under $RC"
    echo "$stamp" > "$RC/.stamp"
    rm -rf "$src/rdma-core-$RC_VERSION"
    log "rdma-core built in $((SECONDS - t0)) s"
  fi

  # The simulator, from this checkout, every time (seconds).
  SIM=$B/sim
  rm -rf "$SIM"
  quiet make -C "$ROOT/efa-sim" RDMA_CORE="$RC" OUT="$SIM" "$SIM/libibverbs.so.1" "$SIM/libefa.so.1" \
    "$SIM/efa-sim-gpu"

  local lft=$CARRY/libfabric-$LF_VERSION.tar.xz cuda_args=()
  [ -f "$lft" ] || lft=${LIBFABRIC_SRC:-$ROOT/../shared/libfabric}/libfabric-$LF_VERSION.tar.xz
  [ -f "$lft" ] || die "no libfabric-$LF_VERSION.tar.xz in gpu-carry/ (ci/gpu-host.sh pack puts it there)"
  if [ "$CUDA" != none ]; then
    [ -x "$CUDA/bin/nvcc" ] || [ -f "$CUDA/include/cuda.h" ] || die "no CUDA toolkit at $CUDA (CUDA=...)"
    cuda_args=(--with-cuda="$CUDA" --enable-cuda-dlopen)
  fi
  LF=$B/libfabric-$LF_VERSION-efa-cuda
  stamp="libfabric $(stat -c %s "$lft") efa rdma-core $RC_VERSION cuda $CUDA v1"
  if ! fresh "$LF" "$stamp"; then
    log "building libfabric $LF_VERSION with efa and CUDA ($CUDA), and fabtests, into $LF"
    local t0=$SECONDS tree=$B/src/libfabric-$LF_VERSION
    rm -rf "$LF" "$tree"; mkdir -p "$B/src"
    tar xf "$lft" -C "$B/src"
    (cd "$tree" && quiet ./configure --prefix="$LF" --enable-efa="$RC" "${cuda_args[@]}" \
        --disable-verbs --disable-usnic --disable-psm2 --disable-psm3 --disable-opx \
        --disable-psm --disable-ucx --disable-lpp --disable-cxi \
        CPPFLAGS="-I$RC/include" LDFLAGS="-L$RC/lib -Wl,-rpath-link,$RC/lib" &&
      quiet make -j"$JOBS" install)
    # Needed: efa with ibv_reg_dmabuf_mr, CUDA. HAVE_CUDA_DMABUF (cuMemGetHandleForAddressRange
    # in cuda.h) only decides whether the provider tries dmabuf first: printed, not required.
    local h=$tree/config.h want=(HAVE_EFA HAVE_EFA_DMABUF_MR)
    [ "$CUDA" != none ] && want+=(HAVE_CUDA)
    for d in "${want[@]}"; do
      grep -q "^#define $d 1" "$h" || die "libfabric configured without $d"
    done
    log "libfabric config.h: $(grep -oE '^#define (HAVE_EFA|HAVE_EFA_DMABUF_MR|HAVE_CUDA|HAVE_CUDA_DMABUF|HAVE_CUDA_DMABUF_MAPPING_TYPE_PCIE|ENABLE_CUDA_DLOPEN|HAVE_EFA_DATA_PATH_DIRECT) [01]' "$h" | sed 's/#define //' | tr '\n' ' ')"
    (cd "$tree/fabtests" && quiet ./configure --prefix="$LF" --with-libfabric="$LF" \
        ${cuda_args[0]:+"${cuda_args[0]}"} && quiet make -j"$JOBS" install)
    echo "$stamp" > "$LF/.stamp"
    rm -rf "$tree"
    log "libfabric and fabtests built in $((SECONDS - t0)) s"
  fi
  [ -x "$LF/bin/fi_rma_bw" ] || die "no fi_rma_bw in $LF/bin"
  log "built: rdma-core $RC, simulator $SIM, libfabric $LF"
}

# The sum of COUNTER over an efa-sim stats file's lines (efa-sim/README.md).
counter() {
  awk -v k="$1" '$1 == "efa-sim" && $2 == "stats" { for (i = 3; i <= NF; i++) { split($i, kv, "=")
    if (kv[1] == k) { n = split(kv[2], se, ":"); s += se[n] } } } END { print s + 0 }' "$2"
}

run() {
  build
  # MEM=host: a dry run of the whole script where there is no GPU (host memory, no -D cuda,
  # no GPU counts): it proves the plumbing, not the GPU path.
  local mem=${MEM:-cuda} gpu=1 req=(--require-cuda) hmem=(-c FI_HMEM)
  if [ "$mem" = host ]; then
    gpu=0 req=() hmem=()
    log "MEM=host: a dry run without GPU memory; it says nothing about the GPU path"
  else
    [ "$CUDA" != none ] || die "CUDA=none: built only (no GPU memory to run with; MEM=host runs the plumbing)"
  fi
  local rb=${RDMA_BENCH:-$CARRY/bin/rdma-bench} checks=${CHECKS:-device,providers,loopback,twoproc,fabtests}
  [ -x "$rb" ] || die "no $rb: run 'ci/gpu-host.sh pack' on the dev box"
  local run; run=$(mktemp -d "${TMPDIR:-/tmp}/gpu-efa-sim.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$run'" EXIT
  export SYSFS_PATH=$run/sysfs EFA_SIM_DEVICES=$ROOT/efa-sim/devices/p5
  export RDMA_BENCH_TOPOLOGY=$ROOT/topo/tests/fixtures/p5.48xlarge.xml
  # The simulator's libibverbs.so.1 and libefa.so.1 first (before gpu-carry/lib's real
  # libibverbs), then the efa + CUDA libfabric, then CUDA's runtime (the provider dlopens
  # libcudart for its own checks).
  export LD_LIBRARY_PATH=$SIM:$LF/lib:$CUDA/lib64:$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$LF/bin:$PATH
  export FI_EFA_ENABLE_SHM_TRANSFER=0
  ! command -v nvidia-smi >/dev/null || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >&2 || true
  local passed=0 failed=0
  pass() { passed=$((passed + 1)); echo "efasim: PASS $*"; }
  fail() { failed=$((failed + 1)); echo "efasim: FAIL $*"; }
  # gpu_counts CHECK STATS: the simulator moved GPU bytes both ways in this check.
  gpu_counts() {
    [ $gpu = 1 ] || return 0
    local m p g
    m=$(counter gpu_mrs "$2"); p=$(counter gpu_put "$2"); g=$(counter gpu_get "$2")
    log "$1: simulator: $(efa-sim/stats.sh "$2" "$1" 2>&1 | tail -1)"
    log "$1: GPU regions $m (dmabuf $(counter gpu_dmabuf "$2")), bytes into GPU memory $p, out of it $g"
    if [ "$m" -gt 0 ] && [ "$p" -gt 0 ] && [ "$g" -gt 0 ]; then return 0; fi
    log "$1: the simulator registered $m GPU regions and moved $p bytes into, $g out of GPU memory: GPU memory did not go through the device"
    return 1
  }
  # regions STATS: what the simulator registered, for the PASS lines.
  regions() {
    echo "sim: $(counter gpu_mrs "$1") GPU regions, $(counter gpu_dmabuf "$1") of them dmabuf"
  }
  # provider_words CHECK FILE: what the provider must not say about GPU memory.
  # (A failed CUDA copy, "efa-sim: DMA ...", is only shown: its bytes fail the verification.)
  provider_words() {
    grep -E "efa-sim: DMA" "$2" | head -3 >&2 || true
    if grep -E "Failed to register CUDA buffer|FI_HMEM transfers that require peer to peer support will fail|refused \(E" "$2" >&2; then
      log "$1: the provider or the simulator refused GPU memory (above)"; return 1
    fi
  }

  if [[ ,$checks, == *,device,* ]]; then
    # The device alone, through rdma-core's API: GPU memory by address and as a dmabuf.
    local st=$run/device.stats out=$run/device.out
    if EFA_SIM_STATS=$st timeout 120 "$SIM/efa-sim-gpu" "${req[@]}" > "$out" 2>&1; then
      cat "$out"; pass "device: efa-sim-gpu ($(grep -c ': PASS' "$out") checks; $(grep -c SKIPPED "$out") skipped)"
    else
      cat "$out" >&2; fail "device: efa-sim-gpu"
    fi
  fi

  if [[ ,$checks, == *,providers,* ]]; then
    # The provider's own check at start-up registers a cudaMalloc'd buffer (dmabuf first):
    # p2p_supported_by_device, or the warning below.
    local st=$run/providers.stats out=$run/providers.out n
    if EFA_SIM_STATS=$st FI_LOG_LEVEL=warn fi_info -p efa -f efa "${hmem[@]}" > "$out" 2>&1; then
      n=$(grep -c 'domain: rdmap' "$out" || true)
      if [ "$n" -ge 32 ] && provider_words providers "$out" && [ "$(counter gpu_mrs "$st")" -ge $gpu ]; then
        pass "providers: fi_info -p efa -f efa ${hmem[*]} lists $n domains; the provider's CUDA registration check passed ($(counter gpu_mrs "$st") GPU region(s) on the simulator)"
      else
        tail -20 "$out" >&2
        fail "providers: $n domains with FI_HMEM, GPU regions $(counter gpu_mrs "$st") (want >= 32 and > 0)"
      fi
    else
      tail -20 "$out" >&2; fail "providers: fi_info -p efa -c FI_HMEM failed"
    fi
  fi

  if [[ ,$checks, == *,loopback,* ]]; then
    local mode
    for mode in paged single; do
      # Small enough for a device that copies every packet with CUDA (semantics, not speed).
      local st=$run/loopback-$mode.stats out=$run/loopback-$mode.out err=$run/loopback-$mode.err
      local args=(--pages 16 -n 3)
      [ $mode = single ] && args=(--single-buffer -n 50)
      log "loopback ($mode): rdma-bench loopback --provider efa --mem $mem --gpus 0 --nics-per-gpu 4"
      if EFA_SIM_STATS=$st FI_LOG_LEVEL=warn timeout 300 "$rb" loopback --provider efa --mem "$mem" \
          --gpus 0 --nics-per-gpu 4 --sizes 4K,64K,1M --verify "${args[@]}" -v > "$out" 2> "$err"; then
        cat "$out"
        if grep -q "$mem memory, 1 GPU(s) x 4 NIC(s), every byte verified" "$out" &&
            { [ $gpu = 0 ] || grep -q "CUDA API in the provider off" "$err"; } &&
            grep -q "WRITEs done by the device" "$err" &&
            provider_words "loopback $mode" "$err" && gpu_counts "loopback $mode" "$st"; then
          pass "loopback $mode: efa, $mem memory, 1 GPU x 4 NICs, every byte verified; CUDA API in the provider off; WRITEs done by the device ($(regions "$st"))"
        else
          grep -E "rdma-bench: NIC" "$err" | head -4 >&2; tail -5 "$err" >&2
          fail "loopback $mode: not (cuda memory, 1 GPU x 4 NICs, every byte verified, CUDA API off, device WRITEs, GPU bytes through the simulator)"
        fi
      else
        tail -20 "$err" >&2; fail "loopback $mode: rdma-bench exited non-zero"
      fi
    done
  fi

  if [[ ,$checks, == *,twoproc,* ]]; then
    # Two processes on two simulated p5s (EFA_SIM_HOST), the server taking the client's
    # GPU memory, layout and NICs; the client verifies every byte by default.
    local st=$run/twoproc.stats out=$run/twoproc.out p
    p=$(free_port)  # under set -e: its failure, said on stderr, ends the run
    log "twoproc: rdma-bench server (host 0) + client (host 1) --mem $mem"
    EFA_SIM_STATS=$st EFA_SIM_HOST=0 FI_LOG_LEVEL=warn timeout 300 "$rb" server \
      --listen 127.0.0.1:$p --provider efa --sessions 1 > "$run/server.out" 2>&1 &
    local spid=$!
    if ! wait_listening $p 60; then
      kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
      tail -10 "$run/server.out" >&2
      fail "twoproc: the server did not listen on port $p within 60 s"
    elif EFA_SIM_STATS=$st EFA_SIM_HOST=1 FI_LOG_LEVEL=warn timeout 290 "$rb" client \
        --connect 127.0.0.1:$p --provider efa --mem "$mem" --gpus 0 --nics-per-gpu 4 \
        --sizes 4K,64K,1M,4M --pages 16 -n 3 -v > "$out" 2> "$run/client.err"; then
      local src=0; wait $spid || src=$?
      cat "$out"
      if [ $src -eq 0 ] && grep -q "$mem memory.*every byte verified" "$out" &&
          { [ $gpu = 0 ] || grep -q "CUDA API in the provider off" "$run/client.err"; } &&
          provider_words twoproc "$run/client.err" && provider_words twoproc "$run/server.out" &&
          gpu_counts twoproc "$st"; then
        pass "twoproc: server + client on two simulated p5s, efa, $mem memory, every byte verified ($(regions "$st"))"
      else
        tail -5 "$run/server.out" >&2; tail -5 "$run/client.err" >&2
        fail "twoproc: server rc $src; not (cuda memory, every byte verified, CUDA API off, GPU bytes through the simulator)"
      fi
    else
      kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
      tail -20 "$run/client.err" >&2; tail -10 "$run/server.out" >&2
      fail "twoproc: the client exited non-zero"
    fi
  fi

  if [[ ,$checks, == *,fabtests,* ]]; then
    # fabtests' own FI_HMEM path: the provider registers their cudaMalloc'd buffers itself
    # (dmabuf first, as on a p5); -v checks the data; server and client are processes of
    # their own, -E exchanges addresses over TCP on this host.
    local t st cmd p crc src
    # The last one with dmabuf off: the provider registers GPU memory by address
    # (ibv_reg_mr on the device pointer, nvidia-peermem's path on a p5).
    for t in "fi_rma_bw -D cuda -o write -I 10 -W 8 -S all -v" \
             "fi_rma_bw -D cuda -o read -I 10 -W 8 -S all -v" \
             "fi_rma_bw -D cuda -o writedata -I 10 -W 8 -S all -v" \
             "fi_rdm_tagged_bw -D cuda -I 10 -W 8 -S all -v" \
             "FI_HMEM_CUDA_USE_DMABUF=0 fi_rma_bw -D cuda -o write -I 10 -W 8 -S all -v"; do
      [ $gpu = 1 ] || t=${t//-D cuda /}
      read -r -a cmd <<< "env $t"
      st=$run/ft.stats; rm -f "$st"; p=$(free_port) || { fail "fabtests: no free port"; continue; }
      EFA_SIM_STATS=$st FI_LOG_LEVEL=warn timeout 240 "${cmd[@]}" -p efa -E=$p > "$run/ft.server" 2>&1 &
      local spid=$!
      # The server's out-of-band socket (-E) is up once it listens: no fixed sleep.
      if ! wait_listening $p 60; then
        kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
        tail -10 "$run/ft.server" >&2
        fail "fabtests: $t -p efa: the server did not listen on port $p within 60 s"
        continue
      fi
      crc=0; EFA_SIM_STATS=$st FI_LOG_LEVEL=warn timeout 240 "${cmd[@]}" -p efa -E=$p 127.0.0.1 \
        > "$run/ft.client" 2>&1 || crc=$?
      src=0; wait $spid || src=$?
      if [ $crc -eq 0 ] && [ $src -eq 0 ] && provider_words "$t" "$run/ft.client" &&
          provider_words "$t" "$run/ft.server" && gpu_counts "$t" "$st"; then
        pass "fabtests: $t -p efa ($(grep -c '^[0-9]' "$run/ft.client") size rows; $(regions "$st"))"
      else
        echo "--- server:" >&2; tail -15 "$run/ft.server" >&2
        echo "--- client:" >&2; tail -15 "$run/ft.client" >&2
        fail "fabtests: $t -p efa (server rc $src, client rc $crc)"
      fi
    done
  fi

  echo "efasim: $passed passed, $failed failed"
  [ $failed -eq 0 ]
}

case $MODE in
  pack) pack ;;
  build) build ;;
  run) run ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
