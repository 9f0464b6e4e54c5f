//! The shared conformance suite on UCX over tcp only, on the loopback interface
//! (`TLS=tcp`, `NET_DEVICES=lo`).

use transport_core::{NicDesc, Result, Transport};
use transport_ucx::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    let mut nic = NicDesc::provider("tcp");
    nic.device = Some("lo".into());
    let ep = Endpoint::open(&nic)?;
    assert_eq!(ep.runtime().settings["err_mode"], "peer", "auto on tcp");
    Ok(ep)
}

transport_conformance::suite!(open);

/// Many batched WRITEs with immediates: each exactly once, every byte in place.
#[test]
fn immediates_many() {
    let mut p = transport_conformance::connect(&open)
        .unwrap()
        .expect("tcp on lo always opens");
    transport_conformance::immediates_many(&mut p, 5000).unwrap();
}
