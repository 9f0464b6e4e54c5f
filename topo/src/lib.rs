//! GPU / RDMA NIC / NUMA topology discovery.
//!
//! `topo` finds the GPUs, RDMA NICs, NUMA nodes and cores of a machine and
//! gives every GPU the RDMA NICs that sit closest to it in the PCIe tree, plus
//! a disjoint set of physical cores for pinning its worker threads.
//!
//! # Sources
//!
//! * [`discover`]: the live machine, through hwlocality over the system hwloc
//!   (2.x), with all I/O objects kept. RDMA device names are then checked
//!   against `/sys/class/infiniband` (the names `ibv_open_device` and
//!   libfabric's EFA provider use) and, with the `cuda` feature, GPU indices
//!   become CUDA ordinals.
//! * [`from_xml`] / [`from_xml_str`]: an hwloc XML export (`lstopo file.xml`),
//!   1.x or 2.x format, i.e. whatever the system hwloc 2.9 reads. hwloc 3.x
//!   exports are refused with a clear error. Exports whose CPU hierarchy was
//!   trimmed (no PU objects) are accepted: each CPU of the cpusets then counts
//!   as a core, and a warning says so.
//!
//! # What counts
//!
//! * **GPU**: a PCI function of display class (VGA `0x0300`, 3D `0x0302`, or
//!   other display `0x0380`, used by AMD Instinct) from NVIDIA (`0x10de`) or
//!   AMD (`0x1002`). OS devices (`cuda*`, `opencl*`, none) do not matter.
//! * **RDMA NIC**: an OpenFabrics OS device (`mlx5_*`, `rdmap*` EFA, `ibp*`,
//!   `rxe*`...), named by that OS device. Plain Ethernet functions (such as
//!   the ENA functions next to each EFA on AWS) are not RDMA NICs.
//! * **Soft-RoCE / software devices** (`rxe*`, `siw*`) have no PCI function:
//!   they are listed with `pci: null`, never given to a GPU (they have no
//!   locality), so they appear in `unassigned_nics` and in the `numa: null`
//!   entry of `numa_groups`.
//!
//! # Grouping rules
//!
//! 1. Each GPU gets the RDMA NICs under the closest PCI bridge (switch) it
//!    shares with any; then, for GPUs still without NICs, the closest shared
//!    host bridge; then the NUMA node. Places are visited deepest first.
//! 2. When several GPUs meet at one place, the NICs there that no GPU took yet
//!    are split between them evenly and deterministically: per NIC model
//!    (PCI vendor:device, so an EFA and a ConnectX are shared out
//!    separately), in contiguous PCI-order chunks, GPUs in index order.
//!    p5en (2 GPUs + 4 EFA per switch) gives 2 EFA each; p6-b200 (2 GPUs + 2
//!    EFA) gives 1 each.
//! 3. With fewer NICs (of a model) than GPUs, the GPUs share them round
//!    robin, each GPU getting at least one (p4d: 2 GPUs per host bridge share
//!    its one EFA). If every NIC at a place is already taken, the GPUs share
//!    those.
//! 4. A GPU with no NIC anywhere near keeps an empty list; NICs that no GPU
//!    got are listed in [`Topology::unassigned_nics`].
//! 5. Cores: physical cores (first PU of each core, by OS index) of the GPU's
//!    NUMA node, split into disjoint contiguous chunks among that node's GPUs
//!    in index order. GPUs whose NUMA node is unknown share the cores of the
//!    NUMA nodes that host no GPU (all cores if there are none).
//! 6. Without GPUs, use [`Topology::numa_groups`]: NICs and cores per NUMA
//!    node (always filled in, GPUs or not).
//!
//! GPU indices are CUDA ordinals when the `cuda` feature is on and the CUDA
//! driver reports PCI bus ids that match (live only); otherwise the rank in
//! PCI bus order, which is CUDA's numbering under
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
//!
//! # Example
//!
//! ```no_run
//! let topo = topo::discover()?;
//! print!("{}", topo.render_table());
//! for gpu in topo.gpus() {
//!     println!("GPU {} -> {:?} on cores {:?}", gpu.index, gpu.nic_names(), gpu.cores);
//! }
//! # Ok::<(), topo::Error>(())
//! ```

#![warn(missing_docs)]

mod error;
mod grouping;
mod hwloc;
mod live;
mod model;
mod sysfs;
mod xmlfix;

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::driver_and_names as cuda_driver_and_names;

pub use error::{Error, Result};
pub use hwloc::SKIPPED_COMPONENTS;
pub use model::{GpuGroup, Nic, NumaGroup, Topology};

use std::path::Path;

/// Discover the topology of this machine.
///
/// Uses the system hwloc with all I/O objects kept, checks RDMA device names
/// against `/sys/class/infiniband`, and (feature `cuda`) numbers GPUs by CUDA
/// ordinal. Works on machines with no GPU and no RDMA device (the result is
/// then just the NUMA grouping of cores).
///
/// # Errors
///
/// [`Error::Hwloc`] when hwloc cannot be configured or fails to load the
/// topology.
pub fn discover() -> Result<Topology> {
    let topology = hwloc::load_live()?;
    let extracted = hwloc::extract(&topology);
    let mut inv = extracted.inventory;
    let mut cuda = None;
    if topology.is_this_system() {
        let sys = sysfs::rdma_devices(Path::new(sysfs::INFINIBAND_CLASS));
        live::reconcile_nics(&mut inv, &extracted.pci, sys, sysfs::pci_numa_node);
        cuda = live::cuda_devices(&mut inv);
    } else {
        inv.warnings.push(
            "hwloc did not read this system (HWLOC_XMLFILE or HWLOC_SYNTHETIC set?): \
             NIC names were not checked against sysfs and CUDA was not asked"
                .to_string(),
        );
    }
    let mut warnings = std::mem::take(&mut inv.warnings);
    let ordinals = grouping::assign_ordinals(&inv.gpus, cuda.as_deref(), &mut warnings);
    inv.warnings = warnings;
    Ok(grouping::build(inv, &ordinals))
}

/// Load a topology from an hwloc XML export file (hwloc 1.x or 2.x format).
///
/// GPU indices follow PCI bus order; the file describes another machine, so
/// neither sysfs nor CUDA is consulted.
///
/// # Errors
///
/// [`Error::XmlRead`] when the file cannot be read, [`Error::XmlInvalid`]
/// (naming the file) when it is not a topology the system hwloc can load.
pub fn from_xml(path: impl AsRef<Path>) -> Result<Topology> {
    use std::io::Read;
    /// Far above any export (the largest real dumps are a few MiB): a bound, so that a path
    /// like /dev/zero is refused instead of read forever.
    const MAX_XML: u64 = 256 << 20;
    let path = path.as_ref();
    let err = |source| Error::XmlRead {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_XML + 1).read_to_end(&mut bytes))
        .map_err(err)?;
    if bytes.len() as u64 > MAX_XML {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "over 256 MiB: not an hwloc topology export",
        )));
    }
    let text = String::from_utf8_lossy(&bytes);
    from_xml_text(&text, &path.display().to_string())
}

/// Load a topology from hwloc XML text held in memory. See [`from_xml`].
///
/// # Errors
///
/// [`Error::XmlInvalid`] when the text is not a topology the system hwloc can
/// load.
pub fn from_xml_str(xml: &str) -> Result<Topology> {
    from_xml_text(xml, "<xml buffer>")
}

fn from_xml_text(xml: &str, origin: &str) -> Result<Topology> {
    let (topology, warnings) = hwloc::load_xml(xml, origin)?;
    let mut inv = hwloc::extract(&topology).inventory;
    inv.warnings.extend(warnings);
    let mut warnings = std::mem::take(&mut inv.warnings);
    let ordinals = grouping::assign_ordinals(&inv.gpus, None, &mut warnings);
    inv.warnings = warnings;
    Ok(grouping::build(inv, &ordinals))
}
