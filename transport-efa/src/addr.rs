//! Peer addresses: `add_peer` splits a peer's address into its endpoints' names, checks
//! them against the provider's address format and inserts them into the AV; each post looks
//! its destination up here ([`Endpoint::dest`]).

use std::ptr;

use libfabric_sys as fi;
use transport_core::{EndpointAddr, Error, PeerId, Result};

use crate::endpoint::Endpoint;
use crate::error;

impl Endpoint {
    /// `add_peer`: check the peer's address (both names where it has two), insert it into the
    /// AV, and announce this endpoint to it where the provider needs that.
    pub(crate) fn insert_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        let (msg, data) = self.split_address(&addr.0)?;
        self.check_address(msg)?;
        if let Some(d) = data {
            self.check_address(d)?;
        }
        let id = u32::try_from(self.peers.len())
            .map_err(|_| Error::InvalidArgument("too many peers".into()))?;
        let to = self.insert(msg)?;
        let write_to = match data {
            Some(d) => self.insert(d)?,
            None => to,
        };
        self.peers.push(to);
        self.write_peers.push(write_to);
        if self.announce_peers {
            self.announce(to);
            if write_to != to {
                self.announce(write_to);
            }
        }
        Ok(PeerId(id))
    }

    /// A peer's address as its message endpoint's and, where it has one, its data endpoint's
    /// (see `imm.rs`): an endpoint with a data endpoint publishes both names back to back.
    fn split_address<'a>(&self, bytes: &'a [u8]) -> Result<(&'a [u8], Option<&'a [u8]>)> {
        if self.addr_format == fi::FI_ADDR_STR {
            // Two NUL-terminated strings, or one.
            return Ok(match bytes.iter().position(|&b| b == 0) {
                Some(nul) if nul + 1 < bytes.len() => (&bytes[..=nul], Some(&bytes[nul + 1..])),
                _ => (bytes, None),
            });
        }
        let one = self.own_addr_len;
        Ok(if one > 0 && bytes.len() == 2 * one {
            (&bytes[..one], Some(&bytes[one..]))
        } else {
            (bytes, None)
        })
    }

    /// Insert one address into the AV.
    fn insert(&mut self, bytes: &[u8]) -> Result<fi::fi_addr_t> {
        let mut fi_addr: fi::fi_addr_t = fi::FI_ADDR_UNSPEC_;
        // SAFETY: av is open; bytes holds one address of a length checked by check_address;
        // fi_addr is a valid out pointer for one address.
        let ret =
            unsafe { fi::rs_fi_av_insert(self.av, bytes.as_ptr().cast(), 1, &mut fi_addr, 0) };
        if ret != 1 || fi_addr == fi::FI_ADDR_UNSPEC_ {
            return Err(Error::BadAddress(format!(
                "provider {} did not accept the {}-byte address ({}); is it a peer's address \
                 from the same provider and fabric (`--provider`)?",
                self.provider,
                bytes.len(),
                if ret < 0 {
                    error::strerror(ret.into())
                } else {
                    format!("fi_av_insert inserted {ret} of 1")
                }
            )));
        }
        Ok(fi_addr)
    }

    /// Check address bytes against the provider's address format before inserting them.
    fn check_address(&self, bytes: &[u8]) -> Result<()> {
        const AF_INET: u16 = 2;
        const AF_INET6: u16 = 10;
        let own = &self.addr.0;
        let fmt = self.addr_format;
        let bad = |what: String| {
            Err(Error::BadAddress(format!(
                "{} bytes are not {what} as provider {} uses",
                bytes.len(),
                self.provider
            )))
        };
        if bytes.is_empty() {
            return Err(Error::BadAddress("empty address".into()));
        }
        // Socket addresses: length and address family must match.
        let shapes: &[(usize, u16)] = if fmt == fi::FI_SOCKADDR_IN {
            &[(16, AF_INET)]
        } else if fmt == fi::FI_SOCKADDR_IN6 {
            &[(28, AF_INET6)]
        } else if fmt == fi::FI_SOCKADDR {
            &[(16, AF_INET), (28, AF_INET6)]
        } else {
            &[]
        };
        if !shapes.is_empty() {
            let family = u16::from_ne_bytes([bytes[0], *bytes.get(1).unwrap_or(&0)]);
            return if shapes
                .iter()
                .any(|&(len, fam)| bytes.len() == len && family == fam)
            {
                Ok(())
            } else {
                bad("a socket address (sockaddr_in/sockaddr_in6)".into())
            };
        }
        if fmt == fi::FI_ADDR_STR {
            // "scheme://...", one NUL at the end; the scheme must be ours.
            let text = match bytes.split_last() {
                Some((0, text)) if !text.contains(&0) => text,
                _ => return bad("a NUL-terminated address string".into()),
            };
            let scheme = |b: &[u8]| {
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| s.split_once("://").map(|(s, _)| s.to_string()))
            };
            let ours = scheme(own.split(|&b| b == 0).next().unwrap_or(&[]));
            if scheme(text).is_none() || scheme(text) != ours || bytes.len() > own.len().max(256) {
                return bad(format!("a `{}://` address", ours.unwrap_or_default()));
            }
            return Ok(());
        }
        // Fixed-size binary addresses (FI_ADDR_EFA, ...): the length must be ours.
        if bytes.len() != self.own_addr_len {
            return bad(format!("an address of {} bytes", self.own_addr_len));
        }
        Ok(())
    }

    /// Make the provider send its connection request to a new peer now, before this
    /// endpoint is next polled: a zero-length WRITE, which libfabric 2.x's `shm` answers with
    /// `-FI_EAGAIN` after queueing its request (`smr_verify_peer`).
    ///
    /// Why: in libfabric 2.x's `shm`, a peer endpoint of the same process is mapped by a
    /// shortcut in `smr_map_to_region` that skips `smr_map_to_endpoint`, so the only other
    /// place that records where the peer mapped our region (`peer_data[id].local_region`)
    /// is the processing of our connection request. A side that processes the other's
    /// request first counts itself connected without ever sending its own, and its first
    /// command that the peer must hand back (any delivery-complete WRITE, any message above
    /// the inject size) carries an address computed from 0: the peer dereferences a bare
    /// offset and dies of SIGSEGV in `smr_progress_cmd`. When each side sends its own
    /// request before it polls, both requests are processed and both addresses set.
    ///
    /// Harmless elsewhere: between processes the request just goes out earlier. Where the
    /// pair is already connected (this endpoint processed the peer's request before
    /// `add_peer`), the WRITE executes: zero bytes to key 0, which the target refuses or
    /// ignores, with a context-free completion that [`Transport::poll`](transport_core::Transport::poll) skips. That order
    /// (poll a peer's request before adding it) is the one this cannot repair.
    fn announce(&mut self, dest: fi::fi_addr_t) {
        // SAFETY: ep is enabled and dest was just inserted into its AV; a zero-length WRITE
        // reads no buffer (NULL, no descriptor needed for 0 bytes) and its NULL context is
        // never dereferenced by us (not a slab slot).
        let ret = unsafe {
            fi::rs_fi_write(
                self.ep,
                ptr::null(),
                0,
                ptr::null_mut(),
                dest,
                0,
                0,
                ptr::null_mut(),
            )
        };
        // -FI_EAGAIN is the expected answer; 0 means the pair was already connected; any
        // error shows up again, with its text, on the first real post to this peer.
        let _ = ret;
    }

    /// The destination of `peer`.
    #[inline]
    pub(crate) fn dest(&self, peer: PeerId) -> Result<fi::fi_addr_t> {
        match self.peers.get(peer.0 as usize) {
            Some(&a) => Ok(a),
            None => Err(self.unknown_peer(peer)),
        }
    }

    #[cold]
    #[inline(never)]
    fn unknown_peer(&self, peer: PeerId) -> Error {
        Error::InvalidArgument(format!(
            "unknown peer {}: this endpoint has {} peer(s)",
            peer.0,
            self.peers.len()
        ))
    }
}
