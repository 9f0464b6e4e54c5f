//! `rdma-bench loopback --workload gpu-write` over libfabric shm and tcp: WRITEs through the
//! proxy ring beside host-initiated ones, every byte verified; client refuses it.
#![cfg(feature = "efa")]

mod common;
use common::*;

fn check(v: &serde_json::Value) {
    assert_eq!(v["producer"], "cpu", "{v}");
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
    "20",
    "--json",
];

#[test]
fn gpu_write_over_shm_verified() {
    check(&run(ARGS, T).expect_ok().json());
}

#[test]
fn gpu_write_over_tcp_verified() {
    let mut a = ARGS.to_vec();
    a.extend_from_slice(&["--provider", "tcp"]);
    check(&run(&a, T).expect_ok().json());
}

#[test]
fn gpu_write_prints_both_columns() {
    let o = run(&ARGS[..ARGS.len() - 1], T).expect_ok();
    for want in ["ring alone", "proxy", "host", "verified yes"] {
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
