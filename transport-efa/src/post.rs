//! The post path's parts: checking a post against the endpoint's regions, peers and limits,
//! posting one WRITE, and mapping a post's return code. `post_send`, `post_recv`,
//! `post_write` and `post_writes`, built of them, are in `endpoint.rs` (see its `impl
//! Transport`). A post allocates nothing, takes no lock of ours and makes no system call of its
//! own; the WRITE path checks without a branch per condition and builds its errors out of line
//! (`#[cold]`).

use std::ffi::c_void;
use std::fmt;

use libfabric_sys as fi;
use transport_core::{Error, LocalSlice, PeerId, Post, RemoteSlice, Result};

use crate::endpoint::Endpoint;
use crate::error::provider;
use crate::mr::Mr;
use crate::slab::Kind;

impl Endpoint {
    /// Buffer address and descriptor of a local slice, after checking it is ours and intact.
    #[inline]
    pub(crate) fn local(&self, s: &LocalSlice<'_, Mr>) -> Result<(*mut c_void, *mut c_void)> {
        let mr = s.mr;
        if mr.domain_id != self.domain.id {
            return Err(invalid(format_args!(
                "the local region was registered on another endpoint; register it on the \
                 endpoint that posts"
            )));
        }
        match s.offset.checked_add(s.len) {
            Some(end) if end <= mr.len => {}
            _ => {
                return Err(invalid(format_args!(
                    "local range {}+{} does not fit the {}-byte region",
                    s.offset, s.len, mr.len
                )))
            }
        }
        Ok(((mr.base as usize + s.offset) as *mut c_void, mr.desc))
    }

    /// Map a post's return code; a post that did not happen gives its slot back.
    #[inline(always)]
    pub(crate) fn posted(
        &mut self,
        call: &'static str,
        ret: isize,
        slot: *mut c_void,
    ) -> Result<Post> {
        if ret == 0 {
            Ok(Post::Posted)
        } else {
            self.not_posted(call, ret, slot)
        }
    }

    /// The slow half of [`Self::posted`]: give the slot back and map the return code.
    #[cold]
    #[inline(never)]
    fn not_posted(&mut self, call: &'static str, ret: isize, slot: *mut c_void) -> Result<Post> {
        self.slab.release(slot);
        if ret == -(fi::FI_EAGAIN as isize) {
            Ok(Post::QueueFull)
        } else {
            Err(provider(
                call,
                ret as i64,
                format!(
                    "the provider {} refused the operation; check its size against the \
                     provider's limits (`rdma-bench doctor --backend libfabric`), and reopen the \
                     endpoint if the peer went away",
                    self.provider
                ),
            ))
        }
    }

    /// Validate one WRITE; returns (dest, local address, descriptor).
    ///
    /// The hot path: every condition is evaluated without a branch of its own and checked
    /// once; which one failed is worked out again, out of line, only on failure.
    #[inline(always)]
    pub(crate) fn write_args(
        &self,
        peer: PeerId,
        buf: &LocalSlice<'_, Mr>,
        remote: &RemoteSlice<u64>,
    ) -> Result<(fi::fi_addr_t, *mut c_void, *mut c_void)> {
        let mr = buf.mr;
        let end = buf.offset.wrapping_add(buf.len);
        let ok = (mr.domain_id == self.domain.id)
            & (end >= buf.offset)
            & (end <= mr.len)
            & (buf.len <= self.caps.max_write_size)
            & (buf.len as u64 <= remote.len);
        match self.write_peers.get(peer.0 as usize) {
            Some(&dest) if ok => Ok((
                dest,
                (mr.base as usize + buf.offset) as *mut c_void,
                mr.desc,
            )),
            _ => Err(self.write_error(peer, buf, remote)),
        }
    }

    /// Why [`Self::write_args`] refused a WRITE (the first failed check, in order).
    #[cold]
    #[inline(never)]
    fn write_error(
        &self,
        peer: PeerId,
        buf: &LocalSlice<'_, Mr>,
        remote: &RemoteSlice<u64>,
    ) -> Error {
        if let Err(e) = self.dest(peer) {
            return e;
        }
        if let Err(e) = self.local(buf) {
            return e;
        }
        if buf.len > self.caps.max_write_size {
            return invalid(format_args!(
                "a {}-byte WRITE exceeds the largest the endpoint offers ({} bytes)",
                buf.len, self.caps.max_write_size
            ));
        }
        invalid(format_args!(
            "a {}-byte WRITE does not fit the {}-byte remote range",
            buf.len, remote.len
        ))
    }

    /// Post one WRITE with libfabric flags (FI_MORE for batches).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_one(
        &mut self,
        dest: fi::fi_addr_t,
        addr: *mut c_void,
        desc: *mut c_void,
        len: usize,
        remote: &RemoteSlice<u64>,
        imm: Option<u32>,
        ctx: u64,
        more: bool,
    ) -> Result<Post> {
        let Some(slot) = self.slab.acquire(Kind::Write, ctx) else {
            return Ok(Post::QueueFull);
        };
        let mut flags = fi::FI_COMPLETION | self.write_flags;
        if more {
            flags |= fi::FI_MORE;
        }
        if imm.is_some() {
            flags |= fi::FI_REMOTE_CQ_DATA;
        }
        // SAFETY: ep is enabled; [addr, addr+len) lies in a region registered on this domain
        // (checked by `local`), which stays registered and allocated until the completion
        // even if dropped (`grave.rs`); slot is a slab slot that stays valid until the
        // completion returns it.
        let ret = unsafe {
            fi::rs_fi_writemsg1(
                self.ep,
                addr,
                len,
                desc,
                dest,
                remote.addr,
                remote.key,
                u64::from(imm.unwrap_or(0)),
                slot,
                flags,
            )
        };
        self.posted("fi_writemsg", ret, slot)
    }
}

/// An invalid-argument error, built out of line: the checks on the post path stay small.
#[cold]
#[inline(never)]
fn invalid(args: fmt::Arguments<'_>) -> Error {
    Error::InvalidArgument(args.to_string())
}
