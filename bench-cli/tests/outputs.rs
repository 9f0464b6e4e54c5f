//! Gates, plots and the HTML report end to end over libfabric shm; the report is opened in a
//! real headless browser (Debian's chromium) when one is installed.
#![cfg(feature = "efa")]

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rdma-bench-out-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn impossible_gate_fails_with_the_named_table() {
    let o = run(
        &[
            "loopback",
            "-n",
            "2",
            "--pages",
            "16",
            "-s",
            "4K",
            "--min-gbps",
            "100000",
        ],
        T,
    );
    assert_eq!(o.code, Some(3), "{}\n{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("gate: at least 100000 Gbit/s per NIC"),
        "{}",
        o.stdout
    );
    // The table names the NIC, its GPU, and the result.
    assert!(
        o.stdout.contains("nic 0    shm                   0"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("FAIL"), "{}", o.stdout);
    assert!(o.stderr.contains("gate failed"), "{}", o.stderr);
    assert!(o.stderr.contains("NIC 0 (shm, GPU 0)"), "{}", o.stderr);

    // --expect p5 on shm: 100 Gbit/s per NIC is far beyond a memory copy of 4 KiB pages.
    let o = run(
        &[
            "loopback", "-n", "2", "--pages", "16", "-s", "4K", "--expect", "p5", "--json",
        ],
        T,
    );
    assert_eq!(o.code, Some(3), "{}", o.stderr);
    let v = o.json();
    assert_eq!(v["gate"]["pass"], false);
    let nic = &v["gate"]["rows"][0];
    assert_eq!(nic["scope"], "nic");
    assert_eq!(nic["nic"], "shm");
    assert_eq!(nic["gpu"], 0);
    assert_eq!(nic["line_gbps"], 100.0);
    assert!(nic["pct"].as_f64().unwrap() < 90.0);
}

#[test]
fn reachable_gate_passes() {
    let o = run(
        &[
            "loopback",
            "-n",
            "2",
            "--pages",
            "16",
            "-s",
            "4K",
            "--min-gbps",
            // 1 Mbit in the timed phase: a floor even a stalled thread on a loaded box passes
            // (0.001 asked it to finish within about a second).
            "0.000001",
        ],
        T,
    )
    .expect_ok();
    assert!(o.stdout.contains("gate: PASS"), "{}", o.stdout);
}

#[test]
fn gate_flags_are_checked_before_running() {
    run(&["loopback", "--expect", "p9"], T).expect_err("known: p5");
    run(&["loopback", "--min-pct", "0"], T).expect_err("--min-pct");
    run(&["loopback", "--workload", "lat", "--min-gbps", "1"], T).expect_err("gate bandwidth");
    run(&["loopback", "--plot", "/nonexistent/dir/p.svg"], T).expect_err("does not exist");
}

#[test]
fn plot_of_a_size_sweep_and_of_compare() {
    let d = tmp("plot");
    let svg = d.join("sweep.svg");
    let s = svg.to_str().unwrap();
    run(
        &[
            "loopback", "--sizes", "4K,64K", "-n", "2", "--pages", "8", "--plot", s,
        ],
        T,
    )
    .expect_ok();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    assert!(
        text.contains("libfabric/shm") && text.contains("64K"),
        "{text}"
    );
    let cmp = d.join("compare.svg");
    run(
        &[
            "compare",
            "--pairs",
            "efa:shm,efa:tcp",
            "--sizes",
            "4K,64K",
            "-n",
            "2",
            "--pages",
            "8",
            "--plot",
            cmp.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    )
    .expect_ok();
    let text = std::fs::read_to_string(&cmp).unwrap();
    assert!(
        text.contains("libfabric:shm") && text.contains("libfabric:tcp"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(d);
}

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Headless chromium on a local file, with the flags a closed network needs.
fn browse(chrome: &Path, profile: &Path, extra: &[&str], page: &Path) -> Out {
    let child = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting chromium");
    wait(child, Duration::from_secs(120))
}

#[test]
fn html_report_renders_in_a_browser_without_console_errors() {
    let Some(chrome) = chromium() else {
        transport_core::skip::note(
            "no chromium",
            "chromium is not installed (ci/setup.sh installs it for ci/test.sh)",
        );
        return;
    };
    let d = tmp("html");
    let page = d.join("report.html");
    let mut args = vec![
        "loopback",
        "--sizes",
        "4K,64K",
        "-n",
        "2",
        "--pages",
        "8",
        "--min-gbps",
        "0.000001",
        "--report",
    ];
    let p = page.to_str().unwrap().to_string();
    args.push(&p);
    let xml = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/topologies/hwloc/aws-p5.48xlarge.8xH100-32xEFA.nixl.hwloc2.xml");
    let xs = xml.to_str().unwrap().to_string();
    if xml.exists() {
        args.extend(["--report-topology", &xs]);
    }
    run(&args, T).expect_ok();
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing to fetch.
    assert!(!html.contains("src="), "external resource in the page");
    assert!(!html.contains("href=\"http"), "external link in the page");

    let dom = browse(&chrome, &d.join("profile"), &["--dump-dom"], &page);
    assert_eq!(dom.code, Some(0), "chromium failed:\n{}", dom.stderr);
    let console: Vec<&str> = dom
        .stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    for needle in [
        "<h1>rdma-bench report</h1>",
        "<h2>Gate</h2>",
        "<h2>Results</h2>",
        "<h2>Bandwidth</h2>",
        "<h2>Topology</h2>",
        "<h2>Node check (rdma-bench doctor)</h2>",
        "<svg",
        "libfabric/shm",
    ] {
        assert!(
            dom.stdout.contains(needle),
            "{needle} missing from the rendered DOM"
        );
    }
    let shot = d.join("report.png");
    let s = browse(
        &chrome,
        &d.join("profile2"),
        &[
            "--hide-scrollbars",
            "--window-size=1280,2600",
            &format!("--screenshot={}", shot.display()),
        ],
        &page,
    );
    assert_eq!(s.code, Some(0), "chromium screenshot failed:\n{}", s.stderr);
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    assert!(
        png.len() > 20_000,
        "screenshot suspiciously small: {} bytes",
        png.len()
    );
    let _ = std::fs::remove_dir_all(d);
}
