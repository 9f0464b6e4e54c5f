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

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

    use super::GpuBuffer;
    use crate::{Error, Result};

    pub(super) struct Inner {
        pub(super) ctx: Arc<CudaContext>,
        pub(super) stream: Arc<CudaStream>,
        pub(super) slice: CudaSlice<u8>,
    }

    fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
        Error::Cuda(format!("{what}: {e:?}"))
    }

    /// Whether a CUDA driver library can be loaded. cudarc panics on first use without one,
    /// so everything here checks this first.
    pub fn driver_present() -> bool {
        // SAFETY: this only tries `dlopen` on the CUDA driver's library names and closes what it
        // opened; the driver library's initialisers are the same ones any CUDA program runs.
        // It is the one unsafe call in this crate, and it is what keeps cudarc from panicking.
        unsafe { cudarc::driver::sys::is_culib_present() }
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

    impl GpuBuffer {
        /// Allocate `len` zeroed bytes on CUDA device `ordinal`.
        pub fn alloc(ordinal: usize, len: usize) -> Result<Self> {
            let ctx = context(ordinal)?;
            let stream = ctx.default_stream();
            let slice = stream
                .alloc_zeros::<u8>(len)
                .map_err(|e| cuda_err("cuMemAlloc", e))?;
            let ptr = {
                let (p, _sync) = slice.device_ptr(&stream);
                p
            };
            Ok(Self {
                ordinal,
                ptr,
                len,
                inner: Inner { ctx, stream, slice },
            })
        }

        /// The CUDA context the memory lives in (for backends that need driver calls).
        pub fn context(&self) -> &Arc<CudaContext> {
            &self.inner.ctx
        }

        pub(super) fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
            let inner = &mut self.inner;
            let mut view = inner.slice.slice_mut(offset..offset + src.len());
            inner
                .stream
                .memcpy_htod(src, &mut view)
                .map_err(|e| cuda_err("cuMemcpyHtoD", e))?;
            inner
                .stream
                .synchronize()
                .map_err(|e| cuda_err("cuStreamSynchronize", e))
        }

        pub(super) fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
            let inner = &self.inner;
            let view = inner.slice.slice(offset..offset + dst.len());
            inner
                .stream
                .memcpy_dtoh(&view, dst)
                .map_err(|e| cuda_err("cuMemcpyDtoH", e))?;
            inner
                .stream
                .synchronize()
                .map_err(|e| cuda_err("cuStreamSynchronize", e))
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
