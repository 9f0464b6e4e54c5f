//! The subcommands: from parsed flags to configurations, to the chosen backend, to output.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use transport_core::Transport;

use bench_coord::backend::{dispatch, WithTransport};
use bench_coord::ranks::{self, RunCfg};
use bench_coord::session::{self, ClientOut, ServerCfg};
use bench_core::config::{Backend, MemKind};
use bench_core::error::{Error, Result};
use bench_core::plan::Plan;
use bench_core::report::{self, RunReport};
use bench_core::side::SideCfg;
use bench_core::topo_glue;
use bench_report::gate::GateResult;
use bench_report::outputs::{self, Done, OutputSpec};

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

/// libfabric's tcp provider must stay on 127.0.0.1 here: point it at `lo` unless told otherwise.
fn set_provider_env(cli: &Cli) {
    let tcp = |p: &Option<String>| p.as_deref().is_some_and(|p| p.starts_with("tcp"));
    let uses_tcp = match &cli.cmd {
        Command::Loopback(a) => tcp(&a.common.provider),
        Command::Server(a) => tcp(&a.common.provider),
        Command::Client(a) => tcp(&a.common.provider),
        Command::Compare(a) => a.pairs.iter().any(|p| tcp(&p.provider)),
        Command::Topo(_) | Command::Doctor(_) => false,
        Command::Run(a) => tcp(&a.common.provider),
    };
    if uses_tcp && std::env::var_os("FI_TCP_IFACE").is_none() {
        // Before any thread or libfabric call exists.
        std::env::set_var("FI_TCP_IFACE", "lo");
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
    if !(c.idle_timeout.is_finite() && c.idle_timeout > 0.0 && c.idle_timeout < 1e6) {
        return Err(Error::Usage("--idle-timeout: seconds, more than 0".into()));
    }
    Ok(Duration::from_secs_f64(c.idle_timeout))
}

fn side_cfg(c: &Common, provider: Option<String>, devices: Vec<String>) -> Result<SideCfg> {
    let nics_per_gpu = match c.nics_per_gpu {
        Some(n) => n,
        None => bench_doctor::instances::default_nics_per_gpu(
            bench_doctor::instances::local(),
            c.backend.nic_driver(provider.as_deref()),
        ),
    };
    let cfg = SideCfg {
        backend: c.backend,
        provider: match c.backend {
            Backend::Efa => provider,
            Backend::Verbs => None,
        },
        devices,
        options: c.nic_opts.clone(),
        gpus: c.gpus.0.clone(),
        nics_per_gpu,
        mem: c.mem,
        verbose: c.verbose,
        idle: idle(c)?,
        hints: match &c.topology {
            Some(path) => Some(topo_glue::hints_from(path)?),
            None => topo_glue::hints(),
        },
        verbs_opts: match (c.backend, std::env::var(bench_core::side::VERBS_OPTS_ENV)) {
            (Backend::Verbs, Ok(v)) => bench_core::side::parse_verbs_opts(&v)?,
            _ => Default::default(),
        },
    };
    cfg.check()?;
    Ok(cfg)
}

/// Loopback's two sides: the first half of `--devices` for the client, the second half for
/// the server (both the whole list when it cannot be halved).
fn loopback_cfgs(c: &Common, provider: Option<String>) -> Result<(SideCfg, ServerCfg)> {
    let devs = &c.devices;
    let (a, b) = if devs.len() >= 2 && devs.len() % 2 == 0 {
        let (x, y) = devs.split_at(devs.len() / 2);
        (x.to_vec(), y.to_vec())
    } else {
        (devs.clone(), devs.clone())
    };
    let mut client = side_cfg(c, provider.clone(), a)?;
    let mut server_side = side_cfg(c, provider, b)?;
    // Both sides in one process: libfabric's shm cannot move GPU memory between them by CUDA
    // IPC (CUDA opens no handle in the process that made it), so GPU regions are registered
    // without FI_HMEM_DEVICE_ONLY and shm copies through the host (transport-efa's gpu_ipc).
    // Between processes (server and client, rdma-bench run) IPC stays on.
    if c.backend == Backend::Efa && c.mem == MemKind::Cuda {
        for side in [&mut client, &mut server_side] {
            if !side.options.iter().any(|(k, _)| k == "gpu_ipc") {
                side.options.push(("gpu_ipc".into(), "off".into()));
            }
        }
    }
    let server = ServerCfg {
        side: server_side,
        max_mem: u64::MAX,
        session_timeout: Duration::from_secs(120),
        max_sessions: 1,
        sessions: Some(1),
        quiet: true,
    };
    Ok((client, server))
}

struct Loopback<'a> {
    client: &'a SideCfg,
    server: &'a ServerCfg,
    plan: &'a Plan,
    json: bool,
}

impl WithTransport for Loopback<'_> {
    type Output = ClientOut;
    fn call<T: Transport>(self) -> Result<ClientOut> {
        session::loopback::<T>(self.client, self.server, self.plan, self.json)
    }
}

fn default_provider(c: &Common) -> Option<String> {
    match c.backend {
        Backend::Efa => Some(c.provider.clone().unwrap_or_else(|| "shm".into())),
        Backend::Verbs => None,
    }
}

/// Print the runs, judge them against the gate, write the plot and report: the end of a
/// loopback and of a client run alike.
fn report_runs(
    reports: Vec<RunReport>,
    plan: &Plan,
    out: &OutputSpec,
    gate: Option<&bench_report::gate::GateSpec>,
    json: bool,
) -> Result<()> {
    let ladder = plan.ladder;
    let reports = report::combine_rounds(reports, plan.rounds);
    let reports = &reports[..];
    let done = Done::of(reports, ladder);
    let verdict = outputs::judge(gate, &done);
    print_runs(reports, json, ladder, verdict.as_ref());
    outputs::finish(out, gate, &done, verdict.as_ref(), json)
}

fn print_runs(reports: &[RunReport], json: bool, ladder: bool, gate: Option<&GateResult>) {
    if json {
        println!("{}", outputs::with_gate(report::to_json(reports), gate));
    } else {
        print!("{}", report::render(reports, ladder));
    }
}

fn loopback(a: LoopbackArgs) -> Result<()> {
    let plan = Plan::new(&(&a.work).into(), true)?;
    let out_spec = OutputSpec::from(&a.out);
    let gate = out_spec.prepare(plan.workload.name())?;
    let (client, server) = loopback_cfgs(&a.common, default_provider(&a.common))?;
    let out = dispatch(
        a.common.backend,
        Loopback {
            client: &client,
            server: &server,
            plan: &plan,
            json: a.common.json,
        },
    )?;
    report_runs(out.reports, &plan, &out_spec, gate.as_ref(), a.common.json)
}

struct Serve<'a> {
    cfg: &'a ServerCfg,
    listen: &'a str,
}

impl WithTransport for Serve<'_> {
    type Output = ();
    fn call<T: Transport>(self) -> Result<()> {
        session::serve::<T>(self.cfg, self.listen)
    }
}

fn server(a: ServerArgs) -> Result<()> {
    if !(a.session_timeout.is_finite() && a.session_timeout > 0.0 && a.session_timeout < 1e6) {
        return Err(Error::Usage(
            "--session-timeout: seconds, more than 0".into(),
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
        )?,
        max_mem: a.max_mem.0,
        session_timeout: Duration::from_secs_f64(a.session_timeout),
        max_sessions: a.max_sessions,
        sessions: a.sessions,
        quiet: false,
    };
    dispatch(
        a.common.backend,
        Serve {
            cfg: &cfg,
            listen: &a.listen,
        },
    )
}

struct Client<'a> {
    cfg: &'a SideCfg,
    plan: &'a Plan,
    stream: std::net::TcpStream,
    json: bool,
}

impl WithTransport for Client<'_> {
    type Output = ClientOut;
    fn call<T: Transport>(self) -> Result<ClientOut> {
        session::client::<T>(self.cfg, self.plan, self.stream, self.json)
    }
}

fn client(a: ClientArgs) -> Result<()> {
    if !(a.connect_timeout.is_finite() && a.connect_timeout > 0.0 && a.connect_timeout < 1e6) {
        return Err(Error::Usage(
            "--connect-timeout: seconds, more than 0".into(),
        ));
    }
    let plan = Plan::new(&(&a.work).into(), false)?;
    let out_spec = OutputSpec::from(&a.out);
    let gate = out_spec.prepare(plan.workload.name())?;
    let cfg = side_cfg(
        &a.common,
        a.common.provider.clone(),
        a.common.devices.clone(),
    )?;
    if !bench_coord::backend::built().contains(&a.common.backend.name()) {
        // Say so before touching the network.
        return dispatch(a.common.backend, Noop).map(|_| ());
    }
    let stream = session::connect(&a.connect, Duration::from_secs_f64(a.connect_timeout))?;
    let out = dispatch(
        a.common.backend,
        Client {
            cfg: &cfg,
            plan: &plan,
            stream,
            json: a.common.json,
        },
    )?;
    report_runs(out.reports, &plan, &out_spec, gate.as_ref(), a.common.json)
}

struct Noop;
impl WithTransport for Noop {
    type Output = ();
    fn call<T: Transport>(self) -> Result<()> {
        Ok(())
    }
}

#[derive(Serialize)]
struct CompareRow<'a> {
    pair: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    run: Option<&'a RunReport>,
}

#[derive(Serialize)]
struct CompareOut<'a> {
    workload: String,
    pairs: Vec<CompareRow<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gate: Option<&'a GateResult>,
}

fn compare(a: CompareArgs) -> Result<()> {
    if a.work.ladder {
        return Err(Error::Usage(
            "compare runs one workload per pair at one size (-s) or a few (--sizes), not --ladder"
                .into(),
        ));
    }
    let plan = Plan::new(&(&a.work).into(), true)?;
    if plan.rounds > 1 {
        return Err(Error::Usage(
            "--rounds: loopback and client repeat a plan in rounds; compare runs it once per pair"
                .into(),
        ));
    }
    let out_spec = OutputSpec::from(&a.out);
    let gate = out_spec.prepare(plan.workload.name())?;
    let mut rows: Vec<(String, std::result::Result<RunReport, String>)> = Vec::new();
    for p in &a.pairs {
        let Some(backend) = Backend::parse(&p.backend) else {
            return Err(Error::Usage(format!("unknown backend in pair {p}")));
        };
        let mut common = a.common.clone();
        common.backend = backend;
        common.devices = p.devices.clone();
        let r = loopback_cfgs(&common, p.provider.clone()).and_then(|(client, server)| {
            dispatch(
                backend,
                Loopback {
                    client: &client,
                    server: &server,
                    plan: &plan,
                    json: true,
                },
            )
        });
        let r = match r {
            Ok(out) if out.reports.is_empty() => Err("no result".to_string()),
            Ok(out) => Ok(out.reports),
            Err(e) => Err(e.to_string()),
        };
        if a.common.verbose > 0 {
            eprintln!(
                "rdma-bench: compare {p}: {}",
                if r.is_ok() { "ok" } else { "failed" }
            );
        }
        // One row per size.
        match r {
            Ok(reports) => rows.extend(reports.into_iter().map(|r| (p.to_string(), Ok(r)))),
            Err(e) => rows.push((p.to_string(), Err(e))),
        }
    }
    let done = Done {
        runs: rows
            .iter()
            .filter_map(|(p, r)| r.as_ref().ok().map(|r| (p.clone(), r)))
            .collect(),
        failures: rows
            .iter()
            .filter_map(|(p, r)| r.as_ref().err().map(|e| (p.clone(), e.clone())))
            .collect(),
        ladder: false,
        workload: plan.workload.to_string(),
    };
    let verdict = outputs::judge(gate.as_ref(), &done);
    if a.common.json {
        let out = CompareOut {
            workload: plan.workload.to_string(),
            pairs: rows
                .iter()
                .map(|(pair, r)| CompareRow {
                    pair: pair.clone(),
                    error: r.as_ref().err().map(|s| s.as_str()),
                    run: r.as_ref().ok(),
                })
                .collect(),
            gate: verdict.as_ref(),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", report::render_compare(&rows));
    }
    let finished = outputs::finish(
        &out_spec,
        gate.as_ref(),
        &done,
        verdict.as_ref(),
        a.common.json,
    );
    let failed: Vec<&str> = rows
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(p, _)| p.as_str())
        .collect();
    if failed.is_empty() {
        finished
    } else {
        Err(Error::Protocol(format!(
            "pair(s) failed: {}",
            failed.join(", ")
        )))
    }
}

/// `rdma-bench run`: this rank's side and the job's plan, then the rank; rank 0 prints the
/// job's table (or `--json`).
fn run_rank(a: RunArgs) -> Result<()> {
    let plan = Plan::new(&(&a.work).into(), true)?;
    let side = side_cfg(
        &a.common,
        a.common.provider.clone(),
        a.common.devices.clone(),
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
    if let Some(rep) = ranks::run(cfg)? {
        if a.common.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&rep)
                    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
        } else {
            print!("{}", ranks::render(&rep));
        }
    }
    Ok(())
}
