//! rdma-bench's coordination layer: who runs what, where, and with whom.
//!
//! - [`backend`](mod@backend): a backend as a program offers it ([`backend::Backend`]: its description and
//!   this crate's entry points for it); a program's table of them is the one place a backend
//!   is chosen, and everything below it is generic over [`transport_core::Transport`].
//! - [`session`]: the server (one session per client), the client, and loopback (both sides
//!   in one process), over `bench-core`'s control protocol.
//! - [`ranks`]: `rdma-bench run`, N ranks: [`launch`] finds the rank in the launcher's
//!   environment (Slurm, Open MPI, PMI, torchrun-style), [`rendezvous`] meets the others at rank 0.
//!
//! # Running a workload from a program
//!
//! Plain structs in, measurements out: here both sides in this process over libfabric's shm
//! provider (any machine), a paged WRITE-with-immediate benchmark of 64 KiB pages with every
//! byte verified, as `rdma-bench loopback -s 64K -n 4` would run it.
//!
//! ```
//! use std::time::Duration;
//!
//! use bench_coord::session::{self, Fixed, ServerCfg};
//! use bench_core::plan::{Plan, WorkloadSpec};
//! use bench_core::side::SideCfg;
//!
//! let side = SideCfg {
//!     provider: Some("shm".into()),
//!     ..SideCfg::default()
//! };
//! let server = ServerCfg {
//!     side: side.clone(),
//!     fixed: Fixed::ALL,
//!     max_mem: u64::MAX,
//!     session_timeout: Duration::from_secs(120),
//!     max_sessions: 1,
//!     sessions: Some(1),
//!     quiet: true,
//! };
//! let work = WorkloadSpec {
//!     size: Some(64 << 10),
//!     iters: Some(4),
//!     ..WorkloadSpec::default()
//! };
//! let plan = Plan::new(&work, true)?;
//! // The backend is a type: transport_verbs::Endpoint runs the same over ibverbs.
//! let out = session::loopback::<transport_efa::Endpoint>(&side, &server, &plan, true)?;
//! let run = &out.reports[0];
//! assert!(run.verified && run.bytes > 0);
//! println!("{} over {}: {:.1} Gbit/s", run.workload, run.provider, run.gbps);
//! # Ok::<(), bench_core::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod backend;
// The `backend!` macro names it from the program's crate.
#[doc(hidden)]
pub use transport_core;
pub mod launch;
pub mod ranks;
pub mod rendezvous;
pub mod session;
