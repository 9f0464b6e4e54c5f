//! The CUDA producer of `--workload gpu-write` (feature `cuda`): GPU threads publish the
//! workload's commands into the sender's ring ([`transport_proxy::cuda::CudaProducer`]).
//!
//! Its rings live in `cuMemHostAlloc(DEVICEMAP | PORTABLE)` memory ([`Producer::ring_memory`]);
//! each `issue` stages the commands, launches one kernel that publishes them and waits for it
//! (the bandwidth steps: one launch per 1024 commands); the ring alone (`generate`) is one
//! launch whose threads make their commands. Latency runs in one persistent kernel
//! (`proxy_pingpong`, [`Producer::pingpong`]): one GPU thread publishes a command, spins on
//! its own ring's arrival counter in mapped memory until the peer's answer is counted, and
//! repeats; the time is the GPU's globaltimer over all rounds, no launch inside it.

use std::time::Duration;
use transport_proxy::cuda::{CudaProducer as Inner, CudaRing, GpuError};

use transport_proxy::{Command, Ring, RingLayout};

use super::gpu_write::{Producer, RingHome, Rounds};
use crate::error::{Error, Result};

/// GPU threads as [`Producer`].
pub struct CudaProducer(Inner, KernelPublish);

/// How the latency kernel publishes and waits (the defaults: no fence, polls from the publish
/// on, no pause).
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelWait {
    /// Pause between two polls of the arrival counter, ns (0: it spins).
    pub poll_sleep_ns: u32,
    /// Poll late: start polling this long before the fastest round trip so far would end
    /// (0: from the publish on).
    pub poll_margin_ns: u32,
    /// How it orders each command ([`KernelPublish`]).
    pub publish: KernelPublish,
}

/// How the latency kernel publishes a command (`transport-proxy`'s ring protocol).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelPublish {
    /// The command's words alone, no fence: its payload was in place before the launch, so
    /// nothing needs ordering before it (`proxy_push_unfenced`).
    #[default]
    Unfenced,
    /// Word 0 with `st.release.sys`: what a kernel that wrote the payload pays
    /// (`proxy_push`).
    Release,
    /// `__threadfence_system`, then the words (the protocol until 2026-11-28).
    Fence,
}

impl CudaProducer {
    /// Compile the kernels on GPU `ordinal` (NVRTC); a usage error where this machine has
    /// no CUDA driver, GPU or NVRTC. `wait`: how the latency kernel publishes and polls.
    pub fn new(ordinal: usize, wait: KernelWait) -> Result<Self> {
        let mut inner = Inner::new(ordinal).map_err(|e| match e {
            GpuError::NoDriver | GpuError::NoDevice | GpuError::NoNvrtc => {
                Error::Usage(format!("gpu-write with the CUDA producer: {e}"))
            }
            e => Error::Protocol(format!("gpu-write: the CUDA producer: {e}")),
        })?;
        inner.set_poll_sleep(wait.poll_sleep_ns);
        inner.set_poll_margin(wait.poll_margin_ns);
        inner.set_sync(match wait.publish {
            KernelPublish::Unfenced => transport_proxy::cuda::SYNC_UNFENCED,
            KernelPublish::Release => 0,
            KernelPublish::Fence => transport_proxy::cuda::SYNC_SC_FENCE,
        });
        Ok(Self(inner, wait.publish))
    }
}

impl Producer for CudaProducer {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn publish(&self) -> &'static str {
        match self.1 {
            KernelPublish::Unfenced => "unfenced",
            KernelPublish::Release => "ordered (st.release.sys)",
            KernelPublish::Fence => "ordered (__threadfence_system)",
        }
    }

    fn issue(&self, ring: Ring<'_>, cmds: &[Command]) -> Result<()> {
        self.0
            .issue(ring, cmds)
            .map_err(|e| Error::Protocol(format!("gpu-write: the CUDA producer: {e}")))
    }

    fn generate(&self, ring: Ring<'_>, cmd: &Command, count: u64) -> Result<()> {
        self.0
            .generate(ring, cmd, count)
            .map_err(|e| Error::Protocol(format!("gpu-write: the CUDA producer: {e}")))
    }

    fn pingpong(
        &self,
        ring: Ring<'_>,
        slot: u32,
        cmd: &Command,
        first: u64,
        base: u64,
        rounds: u64,
        _idle: Duration,
    ) -> Result<Rounds> {
        // The kernel gives up by itself (transport_proxy::cuda::KERNEL_TIMEOUT_NS) and on the
        // ring's error word.
        self.0
            .pingpong(ring, slot, cmd, first, base, rounds)
            .map(|p| Rounds {
                total: Duration::from_nanos(p.total_ns),
                each_ns: p.round_ns,
            })
            .map_err(|e| Error::Protocol(format!("gpu-write: the CUDA latency kernel: {e}")))
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
        match CudaProducer::new(0, KernelWait::default()) {
            Err(Error::Usage(m)) => assert!(m.contains("CUDA") || m.contains("NVRTC"), "{m}"),
            Err(e) => panic!("expected a usage error, got {e}"),
            Ok(_) => panic!("a CUDA producer without CUDA"),
        }
    }
}
