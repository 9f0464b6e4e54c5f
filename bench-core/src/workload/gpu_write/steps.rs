//! What both sides' steps share: where WRITEs go, polling and posting one, the waits that give
//! up, the check of landed bytes, and running a proxy beside the step.

use super::*;

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
pub(super) fn offset(i: u64, size: usize, half: usize) -> u64 {
    let slots = (half / size).max(1) as u64;
    (i % slots) * size as u64
}

pub(super) fn touched(size: usize, n: u64, half: usize) -> usize {
    ((size as u64).saturating_mul(n)).min((half / size * size) as u64) as usize
}

/// The landing range of a step at its receiver: (offset in the region, bytes), for the
/// server (the client's WRITEs) or the client (the answers).
pub(super) fn landing(step: &GpuStep, server: bool) -> (usize, usize) {
    let (size, half) = (step.size as usize, step.half as usize);
    let lat = matches!(step.kind, GpuStepKind::HostLat | GpuStepKind::ProxyLat);
    match (server, lat) {
        (true, true) => (0, size),
        (true, false) => (0, touched(size, step.n, half)),
        (false, true) => (half, size),
        (false, false) => (half, ANSWER),
    }
}

pub(super) fn zero<M: MemoryRegion>(d: &mut M, at: usize, len: usize) -> Result<()> {
    d.memory_mut()
        .write_at(at, &vec![0u8; len])
        .ctx(|| "clearing the landing region")
}

/// Compare `len` bytes at `at` of `d` with side `side`'s pattern; the error names the WRITE
/// (of `size` bytes) and the byte.
pub(super) fn verify<M: MemoryRegion>(
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

pub(super) fn timeout(what: &str, idle: Duration) -> Error {
    Error::Timeout {
        what: what.into(),
        after: idle,
    }
}

pub(super) fn gone() -> Error {
    Error::PeerGone("the peer left during a gpu-write step".into())
}

/// Poll `ep` once: local completions into `done`, immediates into `imms`.
pub(super) fn poll_once<T: Transport>(
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
            _ => {
                return Err(crate::workload::unexpected(
                    c,
                    &format!("gpu-write ({who})"),
                ))
            }
        }
    }
    Ok(k)
}

/// Waits of the host path: a turn counter that checks the clock and the peer now and then.
pub(super) struct Watch {
    t: Instant,
    idle: Duration,
    turns: u32,
}

impl Watch {
    pub(super) fn new(idle: Duration) -> Self {
        Self {
            t: Instant::now(),
            idle,
            turns: 0,
        }
    }
    pub(super) fn reset(&mut self) {
        self.t = Instant::now();
    }
    pub(super) fn check(&mut self, live: &Liveness, what: &str) -> Result<()> {
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

pub(super) fn write_op<'m, T: Transport>(
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
pub(super) fn post_one<T: Transport>(
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

/// A proxy of this side over `region`, the peer's region as its peer 0's region 0; it counts
/// arrivals into slot 0 and makes `region` visible to GPU work before it publishes them.
pub(super) fn proxy_of<'r, T: Transport>(
    ring: Ring<'r>,
    e: &End<'_, T>,
    region: T::Mr,
    batch: usize,
) -> Proxy<'r, T> {
    Proxy::<T>::new(
        ring,
        vec![region],
        vec![ProxyPeer {
            id: e.peer,
            regions: vec![e.remote],
        }],
    )
    .landing(vec![0])
    .max_batch(batch)
}

/// Run `work` beside this side's proxy on `ring` (its own thread, on `e.core`), with a
/// watcher that sets the ring's error word when the peer leaves, when the proxy moves none of
/// the waiting commands for `e.idle` (a peer that stopped polling with its connection open),
/// or when the proxy thread panicked (so a producer spinning on the ring, a GPU kernel too,
/// gives up); stop the proxy after `work`. The proxy posts at
/// most `batch` WRITEs a call, as the host path does (`--batch`). Returns `work`'s result,
/// the region back and what the proxy did.
pub(super) fn with_proxy<T: Transport, R>(
    e: &mut End<'_, T>,
    ring: Ring<'_>,
    region: T::Mr,
    batch: usize,
    work: impl FnOnce() -> Result<R>,
) -> Result<(R, T::Mr, ProxyStats)> {
    let p = proxy_of(ring, e, region, batch);
    let (stop, finished) = (&AtomicBool::new(false), &AtomicBool::new(false));
    let live = e.live.clone();
    let ep = &mut *e.ep;
    let mut stall = StallWatch::new(ring, e.idle);
    std::thread::scope(|s| {
        let h = on_core(s, e.core, move || {
            let _unwinding = StopOnUnwind(ring);
            (p.run(ep, stop), p)
        });
        let w = s.spawn(move || {
            while !finished.load(Ordering::Relaxed) {
                if live.gone() {
                    ring.set_error(transport_proxy::ring::ERR_STOPPED);
                    return;
                }
                if stall.check(ring) {
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
        let region = match &r {
            // WRITEs still in flight read from the region, and nothing says when they end:
            // it must not be freed. Leaked (the step fails anyway).
            Err(transport_proxy::ProxyError::StoppedInFlight { .. }) => {
                std::mem::forget(p);
                None
            }
            _ => p.into_regions().pop(),
        };
        let v = out?;
        let stats = r.map_err(|e| Error::Protocol(e.to_string()))?;
        let region = region.expect("the proxy's one region");
        Ok((v, region, stats))
    })
}

/// Sets the ring's error word if the proxy's thread unwinds: `Proxy::run` sets it when it
/// returns, a panic would leave producers waiting on the ring.
struct StopOnUnwind<'r>(Ring<'r>);

impl Drop for StopOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.set_error(transport_proxy::ring::ERR_STOPPED);
        }
    }
}

/// The server answers `step` through its ring and proxy: a proxy step with `echo_ring`.
pub(super) fn answered_by_ring(step: &GpuStep) -> bool {
    step.echo_ring && matches!(step.kind, GpuStepKind::ProxyLat | GpuStepKind::ProxyBw)
}

pub(super) fn step_name(k: GpuStepKind) -> &'static str {
    match k {
        GpuStepKind::HostLat => "host-initiated latency",
        GpuStepKind::ProxyLat => "proxy latency",
        GpuStepKind::HostBw => "host-initiated bandwidth",
        GpuStepKind::ProxyBw => "proxy bandwidth",
    }
}

pub(super) fn check_halves(own: usize, peer: usize, half: usize, size: usize) -> Result<()> {
    let need = 2 * half;
    if own < need || peer < need || size > half || size == 0 {
        return Err(Error::Protocol(format!(
            "gpu-write: {size}-byte WRITEs in halves of {half} bytes need regions of {need} \
             bytes; this side has {own}, the peer {peer}"
        )));
    }
    Ok(())
}
