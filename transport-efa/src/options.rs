//! Backend options from `NicDesc::options` (see the crate docs' Options section), parsed once
//! when an endpoint opens.

use std::collections::BTreeMap;

use transport_core::Result;

/// Backend options from `NicDesc::options`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    /// `mr_mode=strict`: ask for exactly EFA's set (LOCAL | VIRT_ADDR | ALLOCATED | PROV_KEY).
    pub mr_strict: bool,
    /// `hmem=auto|on|off`.
    pub hmem: Hmem,
    /// `fabric=NAME`: only entries of that fabric (e.g. `efa-direct`, `127.0.0.1/32`).
    pub fabric: Option<String>,
    /// `write_completion=auto|delivery|transmit`.
    pub write_completion: WriteCompletion,
    /// `shm=off|on`: whether the efa provider may carry traffic between endpoints of one
    /// host over shared memory (`FI_OPT_SHARED_MEMORY_PERMITTED`). Off by default, so a
    /// same-host efa run measures the NIC.
    pub shm_permitted: bool,
    /// `cuda_api=auto|on|off` (`FI_OPT_CUDA_API_PERMITTED`).
    pub cuda_api: CudaApi,
    /// `rx_cq_data=auto|on`: `on` runs the receive-for-immediates path (`FI_RX_CQ_DATA`) even
    /// where the provider does not require it, so it can be tested on shm and tcp.
    pub rx_cq_data_forced: bool,
    /// `gpu_ipc=on|off`: register GPU memory with `FI_HMEM_DEVICE_ONLY` (on, the default),
    /// which lets shm move it between processes by CUDA IPC. Off where the peers are in
    /// this process: CUDA cannot open an IPC handle in the process that made it, and shm
    /// then fails the transfer instead of copying through the host.
    pub gpu_ipc: bool,
}

/// Whether the provider may call CUDA itself for GPU memory (`FI_OPT_CUDA_API_PERMITTED`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CudaApi {
    /// As aws-ofi-nccl and pplx-garden: forbidden on efa when GPU memory is registered (every
    /// GPU byte then moves by GPUDirect RDMA, or the endpoint refuses GPU memory saying
    /// why); left to the provider elsewhere (shm's GPU support is CUDA calls).
    #[default]
    Auto,
    /// Permitted: the provider may copy GPU memory through the host with CUDA calls.
    On,
    /// Forbidden on every provider that knows the option.
    Off,
}

/// Completion semantics of WRITEs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum WriteCompletion {
    /// `transmit` on efa and shm, `delivery` elsewhere.
    #[default]
    Auto,
    /// `FI_DELIVERY_COMPLETE`.
    Delivery,
    /// The provider's default (`FI_TRANSMIT_COMPLETE` or weaker).
    Transmit,
}

/// Whether to ask for `FI_HMEM` (GPU memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Hmem {
    /// Where a CUDA device is present, falling back to host memory only.
    #[default]
    Auto,
    /// Always; opening fails where the provider has no `FI_HMEM`.
    On,
    /// Never.
    Off,
}

impl Options {
    pub(crate) fn parse(options: &BTreeMap<String, String>) -> Result<Self> {
        let mut o = Options {
            gpu_ipc: true,
            ..Options::default()
        };
        for (k, v) in options {
            match (k.as_str(), v.as_str()) {
                ("mr_mode", "strict") => o.mr_strict = true,
                ("mr_mode", "default") => o.mr_strict = false,
                ("hmem", "auto") => o.hmem = Hmem::Auto,
                ("hmem", "on") => o.hmem = Hmem::On,
                ("hmem", "off") => o.hmem = Hmem::Off,
                ("write_completion", "auto") => o.write_completion = WriteCompletion::Auto,
                ("write_completion", "delivery") => o.write_completion = WriteCompletion::Delivery,
                ("write_completion", "transmit") => o.write_completion = WriteCompletion::Transmit,
                ("fabric", name) if !name.is_empty() => o.fabric = Some(name.to_string()),
                ("shm", "off") => o.shm_permitted = false,
                ("shm", "on") => o.shm_permitted = true,
                ("cuda_api", "auto") => o.cuda_api = CudaApi::Auto,
                ("cuda_api", "on") => o.cuda_api = CudaApi::On,
                ("cuda_api", "off") => o.cuda_api = CudaApi::Off,
                ("gpu_ipc", "on") => o.gpu_ipc = true,
                ("gpu_ipc", "off") => o.gpu_ipc = false,
                ("rx_cq_data", "auto") => o.rx_cq_data_forced = false,
                ("rx_cq_data", "on") => o.rx_cq_data_forced = true,
                // The keys are crate::INFO's options, which name them in the error.
                _ => return Err(crate::INFO.unknown_option(k, v)),
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use transport_core::{Error, NicDesc, Transport};

    use crate::Endpoint;

    #[test]
    fn unknown_option_is_refused() {
        let nic = NicDesc::provider("shm").with_option("mr_mod", "strict");
        match Endpoint::open(&nic) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("mr_mode"), "{m}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
