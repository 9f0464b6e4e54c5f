#!/usr/bin/env bash
# The UCX part of ci/gpu-host.sh (issue 26 items 4 and 5): UCX 1.22 with CUDA from the
# libucx-cu12 wheel on the GPU host, rdma-bench --backend ucx --mem cuda between two
# processes (every byte verified), and rdma-bench against ucx_perftest like for like.
#
#   ci/gpu-host-ucx.sh pack TARGET_DIR CARRY   (ci/gpu-host.sh pack calls it) builds
#       rdma-bench with --features ucx into CARRY/bin/rdma-bench-ucx (a binary of its own:
#       the other steps' rdma-bench keeps no link to libucp) and CARRY/ucx.tar.xz: the
#       wheel's UCX trimmed to what the step runs (libucp/uct/ucs/ucm, the modules cuda
#       (cuda_copy, cuda_ipc), ucm_cuda, cma and perftest_cuda, ucx_info, ucx_perftest, the
#       bundled libcudart and libgomp), stripped, in the wheel's layout (their RPATHs are
#       $ORIGIN-relative). The wheel: $UCX_WHEEL, else ~/.cache/rdma-bench/ucx-wheel/, else
#       `pip download libucx-cu12==1.22.0 --no-deps` into that folder. With OURS_B_REV=REV
#       (a commit), also that commit's rdma-bench into CARRY/bin/rdma-bench-ucx-b (built in a
#       git worktree), for run's UCX_OURS_B_BIN=bin/rdma-bench-ucx-b.
#   ci/gpu-host-ucx.sh unpack   the wheel's UCX into CARRY/build/ucx; prints its lib directory
#       (ci/gpu-host.sh's gpuwrite2p-ucx step puts it on LD_LIBRARY_PATH).
#   ci/gpu-host-ucx.sh mixed    only the mixed-memory check of run (CARRY as run's).
#   ci/gpu-host-ucx.sh run      (ci/gpu-host.sh run calls it for STEPS=...,ucx,...) with
#       CARRY, MEM, ROUNDS, SIZES, BYTES, CORES as ci/gpu-host.sh documents them (server,
#       client; in the put and tag rows the second core is the sender's for both tools:
#       perftest's client sends, ours' server does, so ours' two sides swap); LAT_ITERS
#       here 20000 round trips on host memory (at most LAT_BYTES / size: 4 GiB), as
#       transport-ucx/compare-tag.sh: over 2000 both tools' means still carry their first
#       round trips, ours' more (docs/measurements.md, U43-U44); 2000 on GPU memory, whose
#       round trips take 300 us (20000 of them made the cuda lat rows alone take 140 s).
#
# ABI: rdma-bench-ucx is built against Debian's UCX 1.13.1 headers (ucx-sys's bindgen) and
# loads the wheel's 1.22.0 libucp.so.0 (same soname). What ucx-sys binds was compared
# between the two headers: every struct 1.22 grew (ucp_params_t, ucp_context_attr_t,
# ucp_mem_map_params_t, ucp_request_param_t) grew at its end, behind a field-mask bit
# 1.13's code never sets; the enum values used are equal (UCS_MEMORY_TYPE_HOST 0, CUDA 1;
# 1.22 appends RDMA, ZE_*, GAUDI before LAST/UNKNOWN, which the backend does not use);
# ucs_status_t and every flag used are unchanged. ucp_init_version passes API 1.13, which
# a 1.22 library accepts.
#
# The step (run) prints:
#   ucx_info -v and the transports of ucx_info -d (expect cuda_copy, cuda_ipc, cma, posix,
#   sysv, tcp on the GPU host); rdma-bench-ucx client/server with --mem cuda (then host),
#   sizes 4K,64K,1M,16M, 16 pages, "every byte verified"; then, where MEM holds cuda, the
#   two memories mixed (`mixed` below; MIXED=0 skips it): write and send at 4K,64K,1M from a
#   server with one memory to a client with the other, both pairings, over the step's
#   transports and over tcp,cuda_copy (MIXED_TLS, space-separated lists), every byte
#   verified; then UCX's warnings off stdout (`json_alone` below: loopback --json with a
#   transport UCX warns about, stdout one JSON document, the warning on stderr); then one
#   table per memory (ROUNDS=0: none):
#     put  rdma-bench --workload write --single-buffer --imm-every K --window 32 (one immediate
#          in K puts, K up to 4096: ci/suspect.sh's put_plan; naming the
#          region's memh, as the tag row's sends do) against
#          ucx_perftest -t ucp_put_bw (one buffer each side, N puts, 32 outstanding: perftest's
#          default window for this test; ours --warmup N/10 puts rounded down to whole
#          repeats of K, perftest's -w the same puts: put_warm);
#     tag  rdma-bench --workload send --single-buffer --window 32 against ucx_perftest -t
#          tag_bw, whose window is 32 (ours SENDs are ucp_tag_send_nbx into ucp_tag_recv_nbx,
#          naming the region's memh and memory type as perftest -z does:
#          UCX_OURS_OPTS="--nic-opt memh=off" turns that off, UCX_PERFTEST_OPTS=-z gives
#          perftest the same);
#     lat  rdma-bench --workload lat --op send against ucx_perftest -t tag_lat (one-way:
#          ours total / iters / 2, perftest's "overall" latency, which is half a round trip;
#          both tools' medians, and ours' minimum and maximum, in the log);
#   best of ROUNDS interleaved rounds, ours / theirs, then the median of the rounds' own
#   ratios (a round where one tool ran twice as fast as in its others, which both tools have
#   had on the GPU host and on the dev box, moves a best of rounds but not the median), and
#   the median's 95% confidence interval (ci/suspect.sh's interval: "level" where it holds
#   1.0, so these rounds do not tell the tools apart). Both sides of every run: the same
#   UCX_TLS (UCX_STEP_TLS, default sm,cuda_copy,cuda_ipc,self: UCX_TLS=sm alone leaves
#   CUDA memory no transport), no peer error handling (perftest's default, without -e:
#   --nic-opt peer_errors=off), ucx_perftest -m cuda for the GPU table and heap buffers
#   (UCX_ALLOC_PRIO=heap, as ours) for the host one, written before the run as ours
#   (bin/perftest-written.so, LD_PRELOAD: perftest never writes its send buffer, which then
#   reads as the kernel's zero page; PERFTEST_BUF=untouched runs it as it comes).
#   BUF_OFFSET (default 0; a multiple of 64): both tools' host buffers that many bytes into a
#   page (ours --buf-offset; perftest's placed by perftest-written.so, PERFTEST_BUF_OFFSET), as
#   like for like as the window (docs/measurements.md, "The page-aligned penalty, explained").
#   CUDA_BUF_OFFSET (default unset: where cuMemAlloc puts them): ours' GPU regions that many
#   bytes into a page (perftest's receive buffer shares a cuMemAlloc chunk with its send
#   buffer and sits 512 bytes into its page; ucp-time prints both tools' offsets). The
#   client/server check places its regions by these two as well, and wants the client to say
#   so ("starting N bytes into a page").
#   UCX_STEP_LOGS=1: each run's UCX output on stderr (with UCX_PROTO_INFO=y: the protocols
#   both tools chose).
#   UCX_AB=1: every row also runs ours with --nic-opt memh=off and perftest with -z (and
#   the tag and lat rows on host memory perftest with untouched buffers), interleaved in the
#   same rounds (one line per size: "ab" columns, then the medians of the rounds' ratios of
#   the two pairs that register alike: ours against perftest -z, both naming a memh
#   registered once; ours memh=off against perftest, both leaving UCX to register per
#   operation). UCX_STEP_BUDGET (seconds, default 420): rows not
#   started by then print SKIPPED (budget), and the step fails.
#   UCX_OURS_B="RDMA-BENCH FLAGS": each round also runs ours with those flags (e.g.
#   "--nic-opt progress_burst=1"), last in the round; each cell's line gets its best and
#   the median of the rounds' ratios of ours against it (an A/B of ours' options; a
#   --buf-offset among them goes to ours-B's client only, which places both sides' regions).
#   UCX_OURS_B_BIN=PATH (in the carry: bin/rdma-bench-ucx-b, which the pack builds from
#   OURS_B_REV, or any build copied there): ours-B runs that binary (with UCX_OURS_B's flags,
#   if any): an A/B of two builds in the same rounds.
#   UCX_THEIRS_B_FEATURES=BITS: each round also runs perftest with bin/perftest-features.so
#   (transport-ucx/perftest-features.c), which ORs these UCP_FEATURE_* bits into the context
#   it creates (64: AM, which ours asks for beside TAG and RMA), last in the round; each cell's
#   line gets the median of the rounds' ratios theirs-B / theirs (and, with UCX_TIME=1, ours
#   against theirs-B and theirs-B against theirs at equal speed).
#   UCX_AA=1: each round also runs each tool a second time (the put and tag rows), and each
#   cell's line gets the A/A columns: the median of the rounds' ratios of perftest against
#   itself and of ours against itself, with their lowest and highest. What an A/B ratio can
#   tell on this host is bounded by how far a tool's A/A ratio strays from 1.0. Each round's
#   log line also gets the steal time (ms, /proc/stat) of the whole round.
#   UCX_TIME=1: both tools' four processes of every run load bin/ucp-time.so
#   (transport-ucx/ucp-time.c), and the log gets each one's line: the time inside
#   ucp_tag_send_nbx, ucp_tag_recv_nbx, ucp_put_nbx and ucp_worker_progress per call and per
#   message, and the calls of each kind without UCP_OP_ATTR_FLAG_MULTI_SEND; and the CUDA
#   driver calls UCX made, per message and function, with the time inside one, and where it
#   issued its copies and how often its event queries found them still running. Where UCX
#   made CUDA calls, each cell's line also gets "at equal speed": the rounds' runs compared
#   at equal host speed (ci/suspect.sh's adjusted: each run's figure against its processes'
#   mean time inside cuCtxGetId, a call of fixed work that UCX makes once a message in both
#   tools; on the H200 host that time moved 30-65 ns run to run and carried most of a run's
#   figure, docs/measurements.md U110), ours against perftest and, with ours-B, against it.
# Exit status: 0 when every run worked and every byte was verified; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source ci/suspect.sh
source ci/listening.sh
log() { echo "gpu-host ucx: $*" >&2; }
# buf_offset MEM: how many bytes into a page ours' regions of MEM start (--buf-offset, the
# client's flag): host BUF_OFFSET (0), as perftest's host buffers are placed; cuda
# CUDA_BUF_OFFSET, empty where unset (where cuMemAlloc puts them).
buf_offset() { if [ "$1" = host ]; then echo "${BUF_OFFSET:-0}"; else echo "${CUDA_BUF_OFFSET:-}"; fi; }
WHEEL_VER=1.22.0

pack_b() {  # TARGET_DIR CARRY REV: REV's rdma-bench-ucx into CARRY/bin/rdma-bench-ucx-b
  local wt; wt=$(mktemp -d)
  git worktree add -q --detach "$wt" "$3" || { rm -rf "$wt"; log "OURS_B_REV=$3: no such commit"; return 1; }
  log "building $3 ($(git rev-parse --short "$3")) as rdma-bench-ucx-b"
  local rc=0
  (cd "$wt" && cargo build --release -q -p bench-cli --bin rdma-bench --features ucx --target-dir "$1-b") &&
    cp "$1-b/release/rdma-bench" "$2/bin/rdma-bench-ucx-b" && strip "$2/bin/rdma-bench-ucx-b" || rc=$?
  git worktree remove --force "$wt"
  return $rc
}

wheel() {
  local dir=${UCX_WHEEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-bench/ucx-wheel} w
  if [ -n "${UCX_WHEEL:-}" ]; then echo "$UCX_WHEEL"; return; fi
  w=$(ls "$dir"/libucx_cu12-$WHEEL_VER-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$w" ]; then
    mkdir -p "$dir"
    log "no libucx-cu12 $WHEEL_VER wheel in $dir: pip download"
    pip download "libucx-cu12==$WHEEL_VER" --no-deps -d "$dir" >&2
    w=$(ls "$dir"/libucx_cu12-$WHEEL_VER-*.whl | head -1)
  fi
  echo "$w"
}

pack() {
  local td=$1 carry=$2 w tmp f
  log "building rdma-bench with --features ucx (UCX $(pkg-config --modversion ucx) headers)"
  cargo build --release -q -p bench-cli --bin rdma-bench --features ucx --target-dir "$td"
  cp "$td/release/rdma-bench" "$carry/bin/rdma-bench-ucx"
  strip "$carry/bin/rdma-bench-ucx"
  rm -f "$carry/bin/rdma-bench-ucx-b"
  [ -z "${OURS_B_REV:-}" ] || pack_b "$td" "$carry" "$OURS_B_REV"
  ${CC:-cc} -O2 -shared -fPIC -o "$carry/bin/perftest-written.so" transport-ucx/perftest-written.c -ldl
  ${CC:-cc} -O2 -shared -fPIC -o "$carry/bin/ucp-time.so" transport-ucx/ucp-time.c -ldl
  ${CC:-cc} -O2 -shared -fPIC -o "$carry/bin/perftest-features.so" transport-ucx/perftest-features.c -ldl
  w=$(wheel)
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  mkdir "$tmp/whl" "$tmp/ucx"
  unzip -q "$w" -d "$tmp/whl"
  for f in libucx/lib/lib{ucp,uct,ucs,ucm}.so.0 \
      libucx/lib/ucx/lib{uct_cuda,ucm_cuda,uct_cma,ucx_perftest_cuda}.so.0 \
      libucx/bin/ucx_info libucx/bin/ucx_perftest libucx_cu12.libs/libcudart-*.so.* \
      libucx_cu12.libs/libgomp-*.so.*; do
    for g in "$tmp/whl"/$f; do
      [ -e "$g" ] || { log "the wheel $w has no $f"; return 1; }
      mkdir -p "$tmp/ucx/$(dirname "$f")"
      cp "$g" "$tmp/ucx/$(dirname "$f")/"
    done
  done
  # The wheel's libraries carry their symbol tables (37 MB); stripped, 12 MB, 1.7 MB in xz.
  find "$tmp/ucx" -type f -exec strip --strip-unneeded {} +
  tar cJf "$carry/ucx.tar.xz" -C "$tmp/ucx" .
  log "packed $(basename "$w") as ucx.tar.xz ($(du -h "$carry/ucx.tar.xz" | cut -f1)) and bin/rdma-bench-ucx"
}

bytes_of() {
  local s=${1^^}
  case $s in *K) echo $(( ${s%K} << 10 )) ;; *M) echo $(( ${s%M} << 20 )) ;; *G) echo $(( ${s%G} << 30 )) ;; *) echo "$s" ;; esac
}

note() {  # ROW MEM: what each side does per iteration
  local m=; [ "$2" = cuda ] && m=" -m cuda"
  case $1 in
    put) echo "ours: ucp_put_nbx from one SIZE buffer into one, naming the region's memh and memory type (as perftest -z; UCX_AB=1 runs both pairings), at most 32 outstanding (--window 32), n / 10 warm-up puts rounded down to whole repeats of K; every Kth put (K up to 4096: put_plan in ci/suspect.sh) is followed by ucp_ep_flush_nbx and a 4-byte active message (the immediate); the clock stops at the server's ack of the last immediate (to delivery) | ucx_perftest -t ucp_put_bw$m ${UCX_PERFTEST_OPTS:-}: ucp_put_nbx from one buffer into one (without -z naming no memh: UCX registers the buffer per put), its default window for this test (32 outstanding), -w ours' warm-up puts, clock stops after ucp_worker_flush" ;;
    tag) echo "ours: ucp_tag_send_nbx of SIZE from one buffer into one posted ucp_tag_recv_nbx buffer (receives kept posted, 1024 deep up to 16 KiB and 256 from 64 KiB (16 MiB of receives between), credits back every quarter of that: an 8-byte WRITE with immediate, one active message), at most 32 sends in flight (--window 32), both naming the region's memh and memory type (UCP_OP_ATTR_FIELD_MEMH, as perftest -z); the receiver acknowledges once at the end | ucx_perftest -t tag_bw$m ${UCX_PERFTEST_OPTS:-}: ucp_tag_send_nbx into ucp_tag_recv_nbx, one buffer each side, up to 32 sends outstanding; its clock stops at the receiver's 1-byte ack" ;;
    lat) echo "ours: ucp_tag_send_nbx ping-pong (--op send), each side has the message before it answers, two receives kept posted (each re-posted while a message is in flight), one clock read per round trip; one-way = total / iters / 2 | ucx_perftest -t tag_lat$m: tag ping-pong, overall latency (half a round trip)" ;;
  esac
}

unpack() {  # the wheel's UCX into CARRY/build/ucx (once per ucx.tar.xz); prints its lib dir
  local carry=${CARRY:?} ucx=$CARRY/build/ucx
  [ -x "$carry/bin/rdma-bench-ucx" ] && [ -f "$carry/ucx.tar.xz" ] || { log "no rdma-bench-ucx or ucx.tar.xz in $carry: ci/gpu-host.sh pack"; return 1; }
  if [ ! -f "$ucx/.stamp" ] || [ "$(cat "$ucx/.stamp")" != "$(stat -c %s "$carry/ucx.tar.xz")" ]; then
    rm -rf "$ucx"; mkdir -p "$ucx"
    tar xJf "$carry/ucx.tar.xz" -C "$ucx"
    stat -c %s "$carry/ucx.tar.xz" > "$ucx/.stamp"
  fi
  echo "$ucx/libucx/lib"
}

# Two processes whose memories differ: the server's buffers fixed to one memory (--mem on
# the server), the client's the other, both pairings. The server is the source of the WRITEs
# and SENDs, the client their target (it verifies every byte), so they run from GPU memory
# into host memory and from host memory into GPU memory. Over the step's transports WRITEs
# are UCX's puts; over tcp,cuda_copy (peer error handling on, as by default) they are ours'
# active messages: into GPU memory a rendezvous, from GPU memory an eager message that UCX
# packs with cuda_copy. Needs LD_LIBRARY_PATH set (run does it).
mixed() {
  local rb=$1 tls_list=$2 out=$3 port status=0 tls sm cm w extra
  for tls in $tls_list; do
    extra=(); [[ $tls == *tcp* ]] || extra=(--nic-opt peer_errors=off)
    for pair in host,cuda cuda,host; do
      sm=${pair%,*}; cm=${pair#*,}; port=$(free_port)
      log "mixed memory over $tls: server $sm memory, client $cm memory, every byte verified"
      timeout 180 "$rb" server --listen 127.0.0.1:$port --backend ucx --provider "$tls" \
        "${extra[@]}" --mem "$sm" --sessions 2 > "$out/srv" 2>&1 &
      local spid=$!
      wait_listening "$port" 30 || true  # past that the client runs anyway, and reports
      for w in write send; do
        local sz=(--sizes 4K,64K,1M); [ "$w" = write ] && sz+=(--pages 16)
        if timeout 120 "$rb" client --connect 127.0.0.1:$port --backend ucx --provider "$tls" \
            "${extra[@]}" --mem "$cm" --workload "$w" "${sz[@]}" > "$out/cli" 2>&1 &&
            grep -q "$cm memory.*every byte verified" "$out/cli"; then
          grep "every byte verified" "$out/cli" | head -1 | sed 's/^/  /' >&2
          grep -E '^ *[0-9]+(\.[0-9]+)? *[KMG]?i?B? ' "$out/cli" | head -4 | sed 's/^/    /' >&2 || true
          log "mixed $tls $w, $sm memory to $cm memory: PASS"
        else
          cat "$out/cli" >&2
          log "FAILED: mixed memory over $tls, server $sm, client $cm, workload $w"; status=1
        fi
      done
      wait $spid 2>/dev/null || { sed 's/^/  server: /' "$out/srv" >&2; log "FAILED: the server exited non-zero"; status=1; }
    done
  done
  return $status
}

json_alone() {  # RB TLS OUT: UCX's warnings go to stderr, --json's stdout stays one document
  # (bench-cli's ucx_warnings_leave_json_on_stdout_alone, against this UCX rather than
  # Debian's 1.13.1: the log handler that ucx-sys pushes must work with the wheel's libucs).
  local rb=$1 tls=$2 out=$3 warned="'junk'.* not available"
  log "UCX's warnings off stdout: loopback --provider $tls,junk --json"
  if ! env -u UCX_LOG_FILE timeout 60 "$rb" loopback --backend ucx --provider "$tls,junk" \
      --nic-opt peer_errors=off -s 4K -n 4 --json > "$out/json" 2> "$out/json.err"; then
    cat "$out/json" "$out/json.err" >&2; log "FAILED: loopback --json with a UCX warning"; return 1
  fi
  if ! python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(d.get("verified") is not True)' \
      "$out/json"; then
    sed 's/^/  stdout: /' "$out/json" >&2; log "FAILED: stdout is not one JSON document that says verified"; return 1
  fi
  if ! grep -q "$warned" "$out/json.err"; then
    sed 's/^/  stderr: /' "$out/json.err" >&2; log "FAILED: UCX's warning ($warned) is not on stderr"; return 1
  fi
  grep -m1 "$warned" "$out/json.err" | cut -c1-120 | sed 's/^/  stderr: /' >&2
  log "UCX's warnings off stdout: PASS (stdout one JSON document, the warning on stderr)"
}

run() {
  local carry=${CARRY:?} rb=$CARRY/bin/rdma-bench-ucx ucx=$CARRY/build/ucx status=0 lib
  lib=$(unpack) || return 1
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local info=$ucx/libucx/bin/ucx_info perf=$ucx/libucx/bin/ucx_perftest
  timeout 30 "$info" -v >&2
  log "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
  log "ucx_info -d: transports (memory domain: transports)"
  timeout 60 "$info" -d 2>/dev/null | awk '/# Memory domain:/ {md = $4} /# *Transport:/ {t[md] = t[md] " " $3}
    END {for (m in t) printf "  %-10s%s\n", m ":", t[m]}' | sort >&2
  local mems=${MEM:-cuda,host} mem
  IFS=, read -r -a memv <<< "$mems"
  local tls=${UCX_STEP_TLS:-sm,cuda_copy,cuda_ipc,self}
  local common=(--backend ucx --provider "$tls" --nic-opt peer_errors=off ${UCX_OURS_OPTS:-})
  local port out; out=$(mktemp -d)
  local pin_srv=() pin_cli=()
  pin_sides; pin_srv=("${PIN_SRV[@]}") pin_cli=("${PIN_CLI[@]}")

  # Two processes, every byte verified (the client verifies by default).
  for mem in "${memv[@]}"; do
    log "rdma-bench-ucx server/client, TLS=$tls, $mem memory, every byte verified"
    port=$(free_port)
    timeout 120 "$rb" server --listen 127.0.0.1:$port "${common[@]}" --mem "$mem" \
      --sessions 1 > "$out/srv" 2>&1 &
    local spid=$!
    wait_listening "$port" 30 || true  # past that the client runs anyway, and reports
    local place=() at; at=$(buf_offset "$mem")
    [ -z "$at" ] || place=(--buf-offset "$at")
    if timeout 120 "$rb" client --connect 127.0.0.1:$port "${common[@]}" --mem "$mem" \
        --sizes 4K,64K,1M,16M --pages 16 "${place[@]}" -v > "$out/cli" 2>&1; then
      cat "$out/cli" >&2
      if ! grep -q "$mem memory.*every byte verified" "$out/cli"; then
        log "FAILED: $mem memory: the client did not say every byte verified"; status=1
      elif [ -n "$at" ] && ! grep -q "starting $at bytes into a page" "$out/cli"; then
        log "FAILED: $mem memory: the client's regions do not start $at bytes into a page"; status=1
      else
        log "$mem memory: PASS (every byte verified${at:+, regions $at bytes into a page})"
      fi
    else
      cat "$out/cli" >&2; sed 's/^/  server: /' "$out/srv" >&2
      log "FAILED: $mem memory: rdma-bench-ucx client/server"; status=1
    fi
    wait $spid 2>/dev/null || { log "FAILED: the server exited non-zero"; status=1; }
  done
  [ "${MIXED:-1}" = 0 ] || [[ $mems != *cuda* ]] ||
    mixed "$rb" "${MIXED_TLS:-$tls tcp,cuda_copy}" "$out" || status=1
  json_alone "$rb" "$tls" "$out" || status=1

  local rounds=${ROUNDS:-3} bytes=${BYTES:-$((1 << 30))}
  [ "$rounds" -gt 0 ] || { log "ROUNDS=0: no tables"; rm -rf "$out"; return $status; }
  lat_n() { round_trips "$1" "$([ "$2" = host ] && echo 20000 || echo 2000)"; }  # BYTES MEM
  local written=$carry/bin/perftest-written.so budget=${UCX_STEP_BUDGET:-420} t0=$SECONDS
  local rbb=${UCX_OURS_B_BIN:+$carry/$UCX_OURS_B_BIN}
  [ -z "$rbb" ] || [ -x "$rbb" ] || { log "no $rbb (UCX_OURS_B_BIN): OURS_B_REV=REV ci/gpu-host.sh pack builds bin/rdma-bench-ucx-b"; return 1; }
  local timer=() timed=
  if [ -n "${UCX_TIME:-}" ]; then
    timed=$carry/bin/ucp-time.so
    [ -f "$timed" ] || { log "no $timed: ci/gpu-host.sh pack"; return 1; }
    timer=(LD_PRELOAD="$timed")
  fi
  ucp_times() {  # WHO SERVER-LOG CLIENT-LOG: each side's ucp-time line (UCX_TIME=1)
    [ -n "$timed" ] || return 0
    log "  $1 server: $(grep -o 'ucp-time: .*' "$2" | cut -c11- || echo none)"
    log "  $1 client: $(grep -o 'ucp-time: .*' "$3" | cut -c11- || echo none)"
    # UCX's CUDA driver calls, where it made any.
    log "  $1 server cuda: $(grep -o 'ucp-time-cuda: .*' "$2" | cut -c16- || echo none)"
    log "  $1 client cuda: $(grep -o 'ucp-time-cuda: .*' "$3" | cut -c16- || echo none)"
    # Where UCX issued its copies, and how its event queries found them.
    log "  $1 server events: $(grep -o 'ucp-time-events: .*' "$2" | cut -c18- || echo none)"
    log "  $1 client events: $(grep -o 'ucp-time-events: .*' "$3" | cut -c18- || echo none)"
    # The run's host speed: both processes' mean cuCtxGetId (ns), "-" where either made none.
    awk '/ucp-time-cuda: / && match($0, /cuCtxGetId [0-9.]+\/msg [0-9.]+ ns/) {
        split(substr($0, RSTART, RLENGTH), f, " "); if (f[2] + 0 > 0) {s += f[3]; n++} }
      END {if (n == 2) printf "%.1f\n", s / 2; else print "-"}' "$2" "$3" > "$out/speed"
  }
  speed() { cat "$out/speed" 2>/dev/null || echo -; }  # the last run's (ucp_times)
  IFS=, read -r -a sizes <<< "${SIZES:-4K,64K,1M}"
  [ "${PERFTEST_BUF:-written}" = untouched ] || [ -f "$written" ] ||
    { log "no $written: ci/gpu-host.sh pack (or PERFTEST_BUF=untouched)"; return 1; }
  # UCX_STEP_LOGS: UCX logs (UCX_PROTO_INFO's tables too) into files of their own, not into
  # the stdout the figures are read from (its writes interleave with ours mid-line there).
  [ -z "${UCX_STEP_LOGS:-}" ] || export UCX_LOG_FILE=$out/ucxlog.%p
  proto_logs() {  # WHO MEM: UCX's tables of tag and put protocols from MEM (cuda, host) in the last run's logs
    local m='(cuda|GPU)'; [ "${2:-cuda}" = host ] && m='host'
    awk -v who="$1" -v m="$m" '{sub(/^\[[^]]*\] \[[^]]*\] */, "")} /\+--/ {next} / cfg#[0-9]+ *\|/ {t = $0; keep = 0; next}
      $0 ~ ("(tagged message|remote memory write).*" m) {keep = 1; print "  " who ": " t}
      keep {print "  " who ": " $0}' "$out"/ucxlog.* 2>/dev/null | cut -c1-200 | head -60 >&2 || true
    rm -f "$out"/ucxlog.*
  }
  ours() {  # ROW SIZE MEM [RDMA-BENCH FLAGS [BINARY]] -> Gbit/s, or one-way us for lat
    local row=$1 size=$2 mem=$3 b n args more=() place=() bin=${5:-$rb} f
    # A --buf-offset among the flags is the client's (its hello places the server's regions).
    local flags=(${4:-})
    for ((f = 0; f < ${#flags[@]}; f++)); do
      if [ "${flags[f]}" = --buf-offset ]; then place=(--buf-offset "${flags[f + 1]:-}"); f=$((f + 1))
      else more+=("${flags[f]}"); fi
    done
    b=$(bytes_of "$size"); n=$(( bytes / b )); [ $n -ge 128 ] || n=128
    port=$(free_port)
    case $row in
      # perftest's window (ucp_put_bw: 32 puts outstanding) and warm-up (-w: ours' warm-up
      # puts, put_warm; ours' --warmup counts repeats of K puts, each ending with the
      # immediate: put_plan).
      put) local plan; read -ra plan <<< "$(put_plan "$n")"
        args=(--workload write --single-buffer "${plan[@]}" --window 32 -s "$size" --no-verify) ;;
      # Warm-up as perftest's -w: --warmup counts repeats of the receive depth (send_warmup);
      # perftest's -w is the same messages (send_warm).
      tag) args=(--workload send --single-buffer --window 32 -s "$size" -n "$n" --no-verify
            --warmup "$(send_warmup "$n" "$b")") ;;
      lat) n=$(lat_n "$b" "$mem")
        args=(--workload lat --op send -s "$size" -n "$n" --warmup $((n / 10))) ;;
    esac
    # The client's flag: the server places its regions as the client's hello says. One from
    # the flags (ours-B's) stands instead of the memory's.
    local at; at=$(buf_offset "$mem")
    [ ${#place[@]} -gt 0 ] || [ -z "$at" ] || place=(--buf-offset "$at")
    args+=("${place[@]}")
    # The sender on the sender's core: ours' server sends (put, tag), perftest's client does
    # (its server is group index 0, the receiving side), so ours' two sides swap cores there.
    local ps=("${pin_srv[@]}") pc=("${pin_cli[@]}")
    case $row in put|tag) ps=("${pin_cli[@]}"); pc=("${pin_srv[@]}") ;; esac
    env "${timer[@]}" timeout 120 "${ps[@]}" "$bin" server --listen 127.0.0.1:$port \
      "${common[@]}" "${more[@]}" --mem "$mem" --sessions 1 > "$out/srv" 2>&1 &
    local spid=$!
    wait_listening "$port" 30 || true  # past that the client runs anyway, and reports
    if ! env "${timer[@]}" timeout 120 "${pc[@]}" "$bin" client --connect 127.0.0.1:$port \
        "${common[@]}" "${more[@]}" --mem "$mem" "${args[@]}" --json > "$out/ours.json" \
        2> "$out/ours.err"; then
      log "rdma-bench-ucx $row $size failed: $(tail -2 "$out/ours.err" | tr '\n' ' ')"
      kill $spid 2>/dev/null; wait $spid 2>/dev/null; echo 0; return
    fi
    wait $spid 2>/dev/null || true
    ucp_times "ours $row $size" "$out/srv" "$out/ours.err"
    # UCX_STEP_LOGS=1: what UCX printed (with UCX_PROTO_INFO=y: the protocols it chose).
    [ -z "${UCX_STEP_LOGS:-}" ] || proto_logs "ours $row $size" "$mem"
    # UCX logs to stdout ("[TIME] [HOST:PID:THREAD] file:line UCX WARN ..."): not JSON.
    grep -v '^\[[0-9]' "$out/ours.json" > "$out/ours.clean" || true
    if [ "$row" = lat ]; then
      log "  ours lat $size: $(jq -r '"p50 \(.p50_us) min \(.min_us) max \(.max_us) us"' "$out/ours.clean")"
      jq -r '.seconds * 1e6 / .ops / 2' "$out/ours.clean"
    else jq -r '.gbps' "$out/ours.clean"; fi
  }
  theirs() {  # ROW SIZE MEM [PERFTEST FLAGS [written|untouched]]
    local row=$1 size=$2 mem=$3 b n t iters buf=${5:-${PERFTEST_BUF:-written}}
    b=$(bytes_of "$size"); n=$(( bytes / b )); [ $n -ge 128 ] || n=128
    port=$(free_port)
    # -w: ours' warm-up (put_warm, send_warm: n / 10 rounded down to whole repeats).
    local w
    case $row in
      put) t=ucp_put_bw; iters=$n; w=$(put_warm "$n") ;;
      tag) t=tag_bw; iters=$n; w=$(send_warm "$n" "$b") ;;
      lat) t=tag_lat; iters=$(lat_n "$b" "$mem"); w=$((iters / 10)) ;;
    esac
    local cmd=("$perf" -t "$t" -s "$b" -n "$iters" -w "$w" -m "$mem" -p "$port" -f ${UCX_PERFTEST_OPTS:-} ${4:-})
    # Host buffers from the heap, as ours: perftest's default host buffers are UCX's own
    # shared-memory segments (UCX_ALLOC_PRIO's md:sysv first), which its peer maps, so a put
    # is one memcpy (docs/measurements.md, "UCX backend against ucx_perftest").
    local alloc=(); [ "$mem" = host ] && alloc=(UCX_ALLOC_PRIO=heap)
    local pre=$timed
    if [ "$mem" = host ] && [ "$buf" = written ]; then
      pre="$written${pre:+ $pre}"; alloc+=(PERFTEST_BUF_OFFSET="${BUF_OFFSET:-0}")
    fi
    if [ -n "${THEIRS_B:-}" ]; then  # theirs-B: UCX_THEIRS_B_FEATURES added to its context
      pre="$carry/bin/perftest-features.so${pre:+ $pre}"; alloc+=(PERFTEST_FEATURES_ADD="$UCX_THEIRS_B_FEATURES")
    fi
    [ -z "$pre" ] || alloc+=(LD_PRELOAD="$pre")
    env "${alloc[@]}" UCX_TLS=$tls timeout 120 "${pin_srv[@]}" "${cmd[@]}" > "$out/tsrv" 2>&1 &
    local spid=$!
    wait_listening "$port" 30 || true
    if ! env "${alloc[@]}" UCX_TLS=$tls timeout 120 "${pin_cli[@]}" "${cmd[@]}" 127.0.0.1 > "$out/tcli" 2>&1; then
      log "ucx_perftest $t $size failed: $(tail -2 "$out/tcli" | tr '\n' ' ')"
      kill $spid 2>/dev/null; wait $spid 2>/dev/null; echo 0; return
    fi
    wait $spid 2>/dev/null || true
    ucp_times "theirs $row $size" "$out/tsrv" "$out/tcli"
    [ -z "${UCX_STEP_LOGS:-}" ] || proto_logs "theirs $row $size" "$mem"
    if [ "$mem" = host ] && [ "$buf" = written ] && ! grep -qE '^perftest-written: [0-9]+ bytes at .* \(placed\)' "$out/tcli"; then
      log "ucx_perftest $t $size: perftest-written.so did not write and place its buffers"; echo 0; return
    fi
    if [ -n "${THEIRS_B:-}" ] && ! grep -q '^perftest-features: ' "$out/tcli"; then
      log "ucx_perftest $t $size: perftest-features.so did not add UCX_THEIRS_B_FEATURES"; echo 0; return
    fi
    # The final line: iterations, p50, average, overall (latency or overhead, us), bandwidth
    # average, overall (MB/s, 2^20 bytes), message rate average, overall.
    if [ "$row" = lat ]; then
      log "  theirs lat $size: p50 $(awk '$1 ~ /^[0-9]+$/ && NF >= 8 {m = $2} END {print m + 0}' "$out/tcli") us"
      awk '$1 ~ /^[0-9]+$/ && NF >= 8 {v = $4} END {print v + 0}' "$out/tcli"
    else
      ucx_perftest_gbps "$out/tcli"
    fi
  }
  best() {
    awk -v r="$1" -v a="$2" -v b="$3" 'BEGIN {
      if (a == 0) {print b; exit} if (b == 0) {print a; exit}
      if (r == "lat") print (a < b ? a : b); else print (a > b ? a : b) }'
  }
  steal_ms() {  # the machine's steal time so far (ms; /proc/stat's 8th cpu field, in USER_HZ)
    awk -v hz="$(getconf CLK_TCK)" '/^cpu / {printf "%d\n", $9 * 1000 / hz; exit}' /proc/stat
  }
  spread() {  # RATIO...: "median [lowest-highest]" of the rounds' ratios
    local v; v=$(printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -n | tr '\n' ' ')
    [ -n "$v" ] || { echo -; return; }
    echo "$(median $v) [${v%% *}-$(echo $v | awk '{print $NF}')]"
  }
  local row size r o t bo bt fail nf runs v ab o2 t2 t3 bo2 bt2 bt3 ratio rr aa oa ta raa taa st rz rm ob bob obv rob so sb stt eq
  for mem in "${memv[@]}"; do
    echo
    echo "== $mem memory, UCX $(timeout 30 "$info" -v | awk '/Library version/ {print $4}') TLS=$tls, two processes (cores $PIN_CORES), $(nproc) cores; ucx_perftest -m $mem; perftest host buffers ${PERFTEST_BUF:-written}$([ "$mem" = host ] && echo "; both tools' host buffers ${BUF_OFFSET:-0} bytes into a page")"
    printf '%-4s %5s %10s %10s %7s %7s %10s  %-19s %s\n' row size ours theirs ratio median "ours ahead" \
      "median's 95% CI" "(Gbit/s, lat: one-way us; best of $rounds interleaved rounds; median: of the rounds' ratios; CI: ci/suspect.sh's interval)"
    IFS=, read -r -a rowv <<< "${ROWS_UCX:-put,tag,lat}"
    for row in "${rowv[@]}"; do
      ab=; [ -n "${UCX_AB:-}" ] && ab=1
      ob=; [ -n "${UCX_OURS_B:-}${UCX_OURS_B_BIN:-}" ] && ob=1
      tb=; [ -n "${UCX_THEIRS_B_FEATURES:-}" ] && tb=1
      for size in "${sizes[@]}"; do
        if [ $((SECONDS - t0)) -ge "$budget" ]; then
          printf '%-4s %5s SKIPPED (budget: %ss of UCX_STEP_BUDGET=%s spent)\n' "$row" "$size" $((SECONDS - t0)) "$budget"
          status=1; continue
        fi
        aa=; [ -n "${UCX_AA:-}" ] && [ "$row" != lat ] && aa=1
        bo=0 bt=0 bo2=0 bt2=0 bt3=0 o2=- t2=- t3=- rr=() raa=() taa=() oa= ta= rz=() rm=()
        bob=0 obv= rob=() so=() sb=() stt=() tbv= rtb=() stb=() runs=()
        for r in $(seq 1 "$rounds"); do
          st=$(steal_ms)
          if [ $((r % 2)) = 1 ]; then o=$(ours $row "$size" "$mem"); so+=("$o:$(speed)")
            t=$(theirs $row "$size" "$mem"); stt+=("$t:$(speed)")
            [ -z "$aa" ] || { ta=$(theirs $row "$size" "$mem"); oa=$(ours $row "$size" "$mem"); }
          else t=$(theirs $row "$size" "$mem"); stt+=("$t:$(speed)")
            o=$(ours $row "$size" "$mem"); so+=("$o:$(speed)")
            [ -z "$aa" ] || { oa=$(ours $row "$size" "$mem"); ta=$(theirs $row "$size" "$mem"); }
          fi
          [ -z "$aa" ] || { raa+=("$(ratio "$o" "$oa")"); taa+=("$(ratio "$t" "$ta")"); }
          if [ -n "$ab" ]; then
            o2=$(ours $row "$size" "$mem" "--nic-opt memh=off"); t2=$(theirs $row "$size" "$mem" -z)
            bo2=$(best $row "$bo2" "$o2"); bt2=$(best $row "$bt2" "$t2")
            if [ "$mem" = host ] && [ "$row" != put ]; then t3=$(theirs $row "$size" "$mem" "" untouched); bt3=$(best $row "$bt3" "$t3"); fi
            rz+=("$(ratio "$o" "$t2")"); rm+=("$(ratio "$o2" "$t")")
          fi
          if [ -n "$ob" ]; then
            obv=$(ours $row "$size" "$mem" "${UCX_OURS_B:-}" "$rbb"); bob=$(best $row "$bob" "$obv")
            sb+=("$obv:$(speed)")
            rob+=("$(ratio "$o" "$obv")")
          fi
          if [ -n "$tb" ]; then
            tbv=$(THEIRS_B=1 theirs $row "$size" "$mem"); stb+=("$tbv:$(speed)")
            rtb+=("$(ratio "$tbv" "$t")")
          fi
          log "$mem $row $size round $r: ours $o, theirs $t${aa:+, ours again $oa, theirs again $ta}${ab:+, ours memh=off $o2, theirs -z $t2, theirs untouched $t3}${ob:+, ours B $obv}${tb:+, theirs B $tbv}; steal $(( $(steal_ms) - st )) ms"
          bo=$(best $row "$bo" "$o"); bt=$(best $row "$bt" "$t"); rr+=("$(ratio "$o" "$t")")
          # Every run this round made, variants too ("-": a variant not run).
          runs+=("$o" "$t")
          for v in "$oa" "$ta" "$o2" "$t2" "$t3" "$obv" "$tbv"; do
            [ -z "$v" ] || [ "$v" = - ] || runs+=("$v")
          done
        done
        # A run without a figure (a failure's 0, a parser's 0.000) fails the row, even where
        # other rounds gave figures: best-of and the medians pass it over, and the cell would
        # rest on fewer rounds than the header says (not_positive: numerically, not as a string).
        fail=; nf=$(not_positive "${runs[@]}")
        [ "$nf" = 0 ] || { fail=" FAILED ($nf of ${#runs[@]} runs gave no figure)"; status=1; }
        ratio=$(ratio "$bo" "$bt")
        printf '%-4s %5s %10.2f %10.2f %7s %7s %10s  %-19s%s%s' "$row" "$size" "$bo" "$bt" "$ratio" \
          "$(median "${rr[@]}")" "$(above "$row" "${rr[@]}")" "$(interval "$row" "${rr[@]}")" \
          "$fail" "$(suspect "$row" "$ratio" "$(median "${rr[@]}")")"
        [ -n "$aa" ] && printf '   aa: theirs/theirs %s, ours/ours %s' "$(spread "${taa[@]}")" "$(spread "${raa[@]}")"
        [ -n "$ab" ] && printf '   ab: ours memh=off %.2f, theirs -z %.2f, theirs untouched %s; medians: ours / theirs -z %s, ours memh=off / theirs %s' \
          "$bo2" "$bt2" "$([ "$mem" = host ] && [ "$row" != put ] && printf %.2f "$bt3" || echo -)" \
          "$(median "${rz[@]}")" "$(median "${rm[@]}")"
        [ -n "$ob" ] && printf '   b: ours %s %.2f; median ours / ours-B %s' "${UCX_OURS_B_BIN:-}${UCX_OURS_B:+ $UCX_OURS_B}" \
          "$bob" "$(median "${rob[@]}")"
        [ -n "$tb" ] && printf '   theirs-B (features +%s): median theirs-B / theirs %s' "$UCX_THEIRS_B_FEATURES" "$(median "${rtb[@]}")"
        # UCX_TIME=1: the same runs compared at equal host speed (ci/suspect.sh's adjusted).
        eq=-; [ -z "$timed" ] || eq=$(adjusted "$row" "${so[@]}" -- "${stt[@]}")
        if [ "$eq" != - ]; then
          printf '   at equal speed: ours / theirs %s' "$eq"
          [ -z "$ob" ] || printf '; ours / ours-B %s' "$(adjusted "$row" "${so[@]}" -- "${sb[@]}")"
          [ -z "$tb" ] || printf '; ours / theirs-B %s; theirs-B / theirs %s' "$(adjusted "$row" "${so[@]}" -- "${stb[@]}")" \
            "$(adjusted "$row" "${stb[@]}" -- "${stt[@]}")"
        fi
        echo
      done
      echo "     per iteration: $(note $row "$mem")"
    done
  done
  log "tables took $((SECONDS - t0)) s"
  rm -rf "$out"
  return $status
}

case ${1:-} in
  pack) pack "$2" "$3" ;;
  unpack) unpack ;;
  run) run ;;
  mixed) CARRY=$(realpath "${CARRY:?}") && lib=$(unpack) && export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} &&
    out=$(mktemp -d) && mixed "$CARRY/bin/rdma-bench-ucx" "${MIXED_TLS:-sm,cuda_copy,cuda_ipc,self tcp,cuda_copy}" "$out" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
