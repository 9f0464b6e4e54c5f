//! Results: the JSON object scripts read and the tables people read.

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::config::Knobs;
use crate::record::Record;
use crate::units::human_bytes;

pub use crate::progress::Progress;

/// One NIC's share of a run.
#[derive(Clone, Debug, Serialize)]
pub struct NicReport {
    pub index: usize,
    /// GPU ordinal (or logical group) the NIC serves.
    pub gpu: usize,
    /// NIC as opened on this side.
    pub nic: String,
    pub bytes: u64,
    pub ops: u64,
    pub seconds: f64,
    pub gbps: f64,
    /// Link speed where the NIC reports it.
    pub link_gbps: Option<f64>,
    pub pct_line_rate: Option<f64>,
}

/// One run: one workload at one size with one set of knobs.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub workload: String,
    pub backend: String,
    pub provider: String,
    /// Ladder stage, for `--ladder`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    pub mem: String,
    pub gpus: Vec<usize>,
    pub nics: usize,
    /// Page or message size.
    pub size: u64,
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
    pub mops: f64,
    /// Sum of the used NICs' link speeds, where every one reports it.
    pub line_rate_gbps: Option<f64>,
    pub pct_line_rate: Option<f64>,
    /// Every received byte was checked against the pattern (and matched).
    pub verified: bool,
    pub knobs: Knobs,
    /// Cores the posting threads were pinned to.
    pub cores: Vec<u32>,
    pub per_nic: Vec<NicReport>,
    /// Latency operation (`lat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// One-way latency, half the round trip (`lat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_us: Option<f64>,
    /// With `--rounds`: this run is the median round, and these are every round's figures
    /// in the order they ran (Gbit/s; p50 one-way us for `lat`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<f64>,
}

impl RunReport {
    /// The figure rounds are ranked by: Gbit/s, or the p50 latency for `lat`.
    fn figure(&self) -> f64 {
        if self.workload == "lat" {
            self.p50_us.unwrap_or(f64::INFINITY)
        } else {
            self.gbps
        }
    }

    /// Lowest and highest figure over the rounds, where there were several.
    pub fn spread(&self) -> Option<(f64, f64)> {
        (self.rounds.len() > 1).then(|| {
            self.rounds
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                })
        })
    }
}

/// Fold `rounds` interleaved rounds (`runs` holds the list of one round `rounds` times over)
/// into one report per entry of the list: the median round (the lower middle one for an
/// even count: the figure a reader can rely on), carrying every round's figure.
pub fn combine_rounds(runs: Vec<RunReport>, rounds: u32) -> Vec<RunReport> {
    let rounds = rounds.max(1) as usize;
    if rounds == 1 || !runs.len().is_multiple_of(rounds) {
        return runs;
    }
    let per_round = runs.len() / rounds;
    let mut slots: Vec<Vec<RunReport>> = (0..per_round).map(|_| Vec::new()).collect();
    for (i, r) in runs.into_iter().enumerate() {
        slots[i % per_round].push(r);
    }
    slots
        .into_iter()
        .filter_map(|mut all| {
            let figures: Vec<f64> = all.iter().map(RunReport::figure).collect();
            // Better first: higher Gbit/s, lower latency.
            let lat = all.first().is_some_and(|r| r.workload == "lat");
            all.sort_by(|a, b| {
                let (x, y) = (a.figure(), b.figure());
                if lat {
                    x.total_cmp(&y)
                } else {
                    y.total_cmp(&x)
                }
            });
            let mut median = all.into_iter().nth(rounds / 2)?;
            median.rounds = figures;
            Some(median)
        })
        .collect()
}

/// The median of `v` (the mean of the two middle values for an even count; 0 for none),
/// sorting `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Gbit/s of `bytes` in `seconds`.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds / 1e9
    } else {
        0.0
    }
}

/// Millions of operations per second.
pub fn mops(ops: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        ops as f64 / seconds / 1e6
    } else {
        0.0
    }
}

/// Percent of `line`, where known and non-zero.
pub fn pct(gbps: f64, line: Option<f64>) -> Option<f64> {
    line.filter(|&l| l > 0.0).map(|l| 100.0 * gbps / l)
}

/// What `--json` prints: the last run's fields at the top, every run in `runs`, and the run
/// record (what ran, where and on what).
#[derive(Serialize)]
pub struct JsonOut<'a> {
    #[serde(flatten)]
    pub last: &'a RunReport,
    pub runs: &'a [RunReport],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<&'a Record>,
}

/// The JSON object for a list of runs (one object, whatever the count), with their record.
pub fn to_json(runs: &[RunReport], record: Option<&Record>) -> String {
    match runs.last() {
        Some(last) => serde_json::to_string_pretty(&JsonOut { last, runs, record })
            .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
        None => "{}".into(),
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

fn headline(r: &RunReport) -> String {
    let mut s = format!(
        "{} over {}/{}, {} memory, {} GPU(s) x {} NIC(s)",
        r.workload,
        r.backend,
        r.provider,
        r.mem,
        r.gpus.len(),
        r.nics / r.gpus.len().max(1)
    );
    if r.verified {
        s.push_str(", every byte verified");
    }
    s
}

/// What a ladder step did, judged against the spread of the two stages' rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// One round (or none) on either side: no spread, so noise cannot be told from a step.
    Unknown,
    /// The two stages' rounds overlap: the change of the median (percent) is within noise.
    WithinNoise(f64),
    /// Every round of this stage beat every round of the previous one (percent up).
    Gain(f64),
    /// Every round of this stage fell short of every round of the previous one (percent down).
    Loss(f64),
}

/// Classify a ladder step from the stage with `prev` rounds (median `prev_median`) to the
/// one with `cur` rounds (median `cur_median`), figures where higher is better. A change is
/// a gain or a loss only where the two stages' ranges (lowest..highest round) are apart;
/// where they overlap it lies within the noise of the rounds.
pub fn classify_step(prev_median: f64, prev: &[f64], cur_median: f64, cur: &[f64]) -> Step {
    if prev.len() < 2 || cur.len() < 2 {
        return Step::Unknown;
    }
    let range = |v: &[f64]| {
        v.iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            })
    };
    let ((plo, phi), (lo, hi)) = (range(prev), range(cur));
    let pct = if prev_median > 0.0 {
        100.0 * (cur_median / prev_median - 1.0)
    } else {
        0.0
    };
    if lo > phi {
        Step::Gain(pct)
    } else if hi < plo {
        Step::Loss(pct)
    } else {
        Step::WithinNoise(pct)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Unknown => f.write_str("-"),
            Step::WithinNoise(_) => f.write_str("within noise"),
            Step::Gain(p) | Step::Loss(p) => write!(f, "{p:+.0}%"),
        }
    }
}

/// The spread of a run's rounds relative to its median, in percent (`(max - min) / median`).
fn rel_spread(r: &RunReport) -> Option<f64> {
    let (lo, hi) = r.spread()?;
    (r.gbps > 0.0).then(|| 100.0 * (hi - lo) / r.gbps)
}

/// The human tables for a list of runs of one command.
pub fn render(runs: &[RunReport], ladder: bool) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else {
        return out;
    };
    let _ = writeln!(out, "{}", headline(first));
    if first.workload == "lat" {
        let _ = writeln!(
            out,
            "{:>8} {:>10} {:>10} {:>10} {:>10} {:>10}   (one-way, us: half the round trip, {})",
            "size",
            "iters",
            "min",
            "p50",
            "p99",
            "max",
            first.op.as_deref().unwrap_or("")
        );
        for r in runs {
            let _ = write!(
                out,
                "{:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
                human_bytes(r.size),
                r.ops,
                opt(r.min_us, 2),
                opt(r.p50_us, 2),
                opt(r.p99_us, 2),
                opt(r.max_us, 2)
            );
            if let Some((lo, hi)) = r.spread() {
                let _ = write!(out, "   p50 of {} rounds: {lo:.2}-{hi:.2}", r.rounds.len());
            }
            out.push('\n');
        }
        return out;
    }
    if ladder {
        let base = first.gbps;
        let rounds = first.rounds.len().max(1);
        let _ = writeln!(
            out,
            "{:<20} {:>10} {:>8} {:>9} {:>8} {:>15} {:>7} {:>12}",
            "stage", "Gbit/s", "% line", "x base", "Mops", "rounds min..max", "spread", "step"
        );
        let mut prev: Option<&RunReport> = None;
        for r in runs {
            let x = if base > 0.0 { r.gbps / base } else { 0.0 };
            let (range, spread) = match (r.spread(), rel_spread(r)) {
                (Some((lo, hi)), Some(s)) => (format!("{lo:.2}..{hi:.2}"), format!("{s:.0}%")),
                _ => ("-".to_string(), "-".to_string()),
            };
            let step = prev.map_or("".to_string(), |p| {
                classify_step(p.gbps, &p.rounds, r.gbps, &r.rounds).to_string()
            });
            let _ = writeln!(
                out,
                "{:<20} {:>10.2} {:>8} {:>9.2} {:>8.3} {:>15} {:>7} {:>12}",
                r.stage.as_deref().unwrap_or(""),
                r.gbps,
                opt(r.pct_line_rate, 1),
                x,
                r.mops,
                range,
                spread,
                step
            );
            prev = Some(r);
        }
        if rounds > 1 {
            let _ = writeln!(
                out,
                "(median of {rounds} interleaved rounds, Gbit/s; spread: (max - min) / median; \
                 step: change of the median, \"within noise\" where the two stages' rounds overlap)"
            );
        } else {
            let _ = writeln!(
                out,
                "(one round: no spread, so a step cannot be told from noise; run --rounds 3 or more)"
            );
        }
        return out;
    }
    let spread = first.spread().is_some();
    let _ = write!(
        out,
        "{:>8} {:>14} {:>10} {:>10} {:>8} {:>9} {:>9}",
        "size", "bytes", "seconds", "Gbit/s", "% line", "Mops", "verified"
    );
    if spread {
        let _ = write!(out, " {:>15}", "rounds min-max");
    }
    out.push('\n');
    for r in runs {
        let _ = write!(
            out,
            "{:>8} {:>14} {:>10.4} {:>10.2} {:>8} {:>9.3} {:>9}",
            human_bytes(r.size),
            r.bytes,
            r.seconds,
            r.gbps,
            opt(r.pct_line_rate, 1),
            r.mops,
            if r.verified { "yes" } else { "no" }
        );
        if let Some((lo, hi)) = r.spread() {
            let _ = write!(out, " {:>15}", format!("{lo:.2}-{hi:.2}"));
        }
        out.push('\n');
    }
    if spread {
        let _ = writeln!(out, "(median of {} interleaved rounds)", first.rounds.len());
    }
    if runs.len() == 1 && !first.per_nic.is_empty() {
        let _ = writeln!(
            out,
            "per NIC:\n{:>4} {:>4} {:<16} {:>14} {:>10} {:>10} {:>8}",
            "nic", "gpu", "name", "bytes", "seconds", "Gbit/s", "% line"
        );
        for n in &first.per_nic {
            let _ = writeln!(
                out,
                "{:>4} {:>4} {:<16} {:>14} {:>10.4} {:>10.2} {:>8}",
                n.index,
                n.gpu,
                n.nic,
                n.bytes,
                n.seconds,
                n.gbps,
                opt(n.pct_line_rate, 1)
            );
        }
    }
    out
}

/// `compare`: one row per pair.
pub fn render_compare(rows: &[(String, Result<RunReport, String>)]) -> String {
    let mut out = String::new();
    let lat = rows
        .iter()
        .any(|(_, r)| matches!(r, Ok(r) if r.workload == "lat"));
    if lat {
        let _ = writeln!(
            out,
            "{:<22} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9}",
            "pair", "size", "min us", "p50 us", "p99 us", "max us", "verified"
        );
    } else {
        let _ = writeln!(
            out,
            "{:<22} {:>8} {:>14} {:>10} {:>10} {:>9} {:>9}",
            "pair", "size", "bytes", "seconds", "Gbit/s", "Mops", "verified"
        );
    }
    for (pair, r) in rows {
        match r {
            Ok(r) if lat => {
                let _ = writeln!(
                    out,
                    "{:<22} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9}",
                    pair,
                    human_bytes(r.size),
                    opt(r.min_us, 2),
                    opt(r.p50_us, 2),
                    opt(r.p99_us, 2),
                    opt(r.max_us, 2),
                    if r.verified { "yes" } else { "no" }
                );
            }
            Ok(r) => {
                let _ = writeln!(
                    out,
                    "{:<22} {:>8} {:>14} {:>10.4} {:>10.2} {:>9.3} {:>9}",
                    pair,
                    human_bytes(r.size),
                    r.bytes,
                    r.seconds,
                    r.gbps,
                    r.mops,
                    if r.verified { "yes" } else { "no" }
                );
            }
            Err(e) => {
                let _ = writeln!(out, "{pair:<22} failed: {e}");
            }
        }
    }
    out
}
