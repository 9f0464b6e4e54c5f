//! The cases where data must arrive: registration, SEND/RECV, WRITE at an offset, batched
//! immediates, and a full send queue drained.

use std::time::Duration;

use transport_core::wait::wait_pair;
use transport_core::{
    CompletionKind, Error, LocalSlice, MemoryRegion, Post, Result, Transport, WriteOp,
};

use crate::pair::{poll_both, Pair, TIMEOUT};
use crate::support::{expect_post, host_bytes, host_mr, pattern};

/// Register host memory of a few sizes on both sides and deregister it, getting it back intact.
pub fn register_deregister<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    for len in [1usize, 4096, 1 << 20] {
        let data = pattern(len, 7);
        let mr = host_mr(&mut p.a, &data)?;
        assert_eq!(mr.len(), len);
        let r = mr.remote();
        assert_eq!(r.len, len as u64);
        let mem = p.a.deregister(mr)?;
        assert_eq!(mem.host().map(|h| h.to_vec()), Some(data));
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
        host_bytes(&dst) == data,
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
        let remote = p.import_on_a(&dst)?.slice(off as u64, len as u64)?;
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
    immediates_n(p, 256, 1024)
}

/// `n` WRITEs of 64 bytes with immediates, batched, every immediate exactly once and every
/// byte in place: enough (a few thousand) to wrap a backend's queues of posted receives for
/// immediates (`FI_RX_CQ_DATA`) several times, which only holds where each receive is posted
/// again as its immediate completes.
pub fn immediates_many<T: Transport>(p: &mut Pair<T>, n: usize) -> Result<()> {
    immediates_n(p, n, 64)
}

fn immediates_n<T: Transport>(p: &mut Pair<T>, n: usize, chunk: usize) -> Result<()> {
    let data = pattern(n * chunk, 5);
    let src = host_mr(&mut p.a, &data)?;
    let dst = host_mr(&mut p.b, &vec![0u8; n * chunk])?;
    let r = p.import_on_a(&dst)?;
    let mut seen = vec![0u32; n];
    let (mut posted, mut writes) = (0usize, 0usize);
    let mut imms = 0usize;
    let start = std::time::Instant::now();
    while writes < n || imms < n {
        if start.elapsed() > TIMEOUT {
            return Err(Error::Timeout {
                what: format!(
                    "{n} WRITEs with immediates: {posted} posted, {writes} completed, {imms} \
                     immediates arrived"
                ),
                after: TIMEOUT,
            });
        }
        if posted < n {
            let mut ops = Vec::with_capacity(16);
            for i in posted..(posted + 16).min(n) {
                ops.push(WriteOp {
                    peer: p.a_to_b,
                    local: LocalSlice::new(&src, i * chunk, chunk)?,
                    remote: r.slice((i * chunk) as u64, chunk as u64)?,
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
                    match seen.get_mut(*imm as usize) {
                        Some(s) => *s += 1,
                        None => panic!("immediate {imm} was never sent (0..{n} were)"),
                    }
                    imms += 1
                }
                other => panic!("unexpected completion {other:?}"),
            }
            Ok(())
        })?;
    }
    let bad: Vec<(usize, u32)> = (0..n)
        .filter(|&i| seen[i] != 1)
        .map(|i| (i, seen[i]))
        .take(16)
        .collect();
    assert!(
        bad.is_empty(),
        "immediates that did not arrive exactly once (immediate, times): {bad:?}"
    );
    assert!(host_bytes(&dst) == data);
    Ok(())
}

/// Post WRITEs without polling until the queue says full, then drain every completion.
pub fn fill_queue_then_drain<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let src = host_mr(&mut p.a, &[9u8; 64])?;
    let dst = host_mr(&mut p.b, &[0u8; 64])?;
    let limit = 4 * p.a.caps().tx_depth.max(16) + 4096;
    let remote = p.import_on_a(&dst)?.all();
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
    assert!(host_bytes(&dst).iter().all(|&b| b == 9));
    // After draining, posting works again: new bytes, one completion on each side.
    let src2 = host_mr(&mut p.a, &[10u8; 64])?;
    expect_post(
        p.a.post_write(p.a_to_b, LocalSlice::all(&src2), remote, Some(1), 1)?,
        "post after drain",
    )?;
    let (mut wrote, mut landed) = (false, false);
    wait_pair(
        &mut p.a,
        &mut p.b,
        "write after drain",
        TIMEOUT,
        |side, c| {
            c.check()?;
            match (side, &c.kind) {
                (0, CompletionKind::Write) if !wrote && c.ctx == 1 => wrote = true,
                (1, CompletionKind::RemoteWrite { imm: 1 }) if !landed => landed = true,
                other => panic!(
                    "unexpected completion after the drain: {other:?} (ctx {})",
                    c.ctx
                ),
            }
            Ok(wrote && landed)
        },
    )?;
    p.b.make_gpu_visible(&dst)?;
    assert!(
        host_bytes(&dst).iter().all(|&b| b == 10),
        "the WRITE after the drain did not land"
    );
    Ok(())
}

/// What a consumer does after the completions that announce a region's bytes:
/// [`Transport::make_gpu_visible`] on the region (here host memory, which needs nothing), then
/// read. On both sides, for a WRITE with immediate and for a receive, the call succeeds and
/// the bytes are the new ones, and no completion comes beyond the four the operations owe.
/// (GPU memory: `transport-efa/tests/gpu.rs` and `gpu_visibility.rs` on the GPU host.)
pub fn visible_after_completion<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let data = pattern(4096, 5);
    let src = host_mr(&mut p.a, &data)?;
    let dst = host_mr(&mut p.b, &[0u8; 8192])?;
    let remote = p.import_on_a(&dst)?.slice(4096, 4096)?;
    expect_post(
        p.b.post_recv(LocalSlice::new(&dst, 0, 4096)?, 0xb1)?,
        "post_recv",
    )?;
    expect_post(
        p.a.post_write(p.a_to_b, LocalSlice::all(&src), remote, Some(7), 0xa1)?,
        "post_write",
    )?;
    expect_post(
        p.a.post_send(p.a_to_b, LocalSlice::all(&src), 0xa2)?,
        "post_send",
    )?;
    let (mut local, mut landed, mut received) = (0, false, false);
    wait_pair(&mut p.a, &mut p.b, "write and send", TIMEOUT, |side, c| {
        c.check()?;
        match (side, &c.kind) {
            (0, CompletionKind::Write | CompletionKind::Send) if local < 2 => local += 1,
            (1, CompletionKind::RemoteWrite { imm: 7 }) => landed = true,
            (1, CompletionKind::Recv { len: 4096, .. }) => received = true,
            other => panic!("unexpected completion {other:?}"),
        }
        Ok(local == 2 && landed && received)
    })?;
    // Four operations, four completions: a fifth (a local one reported twice, say) may come
    // after the remote ones that ended the wait, so both sides are polled a while longer.
    let settle = std::time::Instant::now() + Duration::from_millis(100);
    while std::time::Instant::now() < settle {
        poll_both(p, |side, c| {
            panic!("an extra completion {c:?} on side {side}")
        })?;
    }
    p.b.make_gpu_visible(&dst)?;
    p.a.make_gpu_visible(&src)?;
    let got = host_bytes(&dst);
    assert!(got[..4096] == data[..], "received bytes differ");
    assert!(got[4096..] == data[..], "written bytes differ");
    Ok(())
}
