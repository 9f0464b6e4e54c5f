//! The run record (`record` in `--json`, "Run record" in `--report`): what ran, where and on
//! what, for loopback, compare, server and client, and `rdma-bench run`; and the commit that
//! `build.rs` reads, `unknown` outside git.
#![cfg(feature = "efa")]

mod common;

#[path = "../build/commit.rs"]
mod commit;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;

const SMALL: &[&str] = &["-s", "4K", "--pages", "16", "-n", "2"];

fn read(p: &str) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The commit this test binary's rdma-bench must report: the workspace's HEAD, where it is
/// a git work tree of its own (cargo rebuilt rdma-bench when HEAD moved).
fn expected_commit() -> String {
    commit::commit(&workspace()).0
}

/// Seconds since the epoch of an RFC 3339 UTC time as the record writes it.
fn epoch(t: &str) -> u64 {
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().expect(t);
    assert_eq!((t.len(), &t[10..11], &t[19..]), (20, "T", "Z"), "{t}");
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant), the inverse of the record's own conversion.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)) as u64
}

/// One side's facts, as a record or a peer carries them: this host, this build, libfabric
/// over `provider`.
fn check_facts(f: &serde_json::Value, provider: &str) {
    assert_eq!(f["rdma_bench"], env!("CARGO_PKG_VERSION"), "{f:#}");
    assert_eq!(f["commit"], expected_commit().as_str(), "{f:#}");
    assert_eq!(
        f["host"],
        read("/proc/sys/kernel/hostname").as_str(),
        "{f:#}"
    );
    assert_eq!(
        f["kernel"],
        read("/proc/sys/kernel/osrelease").as_str(),
        "{f:#}"
    );
    assert!(f["cuda"].is_null(), "host memory: no CUDA facts: {f:#}");
    let b = &f["backend"];
    assert_eq!(b["backend"], "libfabric", "{f:#}");
    assert_eq!(b["library"], "libfabric", "{f:#}");
    let v = b["version"].as_str().expect("libfabric's version");
    assert!(
        v.split('.').take(2).all(|p| p.parse::<u32>().is_ok()),
        "{v}"
    );
    assert!(
        b["path"]
            .as_str()
            .is_some_and(|p| p.contains("libfabric.so")),
        "{f:#}"
    );
    assert!(
        b["provider"]
            .as_str()
            .is_some_and(|p| p.starts_with(provider)),
        "{f:#}"
    );
    assert!(b["fabric"].as_str().is_some_and(|x| !x.is_empty()), "{f:#}");
    assert!(b["device"].as_str().is_some_and(|x| !x.is_empty()), "{f:#}");
    assert!(b["settings"]["api_version"].is_string(), "{f:#}");
}

fn check_record(r: &serde_json::Value, command: &str, provider: &str) {
    let argv: Vec<&str> = r["command"]
        .as_array()
        .expect("the command line")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        argv.first().is_some_and(|a| a.ends_with("rdma-bench")),
        "{argv:?}"
    );
    assert_eq!(argv.get(1), Some(&command), "{argv:?}");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let t = epoch(r["time_utc"].as_str().expect("a time"));
    assert!(t <= now && now - t < 600, "{t} vs now {now}");
    check_facts(r, provider);
}

#[test]
fn loopback_json_and_report_carry_the_record() {
    let page = std::env::temp_dir().join(format!("rdma-bench-record-{}.html", std::process::id()));
    let mut a = vec!["loopback", "--json", "--report", page.to_str().unwrap()];
    a.extend_from_slice(SMALL);
    let v = run(&a, T).expect_ok().json();
    let r = &v["record"];
    check_record(r, "loopback", "shm");
    // The server side, in this process.
    check_facts(&r["peer"], "shm");
    assert_eq!(r["backend"]["provider"], v["provider"]);
    assert!(r["instance"].is_null() || r["instance"].is_string());
    let html = std::fs::read_to_string(&page).expect("the report");
    let _ = std::fs::remove_file(&page);
    for want in [
        "<h2>Run record</h2>".to_string(),
        expected_commit(),
        read("/proc/sys/kernel/osrelease"),
        read("/proc/sys/kernel/hostname"),
        format!("libfabric {}", r["backend"]["version"].as_str().unwrap()),
        "<th class=\"l\">peer</th>".into(),
    ] {
        assert!(html.contains(&want), "the report lacks {want:?}");
    }
}

#[test]
fn compare_records_each_pairs_backends() {
    let mut a = vec!["compare", "--json", "--pairs", "efa:shm,efa:tcp"];
    a.extend_from_slice(SMALL);
    let v = run(&a, T).expect_ok().json();
    let r = &v["record"];
    assert!(
        r["backend"].is_null(),
        "one record for several backends: {r:#}"
    );
    let pairs = r["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 2, "{r:#}");
    for (p, (name, prov)) in pairs
        .iter()
        .zip([("libfabric:shm", "shm"), ("libfabric:tcp", "tcp")])
    {
        assert_eq!(p["pair"], name);
        for side in ["backend", "peer"] {
            check_facts(
                &serde_json::json!({
                    "rdma_bench": r["rdma_bench"], "commit": r["commit"], "host": r["host"],
                    "kernel": r["kernel"], "cuda": null, "backend": p[side]
                }),
                prov,
            );
        }
    }
}

#[test]
fn a_client_records_the_servers_facts() {
    let srv = Server::start(&["--provider", "shm", "--sessions", "1"]);
    let mut a = vec![
        "client",
        "--connect",
        srv.addr.as_str(),
        "--provider",
        "shm",
        "--json",
    ];
    a.extend_from_slice(SMALL);
    let v = run(&a, T).expect_ok().json();
    let r = &v["record"];
    check_record(r, "client", "shm");
    // The server is another process: what it said in its welcome.
    check_facts(&r["peer"], "shm");
}

fn spawn_rank(rank: u32, port: u16) -> Child {
    let mut c = Command::new(bin());
    c.args(["run", "--provider", "shm", "--json"]).args(SMALL);
    for (k, _) in std::env::vars() {
        if k.starts_with("OMPI_") || k.starts_with("SLURM_") || k.starts_with("PMI_") {
            c.env_remove(k);
        }
    }
    c.env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting rdma-bench run")
}

#[test]
fn a_rank_job_records_rank_0_and_the_ranks_that_differ() {
    let port = free_port();
    let kids: Vec<Child> = (0..2).map(|r| spawn_rank(r, port)).collect();
    let mut outs = kids.into_iter().map(|k| wait(k, T));
    let v = outs.next().unwrap().expect_ok().json();
    outs.next().unwrap().expect_ok();
    let r = &v["record"];
    check_record(r, "run", "shm");
    // Both ranks run the same build on this host over shm: nothing differs.
    assert!(r["ranks"].is_null(), "{r:#}");
}

/// `build.rs` reads the commit of the workspace's own git work tree, and says `unknown`
/// honestly elsewhere: outside any repository, and inside another project's.
#[test]
fn the_commit_is_unknown_outside_a_work_tree_of_its_own() {
    let dir = std::env::temp_dir().join(format!("rdma-bench-commit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sub = dir.join("vendored/rdma-bench");
    std::fs::create_dir_all(&sub).unwrap();
    // Not in any repository (the temporary folder is not).
    assert_eq!(commit::commit(&sub).0, "unknown");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !git(&["init", "-q"]) || !git(&["commit", "-q", "--allow-empty", "-m", "x"]) {
        eprintln!("skipped the repository cases: git cannot make one here");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // The top of a work tree: its commit, and the files that move with it.
    let (hash, watch) = commit::commit(&dir);
    assert_eq!(hash.len(), 40, "{hash}");
    assert!(watch.iter().any(|p| p.ends_with("HEAD")), "{watch:?}");
    // A copy inside another project's repository: that commit is not its own.
    assert_eq!(commit::commit(&sub).0, "unknown");
    let _ = std::fs::remove_dir_all(&dir);
    // And this workspace, where it is a work tree, names its HEAD.
    let head = Command::new("git")
        .arg("-C")
        .arg(workspace())
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(h) = head {
        assert_eq!(expected_commit(), h);
    }
}
