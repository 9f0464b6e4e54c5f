//! The trait's promise on GPU memory: a [`CompletionKind::RemoteWrite`] or a receive
//! completes at the target after its bytes are visible there, to work on any CUDA stream.
//! Runs on the GPU host (`ci/gpu-host.sh run`, `REQUIRE_CUDA_PROVIDER=1`, a CUDA-enabled
//! libfabric 2.x); skips elsewhere, saying so.
//!
//! Two processes over `shm`: the test process is the target, it starts itself again as the
//! initiator (`GPU_VISIBILITY_CHILD=1`), and the two talk in lines over the child's stdin and
//! stdout. For each size (1 MiB to 256 MiB, where the race is widest) and each operation
//! (WRITE with immediate, SEND into a posted receive), the initiator moves its two sources in
//! turn (every byte `0x11`, then every byte `0x22`, ...) into one target region. At each
//! completion the target at once reads eight 64-byte probes of the region, from its end
//! backwards, on a CUDA stream of its own (`CU_STREAM_NON_BLOCKING`: not ordered after the
//! provider's copies on the legacy default stream) into pinned memory, and checks that every
//! probe holds the new bytes. After the last one it waits for the GPU and checks the whole
//! region, so a stale probe is a completion that came early, not a transfer that failed.
//!
//! Why: shm moves GPU memory between processes by CUDA IPC, with a device-to-device
//! `cudaMemcpy` in the target process that returns before the GPU ran it unless the memory
//! carries `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`; shm then writes the completion while the bytes
//! are on their way. `GpuBuffer::alloc` sets the attribute. The same binary shows the race
//! with `GPU_VISIBILITY_ALLOC=unsynced`: every buffer (both processes) then comes from the
//! hidden `GpuBuffer::alloc_without_sync_memops`, and the test is expected to fail, printing
//! `RACE SHOWN: N of M completions ...` (ci/gpu-host.sh's `visibility` step runs both).
//!
//! `GPU_VISIBILITY_HOST=1` runs the same exchange on host memory (reads are plain loads; no
//! stale read is possible through shm's CMA copy), to try the harness without a GPU.

#![cfg(feature = "cuda")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys};
use transport_core::{
    cuda_device_count, cuda_driver_present, Completion, CompletionKind, EndpointAddr, GpuBuffer,
    HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, Post, RemoteSlice, Transport,
};
use transport_efa::Endpoint;

const TIMEOUT: Duration = Duration::from_secs(120);
/// Region sizes: the wider the copy, the longer a stale completion's window.
const SIZES: [usize; 3] = [1 << 20, 16 << 20, 256 << 20];
/// Completions checked per size and operation.
const REPS: u32 = 40;
/// Probes read at each completion, from the region's end backwards, and their length.
const PROBES: usize = 8;
const PROBE_LEN: usize = 64;

fn required() -> bool {
    std::env::var_os("REQUIRE_CUDA_PROVIDER").is_some()
}

fn host() -> bool {
    std::env::var_os("GPU_VISIBILITY_HOST").is_some()
}

/// Buffers without `SYNC_MEMOPS` (`GPU_VISIBILITY_ALLOC=unsynced`): what the project
/// allocated before the fix.
fn unsynced() -> bool {
    std::env::var("GPU_VISIBILITY_ALLOC").is_ok_and(|v| v == "unsynced")
}

fn nic() -> NicDesc {
    NicDesc::provider("shm").with_option("hmem", if host() { "off" } else { "on" })
}

fn alloc(len: usize) -> Memory {
    if host() {
        Memory::Host(HostBuffer::new(len))
    } else if unsynced() {
        Memory::Gpu(GpuBuffer::alloc_without_sync_memops(0, len).expect("cuMemAlloc"))
    } else {
        let g = GpuBuffer::alloc(0, len).expect("cuMemAlloc");
        assert!(
            g.sync_memops().expect("pointer attribute"),
            "GpuBuffer::alloc must set CU_POINTER_ATTRIBUTE_SYNC_MEMOPS"
        );
        Memory::Gpu(g)
    }
}

/// The byte every position of source `k` holds.
fn value(k: u32) -> u8 {
    [0x11, 0x22][k as usize % 2]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
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

/// The initiator: for each line `SIZE len addr key`, two sources of `len` bytes; then for
/// each `WRITE r` / `SEND r`, source `r` into the target, and `DONE` once it completed here.
fn child() {
    let mut ep = Endpoint::open(&nic()).expect("child: open shm");
    println!("ADDR {}", hex(&ep.address().0));
    let _ = std::io::stdout().flush();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut read = || {
        let mut l = String::new();
        input.read_line(&mut l).expect("stdin");
        l.trim().to_string()
    };
    let peer = ep
        .add_peer(&EndpointAddr(unhex(read().trim_start_matches("ADDR "))))
        .expect("child: add_peer");
    let mut srcs = Vec::new();
    let mut remote = RemoteSlice {
        addr: 0,
        len: 0,
        key: 0,
    };
    loop {
        let line = read();
        let f: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| f[i].parse::<u64>().expect("number");
        match f.first().copied() {
            Some("SIZE") => {
                srcs.clear();
                let len = n(1) as usize;
                for k in 0..2 {
                    let mut m = alloc(len);
                    m.write_at(0, &vec![value(k); len]).expect("child: fill");
                    srcs.push(ep.register(m).expect("child: register"));
                }
                remote = RemoteSlice {
                    addr: n(2),
                    len: len as u64,
                    key: n(3),
                };
                println!("READY");
            }
            Some(op @ ("WRITE" | "SEND")) => {
                let r = n(1) as u32;
                let src = LocalSlice::all(&srcs[r as usize % 2]);
                let start = Instant::now();
                loop {
                    let p = if op == "WRITE" {
                        ep.post_write(peer, src, remote, Some(r), u64::from(r))
                    } else {
                        ep.post_send(peer, src, u64::from(r))
                    }
                    .expect("child: post");
                    if p == Post::Posted {
                        break;
                    }
                    assert!(start.elapsed() < TIMEOUT, "child: queue full");
                    let mut buf: [Completion; 4] = Default::default();
                    let _ = ep.poll(&mut buf).expect("child: poll");
                }
                wait(&mut ep, "child: local completion", |c| {
                    matches!(c.kind, CompletionKind::Write | CompletionKind::Send)
                });
                println!("DONE");
            }
            _ => break,
        }
        let _ = std::io::stdout().flush();
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

/// Reads probes of GPU memory on a non-blocking stream of its own into pinned memory.
struct Prober {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    pinned: *mut u8,
}

impl Prober {
    fn new(g: &GpuBuffer) -> Prober {
        let stream = g
            .context()
            .new_stream()
            .expect("cuStreamCreate(NON_BLOCKING)");
        // SAFETY: the buffer's context is current (new_stream binds it); PROBES * PROBE_LEN
        // bytes of pinned host memory, freed in Drop.
        let pinned = unsafe { result::malloc_host(PROBES * PROBE_LEN, 0) }
            .expect("cuMemAllocHost")
            .cast::<u8>();
        Prober { stream, pinned }
    }

    /// The probes of `g` (its last `PROBE_LEN` bytes, then every `len / PROBES` backwards),
    /// read on this stream only.
    fn read(&self, g: &GpuBuffer, len: usize) -> &[u8] {
        g.context().bind_to_thread().expect("cuCtxSetCurrent");
        let step = len / PROBES;
        for i in 0..PROBES {
            let off = len - PROBE_LEN - i * step;
            // SAFETY: [off, off + PROBE_LEN) lies in g's allocation (len <= g.len(),
            // step * (PROBES - 1) + PROBE_LEN <= len); the destination is PROBE_LEN bytes of
            // the pinned buffer, which outlives the stream work (synchronized below).
            let r = unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    self.pinned.add(i * PROBE_LEN).cast(),
                    g.device_ptr() + off as u64,
                    PROBE_LEN,
                    self.stream.cu_stream(),
                )
            };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemcpyDtoHAsync");
        }
        self.stream.synchronize().expect("cuStreamSynchronize");
        // SAFETY: the pinned buffer holds PROBES * PROBE_LEN initialized bytes (the copies
        // above completed) and is not written while the slice lives (&self).
        unsafe { std::slice::from_raw_parts(self.pinned, PROBES * PROBE_LEN) }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAllocHost in new, freed once.
        let _ = unsafe { result::free_host(self.pinned.cast()) };
    }
}

/// The probes of `mem` as the target sees them right after a completion.
fn probes(mem: &Memory, len: usize, prober: &Option<Prober>) -> Vec<u8> {
    match (mem, prober) {
        (Memory::Gpu(g), Some(p)) => p.read(g, len).to_vec(),
        _ => {
            let step = len / PROBES;
            (0..PROBES)
                .flat_map(|i| {
                    let off = len - PROBE_LEN - i * step;
                    let mut probe = vec![0u8; PROBE_LEN];
                    mem.read_at(off, &mut probe)
                        .expect("a probe inside the buffer");
                    probe
                })
                .collect()
        }
    }
}

#[test]
fn completions_come_after_the_bytes_on_gpu_memory() {
    if std::env::var_os("GPU_VISIBILITY_CHILD").is_some() {
        child();
        return;
    }
    if !host() && (!cuda_driver_present() || cuda_device_count().unwrap_or(0) == 0) {
        assert!(
            !required(),
            "REQUIRE_CUDA_PROVIDER is set, but no CUDA device"
        );
        eprintln!("SKIPPED: no CUDA driver or device on this machine");
        return;
    }
    let mut ep = match Endpoint::open(&nic()) {
        Ok(ep) if ep.caps().gpu_memory || host() => ep,
        other => {
            let why = match other {
                Ok(_) => "shm offers no GPU memory here".to_string(),
                Err(e) => format!("shm with hmem=on does not open: {e}"),
            };
            assert!(!required(), "REQUIRE_CUDA_PROVIDER is set: {why}");
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let exe = std::env::current_exe().expect("test binary");
    let mut kid = Kid(Command::new(exe)
        .args([
            "--exact",
            "completions_come_after_the_bytes_on_gpu_memory",
            "--nocapture",
        ])
        .env("GPU_VISIBILITY_CHILD", "1")
        .env("FI_LOG_LEVEL", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the initiator"));
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

    let (mut stale, mut checked) = (0u32, 0u32);
    let mut where_stale = Vec::new();
    for len in SIZES {
        let dst = ep.register(alloc(len)).expect("register the target region");
        let prober = match dst.memory() {
            Memory::Gpu(g) => Some(Prober::new(g)),
            Memory::Host(_) => None,
        };
        let r = dst.remote();
        // efa's keys are 8 bytes (transport_core::KeyBytes::to_u64); the child posts with it.
        let key = r.key.to_u64("efa").expect("an efa key");
        writeln!(to_kid, "SIZE {len} {} {key}", r.addr).expect("to child");
        to_kid.flush().expect("to child");
        assert_eq!(next_line("READY"), "READY");
        let mut last = 0;
        for op in ["WRITE", "SEND"] {
            let mut bad = 0;
            for rep in 0..REPS {
                let k = last + 1;
                last = k;
                if op == "SEND" {
                    let p = ep
                        .post_recv(LocalSlice::all(&dst), u64::from(k))
                        .expect("post_recv");
                    assert_eq!(p, Post::Posted);
                }
                writeln!(to_kid, "{op} {k}").expect("to child");
                to_kid.flush().expect("to child");
                wait(&mut ep, "the target's completion", |c| match c.kind {
                    CompletionKind::RemoteWrite { imm } => imm == k,
                    CompletionKind::Recv { len: n, .. } => {
                        assert_eq!(n, len, "received length");
                        true
                    }
                    _ => false,
                });
                // At once: the bytes must be there, for a read not ordered after the
                // provider's copy.
                let got = probes(dst.memory(), len, &prober);
                checked += 1;
                if got.iter().any(|&b| b != value(k)) {
                    stale += 1;
                    bad += 1;
                    if where_stale.len() < 8 {
                        let first = got.iter().position(|&b| b != value(k)).unwrap_or(0);
                        where_stale.push(format!(
                            "{op} of {len} bytes #{rep}: probe {} reads {:#04x}, wrote {:#04x}",
                            first / PROBE_LEN,
                            got[first],
                            value(k)
                        ));
                    }
                }
                assert_eq!(next_line("DONE"), "DONE");
            }
            eprintln!(
                "{op:>5} {len:>10} bytes: {bad} of {REPS} completions read stale bytes{}",
                if unsynced() { " (no SYNC_MEMOPS)" } else { "" }
            );
        }
        // The transfers themselves worked: once the GPU is idle, every byte is the last one.
        if let Memory::Gpu(g) = dst.memory() {
            g.context().synchronize().expect("cuCtxSynchronize");
        }
        let mut all = vec![0u8; len];
        dst.memory().read_at(0, &mut all).expect("read back");
        assert!(
            all.iter().all(|&b| b == value(last)),
            "region of {len} bytes: the last transfer did not land at all"
        );
        drop(prober);
    }
    writeln!(to_kid, "END").expect("to child");
    drop(to_kid);
    if stale > 0 {
        eprintln!(
            "RACE SHOWN: {stale} of {checked} completions came before their bytes{}",
            if unsynced() {
                " (buffers without CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, as before the fix)"
            } else {
                ""
            }
        );
    } else {
        eprintln!("no stale read in {checked} completions");
    }
    assert_eq!(
        stale,
        0,
        "{stale} of {checked} completions came before their bytes were visible to another \
         CUDA stream: {}",
        where_stale.join("; ")
    );
}
