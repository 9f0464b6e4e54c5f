#!/usr/bin/env bash
# Every test: formatting, clippy, the host test suite (libfabric shm/tcp conformance, topo
# fixtures, rdma-bench) against the system libfabric (Debian 12: 1.17), the transport-efa and
# rdma-bench suites again against libfabric 2.1.0 and 2.6.0 (built once from
# ../shared/libfabric and cached by ci/libfabric.sh), libfabric's fabtests, the efa
# conformance suite and rdma-bench on the simulated EFA device (ci/efa-sim.sh, cached),
# rdma-bench run under mpirun and srun, a short kill soak (ci/kill-soak.sh), then the verbs
# tests inside a Soft-RoCE VM and rdma-bench run between two of them.
#   ci/test.sh                              all of it
#   SKIP_VM=1 ci/test.sh                    everything but the VMs
#   LIBFABRIC_VERSIONS="2.6.0" ci/test.sh   another set of libfabric releases ("" for none)
#   SKIP_EFA_SIM=1 ci/test.sh               without the simulated EFA device step (ci/efa-sim.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_VM:-}" ] || export SETUP_VM=1
export SETUP_TEST=1
[ -n "${SKIP_EFA_SIM:-}" ] || export SETUP_EFA_SIM=1
source ci/setup.sh
t0=$SECONDS
step() { echo; echo "==> $* ($((SECONDS - t0)) s)"; }

step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo test (host, libfabric $(pkg-config --modversion libfabric))"
LIBFABRIC_EXPECT=$(pkg-config --modversion libfabric | cut -d. -f1,2) cargo test --workspace
step "ci/compare-ref.sh --quick (smoke: every host row runs on both sides)"
RT=0 RDMA_BENCH=${CARGO_TARGET_DIR:-target}/debug/rdma-bench ci/compare-ref.sh --quick --json |
  jq -e '.rows | length == 4 and all(.ours_gbps > 0 and .ref_gbps > 0)' >/dev/null
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
for v in ${LIBFABRIC_VERSIONS-2.1.0 2.6.0}; do
  step "libfabric $v: build (cached), then the transport-efa, bench-coord (its docs example) and rdma-bench tests"
  if [ ! -f ../shared/libfabric/libfabric-$v.tar.xz ] && [ -z "${LIBFABRIC_SRC:-}" ]; then
    echo "libfabric $v: SKIPPED, no ../shared/libfabric/libfabric-$v.tar.xz beside the checkout"
    continue
  fi
  prefix=$(ci/libfabric.sh "$v")
  PKG_CONFIG_PATH=$prefix/lib/pkgconfig LD_LIBRARY_PATH=$prefix/lib \
    LIBFABRIC_EXPECT=${v%.*} \
    cargo test --target-dir "${CARGO_TARGET_DIR:-target}-lf-$v" -p transport-efa -p bench-coord -p bench-cli
done
if [ -n "${SKIP_EFA_SIM:-}" ]; then
  echo "efa-sim: SKIPPED (SKIP_EFA_SIM)"
elif [ ! -f ../shared/libfabric/libfabric-2.6.0.tar.xz ] && [ -z "${LIBFABRIC_SRC:-}" ]; then
  echo "efa-sim: SKIPPED, no ../shared/libfabric/libfabric-2.6.0.tar.xz beside the checkout"
else
  step "efa-sim: build (cached), then libfabric's fabtests and the efa conformance suite on the simulated EFA device"
  ci/efa-sim.sh --build-only
  # Out of order, with RNR: the fabtests verify their data (-v) through it, and each test's
  # processes report that the knobs acted (efa-sim/stats.sh).
  EFA_SIM_REORDER=16 EFA_SIM_DELAY_US=100 EFA_SIM_RNR_PERMILLE=10 ci/efa-sim.sh efa-sim/fabtests.sh
  # The conformance suite and the hardware-readiness checks on the efa and efa-direct
  # fabrics: on a device with unsolicited write receive, on one without (efa-direct then
  # needs FI_RX_CQ_DATA), and on p5's 32 NICs (matching by PCI address). The conformance
  # files turn reordering and delay on themselves: --expect-knobs checks they acted.
  SIMT=${CARGO_TARGET_DIR:-target}-efa-sim
  for devs in minimal minimal-nouwr; do
    CARGO_TARGET_DIR=$SIMT CONFORMANCE_REQUIRE_DEVICE=1 ci/efa-sim.sh --devices $devs \
      --expect-knobs "reorder delay_us" \
      cargo test -p transport-efa --test conformance_efa --test conformance_efa_device_rdma \
      --test efa_readiness
  done
  CARGO_TARGET_DIR=$SIMT CONFORMANCE_REQUIRE_DEVICE=1 ci/efa-sim.sh --devices p5 \
    cargo test -p transport-efa --test efa_readiness
  # rdma-bench: 32 NICs with the p5 topology; a lost WRITE caught; every workload out of
  # order on both fabrics; mpirun all-to-all and a killed rank named.
  CARGO_TARGET_DIR=$SIMT ci/efa-sim.sh --devices p5 efa-sim/rdma-bench.sh p5
  CARGO_TARGET_DIR=$SIMT ci/efa-sim.sh efa-sim/rdma-bench.sh lost-write
  CARGO_TARGET_DIR=$SIMT ci/efa-sim.sh efa-sim/rdma-bench.sh workloads
  SETUP_LAUNCHERS=1 source ci/setup.sh
  CARGO_TARGET_DIR=$SIMT ci/efa-sim.sh efa-sim/rdma-bench.sh ranks
  # The device as strict as the hardware (efa-sim/README.md): code that breaks on EFA must
  # break here (a send buffer reused before its completion, a buffer polled by its last byte,
  # LL128-style polling without the 128-byte in-order capability, a region freed while
  # registered, a key of another PD or process, a CQ sized too small, a QP destroyed with work
  # in flight, a wrong QP attribute mask), and p5's 128-byte capability is granted and kept.
  ci/efa-sim.sh efa-sim/hazards.sh
  ci/efa-sim.sh --devices p5 efa-sim/hazards.sh poll-128
  ci/efa-sim.sh efa-sim-inorder128 --expect no
  ci/efa-sim.sh --devices p5 efa-sim-inorder128 --expect yes
  # p5's PCIe switches in the simulated sysfs, as in its dump; two simulated p5 hosts (same
  # NICs, other GIDs) with rdma-bench between them.
  ci/efa-sim.sh --devices p5 efa-sim/topology.sh pcie
  CARGO_TARGET_DIR=$SIMT ci/efa-sim.sh --devices p5 efa-sim/topology.sh two-hosts
  # The binary a user ships (default features: efa and verbs; the host build's, whose
  # libibverbs imports are the release build's) loads on the simulated device, runs over efa,
  # and its verbs backend says the device is EFA, without RC queue pairs.
  ci/efa-sim.sh efa-sim/abi.sh --run "${CARGO_TARGET_DIR:-target}/debug/rdma-bench"
fi
step "rdma-bench run under mpirun and srun (ci/launchers-test.sh)"
ci/launchers-test.sh
step "kill soak, short: 6 trials per mode and provider on libfabric $(pkg-config --modversion libfabric) (ci/kill-soak.sh)"
ci/kill-soak.sh --trials 6 --versions 1.17
if [ -z "${SKIP_VM:-}" ]; then
  step "verbs tests inside the Soft-RoCE VM"
  ci/verbs-vm-test.sh
  step "rdma-bench run over verbs between two Soft-RoCE VMs (ci/verbs-2vm-test.sh)"
  ci/verbs-2vm-test.sh
fi
step "all tests passed"
