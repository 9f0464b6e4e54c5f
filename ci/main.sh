#!/usr/bin/env bash
# The main job: set up, build, and run a real WRITE-with-immediate benchmark between two
# libfabric endpoints on the shm provider, with every byte verified. The binary has every
# backend (the defaults, libfabric and verbs, and ucx: ci/setup.sh installs libucx-dev).
#   ci/main.sh [rdma-bench loopback flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
cargo build --release -p bench-cli --bin rdma-bench --features ucx
exec "${CARGO_TARGET_DIR:-target}/release/rdma-bench" loopback "$@"
