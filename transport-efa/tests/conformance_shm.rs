//! The shared conformance suite on libfabric's `shm` provider (same host, shared memory).
//!
//! libfabric 1.x's shm drops a WRITE whose key or range the target cannot verify without
//! answering the initiator: with `FI_DELIVERY_COMPLETE` (this backend's default off EFA) the
//! initiator then never gets a completion, without it the initiator is told the WRITE
//! succeeded. So on libfabric 1.x the two bad-WRITE cases check what the backend can promise
//! there: no success is ever reported, the target memory is untouched, and the caller's
//! bounded wait ends. On libfabric >= 2 the suite's cases run unchanged.

use std::time::Duration;

use transport_conformance::Pair;
use transport_core::wait::wait_pair;
use transport_core::{
    CompletionKind, Error, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, Post,
    RemoteSlice, Result, Transport,
};
use transport_efa::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    Endpoint::open(&NicDesc::provider("shm"))
}

transport_conformance::suite!(open; only:
    register_deregister, send_recv_sizes, write_at_offset, immediates_exactly_once,
    fill_queue_then_drain, foreign_local_region, bad_peer_address);

/// A connected, warmed-up pair.
fn pair() -> Option<Pair<Endpoint>> {
    transport_conformance::connect(&open).expect("connecting the shm pair")
}

fn libfabric_major() -> u32 {
    Endpoint::libfabric_version()
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// Post a WRITE that the target must refuse; it must never be reported as a success.
fn bad_write_never_succeeds(p: &mut Pair<Endpoint>, remote: RemoteSlice, src_len: usize) {
    let src =
        p.a.register(Memory::Host(HostBuffer::from_slice(&vec![1u8; src_len])))
            .expect("register");
    match p
        .a
        .post_write(p.a_to_b, LocalSlice::all(&src), remote, Some(7), 0xbad)
    {
        Err(e) => {
            eprintln!("refused at post: {e}");
            return;
        }
        Ok(Post::QueueFull) => panic!("queue full on an idle endpoint"),
        Ok(Post::Posted) => {}
    }
    let r = wait_pair(
        &mut p.a,
        &mut p.b,
        "bad write",
        Duration::from_secs(2),
        |side, c| match (side, &c.kind) {
            (0, CompletionKind::Error(e)) => {
                assert_eq!(e.ctx, 0xbad);
                Ok(true)
            }
            (_, k) => panic!("a bad WRITE produced {k:?} on side {side}"),
        },
    );
    match r {
        Ok(()) => eprintln!("bad write: error completion"),
        Err(Error::Timeout { .. }) => eprintln!("bad write: no completion (libfabric 1.x shm)"),
        Err(e) => panic!("unexpected: {e}"),
    }
}

#[test]
fn bad_remote_key() {
    let Some(mut p) = pair() else {
        return;
    };
    if libfabric_major() >= 2 {
        transport_conformance::bad_remote_key(&mut p).expect("bad_remote_key");
        return;
    }
    let dst =
        p.b.register(Memory::Host(HostBuffer::new(256)))
            .expect("register");
    let mut remote = dst.remote().all();
    remote.key ^= 0x5a5a_0000_7fff;
    bad_write_never_succeeds(&mut p, remote, 256);
    let bytes = dst.memory().host().map(|h| h.as_slice().to_vec());
    assert!(bytes.is_some_and(|b| b.iter().all(|&x| x == 0)));
}

#[test]
fn write_past_end() {
    let Some(mut p) = pair() else {
        return;
    };
    if libfabric_major() >= 2 {
        transport_conformance::write_past_end(&mut p).expect("write_past_end");
        return;
    }
    let dst =
        p.b.register(Memory::Host(HostBuffer::new(4096)))
            .expect("register");
    let remote = RemoteSlice {
        len: 8192,
        ..dst.remote().all()
    };
    bad_write_never_succeeds(&mut p, remote, 8192);
}
