//! The endpoint address: what a peer needs to connect its queue pairs to ours.
//!
//! Fixed length ([`ADDR_LEN`] bytes), versioned, checksummed, little-endian:
//!
//! | bytes  | field                                                     |
//! |--------|-----------------------------------------------------------|
//! | 0..4   | magic `b"IBVQ"`                                           |
//! | 4      | format version ([`ADDR_VERSION`])                          |
//! | 5      | link layer (1 InfiniBand, 2 Ethernet)                     |
//! | 6      | active path MTU (`ibv_mtu`, 1..=5)                        |
//! | 7      | port number                                               |
//! | 8..10  | LID (InfiniBand; 0 on Ethernet)                           |
//! | 10..12 | reserved, zero                                            |
//! | 12..16 | data QP number (WRITE, WRITE with immediate)              |
//! | 16..20 | data QP initial PSN                                       |
//! | 20..24 | message QP number (SEND/RECV)                             |
//! | 24..28 | message QP initial PSN                                    |
//! | 28..44 | GID                                                       |
//! | 44..48 | FNV-1a 32 over bytes 0..44                                |

use transport_core::{EndpointAddr, Error, Result};

/// Length of an encoded address.
pub const ADDR_LEN: usize = 48;
/// Current address format version.
pub const ADDR_VERSION: u8 = 1;
const MAGIC: &[u8; 4] = b"IBVQ";

/// A decoded peer address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireAddr {
    pub link_layer: u8,
    pub mtu: u8,
    pub port: u8,
    pub lid: u16,
    pub data_qpn: u32,
    pub data_psn: u32,
    pub msg_qpn: u32,
    pub msg_psn: u32,
    pub gid: [u8; 16],
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
    /// The address as bytes.
    pub fn encode(&self) -> EndpointAddr {
        let mut b = [0u8; ADDR_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = ADDR_VERSION;
        b[5] = self.link_layer;
        b[6] = self.mtu;
        b[7] = self.port;
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[12..16].copy_from_slice(&self.data_qpn.to_le_bytes());
        b[16..20].copy_from_slice(&self.data_psn.to_le_bytes());
        b[20..24].copy_from_slice(&self.msg_qpn.to_le_bytes());
        b[24..28].copy_from_slice(&self.msg_psn.to_le_bytes());
        b[28..44].copy_from_slice(&self.gid);
        let sum = fnv1a(&b[..44]);
        b[44..48].copy_from_slice(&sum.to_le_bytes());
        EndpointAddr(b.to_vec())
    }

    /// Read and validate address bytes; anything this backend did not write is
    /// [`Error::BadAddress`].
    pub fn decode(addr: &EndpointAddr) -> Result<Self> {
        let b = &addr.0[..];
        let bad = |why: String| Err(Error::BadAddress(format!("verbs address: {why}")));
        if b.len() != ADDR_LEN {
            return bad(format!(
                "{} bytes, expected {ADDR_LEN} (is it from another backend?)",
                b.len()
            ));
        }
        if &b[0..4] != MAGIC {
            return bad("wrong magic: not a verbs endpoint address".into());
        }
        if b[4] != ADDR_VERSION {
            return bad(format!(
                "format version {}, this build reads version {ADDR_VERSION}: use the same \
                 transport-verbs version on both sides",
                b[4]
            ));
        }
        let sum = u32_at(b, 44);
        if sum != fnv1a(&b[..44]) {
            return bad("checksum mismatch: the bytes were damaged in transit".into());
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
            gid: b[28..44].try_into().expect("16 bytes"),
        };
        if b[10..12] != [0, 0] {
            return bad("reserved bytes are not zero".into());
        }
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
        if a.link_layer == LINK_ETH && a.gid == [0; 16] {
            return bad("RoCE address without a GID".into());
        }
        if a.link_layer == LINK_IB && (a.lid == 0 || a.lid >= 0xc000) {
            return bad(format!("InfiniBand LID {:#x} is not a unicast LID", a.lid));
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 1],
        }
    }

    #[test]
    fn roundtrip() {
        let a = sample();
        let e = a.encode();
        assert_eq!(e.0.len(), ADDR_LEN);
        assert_eq!(WireAddr::decode(&e).unwrap(), a);
    }

    #[test]
    fn garbage_is_bad_address() {
        let good = sample().encode().0;
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0; 3],
            vec![0xff; ADDR_LEN + 17],
            good[..ADDR_LEN - 1].to_vec(),
            vec![0; ADDR_LEN],
            vec![0xff; ADDR_LEN],
        ];
        // Every single-bit flip is caught (checksum or field check).
        for i in 0..ADDR_LEN * 8 {
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

    #[test]
    fn field_checks_behind_a_valid_checksum() {
        let mut zero_qpn = sample();
        zero_qpn.data_qpn = 0;
        let mut big_psn = sample();
        big_psn.msg_psn = 1 << 24;
        let mut mtu = sample();
        mtu.mtu = 9;
        let mut ib_no_lid = sample();
        ib_no_lid.link_layer = LINK_IB;
        for a in [zero_qpn, big_psn, mtu, ib_no_lid] {
            assert!(matches!(
                WireAddr::decode(&a.encode()),
                Err(Error::BadAddress(_))
            ));
        }
    }
}
