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
//! This file runs the endpoint as the backend opens it by default. On 0xefa0/0xefa1
//! devices (p4d, p5) the efa fabric's RDM protocol then emulates WRITEs with SENDs,
//! because the backend asks for API 1.17 and libfabric turns device RDMA off below 1.18
//! there (`efa_rdm_get_use_device_rdma`). `conformance_efa_device_rdma.rs` runs the suite
//! again with `FI_EFA_USE_DEVICE_RDMA=1`, where WRITEs are the device's.
//!
//! Left out here, with the reason:
//! - `bad_remote_key` and `write_past_end` on the efa fabric: an emulated WRITE with a bad
//!   key or range crashes the *target* process in libfabric 2.6.0
//!   (`efa_rdm_rma_verified_copy_iov` reads the MR context before checking that
//!   `ofi_mr_map_verify` failed: SIGSEGV in `efa_rdm_pke_proc_eager_rtw`; where it survives
//!   that, `efa_base_ep_write_eq_error` with no EQ bound calls `abort()`), and the
//!   initiator is told of success although the backend says `remote_write_errors`. Both
//!   pass with device RDMA (the other file).
//! - `send_recv_sizes` on efa-direct: the backend offers `max_msg_size` = the fabric's
//!   `ep_attr->max_msg_size`, which on efa-direct is the RDMA size (1 GiB), but a SEND
//!   there is one device message of at most the port's `max_msg_sz` (8928): the 8 MiB
//!   SEND fails with `FI_EMSGSIZE` (EFA status 6). `efa_direct::send_recv_up_to_the_mtu`
//!   checks what does work.

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

transport_conformance::suite!(open; only:
    register_deregister, send_recv_sizes, write_at_offset, immediates_exactly_once,
    fill_queue_then_drain, foreign_local_region, bad_peer_address);

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
            eprintln!("conformance: skipped, no device: {why}")
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

    transport_conformance::suite!(open; only:
        register_deregister, write_at_offset, immediates_exactly_once, fill_queue_then_drain,
        bad_remote_key, write_past_end, foreign_local_region, bad_peer_address);

    /// SENDs of 1 B, 4 KiB and the device's message size (8928 on every EFA generation).
    #[test]
    fn send_recv_up_to_the_mtu() {
        match transport_conformance::connect(&open) {
            Ok(Some(mut p)) => {
                eprintln!(
                    "efa-direct: the backend offers max_msg_size {}",
                    p.a.caps().max_msg_size
                );
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
