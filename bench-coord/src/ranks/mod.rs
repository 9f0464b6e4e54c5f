//! `rdma-bench run`: one command, started once per rank by Slurm (`srun`), Open MPI
//! (`mpirun`), a PMI launcher or torchrun-style variables; N ranks, one traffic pattern, one
//! report printed by rank 0.
//!
//! The rank finds its place in the job ([`crate::launch`]), meets the others at rank 0
//! ([`crate::rendezvous`]), and runs the `write` workload's WRITEs over links to its peers
//! ([`bench_core::workload::ranks`]). Rank 0 prints one table (or `--json`) for the whole job:
//! per rank and per NIC, min/median/max across ranks, and the slowest rank and NIC.
//!
//! This file checks the flags and runs the job on the backend it is given; `job.rs` is the job
//! (rendezvous, links, the runs), `report.rs` rank 0's report of it and its rendering.

use std::time::Duration;

use transport_core::Transport;

use crate::launch;
use bench_core::config::{Pattern, Workload};
use bench_core::error::{Error, Result};
use bench_core::plan::Plan;
use bench_core::side::SideCfg;

mod job;
mod report;
#[cfg(test)]
mod teardown_test;

use job::Job;
pub use report::{render, spread, summarize, JobReport, JobRun, NicRow, RankRow, Slowest, Spread};

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

/// The `run` subcommand: this rank's part of the job, on backend `T`. Rank 0 hands the job's
/// report to `emit` once every rank is done, before it closes its links (a close that hangs
/// cannot lose the report); the other ranks never call it.
pub fn run<T: Transport>(a: RunCfg, emit: &mut dyn FnMut(&JobReport)) -> Result<()> {
    let env = |k: &str| std::env::var(k).ok();
    let launch = launch::detect(&env)?;
    let rdv = launch::rendezvous(a.rendezvous.as_deref(), &env)?;
    let t = a.rendezvous_timeout;
    if !(t.is_finite() && t > 0.0 && t < 1e6) {
        return Err(Error::Usage(
            "--rendezvous-timeout: seconds, more than 0 and below 1000000".into(),
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
    job::job::<T>(&job, emit)
}
