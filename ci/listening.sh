# Sourced by scripts that start a server and then its client (ci/verbs-2vm-test.sh,
# ci/compare-ref.sh, ci/gpu-host.sh, ci/gpu-host-ucx.sh, ci/gpu-efa-sim.sh,
# transport-ucx/shims-test.sh, callgrind.sh, compare.sh and compare-tag.sh, and inside the VM
# by ci/compare-ref-vm.sh's run.sh: POSIX sh, busybox's awk), and by every script that picks
# a port for a server of its own (free_port).
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

# free_port [N [PROTO]]: a port P such that no socket of PROTO (tcp by default, or udp), in any
# state, holds one of P..P+N-1 (N is 1 by default), picked at random in FREE_PORTS ("LOW
# HIGH"; by default 10000 to just below the kernel's ephemeral range). A port that a connection
# of anyone's took as its local end cannot be bound, even with SO_REUSEADDR, while that socket
# lives (TIME_WAIT included): a random port in 20000-39999 met one in CI and failed the
# fabtests' server with "bind: Address already in use". Random, so that two scripts side by
# side seldom pick the same one. Where 1000 tries found none free it says so on stderr and
# fails, so a caller needs only `|| exit 1` (ci/listening-test.sh).
free_port() {
  { cat "/proc/net/${2:-tcp}"; cat "/proc/net/${2:-tcp}6" 2>/dev/null || true; } |
    awk -v n="${1:-1}" -v seed="$(od -An -N4 -tu4 /dev/urandom)" -v range="${FREE_PORTS:-}" -v proto="${2:-tcp}" \
      -v eph="$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)" '
      { k = split($2, a, ":"); if (k > 1) used[a[k]] = 1 }
      END {
        if (split(range, r, " ") == 2) { lo = r[1] + 0; hi = r[2] + 0 }
        else { eph += 0; if (eph < 12000) eph = 32768; lo = 10000; hi = eph - 1 }
        srand(seed + 0)
        for (t = 0; t < 1000 && hi - lo + 1 >= n; t++) {
          p = lo + int(rand() * (hi - lo + 2 - n)); ok = 1
          for (i = 0; i < n; i++) if (sprintf("%04X", p + i) in used) { ok = 0; break }
          if (ok) { print p; exit 0 }
        }
        printf "free_port: no %d free %s port(s) in a row in %d..%d\n", n, proto, lo, hi > "/dev/stderr"
        exit 1
      }'
}
