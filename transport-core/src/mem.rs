//! Memory to register: host buffers, and GPU buffers through cudarc (feature `cuda`).

/// Memory handed to [`crate::Transport::register`]; the region owns it until deregistered.
#[derive(Debug)]
pub enum Memory {
    Host(HostBuffer),
    Gpu(GpuBuffer),
}

impl Memory {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Memory::Host(h) => h.len(),
            Memory::Gpu(g) => g.len(),
        }
    }
    /// Whether the memory is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The host buffer, if this is host memory.
    pub fn host(&self) -> Option<&HostBuffer> {
        match self {
            Memory::Host(h) => Some(h),
            Memory::Gpu(_) => None,
        }
    }
    /// The host buffer, mutably, if this is host memory.
    pub fn host_mut(&mut self) -> Option<&mut HostBuffer> {
        match self {
            Memory::Host(h) => Some(h),
            Memory::Gpu(_) => None,
        }
    }
    /// Copy `src` into the memory at `offset` (a CUDA copy for GPU memory).
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> crate::Result<()> {
        check_range(offset, src.len(), self.len())?;
        match self {
            Memory::Host(h) => {
                h.as_mut_slice()[offset..offset + src.len()].copy_from_slice(src);
                Ok(())
            }
            Memory::Gpu(g) => g.write_at(offset, src),
        }
    }
    /// Copy `dst.len()` bytes from `offset` into `dst` (a CUDA copy for GPU memory).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> crate::Result<()> {
        check_range(offset, dst.len(), self.len())?;
        match self {
            Memory::Host(h) => {
                dst.copy_from_slice(&h.as_slice()[offset..offset + dst.len()]);
                Ok(())
            }
            Memory::Gpu(g) => g.read_at(offset, dst),
        }
    }
}

fn check_range(offset: usize, len: usize, total: usize) -> crate::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(crate::Error::InvalidArgument(format!(
            "range {offset}+{len} does not fit {total} bytes"
        ))),
    }
}

/// Mutable access to the bytes of registered memory, never to the memory itself: a region
/// keeps the allocation it registered for as long as it lives.
pub struct MemoryMut<'a>(&'a mut Memory);

impl<'a> MemoryMut<'a> {
    /// A view of a region's memory (for backends implementing [`crate::MemoryRegion`]).
    pub fn new(mem: &'a mut Memory) -> Self {
        MemoryMut(mem)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether the memory is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The bytes of host memory; `None` for GPU memory.
    pub fn host_bytes(self) -> Option<&'a mut [u8]> {
        self.0.host_mut().map(HostBuffer::as_mut_slice)
    }
    /// Copy `src` into the memory at `offset` (a CUDA copy for GPU memory).
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> crate::Result<()> {
        self.0.write_at(offset, src)
    }
}

impl From<HostBuffer> for Memory {
    fn from(h: HostBuffer) -> Self {
        Memory::Host(h)
    }
}
impl From<GpuBuffer> for Memory {
    fn from(g: GpuBuffer) -> Self {
        Memory::Gpu(g)
    }
}

/// Page-aligned, zeroed host memory. Its address never changes while it lives.
pub struct HostBuffer {
    storage: Box<[u8]>,
    offset: usize,
    len: usize,
}

/// Alignment of host buffers: one 4 KiB page.
pub const PAGE: usize = 4096;

impl HostBuffer {
    /// `len` zeroed bytes, aligned to [`PAGE`].
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + PAGE].into_boxed_slice();
        let offset = storage.as_ptr().align_offset(PAGE);
        Self {
            storage,
            offset,
            len,
        }
    }
    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::new(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Start address, for registration.
    pub fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }
    /// Start address, for registration.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
    /// The bytes. A peer's WRITE may change them at any time while the buffer is registered;
    /// read them after the completion that says the WRITE landed.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }
    /// Eight bytes at `offset`, read with a volatile load, for checks that look at memory a
    /// peer's WRITEs may still be changing (the bytes may then mix an old and a new value);
    /// `None` where they do not fit the buffer.
    pub fn peek8(&self, offset: usize) -> Option<[u8; 8]> {
        let end = offset.checked_add(8)?;
        if end > self.len {
            return None;
        }
        let p = self.storage[self.offset + offset..]
            .as_ptr()
            .cast::<[u8; 8]>();
        // SAFETY: [offset, offset + 8) lies inside the buffer (checked above) and stays
        // allocated for the call; [u8; 8] has alignment 1 and every bit pattern is a value; the
        // load is volatile because a NIC may write the bytes behind the compiler's back.
        Some(unsafe { std::ptr::read_volatile(p) })
    }
    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.as_ptr())
            .field("len", &self.len)
            .finish()
    }
}

/// Memory on a CUDA device. Allocate it with [`GpuBuffer::alloc`] (feature `cuda`).
///
/// Every allocation carries `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`: a synchronous CUDA copy
/// into or out of it (a provider's `cudaMemcpy`, this type's [`Memory::write_at`]) has run
/// when it returns. Without it a device-to-device `cudaMemcpy` may return before the GPU ran
/// it, and libfabric's `shm` moves GPU memory between processes with exactly such a copy in
/// the receiving process: the completion that announces the bytes (a
/// [`crate::CompletionKind::RemoteWrite`], a receive) could then arrive while they are still
/// on their way, and work on another stream read the old ones. fabtests
/// (`hmem_cuda.c`) and NVSHMEM set it on their buffers for the same reason.
pub struct GpuBuffer {
    ordinal: usize,
    ptr: u64,
    len: usize,
    #[cfg(feature = "cuda")]
    inner: cuda::Inner,
}

impl std::fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("ordinal", &self.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl GpuBuffer {
    /// CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// Device pointer (`CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(not(feature = "cuda"))]
    pub(crate) fn make_gpudirect_writes_visible(&self) -> crate::Result<()> {
        Err(crate::Error::Cuda(
            "built without the `cuda` feature".into(),
        ))
    }
    #[cfg(not(feature = "cuda"))]
    fn write_at(&mut self, _offset: usize, _src: &[u8]) -> crate::Result<()> {
        Err(crate::Error::Cuda(
            "built without the `cuda` feature".into(),
        ))
    }
    #[cfg(not(feature = "cuda"))]
    fn read_at(&self, _offset: usize, _dst: &mut [u8]) -> crate::Result<()> {
        Err(crate::Error::Cuda(
            "built without the `cuda` feature".into(),
        ))
    }
}

/// What makes a NIC's GPUDirect RDMA WRITEs into a GPU visible to work that GPU runs next,
/// from two attributes of the device (CUDA's GPUDirect RDMA guide, "Synchronization and
/// Memory Ordering").
///
/// A NIC writing into GPU memory over PCIe does not by itself order those writes with the
/// completion it writes into host memory: the CPU can see the completion while the bytes are
/// not yet visible to a kernel (or a copy) the GPU runs next. Where the device orders remote
/// writes for its own context (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING` at least
/// `OWNER`; Hopper and later report it on most platforms) nothing is needed; elsewhere
/// `cuFlushGPUDirectRDMAWrites(CURRENT_CTX, TO_OWNER)` blocks until they are visible, where
/// the device supports it from the host (`..._FLUSH_WRITES_OPTIONS` has `HOST`). NCCL flushes
/// on GPUs before compute capability 9.0 with a one-byte RDMA READ of the received buffer
/// through a loopback queue pair (a read completion cannot pass the posted writes before
/// it); aws-ofi-nccl calls `cudaDeviceFlushGPUDirectRDMAWrites` where CUDA flush is enabled
/// and an `fi_read` of the buffer otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuDirectFlush {
    /// The device orders GPUDirect RDMA writes for its own context: nothing to do.
    NotNeeded,
    /// `cuFlushGPUDirectRDMAWrites` from the host makes them visible.
    Host,
    /// The device neither orders them nor flushes them from the host (a driver before CUDA
    /// 11.3, or a platform without the path).
    Unsupported,
}

/// `CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER`.
pub const GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER: i32 = 100;
/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST`.
pub const FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST: i32 = 1;

impl GpuDirectFlush {
    /// The plan for a device reporting `ordering`
    /// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`) and `options`
    /// (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`); an attribute the driver
    /// does not know reads as 0.
    pub fn of_device(ordering: i32, options: i32) -> Self {
        if ordering >= GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER {
            GpuDirectFlush::NotNeeded
        } else if options & FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST != 0 {
            GpuDirectFlush::Host
        } else {
            GpuDirectFlush::Unsupported
        }
    }
}

/// How a backend's provider moved bytes into a region, for
/// [`crate::Transport::make_gpu_visible`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landing {
    /// A NIC wrote them by DMA (GPUDirect RDMA for GPU memory): EFA, verbs.
    NicDma,
    /// The provider copied them with the CPU or with synchronous CUDA copies (libfabric's
    /// `shm` and `tcp`): on [`GpuBuffer`] memory (`SYNC_MEMOPS`) those have run before the
    /// completion is written.
    ProviderCopy,
}

/// Make what completed operations put into `mem` visible to work its GPU runs next, for
/// bytes that landed as `landing` says (the body of [`crate::Transport::make_gpu_visible`] for
/// both backends). Host memory and provider copies: nothing to do. GPU memory a NIC wrote:
/// [`GpuBuffer`]'s [`GpuDirectFlush`] plan.
pub fn make_gpu_visible(mem: &Memory, landing: Landing) -> crate::Result<()> {
    match (mem, landing) {
        (Memory::Host(_), _) | (Memory::Gpu(_), Landing::ProviderCopy) => Ok(()),
        (Memory::Gpu(g), Landing::NicDma) => g.make_gpudirect_writes_visible(),
    }
}

/// The whole pages around a byte range, as a dmabuf is exported and registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmabufRange {
    /// Start of the exported range: the range's start rounded down to a page (dmabuf export
    /// and registration work on whole pages).
    pub export_base: u64,
    /// Length of the exported range, whole pages.
    pub export_len: u64,
    /// Where the range starts in the dmabuf (`fi_mr_dmabuf.offset`,
    /// `ibv_reg_dmabuf_mr`'s `offset`).
    pub offset: u64,
    /// The virtual address of the dmabuf's first byte, page aligned (`fi_mr_dmabuf.base_addr`:
    /// fi_mr(3) wants "the page-aligned starting virtual address of the memory region
    /// allocated by the DMA-buf"). The range's own address is `base_addr + offset`, which is
    /// what libfabric registers as the IOVA and what peers' WRITEs address.
    pub base_addr: u64,
}

/// [`DmabufRange`] of `[ptr, ptr + len)` with pages of `page` bytes (a power of two).
pub fn dmabuf_range(ptr: u64, len: usize, page: u64) -> DmabufRange {
    debug_assert!(page.is_power_of_two());
    let export_base = ptr & !(page - 1);
    let offset = ptr - export_base;
    DmabufRange {
        export_base,
        export_len: (offset + len as u64).div_ceil(page) * page,
        offset,
        base_addr: export_base,
    }
}

/// A dmabuf exported for part of a [`GpuBuffer`] ([`GpuBuffer::export_dmabuf`]); the fd
/// closes on drop (a registration keeps its own reference to the dmabuf).
#[derive(Debug)]
pub struct Dmabuf {
    /// The dmabuf.
    pub fd: std::os::fd::OwnedFd,
    /// The pages it covers and where the range sits in them.
    pub range: DmabufRange,
}

#[cfg(feature = "cuda")]
mod cuda {
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
            unsafe { result::memset_d8_sync(ptr, 0, len) }
                .map_err(|e| cuda_err("cuMemsetD8", e))?;
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
                sys::cuPointerGetAttribute(
                    (&mut v as *mut std::os::raw::c_int).cast(),
                    attr,
                    self.ptr,
                )
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
}

#[cfg(feature = "cuda")]
pub use cuda::{
    context as cuda_context, device_count as cuda_device_count,
    driver_present as cuda_driver_present,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_are_page_aligned_and_zeroed() {
        for len in [0, 1, 4095, 4096, 1 << 20] {
            let b = HostBuffer::new(len);
            assert_eq!(b.as_ptr() as usize % PAGE, 0);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
    }

    /// fi_mr(3) takes the dmabuf's page-aligned base and the region's offset in it, and the
    /// provider registers the IOVA `base_addr + offset`. transport-efa passed the buffer's own
    /// address as the base together with that offset, so a region that does not start on a
    /// page (a sub-range of an allocation) was registered `offset` bytes past itself, and
    /// peers' WRITEs (addressed by virtual address) landed there or failed the range check.
    #[test]
    fn dmabuf_base_is_the_page_and_base_plus_offset_is_the_range() {
        let page = 4096;
        for (ptr, len) in [
            (0x7f00_0000_0000_u64, 4096_usize),
            (0x7f00_0000_0234, 4096),
            (0x7f00_0000_0ff8, 16),
            (0x7f00_0001_0000, 1 << 30),
            (0x7f00_0000_1001, 1),
        ] {
            let r = dmabuf_range(ptr, len, page);
            assert_eq!(r.base_addr + r.offset, ptr, "{r:?}");
            assert_eq!(r.base_addr % page, 0, "{r:?}");
            assert_eq!(r.export_base, r.base_addr);
            assert_eq!(r.export_len % page, 0, "{r:?}");
            assert!(r.offset + len as u64 <= r.export_len, "{r:?}");
            assert!(r.export_len - (r.offset + len as u64) < page, "{r:?}");
        }
        assert_eq!(
            dmabuf_range(0x7f00_0000_0234, 4096, page),
            DmabufRange {
                export_base: 0x7f00_0000_0000,
                export_len: 8192,
                offset: 0x234,
                base_addr: 0x7f00_0000_0000,
            }
        );
    }

    /// The device's own ordering wins; the host flush is the fallback; neither is an
    /// error at flush time, not silence. An attribute the driver does not know reads 0.
    #[test]
    fn gpudirect_flush_plan_follows_the_device() {
        use GpuDirectFlush::*;
        let owner = GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
        let host = FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
        assert_eq!(GpuDirectFlush::of_device(owner, 0), NotNeeded);
        assert_eq!(GpuDirectFlush::of_device(200, host), NotNeeded);
        assert_eq!(GpuDirectFlush::of_device(0, host), Host);
        assert_eq!(GpuDirectFlush::of_device(0, host | 2), Host);
        assert_eq!(GpuDirectFlush::of_device(0, 2), Unsupported);
        assert_eq!(GpuDirectFlush::of_device(0, 0), Unsupported);
    }

    /// Host memory needs nothing, whatever moved it.
    #[test]
    fn host_memory_is_visible_as_it_lands() {
        let m = Memory::Host(HostBuffer::new(64));
        assert!(make_gpu_visible(&m, Landing::NicDma).is_ok());
        assert!(make_gpu_visible(&m, Landing::ProviderCopy).is_ok());
    }

    #[test]
    fn peek8_reads_inside_the_buffer_only() {
        let mut b = HostBuffer::new(16);
        b.as_mut_slice()[8..16].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b.peek8(8), Some([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(b.peek8(9), None);
        assert_eq!(b.peek8(usize::MAX), None);
    }

    #[test]
    fn memory_read_write_is_bounds_checked() {
        let mut m = Memory::Host(HostBuffer::new(16));
        m.write_at(4, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 5];
        m.read_at(3, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 0]);
        assert!(m.write_at(15, &[1, 2]).is_err());
        assert!(m.read_at(usize::MAX, &mut out).is_err());
    }
}
