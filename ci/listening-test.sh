#!/usr/bin/env bash
# ci/listening.sh's free_port never names a port that a socket holds: one listening, a
# connection's local end, and one in TIME_WAIT (the socket that closed first keeps its port for
# a minute), the three a server's bind can meet. Run by ci/test.sh.
set -u
cd "$(dirname "$0")/.."
source ci/listening.sh
bad=0
fail() { echo "listening-test: $*" >&2; bad=1; }
base=$(FREE_PORTS="10000 30000" free_port 4) || { echo "listening-test: no 4 free ports" >&2; exit 1; }
ready=$(mktemp) && rm -f "$ready"
# base listens; base+1 is a live connection's local end (to base); base+2's connection closed
# on this side first, so base+2 sits in TIME_WAIT. base+3 stays free for TCP, and a UDP
# socket holds it (ci/verbs-2vm-test.sh's datagram wire asks free_port for UDP ports).
python3 - "$base" "$ready" <<'PY' &
import socket, sys, time
b, ready = int(sys.argv[1]), sys.argv[2]
lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", b)); lst.listen(4)
def conn(port):
    c = socket.socket(); c.bind(("127.0.0.1", port)); c.connect(("127.0.0.1", b))
    return c, lst.accept()[0]
live = conn(b + 1)
c, s = conn(b + 2); c.close(); time.sleep(0.2); s.close()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind(("127.0.0.1", b + 3))
open(ready, "w").close()
time.sleep(600)  # killed below, once the checks ran (a loaded box may take more than 30 s)
PY
holder=$!
for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.1; done
[ -e "$ready" ] || fail "the python holder did not get ready"
states=$(for p in 0 1 2; do
  awk -v p="$(printf ':%04X' $((base + p)))" 'substr($2, length($2) - 4) == p {print $4; exit}' /proc/net/tcp
done | paste -sd,)
[ "$states" = "0A,01,06" ] || fail "ports $base..$((base + 2)) are in states $states, want 0A,01,06 (listen, established, time-wait)"
for _ in $(seq 50); do
  got=$(FREE_PORTS="$base $((base + 3))" free_port) || got=none
  [ "$got" = $((base + 3)) ] || { fail "free_port in $base..$((base + 3)) named $got, want $((base + 3)), the only free one"; break; }
done
got=$(FREE_PORTS="$base $((base + 4))" free_port 2) || got=none
[ "$got" = $((base + 3)) ] || fail "free_port 2 in $base..$((base + 4)) named $got, want $((base + 3))"
# A refusal names what was asked on stderr, so that callers need say nothing more.
err=$(FREE_PORTS="$base $((base + 2))" free_port 2>&1 >/dev/null) && fail "free_port in $base..$((base + 2)), all held, named a port"
[ "$err" = "free_port: no 1 free tcp port(s) in a row in $base..$((base + 2))" ] || fail "free_port's refusal said: $err"
err=$(FREE_PORTS="$((base + 3)) $((base + 3))" free_port 1 udp 2>&1 >/dev/null) && fail "free_port 1 udp named $((base + 3)), which a UDP socket holds"
[ "$err" = "free_port: no 1 free udp port(s) in a row in $((base + 3))..$((base + 3))" ] || fail "free_port's udp refusal said: $err"
got=$(free_port) || got=none
eph=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
{ [ "$got" -ge 10000 ] && [ "$got" -lt "$eph" ]; } 2>/dev/null || fail "free_port named $got, not in 10000..$((eph - 1))"
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null; rm -f "$ready"
[ $bad = 0 ] && echo "listening-test: free_port passed over a listening port, a connection's and one in TIME_WAIT (50 tries), found a pair, refused a full range and a UDP port held (saying so), and stays below the ephemeral range ($eph)"
exit $bad
