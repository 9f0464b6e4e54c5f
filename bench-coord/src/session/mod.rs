//! Sessions: the client, the server (a thread per client), and loopback (both in one process,
//! over a TCP connection on 127.0.0.1, each side driven by its own threads).
//!
//! `client.rs` is the client (and [`connect`]), `report.rs` the report of one of its runs,
//! `server.rs` the server, `loopback.rs` both in one process.

use std::time::Duration;

mod client;
mod loopback;
mod report;
mod server;

pub use client::{client, connect, ClientOut};
pub use loopback::loopback;
pub use server::{serve, session, ServerCfg};

/// How long a side waits for the other to prepare a run (allocate, fill, post receives).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the control connection's watchdog lets the data path notice a departed peer on
/// its own. A data path that is not stuck sees it within a few loop turns (it reads the
/// liveness flag every few hundred); one that is still busy after this is inside a provider
/// call that does not return (libfabric 1.x shm, a peer killed holding a queue lock).
const WATCHDOG_GRACE: Duration = Duration::from_secs(2);
