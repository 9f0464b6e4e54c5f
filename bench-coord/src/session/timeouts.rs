//! The timeouts both sides of a session share.

use std::time::Duration;

/// How long a side waits for the other to prepare a run (allocate, fill, post receives).
pub(super) const PREPARE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the control connection's watchdog lets the data path notice a departed peer on
/// its own. A data path that is not stuck sees it within a few loop turns (it reads the
/// liveness flag every few hundred); one that is still busy after this is inside a provider
/// call that does not return (libfabric 1.x shm, a peer killed holding a queue lock).
pub(super) const WATCHDOG_GRACE: Duration = Duration::from_secs(2);

/// How long a failed transfer waits for the control connection to say whether the peer left
/// (a transfer error and the peer's departure arrive in either order).
pub(super) const GONE_WAIT: Duration = Duration::from_secs(1);

/// A transfer that failed because the peer left (an error completion for a WRITE into a
/// process that is gone, a connection the provider saw close first) is reported as the peer's
/// departure, naming `who`, with the provider's error.
pub(super) fn peer_gone_cause(
    e: bench_core::error::Error,
    ctrl: &bench_core::ctrl::Ctrl,
    who: &str,
) -> bench_core::error::Error {
    use bench_core::error::Error;
    if !matches!(e, Error::Transport { .. }) {
        return e;
    }
    let live = ctrl.liveness();
    let start = std::time::Instant::now();
    while !live.gone() && start.elapsed() < GONE_WAIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    if live.gone() {
        Error::PeerGone(format!("{who} is gone; the transfer failed with: {e}"))
    } else {
        e
    }
}
