# Sourced: ucx_into_share DIR [TOOL...] copies this host's UCX (Debian's libucx0, 1.13.1) into
# a VM share: libucp/uct/ucs/ucm and what they need that the VM's rdma-core userspace lacks into
# DIR/lib, the modules libuct_ib, libuct_rdmacm and libuct_cma into DIR/lib/ucx (give the VM
# UCX_MODULE_DIR=/mnt/host/lib/ucx), and each TOOL (ucx_info, ucx_perftest: ucx-utils) into
# DIR/bin. Used by ci/ucx-vm-test.sh and ci/compare-ref.sh. Returns 1, with the reason on
# stderr, when a piece is missing.
ucx_into_share() {
  local dir=$1 l p m t; shift
  mkdir -p "$dir/lib/ucx" "$dir/bin"
  # libgomp: ucx_perftest's OpenMP.
  for l in libucp.so.0 libuct.so.0 libucs.so.0 libucm.so.0 libnuma.so.1 libhwloc.so.15 \
      libudev.so.1 libgomp.so.1; do
    p=$(ucx_share_lib "$l")
    [ -n "$p" ] || { echo "ucx_into_share: $l not found (libucx0 installed?)" >&2; return 1; }
    cp -L "$p" "$dir/lib/"
  done
  # UCX loads its modules from the `ucx` directory beside libucs (and UCX_MODULE_DIR).
  m=$(dirname "$(ucx_share_lib libucs.so.0)")/ucx
  for l in libuct_ib.so.0 libuct_rdmacm.so.0 libuct_cma.so.0; do
    cp -L "$m/$l" "$dir/lib/ucx/" || { echo "ucx_into_share: no $m/$l" >&2; return 1; }
  done
  for t in "$@"; do
    p=$(command -v "$t") || { echo "ucx_into_share: no $t (ucx-utils)" >&2; return 1; }
    cp "$p" "$dir/bin/"
  done
}

# The x86-64 file of soname $1, from ldconfig.
ucx_share_lib() {
  ldconfig -p | awk -v l="$1" '$1 == l && /x86-64/ && !p {p = $NF} END {print p}'
}
