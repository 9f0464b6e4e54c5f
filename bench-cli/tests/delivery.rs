//! Every clock stops at delivery: the side that posts (`write`, `rate`, `send`, the sending
//! links of `rdma-bench run`) stops a NIC's clock only when the target's acknowledgement
//! arrives, which the target sends after it landed the bytes
//! (`bench_core::workload::delivery`). Here the target (libfabric shm, polled from the same
//! thread) holds its acknowledgement back for a while after the last arrival: the initiator's
//! figure must include that wait. Before, its clock stopped at its own last completion
//! (when the bytes had left, not when they had landed), and a GPU target's late copies were
//! outside every figure but one.
//!
//! The same pair checks the window (`--window`, [`Knobs::window`]): what a NIC keeps in flight,
//! posted and not yet reported complete, never passes it.
#![cfg(feature = "efa")]

use std::time::{Duration, Instant};

use bench_core::config::Knobs;
use bench_core::ctrl::Liveness;
use bench_core::proto::NicStats;
use bench_core::workload::delivery::{Acks, Clock, Delivered};
use bench_core::workload::send::{SendActive, SendParts};
use bench_core::workload::write::{WriteActive, WriteParts};
use bench_core::workload::{drive, NicWork, Polled, RunCtx, Shared};
use transport_core::{
    Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, PeerId,
    Post, RemoteSlice, Transport,
};
use transport_efa::{Endpoint, Mr};

/// How long the target holds its acknowledgement after the phase's last arrival.
const HOLD: Duration = Duration::from_millis(300);

/// An initiator's NIC with its target polled in the same thread; the target acknowledges
/// `HOLD` after the phase's last arrival (an immediate or a receive). It also counts what the
/// initiator keeps in flight (posted, not yet reported complete) and the most it kept at once.
struct SlowTarget<'a, W> {
    inner: W,
    posted: u64,
    done: u64,
    most: u64,
    target: &'a mut Endpoint,
    dst: &'a Mr,
    to_a: PeerId,
    ack_to: RemoteSlice<u64>,
    acks: Acks,
    tbuf: Vec<Completion>,
    arrived: u64,
    last_arrival: Option<Instant>,
}

impl<W: NicWork> NicWork for SlowTarget<'_, W> {
    fn start_phase(&mut self, iters: u64) {
        self.inner.start_phase(iters);
        self.arrived = 0;
        self.last_arrival = None;
        self.acks = Acks::new(0, iters);
    }
    fn post(&mut self, max: usize) -> bench_core::error::Result<usize> {
        let k = self.inner.post(max)?;
        self.posted += k as u64;
        self.most = self.most.max(self.posted - self.done);
        Ok(k)
    }
    fn poll(&mut self, buf: &mut [Completion]) -> bench_core::error::Result<Polled> {
        let p = self.inner.poll(buf)?;
        self.done += p.ops;
        let n = self.target.poll(&mut self.tbuf).expect("target poll");
        for c in &self.tbuf[..n] {
            c.check().expect("target completion");
            match c.kind {
                CompletionKind::RemoteWrite { .. } | CompletionKind::Recv { .. } => {
                    self.arrived += 1;
                }
                CompletionKind::Write => self.acks.inflight -= 1,
                _ => panic!("{c:?}"),
            }
        }
        if self.acks.due(self.arrived) {
            let t = *self.last_arrival.get_or_insert_with(Instant::now);
            if t.elapsed() < HOLD {
                return Ok(p);
            }
        }
        self.acks.step(
            self.arrived,
            self.target,
            self.dst,
            self.to_a,
            self.dst,
            self.ack_to,
            1,
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

struct Setup {
    a: Endpoint,
    b: Endpoint,
    a_to_b: PeerId,
    b_to_a: PeerId,
}

fn setup() -> Setup {
    let open = || Endpoint::open(&NicDesc::provider("shm")).expect("opening a shm endpoint");
    let (mut a, mut b) = (open(), open());
    let (addr_a, addr_b) = (a.address(), b.address());
    let a_to_b = a.add_peer(&addr_b).unwrap();
    let b_to_a = b.add_peer(&addr_a).unwrap();
    Setup {
        a,
        b,
        a_to_b,
        b_to_a,
    }
}

/// The knobs of the clock tests: one thread's own counters, one operation a turn.
fn sharded() -> Knobs {
    Knobs {
        sharded: true,
        ..Knobs::baseline()
    }
}

/// One phase of `iters` on `w` with `knobs`; the NIC's figure and how long the phase took here.
fn one_phase<W: NicWork>(
    w: &mut W,
    knobs: &Knobs,
    iters: u64,
    per_iter: u64,
) -> (NicStats, Duration) {
    let live = Liveness::default();
    let ctx = RunCtx::new(&live, Duration::from_secs(20), 1);
    let mut buf = vec![Completion::default(); 64];
    let shared = Shared::default();
    let clock = Clock::start();
    drive(
        std::slice::from_mut(w),
        knobs,
        iters,
        &ctx,
        &shared,
        iters * per_iter,
        &mut buf,
    )
    .expect("phase");
    let took = clock.started().elapsed();
    assert!(w.finished());
    (w.stats(clock), took)
}

/// A write phase of 20 passes over 16 pages from a to b with `knobs`: the NIC's figure, how
/// long the phase took and the most WRITEs a kept in flight.
fn write_phase(knobs: &Knobs) -> (NicStats, Duration, u64) {
    let Setup {
        mut a,
        mut b,
        a_to_b,
        b_to_a,
    } = setup();
    const PAGES: usize = 16;
    const PS: usize = 4096;
    let mut src = a
        .register(Memory::Host(HostBuffer::new(PAGES * PS)))
        .unwrap();
    let dst = b
        .register(Memory::Host(HostBuffer::new(PAGES * PS)))
        .unwrap();
    let acks_a = a.register(Memory::Host(HostBuffer::new(64))).unwrap();
    let remote = a.import(a_to_b, &dst.remote()).unwrap();
    let ack_to = b.import(b_to_a, &acks_a.remote()).unwrap();
    let tx = a.caps().tx_depth;
    let parts = WriteParts {
        nic: 0,
        ep: &mut a,
        src: &mut src,
        peer: a_to_b,
        remote,
        slots: (0..PAGES as u32).collect(),
        ver: bench_core::buffers::Versions::none(PS),
        page_size: PS,
        max_inflight: knobs.in_flight(tx),
        batch: knobs.batch as usize,
    };
    let mut w = SlowTarget {
        inner: WriteActive::new(parts),
        target: &mut b,
        dst: &dst,
        to_a: b_to_a,
        ack_to: ack_to.slice(0, 8).unwrap(),
        acks: Acks::new(0, 0),
        tbuf: vec![Completion::default(); 64],
        arrived: 0,
        last_arrival: None,
        posted: 0,
        done: 0,
        most: 0,
    };
    let (st, took) = one_phase(&mut w, knobs, 20, PAGES as u64);
    eprintln!(
        "write: {} ops in {:.3} s (phase {took:?}), at most {} in flight",
        st.ops, st.seconds, w.most
    );
    assert_eq!(st.ops, 20 * PAGES as u64);
    (st, took, w.most)
}

#[test]
fn the_write_clock_stops_at_the_targets_acknowledgement() {
    let (st, took, _) = write_phase(&sharded());
    assert!(
        st.seconds >= HOLD.as_secs_f64(),
        "the WRITE clock stopped at {:.3} s, before the target acknowledged ({HOLD:?} after \
         its last immediate)",
        st.seconds
    );
    assert!(st.seconds <= took.as_secs_f64());
}

/// A send phase of 64 messages from a to b with `knobs`: the NIC's figure, how long the phase
/// took and the most SENDs a kept in flight.
fn send_phase(knobs: &Knobs) -> (NicStats, Duration, u64) {
    let Setup {
        mut a,
        mut b,
        a_to_b,
        b_to_a,
    } = setup();
    const N: u64 = 64;
    const LEN: usize = 8192;
    let mut src = a.register(Memory::Host(HostBuffer::new(LEN))).unwrap();
    let dst = b
        .register(Memory::Host(HostBuffer::new(LEN * N as usize)))
        .unwrap();
    let ctrl_a = a.register(Memory::Host(HostBuffer::new(64))).unwrap();
    let ack_to = b.import(b_to_a, &ctrl_a.remote()).unwrap();
    for i in 0..N as usize {
        let p = b
            .post_recv(LocalSlice::new(&dst, i * LEN, LEN).unwrap(), i as u64)
            .unwrap();
        assert_eq!(p, Post::Posted);
    }
    let tx = a.caps().tx_depth;
    let parts = SendParts {
        nic: 0,
        ep: &mut a,
        src: &mut src,
        peer: a_to_b,
        size: LEN,
        initial_credits: N,
        total: N,
        max_inflight: knobs.in_flight(tx),
    };
    let mut w = SlowTarget {
        inner: SendActive::new(parts),
        target: &mut b,
        dst: &dst,
        to_a: b_to_a,
        ack_to: ack_to.slice(0, 8).unwrap(),
        acks: Acks::new(0, 0),
        tbuf: vec![Completion::default(); 64],
        arrived: 0,
        last_arrival: None,
        posted: 0,
        done: 0,
        most: 0,
    };
    let (st, took) = one_phase(&mut w, knobs, N, 1);
    eprintln!(
        "send: {} ops in {:.3} s (phase {took:?}), at most {} in flight",
        st.ops, st.seconds, w.most
    );
    assert_eq!(st.ops, N);
    (st, took, w.most)
}

#[test]
fn the_send_clock_stops_at_the_receivers_acknowledgement() {
    let (st, took, _) = send_phase(&sharded());
    assert!(
        st.seconds >= HOLD.as_secs_f64(),
        "the SEND clock stopped at {:.3} s, before the receiver acknowledged ({HOLD:?} after \
         its last message)",
        st.seconds
    );
    assert!(st.seconds <= took.as_secs_f64());
}

/// `--window 3` with 64 operations posted a turn: a NIC keeps exactly 3 WRITEs in flight
/// (without the window, up to its send queue's depth: 60 here), and never more than 3 SENDs
/// (libfabric 1.17's shm takes them all at once; 2.1 and 2.6 take one SEND until the target
/// polls, so there the window is not what holds them back).
#[test]
fn the_window_caps_what_a_nic_keeps_in_flight() {
    let knobs = Knobs {
        batch: 64,
        window: 3,
        ..sharded()
    };
    let (_, _, most) = write_phase(&knobs);
    assert_eq!(most, 3, "WRITEs in flight at most, with --window 3");
    let (_, _, most) = send_phase(&knobs);
    assert!(
        (1..=3).contains(&most),
        "{most} SENDs in flight at most, with --window 3"
    );
}
