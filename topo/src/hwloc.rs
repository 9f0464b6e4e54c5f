//! Loading a topology with hwlocality and turning it into an [`Inventory`].

use crate::error::{Error, Result};
use crate::grouping::{
    is_gpu, Bridge, BridgeKind, GpuDev, Inventory, Location, NicDev, NumaNode, PciAddr,
};
use crate::xmlfix;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{BridgeType, OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::{TopologyBuilder, TypeFilter};
use hwlocality::Topology as HwTopology;
use std::collections::{BTreeMap, BTreeSet};

/// Builder with every I/O object kept (bridges, PCI devices, OS devices).
fn io_builder(builder: TopologyBuilder) -> Result<TopologyBuilder> {
    builder
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| Error::Hwloc {
            operation: "setting the I/O type filter",
            message: e.to_string(),
        })
}

/// hwloc's discovery components that [`discover`](crate::discover) leaves out: they annotate
/// GPUs and displays through their vendors' libraries. Nothing here reads what they add: GPUs
/// are PCI functions of a display class (`is_gpu`), numbered through the CUDA driver
/// (`live.rs`), and NICs come from the linux component. Loading them costs every process that
/// discovers its topology (each `rdma-bench` side): `opencl` loads the machine's OpenCL
/// drivers (pocl, found on a GPU host, started a worker thread per CPU and mapped LLVM: 16
/// threads and 17 libraries more in each rdma-bench process there, and 70 ms more to
/// discover), `gl` opens X displays, `cuda` starts the CUDA runtime.
pub const SKIPPED_COMPONENTS: &[&str] = &["opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"];

/// Load the topology of this machine, without those of [`SKIPPED_COMPONENTS`] that hwloc has.
pub(crate) fn load_live() -> Result<HwTopology> {
    live_builder()?.build().map_err(|e| Error::Hwloc {
        operation: "topology discovery (hwloc_topology_load)",
        message: e.to_string(),
    })
}

/// A builder for this machine with every I/O object kept, leaving out each of
/// [`SKIPPED_COMPONENTS`] that hwloc registered. hwloc refuses to leave out a component it
/// does not know (its plugin is not installed: `EINVAL`), and the refused builder is gone
/// with the error, so each refusal starts a new builder without that name.
fn live_builder() -> Result<TopologyBuilder> {
    let mut skip = SKIPPED_COMPONENTS.to_vec();
    loop {
        match without(io_builder(HwTopology::builder())?, &skip) {
            Ok(builder) => return Ok(builder),
            Err(refused) => {
                skip.remove(refused);
            }
        }
    }
}

/// `builder` without the components `names`, or the index of the first name hwloc refused.
fn without(
    mut builder: TopologyBuilder,
    names: &[&str],
) -> std::result::Result<TopologyBuilder, usize> {
    for (i, name) in names.iter().enumerate() {
        builder = builder.without_component(name).map_err(|_| i)?;
    }
    Ok(builder)
}

/// Load a topology from hwloc XML text. `origin` names the source in errors.
/// Returns the topology and warnings about the document.
pub(crate) fn load_xml(xml: &str, origin: &str) -> Result<(HwTopology, Vec<String>)> {
    let invalid = |reason: String| Error::XmlInvalid {
        origin: origin.to_string(),
        reason,
    };
    let mut warnings = Vec::new();
    let normalized = xmlfix::normalize(xml);
    let xml = normalized.as_deref().unwrap_or(xml);
    match xmlfix::format_version(xml) {
        None => {
            return Err(invalid(
                "no <topology> element found (not an hwloc XML export, or malformed XML)".into(),
            ))
        }
        Some(v) if v >= 3 => {
            return Err(invalid(format!(
                "hwloc XML format version {v} is newer than the system hwloc reads \
                 (1.x and 2.x exports); re-export it with `lstopo --export-xml-flags v2`"
            )))
        }
        Some(_) => {}
    }
    if let Some((ty, i)) = xmlfix::index_past_bitmaps(xml) {
        return Err(invalid(format!(
            "a {ty} has os_index {i}, past the largest index hwloc's bitmaps hold ({})",
            i32::MAX
        )));
    }
    let fixed = xmlfix::ensure_pus(xml);
    if fixed.is_some() {
        warnings.push(
            "the XML has no PU objects (trimmed CPU hierarchy): each CPU of a NUMA node's \
             cpuset counts as one core"
                .to_string(),
        );
    }
    let text = fixed.as_deref().unwrap_or(xml);
    let builder = HwTopology::builder()
        .from_xml(text)
        .map_err(|e| invalid(format!("hwloc rejected the XML: {e}")))?;
    let topology = io_builder(builder)?
        .build()
        .map_err(|e| invalid(format!("hwloc could not load it: {e}")))?;
    Ok((topology, warnings))
}

/// PCI address of a PCI device (or PCI-side bridge) object.
fn pci_addr(obj: &TopologyObject) -> Option<(PciAddr, u16, u16, u16)> {
    match obj.attributes()? {
        ObjectAttributes::PCIDevice(p) => Some((
            PciAddr {
                domain: u32::from(p.domain()),
                bus: p.bus_id(),
                dev: p.bus_device(),
                func: p.function(),
            },
            p.class_id(),
            p.vendor_id(),
            p.device_id(),
        )),
        _ => None,
    }
}

/// Index of NUMA nodes: OS index, cpuset bits.
struct NumaIndex {
    nodes: Vec<(u32, BTreeSet<usize>)>,
}

impl NumaIndex {
    fn new(topology: &HwTopology) -> Self {
        let mut nodes = Vec::new();
        for node in topology.objects_with_type(ObjectType::NUMANode) {
            // An index no bitmap holds (hwloc's are indexed by int) is in no nodeset.
            let Some(os) = node
                .os_index()
                .and_then(|i| u32::try_from(i).ok())
                .filter(|&i| i <= i32::MAX as u32)
            else {
                continue;
            };
            let cpus: BTreeSet<usize> = node
                .cpuset()
                .map(|c| c.iter_set().map(usize::from).collect())
                .unwrap_or_default();
            nodes.push((os, cpus));
        }
        Self { nodes }
    }

    /// NUMA node of an object: the single NUMA node (with CPUs, preferably)
    /// of its first non-I/O ancestor's nodeset, or `None` when that is
    /// ambiguous or empty.
    fn numa_of(&self, obj: &TopologyObject) -> Option<u32> {
        let anchor = if obj.cpuset().is_some() {
            obj
        } else {
            obj.first_non_io_ancestor()?
        };
        let nodeset = anchor.nodeset()?;
        let in_set: Vec<&(u32, BTreeSet<usize>)> = self
            .nodes
            .iter()
            .filter(|(os, _)| nodeset.is_set(*os as usize))
            .collect();
        let with_cpus: Vec<u32> = in_set
            .iter()
            .filter(|(_, cpus)| !cpus.is_empty())
            .map(|(os, _)| *os)
            .collect();
        match (with_cpus.as_slice(), in_set.as_slice()) {
            ([one], _) => Some(*one),
            ([], [(one, _)]) => Some(*one),
            _ => None,
        }
    }
}

/// Bridges above `obj`, nearest first.
fn bridges_of(obj: &TopologyObject) -> Vec<Bridge> {
    obj.ancestors()
        .filter(|a| a.object_type() == ObjectType::Bridge)
        .map(|a| {
            let kind = match a.attributes() {
                Some(ObjectAttributes::Bridge(b)) if b.upstream_type() == BridgeType::Host => {
                    BridgeKind::Host
                }
                Some(ObjectAttributes::Bridge(_)) => BridgeKind::Pci,
                _ => BridgeKind::Host,
            };
            Bridge {
                id: a.global_persistent_index(),
                kind,
            }
        })
        .collect()
}

/// A PCI function hwloc knows, with its location.
#[derive(Debug, Clone)]
pub(crate) struct PciInfo {
    pub vendor: u16,
    pub device: u16,
    pub loc: Location,
}

/// Devices extracted from an hwloc topology.
pub(crate) struct Extracted {
    pub inventory: Inventory,
    /// Every PCI function hwloc reported (used to place NICs found in sysfs).
    pub pci: BTreeMap<PciAddr, PciInfo>,
}

/// Walk the hwloc topology: GPUs, OpenFabrics devices, NUMA nodes, cores.
pub(crate) fn extract(topology: &HwTopology) -> Extracted {
    let numa = NumaIndex::new(topology);
    let mut inv = Inventory::default();
    let mut pci = BTreeMap::new();

    for dev in topology.pci_devices() {
        let Some((addr, class, vendor, device)) = pci_addr(dev) else {
            continue;
        };
        let loc = Location {
            bridges: bridges_of(dev),
            numa: numa.numa_of(dev),
        };
        if is_gpu(class, vendor) {
            inv.gpus.push(GpuDev {
                pci: addr,
                vendor,
                loc: loc.clone(),
            });
        }
        pci.insert(
            addr,
            PciInfo {
                vendor,
                device,
                loc,
            },
        );
    }

    let mut seen = BTreeSet::new();
    for osdev in topology.os_devices() {
        let is_rdma = matches!(
            osdev.attributes(),
            Some(ObjectAttributes::OSDevice(a)) if a.device_type() == OSDeviceType::OpenFabrics
        );
        if !is_rdma {
            continue;
        }
        let Some(name) = osdev.name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !seen.insert(name.clone()) {
            continue;
        }
        let parent_pci = osdev
            .ancestors()
            .find(|a| a.object_type() == ObjectType::PCIDevice)
            .and_then(|p| pci_addr(p).map(|info| (p, info)));
        let nic = match parent_pci {
            Some((p, (addr, _, vendor, device))) => NicDev {
                name,
                pci: Some(addr),
                model: Some((vendor, device)),
                loc: Location {
                    bridges: bridges_of(p),
                    numa: numa.numa_of(p),
                },
            },
            None => NicDev {
                name,
                pci: None,
                model: None,
                loc: Location {
                    bridges: bridges_of(osdev),
                    numa: numa.numa_of(osdev),
                },
            },
        };
        inv.nics.push(nic);
    }

    // Cores: first PU of every Core; PUs themselves when there are no Core
    // objects. Only CPUs the topology allows.
    let allowed: BTreeSet<usize> = topology
        .allowed_cpuset()
        .iter_set()
        .map(usize::from)
        .collect();
    let mut firsts: BTreeSet<usize> = topology
        .objects_with_type(ObjectType::Core)
        .filter_map(|core| {
            core.cpuset()
                .and_then(|c| c.iter_set().map(usize::from).find(|i| allowed.contains(i)))
        })
        .collect();
    if firsts.is_empty() {
        firsts = topology
            .objects_with_type(ObjectType::PU)
            .filter_map(TopologyObject::os_index)
            .filter(|i| allowed.contains(i))
            .collect();
    }
    inv.all_cores = firsts.iter().copied().collect();
    for (os, cpus) in &numa.nodes {
        let cores: Vec<usize> = firsts
            .iter()
            .copied()
            .filter(|c| cpus.contains(c))
            .collect();
        if !cpus.is_empty() {
            inv.numa_nodes.push(NumaNode {
                os_index: *os,
                cores,
            });
        }
    }
    Extracted {
        inventory: inv,
        pci,
    }
}
