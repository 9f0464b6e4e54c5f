//! The CUDA side of [`GpuBuffer`]: the `cuMemAlloc` allocation (with
//! `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`), its attributes, dmabuf export, copies, and the flush
//! that makes a NIC's GPUDirect RDMA writes visible (feature `cuda`).

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use super::{dmabuf_range, Dmabuf, GpuBuffer, GpuDirectFlush, PAGE};
use crate::{Error, Result};

/// The allocation behind a [`GpuBuffer`]: `cuMemAlloc` memory, freed on drop.
///
/// Not cudarc's stream allocator: on GPUs with memory pools it allocates with
/// `cuMemAllocAsync`, and such pointers report `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
/// = 0` (measured on an H100, driver 580, at every size from 4 KiB to 1 GiB, while
/// `cuMemAlloc`'s report 1): nvidia-peermem and EFA cannot pin them, and CUDA IPC, which
/// libfabric's shm uses between processes, cannot export them.
pub(super) struct Inner {
    pub(super) ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    /// What makes GPUDirect RDMA writes into it visible, read from the device once.
    flush: GpuDirectFlush,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: ptr came from cuMemAlloc in this context and is freed once, here;
            // every region that used it was deregistered before the buffer is dropped
            // (regions own their memory).
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("{what}: {e:?}"))
}

/// Whether a CUDA driver library can be loaded. cudarc panics on first use without one,
/// so everything here checks this first.
pub fn driver_present() -> bool {
    // SAFETY: this only tries `dlopen` on the CUDA driver's library names and closes what it
    // opened; the driver library's initialisers are the same ones any CUDA program runs.
    // It is what keeps cudarc from panicking.
    unsafe { sys::is_culib_present() }
}

/// Number of CUDA devices; 0 where no driver is present.
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        return Ok(0);
    }
    CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(|e| cuda_err("cuDeviceGetCount", e))
}

/// The CUDA context of device `ordinal`, created on first use.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    if !driver_present() {
        return Err(Error::Cuda(
            "no CUDA driver (libcuda.so) found; install the NVIDIA driver or use host memory"
                .into(),
        ));
    }
    let n = device_count()?;
    if ordinal >= n {
        return Err(Error::InvalidArgument(format!(
            "GPU {ordinal} does not exist: CUDA sees {n} device(s)"
        )));
    }
    CudaContext::new(ordinal).map_err(|e| cuda_err("cuCtxCreate", e))
}

/// The device whose CUDA context is current on the calling thread; `None` where none is (or
/// there is no driver). A thread that allocated GPU memory has its device's context current:
/// this is what it hands to the threads it starts, which make it theirs with
/// [`enter_device`].
pub fn current_device() -> Option<usize> {
    if !driver_present() {
        return None;
    }
    result::ctx::get_current().ok().flatten()?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a context is current on this thread (checked just above), which is all
    // cuCtxGetDevice needs; it writes one CUdevice through the pointer, a local here.
    let r = unsafe { sys::cuCtxGetDevice(&mut dev) };
    (r == sys::CUresult::CUDA_SUCCESS)
        .then(|| usize::try_from(dev).ok())
        .flatten()
}

/// Make device `ordinal`'s (primary) context current on the calling thread.
///
/// Every thread that posts or polls on GPU memory needs one. Providers call the CUDA driver
/// from the thread that drives the endpoint, not the one that registered the memory:
/// libfabric 2.6's shm takes a CUDA IPC handle there (`cuMemGetAddressRange`), and on a
/// thread without a context that fails (`CUDA_ERROR_INVALID_CONTEXT`) and it copies the
/// WRITE through host bounce buffers instead ("unable to use IPC for msg, fallback to using
/// SAR"); the runtime call of that copy happens to make the primary context current, so only
/// the first WRITEs pay (transport-efa's `tests/gpu_ipc.rs` shows both). NCCL's proxy
/// threads set their device for the same reason.
pub fn enter_device(ordinal: usize) -> Result<()> {
    context(ordinal)?
        .bind_to_thread()
        .map_err(|e| cuda_err("cuCtxSetCurrent", e))
}

/// An attribute of the context's device; 0 where the driver does not know it.
fn device_attribute(ctx: &CudaContext, attr: sys::CUdevice_attribute) -> i32 {
    ctx.attribute(attr).unwrap_or(0)
}

/// Set `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` on the allocation at `ptr` (current context).
fn set_sync_memops(ptr: sys::CUdeviceptr) -> Result<()> {
    let on: std::os::raw::c_uint = 1;
    // SAFETY: the context is current and ptr is the start of a live allocation of it;
    // the attribute's value is read as one unsigned int from the pointer given.
    let r = unsafe {
        sys::cuPointerSetAttribute(
            (&on as *const std::os::raw::c_uint).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(cuda_err(
            "cuPointerSetAttribute(SYNC_MEMOPS): without it a provider's CUDA copy into \
             this memory may complete after the completion announcing it",
            r,
        ));
    }
    Ok(())
}

impl GpuBuffer {
    /// Allocate `len` zeroed bytes on CUDA device `ordinal` with `cuMemAlloc`, memory
    /// that GPUDirect RDMA can pin (see [`GpuBuffer::gpudirect_rdma_capable`]), with
    /// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` set (see [`GpuBuffer`]).
    pub fn alloc(ordinal: usize, len: usize) -> Result<Self> {
        Self::alloc_with(ordinal, len, true)
    }

    /// [`GpuBuffer::alloc`] of a region of `len` bytes that starts `skew` bytes into a 4 KiB
    /// page (`skew` below [`crate::PAGE`]; 0: [`GpuBuffer::alloc`], where `cuMemAlloc` puts
    /// it), to place a region where another tool's sits: `ucx_perftest`'s receive buffer
    /// shares a `cuMemAlloc` chunk with its send buffer and starts 512 bytes into a page. One
    /// `cuMemAlloc` of up to a page more; the bytes around the region are not handed out, and
    /// the allocation is freed whole on drop.
    pub fn alloc_at_page_offset(ordinal: usize, len: usize, skew: usize) -> Result<Self> {
        if skew == 0 {
            return Self::alloc(ordinal, len);
        }
        let page = crate::PAGE;
        let total = (skew < page)
            .then(|| len.checked_add(page - 1 + skew))
            .flatten()
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a GPU region of {len} bytes {skew} bytes into a page: at most {} bytes in",
                    page - 1
                ))
            })?;
        let mut b = Self::alloc_with(ordinal, total, true)?;
        b.ptr = b.ptr.next_multiple_of(page as u64) + skew as u64;
        b.len = len;
        Ok(b)
    }

    /// [`GpuBuffer::alloc`] without `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`: memory on which a
    /// provider's synchronous CUDA copy may still be running when it returns. Only for
    /// the test that shows what the attribute is for (`transport-efa`'s
    /// `tests/gpu_visibility.rs`); nothing else may use it.
    #[doc(hidden)]
    pub fn alloc_without_sync_memops(ordinal: usize, len: usize) -> Result<Self> {
        Self::alloc_with(ordinal, len, false)
    }

    /// Every GPU allocation of this project goes through here: the attribute is set
    /// before the memory is handed out (a later `cuMemCreate`/VMM path must do the same).
    fn alloc_with(ordinal: usize, len: usize, sync_memops: bool) -> Result<Self> {
        let ctx = context(ordinal)?;
        ctx.bind_to_thread()
            .map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        let flush = GpuDirectFlush::of_device(
            device_attribute(
                &ctx,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
            ),
            device_attribute(
                &ctx,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
            ),
        );
        // SAFETY: the context is current; cuMemAlloc returns a fresh allocation (at least
        // one byte: CUDA refuses zero), owned by Inner from here on and freed on drop.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }
            .map_err(|e| cuda_err(&format!("cuMemAlloc({len})"), e))?;
        let inner = Inner { ctx, ptr, flush };
        if sync_memops {
            set_sync_memops(ptr)?;
        }
        // SAFETY: [ptr, ptr + len) lies in the allocation just made; bytes are plain data.
        unsafe { result::memset_d8_sync(ptr, 0, len) }.map_err(|e| cuda_err("cuMemsetD8", e))?;
        inner
            .ctx
            .synchronize()
            .map_err(|e| cuda_err("cuCtxSynchronize", e))?;
        Ok(Self {
            ordinal,
            ptr,
            len,
            inner,
        })
    }

    /// The CUDA context the memory lives in (for backends that need driver calls).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` of the buffer: whether synchronous CUDA copies
    /// into it have run when they return (true for every [`GpuBuffer::alloc`]).
    pub fn sync_memops(&self) -> Result<bool> {
        self.pointer_flag(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            "cuPointerGetAttribute(SYNC_MEMOPS)",
        )
    }

    /// What makes GPUDirect RDMA writes into this buffer visible to its GPU.
    pub fn gpudirect_flush(&self) -> GpuDirectFlush {
        self.inner.flush
    }

    /// Make a NIC's completed GPUDirect RDMA writes into this buffer visible to work its
    /// GPU runs next ([`GpuDirectFlush`]): nothing where the device orders them,
    /// `cuFlushGPUDirectRDMAWrites(CURRENT_CTX, TO_OWNER)` where it flushes them from the
    /// host, an `Unsupported` error where it does neither. No allocation, no lock of
    /// ours; the flush is one driver call.
    pub(crate) fn make_gpudirect_writes_visible(&self) -> Result<()> {
        match self.inner.flush {
            GpuDirectFlush::NotNeeded => Ok(()),
            GpuDirectFlush::Host => {
                self.inner
                    .ctx
                    .bind_to_thread()
                    .map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
                // SAFETY: plain enum arguments; the context owning the memory is current,
                // which is the target CURRENT_CTX names.
                let r = unsafe {
                    sys::cuFlushGPUDirectRDMAWrites(
                        sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                        sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
                    )
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(cuda_err("cuFlushGPUDirectRDMAWrites", r));
                }
                Ok(())
            }
            GpuDirectFlush::Unsupported => Err(Error::Unsupported(format!(
                "GPU {} neither orders GPUDirect RDMA writes for its own context nor \
                 flushes them from the host (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_\
                 ORDERING below OWNER, no HOST in ..._FLUSH_WRITES_OPTIONS): a kernel may \
                 read bytes a NIC wrote before they are visible; update the NVIDIA driver \
                 (CUDA 11.3+)",
                self.ordinal
            ))),
        }
    }

    /// A pointer attribute written as one int, as a flag.
    fn pointer_flag(&self, attr: sys::CUpointer_attribute, what: &str) -> Result<bool> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        let mut v: std::os::raw::c_int = 0;
        // SAFETY: the context is current, ptr is a live allocation of it, and the
        // attributes read here are written as one int.
        let r = unsafe {
            sys::cuPointerGetAttribute((&mut v as *mut std::os::raw::c_int).cast(), attr, self.ptr)
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda_err(what, r));
        }
        Ok(v != 0)
    }

    /// `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE` of the buffer: whether a NIC can
    /// pin it for GPUDirect RDMA (nvidia-peermem, dmabuf). 1 for `cuMemAlloc` memory on a
    /// GPU that supports GPUDirect RDMA.
    pub fn gpudirect_rdma_capable(&self) -> Result<bool> {
        self.pointer_flag(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
            "cuPointerGetAttribute(IS_GPU_DIRECT_RDMA_CAPABLE)",
        )
    }

    /// Export `[offset, offset + len)` of the buffer as a dmabuf
    /// (`cuMemGetHandleForAddressRange`, CUDA 11.7+ with NVIDIA's open kernel modules):
    /// the whole pages around the range, and where the range sits in them.
    pub fn export_dmabuf(&self, offset: usize, len: usize) -> Result<Dmabuf> {
        super::check_range(offset, len, self.len)?;
        if len == 0 {
            return Err(Error::InvalidArgument("cannot export 0 bytes".into()));
        }
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        let range = dmabuf_range(self.ptr + offset as u64, len, PAGE as u64);
        let mut fd: std::os::raw::c_int = -1;
        // SAFETY: fd is a valid out pointer for an int; the exported range lies in the
        // page-rounded allocation (cuMemAlloc allocations are page-aligned and
        // page-granular); the context is current.
        let r = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::os::raw::c_int).cast(),
                range.export_base,
                range.export_len as usize,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || fd < 0 {
            return Err(Error::Unsupported(format!(
                "cuMemGetHandleForAddressRange (dmabuf export) failed: {r:?}; it needs CUDA \
                 11.7+ and NVIDIA's open kernel modules (Linux 5.12+)"
            )));
        }
        Ok(Dmabuf {
            // SAFETY: the driver just created fd for us; OwnedFd closes it once.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            range,
        })
    }

    pub(super) fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        // SAFETY: the caller checked [offset, offset + src.len()) against len, so the
        // destination lies in the live allocation; the source is a plain byte slice.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, src) }
            .map_err(|e| cuda_err("cuMemcpyHtoD", e))?;
        // The copy from pageable memory may still be in flight when it returns: wait, so a
        // NIC reading the buffer next sees the bytes.
        self.inner
            .ctx
            .synchronize()
            .map_err(|e| cuda_err("cuCtxSynchronize", e))
    }

    pub(super) fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        // SAFETY: the caller checked the range against len; dst is a plain byte slice the
        // synchronous copy fills before it returns.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset as u64) }
            .map_err(|e| cuda_err("cuMemcpyDtoH", e))
    }
}
