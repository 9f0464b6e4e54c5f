//! GPU memory registration.
//!
//! First choice: export the CUDA allocation as a dmabuf (`cuMemGetHandleForAddressRange`,
//! CUDA 11.7+ with the open kernel modules) and register it with `ibv_reg_dmabuf_mr`
//! (kernel 5.12+, a NIC driver with dmabuf support). Second: `ibv_reg_mr` on the device pointer,
//! which works where the `nvidia-peermem` module is loaded. Neither: a clear error.

use std::sync::Arc;

use ibverbs_sys as sys;
use transport_core::{Error, GpuBuffer, Result};

use crate::device::Domain;

#[cfg(not(feature = "cuda"))]
pub(crate) fn register(_d: &Arc<Domain>, _g: &mut GpuBuffer) -> Result<(*mut sys::ibv_mr, i32)> {
    Err(Error::Unsupported(
        "GPU memory needs transport-verbs built with the `cuda` feature".into(),
    ))
}

#[cfg(feature = "cuda")]
pub(crate) fn register(d: &Arc<Domain>, g: &mut GpuBuffer) -> Result<(*mut sys::ibv_mr, i32)> {
    use cudarc::driver::sys as cu;

    use crate::mr::ACCESS;
    use crate::util::{errno, errno_text};

    if !transport_core::cuda_driver_present() {
        return Err(Error::Cuda(
            "no CUDA driver (libcuda.so) found: install the NVIDIA driver".into(),
        ));
    }
    g.context()
        .bind_to_thread()
        .map_err(|e| Error::Cuda(format!("cuCtxSetCurrent: {e:?}")))?;
    let (ptr, len) = (g.device_ptr(), g.len());
    // dmabuf export works on whole host pages.
    let page = transport_core::PAGE as u64;
    let start = ptr & !(page - 1);
    let end = (ptr + len as u64).div_ceil(page) * page;
    let mut fd: i32 = -1;
    // SAFETY: the context owning `ptr` is current; `fd` is a valid out-pointer for an int fd;
    // the range covers whole pages of one live allocation.
    let cu_rc = unsafe {
        cu::cuMemGetHandleForAddressRange(
            (&mut fd as *mut i32).cast(),
            start,
            (end - start) as usize,
            cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    let dmabuf_why = if cu_rc == cu::CUresult::CUDA_SUCCESS && fd >= 0 {
        // SAFETY: `pd` is live; `fd` is a dmabuf covering [start, end), and offset+len lies
        // inside it; the NIC addresses the region by `iova` = the device pointer.
        let mr = unsafe { sys::ibv_reg_dmabuf_mr(d.pd, ptr - start, len, ptr, fd, ACCESS) };
        if !mr.is_null() {
            return Ok((mr, fd));
        }
        let e = errno();
        // SAFETY: `fd` is ours and unused after the failed registration.
        unsafe { libc::close(fd) };
        format!("ibv_reg_dmabuf_mr: {}", errno_text(e))
    } else {
        format!("cuMemGetHandleForAddressRange(DMA_BUF_FD): {cu_rc:?}")
    };
    // SAFETY: `ptr..ptr+len` is a live device allocation owned by the region being built;
    // the peer-memory client (nvidia-peermem) pins it, or the call fails.
    let mr = unsafe { sys::ibvs_reg_mr(d.pd, ptr as *mut _, len, ACCESS) };
    if !mr.is_null() {
        return Ok((mr, -1));
    }
    let e = errno();
    Err(Error::Unsupported(format!(
        "cannot register {len} bytes of GPU memory on {}: dmabuf path failed ({dmabuf_why}); \
         peer-memory path failed (ibv_reg_mr on the device pointer: {}). Use an NVIDIA driver \
         with dmabuf support (open kernel modules, CUDA 11.7+) on kernel 5.12+, or load \
         nvidia-peermem",
        d.name,
        errno_text(e)
    )))
}
