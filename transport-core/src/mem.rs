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
                h.copy_in(offset, src);
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
                h.copy_out(offset, dst);
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

/// Writes into registered memory, never the memory itself: a region keeps the allocation it
/// registered for as long as it lives. It copies bytes in ([`MemoryMut::write_at`]) and lends
/// no slice of them: a send posted from the region may still be reading them.
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
///
/// Once registered, the bytes are shared with a NIC (or a peer's process), which may write
/// or read them at any time an operation is posted. So a shared borrow of the buffer gives
/// no `&[u8]` of them, whose bytes Rust would take to be frozen while it lives: it copies
/// them out ([`HostBuffer::to_vec`], [`Memory::read_at`]) or reads eight at a time with a
/// volatile load ([`HostBuffer::peek8`]). Only the buffer's owner, before it registers the
/// buffer or after it deregisters it, gets a slice ([`HostBuffer::as_mut_slice`]): a
/// region never hands out `&mut HostBuffer` (its [`MemoryMut`] copies too).
pub struct HostBuffer {
    /// The whole allocation (a `Box<[u8]>` turned into a raw pointer, freed in `Drop`): no
    /// reference to its bytes lives while a NIC may write them.
    storage: std::ptr::NonNull<[u8]>,
    offset: usize,
    len: usize,
}

// SAFETY: a HostBuffer owns its allocation, as the Box it was made from did, and nothing
// else frees it; moving it to another thread moves that ownership.
unsafe impl Send for HostBuffer {}
// SAFETY: through `&HostBuffer` the bytes are only copied out through raw pointers or read
// with volatile loads, never written and never lent as a reference, so two threads may do
// that at once. Writers are the NIC, a peer's process, or a backend's progress thread copying
// a peer's message in (UCX's active messages), all announced by a completion: a copy made
// before it may mix old and new bytes, as a C program's would; after it, the bytes are whole.
unsafe impl Sync for HostBuffer {}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `storage` came from `Box::leak` in `at_page_offset` (a leaked Box may be
        // rebuilt with `Box::from_raw`) and is freed only here, once.
        drop(unsafe { Box::from_raw(self.storage.as_ptr()) });
    }
}

/// Alignment of host buffers: one 4 KiB page.
pub const PAGE: usize = 4096;

impl HostBuffer {
    /// `len` zeroed bytes, aligned to [`PAGE`].
    pub fn new(len: usize) -> Self {
        Self::at_page_offset(len, 0)
    }
    /// `len` zeroed bytes that start `skew % PAGE` bytes into a page (a benchmark's
    /// `--buf-offset`: where a copy's source or target sits in its page can change what the
    /// copy costs).
    ///
    /// Every page is written once here, so each is the buffer's own memory: fresh anonymous
    /// memory is not mapped until something touches it (a read maps the kernel's one shared
    /// zero page), and a copy that reads from or next to such a page runs at another speed
    /// than it would in a program's written buffers. On an Intel host, a 4 KiB copy out of a
    /// page-aligned message whose next page was never touched took 3-4x as long
    /// (docs/measurements.md, "The page-aligned penalty, explained"). A NIC registration that
    /// pins the pages for writing maps them anyway; a backend that only copies (UCX, or
    /// libfabric's shm and tcp) does not.
    pub fn at_page_offset(len: usize, skew: usize) -> Self {
        let skew = skew % PAGE;
        let total = len.checked_add(PAGE + skew).unwrap_or_else(|| {
            panic!("a host buffer of {len} bytes does not fit the address space")
        });
        let mut storage = vec![0u8; total].into_boxed_slice();
        // The compiler knows the allocator zeroed the bytes and would drop a store of zero;
        // black_box hides that, so each page takes its store (and its page fault) here.
        // Every PAGE-th byte from the start touches each page but a partial last one, which
        // holds the page after the buffer: the last byte touches it.
        std::hint::black_box(&mut storage);
        for i in (0..storage.len()).step_by(PAGE).chain([storage.len() - 1]) {
            storage[i] = 0;
        }
        let offset = storage.as_ptr().align_offset(PAGE) + skew;
        // Every access through the raw pointer below relies on this.
        assert!(offset
            .checked_add(len)
            .is_some_and(|end| end <= storage.len()));
        Self {
            storage: std::ptr::NonNull::from(Box::leak(storage)),
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
        self.at(0, 0)
    }
    /// Start address, for registration.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.at(0, 0)
    }
    /// The address of byte `offset`, where `[offset, offset + n)` lies inside the buffer;
    /// panics otherwise (callers check ranges first and return errors). Inside the
    /// allocation, since `offset + len` fits it (`at_page_offset`).
    fn at(&self, offset: usize, n: usize) -> *mut u8 {
        assert!(offset.checked_add(n).is_some_and(|end| end <= self.len));
        self.storage
            .as_ptr()
            .cast::<u8>()
            .wrapping_add(self.offset + offset)
    }
    /// A copy of the bytes. A peer's WRITE may change them at any time while the buffer is
    /// registered: copy them after the completion that says the WRITE landed.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.copy_out(0, &mut v);
        v
    }
    /// Copy `dst.len()` bytes from `offset` into `dst`; panics on a range past the end
    /// (callers check it first and return an error).
    fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        let from = self.at(offset, dst.len());
        // SAFETY: [offset, offset + dst.len()) lies inside the buffer (`at` asserts it), which
        // stays allocated for the call; `dst` is a distinct, exclusive borrow, so the two do
        // not overlap. No reference to the buffer's bytes is made: a NIC may be writing other
        // bytes of it (or, if the caller reads early, these: then the copy mixes old and new
        // bytes, as peek8's load may).
        unsafe { std::ptr::copy_nonoverlapping(from, dst.as_mut_ptr(), dst.len()) }
    }
    /// Copy `src` into the buffer at `offset`; panics on a range past the end (callers
    /// check it first and return an error).
    fn copy_in(&mut self, offset: usize, src: &[u8]) {
        let to = self.at(offset, src.len());
        // SAFETY: [offset, offset + src.len()) lies inside the buffer (`at` asserts it), which
        // `&mut self` holds; `src` cannot alias it (no `&[u8]` of a buffer's bytes outlives
        // `as_mut_slice`'s `&mut` borrow, which `&mut self` here excludes).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) }
    }
    /// Eight bytes at `offset`, read with a volatile load, for checks that look at memory a
    /// peer's WRITEs may still be changing (the bytes may then mix an old and a new value);
    /// `None` where they do not fit the buffer.
    #[inline]
    pub fn peek8(&self, offset: usize) -> Option<[u8; 8]> {
        let end = offset.checked_add(8)?;
        if end > self.len {
            return None;
        }
        let p = self.at(offset, 8).cast_const().cast::<[u8; 8]>();
        // SAFETY: [offset, offset + 8) lies inside the buffer (checked above) and stays
        // allocated for the call; [u8; 8] has alignment 1 and every bit pattern is a value; the
        // load is volatile because a NIC may write the bytes behind the compiler's back.
        Some(unsafe { std::ptr::read_volatile(p) })
    }
    /// The bytes, mutably: for the buffer's owner, before it registers it or after it
    /// deregisters it (a region never lends `&mut HostBuffer`).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: [offset, offset + len) lies inside the allocation (`at_page_offset`), and
        // `&mut self` is exclusive: no region holds this buffer (a region owns its memory and
        // lends neither `&mut Memory` nor `&mut HostBuffer`), so no NIC is told to touch it,
        // and the slice lives no longer than the borrow.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len) }
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

/// Memory on a CUDA device. Allocate it with `GpuBuffer::alloc` (feature `cuda`).
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

/// A dmabuf exported for part of a [`GpuBuffer`] (`GpuBuffer::export_dmabuf`, feature
/// `cuda`); the fd closes on drop (a registration keeps its own reference to the dmabuf).
#[derive(Debug)]
pub struct Dmabuf {
    /// The dmabuf.
    pub fd: std::os::fd::OwnedFd,
    /// The pages it covers and where the range sits in them.
    pub range: DmabufRange,
}

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(feature = "cuda")]
pub use cuda::{
    context as cuda_context, current_device as cuda_current_device,
    device_count as cuda_device_count, driver_present as cuda_driver_present,
    enter_device as cuda_enter_device,
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
            assert!(b.to_vec().iter().all(|&x| x == 0));
        }
    }

    /// Resident set size of this process in bytes (Linux's /proc/self/statm).
    fn resident() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * PAGE
    }

    /// A buffer's pages are its own memory from the start, neither unmapped nor the kernel's
    /// shared zero page: the process's resident set grows by about the buffer's size when it is
    /// made; with either it would not grow at all. Half is the bar: other tests of this binary run at
    /// the same time and may free a few MiB meanwhile.
    #[test]
    fn host_buffers_are_backed_by_their_own_pages() {
        let len = 64 << 20;
        let before = resident();
        let b = HostBuffer::at_page_offset(len, 64);
        let grown = resident().saturating_sub(before);
        assert!(
            grown >= len / 2,
            "a {len}-byte buffer grew the resident set by {grown} bytes: its pages are not its own"
        );
        assert!(b.to_vec().iter().step_by(PAGE).all(|&x| x == 0));
    }

    /// Whether the page holding `addr` is in memory or swap (bits 63 and 62 of its entry in
    /// /proc/self/pagemap): a page nothing touched yet is neither.
    fn mapped(addr: usize) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        f.seek(SeekFrom::Start((addr / PAGE * 8) as u64)).unwrap();
        let mut e = [0u8; 8];
        f.read_exact(&mut e).unwrap();
        u64::from_le_bytes(e) >> 62 != 0
    }

    /// Every page of a buffer, and the page its last byte is followed by (a copy that ends at
    /// a page boundary runs slower when that page is not mapped), is mapped when the buffer
    /// is made; large ones come from mmap, where nothing else touches that page.
    #[test]
    fn host_buffers_and_the_page_after_them_are_mapped() {
        for (len, skew) in [(1 << 20, 0), (256 << 10, 0), (1 << 20, 64), (4096, 0)] {
            let b = HostBuffer::at_page_offset(len, skew);
            let start = b.as_ptr() as usize;
            for addr in (start..=start + len).step_by(PAGE).chain([start + len]) {
                assert!(
                    mapped(addr),
                    "{len} bytes at {skew}: page {:#x} ({} bytes in) is not mapped",
                    addr / PAGE * PAGE,
                    addr - start
                );
            }
        }
    }

    #[test]
    fn host_buffers_start_where_in_the_page_they_are_asked() {
        for (len, skew) in [
            (0, 1),
            (1, 4095),
            (4096, 1024),
            (1 << 20, 960),
            (64, PAGE + 8),
        ] {
            let mut b = HostBuffer::at_page_offset(len, skew);
            assert_eq!(b.as_ptr() as usize % PAGE, skew % PAGE, "{len} {skew}");
            assert_eq!(b.len(), len);
            // Every byte is inside the allocation: writing all of them does not panic.
            b.as_mut_slice().fill(0xa5);
            assert!(b.to_vec().iter().all(|&x| x == 0xa5));
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

    /// A length whose page slack overflows is refused, not wrapped into a small allocation
    /// that the buffer's copies would then run past.
    #[test]
    #[should_panic(expected = "does not fit the address space")]
    fn host_buffers_past_the_address_space_are_refused() {
        let _ = HostBuffer::at_page_offset(usize::MAX - 100, 64);
    }

    /// A buffer moves between threads with the region that owns it (`Transport: Send`), and
    /// several threads may copy out of one at once.
    #[test]
    fn host_buffers_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<HostBuffer>();
        let b = std::sync::Arc::new(HostBuffer::from_slice(&[3; 4096]));
        let r = std::thread::scope(|s| {
            let t: Vec<_> = (0..2).map(|_| s.spawn(|| b.to_vec())).collect();
            t.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
        });
        assert!(r.iter().all(|v| v[..] == [3; 4096][..]));
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
