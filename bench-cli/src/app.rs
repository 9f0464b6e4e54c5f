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
    if !(c.idle_timeout.is_finite() && c.idle_timeout > 0.0 && c.idle_timeout < 1e6) {
        return Err(Error::Usage("--idle-timeout: seconds, more than 0".into()));
    }
    Ok(Duration::from_secs_f64(c.idle_timeout))
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

fn side_cfg(c: &Common, provider: Option<String>, devices: Vec<String>) -> Result<SideCfg> {
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
        verbose: c.verbose,
        idle: idle(c)?,
        hints: match &c.topology {
            Some(path) => Some(topo_glue::hints_from(path)?),
            None => topo_glue::hints(),
        },
        facts: facts(c),
    };
    cfg.check()?;
    Ok(cfg)
}

/// Loopback's two sides: the first half of `--devices` for the client, the second half for
/// the server (both the whole list when it cannot be halved).
fn loopback_cfgs(c: &Common, provider: Option<String>) -> Result<(SideCfg, ServerCfg)> {
    let devs = &c.devices;
    let (a, b) = if devs.len() >= 2 && devs.len().is_multiple_of(2) {
        let (x, y) = devs.split_at(devs.len() / 2);
        (x.to_vec(), y.to_vec())
    } else {
        (devs.clone(), devs.clone())
    };
    let mut client = side_cfg(c, provider.clone(), a)?;
    let mut server_side = side_cfg(c, provider, b)?;
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

fn loopback(a: LoopbackArgs) -> Result<()> {
    if a.work.workload == bench_core::config::Workload::GpuWrite {
        return gpu_write(&a);
    }
    if a.work.producer != "cpu" {
        return Err(Error::Usage(
            "--producer is gpu-write's (who fills the proxy's ring): add --workload gpu-write"
                .into(),
        ));
    }
    let plan = Plan::new(&(&a.work).into(), true)?;
    let out_spec = a.out.spec(&a.common, default_provider(&a.common));
    let gate = out_spec.prepare(plan.workload.name())?;
    let (client, server) = loopback_cfgs(&a.common, default_provider(&a.common))?;
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

/// `loopback --workload gpu-write`: the flags as its config; the CPU producer.
fn gpu_write_cfg(w: &crate::cli::WorkloadArgs, verbose: u8) -> Result<GpuWriteCfg> {
    let mut cfg = GpuWriteCfg {
        verbose: verbose > 0,
        verify: !w.no_verify,
        seed: w.seed,
        batch: w.batch.max(1) as usize,
        pin: w.pin,
        ..GpuWriteCfg::default()
    };
    if let Some(warm) = w.warmup {
        cfg.lat_warm = u64::from(warm);
    }
    let sizes: Vec<usize> = w
        .sizes
        .iter()
        .copied()
        .chain(w.size)
        .map(|s| s.0 as usize)
        .collect();
    if sizes.iter().any(|&s| s == 0 || s > u32::MAX as usize) {
        return Err(Error::Usage(
            "--size/--sizes: gpu-write sizes are 1 byte to 4 GiB - 1".into(),
        ));
    }
    if !sizes.is_empty() {
        cfg.lat_sizes = sizes.iter().copied().filter(|&s| s <= 64 << 10).collect();
        cfg.bw_sizes = sizes;
    }
    // -n N: N latency round trips per size, N x 256 KiB per bandwidth size, N x 2000 commands
    // through the ring alone (the default 1000: 250 MiB a size, 2 M commands).
    if let Some(n) = w.iters {
        let n = n.clamp(1, 1 << 20);
        cfg.lat_iters = n;
        cfg.bw_bytes = n << 18;
        cfg.ring_cmds = n * 2000;
    }
    if w.ladder || w.rounds.is_some() || w.single_buffer || w.pages.is_some() {
        return Err(Error::Usage(
            "gpu-write takes --size/--sizes, -n (latency round trips), --warmup (untimed round \
             trips), --batch, --seed, --pin and --no-verify; not --ladder, --rounds, \
             --single-buffer or --pages"
                .into(),
        ));
    }
    Ok(cfg)
}

/// `--producer`: a host thread, or GPU threads on the side's first GPU (a usage error naming
/// what is missing where this build or machine has no CUDA).
fn gpu_write_producer(name: &str, side: &SideCfg) -> Result<Box<dyn Producer>> {
    let _gpu = side.gpus.first().copied().unwrap_or(0);
    match name {
        "cpu" => Ok(Box::new(CpuProducer)),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Box::new(
            bench_core::workload::gpu_write_cuda::CudaProducer::new(_gpu)?,
        )),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(Error::Usage(
            "--producer cuda: this rdma-bench was built without the cuda feature".into(),
        )),
        other => Err(Error::Usage(format!("--producer {other}: cpu or cuda"))),
    }
}

fn gpu_write(a: &LoopbackArgs) -> Result<()> {
    let cfg = gpu_write_cfg(&a.work, a.common.verbose)?;
    let (client, server) = loopback_cfgs(&a.common, default_provider(&a.common))?;
    let producer = gpu_write_producer(&a.work.producer, &client)?;
    let out = a
        .common
        .backend
        .gpu_write(&client, &server, &cfg, producer.as_ref())?;
    print_gpu_write(&out, a.common.json)
}

/// `client --workload gpu-write`: the producer and its proxy here, the server's proxy and
/// echo there.
fn gpu_write_client(a: &ClientArgs) -> Result<()> {
    let cfg = gpu_write_cfg(&a.work, a.common.verbose)?;
    let side = side_cfg(
        &a.common,
        a.common.provider.clone(),
        a.common.devices.clone(),
    )?;
    a.common.backend.check_built()?;
    let producer = gpu_write_producer(&a.work.producer, &side)?;
    let stream = session::connect(&a.connect, Duration::from_secs_f64(a.connect_timeout))?;
    let out = a
        .common
        .backend
        .gpu_write_client(&side, stream, &cfg, producer.as_ref())?;
    print_gpu_write(&out, a.common.json)
}

fn print_gpu_write(
    out: &bench_core::workload::gpu_write::GpuWriteReport,
    json: bool,
) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string(&out).map_err(|e| Error::Protocol(e.to_string()))?
        );
    } else {
        print!("{}", out.render());
    }
    Ok(())
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
            "--connect-timeout: seconds, more than 0".into(),
        ));
    }
    if a.work.workload == bench_core::config::Workload::GpuWrite {
        return gpu_write_client(&a);
    }
    if a.work.producer != "cpu" {
        return Err(Error::Usage(
            "--producer is gpu-write's (who fills the proxy's ring): add --workload gpu-write"
                .into(),
        ));
    }
    // Verified by default, as loopback and run are (`--no-verify` for a pure speed run).
    let plan = Plan::new(&(&a.work).into(), true)?;
    let out_spec = a.out.spec(&a.common, a.common.provider.clone());
    let gate = out_spec.prepare(plan.workload.name())?;
    let cfg = side_cfg(
        &a.common,
        a.common.provider.clone(),
        a.common.devices.clone(),
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
    record: &'a Record,
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
    let mut record = Record::now(facts(&a.common));
    for p in &a.pairs {
        let mut common = a.common.clone();
        common.backend = p.backend;
        common.devices = p.devices.clone();
        let r = loopback_cfgs(&common, p.provider.clone())
            .and_then(|(client, server)| p.backend.loopback(&client, &server, &plan, true));
        if let Ok(out) = &r {
            if let (Some(b), Some(Some(peer))) = (
                out.facts.backend.clone(),
                out.peer.as_ref().map(|f| f.backend.clone()),
            ) {
                record.pairs.push(PairRecord {
                    pair: p.to_string(),
                    backend: b,
                    peer,
                });
            }
        }
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
        record: Some(&record),
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
            record: &record,
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
    // `run` runs its plan once: no ladder rounds unless asked for (and then refused).
    let mut work: WorkloadSpec = (&a.work).into();
    work.rounds = work.rounds.or(Some(1));
    let plan = Plan::new(&work, true)?;
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
    if let Some(rep) = a.common.backend.rank(cfg)? {
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
