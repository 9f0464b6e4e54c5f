//! Small helpers of the cases: host regions, their bytes, test patterns, and the check that
//! a post on an idle endpoint was accepted.

use transport_core::{Error, HostBuffer, Memory, MemoryRegion, Post, Result, Transport};

pub(crate) fn host_mr<T: Transport>(t: &mut T, bytes: &[u8]) -> Result<T::Mr> {
    t.register(Memory::Host(HostBuffer::from_slice(bytes)))
}

/// A copy of a host region's bytes (empty for GPU memory).
pub(crate) fn host_bytes<M: MemoryRegion>(mr: &M) -> Vec<u8> {
    mr.memory().host().map(|h| h.to_vec()).unwrap_or_default()
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

pub(crate) fn expect_post(p: Post, what: &str) -> Result<()> {
    match p {
        Post::Posted => Ok(()),
        Post::QueueFull => Err(Error::InvalidArgument(format!(
            "{what}: queue full on an idle endpoint"
        ))),
    }
}
