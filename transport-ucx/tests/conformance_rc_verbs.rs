//! The shared conformance suite on UCX over rc_verbs (`TLS=rc_verbs,tcp`), side 0 on
//! `RDMA_BENCH_UCX_DEV0` and side 1 on `RDMA_BENCH_UCX_DEV1` (`NET_DEVICES`; default
//! `rxe0:1,veth0` and `rxe1:1,veth1`: the Soft-RoCE VM's, `ci/ucx-vm-test.sh`).
//!
//! rc_verbs alone does not connect: UCX wires an rc endpoint up over another transport and
//! says `no auxiliary transport to <no debug data>: Unsupported operation` (select.c) where
//! there is none. ud_verbs, UCX's usual one, did not work on Debian 12's rxe under TCG: the
//! wireup request went out over ud_verbs and no answer came; closing the endpoint then
//! aborted the process in UCX 1.13.1 (`ucp_request.c:684 Assertion ... got REQ message`).
//! tcp on the veth beside the rxe device is the wire-up transport here. Where UCX opens no rc_verbs transport (no RDMA device, or a UCX
//! without libuct_ib.so) every case is a skip, noted, unless `CONFORMANCE_REQUIRE_DEVICE=1`.

use transport_core::{NicDesc, Result, Transport};
use transport_ucx::Endpoint;

fn open(side: usize) -> Result<Endpoint> {
    let var = format!("RDMA_BENCH_UCX_DEV{side}");
    let dev = std::env::var(&var).unwrap_or_else(|_| format!("rxe{side}:1,veth{side}"));
    let mut nic = NicDesc::provider("rc_verbs,tcp");
    nic.device = Some(dev);
    let ep = Endpoint::open(&nic)?;
    assert_eq!(
        ep.runtime().settings["err_mode"],
        "peer",
        "auto on rc_verbs"
    );
    Ok(ep)
}

transport_conformance::suite!(open);
