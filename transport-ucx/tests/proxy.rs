//! transport-proxy's cases over UCX, shared memory (`sm`) and tcp on loopback: a CPU
//! producer's commands posted by the proxy, counted at the receiver by immediates, every byte
//! verified. UCX's immediate is an active message sent after an endpoint flush covering the
//! put, so a waiter told "N arrived" is told so after the bytes are in place, as on SRD.
//!
//! The cases are transport-proxy's own (its tests run them on libfabric shm, tcp and the efa
//! provider): shared by path, so transport-proxy's tests need no UCX to build.

#[path = "../../transport-proxy/tests/common/cases.rs"]
mod cases;

use cases::Spec;
use transport_conformance::Pair;
use transport_core::{NicDesc, Result, Transport};
use transport_ucx::Endpoint;

fn open(tls: &'static str) -> impl Fn(usize) -> Result<Endpoint> {
    move |_side| {
        let mut nic = NicDesc::provider(tls);
        if tls == "tcp" {
            nic.device = Some("lo".into());
        }
        Endpoint::open(&nic)
    }
}

fn pair(tls: &'static str) -> Pair<Endpoint> {
    transport_conformance::connect(&open(tls))
        .unwrap_or_else(|e| panic!("connecting the UCX {tls} pair: {e}"))
        .unwrap_or_else(|| panic!("UCX {tls} did not open"))
}

#[test]
fn writes_land_and_every_byte_is_there_over_sm() {
    let p = pair("sm");
    let out = cases::writes_land(p.a, p.b, p.a_to_b, Spec::default(), 5).unwrap();
    assert_eq!(out.receiver.arrivals, 600, "{out:?}");
}

#[test]
fn writes_land_and_every_byte_is_there_over_tcp() {
    let p = pair("tcp");
    let out = cases::writes_land(p.a, p.b, p.a_to_b, Spec::default(), 6).unwrap();
    assert_eq!(out.receiver.arrivals, 600, "{out:?}");
}

#[test]
fn fences_between_writes_over_sm() {
    let p = pair("sm");
    let spec = Spec {
        fence_every: 7,
        ..Spec::default()
    };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, spec, 7).unwrap();
    assert_eq!(out.sender.fences, 600 / 7, "{out:?}");
}

/// Data without immediates, a fence, a flag with one: UCX's immediate goes after a flush of
/// every earlier put to the peer, so the flag's arrival says the data landed.
#[test]
fn data_fence_flag_over_sm() {
    let p = pair("sm");
    let spec = Spec {
        n: 200,
        producers: 1,
        flag: true,
        ..Spec::default()
    };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, spec, 8).unwrap();
    assert_eq!(out.arrivals, 1, "{out:?}");
}

#[test]
fn a_bad_command_stops_the_proxy_and_tells_the_producer() {
    let p = pair("sm");
    cases::bad_command_stops_cleanly(p.a, p.a_to_b).unwrap();
}
