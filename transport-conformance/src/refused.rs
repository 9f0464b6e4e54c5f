//! The cases where the endpoint must refuse something: a WRITE with a wrong key or past the
//! end of the region (and what the pair must still do afterwards), key bytes the backend
//! cannot read, a local region of another endpoint or a local slice past its end, and
//! malformed peer addresses.

use std::time::Duration;

use transport_core::wait::wait_pair;
use transport_core::{
    CompletionKind, Error, KeyBytes, LocalSlice, MemoryRegion, PeerId, Post, RemoteMr, RemoteSlice,
    Result, Transport, WriteOp,
};

use crate::pair::{poll_both, Pair, TIMEOUT};
use crate::support::{host_bytes, host_mr};

/// A refusal at post or import is a clear error: a provider's (with its text) or an invalid
/// argument, never a timeout or a wordless error that only happens to be an `Err`.
fn check_refusal(what: &str, e: &Error) {
    let text = match e {
        Error::Provider { msg, .. } => msg.as_str(),
        Error::InvalidArgument(m) | Error::Unsupported(m) => m.as_str(),
        other => panic!("{what}: refused with {other:?}, not as a provider or argument error"),
    };
    assert!(
        !text.trim().is_empty(),
        "{what}: refused without a word: {e:?}"
    );
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
    remote: RemoteSlice<T::RemoteKey>,
    what: &str,
) -> Result<()> {
    match p
        .a
        .post_write(p.a_to_b, LocalSlice::all(src), remote, Some(7), 0xbad)
    {
        Err(e) => {
            check_refusal(what, &e);
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
                assert!(
                    !e.hint.is_empty(),
                    "error completion that says not what to do: {e}"
                );
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

/// Post a good WRITE of `src` to `remote` with immediate `imm` (context 0x600d), posting again
/// while the queue is full, and wait up to `wait` for its completion on side a and its
/// immediate on side b. A completion that is neither, nor one `stray` allows, fails the case.
fn good_write<T: Transport>(
    p: &mut Pair<T>,
    what: &str,
    src: &T::Mr,
    remote: RemoteSlice<T::RemoteKey>,
    imm: u32,
    wait: Duration,
    stray: impl Fn(usize, &transport_core::Completion) -> bool,
) -> Result<()> {
    let mut seen = (false, false);
    let mut note = |side: usize, c: &transport_core::Completion| -> Result<bool> {
        c.check()?;
        match (side, &c.kind) {
            (0, CompletionKind::Write) if c.ctx == 0x600d => seen.0 = true,
            (1, CompletionKind::RemoteWrite { imm: i }) if *i == imm => seen.1 = true,
            _ if stray(side, c) => {}
            (_, k) => panic!("{what}: unexpected {k:?} (ctx {:#x}) on side {side}", c.ctx),
        }
        Ok(seen.0 && seen.1)
    };
    let start = std::time::Instant::now();
    loop {
        if start.elapsed() > wait {
            return Err(Error::Timeout {
                what: what.into(),
                after: wait,
            });
        }
        match p
            .a
            .post_write(p.a_to_b, LocalSlice::all(src), remote, Some(imm), 0x600d)?
        {
            Post::Posted => return wait_pair(&mut p.a, &mut p.b, what, wait, &mut note),
            Post::QueueFull => poll_both(p, |side, c| note(side, c).map(|_| ()))?,
        }
    }
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
    let remote = p.import_on_a(&dst)?.all();
    let wait = match recovery {
        Recovery::Required => TIMEOUT,
        Recovery::KnownBroken(_) => Duration::from_secs(2),
    };
    // The refused WRITE's own local completion (ctx 0xbad) may still come.
    let r = good_write(p, what, &src, remote, 8, wait, |side, c| {
        side == 0 && matches!(c.kind, CompletionKind::Write) && c.ctx == 0xbad
    });
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
    let mut mr = dst.remote();
    // The first three bytes only (the low bits of an integer key): the key keeps its length
    // and form, so the NIC (or provider, or the target) itself must refuse it. Where the
    // backend's import already sees it is no key (a packed handle whose bytes it checks),
    // that refusal is the clear error.
    let mut bytes = mr.key.as_bytes().to_vec();
    for (b, x) in bytes.iter_mut().zip([0x5a, 0x5a, 0xa5]) {
        *b ^= x;
    }
    mr.key = KeyBytes::new(bytes)?;
    match p.a.import(p.a_to_b, &mr) {
        Ok(remote) => expect_write_fails(p, &src, remote.all(), "wrong remote key")?,
        Err(e) => {
            check_refusal("wrong remote key", &e);
            eprintln!("wrong remote key: refused at import: {e}")
        }
    }
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
    let region = p.import_on_a(&dst)?;
    // The checked constructor refuses it...
    assert!(region.slice(0, 8192).is_err());
    // ...and a hand-made slice is refused by the provider.
    let remote = RemoteSlice {
        len: 8192,
        ..region.all()
    };
    expect_write_fails(p, &src, remote, "write past the end")?;
    assert!(
        host_bytes(&dst).iter().all(|&b| b == 0),
        "a write past the end changed memory"
    );
    after_refused_write(p, recovery)
}

/// Key bytes the backend cannot read are an error at import, never a crash: a key of
/// another length (another backend's, cut short or padded), garbage of the longest length
/// accepted. So are an import for a peer the endpoint does not have and a region that wraps
/// the address space. Where the backend takes the bytes (they may be of its own form), a
/// WRITE through them must fail as a wrong key does, and the target memory stays untouched.
pub fn bad_key_bytes<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let src = host_mr(&mut p.a, &[1u8; 64])?;
    let dst = host_mr(&mut p.b, &[0u8; 64])?;
    let good = dst.remote();
    let r = p.a.import(PeerId(p.a_to_b.0.wrapping_add(1000)), &good);
    assert!(
        r.is_err(),
        "an import for an unknown peer was accepted: {r:?}"
    );
    let wraps = RemoteMr {
        addr: u64::MAX - 16,
        ..good.clone()
    };
    let r = p.a.import(p.a_to_b, &wraps);
    assert!(r.is_err(), "a region that wraps was accepted: {r:?}");
    let k = good.key.as_bytes();
    let mut cases = vec![
        vec![0xa5],
        [k, &[0]].concat(),
        vec![0xff; KeyBytes::MAX_LEN],
    ];
    if k.len() > 1 {
        cases.push(k[..k.len() - 1].to_vec());
    }
    let mut wrote = false;
    for bytes in cases {
        let what = format!("key bytes {:02x?}", &bytes[..bytes.len().min(12)]);
        let mr = RemoteMr {
            key: KeyBytes::new(bytes)?,
            ..good.clone()
        };
        match p.a.import(p.a_to_b, &mr) {
            Err(e) => {
                check_refusal(&what, &e);
                eprintln!("{what}: refused at import: {e}")
            }
            Ok(remote) => {
                expect_write_fails(p, &src, remote.all(), &what)?;
                wrote = true;
            }
        }
    }
    assert!(
        host_bytes(&dst).iter().all(|&b| b == 0),
        "a write with bad key bytes changed memory"
    );
    if wrote {
        after_refused_write(p, Recovery::Required)?;
    }
    Ok(())
}

/// A local region registered on another endpoint is refused at post time.
pub fn foreign_local_region<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let foreign = host_mr(&mut p.b, &[1u8; 64])?;
    let dst = host_mr(&mut p.b, &[0u8; 64])?;
    let remote = p.import_on_a(&dst)?.all();
    let r =
        p.a.post_write(p.a_to_b, LocalSlice::all(&foreign), remote, None, 1);
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

/// A local slice that runs past its region is refused at post time, by every post: its
/// fields are public, so a caller can build one without [`LocalSlice::new`]'s check, and a
/// backend that posted it would have the provider read or write outside the region (an
/// inline send copies the bytes in user space). Nothing is posted; the pair still works.
pub fn local_past_end<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let src = host_mr(&mut p.a, &[3u8; 64])?;
    let dst = host_mr(&mut p.b, &[0u8; 64])?;
    let remote = p.import_on_a(&dst)?.all();
    // (offset, len): past the end by a byte, starting at the end, wholly beyond it, and an
    // offset whose sum with the length overflows.
    let shapes = [(1, 64), (64, 1), (4096, 8), (usize::MAX - 3, 8)];
    for (offset, len) in shapes {
        let past = LocalSlice {
            mr: &src,
            offset,
            len,
        };
        let what = format!("local slice {offset}+{len} of a 64-byte region");
        let r = p.a.post_send(p.a_to_b, past, 0xbad);
        assert!(r.is_err(), "{what} was accepted for send: {r:?}");
        let r = p.a.post_recv(past, 0xbad);
        assert!(r.is_err(), "{what} was accepted for receive: {r:?}");
        let r = p.a.post_write(p.a_to_b, past, remote, Some(9), 0xbad);
        assert!(r.is_err(), "{what} was accepted for write: {r:?}");
        let op = WriteOp {
            peer: p.a_to_b,
            local: past,
            remote,
            imm: None,
            ctx: 0xbad,
        };
        let r = p.a.post_writes(&[op]);
        assert!(
            r.is_err(),
            "{what} was accepted in a batch of writes: {r:?}"
        );
    }
    // Nothing was posted: no completion comes, and a good WRITE still lands.
    let what = "a good WRITE after refused local slices";
    good_write(p, what, &src, remote, 4, TIMEOUT, |_, _| false)?;
    assert_eq!(
        host_bytes(&dst),
        &[3u8; 64][..],
        "the good WRITE did not land"
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
