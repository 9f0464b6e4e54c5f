#!/usr/bin/env bash
# libfabric's own fabtests over the efa provider, server and client as two processes, with
# small iteration counts. Run inside ci/efa-sim.sh (which puts the fabtests on PATH):
#   ci/efa-sim.sh efa-sim/fabtests.sh [TEST ...]
# Default tests: fi_rdm_pingpong, fi_rdm_tagged_bw, fi_rma_bw (write, read, writedata).
# Each pair runs under a time limit; the script fails if any side fails. The numbers the
# tests print are the simulator's, not EFA's: they are not shown as results.
# Fault knobs set in the environment (EFA_SIM_REORDER, EFA_SIM_DELAY_US, EFA_SIM_RNR_PERMILLE)
# must have acted in each test (efa-sim/stats.sh over the two processes' exit lines); RNR only
# where the test's traffic needs receives (not the RMA tests), and over the whole run.
set -uo pipefail
LIMIT=${FABTESTS_TIMEOUT:-120}
# Each pair's out-of-band port is one that no socket holds (free_port).
source "$(dirname "$0")/../ci/listening.sh"
if [ $# -eq 0 ]; then
  set -- "fi_rdm_pingpong -I 100 -S all -v" \
         "fi_rdm_tagged_bw -I 20 -W 8 -S all -v" \
         "fi_rma_bw -o write -I 20 -W 8 -S all -v" \
         "fi_rma_bw -o read -I 20 -W 8 -S all -v" \
         "fi_rma_bw -o writedata -I 20 -W 8 -S all -v"
fi
command -v fi_rdm_pingpong >/dev/null || { echo "fabtests.sh: no fabtests on PATH (run it in ci/efa-sim.sh)" >&2; exit 1; }
STATS=$(cd "$(dirname "$0")" && pwd)/stats.sh
ALL=$(mktemp)
trap 'rm -f "$ALL"' EXIT
failed=0 passed=0
for t in "$@"; do
  PORT=$(free_port) || exit 1
  # -E: out-of-band address exchange over a TCP socket on this host (EFA addresses are
  # not host names). -p efa: the efa provider only.
  read -r -a cmd <<< "$t"
  out=$(mktemp)
  export EFA_SIM_STATS=$out.stats
  knobs=()
  [ "${EFA_SIM_REORDER:-0}" -gt 1 ] && knobs+=(reorder)
  [ "${EFA_SIM_DELAY_US:-0}" -gt 0 ] && knobs+=(delay_us)
  case $t in fi_rma_bw*) ;; *) [ "${EFA_SIM_RNR_PERMILLE:-0}" -gt 0 ] && knobs+=(rnr_permille) ;; esac
  timeout "$LIMIT" "${cmd[@]}" -p efa -E="$PORT" >"$out.server" 2>&1 &
  server=$!
  wait_listening "$PORT" 30 || true  # past that the client runs anyway, and fails
  timeout "$LIMIT" "${cmd[@]}" -p efa -E="$PORT" 127.0.0.1 >"$out.client" 2>&1
  crc=$?
  wait $server
  src=$?
  cat "$out.stats" >> "$ALL" 2>/dev/null
  if [ ${#knobs[@]} -gt 0 ]; then
    "$STATS" --expect-knobs "${knobs[*]}" "$out.stats" "  $t" 2>&1
  else
    "$STATS" "$out.stats" "  $t" 2>&1
  fi
  krc=$?
  if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ $krc -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS  $t  ($(grep -c '^[0-9]' "$out.client") size rows)"
  elif [ $crc -eq 0 ] && [ $src -eq 0 ]; then
    failed=$((failed + 1))
    echo "FAIL  $t  (passed, but a fault knob that was set never acted: see above)"
  else
    failed=$((failed + 1))
    echo "FAIL  $t  (server rc $src, client rc $crc)"
    echo "--- server:"; tail -15 "$out.server"; echo "--- client:"; tail -15 "$out.client"
  fi
  rm -f "$out" "$out.server" "$out.client" "$out.stats"
done
echo "fabtests: $passed passed, $failed failed"
# Over the whole run, every knob that was on acted (RNR included).
"$STATS" --expect "$ALL" "fabtests, all" 2>&1 || failed=$((failed + 1))
[ $failed -eq 0 ]
