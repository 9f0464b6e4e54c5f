//! The subcommands: from parsed flags to configurations, to the chosen backend, to output.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use bench_coord::backend::Backend;
use bench_coord::ranks::{self, RunCfg};
use bench_coord::session::{self, Fixed, ServerCfg};
use bench_core::config::MemKind;
use bench_core::error::{Error, Result};
use bench_core::plan::{Plan, WorkloadSpec};
use bench_core::record::{self, Facts, PairRecord, Record};
use bench_core::report::{self, RunReport};
use bench_core::side::SideCfg;
use bench_core::topo_glue;
use bench_core::workload::gpu_write::{CpuProducer, GpuWriteCfg, Producer};
use bench_report::gate::GateResult;
use bench_report::outputs::{self, Done, OutputSpec};

mod compare;
mod gpu_write;

use compare::compare;
use gpu_write::{gpu_write, gpu_write_client};

use crate::cli::{
    Cli, ClientArgs, Command, Common, CompareArgs, LoopbackArgs, RunArgs, ServerArgs, TopoArgs,
};

/// Run the command line; print the result or the error; the process exit code.
pub fn main_with(cli: Cli) -> ExitCode {
    if let Command::Doctor(a) = &cli.cmd {
        // Its own exit statuses: 0 ok, 1 warnings, 2 failures.
        return bench_doctor::main(&a.into());
    }
    set_provider_env(&cli);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-bench: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// What the providers named need in the environment (their backend says: libfabric's tcp stays
/// on `lo` unless told otherwise), set where unset.
fn set_provider_env(cli: &Cli) {
    let one = |c: &Common| (c.backend, c.provider.clone());
    let used: Vec<(&'static Backend, Option<String>)> = match &cli.cmd {
        Command::Loopback(a) => vec![one(&a.common)],
        Command::Server(a) => vec![one(&a.common)],
        Command::Client(a) => vec![one(&a.common)],
        Command::Compare(a) => a
            .pairs
            .iter()
            .map(|p| (p.backend, p.provider.clone()))
            .collect(),
        Command::Topo(_) | Command::Doctor(_) => Vec::new(),
        Command::Run(a) => vec![one(&a.common)],
    };
    for (b, p) in used {
        let (Some(info), Some(p)) = (&b.info().provider, p) else {
            continue;
        };
        for (k, v) in (info.env)(&p) {
            if std::env::var_os(k).is_none() {
                // Before any thread or library call exists.
                std::env::set_var(k, v);
            }
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Command::Topo(a) => topo(a),
        Command::Loopback(a) => loopback(a),
        Command::Server(a) => server(a),
        Command::Client(a) => client(a),
        Command::Compare(a) => compare(a),
        // main_with runs doctor itself (it has exit statuses of its own).
        Command::Doctor(_) => Ok(()),
        Command::Run(a) => run_rank(a),
    }
}

fn topo(a: TopoArgs) -> Result<()> {
    let out = topo_glue::render(a.xml.as_deref(), a.json)?;
    println!("{out}");
    Ok(())
}

fn idle(c: &Common) -> Result<Duration> {
    idle_or(c, Duration::from_secs(10))
}

/// `--idle-timeout`, or `default` where it is not given.
fn idle_or(c: &Common, default: Duration) -> Result<Duration> {
    let Some(s) = c.idle_timeout else {
        return Ok(default);
    };
    if !(s.is_finite() && s > 0.0 && s < 1e6) {
        return Err(Error::Usage(
            "--idle-timeout: seconds, more than 0 and below 1000000".into(),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// rdma-bench's version and the git commit it was built from (`build.rs`).
const VERSION: &str = env!("CARGO_PKG_VERSION");
const COMMIT: &str = env!("RDMA_BENCH_COMMIT");

/// What this process tells its peers about itself, and its run record starts from.
fn facts(c: &Common) -> Facts {
    let mut f = Facts::here(VERSION, COMMIT);
    f.instance = bench_doctor::instances::local().map(|i| i.name.clone());
    if c.mem() == MemKind::Cuda {
        f.cuda = record::cuda(&c.gpus());
    }
    f
}

/// `key=value,...` from the backend's options variable (`BackendInfo::options_env`).
fn env_options(name: &str, example: &str, s: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for kv in s.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                out.push((k.trim().to_string(), v.trim().to_string()));
            }
            _ => {
                return Err(Error::Usage(format!(
                    "{name}: {kv:?} is not key=value (e.g. {example})"
                )))
            }
        }
    }
    Ok(out)
}

/// One side's configuration from the common flags; `buf_offset`: the workload's
/// `--buf-offset` (0 for the server, which takes each client's).
fn side_cfg(
    c: &Common,
    provider: Option<String>,
    devices: Vec<String>,
    buf_offset: u32,
) -> Result<SideCfg> {
    let info = c.backend.info();
    // Only a backend with providers takes one.
    let provider = provider.filter(|_| info.provider.is_some());
    let nic_driver = (info.nic_driver)(provider.as_deref());
    let nics_per_gpu = match c.nics_per_gpu {
        Some(n) => n,
        None => bench_doctor::instances::default_nics_per_gpu(
            bench_doctor::instances::local(),
            nic_driver,
        ),
    };
    // The backend's options variable first, --nic-opt after (a later key wins).
    let mut options = match (
        info.options_env.as_ref(),
        info.options_env.as_ref().map(|e| std::env::var(e.name)),
    ) {
        (Some(e), Some(Ok(v))) => env_options(e.name, e.example, &v)?,
        _ => Vec::new(),
    };
    options.extend(c.nic_opts.iter().cloned());
    let cfg = SideCfg {
        provider,
        devices,
        options,
        real_nics: nic_driver.is_some(),
        gpus: c.gpus(),
        nics_per_gpu,
        mem: c.mem(),
        buf_offset,
        verbose: c.verbose,
        idle: idle(c)?,
        hints: match &c.topology {
            Some(path) => Some(topo_glue::hints_from(path)?),
            None => topo_glue::hints(),
        },
        facts: facts(c),
        teardown: None,
    };
    cfg.check()?;
    Ok(cfg)
}

/// Loopback's two sides: the first half of `--devices` for the client, the second half for
/// the server (both the whole list when it cannot be halved).
fn loopback_cfgs(
    c: &Common,
    provider: Option<String>,
    buf_offset: u32,
) -> Result<(SideCfg, ServerCfg)> {
    let devs = &c.devices;
    let (a, b) = if devs.len() >= 2 && devs.len().is_multiple_of(2) {
        let (x, y) = devs.split_at(devs.len() / 2);
        (x.to_vec(), y.to_vec())
    } else {
        (devs.clone(), devs.clone())
    };
    let mut client = side_cfg(c, provider.clone(), a, buf_offset)?;
    // The server's side takes the client's offset from its hello.
    let mut server_side = side_cfg(c, provider, b, 0)?;
    // Both sides in one process: what the backend needs where two endpoints of one process
    // exchange GPU memory (libfabric: no CUDA IPC, `gpu_ipc=off`), unless given. Between
    // processes (server and client, rdma-bench run) nothing is added.
    if c.mem() == MemKind::Cuda {
        for side in [&mut client, &mut server_side] {
            for (k, v) in c.backend.info().same_process_gpu {
                if !side.options.iter().any(|(x, _)| x == k) {
                    side.options.push((k.to_string(), v.to_string()));
                }
            }
        }
    }
    let server = ServerCfg {
        side: server_side,
        // Both sides are this command's.
        fixed: Fixed::ALL,
        max_mem: u64::MAX,
        session_timeout: Duration::from_secs(120),
        max_sessions: 1,
        sessions: Some(1),
        quiet: true,
    };
    Ok((client, server))
}

/// The provider of both sides in one process: the one named, else the backend's default.
fn default_provider(c: &Common) -> Option<String> {
    let p = c.backend.info().provider.as_ref()?;
    Some(
        c.provider
            .clone()
            .unwrap_or_else(|| p.loopback_default.to_string()),
    )
}

/// A client's or loopback's record: this side's facts and the server's.
fn session_record(out: &session::ClientOut) -> Record {
    let mut r = Record::now(out.facts.clone());
    r.peer = out.peer.clone();
    r
}

/// Print the runs, judge them against the gate, write the plot and report: the end of a
/// loopback and of a client run alike.
fn report_runs(
    reports: Vec<RunReport>,
    record: &Record,
    plan: &Plan,
    out: &OutputSpec,
    gate: Option<&bench_report::gate::GateSpec>,
    json: bool,
) -> Result<()> {
    let ladder = plan.ladder;
    let reports = report::combine_rounds(reports, plan.rounds);
    let reports = &reports[..];
    let mut done = Done::of(reports, ladder);
    done.record = Some(record);
    let verdict = outputs::judge(gate, &done);
    print_runs(reports, record, json, ladder, verdict.as_ref());
    outputs::finish(out, gate, &done, verdict.as_ref(), json)
}

fn print_runs(
    reports: &[RunReport],
    record: &Record,
    json: bool,
    ladder: bool,
    gate: Option<&GateResult>,
) {
    if json {
        println!(
            "{}",
            outputs::with_gate(report::to_json(reports, Some(record)), gate)
        );
    } else {
        print!("{}", report::render(reports, ladder));
    }
}

/// `--producer`, `--kernel-*` and `--server-echo` only mean something to gpu-write (who
/// fills the proxy's ring, who answers its WRITEs).
fn producer_needs_gpu_write(w: &crate::cli::WorkloadArgs) -> Result<()> {
    if w.producer != "cpu"
        || w.kernel_poll_sleep != 0
        || w.kernel_poll_margin != 0
        || w.kernel_publish != "unfenced"
        || w.server_echo != "host"
    {
        return Err(Error::Usage(
            "--producer, --kernel-* and --server-echo are gpu-write's (who fills the proxy's \
             ring, who answers): add --workload gpu-write"
                .into(),
        ));
    }
    Ok(())
}

fn loopback(a: LoopbackArgs) -> Result<()> {
    if a.work.workload == bench_core::config::Workload::GpuWrite {
        return gpu_write(&a);
    }
    producer_needs_gpu_write(&a.work)?;
    let plan = Plan::new(&(&a.work).into(), true)?;
    let out_spec = a.out.spec(&a.common, default_provider(&a.common));
    let gate = out_spec.prepare(plan.workload.name())?;
    let (client, server) =
        loopback_cfgs(&a.common, default_provider(&a.common), a.work.buf_offset)?;
    let out = a
        .common
        .backend
        .loopback(&client, &server, &plan, a.common.json)?;
    let record = session_record(&out);
    report_runs(
        out.reports,
        &record,
        &plan,
        &out_spec,
        gate.as_ref(),
        a.common.json,
    )
}

fn server(a: ServerArgs) -> Result<()> {
    if !(a.session_timeout.is_finite() && a.session_timeout > 0.0 && a.session_timeout < 1e6) {
        return Err(Error::Usage(
            "--session-timeout: seconds, more than 0 and below 1000000".into(),
        ));
    }
    if a.max_sessions == 0 {
        return Err(Error::Usage("--max-sessions: at least 1".into()));
    }
    let cfg = ServerCfg {
        side: side_cfg(
            &a.common,
            a.common.provider.clone(),
            a.common.devices.clone(),
            0,
        )?,
        // What the operator gave; the rest is each client's.
        fixed: Fixed {
            gpus: a.common.gpus.is_some(),
            nics_per_gpu: a.common.nics_per_gpu.is_some(),
            mem: a.common.mem.is_some(),
        },
        max_mem: a.max_mem.0,
        session_timeout: Duration::from_secs_f64(a.session_timeout),
        max_sessions: a.max_sessions,
        sessions: a.sessions,
        quiet: false,
    };
    a.common.backend.serve(&cfg, &a.listen)
}

fn client(a: ClientArgs) -> Result<()> {
    if !(a.connect_timeout.is_finite() && a.connect_timeout > 0.0 && a.connect_timeout < 1e6) {
        return Err(Error::Usage(
            "--connect-timeout: seconds, more than 0 and below 1000000".into(),
        ));
    }
    if a.work.workload == bench_core::config::Workload::GpuWrite {
        return gpu_write_client(&a);
    }
    producer_needs_gpu_write(&a.work)?;
    // Verified by default, as loopback and run are (`--no-verify` for a pure speed run).
    let plan = Plan::new(&(&a.work).into(), true)?;
    let out_spec = a.out.spec(&a.common, a.common.provider.clone());
    let gate = out_spec.prepare(plan.workload.name())?;
    let cfg = side_cfg(
        &a.common,
        a.common.provider.clone(),
        a.common.devices.clone(),
        a.work.buf_offset,
    )?;
    // Say so before touching the network.
    a.common.backend.check_built()?;
    let stream = session::connect(&a.connect, Duration::from_secs_f64(a.connect_timeout))?;
    let out = a
        .common
        .backend
        .client(&cfg, &plan, stream, a.common.json)?;
    let record = session_record(&out);
    report_runs(
        out.reports,
        &record,
        &plan,
        &out_spec,
        gate.as_ref(),
        a.common.json,
    )
}

/// `rdma-bench run`: this rank's side and the job's plan, then the rank; rank 0 prints the
/// job's table (or `--json`).
fn run_rank(a: RunArgs) -> Result<()> {
    // `run` runs its plan once: no ladder rounds unless asked for (and then refused).
    let mut work: WorkloadSpec = (&a.work).into();
    work.rounds = work.rounds.or(Some(1));
    let plan = Plan::new(&work, true)?;
    let side = side_cfg(
        &a.common,
        a.common.provider.clone(),
        a.common.devices.clone(),
        a.work.buf_offset,
    )?;
    let cfg = RunCfg {
        side,
        plan,
        pattern: a.pattern,
        rendezvous: a.rendezvous,
        rendezvous_timeout: a.rendezvous_timeout,
        gpu_per_rank: a.gpu_per_rank,
        provider: a.common.provider.clone().unwrap_or_default(),
    };
    // Rank 0's report, printed before the rank closes its links.
    let json = a.common.json;
    a.common.backend.rank(cfg, &mut |rep| {
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(rep)
                    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
        } else {
            print!("{}", ranks::render(rep));
        }
        // Out now: a close that hangs ends this process through the watchdog.
        let _ = std::io::Write::flush(&mut std::io::stdout());
    })
}
