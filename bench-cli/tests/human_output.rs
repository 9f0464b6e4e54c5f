//! Human output is for people: `-v` in words (no Rust debug structs, no empty lists, the
//! provider named once), and the ladder says when a step is within the noise of its rounds.

mod common;
use common::*;

use bench_core::config::Knobs;
use bench_core::report::{classify_step, render, RunReport, Step};

/// What Rust's `{:?}` leaves in text: struct braces, empty lists, field names.
fn debug_text(s: &str) -> Vec<&str> {
    [
        "{",
        "}",
        "[]",
        "Knobs",
        "Some(",
        "None",
        "nic_groups",
        "shm shm",
    ]
    .into_iter()
    .filter(|n| s.contains(n))
    .collect()
}

#[cfg(feature = "efa")]
#[test]
fn verbose_output_is_words() {
    for extra in [&[][..], &["--threads", "per-gpu", "--pin"][..]] {
        let mut a = vec![
            "loopback",
            "--provider",
            "shm",
            "-v",
            "-n",
            "4",
            "--pages",
            "8",
            "-s",
            "4K",
        ];
        a.extend_from_slice(extra);
        let o = run(&a, T).expect_ok();
        let bad = debug_text(&o.stderr);
        assert!(bad.is_empty(), "-v prints {bad:?}:\n{}", o.stderr);
        assert!(
            o.stderr.contains("knobs: nic groups, warm-up"),
            "{}",
            o.stderr
        );
        assert!(
            o.stderr.contains("not pinned") || o.stderr.contains("pinned to core"),
            "{}",
            o.stderr
        );
        assert!(o.stderr.contains("NIC 0 (GPU 0): shm, "), "{}", o.stderr);
    }
}

#[test]
fn knobs_and_pinning_in_words() {
    assert_eq!(
        Knobs::baseline().to_string(),
        "first NIC per GPU, no warm-up, one thread, batch 1"
    );
    let all = Knobs::ladder(&Knobs::baseline()).last().unwrap().1;
    assert_eq!(
        all.to_string(),
        "nic groups, warm-up 1, thread per GPU, pinned, per-thread state, batch 16, lazy posting"
    );
    use bench_core::units::{pinning, provider_nic};
    assert_eq!(pinning(&[]), "not pinned");
    assert_eq!(pinning(&[5]), "pinned to core 5");
    assert_eq!(pinning(&[3, 0, 1, 2, 8]), "pinned to cores 0-3, 8");
    assert_eq!(provider_nic("shm", "shm"), "shm");
    assert_eq!(provider_nic("efa", "rdmap16s27"), "efa rdmap16s27");
}

#[test]
fn ladder_steps_within_the_spread_are_noise() {
    // One round on either side: no spread, no verdict (the one-round "+55%" was noise).
    assert_eq!(classify_step(10.0, &[10.0], 15.5, &[15.5]), Step::Unknown);
    assert_eq!(
        classify_step(10.0, &[], 15.5, &[14.0, 15.5, 16.0]),
        Step::Unknown
    );
    // Ranges overlap: within noise, however large the change of the medians.
    assert!(matches!(
        classify_step(10.0, &[9.0, 10.0, 16.0], 15.5, &[15.0, 15.5, 16.5]),
        Step::WithinNoise(p) if (p - 55.0).abs() < 1e-9
    ));
    // Touching ranges still overlap.
    assert!(matches!(
        classify_step(10.0, &[9.0, 10.0, 11.0], 12.0, &[11.0, 12.0, 13.0]),
        Step::WithinNoise(_)
    ));
    // Apart: a gain or a loss.
    assert!(matches!(
        classify_step(10.0, &[9.5, 10.0, 10.5], 15.0, &[14.0, 15.0, 16.0]),
        Step::Gain(p) if (p - 50.0).abs() < 1e-9
    ));
    assert!(matches!(
        classify_step(10.0, &[9.5, 10.0, 10.5], 5.0, &[4.0, 5.0, 6.0]),
        Step::Loss(p) if (p + 50.0).abs() < 1e-9
    ));
    assert_eq!(Step::WithinNoise(55.0).to_string(), "within noise");
    assert_eq!(Step::Gain(50.0).to_string(), "+50%");
    assert_eq!(Step::Loss(-50.0).to_string(), "-50%");
}

fn stage(name: &str, rounds: &[f64]) -> RunReport {
    let mut s = rounds.to_vec();
    s.sort_by(f64::total_cmp);
    RunReport {
        workload: "write".into(),
        backend: "efa".into(),
        provider: "shm".into(),
        stage: Some(name.into()),
        mem: "host".into(),
        gpus: vec![0],
        nics: 1,
        size: 65536,
        ops: 1,
        bytes: 1,
        seconds: 1.0,
        gbps: s.get(s.len() / 2).copied().unwrap_or(0.0),
        mops: 0.0,
        line_rate_gbps: None,
        pct_line_rate: None,
        verified: false,
        knobs: Knobs::baseline(),
        cores: vec![],
        per_nic: vec![],
        op: None,
        min_us: None,
        p50_us: None,
        p99_us: None,
        max_us: None,
        rounds: rounds.to_vec(),
    }
}

fn row<'a>(table: &'a str, name: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no row {name}:\n{table}"))
}

#[test]
fn ladder_table_labels_noise_and_shows_the_spread() {
    let t = render(
        &[
            stage("baseline", &[10.0, 9.0, 16.0]),
            stage("+nic groups", &[15.5, 15.0, 16.5]),
            stage("+warm-up", &[30.0, 29.0, 31.0]),
        ],
        true,
    );
    assert!(row(&t, "+nic groups").ends_with("within noise"), "{t}");
    assert!(row(&t, "+warm-up").ends_with("+94%"), "{t}");
    assert!(row(&t, "baseline").contains("9.00..16.00"), "{t}");
    assert!(row(&t, "+warm-up").contains(" 7%"), "{t}");
    assert!(t.contains("median of 3 interleaved rounds"), "{t}");

    // One round: no gain claimed, and the table says how to tell.
    let t = render(
        &[stage("baseline", &[10.0]), stage("+nic groups", &[15.5])],
        true,
    );
    let r = row(&t, "+nic groups");
    assert!(!r.contains('%') && r.ends_with(" -"), "{t}");
    assert!(t.contains("--rounds 3"), "{t}");
}

#[cfg(feature = "efa")]
#[test]
fn ladder_runs_three_rounds_by_default() {
    let v = run(
        &[
            "loopback", "--ladder", "-n", "2", "--pages", "8", "-s", "4K", "--json",
        ],
        T,
    )
    .expect_ok()
    .json();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    assert!(
        runs.iter()
            .all(|r| r["rounds"].as_array().map(Vec::len) == Some(3)),
        "{v}"
    );
}
