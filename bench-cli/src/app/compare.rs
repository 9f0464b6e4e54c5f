//! `compare`: the same workload over several backends or providers, side by side.

use super::*;

#[derive(Serialize)]
struct CompareRow<'a> {
    pair: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    run: Option<&'a RunReport>,
}

#[derive(Serialize)]
struct CompareOut<'a> {
    workload: String,
    pairs: Vec<CompareRow<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gate: Option<&'a GateResult>,
    record: &'a Record,
}

pub(super) fn compare(a: CompareArgs) -> Result<()> {
    if a.work.ladder {
        return Err(Error::Usage(
            "compare runs one workload per pair at one size (-s) or a few (--sizes), not --ladder"
                .into(),
        ));
    }
    let c = &a.common;
    if c.provider.is_some()
        || !c.devices.is_empty()
        || c.backend.name() != crate::backends::default_name()
    {
        return Err(Error::Usage(
            "compare takes each pair's backend, provider and devices from --pairs \
             (BACKEND:PROVIDER or BACKEND:DEV[+DEV]): drop --backend, --provider and --devices"
                .into(),
        ));
    }
    let plan = Plan::new(&(&a.work).into(), true)?;
    if plan.rounds > 1 {
        return Err(Error::Usage(
            "--rounds: loopback and client repeat a plan in rounds; compare runs it once per pair"
                .into(),
        ));
    }
    let out_spec = OutputSpec::from(&a.out);
    let gate = out_spec.prepare(plan.workload.name())?;
    let mut rows: Vec<(String, std::result::Result<RunReport, String>)> = Vec::new();
    let mut record = Record::now(facts(&a.common));
    for p in &a.pairs {
        let mut common = a.common.clone();
        common.backend = p.backend;
        common.devices = p.devices.clone();
        let r = loopback_cfgs(&common, p.provider.clone(), a.work.buf_offset)
            .and_then(|(client, server)| p.backend.loopback(&client, &server, &plan, true));
        if let Ok(out) = &r {
            if let (Some(b), Some(Some(peer))) = (
                out.facts.backend.clone(),
                out.peer.as_ref().map(|f| f.backend.clone()),
            ) {
                record.pairs.push(PairRecord {
                    pair: p.to_string(),
                    backend: b,
                    peer,
                });
            }
        }
        let r = match r {
            Ok(out) if out.reports.is_empty() => Err("no result".to_string()),
            Ok(out) => Ok(out.reports),
            Err(e) => Err(e.to_string()),
        };
        if a.common.verbose > 0 {
            eprintln!(
                "rdma-bench: compare {p}: {}",
                if r.is_ok() { "ok" } else { "failed" }
            );
        }
        // One row per size.
        match r {
            Ok(reports) => rows.extend(reports.into_iter().map(|r| (p.to_string(), Ok(r)))),
            Err(e) => rows.push((p.to_string(), Err(e))),
        }
    }
    let done = Done {
        runs: rows
            .iter()
            .filter_map(|(p, r)| r.as_ref().ok().map(|r| (p.clone(), r)))
            .collect(),
        failures: rows
            .iter()
            .filter_map(|(p, r)| r.as_ref().err().map(|e| (p.clone(), e.clone())))
            .collect(),
        ladder: false,
        workload: plan.workload.to_string(),
        record: Some(&record),
    };
    let verdict = outputs::judge(gate.as_ref(), &done);
    if a.common.json {
        let out = CompareOut {
            workload: plan.workload.to_string(),
            pairs: rows
                .iter()
                .map(|(pair, r)| CompareRow {
                    pair: pair.clone(),
                    error: r.as_ref().err().map(|s| s.as_str()),
                    run: r.as_ref().ok(),
                })
                .collect(),
            gate: verdict.as_ref(),
            record: &record,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", report::render_compare(&rows));
    }
    let finished = outputs::finish(
        &out_spec,
        gate.as_ref(),
        &done,
        verdict.as_ref(),
        a.common.json,
    );
    let failed: Vec<&str> = rows
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(p, _)| p.as_str())
        .collect();
    if failed.is_empty() {
        finished
    } else {
        // The pairs' failure is the exit status; what the outputs and the gate found is not
        // dropped with it (a --report that could not be written, a gate that failed).
        if let Err(e) = finished {
            eprintln!("rdma-bench: error: {e}");
        }
        Err(Error::Protocol(format!(
            "pair(s) failed: {}",
            failed.join(", ")
        )))
    }
}
