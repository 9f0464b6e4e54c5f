#!/usr/bin/env bash
# ucx_perftest's ucp_put_bw beside rdma-bench over the ucx backend, like for like: two
# processes on 127.0.0.1, the same transports (UCX_TLS), the same message size, the same
# number of puts, one buffer each side, no verification in either (ucx_perftest has none).
#
#   transport-ucx/compare.sh [RDMA_BENCH] [TLS...]     (default: target/release/rdma-bench, sm tcp)
#
# ours:  rdma-bench server/client --backend ucx --provider TLS --single-buffer --imm-every K
#        --window 32 -s SIZE -n N/K --warmup W (ci/suspect.sh's put_plan: K up to 4096, W
#        repeats of K, N/10 puts rounded down to whole repeats (put_warm); N/K rounded down
#        where K does not divide N): N puts, one in
#        K followed by the flush and the immediate (every figure to delivery: the clock stops
#        at the last immediate), at most 32 outstanding and W x K warm-up puts, as perftest;
#        no peer error handling (--nic-opt peer_errors=off), as perftest without -e (the
#        backend's default, auto, is on over tcp). PUT_IMM_EVERY=64 gives the plan this
#        script had before 2026-12-03 (one immediate in 64, which holds ours to 1 MiB in
#        flight at 4 KiB: put_plan says why).
# ucx_perftest -t ucp_put_bw -s SIZE -n N -w W*K, ours' warm-up puts (its window: -O 0, that is this test's
# default, 32 puts outstanding), twice for shared memory: with its own buffers (ucp_mem_map
# allocates them by UCX_ALLOC_PRIO, first md:sysv: shared memory the peer attaches, so a put
# is one memcpy by the initiator into the target's buffer, uct_sm_ep_put_short/bcopy, the
# target idle),
# and with UCX_ALLOC_PRIO=heap (buffers from malloc, like ours), the reference of every row,
# over tcp too. Over tcp perftest's own buffers are anonymous memory it never writes, so its
# sender copies every put from the kernel's zero page (its 1 MiB source was not in the
# process's resident set, /proc/PID/smaps; written by the shim, it was): before 2026-12-06
# the tcp rows compared ours with that, and it read perftest about 5% faster at 64 KiB and
# 1 MiB than the same buffers written (docs/measurements.md, U184). No shared-memory
# transport of UCX 1.13 reaches heap memory with a put: posix and sysv map only their own
# segments, and cma (process_vm_writev) has only put_zcopy, while UCP's RMA lanes need
# put_short, put_bcopy and get_bcopy (ucp_wireup_add_rma_lanes). UCP then emulates the put
# with active messages: the initiator copies it into the posix FIFO (uct_mm_ep_am_bcopy),
# the target's progress copies it out (ucp_put_handler) and acknowledges it; that, not
# cma, is what ours and perftest-heap measure. (UCX_MEM_ALLOC_METHOD, used here before,
# is no UCX variable: UCX ignored it and that column was the shared-segment case again.)
# The heap column's buffers are written before the run, as ours (perftest-written.c, an
# LD_PRELOAD shim: perftest never writes its send buffer, which then reads as the kernel's
# zero page; PERFTEST_BUF=untouched runs it as it comes), and placed as ours: BUF_OFFSET bytes
# into a page (default 0, rdma-bench's default; ours --buf-offset, perftest's placed by the
# shim, PERFTEST_BUF_OFFSET), since UCX's heap puts perftest's wherever malloc does and where
# a copy's source sits in its page can change what the copy costs (compare-tag.sh does the
# same). PERFTEST_BUF=untouched leaves perftest's where UCX puts them: not like for like.
# Ours names each put's region (its ucp_mem_map handle and memory type); ucx_perftest does
# so with -z (PERFTEST_OPTS=-z: both perftest columns), and without it UCX registers the
# buffer per put where the put is zero-copy (UCX 1.22's cma).
# Each figure is the best of ROUNDS runs (default 6, the fewest from which the interval
# below is one), the tools interleaved (odd rounds ours first, even rounds perftest first);
# beside it the median of the rounds' own ratios, the
# rounds where ours was ahead and the median's 95% confidence interval (ci/suspect.sh's
# interval: "level" where it holds 1.0), then every round's figures.
# Each side runs on a core of its own, the writers of both tools on one core and their targets
# on the other (pin_sides in ci/suspect.sh: CORES=server,client, default 0,1 here; ours'
# server writes, perftest's client does, so ours' two sides take the other's core), as
# ci/gpu-host-ucx.sh runs them.
# tcp runs with UCX_NET_DEVICES=lo. UCX_PERFTEST names another ucx_perftest (with the UCX
# whose libraries LD_LIBRARY_PATH picks for both). Ours runs with OURS_OPTS (default
# "--nic-opt write=put": ucp_put_nbx, as perftest). Over tcp the backend's default
# (write=auto, OURS_OPTS=) sends each WRITE as one active message carrying the bytes, with
# nothing sent back; UCX emulates a put there with active messages of at most 8 KiB
# (UCX_TCP_TX_SEG_SIZE), and the target acknowledges each one (ucp_put_handler), so a 1 MiB
# put is about 129 messages there and 129 acknowledgements back, which is not like for like.
set -euo pipefail
source "$(dirname "$0")/../ci/suspect.sh"
source "$(dirname "$0")/../ci/listening.sh"
B=${1:-target/release/rdma-bench}; shift || true
[ $# -gt 0 ] && TLS_LIST=("$@") || TLS_LIST=(sm tcp)
PERFTEST=${UCX_PERFTEST:-ucx_perftest}
OURS_OPTS=${OURS_OPTS-"--nic-opt write=put"}
SIZES=(${SIZES:-4096:1048576 65536:262144 1048576:16384})
ROUNDS=${ROUNDS:-6}  # 6: the fewest rounds from which ci/suspect.sh's interval gives one
best() { awk 'BEGIN {m = 0} $1 + 0 > m {m = $1 + 0} END {printf "%.2f\n", m}'; }
HEAP=(UCX_ALLOC_PRIO=heap) SO=
PERFTEST_BUF=${PERFTEST_BUF:-written} BUF_OFFSET=${BUF_OFFSET:-0}
pin_sides
ERR=$(mktemp -d); trap 'rm -rf "$ERR" ${SO:+"$SO"}' EXIT
case $PERFTEST_BUF in
  written) SO=$(mktemp --suffix=.so)
    ${CC:-cc} -O2 -shared -fPIC -o "$SO" "$(dirname "$0")/perftest-written.c" -ldl
    HEAP+=(LD_PRELOAD="$SO" PERFTEST_BUF_OFFSET="$BUF_OFFSET") ;;
  untouched) ;;
  *) echo "compare: PERFTEST_BUF is written or untouched, not $PERFTEST_BUF" >&2; exit 2 ;;
esac
perftest() { # TLS SIZE N [ENV...]
  local tls=$1 size=$2 n=$3 bw; shift 3
  PORT=$(free_port) || exit 1
  env UCX_TLS="$tls" UCX_NET_DEVICES=lo "$@" "${PIN_SRV[@]}" "$PERFTEST" -t ucp_put_bw -s "$size" \
    -n "$n" -w "$(put_warm "$n")" -p "$PORT" -f ${PERFTEST_OPTS:-} >/dev/null 2>"$ERR/srv" &
  local srv=$!
  wait_listening "$PORT" 30 || true  # past that the client runs anyway, and reports
  env UCX_TLS="$tls" UCX_NET_DEVICES=lo "$@" "${PIN_CLI[@]}" "$PERFTEST" -t ucp_put_bw -s "$size" \
    -n "$n" -w "$(put_warm "$n")" -p "$PORT" -f ${PERFTEST_OPTS:-} 127.0.0.1 >"$ERR/out" 2>"$ERR/cli" || true
  bw=$(ucx_perftest_gbps "$ERR/out")
  wait "$srv" || true
  # A heap run that the shim did not write and place compared against the zero page, or
  # from where malloc put it: no figure.
  if [[ " $* " == *" LD_PRELOAD="* ]] &&
      ! grep -qE '^perftest-written: [0-9]+ bytes at .* \(placed\)' "$ERR/cli" "$ERR/srv"; then
    echo "compare: ucx_perftest ran without perftest-written.so writing and placing its buffers" >&2
    echo 0.00; return
  fi
  echo "$bw"
}
ours() { # TLS SIZE N
  local tls=$1 size=$2 n=$3 dev=()
  PORT=$(free_port) || exit 1
  [ "$tls" = tcp ] && dev=(--devices lo)
  "${PIN_CLI[@]}" "$B" server --backend ucx --provider "$tls" "${dev[@]}" \
    --nic-opt peer_errors=off $OURS_OPTS --listen 127.0.0.1:$PORT --sessions 1 >/dev/null 2>&1 &
  local srv=$!
  wait_listening "$PORT" 30 || true  # past that the client runs anyway, and reports
  local plan; read -ra plan <<< "$(put_plan "$n")"
  "${PIN_SRV[@]}" "$B" client --backend ucx --provider "$tls" "${dev[@]}" \
    --nic-opt peer_errors=off $OURS_OPTS --connect 127.0.0.1:$PORT \
    --single-buffer --buf-offset "$BUF_OFFSET" "${plan[@]}" --window 32 -s "$size" --no-verify 2>/dev/null |
    awk '/verified/ {t = 1; next} t && NF >= 7 {print $4; exit}'
  wait "$srv" || true
}
echo "buffers: ours and perftest-heap's (the reference) $BUF_OFFSET bytes into a page; perftest's own as UCX allocates them, never written (shown, not compared)$([ "$PERFTEST_BUF" = untouched ] && echo " (perftest-heap's where UCX puts them)"); perftest-heap's $PERFTEST_BUF; perftest options: ${PERFTEST_OPTS:-none}; ours' options: ${OURS_OPTS:-none}; ours' immediates: one in ${PUT_IMM_EVERY:-up to 4096} puts; cores $PIN_CORES (server,client: perftest's; ours' swapped, both writers on the client's); load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-4s %8s %12s %14s %14s %8s %8s %10s  %s\n' tls size "ours Gbit/s" "perftest" \
  "perftest-heap" ratio median "ours ahead" "median's 95% CI"
FAILS=0
for tls in "${TLS_LIST[@]}"; do
  for sn in "${SIZES[@]}"; do
    size=${sn%%:*} n=${sn##*:}
    os=() ps=() hs=()
    for r in $(seq "$ROUNDS"); do
      # Odd rounds run ours first, even rounds perftest first: neither always follows the other.
      if [ $((r % 2)) = 1 ]; then os+=("$(one_figure 0 ours "$tls" "$size" "$n")"); fi
      ps+=("$(one_figure 0 perftest "$tls" "$size" "$n")")
      hs+=("$(one_figure 0 perftest "$tls" "$size" "$n" "${HEAP[@]}")")
      if [ $((r % 2)) = 0 ]; then os+=("$(one_figure 0 ours "$tls" "$size" "$n")"); fi
    done
    # A run without a figure reads 0 and best-of and medians pass it over: count it.
    FAILS=$((FAILS + $(not_positive "${os[@]}" "${ps[@]}" "${hs[@]}")))
    o=$(printf '%s\n' "${os[@]}" | best)
    p=$(printf '%s\n' "${ps[@]}" | best)
    # The reference: perftest's heap buffers, written and placed as ours (the header says
    # why, over tcp too).
    h=$(printf '%s\n' "${hs[@]}" | best) ref=$h refs=("${hs[@]}")
    r=$(ratio "$o" "$ref")
    # The median of the rounds' own ratios, and in how many rounds ours was ahead: what a
    # claim of "at least 1.0" rests on (a best of rounds moves with one fast round).
    mapfile -t rr < <(round_ratios "${os[*]}" "${refs[*]}")
    printf '%-4s %8s %12s %14s %14s %8s %8s %10s  %-18s%s   rounds: ours %s theirs %s\n' "$tls" \
      "$size" "$o" "$p" "$h" "$r" "$(median "${rr[@]}")" "$(above put "${rr[@]}")" \
      "$(interval put "${rr[@]}")" "$(suspect put "$r" "$(median "${rr[@]}")")" "$(IFS=/; echo "${os[*]}")" \
      "$(IFS=/; echo "${refs[*]}")"
  done
done
if [ "$FAILS" -gt 0 ]; then
  echo "compare: FAILED: $FAILS run(s) gave no figure (0 in their round): the table's figures rest on fewer rounds" >&2
  exit 1
fi
