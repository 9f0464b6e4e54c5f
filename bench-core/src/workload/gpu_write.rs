//! `--workload gpu-write`: WRITEs issued through a proxy ring (`transport-proxy`) beside the
//! same WRITEs posted by the host, in one run, on the same endpoints, between a client and a
//! server (two processes, or both in one: loopback runs the same code over the same protocol).
//!
//! A [`Producer`] writes commands into the client's ring (a CPU thread, or GPU threads); the
//! client's proxy posts them; the server's proxy counts their immediates into its ring's
//! `arrivals` and the server's echo (a CPU thread) answers through its own ring; the client's
//! proxy counts the answers into the client ring's `arrivals`, which the producer waits on.
//! The host-initiated figure beside each one posts the same WRITEs from a client thread, and
//! a server thread answers them the same way. Both halves of every region are fixed: the
//! client WRITEs from its lower half into the server's lower half, the server answers from its
//! upper half into the client's upper half.
//!
//! Figures: commands per second of the ring alone (the client's proxy consuming into nothing);
//! latency as half the round trip of a ping-pong (perftest's definition: WRITE+imm, answered
//! by a WRITE+imm of the same size once its immediate is counted; the mean over the timed
//! rounds, as the GPU's clock gives a total); bandwidth to delivery (N WRITEs+imm, the clock
//! stops at the server's one answer after it counted the N-th: it includes one return). The
//! server compares every landed byte with the client's pattern after each step and says how
//! many it checked; the client checks the answers' bytes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, LocalSlice, MemoryRegion, PeerId, Post, RemoteRegion, Transport,
    WriteOp,
};
use transport_proxy::{
    drain_to_nothing, immediate, pack, Command, Proxy, ProxyPeer, Ring, RingLayout, RingMemory,
};

use crate::buffers::fill_at;
use crate::ctrl::{Ctrl, Liveness};
use crate::error::{Error, Result, TransportContext};
use crate::proto::{GpuStep, GpuStepDone, GpuStepKind, Msg};
use crate::topo_glue::Hints;

/// Who writes commands into the ring: the seam a GPU kernel plugs into.
pub trait Producer: Sync {
    /// For reports: `cpu`, `cuda`, ...
    fn name(&self) -> &'static str;
    /// Write `cmds` into `ring` (in any order; each with its ready word last, as the ring's
    /// protocol says) and return once all are in. The caller waits for their effect on the
    /// ring's counters.
    fn issue(&self, ring: Ring<'_>, cmds: &[Command]) -> Result<()>;
    /// Latency rounds: `rounds` times, publish `cmd` into `ring` (its immediate's low 16 bits
    /// replaced by `(first + round) as u16`) and wait until `ring`'s `arrivals[slot]` reaches
    /// `base + round + 1` (the peer's answer, counted by this ring's proxy); the total time.
    /// The producer is the ring's only one while this runs. It fails when the ring's error
    /// word is set (the proxy stopped, or the caller's watcher saw the peer go).
    #[allow(clippy::too_many_arguments)]
    fn pingpong(
        &self,
        ring: Ring<'_>,
        slot: u32,
        cmd: &Command,
        first: u64,
        base: u64,
        rounds: u64,
        idle: Duration,
    ) -> Result<Duration>;
    /// Memory for a ring this producer writes or waits on, laid out ([`Ring::init`]). The
    /// default is host memory ([`RingMemory`]); a GPU producer returns memory its kernels can
    /// reach (`cuMemHostAlloc` with `DEVICEMAP`, or this memory after `cuMemHostRegister`).
    fn ring_memory(&self, layout: RingLayout) -> Result<Box<dyn RingHome>> {
        Ok(Box::new(RingMemory::new(layout)))
    }
}

/// Where a ring lives: it stays laid out and valid while the box lives.
pub trait RingHome: Send + Sync {
    fn ring(&self) -> Ring<'_>;
}

impl RingHome for RingMemory {
    fn ring(&self) -> Ring<'_> {
        RingMemory::ring(self)
    }
}

/// A CPU thread writing the commands ([`Ring::push`]).
pub struct CpuProducer;

impl Producer for CpuProducer {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn issue(&self, ring: Ring<'_>, cmds: &[Command]) -> Result<()> {
        for c in cmds {
            ring.push(c).map_err(ring_err)?;
        }
        Ok(())
    }
    fn pingpong(
        &self,
        ring: Ring<'_>,
        slot: u32,
        cmd: &Command,
        first: u64,
        base: u64,
        rounds: u64,
        idle: Duration,
    ) -> Result<Duration> {
        let arrivals = ring
            .arrivals(slot)
            .ok_or_else(|| Error::Protocol(format!("gpu-write: the ring has no slot {slot}")))?;
        let t0 = Instant::now();
        for r in 0..rounds {
            let mut c = *cmd;
            c.imm = (cmd.imm & !0xffff) | ((first + r) & 0xffff) as u32;
            ring.push(&c).map_err(ring_err)?;
            spin_until(
                &ring,
                arrivals,
                base + r + 1,
                idle,
                "the answer to a proxied WRITE",
            )?;
        }
        Ok(t0.elapsed())
    }
}

/// Spin until `c >= target`, failing when `ring`'s error word is set or after `idle` without
/// progress (neither the counter nor the ring's `done` moved: a bandwidth step's millions of
/// WRITEs may take longer than `idle` in all).
fn spin_until(
    ring: &Ring<'_>,
    c: &AtomicU64,
    target: u64,
    idle: Duration,
    what: &str,
) -> Result<()> {
    let mut t = Instant::now();
    let mut spins = 0u32;
    // Progress: the counter, or the ring's local completions (a sender's WRITEs going out).
    let moved = || c.load(Ordering::Acquire) + ring.done().load(Ordering::Acquire);
    let mut last = moved();
    while c.load(Ordering::Acquire) < target {
        spins = spins.wrapping_add(1);
        if spins & 63 == 0 {
            let now = moved();
            if now != last {
                (last, t) = (now, Instant::now());
            }
            let e = ring.error();
            if e != 0 && c.load(Ordering::Acquire) < target {
                return Err(Error::Protocol(format!(
                    "gpu-write: waiting for {what}: the proxy stopped ({})",
                    transport_proxy::ring::error_name(e)
                )));
            }
            if t.elapsed() > idle {
                return Err(timeout(what, idle));
            }
        }
        // Several spinning threads (two proxies, a producer, an echo) on as few as two cores:
        // give the core away after a while.
        if spins > 4096 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

fn ring_err(e: transport_proxy::RingError) -> Error {
    Error::Protocol(e.to_string())
}

/// The most WRITEs one bandwidth size takes (small sizes: `bw_bytes / size` would be
/// tens of millions). 256 Ki: about 0.1 s of 8 B WRITEs over shm in host memory, and 2-4 s in
/// GPU memory, where shm's host copies cost 7-15 us a WRITE (H200: 1 Mi of them took 8 s from
/// the host and 14-35 s through the proxy, past the run's bound).
pub const MAX_BW_WRITES: u64 = 1 << 18;

/// What to measure.
#[derive(Clone, Debug)]
pub struct GpuWriteCfg {
    /// Latency sizes.
    pub lat_sizes: Vec<usize>,
    /// Timed round trips per latency size.
    pub lat_iters: u64,
    /// Untimed round trips before them.
    pub lat_warm: u64,
    /// Bandwidth sizes.
    pub bw_sizes: Vec<usize>,
    /// Bytes per bandwidth size (the WRITEs cycle over the region's half).
    pub bw_bytes: u64,
    // (Each size's WRITE count is also capped at [`MAX_BW_WRITES`].)
    /// Commands for the ring-alone rate.
    pub ring_cmds: u64,
    /// Ring capacity (commands).
    pub capacity: u32,
    /// Host-initiated WRITEs per `post_writes`.
    pub batch: usize,
    pub verify: bool,
    pub seed: u64,
    pub idle: Duration,
    /// Pin the proxy threads (and the host path's) near the GPU where the topology says.
    pub pin: bool,
    /// Say on stderr when each step starts and ends (`-v`): where a slow or stuck run is.
    pub verbose: bool,
}

impl Default for GpuWriteCfg {
    fn default() -> Self {
        Self {
            lat_sizes: vec![8, 64, 512, 4096, 65536],
            lat_iters: 1000,
            lat_warm: 100,
            bw_sizes: vec![4096, 65536, 1 << 20],
            bw_bytes: 1000 << 18,
            ring_cmds: 2_000_000,
            capacity: 4096,
            batch: 16,
            verify: true,
            seed: 1,
            idle: Duration::from_secs(30),
            pin: false,
            verbose: false,
        }
    }
}

/// Bytes of the server's answer to a bandwidth step.
const ANSWER: usize = 8;
/// The pattern's "GPU" of the server's answers (the client's WRITEs use 0).
const SERVER_SIDE: u64 = 1;

impl GpuWriteCfg {
    /// Bytes of each half of a side's region: at least 16 MiB and the largest size.
    pub fn half(&self) -> usize {
        let biggest = self
            .bw_sizes
            .iter()
            .chain(&self.lat_sizes)
            .copied()
            .max()
            .unwrap_or(4096);
        (16 << 20).max(biggest)
    }

    /// Bytes each side's data region needs: two halves.
    pub fn region_len(&self) -> usize {
        2 * self.half()
    }
}

/// One row: the proxy path's figure beside the host's from the same run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    pub size: usize,
    pub proxy: f64,
    pub host: f64,
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GpuWriteReport {
    pub producer: &'static str,
    /// Commands per second through the ring alone (millions).
    pub ring_mcmds: f64,
    /// Latency, half the round trip of a ping-pong, microseconds (mean of `lat_rounds`).
    pub lat_us: Vec<Row>,
    /// Timed round trips per latency row.
    pub lat_rounds: u64,
    /// Bandwidth, Gbit/s, to the server's answer after its last counted immediate.
    pub bw_gbps: Vec<Row>,
    pub verified: bool,
    /// Landed bytes the server compared with the client's pattern, over every step.
    pub server_checked: u64,
    /// Where the proxy threads ran, in words.
    pub pinning: String,
}

/// One of the report's tables: a title, then size, proxy, host and `last` (what compares them).
fn table(s: &mut String, title: &str, last: &str, rows: &[Row], cmp: impl Fn(&Row) -> String) {
    *s += &format!(
        "{title}\n{:>10} {:>10} {:>10} {last:>8}\n",
        "size", "proxy", "host"
    );
    for r in rows {
        *s += &format!(
            "{:>10} {:>10.2} {:>10.2} {}\n",
            crate::units::human_bytes(r.size as u64),
            r.proxy,
            r.host,
            cmp(r)
        );
    }
}

impl GpuWriteReport {
    /// The table, for people.
    pub fn render(&self) -> String {
        let mut s = format!(
            "gpu-write (producer {}): ring alone {:.2} M commands/s (the proxy consuming into nothing)\n",
            self.producer, self.ring_mcmds
        );
        table(
            &mut s,
            &format!(
                "latency, half the round trip (WRITE+imm answered by one of the same size once \
                 counted; mean of {} rounds, us):",
                self.lat_rounds
            ),
            "diff",
            &self.lat_us,
            |r| format!("{:>+8.2}", r.proxy - r.host),
        );
        table(
            &mut s,
            "bandwidth to delivery (Gbit/s; the clock stops at the server's answer to the last \
             counted immediate: it includes one return WRITE):",
            "ratio",
            &self.bw_gbps,
            |r| format!("{:>8.2}", r.proxy / r.host),
        );
        s += &format!("proxy threads: {}\n", self.pinning);
        // The same words as every other workload's output ("every byte verified").
        s += &if self.verified {
            format!(
                "every byte verified (the server checked {} landed bytes, the client every answer)\n",
                self.server_checked
            )
        } else {
            "not verified (--no-verify)\n".to_string()
        };
        s
    }
}

/// The core the proxy thread of a side whose GPU is `gpu` runs on, and the words saying so:
/// with `pin`, core `side` of those the topology places near the GPU (the client takes the
/// first, the server the second: both on one host, as over shm, their busy-polling proxies
/// must not share a core); else unpinned, and why.
pub fn proxy_core(
    pin: bool,
    hints: Option<&Hints>,
    gpu: usize,
    side: usize,
) -> (Option<usize>, String) {
    if !pin {
        return (None, "unpinned (--pin not given)".into());
    }
    // Without GPUs a topology's entry 0 holds every core: none of them is near a GPU.
    let near = hints
        .filter(|h| gpu < h.gpus)
        .and_then(|h| h.cores.get(gpu))
        .filter(|c| !c.is_empty())
        .map(|c| &c[side % c.len()]);
    match near {
        Some(&c) => (Some(c), format!("pinned to core {c} (near GPU {gpu})")),
        None => (
            None,
            format!("unpinned (no topology says which cores are near GPU {gpu})"),
        ),
    }
}

/// Run `f` on a thread of its own pinned to `core` (where given and the OS agrees), with the
/// CUDA context this thread has (if any) current there too: the proxy posts and polls GPU
/// memory from that thread (`buffers::enter_gpu` says why it needs one).
fn on_core<'s, 'e, R: Send + 's>(
    s: &'s std::thread::Scope<'s, 'e>,
    core: Option<usize>,
    f: impl FnOnce() -> R + Send + 's,
) -> std::thread::ScopedJoinHandle<'s, R> {
    let gpu = crate::buffers::thread_gpu();
    s.spawn(move || {
        if let Some(Err(e)) = gpu.map(crate::buffers::enter_gpu) {
            eprintln!("rdma-bench: gpu-write: {e}; the proxy's GPU-memory copies may go through host memory");
        }
        if let Some(c) = core {
            if !crate::pin::pin_current(c) {
                eprintln!(
                    "rdma-bench: gpu-write: the OS refused to pin a proxy thread to core {c}"
                );
            }
        }
        f()
    })
}

/// The ring alone: `cfg.ring_cmds` commands from `producer` into a ring whose proxy posts
/// nothing; millions of commands per second to the last one consumed.
pub fn ring_rate(producer: &dyn Producer, cfg: &GpuWriteCfg, core: Option<usize>) -> Result<f64> {
    let mem = producer.ring_memory(RingLayout::new(cfg.capacity, 1).map_err(ring_err)?)?;
    let ring = mem.ring();
    let chunk: Vec<Command> = (0..4096u64)
        .map(|i| Command::write(0, pack(0, i * 64), pack(0, i * 64), 64, Some(1)))
        .collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = on_core(s, core, || drain_to_nothing(ring, &stop, 64));
        let t0 = Instant::now();
        let mut left = cfg.ring_cmds;
        let mut out = Ok(());
        while left > 0 && out.is_ok() {
            let k = left.min(chunk.len() as u64) as usize;
            out = producer.issue(ring, &chunk[..k]);
            left -= k as u64;
        }
        let waited = out.and_then(|()| ring.wait_done(cfg.ring_cmds, cfg.idle).map_err(ring_err));
        let secs = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let n = h
            .join()
            .map_err(|_| Error::Protocol("the drain thread panicked".into()))?;
        waited?;
        if n != cfg.ring_cmds {
            return Err(Error::Protocol(format!(
                "the ring consumed {n} commands of {}",
                cfg.ring_cmds
            )));
        }
        Ok(cfg.ring_cmds as f64 / secs / 1e6)
    })
}

/// One side of a gpu-write session: its endpoint, the peer's id on it, and the peer's region
/// as imported there. The side's own region travels separately (a proxy owns it while it runs).
pub struct End<'a, T: Transport> {
    pub ep: &'a mut T,
    pub peer: PeerId,
    pub remote: RemoteRegion<T::RemoteKey>,
    /// The proxy thread's core (and the host path's thread's).
    pub core: Option<usize>,
    /// The control connection's liveness: a peer that left ends every wait.
    pub live: Liveness,
    pub idle: Duration,
}

/// Where WRITE `i` of `size` bytes goes in a half of `half` bytes: the same offset at both ends.
fn offset(i: u64, size: usize, half: usize) -> u64 {
    let slots = (half / size).max(1) as u64;
    (i % slots) * size as u64
}

fn touched(size: usize, n: u64, half: usize) -> usize {
    ((size as u64).saturating_mul(n)).min((half / size * size) as u64) as usize
}

/// The landing range of a step at its receiver: (offset in the region, bytes), for the
/// server (the client's WRITEs) or the client (the answers).
fn landing(step: &GpuStep, server: bool) -> (usize, usize) {
    let (size, half) = (step.size as usize, step.half as usize);
    let lat = matches!(step.kind, GpuStepKind::HostLat | GpuStepKind::ProxyLat);
    match (server, lat) {
        (true, true) => (0, size),
        (true, false) => (0, touched(size, step.n, half)),
        (false, true) => (half, size),
        (false, false) => (half, ANSWER),
    }
}

fn zero<M: MemoryRegion>(d: &mut M, at: usize, len: usize) -> Result<()> {
    d.memory_mut()
        .write_at(at, &vec![0u8; len])
        .ctx(|| "clearing the landing region")
}

/// Compare `len` bytes at `at` of `d` with side `side`'s pattern; the error names the WRITE
/// (of `size` bytes) and the byte.
fn verify<M: MemoryRegion>(
    d: &M,
    seed: u64,
    side: u64,
    at: usize,
    len: usize,
    size: usize,
    what: &str,
) -> Result<u64> {
    let mut got = vec![0u8; len];
    d.memory()
        .read_at(at, &mut got)
        .ctx(|| "reading the landing region back")?;
    let mut want = vec![0u8; len];
    fill_at(seed, side, at as u64, &mut want);
    if got != want {
        let b = got.iter().zip(&want).position(|(x, y)| x != y).unwrap_or(0);
        return Err(Error::Verify(format!(
            "gpu-write {what}, {size}-byte WRITEs: byte {b} of WRITE {} (offset {} of the \
             landing range) is {:#04x}, expected {:#04x}",
            b / size.max(1),
            b % size.max(1),
            got[b],
            want[b]
        )));
    }
    Ok(len as u64)
}

fn timeout(what: &str, idle: Duration) -> Error {
    Error::Timeout {
        what: what.into(),
        after: idle,
    }
}

fn gone() -> Error {
    Error::PeerGone("the peer left during a gpu-write step".into())
}

/// Poll `ep` once: local completions into `done`, immediates into `imms`.
fn poll_once<T: Transport>(
    ep: &mut T,
    buf: &mut [Completion],
    done: &mut u64,
    imms: &mut u64,
    who: &str,
) -> Result<usize> {
    let k = ep.poll(buf).ctx(|| format!("polling the {who}"))?;
    for c in &buf[..k] {
        match &c.kind {
            CompletionKind::Write => *done += 1,
            CompletionKind::RemoteWrite { .. } => *imms += 1,
            _ => return Err(super::unexpected(c, &format!("gpu-write ({who})"))),
        }
    }
    Ok(k)
}

/// Waits of the host path: a turn counter that checks the clock and the peer now and then.
struct Watch {
    t: Instant,
    idle: Duration,
    turns: u32,
}

impl Watch {
    fn new(idle: Duration) -> Self {
        Self {
            t: Instant::now(),
            idle,
            turns: 0,
        }
    }
    fn reset(&mut self) {
        self.t = Instant::now();
    }
    fn check(&mut self, live: &Liveness, what: &str) -> Result<()> {
        self.turns = self.turns.wrapping_add(1);
        if self.turns & 255 == 0 {
            if live.gone() {
                return Err(gone());
            }
            if self.t.elapsed() > self.idle {
                return Err(timeout(what, self.idle));
            }
        }
        Ok(())
    }
}

fn write_op<'m, T: Transport>(
    e: &End<'_, T>,
    src: &'m T::Mr,
    local: u64,
    remote: u64,
    size: usize,
    imm: u32,
) -> Result<WriteOp<'m, T::Mr, T::RemoteKey>> {
    Ok(WriteOp {
        peer: e.peer,
        local: LocalSlice::new(src, local as usize, size).ctx(|| "a local slice")?,
        remote: e
            .remote
            .slice(remote, size as u64)
            .ctx(|| "a slice of the peer's region")?,
        imm: Some(imm),
        ctx: 0,
    })
}

/// Post one WRITE, polling while the queue is full.
fn post_one<T: Transport>(
    ep: &mut T,
    w: &WriteOp<'_, T::Mr, T::RemoteKey>,
    buf: &mut [Completion],
    done: &mut u64,
    imms: &mut u64,
    who: &str,
) -> Result<()> {
    while ep
        .post_write(w.peer, w.local, w.remote, w.imm, w.ctx)
        .ctx(|| "posting a WRITE")?
        == Post::QueueFull
    {
        poll_once(ep, buf, done, imms, who)?;
    }
    Ok(())
}

/// The client's host path of a step: latency (total time of the timed rounds) or bandwidth
/// (the time to the answer).
fn client_host<T: Transport>(
    e: &mut End<'_, T>,
    src: &T::Mr,
    step: &GpuStep,
    batch: usize,
) -> Result<Duration> {
    let (size, half) = (step.size as usize, step.half as usize);
    let mut buf = vec![Completion::default(); 64];
    let (mut done, mut imms) = (0u64, 0u64);
    let mut w = Watch::new(e.idle);
    let live = e.live.clone();
    let posted;
    let elapsed;
    if step.kind == GpuStepKind::HostLat {
        let op = write_op(e, src, 0, 0, size, 0)?;
        let total = step.warm + step.n;
        let mut t0 = Instant::now();
        for r in 0..total {
            if r == step.warm {
                t0 = Instant::now();
            }
            let mut o = op;
            o.imm = Some(immediate(0, r as u16));
            post_one(e.ep, &o, &mut buf, &mut done, &mut imms, "client")?;
            w.reset();
            while imms < r + 1 {
                poll_once(e.ep, &mut buf, &mut done, &mut imms, "client")?;
                w.check(&live, "the server's answer to a host-initiated WRITE")?;
            }
        }
        elapsed = t0.elapsed();
        posted = total;
    } else {
        let n = step.n;
        let mut ops = Vec::with_capacity(batch);
        let mut next = 0u64;
        let t0 = Instant::now();
        while imms < 1 {
            if next < n {
                ops.clear();
                for i in next..(next + batch as u64).min(n) {
                    let off = offset(i, size, half);
                    ops.push(write_op(e, src, off, off, size, immediate(0, i as u16))?);
                }
                next += e.ep.post_writes(&ops).ctx(|| "posting WRITEs")? as u64;
                w.reset();
            }
            poll_once(e.ep, &mut buf, &mut done, &mut imms, "client")?;
            w.check(&live, "the server's answer to host-initiated WRITEs")?;
        }
        elapsed = t0.elapsed();
        if next < n {
            return Err(Error::Protocol(format!(
                "gpu-write: the server answered after {next} of {n} WRITEs were posted"
            )));
        }
        posted = n;
    }
    // Every local completion too, so that the next step starts with an empty queue.
    w.reset();
    while done < posted {
        poll_once(e.ep, &mut buf, &mut done, &mut imms, "client")?;
        w.check(&live, "host-initiated WRITEs' local completions")?;
    }
    Ok(elapsed)
}

/// The server's host path: answer every WRITE+imm (latency) or the last one (bandwidth).
fn server_host<T: Transport>(e: &mut End<'_, T>, src: &T::Mr, step: &GpuStep) -> Result<u64> {
    let (size, half) = (step.size as usize, step.half as usize);
    let lat = step.kind == GpuStepKind::HostLat;
    let mut buf = vec![Completion::default(); 64];
    let (mut done, mut imms) = (0u64, 0u64);
    let mut w = Watch::new(e.idle);
    let live = e.live.clone();
    let (expect, answers) = if lat {
        (step.warm + step.n, step.warm + step.n)
    } else {
        (step.n, 1)
    };
    let len = if lat { size } else { ANSWER };
    let op = write_op(e, src, half as u64, half as u64, len, 0)?;
    let mut sent = 0u64;
    while sent < answers || done < answers {
        let before = imms;
        let k = poll_once(e.ep, &mut buf, &mut done, &mut imms, "server")?;
        if imms > expect {
            return Err(Error::Protocol(format!(
                "gpu-write: {imms} immediates where the client sends {expect}"
            )));
        }
        let due = if lat { imms } else { u64::from(imms == expect) };
        while sent < due {
            let mut o = op;
            o.imm = Some(immediate(0, sent as u16));
            post_one(e.ep, &o, &mut buf, &mut done, &mut imms, "server")?;
            sent += 1;
        }
        if k > 0 || imms != before {
            w.reset();
        }
        w.check(&live, "the client's host-initiated WRITEs")?;
    }
    Ok(imms)
}

/// A proxy of this side over `region`, the peer's region as its peer 0's region 0; it counts
/// arrivals into slot 0 and makes `region` visible to GPU work before it publishes them.
fn proxy_of<'r, T: Transport>(ring: Ring<'r>, e: &End<'_, T>, region: T::Mr) -> Proxy<'r, T> {
    Proxy::<T>::new(
        ring,
        vec![region],
        vec![ProxyPeer {
            id: e.peer,
            regions: vec![e.remote],
        }],
    )
    .landing(vec![0])
}

/// Run `work` beside this side's proxy on `ring` (its own thread, on `e.core`), with a
/// watcher that sets the ring's error word when the peer leaves (so a producer spinning on
/// the ring, a GPU kernel too, gives up); stop the proxy after `work`. Returns `work`'s
/// result and the region back.
fn with_proxy<T: Transport, R>(
    e: &mut End<'_, T>,
    ring: Ring<'_>,
    region: T::Mr,
    work: impl FnOnce() -> Result<R>,
) -> Result<(R, T::Mr)> {
    let p = proxy_of(ring, e, region);
    let (stop, finished) = (&AtomicBool::new(false), &AtomicBool::new(false));
    let live = e.live.clone();
    let ep = &mut *e.ep;
    std::thread::scope(|s| {
        let h = on_core(s, e.core, move || (p.run(ep, stop), p));
        let w = s.spawn(move || {
            while !finished.load(Ordering::Relaxed) {
                if live.gone() {
                    ring.set_error(transport_proxy::ring::ERR_STOPPED);
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let out = work();
        stop.store(true, Ordering::Relaxed);
        finished.store(true, Ordering::Relaxed);
        let _ = w.join();
        let (r, p) = h
            .join()
            .map_err(|_| Error::Protocol("a proxy thread panicked".into()))?;
        let v = out?;
        r.map_err(|e| Error::Protocol(e.to_string()))?;
        let region = p.into_regions().pop().expect("the proxy's one region");
        Ok((v, region))
    })
}

/// The client's proxy path of a step: the producer issues; latency through
/// [`Producer::pingpong`] on this ring's own arrivals, bandwidth to the answer's arrival.
fn client_proxy<T: Transport>(
    e: &mut End<'_, T>,
    region: T::Mr,
    step: &GpuStep,
    producer: &dyn Producer,
) -> Result<(Duration, T::Mr)> {
    let (size, half) = (step.size as usize, step.half as usize);
    let mem = producer.ring_memory(RingLayout::new(step.capacity, 1).map_err(ring_err)?)?;
    let ring = mem.ring();
    let idle = e.idle;
    let live = e.live.clone();
    with_proxy(e, ring, region, || {
        if step.kind == GpuStepKind::ProxyLat {
            let cmd = Command::write(
                0,
                pack(0, 0),
                pack(0, 0),
                size as u32,
                Some(immediate(0, 0)),
            );
            producer.pingpong(ring, 0, &cmd, 0, 0, step.warm, idle)?;
            let d = producer.pingpong(ring, 0, &cmd, step.warm, step.warm, step.n, idle)?;
            ring.wait_done(step.warm + step.n, idle).map_err(ring_err)?;
            return Ok(d);
        }
        let n = step.n;
        let t0 = Instant::now();
        let mut chunk = Vec::with_capacity(1024);
        let mut next = 0u64;
        while next < n {
            chunk.clear();
            let end = (next + 1024).min(n);
            chunk.extend((next..end).map(|i| {
                let off = offset(i, size, half);
                Command::write(
                    0,
                    pack(0, off),
                    pack(0, off),
                    size as u32,
                    Some(immediate(0, i as u16)),
                )
            }));
            producer.issue(ring, &chunk)?;
            next = end;
            if live.gone() {
                return Err(gone());
            }
        }
        let arrivals = ring.arrivals(0).expect("slot 0");
        spin_until(
            &ring,
            arrivals,
            1,
            idle,
            "the server's answer to proxied WRITEs",
        )?;
        let d = t0.elapsed();
        ring.wait_done(n, idle).map_err(ring_err)?;
        Ok(d)
    })
}

/// The server's proxy path: its echo (this thread) answers each arrival (latency) or the
/// last (bandwidth) through its ring.
fn server_proxy<T: Transport>(
    e: &mut End<'_, T>,
    region: T::Mr,
    step: &GpuStep,
) -> Result<(u64, T::Mr)> {
    let (size, half) = (step.size as usize, step.half as usize);
    let lat = step.kind == GpuStepKind::ProxyLat;
    let mem = RingMemory::new(RingLayout::new(step.capacity, 1).map_err(ring_err)?);
    let ring = mem.ring();
    let idle = e.idle;
    let (expect, answers) = if lat {
        (step.warm + step.n, step.warm + step.n)
    } else {
        (step.n, 1)
    };
    let len = if lat { size } else { ANSWER };
    with_proxy(e, ring, region, || {
        let arrivals = ring.arrivals(0).expect("slot 0");
        for k in 0..answers {
            let target = if lat { k + 1 } else { expect };
            spin_until(&ring, arrivals, target, idle, "the client's proxied WRITEs")?;
            let h = half as u64;
            let c = Command::write(
                0,
                pack(0, h),
                pack(0, h),
                len as u32,
                Some(immediate(0, k as u16)),
            );
            ring.push(&c).map_err(ring_err)?;
        }
        ring.wait_done(answers, idle).map_err(ring_err)?;
        let got = arrivals.load(Ordering::Acquire);
        if got != expect {
            return Err(Error::Protocol(format!(
                "gpu-write: {got} immediates where the client sends {expect}"
            )));
        }
        Ok(got)
    })
}

/// The server's part of one step: clear the landing range, fill the answers' source, tell the
/// client it is ready (`ready`), answer, then compare every landed byte with the client's
/// pattern. Returns what to report and the region back.
pub fn serve_step<T: Transport>(
    e: &mut End<'_, T>,
    mut region: T::Mr,
    step: &GpuStep,
    ready: impl FnOnce() -> Result<()>,
) -> Result<(GpuStepDone, T::Mr)> {
    let (size, half) = (step.size as usize, step.half as usize);
    check_halves(region.len(), e.remote.len as usize, half, size)?;
    let (at, len) = landing(step, true);
    if step.verify {
        zero(&mut region, at, len)?;
    }
    let mut src = vec![0u8; size.max(ANSWER)];
    fill_at(step.seed, SERVER_SIDE, half as u64, &mut src);
    region
        .memory_mut()
        .write_at(half, &src)
        .ctx(|| "filling the answers' source")?;
    ready()?;
    let (arrivals, region) = match step.kind {
        GpuStepKind::HostLat | GpuStepKind::HostBw => {
            let core = e.core;
            let e2 = &mut *e;
            let (r, region) = std::thread::scope(|s| {
                on_core(s, core, move || (server_host(e2, &region, step), region)).join()
            })
            .map_err(|_| Error::Protocol("the host path's thread panicked".into()))?;
            (r?, region)
        }
        GpuStepKind::ProxyLat | GpuStepKind::ProxyBw => server_proxy(e, region, step)?,
    };
    let what = step_name(step.kind);
    let checked = if step.verify {
        verify(&region, step.seed, 0, at, len, size, what)?
    } else {
        0
    };
    Ok((
        GpuStepDone {
            id: step.id,
            arrivals,
            checked,
            core: e.core.map(|c| c as u32),
        },
        region,
    ))
}

fn step_name(k: GpuStepKind) -> &'static str {
    match k {
        GpuStepKind::HostLat => "host-initiated latency",
        GpuStepKind::ProxyLat => "proxy latency",
        GpuStepKind::HostBw => "host-initiated bandwidth",
        GpuStepKind::ProxyBw => "proxy bandwidth",
    }
}

fn check_halves(own: usize, peer: usize, half: usize, size: usize) -> Result<()> {
    let need = 2 * half;
    if own < need || peer < need || size > half || size == 0 {
        return Err(Error::Protocol(format!(
            "gpu-write: {size}-byte WRITEs in halves of {half} bytes need regions of {need} \
             bytes; this side has {own}, the peer {peer}"
        )));
    }
    Ok(())
}

/// The client: the ring alone, then per size the host-initiated step and the proxy's, each
/// announced to the server over `ctrl` and answered by it. Returns the report and the region.
pub fn client<T: Transport>(
    e: &mut End<'_, T>,
    mut region: T::Mr,
    producer: &dyn Producer,
    cfg: &GpuWriteCfg,
    ctrl: &mut Ctrl,
    pinning: &str,
) -> Result<(GpuWriteReport, T::Mr)> {
    let half = cfg.half();
    let biggest = cfg
        .bw_sizes
        .iter()
        .chain(&cfg.lat_sizes)
        .copied()
        .max()
        .unwrap_or(8);
    check_halves(region.len(), e.remote.len as usize, half, biggest)?;
    // The source pattern, once: every WRITE copies a slice of it to the same offset.
    let mut pat = vec![0u8; half];
    fill_at(cfg.seed, 0, 0, &mut pat);
    region
        .memory_mut()
        .write_at(0, &pat)
        .ctx(|| "filling the source region")?;
    drop(pat);
    let ring_mcmds = ring_rate(producer, cfg, e.core)?;
    if cfg.verbose {
        eprintln!("rdma-bench: gpu-write: ring alone {ring_mcmds:.2} M commands/s");
    }
    let mut steps = Vec::new();
    for &size in &cfg.lat_sizes {
        for kind in [GpuStepKind::HostLat, GpuStepKind::ProxyLat] {
            steps.push((kind, size, cfg.lat_iters.max(1)));
        }
    }
    for &size in &cfg.bw_sizes {
        // At most MAX_BW_WRITES a size: at 8 B, -n 2000's 512 MiB would be 64 M WRITEs
        // (minutes through shm), which the GPU host's first two-process run spent its time on.
        let n = (cfg.bw_bytes / size as u64).clamp(1, MAX_BW_WRITES);
        for kind in [GpuStepKind::HostBw, GpuStepKind::ProxyBw] {
            steps.push((kind, size, n));
        }
    }
    let (mut lat, mut bw) = (Vec::<Row>::new(), Vec::<Row>::new());
    let mut server_checked = 0u64;
    let mut server_core = None;
    let mut region = Some(region);
    for (id, (kind, size, n)) in steps.into_iter().enumerate() {
        let step = GpuStep {
            id: id as u32,
            kind,
            size: size as u64,
            n,
            warm: if matches!(kind, GpuStepKind::HostLat | GpuStepKind::ProxyLat) {
                cfg.lat_warm
            } else {
                0
            },
            half: half as u64,
            capacity: cfg.capacity,
            seed: cfg.seed,
            verify: cfg.verify,
            pin: cfg.pin,
        };
        let r = region.take().expect("the region between steps");
        if cfg.verbose {
            eprintln!("rdma-bench: gpu-write step {id}: {kind:?}, {size} B x {n}: started");
        }
        let (d, done, r) = match client_step(e, r, &step, producer, cfg, ctrl) {
            Ok(v) => v,
            // A peer that left or failed says why on the control connection.
            Err(err) if e.live.gone() && !matches!(err, Error::Refused(_) | Error::PeerGone(_)) => {
                return Err(ctrl
                    .recv(Duration::from_secs(1), "the server's reason")
                    .err()
                    .unwrap_or(err))
            }
            Err(err) => return Err(err),
        };
        region = Some(r);
        server_checked += done.checked;
        server_core = done.core;
        let secs = d.as_secs_f64();
        if cfg.verbose {
            eprintln!("rdma-bench: gpu-write step {id}: {secs:.3} s");
        }
        let value = match kind {
            GpuStepKind::HostLat | GpuStepKind::ProxyLat => secs * 1e6 / n as f64 / 2.0,
            GpuStepKind::HostBw | GpuStepKind::ProxyBw => {
                (size as u64 * n) as f64 * 8.0 / secs / 1e9
            }
        };
        let rows = match kind {
            GpuStepKind::HostLat | GpuStepKind::ProxyLat => &mut lat,
            _ => &mut bw,
        };
        match kind {
            GpuStepKind::HostLat | GpuStepKind::HostBw => rows.push(Row {
                size,
                proxy: 0.0,
                host: value,
            }),
            _ => {
                if let Some(row) = rows.last_mut() {
                    row.proxy = value;
                }
            }
        }
    }
    let server = match server_core {
        Some(c) => format!("pinned to core {c}"),
        None if cfg.pin => "unpinned (its topology names no cores near its GPU)".into(),
        None => "unpinned".into(),
    };
    Ok((
        GpuWriteReport {
            producer: producer.name(),
            ring_mcmds,
            lat_us: lat,
            lat_rounds: cfg.lat_iters.max(1),
            bw_gbps: bw,
            verified: cfg.verify,
            server_checked,
            pinning: format!("client {pinning}; server {server}"),
        },
        region.expect("the region after the steps"),
    ))
}

/// One step from the client's side: announce it, wait for the server, run it, take the
/// server's report, check the answers' bytes.
fn client_step<T: Transport>(
    e: &mut End<'_, T>,
    mut region: T::Mr,
    step: &GpuStep,
    producer: &dyn Producer,
    cfg: &GpuWriteCfg,
    ctrl: &mut Ctrl,
) -> Result<(Duration, GpuStepDone, T::Mr)> {
    let (at, len) = landing(step, false);
    if step.verify {
        zero(&mut region, at, len)?;
    }
    ctrl.send(&Msg::GpuStep(step.clone()))?;
    let wait = cfg.idle.max(Duration::from_secs(60));
    match ctrl.recv(wait, "the server to get ready")? {
        Msg::Ready { id } if id == step.id => {}
        m => {
            return Err(Error::Protocol(format!(
                "expected ready for gpu-write step {}, got {}",
                step.id,
                m.kind()
            )))
        }
    }
    let (d, region) = match step.kind {
        GpuStepKind::HostLat | GpuStepKind::HostBw => {
            let core = e.core;
            let batch = cfg.batch.max(1);
            let e2 = &mut *e;
            let (d, region) = std::thread::scope(|s| {
                on_core(s, core, move || {
                    (client_host(e2, &region, step, batch), region)
                })
                .join()
            })
            .map_err(|_| Error::Protocol("the host path's thread panicked".into()))?;
            (d?, region)
        }
        GpuStepKind::ProxyLat | GpuStepKind::ProxyBw => client_proxy(e, region, step, producer)?,
    };
    let done = match ctrl.recv(wait, "the server's end of a gpu-write step")? {
        Msg::GpuStepDone(d) if d.id == step.id => d,
        m => {
            return Err(Error::Protocol(format!(
                "expected the server's end of gpu-write step {}, got {}",
                step.id,
                m.kind()
            )))
        }
    };
    if step.verify {
        let what = format!("{} (the server's answers)", step_name(step.kind));
        verify(&region, step.seed, SERVER_SIDE, at, len, len, &what)?;
        if done.checked == 0 {
            return Err(Error::Protocol(
                "gpu-write: the server checked no byte of a verified step".into(),
            ));
        }
    }
    Ok((d, done, region))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cycle_within_the_half() {
        assert_eq!(offset(0, 4096, 8192), 0);
        assert_eq!(offset(1, 4096, 8192), 4096);
        assert_eq!(offset(2, 4096, 8192), 0);
        assert_eq!(touched(4096, 5, 8192), 8192);
        assert_eq!(touched(8, 3, 8192), 24);
    }

    #[test]
    fn the_ring_alone_consumes_every_command() {
        let cfg = GpuWriteCfg {
            ring_cmds: 100_000,
            capacity: 256,
            ..GpuWriteCfg::default()
        };
        assert!(ring_rate(&CpuProducer, &cfg, None).unwrap() > 0.0);
    }

    #[test]
    fn pinning_needs_the_flag_and_a_topology() {
        assert_eq!(proxy_core(false, None, 0, 0).0, None);
        let (c, why) = proxy_core(true, None, 0, 0);
        assert_eq!(c, None);
        assert!(why.contains("no topology"), "{why}");
        let none = Hints {
            gpus: 0,
            nic_groups: Vec::new(),
            cores: vec![vec![0, 1]],
        };
        assert_eq!(proxy_core(true, Some(&none), 0, 0).0, None);
        let h = Hints {
            gpus: 2,
            nic_groups: vec![Vec::new(); 2],
            cores: vec![vec![0, 1], vec![8, 9]],
        };
        assert_eq!(proxy_core(true, Some(&h), 1, 0).0, Some(8));
        // The server: the next core near its GPU.
        assert_eq!(proxy_core(true, Some(&h), 1, 1).0, Some(9));
    }
}
