//! GPU memory registration (`FI_HMEM_CUDA`): a dmabuf where the provider and driver take
//! one, else registration by device address.
//!
//! Both register with `FI_HMEM_DEVICE_ONLY` unless `gpu_ipc=off`: the memory is `cuMemAlloc`
//! device memory, not host or managed memory, and the flag is what lets providers move it
//! device to device. libfabric's shm uses CUDA IPC between processes only for regions
//! registered so (`smr_select_proto`: `use_ipc` needs the flag); without it every GPU byte
//! goes through its host bounce buffers (SAR), which held rdma-bench at about 14 Gbit/s on an
//! H100 where `fi_rma_bw -D cuda`, which sets the flag (fabtests' `ft_reg_mr`), reached 433.
//! Between endpoints of one process IPC cannot work (CUDA does not open a handle in the
//! process that exported it, and shm has no same-process case: the receiver fails the
//! transfer), so such peers need `gpu_ipc=off`. efa accepts the flag and ignores it.

use libfabric_sys as fi;
use transport_core::{Error, GpuBuffer, Landing, Result};

/// How the provider `provider` (`efa`, `shm`, `tcp;ofi_rxm`) puts bytes into a region, for
/// [`transport_core::Transport::make_gpu_visible`]: the efa provider's device writes GPU
/// memory by GPUDirect RDMA (with `cuda_api=on` it may also copy some with CUDA; the flush
/// covers both), the others copy with the CPU or with synchronous CUDA copies.
pub(crate) fn landing(provider: &str) -> Landing {
    match provider.split(';').next() {
        Some("efa") => Landing::NicDma,
        _ => Landing::ProviderCopy,
    }
}

/// Register `g` on `domain`. The endpoint has checked that the provider offers `FI_HMEM`.
#[cfg(feature = "cuda")]
pub(crate) fn register(
    domain: *mut fi::fid_domain,
    prov: &str,
    g: &GpuBuffer,
    access: u64,
    key: u64,
    flags: u64,
) -> Result<*mut fi::fid_mr> {
    use std::os::fd::AsRawFd;
    use std::ptr;

    use crate::error::provider;

    let device = i32::try_from(g.ordinal())
        .map_err(|_| Error::InvalidArgument(format!("GPU ordinal {} too large", g.ordinal())))?;
    g.context()
        .bind_to_thread()
        .map_err(|e| Error::Cuda(format!("cuCtxSetCurrent: {e:?}")))?;
    let ptr = g.device_ptr();
    let len = g.len();
    let mut mr: *mut fi::fid_mr = ptr::null_mut();

    // 1. dmabuf (libfabric >= 1.20 headers, a driver and GPU that export dmabufs).
    // SAFETY: returns a constant.
    let have_dmabuf = unsafe { fi::rs_fi_have_mr_dmabuf() } != 0;
    let mut dmabuf_err = String::new();
    if have_dmabuf {
        match g.export_dmabuf(0, len) {
            Ok(dmabuf) => {
                let range = dmabuf.range;
                // SAFETY: domain is a live domain; the dmabuf covers g, offset and base_addr
                // are fi_mr(3)'s (the dmabuf's page-aligned base, the region's place in it,
                // see transport_core::DmabufRange); mr is a valid out pointer. The fd is
                // closed after the call (the kernel keeps its own reference to the dmabuf).
                let ret = unsafe {
                    fi::rs_fi_mr_regattr_dmabuf(
                        domain,
                        dmabuf.fd.as_raw_fd(),
                        range.offset,
                        len,
                        range.base_addr as *mut std::ffi::c_void,
                        access,
                        key,
                        fi::FI_HMEM_CUDA as i32,
                        device,
                        flags,
                        &mut mr,
                    )
                };
                drop(dmabuf);
                if ret == 0 {
                    return Ok(mr);
                }
                dmabuf_err = format!(
                    "; dmabuf registration failed first: {}",
                    crate::error::strerror(ret.into())
                );
                mr = ptr::null_mut();
            }
            Err(e) => dmabuf_err = format!("; no dmabuf: {e}"),
        }
    }

    // 2. By device address: the provider resolves it through CUDA itself.
    // SAFETY: domain is a live domain; [ptr, ptr+len) is device memory owned by g, which the
    // region keeps alive; mr is a valid out pointer.
    let ret = unsafe {
        fi::rs_fi_mr_regattr_hmem(
            domain,
            ptr as *const std::ffi::c_void,
            len,
            access,
            key,
            fi::FI_HMEM_CUDA as i32,
            device,
            flags,
            &mut mr,
        )
    };
    if ret == -fi::FI_ENOSYS || ret == -fi::FI_EOPNOTSUPP {
        return Err(Error::Unsupported(format!(
            "provider {prov} on libfabric {} offers FI_HMEM but cannot register CUDA memory \
             (fi_mr_regattr: {}){dmabuf_err}: this libfabric was built without CUDA support; \
             use host memory, or a CUDA-enabled libfabric (the EFA installer's under \
             /opt/amazon/efa)",
            crate::error::runtime_version(),
            crate::error::strerror(ret.into())
        )));
    }
    if ret != 0 {
        return Err(provider(
            "fi_mr_regattr",
            ret.into(),
            format!(
                "registering {len} bytes of GPU {} memory (FI_HMEM_CUDA) failed{dmabuf_err}; \
                 check that the provider was built with CUDA support and that GPUDirect RDMA \
                 (nvidia-peermem or dmabuf) is available",
                g.ordinal()
            ),
        ));
    }
    Ok(mr)
}

/// Without the `cuda` feature a `GpuBuffer` cannot exist; refuse clearly all the same.
#[cfg(not(feature = "cuda"))]
pub(crate) fn register(
    _domain: *mut fi::fid_domain,
    _prov: &str,
    _g: &GpuBuffer,
    _access: u64,
    _key: u64,
    _flags: u64,
) -> Result<*mut fi::fid_mr> {
    Err(Error::Unsupported(
        "transport-efa was built without its `cuda` feature; GPU memory cannot be registered"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the efa provider's device writes GPU memory by DMA; shm and tcp copy.
    #[test]
    fn landing_follows_the_core_provider() {
        assert_eq!(landing("efa"), Landing::NicDma);
        assert_eq!(landing("efa;ofi_rxd"), Landing::NicDma);
        assert_eq!(landing("shm"), Landing::ProviderCopy);
        assert_eq!(landing("tcp;ofi_rxm"), Landing::ProviderCopy);
        assert_eq!(landing("tcp"), Landing::ProviderCopy);
    }
}

#[cfg(test)]
/// An endpoint's GPU-memory answers on tcp, which has no FI_HMEM in the releases we run.
mod endpoint_tests {
    use transport_core::{Error, Memory, NicDesc, Transport};

    use crate::error::runtime_version;
    use crate::Endpoint;

    fn tcp(hmem: &str) -> NicDesc {
        let mut nic = NicDesc::provider("tcp").with_option("hmem", hmem);
        nic.device = Some("lo".into());
        nic
    }

    /// Whether libfabric `version`'s tcp provider offers `FI_HMEM`: not in any release this
    /// project builds against (1.17.1, 2.1.0, 2.6.0: prov/tcp never sets it, and tcp;ofi_rxm
    /// asks its tcp core for it), with or without CUDA. A newer release fails the tests that
    /// ask until someone checks its prov/tcp and says here.
    fn tcp_has_fi_hmem(version: &str) -> bool {
        let mut it = version.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
        let v = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        assert!(
            v <= (2, 6),
            "libfabric {version} is newer than what this test knows of tcp's FI_HMEM \
             (none through 2.6): check its prov/tcp and extend tcp_has_fi_hmem"
        );
        false
    }

    /// tcp has no FI_HMEM in the libfabric releases we run: asking for it fails to open,
    /// clearly, naming the provider.
    #[test]
    fn hmem_on_without_fi_hmem_is_unsupported() {
        let version = runtime_version();
        assert!(!tcp_has_fi_hmem(&version));
        match Endpoint::open(&tcp("on")) {
            Err(Error::Unsupported(m)) => {
                assert!(m.contains("FI_HMEM"), "{m}");
                assert!(m.contains("tcp"), "{m}");
            }
            Ok(ep) => panic!(
                "libfabric {version}'s tcp has no FI_HMEM, yet hmem=on opened: caps {:?}",
                ep.caps()
            ),
            Err(e) => panic!("expected Unsupported, got {e}"),
        }
    }

    /// A host region needs nothing to be visible, on every provider: the call returns at
    /// once (the GPU cases run on the GPU host, `tests/gpu.rs`).
    #[test]
    fn make_gpu_visible_on_host_memory_is_a_no_op() {
        let mut ep = Endpoint::open(&tcp("off")).expect("open tcp");
        let mr = ep
            .register(Memory::Host(transport_core::HostBuffer::new(4096)))
            .expect("register");
        ep.make_gpu_visible(&mr).expect("host memory is visible");
    }

    /// A host-only endpoint (`NicDesc::gpu_memory = Some(false)`) asks for no FI_HMEM and
    /// says so when GPU memory is offered.
    #[test]
    fn host_only_endpoint_refuses_gpu_memory_naming_why() {
        let ep = Endpoint::open(&tcp("auto").with_gpu_memory(false)).expect("open tcp");
        assert!(!ep.caps().gpu_memory);
        match ep.gpu_support() {
            Err(Error::Unsupported(m)) => assert!(m.contains("host memory only"), "{m}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    /// Without FI_HMEM (or a GPU), an endpoint says why GPU memory cannot be registered.
    #[test]
    fn gpu_support_names_the_reason() {
        let ep = Endpoint::open(&tcp("off")).expect("open tcp");
        assert!(!ep.caps().gpu_memory);
        match ep.gpu_support() {
            Err(Error::Unsupported(m)) => assert!(m.contains("hmem=off"), "{m}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
        let ep = Endpoint::open(&tcp("auto")).expect("open tcp");
        if ep.caps().gpu_memory {
            return; // a GPU host with a CUDA-enabled libfabric
        }
        let e = ep.gpu_support().expect_err("no GPU memory here");
        eprintln!("{e}");
    }
}
