#!/usr/bin/env bash
# ucx_perftest's ucp_put_bw beside rdma-bench over the ucx backend, like for like: two
# processes on 127.0.0.1, the same transports (UCX_TLS), the same message size, the same
# number of puts, one buffer each side, no verification in either (ucx_perftest has none).
#
#   transport-ucx/compare.sh [RDMA_BENCH] [TLS...]     (default: target/release/rdma-bench, sm tcp)
#
# ours:  rdma-bench server/client --backend ucx --provider TLS --single-buffer --imm-every 64
#        -s SIZE -n N/64: N puts, one in 64 followed by the flush and the immediate (every
#        figure to delivery: the clock stops at the last immediate).
# ucx_perftest -t ucp_put_bw -s SIZE -n N -w N/10 (its window: -O 0, UCX's default), twice
# for shared memory: with its own buffers (UCX allocates them in posix/sysv shared memory,
# which the peer maps: a put is a memcpy), and with UCX_MEM_ALLOC_METHOD=heap (buffers from
# malloc, like ours: no mapping, puts go through cma's process_vm_writev).
# tcp runs with UCX_NET_DEVICES=lo. UCX_PERFTEST names another ucx_perftest (with the UCX
# whose libraries LD_LIBRARY_PATH picks for both).
set -euo pipefail
B=${1:-target/release/rdma-bench}; shift || true
[ $# -gt 0 ] && TLS_LIST=("$@") || TLS_LIST=(sm tcp)
PERFTEST=${UCX_PERFTEST:-ucx_perftest}
SIZES=(${SIZES:-4096:20000 65536:5000 1048576:500})
PORT=${PORT:-13400}
perftest() { # TLS SIZE N [ENV...]
  local tls=$1 size=$2 n=$3; shift 3
  PORT=$((PORT + 1))
  env UCX_TLS="$tls" UCX_NET_DEVICES=lo "$@" "$PERFTEST" -t ucp_put_bw -s "$size" -n "$n" \
    -w $((n / 10)) -p "$PORT" -f >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  # Final: iters, lat 50%, avg, overall, bw avg (MB/s), bw overall, msgrate avg, overall
  env UCX_TLS="$tls" UCX_NET_DEVICES=lo "$@" "$PERFTEST" -t ucp_put_bw -s "$size" -n "$n" \
    -w $((n / 10)) -p "$PORT" -f 127.0.0.1 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ && NF >= 8 {bw = $6} END {printf "%.2f\n", bw * 8 * 1048576 / 1e9}'
  wait "$srv" || true
}
ours() { # TLS SIZE N
  local tls=$1 size=$2 n=$3 dev=()
  PORT=$((PORT + 1))
  [ "$tls" = tcp ] && dev=(--devices lo)
  "$B" server --backend ucx --provider "$tls" "${dev[@]}" --listen 127.0.0.1:$PORT \
    --sessions 1 >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  "$B" client --backend ucx --provider "$tls" "${dev[@]}" --connect 127.0.0.1:$PORT \
    --single-buffer --imm-every 64 -s "$size" -n $((n / 64)) --no-verify 2>/dev/null |
    awk '/verified/ {t = 1; next} t && NF >= 7 {print $4; exit}'
  wait "$srv" || true
}
printf '%-4s %8s %12s %14s %14s %8s\n' tls size "ours Gbit/s" "perftest" "perftest-heap" ratio
for tls in "${TLS_LIST[@]}"; do
  for sn in "${SIZES[@]}"; do
    size=${sn%%:*} n=${sn##*:}
    o=$(ours "$tls" "$size" "$n")
    p=$(perftest "$tls" "$size" "$n")
    h=-
    [ "$tls" = tcp ] || h=$(perftest "$tls" "$size" "$n" UCX_MEM_ALLOC_METHOD=heap)
    ref=$p; [ "$h" != - ] && ref=$h
    r=$(awk -v o="$o" -v p="$ref" 'BEGIN { if (p > 0) printf "%.2f", o / p; else print "-" }')
    printf '%-4s %8s %12s %14s %14s %8s\n' "$tls" "$size" "$o" "$p" "$h" "$r"
  done
done
