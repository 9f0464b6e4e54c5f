//! `rdma-bench loopback --workload gpu-write`, and `server` + `client --workload gpu-write` in
//! two processes, over libfabric shm and tcp (and UCX sm and tcp with the `ucx` feature):
//! WRITEs through the proxy rings beside host-initiated ones, every byte verified by the
//! server; bad input and a dead server end in a clear error.
#![cfg(feature = "efa")]

mod common;
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    // The same rounds' median beside the mean, for both paths.
    let p50 = v["lat_p50_us"].as_array().unwrap();
    assert_eq!(p50.len(), lat.len(), "{v}");
    for r in lat.iter().chain(p50).chain(bw) {
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

/// With `--rounds 2` each row carries both rounds' pairs, and each path's figure is their
/// median (the mean of two).
#[test]
fn gpu_write_over_shm_verified() {
    let mut a = ARGS.to_vec();
    a.extend_from_slice(&["--rounds", "2"]);
    let v = run(&a, LONG).expect_ok().json();
    check(&v);
    assert_eq!(v["rounds"], 2, "{v}");
    for t in ["lat_us", "lat_p50_us", "bw_gbps"] {
        for r in v[t].as_array().unwrap() {
            let pairs = r["rounds"].as_array().unwrap();
            assert_eq!(pairs.len(), 2, "{t}: {r}");
            let f = |i: usize, j: usize| pairs[i][j].as_f64().unwrap();
            for (j, path) in ["proxy", "host"].into_iter().enumerate() {
                let m = (f(0, j) + f(1, j)) / 2.0;
                assert!(
                    (r[path].as_f64().unwrap() - m).abs() <= 1e-9 * m,
                    "{t}: {r}"
                );
            }
        }
    }
}

#[test]
fn gpu_write_over_tcp_verified() {
    let mut a = ARGS.to_vec();
    a.extend_from_slice(TCP);
    check(&run(&a, LONG).expect_ok().json());
}

/// The client's proxy posts at most `--batch` WRITEs a call, as the host path does: with
/// `--batch 1` every call that was not refused for a full queue posted one WRITE.
#[test]
fn gpu_write_proxy_posts_batch_writes_a_call() {
    let mut a = ARGS[..ARGS.len() - 1].to_vec();
    a.extend_from_slice(&["--batch", "1", "-v"]);
    let o = run(&a, LONG).expect_ok();
    let mut lines = 0;
    for l in o
        .stderr
        .lines()
        .filter(|l| l.contains("the client's proxy posted"))
    {
        let nums: Vec<u64> = l
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        // size, WRITEs, calls, batch, full
        let [_, writes, calls, batch, full] = nums[..] else {
            panic!("{l}")
        };
        assert_eq!(batch, 1, "{l}");
        assert_eq!(calls - full, writes, "{l}");
        lines += 1;
    }
    assert_eq!(lines, 5, "2 latency and 3 bandwidth steps:\n{}", o.stderr);
}

#[test]
fn gpu_write_prints_both_columns() {
    let o = run(&ARGS[..ARGS.len() - 1], LONG).expect_ok();
    for want in ["ring alone", "proxy", "host", "every byte verified"] {
        assert!(o.stdout.contains(want), "{want}: {}", o.stdout);
    }
}

/// libfabric's shm and tcp providers, as both sides name them.
const SHM: &[&str] = &["--provider", "shm"];
const TCP: &[&str] = &["--provider", "tcp"];

/// The client's arguments against `srv` on `backend` (its flags, as the server's): the same
/// figures as loopback's.
fn client_args<'a>(srv: &'a Server, backend: &[&'a str]) -> Vec<&'a str> {
    let mut a = client_base(srv, backend);
    a.extend_from_slice(&ARGS[3..]);
    a
}

/// `client --connect SRV BACKEND... --workload gpu-write`, nothing more.
fn client_base<'a>(srv: &'a Server, backend: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["client", "--connect", srv.addr.as_str()];
    a.extend_from_slice(backend);
    a.extend_from_slice(&["--workload", "gpu-write"]);
    a
}

fn two_processes(backend: &[&str]) {
    let which = backend.join(" ");
    let mut srv = Server::start(backend);
    let v = run(&client_args(&srv, backend), LONG).expect_ok().json();
    check(&v);
    assert_eq!(v["server_echo"], "host", "{v}");
    // The server compared what landed: every WRITE of every step, latency and bandwidth.
    assert!(
        v["server_checked"].as_u64().unwrap() >= (1 << 20) * 5,
        "{v}"
    );
    assert!(srv.alive(), "{which}: the server exited:\n{}", srv.log());
    // The table, for people: both columns, what the figures include, verified.
    let mut a = client_args(&srv, backend);
    a.pop();
    let o = run(&a, LONG).expect_ok();
    for want in [
        "ring alone",
        "half the round trip",
        "median round trip halved",
        "includes one return WRITE",
        "proxy threads: client unpinned (--pin not given)",
        "every byte verified (the server checked",
    ] {
        assert!(o.stdout.contains(want), "{which}: {want}: {}", o.stdout);
    }
    assert!(srv.alive(), "{which}: the server exited:\n{}", srv.log());
}

#[test]
fn gpu_write_server_and_client_over_shm_verified() {
    two_processes(SHM);
}

/// `--server-echo ring`: the server answers the proxy steps through its own ring and proxy
/// (the client checks that it did), every byte verified.
#[test]
fn gpu_write_server_echo_through_its_ring_verified() {
    let srv = Server::start(SHM);
    let mut a = client_args(&srv, SHM);
    a.extend_from_slice(&["--server-echo", "ring"]);
    let v = run(&a, LONG).expect_ok().json();
    check(&v);
    assert_eq!(v["server_echo"], "ring", "{v}");
    assert!(
        v["server_checked"].as_u64().unwrap() >= (1 << 20) * 5,
        "{v}"
    );
    a.pop();
    a.pop();
    a.pop(); // --json
    a.extend_from_slice(&["--server-echo", "ring"]);
    let o = run(&a, LONG).expect_ok();
    assert!(
        o.stdout
            .contains("the server answers the proxy path through its ring and proxy"),
        "{}",
        o.stdout
    );
}

#[test]
fn gpu_write_server_and_client_over_tcp_verified() {
    two_processes(TCP);
}

/// --pin: near GPU 0 where the topology places cores (a fixture of 2 GPUs); on this machine's
/// own topology, without GPUs, unpinned, and the output says why.
#[test]
fn gpu_write_pins_where_the_topology_says() {
    let two = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../topo/tests/fixtures/gpu-no-nic.xml"
    );
    let srv = Server::start(SHM);
    let mut a = client_base(&srv, SHM);
    a.extend_from_slice(&["--sizes", "8", "-n", "2", "--pin"]);
    let o = run(&a, LONG).expect_ok();
    if !o.stdout.contains("pinned to core") {
        assert!(
            o.stdout
                .contains("client unpinned (no topology says which cores are near GPU 0)"),
            "{}",
            o.stdout
        );
    }
    a.extend_from_slice(&["--topology", two]);
    let o = run(&a, LONG).expect_ok();
    assert!(
        o.stdout.contains("proxy threads: client pinned to core"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("(near GPU 0)"), "{}", o.stdout);
}

/// Flags gpu-write refuses, a producer it does not know, `run`, and a server that is not
/// there: a clear error, a non-zero exit, no hang.
#[test]
fn gpu_write_bad_input_and_a_dead_server_fail_clearly() {
    let srv = Server::start(SHM);
    let mut a = client_args(&srv, SHM);
    a.extend_from_slice(&["--pages", "4"]);
    let o = run(&a, T).expect_err("gpu-write takes --size/--sizes");
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    let mut a = client_args(&srv, SHM);
    a.extend_from_slice(&["--window", "8"]);
    let o = run(&a, T).expect_err("--pages or --window");
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    let mut a = client_args(&srv, SHM);
    a.extend_from_slice(&["--producer", "opencl"]);
    assert!(!run(&a, T).ok());
    let o = run(
        &[
            "client",
            "--connect",
            "127.0.0.1:1",
            "--connect-timeout",
            "1",
            "--workload",
            "gpu-write",
        ],
        T,
    );
    let o = o.expect_err("is `rdma-bench server` running there?");
    assert_ne!(o.code, Some(0));
    let o = run(
        &[
            "run",
            "--workload",
            "gpu-write",
            "--rendezvous",
            "127.0.0.1:1",
        ],
        T,
    );
    assert!(!o.ok(), "{}", o.stdout);
}

/// A server killed in the middle of a run: the client says the peer is gone and exits
/// non-zero, well before its idle timeout (30 s).
#[test]
fn gpu_write_client_survives_a_killed_server() {
    let mut srv = Server::start(SHM);
    let mut a = client_base(&srv, SHM);
    a.extend_from_slice(&["--sizes", "8,64K", "-n", "100000"]);
    let child = spawn(&a);
    assert!(
        srv.wait_log("started", Duration::from_secs(60)),
        "{}",
        srv.log()
    );
    std::thread::sleep(Duration::from_millis(1500));
    srv.kill();
    let o = wait(child, Duration::from_secs(60));
    assert!(!o.ok(), "{}", o.stdout);
    // "the server is gone", or the watchdog's "the peer is gone ... exiting" where libfabric
    // 1.x shm spins on a queue lock the dead server held.
    assert!(o.stderr.contains(" is gone"), "{}", o.stderr);
    assert!(o.elapsed < Duration::from_secs(30), "{:?}", o.elapsed);
}

/// The server stops (SIGSTOP: its connection stays open, nothing reads it) `kind`'s step in:
/// the client gives up within its idle timeout and says what it waited for, instead of
/// waiting for ever. 128 KiB WRITEs, 20000 a step: more than the send queue holds.
fn client_gives_up_on_a_server_stopped_in(kind: &str, why: &str) {
    let mut srv = Server::start(TCP);
    let mut a = client_base(&srv, TCP);
    a.extend_from_slice(&[
        "--sizes",
        "128K",
        "-n",
        "10000",
        "--idle-timeout",
        "2",
        "-v",
    ]);
    let mut child = spawn(&a);
    let stderr = child.stderr.take().expect("stderr");
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let (log2, want) = (log.clone(), format!("{kind}, "));
    let reader = std::thread::spawn(move || {
        // The step's "started" line, then the first "ready" after it: the server answered
        // Ready, so stopping it now stops it inside the step, not before.
        let mut started = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(&want) && line.ends_with("started") {
                started = true;
            } else if started && line.ends_with(": the server is ready") {
                started = false;
                // `rdma-bench: gpu-write step N: the server is ready`: the step's own prefix.
                let step = line.trim_end_matches("the server is ready").to_string();
                let _ = tx.send(step);
            }
            let mut l = log2.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let text = || log.lock().unwrap().clone();
    let Ok(step) = rx.recv_timeout(Duration::from_secs(120)) else {
        reap(&mut child);
        panic!("no {kind} step started:\n{}", text());
    };
    // At once: the server sent Ready from inside the step. A fixed wait here let a fast host
    // finish the step's 2.6 GB first (1 s of it on this 2-core box).
    srv.signal("STOP");
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().expect("waiting") {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            reap(&mut child);
            srv.signal("CONT");
            panic!(
                "the client still ran 60 s after the server stopped:\n{}",
                text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    srv.signal("CONT");
    srv.kill();
    // The reader ends at the client's end of stderr: then the log holds its last line.
    let _ = reader.join();
    let log = text();
    assert!(!st.success(), "{log}");
    // The step did not end before the server stopped (its time line: `...step N: 0.950 s`).
    assert!(
        !log.lines()
            .any(|l| l.starts_with(&step) && l.ends_with(" s")),
        "the step ended before the server stopped:\n{log}"
    );
    assert!(log.contains(why), "expected {why:?}:\n{log}");
    eprintln!(
        "{kind}: gave up {:.1} s after the server stopped",
        t.elapsed().as_secs_f64()
    );
}

/// The host path: a send queue the stopped server keeps full is no progress (each refused
/// post restarted the idle clock).
#[test]
fn gpu_write_host_path_gives_up_on_a_stopped_server() {
    client_gives_up_on_a_server_stopped_in(
        "HostBw",
        "timed out after 2s waiting for the server's answer to host-initiated WRITEs",
    );
}

/// The proxy path: the producer waits for room in a ring the proxy cannot drain; the
/// watcher sees no progress and sets the error word, and the stopped proxy returns (a full
/// queue with commands waiting kept it busy for ever).
#[test]
fn gpu_write_proxy_path_gives_up_on_a_stopped_server() {
    client_gives_up_on_a_server_stopped_in("ProxyBw", "moved none for the idle timeout");
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
    let _ = o.expect_err("are gpu-write's");
    let o = run(
        &[
            "loopback",
            "--workload",
            "write",
            "--kernel-poll-sleep",
            "100",
        ],
        T,
    );
    let _ = o.expect_err("are gpu-write's");
    let o = run(
        &[
            "loopback",
            "--workload",
            "gpu-write",
            "--kernel-poll-sleep",
            "100",
        ],
        T,
    );
    let _ = o.expect_err("only the cuda producer's kernel polls");
    let o = run(
        &[
            "loopback",
            "--workload",
            "gpu-write",
            "--kernel-poll-margin",
            "2000",
        ],
        T,
    );
    let _ = o.expect_err("only the cuda producer's kernel polls");
    let o = run(
        &[
            "loopback",
            "--workload",
            "write",
            "--kernel-publish",
            "fence",
        ],
        T,
    );
    let _ = o.expect_err("are gpu-write's");
}

/// gpu-write on the UCX backend (the third backend the proxy is generic over): loopback over
/// shared memory and tcp, and two processes over shared memory, every byte verified by the
/// server. UCX's immediate follows an endpoint flush of the peer's earlier puts, so the
/// proxy's arrivals count delivered WRITEs there as on the other backends.
#[cfg(feature = "ucx")]
mod ucx {
    use super::*;

    fn ucx_loopback(tls: &str, extra: &[&str]) {
        let mut a = ARGS.to_vec();
        a.extend_from_slice(&["--backend", "ucx", "--provider", tls]);
        a.extend_from_slice(extra);
        check(&run(&a, LONG).expect_ok().json());
    }

    #[test]
    fn gpu_write_over_ucx_sm_verified() {
        ucx_loopback("sm", &[]);
    }

    #[test]
    fn gpu_write_over_ucx_tcp_verified() {
        ucx_loopback("tcp", &["--devices", "lo"]);
    }

    #[test]
    fn gpu_write_server_and_client_over_ucx_sm_verified() {
        two_processes(&["--backend", "ucx", "--provider", "sm"]);
    }
}
