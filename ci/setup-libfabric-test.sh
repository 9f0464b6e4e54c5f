#!/usr/bin/env bash
# ci/setup.sh with RDMA_BENCH_LIBFABRIC: Debian's libfabric stays off the machine and the named
# prefix is the one pkg-config and the loader see (docs/install.md, "Which libfabric").
# Meant for a fresh root, where Debian's libfabric is not installed beforehand:
#   FRESH_ROOT_DIR=/var/tmp/rdma-bench-setup-test ci/fresh-root.sh ci/setup-libfabric-test.sh
# On a machine that has Debian's libfabric already, the "not installed" checks only say that
# setup did not add it.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "setup-libfabric-test: FAILED: $*" >&2; exit 1; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# A stand-in for the EFA installer's prefix, laid out as on Amazon Linux (lib64) and as on
# Ubuntu (lib).
fake=$(mktemp -d /tmp/fake-efa.XXXXXX)
trap 'rm -rf "$fake"' EXIT
pc() { # pc DIR VERSION
  mkdir -p "$1/pkgconfig"
  printf 'prefix=%s\nlibdir=%s\nincludedir=%s/include\n\nName: libfabric\nDescription: stand-in\nVersion: %s\nLibs: -L${libdir} -lfabric\nCflags: -I${includedir}\n' \
    "$fake" "$1" "$fake" "$2" > "$1/pkgconfig/libfabric.pc"
}
pc "$fake/lib64" 2.99.1
pc "$fake/lib" 2.99.0
mkdir -p "$fake/bin"

before_dev=no; installed libfabric-dev && before_dev=yes
before_bin=no; installed libfabric-bin && before_bin=yes

out=$(RDMA_BENCH_LIBFABRIC=$fake bash -c '
  source ci/setup.sh
  echo "version=$(pkg-config --modversion libfabric)"
  echo "ld=${LD_LIBRARY_PATH%%:*}"
  echo "path=${PATH%%:*}"') || fail "ci/setup.sh failed with RDMA_BENCH_LIBFABRIC=$fake"
echo "$out"
grep -qx "version=2.99.1" <<<"$out" || fail "pkg-config does not find the prefix's lib64 libfabric.pc first"
grep -qx "ld=$fake/lib64" <<<"$out" || fail "LD_LIBRARY_PATH does not start with $fake/lib64"
grep -qx "path=$fake/bin" <<<"$out" || fail "PATH does not start with $fake/bin"
if [ "$before_dev" = no ] && installed libfabric-dev; then fail "setup installed Debian's libfabric-dev"; fi
if [ "$before_bin" = no ] && installed libfabric-bin; then fail "setup installed Debian's libfabric-bin"; fi

# lib only (Ubuntu's layout).
rm -rf "$fake/lib64"
v=$(RDMA_BENCH_LIBFABRIC=$fake bash -c 'source ci/setup.sh >/dev/null; pkg-config --modversion libfabric') ||
  fail "ci/setup.sh failed with a lib-only prefix"
[ "$v" = 2.99.0 ] || fail "lib-only prefix: pkg-config found $v, not 2.99.0"

# A prefix without libfabric.pc is an error that says what to set.
rm -rf "$fake/lib"
if err=$(RDMA_BENCH_LIBFABRIC=$fake bash -c 'source ci/setup.sh' 2>&1); then
  fail "ci/setup.sh accepted a prefix without libfabric.pc"
fi
grep -q "/opt/amazon/efa" <<<"$err" || fail "the error does not name /opt/amazon/efa: $err"
echo "setup-libfabric-test: PASSED (libfabric-dev before/after: $before_dev/$(installed libfabric-dev && echo yes || echo no))"
