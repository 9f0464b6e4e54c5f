//! What rdma-bench needs from the `topo` crate, behind one small module: NIC groups and cores
//! per GPU, and the `topo` subcommand's output.

use std::path::Path;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// What the benchmark uses of the machine's topology.
#[derive(Clone, Debug, Default)]
pub struct Hints {
    /// GPUs hwloc sees.
    pub gpus: usize,
    /// Per GPU ordinal: the RDMA NICs behind its PCIe switch.
    pub nic_groups: Vec<Vec<NicRef>>,
    /// Per GPU ordinal: the cores near it. Without GPUs, entry 0 holds every core.
    pub cores: Vec<Vec<usize>>,
}

/// One RDMA NIC as topo found it: its ibverbs name and PCI function. The efa backend opens
/// the libfabric domain at that PCI function (its domains are named `rdmap79s0-rdm`, not
/// `rdmap79s0`); the verbs backend opens the device by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicRef {
    pub name: String,
    pub pci: Option<String>,
}

/// [`Hints`] from a topology (this machine's, or an hwloc XML export).
pub fn from_topology(t: &topo::Topology) -> Hints {
    let n = t.gpus().iter().map(|g| g.index + 1).max().unwrap_or(0);
    let mut h = Hints {
        gpus: t.gpus().len(),
        nic_groups: vec![Vec::new(); n],
        cores: vec![Vec::new(); n],
    };
    for g in t.gpus() {
        h.nic_groups[g.index] = g
            .nics
            .iter()
            .map(|n| NicRef {
                name: n.name.clone(),
                pci: n.pci.clone(),
            })
            .collect();
        h.cores[g.index] = g.cores.clone();
    }
    h
}

/// This machine's topology (discovered once per process), or `None` where hwloc cannot read
/// it: then a warning with hwloc's words says what that costs and what to do, once.
pub fn hints() -> Option<Hints> {
    static HINTS: OnceLock<Option<Hints>> = OnceLock::new();
    HINTS
        .get_or_init(|| match topo::discover() {
            Ok(t) => Some(from_topology(&t)),
            Err(e) => {
                eprintln!("{}", no_topology(&e.to_string()));
                None
            }
        })
        .clone()
}

/// The warning when hwloc cannot read this machine.
fn no_topology(hwloc: &str) -> String {
    format!(
        "rdma-bench: warning: hwloc could not read this machine's topology ({hwloc}): NICs are \
         not grouped per GPU and threads are not pinned near them (each endpoint opens the \
         provider's default NIC); pass --topology FILE, an hwloc XML export (`lstopo \
         FILE.xml`) of this node"
    )
}

/// [`Hints`] from an hwloc XML export (`--topology`).
pub fn hints_from(path: &Path) -> Result<Hints> {
    topo::from_xml(path)
        .map(|t| from_topology(&t))
        .map_err(|e| Error::Usage(format!("--topology {}: {e}", path.display())))
}

/// The `topo` subcommand's output: this machine, or an hwloc XML export.
pub fn render(xml: Option<&Path>, json: bool) -> Result<String> {
    let t = match xml {
        Some(p) => topo::from_xml(p),
        None => topo::discover(),
    }
    .map_err(|e| Error::Unavailable(format!("topology: {e}")))?;
    Ok(if json {
        t.to_json_pretty()
    } else {
        t.render_table()
    })
}
