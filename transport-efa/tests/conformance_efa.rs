//! The shared conformance suite on libfabric's `efa` provider: on AWS hardware, or anywhere
//! under the simulated EFA device (`ci/efa-sim.sh cargo test -p transport-efa`).
//!
//! Without an efa provider with a device (no EFA, no simulator) every case is skipped with
//! a note on stderr; `CONFORMANCE_REQUIRE_DEVICE=1` makes that a failure instead.
//!
//! Under the simulator the device delivers out of order: unless they are set already, the
//! first open sets `EFA_SIM_REORDER=16`, `EFA_SIM_DELAY_US=200` and `EFA_SIM_SEED=17`, so
//! SRD's unordered delivery (an immediate before an earlier WRITE's completion, a later
//! SEND first) is what every case runs against. Real EFA ignores these variables.
//!
//! This file runs the endpoint as the backend opens it by default: the highest API version
//! the library knows, so device RDMA stays on where the device has it (below 1.18 the efa
//! fabric's RDM protocol emulated WRITEs with SENDs on 0xefa0/0xefa1 devices, and an emulated
//! WRITE with a bad key crashes the target in libfabric 2.6.0, see
//! `conformance_efa_device_rdma.rs`), and SENDs limited to what the fabric reports per
//! endpoint (`FI_OPT_MAX_MSG_SIZE`: one device message, 8928 bytes, on efa-direct).

use std::sync::Once;

use transport_core::{Error, NicDesc, Result, Transport};
use transport_efa::Endpoint;

/// Before the first `fi_getinfo` (which loads the device): the simulator's fault knobs.
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

transport_conformance::suite!(open);

/// What the backend says of a default efa endpoint (printed for the record).
#[test]
fn efa_fabric_opens() {
    match open(0) {
        Ok(ep) => eprintln!(
            "efa: libfabric {}, caps {:?}, mr_mode {}",
            Endpoint::libfabric_version(),
            ep.caps(),
            ep.mr_mode()
        ),
        Err(Error::NoDevice(why)) if std::env::var("CONFORMANCE_REQUIRE_DEVICE").is_err() => {
            transport_core::skip::note("no device (transport_efa)", &why)
        }
        Err(e) => panic!("open efa: {e}"),
    }
}

/// The efa-direct fabric: no RDM protocol, the device's own SEND, WRITE and immediates.
/// On a device with unsolicited write receive (the simulator's default `minimal`).
mod efa_direct {
    use super::*;

    fn open(_side: usize) -> Result<Endpoint> {
        faults_on();
        Endpoint::open(&NicDesc::provider("efa").with_option("fabric", "efa-direct"))
    }

    transport_conformance::suite!(open);

    /// SENDs of 1 B, 4 KiB and the device's message size (8928 on every EFA generation), which
    /// is what the endpoint reports as its largest message.
    #[test]
    fn send_recv_up_to_the_mtu() {
        match transport_conformance::connect(&open) {
            Ok(Some(mut p)) => {
                let caps = p.a.caps();
                eprintln!(
                    "efa-direct: max_msg_size {}, max_write_size {}",
                    caps.max_msg_size, caps.max_write_size
                );
                assert!(caps.max_msg_size < caps.max_write_size, "{caps:?}");
                for len in [1, 4096, 8928] {
                    transport_conformance::send_recv_len(&mut p, len)
                        .unwrap_or_else(|e| panic!("send/recv of {len} B: {e}"));
                }
            }
            Ok(None) => {}
            Err(e) => panic!("connecting the efa-direct pair: {e}"),
        }
    }
}
