//! The proxy's cases, generic over the transport: a CPU producer writes commands into one
//! endpoint's ring; that endpoint's proxy posts them; the other endpoint's proxy counts the
//! immediates; the producer waits for the arrivals, then every byte is checked.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use transport_core::{HostBuffer, Memory, MemoryRegion, PeerId, Transport};
use transport_proxy::ring::{ERR_BAD_COMMAND, ERR_COMPLETION};
use transport_proxy::{
    immediate, pack, Command, Proxy, ProxyError, ProxyPeer, ProxyStats, RingError, RingLayout,
    RingMemory,
};

pub const WAIT: Duration = Duration::from_secs(30);

/// What one run of [`writes_land`] does.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// WRITEs with immediate.
    pub n: usize,
    /// Their sizes, in turn.
    pub sizes: &'static [usize],
    /// The sender's ring capacity (below `n`: producers wait for room, the ring wraps).
    pub capacity: u32,
    /// A fence after every this many WRITEs (0: none).
    pub fence_every: usize,
    /// CPU producer threads, pushing concurrently.
    pub producers: usize,
    /// The most WRITEs per `post_writes`.
    pub batch: usize,
    /// Data, fence, flag: every WRITE but the last carries no immediate, a fence goes before
    /// the last, and the waiter waits for that one arrival only. Sound only where a local
    /// completion means delivered (delivery complete); one producer.
    pub flag: bool,
    /// Commands written before the proxies start (at most the capacity): a first batch
    /// that is sure to be this big, so a small queue is sure to fill.
    pub prefill: usize,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            n: 600,
            sizes: &[8, 1, 4096, 65536, 100, 3000, 16384, 64],
            capacity: 64,
            fence_every: 0,
            producers: 2,
            batch: 32,
            flag: false,
            prefill: 0,
        }
    }
}

/// The byte at `offset` of run `seed`'s source: differs between neighbours, runs and laps.
pub fn pattern(seed: u64, offset: usize) -> u8 {
    let x = (offset as u64 ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 | 1 // never 0: a byte left zero is a byte not written
}

fn ranges(spec: &Spec) -> (Vec<(usize, usize)>, usize) {
    let mut off = 0;
    let r = (0..spec.n)
        .map(|i| {
            let len = spec.sizes[i % spec.sizes.len()];
            let at = off;
            off += len;
            (at, len)
        })
        .collect();
    (r, off)
}

/// Where the first wrong byte is, if any (`expect`: the pattern, precomputed, so the check
/// is a memory compare, quick enough to catch bytes that show up late).
pub fn first_wrong(
    dst: &[u8],
    expect: &[u8],
    seed: u64,
    ranges: &[(usize, usize)],
) -> Option<String> {
    if dst == expect {
        return None;
    }
    // What it was when compared: a late byte may land while we search.
    let dst = dst.to_vec();
    for (i, &(at, len)) in ranges.iter().enumerate() {
        for (o, &got) in dst.iter().enumerate().skip(at).take(len) {
            if got != pattern(seed, o) {
                return Some(format!(
                    "WRITE {i} ({len} B at {at}): byte {o} is {got:#x}, expected {:#x}",
                    pattern(seed, o)
                ));
            }
        }
    }
    Some("the buffers differ outside every WRITE's range".into())
}

/// What a run saw.
#[derive(Debug)]
pub struct Outcome {
    pub sender: ProxyStats,
    pub receiver: ProxyStats,
    pub arrivals: u64,
    pub done: u64,
}

/// `spec.n` WRITEs with immediates from `a` to `b` through the ring, fences where asked; the
/// producers wait for `b`'s arrivals (never `a`'s local completions), then every byte is
/// verified.
pub fn writes_land<T: Transport>(
    mut a: T,
    mut b: T,
    a_to_b: PeerId,
    spec: Spec,
    seed: u64,
) -> Result<Outcome, String> {
    let (ranges, total) = ranges(&spec);
    let src_bytes: Vec<u8> = (0..total).map(|o| pattern(seed, o)).collect();
    let src = a
        .register(Memory::Host(HostBuffer::from_slice(&src_bytes)))
        .map_err(|e| e.to_string())?;
    let dst = b
        .register(Memory::Host(HostBuffer::new(total)))
        .map_err(|e| e.to_string())?;
    let remote = a.import(a_to_b, &dst.remote()).map_err(|e| e.to_string())?;
    // Where the landed bytes are, as a waiter (a kernel) reads them: through a pointer.
    let dst_ptr = dst.memory().host().expect("host").as_ptr() as usize;
    let ring_a = RingMemory::new(RingLayout::new(spec.capacity, 1).unwrap());
    let ring_b = RingMemory::new(RingLayout::new(2, 1).unwrap());
    let proxy_a = Proxy::<T>::new(
        ring_a.ring(),
        vec![src],
        vec![ProxyPeer {
            id: a_to_b,
            regions: vec![remote],
        }],
    )
    .max_batch(spec.batch);
    let proxy_b = Proxy::<T>::new(ring_b.ring(), vec![dst], vec![]).landing(vec![0]);
    let (stop_a, stop_b) = (&AtomicBool::new(false), &AtomicBool::new(false));
    let fences = if spec.flag {
        1
    } else {
        spec.n.checked_div(spec.fence_every).unwrap_or(0)
    };
    let expect_arrivals = if spec.flag { 1 } else { spec.n as u64 };
    let prefill = spec.prefill.min(spec.capacity as usize).min(spec.n);
    for (i, &(at, len)) in ranges.iter().enumerate().take(prefill) {
        let imm = Some(immediate(0, i as u16));
        let (l, r) = (pack(0, at as u64), pack(0, at as u64));
        ring_a
            .ring()
            .push(&Command::write(0, l, r, len as u32, imm))
            .map_err(|e| e.to_string())?;
    }
    thread::scope(|s| {
        let pa = s.spawn(move || (proxy_a.run(&mut a, stop_a), proxy_a, a));
        let pb = s.spawn(move || (proxy_b.run(&mut b, stop_b), proxy_b, b));
        let produced = produce(&ring_a, &ring_b, &spec, &ranges, fences, prefill);
        let checked = produced.and_then(|()| {
            // SAFETY: the region is alive (proxy b owns it until joined below) and `total`
            // long; every WRITE into it was counted, so nothing writes it any more.
            let dst = unsafe { std::slice::from_raw_parts(dst_ptr as *const u8, total) };
            match first_wrong(dst, &src_bytes, seed, &ranges) {
                Some(w) => Err(format!("arrivals said all {} landed, but {w}", spec.n)),
                None => Ok(()),
            }
        });
        stop_a.store(true, Ordering::Relaxed);
        stop_b.store(true, Ordering::Relaxed);
        let (ra, pxa, ea) = pa.join().expect("proxy a panicked");
        let (rb, pxb, eb) = pb.join().expect("proxy b panicked");
        // Regions go before their endpoints.
        drop((pxa, pxb));
        drop((ea, eb));
        checked?;
        let (sender, receiver) = (
            ra.map_err(|e| format!("sender's proxy: {e}"))?,
            rb.map_err(|e| format!("receiver's proxy: {e}"))?,
        );
        let arrivals = ring_b.ring().arrivals(0).unwrap().load(Ordering::Acquire);
        let done = ring_a.ring().done().load(Ordering::Acquire);
        if arrivals != expect_arrivals {
            return Err(format!("{arrivals} arrivals for {} WRITEs", spec.n));
        }
        if done != (spec.n + fences) as u64 || sender.writes != spec.n as u64 {
            return Err(format!(
                "done {done}, writes posted {}, for {} WRITEs and {fences} fences",
                sender.writes, spec.n
            ));
        }
        Ok(Outcome {
            sender,
            receiver,
            arrivals,
            done,
        })
    })
}

fn produce(
    ring_a: &RingMemory,
    ring_b: &RingMemory,
    spec: &Spec,
    ranges: &[(usize, usize)],
    fences: usize,
    skip: usize,
) -> Result<(), String> {
    let ring = ring_a.ring();
    thread::scope(|s| {
        let workers: Vec<_> = (0..spec.producers)
            .map(|p| {
                s.spawn(move || -> Result<(), RingError> {
                    for (i, &(at, len)) in ranges.iter().enumerate() {
                        if i < skip || i % spec.producers != p {
                            continue;
                        }
                        let (l, r) = (pack(0, at as u64), pack(0, at as u64));
                        let last = i + 1 == ranges.len();
                        let imm = (!spec.flag || last).then_some(immediate(0, i as u16));
                        if spec.flag && last {
                            ring.push(&Command::fence())?;
                        }
                        ring.push(&Command::write(0, l, r, len as u32, imm))?;
                        if spec.fence_every > 0 && (i + 1) % spec.fence_every == 0 {
                            ring.push(&Command::fence())?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .expect("producer panicked")
                .map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    })?;
    // Landed at the peer: told by the peer's counted immediates only.
    let arrivals = if spec.flag { 1 } else { spec.n as u64 };
    ring_b
        .ring()
        .wait_arrivals(0, arrivals, WAIT)
        .map_err(|e| e.to_string())?;
    ring.wait_done((spec.n + fences) as u64, WAIT)
        .map_err(|e| e.to_string())
}

/// A command naming a peer the proxy lacks: the proxy stops with `BadCommand`, the error word
/// says so, and a producer waiting on the ring is told instead of hanging.
pub fn bad_command_stops_cleanly<T: Transport>(mut a: T, a_to_b: PeerId) -> Result<(), String> {
    let src = a
        .register(Memory::Host(HostBuffer::new(64)))
        .map_err(|e| e.to_string())?;
    let ring = RingMemory::new(RingLayout::new(4, 1).unwrap());
    let proxy = Proxy::<T>::new(
        ring.ring(),
        vec![src],
        vec![ProxyPeer {
            id: a_to_b,
            regions: vec![],
        }],
    );
    let stop = &AtomicBool::new(false);
    thread::scope(|s| {
        let h = s.spawn(move || {
            let r = proxy.run(&mut a, stop);
            drop(proxy); // regions before their endpoint
            r
        });
        let r = ring.ring();
        r.push(&Command::write(0, pack(0, 0), pack(3, 0), 8, Some(1)))
            .map_err(|e| e.to_string())?;
        let waited = r.wait_done(1, WAIT);
        // The producer may still be pushing: it must be refused, not left spinning.
        let mut pushes = Ok(0);
        for _ in 0..8 {
            pushes = r.push(&Command::fence());
            if pushes.is_err() {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let out = h.join().expect("proxy panicked");
        match (&out, waited, pushes, r.error()) {
            (
                Err(ProxyError::BadCommand { pos: 0, .. }),
                Err(RingError::ProxyGone(ERR_BAD_COMMAND)),
                Err(RingError::ProxyGone(ERR_BAD_COMMAND)),
                ERR_BAD_COMMAND,
            ) => Ok(()),
            (o, w, p, e) => Err(format!(
                "expected BadCommand everywhere: proxy {o:?}, wait {w:?}, push {p:?}, word {e}"
            )),
        }
    })
}

/// A WRITE to a region the peer does not have fails; the proxy stops with `Completion`, the
/// error word says so and the waiter is told. (Where the backend reports remote errors.)
pub fn error_completion_sets_the_error_word<T: Transport>(
    mut a: T,
    mut b: T,
    a_to_b: PeerId,
) -> Result<(), String> {
    let src = a
        .register(Memory::Host(HostBuffer::new(4096)))
        .map_err(|e| e.to_string())?;
    let dst = b
        .register(Memory::Host(HostBuffer::new(4096)))
        .map_err(|e| e.to_string())?;
    let remote = a.import(a_to_b, &dst.remote()).map_err(|e| e.to_string())?;
    let mem = b.deregister(dst).map_err(|e| e.to_string())?;
    let ring_a = RingMemory::new(RingLayout::new(8, 1).unwrap());
    let ring_b = RingMemory::new(RingLayout::new(2, 1).unwrap());
    let proxy_a = Proxy::<T>::new(
        ring_a.ring(),
        vec![src],
        vec![ProxyPeer {
            id: a_to_b,
            regions: vec![remote],
        }],
    );
    let proxy_b = Proxy::<T>::new(ring_b.ring(), vec![], vec![]);
    let (stop_a, stop_b) = (&AtomicBool::new(false), &AtomicBool::new(false));
    let r = thread::scope(|s| {
        let pa = s.spawn(move || {
            let r = proxy_a.run(&mut a, stop_a);
            drop(proxy_a); // regions before their endpoint
            r
        });
        let pb = s.spawn(move || proxy_b.run(&mut b, stop_b));
        let r = ring_a.ring();
        let pushed = r.push(&Command::write(0, pack(0, 0), pack(0, 0), 4096, Some(1)));
        let waited = r.wait_done(1, WAIT);
        stop_a.store(true, Ordering::Relaxed);
        stop_b.store(true, Ordering::Relaxed);
        let out = pa.join().expect("proxy a panicked");
        let _ = pb.join().expect("proxy b panicked");
        match (pushed, &out, waited, r.error()) {
            (
                Ok(0),
                Err(ProxyError::Completion { pos: 0, .. }),
                Err(RingError::ProxyGone(ERR_COMPLETION)),
                ERR_COMPLETION,
            ) => Ok(()),
            (p, o, w, e) => Err(format!(
                "expected a Completion error: push {p:?}, proxy {o:?}, wait {w:?}, word {e}"
            )),
        }
    });
    drop(mem);
    r
}
