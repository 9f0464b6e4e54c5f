# Sourced by scripts that start a server and then its client (ci/verbs-2vm-test.sh,
# ci/compare-ref.sh, ci/gpu-host.sh, ci/gpu-host-ucx.sh, ci/gpu-efa-sim.sh,
# transport-ucx/shims-test.sh, callgrind.sh, compare.sh and compare-tag.sh, and inside the VM
# by ci/compare-ref-vm.sh's run.sh: POSIX sh, busybox's awk).
#
# listening PORT: a TCP socket listens on PORT, on any local address (/proc/net/tcp and tcp6,
# state 0A). It probes without connecting, so a server that takes one peer is not taken.
listening() {
  # tcp6 may be absent (no IPv6): that is no error, under pipefail either.
  { cat /proc/net/tcp; cat /proc/net/tcp6 2>/dev/null || true; } |
    awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p {f = 1}
      END {exit !f}'
}

# wait_listening PORT SECONDS: until a TCP socket listens on PORT, probing every tenth of a
# second, at most SECONDS; fails if none does (Debian 12's busybox, in the VM, sleeps
# fractions of a second too).
wait_listening() {
  _w=0
  while [ "$_w" -lt $(($2 * 10)) ]; do
    listening "$1" && return 0
    sleep 0.1
    _w=$((_w + 1))
  done
  listening "$1"
}
