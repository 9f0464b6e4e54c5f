//! One rank's job, generic over the backend: it meets the others at rank 0, opens and connects
//! its links, runs every run of the plan between barriers, and (rank 0) builds the job's report.

use std::time::Duration;

use transport_core::{Completion, Transport};

use crate::launch::{self, Launch, Rendezvous};
use crate::rendezvous::{self, Coord, Hub, Leaf, Member};
use bench_core::buffers::PageLayout;
use bench_core::config::Pattern;
use bench_core::ctrl::TEARDOWN_GRACE;
use bench_core::error::{Error, Result};
use bench_core::plan::Plan;
use bench_core::proto::{Join, Links, RankDone, RankSpec, RunSpec, MAGIC, MAX_NAME, VERSION};
use bench_core::record::{endpoints_runtime, Facts, RankFacts, Record};
use bench_core::side::SideCfg;
use bench_core::workload::ranks::{self as data, Link, Phase};

use super::report::{summarize, JobReport};

pub(super) struct Job<'a> {
    pub(super) cfg: &'a SideCfg,
    pub(super) plan: &'a Plan,
    pub(super) pattern: Pattern,
    pub(super) launch: &'a Launch,
    pub(super) rdv: &'a Rendezvous,
    /// The provider asked for (part of the options every rank must share).
    pub(super) provider: String,
    pub(super) timeout: Duration,
}

/// What a good job's teardown may take per link beyond [`TEARDOWN_GRACE`]: a backend bounds
/// each close (UCX waits up to 2 s for a forced close to complete).
const PER_LINK_CLOSE: Duration = Duration::from_secs(2);

/// The watchdog's grace for closing `links` links.
fn teardown_grace(links: usize) -> Duration {
    TEARDOWN_GRACE + PER_LINK_CLOSE * u32::try_from(links).unwrap_or(u32::MAX / 4)
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

pub(super) fn job<T: Transport>(j: &Job<'_>, emit: &mut dyn FnMut(&JobReport)) -> Result<()> {
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
    // From the first endpoint until the last is closed this process uses its endpoints:
    // should a peer die and this rank not end on its own within the grace period (a thread
    // spinning inside the provider), the control connection's watchdog ends it.
    let live = coord.liveness();
    let busy = live.busy();
    let mut links: Vec<Link<T>> = Vec::new();
    let r = ranks_main(j, &mut coord, &mut links);
    match r {
        Ok(rep) => {
            // The job is done: rank 0's report goes out before any link closes, so a close
            // that hangs cannot lose it. The closes stay under the watchdog, armed now with
            // the teardown's grace (a peer closing its connection arms it too, but one that
            // stopped closes nothing), and a bounded allowance per link.
            if let Some(rep) = &rep {
                emit(rep);
            }
            let grace = teardown_grace(links.len());
            coord.watch_teardown("the job is complete and its links are closing", grace);
            drop(links);
            drop(busy);
            Ok(())
        }
        Err(e) if links.is_empty() => Err(coord.fail(e)),
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
    // From now on a peer's orderly end (it closes its connection after its own teardown)
    // gives this rank's teardown as long as it may need, not the default grace.
    coord
        .liveness()
        .raise_teardown_grace(teardown_grace(links.len()));
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
    // Read once the peers are added: a backend may decide per peer (UCX's write=auto), and
    // the record says what it decided. Rank 0 gets it with run 0's result.
    let runtime = endpoints_runtime(links.iter().map(|l| l.ep.runtime()), MAX_NAME);
    let mut facts = Some(Box::new(cfg.facts.with_backend(runtime)));
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
            facts: facts.take(),
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
    let mut rep = build(j, T::BACKEND, &provider, &hub.members, &results);
    rep.record = results.first().and_then(|all| record(all));
    Ok(Some(rep))
}

/// The job's run record, from run 0's results: rank 0's facts, and each other rank's where
/// they differ from them.
fn record(run0: &[RankDone]) -> Option<Record> {
    let facts: Vec<(u32, &Facts)> = run0
        .iter()
        .filter_map(|d| Some((d.rank, d.facts.as_deref()?)))
        .collect();
    let first = facts.iter().find(|(r, _)| *r == 0)?.1;
    let mut rec = Record::now(first.clone());
    rec.ranks = facts
        .iter()
        .filter(|(r, f)| *r != 0 && *f != first)
        .map(|&(rank, f)| RankFacts {
            rank,
            facts: f.clone(),
        })
        .collect();
    Some(rec)
}

fn build(
    j: &Job<'_>,
    backend: &str,
    provider: &str,
    members: &[Member],
    results: &[Vec<RankDone>],
) -> JobReport {
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
        backend: backend.to_string(),
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
        record: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 0's facts head the record; another rank's follow only where they differ.
    #[test]
    fn the_record_lists_the_ranks_that_differ() {
        let f = |host: &str| Facts {
            host: host.into(),
            rdma_bench: "0.1.0".into(),
            ..Facts::default()
        };
        let done = |rank: u32, host: &str| RankDone {
            rank,
            facts: Some(Box::new(f(host))),
            ..RankDone::default()
        };
        let mut all = vec![done(0, "a"), done(1, "a"), done(2, "b"), done(3, "a")];
        let r = record(&all).unwrap();
        assert_eq!(r.this.host, "a");
        assert_eq!(r.ranks.len(), 1);
        assert_eq!((r.ranks[0].rank, r.ranks[0].facts.host.as_str()), (2, "b"));
        assert!(record(&all[1..]).is_none(), "no rank 0, no record");
        all[2].facts = None;
        assert!(
            record(&all).unwrap().ranks.is_empty(),
            "a rank without facts"
        );
    }
}
