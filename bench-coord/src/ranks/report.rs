//! Rank 0's report of the job: per rank and per NIC, min/median/max across ranks, the slowest
//! rank and NIC ([`summarize`]), and the human table of it all ([`render`]).

use std::fmt::Write as _;

use serde::Serialize;

use crate::launch::Launcher;
use crate::rendezvous::Member;
use bench_core::config::Knobs;
use bench_core::proto::{RankDone, RunSpec};
use bench_core::record::Record;
use bench_core::report::{gbps, median};
use bench_core::units::human_bytes;

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
    /// What ran, where and on what: rank 0's facts, and each rank's that differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
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
            let bytes = ls.clone().fold(0u64, |a, l| a.saturating_add(l.bytes));
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
                let bytes = ls.clone().fold(0u64, |a, l| a.saturating_add(l.bytes));
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
    // Each rank's figures are its own to send: saturate, never overflow.
    let bytes = ranks.iter().fold(0u64, |a, r| a.saturating_add(r.tx_bytes));
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
            facts: None,
        }
    }

    /// Byte counts are each rank's to send: sums past u64 saturate (a debug build panicked).
    #[test]
    fn a_ranks_byte_counts_cannot_overflow_the_summary() {
        let all = vec![done(0, &[(0, u64::MAX, 1.0), (1, u64::MAX, 1.0)], &[])];
        let r = summarize(&members(1), 2, run_spec(), &all);
        assert_eq!(r.bytes, u64::MAX);
    }

    /// Ranks `0..n`, rank r on host `hr`.
    fn members(n: u32) -> Vec<Member> {
        (0..n)
            .map(|r| Member {
                rank: r,
                host: format!("h{r}"),
                local_rank: 0,
                pid: 1,
            })
            .collect()
    }

    fn run_spec() -> RunSpec {
        RunSpec {
            stage: None,
            size: 4096,
            pages: 1,
            iters: 1,
            knobs: Knobs::baseline(),
        }
    }

    #[test]
    fn summary_finds_the_straggler_nic_and_rank() {
        let members = members(3);
        let g = 1_000_000_000 / 8; // bytes for 1 Gbit
        let all = vec![
            done(0, &[(0, 10 * g, 1.0), (1, 10 * g, 1.0)], &[(0, g, 1.0)]),
            // Rank 1's NIC 1 takes twice as long.
            done(1, &[(0, 10 * g, 1.0), (1, 10 * g, 2.0)], &[]),
            done(2, &[(0, 10 * g, 1.0), (1, 10 * g, 1.0)], &[]),
        ];
        let r = summarize(&members, 2, run_spec(), &all);
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
            record: None,
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
