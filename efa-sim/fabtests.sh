#!/usr/bin/env bash
# libfabric's own fabtests over the efa provider, server and client as two processes, with
# small iteration counts. Run inside ci/efa-sim.sh (which puts the fabtests on PATH):
#   ci/efa-sim.sh efa-sim/fabtests.sh [TEST ...]
# Default tests: fi_rdm_pingpong, fi_rdm_tagged_bw, fi_rma_bw (write, read, writedata).
# Each pair runs under a time limit; the script fails if any side fails. The numbers the
# tests print are the simulator's, not EFA's: they are not shown as results.
set -uo pipefail
LIMIT=${FABTESTS_TIMEOUT:-120}
PORT=${FABTESTS_PORT:-$((20000 + RANDOM % 20000))}
if [ $# -eq 0 ]; then
  set -- "fi_rdm_pingpong -I 100 -S all -v" \
         "fi_rdm_tagged_bw -I 20 -W 8 -S all -v" \
         "fi_rma_bw -o write -I 20 -W 8 -S all -v" \
         "fi_rma_bw -o read -I 20 -W 8 -S all -v" \
         "fi_rma_bw -o writedata -I 20 -W 8 -S all -v"
fi
command -v fi_rdm_pingpong >/dev/null || { echo "fabtests.sh: no fabtests on PATH (run it in ci/efa-sim.sh)" >&2; exit 1; }
failed=0 passed=0
for t in "$@"; do
  PORT=$((PORT + 1))
  # -E: out-of-band address exchange over a TCP socket on this host (EFA addresses are
  # not host names). -p efa: the efa provider only.
  read -r -a cmd <<< "$t"
  out=$(mktemp)
  timeout "$LIMIT" "${cmd[@]}" -p efa -E="$PORT" >"$out.server" 2>&1 &
  server=$!
  sleep 1
  timeout "$LIMIT" "${cmd[@]}" -p efa -E="$PORT" 127.0.0.1 >"$out.client" 2>&1
  crc=$?
  wait $server
  src=$?
  if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS  $t  ($(grep -c '^[0-9]' "$out.client") size rows)"
  else
    failed=$((failed + 1))
    echo "FAIL  $t  (server rc $src, client rc $crc)"
    echo "--- server:"; tail -15 "$out.server"; echo "--- client:"; tail -15 "$out.client"
  fi
  rm -f "$out" "$out.server" "$out.client"
done
echo "fabtests: $passed passed, $failed failed"
[ $failed -eq 0 ]
