#!/usr/bin/env bash
# Every test: formatting, clippy, the host test suite (libfabric shm/tcp conformance, topo
# fixtures, rdma-bench) against the system libfabric (Debian 12: 1.17), the transport-efa and
# rdma-bench suites again against libfabric 2.1.0 and 2.6.0 (built once from
# ../shared/libfabric and cached by ci/libfabric.sh), libfabric's fabtests, the efa
# conformance suite and rdma-bench on the simulated EFA device (ci/efa-sim.sh, cached),
# rdma-bench run under mpirun and srun, a short kill soak (ci/kill-soak.sh), then the VM's boot
# watchdog (ci/vm/watchdog-test.sh), the verbs tests inside a Soft-RoCE VM, UCX over rc_verbs
# there, rdma-bench run between two of them, and the three stacks on one Soft-RoCE link, each
# against its own tool (compare-ref's VM rows, one size, one round: a smoke test, no figure to
# quote).
#   ci/test.sh                              all of it
#   SKIP_VM=1 ci/test.sh                    everything but the VMs
#   LIBFABRIC_VERSIONS="2.6.0" ci/test.sh   another set of libfabric releases ("" for none)
#   SKIP_EFA_SIM=1 ci/test.sh               without the simulated EFA device step (ci/efa-sim.sh)
#
# Each step runs to its end whatever the others did; the last line counts the steps that
# passed, failed and did not run, and names those that did not run; above it, the last 40
# lines (FAILED_TAIL) each failed step printed. A step that did not run
# is not a pass: under CI=1 (.ci/run sets it) a step CI is expected to run that did not (a
# SKIP_* variable, a missing tarball, a shorter LIBFABRIC_VERSIONS) fails the run. The GPU
# tests run only on the GPU host (ci/gpu-host.sh run); they are listed as not run here.
# Test cases that skipped inside a step (no efa device in the host suite, no CUDA, ...; each
# notes itself through transport_core::skip into RDMA_BENCH_SKIP_LOG) are counted per step
# and by reason.
# Exit status: 0 when no step failed (and, under CI=1, every step CI expects ran); 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_VM:-}" ] || export SETUP_VM=1
export SETUP_TEST=1
[ -n "${SKIP_EFA_SIM:-}" ] || export SETUP_EFA_SIM=1
set -e
source ci/setup.sh
set +e
case ${CI:-} in "" | 0 | false) CI_RUN= ;; *) CI_RUN=1 ;; esac
t0=$SECONDS
# Disk. A CI host's disk is small (a run ran out of it installing the efa-sim build), and
# every step builds a target of its own. Line tables only (backtraces keep file:line; callgrind
# keeps function names) and no incremental cache make the workspace's test build 1.3 GB instead
# of 3.3 GB (measured on this tree), and the targets a step builds for itself
# (each libfabric release's, the simulated device's) go once their steps are done, under CI=1 or
# TIDY=1. Each step's header says how much is free; a step that failed with under 1 GB free
# says so in the summary.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
TIDY=${TIDY:-$CI_RUN}
TD=${CARGO_TARGET_DIR:-target}
mkdir -p "$TD"
free_kb() { df -Pk "$TD" | awk 'NR == 2 {print $4}'; }
human() { awk -v k="$1" 'BEGIN {printf "%.1f GB", k / 1048576}'; }
FREE_START=$(free_kb) FREE_LOW=$(free_kb)
tidy() { # tidy DIR...: remove a step's own target directory (CI=1 or TIDY=1)
  [ -z "$TIDY" ] || rm -rf "$@"
}
PASSED=() FAILED=() FAILED_OUT=() NOT_RUN=() NOT_RUN_WHY=() MUST_RUN=() CASE_SKIPS=()
RDMA_BENCH_SKIP_LOG=$(mktemp /tmp/ci-test-skips.XXXXXX)
export RDMA_BENCH_SKIP_LOG
STEP_LOGS=$(mktemp -d /tmp/ci-test-steps.XXXXXX)
trap 'rm -rf "$RDMA_BENCH_SKIP_LOG" "$STEP_LOGS"' EXIT

# step NAME CMD [ARGS...]: run CMD (a function or a command) in a subshell with errexit on.
step() {
  local name=$1 rc before free
  shift
  free=$(free_kb)
  [ "$free" -ge "$FREE_LOW" ] || FREE_LOW=$free
  echo
  echo "==> $name ($((SECONDS - t0)) s, $(human "$free") free)"
  before=$(wc -l <"$RDMA_BENCH_SKIP_LOG")
  # The step's output goes to the log as before and into a file of its own too, through a
  # tee the step does not wait for (a VM or daemon the step leaves running may hold the pipe).
  local out
  out=$(mktemp "$STEP_LOGS/step.XXXXXX")
  exec 3>&1 4>&2 > >(tee -a "$out") 2>&1
  (set -e; "$@")
  rc=$?
  exec 1>&3 2>&4 3>&- 4>&-
  free=$(free_kb)
  [ "$free" -ge "$FREE_LOW" ] || FREE_LOW=$free
  if [ $rc -eq 0 ]; then
    PASSED+=("$name")
  else
    local why="exit $rc"
    [ "$free" -ge 1048576 ] || why+="; disk nearly full: $(human "$free") free"
    FAILED+=("$name ($why)")
    FAILED_OUT+=("$out")
    echo "==> FAILED: $name ($why)"
  fi
  # Test cases that noted a skip during this step, by reason.
  local skips
  skips=$(tail -n +"$((before + 1))" "$RDMA_BENCH_SKIP_LOG" | cut -f2 | sort | uniq -c |
    awk '{n = $1; $1 = ""; printf "%s%d %s", (NR > 1 ? ", " : ""), n, substr($0, 2)}')
  [ -z "$skips" ] || CASE_SKIPS+=("$name: $skips")
}
# not_run NAME WHY [ci]: a step that did not run; "ci" where CI is expected to run it.
not_run() {
  echo
  echo "==> NOT RUN: $1: $2"
  NOT_RUN+=("$1")
  NOT_RUN_WHY+=("$2")
  [ "${3:-}" != ci ] || MUST_RUN+=("$1")
}

step "cargo fmt --check" cargo fmt --all --check
step "cargo clippy" cargo clippy --workspace --all-targets --features bench-cli/ucx -- -D warnings
host_tests() {
  LIBFABRIC_EXPECT=$(pkg-config --modversion libfabric | cut -d. -f1,2) cargo test --workspace --features bench-cli/ucx
}
step "cargo test (host, libfabric $(pkg-config --modversion libfabric))" host_tests
compare_quick() {
  RT=0 RDMA_BENCH=${CARGO_TARGET_DIR:-target}/debug/rdma-bench ci/compare-ref.sh --quick --json |
    jq -e '.rows | length == 4 and all(.ours_gbps > 0 and .ref_gbps > 0 and .median_ratio > 0)' >/dev/null
}
step "ci/compare-ref.sh --quick (smoke: every host row runs on both sides)" compare_quick
step "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
step "the compare scripts' 1.5x suspect rule (ci/suspect.sh)" bash ci/suspect.sh
step "free_port passes over ports that sockets hold, in any state (ci/listening-test.sh)" bash ci/listening-test.sh
step "the UCX comparisons' shims: placed and written buffers, ucp-time on ucx_perftest and rdma-bench (transport-ucx/shims-test.sh)" \
  env RDMA_BENCH="${CARGO_TARGET_DIR:-target}/debug/rdma-bench" transport-ucx/shims-test.sh

lf_tests() {
  local v=$1 prefix
  prefix=$(ci/libfabric.sh "$v")
  PKG_CONFIG_PATH=$prefix/lib/pkgconfig LD_LIBRARY_PATH=$prefix/lib \
    LIBFABRIC_EXPECT=${v%.*} \
    cargo test --target-dir "$TD-lf-$v" -p transport-efa -p bench-coord -p bench-cli
}
have_tarball() { [ -f "../shared/libfabric/libfabric-$1.tar.xz" ] || [ -n "${LIBFABRIC_SRC:-}" ]; }
CI_VERSIONS="2.1.0 2.6.0"
VERSIONS=${LIBFABRIC_VERSIONS-$CI_VERSIONS}
for v in $VERSIONS; do
  name="libfabric $v: the transport-efa, bench-coord (its docs example) and rdma-bench tests"
  if have_tarball "$v"; then
    step "$name" lf_tests "$v"
    tidy "$TD-lf-$v"
  else
    not_run "$name" "no ../shared/libfabric/libfabric-$v.tar.xz beside the checkout" ci
  fi
done
for v in $CI_VERSIONS; do
  [[ " $VERSIONS " == *" $v "* ]] ||
    not_run "libfabric $v tests" "not in LIBFABRIC_VERSIONS=\"$VERSIONS\"" ci
done

# The simulated EFA device: its steps, in order (name, then command).
SIMT=${CARGO_TARGET_DIR:-target}-efa-sim
sim_conformance() {
  # The conformance suite and the hardware-readiness checks on the efa and efa-direct
  # fabrics: on a device with unsolicited write receive, on one without (efa-direct then
  # needs FI_RX_CQ_DATA), and on p5's 32 NICs (matching by PCI address). The conformance
  # files turn reordering and delay on themselves: --expect-knobs checks they acted.
  CARGO_TARGET_DIR=$SIMT CONFORMANCE_REQUIRE_DEVICE=1 ci/efa-sim.sh --devices "$1" \
    --expect-knobs "reorder delay_us" \
    cargo test -p transport-efa --test conformance_efa --test conformance_efa_device_rdma \
    --test efa_readiness
}
sim_proxy() {
  # transport-proxy (issue 27): a CPU producer's commands through the proxy ring on efa and
  # efa-direct, out of order and late; every byte verified; data, fence, flag.
  CARGO_TARGET_DIR=$SIMT CONFORMANCE_REQUIRE_DEVICE=1 ci/efa-sim.sh \
    --expect-knobs "reorder delay_us" cargo test -p transport-proxy --test proxy_efa
}
sim_readiness_p5() {
  CARGO_TARGET_DIR=$SIMT CONFORMANCE_REQUIRE_DEVICE=1 ci/efa-sim.sh --devices p5 \
    cargo test -p transport-efa --test efa_readiness
}
sim_fabtests() {
  # Out of order, with RNR: the fabtests verify their data (-v) through it, and each test's
  # processes report that the knobs acted (efa-sim/stats.sh).
  EFA_SIM_REORDER=16 EFA_SIM_DELAY_US=100 EFA_SIM_RNR_PERMILLE=10 ci/efa-sim.sh efa-sim/fabtests.sh
}
sim_bench() { # sim_bench [--devices D] MODE
  CARGO_TARGET_DIR=$SIMT ci/efa-sim.sh "$@"
}
# The device as strict as the hardware (efa-sim/README.md): code that breaks on EFA must
# break here (a send buffer reused before its completion, a buffer polled by its last byte,
# LL128-style polling without the 128-byte in-order capability, a region freed while
# registered, a key of another PD or process, a CQ sized too small, a QP destroyed with work
# in flight, a wrong QP attribute mask), and p5's 128-byte capability is granted and kept.
sim_hazards() {
  ci/efa-sim.sh efa-sim/hazards.sh
  ci/efa-sim.sh --devices p5 efa-sim/hazards.sh poll-128
  ci/efa-sim.sh efa-sim-inorder128 --expect no
  ci/efa-sim.sh --devices p5 efa-sim-inorder128 --expect yes
}
# The binary a user ships (default features: efa and verbs; the host build's, whose
# libibverbs imports are the release build's) loads on the simulated device, runs over efa,
# and its verbs backend says the device is EFA, without RC queue pairs.
sim_abi() { ci/efa-sim.sh efa-sim/abi.sh --run "${CARGO_TARGET_DIR:-target}/debug/rdma-bench"; }
sim_ranks() {
  SETUP_LAUNCHERS=1 source ci/setup.sh
  CARGO_TARGET_DIR=$SIMT ci/efa-sim.sh efa-sim/rdma-bench.sh ranks
}
SIM_STEPS=(
  "efa-sim: build (cached)" "ci/efa-sim.sh --build-only"
  "efa-sim: libfabric's fabtests, out of order and with RNR" sim_fabtests
  "efa-sim: efa conformance and readiness, device minimal" "sim_conformance minimal"
  "efa-sim: efa conformance and readiness, device minimal-nouwr" "sim_conformance minimal-nouwr"
  "efa-sim: readiness on p5's 32 NICs" sim_readiness_p5
  "efa-sim: transport-proxy's ring and proxy, out of order" sim_proxy
  # rdma-bench: 32 NICs with the p5 topology; a lost WRITE caught; every workload out of
  # order on both fabrics; mpirun all-to-all and a killed rank named.
  "efa-sim: rdma-bench on p5's 32 NICs" "sim_bench --devices p5 efa-sim/rdma-bench.sh p5"
  "efa-sim: rdma-bench catches a lost WRITE" "sim_bench efa-sim/rdma-bench.sh lost-write"
  "efa-sim: rdma-bench, every workload out of order" "sim_bench efa-sim/rdma-bench.sh workloads"
  "efa-sim: rdma-bench run under mpirun, a killed rank named" sim_ranks
  "efa-sim: the strict device's hazards (reuse, last byte, freed region, other PD, CQ overflow, teardown, 128-byte order)" sim_hazards
  "efa-sim: GPU memory without a GPU (no CUDA: dmabuf refused, host memory as before; a stand-in libcuda: registration by address and dmabuf, CUDA copies synchronised before completions; the GPU host runs it on CUDA: ci/gpu-efa-sim.sh)" "ci/efa-sim.sh efa-sim/gpu.sh"
  # p5's PCIe switches in the simulated sysfs, as in its dump; two simulated p5 hosts (same
  # NICs, other GIDs) with rdma-bench between them.
  "efa-sim: p5's PCIe switches pair each GPU with its NICs" "ci/efa-sim.sh --devices p5 efa-sim/topology.sh pcie"
  "efa-sim: rdma-bench between two simulated p5 hosts" "sim_bench --devices p5 efa-sim/topology.sh two-hosts"
  "efa-sim: the default rdma-bench binary loads; its verbs backend names the EFA device" sim_abi
)
sim_skip=
if [ -n "${SKIP_EFA_SIM:-}" ]; then
  sim_skip="SKIP_EFA_SIM is set"
elif ! have_tarball 2.6.0; then
  sim_skip="no ../shared/libfabric/libfabric-2.6.0.tar.xz beside the checkout"
fi
for ((i = 0; i < ${#SIM_STEPS[@]}; i += 2)); do
  name=${SIM_STEPS[i]}
  if [ -n "$sim_skip" ]; then
    not_run "$name" "$sim_skip" ci
    continue
  fi
  # shellcheck disable=SC2086
  step "$name" ${SIM_STEPS[i + 1]}
  if [ $i -eq 0 ] && [[ " ${PASSED[*]} " != *" $name "* ]]; then
    sim_skip="the efa-sim build failed"
  fi
done
tidy "$SIMT"

step "rdma-bench run under mpirun and srun (ci/launchers-test.sh)" ci/launchers-test.sh
step "kill soak, short: 6 trials per mode and provider on libfabric $(pkg-config --modversion libfabric) and UCX $(pkg-config --modversion ucx) (ci/kill-soak.sh)" \
  ci/kill-soak.sh --trials 6 --versions 1.17 --ucx "sm tcp all"
# Every VM row runs ours and its tool and reads a figure from both (UCX's summary showing
# rc_verbs for the ucx-rc row, or that row reads 0): 16 MiB a run, TCG-bound, no figure to quote.
vm_rows() {
  VM_BYTES=$((16 << 20)) ci/compare-ref.sh --rows verbs,fi-verbs,ucx-rc --sizes 64K --rounds 1 \
    --mode plain --json |
    jq -e '.rows | length == 3 and all(.ours_gbps > 0 and .ref_gbps > 0 and .median_ratio > 0)' >/dev/null
}
# The two-VM test's second boot: vm0's first boot never starts its init; the test must end
# it, boot both again, pass, and say so.
vm2_hang() {
  local log
  log=$(mktemp /tmp/vm2-hang.XXXXXX)
  local rc=0
  VM2_HANG_FIRST=0 SOFTROCE_BOOT_TIMEOUT=30 ci/verbs-2vm-test.sh 2>&1 | tee "$log" || rc=$?
  grep -q "the pair was booted twice: vm0 hung at boot the first time" "$log" ||
    { echo "vm2_hang: the test did not say it booted the pair twice"; [ $rc -ne 0 ] || rc=1; }
  rm -f "$log"
  return $rc
}
step "run-vm.sh's exit status against stand-in qemus: a qemu that failed, a guest that wrote no status, is 125, never a pass (ci/vm/exit-status-test.sh)" \
  ci/vm/exit-status-test.sh
for s in "the Soft-RoCE VM's boot watchdog: a guest whose init never starts is ended, shown, booted once more, reported (ci/vm/watchdog-test.sh)|ci/vm/watchdog-test.sh" \
         "verbs tests inside the Soft-RoCE VM|ci/verbs-vm-test.sh" \
         "UCX over rc_verbs inside the Soft-RoCE VM: conformance, doctor, rdma-bench (ci/ucx-vm-test.sh)|ci/ucx-vm-test.sh" \
         "rdma-bench run over verbs between two Soft-RoCE VMs|ci/verbs-2vm-test.sh" \
         "the same when vm0 hangs at boot: the pair is booted again and passes (VM2_HANG_FIRST=0 ci/verbs-2vm-test.sh)|vm2_hang" \
         "three stacks on one Soft-RoCE link, each against its own tool: verbs and ib_write_bw, libfabric verbs;ofi_rxm and fi_rma_bw, UCX rc_verbs and ucx_perftest (ci/compare-ref.sh's VM rows, a smoke test)|vm_rows"; do
  if [ -n "${SKIP_VM:-}" ]; then
    not_run "${s%%|*}" "SKIP_VM is set" ci
  elif [ "${s#*|}" = vm_rows ] && ! have_tarball 2.6.0; then
    not_run "${s%%|*}" "no libfabric 2.6.0 tarball for the fi-verbs row (../shared/libfabric)" ci
  else
    step "${s%%|*}" "${s#*|}"
  fi
done
# A server whose clients die during UCX's wire-up: UCX built with assertions aborts it over rc
# before 1.14, over tcp (which wires rc up on Soft-RoCE) before the bound the doctor warns by
# (TCP_WIREUP_PURGE_SINCE in transport-ucx/src/probe.rs, read from there; known-limits).
ucx_v=$(pkg-config --modversion ucx 2>/dev/null || true)
since=$(sed -nE 's/^const TCP_WIREUP_PURGE_SINCE: \(u32, u32\) = \(([0-9]+), ([0-9]+)\);.*/\1.\2/p' \
  transport-ucx/src/probe.rs)
wireup="UCX over rc_verbs: 30 clients killed during wire-up, the server survives each (WIREUP_KILLS=30 ci/ucx-vm-test.sh)"
if [ -z "$since" ]; then
  step "$wireup: its UCX bound, TCP_WIREUP_PURGE_SINCE, is in transport-ucx/src/probe.rs" false
elif [ -n "${SKIP_VM:-}" ]; then
  not_run "$wireup" "SKIP_VM is set"
elif [ -n "${UCX_SHARE_LIB:-}" ] ||
     { [ -n "$ucx_v" ] && [ "$(printf '%s\n' "$since" "$ucx_v" | sort -V | head -n1)" = "$since" ]; }; then
  step "$wireup" env WIREUP_KILLS=30 ci/ucx-vm-test.sh
else
  not_run "$wireup" "UCX ${ucx_v:-(none)} here aborts there, as UCX before $since built with assertions can (docs/known-limits.md); UCX_SHARE_LIB=<a UCX $since+ lib dir> runs it"
fi
# Never run here: no GPU. The GPU host runs them with REQUIRE_CUDA_PROVIDER=1.
not_run "GPU tests (transport-efa gpu, gpu_ipc; bench-core's GPU buffers)" \
  "no GPU on a CI host; ci/gpu-host.sh run on the GPU host runs them"

FAILED_TAIL=${FAILED_TAIL:-40}
# ---- summary -----------------------------------------------------------------------------------
echo
echo "==> summary ($((SECONDS - t0)) s; disk: $(human "$FREE_START") free at the start, $(human "$FREE_LOW") at the lowest)"
for s in "${PASSED[@]}"; do echo "  passed   $s"; done
for s in "${FAILED[@]}"; do echo "  FAILED   $s"; done
for i in "${!NOT_RUN[@]}"; do echo "  not run  ${NOT_RUN[i]}: ${NOT_RUN_WHY[i]}"; done
for s in "${CASE_SKIPS[@]}"; do echo "  test cases skipped in $s"; done
join() { local out= s; for s in "$@"; do out+=${out:+; }$s; done; echo "$out"; }
verdict=PASSED
[ ${#FAILED[@]} -eq 0 ] || verdict=FAILED
ci_note=
if [ -n "$CI_RUN" ] && [ ${#MUST_RUN[@]} -gt 0 ]; then
  verdict=FAILED
  ci_note="; under CI=1 these must run: $(join "${MUST_RUN[@]}")"
fi
# What a failed step printed last, again here: whoever reads only the end of the log (a CI
# page showing its tail) sees why, not only that.
for i in "${!FAILED[@]}"; do
  echo "==> the last $FAILED_TAIL lines of: ${FAILED[i]}"
  tail -n "$FAILED_TAIL" "${FAILED_OUT[i]}" | cut -c1-400
done
not_run_names=$(join "${NOT_RUN[@]}")
echo "ci/test.sh: ${#PASSED[@]} passed, ${#FAILED[@]} failed, ${#NOT_RUN[@]} not run${not_run_names:+ ($not_run_names)}$ci_note: $verdict"
[ "$verdict" = PASSED ]
