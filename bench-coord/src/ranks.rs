//! `rdma-bench run`: one command, started once per rank by Slurm (`srun`), Open MPI
//! (`mpirun`), a PMI launcher or torchrun-style variables; N ranks, one traffic pattern, one
//! report printed by rank 0.
//!
//! The rank finds its place in the job ([`crate::launch`]), meets the others at rank 0
//! ([`crate::rendezvous`]), and runs the `write` workload's WRITEs over links to its peers
//! ([`bench_core::workload::ranks`]). Rank 0 prints one table (or `--json`) for the whole job:
//! per rank and per NIC, min/median/max across ranks, and the slowest rank and NIC.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use transport_core::{Completion, Transport};

use crate::backend::{dispatch, WithTransport};
use crate::launch::{self, Launch, Launcher, Rendezvous};
use crate::rendezvous::{self, Coord, Hub, Leaf, Member};
use bench_core::buffers::PageLayout;
use bench_core::config::{Knobs, Pattern, Workload};
use bench_core::error::{Error, Result};
use bench_core::plan::Plan;
use bench_core::proto::{Join, Links, RankDone, RankSpec, RunSpec, MAGIC, VERSION};
use bench_core::report::gbps;
use bench_core::side::SideCfg;
use bench_core::units::human_bytes;
use bench_core::workload::ranks::{self as data, Link, Phase};

/// One rank's `rdma-bench run` (what its flags say once parsed).
#[derive(Debug)]
pub struct RunCfg {
    /// This rank's endpoints, NICs and memory, over every GPU of `--gpus`
    /// (`gpu_per_rank` narrows it to this rank's).
    pub side: SideCfg,
    /// The runs, the same on every rank.
    pub plan: Plan,
    /// Who WRITEs to whom.
    pub pattern: Pattern,
    /// Where rank 0 listens. `None`: MASTER_ADDR:MASTER_PORT, else the first node of the
    /// Slurm step (port from the job id).
    pub rendezvous: Option<String>,
    /// Seconds rank 0 waits for every rank to join (and a rank for rank 0).
    pub rendezvous_timeout: f64,
    /// One rank per GPU: this rank drives only GPU number LOCAL_RANK of `side.gpus`.
    pub gpu_per_rank: bool,
    /// The provider asked for (part of the options every rank must share; "" for none).
    pub provider: String,
}

struct Job<'a> {
    cfg: &'a SideCfg,
    plan: &'a Plan,
    pattern: Pattern,
    launch: &'a Launch,
    rdv: &'a Rendezvous,
    /// The provider asked for (part of the options every rank must share).
    provider: String,
    timeout: Duration,
}

impl WithTransport for Job<'_> {
    type Output = Option<JobReport>;
    fn call<T: Transport>(self) -> Result<Option<JobReport>> {
        job::<T>(&self)
    }
}

/// The `run` subcommand: this rank's part of the job. Rank 0 returns the job's report, the
/// other ranks `None`.
pub fn run(a: RunCfg) -> Result<Option<JobReport>> {
    let env = |k: &str| std::env::var(k).ok();
    let launch = launch::detect(&env)?;
    let rdv = launch::rendezvous(a.rendezvous.as_deref(), &env)?;
    let t = a.rendezvous_timeout;
    if !(t.is_finite() && t > 0.0 && t < 1e6) {
        return Err(Error::Usage(
            "--rendezvous-timeout: seconds, more than 0".into(),
        ));
    }
    let plan = a.plan;
    if plan.rounds > 1 {
        return Err(Error::Usage(
            "--rounds: loopback and client repeat a plan in rounds; rdma-bench run runs it once"
                .into(),
        ));
    }
    if plan.imm_every > 1 {
        return Err(Error::Usage(
            "--imm-every: loopback and client only; rdma-bench run posts one immediate per pass"
                .into(),
        ));
    }
    if !matches!(plan.workload, Workload::Write | Workload::Rate) {
        return Err(Error::Usage(format!(
            "rdma-bench run moves pages with WRITE: use --workload write or rate, not {}",
            plan.workload
        )));
    }
    if a.pattern.targets(0, launch.world).is_none() {
        return Err(Error::Usage(format!(
            "--pattern {} pairs ranks: it needs an even number of ranks, this job has {}",
            a.pattern, launch.world
        )));
    }
    let mut cfg = a.side;
    if a.gpu_per_rank {
        let l = launch.local_rank as usize;
        let Some(&g) = cfg.gpus.get(l) else {
            return Err(Error::Usage(format!(
                "--gpu-per-rank: local rank {l} has no GPU in --gpus {:?}; list one GPU per rank \
                 of a node",
                cfg.gpus
            )));
        };
        cfg.gpus = vec![g];
        cfg.check()?;
    }
    let job = Job {
        cfg: &cfg,
        plan: &plan,
        pattern: a.pattern,
        launch: &launch,
        rdv: &rdv,
        provider: a.provider,
        timeout: Duration::from_secs_f64(t),
    };
    dispatch(cfg.backend, job)
}

fn layout(plan: &Plan, i: usize, npg: usize) -> PageLayout {
    let p = &plan.runs[i];
    PageLayout {
        page_size: p.size as usize,
        pages: p.pages,
        used: if p.knobs.nic_groups { npg } else { 1 },
    }
}

fn spec<T: Transport>(j: &Job<'_>) -> RankSpec {
    RankSpec {
        build: env!("CARGO_PKG_VERSION").into(),
        backend: T::BACKEND.into(),
        provider: j.provider.clone(),
        pattern: j.pattern,
        workload: j.plan.workload,
        gpus: j.cfg.gpus.len() as u32,
        nics_per_gpu: j.cfg.nics_per_gpu as u32,
        mem: j.cfg.mem,
        seed: j.plan.seed,
        verify: j.plan.verify,
        runs: j
            .plan
            .runs
            .iter()
            .map(|p| RunSpec {
                stage: p.stage.clone(),
                size: p.size,
                pages: p.pages,
                iters: p.iters,
                knobs: p.knobs,
            })
            .collect(),
    }
}

fn job<T: Transport>(j: &Job<'_>) -> Result<Option<JobReport>> {
    let (rank, world) = (j.launch.rank, j.launch.world);
    let cfg = j.cfg;
    // The watchdog acts within the idle timeout of a rank's death.
    let grace = cfg.idle;
    let me = Join {
        magic: MAGIC.into(),
        version: VERSION,
        rank,
        world,
        local_rank: j.launch.local_rank,
        host: launch::hostname(),
        pid: std::process::id(),
        spec: spec::<T>(j),
    };
    if cfg.verbose > 0 {
        eprintln!(
            "rdma-bench: rank {rank} of {world} ({}, local rank {}), rendezvous {} (from {})",
            j.launch.launcher, j.launch.local_rank, j.rdv, j.rdv.from
        );
    }
    let mut coord = if rank == 0 {
        let listener = rendezvous::listen(j.rdv)?;
        Coord::Root(Hub::accept(&listener, &me, j.timeout, grace)?)
    } else {
        Coord::Leaf(Leaf::join(j.rdv, &me, j.timeout, grace)?)
    };
    // From the first endpoint to the last barrier this process uses its endpoints: should a
    // peer die and this rank not end on its own within the grace period (a thread spinning
    // inside the provider), the control connection's watchdog ends it.
    let live = coord.liveness();
    let busy = live.busy();
    let mut links: Vec<Link<T>> = Vec::new();
    let r = ranks_main(j, &mut coord, &mut links);
    match r {
        Ok(rep) => {
            drop(busy);
            Ok(rep)
        }
        Err(_) if links.is_empty() => r.map_err(|e| coord.fail(e)),
        Err(e) => {
            let e = coord.fail(e);
            // The job failed, often because a peer died: closing endpoints it may have
            // wedged (a queue lock it held), or letting libfabric's destructors run beside a
            // thread stuck inside it, can hang or crash this rank. End here instead, with the
            // message and status main would give.
            eprintln!("rdma-bench: error: {e}");
            bench_core::ctrl::abandon(e.exit_code())
        }
    }
}

fn ranks_main<T: Transport>(
    j: &Job<'_>,
    coord: &mut Coord,
    links: &mut Vec<Link<T>>,
) -> Result<Option<JobReport>> {
    let (rank, world) = (j.launch.rank, j.launch.world);
    let (cfg, plan) = (j.cfg, j.plan);
    let npg = cfg.nics_per_gpu;
    let nics = cfg.gpus.len() * npg;
    let len = |jj: usize| {
        (0..plan.runs.len())
            .map(|i| {
                let l = layout(plan, i, npg);
                l.slots(jj).saturating_mul(l.page_size as u64)
            })
            .max()
            .unwrap_or(0)
    };
    *links = data::open_links::<T>(cfg, j.pattern, rank, world, len)?;
    for (k, l) in links.iter().enumerate() {
        let lim = l.ep.caps().max_write_size as u64;
        if let Some(p) = plan.runs.iter().find(|p| lim > 0 && p.size > lim) {
            return Err(Error::Usage(format!(
                "size {} is over the largest WRITE of link {k} (NIC {}): {lim} bytes",
                p.size, l.nic
            )));
        }
    }
    let mine = Links {
        rank,
        links: data::wire(links),
    };
    let ends = coord.exchange(mine, j.timeout)?;
    for (k, e) in ends.iter().enumerate() {
        let p = plan.max_size();
        if e.max_write_size > 0 && p > e.max_write_size && links[k].send {
            return Err(Error::Usage(format!(
                "size {p} is over rank {}'s largest WRITE on NIC {}: {} bytes",
                e.peer, e.nic, e.max_write_size
            )));
        }
    }
    data::connect(links, ends)?;
    let names: Vec<String> = (0..nics)
        .map(|n| {
            links
                .iter()
                .find(|l| l.nic == n)
                .map(|l| l.ep.nic_name().to_string())
                .unwrap_or_default()
        })
        .collect();
    let provider = links
        .first()
        .map(|l| l.ep.provider().to_string())
        .unwrap_or_default();
    let live = coord.liveness();
    let mut buf = vec![Completion::default(); 16];
    let mut barrier = 0u32;
    let mut results: Vec<Vec<RankDone>> = Vec::new();
    // Waits between phases are bounded by the rendezvous timeout plus the idle timeout: a
    // slow rank may still be filling its buffers.
    let wait = j.timeout + cfg.idle;
    for (id, p) in plan.runs.iter().enumerate() {
        let phase = Phase {
            rank,
            world,
            pattern: j.pattern,
            npg,
            gpus: &cfg.gpus,
            layout: layout(plan, id, npg),
            seed: plan.seed,
            knobs: p.knobs,
            live: &live,
            idle: cfg.idle,
            hints: cfg.hints.as_ref(),
        };
        phase.prepare(links, plan.verify)?;
        let mut poll = |ls: &mut Vec<Link<T>>| data::poll_idle(ls, &mut buf);
        coord.barrier(barrier, wait, &mut || poll(links))?;
        barrier += 1;
        if cfg.verbose > 0 {
            eprintln!("rdma-bench: rank {rank}: run {id} started");
        }
        let busy = live.busy();
        if p.knobs.warmup > 0 {
            phase.run(links, u64::from(p.knobs.warmup))?;
            drop(busy);
            coord.barrier(barrier, wait, &mut || poll(links))?;
            barrier += 1;
        } else {
            drop(busy);
        }
        let busy = live.busy();
        let out = phase.run(links, p.iters)?;
        drop(busy);
        if plan.verify {
            phase.verify(links)?;
        }
        let done = RankDone {
            rank,
            id: id as u32,
            seconds: out.seconds,
            verified: plan.verify,
            nics: names.clone(),
            links: data::link_stats(links, &out),
            cores: out.cores.clone(),
        };
        if cfg.verbose > 0 {
            eprintln!(
                "rdma-bench: rank {rank}: run {id} done in {:.4} s",
                out.seconds
            );
        }
        if let Some(all) = coord.gather(done, wait, &mut || poll(links))? {
            results.push(all);
        }
    }
    let mut poll = |ls: &mut Vec<Link<T>>| data::poll_idle(ls, &mut buf);
    coord.finish(barrier, wait, &mut || poll(links))?;
    if cfg.verbose > 0 {
        eprintln!("rdma-bench: rank {rank}: the job is complete");
    }
    let Coord::Root(hub) = coord else {
        return Ok(None);
    };
    Ok(Some(build(j, &provider, &hub.members, &results)))
}

// ---------------------------------------------------------------------------------------
// The job's report

/// min/median/max of one figure across ranks.
#[derive(Clone, Debug, Serialize)]
pub struct Spread {
    pub min: f64,
    pub min_rank: u32,
    pub median: f64,
    pub max: f64,
    pub max_rank: u32,
}

/// One rank's figures of one run.
#[derive(Clone, Debug, Serialize)]
pub struct RankRow {
    pub rank: u32,
    pub host: String,
    pub local_rank: u32,
    pub tx_bytes: u64,
    pub tx_seconds: f64,
    pub tx_gbps: f64,
    pub rx_bytes: u64,
    pub rx_seconds: f64,
    pub rx_gbps: f64,
    pub cores: Vec<u32>,
}

/// One NIC of one rank.
#[derive(Clone, Debug, Serialize)]
pub struct NicRow {
    pub rank: u32,
    pub host: String,
    pub nic: u32,
    /// GPU index in the rank's list.
    pub gpu: u32,
    pub name: String,
    pub tx_bytes: u64,
    pub tx_gbps: f64,
    pub rx_bytes: u64,
    pub rx_gbps: f64,
}

/// The straggler: the rank (or NIC) that sent slowest.
#[derive(Clone, Debug, Serialize)]
pub struct Slowest {
    pub rank: u32,
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub tx_gbps: f64,
    /// How far below the median of its kind (ranks, or NICs), in percent.
    pub below_median_pct: f64,
}

/// One run of the job.
#[derive(Clone, Debug, Serialize)]
pub struct JobRun {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    pub size: u64,
    /// Pages per GPU and peer.
    pub pages: u64,
    pub iters: u64,
    pub knobs: Knobs,
    /// Bytes every rank together sent in the timed phase.
    pub bytes: u64,
    /// The slowest rank's timed phase.
    pub seconds: f64,
    /// All ranks' bytes over the slowest rank's time.
    pub aggregate_gbps: f64,
    pub tx_gbps: Option<Spread>,
    pub rx_gbps: Option<Spread>,
    pub slowest_rank: Option<Slowest>,
    pub slowest_nic: Option<Slowest>,
    pub ranks: Vec<RankRow>,
    pub nics: Vec<NicRow>,
}

/// What rank 0 prints for the whole job.
#[derive(Clone, Debug, Serialize)]
pub struct JobReport {
    pub pattern: String,
    pub workload: String,
    pub backend: String,
    pub provider: String,
    pub mem: String,
    pub launcher: Launcher,
    pub world: u32,
    pub gpus_per_rank: usize,
    pub nics_per_gpu: usize,
    pub verified: bool,
    pub runs: Vec<JobRun>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Spread of `(rank, value)` pairs.
pub fn spread(vals: &[(u32, f64)]) -> Option<Spread> {
    let min = vals.iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
    let max = vals.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
    let mut v: Vec<f64> = vals.iter().map(|x| x.1).collect();
    Some(Spread {
        min: min.1,
        min_rank: min.0,
        median: median(&mut v),
        max: max.1,
        max_rank: max.0,
    })
}

fn below(v: f64, median: f64) -> f64 {
    if median > 0.0 {
        100.0 * (median - v) / median
    } else {
        0.0
    }
}

fn host_of(members: &[Member], rank: u32) -> (String, u32) {
    members
        .iter()
        .find(|m| m.rank == rank)
        .map(|m| (m.host.clone(), m.local_rank))
        .unwrap_or_default()
}

/// One run's rows and summary from every rank's result.
pub fn summarize(members: &[Member], npg: usize, p: RunSpec, done: &[RankDone]) -> JobRun {
    let mut ranks = Vec::new();
    let mut nics = Vec::new();
    for d in done {
        let (host, local_rank) = host_of(members, d.rank);
        let dir = |send: bool| {
            let ls = d.links.iter().filter(move |l| l.send == send);
            let bytes: u64 = ls.clone().map(|l| l.bytes).sum();
            let secs = ls.map(|l| l.seconds).fold(0.0, f64::max);
            (bytes, secs)
        };
        let (tx_bytes, tx_seconds) = dir(true);
        let (rx_bytes, rx_seconds) = dir(false);
        ranks.push(RankRow {
            rank: d.rank,
            host: host.clone(),
            local_rank,
            tx_bytes,
            tx_seconds,
            tx_gbps: gbps(tx_bytes, tx_seconds),
            rx_bytes,
            rx_seconds,
            rx_gbps: gbps(rx_bytes, rx_seconds),
            cores: d.cores.clone(),
        });
        for (n, name) in d.nics.iter().enumerate() {
            let nic_dir = |send: bool| {
                let ls = d
                    .links
                    .iter()
                    .filter(move |l| l.send == send && l.nic as usize == n);
                let bytes: u64 = ls.clone().map(|l| l.bytes).sum();
                let secs = ls.map(|l| l.seconds).fold(0.0, f64::max);
                (bytes, gbps(bytes, secs))
            };
            let ((tx_bytes, tx_gbps), (rx_bytes, rx_gbps)) = (nic_dir(true), nic_dir(false));
            nics.push(NicRow {
                rank: d.rank,
                host: host.clone(),
                nic: n as u32,
                gpu: (n / npg.max(1)) as u32,
                name: name.clone(),
                tx_bytes,
                tx_gbps,
                rx_bytes,
                rx_gbps,
            });
        }
    }
    let tx: Vec<(u32, f64)> = ranks
        .iter()
        .filter(|r| r.tx_bytes > 0)
        .map(|r| (r.rank, r.tx_gbps))
        .collect();
    let rx: Vec<(u32, f64)> = ranks
        .iter()
        .filter(|r| r.rx_bytes > 0)
        .map(|r| (r.rank, r.rx_gbps))
        .collect();
    let tx_spread = spread(&tx);
    let slowest_rank = tx_spread.as_ref().map(|s| {
        let (host, _) = host_of(members, s.min_rank);
        Slowest {
            rank: s.min_rank,
            host,
            nic: None,
            name: None,
            tx_gbps: s.min,
            below_median_pct: below(s.min, s.median),
        }
    });
    let sending: Vec<&NicRow> = nics.iter().filter(|n| n.tx_bytes > 0).collect();
    let mut nic_vals: Vec<f64> = sending.iter().map(|n| n.tx_gbps).collect();
    let nic_median = median(&mut nic_vals);
    let slowest_nic = sending
        .iter()
        .min_by(|a, b| a.tx_gbps.total_cmp(&b.tx_gbps))
        .map(|n| Slowest {
            rank: n.rank,
            host: n.host.clone(),
            nic: Some(n.nic),
            name: Some(n.name.clone()),
            tx_gbps: n.tx_gbps,
            below_median_pct: below(n.tx_gbps, nic_median),
        });
    let bytes: u64 = ranks.iter().map(|r| r.tx_bytes).sum();
    let seconds = ranks
        .iter()
        .map(|r| r.tx_seconds.max(r.rx_seconds))
        .fold(0.0, f64::max);
    JobRun {
        stage: p.stage,
        size: p.size,
        pages: p.pages,
        iters: p.iters,
        knobs: p.knobs,
        bytes,
        seconds,
        aggregate_gbps: gbps(bytes, seconds),
        tx_gbps: tx_spread,
        rx_gbps: spread(&rx),
        slowest_rank,
        slowest_nic,
        ranks,
        nics,
    }
}

fn build(j: &Job<'_>, provider: &str, members: &[Member], results: &[Vec<RankDone>]) -> JobReport {
    let spec = j.plan.runs.iter().map(|p| RunSpec {
        stage: p.stage.clone(),
        size: p.size,
        pages: p.pages,
        iters: p.iters,
        knobs: p.knobs,
    });
    JobReport {
        pattern: j.pattern.to_string(),
        workload: j.plan.workload.to_string(),
        backend: j.cfg.backend.to_string(),
        provider: provider.to_string(),
        mem: j.cfg.mem.to_string(),
        launcher: j.launch.launcher,
        world: j.launch.world,
        gpus_per_rank: j.cfg.gpus.len(),
        nics_per_gpu: j.cfg.nics_per_gpu,
        verified: j.plan.verify,
        runs: spec
            .zip(results)
            .map(|(p, done)| summarize(members, j.cfg.nics_per_gpu, p, done))
            .collect(),
    }
}

/// The human table of a job.
pub fn render(r: &JobReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {} over {}/{}: {} ranks ({}), {} memory, {} GPU(s) x {} NIC(s) per rank{}",
        r.pattern,
        r.workload,
        r.backend,
        r.provider,
        r.world,
        r.launcher,
        r.mem,
        r.gpus_per_rank,
        r.nics_per_gpu,
        if r.verified {
            ", every byte verified"
        } else {
            ""
        }
    );
    for run in &r.runs {
        let _ = writeln!(
            out,
            "\n{}size {}, {} page(s) per GPU and peer, {} repeat(s): {:.2} Gbit/s aggregate in {:.4} s",
            run.stage
                .as_deref()
                .map(|s| format!("[{s}] "))
                .unwrap_or_default(),
            human_bytes(run.size),
            run.pages,
            run.iters,
            run.aggregate_gbps,
            run.seconds
        );
        let _ = writeln!(
            out,
            "{:>5} {:<20} {:>5} {:>14} {:>10} {:>14} {:>10}",
            "rank", "host", "local", "tx bytes", "tx Gbit/s", "rx bytes", "rx Gbit/s"
        );
        for k in &run.ranks {
            let _ = writeln!(
                out,
                "{:>5} {:<20} {:>5} {:>14} {:>10.2} {:>14} {:>10.2}",
                k.rank, k.host, k.local_rank, k.tx_bytes, k.tx_gbps, k.rx_bytes, k.rx_gbps
            );
        }
        for (what, s) in [("tx", &run.tx_gbps), ("rx", &run.rx_gbps)] {
            if let Some(s) = s {
                let _ = writeln!(
                    out,
                    "{what} Gbit/s across ranks: min {:.2} (rank {}), median {:.2}, max {:.2} (rank {})",
                    s.min, s.min_rank, s.median, s.max, s.max_rank
                );
            }
        }
        let _ = writeln!(
            out,
            "per NIC:\n{:>5} {:>4} {:>4} {:<16} {:>10} {:>10}",
            "rank", "nic", "gpu", "name", "tx Gbit/s", "rx Gbit/s"
        );
        for n in &run.nics {
            let _ = writeln!(
                out,
                "{:>5} {:>4} {:>4} {:<16} {:>10.2} {:>10.2}",
                n.rank, n.nic, n.gpu, n.name, n.tx_gbps, n.rx_gbps
            );
        }
        if let Some(s) = &run.slowest_rank {
            let _ = writeln!(
                out,
                "slowest rank: {} on {}, {:.2} Gbit/s tx, {:.1}% below the median",
                s.rank, s.host, s.tx_gbps, s.below_median_pct
            );
        }
        if let Some(s) = &run.slowest_nic {
            let _ = writeln!(
                out,
                "slowest NIC: rank {} on {}, NIC {} ({}), {:.2} Gbit/s tx, {:.1}% below the median NIC",
                s.rank,
                s.host,
                s.nic.unwrap_or(0),
                s.name.as_deref().unwrap_or(""),
                s.tx_gbps,
                s.below_median_pct
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bench_core::proto::LinkStats;

    fn done(rank: u32, tx: &[(u32, u64, f64)], rx: &[(u32, u64, f64)]) -> RankDone {
        let mut links = Vec::new();
        for &(nic, bytes, seconds) in tx {
            links.push(LinkStats {
                peer: 9,
                nic,
                send: true,
                bytes,
                ops: 1,
                seconds,
            });
        }
        for &(nic, bytes, seconds) in rx {
            links.push(LinkStats {
                peer: 9,
                nic,
                send: false,
                bytes,
                ops: 1,
                seconds,
            });
        }
        RankDone {
            rank,
            id: 0,
            seconds: 1.0,
            verified: true,
            nics: vec!["a".into(), "b".into()],
            links,
            cores: vec![],
        }
    }

    #[test]
    fn summary_finds_the_straggler_nic_and_rank() {
        let members: Vec<Member> = (0..3)
            .map(|r| Member {
                rank: r,
                host: format!("h{r}"),
                local_rank: 0,
                pid: 1,
            })
            .collect();
        let g = 1_000_000_000 / 8; // bytes for 1 Gbit
        let all = vec![
            done(0, &[(0, 10 * g, 1.0), (1, 10 * g, 1.0)], &[(0, g, 1.0)]),
            // Rank 1's NIC 1 takes twice as long.
            done(1, &[(0, 10 * g, 1.0), (1, 10 * g, 2.0)], &[]),
            done(2, &[(0, 10 * g, 1.0), (1, 10 * g, 1.0)], &[]),
        ];
        let p = RunSpec {
            stage: None,
            size: 4096,
            pages: 1,
            iters: 1,
            knobs: Knobs::baseline(),
        };
        let r = summarize(&members, 2, p, &all);
        let s = r.slowest_rank.as_ref().unwrap();
        assert_eq!((s.rank, s.host.as_str()), (1, "h1"));
        assert!((s.tx_gbps - 10.0).abs() < 1e-9, "{}", s.tx_gbps);
        let n = r.slowest_nic.as_ref().unwrap();
        assert_eq!((n.rank, n.nic, n.name.as_deref()), (1, Some(1), Some("b")));
        assert!((n.tx_gbps - 5.0).abs() < 1e-9);
        assert!((n.below_median_pct - 50.0).abs() < 1e-9);
        let t = r.tx_gbps.as_ref().unwrap();
        assert_eq!(t.min_rank, 1);
        assert_ne!(t.max_rank, 1);
        assert!((t.median - 20.0).abs() < 1e-9);
        assert_eq!(r.rx_gbps.as_ref().unwrap().min_rank, 0);
        assert_eq!(r.nics.len(), 6);
        assert_eq!(r.bytes, 60 * g);
        let rep = JobReport {
            pattern: "all-to-all".into(),
            workload: "write".into(),
            backend: "efa".into(),
            provider: "shm".into(),
            mem: "host".into(),
            launcher: Launcher::Torchrun,
            world: 3,
            gpus_per_rank: 1,
            nics_per_gpu: 2,
            verified: true,
            runs: vec![r],
        };
        let t = render(&rep);
        assert!(t.contains("slowest NIC: rank 1 on h1, NIC 1 (b)"), "{t}");
        assert!(t.contains("slowest rank: 1 on h1"), "{t}");
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
        assert!(spread(&[]).is_none());
    }
}
