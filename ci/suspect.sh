# Sourced by the scripts that put our figures beside another tool's (ci/gpu-host.sh,
# ci/gpu-host-ucx.sh, ci/compare-ref.sh, transport-ucx/compare.sh, compare-tag.sh).
#
# ratio OURS THEIRS: ours / theirs with two decimals, "-" where either is not a positive number
# (a run that failed reads 0).
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-"}'
}

# round_trips BYTES DEFAULT: the round trips of a latency run of BYTES-byte messages, the same
# in every script that compares latency: LAT_ITERS (else DEFAULT), at most LAT_BYTES / BYTES
# (LAT_BYTES 4 GiB: 4096 at 1 MiB). Too few and a mean still carries the first round trips
# (docs/measurements.md, U43-U44).
round_trips() {
  local most=${LAT_ITERS:-$2} n=$((${LAT_BYTES:-4294967296} / $1))
  [ "$n" -lt "$most" ] || n=$most
  echo "$n"
}

# lat_of FUNCTION ROW: 1 where ROW is a latency row (its name contains "lat": lower is
# better), 0 for a rate. `above`, `interval`, `adjusted` and `suspect` read their ROW through
# it, and it fails, saying so, where ROW is a number: a ratio passed there would be read as
# the name and left out of the figures without a word.
lat_of() {
  if [[ $2 =~ ^[0-9]*\.?[0-9]+$ ]]; then
    echo "$1: the first argument is the row's name (tag, lat, put...), not a figure: $2" >&2
    return 2
  fi
  if [[ $2 == *lat* ]]; then echo 1; else echo 0; fi
}

# median VALUE...: the median of the VALUEs that are positive numbers, two decimals ("-" where
# none). Tables quote it beside the best of rounds: on a shared machine one fast round moves a
# best of rounds, not the median of the rounds' own ratios (docs/measurements.md, U57).
median() {
  printf '%s\n' "$@" | awk '$1 ~ /^[0-9]*\.?[0-9]+$/ && $1 + 0 > 0' | sort -g |
    awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) printf "%.2f\n", v[(NR + 1) / 2];
      else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# interval ROW RATIO...: the rounds' ratios' median's 95% confidence interval, "LOW-HIGH", then
# what it tells: "ahead" (ours better in the whole interval: a rate above 1, a latency below
# 1), "behind" (worse in the whole interval) or "level" (the interval holds 1: these rounds do
# not tell the tools apart). Distribution-free: the interval runs from the k-th lowest ratio
# to the k-th highest, k the largest with at least 95% coverage under the binomial (each
# round's ratio as likely above the true median as below); "-" below 6 rounds, where none
# has. On the GPU host each tool against itself reads 0.7-2.0 a round (U57), so a median of
# 7-9 rounds alone does not say which tool is ahead.
interval() {
  local lat; lat=$(lat_of interval "$1") || return; shift
  printf '%s\n' "$@" | awk '$1 ~ /^[0-9]*\.?[0-9]+$/ && $1 + 0 > 0' | sort -g |
    awk -v lat=$lat '{v[NR] = $1} END {
      n = NR; k = 0; c = 1; cdf = 0
      for (j = 0; j < n; j++) {  # cdf: P(X <= j), X ~ Binomial(n, 1/2); c: n choose j
        cdf += c / 2 ^ n; c = c * (n - j) / (j + 1)
        if (1 - 2 * cdf >= 0.95) k = j + 1; else break
      }
      if (k == 0) {print "-"; exit}
      lo = v[k]; hi = v[n - k + 1]
      w = (lo > 1) ? (lat ? "behind" : "ahead") : (hi < 1) ? (lat ? "ahead" : "behind") : "level"
      printf "%.2f-%.2f %s\n", lo, hi, w }'
}

# adjusted ROW OURS... -- THEIRS...: the two tools compared at equal host speed. Each run is
# FIGURE:SPEED, SPEED the run's mean duration (ns) of a driver call whose work is fixed (on the
# GPU host UCX's `cuCtxGetId`, once a message in both tools, from ucp-time.so): on a shared
# host the runs' speeds vary, and they carry most of a run's figure (U110: a correlation of
# -0.93 over 32 runs of the cuda tag row at 4 KiB). A common-slope fit of FIGURE on SPEED,
# with one level per tool (analysis of covariance), gives ours / theirs at the runs' mean
# speed, its 95% interval (Student's t, from the fit's residuals), then "ahead", "behind" or
# "level" as `interval` words them, and the fit: "(slope S per ns, N runs)". "-" below three
# runs of a tool or where the speeds do not vary. Runs whose FIGURE or SPEED is not a
# positive number are left out.
adjusted() {
  local lat; lat=$(lat_of adjusted "$1") || return; shift
  printf '%s\n' "$@" | awk -v lat=$lat '
    BEGIN {g = 0}
    $1 == "--" {g = 1; next}
    {split($1, f, ":")}
    f[1] ~ /^[0-9]*\.?[0-9]+$/ && f[1] + 0 > 0 && f[2] ~ /^[0-9]*\.?[0-9]+$/ && f[2] + 0 > 0 {
      k = ++n[g]; y[g, k] = f[1]; x[g, k] = f[2]; sy[g] += f[1]; sx[g] += f[2] }
    END {
      if (n[0] < 3 || n[1] < 3) {print "-"; exit}
      for (g = 0; g < 2; g++) {my[g] = sy[g] / n[g]; mx[g] = sx[g] / n[g]}
      for (g = 0; g < 2; g++) for (k = 1; k <= n[g]; k++) {
        sxx += (x[g, k] - mx[g]) ^ 2; sxy += (x[g, k] - mx[g]) * (y[g, k] - my[g]) }
      if (sxx <= 0) {print "-"; exit}
      b = sxy / sxx
      for (g = 0; g < 2; g++) for (k = 1; k <= n[g]; k++)
        ss += (y[g, k] - my[g] - b * (x[g, k] - mx[g])) ^ 2
      df = n[0] + n[1] - 3
      # 97.5% quantiles of Student t, df 1-10, then 1.96 + 2.4 / df (within 0.01 past 10).
      split("12.71 4.30 3.18 2.78 2.57 2.45 2.36 2.31 2.26 2.23", tq, " ")
      t = (df <= 10) ? tq[df] : 1.96 + 2.4 / df
      se = sqrt(ss / df * (1 / n[0] + 1 / n[1] + (mx[0] - mx[1]) ^ 2 / sxx))
      m = (sx[0] + sx[1]) / (n[0] + n[1])
      a0 = my[0] - b * (mx[0] - m); a1 = my[1] - b * (mx[1] - m)
      if (a0 <= 0 || a1 <= 0) {print "-"; exit}
      lo = (a0 - t * se) / a1; hi = (a0 + t * se) / a1; if (lo < 0) lo = 0
      w = (lo > 1) ? (lat ? "behind" : "ahead") : (hi < 1) ? (lat ? "ahead" : "behind") : "level"
      printf "%.2f, %.2f-%.2f %s (slope %.4g per ns, %d runs)\n", a0 / a1, lo, hi, w, b, n[0] + n[1] }'
}

# round_ratios OURS THEIRS: each round's ours / theirs, one per line; OURS and THEIRS are the
# rounds' figures in order, separated by spaces, newlines or "/" (a failed round reads "-").
round_ratios() {
  paste -d' ' <(tr ' /' '\n\n' <<< "$1" | grep .) <(tr ' /' '\n\n' <<< "$2" | grep .) |
    while read -r a b; do echo "$(ratio "$a" "$b")"; done
}

# not_positive VALUE...: how many VALUEs are not positive numbers (a failed run's 0 or "-"):
# a comparison counts them and fails after its table, since best-of and medians pass them over.
not_positive() {
  printf '%s\n' "$@" | awk '!($1 ~ /^[0-9]*\.?[0-9]+$/ && $1 + 0 > 0) {n++} END {print n + 0}'
}

# one_figure DEFAULT CMD...: the first line CMD prints, DEFAULT where it prints none: one
# figure per run, so two tools' rounds stay paired (round_ratios) when a run fails.
one_figure() { local d=$1 v; shift; v=$("$@" | head -1); echo "${v:-$d}"; }

# fabtests_gbps FILE: Gbit/s from a fabtests bandwidth run's output (its last result line's
# MB/sec column, 10^6 bytes); 0.000 where it printed none.
fabtests_gbps() {
  awk '$1 ~ /^[0-9]+(\.[0-9]+)?[kmg]?$/ && NF >= 7 {v = $5} END {printf "%.3f\n", v * 8 / 1000}' "$1"
}

# ucx_perftest_gbps FILE: Gbit/s from ucx_perftest's bandwidth output (its last result line's
# sixth column, MB/s of 2^20 bytes); 0.000 where it printed none.
ucx_perftest_gbps() {
  awk '$1 ~ /^[0-9]+$/ && NF >= 8 {v = $6} END {printf "%.3f\n", v * 8 * 1048576 / 1e9}' "$1"
}

# put_plan N: the flags with which rdma-bench posts N puts against ucx_perftest's ucp_put_bw,
# which posts N puts and flushes once at the end: "--imm-every K -n ITERS --warmup WARMUP"
# (with --single-buffer). K is the largest power of 2 at most 4096 (the flag's limit) and at
# most N/10: so ours, too, mostly posts plain puts (one in K is the put, flush and immediate
# that ends a repeat), and its WARMUP repeats (at least 1) are about perftest's N/10 warm-up
# puts. ITERS x K is N where K divides it (N a power of 2, as the scripts' sizes give), else N
# rounded down to a multiple of K: under a tenth fewer. A small K is not like for like: ours
# keeps at most 4 repeats of K puts in flight past the last immediate (bench-core's WINDOW),
# 1 MiB at K=64 and 4 KiB, where perftest's in-flight puts are bounded only by its 32
# outstanding requests (a put that UCX finishes inside ucp_put_nbx is not one).
# PUT_IMM_EVERY=K sets K (64: the scripts before 2026-12-03).
put_plan() {
  local n=$1 k=${PUT_IMM_EVERY:-4096}
  if [ -z "${PUT_IMM_EVERY:-}" ]; then
    while [ "$k" -gt 1 ] && [ $((k * 10)) -gt "$n" ]; do k=$((k / 2)); done
  fi
  local w=$((n / 10 / k))
  echo "--imm-every $k -n $((n / k)) --warmup $((w > 1 ? w : 1))"
}

# put_warm N: the puts of put_plan's warm-up (WARMUP repeats of K), which the scripts pass
# as ucx_perftest's -w beside it: N/10 rounded down to a whole repeat (1024 at N = 16384,
# where perftest's own N/10 is 1638), so both tools warm up with the same puts.
put_warm() { local k w; read -r _ k _ _ _ w <<< "$(put_plan "$1")"; echo $((k * w)); }

# send_warmup N SIZE: ours' --warmup for a send run of N messages of SIZE bytes whose warm-up
# is perftest's -w, N / 10 messages (at least one repeat): --warmup counts repeats of the
# receive depth, the rule of recv_depth in bench-core/src/workload/send.rs (16 MiB of
# receives, between 256 and 1024; the UCX backend's receive queue holds 1024).
send_depth() { local d=$((16777216 / $1)); echo $((d < 256 ? 256 : d > 1024 ? 1024 : d)); }
send_warmup() { local w=$(($1 / 10 / $(send_depth "$2"))); echo $((w > 1 ? w : 1)); }
# send_warm N SIZE: the messages of that warm-up (repeats x depth), ucx_perftest's -w beside
# it: 25600 at 4 KiB and N = 262144, 256 at 1 MiB and N = 1024 (perftest's own N/10: 102).
send_warm() { echo $(($(send_warmup "$1" "$2") * $(send_depth "$2"))); }

# pin_sides: sets PIN_SRV and PIN_CLI, the prefixes that put a comparison's server and client
# each on a core of its own, the same for both tools, and PIN_CORES ("server,client", or
# none): CORES=server,client (default 1,3 with 4 or more CPUs, else 0,1; none, or a single
# CPU: wherever the scheduler puts them). Unpinned, two busy-polling processes that the
# scheduler stacks on one core read several times slower. Where one tool's sender is its
# server and the other's is its client, the caller swaps them, so that both tools' senders
# run on the same core.
pin_sides() {
  local cores=${CORES:-$([ "$(nproc)" -ge 4 ] && echo 1,3 || echo 0,1)}
  PIN_SRV=() PIN_CLI=() PIN_CORES=none
  if [ "$cores" != none ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    PIN_SRV=(taskset -c "${cores%,*}") PIN_CLI=(taskset -c "${cores#*,}") PIN_CORES=$cores
  fi
}

# above ROW RATIO...: "K of N" rounds where ours did better (a rate above 1, a latency below 1).
above() {
  local lat; lat=$(lat_of above "$1") || return; shift
  printf '%s\n' "$@" | awk -v lat="$lat" '
    $1 ~ /^[0-9]*\.?[0-9]+$/ && $1 + 0 > 0 {n++; if (lat ? $1 < 1 : $1 > 1) k++}
    END {printf "%d of %d\n", k, n}'
}

# suspect ROW RATIO...: prints "  SUSPECT: ..." where any RATIO says ours beats the other tool
# by more than 1.5x, nothing otherwise. Each RATIO is ours / theirs (a table passes its
# best-of ratio and its median of the rounds' ratios: the median is the figure quoted); a ROW
# whose name contains "lat" is a latency (lower is better), any other a rate (higher is
# better). Such a figure is a suspect until a note says, per iteration of each tool, why it is
# real (the project's rule on honest figures). `bash ci/suspect.sh` checks the rule itself.
suspect() {
  local lat; lat=$(lat_of suspect "$1") || return; shift
  printf '%s\n' "$@" | awk -v lat="$lat" '
    $1 ~ /^[0-9]*\.?[0-9]+$/ && $1 + 0 > 0 && ((lat && $1 + 0 < 1 / 1.5) || (!lat && $1 + 0 > 1.5)) {s = 1}
    END {if (s) printf "  SUSPECT: beats the other tool by more than 1.5x; say per iteration why before quoting it"}'
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -eu
  bad=0
  check() { # ROW RATIO... WANT(flag|none)
    local want=${*: -1} got=none args=("${@:1:$#-1}")
    [ -n "$(suspect "${args[@]}")" ] && got=flag
    [ "$got" = "$want" ] || { echo "suspect ${args[*]}: $got, want $want" >&2; bad=1; }
  }
  check tag 1.51 flag; check tag 1.50 none; check put 1.2 none; check tag 0.5 none
  check lat 0.66 flag; check lat 0.67 none; check lat 1.8 none; check write 2 flag
  check tag - none; check lat 0 none
  # A median over the bar flags a row whose best-of ratio is under it, and the other way.
  check put 1.19 1.54 flag; check put 1.6 1.1 flag; check lat 1.0 0.6 flag; check put 1.2 - none
  [ "$(ratio 3 2)/$(ratio 0 2)/$(ratio 2 0)/$(ratio x 2)" = "1.50/-/-/-" ] ||
    { echo "ratio: $(ratio 3 2)/$(ratio 0 2)/$(ratio 2 0)/$(ratio x 2), want 1.50/-/-/-" >&2; bad=1; }
  got="$(round_trips 4096 20000)/$(round_trips 1048576 20000)/$(round_trips 4096 2000)"
  got+="/$(LAT_ITERS=50 round_trips 4096 20000)"
  [ "$got" = "20000/4096/2000/50" ] ||
    { echo "round_trips: $got, want 20000/4096/2000/50" >&2; bad=1; }
  got="$(median 1.2 0.9 - 1.0)/$(median 4 1 3 2)/$(median - 0)/$(median 10 9.5)"
  [ "$got" = "1.00/2.50/-/9.75" ] || { echo "median: $got, want 1.00/2.50/-/9.75" >&2; bad=1; }
  got="$(interval tag 9 1 8 2 7 3 6 4 5)/$(interval tag 1.1 1.2 1.3 1.4 1.5)/$(interval lat 1.1 1.2 1.3 1.4 1.5 1.6)"
  got+="/$(interval tag 0.9 0.95 0.99 0.98 0.97 0.96 - 0.94)/$(interval put $(seq 1 24 | sed 's/$/.5/'))"
  [ "$got" = "2.00-8.00 ahead/-/1.10-1.60 behind/0.90-0.99 behind/7.50-18.50 ahead" ] ||
    { echo "interval: $got, want 2.00-8.00 ahead/-/1.10-1.60 behind/0.90-0.99 behind/7.50-18.50 ahead" >&2; bad=1; }
  got="$(interval tag 0.92 0.96 0.98 1.05 1.21 0.96 1.16 0.93 0.92)/$(interval lat 0.5 0.6 0.7 0.8 0.9 0.95)"
  [ "$got" = "0.92-1.16 level/0.50-0.95 ahead" ] ||
    { echo "interval: $got, want 0.92-1.16 level/0.50-0.95 ahead" >&2; bad=1; }
  # At equal speed ours is behind, though its raw median (5.55 against 6.00) says less.
  got="$(adjusted tag 7.0:30 0:40 x:50 6.1:40 - 5.0:50 4.1:60 -- 7.9:30 6.4:45 5.6:52 5.1:58 5:0)"
  got+="|$(adjusted lat 1.10:30 1.31:40 1.49:50 1.70:60 -- 1.00:30 1.21:40 1.40:50 1.61:60)"
  got+="|$(adjusted tag 1:30 2:40 -- 1:30 2:40 3:50)|$(adjusted tag 1:30 2:30 3:30 -- 1:30 2:30 3:30)"
  want="0.87, 0.85-0.89 behind (slope -0.09955 per ns, 8 runs)"
  want+="|1.07, 1.06-1.08 behind (slope 0.02 per ns, 8 runs)|-|-"
  [ "$got" = "$want" ] || { echo "adjusted: $got, want $want" >&2; bad=1; }
  got=$(round_ratios "3 1/2" "2 2 0" | paste -sd,)
  [ "$got" = "1.50,0.50,-" ] || { echo "round_ratios: $got, want 1.50,0.50,-" >&2; bad=1; }
  got="$(not_positive 3.5 0 - 0.000 x 1)/$(not_positive 2)"
  [ "$got" = "4/0" ] || { echo "not_positive: $got, want 4/0" >&2; bad=1; }
  got="$(one_figure 0 printf '3.5\n4\n')/$(one_figure "0 -" true)"
  [ "$got" = "3.5/0 -" ] || { echo "one_figure: $got, want 3.5/0 -" >&2; bad=1; }
  t=$(mktemp)
  printf 'bytes iters total time MB/sec usec/xfer Mxfers/sec\n4k 1k 4m 0.1s 100.00 1.0 0.1\n64k 1k 64m 0.1s 2500.00 1.0 0.1\n' > "$t"
  got=$(fabtests_gbps "$t")
  # fabtests print sizes that are no whole unit with a fraction (size_str): 1.5m
  printf '1.5m 64 96m 0.1s 1000.00 1.0 0.1\n' >> "$t"
  got="$got,$(fabtests_gbps "$t")"
  printf 'Final: x\n   1000 1.0 2.0 3.0 100.00 1000.00 5 6\n' > "$t"
  got="$got/$(ucx_perftest_gbps "$t")/$(fabtests_gbps /dev/null)"
  rm -f "$t"
  [ "$got" = "20.000,8.000/8.389/0.000" ] ||
    { echo "fabtests_gbps/ucx_perftest_gbps: $got, want 20.000,8.000/8.389/0.000" >&2; bad=1; }
  got="$(above tag 1.2 0.9 - 1.01)/$(above lat 0.8 0.9 1.2 -)"
  [ "$got" = "2 of 3/2 of 3" ] || { echo "above: $got, want 2 of 3/2 of 3" >&2; bad=1; }
  got="$(put_plan 1048576)/$(put_plan 16384)/$(put_plan 357913)/$(put_plan 5)/$(PUT_IMM_EVERY=64 put_plan 1048576)"
  want="--imm-every 4096 -n 256 --warmup 25/--imm-every 1024 -n 16 --warmup 1"
  want+="/--imm-every 4096 -n 87 --warmup 8/--imm-every 1 -n 5 --warmup 1/--imm-every 64 -n 16384 --warmup 1638"
  [ "$got" = "$want" ] || { echo "put_plan: $got, want $want" >&2; bad=1; }
  got="$(send_warmup 262144 4096)/$(send_warmup 16384 65536)/$(send_warmup 1024 1048576)"
  got+="/$(send_warmup 1000 4096)/$(send_depth 32768)"
  [ "$got" = "25/6/1/1/512" ] || { echo "send_warmup: $got, want 25/6/1/1/512" >&2; bad=1; }
  got="$(put_warm 1048576)/$(put_warm 262144)/$(put_warm 16384)/$(put_warm 5)"
  got+="/$(send_warm 262144 4096)/$(send_warm 16384 65536)/$(send_warm 1024 1048576)"
  want="102400/24576/1024/1/25600/1536/256"
  [ "$got" = "$want" ] || { echo "put_warm/send_warm: $got, want $want" >&2; bad=1; }
  got=$(CORES=0,1 pin_sides; echo "${PIN_SRV[*]}/${PIN_CLI[*]}/$PIN_CORES")
  got+="|$(CORES=none pin_sides; echo "${#PIN_SRV[@]}${#PIN_CLI[@]}/$PIN_CORES")"
  want="taskset -c 0/taskset -c 1/0,1|00/none"
  [ "$(nproc)" -ge 2 ] || want="/" want+="/none|00/none"
  [ "$got" = "$want" ] || { echo "pin_sides: $got, want $want" >&2; bad=1; }
  for f in above interval adjusted suspect; do
    if $f 0.95 1.02 0.97 > /dev/null 2>&1 || $f 1 1.02 > /dev/null 2>&1 || ! $f tag 1.02 > /dev/null 2>&1; then
      echo "$f: takes a number for the row's name, or refuses a row named tag" >&2; bad=1
    fi
  done
  [ $bad = 0 ] && echo "suspect: the 1.5x rule holds in 14 cases (a median as well as a best-of), ratio in 4, round_trips in 4, median in 4, interval in 7, adjusted in 4, round_ratios, one_figure and above in 5, the two parsers in 3, put_plan in 5, send_warmup in 5, put_warm and send_warm in 7, pin_sides in 2; above, interval, adjusted and suspect refuse a number for the row's name"
  exit $bad
fi
