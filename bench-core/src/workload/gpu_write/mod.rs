//! `--workload gpu-write`: WRITEs issued through a proxy ring (`transport-proxy`) beside the
//! same WRITEs posted by the host, in one run, on the same endpoints, between a client and a
//! server (two processes, or both in one: loopback runs the same code over the same protocol).
//!
//! A [`Producer`] writes commands into the client's ring (a CPU thread, or GPU threads); the
//! client's proxy posts them; the server answers; the client's proxy counts the answers into
//! the client ring's `arrivals`, which the producer waits on. The host-initiated figure
//! beside each one posts the same WRITEs from a client thread. The server answers both the
//! same way: a thread polls its endpoint and posts each answer once the immediate is counted
//! and the bytes are visible (`make_gpu_visible`), so the difference between the two figures
//! is the client's initiator alone. Both of the client's paths land each answer before they
//! count it (the proxy's `landing`, the host path's thread), so both clocks stop at delivery. With
//! `echo_ring` (`--server-echo ring`) it answers the proxy steps as a GPU consumer would:
//! its proxy counts the immediates into its ring's `arrivals` and a CPU echo pushes the
//! answers through that ring (two more hand-offs a round trip). Both halves of every region
//! are fixed: the client WRITEs from its lower half into the server's lower half, the server
//! answers from its upper half into the client's upper half.
//!
//! Figures: commands per second of the ring alone (the client's proxy consuming into nothing);
//! latency as half the round trip of a ping-pong (perftest's definition: WRITE+imm, answered
//! by a WRITE+imm of the same size once its immediate is counted; the mean over the timed
//! rounds, and their median, as perftest's "typical": a kernel times each round by its SM's
//! cycle counter); bandwidth to delivery (N WRITEs+imm, the clock
//! stops at the server's one answer after it counted the N-th: it includes one return). The
//! server compares every landed byte with the client's pattern after each step and says how
//! many it checked; the client checks the answers' bytes.
//!
//! Here: the producers, the configuration, the ring alone and where proxy threads run;
//! `client.rs` the client's half (the steps in order, their figures), `server.rs` the server's
//! half of a step, `steps.rs` what both halves share, `report.rs` the report and its tables.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, LocalSlice, MemoryRegion, PeerId, Post, RemoteRegion, Transport,
    WriteOp,
};
use transport_proxy::ring::StallWatch;
use transport_proxy::{
    drain_to_nothing, immediate, pack, Command, Proxy, ProxyPeer, ProxyStats, Ring, RingLayout,
    RingMemory,
};

use crate::buffers::fill_at;
use crate::ctrl::{Ctrl, Liveness};
use crate::error::{Error, Result, TransportContext};
use crate::proto::{GpuStep, GpuStepDone, GpuStepKind, Msg};
use crate::topo_glue::Hints;

mod client;
mod report;
mod server;
mod steps;

pub use client::client;
pub use report::{GpuWriteReport, Row};
pub use server::serve_step;
pub use steps::End;
use steps::*;

/// Who writes commands into the ring: the seam a GPU kernel plugs into.
pub trait Producer: Sync {
    /// For reports: `cpu`, `cuda`, ...
    fn name(&self) -> &'static str;
    /// For reports: how [`Producer::pingpong`] orders each command before the proxy sees it
    /// (`ordered`: a Release, as [`Ring::push`] does; `unfenced`: no fence, the payload was in
    /// place before).
    fn publish(&self) -> &'static str {
        "ordered"
    }
    /// Write `cmds` into `ring` (in any order; each as the ring's
    /// protocol says) and return once all are in. The caller waits for their effect on the
    /// ring's counters.
    fn issue(&self, ring: Ring<'_>, cmds: &[Command]) -> Result<()>;
    /// Latency rounds: `rounds` times, publish `cmd` into `ring` (its immediate's low 16 bits
    /// replaced by `(first + round) as u16`) and wait until `ring`'s `arrivals[slot]` reaches
    /// `base + round + 1` (the peer's answer, counted by this ring's proxy); the total time
    /// and each round trip, by the producer's clock. The producer is the ring's only one
    /// while this runs. It fails when the ring's error word is set (the proxy stopped, or the
    /// caller's watcher saw the peer go).
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
    ) -> Result<Rounds>;
    /// The ring alone: publish `count` copies of `cmd` (immediate's low 16 bits: each one's
    /// index) into `ring`, made where the producer runs, as a producer that computes its
    /// commands does (no list handed over); return once all are in.
    fn generate(&self, ring: Ring<'_>, cmd: &Command, count: u64) -> Result<()> {
        for i in 0..count {
            let mut c = *cmd;
            c.imm = (cmd.imm & !0xffff) | (i & 0xffff) as u32;
            ring.push(&c).map_err(ring_err)?;
        }
        Ok(())
    }
    /// Memory for a ring this producer writes or waits on, laid out ([`Ring::init`]). The
    /// default is host memory ([`RingMemory`]); a GPU producer returns memory its kernels can
    /// reach (`cuMemHostAlloc` with `DEVICEMAP`, or this memory after `cuMemHostRegister`).
    fn ring_memory(&self, layout: RingLayout) -> Result<Box<dyn RingHome>> {
        Ok(Box::new(RingMemory::new(layout)))
    }
}

/// What a step's clock read: its total and, for latency, each round trip (ns).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rounds {
    pub total: Duration,
    /// Each round trip of a latency step, in order; empty for bandwidth.
    pub each_ns: Vec<u64>,
}

impl Rounds {
    /// Room for `n` round trips, taken before the clock starts (the rounds allocate nothing).
    fn with_capacity(n: u64) -> Self {
        Self {
            total: Duration::ZERO,
            each_ns: Vec::with_capacity(n as usize),
        }
    }

    /// The median round trip (the mean of the two middle ones for an even count); `None`
    /// without rounds.
    pub fn median(&self) -> Option<Duration> {
        let mut v = self.each_ns.clone();
        v.sort_unstable();
        let n = v.len();
        let ns = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2] as f64,
            _ => (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0,
        };
        Some(Duration::from_secs_f64(ns / 1e9))
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
    ) -> Result<Rounds> {
        let arrivals = ring
            .arrivals(slot)
            .ok_or_else(|| Error::Protocol(format!("gpu-write: the ring has no slot {slot}")))?;
        let mut out = Rounds::with_capacity(rounds);
        let t0 = Instant::now();
        let mut last = t0;
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
            let now = Instant::now();
            out.each_ns.push((now - last).as_nanos() as u64);
            last = now;
        }
        out.total = last - t0;
        Ok(out)
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

/// The bytes of the ring a server allocates for a step whose client asked for `capacity`
/// commands: the server holds it to its `--max-mem`, as it does the regions.
pub fn ring_bytes(capacity: u32) -> Result<u64> {
    Ok(RingLayout::new(capacity, 1).map_err(ring_err)?.bytes() as u64)
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
    /// WRITEs per `post_writes`, the host path's and the client proxy's alike (`--batch`).
    pub batch: usize,
    pub verify: bool,
    pub seed: u64,
    pub idle: Duration,
    /// Pin the proxy threads (and the host path's) near the GPU where the topology says.
    pub pin: bool,
    /// In the proxy steps the server answers through its own ring and proxy
    /// (`--server-echo ring`), not the way it answers the host steps (the default).
    pub echo_ring: bool,
    /// Say on stderr when each step starts and ends (`-v`): where a slow or stuck run is.
    pub verbose: bool,
    /// Times each size's host and proxy steps run, side by side, alternating which goes
    /// first (`--rounds`).
    pub rounds: u32,
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
            echo_ring: false,
            verbose: false,
            rounds: 1,
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

/// Slots of the ring-alone step's ring (2 MiB of commands).
pub const RING_ALONE_CAPACITY: u32 = 1 << 16;

/// The ring alone: `cfg.ring_cmds` 4 KiB WRITE commands that `producer` makes itself
/// ([`Producer::generate`]) into a ring of [`RING_ALONE_CAPACITY`] whose one proxy thread
/// posts nothing; millions of commands per second to the last one consumed.
pub fn ring_rate(producer: &dyn Producer, cfg: &GpuWriteCfg, core: Option<usize>) -> Result<f64> {
    let layout = RingLayout::new(RING_ALONE_CAPACITY, 1).map_err(ring_err)?;
    let mem = producer.ring_memory(layout)?;
    let ring = mem.ring();
    let cmd = Command::write(0, pack(0, 0), pack(0, 0), 4096, Some(1));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = on_core(s, core, || drain_to_nothing(ring, &stop, 64));
        let t0 = Instant::now();
        let out = producer.generate(ring, &cmd, cfg.ring_cmds);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The host paths over shm, each side held to "land before you answer"
    /// (`workload::strict`): the server makes each arrival visible before its answer (every
    /// round, or once before the one answer of a bandwidth step), and the client each answer
    /// before its clock stops.
    #[test]
    fn the_host_paths_land_before_they_answer() {
        use crate::workload::strict::shm_pair;
        use transport_core::MemoryRegion;
        for (kind, size, n, warm) in [
            (GpuStepKind::HostLat, 64u64, 20u64, 3u64),
            (GpuStepKind::HostBw, 4096, 64, 0),
        ] {
            let (mut a, mut b, pb, pa, ma, mb) = shm_pair(1 << 16).expect("an shm pair");
            let (la, lb) = (a.landings.clone(), b.landings.clone());
            let ra = b.import(pa, &ma.remote()).expect("import");
            let rb = a.import(pb, &mb.remote()).expect("import");
            let step = GpuStep {
                id: 0,
                kind,
                size,
                n,
                warm,
                half: 1 << 15,
                capacity: 256,
                seed: 1,
                verify: false,
                pin: false,
                echo_ring: false,
            };
            fn end<T: Transport>(
                ep: &mut T,
                peer: transport_core::PeerId,
                remote: transport_core::RemoteRegion<T::RemoteKey>,
            ) -> End<'_, T> {
                End {
                    ep,
                    peer,
                    remote,
                    core: None,
                    live: Liveness::default(),
                    idle: Duration::from_secs(20),
                }
            }
            std::thread::scope(|s| {
                let step = &step;
                let server = s.spawn(move || {
                    let mut e = end(&mut b, pa, ra);
                    server::server_host(&mut e, &mb, step)
                });
                let mut e = end(&mut a, pb, rb);
                let rounds = client::client_host(&mut e, &ma, step, 16);
                let served = server.join().expect("the server thread");
                rounds.unwrap_or_else(|e| panic!("{kind:?}, client: {e}"));
                served.unwrap_or_else(|e| panic!("{kind:?}, server: {e}"));
            });
            let answers = if kind == GpuStepKind::HostLat {
                warm + n
            } else {
                1
            };
            assert_eq!(
                lb.load(Ordering::Relaxed),
                answers,
                "{kind:?}: server landings"
            );
            assert_eq!(
                la.load(Ordering::Relaxed),
                answers,
                "{kind:?}: client landings"
            );
        }
    }

    #[test]
    fn ring_bytes_grow_with_the_capacity_and_refuse_a_bad_one() {
        let small = ring_bytes(4096).unwrap();
        let big = ring_bytes(1 << 24).unwrap();
        assert!((4096 * 32..1 << 20).contains(&small), "{small}");
        assert!(big >= 512 << 20, "{big}");
        assert!(ring_bytes(3).is_err());
    }

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

    /// With rounds, each size's two paths run side by side, the first of each pair
    /// alternating; the rows pair each round's figures and take each path's median.
    #[test]
    fn rounds_alternate_the_paths_and_pair_their_figures() {
        use GpuStepKind::*;
        let cfg = GpuWriteCfg {
            lat_sizes: vec![8],
            bw_sizes: vec![4096],
            rounds: 3,
            ..GpuWriteCfg::default()
        };
        let steps = client::plan(&cfg);
        let kinds: Vec<_> = steps.iter().map(|s| (s.0, s.1)).collect();
        assert_eq!(
            kinds,
            [
                (HostLat, 8),
                (ProxyLat, 8),
                (ProxyLat, 8),
                (HostLat, 8),
                (HostLat, 8),
                (ProxyLat, 8),
                (HostBw, 4096),
                (ProxyBw, 4096),
                (ProxyBw, 4096),
                (HostBw, 4096),
                (HostBw, 4096),
                (ProxyBw, 4096),
            ]
        );
        // Figures in the order the steps ran; the host path drifts down, the proxy with it.
        let bw = [10.0, 9.0, 6.0, 8.0, 7.0, 7.7];
        let figures: Vec<client::Figure> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.0, s.1, if i < 6 { i as f64 } else { bw[i - 6] }, 0.5))
            .collect();
        let rows = client::rows_of(&figures, HostBw, |f| f.2);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.size, 4096);
        assert_eq!(r.rounds, vec![[9.0, 10.0], [6.0, 8.0], [7.7, 7.0]]);
        assert_eq!((r.proxy, r.host), (7.7, 8.0));
        // The median of each round's ratio (0.75, 0.9, 1.1), not the medians' ratio (0.96).
        let (m, range) = r.compare(|p, h| p / h);
        assert_eq!(m, 0.9);
        assert_eq!(range, Some((0.75, 1.1)));
        let lat = client::rows_of(&figures, HostLat, |f| f.3);
        assert_eq!(lat.len(), 1);
        assert_eq!(lat[0].rounds.len(), 3);
        // A size listed twice is one row, its rounds joined.
        let twice = GpuWriteCfg {
            lat_sizes: vec![8, 64, 8],
            bw_sizes: vec![],
            rounds: 1,
            ..GpuWriteCfg::default()
        };
        let f: Vec<client::Figure> = client::plan(&twice)
            .iter()
            .map(|s| (s.0, s.1, 1.0, 1.0))
            .collect();
        let rows = client::rows_of(&f, HostLat, |f| f.2);
        assert_eq!(rows.iter().map(|r| r.size).collect::<Vec<_>>(), [8, 64]);
        assert_eq!(rows[0].rounds.len(), 2);
        // One round: no pairs listed, the comparison of the two figures.
        let one = Row::of_rounds(64, &[2.0], &[4.0]);
        assert!(one.rounds.is_empty());
        assert_eq!(one.compare(|p, h| p / h), (0.5, None));
    }

    #[test]
    fn the_median_round_trip_is_the_middle_one() {
        let r = |v: &[u64]| Rounds {
            total: Duration::ZERO,
            each_ns: v.to_vec(),
        };
        assert_eq!(r(&[]).median(), None);
        // Unsorted, with one slow round that moves the mean (2.6 us) but not the median.
        let one_slow = r(&[1000, 9000, 1200, 1100, 1000]);
        assert_eq!(one_slow.median(), Some(Duration::from_nanos(1100)));
        assert_eq!(
            r(&[4000, 1000, 3000, 2000]).median(),
            Some(Duration::from_nanos(2500))
        );
    }

    #[test]
    fn pingpong_times_each_round() {
        let ring = RingMemory::new(RingLayout::new(64, 1).unwrap());
        let r = ring.ring();
        let cmd = Command::write(0, pack(0, 0), pack(0, 0), 8, Some(immediate(0, 0)));
        let stop = AtomicBool::new(false);
        let rounds = std::thread::scope(|s| {
            // An echo in place of a proxy and its peer: each command consumed is answered.
            s.spawn(|| {
                let mut tail = 0;
                while !stop.load(Ordering::Acquire) {
                    if r.peek(tail).is_some() {
                        tail += 1;
                        r.release(tail);
                        r.arrivals(0).unwrap().store(tail, Ordering::Release);
                    }
                    std::hint::spin_loop();
                }
            });
            let out = CpuProducer.pingpong(r, 0, &cmd, 0, 0, 7, Duration::from_secs(10));
            stop.store(true, Ordering::Release);
            out
        })
        .unwrap();
        assert_eq!(rounds.each_ns.len(), 7);
        assert_eq!(
            rounds.each_ns.iter().sum::<u64>(),
            rounds.total.as_nanos() as u64
        );
        assert!(rounds.median().unwrap() <= rounds.total);
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
