//! Rendezvous WRITEs being received into this endpoint's regions, in the order they arrived
//! from each initiator, and the immediates held behind them.
//!
//! An immediate says that its own WRITE's bytes are visible here, and so are those of every
//! WRITE its initiator saw complete before posting it (the `write` workload posts a repeat's
//! WRITE with immediate once its other WRITEs completed). A rendezvous WRITE's initiator may
//! see it complete before its bytes are in: UCX's fragmented and pipelined rendezvous
//! complete the send once the last fragment left, while the target's CUDA copy of it may
//! still run. So an immediate that arrives while an earlier rendezvous of its initiator is
//! still landing waits for it: each initiator's immediates are released in the order its
//! WRITEs arrived, each once every landing of that initiator that arrived before it is in.
//!
//! The order is kept per initiator, not across them: an immediate promises nothing about
//! another initiator's WRITEs, so it never waits for another's landing. Each active message
//! names its initiator by its origin, a hash of its worker's address (`frame::origin`), which
//! the target computes too for each peer it adds. A queue per origin is made at `add_peer`,
//! with room for `room` entries; an origin the target never added (a peer that connected
//! without being added) gets its queue on first use. Nothing here allocates while each
//! queue holds no more than its room.
//!
//! A landing from a peer that died ends with UCX's error where peer error handling is on (the
//! kill soak over tcp with GPU memory: docs/ranks.md), which releases what waits behind it;
//! without it a dead peer's landing never ends and what waits behind it (that peer's own
//! immediates) waits too, as every operation with that peer hangs then (`peer_errors=off`).

use std::collections::VecDeque;
use std::ffi::c_void;

/// What arrived, per initiator, in order: landings UCX is still receiving, and immediates
/// behind them.
pub(super) struct Landings {
    queues: Vec<Queue>,
    /// Entries in all queues: none, and an immediate is released without a lookup.
    held: usize,
    /// Room made in each queue when it is made.
    room: usize,
}

struct Queue {
    origin: u64,
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
    pub(super) fn with_capacity(room: usize) -> Self {
        Self {
            queues: Vec::new(),
            held: 0,
            room,
        }
    }

    /// Whether nothing is landing (and so no immediate is held).
    pub(super) fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Initiators with a queue.
    #[cfg(test)]
    pub(super) fn initiators(&self) -> usize {
        self.queues.len()
    }

    /// Make the queue of initiator `origin` (a peer added), so that its WRITEs find room.
    pub(super) fn add(&mut self, origin: u64) {
        self.queue(origin);
    }

    fn queue(&mut self, origin: u64) -> &mut VecDeque<Entry> {
        let i = match self.queues.iter().position(|q| q.origin == origin) {
            Some(i) => i,
            None => {
                self.queues.push(Queue {
                    origin,
                    q: VecDeque::with_capacity(self.room),
                });
                self.queues.len() - 1
            }
        };
        &mut self.queues[i].q
    }

    /// A rendezvous from `origin` began landing: UCX's receive request `req`, its WRITE's
    /// immediate.
    pub(super) fn begin(&mut self, origin: u64, req: *mut c_void, imm: Option<u32>) {
        self.queue(origin).push_back(Entry {
            req,
            imm,
            done: false,
        });
        self.held += 1;
    }

    /// An immediate from `origin` whose WRITE's bytes are in: into `out` at once where none
    /// of that initiator's WRITEs is landing, else held behind what is.
    pub(super) fn arrived(&mut self, origin: u64, imm: u32, out: &mut VecDeque<u32>) {
        if self.held == 0 {
            out.push_back(imm);
            return;
        }
        let q = self.queue(origin);
        if q.is_empty() {
            out.push_back(imm);
        } else {
            q.push_back(Entry {
                req: std::ptr::null_mut(),
                imm: Some(imm),
                done: true,
            });
            self.held += 1;
        }
    }

    /// UCX finished receiving `req`: `landed`, its bytes are in; else nothing landed and its
    /// immediate is dropped. Releases into `out`, in order, every immediate of its initiator
    /// that no earlier landing of that initiator still holds back. Whether `req` was one of
    /// these landings.
    pub(super) fn finish(
        &mut self,
        req: *mut c_void,
        landed: bool,
        out: &mut VecDeque<u32>,
    ) -> bool {
        let found = self.queues.iter_mut().find_map(|Queue { q, .. }| {
            let e = q.iter_mut().find(|e| !e.done && e.req == req)?;
            e.done = true;
            if !landed {
                e.imm = None;
            }
            Some(q)
        });
        let Some(q) = found else {
            return false;
        };
        while let Some(e) = q.front().filter(|e| e.done) {
            if let Some(v) = e.imm {
                out.push_back(v);
            }
            q.pop_front();
            self.held -= 1;
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

    const A: u64 = 0xa;
    const B: u64 = 0xb;

    #[test]
    fn an_immediate_waits_for_every_earlier_landing_of_its_initiator() {
        let mut l = Landings::with_capacity(4);
        l.add(A);
        let mut out = VecDeque::new();
        l.arrived(A, 1, &mut out);
        assert_eq!(out, [1], "nothing landing: at once");
        l.begin(A, req(10), None);
        l.begin(A, req(11), Some(2));
        l.arrived(A, 3, &mut out);
        l.begin(A, req(12), Some(4));
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
        l.begin(A, req(13), Some(5));
        assert!(l.finish(req(12), false, &mut out));
        assert_eq!(out, [1, 2, 3]);
        assert!(!l.finish(req(12), true, &mut out), "already finished");
        assert!(!l.finish(req(99), true, &mut out), "not one of these");
        assert!(l.finish(req(13), true, &mut out));
        assert_eq!(out, [1, 2, 3, 5]);
        assert!(l.is_empty());
    }

    /// Another initiator's landing holds nothing back; an origin never added gets a queue of
    /// its own on first use.
    #[test]
    fn initiators_do_not_wait_for_each_other() {
        let mut l = Landings::with_capacity(4);
        l.add(A);
        let mut out = VecDeque::new();
        l.begin(A, req(10), Some(1));
        l.arrived(A, 2, &mut out);
        l.arrived(B, 3, &mut out);
        assert_eq!(out, [3], "B's immediate does not wait for A's landing");
        l.begin(B, req(20), None);
        l.arrived(B, 4, &mut out);
        l.arrived(0xc, 5, &mut out);
        assert_eq!(out, [3, 5]);
        assert!(l.finish(req(10), true, &mut out));
        assert_eq!(out, [3, 5, 1, 2], "A's, once its bytes are in");
        assert!(!l.is_empty(), "B's still landing");
        assert!(l.finish(req(20), true, &mut out));
        assert_eq!(out, [3, 5, 1, 2, 4]);
        assert!(l.is_empty());
        assert_eq!(l.initiators(), 3);
    }
}
