//! The client side of a session: sizes this side's regions for the plan, greets the server,
//! and runs each run of the plan against it; and [`connect`], how a client reaches a server.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use transport_core::{Completion, CompletionKind, LocalSlice, Transport};

use bench_core::buffers::{self, PageLayout};
use bench_core::config::{LatOp, Workload};
use bench_core::ctrl::{Ctrl, Watchdog};
use bench_core::error::{Error, Result, TransportContext};
use bench_core::plan::{Plan, Planned};
use bench_core::proto::{Done, Hello, Msg, Welcome, MAGIC, VERSION};
use bench_core::record::Facts;
use bench_core::report::{Progress, RunReport};
use bench_core::side::{Side, SideCfg};
use bench_core::workload::lat::PingPong;
use bench_core::workload::send::{self, RecvNic};
use bench_core::workload::write;

use super::layout::regions_line;
use super::report::build_report;
use super::timeouts::{peer_gone_cause, PREPARE_TIMEOUT, WATCHDOG_GRACE};

/// Largest data region one side allocates per NIC.
const MAX_DATA: u64 = 1 << 36;

/// What one client command prints.
pub struct ClientOut {
    pub reports: Vec<RunReport>,
    /// This side's run-record facts (`SideCfg::facts`, with the backend's runtime facts).
    pub facts: Facts,
    /// The server's, as its welcome said (`None` from a server that sends none).
    pub peer: Option<Facts>,
}

/// Messages a send run moves per NIC over warm-up and timed phases, and the receive depth.
fn send_counts(p: &Planned, rx_depth: usize) -> (u64, u64, u64) {
    let depth0 = send::recv_depth(rx_depth, p.size, u64::MAX);
    let warm = u64::from(p.knobs.warmup).saturating_mul(depth0);
    let total = warm.saturating_add(p.iters);
    (warm, total, send::recv_depth(rx_depth, p.size, total))
}

/// The shallowest receive queue of this side's NICs (0 without NICs).
fn min_rx_depth<T: Transport>(side: &Side<T>) -> usize {
    side.eps
        .iter()
        .map(|e| e.caps().rx_depth)
        .min()
        .unwrap_or(0)
}

/// Bytes of data region each NIC needs for the whole plan.
fn data_len<T: Transport>(plan: &Plan, side: &Side<T>) -> Result<usize> {
    let rx = min_rx_depth(side);
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
            Workload::GpuWrite => return Err(gpu_write_loopback_only()),
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
        Workload::GpuWrite => return Err(gpu_write_loopback_only()),
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
    // A transfer that fails because the server died names the server (the provider may see
    // the connection go before the control connection does).
    client_inner::<T>(cfg, plan, &mut ctrl, json)
        .map_err(|e| peer_gone_cause(e, &ctrl, "the server"))
}

fn client_inner<T: Transport>(
    cfg: &SideCfg,
    plan: &Plan,
    ctrl: &mut Ctrl,
    json: bool,
) -> Result<ClientOut> {
    // Every provider call from here on, closing the endpoints included, is under the
    // watchdog: one that does not return after the server died ends the process.
    let live = ctrl.liveness();
    let _busy = live.busy();
    let mut side = Side::<T>::open(cfg)?;
    let r = client_runs(&mut side, cfg, plan, ctrl, json);
    if let Err(e) = &r {
        // The endpoints close next, perhaps with WRITEs to a server that stopped. Tell a
        // server still there first: it stops using them (a loopback's server, in this
        // process, is waited for before they close: bench_core::teardown).
        if !matches!(
            e,
            Error::PeerGone(_) | Error::Refused(_) | Error::RankFailed { .. }
        ) {
            ctrl.send_error(&format!("client: {e}"));
        }
        ctrl.watch_teardown(&e.to_string());
    }
    r
}

/// The client's session on its opened endpoints: regions, hello, every run, goodbye.
fn client_runs<T: Transport>(
    side: &mut Side<T>,
    cfg: &SideCfg,
    plan: &Plan,
    ctrl: &mut Ctrl,
    json: bool,
) -> Result<ClientOut> {
    for p in &plan.runs {
        check_size(plan, side, p.size, false)?;
    }
    let len = data_len(plan, side)?;
    side.register(cfg.mem, len, cfg.buf_offset)?;
    if cfg.verbose > 0 {
        eprintln!("rdma-bench: {}", regions_line(side, cfg.mem, len as u64));
    }
    let (facts, peer) = greet(side, cfg, ctrl, len)?;
    for p in &plan.runs {
        check_size(plan, side, p.size, true)?;
    }
    let mut reports = Vec::with_capacity(plan.runs.len());
    for (k, p) in plan.runs.iter().enumerate() {
        let r = run_one(side, ctrl, cfg, plan, p, k as u32, json)?;
        if cfg.verbose > 0 {
            eprintln!(
                "rdma-bench: run {k}{}: {:.2} Gbit/s, {:.3} Mops; knobs: {}; server threads {}",
                p.stage
                    .as_deref()
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default(),
                r.gbps,
                r.mops,
                r.knobs,
                bench_core::units::pinning(&r.cores)
            );
        }
        reports.push(r);
    }
    let _ = ctrl.send(&Msg::Bye);
    Ok(ClientOut {
        reports,
        facts,
        peer,
    })
}

/// Hello and welcome: tell the server this side's layout and endpoints, take its own, connect
/// to them and take in what it announced. `len`: the bytes of this side's data regions, which
/// the server's must hold too. Returns this side's run-record facts and the server's.
pub(crate) fn greet<T: Transport>(
    side: &mut Side<T>,
    cfg: &SideCfg,
    ctrl: &mut Ctrl,
    len: usize,
) -> Result<(Facts, Option<Facts>)> {
    let hello = Hello {
        magic: MAGIC.into(),
        version: VERSION,
        backend: T::BACKEND.into(),
        provider: side.provider(),
        gpus: cfg.gpus.len() as u32,
        nics_per_gpu: cfg.nics_per_gpu as u32,
        mem: cfg.mem,
        buf_offset: cfg.buf_offset,
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
    let peer = welcome.facts.map(|f| *f);
    side.connect(welcome.nics)?;
    // The server announced its endpoints before its welcome: take that in now.
    side.settle()?;
    // This side's record, read now that its peers are added: a backend may decide per peer
    // (UCX's write=auto), and the record says what it decided.
    Ok((cfg.facts.with_backend(side.runtime()), peer))
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
        if turns.is_multiple_of(64) {
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
        Workload::GpuWrite => return Err(gpu_write_loopback_only()),
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
            // After each phase's last immediate on a NIC this side lands the region and
            // acknowledges; the server's clock for the NIC stops at that acknowledgement.
            let warm = u64::from(p.knobs.warmup);
            let mut acks = Vec::with_capacity(nics);
            for (i, (data, c)) in side.data.iter().zip(&side.ctrl).enumerate() {
                let w = if expected[i] > 0 { warm } else { 0 };
                acks.push(write::AckTo::new(
                    data,
                    c,
                    side.peers[i],
                    &side.imported[i][1],
                    w,
                    expected[i],
                )?);
            }
            ctrl.send(&Msg::Request(plan.request(p, id, p.pages, shifts)))?;
            wait_ready(ctrl, id)?;
            let data = &side.data;
            let mut on_imm = |i: usize, g: u64| match checks.get_mut(i) {
                Some(Some(c)) => c.check(&data[i], g),
                _ => Ok(()),
            };
            let done = write::wait_imms(
                &mut side.eps,
                &expected,
                &mut acks,
                ctrl,
                cfg.idle,
                &mut progress,
                &mut on_imm,
            )?;
            drop(acks);
            if cfg.verbose > 0 {
                let (n, torn) = checks
                    .iter()
                    .flatten()
                    .fold((0, 0), |(a, b), c| (a + c.checked, b + c.torn));
                let of = |k: buffers::CheckKind| {
                    checks.iter().flatten().filter(|c| c.kind() == k).count()
                };
                eprintln!(
                    "rdma-bench: {n} immediates checked on arrival ({torn} slot reads raced a \
                     landing WRITE); NICs checked for order: {}, for whole pages: {}, for \
                     their fixed page: {}; NICs without the check: {}",
                    of(buffers::CheckKind::Order),
                    of(buffers::CheckKind::Whole),
                    of(buffers::CheckKind::Fixed),
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
            let rx = min_rx_depth(side);
            let (warm, total, depth) = send_counts(p, rx);
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
                        side.imported[i][1],
                        t,
                        depth,
                        size,
                    )
                    .single_buffer(plan.single_buffer)
                    .warm_up(if t > 0 { warm } else { 0 });
                    r.prepost(i)?;
                    rn.push(r);
                }
                ctrl.send(&Msg::Request(plan.request(p, id, depth, 1)))?;
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
            // Ping from [0, size), the answer lands in [size, 2 size) (the server's mirror).
            buffers::fill_lat(&mut side.data[0], plan.seed, size, 0, size)?;
            let rtts = {
                let data = &side.data[0];
                let mut pp = PingPong {
                    ep: &mut side.eps[0],
                    peer: side.peers[0],
                    src: LocalSlice::new(data, 0, size).ctx(|| "ping buffer")?,
                    dst: LocalSlice::new(data, size, size).ctx(|| "pong buffer")?,
                    remote: side.imported[0][0]
                        .slice(0, p.size)
                        .ctx(|| "the server's region")?,
                    op: plan.op,
                };
                pp.prepare(warm + p.iters)?;
                ctrl.send(&Msg::Request(plan.request(p, id, 1, 1)))?;
                wait_ready(ctrl, id)?;
                pp.ping(warm, p.iters, &ctrl.liveness(), cfg.idle, &mut progress)?
            };
            buffers::verify_lat(&side.data[0], plan.seed, size, size)?;
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

/// Connect to `addr`, retrying until `timeout` passes.
pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStream> {
    let start = Instant::now();
    let mut last: Option<String> = None;
    loop {
        let addrs: Vec<SocketAddr> = match addr.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                return Err(Error::Usage(format!(
                    "cannot resolve server address {addr}: {e} (--connect takes HOST:PORT, \
                     e.g. 10.0.0.2:7471)"
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

/// `gpu-write` is not a plan of runs: it goes through [`super::gpu_write_client`].
pub(crate) fn gpu_write_loopback_only() -> Error {
    Error::Usage(
        "--workload gpu-write runs in steps of its own (`gpu_write_client`), not as a plan of runs"
            .into(),
    )
}
