//! The completion queue: its size as peers come, polling it into [`Completion`]s (the wr_id
//! says whose work request finished), and the backend's zero-length immediate receives,
//! reposted in chained batches as `poll` consumes them.

use std::ffi::CStr;
use std::ptr;

use ibverbs_sys as sys;
use transport_core::{hint, Completion, CompletionError, CompletionKind, Op, Result};

use super::{Endpoint, CHAN_MSG, TAG_IMM, TAG_RECV, TAG_SHIFT, TAG_SQ};
use crate::util::{check, errno, provider_err, MEMLOCK_HINT};

/// Completions taken from the CQ per `ibv_poll_cq` call (the endpoint's own array).
pub(super) const POLL_BATCH: usize = 32;
/// Immediate-receive WRs reposted per chained `ibv_post_srq_recv`.
pub(super) const IMM_BATCH: usize = 32;

impl Endpoint {
    pub(super) fn create_cq(
        ctx: *mut sys::ibv_context,
        want: usize,
    ) -> Result<(*mut sys::ibv_cq, usize)> {
        // SAFETY: `ctx` is open; no completion channel, no vector.
        let cq =
            unsafe { sys::ibv_create_cq(ctx, want as i32, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(provider_err(
                "ibv_create_cq",
                errno(),
                format!("{want} entries; lower tx_depth/rx_depth. {MEMLOCK_HINT}"),
            ));
        }
        // SAFETY: `cq` is valid; `cqe` is what the provider granted.
        let got = unsafe { (*cq).cqe }.max(0) as usize;
        Ok((cq, got))
    }

    /// CQ entries needed with `peers` connected pairs plus the pending one.
    pub(super) fn cq_needed(&self, peers: usize) -> usize {
        self.imm_depth + self.caps.rx_depth + (peers + 1) * 2 * self.caps.tx_depth
    }

    pub(super) fn ensure_cq(&mut self, peers: usize) -> Result<()> {
        let need = self.cq_needed(peers);
        if need <= self.cq_cap {
            return Ok(());
        }
        let want = need.max(self.cq_cap * 2);
        // SAFETY: `cq` is live; resizing keeps its queued completions.
        let rc = unsafe { sys::ibv_resize_cq(self.cq, want as i32) };
        check(
            rc,
            "ibv_resize_cq",
            format!(
                "growing the CQ to {want} entries for {peers} peers; lower tx_depth, or use fewer \
                 peers per endpoint"
            ),
        )?;
        // SAFETY: `cq` is live.
        self.cq_cap = unsafe { (*self.cq).cqe }.max(0) as usize;
        Ok(())
    }

    /// Link `imm_wrs` into one chain of identical zero-length receives, once: posting `n` of
    /// them then only cuts the chain after the `n`-th. The boxed array never moves, so the
    /// links stay valid for the endpoint's life.
    pub(super) fn link_imm_chain(&mut self) {
        let base = self.imm_wrs.as_mut_ptr();
        let len = self.imm_wrs.len();
        for (i, w) in self.imm_wrs.iter_mut().enumerate() {
            w.wr_id = TAG_IMM << TAG_SHIFT;
            w.sg_list = ptr::null_mut();
            w.num_sge = 0;
            w.next = if i + 1 < len {
                // SAFETY: `i + 1 < len`: a pointer into the same boxed array.
                unsafe { base.add(i + 1) }
            } else {
                ptr::null_mut()
            };
        }
    }

    /// Post `n` (<= IMM_BATCH) zero-length receives to the immediate SRQ.
    fn post_imm_recvs(&mut self, n: usize) -> Result<()> {
        let n = n.min(self.imm_wrs.len());
        let Some(last) = n.checked_sub(1) else {
            return Ok(());
        };
        // Cut the chain after `n` for this post; linked again below.
        let next = std::mem::replace(&mut self.imm_wrs[last].next, ptr::null_mut());
        let mut bad = ptr::null_mut();
        // SAFETY: `imm_srq` is live; the chain is `n` initialised WRs in an array the endpoint
        // owns (copied by the provider before the call returns); no SGEs.
        let rc =
            unsafe { sys::ibvs_post_srq_recv(self.imm_srq, self.imm_wrs.as_mut_ptr(), &mut bad) };
        self.imm_wrs[last].next = next;
        check(
            rc,
            "ibv_post_srq_recv",
            "immediate receives; the SRQ is smaller than expected",
        )
    }

    pub(super) fn repost_imm(&mut self) -> Result<()> {
        while self.imm_to_post > 0 {
            let n = self.imm_to_post.min(IMM_BATCH);
            self.post_imm_recvs(n)?;
            self.imm_to_post -= n;
        }
        Ok(())
    }

    /// [`Transport::poll`](transport_core::Transport::poll): up to `POLL_BATCH` work
    /// completions, each mapped to at most one [`Completion`]; reposts the immediate receives
    /// taken once enough are.
    #[inline]
    pub(super) fn poll_cq(&mut self, out: &mut [Completion]) -> Result<usize> {
        let want = out.len().min(POLL_BATCH);
        if want == 0 {
            return Ok(0);
        }
        // SAFETY: `cq` is live; `wcs` holds POLL_BATCH >= `want` entries.
        let n = unsafe { sys::ibvs_poll_cq(self.cq, want as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(poll_failed(n));
        }
        let n = (n as usize).min(want);
        let mut k = 0;
        // n <= want <= out.len(), and every work completion maps to at most one completion,
        // so before the i-th is read k <= i < n <= out.len(): `out[k]` needs no check.
        for i in 0..n {
            let wc = &self.wcs[i];
            if wc.status != sys::IBV_WC_SUCCESS {
                // Out of line: the same bookkeeping, and the error completion, if any.
                if let Some(c) = self.failed_wc(i) {
                    // SAFETY: k <= i < n <= out.len() (above).
                    unsafe { *out.get_unchecked_mut(k) = c };
                    k += 1;
                }
                continue;
            }
            let wr_id = wc.wr_id;
            if wr_id >> TAG_SHIFT == TAG_SQ {
                let slot = (wr_id & 0xffff_ffff) as usize;
                let peer = ((wr_id >> 32) & 0xff_ffff) as usize;
                let msg = (wr_id >> 56) & 1 == CHAN_MSG;
                let Some(p) = self.peers.get_mut(peer) else {
                    continue;
                };
                let q = if msg { &mut p.msg } else { &mut p.data };
                q.outstanding = q.outstanding.saturating_sub(1);
                let ctx = q.ctx.get(slot).copied().unwrap_or(0);
                // SAFETY: k <= i < n <= out.len() (above).
                unsafe {
                    *out.get_unchecked_mut(k) = Completion {
                        ctx,
                        kind: if msg {
                            CompletionKind::Send
                        } else {
                            CompletionKind::Write
                        },
                    }
                };
                k += 1;
            } else if wr_id >> TAG_SHIFT == TAG_RECV {
                let slot = (wr_id & 0xffff_ffff) as u32;
                let len = wc.byte_len as usize;
                // SAFETY: IBV_WC_WITH_IMM says the union holds imm_data.
                let imm = (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0)
                    .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }));
                let ctx = self.recv_ctx.get(slot as usize).copied().unwrap_or(0);
                self.recv_free.push(slot);
                // SAFETY: k <= i < n <= out.len() (above).
                unsafe {
                    *out.get_unchecked_mut(k) = Completion {
                        ctx,
                        kind: CompletionKind::Recv { len, imm },
                    }
                };
                k += 1;
            } else {
                // One of our zero-length immediate receives.
                // SAFETY: a successful RECV_RDMA_WITH_IMM carries imm_data.
                let imm = u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data });
                self.imm_to_post += 1;
                // SAFETY: k <= i < n <= out.len() (above).
                unsafe {
                    *out.get_unchecked_mut(k) = Completion {
                        ctx: 0,
                        kind: CompletionKind::RemoteWrite { imm },
                    }
                };
                k += 1;
            }
        }
        if self.imm_to_post >= self.imm_repost_at {
            if let Err(e) = self.repost_imm() {
                // The completions taken above are handed out, not lost: the repost is tried
                // again at the next poll, which returns its error where it still fails.
                if k == 0 {
                    return Err(e);
                }
            }
        }
        Ok(k)
    }

    /// [`Self::poll_cq`] for a work completion that failed (`wcs[i]`, status not success):
    /// the same bookkeeping as a success (send-queue slot, receive slot, immediate receive
    /// consumed), and the error completion to hand out, if any (none for the backend's own
    /// immediate receives: the writer gets the error; counted here for diagnosis).
    #[cold]
    #[inline(never)]
    fn failed_wc(&mut self, i: usize) -> Option<Completion> {
        let wc = self.wcs[i];
        match wc.wr_id >> TAG_SHIFT {
            TAG_SQ => {
                let slot = (wc.wr_id & 0xffff_ffff) as usize;
                let peer = ((wc.wr_id >> 32) & 0xff_ffff) as usize;
                let msg = (wc.wr_id >> 56) & 1 == CHAN_MSG;
                let p = self.peers.get_mut(peer)?;
                let q = if msg { &mut p.msg } else { &mut p.data };
                q.outstanding = q.outstanding.saturating_sub(1);
                let ctx = q.ctx.get(slot).copied().unwrap_or(0);
                let op = if msg { Op::Send } else { Op::Write };
                Some(Completion {
                    ctx,
                    kind: CompletionKind::Error(self.wc_error(op, ctx, &wc)),
                })
            }
            TAG_RECV => {
                let slot = (wc.wr_id & 0xffff_ffff) as u32;
                let ctx = self.recv_ctx.get(slot as usize).copied().unwrap_or(0);
                self.recv_free.push(slot);
                Some(Completion {
                    ctx,
                    kind: CompletionKind::Error(self.wc_error(Op::Recv, ctx, &wc)),
                })
            }
            _ => {
                // Consumed either way.
                self.imm_to_post += 1;
                if wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                    self.responder_errors += 1;
                    self.last_responder_error = Some(self.wc_error(Op::RemoteWrite, 0, &wc));
                }
                None
            }
        }
    }

    #[cold]
    fn wc_error(&self, op: Op, ctx: u64, wc: &sys::ibv_wc) -> Box<CompletionError> {
        // SAFETY: ibv_wc_status_str returns a static NUL-terminated string for any status.
        let text = unsafe { CStr::from_ptr(sys::ibv_wc_status_str(wc.status)) }.to_string_lossy();
        Box::new(CompletionError {
            op,
            ctx,
            code: wc.status as i32,
            prov_errno: wc.vendor_err as i32,
            msg: format!(
                "{text} (device {}, qp {:#x}, vendor error {:#x})",
                self.domain.name, wc.qp_num, wc.vendor_err
            ),
            hint: wc_hint(wc.status),
        })
    }
}

/// What to do about a failed work completion, by its status; never empty.
fn wc_hint(status: sys::ibv_wc_status) -> &'static str {
    match status {
        sys::IBV_WC_RETRY_EXC_ERR => {
            "the peer did not answer: check that it still runs, that its queue pair is not in \
             error, and the path to it (GID index, MTU, link); then reopen both ends"
        }
        sys::IBV_WC_RNR_RETRY_EXC_ERR => hint::NO_RECV,
        sys::IBV_WC_REM_ACCESS_ERR => hint::BAD_REMOTE,
        sys::IBV_WC_LOC_PROT_ERR => hint::NOT_REGISTERED,
        sys::IBV_WC_LOC_LEN_ERR => hint::TOO_LONG,
        sys::IBV_WC_REM_INV_REQ_ERR => {
            "the peer refused the request (a message too long for its receive buffer?): post \
             larger receives there"
        }
        sys::IBV_WC_WR_FLUSH_ERR => {
            "flushed because an earlier operation on this queue pair failed: look for the first \
             error, then reopen the endpoint"
        }
        _ => {
            "the queue pair is in error after this: reopen the endpoint; `ibv_devinfo -v` and \
              the kernel log (`dmesg`) may say more"
        }
    }
}

/// `ibv_poll_cq` failed. Its negative return is the provider's own code, not an errno (mlx5
/// returns -2 for a corrupt CQE), so it is reported as the number it is.
#[cold]
#[inline(never)]
fn poll_failed(n: i32) -> transport_core::Error {
    transport_core::Error::Provider {
        call: "ibv_poll_cq",
        code: n.saturating_abs(),
        msg: format!("ibv_poll_cq returned {n} (the provider's code, not an errno)"),
        hint: "the completion queue is broken (overrun?); the endpoint must be reopened".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failed_status_has_a_hint() {
        for status in sys::IBV_WC_LOC_LEN_ERR..=sys::IBV_WC_TM_RNDV_INCOMPLETE + 1 {
            assert!(!wc_hint(status).is_empty(), "status {status}");
        }
        assert!(wc_hint(sys::IBV_WC_REM_ACCESS_ERR).contains("remote key"));
        assert!(wc_hint(sys::IBV_WC_RETRY_EXC_ERR).contains("still runs"));
    }
}
