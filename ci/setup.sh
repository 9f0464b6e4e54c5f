#!/usr/bin/env bash
# Install what the project needs on Debian 12, only where it is missing. Idempotent.
# Sourced by ci/main.sh and ci/test.sh; exports LIBCLANG_PATH.
set -euo pipefail

PKGS=(build-essential pkg-config libfabric-dev libfabric-bin libhwloc-dev libudev-dev
      libibverbs-dev libucx-dev libclang-16-dev clang-16 xz-utils)
# The Soft-RoCE VM (ci/vm): qemu and the tools that build its initramfs.
# iproute2 and perftest: their libraries (libmnl, libibumad, libpci...) are copied into the
# VM from this machine.
VM_PKGS=(qemu-system-x86 busybox-static cpio kmod xz-utils binutils iproute2 perftest)
# ci/test.sh only: the headless browser that opens rdma-bench's --report page
# (bench-cli/tests/outputs.rs; it skips without one), and jq for ci/compare-ref.sh --quick.
TEST_PKGS=(chromium jq)
# The launchers rdma-bench run is tested under (ci/launchers-test.sh): Open MPI and Slurm.
LAUNCHER_PKGS=(openmpi-bin slurmctld slurmd slurm-client munge python3)
# The simulated EFA device (ci/efa-sim.sh): what building rdma-core 56.1 needs, and apt's
# keyring for fetching its source from Debian 13.
EFA_SIM_PKGS=(cmake ninja-build python3 libnl-3-dev libnl-route-3-dev libudev-dev pkg-config
              debian-archive-keyring xz-utils)

want=()
for p in "${PKGS[@]}" ${SETUP_VM:+"${VM_PKGS[@]}"} ${SETUP_TEST:+"${TEST_PKGS[@]}"} \
         ${SETUP_LAUNCHERS:+"${LAUNCHER_PKGS[@]}"} ${SETUP_EFA_SIM:+"${EFA_SIM_PKGS[@]}"}; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || want+=("$p")
done
if [ ${#want[@]} -gt 0 ]; then
  echo "setup: installing ${want[*]}" >&2
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" >&2
fi
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
# bindgen (libfabric-sys, ibverbs-sys, ucx-sys) needs libclang; 16 is what we test with.
export LIBCLANG_PATH=${LIBCLANG_PATH:-/usr/lib/llvm-16/lib}
