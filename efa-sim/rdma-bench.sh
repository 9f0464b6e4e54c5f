#!/usr/bin/env bash
# rdma-bench over libfabric's efa provider on the simulated device; run under ci/efa-sim.sh:
#
#   ci/efa-sim.sh --devices p5 efa-sim/rdma-bench.sh p5
#       loopback over 32 simulated NICs with the p5 topology (RDMA_BENCH_TOPOLOGY): every GPU's four
#       endpoints open the efa domains at its own NICs' PCI addresses, every byte verified
#   ci/efa-sim.sh efa-sim/rdma-bench.sh lost-write
#       the verification catches a lost WRITE: with EFA_SIM_LOSE_WRITE_PERMILLE the device
#       acknowledges WRITEs one of whose packets it dropped, out of order (EFA_SIM_REORDER);
#       pages of 1 MiB are 118 packets, so nearly every loss lies inside a page. Clean runs
#       pass; then one lossy run per seed (LOST_WRITE_SEEDS, default "1 2 3 4 5";
#       LOSE_PERMILLE, default 400): each that lost bytes must fail naming the stale slot and
#       the repeats, and the simulator's counts (efa-sim/stats.sh) must show pieces lost
#       inside a WRITE (lost_inside) over the runs
#   ci/efa-sim.sh efa-sim/rdma-bench.sh workloads
#       every workload (write, send, lat, rate) out of order (EFA_SIM_REORDER, delay), on the
#       efa and efa-direct fabrics, every byte verified; each run's counts show the knobs
#       acted (lat of 8 bytes has one message in flight each way, so only acknowledgements
#       can pass it: its reordering is not asserted; lat of 64 KiB, several packets a
#       message, must be reordered)
#   ci/efa-sim.sh efa-sim/rdma-bench.sh ranks
#       rdma-bench run under mpirun, 4 ranks, all-to-all, every byte verified; then rank 2
#       killed mid-run: every other rank exits non-zero naming it
#
# RDMA_BENCH: the binary (default: built here, efa backend only, against the simulator's
# libfabric, in $CARGO_TARGET_DIR or target-efa-sim). Semantics only: no figure from here is
# EFA performance. Exit status 0 when every check held.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: efa-sim/rdma-bench.sh p5|lost-write|workloads|ranks}
[ -n "${EFA_SIM_DEVICES:-}" ] || { echo "run me under ci/efa-sim.sh" >&2; exit 2; }
if [ -z "${RDMA_BENCH:-}" ]; then
  td=${CARGO_TARGET_DIR:-target-efa-sim}
  cargo build -q -p bench-cli --no-default-features --features efa --target-dir "$td"
  RDMA_BENCH=$td/debug/rdma-bench
fi
B=$RDMA_BENCH
STATS=efa-sim/stats.sh
TMP=$(mktemp -d /tmp/efa-sim-rb.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "efa-sim/rdma-bench.sh $MODE: FAILED: $*" >&2; exit 1; }
# The sum of counter (or knob effect) NAME over the processes' lines of an efa-sim stats file.
counter() {
  awk -v k="$1" '$1 == "efa-sim" && $2 == "stats" { for (i = 3; i <= NF; i++) { split($i, kv, "=")
    if (kv[1] == k) { n = split(kv[2], se, ":"); s += se[n] } } } END { print s + 0 }' "$2"
}
source ci/listening.sh  # free_port: a port no socket holds, below the ephemeral range

case $MODE in
p5)
  # ci/efa-sim.sh --devices p5 sets RDMA_BENCH_TOPOLOGY to p5's topology: the command is
  # the one a p5 user types.
  topo=${RDMA_BENCH_TOPOLOGY:?run with --devices p5}
  timeout 300 "$B" loopback --provider efa --gpus 0-7 --nics-per-gpu 4 \
    -s 4K -n 3 -v > "$TMP/out" 2> "$TMP/err" || { rc=$?; cat "$TMP/err" >&2; fail "loopback (rc $rc)"; }
  cat "$TMP/out"
  grep -q "8 GPU(s) x 4 NIC(s), every byte verified" "$TMP/out" || fail "not 8 x 4, verified"
  # Each NIC line of -v: "NIC i (GPU g): efa <domain>, ... PCI <addr>"; topo's JSON names each
  # GPU's NICs with their PCI addresses: endpoint j of GPU g must be on NIC j of its group.
  "$B" topo --xml "$topo" --json > "$TMP/topo.json"
  python3 - "$TMP/topo.json" "$TMP/err" <<'EOF'
import json, re, sys
topo = json.load(open(sys.argv[1]))
want = {}
for g in topo["gpus"]:
    for j, nic in enumerate(g["nics"]):
        want[(g["index"], j)] = (nic["name"] + "-rdm", nic["pci"])
seen = {}
for line in open(sys.argv[2]):
    m = re.match(r"rdma-bench: NIC (\d+) \(GPU (\d+)\): efa ([^\s,]+),? .* PCI (\S+)$", line.strip())
    if m:
        i, g, dom, pci = int(m[1]), int(m[2]), m[3], m[4]
        seen[(g, i % 4)] = (dom, pci)
bad = [k for k in want if seen.get(k) != want[k]]
if len(seen) != 32 or bad:
    sys.exit(f"endpoints not on their GPU's NICs: {len(seen)} seen, wrong: {bad[:4]}")
print("32 endpoints, each on its GPU's own NIC by PCI address")
EOF
  ;;
lost-write)
  export EFA_SIM_REORDER=16
  EFA_SIM_SEED=${EFA_SIM_SEED:-3} EFA_SIM_STATS=$TMP/ok.stats \
    timeout 300 "$B" loopback --provider efa -s 64K -n 20 -v > "$TMP/ok" 2>&1 ||
    { cat "$TMP/ok" >&2; fail "a clean run failed"; }
  # Every immediate checked (20 repeats and the warm-up's), on the one NIC, for order.
  checked=$(sed -n 's/^rdma-bench: \([0-9]*\) immediates checked on arrival.*/\1/p' "$TMP/ok")
  [ "${checked:-0}" -ge 20 ] || fail "the check did not run (${checked:-no} immediates checked)"
  grep -q "NICs checked for order: 1," "$TMP/ok" || fail "the check did not look at the order"
  $STATS --expect-knobs reorder "$TMP/ok.stats" "clean run" || fail "the clean run was not reordered"
  # The lossy runs' shape without the defect: 1 MiB pages, 1025 words read a page, no alarm.
  EFA_SIM_SEED=${EFA_SIM_SEED:-3} timeout 300 "$B" loopback --provider efa -s 1M --pages 16 -n 3 \
    > "$TMP/ok1m" 2>&1 || { cat "$TMP/ok1m" >&2; fail "a clean run of 1 MiB pages failed"; }
  # Lossy runs, one per seed (LOST_WRITE_SEEDS): pages of 1 MiB are 118 packets of the MTU, so
  # nearly every lost piece lies inside a page (lost_inside), where a check of a page's first
  # and last words alone sees nothing. A piece lost in an early repeat may be overwritten by
  # the next repeat's WRITE of its slot before the target reads the immediate (the initiator
  # runs up to 4 repeats ahead): nothing can see it then. Those of the last repeat stay, and
  # with 16 pages a repeat at 400 in 1000 a run loses none there once in 3000 (0.6^16).
  # Every run that lost bytes must fail naming the stale slot: the check at the immediates,
  # not only the byte-by-byte check after the run ("page P (slot S) after repeat R").
  lossy=0 inside=0
  for seed in ${LOST_WRITE_SEEDS:-1 2 3 4 5}; do
    rm -f "$TMP/lost.stats"
    set +e
    EFA_SIM_SEED=$seed EFA_SIM_STATS=$TMP/lost.stats EFA_SIM_LOSE_WRITE_PERMILLE=${LOSE_PERMILLE:-400} \
      timeout 300 "$B" loopback --provider efa -s 1M --pages 16 -n 3 > "$TMP/lost" 2>&1
    rc=$?
    set -e
    $STATS "$TMP/lost.stats" "seed $seed" 2>&1
    pieces=$(counter lose_write_permille "$TMP/lost.stats")
    ins=$(counter lost_inside "$TMP/lost.stats")
    if [ "$pieces" = 0 ]; then
      [ $rc = 0 ] || { cat "$TMP/lost" >&2; fail "seed $seed: nothing was lost, yet the run failed ($rc)"; }
      echo "seed $seed: no WRITE lost; the run passed"
      continue
    fi
    lossy=$((lossy + 1)) inside=$((inside + ins))
    if [ $rc != 1 ] || ! grep -q "still held the page of repeat" "$TMP/lost"; then
      cat "$TMP/lost" >&2
      fail "seed $seed: $pieces piece(s) lost ($ins inside a WRITE), yet the run exited $rc without naming a stale slot"
    fi
    echo "seed $seed: $pieces piece(s) lost ($ins inside a WRITE), caught: $(grep -o 'when the immediate.*' "$TMP/lost")"
  done
  [ $lossy -gt 0 ] || fail "no run lost a WRITE: the lost-write check never ran"
  [ "$inside" -gt 0 ] || fail "no piece was lost inside a WRITE: a loss in the middle of a page never happened"
  echo "$lossy lossy run(s), each caught; $inside piece(s) lost inside a WRITE"
  ;;
workloads)
  export EFA_SIM_REORDER=16 EFA_SIM_DELAY_US=100 EFA_SIM_SEED=${EFA_SIM_SEED:-11}
  for fabric in efa efa-direct; do
    for wl in "write -s 4K -n 10" "write --single-buffer -s 64K -n 200" "send -s 4K -n 500" \
              "lat -s 8 -n 200" "lat -s 64K -n 50" "rate -n 3"; do
      rm -f "$TMP/wl.stats"
      # shellcheck disable=SC2086
      EFA_SIM_STATS=$TMP/wl.stats timeout 300 "$B" loopback --provider efa --nic-opt fabric=$fabric \
        --workload $wl --verify > "$TMP/wl" 2>&1 || { cat "$TMP/wl" >&2; fail "$fabric: --workload $wl"; }
      case $wl in lat*) ;; *) grep -q "every byte verified" "$TMP/wl" || fail "$fabric $wl: not verified" ;; esac
      # One 8-byte message in flight at a time has nothing of its own to be reordered with.
      case $wl in "lat -s 8 "*) knobs=delay_us ;; *) knobs="reorder delay_us" ;; esac
      $STATS --expect-knobs "$knobs" "$TMP/wl.stats" "$fabric $wl" || fail "$fabric $wl: a fault knob never acted"
      echo "$fabric --workload $wl: ok"
    done
  done
  ;;
ranks)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  MPI=(mpirun --oversubscribe -np 4 --mca btl self --mca oob_tcp_if_include lo)
  timeout 300 "${MPI[@]}" "$B" run --provider efa --pattern all-to-all \
    --rendezvous "127.0.0.1:$(free_port)" -s 4K --pages 16 -n 5 --idle-timeout 10 \
    > "$TMP/a2a" || fail "mpirun all-to-all (rc $?)"
  cat "$TMP/a2a"
  grep -q "4 ranks (Open MPI)" "$TMP/a2a" || fail "no 4-rank table"
  grep -q "every byte verified" "$TMP/a2a" || fail "not verified"
  # Rank 2 is killed once its run has started; mpirun does not end the job itself, so what
  # ends the others is rdma-bench noticing. Every other rank must exit non-zero naming it.
  set +e
  timeout 120 "${MPI[@]}" --mca orte_abort_on_non_zero_status 0 sh -c '
    r=$OMPI_COMM_WORLD_RANK; out=$1; shift
    "$@" 2> "$out/kill-$r.err" &
    p=$!
    if [ "$r" = 2 ]; then
      for _ in $(seq 300); do grep -q "run 0" "$out/kill-$r.err" 2>/dev/null && break; sleep 0.1; done
      sleep 1; kill -9 $p
    fi
    wait $p; echo $? > "$out/kill-$r.rc"' sh "$TMP" \
    "$B" run -v --provider efa --rendezvous "127.0.0.1:$(free_port)" --rendezvous-timeout 30 \
    -s 4K --pages 16 -n 100000000 --idle-timeout 5 > /dev/null
  rc=$?
  set -e
  [ $rc -ne 124 ] || fail "killed rank: mpirun hung"
  for r in 0 1 3; do
    code=$(cat "$TMP/kill-$r.rc" 2>/dev/null || echo none)
    [ "$code" != 0 ] && [ "$code" != none ] || { cat "$TMP"/kill-*.err >&2; fail "rank $r exited $code"; }
    grep -q "rank 2" "$TMP/kill-$r.err" || { cat "$TMP/kill-$r.err" >&2; fail "rank $r does not name rank 2"; }
  done
  echo "rank 2 killed: ranks 0, 1 and 3 exited non-zero naming it"
  ;;
*) fail "unknown mode (p5, lost-write, workloads, ranks)" ;;
esac
