#!/usr/bin/env python3
"""Device-file lines for the PCI tree of an instance, from its hwloc XML export.

    python3 efa-sim/devices/from-hwloc.py TOPOLOGY.xml

Prints, in PCI order, one `device NAME ADDR numa=N bridges=B1/B2/...` line per EFA NIC
(an OpenFabrics OS device, rdmapNsM) and one `pci ADDR class=C vendor=V device=D numa=N
bridges=...` line per GPU, where `bridges` are the PCI bridges above the function, root port
first, as the dump records them. The simulator builds its sysfs tree from these lines
(devices/pci0000:BB/B1/B2/.../ADDR), so code that walks sysfs to pair NICs with GPUs finds
the instance's PCIe switches. Only addresses and ids are taken from the dump (never commit a
dump itself: shared/topologies holds them); efa-sim/devices/p5's lines came from
shared/topologies/hwloc/aws-p5.48xlarge.8xH100-32xEFA.nixl.hwloc2.xml.
"""
import sys
import xml.etree.ElementTree as ET


def walk(obj, numa, bridges, out):
    t = obj.get("type")
    if t == "Package" and obj.get("os_index") is not None:
        numa = int(obj.get("os_index"))
    busid = obj.get("pci_busid")
    if t == "Bridge" and busid and obj.get("bridge_type", "").startswith("1-"):
        bridges = bridges + [busid]
    if t == "PCIDev" and busid:
        cls, ids = obj.get("pci_type", "0000 [0000:0000]").split()[:2]
        vendor, device = ids.strip("[]").split(":")
        rdma = [o.get("name") for o in obj.iter("object")
                if o.get("type") == "OSDev" and o.get("osdev_type") == "3"]
        path = "/".join(bridges)
        if rdma and vendor == "1d0f":
            out.append((busid, f"device {rdma[0]} {busid} numa={numa} bridges={path}"))
        elif cls[:2] == "03" and vendor in ("10de", "1002"):
            out.append((busid, f"pci {busid} class=0x{cls}00 vendor=0x{vendor} device=0x{device} "
                               f"numa={numa} bridges={path}"))
    for child in obj.findall("object"):
        walk(child, numa, bridges, out)


def main():
    root = ET.parse(sys.argv[1]).getroot()
    out = []
    for top in root.findall("object"):
        walk(top, 0, [], out)
    for _, line in sorted(out):
        print(line)


if __name__ == "__main__":
    main()
