//! A client run's report: the server's `Done` and this side's own figures (NIC names, link
//! rates, latencies) as one [`RunReport`].

use transport_core::Transport;

use bench_core::error::{Error, Result};
use bench_core::plan::{Plan, Planned};
use bench_core::proto::Done;
use bench_core::report::{self, NicReport, RunReport};
use bench_core::side::{Side, SideCfg};
use bench_core::workload::lat::one_way_stats;

pub(super) fn build_report<T: Transport>(
    side: &Side<T>,
    cfg: &SideCfg,
    plan: &Plan,
    p: &Planned,
    done: &Done,
    verified: bool,
    lat: Option<Vec<u64>>,
) -> Result<RunReport> {
    let nics = side.eps.len();
    let mut r = RunReport {
        workload: plan.workload.name().into(),
        backend: T::BACKEND.into(),
        provider: side.provider(),
        stage: p.stage.clone(),
        mem: cfg.mem.to_string(),
        gpus: cfg.gpus.clone(),
        nics,
        size: p.size,
        ops: done.ops,
        bytes: done.bytes,
        seconds: done.seconds,
        gbps: report::gbps(done.bytes, done.seconds),
        mops: report::mops(done.ops, done.seconds),
        line_rate_gbps: None,
        pct_line_rate: None,
        verified,
        knobs: p.knobs,
        cores: done.cores.clone(),
        per_nic: Vec::new(),
        op: None,
        min_us: None,
        p50_us: None,
        p99_us: None,
        max_us: None,
        rounds: Vec::new(),
    };
    if let Some(mut rtts) = lat {
        let secs = rtts.iter().sum::<u64>() as f64 / 1e9;
        r.ops = rtts.len() as u64;
        r.bytes = r.ops * p.size * 2;
        r.seconds = secs;
        r.gbps = report::gbps(r.bytes, secs);
        r.mops = report::mops(r.ops, secs);
        r.op = Some(plan.op.to_string());
        if let Some((a, b, c, d)) = one_way_stats(&mut rtts) {
            (r.min_us, r.p50_us, r.p99_us, r.max_us) = (Some(a), Some(b), Some(c), Some(d));
        }
        return Ok(r);
    }
    if done.per_nic.len() != nics {
        return Err(Error::Protocol(format!(
            "the server reported {} NICs, this side has {nics}",
            done.per_nic.len()
        )));
    }
    let mut line = Some(0.0);
    for (i, st) in done.per_nic.iter().enumerate() {
        if st.ops == 0 {
            continue;
        }
        let link = side.caps(i).link_gbps;
        line = match (line, link) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        let g = report::gbps(st.bytes, st.seconds);
        r.per_nic.push(NicReport {
            index: i,
            gpu: side.gpu_of(i),
            nic: side.eps[i].nic_name().to_string(),
            bytes: st.bytes,
            ops: st.ops,
            seconds: st.seconds,
            gbps: g,
            link_gbps: link,
            pct_line_rate: report::pct(g, link),
        });
    }
    r.line_rate_gbps = line.filter(|&l| l > 0.0);
    r.pct_line_rate = report::pct(r.gbps, r.line_rate_gbps);
    Ok(r)
}
