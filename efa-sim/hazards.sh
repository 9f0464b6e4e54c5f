#!/usr/bin/env bash
# Code that breaks on EFA hardware must break on the simulated device too: each case of
# efa-sim-hazards (efa-sim/tests/hazards.c) runs a small defect (a send buffer reused before
# its completion, a buffer polled by its last byte, LL128-style polling without the
# 128-byte in-order capability, a region freed while registered, unmapped or read-only
# memory registered for writes, a key of another PD or of another process with the same
# layout, a CQ sized too small, a QP destroyed with work in flight, a QP transition with a
# wrong attribute mask) and must print EXPOSED; on a device file with the 128-byte
# capability (p5) the LL128 case must print KEPT instead. Run under ci/efa-sim.sh:
#
#   ci/efa-sim.sh efa-sim/hazards.sh                  every case, on the default devices
#   ci/efa-sim.sh --devices p5 efa-sim/hazards.sh poll-128
#   HAZARDS_EXPECT=HIDDEN ... efa-sim/hazards.sh      what a gentler device shows
#
# The cases that race the device (the two polling ones, the reused buffer) run with
# EFA_SIM_DELAY_US so that packets and their second placement step come milliseconds
# apart: the window is wide, the outcome does not depend on the box's load.
set -uo pipefail
command -v efa-sim-hazards >/dev/null || { echo "hazards.sh: run me under ci/efa-sim.sh" >&2; exit 2; }
want=${HAZARDS_EXPECT:-EXPOSED}
[ $# -gt 0 ] || set -- $(efa-sim-hazards --list | awk '{print $1}')
TMPDIR_H=$(mktemp -d)
trap 'rm -rf "$TMPDIR_H"' EXIT
failed=0
for c in "$@"; do
  env=()
  case $c in send-reuse|poll-last-byte|poll-128) env=(EFA_SIM_DELAY_US=2000) ;; esac
  expect=$want
  if [ "$c" = poll-128 ] && [ "$want" = EXPOSED ] && grep -q '^caps.*data_polling_128' "${EFA_SIM_DEVICES:?}"; then
    expect=KEPT
  fi
  out=$(env "${env[@]}" timeout 120 efa-sim-hazards "$c" --expect "$expect" 2>"$TMPDIR_H/err")
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "ok    $out"
  else
    failed=$((failed + 1))
    echo "FAIL  $c: expected $expect, got: ${out:-nothing (exit status $rc)}"
    sed 's/^/      /' "$TMPDIR_H/err" | tail -5
  fi
done
echo "hazards: $(($# - failed)) as expected, $failed not"
[ $failed -eq 0 ]
