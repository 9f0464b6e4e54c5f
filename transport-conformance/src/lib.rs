//! The conformance suite every `Transport` backend runs.
//!
//! A backend's test file names how to open its two sides and expands the suite:
//!
//! ```ignore
//! fn open(side: usize) -> transport_core::Result<transport_efa::Endpoint> {
//!     transport_efa::Endpoint::open(&transport_core::NicDesc::provider("shm"))
//! }
//! transport_conformance::suite!(open);
//! ```
//!
//! Each case becomes its own `#[test]`. Side 0 and side 1 are two endpoints driven from one
//! thread; every wait polls both (progress is manual) and has a timeout. [`connect`] warms the
//! pair up with one SEND each way before a case runs.
//!
//! A case whose `open` answers [`Error::NoDevice`] is skipped with a note on stderr, unless
//! `CONFORMANCE_REQUIRE_DEVICE=1` is set, where it fails.
//!
//! The pair and its helpers are in `pair`, the cases where data must arrive in `data`, those
//! where something must be refused in `refused`, the backend's description of itself in
//! `about`; all are re-exported here. [`ab`] holds what
//! the backends' hot-path benches share.
//!
//! [`Error::NoDevice`]: transport_core::Error::NoDevice

#![forbid(unsafe_code)]

pub mod ab;
mod about;
mod data;
mod pair;
mod refused;
mod support;

pub use about::describes_itself;
pub use data::{
    fill_queue_then_drain, immediates_exactly_once, immediates_many, register_deregister,
    send_recv_len, send_recv_sizes, visible_after_completion, write_at_offset,
};
pub use pair::{connect, poll_both, post_retry, warm_up, Pair, TIMEOUT};
pub use refused::{
    bad_key_bytes, bad_peer_address, bad_remote_key, bad_remote_key_with, foreign_local_region,
    local_past_end, write_past_end, write_past_end_with, Recovery,
};

/// Expand the suite as `#[test]` functions in the calling module.
///
/// `$open` is a `fn(usize) -> transport_core::Result<T>` opening side 0 or 1.
/// `suite!(open)` expands every case; `suite!(open; only: case_a, case_b)` expands the named
/// ones, for a backend that replaces a case with its own test (and says why there).
#[macro_export]
macro_rules! suite {
    ($open:path; only: $($case:ident),* $(,)?) => {
        $crate::suite!(@cases $open; $($case),*);
    };
    ($open:path) => {
        $crate::suite!(@cases $open;
            register_deregister, send_recv_sizes, write_at_offset, immediates_exactly_once,
            fill_queue_then_drain, bad_remote_key, write_past_end, bad_key_bytes,
            foreign_local_region, local_past_end, bad_peer_address, describes_itself,
            visible_after_completion);
    };
    (@cases $open:path; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                match $crate::connect(&$open) {
                    Ok(Some(mut pair)) => {
                        if let Err(e) = $crate::$case(&mut pair) {
                            panic!("{}: {e}", stringify!($case));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => panic!("{}: connecting the pair failed: {e}", stringify!($case)),
                }
            }
        )*
    };
}
