//! `rdma-bench server` and `client` in separate processes on 127.0.0.1 (libfabric shm).
#![cfg(feature = "efa")]

mod common;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

fn client_args<'a>(srv: &'a Server, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "client",
        "--connect",
        srv.addr.as_str(),
        "--provider",
        "shm",
    ];
    v.extend_from_slice(extra);
    v
}

fn quick_client(srv: &Server) -> Out {
    let mut a = client_args(srv, SMALL);
    a.extend_from_slice(&["--verify", "--json"]);
    run(&a, T)
}

/// The README's two-node recipe as typed, with shm or tcp for the NIC: a server given no
/// layout serves the client's (here 2 GPUs x 2 NICs of host memory, where it would start with
/// 1 x 1), and a client verifies every byte without being asked to (issue 30 items 1, 2).
#[test]
fn the_server_takes_the_clients_layout_and_the_client_verifies() {
    for prov in ["shm", "tcp"] {
        let mut srv = Server::start(&["--provider", prov]);
        let layout = ["--gpus", "0-1", "--nics-per-gpu", "2"];
        let mut a = client_args(&srv, SMALL);
        a[4] = prov;
        a.extend_from_slice(&layout);
        let mut j = a.clone();
        j.push("--json");
        let v = run(&j, T).expect_ok().json();
        assert_eq!(v["verified"], true, "{prov}: {v:#}");
        assert_eq!(v["nics"], 4, "{prov}: {v:#}");
        assert_eq!(v["gpus"], serde_json::json!([0, 1]), "{prov}: {v:#}");
        assert_eq!(v["per_nic"].as_array().unwrap().len(), 4, "{prov}: {v:#}");
        assert_eq!(v["backend"], "libfabric", "{prov}: {v:#}");
        // tcp runs under ofi_rxm (`tcp;ofi_rxm`).
        assert!(
            v["provider"].as_str().unwrap().starts_with(prov),
            "{prov}: {v:#}"
        );
        // The table says so in words; and over shm or tcp nothing says efa.
        let t = run(&a, T).expect_ok().stdout;
        for want in [
            "every byte verified",
            "2 GPU(s) x 2 NIC(s)",
            &format!("over libfabric/{prov}"),
        ] {
            assert!(t.contains(want), "{prov}: {want:?} missing:\n{t}");
        }
        assert!(!t.contains("efa"), "{prov}:\n{t}");
        // send checks its messages too, on the same layout.
        let mut s = a.clone();
        s.extend_from_slice(&["--workload", "send", "--json"]);
        assert_eq!(run(&s, T).expect_ok().json()["verified"], true, "{prov}");
        // --no-verify is a pure speed run, and says so.
        let mut n = j.clone();
        n.push("--no-verify");
        assert_eq!(run(&n, T).expect_ok().json()["verified"], false, "{prov}");
        let mut n = a.clone();
        n.push("--no-verify");
        let t = run(&n, T).expect_ok().stdout;
        assert!(!t.contains("every byte verified"), "{prov}:\n{t}");
        assert!(
            t.lines()
                .any(|l| l.trim_start().starts_with("4K") && l.trim_end().ends_with(" no")),
            "{prov}: the verified column says no:\n{t}"
        );
        assert!(srv.alive(), "{prov}: server exited:\n{}", srv.log());
    }
}

/// What the server cannot give is refused with what was asked and what it has: more GPUs
/// than its node has, more than its --gpus list, other NICs per GPU than its --nics-per-gpu;
/// and it keeps serving.
#[test]
fn the_server_refuses_a_layout_it_cannot_give() {
    // A node of 2 GPUs (the fixture's topology) and a client that asks for 4.
    let two = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topo/tests/fixtures/gpu-no-nic.xml"
    );
    let mut srv = Server::start(&["--provider", "shm", "--topology", two]);
    let small = ["-n", "1", "--pages", "4", "-s", "4K"];
    let mut a = client_args(&srv, &small);
    a.extend_from_slice(&["--gpus", "0-3"]);
    let o = run(&a, T).expect_err("the client asks for 4 GPU(s)");
    assert!(
        o.stderr
            .contains("this node has 2 (this machine has 2 GPU(s))"),
        "{}",
        o.stderr
    );
    // 2 it has.
    let mut a = client_args(&srv, &small);
    a.extend_from_slice(&["--gpus", "0-1", "--json"]);
    assert_eq!(run(&a, T).expect_ok().json()["nics"], 2);
    assert!(srv.alive(), "{}", srv.log());
    // The operator's flags hold: 1 GPU of its list, 1 NIC per GPU.
    let mut srv = Server::start(&["--provider", "shm", "--gpus", "3", "--nics-per-gpu", "1"]);
    let mut a = client_args(&srv, &small);
    a.extend_from_slice(&["--gpus", "0-1"]);
    let o = run(&a, T).expect_err("this server serves 1 GPU(s) (--gpus 3)");
    assert!(o.stderr.contains("asks for 2 GPU(s)"), "{}", o.stderr);
    let mut a = client_args(&srv, &small);
    a.extend_from_slice(&["--nics-per-gpu", "2"]);
    run(&a, T).expect_err("started with --nics-per-gpu 1");
    assert!(
        srv.wait_log("x 2 NIC(s)", Duration::from_secs(5)),
        "{}",
        srv.log()
    );
    quick_client(&srv).expect_ok();
    assert!(srv.alive(), "{}", srv.log());
}

#[test]
fn clients_come_and_go() {
    let mut srv = Server::start(&["--provider", "shm"]);
    // A first client, then a second.
    for _ in 0..2 {
        let v = quick_client(&srv).expect_ok().json();
        assert_eq!(v["verified"], true);
        assert!(v["gbps"].as_f64().unwrap() > 0.0);
    }
    // Two at once.
    let a = spawn(&client_args(
        &srv,
        &["-n", "20", "--pages", "16", "-s", "4K", "--verify"],
    ));
    let b = spawn(&client_args(
        &srv,
        &["-n", "20", "--pages", "16", "-s", "4K", "--verify"],
    ));
    let (a, b) = (wait(a, T), wait(b, T));
    a.expect_ok();
    b.expect_ok();
    // Other workloads on the same server.
    run(&client_args(&srv, &["--workload", "lat", "-n", "100"]), T).expect_ok();
    run(
        &client_args(
            &srv,
            &["--workload", "send", "-n", "100", "-s", "4K", "--verify"],
        ),
        T,
    )
    .expect_ok();
    assert!(srv.alive(), "server exited:\n{}", srv.log());
}

/// The ping-pong sends from buffers it wrote and each side checks that the peer's last
/// message landed whole: SEND and WRITE with immediate, eager and larger sizes.
#[test]
fn lat_sends_written_buffers_and_checks_the_last_message() {
    let mut srv = Server::start(&["--provider", "shm"]);
    for op in ["send", "write-imm"] {
        for size in ["8", "64K", "1M"] {
            let lat = ["--workload", "lat", "--op", op, "-s", size, "-n", "20"];
            let mut args = client_args(&srv, &lat);
            args.push("--json");
            let v = run(&args, T).expect_ok().json();
            assert_eq!(v["ops"], 20, "{op} {size}: {v}");
        }
    }
    assert!(srv.alive(), "server exited:\n{}", srv.log());
}

#[test]
fn killed_client_leaves_server_and_others_serving() {
    let mut srv = Server::start(&["--provider", "shm"]);
    let mut doomed = spawn(&client_args(
        &srv,
        &["-n", "100000000", "--pages", "16", "-s", "4K"],
    ));
    assert!(
        srv.wait_log("session 0 from", Duration::from_secs(20)),
        "{}",
        srv.log()
    );
    // Another client runs through the crash: 3.3 GB, killed as soon as its session started
    // (a fixed wait of 500 ms let its 26 MB finish first, testing nothing extra).
    let mut other = spawn(&client_args(
        &srv,
        &["-n", "50000", "--pages", "16", "-s", "4K", "--verify"],
    ));
    assert!(
        srv.wait_log("session 1 from", Duration::from_secs(20)),
        "{}",
        srv.log()
    );
    reap(&mut doomed);
    assert!(
        other.try_wait().expect("waiting").is_none(),
        "the other client ended before the kill:\n{}",
        srv.log()
    );
    // The server notices (within its watchdog's grace where a worker is stuck in the
    // provider, with room for a loaded box) and keeps serving.
    assert!(
        srv.wait_log("gone", Duration::from_secs(20)),
        "the server did not report the lost client:\n{}",
        srv.log()
    );
    wait(other, T).expect_ok();
    quick_client(&srv).expect_ok();
    assert!(srv.alive());
}

#[test]
fn killed_server_is_reported_by_the_client() {
    let mut srv = Server::start(&["--provider", "shm"]);
    let long = spawn(&client_args(
        &srv,
        &["-n", "100000000", "--pages", "16", "-s", "4K"],
    ));
    assert!(
        srv.wait_log("started", Duration::from_secs(20)),
        "{}",
        srv.log()
    );
    std::thread::sleep(Duration::from_millis(700));
    let t = Instant::now();
    let client_pid = long.id();
    srv.kill();
    let o = wait(long, Duration::from_secs(30));
    assert!(!o.ok());
    // No hang: an error, or the watchdog's exit after its 2 s grace; the bound leaves room
    // for a loaded box.
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        o.stderr.contains("gone") || o.stderr.contains("closed"),
        "{}",
        o.stderr
    );
    // However it ended (an error, or the watchdog's exit with its worker stuck inside the
    // provider), the client leaves no shm region behind in /dev/shm.
    let left = transport_efa::shm_regions_of(client_pid);
    assert!(left.is_empty(), "the client left {left:?}\n{}", o.stderr);
}

#[test]
fn server_unreachable() {
    // Find a port nobody listens on.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let o = run(
        &[
            "client",
            "--connect",
            &addr,
            "--provider",
            "shm",
            "--connect-timeout",
            "1",
        ],
        T,
    )
    .expect_err("timed out");
    assert!(o.stderr.contains(&addr), "{}", o.stderr);
    assert!(o.elapsed < Duration::from_secs(10));
}

#[test]
fn mismatches_are_refused_on_both_sides() {
    let mut srv = Server::start(&["--provider", "shm", "--max-mem", "1M"]);
    // Provider.
    let a = [
        "client",
        "--connect",
        srv.addr.as_str(),
        "--provider",
        "tcp",
        "-n",
        "1",
        "--pages",
        "4",
        "-s",
        "4K",
    ];
    run(&a, T).expect_err("provider mismatch");
    // Memory over the server's limit (16 MiB asked, 1 MiB allowed).
    run(&client_args(&srv, &[]), T).expect_err("max-mem");
    assert!(
        srv.wait_log("provider mismatch", Duration::from_secs(5)),
        "{}",
        srv.log()
    );
    // Garbage on the control port: the server drops it and keeps serving.
    for junk in [
        &b"GET / HTTP/1.0\r\n\r\n"[..],
        &[0xff; 64][..],
        &[0, 0, 0, 5, b'{', b'x'][..],
    ] {
        let mut s = TcpStream::connect(&srv.addr).unwrap();
        let _ = s.write_all(junk);
        drop(s);
    }
    quick_client(&srv).expect_ok();
    assert!(srv.alive());
}

/// A server that serves a set number of sessions (`--sessions N`, as scripts run it) exits
/// 0 when they all succeeded, and non-zero, saying how many failed, when one did.
#[test]
fn a_server_with_sessions_exits_non_zero_when_one_failed() {
    let mut srv = Server::start(&["--provider", "shm", "--sessions", "1"]);
    quick_client(&srv).expect_ok();
    assert_eq!(srv.exit_code(T), Some(0), "{}", srv.log());
    let mut srv = Server::start(&["--provider", "shm", "--sessions", "2"]);
    quick_client(&srv).expect_ok();
    let mut a = client_args(&srv, SMALL);
    a[4] = "tcp";
    run(&a, T).expect_err("provider mismatch");
    assert_eq!(srv.exit_code(T), Some(1), "{}", srv.log());
    assert!(
        srv.log().contains("served 2 session(s); 1 of them failed"),
        "{}",
        srv.log()
    );
}

/// `--sessions 0` and `--max-sessions 0` would serve one session and then exit, or refuse
/// every client as busy: both are usage errors.
#[test]
fn zero_sessions_are_usage_errors() {
    for flag in ["--sessions", "--max-sessions"] {
        let o = run(&["server", "--listen", "127.0.0.1:0", flag, "0"], T);
        assert_eq!(o.code, Some(2), "{flag} 0: {}", o.stderr);
        assert!(o.stderr.contains(flag), "{}", o.stderr);
    }
}
