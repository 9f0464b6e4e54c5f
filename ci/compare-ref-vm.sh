# Sourced by ci/compare-ref.sh: its VM rows, three stacks on one Soft-RoCE link (rxe0 on veth0
# 10.99.0.1, rxe1 on veth1 10.99.0.2) in one boot of ci/vm, each against its own tool (what
# each row runs: compare-ref.sh's header). Uses compare-ref.sh's ROWV, SIZEV, ROUNDS, VMODES,
# PLAIN_K, VM_BYTES, RESULTS, ROOT, SKIP_VM, VM_REUSE and log, bytes_of, max, vm_row;
# appends the rows to RESULTS. Each round runs ours (each mode) and the row's tool once,
# taking turns going first, so rounds pair up: the median of the rounds' ratios and the
# rounds ours led.

VD=$ROOT/ci/.vm/compare-ref
VMROWS=()
for row in "${ROWV[@]}"; do vm_row "$row" && VMROWS+=("$row"); done
[ -z "${SKIP_VM:-}" ] || VMROWS=()
vmrow() { [[ " ${VMROWS[*]} " == *" $1 "* ]]; }
# ucx-rc runs plain only: ucx_perftest's puts carry no immediate.
vm_modes() { if [ "$1" = ucx-rc ]; then echo plain; else echo "${VMODES[@]}"; fi; }

# vm_ours ROW SIZE MODE N R PORT: the VM's commands for one run of ours (N operations' worth),
# into raw/ROW.o.SIZE.MODE.R.{cmd,json,err}. Two processes, as the tools: ours' server is the
# writer (core 1, as the tools' clients), its client on core 0. At 1 MiB ours read 0.24-0.25
# Gbit/s as one process holding both ends (`loopback`) against 0.18-0.19 as two, in this VM.
vm_ours() {
  local row=$1 size=$2 mode=$3 n=$4 r=$5 port=$6 ma k f b d0= d1= e0= e1= ops pages win=$W pk=$PLAIN_K
  # plain: N / K immediates, each after K WRITEs; K = PLAIN_K, or N / 2 where N holds fewer
  # than two of PLAIN_K (N is at least 64 here), so that ours moves the tool's N WRITEs
  [ $(( n / pk )) -ge 2 ] || pk=$(( n / 2 ))
  k=$(( n / pk ))
  case $mode in
    single) ma="--single-buffer -n $n"; ops=$n ;;
    plain) ma="--single-buffer --imm-every $pk -n $k"; ops=$(( k * pk )) ;;
    # paged: as the host rows, 256 pages a repeat where N holds two repeats, else N / 2
    # pages, so ours moves the tool's bytes (256-page repeats moved 4x them at 1 MiB).
    *) pages=$(paged_pages "$n"); ma="--pages $pages -n $(( n / pages ))"; ops=$(( n / pages * pages )) ;;
  esac
  [ "$row" != ucx-rc ] || win=32  # ucx_perftest's ucp_put_bw: 32 puts outstanding
  f=raw/$row.o.$size.$mode.$r
  # TCG moves tens of Mbit/s: a 256-page repeat of 1 MiB takes longer than the default idle timeout
  ma="-s $size --no-verify $ma --window $win --idle-timeout 120 --json"
  # What the run must show in its JSON (bytes moved, window), checked when the rows are read.
  echo "echo '$(( ops * $(bytes_of "$size") )) $win' > $f.want"
  case $row in
    verbs) b="--backend verbs" d0="--devices rxe0" d1="--devices rxe1" ;;
    fi-verbs)
      b="--backend efa --provider 'verbs;ofi_rxm'" d0="--devices rxe0" d1="--devices rxe1"
      e0='env $FI ' e1='env $FI ' ;;
    ucx-rc)
      # As transport-ucx/compare.sh with PUT_IMM_EVERY=PLAIN_K (its default K is now up to
      # 4096: ci/suspect.sh's put_plan; this row keeps the plain rows' K): N puts, one in K
      # with the flush and the immediate (the clock stops at the last immediate), 32 in
      # flight, N/10 warm-up puts rounded down to whole repeats of K (at least one: put_plan's
      # warm-up), and ucx_perftest's -w the same puts (put_warm, in vm_theirs).
      b="--backend ucx --provider rc_verbs,tcp" e0='env $U0 ' e1='env $U1 '
      local plan; read -ra plan <<< "$(PUT_IMM_EVERY=$pk put_plan "$n")"
      ma="$ma ${plan[*]: -2}" ;;
  esac
  echo "echo \"\\\$ ${e0}rdma-bench server $b $d0   # the writer, core 1; client, core 0: ${e1}rdma-bench client $b $d1 $ma\" > $f.cmd"
  echo "${e0}timeout 600 taskset -c 1 ./bin/rdma-bench server $b $d0 --listen 10.99.0.1:$port --sessions 1 > $f.srv 2>&1 &"
  echo "spid=\$!; up $port"
  echo "${e1}timeout 600 taskset -c 0 ./bin/rdma-bench client $b $d1 --connect 10.99.0.1:$port $ma > $f.json 2> $f.err; echo \$? > $f.rc"
  echo "wait \$spid; echo \$? > $f.src"
}

# vm_theirs ROW SIZE N R PORT: one run of the row's own tool, server on core 0, client (the
# writer) on core 1, into raw/ROW.t.SIZE.R.{cmd,srv,txt}
vm_theirs() {
  local row=$1 size=$2 n=$3 r=$4 port=$5 b f bin=./bin/ e0= e1= srv cli lp=$5
  b=$(bytes_of "$size"); f=raw/$row.t.$size.$r
  case $row in
    verbs)
      bin= lp=18515  # ib_write_bw's default port
      # -t W: the window, named (perftest's default tx depth differs between its releases);
      # -Q 1: a completion for every WRITE, as ours asks for. perftest moderates completions
      # to one in min(100, tx depth) and posts again only as they come, so with -t 64 alone
      # its pipeline drained every 64 WRITEs: TCG's 4 KiB rows read ours 1.28-1.33 ahead.
      srv="ib_write_bw -d rxe0 -x \$G0 -F --report_gbits -s $b -n $n -t $W -Q 1"
      cli="ib_write_bw -d rxe1 -x \$G1 -F --report_gbits -s $b -n $n -t $W -Q 1 10.99.0.1" ;;
    fi-verbs)
      e0='env $FI ' e1='env $FI '
      # -w W: a warm-up of one whole window, drained before the clock (compare-ref's theirs)
      srv="fi_rma_bw -p 'verbs;ofi_rxm' -o writedata -W $W -w $W -S $b -I $n -E=$port -d rxe0 -s 10.99.0.1"
      cli="fi_rma_bw -p 'verbs;ofi_rxm' -o writedata -W $W -w $W -S $b -I $n -E=$port -d rxe1 -s 10.99.0.2 10.99.0.1" ;;
    ucx-rc)
      # -e: peer error handling, ours' default; without it UCX 1.13 finds no transport to
      # wire rc_verbs up over ("no auxiliary transport").
      e0='env $U0 ' e1='env $U1 '
      # -w: ours' warm-up puts (vm_ours: put_plan's warm-up at K = PLAIN_K)
      srv="ucx_perftest -t ucp_put_bw -e -s $b -n $n -w $(PUT_IMM_EVERY=$PLAIN_K put_warm "$n") -f -p $port"
      cli="$srv 10.99.0.1" ;;
  esac
  echo "echo \"\\\$ $e0$srv   # server, core 0; client, core 1: $e1$cli\" > $f.cmd"
  echo "${e0}timeout 300 taskset -c 0 $bin$srv > $f.srv 2>&1 &"
  echo "spid=\$!; up $lp"
  echo "${e1}timeout 300 taskset -c 1 $bin$cli > $f.txt 2>&1; echo \$? > $f.rc"
  echo "wait \$spid; echo \$? > $f.src"
}

# vm_ran FILE: whether both processes of the run FILE.* exited 0 (each wrote its status);
# a run that printed a figure and then failed is no figure
vm_ran() { [ "$(cat "$1.rc" 2>/dev/null)" = 0 ] && [ "$(cat "$1.src" 2>/dev/null)" = 0 ]; }

# vm_figure ROW FILE: Gbit/s of one reference run's output (0 where it printed none)
vm_figure() {
  case $1 in
    verbs) awk '$1 ~ /^[0-9]+$/ && NF >= 5 && $2 ~ /^[0-9]+$/ {v = $4} END {print v + 0}' "$2" ;;
    fi-verbs) fabtests_gbps "$2" ;;
    ucx-rc) ucx_perftest_gbps "$2" ;;
  esac
}

if [ ${#VMROWS[@]} -gt 0 ] && [ -n "${VM_REUSE:-}" ]; then
  log "VM_REUSE: reading the VM rows' results of the last VM run in $VD/raw"
elif [ ${#VMROWS[@]} -gt 0 ]; then
  export SETUP_VM=1
  source ci/setup.sh >/dev/null
  ci/vm/build-initramfs.sh >&2
  feats=() benv=(env)
  vmrow verbs && feats+=(verbs)
  vmrow ucx-rc && feats+=(ucx)
  if vmrow fi-verbs; then
    # libfabric with its verbs provider (Debian's 1.17 has none): built once, cached.
    LFP=$(LIBFABRIC_VERBS=1 ci/libfabric.sh 2.6.0)
    feats+=(efa); benv=(env PKG_CONFIG_PATH="$LFP/lib/pkgconfig")
  fi
  feats=$(IFS=,; echo "${feats[*]}")
  log "building rdma-bench with the $feats backend(s) only"
  VMT=${CARGO_TARGET_DIR:-$ROOT/target}/vm
  "${benv[@]}" cargo build --release -q -p bench-cli --no-default-features --features "$feats" \
    --target-dir "$VMT" >&2
  rm -rf "$VD"; mkdir -p "$VD/bin" "$VD/lib" "$VD/raw"
  cp "$VMT/release/rdma-bench" "$VD/bin/"
  cp ci/listening.sh "$VD/"
  source ci/host-libs.sh
  host_libs_into "$VD/lib" libhwloc.so.15 libudev.so.1 || true
  if vmrow fi-verbs; then cp -L "$LFP/lib/libfabric.so.1" "$VD/lib/"; cp "$LFP/bin/fi_rma_bw" "$VD/bin/"; fi
  if vmrow ucx-rc; then
    source ci/vm/ucx-share.sh
    ucx_into_share "$VD" ucx_perftest || { log "ucx-rc: UCX could not be copied into the VM"; exit 1; }
  fi
  {
    echo '#!/bin/sh'
    echo '# generated by ci/compare-ref.sh (ci/compare-ref-vm.sh); runs inside the VM'
    echo 'G0=$SOFTROCE_GID0; G1=$SOFTROCE_GID1'
    # up PORT: wait (up to 120 s, probing every tenth of a second) until a server listens on
    # PORT before its client starts; a fixed second was too short beside two busy loops (a
    # client refused, its server left waiting). Past 120 s the client runs anyway and
    # reports; every server has a timeout as well, so a missed client cannot hang the VM.
    echo '. ./listening.sh'
    echo 'up() { wait_listening "$1" 120 || true; }'
    # rxm sizes its verbs CQ by the universe (256 peers by default), beyond what rxe gives a
    # CQ ("Unable to create verbs CQ", then fi_enable's -22); with 64 peers it fits. Both
    # tools of the fi-verbs row run with it.
    echo 'FI=FI_UNIVERSE_SIZE=64'
    echo 'export UCX_MODULE_DIR=/mnt/host/lib/ucx'
    # Each side's UCX devices: its rxe port and the veth under it (tcp wires rc_verbs up).
    echo 'U0="UCX_TLS=rc_verbs,tcp UCX_NET_DEVICES=rxe0:1,veth0"; U1="UCX_TLS=rc_verbs,tcp UCX_NET_DEVICES=rxe1:1,veth1"'
    if vmrow ucx-rc; then
      # The transports each tool's writer used (UCX's summary, "ep_cfg[N]: rma(...) ...
      # ka(...)"): rc_verbs must carry the puts.
      echo 'env $U0 timeout 120 ./bin/ucx_perftest -t ucp_put_bw -e -s 4096 -n 64 -p 13390 > raw/lanes.srv 2>&1 &'
      echo 'up 13390; env $U1 UCX_LOG_LEVEL=info timeout 120 ./bin/ucx_perftest -t ucp_put_bw -e -s 4096 -n 64 -p 13390 10.99.0.1 2>&1 | grep -E "ep_cfg\[[0-9]+\]" | sed "s/.*ep_cfg/perftest ep_cfg/" > raw/lanes.txt; wait'
      echo 'env $U0 UCX_LOG_LEVEL=info timeout 120 ./bin/rdma-bench server --backend ucx --provider rc_verbs,tcp --listen 10.99.0.1:13391 --sessions 1 2>&1 | grep -E "ep_cfg\[[0-9]+\]" | sed "s/.*ep_cfg/ours ep_cfg/" >> raw/lanes.txt &'
      echo 'up 13391; env $U1 timeout 120 ./bin/rdma-bench client --backend ucx --provider rc_verbs,tcp --connect 10.99.0.1:13391 -s 4096 -n 2 > /dev/null 2>&1; wait'
    fi
    port=13400
    for size in "${SIZEV[@]}"; do
      n=$(( VM_BYTES / $(bytes_of "$size") )); [ $n -ge 64 ] || n=64
      for r in $(seq 1 "$ROUNDS"); do
        for row in "${VMROWS[@]}"; do
          port=$((port + 2))
          [ $((r % 2)) = 1 ] || vm_theirs "$row" "$size" "$n" "$r" "$port"
          for mode in $(vm_modes "$row"); do vm_ours "$row" "$size" "$mode" "$n" "$r" $((port + 1)); done
          [ $((r % 2)) = 0 ] || vm_theirs "$row" "$size" "$n" "$r" "$port"
        done
      done
    done
    echo 'exit 0'
  } > "$VD/run.sh"
  log "running the VM rows (${VMROWS[*]}; several minutes under TCG)"
  SOFTROCE_TIMEOUT=${SOFTROCE_TIMEOUT:-3600} ci/vm/run-vm.sh --share "$VD" -- sh run.sh >&2 ||
    fail "the VM run failed; VM rows may be missing" > /dev/null
fi

# A UCX tool whose puts did not go over rc_verbs measured another transport: no figure for it.
declare -A over_rc=()
if vmrow ucx-rc; then
  for tool in ours perftest; do
    if grep -qE "^$tool ep_cfg.* rma(_bw)?\(rc_verbs/rxe" "$VD/raw/lanes.txt" 2>/dev/null; then
      over_rc[$tool]=1
    else
      log "ucx-rc: $tool: the puts did not go over rc_verbs, so its figures read 0 (UCX's summary: $VD/raw/lanes.txt)"
    fi
  done
fi
for row in "${VMROWS[@]}"; do
  for size in "${SIZEV[@]}"; do
    ts=() ct=
    for r in $(seq 1 "$ROUNDS"); do
      f=$VD/raw/$row.t.$size.$r
      [ -f "$f.cmd" ] && ct=$(sed 's/^\$ //' "$f.cmd")
      v=$(vm_figure "$row" "$f.txt" 2>/dev/null || true)
      [ "$row" != ucx-rc ] || [ -n "${over_rc[perftest]:-}" ] || v=0
      vm_ran "$f" || v=0
      awk -v v="$v" 'BEGIN {exit !(v + 0 == 0)}' &&
        fail "$row $size round $r, the reference (exit $(cat "$f.rc" 2>/dev/null)/$(cat "$f.src" 2>/dev/null)): $(tail -1 "$f.txt" 2>/dev/null)" > /dev/null
      ts+=("${v:-0}")
    done
    for mode in $(vm_modes "$row"); do
      os=() co=
      for r in $(seq 1 "$ROUNDS"); do
        f=$VD/raw/$row.o.$size.$mode.$r
        [ -f "$f.cmd" ] && co=$(sed 's/^\$ //' "$f.cmd")
        # UCX may print its log lines on stdout, before the JSON. A run that moved other
        # bytes or ran another window than its .want asked is no figure (as the host rows).
        read -r wb ww < "$f.want" 2>/dev/null || wb=- ww=-
        v=$(grep -v '^\[[0-9]' "$f.json" 2>/dev/null | jq -r --arg b "$wb" --arg w "$ww" \
          'if (.gbps | type) == "number" and (.bytes | tostring) == $b and (.knobs.window | tostring) == $w then .gbps
           else "moved \(.bytes) bytes with window \(.knobs.window), asked \($b) with \($w)" end' 2>/dev/null || true)
        why=$(tail -1 "$f.err" 2>/dev/null)
        case $v in [0-9]*) ;; *) [ -z "$v" ] || why=$v; v=0 ;; esac
        [ "$row" != ucx-rc ] || [ -n "${over_rc[ours]:-}" ] || v=0
        vm_ran "$f" || v=0
        awk -v v="$v" 'BEGIN {exit !(v + 0 == 0)}' &&
          fail "$row $size $mode round $r, ours (exit $(cat "$f.rc" 2>/dev/null)/$(cat "$f.src" 2>/dev/null)): $why" > /dev/null
        os+=("${v:-0}")
      done
      best_o=0 best_t=0
      for v in "${os[@]}"; do best_o=$(max "$best_o" "$v"); done
      for v in "${ts[@]}"; do best_t=$(max "$best_t" "$v"); done
      mapfile -t rr < <(round_ratios "${os[*]}" "${ts[*]}")
      result "$row" "$size" "$mode" "$best_o" "$best_t" "$co" "$ct" "${rr[@]}"
    done
  done
done
