//! GPU-initiated WRITEs through any [`transport_core::Transport`]: producers (GPU threads, or
//! CPU threads) write fixed-size commands into a ring in host memory; a proxy thread per
//! endpoint posts them and publishes completion counters the producers wait on.
//!
//! The ring's layout and protocol (the ABI a CUDA kernel writes) are in [`ring`].

pub mod proxy;
pub mod ring;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use proxy::{drain_to_nothing, Proxy, ProxyError, ProxyPeer, ProxyStats, DEFAULT_BATCH};
pub use ring::{immediate, pack, Command, Ring, RingError, RingLayout, RingMemory};
