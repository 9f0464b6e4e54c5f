//! `rdma-bench loopback` and `compare` over libfabric shm and tcp, and bad input.
#![cfg(feature = "efa")]

mod common;
use common::*;

fn args<'a>(a: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["loopback"];
    v.extend_from_slice(a);
    v
}

#[test]
fn no_flags_verifies_and_prints_gbps() {
    let o = run(&["loopback"], T).expect_ok();
    assert!(o.stdout.contains("Gbit/s"), "{}", o.stdout);
    assert!(o.stdout.contains("every byte verified"), "{}", o.stdout);
    assert!(o.stdout.contains("libfabric/shm"), "{}", o.stdout);
}

fn check_run(v: &serde_json::Value, workload: &str) {
    assert_eq!(v["workload"], workload);
    assert_eq!(v["backend"], "libfabric");
    for k in [
        "provider", "bytes", "seconds", "gbps", "mops", "verified", "per_nic",
    ] {
        assert!(!v[k].is_null(), "{k} missing in {v}");
    }
}

#[test]
fn json_write_over_shm() {
    let mut a = args(SMALL);
    a.push("--json");
    let v = run(&a, T).expect_ok().json();
    check_run(&v, "write");
    assert_eq!(v["verified"], true);
    assert_eq!(v["provider"], "shm");
    assert!(v["gbps"].as_f64().unwrap() > 0.0);
    assert_eq!(v["bytes"], 2 * 16 * 4096);
    assert_eq!(v["per_nic"].as_array().unwrap().len(), 1);
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
}

#[test]
fn tcp_provider() {
    let mut a = args(SMALL);
    a.extend_from_slice(&["--provider", "tcp", "--json"]);
    let v = run(&a, T).expect_ok().json();
    check_run(&v, "write");
    assert_eq!(v["verified"], true);
    assert!(v["provider"].as_str().unwrap().contains("tcp"));
}

#[test]
fn sizes_table() {
    let o = run(
        &args(&["--sizes", "64,4K,64K", "-n", "2", "--pages", "8"]),
        T,
    )
    .expect_ok();
    for s in ["64", "4K", "64K"] {
        assert!(o.stdout.contains(s), "{}", o.stdout);
    }
    let v = run(
        &args(&["--sizes", "64,4K,64K", "-n", "2", "--pages", "8", "--json"]),
        T,
    )
    .expect_ok()
    .json();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[2]["size"], 65536);
    assert!(runs.iter().all(|r| r["verified"] == true));
}

#[test]
fn ladder_runs_every_stage() {
    let o = run(
        &args(&[
            "--ladder",
            "-n",
            "2",
            "--pages",
            "16",
            "-s",
            "4K",
            "--gpus",
            "0,1",
            "--nics-per-gpu",
            "2",
        ]),
        T,
    )
    .expect_ok();
    for stage in [
        "baseline",
        "+nic groups",
        "+warm-up",
        "+thread per GPU",
        "+pin",
        "+per-thread state",
        "+batch",
        "+lazy posting",
    ] {
        assert!(o.stdout.contains(stage), "{stage} missing:\n{}", o.stdout);
    }
    let v = run(
        &args(&["--ladder", "-n", "2", "--pages", "16", "-s", "4K", "--json"]),
        T,
    )
    .expect_ok()
    .json();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    assert_eq!(runs[7]["knobs"]["lazy"], true);
    assert_eq!(runs[7]["knobs"]["threads"], "per-gpu");
    assert!(runs
        .iter()
        .all(|r| r["verified"] == true && r["gbps"].as_f64().unwrap() > 0.0));
}

#[test]
fn rounds_report_the_median_round_of_each_size_and_stage() {
    let v = run(
        &args(&[
            "--sizes", "4K,64K", "-n", "2", "--pages", "8", "--rounds", "3", "--json",
        ]),
        T,
    )
    .expect_ok()
    .json();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "one report per size, not per round");
    for (r, size) in runs.iter().zip([4096, 65536]) {
        assert_eq!(r["size"], size);
        assert_eq!(r["verified"], true);
        let mut rounds: Vec<f64> = r["rounds"]
            .as_array()
            .expect("rounds")
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(rounds.len(), 3);
        rounds.sort_by(f64::total_cmp);
        assert_eq!(r["gbps"].as_f64().unwrap(), rounds[1], "the median round");
    }

    let o = run(
        &args(&[
            "--ladder", "-n", "2", "--pages", "8", "-s", "4K", "--rounds", "2",
        ]),
        T,
    )
    .expect_ok();
    assert!(o.stdout.contains("rounds min..max"), "{}", o.stdout);
    assert!(
        o.stdout.contains("median of 2 interleaved rounds"),
        "{}",
        o.stdout
    );
    assert_eq!(o.stdout.matches("+lazy posting").count(), 1, "{}", o.stdout);

    for bad in ["0", "101"] {
        let o = run(&args(&["--rounds", bad]), T);
        assert_eq!(o.code, Some(2), "--rounds {bad}: {}", o.stderr);
    }
}

#[test]
fn imm_every_posts_k_passes_per_immediate() {
    // One buffer, one immediate per 8 WRITEs: -n counts immediates.
    let v = run(
        &args(&[
            "--single-buffer",
            "-s",
            "4K",
            "-n",
            "5",
            "--imm-every",
            "8",
            "--json",
        ]),
        T,
    )
    .expect_ok()
    .json();
    assert_eq!(v["bytes"], 5 * 8 * 4096);
    assert_eq!(v["verified"], true);
    // Paged: the page set 3 times over per immediate, every page still verified.
    let v = run(
        &args(&[
            "-s",
            "4K",
            "--pages",
            "8",
            "-n",
            "2",
            "--imm-every",
            "3",
            "--json",
        ]),
        T,
    )
    .expect_ok()
    .json();
    assert_eq!(v["bytes"], 2 * 3 * 8 * 4096);
    assert_eq!(v["verified"], true);
    for bad in [
        &["--imm-every", "0"][..],
        &["--imm-every", "4097"],
        &["--imm-every", "2", "--workload", "send"],
        &["--imm-every", "4096", "--pages", "1024"],
    ] {
        let o = run(&args(bad), T);
        assert_eq!(o.code, Some(2), "{bad:?}: {}", o.stderr);
    }
}

/// `--topology FILE.xml` stands another machine's topology in for this one's (what the
/// simulated EFA devices of a p5 need): its 8 GPUs are known, a ninth is refused, and a file
/// that is not there is a usage error.
#[test]
fn topology_from_an_hwloc_export() {
    let p5 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topo/tests/fixtures/p5.48xlarge.xml"
    );
    let v = run(
        &args(&[
            "--topology",
            p5,
            "--gpus",
            "0-7",
            "-s",
            "4K",
            "-n",
            "2",
            "--json",
        ]),
        T,
    )
    .expect_ok()
    .json();
    assert_eq!(v["verified"], true);
    assert_eq!(v["gpus"].as_array().map(|g| g.len()), Some(8));
    let o = run(&args(&["--topology", p5, "--gpus", "8"]), T);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("8 GPU(s)"), "{}", o.stderr);
    let o = run(&args(&["--topology", "/nonexistent/topo.xml"]), T);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("--topology"), "{}", o.stderr);
}

/// `-n`'s help says what the code above does: with --imm-every K it counts immediates, K
/// passes over the page set each (it said passes over the page set).
#[test]
fn help_says_n_counts_immediates_with_imm_every() {
    let o = run(&["loopback", "--help"], T).expect_ok();
    let help = o.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("With --imm-every K, write and rate count immediates"),
        "{help}"
    );
}

#[test]
fn latency_both_ops() {
    for op in ["write-imm", "send"] {
        let v = run(
            &args(&[
                "--workload",
                "lat",
                "-n",
                "200",
                "--warmup",
                "10",
                "--op",
                op,
                "--json",
            ]),
            T,
        )
        .expect_ok()
        .json();
        check_run(&v, "lat");
        assert_eq!(v["op"], op);
        let (min, p50, p99, max) = (
            v["min_us"].as_f64().unwrap(),
            v["p50_us"].as_f64().unwrap(),
            v["p99_us"].as_f64().unwrap(),
            v["max_us"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= p50 && p50 <= p99 && p99 <= max, "{v}");
    }
    let o = run(&args(&["--workload", "lat", "-n", "100"]), T).expect_ok();
    assert!(o.stdout.contains("p99"), "{}", o.stdout);
}

#[test]
fn send_and_rate() {
    let v = run(
        &args(&["--workload", "send", "-n", "300", "-s", "4K", "--json"]),
        T,
    )
    .expect_ok()
    .json();
    check_run(&v, "send");
    assert_eq!(v["verified"], true);
    assert_eq!(v["ops"], 300);
    let v = run(
        &args(&[
            "--workload",
            "rate",
            "-n",
            "2",
            "--pages",
            "512",
            "--batch",
            "16",
            "--lazy",
            "--json",
        ]),
        T,
    )
    .expect_ok()
    .json();
    check_run(&v, "rate");
    assert_eq!(v["ops"], 2 * 512);
    assert!(v["mops"].as_f64().unwrap() > 0.0);
}

#[test]
fn knobs_multi_nic_threads() {
    // Two logical GPU groups of two NICs, a thread per GPU, pinned, sharded, batched, lazy.
    let v = run(
        &args(&[
            "--gpus",
            "0,1",
            "--nics-per-gpu",
            "2",
            "--threads",
            "per-gpu",
            "--pin",
            "--sharded",
            "--batch",
            "8",
            "--lazy",
            "--json",
            "-n",
            "3",
            "--pages",
            "33",
            "-s",
            "4K",
        ]),
        T,
    )
    .expect_ok()
    .json();
    assert_eq!(v["verified"], true);
    assert_eq!(v["per_nic"].as_array().unwrap().len(), 4);
    assert_eq!(v["bytes"], 2 * 3 * 33 * 4096);
}

#[test]
fn compare_pairs() {
    let o = run(
        &[
            "compare",
            "--pairs",
            "efa:shm,efa:tcp",
            "-n",
            "2",
            "--pages",
            "8",
            "-s",
            "4K",
        ],
        T,
    )
    .expect_ok();
    // The pairs are named by the old name, an alias: they print by the backend's name, and
    // nothing says "efa" where the efa provider carried no byte.
    assert!(
        o.stdout.contains("libfabric:shm") && o.stdout.contains("libfabric:tcp"),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("efa"), "{}", o.stdout);
    let v = run(
        &[
            "compare",
            "--pairs",
            "efa:shm,efa:tcp",
            "-n",
            "2",
            "--pages",
            "8",
            "-s",
            "4K",
            "--json",
        ],
        T,
    )
    .expect_ok()
    .json();
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2);
    assert!(pairs
        .iter()
        .all(|p| p["gbps"].as_f64().unwrap() > 0.0 && p["verified"] == true));
}

#[test]
fn unknown_provider() {
    run(&args(&["--provider", "no-such-provider"]), T).expect_err("no-such-provider");
}

#[test]
fn unknown_device() {
    run(&args(&["--devices", "no-such-nic"]), T).expect_err("no-such-nic");
    run(
        &args(&["--backend", "verbs", "--devices", "no-such-nic"]),
        T,
    )
    .expect_err("no-such-nic");
}

/// `loopback --backend ucx -s 4K -n 2` and `extra`.
#[cfg(feature = "ucx")]
fn ucx_loopback<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["loopback", "--backend", "ucx", "-s", "4K", "-n", "2"];
    a.extend_from_slice(extra);
    a
}

/// UCX only warns about a device it does not have and runs on what it has (shared memory
/// here), which the run would label with the name it was given: refused instead, in words
/// that list what UCX has.
#[cfg(feature = "ucx")]
#[test]
fn unknown_ucx_device() {
    for dev in ["no-such-nic", "lo"] {
        // lo with UCX's sm (loopback's default): no such device on shared memory either.
        let o = run(&ucx_loopback(&["--devices", dev]), T)
            .expect_err(&format!("UCX uses no device named ({dev}) with TLS=sm"));
        assert_eq!(o.code, Some(1), "{}", o.stderr);
    }
    run(&ucx_loopback(&["--provider", "tcp", "--devices", "lo"]), T).expect_ok();
}

/// UCX's warnings go to stderr, so `--json` keeps stdout a document (UCX prints them to
/// stdout by default); a `UCX_LOG_FILE` the user set still decides where they go.
#[cfg(feature = "ucx")]
#[test]
fn ucx_warnings_leave_json_on_stdout_alone() {
    let args = ucx_loopback(&["--provider", "tcp,junk", "--devices", "lo", "--json"]);
    let cmd = |log: Option<&std::path::Path>| {
        let mut c = common::command(&args);
        match log {
            Some(f) => c.env("UCX_LOG_FILE", f),
            None => c.env_remove("UCX_LOG_FILE"),
        };
        common::wait(c.spawn().expect("starting rdma-bench"), T).expect_ok()
    };
    let warned = "transport 'junk' is not available";
    let o = cmd(None);
    assert_eq!(o.json()["verified"], true, "{}", o.stdout);
    assert!(o.stderr.contains(warned), "{}", o.stderr);
    let f = std::env::temp_dir().join(format!("rb-ucx-log-{}", std::process::id()));
    let o = cmd(Some(&f));
    let logged = std::fs::read_to_string(&f).unwrap_or_default();
    let _ = std::fs::remove_file(&f);
    assert!(logged.contains(warned), "UCX_LOG_FILE holds {logged:?}");
    assert!(!o.stderr.contains(warned), "{}", o.stderr);
}

#[test]
fn gpu_out_of_range() {
    run(&args(&["--gpus", "99"]), T).expect_err("out of range");
    // CUDA: out of range, or no driver here; either way a clear error, never a crash.
    let o = run(&args(&["--mem", "cuda", "--gpus", "99"]), T);
    assert!(!o.ok());
    let e = o.stderr.to_lowercase();
    assert!(e.contains("out of range") || e.contains("cuda"), "{e}");
}

#[test]
fn page_size_over_max_write() {
    run(&args(&["-s", "2G", "--pages", "1"]), T).expect_err("largest write");
}

#[test]
fn bad_flags_are_usage_errors() {
    let o = run(&args(&["--batch", "0"]), T);
    assert_eq!(o.code, Some(2));
    let o = run(&args(&["--window", "65537"]), T);
    assert_eq!(o.code, Some(2));
    assert!(o.stderr.contains("--window 65537"), "{}", o.stderr);
    let o = run(&args(&["-s", "4X"]), T);
    assert_eq!(o.code, Some(2));
    let o = run(&args(&["--buf-offset", "4096"]), T);
    assert_eq!(o.code, Some(2));
    assert!(o.stderr.contains("--buf-offset 4096"), "{}", o.stderr);
    let o = run(&args(&["--buf-offset", "4096", "--mem", "cuda"]), T);
    assert_eq!(o.code, Some(2));
    assert!(o.stderr.contains("--buf-offset 4096"), "{}", o.stderr);
    let o = run(&args(&["--workload", "lat", "--ladder"]), T);
    assert_eq!(o.code, Some(2));
    // Limits the server holds a request to are the client's to refuse, by the flag's name.
    let o = run(&args(&["--workload", "rate", "--pages", "2000000"]), T);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("--pages 2000000"), "{}", o.stderr);
    let o = run(&args(&["-n", "18446744073709551615"]), T);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    // gpu-write's batch is allocated up front.
    let o = run(
        &args(&["--workload", "gpu-write", "--batch", "4294967295"]),
        T,
    );
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("--batch 4294967295"), "{}", o.stderr);
}

/// `--buf-offset`: both sides' regions start that far into a page (the server's too, which
/// takes the offset from the client's hello), and every workload still verifies every byte.
#[test]
fn buf_offset_places_both_sides_regions_and_verifies() {
    for w in [
        &["--workload", "write", "--pages", "8"][..],
        &["--workload", "send"],
        &["--workload", "lat"],
    ] {
        let mut a = args(&["--buf-offset", "1000", "-s", "4K", "-n", "4", "-v"]);
        a.extend_from_slice(w);
        let o = run(&a, T).expect_ok();
        assert_eq!(
            o.stderr.matches("starting 1000 bytes into a page").count(),
            2,
            "{w:?}: the client's and the server's regions\n{}",
            o.stderr
        );
        if w[1] != "lat" {
            assert!(
                o.stdout.contains("every byte verified"),
                "{w:?}: {}",
                o.stdout
            );
        }
    }
    // Without the flag, on the page.
    let o = run(&args(&["-s", "4K", "-n", "2", "--pages", "8", "-v"]), T).expect_ok();
    assert_eq!(
        o.stderr.matches("starting 0 bytes into a page").count(),
        2,
        "{}",
        o.stderr
    );
}

/// `compare` across backends: libfabric's shm beside UCX's shared memory, one workload, both
/// verified, each pair's record naming its own library.
#[cfg(feature = "ucx")]
#[test]
fn compare_libfabric_shm_with_ucx_sm() {
    let v = run(
        &[
            "compare",
            "--pairs",
            "libfabric:shm,ucx:sm",
            "-n",
            "2",
            "--pages",
            "8",
            "-s",
            "4K",
            "--json",
        ],
        T,
    )
    .expect_ok()
    .json();
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2, "{v:#}");
    for (p, (name, backend, prov)) in pairs.iter().zip([
        ("libfabric:shm", "libfabric", "shm"),
        ("ucx:sm", "ucx", "sm"),
    ]) {
        assert_eq!(p["pair"], name, "{p:#}");
        assert_eq!(p["backend"], backend, "{p:#}");
        assert_eq!(p["provider"], prov, "{p:#}");
        assert_eq!(p["verified"], true, "{p:#}");
        // Like for like: the same workload moves the same bytes on both.
        assert_eq!(p["bytes"], 2 * 8 * 4096, "{p:#}");
        assert!(p["gbps"].as_f64().unwrap() > 0.0, "{p:#}");
    }
    let rec = v["record"]["pairs"].as_array().expect("the record's pairs");
    assert_eq!(rec[1]["pair"], "ucx:sm");
    assert_eq!(rec[1]["backend"]["library"], "ucx", "{:#}", rec[1]);
    assert_eq!(rec[0]["backend"]["library"], "libfabric", "{:#}", rec[0]);
    // Both sides' records say how UCX's WRITEs went to the peer (write=auto decides per peer
    // once it is added): over shared memory, puts between host memories (cma), active
    // messages into and out of GPU memory (no cuda_ipc lane within one process).
    let decided = "am host to GPU, GPU to host, GPU to GPU, put otherwise";
    assert_eq!(
        rec[1]["backend"]["settings"]["write"], decided,
        "{:#}",
        rec[1]
    );
    assert_eq!(rec[1]["peer"]["settings"]["write"], decided, "{:#}", rec[1]);
    // The table, too.
    let o = run(
        &[
            "compare",
            "--pairs",
            "libfabric:shm,ucx:sm",
            "-n",
            "2",
            "--pages",
            "8",
            "-s",
            "4K",
        ],
        T,
    )
    .expect_ok();
    assert!(
        o.stdout.contains("libfabric:shm") && o.stdout.contains("ucx:sm"),
        "{}",
        o.stdout
    );
}

/// A side whose idle timeout fires ends the loopback with that error, and neither side closes
/// its endpoints while the other may still use them: shm maps a peer's queue once per process,
/// so a side that closed first unmapped the queue the other side's thread was posting to (a
/// SIGSEGV in `pthread_spin_lock`). The timeout must fire on every machine: one immediate per
/// 1000 passes over 256 pages of 4 KiB is 1 GiB of WRITEs with no immediate, so the server
/// sees no progress for 10 ms while the client is still posting (the run would need 800 Gbit/s
/// over shm to finish first; a timeout of 1 ms at 5 iterations let a fast CI host finish).
#[test]
fn a_side_that_times_out_does_not_pull_the_other_sides_queue_away() {
    for _ in 0..3 {
        let o = run(
            &[
                "loopback",
                "-s",
                "4K",
                "--pages",
                "256",
                "-n",
                "1",
                "--imm-every",
                "1000",
                "--idle-timeout",
                "0.01",
            ],
            T,
        )
        .expect_err("timed out");
        assert_eq!(o.code, Some(1), "{}", o.stderr);
        let e = o.stderr.to_lowercase();
        assert!(e.contains("timed out"), "{}", o.stderr);
        assert!(
            !e.contains("signal") && !e.contains("segmentation"),
            "{}",
            o.stderr
        );
    }
}

/// Flags a command would ignore or quietly change are refused, with exit status 2: compare's
/// --devices (each pair names its own), gpu-write's -n past its range, --pages 0, and one
/// file for both --plot and --report.
#[test]
fn flags_that_would_be_ignored_are_refused() {
    let plot = std::env::temp_dir().join(format!("rb-same-{}.svg", std::process::id()));
    let plot = plot.to_str().expect("a UTF-8 temp path");
    for (args, needle) in [
        (
            &[
                "compare",
                "--pairs",
                "libfabric:tcp",
                "--devices",
                "x",
                "-n",
                "2",
            ][..],
            "drop --backend, --provider and --devices",
        ),
        (
            &["compare", "--pairs", "libfabric:shm", "--provider", "tcp"][..],
            "from --pairs",
        ),
        (
            &["loopback", "--workload", "gpu-write", "-s", "4K", "-n", "0"][..],
            "-n 0",
        ),
        (
            &[
                "loopback",
                "--workload",
                "gpu-write",
                "-s",
                "4K",
                "-n",
                "1048577",
            ][..],
            "1..=1048576",
        ),
        (
            &["loopback", "-s", "4K", "-n", "2", "--pages", "0"][..],
            "--pages 0",
        ),
        (
            &[
                "loopback", "-s", "4K", "-n", "2", "--plot", plot, "--report", plot,
            ][..],
            "both name",
        ),
    ] {
        let o = run(args, T).expect_err(needle);
        assert_eq!(o.code, Some(2), "{args:?}: {}", o.stderr);
    }
    assert!(
        !std::path::Path::new(plot).exists(),
        "a refused run wrote {plot}"
    );
}
