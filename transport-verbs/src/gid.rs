//! Which GID a queue pair sends from and which of the peer's it sends to.
//!
//! The choice is a pure function over the port's GID table ([`GidEntry`]: index, GID, type, the
//! netdev with its VLAN and the prefix of the matching IP address) and the GIDs the peer
//! advertises ([`WireGid`]), so InfiniBand tables, mixed RoCE v1/v2 tables, VLANs and several
//! subnets are unit-tested without hardware (the tests, as long as the choice, are in
//! `gid/tests.rs`). Reading the table from the system is another concept, elsewhere:
//! `device::read_gid_table`, with the netdevs and IP prefixes from `netdev`.
//!
//! Each side advertises its candidates (every RoCE GID of the port, best first, at most
//! [`MAX_GIDS`]; or only the index forced with `gid=N`). For each peer both sides rank every
//! compatible pair (same GID type, same IP family) of their own and the peer's candidates with
//! one symmetric order, so the two ends of a connection pick the same pair:
//! 1. RoCE v2 before v1;
//! 2. a pair on one IP subnet (each address inside the other's prefix) before one where only
//!    one side's prefix holds the other, before no subnet match (a routed fabric). Link-local
//!    IPv6 GIDs never count as a subnet match;
//! 3. untagged netdevs before VLANs (so a VLAN is used only where its subnet alone reaches the
//!    peer);
//! 4. IPv4 before global IPv6 before link-local;
//! 5. the lower pair of GIDs (as bytes, smaller first), the same from either end.

use std::cmp::Reverse;
use std::net::{Ipv4Addr, Ipv6Addr};

use transport_core::{Error, Result};

/// GIDs an address carries at most.
pub const MAX_GIDS: usize = 16;

/// The type of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GidKind {
    /// InfiniBand (the LID routes; a GRH only on request).
    Ib,
    /// RoCE v1 (Ethernet, no IP header; `IB/RoCE v1` in sysfs).
    RoceV1,
    /// RoCE v2 (UDP/IP).
    RoceV2,
}

impl GidKind {
    /// The byte that stands for it in an address.
    pub fn to_wire(self) -> u8 {
        match self {
            GidKind::Ib => 1,
            GidKind::RoceV1 => 2,
            GidKind::RoceV2 => 3,
        }
    }
    /// The kind a byte of an address stands for.
    pub fn from_wire(b: u8) -> Option<Self> {
        match b {
            1 => Some(GidKind::Ib),
            2 => Some(GidKind::RoceV1),
            3 => Some(GidKind::RoceV2),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            GidKind::Ib => "IB",
            GidKind::RoceV1 => "RoCE v1",
            GidKind::RoceV2 => "RoCE v2",
        }
    }
}

/// One GID as the peer learns it from the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireGid {
    pub gid: [u8; 16],
    pub kind: GidKind,
    /// Prefix length of the subnet of the GID's IP address on its netdev (`/24`); 0 where
    /// unknown (InfiniBand, or the address was not found on the host).
    pub prefix_len: u8,
    /// Whether the GID belongs to a VLAN interface.
    pub vlan: bool,
}

/// One entry of this host's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GidEntry {
    pub(crate) index: u8,
    pub(crate) wire: WireGid,
    /// The entry's netdev (`ndev_ifindex`, or sysfs `gid_attrs/ndevs`), where known.
    pub(crate) netdev: Option<String>,
    /// The netdev's VLAN id, where it is a VLAN interface.
    pub(crate) vlan_id: Option<u16>,
}

/// The GIDs one peer's queue pairs use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerPath {
    /// Local GID index (`ah_attr.grh.sgid_index`).
    pub sgid_index: u8,
    /// Local GID.
    pub sgid: [u8; 16],
    /// The peer's GID (`ah_attr.grh.dgid`); zero on InfiniBand without a GRH.
    pub dgid: [u8; 16],
    /// The local GID's netdev, where known.
    pub netdev: Option<String>,
    /// Its VLAN id, where it is a VLAN interface.
    pub vlan: Option<u16>,
}

pub(crate) fn is_v4_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff
}

fn is_link_local(g: &[u8; 16]) -> bool {
    g[0] == 0xfe && g[1] & 0xc0 == 0x80
}

/// A GID as people write it: the IPv4 address of an IPv4-mapped GID, else IPv6 notation.
pub fn gid_text(g: &[u8; 16]) -> String {
    if is_v4_mapped(g) {
        Ipv4Addr::new(g[12], g[13], g[14], g[15]).to_string()
    } else {
        Ipv6Addr::from(*g).to_string()
    }
}

impl GidEntry {
    fn describe(&self) -> String {
        let mut s = format!(
            "[{}] {} {}",
            self.index,
            self.wire.kind.name(),
            gid_text(&self.wire.gid)
        );
        if self.wire.prefix_len > 0 {
            s.push_str(&format!("/{}", self.wire.prefix_len));
        }
        if let Some(n) = &self.netdev {
            s.push_str(&format!(" on {n}"));
        }
        if let Some(v) = self.vlan_id {
            s.push_str(&format!(" (VLAN {v})"));
        }
        s
    }
}

/// 0 IPv4, 1 global IPv6, 2 link-local: lower is preferred.
fn family(g: &[u8; 16]) -> u8 {
    if is_v4_mapped(g) {
        0
    } else if is_link_local(g) {
        2
    } else {
        1
    }
}

fn kind_rank(k: GidKind) -> u8 {
    match k {
        GidKind::RoceV2 => 0,
        GidKind::RoceV1 => 1,
        GidKind::Ib => 2,
    }
}

/// How good an entry is on its own (lower first): what a side offers first.
fn own_key(e: &GidEntry) -> (u8, bool, u8, u8) {
    (
        kind_rank(e.wire.kind),
        e.wire.vlan,
        family(&e.wire.gid),
        e.index,
    )
}

/// Whether `ip` lies in `owner`'s subnet (its address and prefix length).
fn in_subnet(owner: &WireGid, ip: &[u8; 16]) -> bool {
    let (a, b, len) = if is_v4_mapped(&owner.gid) {
        if !is_v4_mapped(ip) || owner.prefix_len > 32 {
            return false;
        }
        (&owner.gid[12..], &ip[12..], owner.prefix_len as usize)
    } else {
        if is_v4_mapped(ip) || owner.prefix_len > 128 {
            return false;
        }
        (&owner.gid[..], &ip[..], owner.prefix_len as usize)
    };
    if len == 0 {
        return false; // unknown
    }
    let (full, rest) = (len / 8, len % 8);
    if a[..full] != b[..full] {
        return false;
    }
    rest == 0 || (a[full] ^ b[full]) & (0xffu8 << (8 - rest)) == 0
}

/// Type, subnet match, untagged ends, IP family (each higher is better), then the lower pair
/// of GIDs.
type PairKey = (u8, u8, u8, u8, Reverse<([u8; 16], [u8; 16])>);

/// The rank of a pair of GIDs, the same whichever end computes it; `None` where the two
/// cannot talk (other GID types, other IP families). Higher is better.
fn pair_key(l: &WireGid, r: &WireGid) -> Option<PairKey> {
    if l.kind != r.kind {
        return None;
    }
    if l.kind != GidKind::Ib && is_v4_mapped(&l.gid) != is_v4_mapped(&r.gid) {
        return None;
    }
    let subnet = if l.kind == GidKind::Ib || is_link_local(&l.gid) || is_link_local(&r.gid) {
        0
    } else {
        match (in_subnet(l, &r.gid), in_subnet(r, &l.gid)) {
            (true, true) => 2,
            (true, false) | (false, true) => 1,
            (false, false) => 0,
        }
    };
    let untagged = u8::from(!l.vlan) + u8::from(!r.vlan);
    // The worse of the two: a global and a link-local IPv6 GID rank as link-local.
    let fam = family(&l.gid).max(family(&r.gid));
    let lo_hi = if l.gid <= r.gid {
        (l.gid, r.gid)
    } else {
        (r.gid, l.gid)
    };
    Some((
        2 - kind_rank(l.kind),
        subnet,
        untagged,
        2 - fam,
        Reverse(lo_hi),
    ))
}

/// What this side offers: the entry at `forced` alone, else on InfiniBand index 0 (none where
/// the table is empty: the LID routes), else every RoCE entry, best first, at most
/// [`MAX_GIDS`].
pub(crate) fn candidates(
    table: &[GidEntry],
    roce: bool,
    forced: Option<u8>,
    device: &str,
    port: u8,
) -> Result<Vec<GidEntry>> {
    if let Some(i) = forced {
        return match table.iter().find(|e| e.index == i) {
            Some(e) => Ok(vec![e.clone()]),
            None => Err(Error::InvalidArgument(format!(
                "GID index {i} of {device} port {port} is empty: list the valid ones with \
                 `show_gids {device}` or in /sys/class/infiniband/{device}/ports/{port}/gids/ \
                 (types in ../gid_attrs/types/)"
            ))),
        };
    }
    if !roce {
        return Ok(table.iter().filter(|e| e.index == 0).cloned().collect());
    }
    let mut c: Vec<GidEntry> = table
        .iter()
        .filter(|e| e.wire.kind != GidKind::Ib)
        .cloned()
        .collect();
    if c.is_empty() {
        return Err(Error::NoDevice(format!(
            "{device} port {port} has no RoCE GID: give its network interface an IP address \
             (RoCE GIDs come from the netdev's addresses)"
        )));
    }
    c.sort_by_key(own_key);
    c.truncate(MAX_GIDS);
    Ok(c)
}

/// The pair of `local` (this side's candidates) and `remote` (the peer's) that the queue
/// pairs to this peer use, as indexes into the two slices; `None` where no pair can talk.
pub(crate) fn choose_pair(local: &[GidEntry], remote: &[WireGid]) -> Option<(usize, usize)> {
    let mut best = None;
    for (i, l) in local.iter().enumerate() {
        for (j, r) in remote.iter().enumerate() {
            if let Some(k) = pair_key(&l.wire, r) {
                if best.as_ref().is_none_or(|(bk, _, _)| k > *bk) {
                    best = Some((k, i, j));
                }
            }
        }
    }
    best.map(|(_, i, j)| (i, j))
}

/// [`choose_pair`] as the path of one peer; on InfiniBand without GIDs, index 0 and no GRH.
/// An error names both sides' GIDs.
pub(crate) fn peer_path(local: &[GidEntry], remote: &[WireGid], roce: bool) -> Result<PeerPath> {
    if let Some((i, j)) = choose_pair(local, remote) {
        let l = &local[i];
        return Ok(PeerPath {
            sgid_index: l.index,
            sgid: l.wire.gid,
            dgid: remote[j].gid,
            netdev: l.netdev.clone(),
            vlan: l.vlan_id,
        });
    }
    if !roce {
        // The LID routes; a GRH is added only with GIDs on both sides.
        return Ok(PeerPath {
            sgid_index: local.first().map_or(0, |e| e.index),
            sgid: local.first().map_or([0; 16], |e| e.wire.gid),
            dgid: remote.first().map_or([0; 16], |r| r.gid),
            netdev: None,
            vlan: None,
        });
    }
    let ours: Vec<String> = local.iter().map(GidEntry::describe).collect();
    let theirs: Vec<String> = remote
        .iter()
        .map(|r| format!("{} {}", r.kind.name(), gid_text(&r.gid)))
        .collect();
    Err(Error::InvalidArgument(format!(
        "no GID of this port can reach the peer's: this side offers {}, the peer {}; both ends \
         need GIDs of the same RoCE version and IP family (set gid=N on both, see `show_gids`)",
        ours.join(", "),
        theirs.join(", ")
    )))
}

/// One line for people: the GID this side prefers, or the forced one.
pub(crate) fn describe_candidates(c: &[GidEntry], forced: bool) -> String {
    match c.first() {
        None => "no GID (the LID routes)".into(),
        Some(e) if forced => format!("gid {} (forced)", e.describe()),
        Some(e) => format!(
            "gid chosen per peer from {} candidate(s), first {}",
            c.len(),
            e.describe()
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests;
