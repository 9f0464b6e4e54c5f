//! The CUDA producer of `--workload gpu-write` (feature `cuda`): GPU threads publish the
//! workload's commands into the sender's ring ([`transport_proxy::cuda::CudaProducer`]).
//!
//! Its rings live in `cuMemHostAlloc(DEVICEMAP | PORTABLE)` memory ([`Producer::ring_memory`]);
//! each `issue` stages the commands, launches one kernel that publishes them and waits for it:
//! its latency figures include a kernel launch per command, which a kernel that originates
//! its own commands (transport-proxy's tests/gpu_proxy.rs) does not pay.

use transport_proxy::cuda::{CudaProducer as Inner, CudaRing, GpuError};
use transport_proxy::{Command, Ring, RingLayout};

use super::gpu_write::{Producer, RingHome};
use crate::error::{Error, Result};

/// GPU threads as [`Producer`].
pub struct CudaProducer(Inner);

impl CudaProducer {
    /// Compile the kernels on GPU `ordinal` (NVRTC); a usage error where this machine has
    /// no CUDA driver, GPU or NVRTC.
    pub fn new(ordinal: usize) -> Result<Self> {
        Inner::new(ordinal).map(Self).map_err(|e| match e {
            GpuError::NoDriver | GpuError::NoDevice | GpuError::NoNvrtc => {
                Error::Usage(format!("gpu-write with the CUDA producer: {e}"))
            }
            e => Error::Protocol(format!("gpu-write: the CUDA producer: {e}")),
        })
    }
}

impl Producer for CudaProducer {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn issue(&self, ring: Ring<'_>, cmds: &[Command]) -> Result<()> {
        self.0
            .issue(ring, cmds)
            .map_err(|e| Error::Protocol(format!("gpu-write: the CUDA producer: {e}")))
    }

    fn ring_memory(&self, layout: RingLayout) -> Result<Box<dyn RingHome>> {
        let ring = self
            .0
            .ring_memory(layout)
            .map_err(|e| Error::Protocol(format!("gpu-write: a ring in mapped memory: {e}")))?;
        Ok(Box::new(Home(ring)))
    }
}

/// A [`CudaRing`] as gpu-write's ring home.
struct Home(CudaRing);

impl RingHome for Home {
    fn ring(&self) -> Ring<'_> {
        self.0.ring()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_it_is_a_usage_error_that_says_what_is_missing() {
        if transport_proxy::cuda::availability().is_ok() {
            return;
        }
        match CudaProducer::new(0) {
            Err(Error::Usage(m)) => assert!(m.contains("CUDA") || m.contains("NVRTC"), "{m}"),
            Err(e) => panic!("expected a usage error, got {e}"),
            Ok(_) => panic!("a CUDA producer without CUDA"),
        }
    }
}
