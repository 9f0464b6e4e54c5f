//! GPU memory registration (`FI_HMEM_CUDA`): a dmabuf where the provider and driver take
//! one, else registration by device address.

use libfabric_sys as fi;
use transport_core::{Error, GpuBuffer, Result};

/// Register `g` on `domain`. The endpoint has checked that the provider offers `FI_HMEM`.
#[cfg(feature = "cuda")]
pub(crate) fn register(
    domain: *mut fi::fid_domain,
    prov: &str,
    g: &GpuBuffer,
    access: u64,
    key: u64,
) -> Result<*mut fi::fid_mr> {
    use std::os::fd::{FromRawFd, OwnedFd};

    use std::ptr;

    use cudarc::driver::sys as cu;

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
        let page = transport_core::PAGE as u64;
        let base = ptr & !(page - 1);
        let offset = ptr - base;
        let size = (offset + len as u64).div_ceil(page) * page;
        let mut fd: i32 = -1;
        // SAFETY: fd is a valid out pointer for an int; [base, base+size) lies in the page-
        // rounded allocation of g (CUDA allocations are page-aligned and page-granular);
        // the context of g is current on this thread.
        let r = unsafe {
            cu::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast(),
                base,
                size as usize,
                cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        if r == cu::CUresult::CUDA_SUCCESS && fd >= 0 {
            // SAFETY: the driver just created fd for us; OwnedFd closes it once, after the
            // registration (the kernel keeps its own reference to the dmabuf).
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: domain is a live domain; the dmabuf range and base address describe g;
            // mr is a valid out pointer.
            let ret = unsafe {
                fi::rs_fi_mr_regattr_dmabuf(
                    domain,
                    fd,
                    offset,
                    len,
                    ptr as *mut std::ffi::c_void,
                    access,
                    key,
                    fi::FI_HMEM_CUDA as i32,
                    device,
                    0,
                    &mut mr,
                )
            };
            drop(owned);
            if ret == 0 {
                return Ok(mr);
            }
            dmabuf_err = format!(
                "; dmabuf registration failed first: {}",
                crate::error::strerror(ret.into())
            );
            mr = ptr::null_mut();
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
            0,
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
) -> Result<*mut fi::fid_mr> {
    Err(Error::Unsupported(
        "transport-efa was built without its `cuda` feature; GPU memory cannot be registered"
            .into(),
    ))
}
