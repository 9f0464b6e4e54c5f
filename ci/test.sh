#!/usr/bin/env bash
# Every test: formatting, clippy, the host test suite (libfabric shm/tcp conformance, topo
# fixtures, rdma-bench), then the verbs tests inside a Soft-RoCE VM.
#   ci/test.sh            all of it
#   SKIP_VM=1 ci/test.sh  everything but the VM
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
step "cargo test (host)"
cargo test --workspace
step "ci/compare-ref.sh --quick (smoke: every host row runs on both sides)"
RT=0 RDMA_BENCH=${CARGO_TARGET_DIR:-target}/debug/rdma-bench ci/compare-ref.sh --quick --json |
  jq -e '.rows | length == 4 and all(.ours_gbps > 0 and .ref_gbps > 0)' >/dev/null
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
if [ -z "${SKIP_VM:-}" ]; then
  step "verbs tests inside the Soft-RoCE VM"
  ci/verbs-vm-test.sh
fi
step "all tests passed"
