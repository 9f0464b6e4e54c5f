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
