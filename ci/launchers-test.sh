#!/usr/bin/env bash
# `rdma-bench run` under the real engines, on this one machine, over 127.0.0.1:
#   1. Open MPI: mpirun --oversubscribe -np 4, libfabric shm and tcp, UCX sm and tcp (on lo);
#   2. Slurm: a one-node cluster (munged, slurmctld, slurmd from Debian's packages, own
#      config, key and state in a temp dir, removed on exit), srun -n 4: rank, size, local
#      rank and the rendezvous host all come from Slurm's environment;
#   3. a rank killed under mpirun: every other rank exits non-zero naming it.
# Every step is bounded by a timeout. Needs the packages SETUP_LAUNCHERS=1 ci/setup.sh
# installs (openmpi-bin, slurmctld, slurmd, slurm-client, munge).
#   ci/launchers-test.sh           uses target/debug/rdma-bench (built, with the ucx feature)
#   RDMA_BENCH=path ci/launchers-test.sh    (a binary with the ucx backend: --features ucx)
#   LAUNCHERS_ONLY=mpi|kill|slurm ci/launchers-test.sh    one part only (e.g. to repeat one)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export SETUP_LAUNCHERS=1
source ci/setup.sh

if [ -z "${RDMA_BENCH:-}" ]; then
  # With UCX, as ci/test.sh's `cargo test --features bench-cli/ucx` left it (a build without
  # the feature would replace that binary).
  cargo build -q -p bench-cli --bin rdma-bench --features ucx
  RDMA_BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/debug/rdma-bench
fi
B=$RDMA_BENCH
ARGS=(-s 4K --pages 16 -n 5 --idle-timeout 5 --rendezvous-timeout 30)
TMP=$(mktemp -d /tmp/rdma-bench-launchers.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # The daemons are not this shell's children (wait returns at once): give each up to 10 s
  # to go, so that none still writes into $TMP while it is removed (slurmctld, under load).
  for p in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$TMP" 2>/dev/null || { sleep 1; rm -rf "$TMP"; } || true
}
trap cleanup EXIT
fail() { echo "launchers-test: FAILED: $*" >&2; exit 1; }
want() { [ -z "${LAUNCHERS_ONLY:-}" ] || [ "$LAUNCHERS_ONLY" = "$1" ]; }
case ${LAUNCHERS_ONLY:-} in ""|mpi|kill|slurm) ;;
  *) echo "launchers-test: LAUNCHERS_ONLY=$LAUNCHERS_ONLY: no such part (mpi, kill, slurm); nothing ran" >&2; exit 2 ;;
esac
source ci/listening.sh  # free_port: a port no socket holds, below the ephemeral range
export FI_TCP_IFACE=lo

# ---- 1. Open MPI ---------------------------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's own wire-up stays on loopback too.
MPI=(mpirun --oversubscribe -np 4 --mca btl self --mca oob_tcp_if_include lo)
want mpi && for prov in shm tcp; do
  echo "=== mpirun -np 4 rdma-bench run --provider $prov --pattern all-to-all" >&2
  timeout 120 "${MPI[@]}" "$B" run --provider "$prov" --pattern all-to-all \
    --rendezvous "127.0.0.1:$(free_port)" "${ARGS[@]}" > "$TMP/mpi-$prov.out" ||
    fail "mpirun over $prov (rc $?)"
  cat "$TMP/mpi-$prov.out"
  grep -q "4 ranks (Open MPI)" "$TMP/mpi-$prov.out" || fail "mpirun $prov: no 4-rank table"
  grep -q "every byte verified" "$TMP/mpi-$prov.out" || fail "mpirun $prov: not verified"
done
# The UCX backend: its shared memory, and its tcp held to lo (NET_DEVICES=lo).
want mpi && for prov in sm tcp; do
  dev=(); [ "$prov" = tcp ] && dev=(--devices lo)
  echo "=== mpirun -np 4 rdma-bench run --backend ucx --provider $prov ${dev[*]} --pattern all-to-all" >&2
  timeout 120 "${MPI[@]}" "$B" run --backend ucx --provider "$prov" "${dev[@]}" \
    --pattern all-to-all --rendezvous "127.0.0.1:$(free_port)" "${ARGS[@]}" \
    > "$TMP/mpi-ucx-$prov.out" || fail "mpirun over ucx:$prov (rc $?)"
  cat "$TMP/mpi-ucx-$prov.out"
  grep -q "all-to-all write over ucx/$prov: 4 ranks (Open MPI)" "$TMP/mpi-ucx-$prov.out" ||
    fail "mpirun ucx:$prov: no 4-rank table over ucx"
  grep -q "every byte verified" "$TMP/mpi-ucx-$prov.out" || fail "mpirun ucx:$prov: not verified"
done

if want kill; then
echo "=== mpirun -np 4, rank 2 killed mid-run" >&2
# Each rank's shell records how its rdma-bench ended; rank 2's kills its own after 3 s. The
# shells exit normally, and mpirun is told not to end the job itself on a non-zero exit:
# what ends the other ranks is rdma-bench's own abort. Should rank 2 die before it joined
# (a slow start), rank 0 names it ("rank 2 of 4 to join") when the rendezvous times out
# (10 s here) and lingers at most as long for late ranks: still within the bound below. The
# times come from /proc/uptime, not the wall clock, which steps when this VM is paused and
# resumed (ci/kill-soak.sh says more).
set +e
timeout 60 "${MPI[@]}" --mca orte_abort_on_non_zero_status 0 sh -c '
  r=$OMPI_COMM_WORLD_RANK; out=$1; shift
  "$@" 2> "$out/kill-$r.err" &
  p=$!
  if [ "$r" = 2 ]; then sleep 3; kill -9 $p; cut -d" " -f1 /proc/uptime > "$out/killed-at"; fi
  wait $p; echo "$? $(cut -d" " -f1 /proc/uptime)" > "$out/kill-$r.rc"
  rm -f /dev/shm/"$p:$(id -u):"*' sh "$TMP" \
  "$B" run -v --provider shm --rendezvous "127.0.0.1:$(free_port)" --rendezvous-timeout 10 \
  -s 4K --pages 16 -n 100000000 --idle-timeout 3 > "$TMP/kill.out"
rc=$?
set -e
kill_report() {
  for r in 0 1 2 3; do
    echo "--- rank $r: $(cat "$TMP/kill-$r.rc" 2>/dev/null || echo 'no status')" >&2
    cat "$TMP/kill-$r.err" >&2 2>/dev/null || true
  done
  ps -eo pid,stat,etime,args | grep "[r]dma-bench run" >&2 || true
}
[ $rc -ne 124 ] || { kill_report; fail "killed rank: mpirun hung"; }
[ -s "$TMP/killed-at" ] || { kill_report; fail "killed rank: rank 2 was not killed (rc $rc)"; }
for r in 0 1 3; do
  cat "$TMP/kill-$r.err" >&2
  read -r code at < "$TMP/kill-$r.rc" || { kill_report; fail "killed rank: rank $r left no status"; }
  [ "$code" -ne 0 ] || fail "killed rank: rank $r exited 0"
  grep -q "rank 2" "$TMP/kill-$r.err" || fail "rank $r did not name rank 2"
  awk -v a="$at" -v k="$(cat "$TMP/killed-at")" 'BEGIN { exit !(a - k < 25) }' ||
    fail "rank $r took $(awk -v a="$at" -v k="$(cat "$TMP/killed-at")" 'BEGIN{print a-k}') s"
  echo "rank $r: exit $code, $(awk -v a="$at" -v k="$(cat "$TMP/killed-at")" 'BEGIN{printf "%.2f", a-k}') s after rank 2 was killed" >&2
done
fi
want slurm || { echo "launchers-test: $LAUNCHERS_ONLY passed" >&2; exit 0; }

# ---- 2. Slurm: one node, in a temp dir ------------------------------------------------------
echo "=== slurm: munged, slurmctld, slurmd (one node: localhost)" >&2
S=$TMP/slurm; mkdir -p "$S"/{state,spool,log,munge}; chmod 700 "$S/munge"
dd if=/dev/urandom of="$S/munge/key" bs=1024 count=1 status=none; chmod 400 "$S/munge/key"
munged --force -S "$S/munge/sock" --key-file "$S/munge/key" --pid-file "$S/munge/pid" \
  --log-file "$S/munge/log" --seed-file "$S/munge/seed" || fail "munged did not start"
PIDS+=("$(cat "$S/munge/pid")")
CPORT=$(free_port 2); DPORT=$((CPORT + 1))
cat > "$S/slurm.conf" <<EOF
ClusterName=rdmabench
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CPORT
SlurmdPort=$DPORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge/sock
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=10 State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF=$S/slurm.conf
# A daemon returns to the shell as it forks and writes its pid file later (after its plugins
# and socket): wait for the file, up to 30 s on a loaded box, rather than a fixed sleep.
pid_of() {
  for _ in $(seq 300); do [ -s "$S/$1.pid" ] && { cat "$S/$1.pid"; return 0; }; sleep 0.1; done
  fail "$1 wrote no pid file in 30 s: $(tail -5 "$S/log/$1.log")"
}
slurmctld -i || fail "slurmctld did not start: $(tail -5 "$S/log/slurmctld.log")"
PIDS+=("$(pid_of slurmctld)")
slurmd -N localhost || fail "slurmd did not start: $(tail -5 "$S/log/slurmd.log")"
PIDS+=("$(pid_of slurmd)")
for _ in $(seq 60); do
  sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)' && break; sleep 0.5
done
sinfo -h -o %t | grep -qE '^(idle|mix|alloc)' ||
  fail "the node did not come up: $(sinfo 2>&1; tail -5 "$S/log/slurmd.log")"

for pat in all-to-all incast; do
  echo "=== srun -n 4 rdma-bench run --provider shm --pattern $pat" >&2
  # Rank, size, local rank and rendezvous host (the step's first node) all from Slurm.
  timeout 120 srun -n 4 --overcommit --time=5 "$B" run --provider shm --pattern "$pat" \
    "${ARGS[@]}" > "$TMP/srun-$pat.out" || fail "srun $pat (rc $?)"
  cat "$TMP/srun-$pat.out"
  grep -q "4 ranks (Slurm)" "$TMP/srun-$pat.out" || fail "srun $pat: no 4-rank table"
  grep -q "every byte verified" "$TMP/srun-$pat.out" || fail "srun $pat: not verified"
done
echo "launchers-test: mpirun and srun passed" >&2
