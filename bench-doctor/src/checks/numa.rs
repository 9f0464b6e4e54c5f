//! NUMA placement: whether each GPU has an RDMA NIC on its NUMA node, from the topology
//! (hwloc) where there is one, else from the sysfs NUMA nodes.

use super::{check, short_list};
use crate::report::{Check, Status};
use crate::sys::Facts;

pub(crate) fn numa(f: &Facts, topo: Option<&topo::Topology>) -> Vec<Check> {
    if let Some(t) = topo.filter(|t| !t.gpus().is_empty()) {
        return vec![numa_topo(f, t)];
    }
    // Fallback: sysfs NUMA nodes of the GPUs and RDMA NICs.
    let gpus = f.gpus();
    if gpus.is_empty() {
        return vec![check(
            "numa.nic",
            Status::Skip,
            "no GPU: nearest-NIC placement does not apply",
            None,
        )];
    }
    if f.ib.is_empty() {
        return vec![check(
            "numa.nic",
            Status::Skip,
            "no RDMA NIC to place next to the GPUs",
            None,
        )];
    }
    let nic_numa: Vec<Option<u32>> =
        f.ib.iter()
            .map(|d| {
                d.pci
                    .as_ref()
                    .and_then(|a| f.pci.get(a))
                    .and_then(|p| p.numa)
            })
            .collect();
    // A NIC of unknown node may be on any GPU's node: a GPU with no NIC known to be on its
    // node is then not compared, rather than called far.
    let nic_unknown = nic_numa.contains(&None);
    let mut far = Vec::new();
    let mut unknown = Vec::new();
    for g in &gpus {
        let Some(n) = g.numa else {
            unknown.push(format!("GPU {}", g.addr));
            continue;
        };
        if nic_numa.contains(&Some(n)) {
            continue;
        }
        if nic_unknown {
            unknown.push(format!("GPU {} (NUMA {n}; a NIC's node unknown)", g.addr));
        } else {
            far.push(format!("GPU {} (NUMA {n})", g.addr));
        }
    }
    if far.is_empty() && unknown.len() == gpus.len() {
        // Nothing was compared: an Ok here would vouch for a placement nobody checked.
        check_vec(
            "numa.nic",
            Status::Skip,
            format!(
                "no GPU's NUMA node could be compared with its NICs', a node unknown (sysfs \
                 numa_node -1 on the GPUs or NICs: a host of one NUMA node, or firmware that \
                 names none): {}",
                short_list(&unknown)
            ),
            Some("on a host of several sockets, check the BIOS's NUMA setting (and its ACPI SRAT); `rdma-bench topo` shows the layout"),
        )
    } else if far.is_empty() {
        let of = if unknown.is_empty() {
            String::new()
        } else {
            format!(
                "; not compared, a NUMA node unknown: {}",
                short_list(&unknown)
            )
        };
        check_vec(
            "numa.nic",
            Status::Ok,
            format!(
                "every GPU compared has an RDMA NIC on its NUMA node ({} of {} GPU(s), from \
                 sysfs{of})",
                gpus.len() - unknown.len(),
                gpus.len()
            ),
            None,
        )
    } else {
        check_vec(
            "numa.nic",
            Status::Warn,
            format!("no RDMA NIC on the NUMA node of {}: traffic crosses the CPU interconnect", short_list(&far)),
            Some("use the NIC nearest each GPU (`rdma-bench topo`); check BIOS NUMA settings and that no NIC is missing"),
        )
    }
}

fn check_vec(id: &str, s: Status, m: String, fix: Option<&str>) -> Vec<Check> {
    vec![check(id, s, m, fix)]
}

fn numa_topo(f: &Facts, t: &topo::Topology) -> Check {
    let nic_numa = |name: &str| {
        t.numa_groups()
            .iter()
            .find(|g| g.nics.iter().any(|n| n.name == name))
            .and_then(|g| g.numa)
    };
    let want = f.instance.map(|i| i.nics_per_gpu()).unwrap_or(0.0);
    let (mut none, mut cross, mut few, mut unknown) = (vec![], vec![], vec![], vec![]);
    for g in t.gpus() {
        if g.nics.is_empty() {
            none.push(format!("GPU {}", g.index));
            continue;
        }
        if (g.nics.len() as f64) + 1e-9 < want.floor().max(1.0) && want >= 1.0 {
            few.push(format!("GPU {}: {} of {want}", g.index, g.nics.len()));
        }
        // A GPU of unknown NUMA node: its NICs' nodes were compared with nothing.
        if g.numa.is_none() {
            unknown.push(format!("GPU {}", g.index));
            continue;
        }
        let same = g
            .nics
            .iter()
            .filter(|n| nic_numa(&n.name) == g.numa)
            .count();
        // None of its NICs known to be on its node, and one of unknown node: that one may
        // be, so the GPU was not compared rather than crossing.
        if same == 0 && g.nics.iter().any(|n| nic_numa(&n.name).is_none()) {
            unknown.push(format!("GPU {} (its NICs' node unknown)", g.index));
            continue;
        }
        if same == 0 {
            cross.push(format!(
                "GPU {} (NUMA {}) -> {}",
                g.index,
                g.numa.map_or("-".into(), |n| n.to_string()),
                g.nic_names().join(",")
            ));
        }
    }
    let n = t.gpus().len();
    let any_nic = !t.all_nics().is_empty();
    if !any_nic {
        return check(
            "numa.nic",
            Status::Skip,
            format!("{n} GPU(s), no RDMA NIC in the topology"),
            None,
        );
    }
    if !none.is_empty() {
        return check(
            "numa.nic",
            Status::Fail,
            format!("no RDMA NIC near {} (topo)", short_list(&none)),
            Some("a NIC is missing or unassigned: compare `rdma-bench topo` with the instance layout"),
        );
    }
    if !cross.is_empty() {
        return check(
            "numa.nic",
            Status::Warn,
            format!("cross-NUMA NIC: {}", short_list(&cross)),
            Some("pin each GPU's traffic to NICs on its NUMA node (`rdma-bench topo` lists them)"),
        );
    }
    if !few.is_empty() {
        return check(
            "numa.nic",
            Status::Warn,
            format!(
                "GPUs with fewer NICs than the instance has per GPU: {}",
                short_list(&few)
            ),
            Some("a NIC is missing: see rdma.count"),
        );
    }
    let per = t.gpus().iter().map(|g| g.nics.len()).min().unwrap_or(0);
    if unknown.len() == n {
        // Nothing was compared: an Ok here would vouch for a placement nobody checked.
        return check(
            "numa.nic",
            Status::Skip,
            format!(
                "no GPU's NUMA node could be compared with its NICs', a node unknown to the \
                 topology ({n} GPU(s), each with its nearest NIC(s), {per} per GPU): {}",
                short_list(&unknown)
            ),
            Some("on a host of several sockets, check the BIOS's NUMA setting (and its ACPI SRAT); `rdma-bench topo` shows the layout"),
        );
    }
    let of = if unknown.is_empty() {
        String::new()
    } else {
        format!(
            "; not compared, a NUMA node unknown: {}",
            short_list(&unknown)
        )
    };
    check(
        "numa.nic",
        Status::Ok,
        format!(
            "each of {} GPU(s) compared has its nearest NIC(s) on its NUMA node ({per} per GPU, \
             topo{of})",
            n - unknown.len()
        ),
        None,
    )
}
