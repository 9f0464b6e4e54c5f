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
                hint: completion_hint(&self.provider, op, e.err, e.prov_errno),
            })),
        }))
    }
}

/// What to do about an error completion: for the efa provider by its `prov_errno`, the
/// device's `EFA_IO_COMP_STATUS_*` (1.x reports every device error as `FI_EIO`, 2.x maps
/// several statuses to one code, `FI_EINVAL` for a bad remote key and a bad local one alike),
/// then by libfabric's code. Never empty.
fn completion_hint(provider: &str, op: Op, err: i32, prov_errno: i32) -> &'static str {
    const UNREACHABLE: &str = "the peer never answered: check that it runs, that the address \
        it sent is its own, and (EFA) that the security group lets all traffic through \
        between the two nodes";
    use transport_core::hint::{BAD_REMOTE, NOT_REGISTERED, NO_RECV, PEER_GONE as GONE, TOO_LONG};
    const FLUSHED: &str = "flushed because the endpoint is closing or an earlier operation \
        failed: look for the first error";
    const CANCELLED: &str = "cancelled because the connection or the endpoint failed (the tcp \
        provider drops the connection when the peer refuses a WRITE's key or range): check \
        the remote key and slice, and look for the first error";
    let efa = provider.starts_with("efa");
    match (err, efa.then_some(prov_errno)) {
        (_, Some(1)) => FLUSHED,
        (_, Some(5)) => NOT_REGISTERED,
        (_, Some(6 | 11)) => TOO_LONG,
        (_, Some(7)) => BAD_REMOTE,
        // 4124, 4126: the provider's own "unresponsive receiver".
        (_, Some(8 | 9 | 13 | 14 | 4124 | 4126)) => GONE,
        (_, Some(10)) => NO_RECV,
        (_, Some(15)) => UNREACHABLE,
        (fi::FI_EHOSTUNREACH | fi::FI_ECONNREFUSED, _) => UNREACHABLE,
        (fi::FI_ECONNABORTED | fi::FI_ECONNRESET | fi::FI_ENOTCONN | fi::FI_ETIMEDOUT, _) => GONE,
        (fi::FI_EACCES | fi::FI_EKEYREJECTED | fi::FI_EREMOTEIO, _) => BAD_REMOTE,
        (fi::FI_EINVAL, _) if matches!(op, Op::Write | Op::RemoteWrite) => BAD_REMOTE,
        (fi::FI_EMSGSIZE, _) => TOO_LONG,
        (e, _) if e == fi::FI_ETRUNC as i32 => TOO_LONG,
        (e, _) if e == fi::FI_ENORX as i32 => NO_RECV,
        (fi::FI_ECANCELED, _) => CANCELLED,
        _ => "run again with FI_LOG_LEVEL=warn for the provider's own log of it",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_completion_has_a_hint() {
        let codes = [
            0,
            fi::FI_EIO,
            fi::FI_EINVAL,
            fi::FI_ECANCELED,
            fi::FI_ETRUNC as i32,
            9999,
        ];
        for provider in ["efa", "efa;ofi_rxm", "tcp", "shm"] {
            for op in [Op::Send, Op::Recv, Op::Write, Op::RemoteWrite, Op::Unknown] {
                for err in codes {
                    for prov_errno in [0, 1, 7, 15, 16, 4096, -1] {
                        let h = completion_hint(provider, op, err, prov_errno);
                        assert!(!h.is_empty(), "{provider} {op} {err} {prov_errno}");
                    }
                }
            }
        }
    }

    #[test]
    fn efa_device_statuses_are_read_only_from_the_efa_provider() {
        // libfabric 1.x's efa: FI_EIO with the device status.
        let bad_key = completion_hint("efa", Op::Write, fi::FI_EIO, 7);
        assert!(bad_key.contains("remote key"), "{bad_key}");
        assert!(completion_hint("efa", Op::Send, fi::FI_EIO, 15).contains("never answered"));
        // The same numbers from another provider are not the device's.
        let tcp = completion_hint("tcp", Op::Write, fi::FI_EIO, 7);
        assert!(!tcp.contains("remote key"), "{tcp}");
        // libfabric 2.x: FI_EINVAL for a bad remote key (what the simulated device's
        // conformance run reports) and for a bad local one; the status tells them apart.
        let remote = completion_hint("efa", Op::Write, fi::FI_EINVAL, 7);
        assert!(remote.contains("remote key"), "{remote}");
        let local = completion_hint("efa", Op::Write, fi::FI_EINVAL, 5);
        assert!(local.contains("local buffer"), "{local}");
        assert!(completion_hint("efa", Op::Send, fi::FI_EHOSTUNREACH, 15).contains("never"));
        assert!(completion_hint("efa", Op::Send, fi::FI_ECONNABORTED, 4124).contains("runs"));
        assert!(completion_hint("efa", Op::Recv, fi::FI_ETRUNC as i32, 0).contains("longer"));
    }
}
