#!/usr/bin/env bash
# GPU memory on a GPU host with no Rust: the GPU tests, the visibility race before and after
# its fix, then rdma-bench against fabtests on libfabric's shm, two processes, in two tables
# (GPU memory, host memory).
#
#   ci/gpu-host.sh pack   on a machine with Rust (this project's dev box): build what the GPU
#                         host runs into gpu-carry/ (git-ignored): rdma-bench and the GPU test
#                         binaries built against libfabric 2.6.0's headers, the shared
#                         libraries a bare host may lack, and libfabric-2.6.0.tar.xz
#                         (OURS_B_REV=REV: also commit REV's UCX build, for an A/B of two
#                         builds: ci/gpu-host-ucx.sh's UCX_OURS_B_BIN)
#   ci/gpu-host.sh run    on the GPU host (a CUDA toolkit, no Rust), from the checkout with
#                         gpu-carry/ beside it: build libfabric 2.6.0 with CUDA and its
#                         fabtests (cached in gpu-carry/build), run the GPU tests with
#                         REQUIRE_CUDA_PROVIDER=1, show the visibility race before and after
#                         the fix, print the tables (GPU memory, then host memory)
#
# The visibility step runs tests/gpu_visibility.rs twice: with GPU_VISIBILITY_ALLOC=unsynced
# (every buffer without CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, as before the fix: expected to FAIL,
# "RACE SHOWN: N of M completions came before their bytes") and as built (must PASS, "no
# stale read in M completions"). Only the second decides the exit status.
#
# The tables: for WRITE bandwidth (rdma-bench --workload write --pages 64 against
# fi_rma_bw -o writedata -W 64: the same 64 source and 64 target slots; up to 4 KiB
# --single-buffer, an immediate on every WRITE as writedata has), SEND bandwidth
# (--workload send --single-buffer against fi_rdm_tagged_bw, which sends from one buffer into
# one) and one-way latency (--workload lat --op send against fi_rdm_pingpong; both the mean
# of the run), at each size: ROUNDS interleaved rounds (the first tool alternates), the best
# round of each tool, ours / theirs, and what each side does per iteration beside each row.
# fabtests get -D cuda for the GPU table and nothing for the host one (as rdma-bench --mem
# host asks for no FI_HMEM). Bandwidth ratios should be at least 1.0, latency ratios at most
# 1.05. Both sides of every run are separate processes on 127.0.0.1 (server first), so shm
# may move GPU memory by CUDA IPC and host memory by CMA.
#
# Env: ROUNDS (3), SIZES (4K,64K,1M), BYTES (per bandwidth run, 1 GiB), LAT_ITERS (2000),
#      ROWS (write,send,lat), FT_WINDOW (fabtests' -W of the bandwidth rows, 64: their
#      window, which each side drains and acknowledges before the next; a larger one shows
#      what their window costs them against ours, which keeps posting),
#      CUDA (/usr/local/cuda), MEM (cuda,host: the tables, in this order), OURS_ARGS (more
#      flags for both rdma-bench sides, e.g. "--nic-opt hmem=on": FI_HMEM asked for host
#      memory, as before the fix, which turns shm's CMA off),
#      CORES (server,client cores of every table run, both tools: 1,3, or 0,1 below 4 CPUs;
#      none: unpinned; in the write and send rows the client's core is the sender's for
#      both tools, so ours' server, which sends, takes it),
#      STEPS (tests,record,visibility,table,loopback,proxy: which parts `run` does; record
#      checks the run record's CUDA facts; loopback documents the one-process protocol and
#      runs the ladder there; proxy runs transport-proxy's GPU tests, issue 27's GOAL lines;
#      not in the default: proxycrash runs the case that died of SIGSEGV CRASH_RUNS (10)
#      times per variant and prints any crash's frames; efasim runs ci/gpu-efa-sim.sh (the efa provider on the simulated
#      device), ucx runs ci/gpu-host-ucx.sh (UCX 1.22 from the libucx-cu12 wheel,
#      rdma-bench --backend ucx against ucx_perftest), gpuwrite2p runs ci/gpu-write-2p.sh
#      (issue 27's gpu-write between rdma-bench server and client, host and GPU memory),
#      gpuwrite2p-ucx the same on the UCX backend (the wheel's UCX; UCX_STEP_TLS as the ucx
#      step's), ucxkill the kill soak over UCX's tcp with GPU memory, UCX's puts against the
#      default (KILL_TRIALS, KILL_SEED)),
#      PROXY_TESTS (the proxy step's tests, space-separated names of gpu_proxy's tests;
#      default all), JOBS (nproc);
#      for a dry run of the script itself without a GPU: MEM=host and LIBFABRIC_PREFIX (a
#      libfabric 2.6.0 install with fabtests, e.g. ci/libfabric.sh 2.6.0's); the GPU steps
#      then say SKIPPED.
# Exit status: 0 when every step ran and every GPU test passed; 1 otherwise. The last line
# says the same ("gpu-host: run PASSED" or "run FAILED"), for output read through a pipe.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source ci/suspect.sh
source ci/listening.sh
CARRY=$ROOT/gpu-carry
MODE=${1:-}
log() { echo "gpu-host: $*" >&2; }

pack() {
  source ci/setup.sh >/dev/null
  local v=2.6.0 prefix td json
  prefix=$(ci/libfabric.sh "$v")
  td=${CARGO_TARGET_DIR:-$ROOT/target}-lf-$v
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  log "building rdma-bench (release) and the GPU tests against libfabric $v's headers"
  cargo build --release -q -p bench-cli --bin rdma-bench --target-dir "$td"
  json=$(mktemp); trap 'rm -f "$json"' RETURN
  cargo test -q --release -p transport-efa --no-run --message-format=json --target-dir "$td" \
    --test gpu --test gpu_ipc --test gpu_visibility --test conformance_shm > "$json"
  rm -rf "$CARRY"; mkdir -p "$CARRY/bin" "$CARRY/tests" "$CARRY/lib"
  cp "$td/release/rdma-bench" "$CARRY/bin/"
  grep '"test":true' "$json" | grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//' |
    sort -u | while read -r t; do
      cp "$t" "$CARRY/tests/$(basename "$t" | sed 's/-[0-9a-f]*$//')"
    done
  pack_proxy "$td"
  strip "$CARRY"/bin/* "$CARRY"/tests/* "$CARRY"/proxy/*
  # What the binaries link that a bare Ubuntu GPU host may lack (libfabric itself is built
  # there, with CUDA).
  source ci/host-libs.sh
  host_libs_into "$CARRY/lib" libhwloc.so.15 libudev.so.1 libibverbs.so.1 libnl-3.so.200 \
    libnl-route-3.so.200 || true
  cp "${LIBFABRIC_SRC:-$ROOT/../shared/libfabric}/libfabric-$v.tar.xz" "$CARRY/"
  ci/gpu-efa-sim.sh pack  # step efasim: rdma-core 56.1's tarball
  ci/gpu-host-ucx.sh pack "$td" "$CARRY"
  if [ -d .git ] || git rev-parse --git-dir >/dev/null 2>&1; then
    ex=$(git rev-parse --git-common-dir)/info/exclude
    mkdir -p "$(dirname "$ex")"
    grep -qx '/gpu-carry/' "$ex" 2>/dev/null || echo '/gpu-carry/' >> "$ex"
  fi
  du -sh "$CARRY" >&2
  log "packed: carry gpu-carry/ to the GPU host and run ci/gpu-host.sh run there"
}

# The GPU producer of transport-proxy (issue 27): its test binary, run by the `proxy` step.
pack_proxy() {
  local td=$1 json t
  json=$(mktemp)
  cargo test -q --release -p transport-proxy --no-run --message-format=json --target-dir "$td" \
    --test gpu_proxy --test proxy_shm > "$json"
  mkdir -p "$CARRY/proxy" "$td/gpu-carry-syms"
  for name in gpu_proxy proxy_shm; do
    t=$(grep '"test":true' "$json" | grep -o "\"executable\":\"[^\"]*$name[^\"]*\"" |
      sed 's/^"executable":"//; s/"$//' | head -1)
    [ -n "$t" ] || { log "pack: no $name test binary"; exit 1; }
    cp "$t" "$CARRY/proxy/$name"
    # Unstripped, for ci/crash-frames.sh here (the carried copy is stripped).
    cp "$t" "$td/gpu-carry-syms/$name"
  done
  rm -f "$json"
}

build_libfabric() {
  local cuda=$1 p=$CARRY/build/libfabric-cuda stamp
  stamp="$(stat -c %s "$CARRY/libfabric-2.6.0.tar.xz") $cuda -g"
  if [ -f "$p/.stamp" ] && [ "$(cat "$p/.stamp")" = "$stamp" ]; then echo "$p"; return; fi
  log "building libfabric 2.6.0 with CUDA ($cuda) and its fabtests into $p"
  rm -rf "$p" "$CARRY/build/src"; mkdir -p "$CARRY/build/src"
  tar xf "$CARRY/libfabric-2.6.0.tar.xz" -C "$CARRY/build/src"
  local tree=$CARRY/build/src/libfabric-2.6.0 jobs=${JOBS:-$(nproc)}
  # -g: frames of a crash inside it resolve to functions and lines (ci/crash-frames.sh);
  # the rest is configure's own default (-O2 -DNDEBUG is added to it).
  (cd "$tree" && CFLAGS="-g -pipe -fvisibility=hidden" ./configure -q --prefix="$p" --with-cuda="$cuda" --enable-cuda-dlopen \
      --disable-efa --disable-verbs --disable-usnic --disable-psm2 --disable-psm3 \
      --disable-opx --disable-psm --disable-ucx --disable-lpp --disable-cxi >/dev/null &&
    make -s -j"$jobs" install >/dev/null 2>&1)
  (cd "$tree/fabtests" && ./configure -q --prefix="$p" --with-libfabric="$p" \
      --with-cuda="$cuda" >/dev/null && make -s -j"$jobs" install >/dev/null 2>&1)
  echo "$stamp" > "$p/.stamp"
  echo "$p"
}

bytes_of() {
  local s=${1^^}
  case $s in *K) echo $(( ${s%K} << 10 )) ;; *M) echo $(( ${s%M} << 20 )) ;; *G) echo $(( ${s%G} << 30 )) ;; *) echo "$s" ;; esac
}

# note ROW MEM: what each side of a table row does per iteration (printed beside the row)
note() {
  local d=; [ "$2" = cuda ] && d=" -D cuda"
  case $1 in
    write) echo "ours: above 4 KiB repeats of 64 WRITEs from 64 SIZE slots into 64 (random order), the last with an immediate once the other 63 completed; up to 4 KiB one WRITE with immediate per op from one buffer into one; at most W (FT_WINDOW) WRITEs in flight (--window), kept going; the target lands the region (make_gpu_visible, GPU idle) and acknowledges once at the end; clock: first post to that ack | fi_rma_bw -o writedata$d -W W: windows of W WRITEs with data from W SIZE slots into W; per window the client waits for its W completions, the server takes W completions and sends a 4-byte ack the client waits for; clock: first post to the last ack" ;;
    send) echo "ours: SENDs of SIZE from one buffer into one receive buffer, receives kept posted (1024 deep up to 16 KiB, 256 from 64 KiB, 16 MiB of receives between; credits back every quarter of that), at most W in flight (--window); the receiver lands and acknowledges once at the end; clock: first post to that ack | fi_rdm_tagged_bw$d -W W: windows of W tagged sends into W receives posted per window, then a 4-byte ack per window; clock: first post to the last ack" ;;
    lat) echo "ours: --op send ping-pong, each side lands the message (make_gpu_visible) before it answers, the round trip stops after the client landed the answer; mean one-way = total / iters / 2 | fi_rdm_pingpong$d: send/recv ping-pong, mean one-way (usec/xfer)" ;;
  esac
}

# verdict STATUS STEPS: the run's last line says whether it passed, so output read through
# `tail` or a log still tells, where the exit status may not have come along.
verdict() {
  if [ "$1" = 0 ]; then
    log "run PASSED (STEPS=$2)"
  else
    log "run FAILED (STEPS=$2): the FAILED lines above say where"
  fi
  return "$1"
}

run() {
  [ -x "$CARRY/bin/rdma-bench" ] || { log "no gpu-carry/: run 'ci/gpu-host.sh pack' on the dev box first"; exit 1; }
  local cuda=${CUDA:-/usr/local/cuda} lf steps=${STEPS:-tests,record,visibility,table,loopback,proxy} status=0
  local mems=${MEM:-cuda,host} gpu=0 asked=$steps  # asked: as given (the GPU steps may go below)
  [[ ,$mems, == *,cuda,* ]] && gpu=1
  # efasim: GPU memory through the efa provider on the simulated device (ci/gpu-efa-sim.sh)
  if [[ ,$steps, == *,efasim,* ]]; then
    ci/gpu-efa-sim.sh run || status=1
    [ "$steps" != efasim ] || { verdict $status "$asked"; return; }
  fi
  # ucxkill: a dead peer over UCX's tcp with GPU memory (ci/kill-soak.sh, 4 ranks on GPU 0,
  # one SIGKILLed mid-transfer; UCX 1.22 from the wheel over tcp,cuda_copy). First with UCX's
  # puts (--nic-opt write=put), whose target answers each put: survivors are expected to
  # abort, which shows the exposure (not counted); then the default, a rendezvous active
  # message per WRITE into GPU memory: every defect column must be zero (KILL_TRIALS, 10).
  if [[ ,$steps, == *,ucxkill,* ]]; then
    local ucxlib
    if ucxlib=$(CARRY=$CARRY ci/gpu-host-ucx.sh unpack); then
      local soak=(env KILL_SOAK_BIN="$CARRY/bin/rdma-bench-ucx" ci/kill-soak.sh --no-build
        --versions "" --ucx tcp,cuda_copy --ucx-lib "$ucxlib" --modes ranks --phases transfer
        --seed "${KILL_SEED:-5}")
      log "ucxkill: UCX's puts into GPU memory, --nic-opt write=put (expected to FAIL)"
      if "${soak[@]}" --trials 5 --args "--mem cuda --nic-opt write=put" >&2; then
        log "ucxkill: no survivor aborted with UCX's puts: the exposure was not shown this time"
      else
        log "ucxkill: EXPOSURE SHOWN with UCX's puts"
      fi
      log "ucxkill: the default, rendezvous active messages (must PASS)"
      "${soak[@]}" --trials "${KILL_TRIALS:-10}" --args "--mem cuda" >&2 || status=1
    else
      status=1
    fi
    [ "$steps" != ucxkill ] || { verdict $status "$asked"; return; }
  fi
  command -v jq >/dev/null || { log "jq is needed"; exit 1; }
  lf=${LIBFABRIC_PREFIX:-$(build_libfabric "$cuda")}
  export LD_LIBRARY_PATH=$lf/lib:$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$lf/bin:$PATH
  local RB=$CARRY/bin/rdma-bench
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >&2 || true
  local gpu_steps="tests visibility loopback proxy proxycrash" st
  if [ $gpu = 0 ]; then
    for st in $gpu_steps; do
      [[ ,$steps, == *,$st,* ]] && log "step $st: SKIPPED (MEM=$mems: a dry run without GPU memory)"
    done
    steps=$(echo ",$steps," | sed 's/,tests,/,/; s/,visibility,/,/; s/,loopback,/,/; s/,proxy,/,/; s/,proxycrash,/,/')
  fi

  if [[ ,$steps, == *,tests,* ]]; then
    for t in "$CARRY"/tests/*; do
      log "test $(basename "$t") (REQUIRE_CUDA_PROVIDER=1)"
      if ! REQUIRE_CUDA_PROVIDER=1 LIBFABRIC_EXPECT=2.6 "$t" --test-threads=1 --nocapture >&2; then
        log "FAILED: $(basename "$t")"; status=1
      fi
    done
  fi

  if [[ ,$steps, == *,record,* ]]; then
    # The run record of a GPU run: the CUDA driver's version and GPU 0's name as the driver
    # reports them (the same as nvidia-smi's), on both sides; libfabric as loaded.
    local mem=host; [ $gpu = 1 ] && mem=cuda
    log "the run record with --mem $mem (record.cuda, record.peer.cuda, record.backend)"
    local rec want=null
    [ "$mem" = cuda ] && want=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | jq -R .)
    if rec=$("$RB" loopback --provider shm --mem "$mem" -s 64K -n 2 --json) &&
      jq -e --argjson gpu "$want" '.record as $r | $r.peer.cuda == $r.cuda
        and $r.backend.library == "libfabric" and ($r.backend.version | startswith("2.6"))
        and ($r.commit | length > 0)
        and (if $gpu == null then $r.cuda == null
             else ($r.cuda.driver | test("^[0-9]+\\.[0-9]+$")) and $r.cuda.gpus == [$gpu] end)' \
        <<<"$rec" >/dev/null; then
      jq -c '.record | {commit, host, kernel, instance, cuda, backend: (.backend | {library, version, provider, fabric, device})}' <<<"$rec" >&2
    else
      log "FAILED: the run record (expected GPU ${want}):"; jq '.record' <<<"${rec:-null}" >&2 || true
      status=1
    fi
  fi

  if [[ ,$steps, == *,visibility,* ]]; then
    # The trait's promise on GPU memory, before and after the fix, in one binary: the same
    # test on buffers without CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (before: expected to fail),
    # then on GpuBuffer::alloc's (after: must pass).
    local t=$CARRY/tests/gpu_visibility out
    out=$(mktemp)
    log "visibility BEFORE the fix (buffers without SYNC_MEMOPS): expected to FAIL"
    if REQUIRE_CUDA_PROVIDER=1 GPU_VISIBILITY_ALLOC=unsynced "$t" --test-threads=1 --nocapture \
        > "$out" 2>&1; then
      log "visibility BEFORE: passed, the race was NOT reproduced on this host: $(grep -E 'stale read|RACE' "$out" | tail -1)"
    else
      log "visibility BEFORE: FAILED as expected: $(grep -E 'RACE SHOWN' "$out" | tail -1)"
    fi
    grep -E 'completions read stale' "$out" | sed 's/^/  before: /' >&2 || true
    log "visibility AFTER the fix (GpuBuffer::alloc, SYNC_MEMOPS set): must PASS"
    if REQUIRE_CUDA_PROVIDER=1 "$t" --test-threads=1 --nocapture > "$out" 2>&1; then
      log "visibility AFTER: passed: $(grep -E 'stale read' "$out" | tail -1)"
    else
      log "visibility AFTER: FAILED: $(grep -E 'RACE SHOWN|panicked|SKIPPED' "$out" | tail -2 | tr '\n' ' ')"
      status=1
    fi
    grep -E 'completions read stale' "$out" | sed 's/^/  after: /' >&2 || true
    rm -f "$out"
  fi

  if [[ ,$steps, == *,loopback,* ]]; then
    # One process: shm cannot use CUDA IPC between endpoints of one process, so rdma-bench
    # loopback registers GPU memory without FI_HMEM_DEVICE_ONLY (gpu_ipc=off) and shm copies
    # through its host bounce buffers. With gpu_ipc=on the receiver's cudaIpcOpenMemHandle
    # fails and so does the transfer: shown here, not hidden.
    log "one process (loopback), shm, GPU memory: the protocol shm can use there"
    "$RB" loopback --provider shm --mem cuda --single-buffer -s 1M -n 200 >&2 || status=1
    "$RB" loopback --provider shm --mem cuda --single-buffer -s 1M -n 20 --idle-timeout 5 \
      --nic-opt gpu_ipc=on >&2 && log "gpu_ipc=on in one process: worked" ||
      log "gpu_ipc=on in one process: failed, as expected (no CUDA IPC within a process)"
    "$RB" loopback --provider shm --mem cuda --ladder --nics-per-gpu 4 --no-verify -n 100 \
      --rounds 3 >&2 || status=1
    # Two processes, every byte verified: the IPC path the table below measures.
    # The README's two-node recipe: a server with no layout flags takes the client's GPU
    # memory; the client verifies by default.
    log "two processes (server, client), shm, GPU memory, every byte verified"
    local port cs; cs=$(mktemp); port=$(free_port) || status=1
    timeout 120 "$RB" server --listen 127.0.0.1:$port --provider shm --sessions 1 >&2 &
    local spid=$!
    wait_listening "$port" 30 || true  # past that the client runs anyway, and fails
    timeout 120 "$RB" client --connect 127.0.0.1:$port --provider shm --mem cuda \
      --sizes 4K,64K,1M,16M --pages 16 | tee "$cs" >&2 || status=1
    grep -q "cuda memory.*every byte verified\|GPU memory.*every byte verified" "$cs" ||
      { log "FAILED: the client/server run did not say GPU memory, every byte verified"; status=1; }
    rm -f "$cs"
    wait $spid || true
    log "two processes: the ladder with 4 NICs per GPU (CUDA IPC)"
    port=$(free_port) || status=1
    timeout 300 "$RB" server --listen 127.0.0.1:$port --provider shm --mem cuda --nics-per-gpu 4 >&2 &
    spid=$!
    wait_listening "$port" 30 || true
    timeout 290 "$RB" client --connect 127.0.0.1:$port --provider shm --mem cuda --ladder \
      --nics-per-gpu 4 --no-verify -n 100 --rounds 3 >&2 || status=1
    kill $spid 2>/dev/null; wait $spid 2>/dev/null || true
  fi

  if [[ ,$steps, == *,proxy,* ]]; then
    # Issue 27: CUDA kernels (NVRTC, needs $CUDA/lib64/libnvrtc.so) feed the proxy ring; shm,
    # one process, two endpoints. Passes when every test passes (every byte verified);
    # the GOAL lines say whether the figures meet the issue's goals.
    local t=$CARRY/proxy/gpu_proxy out; out=$(mktemp)
    log "proxy: GPU-initiated WRITEs through the proxy ring (REQUIRE_CUDA_PROVIDER=1)"
    if [ ! -x "$t" ]; then
      log "FAILED: no $t (pack again)"; status=1
    else
      # Each test in a process of its own: run 2 (all eight in one process) died of a
      # segmentation fault with no test output (not yet explained); run 3 ran them one by
      # one and each passed. A crash stays a failure, and names its test.
      local name failed=0
      for name in ${PROXY_TESTS:-$(LD_LIBRARY_PATH=$cuda/lib64:$LD_LIBRARY_PATH "$t" --list 2>/dev/null |
          sed -n 's/: test$//p')}; do
        if FI_LOG_LEVEL=warn LD_LIBRARY_PATH=$cuda/lib64:$LD_LIBRARY_PATH REQUIRE_CUDA_PROVIDER=1 \
            timeout 300 "$t" --exact "$name" --test-threads=1 --nocapture >> "$out" 2>&1; then
          log "proxy: $name passed"
        else
          # (|| true: under set -e and pipefail a crash that printed no panic must not end
          # the script here)
          log "FAILED: proxy test $name:"
          { grep -E -A12 'panicked|NVRTC' "$out" || tail -25 "$out"; } | head -40 >&2 || true
          failed=1
        fi
      done
      if [ $failed = 0 ] && grep -q 'test result: ok' "$out"; then
        log "proxy: every test passed"
      else
        status=1
      fi
    fi
    grep -E '^(ring-only|copies|latency|sync|bandwidth|CudaProducer|[0-9]+ kernel commands|.*every byte verified)' "$out" >&2 || true
    # Whether libfabric's CUDA copy synchronised the whole device (what hung run 1's
    # GPU-memory bandwidth with a kernel waiting on the proxy): its one-time warning.
    grep -m2 -E 'cudaDeviceSynchronize|cudaHostRegister|register shm with iface' "$out" >&2 ||
      log "proxy: libfabric did not warn of a device-wide cudaDeviceSynchronize"
    echo; echo "== issue 27: kernel-initiated WRITEs through the proxy ring (shm, one process)"
    grep -E '^GOAL' "$out" || { log "FAILED: the proxy tests printed no GOAL line"; status=1; }
    rm -f "$out"
    # rdma-bench's gpu-write with GPU threads as the producer (host memory, every byte
    # verified): passes when it exits 0 and says "every byte verified".
    log "proxy: rdma-bench loopback --workload gpu-write --producer cuda (host memory, shm)"
    out=$(mktemp)
    if LD_LIBRARY_PATH=$cuda/lib64:$LD_LIBRARY_PATH timeout 300 "$RB" loopback \
        --workload gpu-write --producer cuda --provider shm --sizes 4K,64K,1M -n 200 > "$out" 2>&1 &&
        grep -q "every byte verified" "$out"; then
      log "proxy: gpu-write --producer cuda passed"
    else
      log "FAILED: gpu-write --producer cuda"; status=1
    fi
    cat "$out" >&2; rm -f "$out"
  fi

  if [[ ,$steps, == *,proxycrash,* ]]; then
    # Issue 27's SIGSEGV, as a regression check: the case that died (host memory, 64 KiB,
    # 2 in 5 processes) CRASH_RUNS (10) times, FI_HMEM asked (hmem=auto on this host) and
    # not. The cause was the test's endpoint pair, which did not poll each side once before
    # its proxies started (transport-efa's crate docs, tests/shm_same_process.rs): libfabric
    # 2.6's shm then took a's first command with an address computed from 0 and b died in
    # smr_progress_cmd. Each failure prints its frames (tests/common/crash.rs), resolved
    # here by ci/crash-frames.sh (libfabric is built with -g); the test binary's on the dev
    # box against its unstripped copy. Passes when every process passed.
    local t=$CARRY/proxy/gpu_proxy runs=${CRASH_RUNS:-10} v i out rc bad
    out=$(mktemp)
    crash_case() { # variant test-name env...
      local v=$1 name=$2; shift 2
      bad=0
      for i in $(seq "$runs"); do
        rc=0
        env "$@" FI_LOG_LEVEL=warn LD_LIBRARY_PATH=$cuda/lib64:$LD_LIBRARY_PATH \
          timeout 180 "$t" --exact "$name" --test-threads=1 --nocapture > "$out" 2>&1 || rc=$?
        if [ $rc != 0 ]; then
          bad=$((bad + 1)); status=1
          log "proxycrash: $v run $i exited $rc"
          if [ $bad -le 2 ]; then
            ci/crash-frames.sh "$out" | grep -E 'signal|instruction|frame  [2-5] ' >&2 || true
            grep -E -A8 'panicked' "$out" >&2 || tail -5 "$out" >&2 || true
          fi
        fi
      done
      log "proxycrash: $v: $bad of $runs processes failed"
    }
    local k=(PROXY_E2E_ONLY=host:65536 REQUIRE_CUDA_PROVIDER=1) c=kernel_writes_over_shm_every_byte_verified
    crash_case "kernel host:65536" $c "${k[@]}"
    crash_case "kernel host:65536, hmem=off (no FI_HMEM)" $c "${k[@]}" PROXY_SHM_HMEM=off
    rm -f "$out"
  fi

  # Issue 27, two processes: rdma-bench server + client --workload gpu-write --producer cuda
  # over shm, host then GPU memory (ci/gpu-write-2p.sh; not in the default STEPS).
  if [[ ,$steps, == *,gpuwrite2p,* ]]; then
    RB=$RB CUDA=$cuda ci/gpu-write-2p.sh || status=1
  fi

  # The same two processes on the UCX backend (UCX 1.22 with CUDA from the wheel): the
  # client's GPU memory moved by cuda_copy, the proxy's immediates after a flush.
  if [[ ,$steps, == *,gpuwrite2p-ucx,* ]]; then
    local ucxlib
    if ucxlib=$(CARRY=$CARRY ci/gpu-host-ucx.sh unpack); then
      LD_LIBRARY_PATH=$ucxlib:$LD_LIBRARY_PATH RB=$CARRY/bin/rdma-bench-ucx CUDA=$cuda \
        BACKEND_ARGS="--backend ucx --provider ${UCX_STEP_TLS:-sm,cuda_copy,cuda_ipc,self} --nic-opt peer_errors=off" \
        CUDA_CLIENT_ARGS= ci/gpu-write-2p.sh || status=1
    else
      status=1
    fi
  fi

  if [[ ,$steps, == *,table,* ]]; then
    local rounds=${ROUNDS:-3} bytes=${BYTES:-$((1 << 30))} lat_iters=${LAT_ITERS:-2000}
    local port out; out=$(mktemp -d)
    local mem dev=() pin_srv=() pin_cli=() ftw=${FT_WINDOW:-64}
    # Each side of every run, ours and theirs, on a core of its own (CORES=server,client;
    # CORES=none: wherever the scheduler puts them). Unpinned, two busy-polling processes
    # that the scheduler happens to stack on one core, or on two hyperthreads of one, read
    # 4x slower round trips: the 4 KiB latency moved between 0.47 and 2.0 us between rounds.
    pin_sides; pin_srv=("${PIN_SRV[@]}") pin_cli=("${PIN_CLI[@]}")
    IFS=, read -r -a sizes <<< "${SIZES:-4K,64K,1M}"
    IFS=, read -r -a memv <<< "$mems"
    # ours ROW SIZE -> figure (Gbit/s, or one-way us for lat)
    ours() {
      local row=$1 size=$2 b n args
      b=$(bytes_of "$size"); n=$(( bytes / b )); [ $n -ge 64 ] || n=64
      port=$(free_port) || return 1
      case $row in
        # Above 4 KiB, 64 pages: fi_rma_bw -W 64's footprint (64 source and 64 target slots);
        # one source and one target buffer stayed in cache and read 2.7x fi_rma_bw at 1 MiB
        # on the 2-core box, which said nothing about the transport. Up to 4 KiB (shm's
        # inject size) every WRITE carries an immediate, as fi_rma_bw -o writedata's do:
        # shm copies such WRITEs through its inject buffers, while plain ones (the pages'
        # WRITEs but the last) take its "fast RMA" path, one process_vm_writev system call
        # per WRITE (smr_rma.c), which held 4 KiB pages to 18 Gbit/s against 48 with an
        # immediate on each; 64 slots of 4 KiB stay in cache either way
        # --window: at most the fabtests' -W operations in flight, as theirs
        write) if [ "$b" -le 4096 ]; then
                 args=(--workload write --single-buffer -s "$size" -n "$n" --no-verify --window "$ftw")
               else
                 local reps=$(( n / 64 )); [ $reps -ge 2 ] || reps=2
                 args=(--workload write --pages 64 -s "$size" -n "$reps" --no-verify --window "$ftw")
               fi ;;
        send) args=(--workload send --single-buffer -s "$size" -n "$n" --no-verify --window "$ftw") ;;
        lat) args=(--workload lat --op send -s "$size" -n "$lat_iters") ;;
      esac
      # shellcheck disable=SC2206
      local extra=(${OURS_ARGS:-})
      # The sender on the sender's core: fabtests' client posts the WRITEs and SENDs
      # (bandwidth_rma's writedata and bandwidth() branch on opts.dst_addr), ours' server
      # does (the active side), so ours' two sides swap cores in those rows.
      local ps=("${pin_srv[@]}") pc=("${pin_cli[@]}")
      case $row in write|send) ps=("${pin_cli[@]}"); pc=("${pin_srv[@]}") ;; esac
      timeout 120 "${ps[@]}" "$RB" server --listen 127.0.0.1:$port --provider shm \
        --mem "$mem" --sessions 1 "${extra[@]}" > "$out/srv" 2>&1 &
      local spid=$!
      wait_listening "$port" 30 || true  # past that the client runs anyway, and reports
      if ! timeout 120 "${pc[@]}" "$RB" client --connect 127.0.0.1:$port --provider shm --mem "$mem" \
          "${args[@]}" "${extra[@]}" --json > "$out/ours.json" 2> "$out/ours.err"; then
        log "rdma-bench $row $size failed: $(tail -2 "$out/ours.err" | tr '\n' ' ')"
        kill $spid 2>/dev/null; wait $spid 2>/dev/null; echo 0; return
      fi
      wait $spid 2>/dev/null || true
      if [ "$row" = lat ]; then
        jq -r '.seconds * 1e6 / .ops / 2' "$out/ours.json"
      else
        jq -r '.gbps' "$out/ours.json"
      fi
    }
    theirs() {
      local row=$1 size=$2 b n tool
      b=$(bytes_of "$size"); n=$(( bytes / b )); [ $n -ge 64 ] || n=64
      port=$(free_port 3) || return 1
      case $row in
        # -w W: the warm-up one whole window, drained before the clock starts (the default
        # 10 leaves 10 warm-up sends in flight into fi_rdm_tagged_bw's first timed window)
        write) tool=(fi_rma_bw -p shm -o writedata "${dev[@]}" -W "$ftw" -w "$ftw" -S "$b" -I "$n") ;;
        send) tool=(fi_rdm_tagged_bw -p shm "${dev[@]}" -W "$ftw" -w "$ftw" -S "$b" -I "$n") ;;
        lat) tool=(fi_rdm_pingpong -p shm "${dev[@]}" -S "$b" -I "$lat_iters") ;;
      esac
      timeout 120 "${pin_srv[@]}" "${tool[@]}" -E=$port -B $((port + 1)) > "$out/tsrv" 2>&1 &
      local spid=$!
      wait_listening "$port" 30 || true
      if ! timeout 120 "${pin_cli[@]}" "${tool[@]}" -E=$port -B $((port + 2)) 127.0.0.1 \
          > "$out/tcli" 2>&1; then
        log "${tool[0]} $size failed: $(tail -2 "$out/tcli" | tr '\n' ' ')"
        kill $spid 2>/dev/null; wait $spid 2>/dev/null; echo 0; return
      fi
      wait $spid 2>/dev/null || true
      if [ "$row" = lat ]; then
        awk '$1 ~ /^[0-9]+(\.[0-9]+)?[kmg]?$/ && NF >= 7 {v = $6} END {print v + 0}' "$out/tcli"
      else
        fabtests_gbps "$out/tcli"
      fi
    }
    best() {  # ROW A B: the better of two figures (higher bandwidth, lower latency; 0 = failed)
      awk -v r="$1" -v a="$2" -v b="$3" 'BEGIN {
        if (a == 0) {print b; exit} if (b == 0) {print a; exit}
        if (r == "lat") print (a < b ? a : b); else print (a > b ? a : b) }'
    }
    for mem in "${memv[@]}"; do
      dev=(); [ "$mem" = cuda ] && dev=(-D cuda)
      echo
      echo "== $mem memory, libfabric $(fi_info --version 2>/dev/null | awk '/libfabric:/ {print $2}') shm, two processes (cores ${PIN_CORES}), $(nproc) cores; fabtests ${dev[*]:-without -D}, -W $ftw; ours --window $ftw"
      # The card, in the table itself: a figure is compared only with one of the same card.
      echo "   on $(nvidia-smi --query-gpu=name,serial --format=csv,noheader 2>/dev/null | head -1 || echo 'no nvidia-smi')"
      printf '%-6s %5s %10s %10s %7s %7s  %-18s %s\n' row size ours theirs ratio median "median's 95% CI" \
        "(Gbit/s, lat: one-way us; best of $rounds interleaved rounds; median: of the rounds' ratios, the figure to quote)"
      IFS=, read -r -a rowv <<< "${ROWS:-write,send,lat}"
      for row in "${rowv[@]}"; do
        for size in "${sizes[@]}"; do
          local bo=0 bt=0 o t r rr=()
          for r in $(seq 1 "$rounds"); do
            if [ $((r % 2)) = 1 ]; then o=$(ours $row "$size"); t=$(theirs $row "$size")
            else t=$(theirs $row "$size"); o=$(ours $row "$size"); fi
            log "$mem $row $size round $r: ours $o, theirs $t"
            bo=$(best $row "$bo" "$o"); bt=$(best $row "$bt" "$t"); rr+=("$(ratio "$o" "$t")")
          done
          local ratio failed=
          ratio=$(ratio "$bo" "$bt")
          # A tool that failed every round has no figure: the row, and the run, fail.
          awk -v a="$bo" -v b="$bt" 'BEGIN {exit !(a + 0 <= 0 || b + 0 <= 0)}' &&
            { failed=" FAILED (no figure)"; status=1; }
          printf '%-6s %5s %10.2f %10.2f %7s %7s  %-18s%s%s\n' "$row" "$size" "$bo" "$bt" "$ratio" \
            "$(median "${rr[@]}")" "$(interval "$row" "${rr[@]}")" "$failed" "$(suspect "$row" "$ratio" "$(median "${rr[@]}")")"
        done
        echo "       per iteration: $(note $row "$mem")"
      done
    done
    rm -rf "$out"
  fi

  if [[ ,$steps, == *,ucx,* ]]; then
    CARRY=$CARRY MEM=$mems ci/gpu-host-ucx.sh run || status=1
  fi
  verdict $status "$asked"
}

case $MODE in
  pack) pack ;;
  run) run ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
