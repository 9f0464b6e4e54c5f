//! Live-only adjustments: RDMA device names checked against sysfs, CUDA
//! ordinals.

use crate::grouping::{CudaDev, Inventory, Location, NicDev, PciAddr};
use crate::hwloc::PciInfo;
use crate::sysfs::SysRdmaDevice;
use std::collections::BTreeMap;

/// Make the NIC list match `/sys/class/infiniband` (`sys`), the names the
/// backends can open. hwloc's OpenFabrics devices are kept with their place
/// in the PCI tree; devices only sysfs knows are placed by their PCI address
/// (`pci`), or left without location (software devices such as `rxe0`, whose
/// NUMA node is unknown). hwloc devices missing from sysfs are dropped with a
/// warning. With `sys == None` (no RDMA class directory) nothing changes.
pub(crate) fn reconcile_nics(
    inv: &mut Inventory,
    pci: &BTreeMap<PciAddr, PciInfo>,
    sys: Option<Vec<SysRdmaDevice>>,
    numa_of_pci: impl Fn(PciAddr) -> Option<u32>,
) {
    let Some(sys) = sys else {
        return;
    };
    let mut from_hwloc: BTreeMap<String, NicDev> =
        inv.nics.drain(..).map(|n| (n.name.clone(), n)).collect();
    for dev in sys {
        if let Some(mut nic) = from_hwloc.remove(&dev.name) {
            if nic.pci.is_none() {
                nic.pci = dev.pci;
            }
            inv.nics.push(nic);
            continue;
        }
        let placed = dev.pci.and_then(|a| pci.get(&a).map(|info| (a, info)));
        inv.nics.push(match placed {
            Some((addr, info)) => NicDev {
                name: dev.name,
                pci: Some(addr),
                model: Some((info.vendor, info.device)),
                loc: info.loc.clone(),
            },
            None => NicDev {
                name: dev.name,
                pci: dev.pci,
                model: None,
                loc: Location {
                    bridges: Vec::new(),
                    numa: dev.pci.and_then(&numa_of_pci),
                },
            },
        });
    }
    for name in from_hwloc.keys() {
        inv.warnings.push(format!(
            "hwloc lists RDMA device {name} but /sys/class/infiniband does not; left out"
        ));
    }
}

/// CUDA devices when the `cuda` feature is on and a driver answers; a warning
/// otherwise (only when there are NVIDIA GPUs to number).
#[cfg(feature = "cuda")]
pub(crate) fn cuda_devices(inv: &mut Inventory) -> Option<Vec<CudaDev>> {
    if !inv.gpus.iter().any(|g| g.vendor == crate::grouping::NVIDIA) {
        return None;
    }
    match crate::cuda::devices() {
        Ok(list) => Some(list),
        Err(e) => {
            inv.warnings.push(format!(
                "CUDA ordinals unavailable ({e}); GPU indices follow PCI bus order"
            ));
            None
        }
    }
}

/// Without the `cuda` feature GPU indices always follow PCI bus order.
#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_devices(_inv: &mut Inventory) -> Option<Vec<CudaDev>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grouping::{Bridge, BridgeKind};

    fn addr(s: &str) -> PciAddr {
        PciAddr::parse(s).expect("valid address")
    }

    #[test]
    fn sysfs_names_win() {
        let loc = Location {
            bridges: vec![Bridge {
                id: 7,
                kind: BridgeKind::Pci,
            }],
            numa: Some(1),
        };
        let mut inv = Inventory {
            nics: vec![
                NicDev {
                    name: "mlx5_0".into(),
                    pci: Some(addr("0000:43:00.0")),
                    model: Some((0x15b3, 0x101b)),
                    loc: loc.clone(),
                },
                NicDev {
                    name: "stale".into(),
                    pci: Some(addr("0000:44:00.0")),
                    model: None,
                    loc: Location::default(),
                },
            ],
            ..Default::default()
        };
        let mut pci = BTreeMap::new();
        pci.insert(
            addr("0000:4f:00.0"),
            PciInfo {
                vendor: 0x1d0f,
                device: 0xefa1,
                loc: loc.clone(),
            },
        );
        let sys = vec![
            SysRdmaDevice {
                name: "mlx5_0".into(),
                pci: Some(addr("0000:43:00.0")),
            },
            SysRdmaDevice {
                name: "rdmap79s0".into(),
                pci: Some(addr("0000:4f:00.0")),
            },
            SysRdmaDevice {
                name: "mystery".into(),
                pci: Some(addr("0000:99:00.0")),
            },
            SysRdmaDevice {
                name: "rxe0".into(),
                pci: None,
            },
        ];
        reconcile_nics(&mut inv, &pci, Some(sys), |_| Some(3));
        let names: Vec<&str> = inv.nics.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["mlx5_0", "rdmap79s0", "mystery", "rxe0"]);
        assert_eq!(inv.nics[1].loc, loc);
        assert_eq!(inv.nics[1].model, Some((0x1d0f, 0xefa1)));
        assert_eq!(inv.nics[2].loc.numa, Some(3));
        assert_eq!(inv.nics[3].loc.numa, None);
        assert_eq!(inv.warnings.len(), 1);
        assert!(inv.warnings[0].contains("stale"));
    }

    #[test]
    fn no_class_directory_keeps_hwloc_view() {
        let mut inv = Inventory {
            nics: vec![NicDev {
                name: "mlx5_0".into(),
                pci: None,
                model: None,
                loc: Location::default(),
            }],
            ..Default::default()
        };
        reconcile_nics(&mut inv, &BTreeMap::new(), None, |_| None);
        assert_eq!(inv.nics.len(), 1);
    }
}
