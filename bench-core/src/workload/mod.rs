//! The workloads, generic over `Transport`: no backend is named below this module.
//!
//! The side that posts (the server for `write`, `rate` and `send`) runs [`run_active`]: NICs
//! grouped into threads (one, or one per GPU), each thread driving its NICs through
//! [`NicWork`] with the ladder's knobs applied. The hot loop allocates nothing, takes no lock
//! and makes no syscall of its own; liveness and the idle timeout are checked every
//! [`CHECK_EVERY`] turns.

pub mod delivery;
pub mod gpu_write;
#[cfg(feature = "cuda")]
pub mod gpu_write_cuda;
pub mod lat;
pub mod ranks;
pub mod send;
#[cfg(test)]
pub(crate) mod strict;
pub mod write;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use transport_core::{Completion, CompletionKind};

use self::delivery::{Clock, Delivered};
use crate::config::{Knobs, Threads};
use crate::ctrl::Liveness;
use crate::error::{Error, Result};
use crate::pin;
use crate::proto::NicStats;
use crate::topo_glue::Hints;

/// Loop turns between liveness and timeout checks.
pub const CHECK_EVERY: u32 = 256;
/// Completions taken per poll call.
pub const POLL_BATCH: usize = 64;

/// What one `poll` on one NIC yielded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Polled {
    /// Completion slots filled (a full buffer means there may be more).
    pub slots: usize,
    /// Operations of this workload that completed.
    pub ops: u64,
    /// Bytes those operations moved.
    pub bytes: u64,
}

/// One NIC's share of an active workload.
pub trait NicWork {
    /// Begin a phase of `iters` iterations (warm-up, then the timed one).
    fn start_phase(&mut self, iters: u64);
    /// Hand up to `max` operations to the NIC; returns how many it took (fewer: the queue is
    /// full, or there is nothing more to post now).
    fn post(&mut self, max: usize) -> Result<usize>;
    /// Poll the NIC's completions once.
    fn poll(&mut self, buf: &mut [Completion]) -> Result<Polled>;
    /// Whether this phase's work on this NIC is complete: its operations completed and their
    /// bytes are in place at the target ([`NicWork::delivered`]).
    fn finished(&self) -> bool;
    /// When this phase's bytes were known to be in place at the target (see [`delivery`]):
    /// `None` before, and for a NIC without work in the phase.
    fn delivered(&self) -> Option<Delivered>;
    /// Index of the NIC in the session.
    fn nic(&self) -> usize;
    /// What this NIC did in the current phase, timed on `clock` (the phase's start) to
    /// [`NicWork::delivered`].
    fn stats(&self, clock: Clock) -> NicStats;
}

/// The error for a completion a loop did not expect: an error completion becomes
/// [`Error::Transport`] carrying the provider's text; anything else is a protocol error.
/// Error path only (it allocates).
#[cold]
#[inline(never)]
pub fn unexpected(c: &Completion, what: &str) -> Error {
    match &c.kind {
        CompletionKind::Error(e) => Error::Transport {
            what: what.to_string(),
            source: transport_core::Error::Completion(e.clone()),
        },
        other => Error::Protocol(format!("unexpected completion {other:?} during {what}")),
    }
}

/// Counters shared by every thread: the ladder's stage before "per-thread state".
#[derive(Debug, Default)]
pub struct Shared {
    pub posted: AtomicU64,
    pub completed: AtomicU64,
    pub bytes: AtomicU64,
}

/// Per-thread counters (`--sharded`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Local {
    pub posted: u64,
    pub completed: u64,
    pub bytes: u64,
}

/// Everything threads of one active run share: liveness, an abort flag, a start barrier.
pub struct RunCtx<'a> {
    pub live: &'a Liveness,
    pub idle: Duration,
    abort: AtomicBool,
    arrived: AtomicUsize,
    threads: usize,
}

impl<'a> RunCtx<'a> {
    pub fn new(live: &'a Liveness, idle: Duration, threads: usize) -> Self {
        RunCtx {
            live,
            idle,
            abort: AtomicBool::new(false),
            arrived: AtomicUsize::new(0),
            threads,
        }
    }

    fn check(&self) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::Protocol("stopped: another thread failed".into()));
        }
        if self.live.gone() {
            return Err(Error::PeerGone(
                "the control connection closed during the transfer".into(),
            ));
        }
        Ok(())
    }

    /// Wait until every thread arrived; fails when one of them failed or the peer left.
    fn barrier(&self) -> Result<()> {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let start = Instant::now();
        while self.arrived.load(Ordering::Acquire) < self.threads {
            self.check()?;
            if start.elapsed() > self.idle {
                return Err(Error::Timeout {
                    what: "the other threads to finish warming up".into(),
                    after: self.idle,
                });
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// Run one phase on one thread's NICs with `knobs`.
pub fn drive<W: NicWork>(
    nics: &mut [W],
    knobs: &Knobs,
    iters: u64,
    ctx: &RunCtx<'_>,
    shared: &Shared,
    shared_total: u64,
    buf: &mut [Completion],
) -> Result<Local> {
    for n in nics.iter_mut() {
        n.start_phase(iters);
    }
    let batch = knobs.batch.max(1) as usize;
    let mut local = Local::default();
    let mut turns: u32 = 0;
    let mut seen = u64::MAX;
    let mut last_progress = Instant::now();
    loop {
        let (mut posted, mut got) = (0u64, Polled::default());
        if knobs.lazy {
            // Drain every NIC's completion queue first...
            for n in nics.iter_mut() {
                loop {
                    let p = n.poll(buf)?;
                    got.ops += p.ops;
                    got.bytes += p.bytes;
                    if p.slots < buf.len() {
                        break;
                    }
                }
            }
            // ...then post the queued work until every NIC says it is full, `batch` at a
            // time per NIC in turn: no NIC waits while another one is filled to the brim
            // (on a memory-copy provider the peer copies while we post).
            loop {
                let mut more = false;
                for n in nics.iter_mut() {
                    let k = n.post(batch)?;
                    posted += k as u64;
                    more |= k == batch;
                }
                if !more {
                    break;
                }
            }
        } else {
            for n in nics.iter_mut() {
                posted += n.post(batch)? as u64;
                let p = n.poll(buf)?;
                got.ops += p.ops;
                got.bytes += p.bytes;
            }
        }
        if knobs.sharded {
            local.posted += posted;
            local.completed += got.ops;
            local.bytes += got.bytes;
        } else {
            if posted > 0 {
                shared.posted.fetch_add(posted, Ordering::Relaxed);
            }
            if got.ops > 0 {
                shared.completed.fetch_add(got.ops, Ordering::Relaxed);
                shared.bytes.fetch_add(got.bytes, Ordering::Relaxed);
            }
        }
        // A phase ends at delivery: every NIC of this thread finished, acknowledgement
        // included, and (shared counters) every thread's operations completed.
        let done = nics.iter().all(|n| n.finished())
            && (knobs.sharded || shared.completed.load(Ordering::Relaxed) >= shared_total);
        if done {
            return Ok(local);
        }
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(CHECK_EVERY) {
            ctx.check()?;
            let now_seen = if knobs.sharded {
                local.completed
            } else {
                shared.completed.load(Ordering::Relaxed)
            };
            if now_seen != seen {
                seen = now_seen;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > ctx.idle {
                return Err(Error::Timeout {
                    what: format!(
                        "completions on NIC(s) {:?} (no progress; unfinished: {:?})",
                        nics.iter().map(|n| n.nic()).collect::<Vec<_>>(),
                        nics.iter()
                            .filter(|n| !n.finished())
                            .map(|n| n.nic())
                            .collect::<Vec<_>>()
                    ),
                    after: ctx.idle,
                });
            }
        }
    }
}

/// What an active run measured.
#[derive(Debug, Default)]
pub struct ActiveOut {
    pub seconds: f64,
    pub ops: u64,
    pub bytes: u64,
    /// Per NIC, indexed by session NIC index (NICs that took no part have zeros).
    pub per_nic: Vec<NicStats>,
    pub cores: Vec<u32>,
}

/// One thread's group of NICs.
pub struct Group<P> {
    /// GPU ordinal the group serves (for pinning).
    pub gpu: usize,
    pub parts: Vec<P>,
}

/// Split per-NIC parts (in session order, `npg` per GPU) into thread groups per `threads`.
pub fn group<P>(parts: Vec<P>, gpus: &[usize], npg: usize, threads: Threads) -> Vec<Group<P>> {
    match threads {
        Threads::One => vec![Group {
            gpu: gpus.first().copied().unwrap_or(0),
            parts,
        }],
        Threads::PerGpu => {
            let mut out: Vec<Group<P>> = gpus
                .iter()
                .map(|&g| Group {
                    gpu: g,
                    parts: Vec::new(),
                })
                .collect();
            for (i, p) in parts.into_iter().enumerate() {
                let g = (i / npg.max(1)).min(out.len().saturating_sub(1));
                if let Some(grp) = out.get_mut(g) {
                    grp.parts.push(p);
                }
            }
            out
        }
    }
}

/// Run a warm-up phase then a timed phase over thread groups, with `knobs`.
///
/// `build` turns one NIC's parts into its [`NicWork`] inside the thread that drives it.
/// `totals(iters)` is the number of operations every NIC together completes in a phase of
/// `iters` (the shared counters' finish line).
#[allow(clippy::too_many_arguments)]
pub fn run_active<P, W, F>(
    groups: Vec<Group<P>>,
    nics: usize,
    knobs: &Knobs,
    warm_iters: u64,
    iters: u64,
    totals: impl Fn(u64) -> u64,
    live: &Liveness,
    idle: Duration,
    hints: Option<&Hints>,
    build: F,
) -> Result<ActiveOut>
where
    P: Send,
    W: NicWork,
    F: Fn(P) -> W + Sync,
{
    let groups: Vec<Group<P>> = groups.into_iter().filter(|g| !g.parts.is_empty()).collect();
    let ctx = RunCtx::new(live, idle, groups.len());
    let (warm, timed) = (Shared::default(), Shared::default());
    let (warm_total, timed_total) = (totals(warm_iters), totals(iters));
    let ngroups = groups.len();
    // A side on GPU memory has its GPU's context current here; each thread makes its own
    // GPU's current before it posts (`buffers::enter_gpu` says why).
    let cuda = crate::buffers::thread_gpu().is_some();
    let results: Vec<Result<ThreadOut>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(gi, g)| {
                let (ctx, warm, timed, build) = (&ctx, &warm, &timed, &build);
                let core = if knobs.pin {
                    pin::core_for(hints, g.gpu, gi, ngroups)
                } else {
                    None
                };
                s.spawn(move || {
                    let r = thread_main(
                        g,
                        cuda,
                        core,
                        knobs,
                        warm_iters,
                        iters,
                        ctx,
                        warm,
                        timed,
                        (warm_total, timed_total),
                        build,
                    );
                    if r.is_err() {
                        ctx.abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Protocol("a worker thread panicked".into())))
            })
            .collect()
    });
    let mut out = ActiveOut {
        per_nic: vec![NicStats::default(); nics],
        ..ActiveOut::default()
    };
    let mut t0: Option<Instant> = None;
    let mut t1: Option<Instant> = None;
    let mut first_err = None;
    for r in results {
        match r {
            Ok(t) => {
                t0 = Some(t0.map_or(t.t0, |x| x.min(t.t0)));
                t1 = Some(t1.map_or(t.t1, |x| x.max(t.t1)));
                for (i, st) in t.per_nic {
                    if let Some(slot) = out.per_nic.get_mut(i) {
                        *slot = st;
                    }
                }
                out.ops += t.local.completed;
                out.bytes += t.local.bytes;
                out.cores.extend(t.core.map(|c| c as u32));
            }
            // The first real error, not "another thread failed".
            Err(e) => match (&first_err, &e) {
                (None, _) => first_err = Some(e),
                (Some(Error::Protocol(m)), _) if m.starts_with("stopped:") => first_err = Some(e),
                _ => {}
            },
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if !knobs.sharded {
        out.ops = timed.completed.load(Ordering::Relaxed);
        out.bytes = timed.bytes.load(Ordering::Relaxed);
    }
    if let (Some(a), Some(b)) = (t0, t1) {
        out.seconds = b.duration_since(a).as_secs_f64();
    }
    Ok(out)
}

struct ThreadOut {
    t0: Instant,
    t1: Instant,
    local: Local,
    per_nic: Vec<(usize, NicStats)>,
    core: Option<usize>,
}

#[allow(clippy::too_many_arguments)]
fn thread_main<P, W: NicWork>(
    g: Group<P>,
    cuda: bool,
    core: Option<usize>,
    knobs: &Knobs,
    warm_iters: u64,
    iters: u64,
    ctx: &RunCtx<'_>,
    warm: &Shared,
    timed: &Shared,
    (warm_total, timed_total): (u64, u64),
    build: &(impl Fn(P) -> W + Sync),
) -> Result<ThreadOut> {
    let core = core.filter(|&c| pin::pin_current(c));
    if cuda {
        crate::buffers::enter_gpu(g.gpu)?;
    }
    let mut nics: Vec<W> = g.parts.into_iter().map(build).collect();
    let mut buf = vec![Completion::default(); POLL_BATCH];
    if warm_iters > 0 {
        drive(
            &mut nics, knobs, warm_iters, ctx, warm, warm_total, &mut buf,
        )?;
    }
    ctx.barrier()?;
    let clock = Clock::start();
    let t0 = clock.started();
    let local = drive(&mut nics, knobs, iters, ctx, timed, timed_total, &mut buf)?;
    // The thread's clock stops at its NICs' last delivery (no NIC with work: at once).
    let t1 = nics
        .iter()
        .filter_map(|n| n.delivered())
        .max()
        .map_or(t0, Delivered::at);
    let per_nic = nics.iter().map(|n| (n.nic(), n.stats(clock))).collect();
    Ok(ThreadOut {
        t0,
        t1,
        local,
        per_nic,
        core,
    })
}
