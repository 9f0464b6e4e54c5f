//! Hardware-independent part: an [`Inventory`] of devices with their place in
//! the PCI tree, and the rules that turn it into a [`Topology`].
//!
//! One file: the inventory and the rules that read it are one unit, under 600 lines without tests.
//!
//! Rules (see the crate docs for the reasoning):
//!
//! 1. Every PCI bridge (switch port) that has GPUs below it is visited from
//!    the deepest to the shallowest; then every host bridge; then every NUMA
//!    node. At each place, the GPUs below it that have no NICs yet take the
//!    RDMA NICs below it: the ones no GPU took yet if there are any, else all
//!    of them (shared).
//! 2. Taking splits the NICs of each NIC model (PCI vendor:device) separately:
//!    with `k` NICs of a model and `g` GPUs, `k >= g` gives contiguous chunks
//!    in PCI order (sizes differ by at most one, earlier GPUs get the extra
//!    one); `k < g` gives GPU `i` the NIC `i % k` (round robin, shared).
//! 3. GPUs that found nothing keep an empty NIC list; NICs nobody took are
//!    unassigned.
//! 4. Cores: each NUMA node's cores are split into contiguous, disjoint
//!    chunks among its GPUs (in ordinal order). GPUs with unknown NUMA share
//!    the cores of the NUMA nodes that hold no GPU (all cores if none).

use crate::model::{nic_order, GpuGroup, Nic, NumaGroup, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A PCI function address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PciAddr {
    pub domain: u32,
    pub bus: u8,
    pub dev: u8,
    pub func: u8,
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.dev, self.func
        )
    }
}

impl PciAddr {
    /// Parse `dddd:bb:dd.f` (the domain may have more than 4 digits).
    pub fn parse(s: &str) -> Option<Self> {
        let (domain, rest) = s.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (dev, func) = rest.split_once('.')?;
        let hex = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_hexdigit());
        if !(hex(domain) && hex(bus) && hex(dev) && hex(func)) || bus.len() > 2 || dev.len() > 2 {
            return None;
        }
        Some(Self {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u8::from_str_radix(bus, 16).ok()?,
            dev: u8::from_str_radix(dev, 16).ok()?,
            func: u8::from_str_radix(func, 16).ok()?,
        })
    }
}

/// Kind of a place in the I/O tree where devices can meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum BridgeKind {
    /// A PCI-to-PCI bridge: a switch port or a root port.
    Pci,
    /// A host bridge (PCI root complex).
    Host,
}

/// One bridge above a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bridge {
    /// Unique id within the topology (hwloc's global persistent index).
    pub id: u64,
    pub kind: BridgeKind,
}

/// Where a device sits: its bridges (nearest first) and NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Location {
    pub bridges: Vec<Bridge>,
    pub numa: Option<u32>,
}

impl Location {
    fn has_bridge(&self, id: u64) -> bool {
        self.bridges.iter().any(|b| b.id == id)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct GpuDev {
    pub pci: PciAddr,
    pub vendor: u16,
    pub loc: Location,
}

#[derive(Debug, Clone)]
pub(crate) struct NicDev {
    pub name: String,
    pub pci: Option<PciAddr>,
    /// PCI vendor and device id of the NIC function (None for software
    /// devices): NICs of one model are split among GPUs separately.
    pub model: Option<(u16, u16)>,
    pub loc: Location,
}

impl NicDev {
    fn public(&self) -> Nic {
        Nic {
            name: self.name.clone(),
            pci: self.pci.map(|p| p.to_string()),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct NumaNode {
    pub os_index: u32,
    /// Physical cores (first PU OS index of each), sorted.
    pub cores: Vec<usize>,
}

/// Everything the grouping needs, from hwloc or from a test.
#[derive(Debug, Clone, Default)]
pub(crate) struct Inventory {
    pub gpus: Vec<GpuDev>,
    pub nics: Vec<NicDev>,
    /// NUMA nodes that have CPUs, any order.
    pub numa_nodes: Vec<NumaNode>,
    /// All usable cores of the machine, sorted.
    pub all_cores: Vec<usize>,
    pub warnings: Vec<String>,
}

/// A CUDA device as reported by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CudaDev {
    pub ordinal: usize,
    pub domain: u32,
    pub bus: u8,
    pub dev: u8,
}

/// GPU ordinals: CUDA ordinals for GPUs the driver reported (matched on
/// domain, bus and device number), then the others in PCI bus order. With no
/// CUDA list, or when no CUDA bus id matches a GPU (some VMs report zeros),
/// plain PCI bus order.
pub(crate) fn assign_ordinals(
    gpus: &[GpuDev],
    cuda: Option<&[CudaDev]>,
    warnings: &mut Vec<String>,
) -> Vec<usize> {
    let mut by_bus: Vec<usize> = (0..gpus.len()).collect();
    by_bus.sort_by_key(|&i| gpus[i].pci);
    let mut ordinals = vec![usize::MAX; gpus.len()];
    let mut matched = 0usize;
    if let Some(cuda) = cuda {
        for c in cuda {
            let hit = gpus.iter().enumerate().find(|(i, g)| {
                ordinals[*i] == usize::MAX
                    && g.vendor == NVIDIA
                    && g.pci.domain == c.domain
                    && g.pci.bus == c.bus
                    && g.pci.dev == c.dev
            });
            if let Some((i, _)) = hit {
                ordinals[i] = c.ordinal;
                matched += 1;
            }
        }
        if matched == 0 && !cuda.is_empty() && !gpus.is_empty() {
            warnings.push(
                "CUDA PCI bus ids match no GPU found by hwloc; GPU indices follow PCI bus order"
                    .to_string(),
            );
        }
    }
    if matched == 0 {
        for (rank, &i) in by_bus.iter().enumerate() {
            ordinals[i] = rank;
        }
        return ordinals;
    }
    let mut next = ordinals
        .iter()
        .filter(|&&o| o != usize::MAX)
        .max()
        .map_or(0, |m| m + 1);
    for &i in &by_bus {
        if ordinals[i] == usize::MAX {
            warnings.push(format!(
                "GPU {} is not visible to CUDA (CUDA_VISIBLE_DEVICES?); it was given index {next}",
                gpus[i].pci
            ));
            ordinals[i] = next;
            next += 1;
        }
    }
    ordinals
}

pub(crate) const NVIDIA: u16 = 0x10de;
pub(crate) const AMD: u16 = 0x1002;

/// Is this PCI function a GPU? Display-class (VGA 0x0300, 3D 0x0302, other
/// display 0x0380, which AMD Instinct parts use) from NVIDIA or AMD.
pub(crate) fn is_gpu(class: u16, vendor: u16) -> bool {
    matches!(class, 0x0300 | 0x0302 | 0x0380) && matches!(vendor, NVIDIA | AMD)
}

/// Apply the grouping rules. `ordinals[i]` is the index of `inv.gpus[i]`.
pub(crate) fn build(inv: Inventory, ordinals: &[usize]) -> Topology {
    let Inventory {
        gpus,
        mut nics,
        mut numa_nodes,
        all_cores,
        warnings,
    } = inv;
    nics.sort_by(|a, b| (a.pci.is_none(), a.pci, &a.name).cmp(&(b.pci.is_none(), b.pci, &b.name)));
    numa_nodes.sort_by_key(|n| n.os_index);

    // GPU positions in ordinal order.
    let mut order: Vec<usize> = (0..gpus.len()).collect();
    order.sort_by_key(|&i| (ordinals.get(i).copied().unwrap_or(usize::MAX), gpus[i].pci));

    let mut assigned: Vec<Option<Vec<usize>>> = vec![None; gpus.len()];
    let mut claimed = vec![false; nics.len()];

    // Places where GPUs can meet NICs: PCI bridges deepest first, then host
    // bridges deepest first. Depth = distance from the top of the I/O tree.
    let mut places: BTreeSet<(BridgeKind, std::cmp::Reverse<usize>, u64)> = BTreeSet::new();
    for g in &gpus {
        let n = g.loc.bridges.len();
        for (pos, b) in g.loc.bridges.iter().enumerate() {
            places.insert((b.kind, std::cmp::Reverse(n - pos), b.id));
        }
    }
    for &(_, _, id) in &places {
        let members: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&g| assigned[g].is_none() && gpus[g].loc.has_bridge(id))
            .collect();
        let candidates: Vec<usize> = (0..nics.len())
            .filter(|&n| nics[n].loc.has_bridge(id))
            .collect();
        take(&members, &candidates, &nics, &mut assigned, &mut claimed);
    }
    // NUMA fallback.
    for node in &numa_nodes {
        let members: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&g| assigned[g].is_none() && gpus[g].loc.numa == Some(node.os_index))
            .collect();
        let candidates: Vec<usize> = (0..nics.len())
            .filter(|&n| nics[n].loc.numa == Some(node.os_index))
            .collect();
        take(&members, &candidates, &nics, &mut assigned, &mut claimed);
    }

    // Cores.
    let mut cores: Vec<Vec<usize>> = vec![Vec::new(); gpus.len()];
    let gpu_numas: BTreeSet<u32> = gpus.iter().filter_map(|g| g.loc.numa).collect();
    for node in &numa_nodes {
        let members: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&g| gpus[g].loc.numa == Some(node.os_index))
            .collect();
        for (g, chunk) in members.iter().zip(split_even(&node.cores, members.len())) {
            cores[*g] = chunk;
        }
    }
    let homeless: Vec<usize> = order
        .iter()
        .copied()
        .filter(
            |&g| !matches!(gpus[g].loc.numa, Some(n) if numa_nodes.iter().any(|x| x.os_index == n)),
        )
        .collect();
    if !homeless.is_empty() {
        let mut pool: Vec<usize> = numa_nodes
            .iter()
            .filter(|n| !gpu_numas.contains(&n.os_index))
            .flat_map(|n| n.cores.iter().copied())
            .collect();
        pool.sort_unstable();
        if pool.is_empty() {
            pool.clone_from(&all_cores);
        }
        for (g, chunk) in homeless.iter().zip(split_even(&pool, homeless.len())) {
            cores[*g] = chunk;
        }
    }

    let gpu_groups: Vec<GpuGroup> = order
        .iter()
        .map(|&g| {
            let mut list: Vec<Nic> = assigned[g]
                .iter()
                .flatten()
                .map(|&n| nics[n].public())
                .collect();
            list.sort_by(nic_order);
            GpuGroup {
                index: ordinals.get(g).copied().unwrap_or(g),
                pci: gpus[g].pci.to_string(),
                numa: gpus[g].loc.numa,
                nics: list,
                cores: cores[g].clone(),
            }
        })
        .collect();

    let unassigned_nics: Vec<Nic> = (0..nics.len())
        .filter(|&n| !claimed[n])
        .map(|n| nics[n].public())
        .collect();

    let mut numa_groups: Vec<NumaGroup> = numa_nodes
        .iter()
        .map(|node| NumaGroup {
            numa: Some(node.os_index),
            nics: nics
                .iter()
                .filter(|n| n.loc.numa == Some(node.os_index))
                .map(NicDev::public)
                .collect(),
            cores: node.cores.clone(),
        })
        .collect();
    let lost: Vec<Nic> = nics
        .iter()
        .filter(|n| !matches!(n.loc.numa, Some(x) if numa_nodes.iter().any(|m| m.os_index == x)))
        .map(NicDev::public)
        .collect();
    if !lost.is_empty() {
        numa_groups.push(NumaGroup {
            numa: None,
            nics: lost,
            cores: all_cores.clone(),
        });
    }

    Topology {
        gpus: gpu_groups,
        unassigned_nics,
        numa_groups,
        warnings,
    }
}

/// Give the `members` GPUs (ordinal order) their share of `candidates` NICs
/// (PCI order): the unclaimed ones if any, else all of them.
fn take(
    members: &[usize],
    candidates: &[usize],
    nics: &[NicDev],
    assigned: &mut [Option<Vec<usize>>],
    claimed: &mut [bool],
) {
    if members.is_empty() || candidates.is_empty() {
        return;
    }
    let free: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&n| !claimed[n])
        .collect();
    let pool = if free.is_empty() {
        candidates.to_vec()
    } else {
        free
    };
    let mut by_model: BTreeMap<Option<(u16, u16)>, Vec<usize>> = BTreeMap::new();
    for &n in &pool {
        by_model.entry(nics[n].model).or_default().push(n);
    }
    let mut shares: Vec<Vec<usize>> = vec![Vec::new(); members.len()];
    for list in by_model.values() {
        if list.len() >= members.len() {
            for (share, chunk) in shares.iter_mut().zip(split_even(list, members.len())) {
                share.extend(chunk);
            }
        } else {
            for (i, share) in shares.iter_mut().enumerate() {
                share.push(list[i % list.len()]);
            }
        }
    }
    for &n in &pool {
        claimed[n] = true;
    }
    for (&g, share) in members.iter().zip(shares) {
        assigned[g] = Some(share);
    }
}

/// Split `items` into `parts` contiguous chunks whose sizes differ by at most
/// one (the first chunks get the extra items).
pub(crate) fn split_even<T: Clone>(items: &[T], parts: usize) -> Vec<Vec<T>> {
    if parts == 0 {
        return Vec::new();
    }
    let base = items.len() / parts;
    let extra = items.len() % parts;
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let len = base + usize::from(i < extra);
        out.push(items[start..start + len].to_vec());
        start += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci(bus: u8, dev: u8) -> PciAddr {
        PciAddr {
            domain: 0,
            bus,
            dev,
            func: 0,
        }
    }

    fn loc(bridges: &[(u64, BridgeKind)], numa: Option<u32>) -> Location {
        Location {
            bridges: bridges
                .iter()
                .map(|&(id, kind)| Bridge { id, kind })
                .collect(),
            numa,
        }
    }

    fn gpu(bus: u8, bridges: &[(u64, BridgeKind)], numa: Option<u32>) -> GpuDev {
        GpuDev {
            pci: pci(bus, 0),
            vendor: NVIDIA,
            loc: loc(bridges, numa),
        }
    }

    fn nic(
        name: &str,
        bus: u8,
        model: u16,
        bridges: &[(u64, BridgeKind)],
        numa: Option<u32>,
    ) -> NicDev {
        NicDev {
            name: name.to_string(),
            pci: Some(pci(bus, 0)),
            model: Some((0x1d0f, model)),
            loc: loc(bridges, numa),
        }
    }

    use BridgeKind::{Host as H, Pci as P};

    fn names(t: &Topology, i: usize) -> Vec<String> {
        t.gpus()[i].nics.iter().map(|n| n.name.clone()).collect()
    }

    #[test]
    fn pci_addr_roundtrip() {
        let a = PciAddr::parse("0000:4f:00.0").expect("parses");
        assert_eq!(a.to_string(), "0000:4f:00.0");
        assert_eq!(
            PciAddr::parse("10000:0A:1f.7").map(|a| a.to_string()),
            Some("10000:0a:1f.7".to_string())
        );
        assert!(PciAddr::parse("virtio0").is_none());
        assert!(PciAddr::parse("0000:4f:00").is_none());
        assert!(PciAddr::parse("0000:4f0:00.0").is_none());
    }

    #[test]
    fn split_even_sizes() {
        assert_eq!(
            split_even(&[1, 2, 3, 4, 5], 2),
            vec![vec![1, 2, 3], vec![4, 5]]
        );
        assert_eq!(split_even(&[1], 3), vec![vec![1], vec![], vec![]]);
        assert!(split_even::<u8>(&[], 0).is_empty());
    }

    #[test]
    fn two_gpus_four_nics_per_switch_split_two_each() {
        let sw = [(10, P), (1, H)];
        let inv = Inventory {
            gpus: vec![gpu(0x5a, &sw, Some(0)), gpu(0x59, &sw, Some(0))],
            nics: (0..4)
                .map(|i| {
                    nic(
                        &format!("rdmap{}s0", 0x55 + i),
                        0x55 + i,
                        0xefa2,
                        &sw,
                        Some(0),
                    )
                })
                .collect(),
            numa_nodes: vec![NumaNode {
                os_index: 0,
                cores: (0..8).collect(),
            }],
            all_cores: (0..8).collect(),
            warnings: vec![],
        };
        let mut w = vec![];
        let ord = assign_ordinals(&inv.gpus, None, &mut w);
        assert_eq!(ord, vec![1, 0]);
        let t = build(inv, &ord);
        assert_eq!(t.gpus()[0].pci, "0000:59:00.0");
        assert_eq!(names(&t, 0), ["rdmap85s0", "rdmap86s0"]);
        assert_eq!(names(&t, 1), ["rdmap87s0", "rdmap88s0"]);
        assert_eq!(t.gpus()[0].cores, [0, 1, 2, 3]);
        assert_eq!(t.gpus()[1].cores, [4, 5, 6, 7]);
        assert!(t.unassigned_nics().is_empty());
    }

    #[test]
    fn models_are_split_separately() {
        let sw = [(10, P)];
        let mut nics = vec![
            nic("rdmap113s0", 0x71, 0xefa3, &sw, Some(1)),
            nic("rdmap114s0", 0x72, 0xefa3, &sw, Some(1)),
            nic("ibp115s0f0", 0x73, 0x1021, &sw, Some(1)),
            nic("ibp116s0f0", 0x74, 0x1021, &sw, Some(1)),
        ];
        nics[2].model = Some((0x15b3, 0x1021));
        nics[3].model = Some((0x15b3, 0x1021));
        let inv = Inventory {
            gpus: vec![gpu(0x75, &sw, Some(1)), gpu(0x76, &sw, Some(1))],
            nics,
            ..Default::default()
        };
        let t = build(inv, &[0, 1]);
        assert_eq!(names(&t, 0), ["rdmap113s0", "ibp115s0f0"]);
        assert_eq!(names(&t, 1), ["rdmap114s0", "ibp116s0f0"]);
    }

    #[test]
    fn fewer_nics_than_gpus_round_robin() {
        let sw = [(10, P)];
        let inv = Inventory {
            gpus: (0..4).map(|i| gpu(0x10 + i, &sw, None)).collect(),
            nics: vec![
                nic("a", 1, 0xefa0, &sw, None),
                nic("b", 2, 0xefa0, &sw, None),
            ],
            ..Default::default()
        };
        let t = build(inv, &[0, 1, 2, 3]);
        let got: Vec<Vec<String>> = (0..4).map(|i| names(&t, i)).collect();
        assert_eq!(got, [["a"], ["b"], ["a"], ["b"]]);
    }

    #[test]
    fn deepest_switch_wins_then_shares_upwards() {
        // Upper switch 1 holds sub-switch 2 (GPU x + NIC n) and GPU y.
        let inv = Inventory {
            gpus: vec![
                gpu(0x13, &[(1, P), (100, H)], Some(0)),
                gpu(0x19, &[(2, P), (1, P), (100, H)], Some(0)),
            ],
            nics: vec![
                nic("n", 0x1a, 1, &[(2, P), (1, P), (100, H)], Some(0)),
                nic("far", 0x30, 1, &[(3, P), (100, H)], Some(0)),
            ],
            ..Default::default()
        };
        let t = build(inv, &[0, 1]);
        assert_eq!(names(&t, 1), ["n"]);
        // GPU 0 shares switch 1 only with n (already taken): it shares it.
        assert_eq!(names(&t, 0), ["n"]);
        assert_eq!(t.unassigned_nics().len(), 1);
        assert_eq!(t.unassigned_nics()[0].name, "far");
    }

    #[test]
    fn host_bridge_then_numa_fallback() {
        let inv = Inventory {
            gpus: vec![
                gpu(0x10, &[(1, H)], Some(0)),
                gpu(0x11, &[(1, H)], Some(0)),
                gpu(0x90, &[(2, H)], Some(1)),
                gpu(0xa0, &[(3, H)], Some(1)),
                gpu(0xc0, &[(4, H)], Some(2)),
            ],
            nics: vec![
                nic("hb", 0x1b, 1, &[(1, H)], Some(0)),
                nic("numa1", 0x95, 1, &[(5, H)], Some(1)),
            ],
            numa_nodes: (0..3)
                .map(|i| NumaNode {
                    os_index: i,
                    cores: vec![i as usize * 10, i as usize * 10 + 1],
                })
                .collect(),
            ..Default::default()
        };
        let t = build(inv, &[0, 1, 2, 3, 4]);
        assert_eq!(names(&t, 0), ["hb"]);
        assert_eq!(names(&t, 1), ["hb"]);
        assert_eq!(names(&t, 2), ["numa1"]);
        assert_eq!(names(&t, 3), ["numa1"]);
        assert!(names(&t, 4).is_empty());
        assert_eq!(t.gpus()[0].cores, [0]);
        assert_eq!(t.gpus()[1].cores, [1]);
        assert_eq!(t.gpus()[4].cores, [20, 21]);
        assert!(t.unassigned_nics().is_empty());
    }

    #[test]
    fn cuda_ordinals_and_fallback() {
        let gpus = vec![
            gpu(0x20, &[], None),
            gpu(0x10, &[], None),
            gpu(0x30, &[], None),
        ];
        let mut w = vec![];
        let cuda = [
            CudaDev {
                ordinal: 0,
                domain: 0,
                bus: 0x30,
                dev: 0,
            },
            CudaDev {
                ordinal: 1,
                domain: 0,
                bus: 0x20,
                dev: 0,
            },
        ];
        assert_eq!(assign_ordinals(&gpus, Some(&cuda), &mut w), vec![1, 2, 0]);
        assert_eq!(w.len(), 1, "{w:?}");
        let zeros = [CudaDev {
            ordinal: 0,
            domain: 0,
            bus: 0,
            dev: 0,
        }];
        let mut w = vec![];
        assert_eq!(assign_ordinals(&gpus, Some(&zeros), &mut w), vec![1, 0, 2]);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn no_gpus_numa_groups() {
        let inv = Inventory {
            nics: vec![
                nic("mlx5_0", 0x10, 1, &[(1, H)], Some(0)),
                NicDev {
                    name: "rxe0".into(),
                    pci: None,
                    model: None,
                    loc: Location::default(),
                },
            ],
            numa_nodes: vec![NumaNode {
                os_index: 0,
                cores: vec![0, 1],
            }],
            all_cores: vec![0, 1],
            ..Default::default()
        };
        let t = build(inv, &[]);
        assert!(t.gpus().is_empty());
        assert_eq!(t.unassigned_nics().len(), 2);
        assert_eq!(t.unassigned_nics()[1].pci, None);
        assert_eq!(t.numa_groups().len(), 2);
        assert_eq!(t.numa_groups()[0].nics[0].name, "mlx5_0");
        assert_eq!(t.numa_groups()[1].numa, None);
        assert_eq!(t.numa_groups()[1].nics[0].name, "rxe0");
        assert_eq!(t.numa_groups()[1].cores, [0, 1]);
    }
}
