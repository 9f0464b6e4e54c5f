#!/usr/bin/env bash
# Every test: formatting, clippy, the host test suite (libfabric shm/tcp conformance, topo
# fixtures, rdma-bench), then the verbs tests inside a Soft-RoCE VM.
#   ci/test.sh            all of it
#   SKIP_VM=1 ci/test.sh  everything but the VM
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_VM:-}" ] || export SETUP_VM=1
source ci/setup.sh
t0=$SECONDS
step() { echo; echo "==> $* ($((SECONDS - t0)) s)"; }

step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo test (host)"
cargo test --workspace
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
step "rdma-bench run under mpirun and srun (ci/launchers-test.sh)"
ci/launchers-test.sh
if [ -z "${SKIP_VM:-}" ]; then
  step "verbs tests inside the Soft-RoCE VM"
  ci/verbs-vm-test.sh
fi
step "all tests passed"
