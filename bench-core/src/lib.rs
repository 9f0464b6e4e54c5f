//! rdma-bench's library: what one side of a benchmark does, generic over
//! [`transport_core::Transport`], with no command line and no coordination.
//!
//! - [`config`]: the shared vocabulary (workloads, knobs, memory kinds, patterns);
//!   [`plan`]: from a [`plan::WorkloadSpec`] to the list of runs.
//! - [`side`]: the endpoints and regions of one side, their NICs chosen from the topology
//!   ([`topo_glue`]) and their threads pinned near their GPU ([`pin`]).
//! - [`workload`]: the workloads (write, send, lat, rate, and the ranks' WRITEs), generic over
//!   the trait; [`buffers`]: memory, the data pattern and its verification.
//! - [`proto`] and [`ctrl`]: the versioned control protocol and the control connection the
//!   two sides of a workload talk over.
//! - [`report`]: measurements, tables and JSON; [`record`]: what ran, where and on what;
//!   [`progress`]: the progress bar; [`units`].
//!
//! Every setting is a plain struct: a [`side::SideCfg`] says how a side opens its NICs and
//! memory, a [`plan::WorkloadSpec`] what to run (its [`Default`] is `rdma-bench`'s defaults),
//! and [`plan::Plan::new`] turns it into the runs. `bench-coord` puts two sides together (in one
//! process, as server and client, or as N ranks); its crate docs run a verified benchmark from
//! a program with these structs. The outputs (gate, plot, HTML) are `bench-report`, the node
//! check is `bench-doctor`, and the `rdma-bench` binary (`bench-cli`) maps its flags onto these
//! configs.

#![forbid(unsafe_code)]

pub mod buffers;
pub mod config;
pub mod ctrl;
pub mod error;
pub mod pin;
pub mod plan;
pub mod progress;
pub mod proto;
pub mod record;
pub mod report;
pub mod side;
pub mod teardown;
pub mod topo_glue;
pub mod units;
pub mod workload;

pub use error::{Error, Result};
