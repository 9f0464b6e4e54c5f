//! The proxy over libfabric's `shm` provider: a CPU producer's commands, posted by the proxy,
//! counted at the receiver by immediates, every byte verified.

mod common;

use common::cases::{self, Spec};
use transport_conformance::Pair;
use transport_core::{NicDesc, Result, Transport};
use transport_efa::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    Endpoint::open(&NicDesc::provider("shm"))
}

fn pair() -> Option<Pair<Endpoint>> {
    transport_conformance::connect(&open).expect("connecting the shm pair")
}

#[test]
fn writes_land_and_every_byte_is_there() {
    let Some(p) = pair() else { return };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, Spec::default(), 1).unwrap();
    assert_eq!(out.receiver.arrivals, 600, "{out:?}");
}

#[test]
fn fences_between_writes() {
    let Some(p) = pair() else { return };
    let spec = Spec {
        fence_every: 7,
        ..Spec::default()
    };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, spec, 2).unwrap();
    assert_eq!(out.sender.fences, 600 / 7, "{out:?}");
}

#[test]
fn a_bad_command_stops_the_proxy_and_tells_the_producer() {
    let Some(p) = pair() else { return };
    cases::bad_command_stops_cleanly(p.a, p.a_to_b).unwrap();
}
