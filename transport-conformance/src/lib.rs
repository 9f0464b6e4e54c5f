//! The conformance suite every `Transport` backend runs.
//!
//! A backend's test file names how to open its two sides and expands the suite:
//!
//! ```ignore
//! fn open(side: usize) -> transport_core::Result<transport_efa::Endpoint> {
//!     transport_efa::Endpoint::open(&transport_core::NicDesc::provider("shm"))
//! }
//! transport_conformance::suite!(open);
//! ```
//!
//! Each case becomes its own `#[test]`. Side 0 and side 1 are two endpoints driven from one
//! thread; every wait polls both (progress is manual) and has a timeout. [`connect`] warms the
//! pair up with one SEND each way before a case runs.
//!
//! A case whose `open` answers [`Error::NoDevice`] is skipped with a note on stderr, unless
//! `CONFORMANCE_REQUIRE_DEVICE=1` is set, where it fails.

pub mod ab;

use std::time::Duration;

use transport_core::wait::wait_pair;
use transport_core::{
    CompletionKind, Error, HostBuffer, LocalSlice, Memory, MemoryRegion, PeerId, Post, RemoteSlice,
    Result, Transport, WriteOp,
};

/// Every wait in the suite gives up after this long.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Two connected endpoints.
pub struct Pair<T: Transport> {
    pub a: T,
    pub b: T,
    /// `b` as seen from `a`.
    pub a_to_b: PeerId,
    /// `a` as seen from `b`.
    pub b_to_a: PeerId,
}

/// Open both sides and connect them, or `None` when there is no device and none is required.
pub fn connect<T: Transport>(open: &dyn Fn(usize) -> Result<T>) -> Result<Option<Pair<T>>> {
    let mut a = match open(0) {
        Ok(a) => a,
        Err(Error::NoDevice(why)) if std::env::var("CONFORMANCE_REQUIRE_DEVICE").is_err() => {
            eprintln!("conformance: skipped, no device: {why}");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut b = open(1)?;
    let (addr_a, addr_b) = (a.address(), b.address());
    let a_to_b = a.add_peer(&addr_b)?;
    let b_to_a = b.add_peer(&addr_a)?;
    let mut pair = Pair {
        a,
        b,
        a_to_b,
        b_to_a,
    };
    warm_up(&mut pair)?;
    Ok(Some(pair))
}

/// Post with `post` until it is accepted, polling both sides in between (bounded).
pub fn post_retry<T: Transport>(
    p: &mut Pair<T>,
    what: &str,
    mut post: impl FnMut(&mut Pair<T>) -> Result<Post>,
    mut seen: impl FnMut(usize, &transport_core::Completion) -> Result<()>,
) -> Result<()> {
    let start = std::time::Instant::now();
    while post(p)? == Post::QueueFull {
        if start.elapsed() > TIMEOUT {
            return Err(Error::Timeout {
                what: what.into(),
                after: TIMEOUT,
            });
        }
        poll_both(p, &mut seen)?;
    }
    Ok(())
}

/// One SEND and one WRITE with immediate each way, so both directions of both paths are
/// connected.
///
/// Connectionless providers set up their path to a new peer lazily (libfabric's `shm` and
/// `tcp;ofi_rxm` answer the first post with `-FI_EAGAIN` until both sides have progressed),
/// which an application sees as [`Post::QueueFull`] and handles by polling and posting again.
/// WRITEs may take a path of their own (the efa backend aims them at a data endpoint where
/// the provider wants receives posted for immediates), so they are warmed up too. The cases
/// then start from a pair on which a full queue means a full queue.
pub fn warm_up<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let reg = |t: &mut T, b: u8| t.register(Memory::Host(HostBuffer::from_slice(&[b])));
    let (sa, ra) = (reg(&mut p.a, 1)?, reg(&mut p.a, 0)?);
    let (sb, rb) = (reg(&mut p.b, 2)?, reg(&mut p.b, 0)?);
    let (wa, wb) = (reg(&mut p.a, 0)?, reg(&mut p.b, 0)?);
    let (wa_remote, wb_remote) = (wa.remote().all(), wb.remote().all());
    let done = std::cell::Cell::new(0);
    let count = |_: usize, c: &transport_core::Completion| -> Result<()> {
        c.check()?;
        done.set(done.get() + 1);
        Ok(())
    };
    let (a_to_b, b_to_a) = (p.a_to_b, p.b_to_a);
    post_retry(
        p,
        "warm-up recv",
        |p| p.a.post_recv(LocalSlice::all(&ra), 1),
        count,
    )?;
    post_retry(
        p,
        "warm-up recv",
        |p| p.b.post_recv(LocalSlice::all(&rb), 2),
        count,
    )?;
    post_retry(
        p,
        "warm-up send a->b",
        |p| p.a.post_send(a_to_b, LocalSlice::all(&sa), 3),
        count,
    )?;
    post_retry(
        p,
        "warm-up send b->a",
        |p| p.b.post_send(b_to_a, LocalSlice::all(&sb), 4),
        count,
    )?;
    post_retry(
        p,
        "warm-up write a->b",
        |p| {
            p.a.post_write(a_to_b, LocalSlice::all(&sa), wb_remote, Some(5), 5)
        },
        count,
    )?;
    post_retry(
        p,
        "warm-up write b->a",
        |p| {
            p.b.post_write(b_to_a, LocalSlice::all(&sb), wa_remote, Some(6), 6)
        },
        count,
    )?;
    // 4 sends and receives, 2 local WRITE completions, 2 immediates.
    let start = std::time::Instant::now();
    while done.get() < 8 {
        if start.elapsed() > TIMEOUT {
            return Err(Error::Timeout {
                what: "warm-up".into(),
                after: TIMEOUT,
            });
        }
        poll_both(p, count)?;
    }
    Ok(())
}

fn host_mr<T: Transport>(t: &mut T, bytes: &[u8]) -> Result<T::Mr> {
    t.register(Memory::Host(HostBuffer::from_slice(bytes)))
}

fn host_bytes<M: MemoryRegion>(mr: &M) -> &[u8] {
    mr.memory().host().map(|h| h.as_slice()).unwrap_or(&[])
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn expect_post(p: Post, what: &str) -> Result<()> {
    match p {
        Post::Posted => Ok(()),
        Post::QueueFull => Err(Error::InvalidArgument(format!(
            "{what}: queue full on an idle endpoint"
        ))),
    }
}

/// Poll each side once, handing every completion to `f`.
pub fn poll_both<T: Transport>(
    p: &mut Pair<T>,
    mut f: impl FnMut(usize, &transport_core::Completion) -> Result<()>,
) -> Result<()> {
    let mut buf: [transport_core::Completion; 16] = Default::default();
    for side in 0..2 {
        let t = if side == 0 { &mut p.a } else { &mut p.b };
        let n = t.poll(&mut buf)?;
        for c in &buf[..n] {
            f(side, c)?;
        }
    }
    Ok(())
}

/// Register host memory of a few sizes on both sides and deregister it, getting it back intact.
pub fn register_deregister<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    for len in [1usize, 4096, 1 << 20] {
        let data = pattern(len, 7);
        let mr = host_mr(&mut p.a, &data)?;
        assert_eq!(mr.len(), len);
        let r = mr.remote();
        assert_eq!(r.len, len as u64);
        let mem = p.a.deregister(mr)?;
        assert_eq!(mem.host().map(|h| h.as_slice()), Some(&data[..]));
    }
    // Dropping a region deregisters it too.
    drop(host_mr(&mut p.b, &[1, 2, 3])?);
    Ok(())
}

/// One SEND of `len` bytes from a to b lands in b's posted receive, byte for byte.
pub fn send_recv_len<T: Transport>(p: &mut Pair<T>, len: usize) -> Result<()> {
    let data = pattern(len, 3);
    let src = host_mr(&mut p.a, &data)?;
    let dst = host_mr(&mut p.b, &vec![0u8; len])?;
    expect_post(p.b.post_recv(LocalSlice::all(&dst), 0xb0)?, "post_recv")?;
    expect_post(
        p.a.post_send(p.a_to_b, LocalSlice::all(&src), 0xa0)?,
        "post_send",
    )?;
    let (mut sent, mut got) = (false, false);
    wait_pair(&mut p.a, &mut p.b, "send/recv", TIMEOUT, |side, c| {
        c.check()?;
        match (side, &c.kind) {
            (0, CompletionKind::Send) => {
                assert_eq!(c.ctx, 0xa0);
                sent = true
            }
            (1, CompletionKind::Recv { len: n, imm }) => {
                assert_eq!(c.ctx, 0xb0);
                assert_eq!(*n, len, "received length");
                assert_eq!(*imm, None);
                got = true
            }
            other => panic!("unexpected completion {other:?}"),
        }
        Ok(sent && got)
    })?;
    assert!(
        host_bytes(&dst) == &data[..],
        "received bytes differ from sent bytes"
    );
    Ok(())
}

/// SEND/RECV of 1 B, 4 KiB and the largest message the backend allows (capped at 8 MiB).
pub fn send_recv_sizes<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let max =
        p.a.caps()
            .max_msg_size
            .min(p.b.caps().max_msg_size)
            .min(8 << 20);
    for len in [1, 4096, max] {
        send_recv_len(p, len)?;
    }
    Ok(())
}

/// WRITE (and WRITE with immediate) lands exactly the right bytes at an offset and nothing
/// else; each immediate arrives exactly once.
pub fn write_at_offset<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    const REGION: usize = 64 << 10;
    for (imm, off, len) in [
        (None, 100usize, 4000usize),
        (Some(0xdead_beefu32), 8192, 40000),
    ] {
        let data = pattern(len, 11);
        let src = host_mr(&mut p.a, &data)?;
        let dst = host_mr(&mut p.b, &vec![0x5au8; REGION])?;
        let remote = dst.remote().slice(off as u64, len as u64)?;
        expect_post(
            p.a.post_write(p.a_to_b, LocalSlice::all(&src), remote, imm, 0x77)?,
            "post_write",
        )?;
        let (mut done, mut imms) = (false, 0);
        wait_pair(&mut p.a, &mut p.b, "write", TIMEOUT, |side, c| {
            c.check()?;
            match (side, &c.kind) {
                (0, CompletionKind::Write) => {
                    assert_eq!(c.ctx, 0x77);
                    done = true
                }
                (1, CompletionKind::RemoteWrite { imm: got }) => {
                    assert_eq!(Some(*got), imm, "immediate");
                    imms += 1
                }
                other => panic!("unexpected completion {other:?}"),
            }
            Ok(done && imms == usize::from(imm.is_some()))
        })?;
        // Give a duplicate immediate the chance to show up, then check there was none.
        let mut extra = 0;
        let _ = wait_pair(
            &mut p.a,
            &mut p.b,
            "no more",
            Duration::from_millis(200),
            |_, c| {
                extra += 1;
                panic!("unexpected extra completion {c:?}")
            },
        );
        assert_eq!(extra, 0);
        let got = host_bytes(&dst);
        assert!(
            got[..off].iter().all(|&b| b == 0x5a),
            "bytes before the target range changed"
        );
        assert!(got[off..off + len] == data[..], "written bytes differ");
        assert!(
            got[off + len..].iter().all(|&b| b == 0x5a),
            "bytes after the target range changed"
        );
    }
    Ok(())
}

/// Many WRITEs with immediates, batched: every immediate arrives exactly once.
pub fn immediates_exactly_once<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    const N: usize = 256;
    const CHUNK: usize = 1024;
    let data = pattern(N * CHUNK, 5);
    let src = host_mr(&mut p.a, &data)?;
    let dst = host_mr(&mut p.b, &vec![0u8; N * CHUNK])?;
    let r = dst.remote();
    let mut seen = vec![0u32; N];
    let (mut posted, mut writes) = (0usize, 0usize);
    let mut imms = 0usize;
    let start = std::time::Instant::now();
    while writes < N || imms < N {
        if start.elapsed() > TIMEOUT {
            return Err(Error::Timeout {
                what: "batched writes".into(),
                after: TIMEOUT,
            });
        }
        if posted < N {
            let mut ops = Vec::with_capacity(16);
            for i in posted..(posted + 16).min(N) {
                ops.push(WriteOp {
                    peer: p.a_to_b,
                    local: LocalSlice::new(&src, i * CHUNK, CHUNK)?,
                    remote: r.slice((i * CHUNK) as u64, CHUNK as u64)?,
                    imm: Some(i as u32),
                    ctx: i as u64,
                });
            }
            posted += p.a.post_writes(&ops)?;
        }
        poll_both(p, |side, c| {
            c.check()?;
            match (side, &c.kind) {
                (0, CompletionKind::Write) => writes += 1,
                (1, CompletionKind::RemoteWrite { imm }) => {
                    seen[*imm as usize] += 1;
                    imms += 1
                }
                other => panic!("unexpected completion {other:?}"),
            }
            Ok(())
        })?;
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "some immediate did not arrive exactly once: {seen:?}"
    );
    assert!(host_bytes(&dst) == &data[..]);
    Ok(())
}

/// Post WRITEs without polling until the queue says full, then drain every completion.
pub fn fill_queue_then_drain<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let src = host_mr(&mut p.a, &[9u8; 64])?;
    let dst = host_mr(&mut p.b, &[0u8; 64])?;
    let limit = 4 * p.a.caps().tx_depth.max(16) + 4096;
    let remote = dst.remote().all();
    let mut posted = 0usize;
    while p
        .a
        .post_write(p.a_to_b, LocalSlice::all(&src), remote, None, posted as u64)?
        == Post::Posted
    {
        posted += 1;
        assert!(posted < limit, "queue never filled after {posted} posts");
    }
    assert!(posted > 0, "queue full before the first post");
    let mut done = 0usize;
    wait_pair(&mut p.a, &mut p.b, "drain", TIMEOUT, |side, c| {
        c.check()?;
        assert_eq!((side, &c.kind), (0, &CompletionKind::Write));
        done += 1;
        Ok(done == posted)
    })?;
    // After draining, posting works again.
    expect_post(
        p.a.post_write(p.a_to_b, LocalSlice::all(&src), remote, Some(1), 1)?,
        "post after drain",
    )?;
    let mut n = 0;
    wait_pair(&mut p.a, &mut p.b, "write after drain", TIMEOUT, |_, c| {
        c.check()?;
        n += 1;
        Ok(n == 2)
    })?;
    assert!(host_bytes(&dst).iter().all(|&b| b == 9));
    Ok(())
}

/// Run one WRITE the target must refuse, as [`Caps::remote_write_errors`] promises.
///
/// Where the endpoint promises remote errors: `Ok(())` when it refused the WRITE at post
/// time or reported an error completion; a hang or a success fails the case. Where it does
/// not (libfabric's `shm`): the initiator may hear nothing or be told of success, but the
/// target must get no completion, and the pair must still carry a good WRITE afterwards.
/// The caller checks the target memory is unchanged in both cases.
///
/// [`Caps::remote_write_errors`]: transport_core::Caps::remote_write_errors
fn expect_write_fails<T: Transport>(
    p: &mut Pair<T>,
    src: &T::Mr,
    remote: RemoteSlice,
    what: &str,
) -> Result<()> {
    match p
        .a
        .post_write(p.a_to_b, LocalSlice::all(src), remote, Some(7), 0xbad)
    {
        Err(e) => {
            eprintln!("{what}: refused at post: {e}");
            return Ok(());
        }
        Ok(Post::QueueFull) => panic!("{what}: queue full on an idle endpoint"),
        Ok(Post::Posted) => {}
    }
    if !p.a.caps().remote_write_errors {
        return expect_write_dropped(p, what);
    }
    let mut failed = None;
    let r = wait_pair(&mut p.a, &mut p.b, what, TIMEOUT, |side, c| {
        match (side, &c.kind) {
            (0, CompletionKind::Error(e)) => {
                assert_eq!(e.ctx, 0xbad);
                assert!(!e.msg.is_empty(), "error completion without text");
                failed = Some(e.to_string());
                Ok(true)
            }
            (_, k) => panic!(
                "{what}: expected an error completion (the endpoint says it reports remote \
                 errors), got {k:?} on side {side}"
            ),
        }
    });
    match (r, failed) {
        (Ok(()), Some(msg)) => {
            eprintln!("{what}: error completion: {msg}");
            Ok(())
        }
        (Err(e), _) => panic!("{what}: no error completion: {e}"),
        (Ok(()), None) => unreachable!(),
    }
}

/// The half of [`expect_write_fails`] for endpoints that do not report remote errors.
fn expect_write_dropped<T: Transport>(p: &mut Pair<T>, what: &str) -> Result<()> {
    let mut initiator = "no completion";
    let deadline = std::time::Instant::now() + Duration::from_millis(500);
    while std::time::Instant::now() < deadline {
        poll_both(p, |side, c| {
            match (side, &c.kind) {
                (0, CompletionKind::Write) if c.ctx == 0xbad => initiator = "told of success",
                (0, CompletionKind::Error(e)) if e.ctx == 0xbad => initiator = "error completion",
                (_, k) => panic!("{what}: the refused WRITE produced {k:?} on side {side}"),
            }
            Ok(())
        })?;
    }
    eprintln!("{what}: refused by the target; initiator {initiator} (no remote errors here)");
    Ok(())
}

/// Whether a pair must still carry WRITEs after one was refused.
#[derive(Clone, Copy, Debug)]
pub enum Recovery {
    /// It must (every endpoint that does not report remote errors, but the one below).
    Required,
    /// A known provider defect: later operations of the initiator to that peer never
    /// complete. The reason names it; the case checks the defect is still there, so the
    /// exemption goes when the defect does.
    KnownBroken(&'static str),
}

/// After a refused WRITE that the initiator was not told about: a good WRITE lands, with
/// its immediate, exactly once (or, under [`Recovery::KnownBroken`], provably does not
/// within a short wait). Where the refusal came back as an error completion, the initiator
/// knows, and what the endpoint allows next is the backend's (an RC queue pair is in the
/// error state), so nothing is checked there.
fn after_refused_write<T: Transport>(p: &mut Pair<T>, recovery: Recovery) -> Result<()> {
    if p.a.caps().remote_write_errors {
        return Ok(());
    }
    let what = "a good WRITE after a refused one";
    let src = host_mr(&mut p.a, &[3u8; 64])?;
    let dst = host_mr(&mut p.b, &[0u8; 64])?;
    let (a_to_b, remote) = (p.a_to_b, dst.remote().all());
    let wait = match recovery {
        Recovery::Required => TIMEOUT,
        Recovery::KnownBroken(_) => Duration::from_secs(2),
    };
    let mut seen = (false, false);
    let mut note = |side: usize, c: &transport_core::Completion| -> Result<bool> {
        c.check()?;
        match (side, &c.kind) {
            (0, CompletionKind::Write) if c.ctx == 0x600d => seen.0 = true,
            (1, CompletionKind::RemoteWrite { imm: 8 }) => seen.1 = true,
            (0, CompletionKind::Write) if c.ctx == 0xbad => {}
            (_, k) => panic!("{what}: unexpected {k:?} on side {side}"),
        }
        Ok(seen.0 && seen.1)
    };
    let start = std::time::Instant::now();
    let r = loop {
        if start.elapsed() > wait {
            break Err(Error::Timeout {
                what: what.into(),
                after: wait,
            });
        }
        match p
            .a
            .post_write(a_to_b, LocalSlice::all(&src), remote, Some(8), 0x600d)?
        {
            Post::Posted => break wait_pair(&mut p.a, &mut p.b, what, wait, &mut note),
            Post::QueueFull => poll_both(p, |side, c| note(side, c).map(|_| ()))?,
        }
    };
    match (recovery, r) {
        (Recovery::Required, r) => {
            r?;
            assert!(host_bytes(&dst).iter().all(|&b| b == 3));
        }
        (Recovery::KnownBroken(why), Err(Error::Timeout { .. })) => {
            eprintln!("{what}: does not complete, as documented: {why}");
        }
        (Recovery::KnownBroken(why), r) => panic!(
            "{what}: expected the documented defect ({why}), got {r:?}: the defect is \
             gone; drop the exemption"
        ),
    }
    Ok(())
}

/// A WRITE with a remote key that does not exist fails clearly.
pub fn bad_remote_key<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    bad_remote_key_with(p, Recovery::Required)
}

/// [`bad_remote_key`], with the recovery expected after the refused WRITE.
pub fn bad_remote_key_with<T: Transport>(p: &mut Pair<T>, recovery: Recovery) -> Result<()> {
    let src = host_mr(&mut p.a, &[1u8; 256])?;
    let dst = host_mr(&mut p.b, &[0u8; 256])?;
    let mut remote = dst.remote().all();
    // Low bits only: verbs keys are 32 bits, and a key outside them is refused before the
    // NIC sees it; this way the NIC (or provider) itself must refuse it.
    remote.key ^= 0x00a5_5a5a;
    expect_write_fails(p, &src, remote, "wrong remote key")?;
    assert!(
        host_bytes(&dst).iter().all(|&b| b == 0),
        "a write with a wrong key changed memory"
    );
    after_refused_write(p, recovery)
}

/// A WRITE past the end of the remote region fails clearly.
pub fn write_past_end<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    write_past_end_with(p, Recovery::Required)
}

/// [`write_past_end`], with the recovery expected after the refused WRITE.
pub fn write_past_end_with<T: Transport>(p: &mut Pair<T>, recovery: Recovery) -> Result<()> {
    let src = host_mr(&mut p.a, &[1u8; 8192])?;
    let dst = host_mr(&mut p.b, &[0u8; 4096])?;
    // The checked constructor refuses it...
    assert!(dst.remote().slice(0, 8192).is_err());
    // ...and a hand-made slice is refused by the provider.
    let remote = RemoteSlice {
        len: 8192,
        ..dst.remote().all()
    };
    expect_write_fails(p, &src, remote, "write past the end")?;
    assert!(
        host_bytes(&dst).iter().all(|&b| b == 0),
        "a write past the end changed memory"
    );
    after_refused_write(p, recovery)
}

/// A local region registered on another endpoint is refused at post time.
pub fn foreign_local_region<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let foreign = host_mr(&mut p.b, &[1u8; 64])?;
    let dst = host_mr(&mut p.b, &[0u8; 64])?;
    let r = p.a.post_write(
        p.a_to_b,
        LocalSlice::all(&foreign),
        dst.remote().all(),
        None,
        1,
    );
    assert!(
        r.is_err(),
        "a region of another endpoint was accepted: {r:?}"
    );
    let r = p.a.post_send(p.a_to_b, LocalSlice::all(&foreign), 2);
    assert!(
        r.is_err(),
        "a region of another endpoint was accepted for send: {r:?}"
    );
    Ok(())
}

/// Garbage and wrong-length peer addresses are errors, not panics.
pub fn bad_peer_address<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    use transport_core::EndpointAddr;
    let good = p.b.address().0;
    let mut cases = vec![vec![], vec![0u8; 3], vec![0xff; good.len() + 17]];
    if good.len() > 1 {
        cases.push(good[..good.len() - 1].to_vec());
    }
    for bytes in cases {
        let r = p.a.add_peer(&EndpointAddr(bytes.clone()));
        assert!(r.is_err(), "address bytes {bytes:02x?} were accepted");
    }
    Ok(())
}

/// Expand the suite as `#[test]` functions in the calling module.
///
/// `$open` is a `fn(usize) -> transport_core::Result<T>` opening side 0 or 1.
/// `suite!(open)` expands every case; `suite!(open; only: case_a, case_b)` expands the named
/// ones, for a backend that replaces a case with its own test (and says why there).
#[macro_export]
macro_rules! suite {
    ($open:path; only: $($case:ident),* $(,)?) => {
        $crate::suite!(@cases $open; $($case),*);
    };
    ($open:path) => {
        $crate::suite!(@cases $open;
            register_deregister, send_recv_sizes, write_at_offset, immediates_exactly_once,
            fill_queue_then_drain, bad_remote_key, write_past_end, foreign_local_region,
            bad_peer_address);
    };
    (@cases $open:path; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                match $crate::connect(&$open) {
                    Ok(Some(mut pair)) => {
                        if let Err(e) = $crate::$case(&mut pair) {
                            panic!("{}: {e}", stringify!($case));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => panic!("{}: connecting the pair failed: {e}", stringify!($case)),
                }
            }
        )*
    };
}
