//! Sessions: the client, the server (a thread per client), and loopback (both in one process,
//! over a TCP connection on 127.0.0.1, each side driven by its own threads).
//!
//! `client.rs` is the client (and [`connect`]), `report.rs` the report of one of its runs,
//! `server.rs` the server, `loopback.rs` both in one process; `timeouts.rs` holds the timeouts
//! both sides share.

mod client;
mod gpu_write;
mod loopback;
mod report;
mod server;
mod timeouts;

pub use client::{client, connect, ClientOut};
pub use gpu_write::{gpu_write_client, gpu_write_loopback};
pub use loopback::loopback;
pub use server::{serve, session, session_side, Fixed, ServerCfg};
