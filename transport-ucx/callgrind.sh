#!/usr/bin/env bash
# Instructions a message of a tagged stream over UCX, counted by valgrind's callgrind, for
# each side of rdma-bench's send workload and of ucx_perftest's tag_bw, the same way: the
# side under valgrind, its peer native, twice (N1 and N2 messages). Instruction counts, not
# time (docs/measurements.md, "Who sets the pace of the tag rows").
#
#   transport-ucx/callgrind.sh [WHO:SIDE...]   WHO ours or perftest, SIDE sender or receiver
#                                              (default: all four); with ROW=lat, ping or
#                                              pong (default: both tools' ping)
#
# ours:     rdma-bench server (the sender) and client (the receiver) --backend ucx
#           --provider $UCX_TLS --nic-opt peer_errors=off, --workload send --single-buffer
#           --window 32 -s SIZE -n N --no-verify --warmup 1; with the receiver under
#           valgrind the native sender progresses on every poll (progress_skip=0), or its
#           skipped progress leaves the slowed receiver idle.
# perftest: ucx_perftest -t tag_bw -s SIZE -n N -w 256, its server the receiver, with
#           UCX_ALLOC_PRIO=heap (buffers from malloc, like ours).
# ROW=lat: the ping-pong instead, a message being a round trip (one ucp_tag_send_nbx on each
# side), SIDE the side that sends first (ping) or the one that answers (pong): ours --workload
# lat --op send -s SIZE -n N --warmup 1, whose client pings; perftest -t tag_lat -s SIZE -n N,
# whose server pings (libperf's group index 0, the side without a host argument).
# valgrind runs with --fair-sched=yes: without it the receiver's spinning thread starved
# rdma-bench's control reader, and the client timed out after every message had arrived.
#
# Under valgrind a side polls an empty queue far more often than natively, and how often
# differs from run to run, so the two runs' difference per message carries idle polls. Each
# function a loop turn runs (the loop, its poll, UCX's progress) is fitted over the two runs
# as a x turns + b x messages (ci/cg-objects.py --fit; turns: ours' polls, perftest's
# ucp_worker_progress calls; messages: ucp_tag_send_nbx or ucp_tag_recv_nbx calls); every
# other function is the plain difference. Prints, for each WHO:SIDE, the TOP functions by
# instructions a message ("per message, per turn, function"), the total, and the turns per
# message of the two runs.
#
# Env: RDMA_BENCH (default target/release/rdma-bench, built with --features ucx), UCX_LIB
# (a UCX lib directory for both tools, e.g. the libucx-cu12 wheel's libucx/lib),
# UCX_PERFTEST (default ucx_perftest), UCX_TLS (sm), SIZE (4096), N1 (16384), N2 (65536),
# TOP (12), CALLGRIND_DIR (keeps the profiles there; default a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/listening.sh
B=${RDMA_BENCH:-target/release/rdma-bench}
PERFTEST=${UCX_PERFTEST:-ucx_perftest}
ROW=${ROW:-tag} TLS=${UCX_TLS:-sm} SIZE=${SIZE:-4096} N1=${N1:-16384} N2=${N2:-65536} TOP=${TOP:-12}
NETDEV=${UCX_NET_DEVICES:-$([ "$TLS" = tcp ] && echo lo || echo all)}
[ -n "${UCX_LIB:-}" ] && export LD_LIBRARY_PATH=$UCX_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
command -v valgrind >/dev/null || { echo "callgrind: valgrind is not installed" >&2; exit 1; }
[ -x "$B" ] || { echo "callgrind: no $B (cargo build --release -p bench-cli --features ucx)" >&2; exit 1; }
DIR=${CALLGRIND_DIR:-}
if [ -z "$DIR" ]; then DIR=$(mktemp -d); trap 'rm -rf "$DIR"' EXIT; fi
mkdir -p "$DIR"
case $ROW in tag|lat) ;; *) echo "callgrind: ROW is tag or lat, not $ROW" >&2; exit 2 ;; esac
if [ $# -gt 0 ]; then WHAT=("$@")
elif [ "$ROW" = lat ]; then WHAT=(ours:ping perftest:ping)
else WHAT=(ours:sender ours:receiver perftest:sender perftest:receiver); fi
VG=(valgrind --tool=callgrind --fair-sched=yes)

# run WHO SIDE N OUT: one profile of SIDE (valgrind), its peer native; fails if either fails
run() {
  local who=$1 side=$2 n=$3 out=$4 srv=() cli=() vs=() vc=() env=() sp rc=0
  PORT=$(free_port) || exit 1
  # The side the server is: ours' sends (tag) and answers (lat), perftest's receives and
  # pings (libperf's group index 0, the side without a host argument).
  local on_srv
  case $who:$ROW in ours:tag) on_srv=sender ;; ours:lat) on_srv=pong ;;
    perftest:tag) on_srv=receiver ;; perftest:lat) on_srv=ping ;; esac
  if [ "$side" = "$on_srv" ]; then vs=("${VG[@]}" --callgrind-out-file="$out"); else
    vc=("${VG[@]}" --callgrind-out-file="$out"); fi
  if [ "$who" = ours ]; then
    local common=(--backend ucx --provider "$TLS" --nic-opt peer_errors=off)
    [ "$TLS" = tcp ] && common+=(--devices lo)
    srv=("$B" server "${common[@]}" --listen 127.0.0.1:$PORT --sessions 1)
    [ "$side" = receiver ] && srv+=(--nic-opt progress_skip=0)
    cli=("$B" client "${common[@]}" --connect 127.0.0.1:$PORT -s "$SIZE" -n "$n" --warmup 1)
    if [ "$ROW" = lat ]; then cli+=(--workload lat --op send)
    else cli+=(--workload send --single-buffer --window 32 --no-verify); fi
  elif [ "$ROW" = lat ]; then
    srv=("$PERFTEST" -t tag_lat -s "$SIZE" -n "$n" -p $PORT)
    cli=("${srv[@]}" 127.0.0.1)
  else
    local args=(-t tag_bw -s "$SIZE" -n "$n" -w 256 -p $PORT)
    env=(UCX_ALLOC_PRIO=heap)
    srv=("$PERFTEST" "${args[@]}")
    cli=("$PERFTEST" "${args[@]}" 127.0.0.1)
  fi
  env=(UCX_TLS="$TLS" UCX_NET_DEVICES="$NETDEV" "${env[@]}")
  env "${env[@]}" timeout 600 "${vs[@]}" "${srv[@]}" > "$out.srv" 2>&1 &
  sp=$!
  # valgrind starts slowly: up to 60 s for the server to listen.
  wait_listening $PORT 60 || { echo "callgrind: $who's server does not listen on $PORT" >&2
    kill $sp 2>/dev/null; return 1; }
  env "${env[@]}" timeout 600 "${vc[@]}" "${cli[@]}" > "$out.cli" 2>&1 ||
    rc=$?
  wait $sp || rc=$?
  [ "$rc" = 0 ] || { echo "callgrind: $who $side, $n messages: exit $rc; see $out.srv, $out.cli" >&2; return 1; }
}

fail=0
for w in "${WHAT[@]}"; do
  who=${w%%:*} side=${w#*:}
  case $who:$side in ours:*|perftest:*) ;; *) echo "callgrind: WHO:SIDE, not $w" >&2; exit 2 ;; esac
  case $ROW:$side in tag:sender|lat:ping|lat:pong) msg='^ucp_tag_send_nbx$' ;;
    tag:receiver) msg='^ucp_tag_recv_nbx$' ;;
    tag:*) echo "callgrind: SIDE is sender or receiver, not $side" >&2; exit 2 ;;
    *) echo "callgrind: with ROW=lat SIDE is ping or pong, not $side" >&2; exit 2 ;; esac
  if [ "$who" = ours ]; then turn='Endpoint>::poll$' fit='Endpoint>::poll$|workload::|progress'
  else turn='^ucp_worker_progress$' fit='run_stream_uni|run_pingpong|progress'; fi
  run "$who" "$side" "$N1" "$DIR/$who-$side-1.out" && run "$who" "$side" "$N2" "$DIR/$who-$side-2.out" ||
    { fail=1; continue; }
  echo "== $who $side ($ROW, $SIZE bytes, UCX_TLS=$TLS; per message, per turn, function)"
  python3 ci/cg-objects.py --fit "$turn" "$msg" "$fit" "$DIR/$who-$side-1.out" \
    "$DIR/$who-$side-2.out" "$TOP" | cut -c1-140 || fail=1
done
exit $fail
