//! Where every clock stops: at delivery, never at "queued".
//!
//! A figure is bytes over the time from a start to a [`Delivered`], and a [`Delivered`] comes
//! from two places only:
//!
//! - [`land`], at the side the bytes went to, once they are in place: every region passed
//!   through [`Transport::make_gpu_visible`] (what a NIC wrote into GPU memory flushed where
//!   the GPU needs it; a provider's CUDA copies into `GpuBuffer` memory, which carries
//!   `SYNC_MEMOPS`, ran before their completions), and, at the end of a phase, the GPU idle
//!   (whatever a provider still had queued on it has run). The target's own clocks stop
//!   there: `lat` (each round trip stops after the client landed the answer, which the
//!   other side sent only after [`make_visible`] on the ping) and the receiving links of
//!   `rdma-bench run`.
//! - [`Delivered::acknowledged`], at the side that posted, from the target's acknowledgement:
//!   a WRITE with the immediate [`ACK_IMM`] that the target posts after [`land`] at the end of
//!   every phase (`write`, `rate`, `send`, and the sending links of `rdma-bench run`). The
//!   initiator's clock for a NIC stops when both its last operation completed locally and
//!   that acknowledgement arrived, so it includes one one-way trip more than the data needed:
//!   what fabtests' bandwidth tests pay once per window of 64 (`bw_tx_comp` waits for the
//!   receiver's message after every window), paid here once per phase.
//!
//! So no workload can report a figure whose clock stopped when its last operation was queued
//! or sent: the stopwatch ([`Clock`]) reads only against a [`Delivered`].

use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, LocalSlice, MemoryRegion, PeerId, Post, RemoteSlice, Transport,
};

use crate::buffers;
use crate::error::{Result, TransportContext};

/// The immediate of a target's acknowledgement that what a phase sent it is in place.
/// Acknowledgements land only on the side that posts, which gets no data immediates (the
/// `write` workload's and `rdma-bench run`'s land on the target); there the only other
/// immediates are the `send` workload's credits, at most a receive depth
/// ([`MAX_CREDIT_IMM`]).
pub const ACK_IMM: u32 = u32::MAX;

/// Largest credit count one credit immediate carries: below [`ACK_IMM`].
pub const MAX_CREDIT_IMM: u32 = ACK_IMM - 1;

/// Bytes an acknowledgement WRITE carries (its immediate is what counts).
pub const ACK_LEN: usize = 8;

/// Proof that bytes are in place, and when that was known. See the module docs for the only
/// two ways to get one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Delivered(Instant);

impl Delivered {
    /// The target's acknowledgement, where `c` is one ([`ACK_IMM`]); `None` for anything else.
    #[inline]
    pub fn acknowledged(c: &Completion) -> Option<Delivered> {
        matches!(c.kind, CompletionKind::RemoteWrite { imm: ACK_IMM })
            .then(|| Delivered(Instant::now()))
    }

    /// When delivery was known.
    pub fn at(self) -> Instant {
        self.0
    }

    /// Stamped now, by a side that made the bytes visible ([`make_visible`]) after the
    /// completions that announced them, and since then only posted (the ping-pong's next
    /// ping: its clock read is then off the path between an answer and the next ping).
    #[inline]
    pub(super) fn after_visible() -> Delivered {
        Delivered(Instant::now())
    }

    /// The same proof, stamped now: for a NIC whose last local completion came after the
    /// acknowledgement (the phase ends when both arrived).
    #[inline]
    pub fn renewed(self) -> Delivered {
        Delivered(Instant::now().max(self.0))
    }

    /// The later of two proofs (a NIC is done when its last local completion and the
    /// acknowledgement both arrived; either may come first).
    pub fn later(self, other: Delivered) -> Delivered {
        self.max(other)
    }
}

/// A stopwatch that reads only against a [`Delivered`].
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant);

impl Clock {
    /// Start now.
    #[inline]
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    /// Start at `t0` (a phase's common start).
    pub fn from(t0: Instant) -> Clock {
        Clock(t0)
    }

    /// When it started.
    pub fn started(self) -> Instant {
        self.0
    }

    /// From the start to delivery (zero where delivery was known before the start).
    #[inline]
    pub fn stop(self, d: Delivered) -> Duration {
        d.0.saturating_duration_since(self.0)
    }
}

/// Whether [`land`] also waits for the GPU to be idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Per message (`lat`): only [`Transport::make_gpu_visible`], which is free where nothing
    /// is needed.
    No,
    /// At the end of a phase: then the GPU idle too (`cuCtxSynchronize` of every GPU region's
    /// context), should a provider have left a copy queued.
    Yes,
}

/// The bytes that completed operations put into `regions` (polled on `ep`) are in place:
/// [`Transport::make_gpu_visible`] on each, then, with [`Drain::Yes`], the GPU idle
/// ([`buffers::gpu_drain_all`] says why a completion alone is not enough there).
#[inline]
pub fn land<T: Transport>(ep: &mut T, regions: &[&T::Mr], drain: Drain) -> Result<Delivered> {
    make_visible(ep, regions)?;
    if drain == Drain::Yes {
        buffers::gpu_drain_all(regions.iter().map(|m| m.memory()))?;
    }
    Ok(Delivered(Instant::now()))
}

/// What [`land`] does without the clock: for a side whose clock does not stop here (the
/// ping-pong's answering side lands each message before it answers).
#[inline]
pub fn make_visible<T: Transport>(ep: &mut T, regions: &[&T::Mr]) -> Result<()> {
    for mr in regions {
        ep.make_gpu_visible(mr)
            .ctx(|| "making the received bytes visible to the GPU")?;
    }
    Ok(())
}

/// Post a target's acknowledgement ([`ACK_IMM`]) from the first [`ACK_LEN`] bytes of `src`
/// into `to` on `peer`, with context `ctx`; `false` where the queue was full (post it again
/// on a later turn).
pub fn post_ack<T: Transport>(
    ep: &mut T,
    peer: PeerId,
    src: &T::Mr,
    to: RemoteSlice<T::RemoteKey>,
    ctx: u64,
) -> Result<bool> {
    let local = LocalSlice::new(src, 0, ACK_LEN).ctx(|| "the acknowledgement's source")?;
    let posted = ep
        .post_write(peer, local, to, Some(ACK_IMM), ctx)
        .ctx(|| "posting the delivery acknowledgement")?;
    Ok(posted == Post::Posted)
}

/// A target's acknowledgements on one NIC: after the given counts of arrivals (the end of
/// each phase), [`land`] then [`post_ack`]. Driven from the target's polling loop.
pub struct Acks {
    /// Arrival counts that end a phase, ascending (warm-up end, then the run's end).
    at: [u64; 2],
    next: usize,
    /// Landed, not yet posted (the queue was full).
    pending: bool,
    /// Posted, local completion not yet seen.
    pub inflight: u64,
}

impl Acks {
    /// Acknowledge after `warm` arrivals (where non-zero) and after `total` (where non-zero).
    pub fn new(warm: u64, total: u64) -> Self {
        let at = match (warm, total) {
            (_, 0) => [u64::MAX, u64::MAX],
            (0, t) => [t, u64::MAX],
            (w, t) if w >= t => [t, u64::MAX],
            (w, t) => [w, t],
        };
        Acks {
            at,
            next: 0,
            pending: false,
            inflight: 0,
        }
    }

    /// Whether `count` arrivals end a phase that is not yet acknowledged.
    #[inline]
    pub fn due(&self, count: u64) -> bool {
        self.next < 2 && count >= self.at[self.next]
    }

    /// Whether [`step`](Self::step) after `count` arrivals has anything to do (it does
    /// nothing otherwise): a phase to land and acknowledge, or an acknowledgement to re-post.
    #[inline]
    pub fn wants_step(&self, count: u64) -> bool {
        self.pending || self.due(count)
    }

    /// After arrivals up to `count`: land and acknowledge the phase they end, or post an
    /// acknowledgement that met a full queue.
    #[allow(clippy::too_many_arguments)]
    pub fn step<T: Transport>(
        &mut self,
        count: u64,
        ep: &mut T,
        data: &T::Mr,
        peer: PeerId,
        src: &T::Mr,
        to: RemoteSlice<T::RemoteKey>,
        ctx: u64,
    ) -> Result<()> {
        if !self.pending && self.due(count) {
            land(ep, &[data], Drain::Yes)?;
            self.pending = true;
        }
        if self.pending && post_ack(ep, peer, src, to, ctx)? {
            self.pending = false;
            self.inflight += 1;
            self.next += 1;
        }
        Ok(())
    }

    /// Every acknowledgement due by `total` arrivals went out and completed locally.
    pub fn settled(&self, count: u64) -> bool {
        !self.pending && !self.due(count) && self.inflight == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_points_end_each_phase() {
        let a = Acks::new(3, 10);
        assert!(!a.due(2));
        assert!(a.due(3));
        // The receive loop skips step() unless it has work: a phase's end is work.
        assert!(!a.wants_step(2));
        assert!(a.wants_step(3));
        let a = Acks::new(0, 10);
        assert!(!a.due(9));
        assert!(a.due(10));
        let a = Acks::new(0, 0);
        assert!(!a.due(0) && !a.due(u64::MAX - 1));
        assert!(a.settled(0));
        // A warm-up as long as the run (never in practice): one acknowledgement.
        let a = Acks::new(10, 10);
        assert!(a.due(10));
    }

    #[test]
    fn only_the_ack_immediate_proves_delivery() {
        let ack = Completion {
            ctx: 0,
            kind: CompletionKind::RemoteWrite { imm: ACK_IMM },
        };
        assert!(Delivered::acknowledged(&ack).is_some());
        for kind in [
            CompletionKind::RemoteWrite { imm: 7 },
            CompletionKind::Write,
            CompletionKind::Send,
            CompletionKind::Recv {
                len: 8,
                imm: Some(ACK_IMM),
            },
        ] {
            assert!(Delivered::acknowledged(&Completion { ctx: 0, kind }).is_none());
        }
        const { assert!(MAX_CREDIT_IMM < ACK_IMM) };
    }

    #[test]
    fn a_clock_reads_to_delivery() {
        let c = Clock::start();
        let d = Delivered(Instant::now());
        assert!(c.stop(d) < Duration::from_secs(5));
        let early = Delivered(c.started());
        assert_eq!(Clock::from(Instant::now()).stop(early), Duration::ZERO);
        assert_eq!(early.later(d), d);
    }
}
