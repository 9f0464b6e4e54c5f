#!/usr/bin/env bash
# rdma-bench next to the provider's own tools, on the same fabric of this machine: each row
# runs rdma-bench and the reference tool alternately, ROUNDS times, and keeps the best
# Gbit/s of each; the table shows ours, theirs and ours / theirs, then the median of the
# rounds' own ratios, in how many rounds ours led, and the median's 95% confidence interval
# (ci/suspect.sh's interval, from 6 rounds: "level" where it holds 1.0).
#
#   ci/compare-ref.sh                  every row at 4K, 64K and 1M, 6 rounds, VM rows included
#   ci/compare-ref.sh --json           one JSON object instead of the table
#   ci/compare-ref.sh --rows shm-write,tcp-send --sizes 64K --rounds 5
#   ci/compare-ref.sh --quick          smoke test (CI): one size, one round, short runs, no VM
#   ci/compare-ref.sh --rows verbs,fi-verbs,ucx-rc   the VM rows alone (no host build or tools;
#                                      CI runs them so at 64K, --mode plain, VM_BYTES=16M)
#   ci/compare-ref.sh --libfabric 2.6.0   against ci/libfabric.sh's 2.6.0 build and its fabtests
#   ci/compare-ref.sh --ladder         rdma-bench loopback --ladder --rounds ROUNDS on shm and tcp:
#                                      median per stage and its spread (no reference tool)
#
# Rows (ours | reference; the exact command lines are printed with --show-commands and in the
# JSON). Like for like: both tools as two processes on this host, server first, client on
# 127.0.0.1 (ours' server writes, as the tools' clients do); ours with the tools' window
# (--window W against -W W, W = FT_WINDOW, default 64) and the same N operations (BYTES /
# SIZE, at least 128; paged: N / P repeats of P pages, P 256 or N / 2: paged_pages). A run
# that gives no figure, or whose JSON shows other bytes or another window than asked, fails the script after its
# table (its round reads 0, its ratio "-").
#   shm-write  rdma-bench server --provider shm; client --workload write -s SIZE --window W
#              --no-verify MODE | fi_rma_bw -p shm -o writedata -S SIZE -I N -W W -E=PORT -B PORT'
#   tcp-write  same, --provider tcp (FI_TCP_IFACE=lo) | fi_rma_bw -p tcp -o writedata ...
#              In the single and plain modes the server (the writer) takes
#              --nic-opt write_completion=transmit: a WRITE
#              completes once its data left, as fi_rma_bw's do (it asks for no completion
#              level; tcp's default is transmit-complete). rdma-bench's own default on tcp is
#              delivery-complete (a refused WRITE comes back as an error), which the paged
#              mode keeps.
#   shm-send   rdma-bench ... --workload send ... | fi_rdm_tagged_bw -p shm
#   tcp-send   rdma-bench ... --provider tcp --workload send ... | fi_msg_bw -p tcp
#              -B PORT (server), -P PORT 127.0.0.1 (client): FI_EP_MSG, the tcp provider's own
#              connected endpoint, without ofi_rxm
#   tcp-send-rdm  same ours | fi_rdm_tagged_bw -p tcp (FI_EP_RDM through ofi_rxm, like ours)
#   The VM rows (ci/compare-ref-vm.sh): three stacks on one link of the Soft-RoCE VM (ci/vm,
#   rxe0 on veth0 <-> rxe1 on veth1), one boot, each against its own tool; two processes, the
#   writing side (ours' server, the tools' clients) on core 1, the other on core 0; rounds
#   paired, each tool first in turn:
#   verbs      rdma-bench server/client --backend verbs --devices rxe0|rxe1 -s SIZE --no-verify
#              --window W MODE (two processes, as the tools; the server writes)
#              | ib_write_bw -d rxe0|rxe1 -x GID -F --report_gbits -s SIZE -n N -t W -Q 1
#              (server, client; -t names perftest's window, whose default differs between
#              releases; -Q 1 a completion for every WRITE, as ours: perftest moderates them to
#              one in min(100, -t) and refills only as they come, so -t 64 alone drained its
#              pipeline every 64 WRITEs)
#   fi-verbs   libfabric 2.6.0 with its verbs provider (LIBFABRIC_VERBS=1 ci/libfabric.sh; Debian's
#              1.17 has none), FI_EP_RDM over verbs;ofi_rxm, FI_UNIVERSE_SIZE=64 for both (rxm
#              sizes its CQ by it, and rxe refuses 256 peers' worth):
#              rdma-bench server/client --backend efa --provider 'verbs;ofi_rxm' --devices rxe0|rxe1
#              --window W ... | fi_rma_bw -p 'verbs;ofi_rxm' -o writedata -W W -S SIZE -I N -d rxe0|rxe1
#   ucx-rc     UCX 1.13 (this host's, copied in) over rc_verbs, tcp on the veths wiring it up
#              (UCX_TLS=rc_verbs,tcp, UCX_NET_DEVICES rxe0:1,veth0 | rxe1:1,veth1), two
#              processes each, mode plain only:
#              rdma-bench server/client --backend ucx --provider rc_verbs,tcp --single-buffer
#              --imm-every 64 --window 32 -s SIZE -n N/64 --warmup W/64 (W: N/10 puts in whole
#              repeats of 64, at least one; N puts, one in 64
#              with the flush and the immediate, the clock stopping at the last immediate)
#              | ucx_perftest -t ucp_put_bw -e -s SIZE -n N -w W (ours' warm-up puts; 32 outstanding, the
#              clock stopping after its final flush); -e is peer error handling, ours' default,
#              without which UCX 1.13 cannot wire rc_verbs up ("no auxiliary transport"). UCX's
#              own summary must show each tool's puts on rc_verbs, or that tool reads 0.
#
# MODE (--mode, a comma list): `single` is rdma-bench --single-buffer (one source and one
# target buffer, every WRITE with an immediate, receives into one buffer: what the fi_*_bw
# tools do, and 1.17's fi_rma_bw -o writedata; 2.x's fi_rma_bw writes each window's W
# WRITEs from and into W slots of SIZE, `bandwidth_rma` advancing the offset, which
# --libfabric 2.x matches, above 4 KiB, with --pages W, as ci/gpu-host.sh does); `plain` (WRITE rows only) is --single-buffer --imm-every 64
# (one WRITE in 64 carries an immediate, the others are plain WRITEs: what ib_write_bw posts,
# whose target handles no completion at all); `paged` is rdma-bench's default (256 pages per
# repeat in random order, one immediate per repeat; 256 x SIZE bytes of buffer per side;
# where N is under 512, N / 2 pages, so that ours moves the tool's bytes).
# Default `both`: single and paged, and plain as well on the verbs row, whose reference
# (ib_write_bw) posts plain WRITEs. The reference tool is the same for every mode.
#
# Every run moves about BYTES bytes (default 1 GiB on the host, 128 MiB in the VM; --quick:
# 16 MiB): N = BYTES / SIZE operations (paged: N / P repeats of P pages, P = 256 or N / 2).
# The VM rows' JSON must show those bytes and the window too, or the run reads 0.
# Scheduling: on a shared machine, other jobs preempt the busy-polling threads of both tools
# for whole scheduler ticks, which swamps the difference being measured. Both tools therefore
# run under SCHED_FIFO priority 10 (`chrt -f 10`; the kernel's RT throttling still leaves 5%
# of each second to everything else) where that is allowed; RT=0 runs them as they are.
# Env: RDMA_BENCH (a prebuilt rdma-bench to use), OURS_ARGS (more rdma-bench flags), ROUNDS,
#      BYTES, VM_BYTES, SKIP_VM=1, RT=0, VM_REUSE=1 (report the last VM run's raw results
#      in ci/.vm/compare-ref/raw again instead of booting the VM).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source ci/suspect.sh
source ci/listening.sh

ALL_ROWS=shm-write,tcp-write,shm-send,tcp-send,tcp-send-rdm,verbs,fi-verbs,ucx-rc
ROWS=$ALL_ROWS
SIZES=4K,64K,1M
ROUNDS=${ROUNDS:-6}  # 6: the fewest rounds from which ci/suspect.sh's interval gives one
MODE=both
JSON=0; QUICK=0; SHOW=0; LFV=; LADDER=0
BYTES=${BYTES:-$((1 << 30))}
VM_BYTES=${VM_BYTES:-$((128 << 20))}
while [ $# -gt 0 ]; do
  case $1 in
    --rows) ROWS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --mode) MODE=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    --quick) QUICK=1; shift ;;
    --show-commands) SHOW=1; shift ;;
    --libfabric) LFV=$2; shift 2 ;;
    --ladder) LADDER=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare-ref: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ $QUICK = 1 ]; then
  ROUNDS=1; SIZES=64K; BYTES=$((16 << 20)); SKIP_VM=1; MODE=single
  [ "$ROWS" = "$ALL_ROWS" ] && ROWS=shm-write,tcp-write,shm-send,tcp-send
fi
VMODES=()
case $MODE in both) MODES=(single paged); VMODES=(single plain paged) ;;
  *) IFS=, read -r -a MODES <<< "$MODE"
     for m in "${MODES[@]}"; do
       case $m in single|plain|paged) ;;
         *) echo "compare-ref: --mode: a comma list of single, plain, paged (or both)" >&2; exit 2 ;;
       esac
     done ;;
esac
[ ${#VMODES[@]} -gt 0 ] || VMODES=("${MODES[@]}")
# plain: one immediate per this many WRITEs
PLAIN_K=64
# The host rows' window: the fabtests' -W and ours' --window (at most this many operations in
# flight; the fabtests post W and wait for all W, ours keeps up to W going)
W=${FT_WINDOW:-64}
[[ "$W" =~ ^[1-9][0-9]*$ ]] || { echo "compare-ref: FT_WINDOW=$W: want a count of at least 1" >&2; exit 2; }
IFS=, read -r -a ROWV <<< "$ROWS"
IFS=, read -r -a SIZEV <<< "$SIZES"
# The rows that run in the VM (ci/compare-ref-vm.sh), with tools and a build of their own;
# the others run on this host.
vm_row() { case $1 in verbs|fi-verbs|ucx-rc) return 0 ;; *) return 1 ;; esac; }
# Host tools and a host build, unless only VM rows run.
HOST=$LADDER
for row in "${ROWV[@]}"; do vm_row "$row" || HOST=1; done

log() { echo "compare-ref: $*" >&2; }
bytes_of() {  # 4K -> 4096
  local s=${1^^}
  case $s in *K) echo $(( ${s%K} << 10 )) ;; *M) echo $(( ${s%M} << 20 )) ;; *G) echo $(( ${s%G} << 30 )) ;; *) echo "$s" ;; esac
}

# ---- the tools -------------------------------------------------------------------------
source ci/setup.sh >/dev/null
if [ $HOST = 0 ]; then
  : # VM rows only: no host tools, no host build
elif [ -n "$LFV" ]; then
  PREFIX=$(ci/libfabric.sh "$LFV")
  FT=$PREFIX/bin
  export LD_LIBRARY_PATH=$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  TD=$ROOT/target-$LFV
  BUILD_ENV=(env PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig)
else
  FT=$(ci/libfabric.sh 1.17 --fabtests)/bin
  TD=${CARGO_TARGET_DIR:-$ROOT/target}
  BUILD_ENV=(env)
fi
if [ -n "${RDMA_BENCH:-}" ]; then
  RB=$RDMA_BENCH
elif [ $HOST = 0 ]; then
  RB=
else
  log "building rdma-bench (release)"
  "${BUILD_ENV[@]}" cargo build --release -q -p bench-cli --bin rdma-bench --target-dir "$TD" >&2
  RB=$TD/release/rdma-bench
fi
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}
PRIO=()
if [ "${RT:-1}" = 1 ] && chrt -f 10 true 2>/dev/null; then PRIO=(chrt -f 10); fi
[ ${#PRIO[@]} -gt 0 ] || log "running without real-time priority: expect noisy figures on a busy machine"

OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT

if [ $LADDER = 1 ]; then
  # every stage of the ladder, ROUNDS interleaved rounds per provider (rdma-bench --rounds):
  # the median per stage, the spread of its rounds, and each step against that spread
  for prov in shm tcp; do
    "${PRIO[@]}" "$RB" loopback --provider "$prov" --ladder --no-verify -n "${LADDER_ITERS:-60}" \
      --rounds "$ROUNDS"
  done
  exit 0
fi

# ops SIZE: the operations every run of a row moves, ours and theirs alike (BYTES / SIZE, at
# least 128)
ops() { local n=$(( BYTES / $(bytes_of "$1") )); [ $n -ge 128 ] || n=128; echo $n; }
# paged_pages N: pages a repeat of the paged mode for N WRITEs: 256 (rdma-bench's default)
# where N holds two repeats of them, else N / 2, so that N / P repeats move N WRITEs'
# bytes (at least two repeats, N a power of 2 as the sizes give; VM rows: N at least 64)
paged_pages() { local p=$(( $1 / 2 )); echo $(( p < 256 ? p : 256 )); }
# fail WHAT: count a failed run (the rounds run in subshells: a file, not a variable) and
# print the 0 that keeps its round paired; the script exits 1 after its table
fail() { log "$*"; echo "$*" >> "$OUT/failed"; echo 0; }
# A 2.x fi_rma_bw writes each window's W WRITEs from and into W slots of SIZE (bandwidth_rma
# advances the offset); 1.17's into one buffer. Ours' single mode matches it: above 4 KiB
# with --pages W (one source and one target buffer stayed in cache and read 2.7x fi_rma_bw at
# 1 MiB), up to 4 KiB (shm's inject size) one buffer, every WRITE with an immediate, as
# ci/gpu-host.sh does.
slots() { [ -n "$LFV" ] && [ "${LFV%%.*}" != 1 ]; }

# ours ROW SIZE MODE -> Gbit/s on stdout; the command in $OUT/cmd. Two processes, as the
# tools: ours' server writes (its WRITEs and SENDs), the client asks and reads the result;
# the window is the tools' -W. A run that did not move the asked bytes with that window is
# a failed run.
ours() {
  local row=$1 size=$2 mode=$3 b n prov wl ops_asked
  b=$(bytes_of "$size"); n=$(ops "$size")
  case $row in
    shm-*) prov=shm ;; tcp-*) prov=tcp ;;
  esac
  case $row in *-write) wl=write ;; *) wl=send ;; esac
  local args=(--provider "$prov" --workload "$wl" -s "$size" --window "$W" --no-verify --json)
  local sargs=(--provider "$prov")
  # shellcheck disable=SC2206
  [ -z "${OURS_ARGS:-}" ] || args+=($OURS_ARGS)
  # like-for-like completion semantics with fi_rma_bw (see the header), on the writer
  if [ "$row" = tcp-write ] && [ "$mode" != paged ]; then
    sargs+=(--nic-opt write_completion=transmit)
  fi
  if [ "$mode" = single ] && [ $wl = write ] && slots && [ "$b" -gt 4096 ]; then
    local reps=$(( n / W )); [ $reps -ge 2 ] || reps=2
    args+=(--pages "$W" -n "$reps"); ops_asked=$(( reps * W ))
  elif [ "$mode" = single ]; then
    args+=(--single-buffer -n "$n"); ops_asked=$n
  elif [ "$mode" = plain ]; then
    local k=$(( n / PLAIN_K )); [ $k -ge 2 ] || k=2
    args+=(--single-buffer --imm-every "$PLAIN_K" -n "$k"); ops_asked=$(( k * PLAIN_K ))
  elif [ $wl = write ]; then
    # paged: N / P repeats of P pages, P = 256 or N / 2 (paged_pages): the tool's N WRITEs
    local pages; pages=$(paged_pages "$n")
    args+=(--pages "$pages" -n $(( n / pages ))); ops_asked=$(( n / pages * pages ))
  else
    args+=(-n "$n"); ops_asked=$n
  fi
  PORT=$(free_port) || { fail "no free port"; return; }
  echo "$RB server ${sargs[*]} --listen 127.0.0.1:$PORT --sessions 1   # client: $RB client --connect 127.0.0.1:$PORT ${args[*]}" > "$OUT/cmd"
  "${PRIO[@]}" timeout 120 "$RB" server "${sargs[@]}" --listen "127.0.0.1:$PORT" --sessions 1 \
    > "$OUT/ours.srv" 2>&1 &
  local spid=$!
  wait_listening "$PORT" 30 || true  # past that the client runs anyway, and fails
  if ! "${PRIO[@]}" timeout 120 "$RB" client --connect "127.0.0.1:$PORT" "${args[@]}" \
      > "$OUT/ours.json" 2> "$OUT/ours.err"; then
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
    fail "rdma-bench $row $size $mode failed: $(tail -2 "$OUT/ours.err" | tr '\n' ' ')"; return
  fi
  wait $spid 2>/dev/null || { fail "rdma-bench server ($row $size $mode) failed: $(tail -2 "$OUT/ours.srv" | tr '\n' ' ')"; return; }
  local got
  got=$(jq -r --argjson w "$W" --argjson by $(( ops_asked * b )) \
    'if (.gbps | type) == "number" and .knobs.window == $w and .bytes == $by then .gbps
     else "moved \(.bytes) bytes with window \(.knobs.window), asked \($by) with \($w)" end' \
    "$OUT/ours.json" 2>&1) || got="no JSON result: $got"
  case $got in
    [0-9]*) echo "$got" ;;
    *) fail "rdma-bench $row $size $mode: $got" ;;
  esac
}

# theirs ROW SIZE -> Gbit/s on stdout (client's MB/s x 8 / 1000); the command in $OUT/cmd
theirs() {
  local row=$1 size=$2 b n tool
  b=$(bytes_of "$size"); n=$(ops "$size")
  PORT=$(free_port 3) || { fail "no free port"; return; }
  # -w W: a warm-up of one whole window, which the tools drain before their clock starts.
  # Their default, 10, leaves 10 warm-up operations in flight when the clock starts (1.17's
  # loops, and 2.x's send loop): their first timed window completes them too, so the figure
  # counts N operations for the time of N + 10 (about 1% at 1 MiB, in ours' favour).
  local common=(-S "$b" -I "$n" -w "$W")
  case $row in
    shm-write) tool=(fi_rma_bw -p shm -o writedata -W "$W") ;;
    tcp-write) tool=(fi_rma_bw -p tcp -o writedata -W "$W") ;;
    shm-send) tool=(fi_rdm_tagged_bw -p shm -W "$W") ;;
    tcp-send) tool=(fi_msg_bw -p tcp -W "$W") ;;
    tcp-send-rdm) tool=(fi_rdm_tagged_bw -p tcp -W "$W") ;;
  esac
  local srv cli
  if [ "$row" = tcp-send ]; then
    # FI_EP_MSG: the server listens on -B, the client connects to -P (no out-of-band exchange)
    srv=("$FT/${tool[0]}" "${tool[@]:1}" "${common[@]}" -B "$PORT")
    cli=("$FT/${tool[0]}" "${tool[@]:1}" "${common[@]}" -P "$PORT" 127.0.0.1)
    echo "${tool[*]} ${common[*]} -B $PORT   # server; client: -P $PORT 127.0.0.1" > "$OUT/cmd"
  else
    # FI_EP_RDM: addresses go over the -E socket; shm names its region after -B, so the two
    # sides need distinct ones
    srv=("$FT/${tool[0]}" "${tool[@]:1}" "${common[@]}" -E="$PORT" -B $((PORT + 1)))
    cli=("$FT/${tool[0]}" "${tool[@]:1}" "${common[@]}" -E="$PORT" -B $((PORT + 2)) 127.0.0.1)
    echo "${tool[*]} ${common[*]} -E=$PORT -B $((PORT + 1))   # server; client: -B $((PORT + 2)) 127.0.0.1" > "$OUT/cmd"
  fi
  "${PRIO[@]}" timeout 60 "${srv[@]}" > "$OUT/srv.txt" 2>&1 &
  local spid=$!
  # Every server listens on PORT: -E's address exchange, or tcp-send's passive endpoint.
  wait_listening "$PORT" 30 || true  # past that the client runs anyway, and fails
  local ok=1
  "${PRIO[@]}" timeout 60 "${cli[@]}" > "$OUT/cli.txt" 2>&1 || ok=0
  wait $spid || ok=0
  [ $ok = 1 ] || { fail "${tool[0]} $size failed: $(tail -2 "$OUT/cli.txt" "$OUT/srv.txt" | tr '\n' ' ')"; return; }
  local g
  g=$(fabtests_gbps "$OUT/cli.txt")
  if [ "$(awk -v g="$g" 'BEGIN {print (g + 0 > 0)}')" = 1 ]; then echo "$g"
  else fail "${tool[0]} $size printed no result line: $(tail -2 "$OUT/cli.txt" | tr '\n' ' ')"; fi
}

max() { awk -v a="$1" -v b="$2" 'BEGIN {print (b + 0 > a + 0) ? b : a}'; }

RESULTS=$OUT/results.tsv   # row size mode ours theirs ours_cmd theirs_cmd median ahead interval
: > "$RESULTS"
# result ROW SIZE MODE BEST_OURS BEST_THEIRS OURS_CMD THEIRS_CMD RATIO...: one row of RESULTS
# from the best figures, the last commands and the rounds' ratios (the host rows here, the VM
# rows in ci/compare-ref-vm.sh).
result() {
  local row=$1 size=$2 mode=$3 o=$4 t=$5 co=$6 ct=$7; shift 7
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "$size" "$mode" "$o" "$t" "$co" \
    "$ct" "$(median "$@")" "$(above "$row" "$@")" "$(interval "$row" "$@")" >> "$RESULTS"
}
for row in "${ROWV[@]}"; do
  vm_row "$row" && continue
  for size in "${SIZEV[@]}"; do
    for mode in "${MODES[@]}"; do
      [ "$mode" = plain ] && [[ $row != *-write ]] && continue
      best_o=0; best_t=0; co=; ct=; rr=()
      for r in $(seq 1 "$ROUNDS"); do
        # alternate which tool goes first, so a slow start or a noisy neighbour hits both
        if [ $((r % 2)) = 1 ]; then
          o=$(ours "$row" "$size" "$mode"); co=$(cat "$OUT/cmd")
          t=$(theirs "$row" "$size"); ct=$(cat "$OUT/cmd")
        else
          t=$(theirs "$row" "$size"); ct=$(cat "$OUT/cmd")
          o=$(ours "$row" "$size" "$mode"); co=$(cat "$OUT/cmd")
        fi
        log "$row $size $mode round $r: ours $o, theirs $t Gbit/s"
        best_o=$(max "$best_o" "$o"); best_t=$(max "$best_t" "$t"); rr+=("$(ratio "$o" "$t")")
      done
      result "$row" "$size" "$mode" "$best_o" "$best_t" "$co" "$ct" "${rr[@]}"
    done
  done
done

# ---- the VM rows: verbs, fi-verbs, ucx-rc on one Soft-RoCE link, inside the VM ------------
source ci/compare-ref-vm.sh

# ---- report ------------------------------------------------------------------------------
ref_name() {
  case $1 in
    shm-write|tcp-write) echo "fi_rma_bw -o writedata" ;;
    shm-send|tcp-send-rdm) echo fi_rdm_tagged_bw ;;
    tcp-send) echo "fi_msg_bw (FI_EP_MSG)" ;;
    verbs) echo "ib_write_bw (VM)" ;;
    fi-verbs) echo "fi_rma_bw -o writedata (VM)" ;;
    ucx-rc) echo "ucx_perftest -t ucp_put_bw -e (VM)" ;;
  esac
}
if [ $JSON = 1 ]; then
  jq -n --arg host "$(uname -n)" --arg cpus "$(nproc)" --arg rounds "$ROUNDS" \
    --arg bytes "$BYTES" --arg vm_bytes "$VM_BYTES" --arg libfabric "${LFV:-system}" \
    --rawfile tsv "$RESULTS" '
    {host: $host, cpus: ($cpus | tonumber), rounds: ($rounds | tonumber),
     bytes_per_run: ($bytes | tonumber), vm_bytes_per_run: ($vm_bytes | tonumber),
     libfabric: $libfabric,
     rows: [$tsv | split("\n")[] | select(length > 0) | split("\t") |
       {row: .[0], size: .[1], mode: .[2], ours_gbps: (.[3] | tonumber),
        ref_gbps: (.[4] | tonumber),
        ratio: (if (.[4] | tonumber) > 0 then ((.[3] | tonumber) / (.[4] | tonumber)) else null end),
        median_ratio: (if .[7] == "-" then null else (.[7] | tonumber) end), ours_ahead: .[8],
        median_interval: (if .[9] == "-" then null else .[9] end),
        ours_cmd: .[5], ref_cmd: .[6]}]}'
else
  printf '%-13s %5s %-7s %9s %9s %7s %7s %10s  %-18s %s\n' row size mode "ours" "ref" "ratio" \
    median "ours ahead" "median's 95% CI" \
    "reference (Gbit/s, best of $ROUNDS; median: of the rounds' ratios)"
  while IFS=$'\t' read -r row size mode o t co ct med ahead ci; do
    ratio=$(ratio "$o" "$t")
    printf '%-13s %5s %-7s %9.2f %9.2f %7s %7s %10s  %-18s %s%s\n' "$row" "$size" "$mode" "$o" \
      "$t" "$ratio" "$med" "$ahead" "$ci" "$(ref_name "$row")" "$(suspect "$row" "$ratio" "$med")"
  done < "$RESULTS"
  if [ $SHOW = 1 ]; then
    echo; echo "commands (last round of each row):"
    while IFS=$'\t' read -r row size mode o t co ct _; do
      echo "  $row $size $mode:"; echo "    ours: $co"; echo "    ref:  $ct"
    done < "$RESULTS"
  fi
fi
# A failed run reads 0 in its round (its ratio "-"): the table stands, the verdict does not.
if [ -s "$OUT/failed" ]; then
  log "FAILED: $(wc -l < "$OUT/failed") run(s) gave no figure:"
  sed 's/^/  /' "$OUT/failed" >&2
  exit 1
fi
