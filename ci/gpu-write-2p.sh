#!/usr/bin/env bash
# Issue 27 on the GPU host, two processes over shm (or the backend BACKEND_ARGS names):
# `rdma-bench server` and `rdma-bench client --workload gpu-write --producer cuda`. The
# kernel's ring and proxy run in the client process; the server answers both paths from the
# thread on its endpoint (GW_ARGS with `--server-echo ring`: through its own ring and proxy);
# latency is half the ping-pong round trip (the persistent proxy_pingpong kernel against a
# client thread), and bandwidth stops at the server's answer (one return WRITE included).
#
#   ci/gpu-write-2p.sh        (ci/gpu-host.sh runs it as its `gpuwrite2p` step)
#
# MEMS (default "host cuda"), one run each:
#   host       both sides' regions in host memory.
#   cuda       the client's (the kernel's side) in GPU memory, the server's in host memory
#              (`server --mem host`), and the client's GPU memory registered for shm's copies
#              through host memory (`--nic-opt gpu_ipc=off`): no CUDA work in the server.
#   cuda-both  both in GPU memory, CUDA IPC between them (the server copies out of and into
#              the client's GPU memory). On a host with one GPU and no MPS, that copy waits
#              for the GPU to time-slice away from the client's persistent kernel: on the
#              H200 (2026-11-28) a 4 KiB round trip took 1.2 ms with the kernel against 153 us
#              with a CPU producer, and 12.6 us as `cuda` above. It measures CUDA's scheduling
#              of two processes on one GPU, not the proxy; keep -n small.
# Env: RB (rdma-bench, default gpu-carry/bin/rdma-bench), CUDA (/usr/local/cuda), MEMS,
#      BACKEND_ARGS (both sides' backend flags, default "--provider shm"; ci/gpu-host.sh's
#      gpuwrite2p-ucx step passes UCX's), CUDA_CLIENT_ARGS (the client's extra flags with
#      MEMS=cuda, default "--nic-opt gpu_ipc=off", a libfabric option),
#      GW_ARGS (client flags, default "--sizes 8,64,512,4K,64K,1M -n 1000 --pin --rounds 5":
#      each size's two paths five times side by side, compared round by round),
#      PRODUCER (cuda; cpu for a dry run of the script without a GPU: MEMS=host PRODUCER=cpu),
#      SERVER_ARGS (more server flags), CLIENT_TIMEOUT (s, per run, default 240: then the
#      client's threads are listed and it is killed).
# Pass: exit 0; every table ends with "every byte verified (the server checked N landed
# bytes, ...)"; a mismatch is a non-zero exit naming the WRITE and the byte; shm's warning
# that it copied GPU memory through host memory where CUDA IPC was asked fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/listening.sh
RB=${RB:-gpu-carry/bin/rdma-bench}
cuda=${CUDA:-/usr/local/cuda}
export LD_LIBRARY_PATH=$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
read -r -a args <<< "${GW_ARGS:---sizes 8,64,512,4K,64K,1M -n 1000 --pin --rounds 5}"
read -r -a bargs <<< "${BACKEND_ARGS:---provider shm}"
log() { echo "gpu-write-2p: $*" >&2; }
status=0
for mem in ${MEMS:-host cuda}; do
  mem=${mem//,/}
  port=$(free_port) || exit 1
  srvlog=$(mktemp); out=$(mktemp)
  read -r -a sargs <<< "${SERVER_ARGS:-}"
  cextra=()
  case $mem in
    host) ;;
    cuda) sargs=(--mem host ${sargs[@]+"${sargs[@]}"})
      read -r -a cextra <<< "${CUDA_CLIENT_ARGS---nic-opt gpu_ipc=off}" ;;
    cuda-both) mem=cuda ;;
    *) log "MEMS: host, cuda or cuda-both, not $mem"; exit 2 ;;
  esac
  FI_LOG_LEVEL=${FI_LOG_LEVEL:-warn} "$RB" server "${bargs[@]}" --listen "127.0.0.1:$port" --sessions 1 \
    ${sargs[@]+"${sargs[@]}"} >/dev/null 2>"$srvlog" &
  srv=$!
  wait_listening "$port" 30 || true  # past that the client runs anyway, and fails
  echo; echo "== issue 27: gpu-write, two processes (${bargs[*]}), --producer ${PRODUCER:-cuda}, $mem memory"
  echo "   $RB server ${bargs[*]} --listen 127.0.0.1:$port --sessions 1 ${sargs[*]+${sargs[*]}}"
  echo "   $RB client --connect 127.0.0.1:$port ${bargs[*]} --mem $mem --workload gpu-write --producer ${PRODUCER:-cuda} ${args[*]} ${cextra[*]+${cextra[*]}}"
  # (Streamed as it runs, so a run cut short still shows how far it got; CLIENT_TIMEOUT
  # bounds each memory's run.)
  # FI_LOG_LEVEL=warn: libfabric says once when its CUDA copy synchronises the whole device
  # (a copy with memory CUDA does not know), which a kernel spinning on the proxy cannot
  # survive: the first thing to look for if a GPU-memory run hangs (run 6's did, silently).
  rc=0
  FI_LOG_LEVEL=${FI_LOG_LEVEL:-warn} "$RB" client --connect "127.0.0.1:$port" "${bargs[@]}" \
    --mem "$mem" --workload gpu-write --producer "${PRODUCER:-cuda}" -v "${args[@]}" \
    ${cextra[@]+"${cextra[@]}"} >"$out" 2>&1 &
  cpid=$!
  tail -n +1 -f --pid="$cpid" "$out" &
  tailer=$!
  waited=0
  while kill -0 "$cpid" 2>/dev/null; do
    if [ "$waited" -ge "${CLIENT_TIMEOUT:-240}" ]; then
      # A hang: say where each thread is before killing it (a signal needs no dump: its
      # number is printed below).
      log "the client ($mem memory) is still running after ${CLIENT_TIMEOUT:-240} s; its threads:"
      for t in /proc/"$cpid"/task/*; do
        echo "  $(cat "$t/comm" 2>/dev/null) state=$(awk '{print $3}' "$t/stat" 2>/dev/null)" \
          "wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$t/syscall" 2>/dev/null)" >&2
      done
      # The binary's load address, for ci/crash-frames.sh with the unstripped copy
      # (target-lf-2.6.0/release/rdma-bench here) to name gdb's bare frames.
      awk '$6 ~ /rdma-bench$/ {print "  load: " $1 " " $3 " " $6; exit}' /proc/"$cpid"/maps >&2 || true
      if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$cpid" -batch -ex "thread apply all bt 12" 2>&1 | grep -E '^(Thread|#)' | head -150 >&2 || true
      fi
      kill -9 "$cpid" 2>/dev/null || true
      break
    fi
    sleep 1
    waited=$((waited + 1))
  done
  wait "$cpid" || rc=$?
  wait "$tailer" 2>/dev/null || true
  if [ "$rc" = 0 ] && grep -q "every byte verified" "$out"; then
    log "$mem memory: passed"
  else
    log "FAILED: $mem memory (the client exited $rc$([ "$rc" -gt 128 ] && echo ", signal $((rc - 128))"))"
    status=1
    kill "$srv" 2>/dev/null || true
  fi
  wait "$srv" 2>/dev/null || { log "the server ($mem memory) exited non-zero:"; cat "$srvlog" >&2; status=1; }
  # shm says at warn level when it copies GPU memory through host bounce buffers instead of
  # CUDA IPC (a posting thread without a CUDA context did, in the run of 2026-11-28 that
  # read 0.07 Gbit/s): figures taken so are not the GPU path's.
  if grep -h "fallback to using SAR" "$out" "$srvlog" | head -2 | grep . >&2; then
    log "FAILED: $mem memory: shm copied GPU memory through host bounce buffers (above)"
    status=1
  fi
  rm -f "$out" "$srvlog"
done
exit $status
