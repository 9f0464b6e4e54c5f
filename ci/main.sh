#!/usr/bin/env bash
# The main job: set up, build, and run a real WRITE-with-immediate benchmark between two
# libfabric endpoints on the shm provider, with every byte verified.
#   ci/main.sh [rdma-bench loopback flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
cargo build --release -p bench-cli --bin rdma-bench
exec "${CARGO_TARGET_DIR:-target}/release/rdma-bench" loopback "$@"
