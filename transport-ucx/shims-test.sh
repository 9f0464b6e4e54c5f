#!/usr/bin/env bash
# The LD_PRELOAD shims the UCX comparisons load into ucx_perftest, checked against the
# ucx_perftest on PATH (Debian's ucx-utils in CI) over shared memory:
#   perftest-written.c  writes every host buffer perftest maps, and with PERFTEST_BUF_OFFSET=B
#                       allocates them itself B bytes into a page: both processes must say
#                       "(placed)" at an address B bytes into its page, and the test must run;
#                       a bad B must stop perftest with exit 2; ucp_put_bw's buffers (exactly
#                       the size) must be written with the page after them;
#   ucp-time.c          must print its line in both: the sender's src%4096 and the receiver's
#                       dst%4096 are B (a multiple of 64: UCX 1.13 rounds a mapping's start
#                       down to 16 bytes, and perftest sends from where UCX says it starts);
#                       in a ping-pong (tag_lat) both sides must count react for most round
#                       trips, with a median under 1 us and most reacts under it; it must
#                       count the calls that lack UCP_OP_ATTR_FLAG_MULTI_SEND: none of
#                       tag_bw's sends and ucp_put_bw's puts (perftest's stream tests set it),
#                       every tag_lat send (its ping-pongs do not), and time the puts;
#                       and, on stand-ins for libcuda and a UCX module that calls it
#                       (ucp-time-fake.c), count the CUDA driver calls a send makes, hand
#                       each to libcuda with its arguments, place the copies in the send and
#                       count each event's record and the query that found it still running;
#   perftest-features.c with PERFTEST_FEATURES_ADD=64 must add UCP_FEATURE_AM to the
#                       features each side's context asks for, and the test must run; without
#                       it the shim must leave them alone; a value that is no number must stop
#                       perftest.
# With RDMA_BENCH (an rdma-bench built with the ucx feature; ci/test.sh passes its debug build),
# ours under ucp-time too: its stream sends and puts ask for UCX's bandwidth protocols as
# perftest's do, all but each phase's first (transport-ucx/src/endpoint/stream.rs), its
# ping-pong's sends none; with --nic-opt multi_send=off no stream send asks.
#   [RDMA_BENCH=target/debug/rdma-bench] transport-ucx/shims-test.sh        (ci/test.sh runs it)
set -euo pipefail
[ -z "${RDMA_BENCH:-}" ] || RDMA_BENCH=$(realpath "$RDMA_BENCH")
cd "$(dirname "$0")"
PERF=${UCX_PERFTEST:-$(command -v ucx_perftest || true)}
[ -n "$PERF" ] || { echo "shims-test: no ucx_perftest (apt-get install ucx-utils)" >&2; exit 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
${CC:-cc} -O2 -Wall -Werror -shared -fPIC -o "$out/written.so" perftest-written.c -ldl
${CC:-cc} -O2 -Wall -Werror -shared -fPIC -o "$out/time.so" ucp-time.c -ldl
${CC:-cc} -O2 -Wall -Werror -shared -fPIC -o "$out/features.so" perftest-features.c -ldl
B=1088 bad=0 extra=()
source ../ci/listening.sh
run() { # SERVER-OFFSET CLIENT-OFFSET [TEST N] (default tag_bw 4000) -> perftest's logs in
  # $out/srv, $out/cli; the client's status
  local env=(UCX_TLS=posix,self UCX_ALLOC_PRIO=heap LD_PRELOAD="$out/written.so $out/time.so${extra[*]:+ $out/features.so}" "${extra[@]}")
  local port; port=$(free_port) || return 1
  local t=(-t "${3:-tag_bw}" -s 4096 -n "${4:-4000}" -p "$port")
  env "${env[@]}" PERFTEST_BUF_OFFSET="$1" timeout 60 "$PERF" "${t[@]}" > "$out/srv" 2>&1 &
  local s=$! rc=0
  wait_listening $port 10 || echo "shims-test: ucx_perftest's server does not listen on $port" >&2
  env "${env[@]}" PERFTEST_BUF_OFFSET="$2" timeout 60 "$PERF" "${t[@]}" 127.0.0.1 \
    > "$out/cli" 2>&1 || rc=$?
  # A client stopped by a bad offset leaves the server without a peer: it is not waited for.
  if [ $rc = 0 ]; then wait $s || rc=$?; else kill $s 2>/dev/null; wait $s 2>/dev/null || true; fi
  return $rc
}
run $B $B || { echo "shims-test: ucx_perftest with PERFTEST_BUF_OFFSET=$B failed:" >&2; cat "$out/srv" "$out/cli" >&2; exit 1; }
for side in srv cli; do
  addrs=$(sed -n 's/^perftest-written: [0-9]* bytes at \(0x[0-9a-f]*\) (placed)$/\1/p' "$out/$side")
  [ -n "$addrs" ] || { echo "shims-test: $side: no placed buffer" >&2; cat "$out/$side" >&2; bad=1; continue; }
  for a in $addrs; do
    [ $((a % 4096)) = $B ] || { echo "shims-test: $side: buffer at $a, $((a % 4096)) bytes into its page, not $B" >&2; bad=1; }
  done
  # The server receives (its dst), the client sends (its src).
  want="dst%4096 $B,"; [ $side = cli ] && want="src%4096 $B,"
  grep -q "^ucp-time: .*$want" "$out/$side" ||
    { echo "shims-test: $side: no ucp-time line with $want" >&2; grep ucp-time "$out/$side" >&2; bad=1; }
done
# The receiver's receives: all 4000 and the warm-up's, some of them perhaps done at once.
read -r nrecv nonce < <(sed -nE 's/^ucp-time: .* recv [0-9.]+ ns\/call \(([0-9]+), ([0-9]+) done at once\).*/\1 \2/p' "$out/srv")
[ -n "${nrecv:-}" ] && [ "$nrecv" -ge 4000 ] && [ "$nonce" -le "$nrecv" ] ||
  { echo "shims-test: srv: ucp-time's receives are not 4000 or more, each done at once or not" >&2; grep ucp-time "$out/srv" >&2; bad=1; }
# The bandwidth flag: perftest's stream sends carry it, all of them.
plain() { # SIDE FIELD -> ucp-time's count of FIELD (sends, receives, puts) without the flag
  sed -nE "s/^ucp-time: .*without the bandwidth flag: ([0-9]+) sends, ([0-9]+) receives, ([0-9]+) puts;.*/\\$2/p" "$out/$1"
}
calls() { # SIDE KIND (send, put) -> ucp-time's count of those calls
  sed -nE "s/^ucp-time: .* $2 [0-9.]+ ns\/call \(([0-9]+)[,)].*/\1/p" "$out/$1"
}
[ "$(plain cli 1)" = 0 ] ||
  { echo "shims-test: cli: tag_bw's sends counted without the bandwidth flag" >&2; grep ucp-time "$out/cli" >&2; bad=1; }
# A ping-pong: each side answers what a progress call handed it, so ucp-time's react (the
# tool's time from that call to its answer) is counted for most of the 2000 round trips, and
# most of those took under 1 us: the median is one of them, and so are more than half.
run $B $B tag_lat 2000 || { echo "shims-test: ucx_perftest -t tag_lat failed" >&2; bad=1; }
for side in srv cli; do
  read -r n med nu < <(sed -nE 's/^ucp-time: .*, idle [0-9.]+ ns each\).* react [0-9.]+ ns \(([0-9]+)\), median ([0-9.-]+) ns, under 1 us [0-9.-]+ ns \(([0-9]+)\)$/\1 \2 \3/p' "$out/$side")
  [ -n "${n:-}" ] && [ "$n" -ge 1000 ] ||
    { echo "shims-test: $side: ucp-time counted no react for most of 2000 round trips" >&2; cat "$out/$side" >&2; bad=1; }
  [ -n "${nu:-}" ] && [ $((2 * nu)) -gt "${n:-0}" ] && awk -v m="$med" 'BEGIN { exit !(m >= 0 && m < 1000) }' ||
    { echo "shims-test: $side: ucp-time's react has no median under 1 us (median ${med:-none}, ${nu:-no} of ${n:-no} reacts under 1 us)" >&2; cat "$out/$side" >&2; bad=1; }
  # tag_lat's sends ask for no bandwidth protocol: every one counted.
  n=$(plain $side 1); [ -n "$n" ] && [ "$n" -ge 2000 ] ||
    { echo "shims-test: $side: ucp-time counted ${n:-no} tag_lat sends without the bandwidth flag, not 2000 or more" >&2; bad=1; }
done
# Puts: timed and counted, each with the flag (ucp_put_bw is a stream test).
run $B $B ucp_put_bw 4000 || { echo "shims-test: ucx_perftest -t ucp_put_bw failed" >&2; bad=1; }
n=$(calls cli put)
[ -n "$n" ] && [ "$n" -ge 4000 ] && [ "$(plain cli 3)" = 0 ] ||
  { echo "shims-test: cli: ucp-time did not count 4000 or more ucp_put_bw puts, each with the bandwidth flag" >&2; grep ucp-time "$out/cli" >&2; bad=1; }
# ucp_put_bw's buffers are exactly the size: the shim must have written them and the whole
# page holding the byte after each (its next page, as rdma-bench's HostBuffer writes its
# own; a never-touched page there made 4 KiB copies several times slower on the dev box).
for side in srv cli; do
  read -r len at < <(sed -nE 's/^perftest-written: ([0-9]+) bytes at (0x[0-9a-f]+) \(placed\)$/\1 \2/p' "$out/$side" | head -1)
  read -r from to < <(sed -nE 's/^perftest-written: wrote (0x[0-9a-f]+)-(0x[0-9a-f]+)$/\1 \2/p' "$out/$side" | head -1)
  if [ -z "${len:-}" ] || [ -z "${from:-}" ] ||
      [ $((from)) -gt $((at)) ] || [ $((to)) -lt $(( ((at + len) / 4096 + 1) * 4096 )) ]; then
    echo "shims-test: $side: ucp_put_bw's buffer (${len:-?} bytes at ${at:-?}) and the page after it were not all written (wrote ${from:-?}-${to:-?})" >&2
    grep perftest-written "$out/$side" >&2; bad=1
  fi
done
if [ -n "${RDMA_BENCH:-}" ]; then
  srv=() # the server's own flags for the next run
  ours() { # ARGS (the client's) -> ours' logs in $out/osrv (the active side: sender, writer), $out/ocli
    local p env=(LD_PRELOAD="$out/time.so") s rc=0
    p=$(free_port) || return 1
    local c=(--backend ucx --provider sm --nic-opt peer_errors=off)
    env "${env[@]}" timeout 60 "$RDMA_BENCH" server "${c[@]}" "${srv[@]}" --listen 127.0.0.1:$p --sessions 1 > "$out/osrv" 2>&1 &
    s=$!
    wait_listening $p 10 || echo "shims-test: rdma-bench's server does not listen on $p" >&2
    env "${env[@]}" timeout 60 "$RDMA_BENCH" client "${c[@]}" --connect 127.0.0.1:$p -s 4096 --no-verify "$@" \
      > "$out/ocli" 2>&1 || rc=$?
    wait $s || rc=$?
    [ $rc = 0 ] || { echo "shims-test: rdma-bench $* failed ($rc)" >&2; cat "$out/osrv" "$out/ocli" >&2; bad=1; }
  }
  # A stream of sends (warm-up, then the timed phase: one stream, credits come back as
  # immediates): its first send alone without the flag.
  ours --workload send --single-buffer --window 32 -n 4000 --warmup 2
  n=$(calls osrv send)
  [ -n "$n" ] && [ "$n" -ge 4000 ] && [ "$(plain osrv 1)" = 1 ] ||
    { echo "shims-test: ours' stream of sends: ${n:-no} sends, $(plain osrv 1) without the bandwidth flag, not 4000 or more and 1" >&2; grep ucp-time "$out/osrv" >&2; bad=1; }
  # The same stream with --nic-opt multi_send=off: no send asks.
  srv=(--nic-opt multi_send=off)
  ours --workload send --single-buffer --window 32 -n 4000 --warmup 2
  srv=()
  n=$(calls osrv send)
  [ -n "$n" ] && [ "$n" -ge 4000 ] && [ "$(plain osrv 1)" = "$n" ] ||
    { echo "shims-test: ours' stream of sends with multi_send=off: ${n:-no} sends, $(plain osrv 1) without the bandwidth flag, not 4000 or more, all" >&2; grep ucp-time "$out/osrv" >&2; bad=1; }
  # Puts: each phase's first puts before the receiver's acknowledgement, the rest with it.
  ours --workload write --single-buffer --imm-every 64 --window 32 -n 64 --warmup 2
  n=$(calls osrv put)
  [ -n "$n" ] && [ "$n" -ge 4096 ] && [ "$(plain osrv 3)" -le 2 ] ||
    { echo "shims-test: ours' stream of puts: ${n:-no} puts, $(plain osrv 3) without the bandwidth flag, not 4096 or more and at most 2" >&2; grep ucp-time "$out/osrv" >&2; bad=1; }
  # A ping-pong: no send asks.
  ours --workload lat --op send -n 2000
  for side in osrv ocli; do
    n=$(calls $side send)
    [ -n "$n" ] && [ "$n" -ge 2000 ] && [ "$(plain $side 1)" = "$n" ] ||
      { echo "shims-test: ours' ping-pong ($side): ${n:-no} sends, $(plain $side 1) without the bandwidth flag, not 2000 or more, all" >&2; grep ucp-time "$out/$side" >&2; bad=1; }
  done
else
  echo "shims-test: RDMA_BENCH unset: ours' calls were not checked" >&2
fi
# The CUDA driver calls: stand-ins for libcuda, a module of UCX loaded with RTLD_LOCAL that
# calls it, and ucp_tag_send_nbx (ucp-time-fake.c). Each of 2000 sends makes three driver
# calls; ucp-time must count each once and hand each to libcuda with its arguments.
fk=$out/fake; mkdir "$fk"
cf=(${CC:-cc} -O2 -Wall -Werror)
"${cf[@]}" -shared -fPIC -DFAKE_CUDA -Wl,-soname,libcuda.so.1 -o "$fk/libcuda.so.1" ucp-time-fake.c
"${cf[@]}" -shared -fPIC -DFAKE_MOD -o "$fk/libfakemod.so" ucp-time-fake.c -L"$fk" -l:libcuda.so.1
"${cf[@]}" -shared -fPIC -DFAKE_UCP -o "$fk/libfakeucp.so" ucp-time-fake.c -ldl
"${cf[@]}" -o "$fk/fake" ucp-time-fake.c -L"$fk" -lfakeucp -ldl
LD_LIBRARY_PATH=$fk LD_PRELOAD=$out/time.so "$fk/fake" 2000 > "$fk/out" 2>&1 ||
  { echo "shims-test: the fake CUDA program failed under ucp-time:" >&2; cat "$fk/out" >&2; bad=1; }
want="^ucp-time-cuda: 6.00 calls/msg, [0-9.]+ ns/msg: cuCtxPushCurrent 1.000/msg [0-9]+ ns; cuCtxPopCurrent 1.000/msg [0-9]+ ns; cuMemcpyAsync 1.000/msg [0-9]+ ns; cuEventRecord 1.000/msg [0-9]+ ns; cuEventQuery 2.000/msg [0-9]+ ns;$"
events="^ucp-time-events: copies issued in progress 0, in recv 0, in send 2000, in put 0, outside 0; events recorded 2000, each behind 0.00 pending \\(most 0, 0 not tracked\\); early queries 1.000/msg \\(2000, 0 in the progress call that recorded the event\\), their event's age [0-9]+ ns; ready queries 2000, their event's age [0-9]+ ns$"
grep -qE "$want" "$fk/out" && grep -qE "$events" "$fk/out" &&
  grep -qx "fake libcuda: 12000 calls with the arguments sent" "$fk/out" ||
  { echo "shims-test: ucp-time did not count and forward 6 CUDA calls a send, 2000 sends, or place their copies and queries:" >&2; cat "$fk/out" >&2; bad=1; }
# Every driver function the shim names (its cu_name table) must stay wrapped, as itself or its
# _v2 symbol: one whose wrapper went missing would vanish from the CUDA line without a word (a
# rewrite once dropped the two synchronous-copy wrappers).
names=$(sed -n '/cu_name\[CU_N\] = {/,/};/p' ucp-time.c | grep -o '"cu[A-Za-z]*"' | tr -d '"' || true)
syms=$(nm -D --defined-only "$out/time.so" | awk '{print $3}')
[ "$(wc -w <<< "$names")" -ge 17 ] ||
  { echo "shims-test: read $(wc -w <<< "$names") names from ucp-time.c's cu_name, not its 17" >&2; bad=1; }
for f in $names; do
  grep -qxE "${f}(_v2)?" <<< "$syms" || { echo "shims-test: ucp-time.so does not wrap $f" >&2; bad=1; }
done
# Features added: each side prints what its context asked for and what the shim made of it.
# UCX's own debug line says what the context got.
extra=(PERFTEST_FEATURES_ADD=64 UCX_LOG_LEVEL=debug)
run $B $B tag_bw 2000 || { echo "shims-test: ucx_perftest with PERFTEST_FEATURES_ADD=64 failed" >&2; bad=1; }
for side in srv cli; do
  read -r was now < <(sed -nE 's/^perftest-features: (0x[0-9a-f]+) -> (0x[0-9a-f]+)$/\1 \2/p' "$out/$side")
  [ -n "${was:-}" ] && [ $((was & 64)) = 0 ] && [ $((now)) = $((was | 64)) ] &&
    grep -qE "created ucp context .* features $now " "$out/$side" ||
    { echo "shims-test: $side: perftest-features did not add UCP_FEATURE_AM (64) to the context:" >&2
      grep -E 'perftest-features|created ucp context' "$out/$side" >&2; bad=1; }
done
extra=(PERFTEST_FEATURES_ADD=)
run $B $B tag_bw 2000 || { echo "shims-test: ucx_perftest under perftest-features without a value failed" >&2; bad=1; }
! grep -q '^perftest-features' "$out/srv" "$out/cli" ||
  { echo "shims-test: perftest-features changed the features without PERFTEST_FEATURES_ADD" >&2; bad=1; }
extra=(PERFTEST_FEATURES_ADD=AM)
rc=0; run $B $B tag_bw 2000 || rc=$?
[ $rc != 0 ] && grep -q "PERFTEST_FEATURES_ADD=AM is not a number" "$out/cli" ||
  { echo "shims-test: PERFTEST_FEATURES_ADD=AM ran (status $rc)" >&2; bad=1; }
extra=()
also=; [ -z "${RDMA_BENCH:-}" ] || also=" (in rdma-bench too)"
rc=0; run $B 4096 || rc=$?
[ $rc = 2 ] && grep -q "PERFTEST_BUF_OFFSET=4096: 0 to 4095" "$out/cli" ||
  { echo "shims-test: PERFTEST_BUF_OFFSET=4096 ran (status $rc)" >&2; bad=1; }
[ $bad = 0 ] && echo "shims-test: perftest-written placed and wrote perftest's buffers $B bytes into their pages, ucp-time named the offset, counted a ping-pong's reactions and their median, the calls without the bandwidth flag and the puts$also, and counted and forwarded CUDA driver calls, perftest-features added AM to both contexts; a bad offset and a bad feature stopped perftest"
exit $bad
