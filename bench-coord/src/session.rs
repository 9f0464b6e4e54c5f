//! Sessions: the client, the server (a thread per client), and loopback (both in one process,
//! over a TCP connection on 127.0.0.1, each side driven by its own threads).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use transport_core::{Completion, CompletionKind, LocalSlice, Transport};

use bench_core::buffers::{self, PageLayout};
use bench_core::config::{LatOp, Workload};
use bench_core::ctrl::{Ctrl, Watchdog, IO_TIMEOUT};
use bench_core::error::{Error, Result, TransportContext};
use bench_core::plan::{Plan, Planned};
use bench_core::proto::{Done, Hello, Msg, NicStats, Request, Welcome, MAGIC, VERSION};
use bench_core::report::{self, NicReport, Progress, RunReport};
use bench_core::side::{Side, SideCfg};
use bench_core::workload::lat::{one_way_stats, PingPong};
use bench_core::workload::send::{self, RecvNic, SendActive, SendParts};
use bench_core::workload::write::{self, WriteActive, WriteParts};
use bench_core::workload::{group, run_active};

/// How long a side waits for the other to prepare a run (allocate, fill, post receives).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(120);
/// Most receives the send workload keeps posted per NIC.
const MAX_RECV_DEPTH: u64 = 256;
/// Largest data region one side allocates per NIC.
const MAX_DATA: u64 = 1 << 36;
/// How long the control connection's watchdog lets the data path notice a departed peer on
/// its own. A data path that is not stuck sees it within a few loop turns (it reads the
/// liveness flag every few hundred); one that is still busy after this is inside a provider
/// call that does not return (libfabric 1.x shm, a peer killed holding a queue lock).
const WATCHDOG_GRACE: Duration = Duration::from_secs(2);
/// How long a failed transfer waits for the control connection to say whether the peer left
/// (a transfer error and the peer's departure arrive in either order).
const GONE_WAIT: Duration = Duration::from_secs(1);

/// The server's configuration.
#[derive(Clone, Debug)]
pub struct ServerCfg {
    pub side: SideCfg,
    pub max_mem: u64,
    pub session_timeout: Duration,
    pub max_sessions: usize,
    pub sessions: Option<u64>,
    /// Do not log sessions (loopback: the client reports).
    pub quiet: bool,
}

/// What one client command prints.
pub struct ClientOut {
    pub reports: Vec<RunReport>,
}

fn recv_depth(rx_depth: usize, total: u64) -> u64 {
    let d = if rx_depth == 0 { 64 } else { rx_depth as u64 };
    d.min(MAX_RECV_DEPTH).min(total).max(1)
}

/// Messages a send run moves per NIC over warm-up and timed phases, and the receive depth.
fn send_counts(p: &Planned, rx_depth: usize) -> (u64, u64, u64) {
    let depth0 = recv_depth(rx_depth, u64::MAX);
    let warm = u64::from(p.knobs.warmup).saturating_mul(depth0);
    let total = warm.saturating_add(p.iters);
    (warm, total, recv_depth(rx_depth, total))
}

/// Bytes of data region each NIC needs for the whole plan.
fn data_len<T: Transport>(plan: &Plan, side: &Side<T>) -> Result<usize> {
    let rx = side
        .eps
        .iter()
        .map(|e| e.caps().rx_depth)
        .min()
        .unwrap_or(0);
    let mut need = 0u64;
    for p in &plan.runs {
        let n = match plan.workload {
            // A slack page after the slots while verifying (`buffers::Versions`).
            Workload::Write | Workload::Rate => p
                .pages
                .checked_add(u64::from(plan.verify))
                .and_then(|n| n.checked_mul(p.size)),
            Workload::Send => send_counts(p, rx).2.checked_mul(p.size),
            Workload::Lat => p.size.checked_mul(2),
        };
        need = need.max(n.unwrap_or(u64::MAX));
    }
    if need > MAX_DATA {
        return Err(Error::Usage(format!(
            "the runs need {need} bytes per NIC (size x pages or depth); at most {MAX_DATA}"
        )));
    }
    Ok(need.max(64) as usize)
}

/// The size limit a run's operation has on NIC `i` of either side.
fn check_size<T: Transport>(plan: &Plan, side: &Side<T>, size: u64, peer: bool) -> Result<()> {
    let uses_write = match plan.workload {
        Workload::Write | Workload::Rate => true,
        Workload::Send => false,
        Workload::Lat => plan.op == LatOp::WriteImm,
    };
    let what = if uses_write { "WRITE" } else { "message" };
    for i in 0..side.eps.len() {
        let (limit, whose) = if peer {
            let r = &side.remote[i];
            (
                if uses_write {
                    r.max_write_size
                } else {
                    r.max_msg_size
                },
                "the server's",
            )
        } else {
            let c = side.caps(i);
            (
                if uses_write {
                    c.max_write_size
                } else {
                    c.max_msg_size
                } as u64,
                "this side's",
            )
        };
        if limit > 0 && size > limit {
            return Err(Error::Usage(format!(
                "size {size} is over {whose} largest {what} on NIC {i}: {limit} bytes ({} backend)",
                T::BACKEND
            )));
        }
    }
    Ok(())
}

/// Run every run of `plan` as a client over `stream`.
pub fn client<T: Transport>(
    cfg: &SideCfg,
    plan: &Plan,
    stream: TcpStream,
    json: bool,
) -> Result<ClientOut> {
    let mut ctrl = Ctrl::watched(stream, Some(Watchdog::Exit(WATCHDOG_GRACE)))?;
    // Every provider call from here on, closing the endpoints included, is under the
    // watchdog: one that does not return after the server died ends the process.
    let live = ctrl.liveness();
    let _busy = live.busy();
    let mut side = Side::<T>::open(cfg)?;
    for p in &plan.runs {
        check_size(plan, &side, p.size, false)?;
    }
    let len = data_len(plan, &side)?;
    side.register(cfg.mem, len)?;
    let hello = Hello {
        magic: MAGIC.into(),
        version: VERSION,
        backend: T::BACKEND.into(),
        provider: side.provider(),
        gpus: cfg.gpus.len() as u32,
        nics_per_gpu: cfg.nics_per_gpu as u32,
        mem: cfg.mem,
        nics: side.wire(),
    };
    ctrl.send(&Msg::Hello(hello))?;
    let welcome: Welcome = match ctrl.recv(PREPARE_TIMEOUT, "the server's welcome")? {
        Msg::Welcome(w) => w,
        m => {
            return Err(Error::Protocol(format!(
                "expected the server's welcome, got {}",
                m.kind()
            )))
        }
    };
    if let Some((i, n)) = welcome
        .nics
        .iter()
        .enumerate()
        .find(|(_, n)| (n.mrs[0].len as usize) < len)
    {
        return Err(Error::Protocol(format!(
            "the server's NIC {i} region holds {} bytes, {len} needed",
            n.mrs[0].len
        )));
    }
    side.connect(welcome.nics)?;
    // The server announced its endpoints before its welcome: take that in now.
    side.settle()?;
    for p in &plan.runs {
        check_size(plan, &side, p.size, true)?;
    }
    let mut reports = Vec::with_capacity(plan.runs.len());
    for (k, p) in plan.runs.iter().enumerate() {
        let r = run_one(&mut side, &mut ctrl, cfg, plan, p, k as u32, json)?;
        if cfg.verbose > 0 {
            eprintln!(
                "rdma-bench: run {k}{}: {:.2} Gbit/s, {:.3} Mops, knobs {:?}, server threads pinned to {:?}",
                p.stage.as_deref().map(|s| format!(" ({s})")).unwrap_or_default(),
                r.gbps,
                r.mops,
                r.knobs,
                r.cores
            );
        }
        reports.push(r);
    }
    let _ = ctrl.send(&Msg::Bye);
    Ok(ClientOut { reports })
}

fn request(plan: &Plan, p: &Planned, id: u32, count: u64, shifts: u64) -> Request {
    Request {
        verify: plan.verify,
        shifts,
        id,
        workload: plan.workload,
        size: p.size,
        count,
        iters: p.iters,
        seed: plan.seed,
        op: plan.op,
        knobs: p.knobs,
        imm_every: plan.imm_every,
    }
}

fn wait_ready(ctrl: &mut Ctrl, id: u32) -> Result<()> {
    match ctrl.recv(PREPARE_TIMEOUT, "the server to get ready")? {
        Msg::Ready { id: got } if got == id => Ok(()),
        m => Err(Error::Protocol(format!(
            "expected ready for run {id}, got {}",
            m.kind()
        ))),
    }
}

/// Poll every endpoint (progress is manual) until the peer's `Done` arrives.
fn wait_done_polling<T: Transport>(eps: &mut [T], ctrl: &mut Ctrl, idle: Duration) -> Result<Done> {
    let mut buf = vec![Completion::default(); 16];
    let start = Instant::now();
    let mut turns = 0u32;
    loop {
        for (i, ep) in eps.iter_mut().enumerate() {
            let n = ep.poll(&mut buf).ctx(|| format!("polling NIC {i}"))?;
            if let Some(c) = buf[..n]
                .iter()
                .find(|c| matches!(c.kind, CompletionKind::Error(_)))
            {
                return Err(Error::Protocol(format!(
                    "NIC {i}: error completion while waiting for the server: {:?}",
                    c.kind
                )));
            }
        }
        turns = turns.wrapping_add(1);
        if turns % 64 == 0 {
            match ctrl.try_recv()? {
                Some(Msg::Done(d)) => return Ok(d),
                Some(m) => {
                    return Err(Error::Protocol(format!(
                        "expected the server's done message, got {}",
                        m.kind()
                    )))
                }
                None => {}
            }
            if start.elapsed() > idle {
                return Err(Error::Timeout {
                    what: "the server's done message".into(),
                    after: idle,
                });
            }
        }
    }
}

fn run_one<T: Transport>(
    side: &mut Side<T>,
    ctrl: &mut Ctrl,
    cfg: &SideCfg,
    plan: &Plan,
    p: &Planned,
    id: u32,
    json: bool,
) -> Result<RunReport> {
    let live = ctrl.liveness();
    let _busy = live.busy();
    let nics = side.eps.len();
    let npg = side.npg;
    let used = if p.knobs.nic_groups { npg } else { 1 };
    let size = p.size as usize;
    let label = match &p.stage {
        Some(s) => format!("{} {s}", plan.workload),
        None => format!(
            "{} {}",
            plan.workload,
            bench_core::units::human_bytes(p.size)
        ),
    };
    let mut progress = Progress::new(label, json);
    let mut lat = None;
    let (done, verified) = match plan.workload {
        Workload::Write | Workload::Rate => {
            let layout = PageLayout {
                page_size: size,
                pages: p.pages,
                used,
            };
            let reps = u64::from(p.knobs.warmup) + p.iters;
            let mut expected = vec![0u64; nics];
            for (i, e) in expected.iter_mut().enumerate() {
                if layout.slots(i % npg) > 0 {
                    *e = reps;
                }
            }
            if plan.verify {
                for (i, mr) in side.data.iter_mut().enumerate() {
                    buffers::zero(mr, layout.slots(i % npg) as usize * size)?;
                }
            }
            // While verifying the server turns its source with the repeat, and each immediate
            // is checked as it arrives: no slot may still hold an older repeat's page.
            let vers: Vec<buffers::Versions> = (0..nics)
                .map(|i| {
                    if plan.verify {
                        buffers::Versions::new(size, layout.slots(i % npg), true)
                    } else {
                        buffers::Versions::none(size)
                    }
                })
                .collect();
            let shifts = vers.first().map_or(1, |v| v.shifts());
            let mut checks: Vec<Option<buffers::RepeatCheck>> = (0..nics)
                .map(|i| {
                    let on = plan.verify && layout.slots(i % npg) > 0;
                    on.then(|| {
                        let (g, j) = ((i / npg) as u64, i % npg);
                        buffers::RepeatCheck::new(&layout, vers[i], plan.seed, g, j, i)
                    })
                    .flatten()
                })
                .collect();
            ctrl.send(&Msg::Request(request(plan, p, id, p.pages, shifts)))?;
            wait_ready(ctrl, id)?;
            let data = &side.data;
            let mut on_imm = |i: usize, g: u64| match checks.get_mut(i) {
                Some(Some(c)) => c.check(&data[i], g),
                _ => Ok(()),
            };
            let mut done = write::wait_imms(
                &mut side.eps,
                &expected,
                ctrl,
                cfg.idle,
                &mut progress,
                &mut on_imm,
            )?;
            // The bytes are in place only once the GPU has run the copies the provider queued
            // (see buffers::gpu_drain): that wait is part of the run.
            done.seconds += buffers::gpu_drain(&side.data)?.as_secs_f64();
            if cfg.verbose > 0 {
                let (n, torn) = checks
                    .iter()
                    .flatten()
                    .fold((0, 0), |(a, b), c| (a + c.checked, b + c.torn));
                eprintln!(
                    "rdma-bench: {n} immediates checked on arrival ({torn} slot reads raced a \
                     landing WRITE); NICs without the check: {}",
                    checks.iter().filter(|c| c.is_none()).count()
                );
            }
            if plan.verify {
                for (i, mr) in side.data.iter().enumerate() {
                    let last = reps.saturating_sub(1);
                    buffers::verify_pages(
                        mr,
                        &layout,
                        plan.seed,
                        (i / npg) as u64,
                        i % npg,
                        i,
                        last,
                        &vers[i],
                    )?;
                }
            }
            (done, plan.verify)
        }
        Workload::Send => {
            let rx = side
                .eps
                .iter()
                .map(|e| e.caps().rx_depth)
                .min()
                .unwrap_or(0);
            let (_warm, total, depth) = send_counts(p, rx);
            if plan.verify {
                for mr in side.data.iter_mut() {
                    buffers::zero(mr, depth as usize * size)?;
                }
            }
            let done = {
                let mut rn: Vec<RecvNic<'_, T>> = Vec::with_capacity(nics);
                for (i, ((ep, data), c)) in side
                    .eps
                    .iter_mut()
                    .zip(side.data.iter())
                    .zip(side.ctrl.iter())
                    .enumerate()
                {
                    let t = if i % npg < used { total } else { 0 };
                    let mut r = RecvNic::new(
                        ep,
                        data,
                        c,
                        side.peers[i],
                        side.remote[i].mrs[1],
                        t,
                        depth,
                        size,
                    )
                    .single_buffer(plan.single_buffer);
                    r.prepost(i)?;
                    rn.push(r);
                }
                ctrl.send(&Msg::Request(request(plan, p, id, depth, 1)))?;
                wait_ready(ctrl, id)?;
                send::receive(&mut rn, ctrl, cfg.idle, &mut progress)?
            };
            if plan.verify {
                for (i, mr) in side.data.iter().enumerate() {
                    if i % npg < used {
                        let slots = if plan.single_buffer {
                            1
                        } else {
                            depth.min(total) as usize
                        };
                        buffers::verify_messages(mr, plan.seed, size, slots, i)?;
                    }
                }
            }
            (done, plan.verify)
        }
        Workload::Lat => {
            let warm = u64::from(p.knobs.warmup);
            let rtts = {
                let data = &side.data[0];
                let mut pp = PingPong {
                    ep: &mut side.eps[0],
                    peer: side.peers[0],
                    src: LocalSlice::new(data, 0, size).ctx(|| "ping buffer")?,
                    dst: LocalSlice::new(data, size, size).ctx(|| "pong buffer")?,
                    remote: side.remote[0].mrs[0]
                        .slice(0, p.size)
                        .ctx(|| "the server's region")?,
                    op: plan.op,
                };
                pp.prepare()?;
                ctrl.send(&Msg::Request(request(plan, p, id, 1, 1)))?;
                wait_ready(ctrl, id)?;
                pp.ping(warm, p.iters, &ctrl.liveness(), cfg.idle, &mut progress)?
            };
            let done = wait_done_polling(&mut side.eps, ctrl, cfg.idle)?;
            lat = Some(rtts);
            (done, false)
        }
    };
    progress.finish();
    if done.id != id {
        return Err(Error::Protocol(format!(
            "the server finished run {} while this side ran {id}",
            done.id
        )));
    }
    build_report(side, cfg, plan, p, &done, verified, lat)
}

fn build_report<T: Transport>(
    side: &Side<T>,
    cfg: &SideCfg,
    plan: &Plan,
    p: &Planned,
    done: &Done,
    verified: bool,
    lat: Option<Vec<u64>>,
) -> Result<RunReport> {
    let nics = side.eps.len();
    let mut r = RunReport {
        workload: plan.workload.name().into(),
        backend: T::BACKEND.into(),
        provider: side.provider(),
        stage: p.stage.clone(),
        mem: cfg.mem.to_string(),
        gpus: cfg.gpus.clone(),
        nics,
        size: p.size,
        ops: done.ops,
        bytes: done.bytes,
        seconds: done.seconds,
        gbps: report::gbps(done.bytes, done.seconds),
        mops: report::mops(done.ops, done.seconds),
        line_rate_gbps: None,
        pct_line_rate: None,
        verified,
        knobs: p.knobs,
        cores: done.cores.clone(),
        per_nic: Vec::new(),
        op: None,
        min_us: None,
        p50_us: None,
        p99_us: None,
        max_us: None,
        rounds: Vec::new(),
    };
    if let Some(mut rtts) = lat {
        let secs = rtts.iter().sum::<u64>() as f64 / 1e9;
        r.ops = rtts.len() as u64;
        r.bytes = r.ops * p.size * 2;
        r.seconds = secs;
        r.gbps = report::gbps(r.bytes, secs);
        r.mops = report::mops(r.ops, secs);
        r.op = Some(plan.op.to_string());
        if let Some((a, b, c, d)) = one_way_stats(&mut rtts) {
            (r.min_us, r.p50_us, r.p99_us, r.max_us) = (Some(a), Some(b), Some(c), Some(d));
        }
        return Ok(r);
    }
    if done.per_nic.len() != nics {
        return Err(Error::Protocol(format!(
            "the server reported {} NICs, this side has {nics}",
            done.per_nic.len()
        )));
    }
    let mut line = Some(0.0);
    for (i, st) in done.per_nic.iter().enumerate() {
        if st.ops == 0 {
            continue;
        }
        let link = side.caps(i).link_gbps;
        line = match (line, link) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        let g = report::gbps(st.bytes, st.seconds);
        r.per_nic.push(NicReport {
            index: i,
            gpu: side.gpu_of(i),
            nic: side.eps[i].nic_name().to_string(),
            bytes: st.bytes,
            ops: st.ops,
            seconds: st.seconds,
            gbps: g,
            link_gbps: link,
            pct_line_rate: report::pct(g, link),
        });
    }
    r.line_rate_gbps = line.filter(|&l| l > 0.0);
    r.pct_line_rate = report::pct(r.gbps, r.line_rate_gbps);
    Ok(r)
}

// ---------------------------------------------------------------------------------------
// Server

/// Serve clients until `cfg.sessions` have been served (forever without it).
pub fn serve<T: Transport>(cfg: &ServerCfg, listen: &str) -> Result<()> {
    let listener = TcpListener::bind(listen).ctx(|| format!("listening on {listen}"))?;
    let addr = listener
        .local_addr()
        .ctx(|| "reading the listening address")?;
    println!(
        "rdma-bench server: listening on {addr} ({} backend{})",
        T::BACKEND,
        cfg.side
            .provider
            .as_deref()
            .map(|p| format!(", provider {p}"))
            .unwrap_or_default()
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
    std::thread::scope(|s| {
        let mut served = 0u64;
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
            let active = &active;
            let spawned = std::thread::Builder::new()
                .name(format!("session-{id}"))
                .spawn_scoped(s, move || {
                    let t0 = Instant::now();
                    if !cfg.quiet {
                        eprintln!("rdma-bench server: session {id} from {peer}: started");
                    }
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| session::<T>(cfg, stream)))
                        .unwrap_or_else(|_| Err(Error::Protocol("the session panicked".into())));
                    if !cfg.quiet {
                        match &r {
                            Ok(n) => eprintln!(
                                "rdma-bench server: session {id} from {peer}: done, {n} run(s) in {:.1} s",
                                t0.elapsed().as_secs_f64()
                            ),
                            Err(e) => eprintln!("rdma-bench server: session {id} from {peer}: {e}"),
                        }
                    }
                    active.fetch_sub(1, Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                eprintln!("rdma-bench server: cannot start a session thread: {e}");
                active.fetch_sub(1, Ordering::AcqRel);
            }
            served += 1;
            if cfg.sessions.is_some_and(|n| served >= n) {
                break;
            }
        }
    });
    Ok(())
}

/// One client session; returns the number of runs served.
pub fn session<T: Transport>(cfg: &ServerCfg, stream: TcpStream) -> Result<u64> {
    let mut ctrl = Ctrl::watched(stream, Some(Watchdog::Warn(WATCHDOG_GRACE)))?;
    let r = session_inner::<T>(cfg, &mut ctrl).map_err(|e| peer_gone_cause(e, &ctrl));
    if let Err(e) = &r {
        if !matches!(e, Error::PeerGone(_) | Error::Refused(_)) {
            ctrl.send_error(&format!("server: {e}"));
        }
    }
    r
}

/// A transfer that failed because the peer left (an error completion for a WRITE into a
/// process that is gone) is reported as the peer's departure, with the provider's error.
fn peer_gone_cause(e: Error, ctrl: &Ctrl) -> Error {
    if !matches!(e, Error::Transport { .. }) {
        return e;
    }
    let live = ctrl.liveness();
    let start = Instant::now();
    while !live.gone() && start.elapsed() < GONE_WAIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    if live.gone() {
        Error::PeerGone(format!("the client is gone; the transfer failed with: {e}"))
    } else {
        e
    }
}

fn session_inner<T: Transport>(cfg: &ServerCfg, ctrl: &mut Ctrl) -> Result<u64> {
    let hello = match ctrl.recv(IO_TIMEOUT, "the client's hello")? {
        Msg::Hello(h) => h,
        m => {
            return Err(Error::Protocol(format!(
                "expected a hello, got {}",
                m.kind()
            )))
        }
    };
    if hello.backend != T::BACKEND {
        return Err(Error::Protocol(format!(
            "backend mismatch: the client uses {}, this server runs {}",
            hello.backend,
            T::BACKEND
        )));
    }
    let (gpus, npg) = (cfg.side.gpus.len(), cfg.side.nics_per_gpu);
    if hello.gpus as usize != gpus || hello.nics_per_gpu as usize != npg {
        return Err(Error::Protocol(format!(
            "layout mismatch: the client uses {} GPU(s) x {} NIC(s), this server {gpus} x {npg}; give both the same number of --gpus and --nics-per-gpu",
            hello.gpus, hello.nics_per_gpu
        )));
    }
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
    let mut side = Side::<T>::open(&cfg.side)?;
    if T::BACKEND == "efa" && side.provider() != hello.provider {
        return Err(Error::Protocol(format!(
            "provider mismatch: the client uses {}, this server {}",
            hello.provider,
            side.provider()
        )));
    }
    side.register(cfg.side.mem, want.max(64) as usize)?;
    let wire = side.wire();
    side.connect(hello.nics)?;
    ctrl.send(&Msg::Welcome(Welcome {
        magic: MAGIC.into(),
        version: VERSION,
        mem: cfg.side.mem,
        nics: wire,
    }))?;
    let mut runs = 0;
    loop {
        match ctrl.recv(cfg.session_timeout, "the client's next request")? {
            Msg::Request(r) => {
                if runs == 0 {
                    // The client announced its endpoints before its first request.
                    side.settle()?;
                }
                let done = serve_request(&mut side, ctrl, cfg, &r)?;
                ctrl.send(&Msg::Done(done))?;
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
    let uses_write = match r.workload {
        Workload::Write | Workload::Rate => true,
        Workload::Send => false,
        Workload::Lat => r.op == LatOp::WriteImm,
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
                        max_inflight: c.tx_depth.max(1),
                        ep,
                        src,
                        peer: side.peers[i],
                        remote: side.remote[i].mrs[0],
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
                        max_inflight: c.tx_depth.max(1),
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
            let data = &side.data[0];
            let mut pp = PingPong {
                ep: &mut side.eps[0],
                peer: side.peers[0],
                src: LocalSlice::new(data, size, size).ctx(|| "pong buffer")?,
                dst: LocalSlice::new(data, 0, size).ctx(|| "ping buffer")?,
                remote: side.remote[0].mrs[0]
                    .slice(r.size, r.size)
                    .ctx(|| "the client's region")?,
                op: r.op,
            };
            pp.prepare()?;
            ctrl.send(&Msg::Ready { id: r.id })?;
            pp.pong(warm + r.iters, &live, idle)?;
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
        self.map_or(true, |v| v > limit)
    }
}

// ---------------------------------------------------------------------------------------
// Client connection and loopback

/// Connect to `addr`, retrying until `timeout` passes.
pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStream> {
    let start = Instant::now();
    let mut last: Option<String> = None;
    loop {
        let addrs: Vec<SocketAddr> = match addr.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                return Err(Error::Usage(format!(
                    "cannot resolve server address {addr}: {e}"
                )))
            }
        };
        for a in &addrs {
            let left = timeout
                .saturating_sub(start.elapsed())
                .max(Duration::from_millis(100));
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e.to_string()),
            }
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what: format!(
                    "the server at {addr} ({}); is `rdma-bench server` running there?",
                    last.unwrap_or_else(|| "no address".into())
                ),
                after: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Both sides in this process: a one-session server in a thread, the client in this one.
pub fn loopback<T: Transport>(
    client_cfg: &SideCfg,
    server_cfg: &ServerCfg,
    plan: &Plan,
    json: bool,
) -> Result<ClientOut> {
    let listener = TcpListener::bind("127.0.0.1:0").ctx(|| "binding 127.0.0.1")?;
    let addr = listener
        .local_addr()
        .ctx(|| "reading the loopback address")?;
    listener
        .set_nonblocking(true)
        .ctx(|| "making the loopback listener non-blocking")?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let server = s.spawn(|| -> Result<u64> {
            let start = Instant::now();
            let stream = loop {
                match listener.accept() {
                    Ok((st, _)) => break st,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if stop.load(Ordering::Relaxed) {
                            return Ok(0);
                        }
                        if start.elapsed() > PREPARE_TIMEOUT {
                            return Err(Error::Timeout {
                                what: "the loopback client to connect".into(),
                                after: PREPARE_TIMEOUT,
                            });
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        return Err(Error::Io {
                            what: "accepting the loopback client".into(),
                            source: e,
                        })
                    }
                }
            };
            stream
                .set_nonblocking(false)
                .ctx(|| "configuring the loopback connection")?;
            session::<T>(server_cfg, stream)
        });
        let client = connect(&addr.to_string(), Duration::from_secs(5))
            .and_then(|st| client::<T>(client_cfg, plan, st, json));
        stop.store(true, Ordering::Relaxed);
        let server = server.join().unwrap_or_else(|_| {
            Err(Error::Protocol(
                "the loopback server thread panicked".into(),
            ))
        });
        match (client, server) {
            (Ok(c), Ok(_)) => Ok(c),
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e),
        }
    })
}
