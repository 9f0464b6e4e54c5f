//! rdma-bench: one benchmark harness for every `Transport` backend.
//!
//! The binary (`src/main.rs`) is a thin wrapper over [`app::main_with`]. Modules:
//! - [`cli`]: the command line; [`config`]: the shared vocabulary (workloads, knobs).
//! - [`proto`] and [`ctrl`]: the versioned TCP handshake and the control connection.
//! - [`side`], [`session`]: endpoints and regions of one side; client, server and loopback.
//! - [`workload`]: the workloads, generic over the trait; [`backend`]: the one dispatch.
//! - [`report`]: tables and JSON; [`buffers`]: memory, pattern, verification.
//! - [`ranks`] (`rdma-bench run`, N ranks): [`launch`] finds the rank in the launcher's
//!   environment, [`rendezvous`] meets the others at rank 0.

#![forbid(unsafe_code)]

pub mod app;
pub mod backend;
pub mod buffers;
pub mod cli;
pub mod config;
pub mod ctrl;
pub mod doctor;
pub mod error;
pub mod gate;
pub mod html;
pub mod instances;
pub mod launch;
pub mod outputs;
pub mod pin;
pub mod plan;
pub mod plot;
pub mod progress;
pub mod proto;
pub mod ranks;
pub mod rendezvous;
pub mod report;
pub mod session;
pub mod side;
pub mod topo_glue;
pub mod units;
pub mod workload;
