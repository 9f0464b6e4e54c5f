//! Unit tests of `gate`.
use super::*;
use bench_core::config::Knobs;
use bench_core::report::NicReport;

pub(crate) fn nic(index: usize, gpu: usize, name: &str, gbps: f64, link: Option<f64>) -> NicReport {
    NicReport {
        index,
        gpu,
        nic: name.into(),
        bytes: 1,
        ops: 1,
        seconds: 1.0,
        gbps,
        link_gbps: link,
        pct_line_rate: None,
    }
}

pub(crate) fn run(size: u64, per_nic: Vec<NicReport>) -> RunReport {
    let gbps = per_nic.iter().map(|n| n.gbps).sum();
    let mut gpus: Vec<usize> = per_nic.iter().map(|n| n.gpu).collect();
    gpus.dedup();
    RunReport {
        workload: "write".into(),
        backend: "efa".into(),
        provider: "efa".into(),
        stage: None,
        mem: "cuda".into(),
        gpus,
        nics: per_nic.len(),
        size,
        ops: 1,
        bytes: 1,
        seconds: 1.0,
        gbps,
        mops: 0.0,
        line_rate_gbps: None,
        pct_line_rate: None,
        verified: false,
        knobs: Knobs::baseline(),
        cores: vec![],
        per_nic,
        op: None,
        min_us: None,
        p50_us: None,
        p99_us: None,
        max_us: None,
        rounds: Vec::new(),
    }
}

/// A p5 run: 8 GPUs x 4 EFA, each at `f(gpu, j)` Gbit/s.
fn p5_run(f: impl Fn(usize, usize) -> f64) -> RunReport {
    let mut v = Vec::new();
    for g in 0..8 {
        for j in 0..4 {
            let i = g * 4 + j;
            v.push(nic(i, g, &format!("rdmap{i}s0"), f(g, j), Some(100.0)));
        }
    }
    run(1 << 20, v)
}

fn p5() -> GateSpec {
    GateSpec::from_flags(Some("p5"), None, None)
        .unwrap()
        .unwrap()
}

#[test]
fn healthy_p5_passes() {
    let r = p5_run(|_, _| 96.0);
    let g = evaluate(&p5(), &[&r]);
    assert!(g.pass, "{}", render(&g));
    assert_eq!(g.rows.len(), 32 + 8 + 1);
    let node = g.rows.last().unwrap();
    assert_eq!(node.scope, "node");
    assert_eq!(node.line_gbps, Some(3200.0));
    assert!((node.pct.unwrap() - 96.0).abs() < 1e-9);
    assert!(g.notes.is_empty(), "{:?}", g.notes);
}

#[test]
fn one_slow_nic_fails_and_is_named_with_its_gpu() {
    let r = p5_run(|g, j| if g == 5 && j == 2 { 45.0 } else { 97.0 });
    let g = evaluate(&p5(), &[&r]);
    assert!(!g.pass);
    let bad: Vec<&GateRow> = g.failed().collect();
    // The NIC and its GPU fall short; the node total (93.8 %) does not.
    assert_eq!(bad.len(), 2, "{}", render(&g));
    assert_eq!((bad[0].scope, bad[0].index), ("nic", Some(22)));
    assert_eq!(bad[0].nic, "rdmap22s0");
    assert_eq!(bad[0].gpu, Some(5));
    assert!((bad[0].pct.unwrap() - 45.0).abs() < 1e-9);
    assert_eq!((bad[1].scope, bad[1].gpu), ("gpu", Some(5)));
    let s = g.summary();
    assert!(s.contains("NIC 22 (rdmap22s0, GPU 5) at 45.0%"), "{s}");
    let t = render(&g);
    assert!(t.contains("nic 22   rdmap22s0"), "{t}");
    assert!(t.contains("FAIL"), "{t}");
}

#[test]
fn min_pct_overrides_the_table_threshold() {
    let r = p5_run(|_, _| 85.0);
    assert!(!evaluate(&p5(), &[&r]).pass);
    let loose = GateSpec::from_flags(Some("p5"), Some(80.0), None)
        .unwrap()
        .unwrap();
    assert!(evaluate(&loose, &[&r]).pass);
}

#[test]
fn min_pct_alone_uses_the_reported_link_speed_and_fails_where_unknown() {
    let spec = GateSpec::from_flags(None, Some(90.0), None)
        .unwrap()
        .unwrap();
    let r = run(
        65536,
        vec![
            nic(0, 0, "mlx5_0", 380.0, Some(400.0)),
            nic(1, 1, "mlx5_1", 300.0, Some(400.0)),
        ],
    );
    let g = evaluate(&spec, &[&r]);
    let bad: Vec<_> = g.failed().map(|r| (r.scope, r.nic.clone())).collect();
    // mlx5_1 at 75 %, its GPU, and the node (680 of the 720 needed).
    assert_eq!(
        bad,
        vec![
            ("nic", "mlx5_1".into()),
            ("gpu", "1 NIC(s)".into()),
            ("node", "2 NIC(s)".into())
        ]
    );
    let unknown = run(65536, vec![nic(0, 0, "shm", 30.0, None)]);
    let g = evaluate(&spec, &[&unknown]);
    assert!(!g.pass);
    assert!(g.rows[0]
        .note
        .as_deref()
        .unwrap()
        .contains("line rate unknown"));
}

#[test]
fn min_gbps_is_a_floor_per_endpoint() {
    let spec = GateSpec::from_flags(None, None, Some(20.0))
        .unwrap()
        .unwrap();
    let r = run(
        4096,
        vec![nic(0, 0, "shm", 25.0, None), nic(1, 1, "shm", 15.0, None)],
    );
    let g = evaluate(&spec, &[&r]);
    assert!(!g.pass);
    assert!(g.rows[0].pass && !g.rows[1].pass);
    // Node: 40 of the 40 needed.
    assert!(g.rows.last().unwrap().pass, "{}", render(&g));
}

#[test]
fn shared_nics_split_their_line_rate_p4d() {
    // p4d: GPUs 0 and 1 share one EFA; each endpoint is held to half of it.
    let spec = GateSpec::from_flags(Some("p4d"), None, None)
        .unwrap()
        .unwrap();
    let r = run(
        1 << 20,
        vec![
            nic(0, 0, "rdmap16s27", 47.0, None),
            nic(1, 1, "rdmap16s27", 47.0, None),
        ],
    );
    let g = evaluate(&spec, &[&r]);
    assert_eq!(g.rows[0].line_gbps, Some(50.0));
    assert!(g.rows[0].pass, "{}", render(&g));
    assert!(g.notes.iter().any(|n| n.contains("2 of p4d's 8 GPUs")));
}

#[test]
fn partial_runs_get_a_note() {
    let r = run(1 << 20, vec![nic(0, 0, "rdmap0s0", 99.0, None)]);
    let g = evaluate(&p5(), &[&r]);
    assert!(g.pass);
    assert_eq!(g.notes.len(), 2, "{:?}", g.notes);
    assert!(g.notes[1].contains("--nics-per-gpu 4"), "{:?}", g.notes);
}

#[test]
fn pick_takes_the_largest_size_or_last_stage() {
    let a = run(4096, vec![nic(0, 0, "shm", 1.0, None)]);
    let b = run(1 << 20, vec![nic(0, 0, "shm", 2.0, None)]);
    let c = run(65536, vec![nic(0, 0, "shm", 3.0, None)]);
    let runs = vec![a, b, c];
    let p = pick(&runs);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].size, 1 << 20);
    let mut l = runs.clone();
    for (r, s) in l.iter_mut().zip(["baseline", "+pin", "+lazy posting"]) {
        r.stage = Some(s.into());
    }
    assert_eq!(pick(&l)[0].stage.as_deref(), Some("+lazy posting"));
}

#[test]
fn bad_flags_are_usage_errors() {
    assert!(GateSpec::from_flags(None, None, None).unwrap().is_none());
    for (e, p, g) in [
        (Some("p99"), None, None),
        (None, Some(0.0), None),
        (None, Some(150.0), None),
        (None, None, Some(-1.0)),
        (None, None, Some(f64::NAN)),
    ] {
        let err = GateSpec::from_flags(e, p, g).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
    }
    assert!(check_workload("lat").is_err());
    assert!(check_workload("write").is_ok());
}

/// No run to judge (every pair of a compare failed): the gate fails, and says so.
#[test]
fn an_empty_gate_fails_and_says_so() {
    let g = evaluate(&p5(), &[]);
    assert!(!g.pass);
    assert!(g.summary().starts_with("gate failed"), "{}", g.summary());
    assert!(g.summary().contains("no run to judge"), "{}", g.summary());
}
