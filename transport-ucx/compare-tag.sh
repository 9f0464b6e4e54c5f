#!/usr/bin/env bash
# ucx_perftest's tag_bw and tag_lat beside rdma-bench's SEND rows over the ucx backend, like
# for like (compare.sh does put): two processes on 127.0.0.1, the same transports (UCX_TLS),
# message sizes and iterations, heap buffers on both sides (perftest: UCX_ALLOC_PRIO=heap, as
# ci/gpu-host-ucx.sh runs it), written before the run on both sides (ours fills its send
# buffer; perftest never writes its own, so it sends the kernel's zero page: the LD_PRELOAD
# shim perftest-written.c writes each buffer ucp_mem_map allocates; PERFTEST_BUF=untouched
# runs perftest as it comes), no peer error handling on either (perftest's default, ours
# --nic-opt peer_errors=off), no verification in either, and both tools' buffers the same
# BUF_OFFSET bytes into a page (a multiple of 64; default 0: on the page, rdma-bench's
# default; ours --buf-offset, perftest's placed by the shim, PERFTEST_BUF_OFFSET), since
# UCX's heap puts perftest's wherever malloc does (docs/measurements.md, "The page-aligned
# penalty, explained").
#
#   transport-ucx/compare-tag.sh [RDMA_BENCH] [TLS...]   (default: target/release/rdma-bench, sm tcp)
#
# tag  ours: --workload send --single-buffer --window 32 -s SIZE -n N: ucp_tag_send_nbx into
#           receives kept posted on one buffer (1024 up to 16 KiB, 256 from 64 KiB: 16 MiB
#           of receives between; credits back as WRITEs with immediate every quarter of
#           that), at most 32 sends posted and not yet reported complete (an
#           immediately completed one counts until the next poll reports it); the clock stops
#           at the receiver's acknowledgement after the last message.
#      perftest -t tag_bw -s SIZE -n N -w W (ours' warm-up messages: N/10 rounded down to
#           whole repeats of the receive depth, at least one: send_warm; lat: -w N/10): ucp_tag_send_nbx with up to 32 sends
#           outstanding (immediately completed ones not counted), the receiver posts up to 32
#           receives; from UCX 1.18 its clock stops when the receiver's 1-byte ack (a tag
#           send) arrived. Before 1.18 (Debian's 1.13.1, this box's rows) there is no ack
#           (run_stream_uni): the sender's clock stops after its last send completed locally
#           and a flush, not at delivery as ours', which favours perftest.
# lat  ours: --workload lat --op send -s SIZE -n LAT_ITERS: tag ping-pong; one-way = the sum of
#           the timed round trips / iters / 2 (the mean), and the median round trip / 2.
#      perftest -t tag_lat -s SIZE -n LAT_ITERS -w LAT_ITERS/10: its "overall" latency (the
#           mean, half a round trip) and its "50%" column, which is the median of its last
#           2048 round trips only (libperf's TIMING_QUEUE_SIZE), not of all of them as ours':
#           the ratio is of the means; the medians are printed beside it, not compared.
# Gbit/s for tag (ours / theirs: higher is better), microseconds for lat (lower is better);
# each figure the best of ROUNDS (default 6, the fewest from which the interval is one)
# rounds, the tools interleaved (odd rounds ours first, even rounds theirs first), then the median of the rounds' own ratios (of the means
# for lat), the rounds where ours was ahead and the median's 95% confidence interval
# (ci/suspect.sh's interval: "level" where it holds 1.0). tcp runs with UCX_NET_DEVICES=lo
# and --devices lo. Each side runs on a core of its own (pin_sides in ci/suspect.sh:
# CORES=server,client, default 0,1 here), as ci/gpu-host-ucx.sh runs them: for tag the
# senders of both tools on one core (ours' server sends, perftest's client does, so ours' two
# sides take the other's core), for lat the servers on one and the clients on the other.
# UCX_LIB=DIR runs both against the UCX in DIR (LD_LIBRARY_PATH; e.g. the libucx-cu12 wheel's
# libucx/lib, whose 1.22 is what the GPU host runs), with UCX_PERFTEST its ucx_perftest.
# ROWS (tag,lat), SIZES (4096,65536,1048576), BYTES (1 GiB per tag run), LAT_ITERS (20000,
# at most LAT_BYTES / SIZE: 4 GiB, so 4096 round trips at 1 MiB).
# UCX_TIME=1: every process of both tools loads ucp-time.c, and each cell's line also gets
# "at equal speed" (ci/suspect.sh's adjusted): the runs compared at equal speed of the box,
# each run's speed the mean time of a UCX call whose work is the same in both tools. lat: a
# progress call that did work, in both processes (in a ping-pong each such call takes one
# message out of UCX's FIFO or socket into the posted receive and completes it); tag: a
# ucp_tag_send_nbx call of the sender (a SIZE send; the receivers' progress calls take
# messages in batches that differ between the tools). This box's vCPUs move between levels of
# speed from run to run (sm lat 4 KiB at about 0.25, 0.4 and 1.3 us one-way); the send time
# alone tells only the slowest level apart, a receive's time the other two as well. The
# shim's clock reads around each UCX call slow both tools alike; its figures are compared
# with each other, not with runs without it. A lat cell's line also gets each tool's react,
# server/client: ucp-time's mean of the reacts under 1 us (a process's time from the progress
# call that handed it a message to its answer's send), the middle of the runs' (U179).
set -euo pipefail
source "$(dirname "$0")/../ci/suspect.sh"
source "$(dirname "$0")/../ci/listening.sh"
B=${1:-target/release/rdma-bench}; shift || true
[ $# -gt 0 ] && TLS_LIST=("$@") || TLS_LIST=(sm tcp)
PERFTEST=${UCX_PERFTEST:-ucx_perftest}
[ -n "${UCX_LIB:-}" ] && export LD_LIBRARY_PATH=$UCX_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
IFS=, read -r -a SIZES <<< "${SIZES:-4096,65536,1048576}"
IFS=, read -r -a ROWS <<< "${ROWS:-tag,lat}"
ROUNDS=${ROUNDS:-6} BYTES=${BYTES:-1073741824}
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
pin_sides
PERFTEST_BUF=${PERFTEST_BUF:-written} BUF_OFFSET=${BUF_OFFSET:-0}
case $PERFTEST_BUF in
  written) ${CC:-cc} -O2 -shared -fPIC -o "$OUT/written.so" "$(dirname "$0")/perftest-written.c" -ldl
    PRELOAD=(LD_PRELOAD="$OUT/written.so" PERFTEST_BUF_OFFSET="$BUF_OFFSET") ;;
  # perftest's buffers as UCX places them: ours keeps BUF_OFFSET, so not like for like.
  untouched) PRELOAD=() ;;
  *) echo "compare-tag: PERFTEST_BUF is written or untouched, not $PERFTEST_BUF" >&2; exit 2 ;;
esac
TIMED=  # ucp-time.so, under UCX_TIME
if [ -n "${UCX_TIME:-}" ]; then
  TIMED=$OUT/time.so
  ${CC:-cc} -O2 -shared -fPIC -o "$TIMED" "$(dirname "$0")/ucp-time.c" -ldl
  # perftest's processes load it after perftest-written, where that is loaded.
  case ${PRELOAD[0]:-} in
    LD_PRELOAD=*) PRELOAD[0]="${PRELOAD[0]} $TIMED" ;;
    *) PRELOAD+=(LD_PRELOAD="$TIMED") ;;
  esac
fi
# react_of LOG: the process's react under 1 us (ns) from its ucp-time line; "-" where none.
react_of() {
  local v; v=$(sed -nE 's/^ucp-time: .* under 1 us ([0-9.]+) ns \([0-9]+\)$/\1/p' "$1" | head -1)
  echo "${v:--}"
}
# keep_reacts ROW FILE SERVER-LOG CLIENT-LOG: a lat run's two reacts (UCX_TIME), a line of FILE.
keep_reacts() {
  [ -z "$TIMED" ] || [ "$1" != lat ] || echo "$(react_of "$3") $(react_of "$4")" >> "$2"
}
# reacts FILE: "SERVER/CLIENT", the middle of the runs' reacts kept in FILE.
reacts() {
  # shellcheck disable=SC2046 # one number a run
  echo "$(median $(cut -d' ' -f1 "$1"))/$(median $(cut -d' ' -f2 "$1"))"
}
# run_speed ROW LOG...: the run's speed (ns) from its processes' ucp-time lines (UCX_TIME):
# lat, the mean time of a progress call with work; tag, of a send; over the processes that
# made at least 1000 such calls. "-" where none did (or UCX_TIME is unset).
run_speed() {
  local row=$1; shift
  [ -n "$TIMED" ] || { echo -; return; }
  if [ "$row" = lat ]; then
    sed -nE 's/^ucp-time: .* progress [0-9.]+ ns\/call \([0-9]+, ([0-9]+) with work, ([0-9.]+) ns each.*/\2 \1/p' "$@"
  else
    sed -nE 's/^ucp-time: .* send ([0-9.]+) ns\/call \(([0-9]+), .*/\1 \2/p' "$@"
  fi | awk '$2 >= 1000 {s += $1; n++} END {if (n) printf "%.1f\n", s / n; else print "-"}'
}
iters() { # ROW SIZE
  local n
  if [ "$1" = lat ]; then round_trips "$2" 20000; return; fi
  n=$((BYTES / $2)); [ $n -ge 128 ] || n=128; echo $n
}
theirs() { # ROW TLS SIZE -> "value median speed" (median: lat only; speed: UCX_TIME only)
  local row=$1 tls=$2 size=$3 n t; n=$(iters "$row" "$size")
  [ "$row" = lat ] && t=tag_lat || t=tag_bw
  # Ours' warm-up: n / 10 round trips (lat); whole repeats of the receive depth (tag).
  local w=$((n / 10)); [ "$row" = lat ] || w=$(send_warm "$n" "$size")
  PORT=$(free_port) || exit 1
  local env=(UCX_TLS="$tls" UCX_NET_DEVICES=lo UCX_ALLOC_PRIO=heap "${PRELOAD[@]}")
  env "${env[@]}" timeout 120 "${PIN_SRV[@]}" "$PERFTEST" -t $t -s "$size" -n "$n" \
    -w "$w" -p $PORT -f > "$OUT/tsrv" 2>&1 &
  local srv=$!
  wait_listening "$PORT" 30 || true  # past that the client runs anyway, and reports
  # Final line: iters, lat 50%, lat avg, lat overall (us), bw avg, overall (MB/s), rates.
  env "${env[@]}" timeout 120 "${PIN_CLI[@]}" "$PERFTEST" -t $t -s "$size" -n "$n" \
    -w "$w" -p $PORT -f 127.0.0.1 > "$OUT/tcli" 2>&1 || true
  wait "$srv" || true
  keep_reacts "$row" "$OUT/rt" "$OUT/tsrv" "$OUT/tcli"
  if [ "$PERFTEST_BUF" = written ] && ! grep -qE '^perftest-written: [0-9]+ bytes at .* \(placed\)' "$OUT/tcli" "$OUT/tsrv"; then
    echo "compare-tag: ucx_perftest ran without perftest-written.so writing and placing its buffers" >&2
    echo "0 - -"; return
  fi
  local sp; sp=$(run_speed "$row" "$OUT/tsrv" "$OUT/tcli")
  if [ "$row" = lat ]; then
    awk -v sp="$sp" '$1 ~ /^[0-9]+$/ && NF >= 8 {v = $4; m = $2} END {printf "%.3f %.3f %s\n", v, m, sp}' "$OUT/tcli"
  else
    echo "$(ucx_perftest_gbps "$OUT/tcli") - $sp"
  fi
}
ours() { # ROW TLS SIZE -> "value median speed", as theirs
  local row=$1 tls=$2 size=$3 n dev=() args; n=$(iters "$row" "$size")
  PORT=$(free_port) || exit 1
  [ "$tls" = tcp ] && dev=(--devices lo)
  local common=(--backend ucx --provider "$tls" "${dev[@]}" --nic-opt peer_errors=off)
  local place=(--buf-offset "$BUF_OFFSET")
  case $row in
    # Warm-up as perftest's -w: --warmup counts repeats of the receive depth (send_warmup),
    # n / 10 messages in whole repeats, at least one; perftest's -w is the same count
    # (send_warm).
    tag) args=(--workload send --single-buffer --window 32 -s "$size" -n "$n" --no-verify
          --warmup "$(send_warmup "$n" "$size")") ;;
    lat) args=(--workload lat --op send -s "$size" -n "$n" --warmup $((n / 10))) ;;
  esac
  # The sender on the senders' core (tag): ours' server sends, perftest's client does.
  local ps=("${PIN_SRV[@]}") pc=("${PIN_CLI[@]}")
  [ "$row" = tag ] && ps=("${PIN_CLI[@]}") pc=("${PIN_SRV[@]}")
  local timed=(); [ -z "$TIMED" ] || timed=(env LD_PRELOAD="$TIMED")
  timeout 120 "${timed[@]}" "${ps[@]}" "$B" server "${common[@]}" --listen 127.0.0.1:$PORT --sessions 1 > "$OUT/srv" 2>&1 &
  local srv=$!
  wait_listening "$PORT" 30 || true  # past that the client runs anyway, and reports
  timeout 120 "${timed[@]}" "${pc[@]}" "$B" client "${common[@]}" --connect 127.0.0.1:$PORT "${args[@]}" "${place[@]}" --json \
    2> "$OUT/err" | grep -v '^\[[0-9]' > "$OUT/ours.json" || true
  wait "$srv" || true
  keep_reacts "$row" "$OUT/ro" "$OUT/srv" "$OUT/err"
  local sp; sp=$(run_speed "$row" "$OUT/srv" "$OUT/err")
  if [ "$row" = lat ]; then
    jq -r '"\(.seconds * 1e6 / .ops / 2) \(.p50_us)"' "$OUT/ours.json" 2>/dev/null |
      awk -v sp="$sp" '{printf "%.3f %.3f %s\n", $1, $2, sp}' || echo "0 0 -"
  else
    jq -r '.gbps' "$OUT/ours.json" 2>/dev/null | awk -v sp="$sp" '{printf "%.2f - %s\n", $1, sp}' || echo "0 - -"
  fi
}
best() { # ROW: best of the first column (and of the second) of stdin
  awk -v r="$1" '$1 + 0 > 0 { if (n++ == 0 || (r == "lat" ? $1 < a : $1 > a)) a = $1;
      if ($2 != "-" && (m == "" || $2 < m)) m = $2 }
    END { if (n == 0) print "0 -"; else printf "%s %s\n", a, (m == "" ? "-" : m) }'
}
echo "buffers: both tools' $BUF_OFFSET bytes into a page$([ "$PERFTEST_BUF" = untouched ] && echo " (ours; perftest's where UCX puts them)"); ucx_perftest's heap, $PERFTEST_BUF; cores $PIN_CORES (server,client; ours' swapped for tag, both senders on the client's); load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-4s %-4s %8s %10s %10s %7s %7s %10s  %-18s %s\n' tls row size ours theirs ratio median \
  "ours ahead" "median's 95% CI" "(tag: Gbit/s; lat: one-way us, mean, then median ours/theirs)"
FAILS=0
for tls in "${TLS_LIST[@]}"; do
  for row in "${ROWS[@]}"; do
    for size in "${SIZES[@]}"; do
      : > "$OUT/o"; : > "$OUT/t"; : > "$OUT/ro"; : > "$OUT/rt"
      for r in $(seq "$ROUNDS"); do
        # One line per run ("0 -" where a run printed none): the rounds stay paired.
        if [ $((r % 2)) = 1 ]; then
          one_figure "0 - -" ours $row $tls $size >> "$OUT/o"
          one_figure "0 - -" theirs $row $tls $size >> "$OUT/t"
        else
          one_figure "0 - -" theirs $row $tls $size >> "$OUT/t"
          one_figure "0 - -" ours $row $tls $size >> "$OUT/o"
        fi
      done
      # A run without a figure reads 0 and best-of and medians pass it over: count it.
      FAILS=$((FAILS + $(not_positive $(cut -d' ' -f1 "$OUT/o" "$OUT/t"))))
      read -r o om < <(best $row < "$OUT/o")
      read -r t tm < <(best $row < "$OUT/t")
      ratio=$(ratio "$o" "$t")
      extra=
      [ "$row" = lat ] && extra="   median $om/$tm"
      mapfile -t rr < <(round_ratios "$(cut -d' ' -f1 "$OUT/o")" "$(cut -d' ' -f1 "$OUT/t")")
      # UCX_TIME: FIGURE:SPEED of each run, compared at equal speed.
      eq=
      if [ -n "$TIMED" ]; then
        mapfile -t so < <(awk '{print $1 ":" $3}' "$OUT/o"); mapfile -t st < <(awk '{print $1 ":" $3}' "$OUT/t")
        eq="   at equal speed: ours / theirs $(adjusted "$row" "${so[@]}" -- "${st[@]}"); speeds (ns): ours $(cut -d' ' -f3 "$OUT/o" | paste -sd/) theirs $(cut -d' ' -f3 "$OUT/t" | paste -sd/)"
        [ "$row" != lat ] || eq="$eq; react under 1 us (ns), server/client: ours $(reacts "$OUT/ro") theirs $(reacts "$OUT/rt")"
      fi
      printf '%-4s %-4s %8s %10s %10s %7s %7s %10s  %-18s%s   rounds: ours %s theirs %s%s\n' \
        "$tls" "$row" "$size" "$o" "$t" "$ratio" "$(median "${rr[@]}")" \
        "$(above "$row" "${rr[@]}")" "$(interval "$row" "${rr[@]}")" \
        "$extra" "$(cut -d' ' -f1 "$OUT/o" | paste -sd/)" \
        "$(cut -d' ' -f1 "$OUT/t" | paste -sd/)" "$(suspect "$row" "$ratio" "$(median "${rr[@]}")")$eq"
    done
  done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$FAILS" -gt 0 ]; then
  echo "compare-tag: FAILED: $FAILS run(s) gave no figure (0 in their round): the table's figures rest on fewer rounds" >&2
  exit 1
fi
