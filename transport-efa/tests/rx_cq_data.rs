//! The path for providers that want receives posted for immediates (`FI_RX_CQ_DATA`), run
//! on `tcp` with `rx_cq_data=on`.
//!
//! efa's `efa-direct` fabric grants `FI_RMA` on devices without "unsolicited write receive"
//! only to an application that posts a receive for every WRITE with immediate it is sent;
//! before this path the backend never offered the mode, so on such a device efa-direct found
//! no entry and the open failed with no reason. Here `rx_cq_data=on` makes the backend take
//! that path on tcp, which does not need it: a data endpoint of its own with zero-length
//! receives posted, peers' WRITEs aimed at it, SENDs kept on the message endpoint. tcp does
//! not consume those receives, so what this proves is the plumbing (two names in one
//! address, WRITEs to the data endpoint, SENDs and immediates kept apart, a peer without the
//! mode still reached); that an immediate consumes and reposts a receive needs efa-direct on
//! a device without unsolicited write receive (the simulated EFA device, or a real one).

use std::sync::Once;
use std::time::Duration;

use transport_core::wait::wait_pair;
use transport_core::{
    Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, Post,
    Result, Transport,
};
use transport_efa::Endpoint;

fn tcp(rx_cq_data: bool) -> NicDesc {
    static LOOPBACK: Once = Once::new();
    LOOPBACK.call_once(|| std::env::set_var("FI_TCP_IFACE", "lo"));
    let mut nic = NicDesc::provider("tcp");
    nic.device = Some("lo".into());
    if rx_cq_data {
        nic = nic.with_option("rx_cq_data", "on");
    }
    nic
}

/// What each side saw: immediates, whole messages received, local completions.
#[derive(Default)]
struct Tally {
    imm: [Vec<u32>; 2],
    recv: [usize; 2],
    local: usize,
}

impl Tally {
    fn add(&mut self, side: usize, kind: CompletionKind) {
        match kind {
            CompletionKind::RemoteWrite { imm } => self.imm[side].push(imm),
            CompletionKind::Recv { len, imm: None } => {
                assert_eq!(len, 256, "a whole message, never a receive for immediates");
                self.recv[side] += 1;
            }
            CompletionKind::Write | CompletionKind::Send => self.local += 1,
            other => panic!("unexpected completion {other:?}"),
        }
    }
    fn done(&self, n: usize) -> bool {
        self.imm[0].len() == n
            && self.imm[1].len() == n
            && self.recv == [n, n]
            && self.local == 4 * n
    }
}

/// Post on `x` until it is accepted, polling both `x` (side 0) and `y` (side 1) in between
/// and keeping every completion, for at most 30 s.
fn post(
    x: &mut Endpoint,
    y: &mut Endpoint,
    seen: &mut Vec<(usize, CompletionKind)>,
    mut op: impl FnMut(&mut Endpoint) -> Result<Post>,
) {
    let start = std::time::Instant::now();
    while op(x).expect("post") == Post::QueueFull {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "queue full for 30 s"
        );
        let mut c: [Completion; 8] = Default::default();
        for (side, ep) in [&mut *x, &mut *y].into_iter().enumerate() {
            let n = ep.poll(&mut c).expect("poll");
            for done in &c[..n] {
                done.check().expect("completion");
                seen.push((side, done.kind.clone()));
            }
        }
    }
}

fn open(_side: usize) -> Result<Endpoint> {
    Endpoint::open(&tcp(true))
}

transport_conformance::suite!(open);

#[test]
fn the_endpoint_says_it_posts_receives_for_immediates() {
    let ep = open(0).expect("open tcp with rx_cq_data=on");
    assert!(ep.info().rx_cq_data, "{}", ep.info());
    let plain = Endpoint::open(&tcp(false)).expect("open tcp");
    assert!(!plain.info().rx_cq_data, "{}", plain.info());
    // Two names back to back: the message endpoint's and the data endpoint's.
    assert_eq!(ep.address().0.len(), 2 * plain.address().0.len());
}

/// SENDs and WRITEs with immediate interleaved, both ways between an endpoint with a data
/// endpoint and one without: every message lands in an application receive with its bytes,
/// every immediate arrives once, and no SEND is swallowed by a receive for immediates.
#[test]
fn sends_and_immediates_stay_apart_and_mixed_peers_interoperate() {
    let mut a = Endpoint::open(&tcp(true)).expect("a");
    let mut b = Endpoint::open(&tcp(false)).expect("b");
    let to_b = a.add_peer(&b.address()).expect("a adds b");
    let to_a = b.add_peer(&a.address()).expect("b adds a");
    const N: usize = 16;
    const LEN: usize = 256;
    let src_a = a
        .register(Memory::Host(HostBuffer::from_slice(&[0xa5; LEN])))
        .unwrap();
    let src_b = b
        .register(Memory::Host(HostBuffer::from_slice(&[0x5a; LEN])))
        .unwrap();
    let dst_a = a.register(Memory::Host(HostBuffer::new(LEN * N))).unwrap();
    let dst_b = b.register(Memory::Host(HostBuffer::new(LEN * N))).unwrap();
    let rbuf_a = a.register(Memory::Host(HostBuffer::new(LEN * N))).unwrap();
    let rbuf_b = b.register(Memory::Host(HostBuffer::new(LEN * N))).unwrap();
    for i in 0..N {
        let ra = LocalSlice::new(&rbuf_a, i * LEN, LEN).unwrap();
        let rb = LocalSlice::new(&rbuf_b, i * LEN, LEN).unwrap();
        assert_eq!(a.post_recv(ra, 1000 + i as u64).unwrap(), Post::Posted);
        assert_eq!(b.post_recv(rb, 2000 + i as u64).unwrap(), Post::Posted);
    }
    let dst_a_remote = b.import(to_a, &dst_a.remote()).unwrap();
    let dst_b_remote = a.import(to_b, &dst_b.remote()).unwrap();
    let (mut seen, mut seen_rev) = (Vec::new(), Vec::new());
    for i in 0..N {
        let off = (i * LEN) as u64;
        let w_ab = dst_b_remote.slice(off, LEN as u64).unwrap();
        let w_ba = dst_a_remote.slice(off, LEN as u64).unwrap();
        // The first WRITE on each side also connects the path to the peer's data endpoint
        // (tcp;ofi_rxm says -FI_EAGAIN until both sides progressed): poll and post again,
        // keeping what the polls brought.
        post(&mut a, &mut b, &mut seen, |a| {
            a.post_write(to_b, LocalSlice::all(&src_a), w_ab, Some(i as u32), 1)
        });
        post(&mut a, &mut b, &mut seen, |a| {
            a.post_send(to_b, LocalSlice::all(&src_a), 3)
        });
        post(&mut b, &mut a, &mut seen_rev, |b| {
            b.post_write(to_a, LocalSlice::all(&src_b), w_ba, Some(100 + i as u32), 4)
        });
        post(&mut b, &mut a, &mut seen_rev, |b| {
            b.post_send(to_a, LocalSlice::all(&src_b), 5)
        });
    }
    // Completions seen while posting, as (side, kind), side 0 being a.
    let early: Vec<(usize, CompletionKind)> = seen
        .into_iter()
        .chain(seen_rev.into_iter().map(|(s, k)| (1 - s, k)))
        .collect();
    let mut t = Tally::default();
    for (side, kind) in early {
        t.add(side, kind);
    }
    wait_pair(
        &mut a,
        &mut b,
        "traffic",
        Duration::from_secs(30),
        |side, c| {
            c.check()?;
            t.add(side, c.kind.clone());
            Ok(t.done(N))
        },
    )
    .expect("every completion");
    t.imm[0].sort_unstable();
    t.imm[1].sort_unstable();
    assert_eq!(t.imm[1], (0..N as u32).collect::<Vec<_>>());
    assert_eq!(t.imm[0], (100..100 + N as u32).collect::<Vec<_>>());
    let bytes = |m: &transport_efa::Mr| m.memory().host().unwrap().to_vec();
    assert!(bytes(&dst_b).iter().all(|&x| x == 0xa5));
    assert!(bytes(&dst_a).iter().all(|&x| x == 0x5a));
    assert!(bytes(&rbuf_b).iter().all(|&x| x == 0xa5));
    assert!(bytes(&rbuf_a).iter().all(|&x| x == 0x5a));
}
