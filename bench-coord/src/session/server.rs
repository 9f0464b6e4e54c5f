//! The server side: listens, runs one session per client (each in its own thread), checks the
//! client's hello, and serves each of its runs as the active side.

use std::net::{TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use transport_core::{LocalSlice, Transport};

use bench_core::buffers::{self, PageLayout};
use bench_core::config::{LatOp, Workload};
use bench_core::ctrl::{abandon, Ctrl, CtrlOpts, Liveness, Watchdog};
use bench_core::error::{Error, Result, TransportContext};
use bench_core::proto::{Done, Msg, NicStats, Request, Welcome, MAGIC, VERSION};
use bench_core::side::Side;
use bench_core::workload::lat::PingPong;
use bench_core::workload::send::{SendActive, SendParts};
use bench_core::workload::write::{WriteActive, WriteParts};
use bench_core::workload::{group, run_active};

use super::layout::{layout_line, regions_line, session_side, ServerCfg};
use super::timeouts::{peer_gone_cause, PREPARE_TIMEOUT, WATCHDOG_GRACE};

/// Serve clients until `cfg.sessions` have been served (forever without it).
pub fn serve<T: Transport>(cfg: &ServerCfg, listen: &str) -> Result<()> {
    let listener = TcpListener::bind(listen)
        .ctx(|| format!("listening on {listen} (--listen takes ADDR:PORT, e.g. 0.0.0.0:7471)"))?;
    let addr = listener
        .local_addr()
        .ctx(|| "reading the listening address")?;
    println!(
        "rdma-bench server: listening on {addr} ({} backend{}); serving {}",
        T::BACKEND,
        cfg.side
            .provider
            .as_deref()
            .map(|p| format!(", provider {p}"))
            .unwrap_or_default(),
        layout_line(cfg)
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    accept_loop::<T>(cfg, &listener, &AtomicBool::new(false))
}

fn accept_loop<T: Transport>(
    cfg: &ServerCfg,
    listener: &TcpListener,
    stop: &AtomicBool,
) -> Result<()> {
    let active = AtomicUsize::new(0);
    let next_id = AtomicU64::new(0);
    // Sessions that ended in an error: a server that serves a set number of them exits
    // non-zero if any did (a script's `server --sessions 1` must see its client's failure).
    let failed = AtomicU64::new(0);
    std::thread::scope(|s| {
        let mut served = 0u64;
        // Each session's liveness and whether it ended: the scope would wait for ever on a
        // session the watchdog abandoned.
        let mut sessions: Vec<(Liveness, Arc<AtomicBool>)> = Vec::new();
        for conn in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let stream = match conn {
                Ok(st) => st,
                Err(e) => {
                    eprintln!("rdma-bench server: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            if active.load(Ordering::Acquire) >= cfg.max_sessions {
                eprintln!(
                    "rdma-bench server: {peer}: refused, {} sessions running",
                    cfg.max_sessions
                );
                let max = cfg.max_sessions;
                s.spawn(move || {
                    if let Ok(mut c) = Ctrl::new(stream) {
                        c.send_error(&format!(
                            "server: busy, {max} sessions running (--max-sessions); try again later"
                        ));
                    }
                });
                continue;
            }
            active.fetch_add(1, Ordering::AcqRel);
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            let (active, failed) = (&active, &failed);
            sessions.retain(|(_, ended)| !ended.load(Ordering::Acquire));
            let (live, ended) = (Liveness::default(), Arc::new(AtomicBool::new(false)));
            sessions.push((live.clone(), ended.clone()));
            let spawned = std::thread::Builder::new()
                .name(format!("session-{id}"))
                .spawn_scoped(s, move || {
                    let t0 = Instant::now();
                    let label = format!("session {id} from {peer}");
                    if !cfg.quiet {
                        eprintln!("rdma-bench server: {label}: started");
                    }
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        session::<T>(cfg, stream, &label, live)
                    }))
                    .unwrap_or_else(|_| Err(Error::Protocol("the session panicked".into())));
                    if r.is_err() {
                        failed.fetch_add(1, Ordering::AcqRel);
                    }
                    if !cfg.quiet {
                        match &r {
                            Ok(n) => eprintln!(
                                "rdma-bench server: {label}: done, {n} run(s) in {:.1} s",
                                t0.elapsed().as_secs_f64()
                            ),
                            Err(e) => eprintln!("rdma-bench server: {label}: {e}"),
                        }
                    }
                    active.fetch_sub(1, Ordering::AcqRel);
                    ended.store(true, Ordering::Release);
                });
            if let Err(e) = spawned {
                eprintln!("rdma-bench server: cannot start a session thread: {e}");
                active.fetch_sub(1, Ordering::AcqRel);
                sessions.pop();
            }
            served += 1;
            if cfg.sessions.is_some_and(|n| served >= n) {
                break;
            }
        }
        // Wait for the sessions still running, but not for ever on those that are stuck.
        loop {
            match left(&sessions) {
                Left::None => break,
                Left::Running => std::thread::sleep(Duration::from_millis(100)),
                Left::Stuck(n) => {
                    eprintln!(
                        "rdma-bench server: served {served} session(s); {n} of them stuck \
                         inside a provider call after their clients went (above): exiting \
                         without closing their endpoints"
                    );
                    abandon(1);
                }
            }
        }
        let failed = failed.load(Ordering::Acquire);
        if failed > 0 && cfg.sessions.is_some() {
            return Err(Error::Protocol(format!(
                "served {served} session(s); {failed} of them failed (above)"
            )));
        }
        Ok(())
    })
}

/// What is left of the sessions when the server is done accepting.
#[derive(Debug, PartialEq, Eq)]
enum Left {
    /// Every session ended.
    None,
    /// Some session still runs (and may end).
    Running,
    /// Every session still there was abandoned by its watchdog: this many.
    Stuck(usize),
}

fn left(sessions: &[(Liveness, Arc<AtomicBool>)]) -> Left {
    let mut stuck = 0;
    for (live, ended) in sessions {
        if ended.load(Ordering::Acquire) {
            continue;
        }
        if !live.abandoned() {
            return Left::Running;
        }
        stuck += 1;
    }
    if stuck == 0 {
        Left::None
    } else {
        Left::Stuck(stuck)
    }
}

/// One client session; returns the number of runs served. `label` names it where its
/// watchdog abandons it ("session 3 from ADDR").
/// `live` is the session's liveness flag: the caller keeps a clone to learn whether the
/// watchdog abandoned it.
pub fn session<T: Transport>(
    cfg: &ServerCfg,
    stream: TcpStream,
    label: &str,
    live: Liveness,
) -> Result<u64> {
    let mut ctrl = Ctrl::with(
        stream,
        CtrlOpts {
            watchdog: Some(Watchdog::Warn(WATCHDOG_GRACE)),
            live: Some(live),
            label: Some(label.to_string()),
            ..CtrlOpts::default()
        },
    )?;
    let r = session_inner::<T>(cfg, &mut ctrl).map_err(|e| peer_gone_cause(e, &ctrl, "the client"));
    if let Err(e) = &r {
        if !matches!(e, Error::PeerGone(_) | Error::Refused(_)) {
            ctrl.send_error(&format!("server: {e}"));
        }
    }
    r
}

fn session_inner<T: Transport>(cfg: &ServerCfg, ctrl: &mut Ctrl) -> Result<u64> {
    // The client opens and registers every NIC before its hello (32 on a p5): it prepares,
    // as the server does before its welcome, which the client waits PREPARE_TIMEOUT for.
    let hello = match ctrl.recv(PREPARE_TIMEOUT, "the client's hello")? {
        Msg::Hello(h) => h,
        m => {
            return Err(Error::Protocol(format!(
                "expected a hello, got {}",
                m.kind()
            )))
        }
    };
    // By name or by an alias (a renamed backend still meets a client that uses its old name).
    if !T::INFO.answers_to(&hello.backend) {
        return Err(Error::Protocol(format!(
            "backend mismatch: the client uses {}, this server runs {}",
            hello.backend,
            T::BACKEND
        )));
    }
    // The client's layout, within what this node has and its operator fixed.
    let scfg = session_side(cfg, &hello)?;
    let want = hello.nics.iter().map(|n| n.mrs[0].len).max().unwrap_or(0);
    if want > cfg.max_mem {
        return Err(Error::Protocol(format!(
            "the client needs {want} bytes per NIC, over this server's --max-mem {}",
            cfg.max_mem
        )));
    }
    // A provider call that does not return after the client died is reported (the session
    // is then lost, the server goes on); the transfers are not the only such calls.
    let live = ctrl.liveness();
    let _busy = live.busy();
    let mut side = Side::<T>::open(&scfg)?;
    let r = serve_session(&mut side, cfg, &scfg, hello, want, ctrl);
    if let Err(e) = &r {
        // The endpoints close next, perhaps with WRITEs to a client that stopped; a client
        // still there is told first (see the client's).
        if !matches!(e, Error::PeerGone(_) | Error::Refused(_)) {
            ctrl.send_error(&format!("server: {e}"));
        }
        ctrl.watch_teardown(&e.to_string());
    }
    r
}

/// The session on the server's opened endpoints: regions, welcome, every request until the
/// client's goodbye; the runs served.
fn serve_session<T: Transport>(
    side: &mut Side<T>,
    cfg: &ServerCfg,
    scfg: &bench_core::side::SideCfg,
    hello: bench_core::proto::Hello,
    want: u64,
    ctrl: &mut Ctrl,
) -> Result<u64> {
    // A backend with providers runs both sides over the same one.
    if T::INFO.provider.is_some() && side.provider() != hello.provider {
        return Err(Error::Protocol(format!(
            "provider mismatch: the client uses {}, this server {}",
            hello.provider,
            side.provider()
        )));
    }
    side.register(scfg.mem, want.max(64) as usize, scfg.buf_offset)?;
    if scfg.verbose > 0 {
        eprintln!("rdma-bench: {}", regions_line(side, scfg.mem, want));
    }
    let wire = side.wire();
    side.connect(hello.nics)?;
    // Read once the client's endpoints are added: a backend may decide per peer (UCX's
    // write=auto), and the record says what it decided.
    let facts = side
        .runtime()
        .map(|r| Box::new(scfg.facts.with_backend(Some(r))));
    ctrl.send(&Msg::Welcome(Welcome {
        magic: MAGIC.into(),
        version: VERSION,
        mem: scfg.mem,
        nics: wire,
        facts,
    }))?;
    let mut runs = 0;
    loop {
        match ctrl.recv(cfg.session_timeout, "the client's next request")? {
            Msg::Request(r) => {
                if runs == 0 {
                    // The client announced its endpoints before its first request.
                    side.settle()?;
                }
                let done = serve_request(side, ctrl, cfg, &r)?;
                ctrl.send(&Msg::Done(done))?;
                runs += 1;
            }
            Msg::GpuStep(g) => {
                if runs == 0 {
                    side.settle()?;
                }
                let done = super::gpu_write::serve_gpu_step(side, ctrl, cfg, &g)?;
                ctrl.send(&Msg::GpuStepDone(done))?;
                runs += 1;
            }
            Msg::Bye => return Ok(runs),
            m => {
                return Err(Error::Protocol(format!(
                    "expected a request, got {}",
                    m.kind()
                )))
            }
        }
    }
}

fn serve_request<T: Transport>(
    side: &mut Side<T>,
    ctrl: &mut Ctrl,
    cfg: &ServerCfg,
    r: &Request,
) -> Result<Done> {
    let nics = side.eps.len();
    let npg = side.npg;
    let used = if r.knobs.nic_groups { npg } else { 1 };
    let size = usize::try_from(r.size).map_err(|_| Error::Protocol("size too large".into()))?;
    let own_len = side
        .data
        .first()
        .map_or(0, transport_core::MemoryRegion::len) as u64;
    let peer_len = side.remote.iter().map(|n| n.mrs[0].len).min().unwrap_or(0);
    let region = own_len.min(peer_len);
    let uses_write =
        match r.workload {
            Workload::Write | Workload::Rate => true,
            Workload::Send => false,
            Workload::Lat => r.op == LatOp::WriteImm,
            Workload::GpuWrite => return Err(Error::Protocol(
                "a client asked for gpu-write in a run request: gpu-write runs in steps of its own"
                    .into(),
            )),
        };
    for i in 0..nics {
        let c = side.caps(i);
        let limit = if uses_write {
            c.max_write_size
        } else {
            c.max_msg_size
        } as u64;
        if limit > 0 && r.size > limit {
            return Err(Error::Protocol(format!(
                "size {} is over this server's largest {} on NIC {i}: {limit} bytes",
                r.size,
                if uses_write { "WRITE" } else { "message" }
            )));
        }
    }
    let live = ctrl.liveness();
    let _busy = live.busy();
    let idle = cfg.side.idle;
    let hints = cfg.side.hints.as_ref();
    let knobs = r.knobs;
    let warm = u64::from(knobs.warmup);
    let mut done = Done {
        id: r.id,
        ..Done::default()
    };
    let out = match r.workload {
        Workload::GpuWrite => {
            return Err(Error::Protocol(
                "gpu-write runs in steps of its own, not run requests".into(),
            ))
        }
        Workload::Write | Workload::Rate => {
            let layout = PageLayout {
                page_size: size,
                pages: r.count,
                used,
            };
            let need = layout.slots(0).checked_mul(r.size);
            if r.count > u64::from(u32::MAX) || need.exceeds(region) {
                return Err(Error::Protocol(format!(
                    "{} pages of {} bytes do not fit the {region}-byte regions",
                    r.count, r.size
                )));
            }
            let mut slots = Vec::with_capacity(nics);
            let mut vers = Vec::with_capacity(nics);
            for i in 0..nics {
                let (g, j) = (i / npg, i % npg);
                // A client that checks bytes gets a source that turns with the repeat, with the
                // slack page it sized the regions for (`buffers::Versions`).
                let ver = if r.verify && j < used {
                    let v = buffers::Versions::new(size, layout.slots(j), r.shifts > 1);
                    if v.slots() > 1 && v.shifts() != r.shifts {
                        return Err(Error::Protocol(format!(
                            "the client asks for {} source shifts of {size}-byte pages; this \
                             server makes {}",
                            r.shifts,
                            v.shifts()
                        )));
                    }
                    if r.shifts > 1 && (layout.slots(j) as usize + 1) * size > region as usize {
                        return Err(Error::Protocol(format!(
                            "{} pages of {size} bytes and a slack page do not fit the \
                             {region}-byte regions",
                            layout.slots(j)
                        )));
                    }
                    v
                } else {
                    buffers::Versions::none(size)
                };
                vers.push(ver);
                if j < used {
                    buffers::fill_pages(&mut side.data[i], &layout, r.seed, g as u64, j)?;
                }
                let order = if j < used {
                    layout.post_order(r.seed, g as u64, j)
                } else {
                    Vec::new()
                };
                // --imm-every K: the page set K times over before the immediate.
                let order: Vec<u32> = order.into_iter().map(|p| p / used as u32).collect();
                slots.push(order.repeat(r.imm_every as usize));
            }
            let per_rep: u64 = slots.iter().map(|s| s.len() as u64).sum();
            ctrl.send(&Msg::Ready { id: r.id })?;
            let parts: Vec<WriteParts<'_, T>> = side
                .eps
                .iter_mut()
                .zip(side.data.iter_mut())
                .zip(slots)
                .enumerate()
                .map(|(i, ((ep, src), slots))| {
                    let c = ep.caps();
                    WriteParts {
                        nic: i,
                        max_inflight: knobs.in_flight(c.tx_depth),
                        ep,
                        src,
                        peer: side.peers[i],
                        remote: side.imported[i][0],
                        slots,
                        ver: vers[i],
                        page_size: size,
                        batch: knobs.batch as usize,
                    }
                })
                .collect();
            let groups = group(parts, &side.gpus, npg, knobs.threads);
            run_active(
                groups,
                nics,
                &knobs,
                warm,
                r.iters,
                |it| it.saturating_mul(per_rep),
                &live,
                idle,
                hints,
                WriteActive::new,
            )?
        }
        Workload::Send => {
            let depth = r.count;
            if r.size > own_len {
                return Err(Error::Protocol(format!(
                    "messages of {} bytes do not fit the {own_len}-byte region",
                    r.size
                )));
            }
            let warm_msgs = warm.saturating_mul(depth);
            let total = warm_msgs.saturating_add(r.iters);
            for i in 0..nics {
                if i % npg < used {
                    buffers::fill_messages(&mut side.data[i], r.seed, size, 1)?;
                }
            }
            ctrl.send(&Msg::Ready { id: r.id })?;
            let parts: Vec<SendParts<'_, T>> = side
                .eps
                .iter_mut()
                .zip(side.data.iter_mut())
                .enumerate()
                .filter(|(i, _)| i % npg < used)
                .map(|(i, (ep, src))| {
                    let c = ep.caps();
                    SendParts {
                        nic: i,
                        max_inflight: knobs.in_flight(c.tx_depth),
                        ep,
                        src,
                        peer: side.peers[i],
                        size,
                        initial_credits: depth,
                        total,
                    }
                })
                .collect();
            let n_used = parts.len() as u64;
            // Groups by GPU: parts of NIC i sit at position (i / npg) * used + (i % npg).
            let groups = group(parts, &side.gpus, used, knobs.threads);
            run_active(
                groups,
                nics,
                &knobs,
                warm_msgs,
                r.iters,
                |it| it.saturating_mul(n_used),
                &live,
                idle,
                hints,
                SendActive::new,
            )?
        }
        Workload::Lat => {
            if r.size.checked_mul(2).exceeds(region) {
                return Err(Error::Protocol(format!(
                    "latency messages of {} bytes do not fit the {region}-byte regions",
                    r.size
                )));
            }
            buffers::fill_lat(&mut side.data[0], r.seed, size, size, 0)?;
            let data = &side.data[0];
            let mut pp = PingPong {
                ep: &mut side.eps[0],
                peer: side.peers[0],
                src: LocalSlice::new(data, size, size).ctx(|| "pong buffer")?,
                dst: LocalSlice::new(data, 0, size).ctx(|| "ping buffer")?,
                remote: side.imported[0][0]
                    .slice(r.size, r.size)
                    .ctx(|| "the client's region")?,
                op: r.op,
            };
            pp.prepare(warm + r.iters)?;
            ctrl.send(&Msg::Ready { id: r.id })?;
            pp.pong(warm + r.iters, &live, idle)?;
            buffers::verify_lat(&side.data[0], r.seed, size, 0)?;
            Default::default()
        }
    };
    done.seconds = out.seconds;
    done.bytes = out.bytes;
    done.ops = out.ops;
    done.per_nic = if out.per_nic.is_empty() {
        vec![NicStats::default(); nics]
    } else {
        out.per_nic
    };
    done.cores = out.cores;
    Ok(done)
}

/// `None` (an overflow) or a value over `limit`.
trait Exceeds {
    fn exceeds(self, limit: u64) -> bool;
}
impl Exceeds for Option<u64> {
    fn exceeds(self, limit: u64) -> bool {
        self.is_none_or(|v| v > limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session whose client went while its data path was busy, as the watchdog sees it.
    fn abandoned_session() -> (Liveness, Ctrl) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server_end, _) = l.accept().unwrap();
        let live = Liveness::default();
        let ctrl = Ctrl::with(
            server_end,
            CtrlOpts {
                watchdog: Some(Watchdog::Warn(Duration::from_millis(50))),
                live: Some(live.clone()),
                label: Some("test session".into()),
                ..CtrlOpts::default()
            },
        )
        .unwrap();
        let busy = live.busy();
        drop(client);
        let start = Instant::now();
        while !live.abandoned() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Stuck for good, as far as the server can tell: the guard is never dropped.
        std::mem::forget(busy);
        (live, ctrl)
    }

    /// `--sessions N` ends the server once its sessions end; one its watchdog abandoned never
    /// will, and the server exits rather than wait for it for ever.
    #[test]
    fn the_server_waits_for_running_sessions_not_stuck_ones() {
        let (stuck, _keep) = abandoned_session();
        assert!(stuck.abandoned());
        let flag = |b: bool| Arc::new(AtomicBool::new(b));
        let running = Liveness::default();
        assert_eq!(left(&[]), Left::None);
        assert_eq!(left(&[(running.clone(), flag(true))]), Left::None);
        assert_eq!(left(&[(stuck.clone(), flag(true))]), Left::None);
        assert_eq!(
            left(&[(stuck.clone(), flag(false)), (running.clone(), flag(false))]),
            Left::Running
        );
        assert_eq!(
            left(&[(stuck.clone(), flag(false)), (running, flag(true))]),
            Left::Stuck(1)
        );
    }
}
