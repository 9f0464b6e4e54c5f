//! rdma-bench's outputs after the runs, shared by loopback, client and compare: the gate
//! against an instance type's line rates ([`gate`]), the SVG plot ([`plot`]), the HTML page
//! ([`html`]), and [`outputs`], which checks their settings before a run and writes them after.

#![forbid(unsafe_code)]

pub mod gate;
pub mod html;
pub mod outputs;
pub mod plot;
