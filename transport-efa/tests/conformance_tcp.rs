//! The shared conformance suite on libfabric's `tcp` provider over the loopback interface
//! (`tcp;ofi_rxm` on libfabric 1.17).

use std::sync::Once;

use transport_core::{NicDesc, Result, Transport};
use transport_efa::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    static LOOPBACK: Once = Once::new();
    // Before the first fi_getinfo: keep the tcp provider on 127.0.0.1.
    LOOPBACK.call_once(|| std::env::set_var("FI_TCP_IFACE", "lo"));
    let mut nic = NicDesc::provider("tcp");
    nic.device = Some("lo".into());
    Endpoint::open(&nic)
}

transport_conformance::suite!(open);

/// tcp reports a refused WRITE when the initiator waits for delivery (the default off EFA),
/// and says it does not when asked for transmit completions only.
#[test]
fn tcp_reports_remote_write_errors_with_delivery_complete() {
    let ep = open(0).expect("open tcp");
    assert!(ep.caps().remote_write_errors);
    let mut nic = NicDesc::provider("tcp").with_option("write_completion", "transmit");
    nic.device = Some("lo".into());
    let ep = Endpoint::open(&nic).expect("open tcp, transmit completions");
    assert!(!ep.caps().remote_write_errors);
}

/// CI builds and tests against several libfabric releases; `LIBFABRIC_EXPECT=2.6` makes
/// sure the headers the bindings came from and the library loaded are that release, not a
/// stale build or the system's 1.17 picked up by accident.
#[test]
fn built_and_running_against_the_expected_libfabric() {
    let (headers, runtime) = (
        Endpoint::libfabric_header_version(),
        Endpoint::libfabric_version(),
    );
    eprintln!("libfabric: headers {headers}, library {runtime}");
    if let Ok(want) = std::env::var("LIBFABRIC_EXPECT") {
        assert_eq!(headers, want, "bindings generated from other headers");
        assert_eq!(runtime, want, "another libfabric loaded at run time");
    }
}
