#!/usr/bin/env bash
# Whether a binary loads on the simulated device: every symbol it imports from
# libibverbs.so.1 or libefa.so.1, at its version (IBVERBS_1.1, EFA_1.2, ...), must be one the
# simulator's library exports at that version, or the dynamic linker refuses the binary
# ("undefined symbol: ibv_resize_cq, version IBVERBS_1.1"). Run under ci/efa-sim.sh:
#
#   ci/efa-sim.sh efa-sim/abi.sh target/release/rdma-bench [OTHER_BINARY ...]
#   ci/efa-sim.sh efa-sim/abi.sh --run RDMA_BENCH
#       and then run that rdma-bench (built with its default features, efa and verbs) as a
#       user would: a loopback over the efa provider verifies every byte, and the verbs
#       backend ends non-zero saying the device is EFA, without RC queue pairs
set -euo pipefail
RUN=
[ "${1:-}" = --run ] && { RUN=1; shift; }
[ $# -gt 0 ] || { echo "usage: efa-sim/abi.sh [--run] BINARY..." >&2; exit 2; }
lib_of() {
  local d
  IFS=: read -r -a dirs <<< "${LD_LIBRARY_PATH:-}"
  for d in "${dirs[@]}"; do [ -f "$d/$1" ] && { echo "$d/$1"; return; }; done
  echo "abi.sh: no $1 on LD_LIBRARY_PATH (run me under ci/efa-sim.sh)" >&2
  exit 2
}
exports=$(mktemp)
trap 'rm -f "$exports"' EXIT
for lib in libibverbs.so.1 libefa.so.1; do
  # "... DF .text ... IBVERBS_1.1 ibv_create_qp" (defined, with its version node)
  objdump -T "$(lib_of $lib)" | awk '$0 !~ /\*UND\*/ && NF >= 7 {v = $(NF-1); gsub(/[()]/, "", v); print $NF "@" v}'
done | sort -u > "$exports"
bad=0
for bin in "$@"; do
  imports=$(objdump -T "$bin" | awk '/\*UND\*/ && ($(NF-1) ~ /IBVERBS_|EFA_/) {v = $(NF-1); gsub(/[()]/, "", v); print $NF "@" v}' | sort -u)
  missing=$(comm -23 <(printf '%s\n' "$imports") "$exports" | grep . || true)
  n=$(printf '%s\n' "$imports" | grep -c . || true)
  if [ -n "$missing" ]; then
    echo "abi.sh: $bin imports $(echo "$missing" | wc -l) symbol(s) the simulator does not export:"
    echo "$missing" | sed 's/^/  /'
    bad=1
  else
    echo "abi.sh: $bin: all $n libibverbs/libefa symbols it imports are exported at their versions"
  fi
done
[ -n "$RUN" ] && [ $bad = 0 ] || exit $bad
B=$1
out=$(mktemp)
trap 'rm -f "$exports" "$out"' EXIT
timeout 300 "$B" loopback --provider efa -s 4K -n 3 > "$out" 2>&1 ||
  { cat "$out" >&2; echo "abi.sh: $B loopback --provider efa failed" >&2; exit 1; }
grep -q "every byte verified" "$out" || { cat "$out" >&2; echo "abi.sh: not verified" >&2; exit 1; }
echo "abi.sh: $B loopback --provider efa: every byte verified"
set +e
timeout 120 "$B" loopback --backend verbs -s 4K -n 3 > "$out" 2>&1
rc=$?
set -e
if [ $rc = 0 ] || [ $rc -ge 124 ] || ! grep -q "is an AWS EFA device" "$out" ||
   ! grep -q "IBV_QPT_RC): Operation not supported" "$out"; then
  cat "$out" >&2
  echo "abi.sh: the verbs backend should end non-zero saying the device is EFA (rc $rc)" >&2
  exit 1
fi
echo "abi.sh: $B loopback --backend verbs (rc $rc): $(grep -o 'rdmap[0-9a-z]* is an AWS EFA device[^;]*' "$out" | head -1)"
