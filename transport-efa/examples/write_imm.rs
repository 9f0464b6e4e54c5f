//! WRITE with immediate between two endpoints of one process: what an application copies
//! to link the libfabric backend in.
//!
//! ```text
//! cargo run --release -p transport-efa --example write_imm -- [PROVIDER [SIZE [ITERATIONS]]]
//!     [--provider shm|tcp|efa] [--size BYTES] [--iters N] [--device NAME] [--depth N]
//!     [--option KEY=VALUE]...
//! ```
//!
//! Defaults: provider `shm`, 64 KiB, 10000 iterations, up to 64 WRITEs in flight. `tcp`
//! defaults to the loopback device (`--device lo`). It registers a source region on one
//! endpoint and a target region on the other, streams WRITEs with immediates (the immediate
//! is the iteration number), waits until every immediate arrived exactly once, checks the
//! bytes, and prints bytes, seconds, Gbit/s and the verification result. The exit status is
//! non-zero when anything failed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, Error, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, Post,
    Result, Transport,
};
use transport_efa::Endpoint;

/// Every wait gives up after this long without progress.
const STALL: Duration = Duration::from_secs(20);

struct Args {
    nic: NicDesc,
    size: usize,
    iters: usize,
    depth: usize,
}

fn usage() -> String {
    "usage: write_imm [PROVIDER [SIZE [ITERATIONS]]] [--provider P] [--size BYTES] \
     [--iters N] [--device NAME] [--depth N] [--option KEY=VALUE]..."
        .into()
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut provider = None;
    let mut size = None;
    let mut iters = None;
    let mut device = None;
    let mut depth = 64usize;
    let mut options = Vec::new();
    let mut positional = 0;
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, what: &str| -> std::result::Result<usize, String> {
        v.ok_or_else(|| format!("{what} needs a value"))?
            .parse::<usize>()
            .map_err(|e| format!("{what}: {e}"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--provider" => provider = Some(it.next().ok_or("--provider needs a value")?),
            "--size" => size = Some(num(it.next(), "--size")?),
            "--iters" => iters = Some(num(it.next(), "--iters")?),
            "--device" => device = Some(it.next().ok_or("--device needs a value")?),
            "--depth" => depth = num(it.next(), "--depth")?,
            "--option" => {
                let kv = it.next().ok_or("--option needs KEY=VALUE")?;
                let (k, v) = kv.split_once('=').ok_or("--option needs KEY=VALUE")?;
                options.push((k.to_string(), v.to_string()));
            }
            "-h" | "--help" => return Err(usage()),
            _ if a.starts_with('-') => return Err(format!("unknown flag {a}\n{}", usage())),
            _ => {
                match positional {
                    0 => provider = Some(a),
                    1 => size = Some(a.parse().map_err(|e| format!("SIZE: {e}"))?),
                    2 => iters = Some(a.parse().map_err(|e| format!("ITERATIONS: {e}"))?),
                    _ => return Err(usage()),
                }
                positional += 1;
            }
        }
    }
    let provider = provider.unwrap_or_else(|| "shm".into());
    let mut nic = NicDesc::provider(provider.clone());
    // Both endpoints live in this process: keep tcp on the loopback interface.
    nic.device = device.or_else(|| (provider == "tcp").then(|| "lo".to_string()));
    for (k, v) in options {
        nic = nic.with_option(k, v);
    }
    let size = size.unwrap_or(64 << 10);
    if size == 0 || depth == 0 {
        return Err("SIZE and --depth must be at least 1".into());
    }
    Ok(Args {
        nic,
        size,
        iters: iters.unwrap_or(10_000),
        depth,
    })
}

/// Poll both endpoints, handing each completion to `f`; true where anything completed.
fn poll_both(
    a: &mut Endpoint,
    b: &mut Endpoint,
    buf: &mut [Completion],
    mut f: impl FnMut(usize, &Completion) -> Result<()>,
) -> Result<bool> {
    let mut any = false;
    for side in 0..2 {
        let t = if side == 0 { &mut *a } else { &mut *b };
        let n = t.poll(buf)?;
        any |= n > 0;
        for c in &buf[..n] {
            f(side, c)?;
        }
    }
    Ok(any)
}

fn run(args: &Args) -> Result<bool> {
    if args.nic.provider.as_deref() == Some("tcp") && std::env::var_os("FI_TCP_IFACE").is_none() {
        // Before the first fi_getinfo.
        std::env::set_var("FI_TCP_IFACE", args.nic.device.as_deref().unwrap_or("lo"));
    }
    let mut a = Endpoint::open(&args.nic)?;
    let mut b = Endpoint::open(&args.nic)?;
    let a_to_b = a.add_peer(&b.address())?;
    b.add_peer(&a.address())?;
    // One process: each side takes the other's connection request before a posts (see
    // the crate docs: libfabric 2.6's shm crashes a peer that has not polled once).
    let mut none: [transport_core::Completion; 4] = Default::default();
    b.poll(&mut none)?;
    a.poll(&mut none)?;
    println!(
        "provider {} (fabric {}, domain {}, libfabric {}), mr_mode {}, max write {} bytes",
        a.provider(),
        a.fabric_name(),
        a.nic_name(),
        Endpoint::libfabric_version(),
        a.mr_mode(),
        a.caps().max_write_size
    );
    if args.size > a.caps().max_write_size {
        return Err(Error::InvalidArgument(format!(
            "{} bytes exceed the largest WRITE ({} bytes)",
            args.size,
            a.caps().max_write_size
        )));
    }

    let pattern: Vec<u8> = (0..args.size)
        .map(|i| (i as u8).wrapping_mul(7) ^ (i >> 8) as u8)
        .collect();
    let src = a.register(Memory::Host(HostBuffer::from_slice(&pattern)))?;
    let dst = b.register(Memory::Host(HostBuffer::new(args.size)))?;
    let remote = a.import(a_to_b, &dst.remote())?.all();
    let depth = args.depth.min(a.caps().tx_depth).max(1);

    let mut seen = vec![0u32; args.iters];
    let (mut posted, mut writes, mut imms) = (0usize, 0usize, 0usize);
    let mut buf: [Completion; 32] = Default::default();
    let start = Instant::now();
    let mut last_progress = Instant::now();
    while writes < args.iters || imms < args.iters {
        // Keep `depth` WRITEs in flight. A full queue (also while a lazily connecting
        // provider sets up the connection) just means: poll, then post again.
        while posted < args.iters && posted - writes < depth {
            let imm = Some(posted as u32);
            match a.post_write(a_to_b, LocalSlice::all(&src), remote, imm, posted as u64)? {
                Post::Posted => posted += 1,
                Post::QueueFull => break,
            }
        }
        let progressed = poll_both(&mut a, &mut b, &mut buf, |side, c| {
            c.check()?;
            match (side, &c.kind) {
                (0, CompletionKind::Write) => writes += 1,
                (1, CompletionKind::RemoteWrite { imm }) => {
                    if let Some(n) = seen.get_mut(*imm as usize) {
                        *n += 1;
                    }
                    imms += 1;
                }
                (s, k) => {
                    return Err(Error::InvalidArgument(format!(
                        "unexpected completion {k:?} on side {s}"
                    )))
                }
            }
            Ok(())
        })?;
        if progressed {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > STALL {
            return Err(Error::Timeout {
                what: format!("completions ({writes} writes, {imms} immediates done)"),
                after: STALL,
            });
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = args.size as u64 * args.iters as u64;
    println!(
        "{} x {} B WRITE with immediate: {} bytes in {:.3} s = {:.2} Gbit/s",
        args.iters,
        args.size,
        bytes,
        secs,
        bytes as f64 * 8.0 / secs / 1e9
    );
    let once = seen.iter().all(|&n| n == 1);
    let same = dst.memory().host().map(|h| h.to_vec()).as_deref() == Some(&pattern[..]);
    println!(
        "verify: {} (every immediate exactly once: {once}, bytes match: {same})",
        if once && same { "OK" } else { "FAILED" }
    );
    Ok(once && same)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("write_imm: {e}");
            ExitCode::FAILURE
        }
    }
}
