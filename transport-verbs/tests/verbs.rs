//! Verbs-specific tests beyond the shared suite: bad input (wrong rkey, a peer destroyed in the
//! middle of a transfer, garbage addresses), the two-queue-pair design (immediates never take
//! a receive buffer), several peers, batching, device selection.
//!
//! One file (about 800 lines): every test here runs on the same two devices of one VM and
//! shares its setup helpers; splitting it would split that harness, not the concern.
//!
//! Same environment as `conformance.rs`: `VERBS_DEV0/1`, `VERBS_GID0/1`; skipped without a
//! device unless `CONFORMANCE_REQUIRE_DEVICE=1`.

use std::time::{Duration, Instant};

use transport_core::wait::{wait_for, wait_pair};
use transport_core::{
    CompletionKind, EndpointAddr, Error, HostBuffer, KeyBytes, LocalSlice, Memory, MemoryRegion,
    NicDesc, Post, RemoteMr, Result, Transport, WriteOp,
};
use transport_verbs::{addr_len, Endpoint, VerbsMr};

const T: Duration = Duration::from_secs(20);

fn nic(side: usize) -> NicDesc {
    transport_verbs::test_nic(side).expect("VERBS_GID<side> is a GID index")
}

fn required() -> bool {
    std::env::var("CONFORMANCE_REQUIRE_DEVICE").is_ok()
}

/// Open side 0 with `nic0` changes, or `None` (skip) without a device.
fn open_or_skip(side: usize, f: impl FnOnce(&mut NicDesc)) -> Option<Endpoint> {
    let mut n = nic(side);
    f(&mut n);
    match Endpoint::open(&n) {
        Ok(e) => Some(e),
        Err(Error::NoDevice(why)) if !required() => {
            transport_core::skip::note("no device (transport_verbs)", &why);
            None
        }
        Err(e) => panic!("open side {side}: {e}"),
    }
}

fn connect(a: &mut Endpoint, b: &mut Endpoint) -> (transport_core::PeerId, transport_core::PeerId) {
    let (aa, ba) = (a.address(), b.address());
    (a.add_peer(&ba).unwrap(), b.add_peer(&aa).unwrap())
}

fn mr(t: &mut Endpoint, bytes: &[u8]) -> VerbsMr {
    t.register(Memory::Host(HostBuffer::from_slice(bytes)))
        .unwrap()
}

fn bytes(m: &VerbsMr) -> Vec<u8> {
    m.memory().host().unwrap().to_vec()
}

#[test]
fn open_without_device_is_no_device_not_a_panic() {
    match Endpoint::open(&NicDesc::default()) {
        Ok(ep) => assert!(!ep.device().is_empty()),
        Err(Error::NoDevice(why)) => {
            assert!(!required(), "no device although required: {why}");
            assert!(!why.is_empty());
        }
        Err(e) => panic!("open failed with something other than NoDevice: {e}"),
    }
    match transport_verbs::device_names() {
        Ok(names) => assert!(!names.is_empty()),
        Err(Error::NoDevice(_)) => {}
        Err(e) => panic!("device_names: {e}"),
    }
}

#[test]
fn unknown_device_names_the_present_ones() {
    let Ok(names) = transport_verbs::device_names() else {
        assert!(!required());
        return;
    };
    match Endpoint::open(&NicDesc::device("no-such-nic9")) {
        Err(Error::NoDevice(why)) => assert!(why.contains(&names[0]), "{why}"),
        other => panic!(
            "expected NoDevice, got {:?}",
            other.map(|e| e.device().to_string())
        ),
    }
}

#[test]
fn gid_is_chosen_automatically() {
    let Some(a) = open_or_skip(0, |n| {
        n.options.remove("gid");
    }) else {
        return;
    };
    eprintln!(
        "{} port {}: gid[{}] {:02x?}, roce {}, mtu {}",
        a.device(),
        a.port(),
        a.gid_index(),
        a.gid(),
        a.is_roce(),
        a.active_mtu()
    );
    if a.is_roce() {
        let g = a.gid();
        assert!(
            g[..10] == [0; 10] && g[10..12] == [0xff, 0xff],
            "RoCE: expected the IPv4-mapped GID, got {g:02x?}"
        );
        // The VM's init found the same index by scanning sysfs: the lower of veth0's two
        // untagged IPv4 GIDs (never the VLAN's).
        if let Ok(want) = std::env::var("SOFTROCE_GID0") {
            if a.device() == "rxe0" && !want.is_empty() {
                let want = [Some(want), std::env::var("SOFTROCE_GID0_ALT").ok()]
                    .into_iter()
                    .flatten()
                    .filter_map(|g| g.parse::<u8>().ok())
                    .min();
                assert_eq!(Some(a.gid_index()), want, "{a:?}");
            }
        }
    }
    assert!(a.caps().tx_depth > 0 && a.caps().max_msg_size > 0);
    assert!(a.caps().cq_data_size >= 4);
    // An explicit index that does not exist is refused clearly.
    let mut n = nic(0);
    n.options.insert("gid".into(), "250".into());
    let r = Endpoint::open(&n);
    match r {
        Err(Error::InvalidArgument(m)) => {
            assert!(
                m.contains("show_gids") && m.contains("/sys/class/infiniband/"),
                "{m}"
            )
        }
        other => panic!("{:?}", other.map(|e| e.device().to_string())),
    }
    let r = Endpoint::open(&nic(0).with_option("gid", "250"));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{:?}", r.err());
}

/// A 32-bit rkey that the peer never issued: an error completion with the provider's text,
/// memory unchanged, nothing reported to the target's application. Key bytes that are no
/// rkey (another backend's 8-byte key) are refused at import, before any post.
#[test]
fn wrong_rkey_is_an_error_completion() {
    // A fresh pair per case: the first failure puts the queue pair in the error state.
    for imm in [None, Some(5)] {
        let Some(mut a) = open_or_skip(0, |_| {}) else {
            return;
        };
        let mut b = open_or_skip(1, |_| {}).unwrap();
        let (ab, _) = connect(&mut a, &mut b);
        let src = mr(&mut a, &[1u8; 512]);
        let dst = mr(&mut b, &[0u8; 512]);
        let libfabric_key = RemoteMr {
            key: KeyBytes::from_u64(u64::from(dst.rkey())),
            ..dst.remote()
        };
        match a.import(ab, &libfabric_key) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("verbs key (4 bytes)"), "{m}"),
            other => panic!("an 8-byte key was imported: {other:?}"),
        }
        let wrong = RemoteMr {
            key: KeyBytes::from_u32(dst.rkey() ^ 0x00ab_cd00),
            ..dst.remote()
        };
        let remote = a.import(ab, &wrong).unwrap().all();
        let p = a
            .post_write(ab, LocalSlice::all(&src), remote, imm, 0xbad)
            .unwrap();
        assert_eq!(p, Post::Posted);
        let mut err = None;
        wait_pair(&mut a, &mut b, "wrong rkey", T, |side, c| {
            match (side, &c.kind) {
                (0, CompletionKind::Error(e)) => err = Some(e.clone()),
                (_, k) => panic!("unexpected completion on side {side}: {k:?}"),
            }
            Ok(true)
        })
        .unwrap();
        let e = err.unwrap();
        eprintln!("wrong rkey (imm {imm:?}): {e}");
        assert_eq!(e.ctx, 0xbad);
        assert_eq!(e.code, 10, "IBV_WC_REM_ACCESS_ERR expected: {e}");
        assert!(e.msg.contains("remote access error"), "{}", e.msg);
        assert!(bytes(&dst).iter().all(|&x| x == 0));
    }
}

/// Side 1 goes away while side 0 has writes in flight: every posted write completes (with an
/// error), within a bound, and nothing hangs.
#[test]
fn peer_destroyed_mid_transfer() {
    // ~67 ms ACK timeout, 3 retries: the error arrives well under a second on real NICs.
    let Some(mut a) = open_or_skip(0, |n| {
        n.options.insert("timeout".into(), "14".into());
        n.options.insert("retry_cnt".into(), "3".into());
        n.tx_depth = Some(64);
    }) else {
        return;
    };
    let mut b = open_or_skip(1, |_| {}).unwrap();
    let (ab, _) = connect(&mut a, &mut b);
    const CHUNK: usize = 64 << 10;
    let src = mr(&mut a, &vec![7u8; CHUNK]);
    let dst = mr(&mut b, &vec![0u8; 16 * CHUNK]);
    let r = a.import(ab, &dst.remote()).unwrap();
    let op = |i: usize| WriteOp {
        peer: ab,
        local: LocalSlice::all(&src),
        remote: r.slice(((i % 16) * CHUNK) as u64, CHUNK as u64).unwrap(),
        imm: None,
        ctx: i as u64,
    };
    // Some traffic that succeeds, so the transfer is really under way.
    let ops: Vec<_> = (0..8).map(op).collect();
    assert_eq!(a.post_writes(&ops).unwrap(), 8);
    let mut ok = 0;
    wait_pair(&mut a, &mut b, "first writes", T, |_, c| {
        c.check()?;
        ok += 1;
        Ok(ok == 8)
    })
    .unwrap();
    // More in flight, then the peer disappears (its QPs, CQ, PD and context are destroyed).
    // Whatever was in flight may or may not have landed; what is posted after the drop cannot.
    let ops: Vec<_> = (8..40).map(op).collect();
    let before = a.post_writes(&ops).unwrap();
    // Only the queue pairs go: the target region stays registered (it holds the PD), so the
    // failure is the missing peer, not a missing region.
    drop(b);
    let after_ops: Vec<_> = (100..132).map(op).collect();
    let mut after_posted = 0;
    let start = Instant::now();
    let (mut done, mut errors, mut first_err) = (0usize, 0usize, None);
    let bound = Duration::from_secs(60);
    while done < before + after_posted || after_posted < after_ops.len() {
        assert!(
            start.elapsed() < bound,
            "{done} of {} writes completed after {bound:?}: hang",
            before + after_posted
        );
        if after_posted < after_ops.len() {
            match a.post_writes(&after_ops[after_posted..]) {
                Ok(n) => after_posted += n,
                // Refused at post once the QP is in the error state: also a clear failure.
                Err(e) => {
                    eprintln!("post after the peer went away refused: {e}");
                    break;
                }
            }
        }
        let mut out: [transport_core::Completion; 16] = Default::default();
        let n = a.poll(&mut out).unwrap();
        for c in &out[..n] {
            done += 1;
            match &c.kind {
                CompletionKind::Error(e) => {
                    errors += 1;
                    first_err.get_or_insert_with(|| (e.clone(), start.elapsed()));
                }
                k => assert!(
                    c.ctx < 100,
                    "write {} posted after the peer went away: {k:?}",
                    c.ctx
                ),
            }
        }
    }
    // Whatever is still outstanding drains too.
    while done < before + after_posted {
        assert!(start.elapsed() < bound, "drain hung");
        let mut out: [transport_core::Completion; 16] = Default::default();
        let n = a.poll(&mut out).unwrap();
        for c in &out[..n] {
            done += 1;
            if let CompletionKind::Error(e) = &c.kind {
                errors += 1;
                first_err.get_or_insert_with(|| (e.clone(), start.elapsed()));
            }
        }
    }
    let (e, after) = first_err.expect("no error completion after the peer was destroyed");
    eprintln!(
        "peer gone: first error after {after:?}: {e}; {errors} errors of {done} completions, \
         all done after {:?}",
        start.elapsed()
    );
    // IBV_WC_RETRY_EXC_ERR (12), or a flush behind it.
    assert!(e.code == 12 || e.code == 5, "{e}");
    assert!(errors > 0);
    drop(dst);
    // After the failure, a post is refused or fails by completion, never hangs.
    match a.post_write(ab, LocalSlice::all(&src), r.all(), Some(1), 999) {
        Err(e) => eprintln!("post after failure refused: {e}"),
        Ok(Post::QueueFull) => panic!("queue full after draining"),
        Ok(Post::Posted) => {
            let mut got = false;
            wait_for(&mut a, "post after failure", T, |c| {
                got = matches!(c.kind, CompletionKind::Error(_));
                Ok(true)
            })
            .unwrap();
            assert!(got, "a write to a destroyed peer succeeded");
        }
    }
}

fn fnv1a(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ u32::from(x)).wrapping_mul(0x0100_0193)
    })
}

/// Same-length garbage, tampered fields, another version: all `BadAddress`; the pending queue
/// pair survives, and the real address still connects afterwards.
#[test]
fn garbage_addresses_are_bad_address() {
    let Some(mut a) = open_or_skip(0, |_| {}) else {
        return;
    };
    let mut b = open_or_skip(1, |_| {}).unwrap();
    let good = b.address().0;
    let len = good.len();
    assert!(
        len >= addr_len(1) && (len - addr_len(0)).is_multiple_of(20),
        "{len}"
    );
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short", good[..20].to_vec()),
        ("long", [good.clone(), vec![0]].concat()),
        ("zeros", vec![0; len]),
        ("ones", vec![0xff; len]),
        (
            "pseudo-random",
            (0..len as u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                .collect(),
        ),
    ];
    let mut flipped = good.clone();
    flipped[30] ^= 0x40; // a GID bit: checksum mismatch
    cases.push(("flipped bit", flipped));
    let resum = |mut b: Vec<u8>| {
        let s = fnv1a(&b[..len - 4]);
        b[len - 4..].copy_from_slice(&s.to_le_bytes());
        b
    };
    let mut v3 = good.clone();
    v3[4] = 3;
    cases.push(("future version", resum(v3)));
    let mut count = good.clone();
    count[10] += 1;
    cases.push(("one GID more than the bytes hold", resum(count)));
    let mut qpn0 = good.clone();
    qpn0[12..16].copy_from_slice(&0u32.to_le_bytes());
    cases.push(("QP number 0", resum(qpn0)));
    let mut ll = good.clone();
    ll[5] = 9;
    cases.push(("unknown link layer", resum(ll)));
    let mut mtu = good.clone();
    mtu[6] = 0;
    cases.push(("MTU 0", resum(mtu)));
    for (what, c) in cases {
        match a.add_peer(&EndpointAddr(c)) {
            Err(Error::BadAddress(why)) => eprintln!("{what}: {why}"),
            other => panic!("{what}: expected BadAddress, got {other:?}"),
        }
    }
    assert_eq!(a.peer_count(), 0);
    // The pending pair described before the garbage still connects.
    let aa = a.address();
    let ab = a.add_peer(&EndpointAddr(good)).unwrap();
    b.add_peer(&aa).unwrap();
    let src = mr(&mut a, b"hello");
    let dst = mr(&mut b, &[0u8; 5]);
    let remote = a.import(ab, &dst.remote()).unwrap().all();
    assert_eq!(
        a.post_write(ab, LocalSlice::all(&src), remote, Some(3), 1)
            .unwrap(),
        Post::Posted
    );
    let mut n = 0;
    wait_pair(&mut a, &mut b, "write after garbage", T, |_, c| {
        c.check()?;
        n += 1;
        Ok(n == 2)
    })
    .unwrap();
    assert_eq!(bytes(&dst), b"hello");
}

/// WRITEs with immediate never consume the application's receive buffers: each SEND lands in
/// its own posted buffer and each immediate arrives once, in any interleaving.
#[test]
fn immediates_never_take_receive_buffers() {
    let Some(mut a) = open_or_skip(0, |_| {}) else {
        return;
    };
    let mut b = open_or_skip(1, |_| {}).unwrap();
    let (ab, _) = connect(&mut a, &mut b);
    const N: usize = 4;
    let recv: Vec<VerbsMr> = (0..N).map(|_| mr(&mut b, &[0u8; 64])).collect();
    for (i, m) in recv.iter().enumerate() {
        assert_eq!(
            b.post_recv(LocalSlice::all(m), 100 + i as u64).unwrap(),
            Post::Posted
        );
    }
    let msgs: Vec<VerbsMr> = (0..N).map(|i| mr(&mut a, &[i as u8 + 1; 48])).collect();
    let src = mr(&mut a, &[9u8; 32]);
    let dst = mr(&mut b, &[0u8; 32 * 16]);
    let remote = a.import(ab, &dst.remote()).unwrap();
    for i in 0..16u32 {
        let r = remote.slice(u64::from(i) * 32, 32).unwrap();
        assert_eq!(
            a.post_write(ab, LocalSlice::all(&src), r, Some(i), 1)
                .unwrap(),
            Post::Posted
        );
        if i % 4 == 0 {
            let m = &msgs[i as usize / 4];
            assert_eq!(
                a.post_send(ab, LocalSlice::all(m), 2).unwrap(),
                Post::Posted
            );
        }
    }
    let (mut imms, mut recvs, mut local) = (vec![0; 16], vec![None; N], 0);
    wait_pair(&mut a, &mut b, "mixed", T, |side, c| {
        c.check()?;
        match (side, &c.kind) {
            (0, CompletionKind::Write | CompletionKind::Send) => local += 1,
            (1, CompletionKind::RemoteWrite { imm }) => imms[*imm as usize] += 1,
            (1, CompletionKind::Recv { len, imm: None }) => {
                assert_eq!(*len, 48);
                recvs[(c.ctx - 100) as usize] = Some(*len);
            }
            other => panic!("unexpected {other:?}"),
        }
        Ok(local == 20 && imms.iter().sum::<i32>() == 16 && recvs.iter().all(Option::is_some))
    })
    .unwrap();
    assert!(imms.iter().all(|&n| n == 1), "{imms:?}");
    // Every receive buffer holds one whole message (in some order).
    let mut firsts: Vec<u8> = recv.iter().map(|m| bytes(m)[0]).collect();
    firsts.sort();
    assert_eq!(firsts, (1..=N as u8).collect::<Vec<_>>());
    for m in &recv {
        assert!(bytes(m)[..48].iter().all(|&x| x == bytes(m)[0]));
    }
    assert!(bytes(&dst).iter().all(|&x| x == 9));
}

/// One endpoint, two peers: a queue pair each, receives shared.
#[test]
fn several_peers() {
    let Some(mut a) = open_or_skip(0, |_| {}) else {
        return;
    };
    let mut b = open_or_skip(1, |_| {}).unwrap();
    let mut c = open_or_skip(1, |_| {}).unwrap();
    let (ab, ba) = connect(&mut a, &mut b);
    let (ac, ca) = connect(&mut a, &mut c);
    assert_ne!(ab, ac);
    assert_eq!(a.peer_count(), 2);
    let src = mr(&mut a, &[5u8; 100]);
    let db = mr(&mut b, &[0u8; 100]);
    let dc = mr(&mut c, &[0u8; 100]);
    let (rb, rc) = (
        a.import(ab, &db.remote()).unwrap(),
        a.import(ac, &dc.remote()).unwrap(),
    );
    let _ = a
        .post_write(ab, LocalSlice::all(&src), rb.all(), Some(11), 1)
        .unwrap();
    let _ = a
        .post_write(ac, LocalSlice::all(&src), rc.all(), Some(22), 2)
        .unwrap();
    let rbuf: Vec<VerbsMr> = (0..2).map(|_| mr(&mut a, &[0u8; 8])).collect();
    for (i, m) in rbuf.iter().enumerate() {
        let _ = a.post_recv(LocalSlice::all(m), i as u64).unwrap();
    }
    let mb = mr(&mut b, b"from b!!");
    let mc = mr(&mut c, b"from c!!");
    let _ = b.post_send(ba, LocalSlice::all(&mb), 3).unwrap();
    let _ = c.post_send(ca, LocalSlice::all(&mc), 4).unwrap();
    let start = Instant::now();
    let (mut na, mut nb, mut nc) = (0, 0, 0);
    let mut out: [transport_core::Completion; 8] = Default::default();
    while na < 4 || nb < 2 || nc < 2 {
        assert!(start.elapsed() < T, "timeout: a {na} b {nb} c {nc}");
        for (t, n, want_imm) in [
            (&mut a, &mut na, None),
            (&mut b, &mut nb, Some(11)),
            (&mut c, &mut nc, Some(22)),
        ] {
            let k = t.poll(&mut out).unwrap();
            for cpl in &out[..k] {
                cpl.check().unwrap();
                if let CompletionKind::RemoteWrite { imm } = cpl.kind {
                    assert_eq!(Some(imm), want_imm);
                }
                *n += 1;
            }
        }
    }
    let mut got: Vec<Vec<u8>> = rbuf.iter().map(bytes).collect();
    got.sort();
    assert_eq!(got, [b"from b!!", b"from c!!"]);
    assert!(bytes(&db).iter().chain(&bytes(&dc)).all(|&x| x == 5));
}

/// A batch larger than the send queue: a short count, then the rest after polling.
#[test]
fn batch_larger_than_queue_is_a_short_count() {
    let Some(mut a) = open_or_skip(0, |n| n.tx_depth = Some(8)) else {
        return;
    };
    let mut b = open_or_skip(1, |_| {}).unwrap();
    let (ab, _) = connect(&mut a, &mut b);
    assert_eq!(a.caps().tx_depth, 8);
    let src = mr(&mut a, &[3u8; 64]);
    let dst = mr(&mut b, &[0u8; 64 * 20]);
    let remote = a.import(ab, &dst.remote()).unwrap();
    let ops: Vec<_> = (0..20)
        .map(|i| WriteOp {
            peer: ab,
            local: LocalSlice::all(&src),
            remote: remote.slice(i * 64, 64).unwrap(),
            imm: Some(i as u32),
            ctx: i,
        })
        .collect();
    let first = a.post_writes(&ops).unwrap();
    assert_eq!(first, 8, "the send queue holds 8");
    let mut posted = first;
    let (mut writes, mut imms) = (0, 0);
    let start = Instant::now();
    let mut out: [transport_core::Completion; 16] = Default::default();
    while writes < 20 || imms < 20 {
        assert!(
            start.elapsed() < T,
            "timeout: {writes} writes, {imms} immediates"
        );
        if posted < 20 {
            let n = a.post_writes(&ops[posted..]).unwrap();
            assert!(n <= 8);
            posted += n;
        }
        let n = a.poll(&mut out).unwrap();
        for c in &out[..n] {
            assert_eq!(c.check().unwrap().kind, CompletionKind::Write);
            writes += 1;
        }
        let n = b.poll(&mut out).unwrap();
        for c in &out[..n] {
            assert!(matches!(
                c.check().unwrap().kind,
                CompletionKind::RemoteWrite { .. }
            ));
            imms += 1;
        }
    }
    assert!(bytes(&dst).iter().all(|&x| x == 3));
}

/// Regions may outlive their endpoint; a region is refused by another endpoint.
#[test]
fn regions_outlive_endpoints_and_stay_home() -> Result<()> {
    let Some(mut a) = open_or_skip(0, |_| {}) else {
        return Ok(());
    };
    let mut b = open_or_skip(1, |_| {}).unwrap();
    let m = mr(&mut a, &[1, 2, 3]);
    let m = match b.deregister(m) {
        Err(Error::InvalidArgument(_)) => mr(&mut a, &[1, 2, 3]),
        other => panic!("deregistered on the wrong endpoint: {other:?}"),
    };
    drop(a);
    // The PD lives on through the region; deregistering after the endpoint is gone is fine.
    assert_eq!(bytes(&m), &[1, 2, 3]);
    drop(m);
    drop(b);
    Ok(())
}

/// WRITE `payload` with immediate `imm` from `a` to `b` (peer `ab` of `a`), wait for both
/// completions and check the bytes arrived.
fn write_and_check(
    a: &mut Endpoint,
    b: &mut Endpoint,
    ab: transport_core::PeerId,
    payload: &[u8],
    imm: u32,
) {
    let src = mr(a, payload);
    let dst = mr(b, &vec![0u8; payload.len()]);
    let remote = a.import(ab, &dst.remote()).unwrap().all();
    assert_eq!(
        a.post_write(ab, LocalSlice::all(&src), remote, Some(imm), 7)
            .unwrap(),
        Post::Posted
    );
    let (mut wrote, mut got) = (false, false);
    let start = Instant::now();
    let mut out: [transport_core::Completion; 4] = Default::default();
    while !(wrote && got) {
        assert!(
            start.elapsed() < T,
            "timeout: wrote {wrote}, immediate {got}"
        );
        let n = a.poll(&mut out).unwrap();
        for c in &out[..n] {
            assert_eq!(c.check().unwrap().kind, CompletionKind::Write);
            wrote = true;
        }
        let n = b.poll(&mut out).unwrap();
        for c in &out[..n] {
            assert_eq!(c.check().unwrap().kind, CompletionKind::RemoteWrite { imm });
            got = true;
        }
    }
    assert_eq!(bytes(&dst), payload);
}

/// Regions ask for relaxed ordering by default and not with `relaxed_ordering=off`, and
/// WRITEs move the same bytes either way. Soft-RoCE accepts the optional flag and ignores it.
/// On a ConnectX-7 (mlx5 with relaxed-ordering write support) the mkey gets relaxed ordering:
/// the NIC's PCIe writes into the region may pass one another, which GPU memory needs for
/// line rate, and a completion still means every byte is in place; without the bit, GPU
/// traffic stays far below 400 Gbit/s.
#[test]
fn relaxed_ordering_regions_move_bytes() {
    let Some(mut a) = open_or_skip(0, |_| {}) else {
        return;
    };
    let mut b = open_or_skip(1, |n| {
        n.options.insert("relaxed_ordering".into(), "off".into());
    })
    .unwrap();
    assert!(a.relaxed_ordering() && !b.relaxed_ordering());
    let on = mr(&mut a, &[0u8; 8]);
    let off = mr(&mut b, &[0u8; 8]);
    assert!(on.relaxed_ordering(), "{on:?}");
    assert_ne!(on.access() & transport_verbs::ACCESS_RELAXED_ORDERING, 0);
    assert!(!off.relaxed_ordering(), "{off:?}");
    assert!(
        format!("{on:?}").contains("relaxed_ordering: true"),
        "{on:?}"
    );
    let (ab, ba) = connect(&mut a, &mut b);
    let payload: Vec<u8> = (0..64 << 10).map(|i| (i * 7 + 3) as u8).collect();
    write_and_check(&mut a, &mut b, ab, &payload, 1);
    write_and_check(&mut b, &mut a, ba, &payload, 2);
    // An unknown value is refused before anything is opened.
    match Endpoint::open(&nic(0).with_option("relaxed_ordering", "maybe")) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("relaxed_ordering=maybe"), "{m}"),
        other => panic!("{:?}", other.map(|e| e.device().to_string())),
    }
}

/// A GID index the VM's init found (`ci/vm/init` exports `SOFTROCE_GID<side>_ALT` for the
/// second subnet and `SOFTROCE_GID<side>_VLAN` for VLAN 100); `None` outside that VM.
fn vm_gid(name: &str) -> Option<u8> {
    let v = std::env::var(name).ok()?;
    Some(v.parse().unwrap_or_else(|_| {
        panic!("{name}={v:?}: the VM's init found no such GID (8021q loaded? address added?)")
    }))
}

fn v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

/// The GID of each peer's queue pairs is chosen per peer from both sides' GID tables: with
/// rxe0 and rxe1 each on three subnets (10.99.0.0/24 and 10.99.2.0/24 on veth0/veth1,
/// 10.99.100.0/24 on VLAN 100 above them), one endpoint on rxe0 connects to three on rxe1:
/// one automatic (the untagged first subnet), one forced with `gid=N` onto the second subnet,
/// one forced onto the VLAN. The rxe0 side follows each peer onto its subnet and netdev, the
/// device's own address vectors (`ibv_query_qp`) say the same, and WRITEs flow both ways on
/// all three. `gid=N` on the rxe0 side forces its index, and the automatic peer follows.
/// Before, every QP used the first IPv4-mapped GID whatever the peer's subnet, and the
/// address carried one GID: towards the VLAN peer rxe0 sent untagged packets to a GID that
/// lives on veth1.100, which rxe drops (no GID on the netdev they arrive on), and nothing said
/// which GID a peer used. On a ConnectX-7 with a VLAN or several subnets, the same choice
/// sends tagged or untagged traffic onto a network the peer is not on (RTR fails or the ACKs
/// never come back).
#[test]
fn gid_follows_the_peers_subnet() {
    let (Some(alt0), Some(alt1), Some(vlan0), Some(vlan1)) = (
        vm_gid("SOFTROCE_GID0_ALT"),
        vm_gid("SOFTROCE_GID1_ALT"),
        vm_gid("SOFTROCE_GID0_VLAN"),
        vm_gid("SOFTROCE_GID1_VLAN"),
    ) else {
        transport_core::skip::note(
            "not in the Soft-RoCE VM",
            "needs the VM's second subnet and VLAN (ci/vm/init)",
        );
        return;
    };
    let auto = |n: &mut NicDesc| {
        n.options.remove("gid");
    };
    let forced = |g: u8| {
        move |n: &mut NicDesc| {
            n.options.insert("gid".into(), g.to_string());
        }
    };
    let Some(mut a) = open_or_skip(0, auto) else {
        return;
    };
    let mut b_auto = open_or_skip(1, auto).unwrap();
    let mut b_alt = open_or_skip(1, forced(alt1)).unwrap();
    let mut b_vlan = open_or_skip(1, forced(vlan1)).unwrap();
    assert_eq!((b_alt.gid_index(), b_vlan.gid_index()), (alt1, vlan1));
    let cases = [
        (
            "automatic",
            &mut b_auto,
            [10, 99, 0, 1],
            [10, 99, 0, 2],
            "veth0",
            None,
        ),
        (
            "second subnet",
            &mut b_alt,
            [10, 99, 2, 1],
            [10, 99, 2, 2],
            "veth0",
            None,
        ),
        (
            "VLAN 100",
            &mut b_vlan,
            [10, 99, 100, 1],
            [10, 99, 100, 2],
            "veth0.100",
            Some(100),
        ),
    ];
    for (k, (what, b, ours, theirs, netdev, vlan)) in cases.into_iter().enumerate() {
        let (ab, ba) = connect(&mut a, b);
        let p = a.peer_path(ab).unwrap().clone();
        eprintln!("{what}: {a:?}");
        assert_eq!((p.sgid, p.dgid), (v4(ours), v4(theirs)), "{what}: {p:?}");
        assert_eq!(
            (p.netdev.as_deref(), p.vlan),
            (Some(netdev), vlan),
            "{what}: {p:?}"
        );
        let q = b.peer_path(ba).unwrap().clone();
        assert_eq!(
            (q.sgid, q.dgid),
            (p.dgid, p.sgid),
            "{what}: the ends disagree: {q:?}"
        );
        match what {
            "second subnet" => assert_eq!((p.sgid_index, q.sgid_index), (alt0, alt1)),
            "VLAN 100" => assert_eq!((p.sgid_index, q.sgid_index), (vlan0, vlan1)),
            _ => {}
        }
        // What the device holds for both queue pairs of the peer, at both ends.
        for (t, peer, path) in [(&a, ab, &p), (&*b, ba, &q)] {
            for av in t.queried_av(peer).unwrap() {
                assert!(av.is_global, "{what}: {av:?}");
                assert_eq!(
                    (av.sgid_index, av.dgid),
                    (path.sgid_index, path.dgid),
                    "{what}"
                );
            }
        }
        let payload: Vec<u8> = (0..4096).map(|i| (i * 13 + k) as u8).collect();
        write_and_check(&mut a, b, ab, &payload, 10 + k as u32);
        write_and_check(b, &mut a, ba, &payload, 20 + k as u32);
    }
    // gid=N on this side: every peer gets it, and an automatic peer follows it.
    let mut a2 = open_or_skip(0, forced(alt0)).unwrap();
    let mut b2 = open_or_skip(1, auto).unwrap();
    let (ab, ba) = connect(&mut a2, &mut b2);
    assert_eq!(a2.peer_path(ab).unwrap().sgid_index, alt0);
    assert_eq!(b2.peer_path(ba).unwrap().sgid_index, alt1);
    assert_eq!(b2.peer_path(ba).unwrap().dgid, v4([10, 99, 2, 1]));
    write_and_check(&mut a2, &mut b2, ab, b"forced", 30);
}

/// `tc=N` (and its alias `traffic_class=N`) is the GRH traffic class of both queue pairs of
/// every peer, as the device reports them (`ibv_query_qp`), and the endpoint says it; WRITEs
/// flow; out of range is refused. Before, `tc` was ignored and every QP sent with class 0.
/// rxe writes the class into the IPv4 TOS byte; on a ConnectX-7 RoCE v2 fabric the same
/// byte is the DSCP (tc = DSCP << 2 | ECN) that selects the switch's (lossless) priority.
#[test]
fn traffic_class_reaches_every_queue_pair() {
    let Some(mut a) = open_or_skip(0, |n| {
        n.options.insert("tc".into(), "104".into());
    }) else {
        return;
    };
    let mut b = open_or_skip(1, |n| {
        n.options.insert("traffic_class".into(), "32".into());
    })
    .unwrap();
    assert_eq!((a.traffic_class(), b.traffic_class()), (104, 32));
    assert!(format!("{a:?}").contains("tc 104"), "{a:?}");
    let (ab, ba) = connect(&mut a, &mut b);
    if a.is_roce() {
        for (t, p, want) in [(&a, ab, 104), (&b, ba, 32)] {
            for av in t.queried_av(p).unwrap() {
                assert!(av.is_global, "{av:?}");
                assert_eq!(av.traffic_class, want, "{av:?}");
            }
        }
    }
    write_and_check(&mut a, &mut b, ab, b"class 104", 1);
    write_and_check(&mut b, &mut a, ba, b"class 32", 2);
    match Endpoint::open(&nic(0).with_option("tc", "256")) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("tc=256"), "{m}"),
        other => panic!("{:?}", other.map(|e| e.device().to_string())),
    }
}
