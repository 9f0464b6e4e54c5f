//! `rdma-bench doctor`: a pre-flight check of the node. Every check says ok, warn, fail (or
//! skip, where it does not apply or cannot be read), with the fix in one line. Exit status:
//! 0 all ok, 1 warnings, 2 a failure.
//!
//! Everything is read from files under a root (`/`, or `--root DIR` with a copy or a fixture
//! tree), except what only this process can know: what the backends' libraries report (each
//! backend's probe, handed over by the program; skipped under `--root`) and, without
//! `--topology`, hwloc's view of the live machine. The doctor names no backend.

#![forbid(unsafe_code)]

pub mod catalog;
mod checks;
pub mod env;
pub mod error;
pub mod instances;
pub mod lf;
mod report;
pub mod sys;

use std::path::PathBuf;
use std::process::ExitCode;

use transport_core::{FindingStatus, Probe, ProbeAsk};

pub use crate::checks::acs_ctrl;
pub use crate::error::{Error, Result};
pub use crate::report::{render, Check, Report, Status};
use checks::{
    acs, gpu_memory, gpus, instance, iommu, libfabric, memlock, numa, pcie_links, rdma_count,
    rdma_devices, rdma_links,
};
use report::exit_code;
use sys::Sys;

/// What the doctor reads and how it prints (`rdma-bench doctor`'s flags).
#[derive(Debug, Clone, Default)]
pub struct DoctorCfg {
    /// Print one JSON object instead of the table.
    pub json: bool,
    /// Read sysfs and procfs under this directory instead of / (a copy of another node's
    /// files, or a test fixture); libfabric, which is this process's, is then not checked.
    pub root: Option<PathBuf>,
    /// Take the GPU/NIC/NUMA layout from an hwloc XML export instead of this machine.
    pub topology: Option<PathBuf>,
    /// What to ask each backend's library in this process (`BackendInfo::probe` of every
    /// backend the program has); not asked under `root`.
    pub probes: Vec<fn(&ProbeAsk) -> Probe>,
    /// What the user named (backend, provider, devices, GPU memory), handed to every probe;
    /// each takes only what was named for its backend.
    pub ask: ProbeAsk,
    /// Print the list of checks (id, what it checks, what to do) instead of checking.
    pub list_checks: bool,
    /// With `list_checks`: as README.md's markdown table.
    pub markdown: bool,
}

/// Everything doctor judges, injectable for tests.
pub struct Inputs {
    pub root: PathBuf,
    pub env: Vec<(String, String)>,
    /// GPU/NIC grouping from `topo`; `None` falls back to sysfs NUMA nodes.
    pub topology: Option<topo::Topology>,
    /// The loaded libfabric; `None` skips those checks.
    pub libfabric: Option<lf::Libfabric>,
    /// What the other backends' libraries reported: each is listed, with its findings.
    pub probes: Vec<Probe>,
}

/// Run every check.
pub fn run(inp: &Inputs) -> Report {
    let sys = Sys::new(&inp.root);
    let f = sys::gather(&sys);
    let mut c = vec![instance(&f), gpus(&f)];
    c.push(rdma_devices(&f));
    c.extend(rdma_links(&f));
    c.push(rdma_count(&f));
    c.push(memlock(&f));
    c.extend(libfabric(&f, inp.libfabric.as_ref()));
    c.extend(gpu_memory(&f, inp.libfabric.as_ref()));
    c.extend(pcie_links(&f));
    c.push(iommu(&f));
    c.push(acs(&sys, &f));
    c.extend(numa(&f, inp.topology.as_ref()));
    for p in &inp.probes {
        c.extend(probe_checks(p));
    }
    c.extend(env::checks(&env::Ctx {
        env: env::Env(&inp.env),
        facts: &f,
        libfabric: inp.libfabric.as_ref().and_then(|l| {
            let (a, b) = l.version.split_once('.')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        }),
    }));
    let mut r = Report {
        root: inp.root.display().to_string(),
        product: f.product.clone(),
        vendor: f.vendor.clone(),
        instance: f.instance.map(|i| i.name.clone()),
        checks: c,
        exit_code: 0,
    };
    r.exit_code = exit_code(r.worst());
    r
}

/// A library the doctor has no checks of its own for: what its probe found, and the
/// backend's own findings.
fn probe_checks(p: &Probe) -> Vec<Check> {
    let mut s = format!(
        "{} {} ({})",
        p.library,
        p.version,
        p.path.as_deref().unwrap_or("library path unknown")
    );
    if !p.offers.is_empty() {
        s.push_str(&format!(", offers: {}", p.offers.join(", ")));
    }
    let mut out = vec![Check {
        id: p.library.clone(),
        status: Status::Ok,
        summary: s,
        fix: None,
    }];
    out.extend(finding_checks(&p.findings));
    out
}

/// A backend's findings as checks.
pub(crate) fn finding_checks(f: &[transport_core::Finding]) -> impl Iterator<Item = Check> + '_ {
    f.iter().map(|f| Check {
        id: f.id.clone(),
        status: match f.status {
            FindingStatus::Ok => Status::Ok,
            FindingStatus::Warn => Status::Warn,
            FindingStatus::Fail => Status::Fail,
        },
        summary: f.summary.clone(),
        fix: f.fix.clone(),
    })
}

fn collect_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("FI_") || k.starts_with("NCCL_"))
        .collect()
}

/// Gather the inputs `a` asks for: this machine, or files under `--root`.
pub fn inputs(a: &DoctorCfg) -> Result<Inputs> {
    let root = a.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    if !sys::is_dir(&root) {
        return Err(Error::Usage(format!(
            "--root {}: not a directory",
            root.display()
        )));
    }
    let topology = match (&a.topology, &a.root) {
        (Some(x), _) => {
            Some(topo::from_xml(x).map_err(|e| Error::Usage(format!("--topology: {e}")))?)
        }
        // Live: hwloc's view; a failure leaves the sysfs fallback.
        (None, None) => topo::discover().ok(),
        (None, Some(_)) => None,
    };
    let probes: Vec<Probe> = if a.root.is_some() {
        Vec::new()
    } else {
        a.probes.iter().map(|p| p(&a.ask)).collect()
    };
    let libfabric = probes.iter().find_map(lf::Libfabric::from_probe);
    Ok(Inputs {
        root,
        env: collect_env(),
        topology,
        libfabric,
        probes: probes
            .into_iter()
            .filter(|p| lf::Libfabric::from_probe(p).is_none())
            .collect(),
    })
}

/// `rdma-bench doctor`: print the verdict, exit 0/1/2.
pub fn main(a: &DoctorCfg) -> ExitCode {
    if a.list_checks {
        print!(
            "{}",
            if a.markdown {
                catalog::markdown()
            } else {
                catalog::text()
            }
        );
        return ExitCode::SUCCESS;
    }
    let inp = match inputs(a) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("rdma-bench: error: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let r = run(&inp);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", render(&r));
    }
    ExitCode::from(r.exit_code)
}
