//! `rdma-bench loopback --workload gpu-write` over libfabric shm and tcp: WRITEs through the
//! proxy ring beside host-initiated ones, every byte verified; client refuses it.
#![cfg(feature = "efa")]

mod common;
use std::time::Duration;

use common::*;

/// Two proxies, a producer and the host path's threads per run, three runs at once: on a
/// loaded 2-core box a run takes tens of seconds in a debug build.
const LONG: Duration = Duration::from_secs(300);

fn check(v: &serde_json::Value) {
    check_producer(v, "cpu");
}

fn check_producer(v: &serde_json::Value, producer: &str) {
    assert_eq!(v["producer"], producer, "{v}");
    assert_eq!(v["verified"], true, "{v}");
    assert!(v["ring_mcmds"].as_f64().unwrap() > 0.0, "{v}");
    let lat = v["lat_us"].as_array().unwrap();
    let bw = v["bw_gbps"].as_array().unwrap();
    assert_eq!(lat.len(), 2, "{v}"); // 8 B and 4 KiB; 1 MiB is over latency's 64 KiB
    assert_eq!(bw.len(), 3, "{v}");
    for r in lat.iter().chain(bw) {
        assert!(r["proxy"].as_f64().unwrap() > 0.0, "{v}");
        assert!(r["host"].as_f64().unwrap() > 0.0, "{v}");
    }
}

const ARGS: &[&str] = &[
    "loopback",
    "--workload",
    "gpu-write",
    "--sizes",
    "8,4K,1M",
    "-n",
    "5",
    "--json",
];

#[test]
fn gpu_write_over_shm_verified() {
    check(&run(ARGS, LONG).expect_ok().json());
}

#[test]
fn gpu_write_over_tcp_verified() {
    let mut a = ARGS.to_vec();
    a.extend_from_slice(&["--provider", "tcp"]);
    check(&run(&a, LONG).expect_ok().json());
}

#[test]
fn gpu_write_prints_both_columns() {
    let o = run(&ARGS[..ARGS.len() - 1], LONG).expect_ok();
    for want in ["ring alone", "proxy", "host", "every byte verified"] {
        assert!(o.stdout.contains(want), "{want}: {}", o.stdout);
    }
}

#[test]
fn client_refuses_gpu_write() {
    let o = run(
        &[
            "client",
            "--connect",
            "127.0.0.1:1",
            "--workload",
            "gpu-write",
        ],
        T,
    );
    let _ = o.expect_err("runs in `rdma-bench loopback` only");
}

/// `--producer cuda`: GPU threads fill the ring (host memory, every byte verified) where CUDA
/// is; elsewhere a usage error (exit 2) that names what is missing, and under
/// `REQUIRE_CUDA_PROVIDER` that is a failure. `--producer` on another workload is refused.
#[test]
fn gpu_write_with_the_cuda_producer_runs_or_says_why_not() {
    let mut a = ARGS.to_vec();
    a.extend_from_slice(&["--producer", "cuda"]);
    let o = run(&a, LONG);
    if o.ok() {
        check_producer(&o.json(), "cuda");
    } else {
        assert!(
            std::env::var_os("REQUIRE_CUDA_PROVIDER").is_none(),
            "REQUIRE_CUDA_PROVIDER is set: --producer cuda failed: {}",
            o.stderr
        );
        assert_eq!(o.code, Some(2), "a usage error: {}", o.stderr);
        assert!(o.stderr.contains("CUDA producer"), "{}", o.stderr);
        eprintln!("SKIPPED: --producer cuda: {}", o.stderr.trim());
    }
    let o = run(
        &["loopback", "--workload", "write", "--producer", "cuda"],
        T,
    );
    let _ = o.expect_err("--producer is gpu-write's");
}
