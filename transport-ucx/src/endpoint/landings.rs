//! Rendezvous WRITEs being received into this endpoint's regions, in the order they arrived,
//! and the immediates held behind them.
//!
//! An immediate says that its own WRITE's bytes are visible here, and so are those of every
//! WRITE its initiator saw complete before posting it (the `write` workload posts a repeat's
//! WRITE with immediate once its other WRITEs completed). A rendezvous WRITE's initiator may
//! see it complete before its bytes are in: UCX's fragmented and pipelined rendezvous
//! complete the send once the last fragment left, while the target's CUDA copy of it may
//! still run. So an immediate that arrives while an earlier rendezvous is still landing
//! waits for it: immediates are released in the order their WRITEs arrived, each once every
//! landing that arrived before it is in. Nothing here allocates while no more than the
//! room made at open is in flight.
//!
//! The order is the endpoint's, across its peers: an immediate from one peer may wait for
//! another's landing. A landing from a peer that died ends with UCX's error where peer error
//! handling is on (the kill soak over tcp with GPU memory: docs/ranks.md), which releases what
//! waits behind it; without it a dead peer's landing never ends and what waits behind it
//! waits too, as every operation with that peer hangs then (`peer_errors=off`).

use std::collections::VecDeque;
use std::ffi::c_void;

/// What arrived, in order: landings UCX is still receiving, and immediates behind them.
pub(super) struct Landings {
    q: VecDeque<Entry>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// UCX's receive request (`ucp_am_recv_data_nbx`); null for an immediate whose bytes were
    /// in when it arrived.
    req: *mut c_void,
    imm: Option<u32>,
    done: bool,
}

impl Landings {
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            q: VecDeque::with_capacity(n),
        }
    }

    /// Whether nothing is landing (and so no immediate is held).
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// A rendezvous began landing: UCX's receive request `req`, its WRITE's immediate.
    pub(super) fn begin(&mut self, req: *mut c_void, imm: Option<u32>) {
        self.q.push_back(Entry {
            req,
            imm,
            done: false,
        });
    }

    /// An immediate whose WRITE's bytes are in: into `out` at once where nothing is landing,
    /// else held behind what is.
    pub(super) fn arrived(&mut self, imm: u32, out: &mut VecDeque<u32>) {
        if self.q.is_empty() {
            out.push_back(imm);
        } else {
            self.q.push_back(Entry {
                req: std::ptr::null_mut(),
                imm: Some(imm),
                done: true,
            });
        }
    }

    /// UCX finished receiving `req`: `landed`, its bytes are in; else nothing landed and its
    /// immediate is dropped. Releases into `out`, in order, every immediate no earlier landing
    /// still holds back. Whether `req` was one of these landings.
    pub(super) fn finish(
        &mut self,
        req: *mut c_void,
        landed: bool,
        out: &mut VecDeque<u32>,
    ) -> bool {
        let Some(e) = self.q.iter_mut().find(|e| !e.done && e.req == req) else {
            return false;
        };
        e.done = true;
        if !landed {
            e.imm = None;
        }
        while let Some(e) = self.q.front().filter(|e| e.done) {
            if let Some(v) = e.imm {
                out.push_back(v);
            }
            self.q.pop_front();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(n: usize) -> *mut c_void {
        n as *mut c_void
    }

    #[test]
    fn an_immediate_waits_for_every_earlier_landing() {
        let mut l = Landings::with_capacity(4);
        let mut out = VecDeque::new();
        l.arrived(1, &mut out);
        assert_eq!(out, [1], "nothing landing: at once");
        l.begin(req(10), None);
        l.begin(req(11), Some(2));
        l.arrived(3, &mut out);
        l.begin(req(12), Some(4));
        assert_eq!(out, [1]);
        // The later rendezvous lands first: its immediate waits for 10's bytes.
        assert!(l.finish(req(11), true, &mut out));
        assert_eq!(out, [1]);
        assert!(l.finish(req(10), true, &mut out));
        assert_eq!(
            out,
            [1, 2, 3],
            "in arrival order, up to the one still landing"
        );
        assert!(!l.is_empty());
        // A landing that failed drops its own immediate only.
        l.begin(req(13), Some(5));
        assert!(l.finish(req(12), false, &mut out));
        assert_eq!(out, [1, 2, 3]);
        assert!(!l.finish(req(12), true, &mut out), "already finished");
        assert!(!l.finish(req(99), true, &mut out), "not one of these");
        assert!(l.finish(req(13), true, &mut out));
        assert_eq!(out, [1, 2, 3, 5]);
        assert!(l.is_empty());
    }
}
