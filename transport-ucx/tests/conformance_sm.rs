//! The shared conformance suite on UCX over shared memory only (`TLS=sm`: posix, sysv, cma).
//!
//! UCX 1.13's posix and sysv transports have no peer failure handler, so `ucp_ep_create` with
//! `UCP_ERR_HANDLING_MODE_PEER` finds no transport for active messages ("no peer failure
//! handler"): shared memory alone runs with `peer_errors=off` (what `auto`, the default,
//! picks for shared-memory transports only; ucx_perftest's default too).
//! `peer_errors_need_a_transport_that_has_them` checks the refusal with `on` says so.

use transport_core::{Error, NicDesc, Result, Transport};
use transport_ucx::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    let ep = Endpoint::open(&NicDesc::provider("sm"))?;
    assert_eq!(ep.runtime().settings["err_mode"], "none", "auto on sm");
    assert_eq!(
        ep.runtime().settings["progress_burst"],
        "8",
        "default on sm"
    );
    Ok(ep)
}

transport_conformance::suite!(open);

/// Many batched WRITEs with immediates: each exactly once, every byte in place.
#[test]
fn immediates_many() {
    let mut p = transport_conformance::connect(&open)
        .unwrap()
        .expect("sm always opens");
    transport_conformance::immediates_many(&mut p, 5000).unwrap();
}

#[test]
fn peer_errors_need_a_transport_that_has_them() {
    let nic = NicDesc::provider("sm").with_option("peer_errors", "on");
    let (mut a, b) = (Endpoint::open(&nic).unwrap(), Endpoint::open(&nic).unwrap());
    match a.add_peer(&b.address()) {
        Err(e @ Error::Provider { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("unreachable") && m.contains("peer_errors=off"),
                "{m}"
            );
        }
        other => panic!("UCX 1.13 sm with peer errors: {other:?}"),
    }
}

/// `memh` (SEND and RECV naming their region) is on by default, can be turned off, and a
/// value it does not know is refused; the run record says which.
#[test]
fn memh_option() {
    let on = Endpoint::open(&NicDesc::provider("sm")).unwrap();
    assert_eq!(on.runtime().settings["memh"], "on");
    let off = Endpoint::open(&NicDesc::provider("sm").with_option("memh", "off")).unwrap();
    assert_eq!(off.runtime().settings["memh"], "off");
    match Endpoint::open(&NicDesc::provider("sm").with_option("memh", "maybe")) {
        Err(e) => assert!(e.to_string().contains("memh"), "{e}"),
        Ok(_) => panic!("memh=maybe was taken"),
    }
}

/// A small WRITE with immediate between host memories travels as one active message that the
/// target's handler writes by address (no rkey check by UCX): the region's token, carried in
/// its key, is what keeps a stale or foreign key from writing. Here a's key bytes belong to
/// region `other` while its address and length are region `dst`'s: nothing lands in `dst`,
/// no immediate arrives, and a WRITE with `dst`'s own key afterwards lands.
#[test]
fn a_foreign_key_writes_nothing_by_active_message() {
    use transport_core::{HostBuffer, Memory, MemoryRegion, RemoteMr};
    let mut p = transport_conformance::connect(&open)
        .unwrap()
        .expect("sm always opens");
    let dst = p.b.register(Memory::Host(HostBuffer::new(64))).unwrap();
    let other = p.b.register(Memory::Host(HostBuffer::new(64))).unwrap();
    let src =
        p.a.register(Memory::Host(HostBuffer::from_slice(&[0x5a; 32])))
            .unwrap();
    let forged = RemoteMr {
        key: other.remote().key,
        ..dst.remote()
    };
    let wrong = p.a.import(p.a_to_b, &forged).unwrap().slice(0, 32).unwrap();
    let right = p.import_on_a(&dst).unwrap().slice(0, 32).unwrap();
    let (w, imms) = write_imm(&mut p, &src, wrong, 7, false);
    assert_eq!(w, 1, "the initiator is told of the WRITE");
    assert!(
        imms.is_empty(),
        "a foreign key's immediate arrived: {imms:?}"
    );
    assert_eq!(
        &dst.memory().host().unwrap().to_vec()[..32],
        &[0u8; 32][..],
        "a foreign key's WRITE landed in the region"
    );
    // Active messages on one endpoint arrive in order: 8 alone says 7 never will.
    let (w, imms) = write_imm(&mut p, &src, right, 8, true);
    assert_eq!((w, imms), (1, vec![8]), "the region's own key");
    assert_eq!(
        &dst.memory().host().unwrap().to_vec()[..32],
        &[0x5a; 32][..],
        "the region's own key: the bytes"
    );
}

/// Post one WRITE of all of `src` with immediate `imm` from a to b, then poll both until a's
/// `Write` completion came and, where `arrives`, an immediate at b (at most 20 s), and for
/// half a second more: a's `Write` completions and the immediates b saw.
fn write_imm(
    p: &mut transport_conformance::Pair<Endpoint>,
    src: &<Endpoint as Transport>::Mr,
    remote: transport_core::RemoteSlice<<Endpoint as Transport>::RemoteKey>,
    imm: u32,
    arrives: bool,
) -> (u32, Vec<u32>) {
    use std::time::{Duration, Instant};
    use transport_core::{CompletionKind, LocalSlice, Post};
    let to = p.a_to_b;
    let r =
        p.a.post_write(to, LocalSlice::all(src), remote, Some(imm), u64::from(imm))
            .unwrap();
    assert_ne!(r, Post::QueueFull);
    let (mut writes, mut imms) = (0, Vec::new());
    let start = Instant::now();
    let mut settled: Option<Instant> = None;
    while settled.is_none_or(|t| t.elapsed() < Duration::from_millis(500)) {
        if settled.is_none() && writes > 0 && (!arrives || !imms.is_empty()) {
            settled = Some(Instant::now());
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no completion in 20 s: {writes} WRITE(s), immediates {imms:?}"
        );
        transport_conformance::poll_both(p, |side, c| {
            c.check()?;
            match (side, &c.kind) {
                (0, CompletionKind::Write) => writes += 1,
                (1, CompletionKind::RemoteWrite { imm }) => imms.push(*imm),
                _ => {}
            }
            Ok(())
        })
        .unwrap();
    }
    (writes, imms)
}
