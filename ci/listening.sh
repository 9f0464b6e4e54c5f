# Sourced by scripts that start a server and then its client (ci/verbs-2vm-test.sh,
# transport-ucx/shims-test.sh, and inside the VM by ci/compare-ref-vm.sh's run.sh: POSIX sh,
# busybox's awk).
#
# listening PORT: a TCP socket listens on PORT, on any local address (/proc/net/tcp and tcp6,
# state 0A). It probes without connecting, so a server that takes one peer is not taken.
listening() {
  # tcp6 may be absent (no IPv6): that is no error, under pipefail either.
  { cat /proc/net/tcp; cat /proc/net/tcp6 2>/dev/null || true; } |
    awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p {f = 1}
      END {exit !f}'
}
