//! What doctor reads of a machine: sysfs and procfs under an injectable root (`/` live, a
//! fixture tree in tests), gathered once into [`Facts`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::instances::{self, Instance};

/// Files of one machine, under `root`.
#[derive(Clone, Debug)]
pub struct Sys {
    root: PathBuf,
}

impl Sys {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sys { root: root.into() }
    }
    /// `abs` (an absolute path on the machine) under the root.
    pub fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }
    /// A text file, trimmed; `None` when missing or unreadable.
    pub fn read(&self, abs: &str) -> Option<String> {
        std::fs::read_to_string(self.path(abs))
            .ok()
            .map(|s| s.trim().to_string())
    }
    pub fn bytes(&self, abs: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(abs)).ok()
    }
    pub fn exists(&self, abs: &str) -> bool {
        self.path(abs).exists()
    }
    /// Entry names of a directory, sorted; empty when missing.
    pub fn list(&self, abs: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path(abs))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
    /// The last component of a symlink's target (`driver` -> `efa`).
    pub fn link_name(&self, abs: &str) -> Option<String> {
        let t = std::fs::read_link(self.path(abs)).ok()?;
        t.file_name()?.to_str().map(str::to_string)
    }
    /// The PCI address a symlink points at (its last component of that form).
    pub fn link_pci(&self, abs: &str) -> Option<String> {
        let t = std::fs::read_link(self.path(abs)).ok()?;
        t.components()
            .rev()
            .filter_map(|c| c.as_os_str().to_str())
            .find(|c| is_pci_addr(c))
            .map(str::to_string)
    }
}

/// `dddd:bb:dd.f`.
pub fn is_pci_addr(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// One PCI function.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PciDev {
    pub addr: String,
    pub vendor: String,
    pub device: String,
    pub class: String,
    pub driver: Option<String>,
    pub numa: Option<u32>,
    pub cur_speed: Option<String>,
    pub max_speed: Option<String>,
    pub cur_width: Option<u32>,
    pub max_width: Option<u32>,
}

impl PciDev {
    /// NVIDIA or AMD display/3D controller.
    pub fn is_gpu(&self) -> bool {
        matches!(self.vendor.as_str(), "0x10de" | "0x1002")
            && ["0x0300", "0x0302", "0x0380"]
                .iter()
                .any(|c| self.class.starts_with(c))
    }
    pub fn is_bridge(&self) -> bool {
        self.class.starts_with("0x0604")
    }
}

/// One port of an RDMA device.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Port {
    pub num: String,
    pub state: Option<String>,
    pub phys_state: Option<String>,
    pub rate: Option<String>,
}

impl Port {
    /// `100 Gb/sec (4X EDR)` -> 100.
    pub fn gbps(&self) -> Option<f64> {
        self.rate
            .as_deref()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
    pub fn active(&self) -> bool {
        self.state.as_deref().is_some_and(|s| s.contains("ACTIVE"))
    }
    pub fn link_up(&self) -> bool {
        // phys_state is absent on some software devices; state decides there.
        self.phys_state
            .as_deref()
            .is_none_or(|s| s.contains("LinkUp"))
    }
}

/// One RDMA device of `/sys/class/infiniband`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IbDev {
    pub name: String,
    pub pci: Option<String>,
    /// `efa`, `mlx5_core`, `rdma_rxe`... (the PCI function's driver, or the name's family).
    pub kind: String,
    pub ports: Vec<Port>,
}

/// A resource limit as `/proc/PID/limits` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    Bytes(u64),
}

/// Everything doctor knows about the machine's files.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub product: Option<String>,
    pub vendor: Option<String>,
    pub instance: Option<&'static Instance>,
    pub pci: BTreeMap<String, PciDev>,
    pub ib: Vec<IbDev>,
    /// Loaded kernel modules (`/proc/modules`, plus `/sys/module` entries).
    pub modules: Vec<String>,
    /// Soft RLIMIT_MEMLOCK of this process (`/proc/self/limits`).
    pub memlock: Option<Limit>,
    pub cmdline: String,
    pub iommu_groups: usize,
    pub kernel: Option<String>,
    /// `/proc/driver/nvidia/version`, first line.
    pub nvidia: Option<String>,
}

impl Facts {
    pub fn gpus(&self) -> Vec<&PciDev> {
        self.pci.values().filter(|d| d.is_gpu()).collect()
    }
    pub fn nics_of(&self, kind: &str) -> Vec<&IbDev> {
        self.ib.iter().filter(|d| d.kind == kind).collect()
    }
    pub fn has_efa(&self) -> bool {
        !self.nics_of("efa").is_empty() || self.instance.is_some_and(|i| i.nic_driver == "efa")
    }
    /// Whether some EFA device is of the first two generations (PCI device 0xefa0 or
    /// 0xefa1: p3dn, p4d, p5, p5e), where libfabric's efa provider turns device RDMA off by
    /// default for applications asking API versions below 1.18; p5 by its instance type
    /// where the PCI functions cannot be read.
    pub fn efa_gen1_or_2(&self) -> bool {
        let by_id = self.nics_of("efa").iter().any(|n| {
            n.pci
                .as_ref()
                .and_then(|p| self.pci.get(p))
                .is_some_and(|d| matches!(d.device.as_str(), "0xefa0" | "0xefa1"))
        });
        by_id
            || self
                .instance
                .is_some_and(|i| matches!(i.name.as_str(), "p4d" | "p5" | "p5e"))
    }
    pub fn has_mlx5(&self) -> bool {
        !self.nics_of("mlx5").is_empty()
    }
    pub fn module(&self, name: &str) -> bool {
        self.modules.iter().any(|m| m == name)
    }
}

fn parse_u32(s: Option<String>) -> Option<u32> {
    s?.trim().parse().ok()
}

/// `/proc/self/limits`' "Max locked memory" soft value.
pub fn parse_memlock(limits: &str) -> Option<Limit> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        Some(Limit::Unlimited)
    } else {
        soft.parse().ok().map(Limit::Bytes)
    }
}

fn pci_dev(sys: &Sys, addr: &str) -> PciDev {
    let base = format!("/sys/bus/pci/devices/{addr}");
    let f = |n: &str| sys.read(&format!("{base}/{n}"));
    PciDev {
        addr: addr.to_string(),
        vendor: f("vendor").unwrap_or_default(),
        device: f("device").unwrap_or_default(),
        class: f("class").unwrap_or_default(),
        driver: sys.link_name(&format!("{base}/driver")),
        numa: f("numa_node")
            .and_then(|s| s.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok()),
        cur_speed: f("current_link_speed"),
        max_speed: f("max_link_speed"),
        cur_width: parse_u32(f("current_link_width")),
        max_width: parse_u32(f("max_link_width")),
    }
}

fn kind_of(name: &str, driver: Option<&str>) -> String {
    match driver {
        Some("efa") => "efa".into(),
        Some("mlx5_core") => "mlx5".into(),
        Some(d) => d.to_string(),
        None if name.starts_with("rdmap") || name.starts_with("efa") => "efa".into(),
        None if name.starts_with("mlx5") => "mlx5".into(),
        None if name.starts_with("rxe") => "rxe".into(),
        None if name.starts_with("siw") => "siw".into(),
        None => "unknown".into(),
    }
}

/// Read everything under `sys`.
pub fn gather(sys: &Sys) -> Facts {
    let mut f = Facts {
        product: sys.read("/sys/class/dmi/id/product_name"),
        vendor: sys.read("/sys/class/dmi/id/sys_vendor"),
        ..Facts::default()
    };
    f.instance = f.product.as_deref().and_then(instances::by_product);
    for addr in sys.list("/sys/bus/pci/devices") {
        if is_pci_addr(&addr) {
            let d = pci_dev(sys, &addr);
            f.pci.insert(addr, d);
        }
    }
    for name in sys.list("/sys/class/infiniband") {
        let base = format!("/sys/class/infiniband/{name}");
        let pci = sys.link_pci(&format!("{base}/device"));
        let driver = pci
            .as_ref()
            .and_then(|a| f.pci.get(a))
            .and_then(|d| d.driver.clone());
        let ports = sys
            .list(&format!("{base}/ports"))
            .into_iter()
            .map(|num| {
                let p = format!("{base}/ports/{num}");
                Port {
                    state: sys.read(&format!("{p}/state")),
                    phys_state: sys.read(&format!("{p}/phys_state")),
                    rate: sys.read(&format!("{p}/rate")),
                    num,
                }
            })
            .collect();
        f.ib.push(IbDev {
            kind: kind_of(&name, driver.as_deref()),
            name,
            pci,
            ports,
        });
    }
    let mut modules: Vec<String> = sys
        .read("/proc/modules")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    modules.extend(sys.list("/sys/module"));
    modules.sort();
    modules.dedup();
    f.modules = modules;
    f.memlock = sys
        .read("/proc/self/limits")
        .and_then(|l| parse_memlock(&l));
    f.cmdline = sys.read("/proc/cmdline").unwrap_or_default();
    f.iommu_groups = sys.list("/sys/kernel/iommu_groups").len();
    f.kernel = sys.read("/proc/sys/kernel/osrelease");
    f.nvidia = sys
        .read("/proc/driver/nvidia/version")
        .and_then(|s| s.lines().next().map(str::to_string));
    f
}

/// `5.15.0-1049-aws` -> (5, 15).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// `32.0 GT/s PCIe` -> 32.0.
pub fn gts(speed: &str) -> Option<f64> {
    speed.split_whitespace().next()?.parse().ok()
}

/// Whether `path` is a directory (for the `--root` argument check).
pub fn is_dir(path: &Path) -> bool {
    path.is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_parsers() {
        assert!(is_pci_addr("0000:4f:00.0"));
        assert!(!is_pci_addr("0000:4f:00"));
        assert!(!is_pci_addr("pci0000:00"));
        let l = "Limit                     Soft Limit           Hard Limit           Units     \nMax locked memory         8388608              8388608              bytes     \n";
        assert_eq!(parse_memlock(l), Some(Limit::Bytes(8388608)));
        let u = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(parse_memlock(u), Some(Limit::Unlimited));
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(gts("16.0 GT/s PCIe"), Some(16.0));
        let p = Port {
            rate: Some("100 Gb/sec (4X EDR)".into()),
            ..Port::default()
        };
        assert_eq!(p.gbps(), Some(100.0));
    }
}
