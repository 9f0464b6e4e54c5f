//! A peer process killed in the middle of a transfer: the survivor sees an error or a
//! timeout within a bounded time, never a hang and never a false success.
//!
//! The test binary runs itself as the peer (`child_role`, selected by an environment
//! variable); the two exchange addresses and regions over the child's stdin/stdout. The child
//! answers every WRITE with immediate by a WRITE with the same immediate, so the parent can
//! tell a transfer that really arrived from one that did not.
//!
//! On `shm` the child is first told to stop calling libfabric (`PAUSE`), and is killed with
//! the survivor's WRITEs in flight to it. libfabric 1.x's shm guards its shared-memory queues
//! with process-shared spinlocks: a peer killed while it holds one leaves the survivor
//! spinning inside `fi_cq_read` forever, which no caller-side timeout can interrupt (seen
//! here: a survivor stuck in `pthread_spin_lock` under `fi_cq_read`). That is the provider's
//! limit, documented in the crate; `rdma-bench` guards against it with a watchdog. On `tcp` the
//! child is killed while it is busy polling.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use transport_core::wait::wait_for;
use transport_core::{
    CompletionKind, EndpointAddr, Error, HostBuffer, KeyBytes, LocalSlice, Memory, MemoryRegion,
    NicDesc, PeerId, Post, RemoteMr, RemoteRegion, Result, Transport,
};
use transport_efa::{Endpoint, Mr};

/// Set in the child: the provider to open.
const ROLE: &str = "TRANSPORT_EFA_PEER_KILLED_CHILD";
const CHUNK: usize = 4096;
const CHUNKS: usize = 16;

fn nic(provider: &str) -> NicDesc {
    let mut nic = NicDesc::provider(provider);
    if provider == "tcp" {
        nic.device = Some("lo".into());
    }
    nic
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `HELLO <addr hex> <mr addr> <mr len> <mr key hex>`
fn hello(ep: &Endpoint, mr: &Mr) -> String {
    let r = mr.remote();
    format!(
        "HELLO {} {} {} {}",
        hex(&ep.address().0),
        r.addr,
        r.len,
        hex(r.key.as_bytes())
    )
}

fn parse_hello(line: &str) -> Option<(EndpointAddr, RemoteMr)> {
    let mut it = line.strip_prefix("HELLO ")?.split_whitespace();
    let addr = EndpointAddr(unhex(it.next()?)?);
    let addr_ = it.next()?.parse().ok()?;
    let len = it.next()?.parse().ok()?;
    let key = KeyBytes::new(unhex(it.next()?)?).ok()?;
    Some((
        addr,
        RemoteMr {
            addr: addr_,
            len,
            key,
        },
    ))
}

/// Post a WRITE with immediate, polling while the queue is full (bounded).
fn write_imm(
    ep: &mut Endpoint,
    peer: PeerId,
    src: &Mr,
    remote: &RemoteRegion<u64>,
    i: usize,
    budget: Duration,
) -> Result<()> {
    let deadline = Instant::now() + budget;
    let off = (i % CHUNKS) * CHUNK;
    let dst = remote.slice(off as u64, CHUNK as u64)?;
    let mut sink: [transport_core::Completion; 16] = Default::default();
    loop {
        match ep.post_write(
            peer,
            LocalSlice::new(src, off, CHUNK)?,
            dst,
            Some(i as u32),
            i as u64,
        )? {
            Post::Posted => return Ok(()),
            Post::QueueFull => {
                if Instant::now() > deadline {
                    return Err(Error::Timeout {
                        what: "a free send slot".into(),
                        after: budget,
                    });
                }
                let n = ep.poll(&mut sink)?;
                for c in &sink[..n] {
                    c.check()?;
                }
            }
        }
    }
}

/// The child: serve echoes until killed (or for at most a minute).
#[test]
fn child_role() {
    let Ok(provider) = std::env::var(ROLE) else {
        return; // Not the child: nothing to do.
    };
    let mut ep = Endpoint::open(&nic(&provider)).expect("child: open");
    let src = ep
        .register(Memory::Host(HostBuffer::new(CHUNK * CHUNKS)))
        .expect("child: register");
    let dst = ep
        .register(Memory::Host(HostBuffer::new(CHUNK * CHUNKS)))
        .expect("child: register");
    println!("{}", hello(&ep, &dst));
    std::io::stdout().flush().expect("child: stdout");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("child: stdin");
    let (addr, remote) = parse_hello(line.trim()).expect("child: parent's hello");
    let peer = ep.add_peer(&addr).expect("child: add_peer");
    let remote = ep.import(peer, &remote).expect("child: import");
    let pause = Arc::new(AtomicBool::new(false));
    let flag = pause.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
            if line.trim() == "PAUSE" {
                flag.store(true, Ordering::Release);
            }
            line.clear();
        }
    });
    let end = Instant::now() + Duration::from_secs(60);
    let budget = Duration::from_secs(10);
    let mut buf: [transport_core::Completion; 16] = Default::default();
    while Instant::now() < end {
        if pause.load(Ordering::Acquire) {
            println!("PAUSED");
            std::io::stdout().flush().expect("child: stdout");
            // Out of libfabric for good: wait to be killed.
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        let n = ep.poll(&mut buf).expect("child: poll");
        for c in &buf[..n] {
            if let CompletionKind::RemoteWrite { imm } = c.kind {
                write_imm(&mut ep, peer, &src, &remote, imm as usize, budget).expect("child: echo");
            }
        }
    }
}

/// Kills the child however the test ends.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let pid = self.0.id();
        let _ = self.0.kill();
        let _ = self.0.wait();
        // The killed peer cannot remove its shm regions itself.
        transport_efa::remove_shm_regions_of(pid);
    }
}

fn survivor_sees_error_or_timeout(provider: &str) {
    // Once, before this process's first fi_getinfo: tests run on threads beside each other,
    // and a setenv beside libfabric's getenv on another thread is a data race.
    static LOOPBACK: std::sync::Once = std::sync::Once::new();
    LOOPBACK.call_once(|| std::env::set_var("FI_TCP_IFACE", "lo"));
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Peer(
        Command::new(exe)
            .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
            .env(ROLE, provider)
            .env("FI_TCP_IFACE", "lo")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the peer"),
    );
    let out = child.0.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            // libtest may print "test child_role ... " on the same line first.
            let at = line.find("HELLO ").or_else(|| line.find("PAUSED"));
            if let Some(at) = at {
                if tx.send(line[at..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the peer's HELLO within 30 s");
    let (addr, remote) = parse_hello(&line).expect("a well-formed HELLO");

    let mut ep = Endpoint::open(&nic(provider)).expect("open");
    let src = ep
        .register(Memory::Host(HostBuffer::new(CHUNK * CHUNKS)))
        .expect("register");
    let dst = ep
        .register(Memory::Host(HostBuffer::new(CHUNK * CHUNKS)))
        .expect("register");
    let peer = ep.add_peer(&addr).expect("add_peer");
    let remote = ep.import(peer, &remote).expect("import");
    let mut stdin = child.0.stdin.take().expect("child stdin");
    writeln!(stdin, "{}", hello(&ep, &dst)).expect("send HELLO");
    stdin.flush().expect("flush");

    // The transfer works while the peer lives: one echo.
    let budget = Duration::from_secs(20);
    write_imm(&mut ep, peer, &src, &remote, 1, budget).expect("first write");
    wait_for(&mut ep, "the first echo", Duration::from_secs(20), |c| {
        c.check()?;
        Ok(c.kind == CompletionKind::RemoteWrite { imm: 1 })
    })
    .expect("an echo from the live peer");

    if provider == "shm" {
        writeln!(stdin, "PAUSE").expect("send PAUSE");
        stdin.flush().expect("flush");
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the peer's PAUSED within 20 s");
        assert_eq!(line, "PAUSED");
    }
    // Mid-transfer: writes in flight, then the peer dies.
    // (A paused shm peer takes only as many as its queue holds.)
    let mut in_flight = 0;
    for i in 2..2 + CHUNKS {
        match write_imm(&mut ep, peer, &src, &remote, i, Duration::from_secs(1)) {
            Ok(()) => in_flight += 1,
            Err(Error::Timeout { .. }) if in_flight > 0 => break,
            Err(e) => panic!("write before the kill: {e}"),
        }
    }
    child.0.kill().expect("kill the peer");
    child.0.wait().expect("reap the peer");

    // Keep writing and waiting for echoes: it must end in an error or a timeout.
    let start = Instant::now();
    let mut i = 100;
    let outcome: Result<()> = loop {
        if start.elapsed() > Duration::from_secs(30) {
            panic!("the survivor still sees success 30 s after the peer died");
        }
        i += 1;
        if let Err(e) = write_imm(&mut ep, peer, &src, &remote, i, Duration::from_secs(5)) {
            break Err(e);
        }
        let echoed = wait_for(&mut ep, "an echo", Duration::from_secs(3), |c| {
            c.check()?;
            Ok(c.kind == CompletionKind::RemoteWrite { imm: i as u32 })
        });
        if let Err(e) = echoed {
            break Err(e);
        }
    };
    let e = outcome.expect_err("loop only ends in an error");
    eprintln!(
        "{provider}: survivor saw after {:.1} s: {e}",
        start.elapsed().as_secs_f64()
    );
    assert!(start.elapsed() < Duration::from_secs(30));
    // Dropping the endpoint with operations to a dead peer must not hang either.
    let t = Instant::now();
    drop((src, dst, ep));
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "close took {:?}",
        t.elapsed()
    );
}

#[test]
fn peer_killed_tcp() {
    survivor_sees_error_or_timeout("tcp");
}

#[test]
fn peer_killed_shm() {
    survivor_sees_error_or_timeout("shm");
}
