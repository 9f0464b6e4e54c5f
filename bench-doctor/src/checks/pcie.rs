//! PCIe checks: the GPU and NIC links' width and speed, the IOMMU mode, and ACS peer-to-peer
//! redirect on the bridges between GPUs and NICs.

use std::fmt::Write as _;

use super::{check, short_list};
use crate::report::{Check, Status};
use crate::sys::{self, Facts, Sys};

pub(crate) fn pcie_links(f: &Facts) -> Vec<Check> {
    let nic_pci: Vec<(&str, &str)> =
        f.ib.iter()
            .filter_map(|d| d.pci.as_deref().map(|p| (d.name.as_str(), p)))
            .collect();
    let mut devs: Vec<(String, bool, &sys::PciDev)> = f
        .gpus()
        .into_iter()
        .map(|d| (format!("GPU {}", d.addr), true, d))
        .collect();
    for (name, addr) in &nic_pci {
        if let Some(d) = f.pci.get(*addr) {
            devs.push((format!("{name} {addr}"), false, d));
        }
    }
    if devs.is_empty() {
        return vec![check(
            "pcie.links",
            Status::Skip,
            "no GPU or RDMA NIC on PCI",
            None,
        )];
    }
    let (mut narrow, mut slow, mut idle, mut unknown) = (vec![], vec![], vec![], 0);
    for (name, gpu, d) in &devs {
        let (Some(cw), Some(mw)) = (d.cur_width, d.max_width) else {
            unknown += 1;
            continue;
        };
        if cw < mw {
            narrow.push(format!("{name} x{cw} of x{mw}"));
        }
        let cs = d.cur_speed.as_deref().and_then(sys::gts);
        let ms = d.max_speed.as_deref().and_then(sys::gts);
        if let (Some(c), Some(m)) = (cs, ms) {
            if c + 0.01 < m {
                let s = format!("{name} {c} of {m} GT/s");
                if *gpu {
                    idle.push(s);
                } else {
                    slow.push(s);
                }
            }
        }
    }
    let mut out = Vec::new();
    let n = devs.len() - unknown;
    if !narrow.is_empty() {
        out.push(check(
            "pcie.width",
            Status::Fail,
            format!("{} link(s) narrower than they can be: {}", narrow.len(), short_list(&narrow)),
            Some("a degraded PCIe link: reseat the card/riser or replace the node (`lspci -vv | grep LnkSta`)"),
        ));
    }
    if !slow.is_empty() {
        out.push(check(
            "pcie.speed",
            Status::Warn,
            format!(
                "{} NIC link(s) below their top speed: {}",
                slow.len(),
                short_list(&slow)
            ),
            Some("the link trained down: check `lspci -vv` LnkSta and the slot; reseat or replace"),
        ));
    }
    if out.is_empty() {
        let mut s = format!("{n} GPU/NIC link(s) at full width");
        if !idle.is_empty() {
            let _ = write!(
                s,
                "; {} GPU link(s) below top speed, normal while idle (GPUs slow the link to save power; judge under load)",
                idle.len()
            );
        }
        if unknown > 0 {
            let _ = write!(
                s,
                "; {unknown} without link attributes (virtual functions?)"
            );
        }
        out.push(check(
            "pcie.links",
            if n == 0 { Status::Skip } else { Status::Ok },
            s,
            None,
        ));
    }
    out
}

pub(crate) fn iommu(f: &Facts) -> Check {
    let cmd = f.cmdline.split_whitespace().collect::<Vec<_>>();
    let pt = cmd.contains(&"iommu=pt");
    let forced = cmd
        .iter()
        .find(|a| a.starts_with("intel_iommu=on") || a.starts_with("amd_iommu=on"));
    if f.iommu_groups == 0 {
        return check(
            "iommu",
            Status::Ok,
            "IOMMU off (no IOMMU groups): peer-to-peer is not translated",
            None,
        );
    }
    if pt {
        return check(
            "iommu",
            Status::Ok,
            format!(
                "IOMMU on in passthrough mode (iommu=pt), {} group(s)",
                f.iommu_groups
            ),
            None,
        );
    }
    check(
        "iommu",
        Status::Warn,
        format!(
            "IOMMU on in translated mode ({} group(s){}, no iommu=pt): GPU-NIC peer-to-peer goes through the IOMMU (slow or blocked)",
            f.iommu_groups,
            forced.map(|a| format!(", {a}")).unwrap_or_default()
        ),
        Some("add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX) and reboot"),
    )
}

/// PCIe extended capability id of ACS.
const ACS_CAP: u16 = 0x000d;

/// The ACS control register of a device's config space, where the file holds the
/// extended capabilities (root reads 4096 bytes; others get 64).
pub fn acs_ctrl(config: &[u8]) -> Option<u16> {
    if config.len() < 0x104 {
        return None;
    }
    let rd32 = |o: usize| -> Option<u32> {
        config
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut off = 0x100usize;
    for _ in 0..64 {
        let h = rd32(off)?;
        if h == 0 || h == 0xffff_ffff {
            return None;
        }
        if (h & 0xffff) as u16 == ACS_CAP {
            let c = config.get(off + 6..off + 8)?;
            return Some(u16::from_le_bytes([c[0], c[1]]));
        }
        let next = (h >> 20) as usize & 0xffc;
        if next < 0x100 {
            return None;
        }
        off = next;
    }
    None
}

pub(crate) fn acs(sys: &Sys, f: &Facts) -> Check {
    if f.gpus().is_empty() || f.ib.is_empty() {
        return check(
            "pcie.acs",
            Status::Skip,
            "no GPU-to-NIC peer-to-peer on this host",
            None,
        );
    }
    let bridges: Vec<&sys::PciDev> = f.pci.values().filter(|d| d.is_bridge()).collect();
    let mut read = 0;
    let mut redirect = Vec::new();
    for b in &bridges {
        let Some(cfg) = sys.bytes(&format!("/sys/bus/pci/devices/{}/config", b.addr)) else {
            continue;
        };
        if cfg.len() < 0x104 {
            continue;
        }
        read += 1;
        if let Some(ctl) = acs_ctrl(&cfg) {
            // Bit 2: P2P Request Redirect, bit 3: P2P Completion Redirect.
            if ctl & 0b1100 != 0 {
                redirect.push(b.addr.clone());
            }
        }
    }
    if bridges.is_empty() {
        return check(
            "pcie.acs",
            Status::Skip,
            "no PCIe bridge listed: nothing between GPU and NIC to redirect peer-to-peer",
            None,
        );
    }
    if read == 0 {
        return check(
            "pcie.acs",
            Status::Skip,
            format!(
                "ACS control of {} bridge(s) not readable: it sits in PCIe extended config space, which only root can read",
                bridges.len()
            ),
            Some("run doctor as root, or `sudo lspci -vvv | grep -i ACSCtl` (ReqRedir+/CmpltRedir+ on a switch port blocks direct P2P)"),
        );
    }
    if redirect.is_empty() {
        return check(
            "pcie.acs",
            Status::Ok,
            format!("no P2P redirect in the ACS control of {read} bridge(s)"),
            None,
        );
    }
    check(
        "pcie.acs",
        Status::Warn,
        format!(
            "ACS redirects peer-to-peer to the root complex on {} bridge(s): {}",
            redirect.len(),
            short_list(&redirect)
        ),
        Some("disable ACS P2P redirect on the PCIe switch ports (BIOS, or `setpci -s BDF ECAP_ACS+6.w=0`) for GPUDirect RDMA"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acs_control_is_found_in_the_extended_capability_list() {
        let mut cfg = vec![0u8; 4096];
        // 0x100: AER (id 1), next at 0x148; 0x148: ACS (id 0xd), next 0.
        cfg[0x100..0x104].copy_from_slice(&(1u32 | (0x148 << 20)).to_le_bytes());
        cfg[0x148..0x14c].copy_from_slice(&(ACS_CAP as u32 | (1 << 16)).to_le_bytes());
        cfg[0x14e..0x150].copy_from_slice(&0x001du16.to_le_bytes());
        assert_eq!(acs_ctrl(&cfg), Some(0x1d));
        assert_eq!(acs_ctrl(&cfg[..64]), None);
        let mut no = vec![0u8; 4096];
        no[0x100..0x104].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(acs_ctrl(&no), None);
    }
}
