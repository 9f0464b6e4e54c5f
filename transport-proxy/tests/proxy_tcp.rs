//! The proxy over libfabric's `tcp` provider on loopback (`FI_TCP_IFACE=lo`): commands posted
//! by the proxy, counted at the receiver by immediates, every byte verified; a WRITE to a
//! deregistered region comes back as an error completion (tcp reports them) and stops the
//! proxy with the error word set.

mod common;

use std::sync::Once;

use common::cases::{self, Spec};
use transport_conformance::Pair;
use transport_core::{NicDesc, Result, Transport};
use transport_efa::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    static LOOPBACK: Once = Once::new();
    LOOPBACK.call_once(|| std::env::set_var("FI_TCP_IFACE", "lo"));
    let mut nic = NicDesc::provider("tcp");
    nic.device = Some("lo".into());
    Endpoint::open(&nic)
}

fn pair() -> Option<Pair<Endpoint>> {
    transport_conformance::connect(&open).expect("connecting the tcp pair")
}

#[test]
fn writes_land_and_every_byte_is_there() {
    let Some(p) = pair() else { return };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, Spec::default(), 3).unwrap();
    assert_eq!(out.receiver.arrivals, 600, "{out:?}");
}

#[test]
fn data_fence_flag() {
    // tcp's WRITEs complete at delivery here (the backend's default off EFA): a flag after a
    // fence lands after the data.
    let Some(p) = pair() else { return };
    let spec = Spec {
        n: 200,
        producers: 1,
        flag: true,
        ..Spec::default()
    };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, spec, 4).unwrap();
    assert_eq!(out.arrivals, 1, "{out:?}");
}

#[test]
fn an_error_completion_sets_the_error_word() {
    let Some(p) = pair() else { return };
    cases::error_completion_sets_the_error_word(p.a, p.b, p.a_to_b).unwrap();
}

#[test]
fn a_bad_command_stops_the_proxy_and_tells_the_producer() {
    let Some(p) = pair() else { return };
    cases::bad_command_stops_cleanly(p.a, p.a_to_b).unwrap();
}
