//! The public result types: [`Topology`], [`GpuGroup`], [`Nic`], [`NumaGroup`].

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// An RDMA device: one OpenFabrics (ibverbs) device such as `mlx5_0`,
/// `rdmap79s0` (EFA) or `rxe0` (Soft-RoCE).
///
/// Serialized as `{"name": "rdmap79s0", "pci": "0000:4f:00.0"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Nic {
    /// The ibverbs device name, as listed in `/sys/class/infiniband` and as
    /// opened by the verbs backend (`ibv_open_device`) or by libfabric's EFA
    /// provider (its domain names are the same names).
    pub name: String,
    /// PCI function in `dddd:bb:dd.f` form (lower-case hex), or `None` for a
    /// software device with no PCI function (Soft-RoCE `rxe*`, `siw*`).
    pub pci: Option<String>,
}

/// One GPU with the RDMA NICs and CPU cores it should use.
///
/// Serialized as
/// `{"index":0,"pci":"0000:53:00.0","numa":0,"nics":[...],"cores":[0,1,2]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuGroup {
    /// Device ordinal: the CUDA ordinal when the CUDA driver could be asked
    /// (feature `cuda`, live discovery only), otherwise the rank in PCI bus
    /// order (CUDA's `CUDA_DEVICE_ORDER=PCI_BUS_ID` numbering).
    pub index: usize,
    /// PCI function of the GPU in `dddd:bb:dd.f` form (lower-case hex).
    pub pci: String,
    /// NUMA node (OS index) the GPU is attached to; `None` when unknown.
    pub numa: Option<u32>,
    /// RDMA NICs assigned to this GPU (empty when the GPU has none), sorted
    /// by PCI address. A NIC may be shared with other GPUs when there are
    /// fewer NICs than GPUs behind a switch, host bridge or NUMA node.
    pub nics: Vec<Nic>,
    /// Physical cores (OS index of each core's first PU) reserved for this
    /// GPU's worker threads, taken from its NUMA node and disjoint from the
    /// other GPUs' cores on that node. Sorted.
    pub cores: Vec<usize>,
}

impl GpuGroup {
    /// Names of this GPU's NICs, in order.
    pub fn nic_names(&self) -> Vec<&str> {
        self.nics.iter().map(|n| n.name.as_str()).collect()
    }
}

/// RDMA NICs and cores of one NUMA node, regardless of GPUs.
///
/// This is the grouping to use on a machine without GPUs. Serialized as
/// `{"numa":0,"nics":[...],"cores":[...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaGroup {
    /// NUMA node OS index; `None` collects the NICs whose locality is unknown
    /// (such a group lists all cores of the machine).
    pub numa: Option<u32>,
    /// RDMA NICs attached to this NUMA node, sorted by PCI address.
    pub nics: Vec<Nic>,
    /// All physical cores of the node (first PU OS index of each core).
    pub cores: Vec<usize>,
}

/// Result of discovery: GPUs grouped with their RDMA NICs and cores.
///
/// JSON form (the first two keys are a stable interface for scripts):
///
/// ```json
/// {"gpus":[{"index":0,"pci":"0000:53:00.0","numa":0,
///           "nics":[{"name":"rdmap79s0","pci":"0000:4f:00.0"}],"cores":[0,1,2]}],
///  "unassigned_nics":[{"name":"mlx5_8","pci":"0000:aa:00.0"}],
///  "numa_groups":[{"numa":0,"nics":[...],"cores":[...]}],
///  "warnings":[]}
/// ```
///
/// `unassigned_nics` holds every RDMA NIC that no GPU got (all of them on a
/// machine without GPUs); every NIC is thus either in some GPU's `nics` or in
/// `unassigned_nics`. `numa_groups` always lists each NUMA node that has CPUs
/// with its NICs and cores, plus a `numa: null` group when some NIC's locality
/// is unknown. `warnings` says where the result is approximate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub(crate) gpus: Vec<GpuGroup>,
    pub(crate) unassigned_nics: Vec<Nic>,
    pub(crate) numa_groups: Vec<NumaGroup>,
    #[serde(default)]
    pub(crate) warnings: Vec<String>,
}

impl Topology {
    /// GPUs, sorted by [`GpuGroup::index`].
    pub fn gpus(&self) -> &[GpuGroup] {
        &self.gpus
    }

    /// The GPU with this ordinal, if any.
    pub fn gpu(&self, index: usize) -> Option<&GpuGroup> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// RDMA NICs that no GPU got, sorted by PCI address.
    pub fn unassigned_nics(&self) -> &[Nic] {
        &self.unassigned_nics
    }

    /// Per-NUMA-node grouping of NICs and cores (see [`NumaGroup`]).
    pub fn numa_groups(&self) -> &[NumaGroup] {
        &self.numa_groups
    }

    /// Every RDMA NIC found, each once, sorted by PCI address then name.
    pub fn all_nics(&self) -> Vec<&Nic> {
        let mut all: Vec<&Nic> = self
            .gpus
            .iter()
            .flat_map(|g| g.nics.iter())
            .chain(self.unassigned_nics.iter())
            .collect();
        all.sort_by(|a, b| nic_order(a, b));
        all.dedup();
        all
    }

    /// Notes on where the result is approximate (GPU ordinals from PCI order
    /// because CUDA was unavailable, trimmed CPU information...).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The JSON document described on [`Topology`], pretty-printed.
    pub fn to_json_pretty(&self) -> String {
        // Serializing plain strings, integers, options and vectors cannot
        // fail; fall back to the compact writer's error text just in case.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Human-readable table: one line per GPU with bus id, NUMA node, NICs
    /// and cores, then unassigned NICs, the per-NUMA grouping when there is
    /// no GPU, and warnings.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        if self.gpus.is_empty() {
            out.push_str("No GPUs found.\n");
        } else {
            let rows: Vec<[String; 5]> = self
                .gpus
                .iter()
                .map(|g| {
                    [
                        g.index.to_string(),
                        g.pci.clone(),
                        numa_str(g.numa),
                        if g.nics.is_empty() {
                            "-".to_string()
                        } else {
                            g.nic_names().join(",")
                        },
                        cpu_list(&g.cores),
                    ]
                })
                .collect();
            push_table(&mut out, ["GPU", "BUS ID", "NUMA", "NICS", "CORES"], &rows);
        }
        if !self.unassigned_nics.is_empty() {
            out.push_str("\nRDMA NICs not assigned to any GPU:\n");
            for nic in &self.unassigned_nics {
                let _ = writeln!(
                    out,
                    "  {} ({})",
                    nic.name,
                    nic.pci.as_deref().unwrap_or("no PCI")
                );
            }
        }
        if self.gpus.is_empty() {
            out.push('\n');
            let rows: Vec<[String; 3]> = self
                .numa_groups
                .iter()
                .map(|n| {
                    [
                        numa_str(n.numa),
                        if n.nics.is_empty() {
                            "-".to_string()
                        } else {
                            n.nics
                                .iter()
                                .map(|x| x.name.as_str())
                                .collect::<Vec<_>>()
                                .join(",")
                        },
                        cpu_list(&n.cores),
                    ]
                })
                .collect();
            push_table(&mut out, ["NUMA", "NICS", "CORES"], &rows);
        }
        if !self.warnings.is_empty() {
            out.push_str("\nWarnings:\n");
            for w in &self.warnings {
                let _ = writeln!(out, "  - {w}");
            }
        }
        out
    }
}

/// Order NICs by PCI address (software devices last), then name.
pub(crate) fn nic_order(a: &Nic, b: &Nic) -> std::cmp::Ordering {
    let key = |n: &Nic| (n.pci.is_none(), n.pci.clone(), n.name.clone());
    key(a).cmp(&key(b))
}

fn numa_str(numa: Option<u32>) -> String {
    numa.map_or_else(|| "-".to_string(), |n| n.to_string())
}

/// Compact CPU list: `0-11,24,26-27`.
pub(crate) fn cpu_list(cores: &[usize]) -> String {
    if cores.is_empty() {
        return "-".to_string();
    }
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let start = cores[i];
        let mut end = start;
        while i + 1 < cores.len() && cores[i + 1] == end + 1 {
            i += 1;
            end = cores[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

fn push_table<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths.iter()).enumerate() {
            if i + 1 == N {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_list(&[]), "-");
        assert_eq!(cpu_list(&[3]), "3");
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    fn sample() -> Topology {
        Topology {
            gpus: vec![GpuGroup {
                index: 0,
                pci: "0000:53:00.0".into(),
                numa: Some(0),
                nics: vec![Nic {
                    name: "rdmap79s0".into(),
                    pci: Some("0000:4f:00.0".into()),
                }],
                cores: vec![0, 1, 2],
            }],
            unassigned_nics: vec![],
            numa_groups: vec![],
            warnings: vec![],
        }
    }

    #[test]
    fn json_shape() {
        let v = serde_json::to_value(sample()).expect("serializes");
        assert_eq!(
            v["gpus"][0],
            serde_json::json!({"index":0,"pci":"0000:53:00.0","numa":0,
                "nics":[{"name":"rdmap79s0","pci":"0000:4f:00.0"}],"cores":[0,1,2]})
        );
        assert_eq!(v["unassigned_nics"], serde_json::json!([]));
        let back: Topology = serde_json::from_value(v).expect("round trip");
        assert_eq!(back, sample());
    }

    #[test]
    fn table() {
        let t = sample().render_table();
        assert!(
            t.starts_with("GPU  BUS ID        NUMA  NICS       CORES\n"),
            "{t}"
        );
        assert!(t.contains("0    0000:53:00.0  0     rdmap79s0  0-2"), "{t}");
    }
}
