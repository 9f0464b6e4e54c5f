//! The hot path on libfabric shm: post + poll per operation through the `Transport` trait,
//! and through rdma-bench's write engine (the knobs' cost), per operation.
//!
//! `cargo bench -p bench-cli --bench hot_path`
//!
//! The trait next to bare libfabric calls (`fi_writemsg`/`fi_cq_read` with the same flags)
//! is `cargo bench -p transport-efa --bench hot_path`: raw handles and `unsafe` stay in the
//! backend crate. Zero allocations per operation in steady state is checked by
//! `tests/alloc.rs` (a counting global allocator).

#[cfg(feature = "efa")]
mod shm {
    use std::time::Duration;

    use bench_core::config::Knobs;
    use bench_core::ctrl::Liveness;
    use bench_core::workload::delivery::{Acks, Clock, Delivered};
    use bench_core::workload::write::{WriteActive, WriteParts};
    use bench_core::workload::{drive, NicWork, Polled, RunCtx, Shared};
    use criterion::{Criterion, Throughput};
    use transport_core::{
        Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, PeerId,
        Post, RemoteSlice, Transport, WriteOp,
    };
    use transport_efa::{Endpoint, Mr};

    fn open() -> Endpoint {
        Endpoint::open(&NicDesc::provider("shm")).expect("opening a shm endpoint")
    }

    /// Poll `a` until `writes` local completions and `b` until `imms` immediates arrived.
    fn wait(
        a: &mut Endpoint,
        b: &mut Endpoint,
        buf: &mut [Completion],
        writes: usize,
        imms: usize,
    ) {
        let (mut w, mut r) = (0, 0);
        while w < writes || r < imms {
            let n = a.poll(buf).expect("poll");
            w += buf[..n]
                .iter()
                .filter(|c| c.kind == CompletionKind::Write)
                .count();
            let n = b.poll(buf).expect("poll");
            r += buf[..n]
                .iter()
                .filter(|c| matches!(c.kind, CompletionKind::RemoteWrite { .. }))
                .count();
        }
    }

    /// The engine with its target polled in the same thread; the target acknowledges each
    /// phase as rdma-bench's does (one more WRITE per phase, which the engine waits for).
    struct WithTarget<'a, W> {
        inner: W,
        target: &'a mut Endpoint,
        dst: &'a Mr,
        to_a: PeerId,
        ack_to: RemoteSlice<u64>,
        acks: Acks,
        imms: u64,
        tbuf: Vec<Completion>,
    }

    impl<W: NicWork> NicWork for WithTarget<'_, W> {
        fn start_phase(&mut self, iters: u64) {
            self.inner.start_phase(iters);
            self.imms = 0;
            self.acks = Acks::new(0, iters);
        }
        fn post(&mut self, max: usize) -> bench_core::error::Result<usize> {
            self.inner.post(max)
        }
        fn poll(&mut self, buf: &mut [Completion]) -> bench_core::error::Result<Polled> {
            let p = self.inner.poll(buf)?;
            let n = self.target.poll(&mut self.tbuf).expect("poll");
            for c in &self.tbuf[..n] {
                match c.kind {
                    CompletionKind::Write => self.acks.inflight -= 1,
                    _ => self.imms += 1,
                }
            }
            self.acks.step(
                self.imms,
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
        fn stats(&self, clock: Clock) -> bench_core::proto::NicStats {
            self.inner.stats(clock)
        }
    }

    pub fn benches(c: &mut Criterion) {
        let (mut a, mut b) = (open(), open());
        let (addr_a, addr_b) = (a.address(), b.address());
        let peer = a.add_peer(&addr_b).expect("add_peer");
        let to_a = b.add_peer(&addr_a).expect("add_peer");
        const PAGES: usize = 256;
        const PS: usize = 64;
        let mut src = a
            .register(Memory::Host(HostBuffer::new(PAGES * PS)))
            .expect("register");
        let dst = b
            .register(Memory::Host(HostBuffer::new(PAGES * PS)))
            .expect("register");
        let remote = a.import(peer, &dst.remote()).expect("import");
        let acks_a = a
            .register(Memory::Host(HostBuffer::new(64)))
            .expect("register");
        let ack_to = b
            .import(to_a, &acks_a.remote())
            .expect("import")
            .slice(0, 8)
            .expect("slice");
        let mut buf = vec![Completion::default(); 64];

        let mut g = c.benchmark_group("shm_hot_path");
        g.measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));

        g.throughput(Throughput::Elements(1));
        g.bench_function("trait_poll_empty", |bn| {
            bn.iter(|| a.poll(&mut buf).expect("poll"))
        });

        {
            let local = LocalSlice::new(&src, 0, 8).expect("slice");
            let rs = remote.slice(0, 8).expect("slice");
            g.bench_function("trait_write_imm_8B_post_poll_both", |bn| {
                bn.iter(|| {
                    while a.post_write(peer, local, rs, Some(1), 1).expect("post")
                        == Post::QueueFull
                    {
                        let _ = a.poll(&mut buf);
                        let _ = b.poll(&mut buf);
                    }
                    wait(&mut a, &mut b, &mut buf, 1, 1);
                })
            });
        }

        {
            const BATCH: usize = 32;
            let ops: Vec<WriteOp<'_, _, _>> = (0..BATCH)
                .map(|i| WriteOp {
                    peer,
                    local: LocalSlice::new(&src, i * PS, PS).expect("slice"),
                    remote: remote.slice((i * PS) as u64, PS as u64).expect("slice"),
                    imm: None,
                    ctx: i as u64,
                })
                .collect();
            g.throughput(Throughput::Elements(BATCH as u64));
            g.bench_function("trait_post_writes_64B_batch32", |bn| {
                bn.iter(|| {
                    let (mut done, mut w) = (0, 0);
                    while done < BATCH || w < BATCH {
                        if done < BATCH {
                            done += a.post_writes(&ops[done..]).expect("post_writes");
                        }
                        // Progress is manual: the target is polled too.
                        w += a.poll(&mut buf).expect("poll");
                        let _ = b.poll(&mut buf);
                    }
                })
            });
        }

        // The engine's loop written by hand on the bare trait: up to the queue depth in
        // flight, one post and one poll of each side per turn, PAGES writes, the last with an
        // immediate. Set against `engine_64B_baseline`, this is the engine's own cost.
        {
            let tx = a.caps().tx_depth;
            let ops: Vec<WriteOp<'_, _, _>> = (0..PAGES)
                .map(|i| WriteOp {
                    peer,
                    local: LocalSlice::new(&src, i * PS, PS).expect("slice"),
                    remote: remote.slice((i * PS) as u64, PS as u64).expect("slice"),
                    imm: (i == PAGES - 1).then_some(1),
                    ctx: i as u64,
                })
                .collect();
            g.throughput(Throughput::Elements(PAGES as u64));
            g.bench_function("trait_pipelined_64B_by_hand", |bn| {
                bn.iter(|| {
                    let (mut posted, mut done, mut inflight) = (0, 0, 0);
                    while done < PAGES {
                        // The last write waits for the others, as the engine's immediate does.
                        let ready =
                            posted < PAGES - 1 || (posted == PAGES - 1 && done == PAGES - 1);
                        if ready && inflight < tx {
                            let op = &ops[posted];
                            if a.post_write(op.peer, op.local, op.remote, op.imm, op.ctx)
                                .expect("post")
                                == Post::Posted
                            {
                                posted += 1;
                                inflight += 1;
                            }
                        }
                        let n = a.poll(&mut buf).expect("poll");
                        done += n;
                        inflight -= n;
                        let _ = b.poll(&mut buf);
                    }
                })
            });
        }

        // The write engine: one repeat of PAGES writes (the last with an immediate) per
        // iteration, eager single posts versus the full ladder (batch 32, lazy, sharded). Each
        // iteration is a phase, so it ends at the target's acknowledgement: one more WRITE and
        // a trip back per PAGES writes, which the hand-written loop above does not pay.
        let live = Liveness::default();
        let ctx = RunCtx::new(&live, Duration::from_secs(10), 1);
        let tx = a.caps().tx_depth;
        for (name, knobs) in [
            ("engine_64B_baseline", Knobs::baseline()),
            (
                "engine_64B_batch32_lazy_sharded",
                Knobs {
                    batch: 32,
                    lazy: true,
                    sharded: true,
                    ..Knobs::baseline()
                },
            ),
        ] {
            let parts = WriteParts {
                nic: 0,
                ep: &mut a,
                src: &mut src,
                peer,
                remote,
                slots: (0..PAGES as u32).collect(),
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
                imms: 0,
                tbuf: vec![Completion::default(); 64],
            }];
            g.throughput(Throughput::Elements(PAGES as u64));
            g.bench_function(name, |bn| {
                bn.iter(|| {
                    let shared = Shared::default();
                    drive(&mut w, &knobs, 1, &ctx, &shared, PAGES as u64, &mut buf).expect("drive")
                })
            });
        }
        g.finish();
    }
}

#[cfg(feature = "efa")]
criterion::criterion_group!(benches, shm::benches);
#[cfg(feature = "efa")]
criterion::criterion_main!(benches);

#[cfg(not(feature = "efa"))]
fn main() {
    eprintln!("hot_path: built without the `efa` feature; nothing to measure");
}
