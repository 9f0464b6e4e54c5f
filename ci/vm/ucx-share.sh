# Sourced: ucx_into_share DIR [TOOL...] copies this host's UCX (Debian's libucx0, 1.13.1) into
# a VM share: libucp/uct/ucs/ucm and what they need that the VM's rdma-core userspace lacks into
# DIR/lib, the modules libuct_ib, libuct_rdmacm and libuct_cma into DIR/lib/ucx (give the VM
# UCX_MODULE_DIR=/mnt/host/lib/ucx), and each TOOL (ucx_info, ucx_perftest: ucx-utils) into
# DIR/bin. Used by ci/ucx-vm-test.sh and ci/compare-ref-vm.sh. Returns 1, with the reason on
# stderr, when a piece is missing. UCX_SHARE_LIB=DIR takes another UCX built with verbs (its
# lib directory: libucp... and ucx/libuct_ib...; its tools from DIR/../bin) instead of Debian's.
source "$(dirname "${BASH_SOURCE[0]}")/../host-libs.sh"

ucx_into_share() {
  local dir=$1 l p m t; shift
  mkdir -p "$dir/lib/ucx" "$dir/bin"
  # libgomp: ucx_perftest's OpenMP.
  local ucx=${UCX_SHARE_LIB:-}
  host_libs_into "$dir/lib" libnuma.so.1 libhwloc.so.15 libudev.so.1 libgomp.so.1 ||
    { echo "ucx_into_share: libnuma, libhwloc, libudev, libgomp installed?" >&2; return 1; }
  if [ -n "$ucx" ]; then
    for l in libucp.so.0 libuct.so.0 libucs.so.0 libucm.so.0; do
      cp -L "$ucx/$l" "$dir/lib/" || { echo "ucx_into_share: no $ucx/$l" >&2; return 1; }
    done
  else
    host_libs_into "$dir/lib" libucp.so.0 libuct.so.0 libucs.so.0 libucm.so.0 ||
      { echo "ucx_into_share: libucx0 installed?" >&2; return 1; }
  fi
  # UCX loads its modules from the `ucx` directory beside libucs (and UCX_MODULE_DIR).
  m=${ucx:-$(dirname "$(host_lib libucs.so.0)")}/ucx
  for l in libuct_ib.so.0 libuct_rdmacm.so.0 libuct_cma.so.0; do
    cp -L "$m/$l" "$dir/lib/ucx/" || { echo "ucx_into_share: no $m/$l" >&2; return 1; }
  done
  for t in "$@"; do
    if [ -n "$ucx" ]; then p=$ucx/../bin/$t; [ -x "$p" ] || p=
    else p=$(command -v "$t"); fi
    [ -n "$p" ] || { echo "ucx_into_share: no $t (ucx-utils, or beside UCX_SHARE_LIB)" >&2; return 1; }
    cp "$p" "$dir/bin/"
  done
}
