//! Sessions: the client, the server (a thread per client), and loopback (both in one process,
//! over a TCP connection on 127.0.0.1, each side driven by its own threads).
//!
//! `client.rs` is the client (and [`connect`]), `report.rs` the report of one of its runs,
//! `layout.rs` the server's configuration and the side each session gets, `server.rs` the
//! server, `gpu_write.rs` the two halves of `--workload gpu-write`, `loopback.rs` both sides in
//! one process (every workload's); `timeouts.rs` holds the timeouts both sides share.

mod client;
mod gpu_write;
mod layout;
mod loopback;
mod report;
mod server;
mod timeouts;

pub use client::{client, connect, ClientOut};
pub use gpu_write::gpu_write_client;
pub use layout::{session_side, Fixed, ServerCfg};
pub use loopback::{gpu_write_loopback, loopback};
pub use server::{serve, session};
