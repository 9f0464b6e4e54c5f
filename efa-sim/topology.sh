#!/usr/bin/env bash
# The simulated device's machine, as code that walks sysfs sees it; run under ci/efa-sim.sh:
#
#   ci/efa-sim.sh --devices p5 efa-sim/topology.sh pcie
#       walks $SYSFS_PATH as NCCL and aws-ofi-nccl do (class/infiniband/NAME/device resolved
#       to its PCI path; the GPUs from bus/pci/devices by class) and pairs each GPU with the
#       NICs under its PCIe switch (their deepest common ancestor is a bridge, not the host
#       bridge); the pairs must be the instance's, by the same rule on its hwloc dump
#       (shared/topologies, read at test time; else the device file's topology fixture)
#   ci/efa-sim.sh --devices p5 efa-sim/topology.sh two-hosts
#       two simulated hosts with the same NICs (names, PCI addresses) and different GIDs
#       (EFA_SIM_HOST=1 and 2): each host sees its own GIDs, and rdma-bench runs between
#       them (server on one, client on the other, 8 GPUs x 4 NICs, every byte verified)
#
# RDMA_BENCH: the binary for two-hosts (default: built as efa-sim/rdma-bench.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: efa-sim/topology.sh pcie|two-hosts}
[ -n "${EFA_SIM_DEVICES:-}" ] || { echo "run me under ci/efa-sim.sh" >&2; exit 2; }
if [ "$MODE" = two-hosts ] && [ -z "${RDMA_BENCH:-}" ]; then
  td=${CARGO_TARGET_DIR:-target-efa-sim}
  cargo build -q -p bench-cli --no-default-features --features efa --target-dir "$td"
  RDMA_BENCH=$td/debug/rdma-bench
fi
B=${RDMA_BENCH:-}
TMP=$(mktemp -d /tmp/efa-sim-topo.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "efa-sim/topology.sh $MODE: FAILED: $*" >&2; exit 1; }

case $MODE in
pcie)
  fixture=${RDMA_BENCH_TOPOLOGY:?run with a device file that names its topology (--devices p5)}
  inst=$(basename "$fixture" .xml)
  dump=$(ls ../shared/topologies/hwloc/aws-"$inst".*.xml 2>/dev/null | head -1 || true)
  xml=${dump:-$fixture}
  # The simulator lays its sysfs tree out when a process first lists the devices.
  fi_info -p efa > /dev/null
  python3 - "$SYSFS_PATH" "$xml" <<'EOF'
import os, sys
import xml.etree.ElementTree as ET
root, xml = sys.argv[1], sys.argv[2]
def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
def pairs(nics, gpus):
    """GPU -> the NICs under its PCIe switch: their deepest common ancestor is a bridge, not
    the host bridge (more than one element of the chain in common)."""
    return {g: sorted(n for n, c in nics.items() if common(c, gc) > 1) for g, gc in gpus.items()}
# As NCCL walks sysfs: class/infiniband/NAME/device and the GPUs' bus/pci/devices entries,
# resolved, from the host bridge (pciDDDD:BB) down.
def chain(path):
    parts = os.path.realpath(path).split("/")
    i = next(i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p)
    return parts[i:]
nics = {n: chain(f"{root}/class/infiniband/{n}/device") for n in os.listdir(f"{root}/class/infiniband")}
gpus = {}
for addr in (os.listdir(f"{root}/bus/pci/devices") if os.path.isdir(f"{root}/bus/pci/devices") else []):
    if open(f"{root}/bus/pci/devices/{addr}/class").read().startswith("0x03"):
        gpus[addr] = chain(f"{root}/bus/pci/devices/{addr}")
if not gpus:
    sys.exit("no GPU in the simulated sysfs: nothing to pair the NICs with")
seen = pairs(nics, gpus)
# The same rule on the instance's dump: its host bridges and PCI bridges as the chain.
inics, igpus = {}, {}
def walk(o, chain):
    t = o.get("type")
    if t == "Bridge":
        chain = chain + [o.get("pci_busid") or "host:" + o.get("bridge_pci", "")]
    if t == "PCIDev":
        c = chain + [o.get("pci_busid")]
        rdma = [x.get("name") for x in o.iter("object") if x.get("type") == "OSDev" and x.get("osdev_type") == "3"]
        if rdma and "1d0f:" in o.get("pci_type", ""):
            inics[rdma[0]] = c
        elif o.get("pci_type", "").startswith("03") and ("10de:" in o.get("pci_type") or "1002:" in o.get("pci_type")):
            igpus[o.get("pci_busid")] = c
    for x in o.findall("object"):
        walk(x, chain)
walk(ET.parse(xml).getroot(), [])
want = pairs(inics, igpus)
if seen != want:
    bad = [g for g in sorted(want) if seen.get(g) != want[g]][:3]
    sys.exit(f"the simulated sysfs pairs GPUs and NICs unlike {xml}: "
             + "; ".join(f"GPU {g}: sysfs {seen.get(g)}, instance {want[g]}" for g in bad))
print(f"{len(gpus)} GPUs and {len(nics)} NICs: each GPU with the NICs under its PCIe switch "
      f"({', '.join(str(len(v)) for v in [next(iter(want.values()))])} each), as in {os.path.basename(xml)}")
EOF
  ;;
two-hosts)
  # Each host's GIDs: the same NIC on the two hosts must have two GIDs.
  for h in 1 2; do
    EFA_SIM_HOST=$h fi_info -p efa -f efa -v 2>/dev/null |
      awk '/src_addr:/ {a=$2} /name: rdmap.*-rdm/ && a {print $2, a; a=""}' | sort -u > "$TMP/gids-$h"
  done
  [ -s "$TMP/gids-1" ] || fail "fi_info listed no efa address"
  # Same NIC names on both hosts, no address in common.
  cmp -s <(cut -d' ' -f1 "$TMP/gids-1") <(cut -d' ' -f1 "$TMP/gids-2") ||
    fail "the two hosts do not have the same NICs"
  if [ -n "$(comm -12 <(cut -d' ' -f2 "$TMP/gids-1" | sort) <(cut -d' ' -f2 "$TMP/gids-2" | sort))" ]; then
    fail "the two hosts share GIDs: $(head -1 "$TMP/gids-1") / $(head -1 "$TMP/gids-2")"
  fi
  echo "two hosts, $(wc -l < "$TMP/gids-1") NICs each, each NIC with its own GID per host"
  port=$(source ci/listening.sh && free_port)
  EFA_SIM_HOST=1 timeout 300 "$B" server --provider efa --listen "127.0.0.1:$port" \
    --gpus 0-7 --nics-per-gpu 4 --sessions 1 > "$TMP/server" 2>&1 &
  server=$!
  sleep 1
  set +e
  EFA_SIM_HOST=2 timeout 300 "$B" client --provider efa --connect "127.0.0.1:$port" \
    --gpus 0-7 --nics-per-gpu 4 -s 4K -n 3 --verify -v > "$TMP/client" 2>&1
  rc=$?
  wait "$server"
  src=$?
  set -e
  [ $src = 0 ] || { cat "$TMP/server" >&2; fail "server (rc $src)"; }
  [ $rc = 0 ] || { cat "$TMP/client" "$TMP/server" >&2; fail "client between the hosts (rc $rc)"; }
  grep -q "every byte verified" "$TMP/client" || { cat "$TMP/client" >&2; fail "not verified"; }
  grep "GPU(s) x" "$TMP/client" || true
  echo "rdma-bench ran between the two simulated hosts"
  ;;
*) fail "unknown mode (pcie, two-hosts)" ;;
esac
