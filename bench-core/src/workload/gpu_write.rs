//! `--workload gpu-write`: WRITEs issued through a proxy ring (`transport-proxy`) beside the
//! same WRITEs posted by the host, in one run, both sides in this process.
//!
//! A [`Producer`] writes commands into the sender's ring (the CPU one here; a CUDA kernel
//! plugs in through the same seam); the sender's proxy posts them; the receiver's proxy counts
//! their immediates and publishes the count. The host-initiated figure beside each one posts
//! the same WRITEs from a thread of its own while a thread on the receiver counts the
//! immediates the same way. Every figure stops at delivery: when the issuer saw the
//! receiver's count reach the WRITE (or the last of a batch); the bytes are then verified
//! when verification is on.
//!
//! Figures: commands per second of the ring alone (the proxy consuming into nothing), one-way
//! latency issue-to-remote-immediate (both sides share this process's clock, so one-way is
//! measured, not halved), and bandwidth.

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
use crate::error::{Error, Result, TransportContext};

/// Who writes commands into the ring: the seam a GPU kernel plugs into.
pub trait Producer: Sync {
    /// For reports: `cpu`, `cuda`, ...
    fn name(&self) -> &'static str;
    /// Write `cmds` into `ring` (in any order; each with its ready word last, as the ring's
    /// protocol says) and return once all are in. The caller waits for their effect on the
    /// ring's counters.
    fn issue(&self, ring: Ring<'_>, cmds: &[Command]) -> Result<()>;
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
}

fn ring_err(e: transport_proxy::RingError) -> Error {
    Error::Protocol(e.to_string())
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct GpuWriteCfg {
    /// One-way latency sizes.
    pub lat_sizes: Vec<usize>,
    /// Round trips per latency size (each one WRITE, waited for).
    pub lat_iters: u64,
    /// Bandwidth sizes.
    pub bw_sizes: Vec<usize>,
    /// Bytes per bandwidth size (the WRITEs cycle over the region).
    pub bw_bytes: u64,
    /// Commands for the ring-alone rate.
    pub ring_cmds: u64,
    /// Ring capacity (commands).
    pub capacity: u32,
    /// Host-initiated WRITEs per `post_writes`.
    pub batch: usize,
    pub verify: bool,
    pub seed: u64,
    pub idle: Duration,
}

impl Default for GpuWriteCfg {
    fn default() -> Self {
        Self {
            lat_sizes: vec![8, 64, 512, 4096, 65536],
            lat_iters: 1000,
            bw_sizes: vec![4096, 65536, 1 << 20],
            bw_bytes: 1000 << 18,
            ring_cmds: 2_000_000,
            capacity: 4096,
            batch: 16,
            verify: true,
            seed: 1,
            idle: Duration::from_secs(30),
        }
    }
}

impl GpuWriteCfg {
    /// Bytes each side's data region needs.
    pub fn region_len(&self) -> usize {
        let biggest = self
            .bw_sizes
            .iter()
            .chain(&self.lat_sizes)
            .copied()
            .max()
            .unwrap_or(4096);
        (32 << 20).max(biggest)
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
    /// One-way latency issue-to-remote-immediate, microseconds (median).
    pub lat_us: Vec<Row>,
    /// Bandwidth, Gbit/s, to the last immediate counted.
    pub bw_gbps: Vec<Row>,
    pub verified: bool,
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
            "one-way latency, issue to the receiver's counted immediate (median, us):",
            "diff",
            &self.lat_us,
            |r| format!("{:>+8.2}", r.proxy - r.host),
        );
        table(
            &mut s,
            "bandwidth to the last counted immediate (Gbit/s):",
            "ratio",
            &self.bw_gbps,
            |r| format!("{:>8.2}", r.proxy / r.host),
        );
        // The same words as every other workload's output ("every byte verified").
        s += if self.verified {
            "every byte verified\n"
        } else {
            "not verified (--no-verify)\n"
        };
        s
    }
}

/// The ring alone: `cfg.ring_cmds` commands from `producer` into a ring whose proxy posts
/// nothing; millions of commands per second to the last one consumed.
pub fn ring_rate(producer: &dyn Producer, cfg: &GpuWriteCfg) -> Result<f64> {
    let mem = producer.ring_memory(RingLayout::new(cfg.capacity, 1).map_err(ring_err)?)?;
    let ring = mem.ring();
    let chunk: Vec<Command> = (0..4096u64)
        .map(|i| Command::write(0, pack(0, i * 64), pack(0, i * 64), 64, Some(1)))
        .collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = s.spawn(|| drain_to_nothing(ring, &stop, 64));
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

/// Everything [`run`] needs: two connected endpoints and a data region on each (the sender's
/// `src`, the receiver's `dst`, imported on the sender as `remote`).
pub struct Pair<T: Transport> {
    pub a: T,
    pub b: T,
    pub a_to_b: PeerId,
    pub src: T::Mr,
    pub dst: T::Mr,
    pub remote: RemoteRegion<T::RemoteKey>,
}

/// The whole workload: ring alone, then per size the host-initiated figure and the proxy's.
pub fn run<T: Transport>(
    p: Pair<T>,
    producer: &dyn Producer,
    cfg: &GpuWriteCfg,
) -> Result<GpuWriteReport> {
    let Pair {
        mut a,
        mut b,
        a_to_b,
        mut src,
        dst,
        remote,
    } = p;
    let len = src.len().min(dst.len());
    if len < cfg.region_len() {
        return Err(Error::Usage(format!(
            "gpu-write: regions of {len} bytes; it needs {}",
            cfg.region_len()
        )));
    }
    // The source pattern, once: every WRITE copies a slice of it to the same offset.
    let mut pat = vec![0u8; len];
    fill_at(cfg.seed, 0, 0, &mut pat);
    src.memory_mut()
        .write_at(0, &pat)
        .ctx(|| "filling the source region")?;
    let ring_mcmds = ring_rate(producer, cfg)?;

    let mut dst = Some(dst);
    let mut src = Some(src);
    let mut lat = Vec::new();
    let mut bw = Vec::new();
    let plans: Vec<(usize, u64, bool)> = cfg
        .lat_sizes
        .iter()
        .map(|&s| (s, cfg.lat_iters, true))
        .chain(
            cfg.bw_sizes
                .iter()
                .map(|&s| (s, (cfg.bw_bytes / s as u64).max(1), false)),
        )
        .collect();
    for (size, n, one_at_a_time) in plans {
        let (s, d) = (src.take().expect("src"), dst.take().expect("dst"));
        let mut d = d;
        clear(&mut d, size, n, len)?;
        let host = host_phase(
            &mut a,
            &mut b,
            a_to_b,
            &s,
            &remote,
            size,
            n,
            one_at_a_time,
            cfg,
        )?;
        verify(&d, &pat, size, n, len, cfg, "host-initiated")?;
        clear(&mut d, size, n, len)?;
        let (proxy, s, d) = proxy_phase(
            &mut a,
            &mut b,
            a_to_b,
            s,
            d,
            &remote,
            size,
            n,
            one_at_a_time,
            producer,
            cfg,
        )?;
        verify(&d, &pat, size, n, len, cfg, "proxy")?;
        src = Some(s);
        dst = Some(d);
        let row = |proxy, host| Row { size, proxy, host };
        if one_at_a_time {
            lat.push(row(proxy, host));
        } else {
            bw.push(row(proxy, host));
        }
    }
    // Regions before their endpoints.
    drop((src, dst));
    drop((a, b));
    Ok(GpuWriteReport {
        producer: producer.name(),
        ring_mcmds,
        lat_us: lat,
        bw_gbps: bw,
        verified: cfg.verify,
    })
}

/// Where WRITE `i` of `size` bytes goes in a region of `len`: the same offset at both ends.
fn offset(i: u64, size: usize, len: usize) -> u64 {
    let slots = (len / size).max(1) as u64;
    (i % slots) * size as u64
}

fn touched(size: usize, n: u64, len: usize) -> usize {
    ((size as u64).saturating_mul(n)).min((len / size * size) as u64) as usize
}

fn clear<M: MemoryRegion>(d: &mut M, size: usize, n: u64, len: usize) -> Result<()> {
    let zeros = vec![0u8; touched(size, n, len)];
    d.memory_mut()
        .write_at(0, &zeros)
        .ctx(|| "clearing the landing region")
}

fn verify<M: MemoryRegion>(
    d: &M,
    pat: &[u8],
    size: usize,
    n: u64,
    len: usize,
    cfg: &GpuWriteCfg,
    what: &str,
) -> Result<()> {
    if !cfg.verify {
        return Ok(());
    }
    let k = touched(size, n, len);
    let mut got = vec![0u8; k];
    d.memory()
        .read_at(0, &mut got)
        .ctx(|| "reading the landing region back")?;
    if got[..] != pat[..k] {
        let at = got.iter().zip(pat).position(|(x, y)| x != y).unwrap_or(0);
        return Err(Error::Verify(format!(
            "gpu-write {what}, {size}-byte WRITEs: byte {at} (WRITE {}) is {:#04x}, expected {:#04x}",
            at / size,
            got[at],
            pat[at]
        )));
    }
    Ok(())
}

fn timeout(what: &str, idle: Duration) -> Error {
    Error::Timeout {
        what: what.into(),
        after: idle,
    }
}

/// Host-initiated: this thread posts (batches, or one at a time waiting for each), a thread on
/// the receiver polls and publishes its count of immediates; the figure stops when this thread
/// sees the count. Returns microseconds (median one-way) or Gbit/s.
#[allow(clippy::too_many_arguments)]
fn host_phase<T: Transport>(
    a: &mut T,
    b: &mut T,
    a_to_b: PeerId,
    src: &T::Mr,
    remote: &RemoteRegion<T::RemoteKey>,
    size: usize,
    n: u64,
    one_at_a_time: bool,
    cfg: &GpuWriteCfg,
) -> Result<f64> {
    let len = src.len();
    let count = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (count, stop) = (&count, &stop);
        let rx = s.spawn(move || -> Result<()> {
            let mut buf = vec![Completion::default(); 64];
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = b.poll(&mut buf).ctx(|| "polling the receiver")?;
                for c in &buf[..k] {
                    match &c.kind {
                        CompletionKind::RemoteWrite { .. } => seen += 1,
                        _ => return Err(super::unexpected(c, "gpu-write (receiver)")),
                    }
                }
                if k > 0 {
                    count.store(seen, Ordering::Release);
                }
            }
            Ok(())
        });
        let out = host_issue(
            a,
            a_to_b,
            src,
            remote,
            size,
            n,
            one_at_a_time,
            cfg,
            len,
            count,
        );
        stop.store(true, Ordering::Relaxed);
        let r = rx
            .join()
            .map_err(|_| Error::Protocol("the receiver thread panicked".into()))?;
        let v = out?;
        r?;
        Ok(v)
    })
}

#[allow(clippy::too_many_arguments)]
fn host_issue<T: Transport>(
    a: &mut T,
    a_to_b: PeerId,
    src: &T::Mr,
    remote: &RemoteRegion<T::RemoteKey>,
    size: usize,
    n: u64,
    one_at_a_time: bool,
    cfg: &GpuWriteCfg,
    len: usize,
    count: &AtomicU64,
) -> Result<f64> {
    let mut buf = vec![Completion::default(); 64];
    let mut done = 0u64;
    let mut poll = |a: &mut T, done: &mut u64| -> Result<()> {
        let k = a.poll(&mut buf).ctx(|| "polling the sender")?;
        for c in &buf[..k] {
            match &c.kind {
                CompletionKind::Write => *done += 1,
                _ => return Err(super::unexpected(c, "gpu-write (sender)")),
            }
        }
        Ok(())
    };
    let op = |i: u64| -> Result<WriteOp<'_, T::Mr, T::RemoteKey>> {
        let off = offset(i, size, len);
        Ok(WriteOp {
            peer: a_to_b,
            local: LocalSlice::new(src, off as usize, size).ctx(|| "a local slice")?,
            remote: remote.slice(off, size as u64).ctx(|| "a remote slice")?,
            imm: Some(immediate(0, i as u16)),
            ctx: i,
        })
    };
    let start = Instant::now();
    let mut lat = Vec::with_capacity(if one_at_a_time { n as usize } else { 0 });
    if one_at_a_time {
        for i in 0..n {
            let w = op(i)?;
            let t0 = Instant::now();
            while a
                .post_write(w.peer, w.local, w.remote, w.imm, w.ctx)
                .ctx(|| "posting a WRITE")?
                == Post::QueueFull
            {
                poll(a, &mut done)?;
            }
            while count.load(Ordering::Acquire) < i + 1 {
                poll(a, &mut done)?;
                if start.elapsed() > cfg.idle {
                    return Err(timeout("a host-initiated WRITE's immediate", cfg.idle));
                }
            }
            lat.push(t0.elapsed());
        }
    } else {
        let mut ops = Vec::with_capacity(cfg.batch);
        let mut next = 0u64;
        while count.load(Ordering::Acquire) < n {
            if next < n {
                ops.clear();
                for i in next..(next + cfg.batch as u64).min(n) {
                    ops.push(op(i)?);
                }
                next += a.post_writes(&ops).ctx(|| "posting WRITEs")? as u64;
            }
            poll(a, &mut done)?;
            if start.elapsed() > cfg.idle.max(Duration::from_secs(120)) {
                return Err(timeout("host-initiated WRITEs' immediates", cfg.idle));
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Every local completion too, so the next phase starts with an empty queue.
    let t = Instant::now();
    while done < n {
        poll(a, &mut done)?;
        if t.elapsed() > cfg.idle {
            return Err(timeout(
                "host-initiated WRITEs' local completions",
                cfg.idle,
            ));
        }
    }
    Ok(if one_at_a_time {
        median_us(&mut lat)
    } else {
        (size as u64 * n) as f64 * 8.0 / secs / 1e9
    })
}

fn median_us(v: &mut [Duration]) -> f64 {
    v.sort_unstable();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Through the ring: both endpoints run a proxy; `producer` issues; the figure stops when
/// this thread sees the receiver's ring count the immediate(s).
#[allow(clippy::too_many_arguments)]
fn proxy_phase<T: Transport>(
    a: &mut T,
    b: &mut T,
    a_to_b: PeerId,
    src: T::Mr,
    dst: T::Mr,
    remote: &RemoteRegion<T::RemoteKey>,
    size: usize,
    n: u64,
    one_at_a_time: bool,
    producer: &dyn Producer,
    cfg: &GpuWriteCfg,
) -> Result<(f64, T::Mr, T::Mr)> {
    let len = src.len();
    let ring_a = producer.ring_memory(RingLayout::new(cfg.capacity, 1).map_err(ring_err)?)?;
    let ring_b = producer.ring_memory(RingLayout::new(2, 1).map_err(ring_err)?)?;
    let pa = Proxy::<T>::new(
        ring_a.ring(),
        vec![src],
        vec![ProxyPeer {
            id: a_to_b,
            regions: vec![*remote],
        }],
    );
    let pb = Proxy::<T>::new(ring_b.ring(), vec![dst], vec![]).landing(vec![0]);
    let (stop_a, stop_b) = (&AtomicBool::new(false), &AtomicBool::new(false));
    let cmd = |i: u64| {
        let off = offset(i, size, len);
        Command::write(
            0,
            pack(0, off),
            pack(0, off),
            size as u32,
            Some(immediate(0, i as u16)),
        )
    };
    std::thread::scope(|s| {
        let ha = s.spawn(move || (pa.run(a, stop_a), pa));
        let hb = s.spawn(move || (pb.run(b, stop_b), pb));
        let (rb, ra) = (ring_b.ring(), ring_a.ring());
        let arrivals = rb.arrivals(0).expect("slot 0");
        let measure = || -> Result<f64> {
            let start = Instant::now();
            if one_at_a_time {
                let mut lat = Vec::with_capacity(n as usize);
                for i in 0..n {
                    let c = [cmd(i)];
                    let t0 = Instant::now();
                    producer.issue(ra, &c)?;
                    let mut spins = 0u32;
                    while arrivals.load(Ordering::Acquire) < i + 1 {
                        // Three threads (two proxies and this one) on as few as two cores:
                        // give the proxies the core after a while.
                        spins += 1;
                        if spins > 1024 {
                            std::thread::yield_now();
                        }
                        if ra.error() != 0 || rb.error() != 0 {
                            return Err(Error::Protocol("a proxy stopped".into()));
                        }
                        if start.elapsed() > cfg.idle {
                            return Err(timeout("a proxied WRITE's immediate", cfg.idle));
                        }
                        std::hint::spin_loop();
                    }
                    lat.push(t0.elapsed());
                }
                return Ok(median_us(&mut lat));
            }
            let mut chunk = Vec::with_capacity(1024);
            let mut next = 0u64;
            while next < n {
                chunk.clear();
                let end = (next + 1024).min(n);
                chunk.extend((next..end).map(cmd));
                producer.issue(ra, &chunk)?;
                next = end;
            }
            rb.wait_arrivals(0, n, cfg.idle.max(Duration::from_secs(120)))
                .map_err(ring_err)?;
            let secs = start.elapsed().as_secs_f64();
            ra.wait_done(n, cfg.idle).map_err(ring_err)?;
            Ok((size as u64 * n) as f64 * 8.0 / secs / 1e9)
        };
        let out = measure();
        stop_a.store(true, Ordering::Relaxed);
        stop_b.store(true, Ordering::Relaxed);
        let (ra_res, pa) = ha
            .join()
            .map_err(|_| Error::Protocol("the sender's proxy panicked".into()))?;
        let (rb_res, pb) = hb
            .join()
            .map_err(|_| Error::Protocol("the receiver's proxy panicked".into()))?;
        let proxy_err = |e: transport_proxy::ProxyError| Error::Protocol(e.to_string());
        let v = out?;
        ra_res.map_err(proxy_err)?;
        rb_res.map_err(proxy_err)?;
        let src = pa.into_regions().pop().expect("src");
        let dst = pb.into_regions().pop().expect("dst");
        Ok((v, src, dst))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cycle_within_the_region() {
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
        assert!(ring_rate(&CpuProducer, &cfg).unwrap() > 0.0);
    }
}
