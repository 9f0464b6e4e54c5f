#!/usr/bin/env bash
# Every test: formatting, clippy, the host test suite (libfabric shm/tcp conformance, topo
# fixtures, rdma-bench) against the system libfabric (Debian 12: 1.17), the transport-efa and
# rdma-bench suites again against libfabric 2.1.0 and 2.6.0 (built once from
# ../shared/libfabric and cached by ci/libfabric.sh), rdma-bench run under mpirun and srun,
# a short kill soak (ci/kill-soak.sh), then the verbs tests inside a Soft-RoCE VM and
# rdma-bench run between two of them.
#   ci/test.sh                              all of it
#   SKIP_VM=1 ci/test.sh                    everything but the VMs
#   LIBFABRIC_VERSIONS="2.6.0" ci/test.sh   another set of libfabric releases ("" for none)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_VM:-}" ] || export SETUP_VM=1
export SETUP_TEST=1
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
  step "libfabric $v: build (cached), then the transport-efa and rdma-bench tests"
  if [ ! -f ../shared/libfabric/libfabric-$v.tar.xz ] && [ -z "${LIBFABRIC_SRC:-}" ]; then
    echo "libfabric $v: SKIPPED, no ../shared/libfabric/libfabric-$v.tar.xz beside the checkout"
    continue
  fi
  prefix=$(ci/libfabric.sh "$v")
  PKG_CONFIG_PATH=$prefix/lib/pkgconfig LD_LIBRARY_PATH=$prefix/lib \
    LIBFABRIC_EXPECT=${v%.*} \
    cargo test --target-dir "${CARGO_TARGET_DIR:-target}-lf-$v" -p transport-efa -p bench-cli
done
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
