//! The proxy over an in-process fabric that reorders deliveries, completes WRITEs locally
//! before they land, fills its queue, and (where asked) holds a landing region's bytes back
//! until `make_gpu_visible`, as GPUDirect RDMA writes are held from a kernel until the flush.

mod common;

use common::cases::{self, Spec};
use common::mock::{Behaviour, Fabric, MockEp};
use transport_core::{PeerId, Transport};

fn pair(b: Behaviour, seed: u64) -> (Fabric, MockEp, MockEp, PeerId) {
    let f = Fabric::new(b, seed);
    let (mut a, mut e) = (f.endpoint(), f.endpoint());
    let a_to_b = a.add_peer(&e.address()).unwrap();
    e.add_peer(&a.address()).unwrap();
    (f, a, e, a_to_b)
}

#[test]
fn reordered_writes_land_and_every_byte_is_there() {
    for seed in 1..4 {
        let (_f, a, b, p) = pair(Behaviour::default(), seed);
        let spec = Spec {
            prefill: 40, // a first batch of 32 on a queue of 16
            ..Spec::default()
        };
        let out = cases::writes_land(a, b, p, spec, seed).unwrap();
        assert!(out.sender.queue_full > 0, "the queue never filled: {out:?}");
    }
}

#[test]
fn a_full_queue_is_retried_never_dropped() {
    let b = Behaviour {
        depth: 3,
        ..Behaviour::default()
    };
    let (_f, a, e, p) = pair(b, 7);
    let spec = Spec {
        n: 2000,
        sizes: &[8, 64, 512],
        capacity: 16,
        batch: 64,
        prefill: 16, // a first batch of 16 on a queue of 3
        ..Spec::default()
    };
    let out = cases::writes_land(a, e, p, spec, 7).unwrap();
    assert!(out.sender.queue_full > 0, "{out:?}");
}

#[test]
fn fences_pass_only_after_everything_before_them() {
    // Delivery completion (a local completion means landed): data, fence, flag.
    let b = Behaviour {
        early_local: false,
        ..Behaviour::default()
    };
    let (_f, a, e, p) = pair(b, 11);
    let spec = Spec {
        fence_every: 5,
        producers: 1,
        ..Spec::default()
    };
    let out = cases::writes_land(a, e, p, spec, 11).unwrap();
    assert_eq!(out.sender.fences, 120, "{out:?}");
}

#[test]
fn data_fence_flag_the_flag_lands_after_the_data() {
    // Delivery completion, out of order: without the fence the flag would often land first.
    let b = Behaviour {
        early_local: false,
        ..Behaviour::default()
    };
    for seed in 1..6 {
        let (f, a, e, p) = pair(b, 100 + seed);
        let spec = Spec {
            n: 200,
            producers: 1,
            flag: true,
            ..Spec::default()
        };
        let out = cases::writes_land(a, e, p, spec, seed).unwrap();
        assert_eq!((out.sender.fences, out.arrivals), (1, 1), "{out:?}");
        // The flag went out with nothing before it in flight.
        assert_eq!(f.in_flight_at_imm(), [0]);
    }
}

#[test]
fn arrivals_are_published_after_make_gpu_visible() {
    // The landing region's bytes stay invisible until make_gpu_visible: a waiter told of an
    // arrival before the proxy called it would find bytes missing.
    let b = Behaviour {
        staged_landing: true,
        ..Behaviour::default()
    };
    let (f, a, e, p) = pair(b, 13);
    cases::writes_land(a, e, p, Spec::default(), 13).unwrap();
    assert!(f.gpu_visible_calls() > 0);
}

#[test]
fn a_bad_command_stops_the_proxy_and_tells_the_producer() {
    let (_f, a, _e, p) = pair(Behaviour::default(), 17);
    cases::bad_command_stops_cleanly(a, p).unwrap();
}

#[test]
fn an_error_completion_sets_the_error_word() {
    let (_f, a, e, p) = pair(Behaviour::default(), 19);
    cases::error_completion_sets_the_error_word(a, e, p).unwrap();
}

/// A peer that stopped polling (nothing lands or completes), the queue full and commands
/// waiting in the ring: asked to stop, the proxy waits its grace for the WRITEs in flight
/// and returns (it spun for ever: waiting commands counted as work), and the producer still
/// pushing is refused.
#[test]
fn a_stopped_proxy_facing_a_stalled_peer_returns() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    use transport_core::{HostBuffer, Memory, MemoryRegion};
    use transport_proxy::{pack, Command, Proxy, ProxyError, ProxyPeer, RingLayout, RingMemory};

    let b = Behaviour {
        depth: 4,
        stalled: true,
        ..Behaviour::default()
    };
    let (_f, mut a, mut e, p) = pair(b, 5);
    let src = a.register(Memory::Host(HostBuffer::new(64))).unwrap();
    let dst = e.register(Memory::Host(HostBuffer::new(64))).unwrap();
    let remote = a.import(p, &dst.remote()).unwrap();
    // 'static, so that a proxy that never returns can be left behind by a failing test.
    let ring: &'static RingMemory =
        Box::leak(Box::new(RingMemory::new(RingLayout::new(8, 1).unwrap())));
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let proxy = Proxy::<MockEp>::new(
        ring.ring(),
        vec![src],
        vec![ProxyPeer {
            id: p,
            regions: vec![remote],
        }],
    )
    .stop_grace(Duration::from_millis(100));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = proxy.run(&mut a, stop);
        let _ = tx.send(r);
        drop(proxy);
        drop(a);
    });
    // 4 in flight, 8 waiting in the ring.
    for i in 0..12u64 {
        ring.ring()
            .push(&Command::write(
                0,
                pack(0, 0),
                pack(0, 0),
                8,
                Some(i as u32),
            ))
            .unwrap();
    }
    let t = Instant::now();
    stop.store(true, Ordering::Relaxed);
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Err(ProxyError::StoppedInFlight { in_flight: 4, .. })) => {}
        Ok(other) => panic!("expected StoppedInFlight with 4 WRITEs: {other:?}"),
        Err(_) => panic!("the stopped proxy did not return in 10 s"),
    }
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    let pushed = ring.ring().push(&Command::fence());
    assert!(
        pushed.is_err(),
        "a producer is told the proxy is gone: {pushed:?}"
    );
    drop(dst);
}
