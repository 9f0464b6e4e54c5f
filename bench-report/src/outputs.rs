//! What happens after the runs: the gate (`--expect`, `--min-pct`, `--min-gbps`), the plot
//! (`--plot FILE.svg`) and the page (`--report FILE.html`). Shared by loopback, client and
//! compare.

use std::path::{Path, PathBuf};

use crate::gate::{self, GateResult, GateSpec};
use crate::html;
use crate::plot;
use bench_core::error::{Error, Result, TransportContext};
use bench_core::record::Record;
use bench_core::report::RunReport;
use transport_core::{Probe, ProbeAsk};

/// What to do after the runs (`rdma-bench`'s `--expect`, `--min-pct`, `--min-gbps`, `--plot`,
/// `--report`, `--report-topology`).
#[derive(Debug, Clone, Default)]
pub struct OutputSpec {
    /// Gate against an instance type's line rates (p5, p5e, p5en, p6-b200, p4d, cx7-400):
    /// every NIC, GPU and the node must reach its threshold.
    pub expect: Option<String>,
    /// Gate: percent of line rate each NIC, GPU and the node must reach (the table's
    /// threshold with `expect`, else each NIC's reported link speed).
    pub min_pct: Option<f64>,
    /// Gate: Gbit/s each NIC endpoint must reach (works where no line rate is known, e.g. shm).
    pub min_gbps: Option<f64>,
    /// Draw bandwidth against size, stage or pair into this SVG file.
    pub plot: Option<PathBuf>,
    /// Write one self-contained HTML page: tables, gate, plot, topology, node check.
    pub report: Option<PathBuf>,
    /// The hwloc XML export the report's topology section shows (default: this machine).
    pub report_topology: Option<PathBuf>,
    /// What the report's node check asks each backend's library (`DoctorCfg::probes`).
    pub probes: Vec<fn(&ProbeAsk) -> Probe>,
    /// What the run named (backend, provider, devices, memory), asked of those probes as
    /// `doctor --backend ... --provider ... --devices ... --mem ...` asks them.
    pub ask: ProbeAsk,
}

fn check_dir(flag: &str, p: &Path) -> Result<()> {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(d) = dir {
        if !d.is_dir() {
            return Err(Error::Usage(format!(
                "{flag} {}: directory {} does not exist",
                p.display(),
                d.display()
            )));
        }
    }
    Ok(())
}

impl OutputSpec {
    /// Check the flags before anything runs; the gate they ask for.
    pub fn prepare(&self, workload: &str) -> Result<Option<GateSpec>> {
        let spec = GateSpec::from_flags(self.expect.as_deref(), self.min_pct, self.min_gbps)?;
        if spec.is_some() {
            gate::check_workload(workload)?;
        }
        if let Some(p) = &self.plot {
            if workload == "lat" {
                return Err(Error::Usage(
                    "--plot draws bandwidth: use it with --workload write, send or rate".into(),
                ));
            }
            check_dir("--plot", p)?;
        }
        if let Some(p) = &self.report {
            check_dir("--report", p)?;
            if self.plot.as_ref() == Some(p) {
                return Err(Error::Usage(format!(
                    "--plot and --report both name {}: the report would overwrite the plot; \
                     give each its own file",
                    p.display()
                )));
            }
        }
        if let Some(x) = &self.report_topology {
            if !x.is_file() {
                return Err(Error::Usage(format!(
                    "--report-topology {}: no such file",
                    x.display()
                )));
            }
        }
        Ok(spec)
    }
}

/// The runs of one command, each with the label of its line (provider or pair).
pub struct Done<'a> {
    pub runs: Vec<(String, &'a RunReport)>,
    pub failures: Vec<(String, String)>,
    pub ladder: bool,
    pub workload: String,
    /// What ran, where and on what.
    pub record: Option<&'a Record>,
}

impl<'a> Done<'a> {
    /// A loopback or client command's runs, labelled `backend/provider`.
    pub fn of(runs: &'a [RunReport], ladder: bool) -> Self {
        Done {
            runs: runs.iter().map(|r| (own_label(r), r)).collect(),
            failures: Vec::new(),
            ladder,
            workload: runs.first().map(|r| r.workload.clone()).unwrap_or_default(),
            record: None,
        }
    }
}

/// A run's label where no compare pair names it: `backend/provider`.
fn own_label(r: &RunReport) -> String {
    format!("{}/{}", r.backend, r.provider)
}

/// Judge the runs against the gate, if any.
pub fn judge(spec: Option<&GateSpec>, d: &Done<'_>) -> Option<GateResult> {
    let spec = spec?;
    // Per label: a compare's pairs, or a command's backend/provider (Done::of). A pair's
    // rows name it where its label says more than the run's backend/provider.
    let picked: Vec<(String, &RunReport)> =
        gate::pick_by(d.runs.iter().map(|(label, r)| (label.as_str(), *r)))
            .into_iter()
            .map(|(label, r)| {
                let run = gate::run_label(r);
                if *label == own_label(r) {
                    (run, r)
                } else {
                    (format!("{run} (pair {label})"), r)
                }
            })
            .collect();
    let mut g = gate::evaluate_labelled(spec, &picked);
    // A pair that failed has no figure, so nothing of it passed: one failing row each.
    for (label, why) in &d.failures {
        g.rows.push(gate::GateRow::unjudged(
            format!("pair {label}"),
            0.0,
            format!("not run: {why}"),
        ));
        g.pass = false;
    }
    Some(g)
}

/// The line rate the plot marks: the gate's node line, else the runs' own.
fn line_rate(
    d: &Done<'_>,
    g: Option<&GateResult>,
    spec: Option<&GateSpec>,
) -> Option<(f64, String)> {
    if let (Some(g), Some(s)) = (g, spec) {
        let node = g.rows.iter().rev().find(|r| r.scope == "node")?;
        let what = s
            .expect
            .map_or("link speed".to_string(), |i| i.name.clone());
        return node.line_gbps.map(|l| (l, what));
    }
    d.runs
        .iter()
        .filter_map(|(_, r)| r.line_rate_gbps)
        .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))
        .map(|l| (l, "reported link speed".into()))
}

/// Write the plot and the report, print the gate table (unless `json`), and fail when the
/// gate does.
pub fn finish(
    o: &OutputSpec,
    spec: Option<&GateSpec>,
    d: &Done<'_>,
    gate: Option<&GateResult>,
    json: bool,
) -> Result<()> {
    if let (Some(g), false) = (gate, json) {
        print!("{}", gate::render(g));
    }
    let plot_svg = if o.plot.is_some() || o.report.is_some() {
        let (axis, series) = plot::from_runs(d.runs.iter().map(|(l, r)| (l.clone(), *r)), d.ladder);
        let title = match &axis {
            plot::XAxis::Size => format!("{} bandwidth by message size", d.workload),
            plot::XAxis::Stages(_) => format!("{} bandwidth by ladder stage", d.workload),
        };
        (!series.is_empty())
            .then(|| plot::bandwidth_svg(&title, &axis, &series, line_rate(d, gate, spec)))
            .transpose()?
    } else {
        None
    };
    if let (Some(p), Some(svg)) = (&o.plot, &plot_svg) {
        std::fs::write(p, svg).ctx(|| format!("writing --plot {}", p.display()))?;
    }
    if let Some(p) = &o.report {
        let topology = match &o.report_topology {
            Some(x) => Some((
                format!("from {}", x.display()),
                topo::from_xml(x).map_err(|e| Error::Usage(format!("--report-topology: {e}")))?,
            )),
            None => topo::discover()
                .ok()
                .map(|t| ("this machine (hwloc)".to_string(), t)),
        };
        let topology_svg = topology
            .as_ref()
            .map(|(_, t)| plot::topology_svg(t))
            .transpose()?;
        // The node check is of this machine, whatever topology the page shows.
        let doctor = bench_doctor::inputs(&bench_doctor::DoctorCfg {
            probes: o.probes.clone(),
            ask: o.ask.clone(),
            ..bench_doctor::DoctorCfg::default()
        })
        .ok()
        .map(|i| bench_doctor::run(&i));
        let page = html::Page {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            runs: d.runs.clone(),
            failures: d.failures.clone(),
            gate,
            plot_svg,
            topology,
            topology_svg,
            doctor,
            record: d.record,
        };
        std::fs::write(p, html::render(&page))
            .ctx(|| format!("writing --report {}", p.display()))?;
    }
    match gate {
        Some(g) if !g.pass => Err(Error::Gate(g.summary())),
        _ => Ok(()),
    }
}

/// `--json` output with the gate's verdict added as `gate`.
pub fn with_gate(json: String, gate: Option<&GateResult>) -> String {
    let Some(g) = gate else { return json };
    match serde_json::from_str::<serde_json::Value>(&json) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.insert(
                "gate".into(),
                serde_json::to_value(g).unwrap_or(serde_json::Value::Null),
            );
            serde_json::to_string_pretty(&m).unwrap_or(json)
        }
        _ => json,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::tests::{nic, run};

    /// A compare's outcome: its pairs' runs and failures, under a 20 Gbit/s gate.
    fn judged(runs: Vec<(String, &RunReport)>, failures: Vec<(String, String)>) -> GateResult {
        let spec = GateSpec::from_flags(None, None, Some(20.0))
            .unwrap()
            .unwrap();
        let done = Done {
            runs,
            failures,
            ladder: false,
            workload: "write".into(),
            record: None,
        };
        judge(Some(&spec), &done).unwrap()
    }

    /// Two compare pairs over one backend and provider (verbs names its provider after the first
    /// device): each is judged, and the slow one fails the gate.
    #[test]
    fn every_compare_pair_is_judged() {
        let fast = run(1 << 20, vec![nic(0, 0, "mlx5_0", 90.0, None)]);
        let slow = run(1 << 20, vec![nic(0, 0, "mlx5_0", 5.0, None)]);
        let small = run(4096, vec![nic(0, 0, "mlx5_0", 1.0, None)]);
        let runs = vec![
            ("verbs:mlx5_0".into(), &small),
            ("verbs:mlx5_0".into(), &fast),
            ("verbs:mlx5_0+mlx5_1".into(), &slow),
        ];
        let g = judged(runs, Vec::new());
        assert!(!g.pass, "{}", g.summary());
        // Per pair, the largest size: the small run of the first pair is not judged. The slow
        // pair's rows (NIC, GPU, node) fail and name it.
        assert!(g.rows.iter().all(|r| r.gbps != 1.0), "{:?}", g.rows);
        assert_eq!(g.failed().count(), 3, "{:?}", g.rows);
        for r in g.failed() {
            assert_eq!(r.gbps, 5.0);
            assert!(r.run.ends_with("(pair verbs:mlx5_0+mlx5_1)"), "{}", r.run);
        }
        assert!(g.summary().contains("3 of 6 rows short"), "{}", g.summary());
    }

    /// A pair that failed fails the gate, named, though every pair that ran passed.
    #[test]
    fn a_failed_pair_fails_the_gate() {
        let fast = run(1 << 20, vec![nic(0, 0, "mlx5_0", 90.0, None)]);
        let failures = vec![("verbs:mlx5_1".into(), "no such device".into())];
        let g = judged(vec![("verbs:mlx5_0".into(), &fast)], failures);
        assert!(!g.pass, "{}", g.summary());
        let bad: Vec<_> = g.failed().collect();
        assert_eq!(bad.len(), 1, "{:?}", g.rows);
        assert_eq!(bad[0].run, "pair verbs:mlx5_1");
        assert!(
            g.summary().contains("not run: no such device"),
            "{}",
            g.summary()
        );
    }
}
