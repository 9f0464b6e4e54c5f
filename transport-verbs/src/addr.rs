//! The endpoint address: what a peer needs to connect its queue pairs to ours.
//!
//! Versioned, checksummed, little-endian; its length follows from the GID count:
//! [`addr_len`]`(n)` = 32 + 20·n bytes.
//!
//! | bytes       | field                                                 |
//! |-------------|-------------------------------------------------------|
//! | 0..4        | magic `b"IBVQ"`                                       |
//! | 4           | format version ([`ADDR_VERSION`])                      |
//! | 5           | link layer (1 InfiniBand, 2 Ethernet)                 |
//! | 6           | active path MTU (`ibv_mtu`, 1..=5)                    |
//! | 7           | port number                                           |
//! | 8..10       | LID (InfiniBand; 0 on Ethernet)                       |
//! | 10          | GID count n (0..=[`MAX_GIDS`]; at least 1 on Ethernet) |
//! | 11          | reserved, zero                                        |
//! | 12..16      | data QP number (WRITE, WRITE with immediate)          |
//! | 16..20      | data QP initial PSN                                   |
//! | 20..24      | message QP number (SEND/RECV)                         |
//! | 24..28      | message QP initial PSN                                |
//! | 28..28+20n  | the GIDs this side offers, best first, 20 bytes each: |
//! |             | GID (16), type (1 IB, 2 RoCE v1, 3 RoCE v2), prefix   |
//! |             | length of its IP subnet (0 unknown), flags (bit 0:    |
//! |             | VLAN interface), reserved zero                        |
//! | last 4      | FNV-1a 32 over everything before                      |
//!
//! Version 1 (before the per-peer GID choice) was 48 bytes with one GID and is refused with
//! a message saying so.

use transport_core::{EndpointAddr, Error, Result};

pub use crate::gid::MAX_GIDS;
use crate::gid::{is_v4_mapped, GidKind, WireGid};

/// Current address format version.
pub const ADDR_VERSION: u8 = 2;
const MAGIC: &[u8; 4] = b"IBVQ";
const HEADER: usize = 28;
const GID_LEN: usize = 20;
const FLAG_VLAN: u8 = 1;

/// Length of an encoded address carrying `gids` GIDs.
pub const fn addr_len(gids: usize) -> usize {
    HEADER + GID_LEN * gids + 4
}

/// A decoded peer address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireAddr {
    pub link_layer: u8,
    pub mtu: u8,
    pub port: u8,
    pub lid: u16,
    pub data_qpn: u32,
    pub data_psn: u32,
    pub msg_qpn: u32,
    pub msg_psn: u32,
    /// The GIDs the peer offers, best first (see `gid`).
    pub gids: Vec<WireGid>,
}

/// `ibv_port_attr.link_layer` values.
pub const LINK_IB: u8 = 1;
pub const LINK_ETH: u8 = 2;

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

impl WireAddr {
    /// The address as bytes; GIDs past [`MAX_GIDS`] are left out.
    pub fn encode(&self) -> EndpointAddr {
        let n = self.gids.len().min(MAX_GIDS);
        let mut b = vec![0u8; addr_len(n)];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = ADDR_VERSION;
        b[5] = self.link_layer;
        b[6] = self.mtu;
        b[7] = self.port;
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10] = n as u8;
        b[12..16].copy_from_slice(&self.data_qpn.to_le_bytes());
        b[16..20].copy_from_slice(&self.data_psn.to_le_bytes());
        b[20..24].copy_from_slice(&self.msg_qpn.to_le_bytes());
        b[24..28].copy_from_slice(&self.msg_psn.to_le_bytes());
        for (k, g) in self.gids.iter().take(n).enumerate() {
            let o = HEADER + k * GID_LEN;
            b[o..o + 16].copy_from_slice(&g.gid);
            b[o + 16] = g.kind.to_wire();
            b[o + 17] = g.prefix_len;
            b[o + 18] = if g.vlan { FLAG_VLAN } else { 0 };
        }
        let end = b.len() - 4;
        let sum = fnv1a(&b[..end]);
        b[end..].copy_from_slice(&sum.to_le_bytes());
        EndpointAddr(b)
    }

    /// Read and validate address bytes; anything this backend did not write is
    /// [`Error::BadAddress`].
    pub fn decode(addr: &EndpointAddr) -> Result<Self> {
        let b = &addr.0[..];
        let bad = |why: String| Err(Error::BadAddress(format!("verbs address: {why}")));
        if b.len() < addr_len(0) {
            return bad(format!(
                "{} bytes, at least {} expected (is it from another backend?)",
                b.len(),
                addr_len(0)
            ));
        }
        if &b[0..4] != MAGIC {
            return bad("wrong magic: not a verbs endpoint address".into());
        }
        if b[4] != ADDR_VERSION {
            return bad(format!(
                "format version {}, this build reads version {ADDR_VERSION}{}: use the same \
                 transport-verbs version on both sides",
                b[4],
                if b[4] == 1 {
                    " (version 1 carried one GID, before the per-peer GID choice)"
                } else {
                    ""
                }
            ));
        }
        let n = usize::from(b[10]);
        if n > MAX_GIDS {
            return bad(format!("{n} GIDs, at most {MAX_GIDS}"));
        }
        if b.len() != addr_len(n) {
            return bad(format!(
                "{} bytes for {n} GID(s), expected {}: truncated or padded in transit",
                b.len(),
                addr_len(n)
            ));
        }
        let end = b.len() - 4;
        if u32_at(b, end) != fnv1a(&b[..end]) {
            return bad("checksum mismatch: the bytes were damaged in transit".into());
        }
        if b[11] != 0 {
            return bad("reserved bytes are not zero".into());
        }
        let mut gids = Vec::with_capacity(n);
        for k in 0..n {
            let o = HEADER + k * GID_LEN;
            let e = &b[o..o + GID_LEN];
            let mut gid = [0u8; 16];
            gid.copy_from_slice(&e[..16]);
            let Some(kind) = GidKind::from_wire(e[16]) else {
                return bad(format!("GID {k}: unknown type {}", e[16]));
            };
            let max_prefix = if is_v4_mapped(&gid) { 32 } else { 128 };
            if e[17] > max_prefix {
                return bad(format!(
                    "GID {k}: prefix length {} over {max_prefix}",
                    e[17]
                ));
            }
            if e[18] & !FLAG_VLAN != 0 || e[19] != 0 {
                return bad(format!("GID {k}: unknown flags {:#x}/{:#x}", e[18], e[19]));
            }
            if gid == [0; 16] {
                return bad(format!("GID {k} is zero"));
            }
            gids.push(WireGid {
                gid,
                kind,
                prefix_len: e[17],
                vlan: e[18] & FLAG_VLAN != 0,
            });
        }
        let a = WireAddr {
            link_layer: b[5],
            mtu: b[6],
            port: b[7],
            lid: u16_at(b, 8),
            data_qpn: u32_at(b, 12),
            data_psn: u32_at(b, 16),
            msg_qpn: u32_at(b, 20),
            msg_psn: u32_at(b, 24),
            gids,
        };
        if a.link_layer != LINK_IB && a.link_layer != LINK_ETH {
            return bad(format!("unknown link layer {}", a.link_layer));
        }
        if !(1..=5).contains(&a.mtu) {
            return bad(format!("path MTU code {} out of range 1..=5", a.mtu));
        }
        for (what, qpn) in [("data", a.data_qpn), ("message", a.msg_qpn)] {
            if qpn == 0 || qpn >= 1 << 24 {
                return bad(format!("{what} QP number {qpn:#x} out of range"));
            }
        }
        for (what, psn) in [("data", a.data_psn), ("message", a.msg_psn)] {
            if psn >= 1 << 24 {
                return bad(format!("{what} PSN {psn:#x} is not 24-bit"));
            }
        }
        if a.link_layer == LINK_ETH {
            if a.gids.is_empty() {
                return bad("RoCE address without a GID".into());
            }
            if a.gids.iter().any(|g| g.kind == GidKind::Ib) {
                return bad("RoCE address with an InfiniBand GID".into());
            }
        }
        if a.link_layer == LINK_IB {
            if a.lid == 0 || a.lid >= 0xc000 {
                return bad(format!("InfiniBand LID {:#x} is not a unicast LID", a.lid));
            }
            if a.gids.iter().any(|g| g.kind != GidKind::Ib) {
                return bad("InfiniBand address with a RoCE GID".into());
            }
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gid::tests::v4;

    fn g(last: u8, kind: GidKind, vlan: bool) -> WireGid {
        WireGid {
            gid: v4([10, 99, 0, last]),
            kind,
            prefix_len: 24,
            vlan,
        }
    }

    fn sample() -> WireAddr {
        WireAddr {
            link_layer: LINK_ETH,
            mtu: 3,
            port: 1,
            lid: 0,
            data_qpn: 0x11,
            data_psn: 0x123456,
            msg_qpn: 0x12,
            msg_psn: 0xabcdef,
            gids: vec![
                g(1, GidKind::RoceV2, false),
                g(2, GidKind::RoceV2, true),
                g(1, GidKind::RoceV1, false),
            ],
        }
    }

    /// Several GIDs, with their types, prefixes and VLAN flags, survive the trip; the old
    /// format had room for one GID and no subnet or VLAN, so the peer could not choose.
    #[test]
    fn roundtrip() {
        let a = sample();
        let e = a.encode();
        assert_eq!(e.0.len(), addr_len(3));
        assert_eq!(WireAddr::decode(&e).unwrap(), a);
        let mut full = sample();
        full.gids = (0..MAX_GIDS as u8 + 3)
            .map(|i| g(i + 1, GidKind::RoceV2, false))
            .collect();
        let d = WireAddr::decode(&full.encode()).unwrap();
        assert_eq!(d.gids.len(), MAX_GIDS, "the extra ones are left out");
        assert_eq!(d.gids[..], full.gids[..MAX_GIDS]);
        let mut ib = sample();
        ib.link_layer = LINK_IB;
        ib.lid = 7;
        ib.gids.clear();
        assert_eq!(WireAddr::decode(&ib.encode()).unwrap(), ib);
    }

    #[test]
    fn garbage_is_bad_address() {
        let good = sample().encode().0;
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0; 3],
            vec![0xff; addr_len(3) + 17],
            good[..good.len() - 1].to_vec(),
            [good.clone(), vec![0]].concat(),
            vec![0; addr_len(3)],
            vec![0xff; addr_len(3)],
        ];
        // Every single-bit flip is caught (checksum, length or field check).
        for i in 0..good.len() * 8 {
            let mut b = good.clone();
            b[i / 8] ^= 1 << (i % 8);
            cases.push(b);
        }
        for c in cases {
            match WireAddr::decode(&EndpointAddr(c.clone())) {
                Err(Error::BadAddress(_)) => {}
                other => panic!("{c:02x?} gave {other:?}"),
            }
        }
    }

    /// Bytes with a valid checksum but fields this backend never writes: `BadAddress`, each
    /// with its reason, never a panic.
    #[test]
    fn field_checks_behind_a_valid_checksum() {
        let mut cases: Vec<(&str, WireAddr)> = Vec::new();
        let mut a = sample();
        a.data_qpn = 0;
        cases.push(("QP number", a));
        let mut a = sample();
        a.msg_psn = 1 << 24;
        cases.push(("PSN", a));
        let mut a = sample();
        a.mtu = 9;
        cases.push(("MTU", a));
        let mut a = sample();
        a.link_layer = LINK_IB;
        cases.push(("LID", a));
        let mut a = sample();
        a.gids.clear();
        cases.push(("without a GID", a));
        let mut a = sample();
        a.gids[1].kind = GidKind::Ib;
        cases.push(("InfiniBand GID", a));
        let mut a = sample();
        a.gids[0].prefix_len = 33;
        cases.push(("prefix length", a));
        let mut a = sample();
        a.gids[2].gid = [0; 16];
        cases.push(("zero", a));
        for (want, a) in cases {
            match WireAddr::decode(&a.encode()) {
                Err(Error::BadAddress(m)) => assert!(m.contains(want), "{want}: {m}"),
                other => panic!("{want}: {other:?}"),
            }
        }
        // Raw bytes: a GID count past the limit, an unknown type, unknown flags, version 1.
        let resum = |mut b: Vec<u8>| {
            let end = b.len() - 4;
            let s = fnv1a(&b[..end]);
            b[end..].copy_from_slice(&s.to_le_bytes());
            b
        };
        let good = sample().encode().0;
        let mut count = vec![0u8; addr_len(MAX_GIDS + 1)];
        count[..HEADER].copy_from_slice(&good[..HEADER]);
        count[10] = MAX_GIDS as u8 + 1;
        let mut kind = good.clone();
        kind[HEADER + 16] = 9;
        let mut flags = good.clone();
        flags[HEADER + 18] = 0x80;
        let mut v1 = good.clone();
        v1[4] = 1;
        for (want, b) in [
            ("at most", resum(count)),
            ("unknown type", resum(kind)),
            ("unknown flags", resum(flags)),
            ("version 1 carried one GID", resum(v1)),
        ] {
            match WireAddr::decode(&EndpointAddr(b)) {
                Err(Error::BadAddress(m)) => assert!(m.contains(want), "{want}: {m}"),
                other => panic!("{want}: {other:?}"),
            }
        }
    }
}
