//! The client's half: the producer's ring and proxy, the host path's thread, the steps in
//! order and their figures.

use super::*;
use crate::workload::delivery::make_visible;

/// The client's host path of a step: latency (the timed rounds, each and in all) or
/// bandwidth (the time to the answer), each clock stopping once the answer is visible here.
pub(super) fn client_host<T: Transport>(
    e: &mut End<'_, T>,
    src: &T::Mr,
    step: &GpuStep,
    batch: usize,
) -> Result<Rounds> {
    let (size, half) = (step.size as usize, step.half as usize);
    let mut buf = vec![Completion::default(); 64];
    let (mut done, mut imms) = (0u64, 0u64);
    let mut w = Watch::new(e.idle);
    let live = e.live.clone();
    let posted;
    let mut timed = Rounds::default();
    if step.kind == GpuStepKind::HostLat {
        let op = write_op(e, src, 0, 0, size, 0)?;
        let total = step.warm + step.n;
        timed = Rounds::with_capacity(step.n);
        let mut t0 = Instant::now();
        let mut last = t0;
        for r in 0..total {
            if r == step.warm {
                t0 = Instant::now();
                last = t0;
            }
            let mut o = op;
            o.imm = Some(immediate(0, r as u16));
            post_one(e.ep, &o, &mut buf, &mut done, &mut imms, "client")?;
            w.reset();
            while imms < r + 1 {
                poll_once(e.ep, &mut buf, &mut done, &mut imms, "client")?;
                w.check(&live, "the server's answer to a host-initiated WRITE")?;
            }
            // The answer is visible here before the round ends (and before the next WRITE),
            // as the proxy path's proxy lands each arrival before it counts it.
            make_visible(e.ep, &[src])?;
            if r >= step.warm {
                let now = Instant::now();
                timed.each_ns.push((now - last).as_nanos() as u64);
                last = now;
            }
        }
        timed.total = last - t0;
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
                let k = e.ep.post_writes(&ops).ctx(|| "posting WRITEs")?;
                next += k as u64;
                // Progress only: a queue that stays full (a peer that stopped reading) must
                // run into the idle timeout.
                if k > 0 {
                    w.reset();
                }
            }
            if poll_once(e.ep, &mut buf, &mut done, &mut imms, "client")? > 0 {
                w.reset();
            }
            w.check(&live, "the server's answer to host-initiated WRITEs")?;
        }
        make_visible(e.ep, &[src])?;
        timed.total = t0.elapsed();
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
    Ok(timed)
}

/// The client's proxy path of a step: the producer issues; latency through
/// [`Producer::pingpong`] on this ring's own arrivals, bandwidth to the answer's arrival.
pub(super) fn client_proxy<T: Transport>(
    e: &mut End<'_, T>,
    region: T::Mr,
    step: &GpuStep,
    producer: &dyn Producer,
    batch: usize,
    verbose: bool,
) -> Result<(Rounds, T::Mr)> {
    let (size, half) = (step.size as usize, step.half as usize);
    let mem = producer.ring_memory(RingLayout::new(step.capacity, 1).map_err(ring_err)?)?;
    let ring = mem.ring();
    let idle = e.idle;
    let live = e.live.clone();
    let (d, region, stats) = with_proxy(e, ring, region, batch, || {
        if step.kind == GpuStepKind::ProxyLat {
            let cmd = Command::write(
                0,
                pack(0, 0),
                pack(0, 0),
                size as u32,
                Some(immediate(0, 0)),
            );
            producer.pingpong(ring, 0, &cmd, 0, 0, step.warm, idle)?;
            let t0 = Instant::now();
            let d = producer.pingpong(ring, 0, &cmd, step.warm, step.warm, step.n, idle)?;
            let outside = t0.elapsed();
            ring.wait_done(step.warm + step.n, idle).map_err(ring_err)?;
            if verbose {
                // The producer's own clock (a kernel's: the GPU's globaltimer) against the
                // host's around the whole call (a kernel's launch and the wait included).
                let us = |d: Duration| d.as_secs_f64() * 1e6 / step.n as f64 / 2.0;
                eprintln!(
                    "rdma-bench: gpu-write: {size} B proxy latency {:.3} us by the producer's clock, {:.3} us by the host's around the call",
                    us(d.total),
                    us(outside)
                );
            }
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
        let d = Rounds {
            total: t0.elapsed(),
            each_ns: Vec::new(),
        };
        ring.wait_done(n, idle).map_err(ring_err)?;
        Ok(d)
    })?;
    if verbose {
        eprintln!(
            "rdma-bench: gpu-write: {}, {size} B: the client's proxy posted {} WRITEs in {} \
             post_writes calls (at most {batch} a call; {} found the queue full)",
            step_name(step.kind),
            stats.writes,
            stats.batches,
            stats.queue_full
        );
    }
    Ok((d, region))
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
    let rounds = cfg.rounds.max(1);
    let steps = plan(cfg);
    let mut figures: Vec<Figure> = Vec::with_capacity(steps.len());
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
            echo_ring: cfg.echo_ring,
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
        server_checked = server_checked.saturating_add(done.checked);
        server_core = done.core;
        let secs = d.total.as_secs_f64();
        if cfg.verbose {
            eprintln!("rdma-bench: gpu-write step {id}: {secs:.3} s");
        }
        let value = match kind {
            GpuStepKind::HostLat | GpuStepKind::ProxyLat => secs * 1e6 / n as f64 / 2.0,
            GpuStepKind::HostBw | GpuStepKind::ProxyBw => {
                (size as u64 * n) as f64 * 8.0 / secs / 1e9
            }
        };
        // Half the median round trip, beside half the mean.
        let median = d.median().map_or(0.0, |m| m.as_secs_f64() * 1e6 / 2.0);
        figures.push((kind, size, value, median));
    }
    let lat = rows_of(&figures, GpuStepKind::HostLat, |f| f.2);
    let lat_p50 = rows_of(&figures, GpuStepKind::HostLat, |f| f.3);
    let bw = rows_of(&figures, GpuStepKind::HostBw, |f| f.2);
    let server = match server_core {
        Some(c) => format!("pinned to core {c}"),
        None if cfg.pin => "unpinned (its topology names no cores near its GPU)".into(),
        None => "unpinned".into(),
    };
    Ok((
        GpuWriteReport {
            producer: producer.name(),
            publish: producer.publish(),
            ring_mcmds,
            lat_us: lat,
            lat_p50_us: lat_p50,
            lat_rounds: cfg.lat_iters.max(1),
            rounds,
            server_echo: if cfg.echo_ring { "ring" } else { "host" },
            bw_gbps: bw,
            verified: cfg.verify,
            server_checked,
            pinning: format!("client {pinning}; server {server}"),
        },
        region.expect("the region after the steps"),
    ))
}

/// The client's steps, (kind, size, WRITEs): per latency size, then per bandwidth size, the
/// two paths `rounds` times, alternating which goes first (host, proxy; then proxy, host), so
/// that a drift of the machine over the run lands on both paths alike.
pub(super) fn plan(cfg: &GpuWriteCfg) -> Vec<(GpuStepKind, usize, u64)> {
    let pairs = |host, proxy| {
        (0..cfg.rounds.max(1)).flat_map(move |r| {
            if r % 2 == 0 {
                [host, proxy]
            } else {
                [proxy, host]
            }
        })
    };
    let mut steps = Vec::new();
    for &size in &cfg.lat_sizes {
        for kind in pairs(GpuStepKind::HostLat, GpuStepKind::ProxyLat) {
            steps.push((kind, size, cfg.lat_iters.max(1)));
        }
    }
    for &size in &cfg.bw_sizes {
        // At most MAX_BW_WRITES a size: at 8 B, -n 2000's 512 MiB would be 64 M WRITEs
        // (minutes through shm), which the GPU host's first two-process run spent its time on.
        let n = (cfg.bw_bytes / size as u64).clamp(1, MAX_BW_WRITES);
        for kind in pairs(GpuStepKind::HostBw, GpuStepKind::ProxyBw) {
            steps.push((kind, size, n));
        }
    }
    steps
}

/// A step's figures: its kind, size, figure (us or Gbit/s) and, for latency, half the
/// median round trip.
pub(super) type Figure = (GpuStepKind, usize, f64, f64);

/// The rows of one kind of step (`host`: `HostLat` or `HostBw`, with its proxy twin), one per
/// size in the order the sizes ran, each with every round's pair. `figure` picks the figure.
pub(super) fn rows_of(
    figures: &[Figure],
    host: GpuStepKind,
    figure: impl Fn(&Figure) -> f64,
) -> Vec<Row> {
    let proxy = match host {
        GpuStepKind::HostLat => GpuStepKind::ProxyLat,
        _ => GpuStepKind::ProxyBw,
    };
    // Each size once, in the order they ran (`--sizes 8,4K,8` repeats one; its rounds join).
    let mut sizes: Vec<usize> = Vec::new();
    for f in figures.iter().filter(|f| f.0 == host) {
        if !sizes.contains(&f.1) {
            sizes.push(f.1);
        }
    }
    sizes
        .into_iter()
        .map(|size| {
            let of = |k| -> Vec<f64> {
                figures
                    .iter()
                    .filter(|f| f.0 == k && f.1 == size)
                    .map(&figure)
                    .collect()
            };
            Row::of_rounds(size, &of(proxy), &of(host))
        })
        .collect()
}

/// One step from the client's side: announce it, wait for the server, run it, take the
/// server's report, check the answers' bytes.
pub(super) fn client_step<T: Transport>(
    e: &mut End<'_, T>,
    mut region: T::Mr,
    step: &GpuStep,
    producer: &dyn Producer,
    cfg: &GpuWriteCfg,
    ctrl: &mut Ctrl,
) -> Result<(Rounds, GpuStepDone, T::Mr)> {
    let (at, len) = landing(step, false);
    if step.verify {
        zero(&mut region, at, len)?;
    }
    ctrl.send(&Msg::GpuStep(step.clone()))?;
    let wait = cfg.idle.max(Duration::from_secs(60));
    match ctrl.recv(wait, "the server to get ready")? {
        Msg::Ready { id } if id == step.id => {
            if cfg.verbose {
                eprintln!("rdma-bench: gpu-write step {id}: the server is ready");
            }
        }
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
        GpuStepKind::ProxyLat | GpuStepKind::ProxyBw => {
            client_proxy(e, region, step, producer, cfg.batch.max(1), cfg.verbose)?
        }
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
    let by_ring = answered_by_ring(step);
    if done.by_ring != by_ring {
        // A server that does not know `echo_ring` answers from a thread: its figures would
        // not be the ones asked for.
        return Err(Error::Protocol(format!(
            "gpu-write step {}: the server answered {}, asked {} (--server-echo; update the \
             server's rdma-bench)",
            step.id,
            if done.by_ring {
                "through its ring"
            } else {
                "from a thread"
            },
            if by_ring {
                "through its ring"
            } else {
                "from a thread"
            },
        )));
    }
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
