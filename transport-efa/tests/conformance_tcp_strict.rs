//! The shared conformance suite on `tcp` with `mr_mode=strict`: the endpoint asks for EFA's
//! memory registration mode (`FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
//! FI_MR_PROV_KEY`) and must honour whatever subset the provider grants.
//!
//! libfabric 1.17's `tcp;ofi_rxm` needs none of those bits and drops them (it grants 0), so
//! there the strict *request* is what is tested; where a provider grants the strict set
//! (EFA, or a tcp that keeps the bits), `STRICT_MR_REQUIRED=1` makes that an assertion.

use std::sync::Once;

use transport_core::{NicDesc, Result, Transport};
use transport_efa::{Endpoint, MrMode};

fn open(_side: usize) -> Result<Endpoint> {
    static LOOPBACK: Once = Once::new();
    LOOPBACK.call_once(|| std::env::set_var("FI_TCP_IFACE", "lo"));
    let mut nic = NicDesc::provider("tcp").with_option("mr_mode", "strict");
    nic.device = Some("lo".into());
    let ep = Endpoint::open(&nic)?;
    check_mode(&ep);
    Ok(ep)
}

fn check_mode(ep: &Endpoint) {
    let granted = ep.mr_mode();
    // Only the strict bits were offered, so nothing else may come back.
    assert!(
        MrMode::STRICT.contains(granted),
        "mr_mode=strict offered {}, the provider granted {granted}",
        MrMode::STRICT
    );
    assert_eq!(ep.requested_mr_mode(), MrMode::STRICT);
    if std::env::var("STRICT_MR_REQUIRED").is_ok_and(|v| v == "1") {
        assert_eq!(
            granted,
            MrMode::STRICT,
            "the provider did not grant the strict set"
        );
    }
}

transport_conformance::suite!(open);

#[test]
fn strict_mode_requested_and_reported() {
    let ep = open(0).expect("open tcp with mr_mode=strict");
    eprintln!(
        "tcp with mr_mode=strict: provider {} (libfabric {}) granted {}",
        ep.provider(),
        Endpoint::libfabric_version(),
        ep.mr_mode()
    );
}
