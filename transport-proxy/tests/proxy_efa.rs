//! The proxy over libfabric's `efa` provider: on AWS hardware, or anywhere under the simulated
//! EFA device (`ci/efa-sim.sh cargo test -p transport-proxy --test proxy_efa`), where the
//! device delivers out of order and late: unless set already, the first open sets
//! `EFA_SIM_REORDER=16`, `EFA_SIM_DELAY_US=200` and `EFA_SIM_SEED=17`. SRD does not order
//! WRITEs: the producer learns they landed from the receiver's counted immediates only, and
//! every byte is verified after. Without an efa device every case is a noted skip
//! (`CONFORMANCE_REQUIRE_DEVICE=1` makes that a failure).

mod common;

use std::sync::Once;

use common::cases::{self, Spec};
use transport_conformance::Pair;
use transport_core::{NicDesc, Result, Transport};
use transport_efa::Endpoint;

fn faults_on() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (k, v) in [
            ("EFA_SIM_REORDER", "16"),
            ("EFA_SIM_DELAY_US", "200"),
            ("EFA_SIM_SEED", "17"),
        ] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    });
}

fn open(_side: usize) -> Result<Endpoint> {
    faults_on();
    Endpoint::open(&NicDesc::provider("efa"))
}

fn open_direct(_side: usize) -> Result<Endpoint> {
    faults_on();
    Endpoint::open(&NicDesc::provider("efa").with_option("fabric", "efa-direct"))
}

fn pair(open: &dyn Fn(usize) -> Result<Endpoint>) -> Option<Pair<Endpoint>> {
    transport_conformance::connect(open).expect("connecting the efa pair")
}

fn spec() -> Spec {
    Spec {
        n: 300,
        // efa-direct: one device message per WRITE is not a limit (WRITEs go to 1 GiB).
        sizes: &[8, 1, 4096, 65536, 100, 3000, 16384, 64],
        ..Spec::default()
    }
}

#[test]
fn efa_writes_land_out_of_order_and_every_byte_is_there() {
    let Some(p) = pair(&open) else { return };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, spec(), 5).unwrap();
    assert_eq!(out.receiver.arrivals, 300, "{out:?}");
}

#[test]
fn efa_direct_writes_land_out_of_order_and_every_byte_is_there() {
    let Some(p) = pair(&open_direct) else { return };
    let out = cases::writes_land(p.a, p.b, p.a_to_b, spec(), 6).unwrap();
    assert_eq!(out.receiver.arrivals, 300, "{out:?}");
}

#[test]
fn efa_a_bad_command_stops_the_proxy_and_tells_the_producer() {
    let Some(p) = pair(&open) else { return };
    cases::bad_command_stops_cleanly(p.a, p.a_to_b).unwrap();
}
