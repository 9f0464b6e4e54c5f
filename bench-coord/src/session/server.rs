//! The server side: listens, runs one session per client (each in its own thread), checks the
//! client's hello, and serves each of its runs as the active side.

use std::net::{TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use transport_core::{LocalSlice, Transport};

use bench_core::buffers::{self, PageLayout};
use bench_core::config::{LatOp, MemKind, Workload};
use bench_core::ctrl::{Ctrl, Watchdog};
use bench_core::error::{Error, Result, TransportContext};
use bench_core::proto::{Done, Hello, Msg, NicStats, Request, Welcome, MAGIC, VERSION};
use bench_core::side::{Side, SideCfg};
use bench_core::workload::lat::PingPong;
use bench_core::workload::send::{SendActive, SendParts};
use bench_core::workload::write::{WriteActive, WriteParts};
use bench_core::workload::{group, run_active};

use super::timeouts::{peer_gone_cause, PREPARE_TIMEOUT, WATCHDOG_GRACE};

/// The server's configuration.
#[derive(Clone, Debug)]
pub struct ServerCfg {
    /// This node's side. Its GPUs, NICs per GPU and memory are each client's (its hello's),
    /// within what this node has, except where `fixed` says the operator gave them.
    pub side: SideCfg,
    /// Which of `side`'s layout the operator gave (flags): those are not the client's to
    /// choose.
    pub fixed: Fixed,
    pub max_mem: u64,
    pub session_timeout: Duration,
    pub max_sessions: usize,
    pub sessions: Option<u64>,
    /// Do not log sessions (loopback: the client reports).
    pub quiet: bool,
}

/// Which parts of the server's layout its operator gave; each other part is taken from each
/// client's hello, as perftest's server takes the client's parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fixed {
    /// `--gpus`: the GPUs the server serves from; a client asking for N of them gets the first
    /// N (more than the list holds is refused).
    pub gpus: bool,
    /// `--nics-per-gpu`: a client must ask for as many.
    pub nics_per_gpu: bool,
    /// `--mem`: the server's buffers are of this kind, whatever the client's are.
    pub mem: bool,
}

impl Fixed {
    /// Everything fixed: the server's side is as given (loopback, whose two sides are one
    /// command's).
    pub const ALL: Fixed = Fixed {
        gpus: true,
        nics_per_gpu: true,
        mem: true,
    };
}

/// This session's side: `cfg.side`, with the GPUs, NICs per GPU and memory that `cfg.fixed`
/// leaves open taken from the client's hello, within what this node has. An error names what
/// the client asks for that this server cannot give, and why.
pub fn session_side(cfg: &ServerCfg, hello: &Hello) -> Result<SideCfg> {
    let (n, k) = (hello.gpus as usize, hello.nics_per_gpu as usize);
    let asks = format!(
        "the client asks for {n} GPU(s) x {k} NIC(s), {} memory",
        hello.mem
    );
    let mut side = cfg.side.clone();
    if !cfg.fixed.mem {
        side.mem = hello.mem;
    }
    side.gpus = if cfg.fixed.gpus {
        let have = &cfg.side.gpus;
        if n > have.len() {
            return Err(Error::Protocol(format!(
                "{asks}; this server serves {} GPU(s) (--gpus {}): start it with more, or \
                 without --gpus to serve what the client asks",
                have.len(),
                list(have)
            )));
        }
        have[..n].to_vec()
    } else {
        let (here, why) = side
            .gpus_here()
            .map_err(|e| Error::Protocol(format!("{asks}; this node cannot: {e}")))?;
        if n > here {
            return Err(Error::Protocol(format!(
                "{asks}; this node has {here} ({why})"
            )));
        }
        (0..n).collect()
    };
    if cfg.fixed.nics_per_gpu {
        if k != cfg.side.nics_per_gpu {
            return Err(Error::Protocol(format!(
                "layout mismatch: {asks}; this server was started with --nics-per-gpu {}: give \
                 both the same, or start the server without it to take the client's",
                cfg.side.nics_per_gpu
            )));
        }
    } else {
        side.nics_per_gpu = k;
        // Over this node's own NICs, each GPU's endpoints go to its NIC group (topo): more
        // endpoints than the group has NICs would share NICs, which the operator asks for
        // with --nics-per-gpu, and a client cannot.
        let groups = side
            .hints
            .as_ref()
            .filter(|_| side.real_nics && side.devices.is_empty());
        if let Some(h) = groups {
            for &g in &side.gpus {
                let grp = h.nic_groups.get(g).map_or(&[][..], |v| &v[..]);
                if !grp.is_empty() && k > grp.len() {
                    let names: Vec<&str> = grp.iter().map(|n| n.name.as_str()).collect();
                    return Err(Error::Protocol(format!(
                        "{asks}; GPU {g}'s NIC group on this node has {} NIC(s) ({}): ask \
                         for at most {}, or start the server with --nics-per-gpu {k} to share them",
                        grp.len(),
                        names.join(", "),
                        grp.len()
                    )));
                }
            }
        }
    }
    side.check()
        .map_err(|e| Error::Protocol(format!("{asks}; this server cannot: {e}")))?;
    // The run record's CUDA facts are those of the GPUs this session uses.
    if side.mem == MemKind::Cuda {
        if cfg.side.mem != MemKind::Cuda || side.gpus != cfg.side.gpus {
            side.facts.cuda = bench_core::record::cuda(&side.gpus);
        }
    } else {
        side.facts.cuda = None;
    }
    Ok(side)
}

/// `0,1,4` as typed.
fn list(gpus: &[usize]) -> String {
    gpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// What the server says it serves, in its first line: each client's layout, but for what
/// the operator fixed.
fn layout_line(cfg: &ServerCfg) -> String {
    let f = cfg.fixed;
    let mut fixed = Vec::new();
    if f.gpus {
        fixed.push(format!("GPUs {}", list(&cfg.side.gpus)));
    }
    if f.nics_per_gpu {
        fixed.push(format!("{} NIC(s) per GPU", cfg.side.nics_per_gpu));
    }
    if f.mem {
        fixed.push(format!("{} memory", cfg.side.mem));
    }
    if fixed.len() == 3 {
        format!("layout {}", fixed.join(", "))
    } else if fixed.is_empty() {
        "each client's layout (GPUs, NICs per GPU, memory)".into()
    } else {
        format!("each client's layout within {}", fixed.join(", "))
    }
}

/// Serve clients until `cfg.sessions` have been served (forever without it).
pub fn serve<T: Transport>(cfg: &ServerCfg, listen: &str) -> Result<()> {
    let listener = TcpListener::bind(listen).ctx(|| format!("listening on {listen}"))?;
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
    // A backend with providers runs both sides over the same one.
    if T::INFO.provider.is_some() && side.provider() != hello.provider {
        return Err(Error::Protocol(format!(
            "provider mismatch: the client uses {}, this server {}",
            hello.provider,
            side.provider()
        )));
    }
    side.register(scfg.mem, want.max(64) as usize)?;
    let facts = side.runtime().map(|r| Box::new(scfg.facts.with_backend(r)));
    let wire = side.wire();
    side.connect(hello.nics)?;
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
                let done = serve_request(&mut side, ctrl, cfg, &r)?;
                ctrl.send(&Msg::Done(done))?;
                runs += 1;
            }
            Msg::GpuStep(g) => {
                if runs == 0 {
                    side.settle()?;
                }
                let done = super::gpu_write::serve_gpu_step(&mut side, ctrl, cfg, &g)?;
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
                        max_inflight: c.tx_depth.max(1),
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
                remote: side.imported[0][0]
                    .slice(r.size, r.size)
                    .ctx(|| "the client's region")?,
                op: r.op,
            };
            pp.prepare(warm + r.iters)?;
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
        self.is_none_or(|v| v > limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bench_core::topo_glue::{Hints, NicRef};

    fn cfg(side: SideCfg, fixed: Fixed) -> ServerCfg {
        ServerCfg {
            side,
            fixed,
            max_mem: u64::MAX,
            session_timeout: Duration::from_secs(1),
            max_sessions: 1,
            sessions: None,
            quiet: true,
        }
    }

    fn hello(gpus: u32, nics_per_gpu: u32, mem: MemKind) -> Hello {
        Hello {
            magic: MAGIC.into(),
            version: VERSION,
            backend: "libfabric".into(),
            provider: "shm".into(),
            gpus,
            nics_per_gpu,
            mem,
            nics: Vec::new(),
            facts: None,
        }
    }

    /// A node of `gpus` GPUs, each with a NIC group of `per` NICs.
    fn node(gpus: usize, per: usize) -> SideCfg {
        let nic = |g: usize, j: usize| NicRef {
            name: format!("rdmap{g}s{j}"),
            pci: None,
        };
        SideCfg {
            hints: Some(Hints {
                gpus,
                nic_groups: (0..gpus)
                    .map(|g| (0..per).map(|j| nic(g, j)).collect())
                    .collect(),
                cores: vec![Vec::new(); gpus],
            }),
            ..SideCfg::default()
        }
    }

    fn err(r: Result<SideCfg>) -> String {
        r.map(|s| format!("{:?} x {}", s.gpus, s.nics_per_gpu))
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_clients_layout_is_taken() {
        let c = cfg(SideCfg::default(), Fixed::default());
        let s = session_side(&c, &hello(2, 2, MemKind::Host)).unwrap();
        assert_eq!(
            (s.gpus, s.nics_per_gpu, s.mem),
            (vec![0, 1], 2, MemKind::Host)
        );
        // Within this node's NIC groups: 8 GPUs of 4 NICs each (a p5).
        let c = cfg(node(8, 4), Fixed::default());
        let s = session_side(&c, &hello(8, 4, MemKind::Host)).unwrap();
        assert_eq!((s.gpus.len(), s.nics_per_gpu), (8, 4));
    }

    #[test]
    fn what_this_node_has_not_is_refused() {
        // The case: a client of 8 GPUs x 4 NICs, a node of 1 GPU.
        let c = cfg(node(1, 4), Fixed::default());
        assert_eq!(
            err(session_side(&c, &hello(8, 4, MemKind::Host))),
            "the client asks for 8 GPU(s) x 4 NIC(s), host memory; this node has 1 (this \
             machine has 1 GPU(s))"
        );
        // More NICs per GPU than a GPU's NIC group holds.
        let c = cfg(node(2, 2), Fixed::default());
        let e = err(session_side(&c, &hello(2, 4, MemKind::Host)));
        assert!(
            e.contains("GPU 0's NIC group on this node has 2 NIC(s) (rdmap0s0, rdmap0s1)"),
            "{e}"
        );
        // A provider that copies memory has no NIC groups to respect.
        let mut side = node(2, 2);
        side.real_nics = false;
        let s = session_side(&cfg(side, Fixed::default()), &hello(2, 4, MemKind::Host)).unwrap();
        assert_eq!(s.nics_per_gpu, 4);
        // GPU memory where there is none.
        if !buffers::cuda_driver() {
            let c = cfg(SideCfg::default(), Fixed::default());
            let e = err(session_side(&c, &hello(1, 1, MemKind::Cuda)));
            assert!(
                e.starts_with(
                    "the client asks for 1 GPU(s) x 1 NIC(s), cuda memory; this node cannot"
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn the_operators_flags_hold() {
        // --gpus 4,5,6: a client of 2 gets the first 2; of 4, a refusal naming the list.
        let mut side = node(8, 2);
        side.gpus = vec![4, 5, 6];
        let only = Fixed {
            gpus: true,
            ..Fixed::default()
        };
        let c = cfg(side.clone(), only);
        assert_eq!(
            session_side(&c, &hello(2, 1, MemKind::Host)).unwrap().gpus,
            vec![4, 5]
        );
        let e = err(session_side(&c, &hello(4, 1, MemKind::Host)));
        assert!(
            e.contains("this server serves 3 GPU(s) (--gpus 4,5,6)"),
            "{e}"
        );
        // --nics-per-gpu 4: the client must ask as many, and the NICs are shared by the
        // operator's choice.
        side.nics_per_gpu = 4;
        let npg = Fixed {
            nics_per_gpu: true,
            ..Fixed::default()
        };
        let c = cfg(side.clone(), npg);
        assert_eq!(
            session_side(&c, &hello(2, 4, MemKind::Host))
                .unwrap()
                .nics_per_gpu,
            4
        );
        let e = err(session_side(&c, &hello(2, 2, MemKind::Host)));
        assert!(
            e.starts_with("layout mismatch: ") && e.contains("--nics-per-gpu 4"),
            "{e}"
        );
        // --mem host: the server's buffers stay in host memory for a client of GPU memory.
        let mem = Fixed {
            mem: true,
            ..Fixed::default()
        };
        let s = session_side(&cfg(SideCfg::default(), mem), &hello(1, 1, MemKind::Cuda)).unwrap();
        assert_eq!(s.mem, MemKind::Host);
        // Everything fixed (loopback): the side as given.
        let s = session_side(&cfg(side, Fixed::ALL), &hello(3, 4, MemKind::Host)).unwrap();
        assert_eq!((s.gpus, s.nics_per_gpu), (vec![4, 5, 6], 4));
    }
}
