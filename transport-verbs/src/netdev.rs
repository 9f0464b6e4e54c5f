//! What the host knows about the netdevs behind RoCE GIDs: names, VLANs, addresses with their
//! prefix lengths. Read once per endpoint open, never on the hot path.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The host's interface addresses and VLAN interfaces.
#[derive(Debug, Default)]
pub(crate) struct Interfaces {
    /// (netdev, address, prefix length).
    addrs: Vec<(String, IpAddr, u8)>,
    /// (VLAN netdev, VLAN id) from `/proc/net/vlan/config`.
    vlans: Vec<(String, u16)>,
}

impl Interfaces {
    /// `getifaddrs` and `/proc/net/vlan/config` (present once the 8021q module is loaded);
    /// whatever cannot be read is left out, and the GID choice then goes without it.
    pub(crate) fn read() -> Self {
        Self {
            addrs: if_addrs(),
            vlans: std::fs::read_to_string("/proc/net/vlan/config")
                .map(|t| parse_vlan_config(&t))
                .unwrap_or_default(),
        }
    }

    /// The prefix length of `ip` on `netdev` (or on any netdev, where the netdev is unknown).
    pub(crate) fn prefix_of(&self, netdev: Option<&str>, ip: IpAddr) -> Option<u8> {
        self.addrs
            .iter()
            .find(|(n, a, _)| *a == ip && netdev.is_none_or(|d| d == n))
            .map(|(_, _, p)| *p)
    }

    /// The VLAN id of `netdev`, where it is a VLAN interface.
    pub(crate) fn vlan_of(&self, netdev: &str) -> Option<u16> {
        self.vlans
            .iter()
            .find(|(n, _)| n == netdev)
            .map(|(_, v)| *v)
    }
}

/// `/proc/net/vlan/config`: two header lines, then `NAME | VID | REAL-DEV` per VLAN.
pub(crate) fn parse_vlan_config(text: &str) -> Vec<(String, u16)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('|').map(str::trim);
            let name = f.next()?;
            let vid = f.next()?.parse().ok()?;
            f.next()?;
            (!name.is_empty()).then(|| (name.to_string(), vid))
        })
        .collect()
}

/// The name of interface `ifindex` in this network namespace.
pub(crate) fn ifindex_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname requires; it writes a
    // NUL-terminated name there or returns NULL.
    let r = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if r.is_null() {
        return None;
    }
    // SAFETY: on success `buf` holds a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

fn prefix_len(mask: &[u8]) -> u8 {
    let mut n = 0u32;
    for b in mask {
        n += b.leading_ones();
        if *b != 0xff {
            break;
        }
    }
    n as u8
}

/// Every IPv4 and IPv6 address of every interface, with its prefix length.
fn if_addrs() -> Vec<(String, IpAddr, u8)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; a list returned is freed below, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: a non-null ifa_addr points to a sockaddr at least as long as its family's.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let (ip, mask) = match family {
            libc::AF_INET => {
                // SAFETY: AF_INET: the address is a sockaddr_in.
                let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let ip = IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)));
                let mask = if ifa.ifa_netmask.is_null() {
                    None
                } else {
                    // SAFETY: the netmask of an AF_INET address is a sockaddr_in.
                    let m = unsafe { &*(ifa.ifa_netmask as *const libc::sockaddr_in) };
                    Some(prefix_len(&m.sin_addr.s_addr.to_ne_bytes()))
                };
                (ip, mask)
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6: the address is a sockaddr_in6.
                let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let ip = IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr));
                let mask = if ifa.ifa_netmask.is_null() {
                    None
                } else {
                    // SAFETY: the netmask of an AF_INET6 address is a sockaddr_in6.
                    let m = unsafe { &*(ifa.ifa_netmask as *const libc::sockaddr_in6) };
                    Some(prefix_len(&m.sin6_addr.s6_addr))
                };
                (ip, mask)
            }
            _ => continue,
        };
        if let Some(m) = mask {
            out.push((name, ip, m));
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it survives.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_config() {
        let t = "VLAN Dev name    | VLAN ID\n\
                 Name-Type: VLAN_NAME_TYPE_RAW_PLUS_VID_NO_PAD\n\
                 veth0.100      | 100  | veth0\n\
                 eth1.7         | 7  | eth1\n";
        assert_eq!(
            parse_vlan_config(t),
            [("veth0.100".to_string(), 100), ("eth1.7".to_string(), 7)]
        );
        assert!(parse_vlan_config("").is_empty());
    }

    #[test]
    fn masks() {
        assert_eq!(prefix_len(&[255, 255, 255, 0]), 24);
        assert_eq!(prefix_len(&[255, 255, 254, 0]), 23);
        assert_eq!(prefix_len(&[0, 0, 0, 0]), 0);
        assert_eq!(prefix_len(&[255; 16]), 128);
        let mut m = [0u8; 16];
        m[..8].fill(255);
        assert_eq!(prefix_len(&m), 64);
    }

    /// The host's own loopback address is found with its /8.
    #[test]
    fn loopback_prefix() {
        let i = Interfaces::read();
        if let Some(p) = i.prefix_of(Some("lo"), IpAddr::V4(Ipv4Addr::LOCALHOST)) {
            assert_eq!(p, 8);
        }
    }
}
