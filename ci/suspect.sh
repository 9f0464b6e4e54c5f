# Sourced by the scripts that put our figures beside another tool's (ci/gpu-host.sh,
# ci/gpu-host-ucx.sh, ci/compare-ref.sh, transport-ucx/compare.sh, compare-tag.sh).
#
# suspect ROW RATIO: prints "  SUSPECT: ..." where ours beats the other tool by more than 1.5x,
# nothing otherwise. RATIO is ours / theirs; a ROW whose name contains "lat" is a latency
# (lower is better), any other a rate (higher is better). Such a figure is a suspect until a
# note says, per iteration of each tool, why it is real (the project's rule on honest figures).
# `bash ci/suspect.sh` checks the rule itself.
suspect() {
  awk -v row="$1" -v r="$2" 'BEGIN {
    if (r !~ /^[0-9]*\.?[0-9]+$/ || r + 0 <= 0) exit
    lat = (row ~ /lat/)
    if ((lat && r + 0 < 1 / 1.5) || (!lat && r + 0 > 1.5))
      printf "  SUSPECT: beats the other tool by more than 1.5x; say per iteration why before quoting it"
  }'
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -eu
  bad=0
  check() { # ROW RATIO WANT(flag|none)
    local got=none; [ -n "$(suspect "$1" "$2")" ] && got=flag
    [ "$got" = "$3" ] || { echo "suspect $1 $2: $got, want $3" >&2; bad=1; }
  }
  check tag 1.51 flag; check tag 1.50 none; check put 1.2 none; check tag 0.5 none
  check lat 0.66 flag; check lat 0.67 none; check lat 1.8 none; check write 2 flag
  check tag - none; check lat 0 none
  [ $bad = 0 ] && echo "suspect: the 1.5x rule holds in 10 cases"
  exit $bad
fi
