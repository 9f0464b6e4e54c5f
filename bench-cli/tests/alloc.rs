//! Zero allocations per operation in steady state, shown by a counting global allocator:
//! through the trait alone, and through rdma-bench's own write engine with every knob
//! combination of the ladder (libfabric shm).
#![cfg(feature = "efa")]

use std::alloc::System;
use std::time::{Duration, Instant};

use bench_core::config::{Knobs, Threads};
use bench_core::ctrl::Liveness;
use bench_core::proto::NicStats;
use bench_core::workload::delivery::{Acks, Clock, Delivered};
use bench_core::workload::write::{WriteActive, WriteParts};
use bench_core::workload::{drive, NicWork, Polled, RunCtx, Shared};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use transport_core::{
    Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, PeerId,
    Post, RemoteSlice, Transport,
};
use transport_efa::{Endpoint, Mr};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The write engine on one side, with the target polled in the same thread (progress is
/// manual and this test has one thread): it counts the immediates and, after a phase's last
/// one, lands its region and acknowledges, as rdma-bench's target does.
struct WithTarget<'a, W> {
    inner: W,
    target: &'a mut Endpoint,
    dst: &'a Mr,
    to_a: PeerId,
    ack_to: RemoteSlice<u64>,
    acks: Acks,
    tbuf: Vec<Completion>,
    /// Immediates of this phase, and of every phase.
    phase_imms: u64,
    imms: u64,
}

impl<W: NicWork> NicWork for WithTarget<'_, W> {
    fn start_phase(&mut self, iters: u64) {
        self.inner.start_phase(iters);
        self.phase_imms = 0;
        self.acks = Acks::new(0, iters);
    }
    fn post(&mut self, max: usize) -> bench_core::error::Result<usize> {
        self.inner.post(max)
    }
    fn poll(&mut self, buf: &mut [Completion]) -> bench_core::error::Result<Polled> {
        let p = self.inner.poll(buf)?;
        let n = self.target.poll(&mut self.tbuf).expect("target poll");
        for c in &self.tbuf[..n] {
            match c.kind {
                CompletionKind::RemoteWrite { .. } => {
                    self.phase_imms += 1;
                    self.imms += 1;
                }
                CompletionKind::Write => self.acks.inflight -= 1,
                _ => panic!("{c:?}"),
            }
        }
        self.acks.step(
            self.phase_imms,
            self.target,
            self.dst,
            self.to_a,
            self.dst,
            self.ack_to,
            0,
        )?;
        Ok(p)
    }
    fn finished(&self) -> bool {
        self.inner.finished()
    }
    fn delivered(&self) -> Option<Delivered> {
        self.inner.delivered()
    }
    fn nic(&self) -> usize {
        self.inner.nic()
    }
    fn stats(&self, clock: Clock) -> NicStats {
        self.inner.stats(clock)
    }
}

fn open() -> Endpoint {
    Endpoint::open(&NicDesc::provider("shm")).expect("opening a shm endpoint")
}

#[test]
fn steady_state_allocates_nothing() {
    let (mut a, mut b) = (open(), open());
    let (addr_a, addr_b) = (a.address(), b.address());
    let peer = a.add_peer(&addr_b).unwrap();
    let to_a = b.add_peer(&addr_a).unwrap();
    const PAGES: usize = 64;
    const PS: usize = 4096;
    let mut src = a
        .register(Memory::Host(HostBuffer::new(PAGES * PS)))
        .unwrap();
    let dst = b
        .register(Memory::Host(HostBuffer::new(PAGES * PS)))
        .unwrap();
    let remote = a.import(peer, &dst.remote()).unwrap();
    // Where the target's acknowledgements land on the initiator's side.
    let acks_a = a.register(Memory::Host(HostBuffer::new(64))).unwrap();
    let ack_to = b
        .import(to_a, &acks_a.remote())
        .unwrap()
        .slice(0, 8)
        .unwrap();

    // 1. The trait alone: post a WRITE with immediate, poll both sides until both completions.
    {
        let mut buf = vec![Completion::default(); 16];
        let local = LocalSlice::new(&src, 0, 8).unwrap();
        let rs = remote.slice(0, 8).unwrap();
        let mut one = |a: &mut Endpoint, b: &mut Endpoint, i: u64| {
            let t = Instant::now();
            // A full queue is an outcome: poll both sides, then post again.
            while a.post_write(peer, local, rs, Some(i as u32), i).unwrap() == Post::QueueFull {
                a.poll(&mut buf).unwrap();
                b.poll(&mut buf).unwrap();
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "queue stays full at op {i}"
                );
            }
            let (mut w, mut r) = (false, false);
            while !(w && r) {
                let n = a.poll(&mut buf).unwrap();
                w |= buf[..n].iter().any(|c| c.kind == CompletionKind::Write);
                let n = b.poll(&mut buf).unwrap();
                r |= buf[..n]
                    .iter()
                    .any(|c| matches!(c.kind, CompletionKind::RemoteWrite { .. }));
                assert!(t.elapsed() < Duration::from_secs(10), "no completion");
            }
        };
        for i in 0..1000 {
            one(&mut a, &mut b, i);
        }
        let reg = Region::new(GLOBAL);
        for i in 0..10_000 {
            one(&mut a, &mut b, i);
        }
        let st = reg.change();
        assert_eq!(
            (st.allocations, st.reallocations),
            (0, 0),
            "the trait's post/poll path allocated: {st:?}"
        );
    }

    // 2. rdma-bench's write engine, each ladder combination that runs on one thread.
    let live = Liveness::default();
    let ctx = RunCtx::new(&live, Duration::from_secs(10), 1);
    let mut buf = vec![Completion::default(); 64];
    let tx = a.caps().tx_depth;
    for knobs in [
        Knobs::baseline(),
        Knobs {
            sharded: true,
            ..Knobs::baseline()
        },
        Knobs {
            sharded: true,
            batch: 16,
            ..Knobs::baseline()
        },
        Knobs {
            sharded: true,
            batch: 16,
            lazy: true,
            threads: Threads::PerGpu,
            ..Knobs::baseline()
        },
        Knobs {
            sharded: false,
            batch: 16,
            lazy: true,
            ..Knobs::baseline()
        },
    ] {
        let parts = WriteParts {
            nic: 0,
            ep: &mut a,
            src: &mut src,
            peer,
            remote,
            slots: (0..PAGES as u32).rev().collect(),
            ver: bench_core::buffers::Versions::new(PS, PAGES as u64, false),
            page_size: PS,
            max_inflight: tx,
            batch: knobs.batch as usize,
        };
        let mut w = [WithTarget {
            inner: WriteActive::new(parts),
            target: &mut b,
            dst: &dst,
            to_a,
            ack_to,
            acks: Acks::new(0, 0),
            tbuf: vec![Completion::default(); 64],
            phase_imms: 0,
            imms: 0,
        }];
        let per_rep = PAGES as u64;
        let warm = Shared::default();
        drive(&mut w, &knobs, 3, &ctx, &warm, 3 * per_rep, &mut buf).unwrap();
        let shared = Shared::default();
        let reg = Region::new(GLOBAL);
        let local = drive(&mut w, &knobs, 50, &ctx, &shared, 50 * per_rep, &mut buf).unwrap();
        let st = reg.change();
        assert_eq!(
            (st.allocations, st.reallocations),
            (0, 0),
            "the write engine allocated with {knobs:?}: {st:?}"
        );
        let ops = if knobs.sharded {
            local.completed
        } else {
            shared.completed.load(std::sync::atomic::Ordering::Relaxed)
        };
        assert_eq!(ops, 50 * per_rep);
        // Every phase ends at the target's acknowledgement, so every immediate arrived.
        assert_eq!(w[0].imms, 53, "immediates");
        assert!(
            w[0].delivered().is_some(),
            "the phase ended without delivery"
        );
    }
}
