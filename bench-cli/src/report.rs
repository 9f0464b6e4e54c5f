//! Results: the JSON object scripts read and the tables people read.

use std::fmt::Write as _;

use serde::Serialize;

use crate::config::Knobs;
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

/// What `--json` prints: the last run's fields at the top, every run in `runs`.
#[derive(Serialize)]
pub struct JsonOut<'a> {
    #[serde(flatten)]
    pub last: &'a RunReport,
    pub runs: &'a [RunReport],
}

/// The JSON object for a list of runs (one object, whatever the count).
pub fn to_json(runs: &[RunReport]) -> String {
    match runs.last() {
        Some(last) => serde_json::to_string_pretty(&JsonOut { last, runs })
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
            let _ = writeln!(
                out,
                "{:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
                human_bytes(r.size),
                r.ops,
                opt(r.min_us, 2),
                opt(r.p50_us, 2),
                opt(r.p99_us, 2),
                opt(r.max_us, 2)
            );
        }
        return out;
    }
    if ladder {
        let base = first.gbps;
        let _ = writeln!(
            out,
            "{:<20} {:>10} {:>8} {:>9} {:>8}",
            "stage", "Gbit/s", "% line", "x base", "Mops"
        );
        for r in runs {
            let x = if base > 0.0 { r.gbps / base } else { 0.0 };
            let _ = writeln!(
                out,
                "{:<20} {:>10.2} {:>8} {:>9.2} {:>8.3}",
                r.stage.as_deref().unwrap_or(""),
                r.gbps,
                opt(r.pct_line_rate, 1),
                x,
                r.mops
            );
        }
        return out;
    }
    let _ = writeln!(
        out,
        "{:>8} {:>14} {:>10} {:>10} {:>8} {:>9} {:>9}",
        "size", "bytes", "seconds", "Gbit/s", "% line", "Mops", "verified"
    );
    for r in runs {
        let _ = writeln!(
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
