//! The shared conformance suite on libfabric's `efa` fabric with the device's RDMA
//! (`FI_EFA_USE_DEVICE_RDMA=1`, as aws-ofi-nccl sets it): WRITEs and READs are the
//! device's own, with out-of-order delivery under the simulator
//! (`ci/efa-sim.sh cargo test -p transport-efa`). Skipped without an efa device.
//!
//! `conformance_efa.rs` runs the backend's defaults, which ask for the library's own API
//! version and so keep device RDMA on without the variable; this file checks that setting it
//! as aws-ofi-nccl does changes nothing (a separate file because the variable is read per
//! process).

use std::sync::Once;

use transport_core::{NicDesc, Result, Transport};
use transport_efa::Endpoint;

fn open(_side: usize) -> Result<Endpoint> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (k, v) in [
            ("FI_EFA_USE_DEVICE_RDMA", "1"),
            ("EFA_SIM_REORDER", "16"),
            ("EFA_SIM_DELAY_US", "200"),
            ("EFA_SIM_SEED", "23"),
        ] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    });
    Endpoint::open(&NicDesc::provider("efa"))
}

transport_conformance::suite!(open);
