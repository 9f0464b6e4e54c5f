//! The shared conformance suite on the verbs backend.
//!
//! Side 0 opens `$VERBS_DEV0` (or the first device), side 1 `$VERBS_DEV1` (or the first
//! device); `$VERBS_GID0`/`$VERBS_GID1` override the GID index, which is chosen automatically
//! otherwise. Without an RDMA device every case is skipped, unless
//! `CONFORMANCE_REQUIRE_DEVICE=1`.

use transport_core::{Result, Transport};
use transport_verbs::Endpoint;

fn open(side: usize) -> Result<Endpoint> {
    Endpoint::open(&transport_verbs::test_nic(side)?)
}

transport_conformance::suite!(open);
