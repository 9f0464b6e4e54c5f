//! Pass/fail gates: every NIC endpoint, every GPU and the node of a bandwidth run against a
//! line rate (from the instance table, `--expect`, or the NIC's own link speed) and a
//! threshold (`--min-pct`, or the table's), or against a floor (`--min-gbps`).
//!
//! The gate looks at the run that should come closest to line rate: the largest size of a
//! size sweep, the last stage of the ladder, and, with `compare`, that run of each pair.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use bench_core::error::{Error, Result};
use bench_core::report::RunReport;
use bench_core::units::human_bytes;
use bench_doctor::instances::{self, Instance};

/// What a run must reach.
#[derive(Clone, Debug, PartialEq)]
pub struct GateSpec {
    /// Line rates and default threshold of an instance type (`--expect`).
    pub expect: Option<&'static Instance>,
    /// Percent of line rate every row must reach (`--min-pct`).
    pub min_pct: Option<f64>,
    /// Gbit/s every NIC endpoint must reach (`--min-gbps`).
    pub min_gbps: Option<f64>,
}

impl GateSpec {
    /// The gate the flags ask for, `None` without any gate flag.
    pub fn from_flags(
        expect: Option<&str>,
        min_pct: Option<f64>,
        min_gbps: Option<f64>,
    ) -> Result<Option<Self>> {
        if let Some(p) = min_pct {
            if !(p.is_finite() && p > 0.0 && p <= 100.0) {
                return Err(Error::Usage(format!(
                    "--min-pct {p}: a percentage of line rate, more than 0 and at most 100"
                )));
            }
        }
        if let Some(g) = min_gbps {
            if !(g.is_finite() && g > 0.0) {
                return Err(Error::Usage(format!(
                    "--min-gbps {g}: Gbit/s per NIC, more than 0"
                )));
            }
        }
        let expect = expect
            .map(instances::by_name)
            .transpose()
            .map_err(|e| match e {
                bench_doctor::Error::Usage(m) => Error::Usage(m),
                bench_doctor::Error::Unavailable(m) => Error::Unavailable(m),
            })?;
        if expect.is_none() && min_pct.is_none() && min_gbps.is_none() {
            return Ok(None);
        }
        Ok(Some(GateSpec {
            expect,
            min_pct,
            min_gbps,
        }))
    }

    /// The threshold in percent of line rate, where one applies.
    pub fn pct(&self) -> Option<f64> {
        self.min_pct.or(self.expect.map(|i| i.min_pct))
    }

    /// One line saying what the gate asks.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (self.expect, self.pct()) {
            (Some(i), Some(p)) => parts.push(format!(
                "{p}% of {} ({} Gbit/s per {} NIC)",
                i.name, i.nic_gbps, i.nic_driver
            )),
            (None, Some(p)) => parts.push(format!("{p}% of each NIC's reported link speed")),
            _ => {}
        }
        if let Some(g) = self.min_gbps {
            parts.push(format!("at least {g} Gbit/s per NIC"));
        }
        parts.join(" and ")
    }
}

/// One line of the gate table.
#[derive(Clone, Debug, Serialize)]
pub struct GateRow {
    /// The run the row belongs to (`write 1M over efa/shm`).
    pub run: String,
    /// `nic`, `gpu` or `node`.
    pub scope: &'static str,
    /// NIC index in the run (scope `nic`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// NIC name, or `N NICs` for GPU and node rows.
    pub nic: String,
    pub gpu: Option<usize>,
    pub gbps: f64,
    /// The line rate this row is held against (its share where endpoints share a NIC).
    pub line_gbps: Option<f64>,
    /// What the row must reach.
    pub need_gbps: Option<f64>,
    /// Percent of line rate reached.
    pub pct: Option<f64>,
    pub pass: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl GateRow {
    /// A failing node row for a run the gate cannot judge (no per-NIC figures, a pair that
    /// did not run), saying why.
    pub fn unjudged(run: String, gbps: f64, why: String) -> Self {
        GateRow {
            run,
            scope: "node",
            index: None,
            nic: "-".into(),
            gpu: None,
            gbps,
            line_gbps: None,
            need_gbps: None,
            pct: None,
            pass: false,
            note: Some(why),
        }
    }
}

/// The verdict of a gate over one command's runs.
#[derive(Clone, Debug, Serialize)]
pub struct GateResult {
    pub gate: String,
    pub pass: bool,
    pub rows: Vec<GateRow>,
    /// Where the run does not exercise the whole node the gate describes.
    pub notes: Vec<String>,
}

impl GateResult {
    /// Rows that fell short.
    pub fn failed(&self) -> impl Iterator<Item = &GateRow> {
        self.rows.iter().filter(|r| !r.pass)
    }

    /// One line for the error message.
    pub fn summary(&self) -> String {
        let bad: Vec<&GateRow> = self.failed().collect();
        let Some(first) = bad.first() else {
            return if self.pass {
                format!("gate passed ({})", self.gate)
            } else {
                format!("gate failed ({}): no run to judge", self.gate)
            };
        };
        let at = match first.pct {
            Some(p) => format!("{p:.1}% of line rate"),
            None => format!("{:.2} Gbit/s", first.gbps),
        };
        let what = match first.scope {
            "nic" => format!(
                "NIC {} ({}, GPU {})",
                first.index.unwrap_or(0),
                first.nic,
                first.gpu.map_or("-".into(), |g| g.to_string())
            ),
            "gpu" => format!("GPU {}", first.gpu.unwrap_or(0)),
            _ => "the node".into(),
        };
        format!(
            "gate failed ({}): {} of {} rows short, first {what} at {at}{}",
            self.gate,
            bad.len(),
            self.rows.len(),
            first
                .note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        )
    }
}

/// Reject workloads a bandwidth gate cannot judge, before anything runs.
pub fn check_workload(workload: &str) -> Result<()> {
    if workload == "lat" {
        return Err(Error::Usage(
            "--expect/--min-pct/--min-gbps gate bandwidth: use them with --workload write, send or rate, not lat"
                .into(),
        ));
    }
    Ok(())
}

pub(crate) fn run_label(r: &RunReport) -> String {
    match &r.stage {
        Some(s) => format!("{} {s} over {}/{}", r.workload, r.backend, r.provider),
        None => format!(
            "{} {} over {}/{}",
            r.workload,
            human_bytes(r.size),
            r.backend,
            r.provider
        ),
    }
}

/// The runs a gate looks at: per backend/provider, the ladder's last stage or the largest
/// size.
pub fn pick(runs: &[RunReport]) -> Vec<&RunReport> {
    pick_by(
        runs.iter()
            .map(|r| ((r.backend.as_str(), r.provider.as_str()), r)),
    )
    .into_iter()
    .map(|(_, r)| r)
    .collect()
}

/// As [`pick`], per key: a compare's pair, whose runs can share a backend and provider (two
/// pairs of verbs NICs, named by their first device).
pub fn pick_by<'a, K: PartialEq>(
    runs: impl IntoIterator<Item = (K, &'a RunReport)>,
) -> Vec<(K, &'a RunReport)> {
    let mut best: Vec<(K, &RunReport)> = Vec::new();
    for (k, r) in runs {
        match best.iter_mut().find(|(b, _)| *b == k) {
            Some((_, b)) => {
                if r.stage.is_some() || r.size >= b.size {
                    *b = r;
                }
            }
            None => best.push((k, r)),
        }
    }
    best
}

fn pct_of(gbps: f64, line: Option<f64>) -> Option<f64> {
    line.filter(|&l| l > 0.0).map(|l| 100.0 * gbps / l)
}

fn sum_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? + b?)
}

/// Judge `runs` (already picked) against `spec`.
pub fn evaluate(spec: &GateSpec, runs: &[&RunReport]) -> GateResult {
    let labelled: Vec<(String, &RunReport)> = runs.iter().map(|r| (run_label(r), *r)).collect();
    evaluate_labelled(spec, &labelled)
}

/// As [`evaluate`], each run's rows under its own label (a compare's pair beside the run).
pub fn evaluate_labelled(spec: &GateSpec, runs: &[(String, &RunReport)]) -> GateResult {
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let pct = spec.pct();
    for (label, r) in runs {
        let (label, r) = (label.clone(), *r);
        if r.per_nic.is_empty() {
            rows.push(GateRow::unjudged(
                label,
                r.gbps,
                "no per-NIC figures in this run".into(),
            ));
            continue;
        }
        // Endpoints that share one NIC share its line rate.
        let mut share: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &r.per_nic {
            *share.entry(n.nic.as_str()).or_default() += 1;
        }
        let mut gpus: BTreeMap<usize, (f64, Option<f64>, Option<f64>, usize)> = BTreeMap::new();
        let (mut node_line, mut node_need) = (Some(0.0), Some(0.0));
        for n in &r.per_nic {
            let k = share[n.nic.as_str()] as f64;
            let line = spec
                .expect
                .map(|i| i.nic_gbps)
                .or(n.link_gbps)
                .map(|l| l / k);
            let need_pct = match (line, pct) {
                (Some(l), Some(p)) => Some(l * p / 100.0),
                _ => None,
            };
            let need = match (need_pct, spec.min_gbps) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            let note = if need.is_none() {
                Some("line rate unknown: give --expect TYPE or --min-gbps".to_string())
            } else if k > 1.0 && line.is_some() {
                Some(format!("NIC shared by {k} endpoints"))
            } else {
                None
            };
            let pass = need.is_some_and(|need| n.gbps >= need);
            rows.push(GateRow {
                run: label.clone(),
                scope: "nic",
                index: Some(n.index),
                nic: n.nic.clone(),
                gpu: Some(n.gpu),
                gbps: n.gbps,
                line_gbps: line,
                need_gbps: need,
                pct: pct_of(n.gbps, line),
                pass,
                note,
            });
            let g = gpus.entry(n.gpu).or_insert((0.0, Some(0.0), Some(0.0), 0));
            g.0 += n.gbps;
            g.1 = sum_opt(g.1, line);
            g.2 = sum_opt(g.2, need);
            g.3 += 1;
            node_line = sum_opt(node_line, line);
            node_need = sum_opt(node_need, need);
        }
        for (&gpu, &(gbps, line, need, count)) in &gpus {
            rows.push(GateRow {
                run: label.clone(),
                scope: "gpu",
                index: None,
                nic: format!("{count} NIC(s)"),
                gpu: Some(gpu),
                gbps,
                line_gbps: line,
                need_gbps: need,
                pct: pct_of(gbps, line),
                pass: need.is_some_and(|need| gbps >= need),
                note: None,
            });
        }
        rows.push(GateRow {
            run: label.clone(),
            scope: "node",
            index: None,
            nic: format!("{} NIC(s)", r.per_nic.len()),
            gpu: None,
            gbps: r.gbps,
            line_gbps: node_line,
            need_gbps: node_need,
            pct: pct_of(r.gbps, node_line),
            pass: node_need.is_some_and(|need| r.gbps >= need),
            note: None,
        });
        if let Some(i) = spec.expect {
            let per_gpu = r.per_nic.len() as f64 / gpus.len().max(1) as f64;
            if i.gpus > 0 && (gpus.len() as u32) < i.gpus {
                notes.push(format!(
                    "{label}: {} of {}'s {} GPUs ran; give --gpus 0-{} to gate the whole node",
                    gpus.len(),
                    i.name,
                    i.gpus,
                    i.gpus - 1
                ));
            }
            if per_gpu + 1e-9 < i.nics_per_gpu() {
                notes.push(format!(
                    "{label}: {per_gpu} NIC(s) per GPU ran; {} has {} (--nics-per-gpu {})",
                    i.name,
                    i.nics_per_gpu(),
                    i.nics_per_gpu().ceil()
                ));
            }
        }
    }
    let pass = !rows.is_empty() && rows.iter().all(|r| r.pass);
    GateResult {
        gate: spec.describe(),
        pass,
        rows,
        notes,
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

/// The gate table people read.
pub fn render(g: &GateResult) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "gate: {}", g.gate);
    let mut last_run = "";
    for r in &g.rows {
        if r.run != last_run {
            let _ = writeln!(
                out,
                "  {}\n  {:<8} {:<18} {:>4} {:>10} {:>9} {:>9} {:>7}  result",
                r.run, "what", "nic", "gpu", "Gbit/s", "line", "need", "% line"
            );
            last_run = &r.run;
        }
        let what = match (r.scope, r.index) {
            ("nic", Some(i)) => format!("nic {i}"),
            ("gpu", _) => format!("gpu {}", r.gpu.unwrap_or(0)),
            (s, _) => s.to_string(),
        };
        let _ = writeln!(
            out,
            "  {:<8} {:<18} {:>4} {:>10.2} {:>9} {:>9} {:>7}  {}{}",
            what,
            r.nic,
            r.gpu.map_or("-".into(), |g| g.to_string()),
            r.gbps,
            opt(r.line_gbps, 1),
            opt(r.need_gbps, 2),
            opt(r.pct, 1),
            if r.pass { "ok" } else { "FAIL" },
            r.note
                .as_deref()
                .map(|n| format!("  ({n})"))
                .unwrap_or_default()
        );
    }
    for n in &g.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    let _ = writeln!(
        out,
        "gate: {}",
        if g.pass {
            "PASS".to_string()
        } else {
            format!(
                "FAIL, {} of {} rows short",
                g.failed().count(),
                g.rows.len()
            )
        }
    );
    out
}

#[cfg(test)]
pub(crate) mod tests;
