#!/usr/bin/env bash
# Install what the project needs on Debian 12, only where it is missing. Idempotent.
# Sourced by ci/main.sh and ci/test.sh; exports LIBCLANG_PATH.
set -euo pipefail

PKGS=(build-essential pkg-config libhwloc-dev libudev-dev libibverbs-dev libucx-dev libclang-16-dev
      clang-16 xz-utils)
# Debian's libfabric (1.17), unless another is to be used (docs/install.md): on an EFA host the
# EFA installer's. RDMA_BENCH_LIBFABRIC=PREFIX (e.g. /opt/amazon/efa) puts PREFIX/lib64 (where it
# has pkgconfig/libfabric.pc, else PREFIX/lib) first in PKG_CONFIG_PATH and LD_LIBRARY_PATH and
# PREFIX/bin first in PATH; neither that nor a libfabric >= 1.17 that pkg-config already finds
# gets Debian's libfabric-dev and libfabric-bin beside it (libfabric-bin would bring Debian's
# libfabric.so.1 into /usr, where the loader finds it whenever LD_LIBRARY_PATH is unset).
LIBFABRIC_PKGS=(libfabric-dev libfabric-bin)
if [ -n "${RDMA_BENCH_LIBFABRIC:-}" ]; then
  lf_lib=
  for d in lib64 lib; do
    if [ -f "$RDMA_BENCH_LIBFABRIC/$d/pkgconfig/libfabric.pc" ]; then lf_lib=$RDMA_BENCH_LIBFABRIC/$d; break; fi
  done
  if [ -z "$lf_lib" ]; then
    echo "setup: RDMA_BENCH_LIBFABRIC=$RDMA_BENCH_LIBFABRIC has neither lib64/pkgconfig/libfabric.pc nor lib/pkgconfig/libfabric.pc; on an EFA host it is /opt/amazon/efa (see docs/install.md)" >&2
    exit 1
  fi
  export PKG_CONFIG_PATH=$lf_lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$lf_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ ! -d "$RDMA_BENCH_LIBFABRIC/bin" ] || export PATH=$RDMA_BENCH_LIBFABRIC/bin:$PATH
  LIBFABRIC_PKGS=()
  echo "setup: libfabric from $lf_lib (RDMA_BENCH_LIBFABRIC); not installing Debian's libfabric-dev, libfabric-bin" >&2
elif command -v pkg-config >/dev/null && pkg-config --atleast-version=1.17 libfabric 2>/dev/null &&
     ! dpkg-query -W -f='${Status}' libfabric-dev 2>/dev/null | grep -q "install ok installed"; then
  LIBFABRIC_PKGS=()
  echo "setup: pkg-config finds libfabric $(pkg-config --modversion libfabric) ($(pkg-config --variable=libdir libfabric)); not installing Debian's libfabric-dev, libfabric-bin" >&2
fi
PKGS+=("${LIBFABRIC_PKGS[@]}")
# The Soft-RoCE VM (ci/vm): qemu and the tools that build its initramfs.
# iproute2 and perftest: their libraries (libmnl, libibumad, libpci...) are copied into the
# VM from this machine; ucx-utils: ucx_info and ucx_perftest, which ci/vm/ucx-share.sh copies in
# beside UCX.
# librdmacm-dev: the verbs provider of the libfabric that ci/compare-ref.sh's fi-verbs row builds.
VM_PKGS=(qemu-system-x86 busybox-static cpio kmod xz-utils binutils iproute2 perftest ucx-utils
         librdmacm-dev)
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
