//! The completion path's parts: mapping each entry `poll` (in `endpoint.rs`) reads from the CQ
//! to a [`Completion`] (the slab gives back the operation's context; a peer's WRITE with
//! immediate has none of ours), and reading an error entry, out of line.

use libfabric_sys as fi;
use transport_core::{Completion, CompletionError, CompletionKind, Op, Result};

use crate::endpoint::Endpoint;
use crate::error::{self, provider};
use crate::slab::Kind;

impl Endpoint {
    /// Map one successful CQ entry; `None` for entries that are none of ours to report.
    #[inline(always)]
    pub(crate) fn completion(&mut self, e: &fi::fi_cq_data_entry) -> Option<Completion> {
        let remote_data = e.flags & fi::FI_REMOTE_CQ_DATA != 0;
        match self.slab.release(e.op_context) {
            Some((ctx, kind)) => {
                let kind = match kind {
                    Kind::Send => CompletionKind::Send,
                    Kind::Recv => CompletionKind::Recv {
                        len: e.len,
                        imm: remote_data.then_some(e.data as u32),
                    },
                    Kind::Write => CompletionKind::Write,
                    Kind::Free => return None,
                };
                Some(Completion { ctx, kind })
            }
            // No context of ours: a peer's WRITE with immediate landed here.
            None if remote_data => {
                // Under FI_RX_CQ_DATA it consumed one of the data endpoint's receives.
                if let Some(imm) = self.imm.as_mut() {
                    if let Some(i) = imm.index_of(e.op_context) {
                        imm.repost(i);
                    }
                }
                Some(Completion {
                    ctx: 0,
                    kind: CompletionKind::RemoteWrite { imm: e.data as u32 },
                })
            }
            None => {
                // A receive for immediates that completed without one (nothing to report).
                if let Some(imm) = self.imm.as_mut() {
                    if let Some(i) = imm.index_of(e.op_context) {
                        imm.repost(i);
                    }
                }
                None
            }
        }
    }

    /// Read one error entry (after `-FI_EAVAIL`). Allocates: error path only.
    #[cold]
    pub(crate) fn error_completion(&mut self) -> Result<Option<Completion>> {
        let mut e = fi::fi_cq_err_entry::default();
        // SAFETY: cq is open; e is a zeroed entry (err_data_size 0: the provider lends its
        // own buffer for err_data, valid until the next read on this CQ).
        let ret = unsafe { fi::rs_fi_cq_readerr(self.cq, &mut e, 0) };
        if ret == -(fi::FI_EAGAIN as isize) {
            return Ok(None);
        }
        if ret < 0 {
            return Err(provider(
                "fi_cq_readerr",
                ret as i64,
                "the completion queue could not be read; the endpoint is unusable: reopen it",
            ));
        }
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: cq is open; err_data comes from the entry just read and is still valid; buf
        // has buf.len() writable bytes. The returned pointer is buf or a provider string.
        let prov = unsafe {
            let p = fi::rs_fi_cq_strerror(
                self.cq,
                e.prov_errno,
                e.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            );
            error::cstr(p)
        };
        let imm_recv = self.imm.as_ref().and_then(|i| i.index_of(e.op_context));
        let (ctx, op) = match self.slab.release(e.op_context) {
            Some((ctx, kind)) => (ctx, kind.op()),
            None if e.flags & fi::FI_REMOTE_WRITE != 0 || imm_recv.is_some() => {
                (0, Op::RemoteWrite)
            }
            None => (0, Op::Unknown),
        };
        if let (Some(i), Some(imm)) = (imm_recv, self.imm.as_mut()) {
            imm.repost(i);
        }
        let mut msg = error::strerror(e.err.into());
        if !prov.is_empty() && prov != msg {
            msg.push_str(": ");
            msg.push_str(&prov);
        }
        Ok(Some(Completion {
            ctx,
            kind: CompletionKind::Error(Box::new(CompletionError {
                op,
                ctx,
                code: e.err,
                prov_errno: e.prov_errno,
                msg,
            })),
        }))
    }
}
