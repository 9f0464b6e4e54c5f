//! WRITE bandwidth and latency of the verbs backend, measured the way perftest measures
//! `ib_write_bw` and `ib_write_lat`, for a side-by-side comparison (`ci/verbs-compare.sh`).
//!
//! Server and client are two threads of this process, each with its own endpoint (server on
//! `--dev0`, client on `--dev1`), pinned to different CPUs (`--cpu0`, `--cpu1`) because both
//! busy-poll.
//!
//! ```text
//! verbs_bench bw  [--size 65536] [--iters 5000] [--tx-depth 128] [--dev0 rxe0] [--dev1 rxe1]
//! verbs_bench lat [--size 8] [--iters 1000] [--poll cq|memory] ...
//! ```
//!
//! - `bw`: the client keeps up to `--tx-depth` WRITEs of `--size` bytes in flight into one
//!   remote buffer (batches of up to 32 chained in one post), `--iters` in all; bandwidth is
//!   bytes over the time from the first post to the last completion (perftest's "BW average").
//!   Every WRITE is signaled (perftest signals every 100th).
//! - `lat`: ping-pong of `--size`-byte WRITEs with immediate: each side waits for the peer's
//!   immediate (a receive completion), then writes back. One-way latency = round trip / 2, per
//!   iteration; min, typical (median), average and 99th percentile, like `ib_write_lat`. Note:
//!   `ib_write_lat` uses plain WRITEs and polls the last byte of the target buffer instead of a
//!   completion queue; the backend's contract is the immediate (bytes visible when the
//!   completion is seen), so that is what is measured here.
//! - `lat --poll memory`: `ib_write_lat`'s own method, for a like-for-like check of the post
//!   path: plain WRITEs carrying a sequence number in their last byte, each side spinning on
//!   the last byte of its receive half and draining its (signaled) WRITE completions.
//!
//! Prints one `RESULT` line per run.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, RemoteMr,
    RemoteRegion, Transport, WriteOp,
};
use transport_verbs::Endpoint;

#[derive(Clone, Debug)]
struct Args {
    mode: String,
    size: usize,
    iters: usize,
    tx_depth: usize,
    dev0: Option<String>,
    dev1: Option<String>,
    cpu0: Option<usize>,
    cpu1: Option<usize>,
    warmup: usize,
    poll_memory: bool,
    batch: usize,
    opts: Vec<(String, String)>,
}

fn parse() -> Args {
    let mut it = std::env::args().skip(1);
    let mode = it.next().unwrap_or_else(|| usage());
    if mode != "bw" && mode != "lat" {
        usage();
    }
    let mut a = Args {
        size: if mode == "bw" { 65536 } else { 8 },
        iters: if mode == "bw" { 5000 } else { 1000 },
        mode,
        tx_depth: 128,
        dev0: None,
        dev1: None,
        cpu0: Some(0),
        cpu1: Some(1),
        warmup: 50,
        poll_memory: false,
        batch: 32,
        opts: Vec::new(),
    };
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| usage());
        let num = || v.parse::<usize>().unwrap_or_else(|_| usage());
        match k.as_str() {
            "--size" => a.size = num(),
            "--iters" => a.iters = num(),
            "--tx-depth" => a.tx_depth = num(),
            "--warmup" => a.warmup = num(),
            "--batch" => a.batch = num().clamp(1, 32),
            "--opt" => match v.split_once('=') {
                Some((k, val)) => a.opts.push((k.to_string(), val.to_string())),
                None => usage(),
            },
            "--poll" => {
                a.poll_memory = match v.as_str() {
                    "cq" => false,
                    "memory" => true,
                    _ => usage(),
                }
            }
            "--dev0" => a.dev0 = Some(v),
            "--dev1" => a.dev1 = Some(v),
            "--cpu0" => a.cpu0 = (v != "none").then(num),
            "--cpu1" => a.cpu1 = (v != "none").then(num),
            _ => usage(),
        }
    }
    a
}

fn usage() -> ! {
    eprintln!(
        "usage: verbs_bench bw|lat [--size B] [--iters N] [--tx-depth N] [--warmup N] \
         [--dev0 NAME] [--dev1 NAME] [--cpu0 N|none] [--cpu1 N|none] [--poll cq|memory] [--batch 1..32] [--opt KEY=VALUE (NicDesc option)]..."
    );
    std::process::exit(2)
}

fn pin(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it; the call only
    // reads the set and affects the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("verbs_bench: cannot pin to CPU {cpu}; running unpinned");
        }
    }
}

/// What the two threads exchange out of band.
struct Hello {
    addr: transport_core::EndpointAddr,
    mr: RemoteMr,
}

const TIMEOUT: Duration = Duration::from_secs(300);

fn open(dev: &Option<String>, a: &Args) -> Endpoint {
    let mut nic = NicDesc {
        device: dev.clone(),
        tx_depth: Some(a.tx_depth.max(1)),
        ..NicDesc::default()
    };
    for (k, v) in &a.opts {
        nic = nic.with_option(k, v);
    }
    Endpoint::open(&nic).unwrap_or_else(|e| {
        eprintln!("verbs_bench: open {dev:?}: {e}");
        std::process::exit(1)
    })
}

/// Connect `ep` with the other thread and register a `size`-byte buffer; returns the peer's
/// region and our own.
fn setup(
    ep: &mut Endpoint,
    size: usize,
    tx: &mpsc::Sender<Hello>,
    rx: &mpsc::Receiver<Hello>,
) -> (
    transport_core::PeerId,
    RemoteRegion<u32>,
    transport_verbs::VerbsMr,
) {
    let mr = ep
        .register(Memory::Host(HostBuffer::new(size.max(1))))
        .expect("register");
    tx.send(Hello {
        addr: ep.address(),
        mr: mr.remote(),
    })
    .expect("send hello");
    let h = rx.recv().expect("receive hello");
    let peer = ep.add_peer(&h.addr).expect("add_peer");
    let remote = ep.import(peer, &h.mr).expect("import the peer's region");
    (peer, remote, mr)
}

/// Poll until `f` has seen what it wants; panics after `TIMEOUT`.
fn spin(ep: &mut Endpoint, out: &mut [Completion], mut f: impl FnMut(&Completion) -> bool) {
    let start = Instant::now();
    let mut idle = 0u32;
    loop {
        let n = ep.poll(out).expect("poll");
        let mut done = false;
        for c in &out[..n] {
            if let CompletionKind::Error(e) = &c.kind {
                panic!("error completion: {e}");
            }
            done |= f(c);
        }
        if done {
            return;
        }
        // Reading the clock costs more than a poll under emulation: only now and then.
        if n == 0 {
            idle = idle.wrapping_add(1);
            if idle.is_multiple_of(4096) && start.elapsed() > TIMEOUT {
                panic!("timed out");
            }
        }
    }
}

type Mr = transport_verbs::VerbsMr;

/// `n` WRITEs with at most `tx_depth` in flight; the time from the first post to the last
/// completion.
#[allow(clippy::too_many_arguments)]
fn bw_run<'m>(
    a: &Args,
    ep: &mut Endpoint,
    ops: &mut Vec<WriteOp<'m, Mr, u32>>,
    out: &mut [Completion],
    n: usize,
    peer: transport_core::PeerId,
    local: LocalSlice<'m, Mr>,
    target: transport_core::RemoteSlice<u32>,
) -> Duration {
    let (mut posted, mut done) = (0usize, 0usize);
    let start = Instant::now();
    while done < n {
        let room = (a.tx_depth - (posted - done)).min(a.batch).min(n - posted);
        if room > 0 {
            ops.clear();
            for i in 0..room {
                ops.push(WriteOp {
                    peer,
                    local,
                    remote: target,
                    imm: None,
                    ctx: (posted + i) as u64,
                });
            }
            posted += ep.post_writes(ops).expect("post_writes");
        }
        let k = ep.poll(out).expect("poll");
        for c in &out[..k] {
            if let CompletionKind::Error(e) = &c.kind {
                panic!("error completion: {e}");
            }
            done += 1;
        }
        if k == 0 && done % 64 == 0 && start.elapsed() > TIMEOUT {
            panic!("timed out");
        }
    }
    start.elapsed()
}

fn bw_client(
    a: &Args,
    ep: &mut Endpoint,
    peer: transport_core::PeerId,
    remote: RemoteRegion<u32>,
    mr: &Mr,
) -> f64 {
    let local = LocalSlice::new(mr, 0, a.size).unwrap();
    let target = remote.slice(0, a.size as u64).unwrap();
    let mut ops = Vec::with_capacity(32);
    let mut out: [Completion; 32] = Default::default();
    bw_run(a, ep, &mut ops, &mut out, a.warmup, peer, local, target);
    let t = bw_run(a, ep, &mut ops, &mut out, a.iters, peer, local, target);
    // Tell the server we are done.
    let _ = ep
        .post_write(
            peer,
            mr.slice(0, 0).unwrap(),
            target,
            Some(u32::MAX),
            u64::MAX,
        )
        .unwrap();
    spin(ep, &mut out, |c| c.ctx == u64::MAX);
    (a.iters * a.size) as f64 * 8.0 / t.as_secs_f64() / 1e9
}

fn lat_side(
    a: &Args,
    ep: &mut Endpoint,
    peer: transport_core::PeerId,
    remote: RemoteRegion<u32>,
    mr: &mut transport_verbs::VerbsMr,
    client: bool,
) -> Vec<f64> {
    let mut out: [Completion; 32] = Default::default();
    let total = a.warmup + a.iters;
    let mut rtts = Vec::with_capacity(a.iters);
    let size = a.size;
    // Memory mode: [0, size) is what we send, [size, 2 size) is where the peer writes.
    let target = if a.poll_memory {
        remote.slice(size as u64, size as u64).unwrap()
    } else {
        remote.slice(0, size as u64).unwrap()
    };
    let recv_last = mr
        .memory()
        .host()
        .unwrap()
        .as_ptr()
        .wrapping_add(2 * size - 1);
    // Wait for the peer's message number `seq`.
    let wait = |ep: &mut Endpoint, out: &mut [Completion], seq: u8, poll_memory: bool| {
        if poll_memory {
            // SAFETY: `recv_last` is the last byte of the registered host region, alive for
            // this whole function; the NIC writes it, so it is read with a volatile load.
            while unsafe { std::ptr::read_volatile(recv_last) } != seq {
                std::hint::spin_loop();
            }
            // Drain our own WRITE completions (every WRITE is signaled), like ib_write_lat.
            let _ = ep.poll(out).expect("poll");
        } else {
            spin(ep, out, |c| {
                matches!(c.kind, CompletionKind::RemoteWrite { .. })
            });
        }
    };
    for i in 0..total {
        let seq = (i % 255 + 1) as u8;
        let send = |ep: &mut Endpoint, mr: &mut transport_verbs::VerbsMr| {
            if a.poll_memory {
                mr.memory_mut().write_at(size - 1, &[seq]).unwrap();
            }
            let local = LocalSlice::new(&*mr, 0, size).unwrap();
            let imm = (!a.poll_memory).then_some(i as u32);
            let _ = ep
                .post_write(peer, local, target, imm, i as u64)
                .expect("post");
        };
        if client {
            let t0 = Instant::now();
            send(ep, mr);
            wait(ep, &mut out, seq, a.poll_memory);
            if i >= a.warmup {
                rtts.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        } else {
            wait(ep, &mut out, seq, a.poll_memory);
            send(ep, mr);
        }
    }
    // Collect our own last write completion before tearing down.
    std::thread::sleep(Duration::from_millis(50));
    let _ = ep.poll(&mut out);
    rtts
}

/// Region size: twice the message in memory-polling mode (send half, receive half).
fn region(a: &Args) -> usize {
    if a.poll_memory {
        2 * a.size
    } else {
        a.size
    }
}

fn main() {
    let a = parse();
    let (tx0, rx1) = mpsc::channel::<Hello>();
    let (tx1, rx0) = mpsc::channel::<Hello>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let sa = a.clone();
    let server = std::thread::spawn(move || {
        pin(sa.cpu0);
        let mut ep = open(&sa.dev0, &sa);
        let (peer, remote, mut mr) = setup(&mut ep, region(&sa), &tx0, &rx0);
        let mut out: [Completion; 32] = Default::default();
        if sa.mode == "bw" {
            // Passive, like ib_write_bw's server, which sleeps on its TCP socket: the target of
            // plain WRITEs needs no CPU, so block (leaving the CPU to the kernel's rxe work)
            // until the client says it is done, then take its final immediate.
            let _ = done_rx.recv();
            spin(&mut ep, &mut out, |c| {
                matches!(c.kind, CompletionKind::RemoteWrite { imm: u32::MAX })
            });
        } else {
            lat_side(&sa, &mut ep, peer, remote, &mut mr, false);
        }
        (ep.device().to_string(), ep.gid_index(), ep.active_mtu())
    });
    pin(a.cpu1);
    let mut ep = open(&a.dev1, &a);
    let (peer, remote, mut mr) = setup(&mut ep, region(&a), &tx1, &rx1);
    let (sdev, sgid, mtu) = if a.mode == "bw" {
        let gbps = bw_client(&a, &mut ep, peer, remote, &mr);
        let _ = done_tx.send(());
        let info = server.join().expect("server thread");
        println!(
            "RESULT verbs write_bw size={} iters={} tx_depth={} gbps={:.4} mpps={:.5}",
            a.size,
            a.iters,
            a.tx_depth,
            gbps,
            gbps * 1e9 / 8.0 / a.size as f64 / 1e6
        );
        info
    } else {
        let mut rtts = lat_side(&a, &mut ep, peer, remote, &mut mr, true);
        let info = server.join().expect("server thread");
        rtts.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let one_way = |v: f64| v / 2.0;
        let n = rtts.len();
        let avg = rtts.iter().sum::<f64>() / n as f64;
        println!(
            "RESULT verbs write_lat poll={} size={} iters={} t_min_us={:.2} t_typical_us={:.2} t_avg_us={:.2} t_p99_us={:.2}",
            if a.poll_memory { "memory" } else { "cq" },
            a.size,
            n,
            one_way(rtts[0]),
            one_way(rtts[n / 2]),
            one_way(avg),
            one_way(rtts[(n * 99 / 100).min(n - 1)])
        );
        info
    };
    eprintln!(
        "verbs_bench: server {sdev} (gid {sgid}), client {} (gid {}), active MTU {mtu}",
        ep.device(),
        ep.gid_index()
    );
}
