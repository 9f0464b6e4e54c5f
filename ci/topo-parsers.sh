#!/usr/bin/env bash
# topo against both of hwloc's XML readers: its built-in minimal parser (what a
# --no-install-recommends install has) and libxml2 (Debian's libhwloc-plugins). Installs the
# plugin when missing, then runs topo's tests (which also force the built-in parser with
# HWLOC_LIBXML_IMPORT=0 and compare, and show live discovery leaving out the plugins' opencl and
# gl components) and `rdma-bench topo --xml` on the real dumps in
# ../shared/topologies/hwloc when present. CI runs it after ci/test.sh, in the fresh root that
# ci/test.sh ran in without the plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
if ! dpkg-query -W -f='${Status}' libhwloc-plugins 2>/dev/null | grep -q "install ok installed"; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "topo-parsers: installing libhwloc-plugins (hwloc's libxml2 reader)" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    libhwloc-plugins >&2
fi
# With the plugins, hwloc registers its opencl and gl components, and live discovery must
# leave both out (topo's tests/live.rs: without this it checks only those it finds).
TOPO_EXPECT_SKIPPED=opencl,gl cargo test -p topo
cargo build -p bench-cli --bin rdma-bench
BIN=${CARGO_TARGET_DIR:-target}/debug/rdma-bench
n=0
for f in ../shared/topologies/hwloc/*.xml; do
  [ -f "$f" ] || continue
  case "$f" in *hwloc-testsuite*) continue ;; esac # an hwloc 3.x export: refused by design
  for libxml in 1 0; do
    HWLOC_LIBXML_IMPORT=$libxml "$BIN" topo --xml "$f" --json >/dev/null ||
      { echo "topo-parsers: rdma-bench topo failed on $f (HWLOC_LIBXML_IMPORT=$libxml)" >&2; exit 1; }
  done
  n=$((n + 1))
done
if [ $n -eq 0 ]; then
  # No dump read is not a pass: under CI (which has ../shared) it fails, elsewhere it says so.
  echo "topo-parsers: not run: no real dumps in ../shared/topologies/hwloc (topo's own tests ran)" >&2
  [ -z "${CI:-}" ] || { echo "topo-parsers: FAILED: CI=1 expects the real dumps" >&2; exit 1; }
  exit 0
fi
echo "topo-parsers: $n real dumps load with both readers"
