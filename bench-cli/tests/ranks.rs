//! `rdma-bench run` as 4 processes on 127.0.0.1 with torchrun-style variables (no launcher
//! needed): every pattern, shm and tcp, a killed rank, mismatched options and version.
#![cfg(feature = "efa")]

mod common;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bench_core::config::{Knobs, MemKind, Pattern, Workload};
use bench_core::proto::{self, Join, Msg, RankSpec, RunSpec};
use common::*;

const SMALL_RUN: &[&str] = &["-s", "4K", "--pages", "16", "-n", "3"];

/// Start rank `rank` of `world` with torchrun-style variables (and nothing of a launcher).
fn spawn_rank(rank: u32, world: u32, port: u16, args: &[&str]) -> Child {
    let mut c = Command::new(bin());
    c.arg("run").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("OMPI_") || k.starts_with("SLURM_") || k.starts_with("PMI_") {
            c.env_remove(k);
        }
    }
    c.env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting rdma-bench run")
}

/// A whole job; every rank's output, rank by rank.
fn job(world: u32, args: &[&str]) -> Vec<Out> {
    let port = free_port();
    let kids: Vec<Child> = (0..world)
        .map(|r| spawn_rank(r, world, port, args))
        .collect();
    kids.into_iter().map(|k| wait(k, T)).collect()
}

fn check_job(outs: Vec<Out>, pattern: &str) -> serde_json::Value {
    let mut outs = outs.into_iter();
    let v = outs.next().unwrap().expect_ok().json();
    for (r, o) in outs.enumerate() {
        let o = o.expect_ok();
        assert!(o.stdout.is_empty(), "rank {} printed:\n{}", r + 1, o.stdout);
    }
    assert_eq!(v["pattern"], pattern);
    assert_eq!(v["world"], 4);
    assert_eq!(v["verified"], true);
    assert_eq!(v["launcher"], "torchrun");
    v
}

const PER_PEER: u64 = 16 * 4096 * 3;

#[test]
fn all_to_all_over_shm_and_tcp() {
    for prov in ["shm", "tcp"] {
        let mut a = vec!["--provider", prov, "--pattern", "all-to-all", "--json"];
        a.extend_from_slice(SMALL_RUN);
        let v = check_job(job(4, &a), "all-to-all");
        assert!(v["provider"].as_str().unwrap().contains(prov), "{v}");
        let run = &v["runs"][0];
        let ranks = run["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 4);
        for (i, r) in ranks.iter().enumerate() {
            assert_eq!(r["rank"], i as u64);
            assert_eq!(r["tx_bytes"], 3 * PER_PEER, "{prov}: {r}");
            assert_eq!(r["rx_bytes"], 3 * PER_PEER, "{prov}: {r}");
            assert!(r["tx_gbps"].as_f64().unwrap() > 0.0);
        }
        assert_eq!(run["nics"].as_array().unwrap().len(), 4);
        assert_eq!(run["bytes"], 12 * PER_PEER);
        let t = &run["tx_gbps"];
        assert!(t["min"].as_f64().unwrap() <= t["median"].as_f64().unwrap());
        assert!(t["median"].as_f64().unwrap() <= t["max"].as_f64().unwrap());
        assert!(run["slowest_rank"]["rank"].as_u64().unwrap() < 4);
        assert!(!run["slowest_nic"]["name"].is_null());
    }
}

/// `run --backend ucx`: 4 ranks all-to-all over UCX's shared memory and over its tcp on lo,
/// every byte verified, each rank's bytes exact.
#[cfg(feature = "ucx")]
#[test]
fn all_to_all_over_ucx_sm_and_tcp() {
    for prov in [
        &["--provider", "sm"][..],
        &["--provider", "tcp", "--devices", "lo"],
    ] {
        let mut a = vec!["--backend", "ucx", "--pattern", "all-to-all", "--json"];
        a.extend_from_slice(prov);
        a.extend_from_slice(SMALL_RUN);
        let v = check_job(job(4, &a), "all-to-all");
        assert_eq!(v["backend"], "ucx", "{v}");
        assert!(v["provider"].as_str().unwrap().contains(prov[1]), "{v}");
        let run = &v["runs"][0];
        let ranks = run["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 4);
        for r in ranks {
            assert_eq!(r["tx_bytes"], 3 * PER_PEER, "{prov:?}: {r}");
            assert_eq!(r["rx_bytes"], 3 * PER_PEER, "{prov:?}: {r}");
        }
        assert_eq!(run["bytes"], 12 * PER_PEER);
        // The record says what `write=auto` decided for the peers, read after they were added
        // (before, ranks sent theirs before connecting, and it said "auto"), and every rank
        // decided the same.
        let rec = &v["record"];
        let write = rec["backend"]["settings"]["write"].as_str().unwrap_or("");
        if prov[1] == "tcp" {
            assert_eq!(write, "am", "UCX emulates puts over tcp: {rec:#}");
        }
        assert!(!write.is_empty() && !write.starts_with("auto"), "{rec:#}");
        assert!(rec["ranks"].is_null(), "the ranks' facts differ: {rec:#}");
    }
}

#[test]
fn pairwise_incast_bisection() {
    for (pattern, tx, rx) in [
        ("pairwise", [1, 1, 1, 1], [1, 1, 1, 1]),
        ("incast", [0, 1, 1, 1], [3, 0, 0, 0]),
        ("bisection", [1, 1, 1, 1], [1, 1, 1, 1]),
    ] {
        let mut a = vec!["--provider", "shm", "--pattern", pattern, "--json"];
        a.extend_from_slice(SMALL_RUN);
        let v = check_job(job(4, &a), pattern);
        let ranks = v["runs"][0]["ranks"].as_array().unwrap().clone();
        for (i, r) in ranks.iter().enumerate() {
            assert_eq!(r["tx_bytes"], tx[i] * PER_PEER, "{pattern}: {r}");
            assert_eq!(r["rx_bytes"], rx[i] * PER_PEER, "{pattern}: {r}");
        }
    }
    // The table, with two NIC groups and a thread each, over two sizes.
    let a = [
        "--provider",
        "shm",
        "--pattern",
        "pairwise",
        "--gpus",
        "0,1",
        "--threads",
        "per-gpu",
        "--sizes",
        "4K,16K",
        "--pages",
        "8",
        "-n",
        "2",
    ];
    let outs = job(4, &a);
    let t = outs.into_iter().next().unwrap().expect_ok().stdout;
    for want in [
        "pairwise write over libfabric/shm: 4 ranks",
        "2 GPU(s) x 1 NIC(s) per rank",
        "every byte verified",
        "size 4K",
        "size 16K",
        "tx Gbit/s across ranks: min",
        "slowest rank:",
        "slowest NIC: rank",
    ] {
        assert!(t.contains(want), "{want:?} missing:\n{t}");
    }
}

#[test]
fn a_killed_rank_stops_every_other_rank_naming_it() {
    kill_rank_2(&["--provider", "shm"]);
}

/// The same over UCX's tcp, three times: UCX emulates puts over tcp and acknowledges each
/// with a send that aborts the target's process (`ucs_fatal` under `ucp_put_handler`) when
/// the initiator died with puts in flight; with WRITEs as UCX's puts (`--nic-opt
/// write=put`) a survivor aborted in most jobs of this kind. By default (`write=auto`) WRITEs
/// over tcp are ours' active messages, which the target acknowledges with nothing.
#[cfg(feature = "ucx")]
#[test]
fn a_killed_rank_over_ucx_tcp_is_an_error_not_an_abort() {
    for _ in 0..3 {
        kill_rank_2(&["--backend", "ucx", "--provider", "tcp", "--devices", "lo"]);
    }
}

/// The same over UCX's default transports (`all`, no --provider; on lo), three times: with
/// peer error handling UCX reaches the other ranks of this node over tcp alone, with no RMA
/// lane, so it would emulate puts there too. `write=auto` reads that from each peer's lanes; before
/// it did (auto was am only where every transport named was tcp), survivors aborted inside
/// UCX in five of six such jobs of the kill soak (`--ucx all`).
#[cfg(feature = "ucx")]
#[test]
fn a_killed_rank_over_ucx_defaults_is_an_error_not_an_abort() {
    for _ in 0..3 {
        kill_rank_2(&["--backend", "ucx", "--devices", "lo"]);
    }
}

/// Four ranks WRITE all-to-all until rank 2 is killed once its run started: every other rank
/// exits non-zero naming rank 2, soon, and none of them aborted.
fn kill_rank_2(nic: &[&str]) {
    let port = free_port();
    let mut args = nic.to_vec();
    args.extend_from_slice(&[
        "-s",
        "4K",
        "--pages",
        "16",
        "-n",
        "100000000",
        "--idle-timeout",
        "3",
        "--rendezvous-timeout",
        "20",
    ]);
    let mut kids: Vec<Option<Child>> = (0..4)
        .map(|r| {
            let mut a = args.clone();
            if r == 2 {
                a.push("-v");
            }
            Some(spawn_rank(r, 4, port, &a))
        })
        .collect();
    // Kill rank 2 once its run has started (its -v line says so), not after a fixed time: on
    // a loaded box it may not even have joined after a few seconds, which is another case
    // (the rendezvous timeout names it).
    let mut victim = kids[2].take().unwrap();
    let err = victim.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("rank 2: run 0 started") {
                let _ = tx.send(());
            }
        }
    });
    let started = rx.recv_timeout(Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    reap(&mut victim);
    assert!(started.is_ok(), "rank 2 did not start its run within 60 s");
    let t = Instant::now();
    for (r, k) in kids.into_iter().enumerate() {
        let Some(k) = k else { continue };
        let o = wait(k, Duration::from_secs(30));
        assert!(!o.ok(), "rank {r} succeeded:\n{}", o.stdout);
        assert!(
            o.stderr.contains("rank 2"),
            "rank {r} does not name rank 2:\n{}",
            o.stderr
        );
        assert!(
            !o.stderr.contains("Fatal") && !o.stderr.contains("backtrace"),
            "rank {r} aborted:\n{}",
            o.stderr
        );
    }
    // No hang: the idle timeout (3 s), then a survivor stuck in the provider ends through its
    // watchdog's grace (3 s), and one that only sees that survivor go through its own grace
    // after it: 9 s at most on an idle box; the bound is ci/kill-soak.sh's for a loaded one.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

#[test]
fn mismatched_options_are_refused() {
    let port = free_port();
    let kids: Vec<Child> = (0..4)
        .map(|r| {
            let pages = if r == 2 { "32" } else { "16" };
            spawn_rank(
                r,
                4,
                port,
                &["--provider", "shm", "-s", "4K", "--pages", pages, "-n", "2"],
            )
        })
        .collect();
    for (r, k) in kids.into_iter().enumerate() {
        let o = wait(k, T);
        assert!(!o.ok(), "rank {r} succeeded");
        assert!(
            o.stderr.contains("pages: rank 0 has 16, it has 32"),
            "rank {r}:\n{}",
            o.stderr
        );
        if r != 2 {
            assert!(o.stderr.contains("rank 2"), "rank {r}:\n{}", o.stderr);
        }
    }
}

/// A rank speaking another protocol version is refused with a message that says so.
#[test]
fn mismatched_version_is_refused() {
    let port = free_port();
    let root = spawn_rank(
        0,
        2,
        port,
        &["--provider", "shm", "--rendezvous-timeout", "20"],
    );
    let start = Instant::now();
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("rank 0 does not listen: {e}"),
        }
    };
    let join = Join {
        magic: proto::MAGIC.into(),
        version: proto::VERSION + 1,
        rank: 1,
        world: 2,
        local_rank: 0,
        host: "elsewhere".into(),
        pid: 1,
        spec: RankSpec {
            build: "0.0.0".into(),
            backend: "libfabric".into(),
            provider: "shm".into(),
            pattern: Pattern::AllToAll,
            workload: Workload::Write,
            gpus: 1,
            nics_per_gpu: 1,
            mem: MemKind::Host,
            seed: 1,
            verify: true,
            runs: vec![RunSpec {
                stage: None,
                size: 4096,
                pages: 1,
                iters: 1,
                knobs: Knobs::baseline(),
            }],
        },
    };
    s.write_all(&proto::encode(&Msg::Join(join)).unwrap())
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("version mismatch"), "{text}");
    wait(root, T).expect_err("version mismatch");
}

#[test]
fn no_launcher_and_odd_pairs_are_usage_errors() {
    let mut c = Command::new(bin());
    c.args(["run", "--provider", "shm"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("OMPI_")
            || k.starts_with("SLURM_")
            || k.starts_with("PMI_")
            || ["RANK", "WORLD_SIZE", "MASTER_ADDR"].contains(&k.as_str())
        {
            c.env_remove(k);
        }
    }
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no launcher"));
    let port = free_port();
    let o = wait(
        spawn_rank(0, 3, port, &["--provider", "shm", "--pattern", "pairwise"]),
        T,
    );
    assert_eq!(o.code, Some(2));
    assert!(o.stderr.contains("even number"), "{}", o.stderr);
}
