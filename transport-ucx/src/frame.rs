//! The framing around the blobs UCX hands out: a packed rkey (`ucp_rkey_pack`) and a worker
//! address (`ucp_worker_get_address`).
//!
//! UCX reads both without being told their length (`ucp_ep_rkey_unpack` and `ucp_ep_create`
//! take a bare pointer), so bytes that arrive from a peer are checked here before UCX sees
//! them: a 4-byte tag (`UX`, the kind, a version), the payload's length and an FNV-1a hash of
//! it. A key of another backend, cut short, padded, or with a flipped byte is refused with a
//! clear error instead of being parsed by UCX past its end.

use transport_core::{Error, Result};

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Rkey = 1,
    Address = 2,
}

const MAGIC: [u8; 2] = *b"UX";
const VERSION: u8 = 1;
/// Tag (4), payload length (4), hash (8).
pub(crate) const HEADER: usize = 16;

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The origin of a worker: the hash of its address (the payload of its address frame), which
/// its active messages carry and by which a target tells its initiators apart
/// (`endpoint/landings.rs`).
pub(crate) fn origin(address: &[u8]) -> u64 {
    fnv1a(address)
}

/// `payload` framed as `kind`.
pub(crate) fn wrap(kind: Kind, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.extend_from_slice(&MAGIC);
    v.push(kind as u8);
    v.push(VERSION);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&fnv1a(payload).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// The payload of a frame of `kind`; an error saying what is wrong with it otherwise.
pub(crate) fn unwrap<'a>(kind: Kind, bytes: &'a [u8], what: &str) -> Result<&'a [u8]> {
    let bad = |why: String| {
        let msg = format!(
            "{} bytes are not a UCX {what} of this backend: {why} (was it made by another \
             backend, or another version of this one?)",
            bytes.len()
        );
        match kind {
            Kind::Address => Error::BadAddress(msg),
            Kind::Rkey => Error::InvalidArgument(msg),
        }
    };
    if bytes.len() < HEADER {
        return Err(bad(format!("shorter than the {HEADER}-byte header")));
    }
    if bytes[..2] != MAGIC || bytes[2] != kind as u8 {
        return Err(bad("no UCX frame tag".into()));
    }
    if bytes[3] != VERSION {
        return Err(bad(format!(
            "frame version {} (this build: {VERSION})",
            bytes[3]
        )));
    }
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    let payload = &bytes[HEADER..];
    if payload.len() != len {
        return Err(bad(format!(
            "the header says {len} bytes of payload, {} follow",
            payload.len()
        )));
    }
    let mut h = [0u8; 8];
    h.copy_from_slice(&bytes[8..16]);
    if u64::from_le_bytes(h) != fnv1a(payload) || len == 0 {
        return Err(bad("the payload does not match its hash".into()));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_damage_is_refused() {
        let f = wrap(Kind::Rkey, &[1, 2, 3, 4, 5]);
        assert_eq!(unwrap(Kind::Rkey, &f, "key").unwrap(), &[1, 2, 3, 4, 5]);
        assert!(unwrap(Kind::Address, &f, "address").is_err(), "kind");
        assert!(unwrap(Kind::Rkey, &f[..f.len() - 1], "key").is_err(), "cut");
        assert!(
            unwrap(Kind::Rkey, &[&f[..], &[0]].concat(), "key").is_err(),
            "padded"
        );
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x5a;
            assert!(unwrap(Kind::Rkey, &g, "key").is_err(), "byte {i} flipped");
        }
        assert!(unwrap(Kind::Rkey, &[], "key").is_err());
        assert!(
            unwrap(Kind::Rkey, &wrap(Kind::Rkey, &[]), "key").is_err(),
            "empty"
        );
    }
}
