//! The proxy over libfabric's `shm` provider: a CPU producer's commands, posted by the proxy,
//! counted at the receiver by immediates, every byte verified.

mod common;
#[path = "common/crash.rs"]
mod crash;

use common::cases::{self, Spec};
use transport_conformance::Pair;
use transport_core::{NicDesc, Result, Transport};
use transport_efa::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    crash::install();
    let mut nic = NicDesc::provider("shm");
    // PROXY_SHM_HMEM=on: ask FI_HMEM, as a host with a GPU does under hmem=auto (shm then
    // turns CMA off and copies WRITEs above 4 KiB through its SAR buffers, one per peer at a
    // time: the GPU host's protocol, here without a GPU; libfabric 2.x).
    if let Ok(h) = std::env::var("PROXY_SHM_HMEM") {
        nic = nic.with_option("hmem", &h);
    }
    Endpoint::open(&nic)
}

fn pair() -> Option<Pair<Endpoint>> {
    transport_conformance::connect(&open).expect("connecting the shm pair")
}

#[test]
fn writes_land_and_every_byte_is_there() {
    let Some(p) = pair() else { return };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, Spec::default(), 1).unwrap();
    assert_eq!(out.receiver.arrivals, 600, "{out:?}");
}

#[test]
fn fences_between_writes() {
    let Some(p) = pair() else { return };
    let spec = Spec {
        fence_every: 7,
        ..Spec::default()
    };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, spec, 2).unwrap();
    assert_eq!(out.sender.fences, 600 / 7, "{out:?}");
}

#[test]
fn a_bad_command_stops_the_proxy_and_tells_the_producer() {
    let Some(p) = pair() else { return };
    cases::bad_command_stops_cleanly(p.a, p.a_to_b).unwrap();
}

/// gpu_proxy.rs's `kernel_writes_over_shm_every_byte_verified`, host memory, 64 KiB, on the
/// CPU (the shape that died of SIGSEGV on the GPU host): a 64-slot ring filled exactly by 64
/// commands (7..71 onto pages `i % 64` of a 4 MiB region), the producer waits for `done` at
/// `a` and the arrivals at `b`, the proxies stop, every byte is checked, and the endpoints
/// are dropped before their regions (as that test's `Pair` does). `PROXY_FULL_RING_RUNS`
/// times (default 4), the 4 KiB case (256 WRITEs) and this one in turn.
#[test]
fn a_ring_exactly_full_of_64k_writes_then_endpoints_before_regions() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use transport_core::{HostBuffer, Memory, MemoryRegion};
    use transport_proxy::{immediate, pack, Command, Proxy, ProxyPeer, RingLayout, RingMemory};
    let runs: usize = std::env::var("PROXY_FULL_RING_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let first = 7u64;
    let byte = |i: u64, j: usize| (i as usize * 131 + j * 7 + (j >> 8) + 0x5a) as u8;
    // As that test: the 4 KiB case (256 through the 64 slots) first, in the same process.
    let cases = [(4096usize, 256u64), (64 << 10, 64)];
    for run in 0..runs {
        let (len, count) = cases[run % 2];
        let Some(p) = pair() else { return };
        let (mut a, mut b, to_b) = (p.a, p.b, p.a_to_b);
        let mut src_bytes = vec![0u8; len * count as usize];
        for i in first..first + count {
            let page = (i % count) as usize * len;
            for j in 0..len {
                src_bytes[page + j] = byte(i, j);
            }
        }
        let src = a
            .register(Memory::Host(HostBuffer::from_slice(&src_bytes)))
            .unwrap();
        let dst = b
            .register(Memory::Host(HostBuffer::new(len * count as usize)))
            .unwrap();
        let remote = a.import(to_b, &dst.remote()).unwrap();
        let ring_a = RingMemory::new(RingLayout::new(64, 1).unwrap());
        let ring_b = RingMemory::new(RingLayout::new(2, 1).unwrap());
        let stop = &AtomicBool::new(false);
        // Stops the proxies however the body ends (a failed wait included), so the scope's
        // join does not hang.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let (a, b, src, dst) = std::thread::scope(|s| {
            let _stop = StopOnDrop(stop);
            let (ra, rb) = (ring_a.ring(), ring_b.ring());
            let ha = s.spawn(move || {
                let peers = vec![ProxyPeer {
                    id: to_b,
                    regions: vec![remote],
                }];
                let proxy = Proxy::<Endpoint>::new(ra, vec![src], peers);
                let r = proxy.run(&mut a, stop);
                (a, proxy.into_regions().pop().unwrap(), r)
            });
            let hb = s.spawn(move || {
                let proxy = Proxy::<Endpoint>::new(rb, vec![dst], vec![]).landing(vec![0]);
                let r = proxy.run(&mut b, stop);
                (b, proxy.into_regions().pop().unwrap(), r)
            });
            for i in first..first + count {
                let at = (i % count) * len as u64;
                let cmd = Command::write(
                    0,
                    pack(0, at),
                    pack(0, at),
                    len as u32,
                    Some(immediate(0, i as u16)),
                );
                ring_a.ring().push(&cmd).unwrap();
            }
            let wait = Duration::from_secs(10);
            ring_a.ring().wait_done(count, wait).unwrap();
            ring_b.ring().wait_arrivals(0, count, wait).unwrap();
            stop.store(true, Ordering::Relaxed);
            let (a, src, sa) = ha.join().unwrap();
            let (b, dst, sb) = hb.join().unwrap();
            let (sa, sb) = (sa.unwrap(), sb.unwrap());
            assert_eq!((sa.writes, sb.arrivals), (count, count), "run {run}");
            (a, b, src, dst)
        });
        let got = dst.memory().host().unwrap().to_vec();
        assert!(got[..] == src_bytes[..], "run {run}: the target differs");
        // As gpu_proxy.rs's Pair drops: endpoints first, then the regions.
        drop((a, b));
        drop((src, dst));
    }
}
