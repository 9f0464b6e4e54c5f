//! The timeouts both sides of a session share.

use std::time::Duration;

/// How long a side waits for the other to prepare a run (allocate, fill, post receives).
pub(super) const PREPARE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the control connection's watchdog lets the data path notice a departed peer on
/// its own. A data path that is not stuck sees it within a few loop turns (it reads the
/// liveness flag every few hundred); one that is still busy after this is inside a provider
/// call that does not return (libfabric 1.x shm, a peer killed holding a queue lock).
pub(super) const WATCHDOG_GRACE: Duration = Duration::from_secs(2);
