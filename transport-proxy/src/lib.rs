//! GPU-initiated WRITEs through any [`transport_core::Transport`]: producers (GPU threads, or
//! CPU threads) write fixed-size commands into a ring in host memory; a proxy thread per
//! endpoint posts them and publishes completion counters the producers wait on.
//!
//! The ring's layout and protocol (the ABI a CUDA kernel writes) are in [`ring`].

pub mod ring;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use ring::{Command, Ring, RingError, RingLayout, RingMemory};
