//! rdma-bench's coordination layer: who runs what, where, and with whom.
//!
//! - [`backend`]: the one place a backend is chosen at run time ([`backend::dispatch`]);
//!   everything below it is generic over [`transport_core::Transport`].
//! - [`session`]: the server (one session per client), the client, and loopback (both sides
//!   in one process), over `bench-core`'s control protocol.
//! - [`ranks`]: `rdma-bench run`, N ranks: [`launch`] finds the rank in the launcher's
//!   environment (Slurm, Open MPI, torchrun-style), [`rendezvous`] meets the others at rank 0.

#![forbid(unsafe_code)]

pub mod backend;
pub mod launch;
pub mod ranks;
pub mod rendezvous;
pub mod session;
