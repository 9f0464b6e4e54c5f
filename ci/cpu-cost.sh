#!/usr/bin/env bash
# Instructions per WRITE of the whole path (rdma-bench's harness and trait, libfabric's
# provider), counted by valgrind's callgrind, for efa on the simulated device (efa-sim), shm
# and tcp, all through libfabric 2.6.0 (ci/efa-sim.sh's build, which has every provider).
# Instruction counts, not performance: nothing here is a time, and nothing from the
# simulator is EFA performance.
#
#   ci/cpu-cost.sh [ROW...]     a ROW is "PROVIDER SIZE single|paged [EXTRA FLAGS...]";
#                               default: efa, shm, tcp x 4K, 64K x single, paged, then efa
#                               64K with --batch 1, with --lazy, and verified
# Each row runs `rdma-bench loopback` (both sides in one process: the initiator's and the
# target's threads, and efa-sim's engine thread) twice under callgrind, with a small and a
# larger WRITE count, and subtracts (set-up, warm-up and tear-down cancel); then twice more
# with --toggle-collect on the trait's C shim around fi_writemsg (rs_fi_write*), which counts
# libfabric's post path alone. Columns, per WRITE:
#   all       harness+trait+libfabric, both sides, polls included (the simulator's objects
#             and threads left out: sim column). Under valgrind threads run one at a time,
#             so a side polls an empty queue far more often than on hardware: an upper bound.
#   bench     of which rdma-bench (harness and trait); libfabric: of which libfabric
#   sim       the simulator's own work (its libibverbs/libefa stand-ins and engine), left out
#   lf-post   libfabric's post of one WRITE (fi_writemsg through the trait's C shim, the
#             simulated device's post left out): no idle turns in it, but the provider's
#             own queueing (a WRITE posted later from progress when the send queue is full)
#   turns     the harness's loop turns (post attempts) per WRITE on the posting side: a turn
#             that finds the window full posts nothing and polls; 1/batch would be none idle
#   polls     the trait's poll calls per WRITE, both sides
#   top       the 5 libfabric functions that grew most (all threads, per WRITE)
# Idle polls vary from run to run with valgrind's scheduling: run a row several times
# (CPU_COST_REPEAT=N prints N runs of each) and read the run with the fewest polls per WRITE;
# docs/measurements.md ("Instructions per WRITE") fits them out.
# Env: CPU_COST_REPEAT (runs per row, default 1), CPU_COST_DIR (profiles; default a
# temporary directory, removed), RDMA_BENCH (binary; default
# target-efa-sim/release/rdma-bench, built with `ci/efa-sim.sh cargo build --release -p
# bench-cli` when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${RDMA_BENCH:-$ROOT/target-efa-sim/release/rdma-bench}
if [ ! -x "$BIN" ]; then
  echo "cpu-cost: building $BIN" >&2
  ci/efa-sim.sh cargo build --release -p bench-cli >&2
fi
command -v valgrind >/dev/null || { echo "cpu-cost: valgrind is not installed" >&2; exit 1; }
DIR=${CPU_COST_DIR:-}
if [ -z "$DIR" ]; then DIR=$(mktemp -d); trap 'rm -rf "$DIR"' EXIT; fi
mkdir -p "$DIR"

ROWS=("$@")
if [ ${#ROWS[@]} -eq 0 ]; then
  for p in efa shm tcp; do for s in 4K 64K; do for m in single paged; do ROWS+=("$p $s $m"); done; done; done
  ROWS+=("efa 64K single --batch 1" "efa 64K paged --batch 1" "efa 64K paged --lazy"
         "efa 64K paged --verify")
fi
REPEAT=${CPU_COST_REPEAT:-1}
if [ "$REPEAT" -gt 1 ]; then
  r=("${ROWS[@]}"); ROWS=()
  for row in "${r[@]}"; do for _ in $(seq "$REPEAT"); do ROWS+=("$row"); done; done
fi

# run TAG N PROVIDER SIZE MODE EXTRA... : one callgrind run; prints the WRITEs it measured
run() {
  local tag=$1 n=$2 prov=$3 size=$4 mode=$5; shift 5
  # valgrind runs the threads one at a time, 50-100x slower: generous time-outs (rdma-bench's
  # idle time-out; the simulated device's answer time-out, else "Unresponsive receiver").
  local flags=(loopback --provider "$prov" -s "$size" --warmup 1 -n "$n" --idle-timeout 300)
  [ "$mode" = single ] && flags+=(--single-buffer)
  local verify=(--no-verify)
  for a in "$@"; do [ "$a" = --verify ] && verify=(); done
  flags+=("${verify[@]}")
  for a in "$@"; do [ "$a" = --verify ] || flags+=("$a"); done
  local vg=(valgrind --tool=callgrind --callgrind-out-file="$DIR/$tag.out")
  case "$tag" in *post*) vg+=("--toggle-collect=rs_fi_write*") ;; esac
  local pre=()
  case "$prov" in
    efa) pre=(--devices p5); flags+=(--nics-per-gpu 1 -v) ;;
    tcp) export FI_TCP_IFACE=lo ;;
  esac
  EFA_SIM_TIMEOUT_MS=${EFA_SIM_TIMEOUT_MS:-300000} ci/efa-sim.sh "${pre[@]}" "${vg[@]}" "$BIN" "${flags[@]}" > "$DIR/$tag.txt" 2> "$DIR/$tag.err" ||
    { tail -20 "$DIR/$tag.err" >&2; echo "cpu-cost: $prov $size $mode $*: the run failed" >&2; return 1; }
  # The p5 path: WRITEs done by the device (libfabric API >= 1.18), not emulated over SENDs.
  if [ "$prov" = efa ] && ! grep -q 'WRITEs done by the device' "$DIR/$tag.err"; then
    grep -m1 'NIC 0' "$DIR/$tag.err" >&2 || true
    echo "cpu-cost: efa did not say its WRITEs are done by the device (a binary built against libfabric < 1.18?)" >&2
    return 1
  fi
  # the result row: "SIZE BYTES SECONDS ..."; WRITEs = bytes / size
  awk -v s="$size" '$1 == s && $2 ~ /^[0-9]+$/ { print $2; exit }' "$DIR/$tag.txt"
}
bytes_of() { numfmt --from=iec "$1"; }
calls() {  # calls REGEX: how many more calls the larger run's functions matching REGEX got
  python3 ci/cg-objects.py --calls "$1" "$DIR/r$i-a.out" "$DIR/r$i-b.out"
}

printf '%-6s %-4s %-6s %-16s %8s %8s %8s %9s %8s %7s %7s  %s\n' provider size buffer extra \
  all bench libfab "sim(out)" lf-post turns polls "top libfabric functions (Ir per WRITE)"
i=0 fail=0
for row in "${ROWS[@]}"; do
  read -r prov size mode extra <<<"$row"
  # shellcheck disable=SC2086
  set -- $extra
  if [ "$mode" = single ]; then n0=200 n1=600; else n0=1 n1=3; fi
  i=$((i + 1))
  w0=$(run "r$i-a" $n0 "$prov" "$size" "$mode" "$@") || { fail=1; continue; }
  w1=$(run "r$i-b" $n1 "$prov" "$size" "$mode" "$@") || { fail=1; continue; }
  run "r$i-post-a" $n0 "$prov" "$size" "$mode" "$@" >/dev/null || { fail=1; continue; }
  run "r$i-post-b" $n1 "$prov" "$size" "$mode" "$@" >/dev/null || { fail=1; continue; }
  sz=$(bytes_of "$size")
  dw=$(( (w1 - w0) / sz ))
  [ "$dw" -gt 0 ] || { echo "cpu-cost: $row: no WRITE count ($w0, $w1)" >&2; fail=1; continue; }
  read -r tot bench lf sim other < <(python3 ci/cg-objects.py "$DIR/r$i-a.out" "$DIR/r$i-b.out")
  read -r ptot pbench plf psim pother < <(python3 ci/cg-objects.py "$DIR/r$i-post-a.out" "$DIR/r$i-post-b.out")
  turns=$(calls 'WriteActive<T> as bench_core::workload::NicWork>::post$')
  polls=$(calls 'as transport_core::Transport>::poll$')
  top=$(python3 ci/cg-objects.py --top 5 libfabric "$DIR/r$i-a.out" "$DIR/r$i-b.out" |
    awk -v w="$dw" '{ printf "%s%s %d", (NR > 1 ? ", " : ""), $2, $1 / w }')
  awk -v dw="$dw" -v b="$bench" -v l="$lf" -v s="$sim" -v pl="$plf" -v pb="$pbench" \
      -v t="$turns" -v pc="$polls" -v prov="$prov" -v size="$size" -v mode="$mode" \
      -v extra="${extra:--}" -v top="$top" 'BEGIN {
    printf "%-6s %-4s %-6s %-16s %8.0f %8.0f %8.0f %9.0f %8.0f %7.2f %7.2f  %s\n",
      prov, size, mode, extra, (b + l) / dw, b / dw, l / dw, s / dw, (pl + pb) / dw, t / dw,
      pc / dw, top }'
done
echo "(per WRITE; differences of two runs with $((600 - 200)) single-buffer WRITEs or 2 passes over the pages apart; profiles in $DIR)"
exit $fail
