//! The libfabric fabric and domain an endpoint opens. The domain is shared (an `Arc`) by the
//! endpoint and every region registered on it, so it closes after the last of them, and the
//! fabric after it (as transport-verbs' `Domain`, in its `device.rs`).

use std::sync::atomic::AtomicU64;

use libfabric_sys as fi;

/// Ids telling endpoints (domains) apart, so a region of another endpoint is refused.
pub(crate) static NEXT_DOMAIN_ID: AtomicU64 = AtomicU64::new(1);

/// The fabric, closed on drop.
pub(crate) struct Fabric(pub *mut fi::fid_fabric);

impl Drop for Fabric {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a fabric opened by fi_fabric, closed once, after its domain.
            unsafe { fi::rs_fi_close(fi::rs_fi_fabric_fid(self.0)) };
        }
    }
}

/// The domain and its fabric. Shared by the endpoint and its regions, so it closes after the
/// last of them.
pub(crate) struct Domain {
    pub ptr: *mut fi::fid_domain,
    pub id: u64,
    pub next_key: AtomicU64,
    // Dropped after `Domain::drop` closed the domain.
    pub _fabric: Fabric,
}

// SAFETY: the domain's own calls (registering and closing regions, closing the domain) may
// come from any thread: every provider here guards its registration map with the domain's
// lock whatever the threading model (see `select::THREADING`); the endpoint, CQ and AV, which
// FI_THREAD_DOMAIN leaves unguarded, are only used through `&mut Endpoint`. The pointer is
// only closed once, in Drop, when the last owner goes.
unsafe impl Send for Domain {}
// SAFETY: as above; the only shared mutable state of ours is an atomic.
unsafe impl Sync for Domain {}

impl Drop for Domain {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: a domain opened by fi_domain; every endpoint and region of it is closed
            // (they hold this Arc), so it is closed once, here.
            unsafe { fi::rs_fi_close(fi::rs_fi_domain_fid(self.ptr)) };
        }
    }
}
