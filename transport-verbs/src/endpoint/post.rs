//! The post path: SEND, receive and WRITE work requests built in the endpoint's own arrays,
//! consecutive WRITEs to one peer chained into one `ibv_post_send`, and each send queue's
//! ring of caller contexts (every WR is signaled; completions free the slots in order).

use std::ptr;
use std::sync::Arc;

use ibverbs_sys as sys;
use transport_core::{Error, LocalSlice, PeerId, Post, RemoteSlice, Result, WriteOp};

use super::{fits, Endpoint, CHAN_DATA, CHAN_MSG, TAG_RECV, TAG_SHIFT, TAG_SQ};
use crate::mr::VerbsMr;
use crate::util::provider_err;

/// Work requests chained into one `ibv_post_send`.
pub(super) const POST_BATCH: usize = 32;

impl Endpoint {
    /// [`Transport::post_send`](transport_core::Transport::post_send) on `peer`'s message QP.
    #[inline]
    pub(super) fn send_msg(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, VerbsMr>,
        ctx: u64,
    ) -> Result<Post> {
        self.own_slice(&buf, "post_send")?;
        let pi = self.peer_index(peer)?;
        if buf.len > self.caps.max_msg_size {
            return Err(Error::InvalidArgument(format!(
                "send of {} bytes exceeds the port's maximum message size {}",
                buf.len, self.caps.max_msg_size
            )));
        }
        let depth = self.caps.tx_depth;
        let q = &self.peers[pi].msg;
        if q.outstanding >= depth {
            return Ok(Post::QueueFull);
        }
        let (qp, slot) = (q.qp, q.head);
        let p = Prepared {
            peer: pi,
            sge: self.sge(&buf),
            inline: self.can_inline(&buf),
            opcode: sys::IBV_WR_SEND,
            imm: 0,
            remote_addr: 0,
            rkey: 0,
        };
        self.fill(0, &p, CHAN_MSG, slot);
        if post_chain(qp, &mut self.wrs, 1)? == 0 {
            return Ok(Post::QueueFull);
        }
        let q = &mut self.peers[pi].msg;
        q.ctx[slot] = ctx;
        q.head = ring_next(slot, depth);
        q.outstanding += 1;
        Ok(Post::Posted)
    }

    /// [`Transport::post_recv`](transport_core::Transport::post_recv) on the receive SRQ.
    #[inline]
    pub(super) fn recv_msg(&mut self, buf: LocalSlice<'_, VerbsMr>, ctx: u64) -> Result<Post> {
        self.own_slice(&buf, "post_recv")?;
        if buf.len > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "receive buffer of {} bytes exceeds 4 GiB",
                buf.len
            )));
        }
        let Some(slot) = self.recv_free.pop() else {
            return Ok(Post::QueueFull);
        };
        let mut sge = self.sge(&buf);
        let mut wr = sys::ibv_recv_wr {
            wr_id: (TAG_RECV << TAG_SHIFT) | u64::from(slot),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(buf.len > 0),
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `recv_srq` is live; `wr` and `sge` live across the call (the provider copies
        // them); the SGE lies in a region of this endpoint (checked: `own_slice`). Should
        // the region be dropped before the receive completes, `ibv_dereg_mr` returns only
        // once the device no longer accesses it (the receive then completes in error), so
        // its memory is never written after it is freed.
        let rc = unsafe { sys::ibvs_post_srq_recv(self.recv_srq, &mut wr, &mut bad) };
        if rc != 0 {
            self.recv_free.push(slot);
            if rc == libc::ENOMEM {
                return Ok(Post::QueueFull);
            }
            return Err(provider_err(
                "ibv_post_srq_recv",
                rc,
                "posting an application receive; the endpoint's receive queue may be broken: \
                 reopen the endpoint",
            ));
        }
        self.recv_ctx[slot as usize] = ctx;
        Ok(Post::Posted)
    }

    /// [`Transport::post_write`](transport_core::Transport::post_write) on `peer`'s data QP.
    ///
    /// The one-WRITE path, written out rather than through [`Self::prepare_write`] and
    /// [`Self::fill`]: every check in one branch (the message built out of line from scalars,
    /// so nothing is put in memory for it on the way), the peer looked up once, only the
    /// fields of `wrs[0]` that change per WRITE stored (its SGE pointer is set at open), no
    /// chain to link.
    #[inline]
    pub(super) fn write_one(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, VerbsMr>,
        remote: RemoteSlice<u32>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        let pi = peer.0 as usize;
        let len = buf.len;
        let ok = Arc::ptr_eq(&buf.mr.domain, &self.domain)
            & fits(&buf)
            & (len <= self.caps.max_write_size)
            & (len as u64 <= remote.len);
        let inline = (len <= self.caps.inject_size) & (buf.mr.host_addr != 0);
        let depth = self.caps.tx_depth;
        let Some(pair) = self.peers.get_mut(pi).filter(|_| ok) else {
            return Err(self.write_error(&buf, peer, remote.len));
        };
        let q = &mut pair.data;
        if q.outstanding >= depth {
            return Ok(Post::QueueFull);
        }
        let slot = q.head;
        self.sges[0] = sys::ibv_sge {
            addr: buf.mr.iova + buf.offset as u64,
            length: len as u32,
            lkey: buf.mr.lkey,
        };
        let w = &mut self.wrs[0];
        w.wr_id = (TAG_SQ << TAG_SHIFT) | (CHAN_DATA << 56) | ((pi as u64) << 32) | slot as u64;
        // `w.next` is null: `post_chain` unlinks every chain it posts.
        w.num_sge = i32::from(len > 0);
        w.opcode = if imm.is_some() {
            sys::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            sys::IBV_WR_RDMA_WRITE
        };
        w.send_flags = sys::IBV_SEND_SIGNALED | if inline { sys::IBV_SEND_INLINE } else { 0 };
        w.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        w.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: remote.addr,
            rkey: remote.key,
        };
        if post_chain(q.qp, &mut self.wrs, 1)? == 0 {
            return Ok(Post::QueueFull);
        }
        debug_assert!(slot < q.ctx.len());
        // SAFETY: `head < depth == ctx.len()` always: the ring has `caps.tx_depth` slots
        // (`create_qp`; `tx_depth` is fixed at open) and `head` only moves by `ring_next` and
        // `ring_add` modulo that depth.
        unsafe { *q.ctx.get_unchecked_mut(slot) = ctx };
        q.head = ring_next(slot, depth);
        q.outstanding += 1;
        Ok(Post::Posted)
    }

    /// [`Transport::post_writes`](transport_core::Transport::post_writes) on the data QPs:
    /// every op checked first, then a chain per run of ops to one peer, closed at
    /// `POST_BATCH` WRs, at `chain_bytes` of payload, or where the send queue is full.
    #[inline]
    pub(super) fn write_chained(&mut self, ops: &[WriteOp<'_, VerbsMr, u32>]) -> Result<usize> {
        for op in ops {
            self.prepare_write(op)?;
        }
        let depth = self.caps.tx_depth;
        let mut i = 0;
        while i < ops.len() {
            let peer = ops[i].peer.0 as usize;
            let q = &self.peers[peer].data;
            let room = depth - q.outstanding;
            if room == 0 {
                break;
            }
            let (qp, head) = (q.qp, q.head);
            let (mut n, mut bytes) = (0, 0usize);
            while n < room.min(POST_BATCH)
                && bytes < self.chain_bytes
                && i + n < ops.len()
                && ops[i + n].peer.0 as usize == peer
            {
                let p = self.prepare_write(&ops[i + n])?;
                self.fill(n, &p, CHAN_DATA, ring_add(head, n, depth));
                bytes += p.sge.length as usize;
                n += 1;
            }
            let took = post_chain(qp, &mut self.wrs, n)?;
            let q = &mut self.peers[peer].data;
            for k in 0..took {
                q.ctx[ring_add(head, k, depth)] = ops[i + k].ctx;
            }
            q.head = ring_add(head, took, depth);
            q.outstanding += took;
            i += took;
            if took < n {
                break;
            }
        }
        Ok(i)
    }

    /// Check one WRITE and describe it; nothing is posted.
    ///
    /// The hot path: every condition is evaluated without a branch of its own and checked
    /// once; which one failed is worked out again, out of line, only on failure.
    #[inline(always)]
    fn prepare_write(&self, op: &WriteOp<'_, VerbsMr, u32>) -> Result<Prepared> {
        let peer = op.peer.0 as usize;
        let len = op.local.len;
        let ok = Arc::ptr_eq(&op.local.mr.domain, &self.domain)
            & fits(&op.local)
            & (peer < self.peers.len())
            & (len <= self.caps.max_write_size)
            & (len as u64 <= op.remote.len);
        if !ok {
            return Err(self.write_error(&op.local, op.peer, op.remote.len));
        }
        Ok(Prepared {
            peer,
            sge: self.sge(&op.local),
            inline: self.can_inline(&op.local),
            opcode: if op.imm.is_some() {
                sys::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                sys::IBV_WR_RDMA_WRITE
            },
            imm: op.imm.unwrap_or(0),
            remote_addr: op.remote.addr,
            rkey: op.remote.key,
        })
    }

    /// Why [`Self::prepare_write`] refused a WRITE (the first failed check, in order).
    #[cold]
    #[inline(never)]
    fn write_error(&self, buf: &LocalSlice<'_, VerbsMr>, peer: PeerId, remote_len: u64) -> Error {
        if let Err(e) = self.own_slice(buf, "post_write") {
            return e;
        }
        let len = buf.len;
        if let Err(e) = self.peer_index(peer) {
            return e;
        }
        if len > self.caps.max_write_size {
            return Error::InvalidArgument(format!(
                "write of {len} bytes exceeds the port's maximum message size {}",
                self.caps.max_write_size
            ));
        }
        Error::InvalidArgument(format!(
            "write of {len} bytes into a {remote_len}-byte remote slice"
        ))
    }

    #[inline(always)]
    fn sge(&self, s: &LocalSlice<'_, VerbsMr>) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: s.mr.iova + s.offset as u64,
            length: s.len as u32,
            lkey: s.mr.lkey,
        }
    }

    #[inline(always)]
    fn can_inline(&self, s: &LocalSlice<'_, VerbsMr>) -> bool {
        s.len <= self.caps.inject_size && s.mr.host_addr != 0
    }

    /// Fill `self.wrs[i]` from `p` using ring slot `slot` of channel `chan` (its `sg_list`
    /// points at `self.sges[i]` since [`Self::link_send_sges`]).
    #[inline(always)]
    fn fill(&mut self, i: usize, p: &Prepared, chan: u64, slot: usize) {
        self.sges[i] = p.sge;
        let w = &mut self.wrs[i];
        w.wr_id = (TAG_SQ << TAG_SHIFT) | (chan << 56) | ((p.peer as u64) << 32) | slot as u64;
        w.next = ptr::null_mut();
        w.num_sge = i32::from(p.sge.length > 0);
        w.opcode = p.opcode;
        w.send_flags = sys::IBV_SEND_SIGNALED | if p.inline { sys::IBV_SEND_INLINE } else { 0 };
        w.__bindgen_anon_1.imm_data = p.imm.to_be();
        w.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: p.remote_addr,
            rkey: p.rkey,
        };
    }

    /// Point each send WR at its own SGE, once: `wrs[i].sg_list = &sges[i]`. The boxed
    /// arrays never move, so the pointers stay valid for the endpoint's life.
    pub(super) fn link_send_sges(&mut self) {
        for (w, sge) in self.wrs.iter_mut().zip(self.sges.iter_mut()) {
            w.sg_list = sge;
        }
    }
}

/// Post `wrs[..n]` (`1 <= n <= POST_BATCH`; linked here and unlinked after, so every
/// `next` is null between posts) on `qp`; how many the provider took, or the error where it
/// took none.
#[inline(always)]
fn post_chain(
    qp: *mut sys::ibv_qp,
    wrs: &mut [sys::ibv_send_wr; POST_BATCH],
    n: usize,
) -> Result<usize> {
    let base = wrs.as_mut_ptr();
    for i in 0..n.saturating_sub(1) {
        // SAFETY: `i + 1 < n <= POST_BATCH`: pointers into the same boxed array.
        unsafe { (*base.add(i)).next = base.add(i + 1) };
    }
    let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
    // SAFETY: `qp` is a live connected QP; `wrs[..n]` is an initialised chain whose SGEs
    // point into the endpoint's `sges`, and each SGE into registered memory of the caller's
    // regions (every post checked its slice lies inside its region: `fits`; a region
    // dropped meanwhile is deregistered first, and the device stops accessing it before
    // `ibv_dereg_mr` returns); the provider copies (or, for inline, reads) them before
    // returning.
    let rc = unsafe { sys::ibvs_post_send(qp, base, &mut bad) };
    for i in 0..n.saturating_sub(1) {
        // Unlinked again: a one-WR post then only sets its own fields (`next` stays null).
        // SAFETY: `i < n - 1 < POST_BATCH`: a pointer into the same boxed array.
        unsafe { (*base.add(i)).next = ptr::null_mut() };
    }
    if rc == 0 {
        return Ok(n);
    }
    post_failed(rc, base, bad, n)
}

/// [`post_chain`] when `ibv_post_send` said no: the WRs before `bad` were posted.
#[cold]
#[inline(never)]
fn post_failed(
    rc: i32,
    base: *mut sys::ibv_send_wr,
    bad: *mut sys::ibv_send_wr,
    n: usize,
) -> Result<usize> {
    let taken = if bad.is_null() {
        0
    } else {
        // SAFETY: a non-null `bad` points into the chain at `base` (providers set it on
        // failure).
        unsafe { bad.offset_from(base) }.max(0) as usize
    };
    if taken > 0 || rc == libc::ENOMEM || rc == libc::EAGAIN {
        return Ok(taken.min(n));
    }
    Err(provider_err(
        "ibv_post_send",
        rc,
        "is the peer's queue pair in the error state after an earlier failure?",
    ))
}

/// `(slot + 1) % depth` for `slot < depth`, without the division.
#[inline(always)]
fn ring_next(slot: usize, depth: usize) -> usize {
    let s = slot + 1;
    if s == depth {
        0
    } else {
        s
    }
}

/// `(slot + n) % depth` for `slot < depth` and `n <= depth`, without the division (`depth`
/// is a run-time value, so `%` would be one per post).
#[inline]
fn ring_add(slot: usize, n: usize, depth: usize) -> usize {
    debug_assert!(slot < depth && n <= depth);
    let s = slot + n;
    if s >= depth {
        s - depth
    } else {
        s
    }
}

/// A checked WRITE, ready to be put into a work request.
#[derive(Clone, Copy)]
struct Prepared {
    peer: usize,
    sge: sys::ibv_sge,
    inline: bool,
    opcode: sys::ibv_wr_opcode,
    imm: u32,
    remote_addr: u64,
    rkey: u32,
}
