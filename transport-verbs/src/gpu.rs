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

/// The page-aligned range a dmabuf must be exported for to cover `[ptr, ptr + len)`: its
/// start, its length, and the offset of `ptr` in it (dmabuf export works on whole pages).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn dmabuf_range(ptr: u64, len: usize, page: u64) -> (u64, u64, u64) {
    let start = ptr & !(page - 1);
    let end = (ptr + len as u64).div_ceil(page) * page;
    (start, end - start, ptr - start)
}

/// How GPU memory got registered: the decision, apart from the calls that make it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, PartialEq)]
pub(crate) enum Path<M> {
    /// `ibv_reg_dmabuf_mr` on an exported dmabuf; the fd stays open until deregistration.
    Dmabuf(M, i32),
    /// `ibv_reg_mr` on the device pointer, pinned by a peer-memory client (nvidia-peermem).
    PeerMemory(M),
}

/// Try dmabuf first, then peer memory; close the fd of a dmabuf that did not register; on
/// failure name both reasons and the fixes. Each step is a closure, so the order and the
/// messages are unit-tested without a GPU or a NIC.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn choose_path<M>(
    nic: &str,
    len: usize,
    export: impl FnOnce() -> std::result::Result<i32, String>,
    reg_dmabuf: impl FnOnce(i32) -> std::result::Result<M, String>,
    close: impl FnOnce(i32),
    reg_peer: impl FnOnce() -> std::result::Result<M, String>,
) -> Result<Path<M>> {
    let dmabuf_why = match export() {
        Ok(fd) => match reg_dmabuf(fd) {
            Ok(mr) => return Ok(Path::Dmabuf(mr, fd)),
            Err(why) => {
                close(fd);
                why
            }
        },
        Err(why) => why,
    };
    match reg_peer() {
        Ok(mr) => Ok(Path::PeerMemory(mr)),
        Err(peer_why) => Err(Error::Unsupported(format!(
            "cannot register {len} bytes of GPU memory on {nic}: dmabuf path failed \
             ({dmabuf_why}); peer-memory path failed ({peer_why}). Use an NVIDIA driver with \
             dmabuf support (open kernel modules, CUDA 11.7+) on kernel 5.12+, or load \
             nvidia-peermem"
        ))),
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn register(
    _d: &Arc<Domain>,
    _g: &mut GpuBuffer,
    _access: u32,
) -> Result<(*mut sys::ibv_mr, i32)> {
    Err(Error::Unsupported(
        "GPU memory needs transport-verbs built with the `cuda` feature".into(),
    ))
}

#[cfg(feature = "cuda")]
pub(crate) fn register(
    d: &Arc<Domain>,
    g: &mut GpuBuffer,
    access: u32,
) -> Result<(*mut sys::ibv_mr, i32)> {
    use cudarc::driver::sys as cu;

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
    let (start, span, offset) = dmabuf_range(ptr, len, transport_core::PAGE as u64);
    let export = || {
        let mut fd: i32 = -1;
        // SAFETY: the context owning `ptr` is current; `fd` is a valid out-pointer for an
        // int fd; the range covers whole pages of one live allocation.
        let rc = unsafe {
            cu::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast(),
                start,
                span as usize,
                cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        if rc == cu::CUresult::CUDA_SUCCESS && fd >= 0 {
            Ok(fd)
        } else {
            Err(format!("cuMemGetHandleForAddressRange(DMA_BUF_FD): {rc:?}"))
        }
    };
    let reg_dmabuf = |fd: i32| {
        // SAFETY: `pd` is live; `fd` is a dmabuf covering [start, start + span), and
        // offset + len lies inside it; the NIC addresses the region by `iova` = `ptr`.
        // ibv_reg_dmabuf_mr hands `access` to the kernel as is: every kernel with dmabuf MRs
        // (5.12+) knows the optional range and drops relaxed ordering where the device lacks it.
        let mr = unsafe { sys::ibv_reg_dmabuf_mr(d.pd, offset, len, ptr, fd, access as i32) };
        if mr.is_null() {
            Err(format!("ibv_reg_dmabuf_mr: {}", errno_text(errno())))
        } else {
            Ok(mr)
        }
    };
    // SAFETY: `fd` is ours and unused after the failed registration.
    let close = |fd: i32| unsafe {
        libc::close(fd);
    };
    let reg_peer = || {
        // SAFETY: `ptr..ptr+len` is a live device allocation owned by the region being
        // built; the peer-memory client (nvidia-peermem) pins it, or the call fails.
        // ibvs_reg_mr goes through ibv_reg_mr_iova2, so relaxed ordering is optional here too.
        let mr = unsafe { sys::ibvs_reg_mr(d.pd, ptr as *mut _, len, access as i32) };
        if mr.is_null() {
            Err(format!(
                "ibv_reg_mr on the device pointer: {}",
                errno_text(errno())
            ))
        } else {
            Ok(mr)
        }
    };
    match choose_path(&d.name, len, export, reg_dmabuf, close, reg_peer)? {
        Path::Dmabuf(mr, fd) => Ok((mr, fd)),
        Path::PeerMemory(mr) => Ok((mr, -1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn dmabuf_range_covers_whole_pages() {
        assert_eq!(dmabuf_range(0x10000, 4096, 4096), (0x10000, 4096, 0));
        assert_eq!(dmabuf_range(0x10010, 4096, 4096), (0x10000, 8192, 0x10));
        assert_eq!(dmabuf_range(0x10fff, 2, 4096), (0x10000, 8192, 0xfff));
        assert_eq!(
            dmabuf_range(0x200000, 1 << 21, 1 << 16),
            (0x200000, 1 << 21, 0)
        );
    }

    /// Runs `choose_path` with scripted outcomes; returns the path and the steps taken.
    fn run(
        export: Result<i32, &str>,
        dmabuf: Result<u32, &str>,
        peer: Result<u32, &str>,
    ) -> (Result<Path<u32>>, Vec<String>) {
        let log = RefCell::new(Vec::new());
        let r = choose_path(
            "mlx5_0",
            4096,
            || {
                log.borrow_mut().push("export".to_string());
                export.map_err(str::to_string)
            },
            |fd| {
                log.borrow_mut().push(format!("reg_dmabuf {fd}"));
                dmabuf.map_err(str::to_string)
            },
            |fd| log.borrow_mut().push(format!("close {fd}")),
            || {
                log.borrow_mut().push("reg_peer".to_string());
                peer.map_err(str::to_string)
            },
        );
        (r, log.into_inner())
    }

    #[test]
    fn dmabuf_first_and_peer_memory_untried() {
        let (r, log) = run(Ok(7), Ok(1), Ok(2));
        assert_eq!(r.ok(), Some(Path::Dmabuf(1, 7)));
        assert_eq!(log, ["export", "reg_dmabuf 7"]);
    }

    #[test]
    fn no_dmabuf_export_falls_back_to_peer_memory() {
        let (r, log) = run(Err("CUDA_ERROR_NOT_SUPPORTED"), Ok(1), Ok(2));
        assert_eq!(r.ok(), Some(Path::PeerMemory(2)));
        assert_eq!(log, ["export", "reg_peer"]);
    }

    #[test]
    fn refused_dmabuf_is_closed_before_peer_memory() {
        let (r, log) = run(Ok(9), Err("EOPNOTSUPP"), Ok(2));
        assert_eq!(r.ok(), Some(Path::PeerMemory(2)));
        assert_eq!(log, ["export", "reg_dmabuf 9", "close 9", "reg_peer"]);
    }

    #[test]
    fn neither_path_names_both_reasons_and_the_fixes() {
        let (r, log) = run(Ok(9), Err("ibv_reg_dmabuf_mr: EOPNOTSUPP"), Err("EFAULT"));
        assert_eq!(log, ["export", "reg_dmabuf 9", "close 9", "reg_peer"]);
        match r {
            Err(Error::Unsupported(m)) => {
                for want in [
                    "mlx5_0",
                    "4096 bytes",
                    "EOPNOTSUPP",
                    "EFAULT",
                    "nvidia-peermem",
                ] {
                    assert!(m.contains(want), "{want} missing: {m}");
                }
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
