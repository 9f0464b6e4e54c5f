//! Matching a NIC to a libfabric domain: [`Pci`] addresses, what libfabric offers as a
//! domain ([`DomainInfo`]), and [`match_nic`].

use std::fmt;
use std::str::FromStr;

use transport_core::{Error, NicDesc, Result};

use crate::error::runtime_version;

/// A PCI function, `dddd:bb:dd.f`: how NICs are matched to libfabric domains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pci {
    /// PCI domain (segment).
    pub domain: u16,
    /// Bus.
    pub bus: u8,
    /// Device (slot).
    pub device: u8,
    /// Function.
    pub function: u8,
}

impl fmt::Display for Pci {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for Pci {
    type Err = Error;

    /// `dddd:bb:dd.f` or `bb:dd.f` (domain 0), hexadecimal, as sysfs and `lspci -D` print.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidArgument(format!(
                "{s:?} is not a PCI address: expected dddd:bb:dd.f (hexadecimal, e.g. \
                 0000:4f:00.0)"
            ))
        };
        let t = s.trim();
        let (head, function) = t.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(bad()),
        };
        let hex16 = |x: &str| u16::from_str_radix(x, 16).map_err(|_| bad());
        let hex8 = |x: &str| u8::from_str_radix(x, 16).map_err(|_| bad());
        let pci = Pci {
            domain: hex16(domain)?,
            bus: hex8(bus)?,
            device: hex8(device)?,
            function: hex8(function)?,
        };
        if pci.device > 0x1f || pci.function > 7 {
            return Err(bad());
        }
        Ok(pci)
    }
}

/// What libfabric offers as one domain: what a NIC is matched against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainInfo {
    /// Provider (`efa`, `tcp;ofi_rxm`).
    pub provider: String,
    /// Fabric (`efa`, `efa-direct`).
    pub fabric: String,
    /// Domain (`rdmap79s0-rdm`).
    pub domain: String,
    /// The device behind it (`fi_info->nic->device_attr->name`, `rdmap79s0`), or "".
    pub nic_name: String,
    /// Its PCI function (`fi_info->nic->bus_attr`), where the provider reports one.
    pub pci: Option<Pci>,
}

impl fmt::Display for DomainInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.domain)?;
        match self.pci {
            Some(p) => write!(f, " (PCI {p}")?,
            None => write!(f, " (no PCI")?,
        }
        write!(f, ", fabric {})", self.fabric)
    }
}

/// Domain name suffixes of libfabric's efa provider (`efa_domain_name_suffix`): an ibverbs
/// device `rdmap79s0` is the domain `rdmap79s0-rdm` (RDM, on both the `efa` and `efa-direct`
/// fabrics) and `rdmap79s0-dgrm` (datagram).
const DOMAIN_SUFFIXES: [&str; 2] = ["-rdm", "-dgrm"];

/// The domains of `domains` that `nic` names, as indexes, best first.
///
/// - [`NicDesc::pci`] set: the domains at that PCI function. This is how NIXL and pplx-garden
///   match a GPU's NICs (by `fi_info->nic->bus_attr`), and it holds whatever a provider calls
///   its domains (`rdmap79s0-rdm` on efa, and other names on other fabrics). Where no domain is
///   at that address, the name decides, so a provider that reports no bus still matches.
/// - [`NicDesc::device`] set: the domain of that name, else the domain of that device with
///   the efa provider's suffix (`rdmap79s0` is `rdmap79s0-rdm`), else the domain whose
///   `nic->device_attr->name` is that name.
/// - Neither: every domain.
///
/// Nothing matching is [`Error::NoDevice`] listing every domain offered, with its PCI
/// address and fabric.
pub fn match_nic(domains: &[DomainInfo], nic: &NicDesc) -> Result<Vec<usize>> {
    let all: Vec<usize> = (0..domains.len()).collect();
    let want_pci = nic.pci.as_deref().map(str::parse::<Pci>).transpose()?;
    if let Some(p) = want_pci {
        let at: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&i| domains[i].pci == Some(p))
            .collect();
        if !at.is_empty() {
            return Ok(at);
        }
    }
    if let Some(name) = nic.device.as_deref() {
        let rules: [&dyn Fn(&DomainInfo) -> bool; 3] = [
            &|d| d.domain == name,
            &|d| {
                DOMAIN_SUFFIXES
                    .iter()
                    .any(|sfx| d.domain.strip_suffix(sfx) == Some(name))
            },
            &|d| !d.nic_name.is_empty() && d.nic_name == name,
        ];
        for rule in rules {
            let hit: Vec<usize> = all.iter().copied().filter(|&i| rule(&domains[i])).collect();
            if !hit.is_empty() {
                return Ok(hit);
            }
        }
    }
    if want_pci.is_none() && nic.device.is_none() {
        return Ok(all);
    }
    let wanted = match (&nic.device, want_pci) {
        (Some(n), Some(p)) => format!("NIC {n} at PCI {p}"),
        (Some(n), None) => format!("NIC {n}"),
        (None, Some(p)) => format!("the NIC at PCI {p}"),
        (None, None) => unreachable!("handled above"),
    };
    let provider = domains
        .first()
        .map_or("the provider", |d| d.provider.as_str());
    let offered: Vec<String> = domains.iter().map(|d| d.to_string()).collect();
    Err(Error::NoDevice(format!(
        "provider {provider} (libfabric {}) has no domain for {wanted}: it offers {}; name one \
         of them as the device, or check that the NIC's driver is loaded (`fi_info -p {} -v`)",
        runtime_version(),
        if offered.is_empty() {
            "none".to_string()
        } else {
            dedup(offered).join(", ")
        },
        provider.split(';').next().unwrap_or(provider),
    )))
}

pub(crate) fn dedup(mut v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    v.retain(|s| seen.insert(s.clone()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RDM entries of `fi_info -v` text, as the domains a NIC is matched against.
    fn parse_fi_info(text: &str) -> Vec<DomainInfo> {
        let mut out = Vec::new();
        for block in text.split("\n---").skip(1) {
            let mut section = "";
            let mut d = DomainInfo {
                provider: String::new(),
                fabric: String::new(),
                domain: String::new(),
                nic_name: String::new(),
                pci: None,
            };
            let (mut ep_type, mut pci) = (String::new(), [None::<u16>; 4]);
            for line in block.lines() {
                let t = line.trim();
                if t.ends_with(':') && !t.contains(' ') {
                    section = t.trim_end_matches(':');
                    continue;
                }
                let Some((k, v)) = t.split_once(": ") else {
                    continue;
                };
                let v = v.trim().to_string();
                match (section, k) {
                    ("fi_ep_attr", "type") => ep_type = v,
                    ("fi_domain_attr", "name") => d.domain = v,
                    ("fi_fabric_attr", "name") => d.fabric = v,
                    ("fi_fabric_attr", "prov_name") => d.provider = v,
                    ("fi_device_attr", "name") => d.nic_name = v,
                    ("fi_pci_attr", "domain_id") => pci[0] = v.parse().ok(),
                    ("fi_pci_attr", "bus_id") => pci[1] = v.parse().ok(),
                    ("fi_pci_attr", "device_id") => pci[2] = v.parse().ok(),
                    ("fi_pci_attr", "function_id") => pci[3] = v.parse().ok(),
                    _ => {}
                }
            }
            if let [Some(dom), Some(bus), Some(dev), Some(fun)] = pci {
                d.pci = Some(Pci {
                    domain: dom,
                    bus: bus as u8,
                    device: dev as u8,
                    function: fun as u8,
                });
            }
            if ep_type == "FI_EP_RDM" {
                out.push(d);
            }
        }
        out
    }

    const FI_INFO_EFA: &str = include_str!("../tests/data/fi_info_efa.txt");

    fn nic(device: Option<&str>, pci: Option<&str>) -> NicDesc {
        NicDesc {
            device: device.map(str::to_string),
            pci: pci.map(str::to_string),
            ..NicDesc::default()
        }
    }

    #[test]
    fn real_fi_info_parses() {
        let d = parse_fi_info(FI_INFO_EFA);
        let names: Vec<&str> = d.iter().map(|d| d.domain.as_str()).collect();
        assert_eq!(names, ["rdmap79s0-rdm", "rdmap70s0-rdm"]);
        assert_eq!(d[0].nic_name, "rdmap79s0");
        assert_eq!(
            d[0].pci.map(|p| p.to_string()).as_deref(),
            Some("0000:4f:00.0")
        );
        assert_eq!(
            d[1].pci.map(|p| p.to_string()).as_deref(),
            Some("0000:46:00.0")
        );
    }

    /// topo names a p5's EFA NIC by its ibverbs device (`rdmap79s0`, PCI 0000:4f:00.0);
    /// libfabric's efa provider calls the domain `rdmap79s0-rdm`. Matching by name alone
    /// (what this backend did) found no domain, so a p5 run failed before any byte moved.
    #[test]
    fn a_topo_nic_finds_its_efa_domain_by_pci() {
        let d = parse_fi_info(FI_INFO_EFA);
        assert!(
            !d.iter().any(|d| d.domain == "rdmap79s0"),
            "no efa domain carries the bare ibverbs name"
        );
        let p5 = nic(Some("rdmap79s0"), Some("0000:4f:00.0"));
        assert_eq!(match_nic(&d, &p5).unwrap(), [0]);
        // By PCI alone, whatever the name.
        assert_eq!(
            match_nic(&d, &nic(None, Some("0000:46:00.0"))).unwrap(),
            [1]
        );
        assert_eq!(
            match_nic(&d, &nic(Some("renamed0"), Some("0000:46:00.0"))).unwrap(),
            [1]
        );
    }

    /// A name alone (`--devices rdmap79s0`) still finds the domain: exact, then with the
    /// efa provider's suffix, then by the device attribute's name.
    #[test]
    fn a_name_falls_back_to_the_efa_domain_suffix() {
        let d = parse_fi_info(FI_INFO_EFA);
        assert_eq!(
            match_nic(&d, &nic(Some("rdmap79s0-rdm"), None)).unwrap(),
            [0]
        );
        assert_eq!(match_nic(&d, &nic(Some("rdmap70s0"), None)).unwrap(), [1]);
        // A provider that reports no bus: the name decides even with a PCI address given.
        let no_bus: Vec<DomainInfo> = d
            .iter()
            .cloned()
            .map(|mut x| {
                x.pci = None;
                x
            })
            .collect();
        assert_eq!(
            match_nic(&no_bus, &nic(Some("rdmap70s0"), Some("0000:99:00.0"))).unwrap(),
            [1]
        );
        // Neither: every domain.
        assert_eq!(match_nic(&d, &nic(None, None)).unwrap(), [0, 1]);
    }

    /// Both fabrics of efa 2.x (`efa`, `efa-direct`) name the domain alike; both match and
    /// `choose` prefers the `efa` fabric unless `fabric=efa-direct` is given.
    #[test]
    fn both_efa_fabrics_match() {
        let mut d = parse_fi_info(FI_INFO_EFA);
        let mut direct = d[0].clone();
        direct.fabric = "efa-direct".into();
        d.insert(0, direct);
        assert_eq!(
            match_nic(&d, &nic(Some("rdmap79s0"), Some("0000:4f:00.0"))).unwrap(),
            [0, 1]
        );
    }

    #[test]
    fn no_match_lists_what_libfabric_offers() {
        let d = parse_fi_info(FI_INFO_EFA);
        let e = match_nic(&d, &nic(Some("mlx5_0"), Some("0000:aa:00.0"))).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, Error::NoDevice(_)), "{e:?}");
        for want in [
            "mlx5_0 at PCI 0000:aa:00.0",
            "rdmap79s0-rdm (PCI 0000:4f:00.0, fabric efa)",
            "rdmap70s0-rdm (PCI 0000:46:00.0, fabric efa)",
            "fi_info -p efa -v",
        ] {
            assert!(m.contains(want), "{want:?} missing from: {m}");
        }
        match match_nic(&d, &nic(None, Some("4f:00"))) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("dddd:bb:dd.f"), "{m}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn pci_addresses_parse_and_print() {
        let p: Pci = "0000:4f:00.0".parse().unwrap();
        assert_eq!(
            p,
            Pci {
                domain: 0,
                bus: 0x4f,
                device: 0,
                function: 0
            }
        );
        assert_eq!(p.to_string(), "0000:4f:00.0");
        assert_eq!("4f:00.0".parse::<Pci>().unwrap(), p);
        assert_eq!(
            "0001:AB:1f.7".parse::<Pci>().unwrap().to_string(),
            "0001:ab:1f.7"
        );
        for bad in [
            "",
            "4f",
            "0000:4f:00",
            "0000:4f:20.0",
            "0000:4f:00.8",
            "x:4f:00.0",
        ] {
            assert!(bad.parse::<Pci>().is_err(), "{bad:?}");
        }
    }
}
