//! The shared conformance suite on UCX over tcp only, on the loopback interface
//! (`TLS=tcp`, `NET_DEVICES=lo`): WRITEs as active messages (`write=auto`: UCX has no RMA
//! lane to the peer, it would emulate puts), and in `put` as puts (`write=put`).

use transport_core::{NicDesc, Result, Transport};
use transport_ucx::Endpoint;

/// tcp on lo with option `write` as given (`None`: the default), checked in the endpoint's
/// settings.
fn open_with(write: Option<&str>) -> Result<Endpoint> {
    let mut nic = NicDesc::provider("tcp");
    if let Some(w) = write {
        nic = nic.with_option("write", w);
    }
    nic.device = Some("lo".into());
    let ep = Endpoint::open(&nic)?;
    let settings = ep.runtime().settings;
    assert_eq!(settings["err_mode"], "peer", "auto on tcp");
    assert_eq!(settings["progress_burst"], "1", "default on tcp alone");
    assert_eq!(
        settings["write"].split(' ').next(),
        Some(write.unwrap_or("auto"))
    );
    Ok(ep)
}

fn open(_side: usize) -> Result<Endpoint> {
    open_with(None)
}

transport_conformance::suite!(open);

/// Many batched WRITEs with immediates: each exactly once, every byte in place; the WRITEs
/// went as `write` says (`am` or `put`) once the peer was added.
fn many(open: &dyn Fn(usize) -> Result<Endpoint>, write: &str) {
    let mut p = transport_conformance::connect(open)
        .unwrap()
        .expect("tcp on lo always opens");
    assert_eq!(p.a.runtime().settings["write"], write);
    transport_conformance::immediates_many(&mut p, 5000).unwrap();
}

#[test]
fn immediates_many() {
    many(&open, "am");
}

/// The suite again with WRITEs as UCX's puts (emulated over tcp).
mod put {
    fn open(_side: usize) -> transport_core::Result<transport_ucx::Endpoint> {
        super::open_with(Some("put"))
    }

    transport_conformance::suite!(open);

    #[test]
    fn immediates_many() {
        super::many(&open, "put");
    }
}

/// A peer that went away (its endpoint dropped, its sockets closed): SENDs to it end in an
/// error, a refused post or an error completion carrying UCX's text, within the wait; never
/// an abort, a hang or a success forever.
#[test]
fn a_dead_peer_is_an_error() {
    use std::time::{Duration, Instant};
    use transport_core::{Completion, CompletionKind, HostBuffer, LocalSlice, Memory, Post};
    let p = transport_conformance::connect(&open)
        .unwrap()
        .expect("tcp on lo always opens");
    let transport_conformance::Pair {
        mut a, b, a_to_b, ..
    } = p;
    let src = a.register(Memory::Host(HostBuffer::new(4096))).unwrap();
    drop(b);
    let start = Instant::now();
    let mut out: [Completion; 16] = Default::default();
    let how = 'outer: loop {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "SENDs to a dead peer still succeed after 30 s"
        );
        match a.post_send(a_to_b, LocalSlice::all(&src), 1) {
            Err(e) => break format!("refused post: {e}"),
            Ok(Post::Posted | Post::QueueFull) => {}
        }
        let n = a.poll(&mut out).unwrap();
        for c in &out[..n] {
            if let CompletionKind::Error(e) = &c.kind {
                assert!(!e.msg.is_empty());
                assert!(!e.hint.is_empty(), "no hint: {e}");
                break 'outer format!("error completion: {e}");
            }
        }
    };
    eprintln!("dead peer: {how}");
}
