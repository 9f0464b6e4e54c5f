//! GPU memory between two processes on `shm` takes the device-to-device path (CUDA IPC),
//! for regions from 4 KiB to 1 GiB. Runs on the GPU host (`ci/gpu-host.sh`, with
//! `REQUIRE_CUDA_PROVIDER=1` and a CUDA-enabled libfabric 2.x); skips elsewhere, saying so.
//!
//! Why: rdma-bench moved GPU memory between two processes at about 14 Gbit/s whatever the
//! size, where `fi_rma_bw -D cuda` reached 433 Gbit/s at 1 MiB. shm takes its IPC protocol
//! only for regions registered with `FI_HMEM_DEVICE_ONLY` (`smr_select_proto`), which
//! fabtests sets and this backend did not, and CUDA IPC cannot export the `cuMemAllocAsync`
//! memory `GpuBuffer` used to hold; every byte went through shm's host bounce buffers. shm
//! says nothing either way, so the path shows in what it reaches: this test fails where a
//! region of 1 MiB or more moves at under 50 Gbit/s (the bounce path tops out near 15, a
//! device-to-device copy of one H100 is well beyond 1000), and everywhere it checks every
//! byte of every region.
//!
//! The test process is the target; it starts itself again as the initiator (the child,
//! `GPU_IPC_CHILD=1`), and the two exchange addresses and regions as lines on the child's
//! stdin and stdout. `GPU_IPC_HOST=1` runs the same exchange on host memory without the
//! bandwidth check, to try the harness on a machine without a GPU.

#![cfg(feature = "cuda")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use transport_core::{
    cuda_device_count, cuda_driver_present, Completion, CompletionKind, EndpointAddr, GpuBuffer,
    KeyBytes, LocalSlice, Memory, MemoryRegion, NicDesc, Post, RemoteMr, Transport,
};
use transport_efa::Endpoint;

const TIMEOUT: Duration = Duration::from_secs(120);
/// Regions of this size or more must move at [`MIN_GBPS`] or better.
const CHECK_FROM: usize = 1 << 20;
const MIN_GBPS: f64 = 50.0;

fn required() -> bool {
    std::env::var_os("REQUIRE_CUDA_PROVIDER").is_some()
}

/// Host memory instead of GPU memory (`GPU_IPC_HOST=1`): the harness without a GPU.
fn host() -> bool {
    std::env::var_os("GPU_IPC_HOST").is_some()
}

fn nic() -> NicDesc {
    NicDesc::provider("shm").with_option("hmem", if host() { "off" } else { "on" })
}

fn alloc(len: usize) -> Memory {
    if host() {
        Memory::Host(transport_core::HostBuffer::new(len))
    } else {
        Memory::Gpu(GpuBuffer::alloc(0, len).expect("cuMemAlloc"))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The byte at `i` of the region of size index `k`.
fn byte(k: usize, i: usize) -> u8 {
    (i as u64)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(k as u64 * 17) as u8
        ^ (i >> 12) as u8
}

/// Poll `ep` until `done` says so, for at most [`TIMEOUT`].
fn wait(ep: &mut Endpoint, what: &str, mut done: impl FnMut(&Completion) -> bool) {
    let start = Instant::now();
    let mut buf: [Completion; 16] = Default::default();
    loop {
        let n = ep.poll(&mut buf).expect("poll");
        for c in &buf[..n] {
            c.check().unwrap_or_else(|e| panic!("{what}: {e}"));
            if done(c) {
                return;
            }
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "{what}: no completion in {TIMEOUT:?}"
        );
    }
}

/// The initiator: registers a source region per line `WRITE addr len key-hex reps k`, fills it,
/// WRITEs it `reps` times (the last with immediate `k`), answers `DONE`.
fn child() {
    let mut ep = Endpoint::open(&nic()).expect("child: open shm");
    println!("ADDR {}", hex(&ep.address().0));
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut read = || {
        let mut l = String::new();
        input.read_line(&mut l).expect("stdin");
        l.trim().to_string()
    };
    let peer_line = read();
    let peer = ep
        .add_peer(&EndpointAddr(unhex(peer_line.trim_start_matches("ADDR "))))
        .expect("child: add_peer");
    loop {
        let line = read();
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() != Some(&"WRITE") {
            break;
        }
        let n = |i: usize| f[i].parse::<u64>().expect("number");
        let (addr, len, reps, k) = (n(1), n(2) as usize, n(4), n(5) as usize);
        let key = KeyBytes::new(unhex(f[3])).expect("child: key bytes");
        let mut mem = alloc(len);
        let pattern: Vec<u8> = (0..len).map(|i| byte(k, i)).collect();
        mem.write_at(0, &pattern).expect("child: fill");
        let src = ep.register(mem).expect("child: register GPU memory");
        // The source is ready: the target starts its clock at GO, so the set-up above (a
        // 1 GiB allocation and fill) is not counted as transfer time.
        println!("READY");
        let _ = std::io::stdout().flush();
        assert_eq!(read(), "GO", "child: expected GO");
        let remote = ep
            .import(
                peer,
                &RemoteMr {
                    addr,
                    len: len as u64,
                    key,
                },
            )
            .expect("child: import the target region")
            .all();
        // The WRITEs go out from a thread of their own, as a workload's do: with the
        // device's context made current there first (`GPU_IPC_THREAD=bound`, what every
        // rdma-bench thread does) or not (`unbound`).
        let bind = std::env::var("GPU_IPC_THREAD").as_deref() == Ok("bound");
        let ep = &mut ep;
        std::thread::scope(|s| {
            s.spawn(move || {
                if bind && !host() {
                    transport_core::cuda_enter_device(0).expect("child: cuCtxSetCurrent");
                }
                write_all(ep, peer, &src, remote, reps, k);
            })
            .join()
            .expect("child: the posting thread panicked");
        });
        println!("DONE");
        let _ = std::io::stdout().flush();
    }
}

/// Post `reps` WRITEs of all of `src` to `remote` (the last with immediate `k`) and wait for
/// their completions.
fn write_all(
    ep: &mut Endpoint,
    peer: transport_core::PeerId,
    src: &<Endpoint as Transport>::Mr,
    remote: transport_core::RemoteSlice<<Endpoint as Transport>::RemoteKey>,
    reps: u64,
    k: usize,
) {
    {
        let mut done = 0;
        for r in 0..reps {
            let imm = (r + 1 == reps).then_some(k as u32);
            let start = Instant::now();
            while ep
                .post_write(peer, LocalSlice::all(src), remote, imm, r)
                .expect("child: post_write")
                == Post::QueueFull
            {
                assert!(start.elapsed() < TIMEOUT, "child: queue full");
                let mut buf: [Completion; 16] = Default::default();
                let got = ep.poll(&mut buf).expect("child: poll");
                for c in &buf[..got] {
                    c.check().expect("child: completion");
                    done += u64::from(c.kind == CompletionKind::Write);
                }
            }
        }
        wait(ep, "child: WRITE completions", |c| {
            done += u64::from(c.kind == CompletionKind::Write);
            done == reps
        });
    }
}

struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        transport_efa::remove_shm_regions_of(self.0.id());
    }
}

/// The target's endpoint, or why this machine cannot run the exchange (a skip, said).
fn target() -> Option<Endpoint> {
    if !host() && (!cuda_driver_present() || cuda_device_count().unwrap_or(0) == 0) {
        assert!(
            !required(),
            "REQUIRE_CUDA_PROVIDER is set, but no CUDA device"
        );
        transport_core::skip::note("no CUDA device", "no CUDA driver or device on this machine");
        return None;
    }
    match Endpoint::open(&nic()) {
        Ok(ep) if ep.caps().gpu_memory || host() => Some(ep),
        other => {
            let why = match other {
                Ok(_) => "shm offers no GPU memory here".to_string(),
                Err(e) => format!("shm with hmem=on does not open: {e}"),
            };
            assert!(!required(), "REQUIRE_CUDA_PROVIDER is set: {why}");
            transport_core::skip::note("no CUDA-capable libfabric", &why);
            None
        }
    }
}

/// Regions of each of `sizes` WRITEn into this process by a child whose posting thread is
/// `thread` (`GPU_IPC_THREAD`), every byte checked; the rate of each (Gbit/s) and what the
/// child printed on stderr (libfabric's warnings).
fn exchange(ep: &mut Endpoint, thread: &str, sizes: &[usize]) -> (Vec<(usize, f64)>, String) {
    let exe = std::env::current_exe().expect("test binary");
    let mut kid = Kid(Command::new(exe)
        .args([
            "--exact",
            "gpu_memory_between_processes_moves_device_to_device",
            "--nocapture",
        ])
        .env("GPU_IPC_CHILD", "1")
        .env("GPU_IPC_THREAD", thread)
        .env("FI_LOG_LEVEL", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the initiator"));
    // The child's warnings, echoed and kept: shm says there when it falls back.
    let mut err = kid.0.stderr.take().expect("stderr");
    let warnings = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut all);
        eprint!("{all}");
        all
    });
    let mut to_kid = kid.0.stdin.take().expect("stdin");
    let mut from_kid = BufReader::new(kid.0.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut next_line = |what: &str| -> String {
        loop {
            line.clear();
            let n = from_kid.read_line(&mut line).expect("child stdout");
            assert!(n > 0, "the initiator exited before {what}");
            let t = line.trim();
            if t.starts_with("ADDR ") || t == "DONE" || t == "READY" {
                return t.to_string();
            }
        }
    };
    let addr = next_line("its address");
    ep.add_peer(&EndpointAddr(unhex(addr.trim_start_matches("ADDR "))))
        .expect("add_peer");
    writeln!(to_kid, "ADDR {}", hex(&ep.address().0)).expect("to child");

    let mut rates = Vec::new();
    for (k, &len) in sizes.iter().enumerate() {
        let reps: u64 = ((8u64 << 30) / len as u64).clamp(4, 256);
        let dst = ep.register(alloc(len)).expect("register the target region");
        let r = dst.remote();
        let key = hex(r.key.as_bytes());
        writeln!(to_kid, "WRITE {} {} {key} {reps} {k}", r.addr, r.len).expect("to child");
        to_kid.flush().expect("to child");
        assert_eq!(next_line("READY"), "READY");
        let start = Instant::now();
        writeln!(to_kid, "GO").expect("to child");
        to_kid.flush().expect("to child");
        wait(ep, "the region's immediate", |c| {
            c.kind == CompletionKind::RemoteWrite { imm: k as u32 }
        });
        // shm's IPC copy is a device-to-device cudaMemcpy in this process, which returns
        // before the GPU has run it: the immediate can arrive first. The clock stops when
        // the bytes are in place.
        if let Memory::Gpu(g) = dst.memory() {
            g.context().synchronize().expect("cuCtxSynchronize");
        }
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(next_line("DONE"), "DONE");
        let gbps = (len as u64 * reps) as f64 * 8.0 / secs / 1e9;
        // Every byte, in 64 MiB pieces.
        let chunk = len.min(64 << 20);
        let mut got = vec![0u8; chunk];
        for off in (0..len).step_by(chunk) {
            dst.memory()
                .read_at(off, &mut got)
                .expect("copy from the GPU");
            if let Some(i) = (0..chunk).find(|&i| got[i] != byte(k, off + i)) {
                panic!("region of {len} bytes: byte {} differs", off + i);
            }
        }
        eprintln!(
            "{thread} posting thread: {len:>11} bytes x {reps:>3}: {gbps:8.1} Gbit/s, every byte verified"
        );
        rates.push((len, gbps));
    }
    writeln!(to_kid, "END").expect("to child");
    drop(to_kid);
    let _ = kid.0.wait();
    let warnings = warnings.join().expect("the stderr reader");
    (rates, warnings)
}

/// What libfabric 2.6's shm says when it copies through its host bounce buffers instead.
const SAR: &str = "fallback to using SAR";

/// The regions at or above [`CHECK_FROM`] that moved under [`MIN_GBPS`], in words.
fn slow(rates: &[(usize, f64)]) -> Vec<String> {
    rates
        .iter()
        .filter(|&&(len, gbps)| len >= CHECK_FROM && gbps < MIN_GBPS)
        .map(|(len, gbps)| format!("{len} bytes at {gbps:.1} Gbit/s"))
        .collect()
}

/// The child posts from a thread of its own that made the device's context current first,
/// as every rdma-bench thread does (`bench_core::buffers::enter_gpu`): every WRITE takes CUDA
/// IPC, the first too.
#[test]
fn gpu_memory_between_processes_moves_device_to_device() {
    if std::env::var_os("GPU_IPC_CHILD").is_some() {
        child();
        return;
    }
    let Some(mut ep) = target() else { return };
    let sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30];
    let (rates, warnings) = exchange(&mut ep, "bound", &sizes);
    let slow = slow(&rates);
    assert!(
        host() || slow.is_empty(),
        "GPU memory did not move device to device between processes (under {MIN_GBPS} \
         Gbit/s: shm's host bounce path): {}",
        slow.join(", ")
    );
    assert!(
        !warnings.contains(SAR),
        "shm copied through host memory although the posting thread had the context: \
         {warnings}"
    );
}

/// What the context on the posting thread is for: from a thread that never made a CUDA
/// context current, shm cannot take the first WRITE's IPC handle (`cuMemGetAddressRange`:
/// CUDA_ERROR_INVALID_CONTEXT) and copies it through host memory; the CUDA runtime call of
/// that copy makes the primary context current as a side effect, and later WRITEs take IPC
/// (H200, 2026-11-28: 1 MiB x 256 at 423 Gbit/s unbound, 562 bound). Every byte arrives
/// either way. If a libfabric stops falling back there, this goes red.
#[test]
fn a_posting_thread_without_a_cuda_context_copies_its_first_write_through_host_memory() {
    if host() {
        transport_core::skip::note("GPU_IPC_HOST", "host memory has no CUDA path to lose");
        return;
    }
    let Some(mut ep) = target() else { return };
    let (_, warnings) = exchange(&mut ep, "unbound", &[1 << 20]);
    assert!(
        warnings.contains(SAR),
        "a posting thread without a CUDA context no longer makes shm fall back to host \
         copies (no \"{SAR}\" in the initiator's warnings); enter_gpu's reason may be gone"
    );
}
