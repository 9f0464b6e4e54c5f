//! RDMA devices as the kernel lists them in `/sys/class/infiniband`.
//!
//! These are the names the backends open: ibverbs device names for the verbs
//! backend, and the libfabric EFA provider's domain names (`rdmap79s0`...),
//! which are the same ibverbs names.

use crate::grouping::PciAddr;
use std::path::Path;

/// Default location of the RDMA class directory.
pub(crate) const INFINIBAND_CLASS: &str = "/sys/class/infiniband";

/// One entry of `/sys/class/infiniband`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SysRdmaDevice {
    pub name: String,
    /// PCI function behind `<name>/device`, `None` for software devices
    /// (Soft-RoCE `rxe*`, `siw*`) that have no PCI parent.
    pub pci: Option<PciAddr>,
}

/// List the RDMA devices under `class_dir`. `None` when the directory does not
/// exist or cannot be read (no RDMA stack in this kernel).
pub(crate) fn rdma_devices(class_dir: &Path) -> Option<Vec<SysRdmaDevice>> {
    let entries = std::fs::read_dir(class_dir).ok()?;
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let pci = std::fs::canonicalize(entry.path().join("device"))
            .ok()
            .and_then(|p| pci_of_device_path(&p));
        out.push(SysRdmaDevice { name, pci });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Some(out)
}

/// The nearest PCI function in a resolved sysfs device path
/// (`/sys/devices/pci0000:00/0000:00:02.0/0000:4f:00.0` gives `0000:4f:00.0`).
pub(crate) fn pci_of_device_path(path: &Path) -> Option<PciAddr> {
    path.components()
        .rev()
        .filter_map(|c| c.as_os_str().to_str())
        .find_map(PciAddr::parse)
}

/// NUMA node of a PCI function per sysfs (`-1` or missing gives `None`).
pub(crate) fn pci_numa_node(addr: PciAddr) -> Option<u32> {
    let path = format!("/sys/bus/pci/devices/{addr}/numa_node");
    std::fs::read_to_string(path)
        .ok()?
        .trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn pci_from_paths() {
        let p = PathBuf::from("/sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:00.1");
        assert_eq!(
            pci_of_device_path(&p).map(|a| a.to_string()).as_deref(),
            Some("0000:42:00.1")
        );
        let virt = PathBuf::from("/sys/devices/pci0000:00/0000:00:03.0/virtio0");
        assert_eq!(
            pci_of_device_path(&virt).map(|a| a.to_string()).as_deref(),
            Some("0000:00:03.0")
        );
        assert_eq!(
            pci_of_device_path(Path::new("/sys/devices/virtual/net/veth0")),
            None
        );
    }

    #[test]
    fn fake_class_directory() {
        let root = std::env::temp_dir().join(format!("topo-sysfs-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let class = root.join("class");
        let pci_dev = root.join("devices/pci0000:40/0000:40:01.0/0000:4f:00.0");
        std::fs::create_dir_all(&pci_dev).expect("mkdir");
        std::fs::create_dir_all(class.join("rdmap79s0")).expect("mkdir");
        std::fs::create_dir_all(class.join("rxe0")).expect("mkdir");
        std::os::unix::fs::symlink(&pci_dev, class.join("rdmap79s0/device")).expect("symlink");
        let devs = rdma_devices(&class).expect("listed");
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(
            devs,
            vec![
                SysRdmaDevice {
                    name: "rdmap79s0".into(),
                    pci: PciAddr::parse("0000:4f:00.0"),
                },
                SysRdmaDevice {
                    name: "rxe0".into(),
                    pci: None,
                },
            ]
        );
        assert!(rdma_devices(&root.join("missing")).is_none());
    }
}
