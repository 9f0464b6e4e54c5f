#!/usr/bin/env bash
# What the simulated device did in a run: the lines its processes appended at exit to
# $EFA_SIM_STATS (ci/efa-sim.sh points it at a file of the run unless it is set), summed.
#
#   efa-sim/stats.sh FILE [LABEL]          print the sums
#   efa-sim/stats.sh --expect FILE [LABEL] ... and fail unless every fault knob that was on
#                                          in some process acted at least once, and some
#                                          process sent packets at all
#   efa-sim/stats.sh --expect-knobs "K1 K2" FILE [LABEL]
#                                          ... and fail unless these knobs were on and acted
#                                          (others are only printed: a knob whose traffic a
#                                          test does not make, e.g. RNR on WRITEs)
#
# A line is "efa-sim stats pid=P packets=N KNOB=SETTING:EFFECT ... COUNTER=N ...": for each
# knob (reorder, delay_us, rnr_permille, lose_write_permille, die_after) its setting in that
# process and what it did there. A knob can act in another process than the one that set it
# (lose_write_permille marks a WRITE at the initiator, its target drops the bytes), so the
# effects are summed over every line of the file.
set -euo pipefail
mode=print knob=
case ${1:-} in
  --expect) mode=expect; shift ;;
  --expect-knobs) mode=expect; knob=${2:?--expect-knobs needs knob names}; shift 2 ;;
esac
file=${1:?usage: efa-sim/stats.sh [--expect | --expect-knobs "KNOBS"] FILE [LABEL]}
label=${2:-efa-sim}
if [ ! -s "$file" ]; then
  echo "$label: no efa-sim stats in $file (no process opened a simulated device?)" >&2
  [ $mode = print ] && exit 0 || exit 1
fi
awk -v mode="$mode" -v want="$knob" -v label="$label" '
  $1 == "efa-sim" && $2 == "stats" {
    procs++
    for (i = 3; i <= NF; i++) {
      split($i, kv, "=")
      if (index(kv[2], ":")) {          # a knob: setting:effect
        split(kv[2], se, ":")
        if (!(kv[1] in setting) || se[1] + 0 > setting[kv[1]]) setting[kv[1]] = se[1] + 0
        effect[kv[1]] += se[2]
        if (!(kv[1] in seen)) { seen[kv[1]] = 1; order[++nk] = kv[1] }
      } else if (kv[1] != "pid") {
        sum[kv[1]] += kv[2]
        if (!(kv[1] in cseen)) { cseen[kv[1]] = 1; corder[++nc] = kv[1] }
      }
    }
  }
  END {
    out = sprintf("%s: %d process(es)", label, procs)
    for (i = 1; i <= nc; i++) out = out sprintf(", %s %d", corder[i], sum[corder[i]])
    for (i = 1; i <= nk; i++) {
      k = order[i]
      if (setting[k] > 0) out = out sprintf("; %s=%d acted %d time(s)", k, setting[k], effect[k])
    }
    print out
    if (mode != "expect") exit 0
    bad = 0
    if (sum["packets"] == 0) { print label ": FAILED: no packets went through the simulated device"; bad = 1 }
    nw = split(want, wl, " ")
    for (i = 1; i <= nw; i++) {
      only[wl[i]] = 1
      if (!(setting[wl[i]] > 0)) { print label ": FAILED: knob " wl[i] " was not on"; bad = 1 }
    }
    for (i = 1; i <= nk; i++) {
      k = order[i]
      if (nw && !(k in only)) continue
      if (setting[k] > 0 && effect[k] == 0) {
        print label ": FAILED: knob " k "=" setting[k] " was on and never acted"
        bad = 1
      }
    }
    exit bad
  }' "$file" >&2
