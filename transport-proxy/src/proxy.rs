//! The proxy: one thread per endpoint turns a ring's commands into posts and completions into
//! the ring's counters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, LocalSlice, PeerId, RemoteRegion, Transport, WriteOp,
};

use crate::ring::{
    self, unpack, Ring, ARRIVAL_SHIFT, ERR_BAD_COMMAND, ERR_BAD_IMMEDIATE, ERR_COMPLETION,
    ERR_STOPPED, ERR_TRANSPORT, OP_FENCE, OP_WRITE, OP_WRITE_IMM,
};

/// A peer as the ring's commands name it (`Command::peer` indexes the proxy's peer table): its
/// id on this endpoint and its regions, imported for it (`Command::remote`'s region index).
pub struct ProxyPeer<K> {
    pub id: PeerId,
    pub regions: Vec<RemoteRegion<K>>,
}

/// Why a proxy stopped other than being asked to. The ring's error word says the same to the
/// producers and waiters (`ring::ERR_*`).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A post, a poll or `make_gpu_visible` failed.
    #[error("proxy: the transport failed: {0}")]
    Transport(#[source] transport_core::Error),
    /// The WRITE at ring position `pos` completed with an error.
    #[error("proxy: the WRITE of ring position {pos} failed: {error}. Check the peer is alive and its region imported for this peer")]
    Completion {
        pos: u64,
        #[source]
        error: Box<transport_core::CompletionError>,
    },
    /// A command named an unknown op, peer or region, or a range outside its region.
    #[error("proxy: ring position {pos} holds a bad command: {why}. Fix the producer")]
    BadCommand { pos: u64, why: String },
    /// An immediate named an arrival counter the ring lacks (`imm >> 16 >= arrival slots`).
    #[error("proxy: an immediate {imm:#x} names arrival counter {} but the ring has {slots}. Give the ring one slot per writing peer", imm >> ARRIVAL_SHIFT)]
    BadImmediate { imm: u32, slots: u32 },
    /// Asked to stop, it waited [`STOP_GRACE`] and WRITEs were still in flight (a peer that
    /// stopped polling, a lost completion): their buffers must not be freed yet.
    #[error("proxy: stopped with {in_flight} WRITEs still in flight after waiting {waited:?} for them. Is the peer still polling?")]
    StoppedInFlight { in_flight: u64, waited: Duration },
}

/// What a proxy did, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// WRITEs posted.
    pub writes: u64,
    /// Fences passed.
    pub fences: u64,
    /// `post_writes` calls.
    pub batches: u64,
    /// Calls that found the queue full (the rest was posted after a poll).
    pub queue_full: u64,
    /// Immediates counted into arrivals.
    pub arrivals: u64,
}

/// The most WRITEs one `post_writes` call carries.
pub const DEFAULT_BATCH: usize = 64;
const POLL_BATCH: usize = 64;
const IDLE_TURNS_BEFORE_YIELD: u32 = 4096;
/// How long a stopped proxy waits for the completions of WRITEs in flight.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// One endpoint's proxy: its ring, the local regions commands name (`Command::local`'s region
/// index: `regions[i]`), the peers (`Command::peer`), and which regions are landing regions
/// whose arrivals it publishes. It owns the regions while it runs (a region is `Send`, not
/// `Sync`, so the proxy's thread holds them); [`Proxy::into_regions`] hands them back.
pub struct Proxy<'a, T: Transport> {
    ring: Ring<'a>,
    regions: Vec<T::Mr>,
    peers: Vec<ProxyPeer<T::RemoteKey>>,
    landing: Vec<usize>,
    max_batch: usize,
    stop_grace: Duration,
}

impl<'a, T: Transport> Proxy<'a, T> {
    /// A proxy for `ring`: commands name `regions[i]` and `peers[j]` (with
    /// `peers[j].regions[k]`).
    pub fn new(ring: Ring<'a>, regions: Vec<T::Mr>, peers: Vec<ProxyPeer<T::RemoteKey>>) -> Self {
        Self {
            ring,
            regions,
            peers,
            landing: Vec::new(),
            max_batch: DEFAULT_BATCH,
            stop_grace: STOP_GRACE,
        }
    }

    /// The regions (indices into `regions`) peers WRITE into here: the proxy calls
    /// `make_gpu_visible` on each after polling immediates and before publishing the arrivals
    /// (for host memory backends return at once; for GPU memory it is what makes the bytes
    /// visible to the waiting kernel). Indices past the table are ignored.
    pub fn landing(mut self, landing: Vec<usize>) -> Self {
        self.landing = landing;
        self.landing.retain(|&i| i < self.regions.len());
        self
    }

    /// The most WRITEs per `post_writes` call (at least 1).
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// How long a stopped proxy waits for its WRITEs in flight ([`STOP_GRACE`] by default).
    pub fn stop_grace(mut self, d: Duration) -> Self {
        self.stop_grace = d;
        self
    }

    /// The regions.
    pub fn regions(&self) -> &[T::Mr] {
        &self.regions
    }

    /// The regions back (to deregister, or to read).
    pub fn into_regions(self) -> Vec<T::Mr> {
        self.regions
    }

    /// Run until `stop` is set and no WRITE is in flight (or an error): poll the ring, post
    /// what is ready in batches, poll completions, publish `done` and `arrivals`. Stores the
    /// error word before it returns ([`ERR_STOPPED`] when stopped).
    ///
    /// Nothing is allocated after it starts, no lock is taken, and it makes no syscall of its
    /// own while there is work (after a long idle stretch it yields its core).
    ///
    /// With GPU memory among the regions, call it on a thread with the device's CUDA context
    /// current (`transport_core::cuda_enter_device`): the provider's CUDA calls run on this
    /// thread, and libfabric's shm copies through host memory where it has none.
    pub fn run(&self, ep: &mut T, stop: &AtomicBool) -> Result<ProxyStats, ProxyError> {
        let out = self.run_inner(ep, stop);
        self.ring.set_error(match &out {
            Ok(_) => ERR_STOPPED,
            Err(ProxyError::Transport(_)) => ERR_TRANSPORT,
            Err(ProxyError::Completion { .. }) => ERR_COMPLETION,
            Err(ProxyError::BadCommand { .. }) => ERR_BAD_COMMAND,
            Err(ProxyError::BadImmediate { .. }) => ERR_BAD_IMMEDIATE,
            Err(ProxyError::StoppedInFlight { .. }) => ERR_STOPPED,
        });
        out
    }

    fn run_inner(&self, ep: &mut T, stop: &AtomicBool) -> Result<ProxyStats, ProxyError> {
        let ring = &self.ring;
        let slots = ring.layout().arrival_slots;
        let mut stats = ProxyStats::default();
        let mut tail = ring.tail().load(Ordering::Acquire);
        let mut done = ring.done().load(Ordering::Acquire);
        let mut arrived: Vec<u64> = (0..slots)
            .map(|i| ring.arrivals(i).map_or(0, |a| a.load(Ordering::Acquire)))
            .collect();
        let mut comps = vec![Completion::default(); POLL_BATCH];
        let mut batch: Vec<WriteOp<'_, T::Mr, T::RemoteKey>> = Vec::with_capacity(self.max_batch);
        let mut in_flight = 0u64;
        let mut idle = 0u32;
        let mut stopping: Option<Instant> = None;
        loop {
            // Gather what is ready from `tail` on, up to a fence or a batch's worth.
            batch.clear();
            let start = tail;
            let mut pos = tail;
            while batch.len() < self.max_batch {
                let Some(cmd) = ring.peek(pos) else { break };
                match cmd.op {
                    OP_FENCE if batch.is_empty() && in_flight == 0 => {
                        // Everything before it completed: pass it.
                        pos += 1;
                        tail = pos;
                        done += 1;
                        stats.fences += 1;
                        ring.release(tail);
                        ring.done().store(done, Ordering::Release);
                    }
                    OP_FENCE => break,
                    OP_WRITE | OP_WRITE_IMM => {
                        batch.push(self.decode(pos, &cmd)?);
                        pos += 1;
                    }
                    op => return Err(bad(pos, format!("unknown op {op}"))),
                }
            }
            if !batch.is_empty() {
                let n = ep.post_writes(&batch).map_err(ProxyError::Transport)?;
                stats.batches += 1;
                if n < batch.len() {
                    // The queue is full: what it did not take stays in its slots (tail does
                    // not pass it) and is posted again after the poll below.
                    stats.queue_full += 1;
                }
                tail += n as u64;
                in_flight += n as u64;
                stats.writes += n as u64;
                ring.release(tail);
            }
            // Completions. Progress is a fence passed or a WRITE posted or completed; commands
            // the full queue refused are work waiting, not progress (below).
            let k = ep.poll(&mut comps).map_err(ProxyError::Transport)?;
            let progress = tail != start || k > 0;
            let (mut wrote, mut landed) = (false, false);
            for c in &comps[..k] {
                match &c.kind {
                    CompletionKind::Write => {
                        in_flight = in_flight.saturating_sub(1);
                        done += 1;
                        wrote = true;
                    }
                    CompletionKind::RemoteWrite { imm } => {
                        let slot = imm >> ARRIVAL_SHIFT;
                        let Some(n) = arrived.get_mut(slot as usize) else {
                            return Err(ProxyError::BadImmediate { imm: *imm, slots });
                        };
                        *n += 1;
                        stats.arrivals += 1;
                        landed = true;
                    }
                    CompletionKind::Error(e) => {
                        return Err(ProxyError::Completion {
                            pos: c.ctx,
                            error: e.clone(),
                        })
                    }
                    // Not the proxy's: SENDs and receives of whoever shares the endpoint
                    // are theirs to count.
                    CompletionKind::Send | CompletionKind::Recv { .. } => {}
                }
            }
            if wrote {
                ring.done().store(done, Ordering::Release);
            }
            if landed {
                // The bytes must be visible to GPU work before a waiter is told they landed
                // (host memory: the backend returns at once).
                for &i in &self.landing {
                    ep.make_gpu_visible(&self.regions[i])
                        .map_err(ProxyError::Transport)?;
                }
                for c in &comps[..k] {
                    if let CompletionKind::RemoteWrite { imm } = c.kind {
                        let slot = imm >> ARRIVAL_SHIFT;
                        if let Some(a) = ring.arrivals(slot) {
                            a.store(arrived[slot as usize], Ordering::Release);
                        }
                    }
                }
            }
            if progress {
                idle = 0;
                continue;
            }
            // Asked to stop, the grace period runs whether or not commands wait: a peer that
            // stopped polling keeps the queue full for ever.
            if stop.load(Ordering::Relaxed) {
                if in_flight == 0 {
                    return Ok(stats);
                }
                let since = *stopping.get_or_insert_with(Instant::now);
                if since.elapsed() > self.stop_grace {
                    return Err(ProxyError::StoppedInFlight {
                        in_flight,
                        waited: self.stop_grace,
                    });
                }
            }
            if !batch.is_empty() {
                // Commands wait for room in a full queue: spin for the next completion, never
                // yield the core.
                std::hint::spin_loop();
                continue;
            }
            idle += 1;
            if idle < IDLE_TURNS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    #[inline]
    fn decode(
        &self,
        pos: u64,
        cmd: &ring::Command,
    ) -> Result<WriteOp<'_, T::Mr, T::RemoteKey>, ProxyError> {
        let peer = self
            .peers
            .get(cmd.peer as usize)
            .ok_or_else(|| bad(pos, format!("unknown peer {}", cmd.peer)))?;
        let (lr, loff) = unpack(cmd.local);
        let (rr, roff) = unpack(cmd.remote);
        let mr = self
            .regions
            .get(lr as usize)
            .ok_or_else(|| bad(pos, format!("unknown local region {lr}")))?;
        let local = LocalSlice::new(mr, loff as usize, cmd.len as usize)
            .map_err(|e| bad(pos, e.to_string()))?;
        let remote = peer
            .regions
            .get(rr as usize)
            .ok_or_else(|| bad(pos, format!("unknown region {rr} of peer {}", cmd.peer)))?
            .slice(roff, cmd.len as u64)
            .map_err(|e| bad(pos, e.to_string()))?;
        Ok(WriteOp {
            peer: peer.id,
            local,
            remote,
            imm: (cmd.op == OP_WRITE_IMM).then_some(cmd.imm),
            ctx: pos,
        })
    }
}

#[cold]
fn bad(pos: u64, why: String) -> ProxyError {
    ProxyError::BadCommand { pos, why }
}

/// The ring alone: consume commands and count them done without posting anything (the
/// proxy's own cost, for "commands per second of the ring"). Runs until `stop`; returns the
/// commands consumed. Stores [`ERR_STOPPED`] before it returns.
pub fn drain_to_nothing(ring: Ring<'_>, stop: &AtomicBool, max_batch: usize) -> u64 {
    let mut tail = ring.tail().load(Ordering::Acquire);
    let start = tail;
    let mut idle = 0u32;
    loop {
        let mut pos = tail;
        while pos - tail < max_batch as u64 && ring.peek(pos).is_some() {
            pos += 1;
        }
        if pos != tail {
            tail = pos;
            ring.release(tail);
            ring.done().store(tail, Ordering::Release);
            idle = 0;
            continue;
        }
        if stop.load(Ordering::Relaxed) {
            ring.set_error(ERR_STOPPED);
            return tail - start;
        }
        idle += 1;
        if idle < IDLE_TURNS_BEFORE_YIELD {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
