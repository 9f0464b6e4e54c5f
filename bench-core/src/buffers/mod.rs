//! Benchmark buffers: allocation on the host or a GPU, the data pattern, filling and checking
//! through `Memory::write_at`/`read_at` (CUDA copies for GPU memory), and the page layout of
//! the `write` workload; `versions.rs` says which repeat of it a page holds and checks it.

use transport_core::{HostBuffer, Memory, MemoryRegion};

use crate::config::MemKind;
use crate::error::{Error, Result, TransportContext};

/// Bytes staged per CUDA copy when filling or checking GPU memory.
const STAGE: usize = 4 << 20;

/// Allocate `len` zeroed bytes of `kind` memory on GPU `ordinal` (ignored for host memory),
/// starting `page_offset` bytes into a page (`--buf-offset`; for GPU memory 0 leaves the
/// region where `cuMemAlloc` puts it).
pub fn alloc(kind: MemKind, ordinal: usize, len: usize, page_offset: u32) -> Result<Memory> {
    check_page_offset(page_offset)?;
    match kind {
        MemKind::Host => Ok(Memory::Host(HostBuffer::at_page_offset(
            len,
            page_offset as usize,
        ))),
        MemKind::Cuda => alloc_gpu(ordinal, len, page_offset as usize),
    }
}

/// Most bytes `--buf-offset` may place a region into its page.
pub const MAX_PAGE_OFFSET: u32 = transport_core::PAGE as u32 - 1;

/// `--buf-offset`: at most [`MAX_PAGE_OFFSET`] bytes into a page, host or GPU memory
/// (`HostBuffer::at_page_offset`, `GpuBuffer::alloc_at_page_offset`).
pub fn check_page_offset(page_offset: u32) -> Result<()> {
    if page_offset > MAX_PAGE_OFFSET {
        return Err(Error::Usage(format!(
            "--buf-offset {page_offset}: at most {MAX_PAGE_OFFSET} (bytes into a page)"
        )));
    }
    Ok(())
}

/// How many bytes into its (4 KiB) page a region starts, in host or GPU memory.
pub fn page_offset(m: &Memory) -> usize {
    match m {
        Memory::Host(h) => h.as_ptr() as usize % transport_core::PAGE,
        Memory::Gpu(g) => (g.device_ptr() % transport_core::PAGE as u64) as usize,
    }
}

#[cfg(feature = "cuda")]
fn alloc_gpu(ordinal: usize, len: usize, offset: usize) -> Result<Memory> {
    transport_core::GpuBuffer::alloc_at_page_offset(ordinal, len, offset)
        .map(Memory::Gpu)
        .ctx(|| format!("allocating {len} bytes on GPU {ordinal}, {offset} bytes into a page"))
}

#[cfg(not(feature = "cuda"))]
fn alloc_gpu(_ordinal: usize, _len: usize, _offset: usize) -> Result<Memory> {
    Err(Error::Unavailable(
        "--mem cuda: this rdma-bench was built without the `cuda` feature".into(),
    ))
}

/// How many CUDA devices this machine has (0 without a driver or without the `cuda` feature).
pub fn cuda_devices() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        transport_core::cuda_device_count().ctx(|| "counting CUDA devices")
    }
    #[cfg(not(feature = "cuda"))]
    {
        Ok(0)
    }
}

/// Whether a CUDA driver can be loaded.
pub fn cuda_driver() -> bool {
    #[cfg(feature = "cuda")]
    {
        transport_core::cuda_driver_present()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// The GPU whose CUDA context this thread has current (it allocated a side's GPU memory, or
/// ran a kernel), to hand to the threads it starts; `None` without one, without a driver or
/// without the `cuda` feature.
pub fn thread_gpu() -> Option<usize> {
    #[cfg(feature = "cuda")]
    {
        transport_core::cuda_current_device()
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// Make GPU `gpu`'s CUDA context current on this thread. Every thread a workload starts to
/// post or poll calls this first where the thread that started it had a context
/// ([`thread_gpu`]): providers call the CUDA driver from the thread that drives the endpoint,
/// and libfabric's shm copies GPU memory through host bounce buffers from a thread without
/// one until something there happens to make one current (`transport_core::cuda_enter_device`).
pub fn enter_gpu(gpu: usize) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        transport_core::cuda_enter_device(gpu)
            .ctx(|| format!("making GPU {gpu}'s CUDA context current on a worker thread"))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = gpu;
        Ok(())
    }
}

#[inline]
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small deterministic generator for the page order (splitmix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix(self.0)
    }
    /// Uniform in `0..n` (n > 0), close enough for shuffling.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// The word mask of GPU `gpu`'s pattern for `seed`.
fn mask(seed: u64, gpu: u64) -> u64 {
    splitmix(seed ^ gpu.wrapping_mul(0x1000_0000_01b3))
}

/// The pattern from byte `pos` of GPU `gpu`'s page space (page `p` of `ps` bytes starts at
/// `p * ps`), into `out`: the 8-byte word `w` of that space reads `w ^ mask(seed, gpu)`, little
/// endian. Every word of every page of a GPU differs, and a word read back names its own place
/// ([`Versions::decode`]).
pub fn fill_at(seed: u64, gpu: u64, pos: u64, out: &mut [u8]) {
    let m = mask(seed, gpu);
    let (mut i, mut p) = (0usize, pos);
    while i < out.len() && p % 8 != 0 {
        out[i] = ((p / 8) ^ m).to_le_bytes()[(p % 8) as usize];
        i += 1;
        p += 1;
    }
    let mut w = p / 8;
    let mut chunks = out[i..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&(w ^ m).to_le_bytes());
        w += 1;
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&(w ^ m).to_le_bytes()[..n]);
}

/// The bytes of page `page` of GPU `gpu` for `seed`, into `out` (`out.len()` bytes a page).
pub fn fill_pattern(seed: u64, gpu: u64, page: u64, out: &mut [u8]) {
    fill_at(seed, gpu, page.wrapping_mul(out.len() as u64), out)
}

/// The `write` workload's layout of one GPU's pages over its NICs: with `used` NICs, page `p`
/// travels over NIC `p % used` and lands in slot `p / used` of that NIC's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLayout {
    pub page_size: usize,
    pub pages: u64,
    pub used: usize,
}

impl PageLayout {
    /// Pages NIC `j` carries.
    pub fn slots(&self, j: usize) -> u64 {
        if j >= self.used {
            return 0;
        }
        let (p, u, j) = (self.pages, self.used as u64, j as u64);
        if p <= j {
            0
        } else {
            (p - j).div_ceil(u)
        }
    }
    /// The page in slot `k` of NIC `j`.
    pub fn page_of(&self, j: usize, k: u64) -> u64 {
        k * self.used as u64 + j as u64
    }
    /// NIC `j`'s pages in the order they are posted: the GPU's random order, filtered.
    pub fn post_order(&self, seed: u64, gpu: u64, j: usize) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.pages as u32).collect();
        let mut rng = Rng::new(seed ^ gpu.wrapping_mul(0x2545_f491_4f6c_dd1d));
        for i in (1..order.len()).rev() {
            let k = rng.below(i as u64 + 1) as usize;
            order.swap(i, k);
        }
        order.retain(|&p| p as usize % self.used == j);
        order
    }
}

/// Fill NIC `j`'s slots of `mr` with the pattern of the pages they hold, and the slot after
/// them too where `mr` has room for it (the source's slack page, see [`Versions`]).
pub fn fill_pages<M: MemoryRegion>(
    mr: &mut M,
    layout: &PageLayout,
    seed: u64,
    gpu: u64,
    j: usize,
) -> Result<()> {
    let ps = layout.page_size;
    let per = (STAGE / ps).max(1) as u64;
    let mut stage = vec![0u8; per as usize * ps];
    let n = layout.slots(j);
    let slack = n > 0 && mr.len() >= (n as usize + 1) * ps;
    let slots = n + u64::from(slack);
    let mut k = 0;
    while k < slots {
        let n = per.min(slots - k);
        for i in 0..n {
            let off = i as usize * ps;
            fill_pattern(
                seed,
                gpu,
                layout.page_of(j, k + i),
                &mut stage[off..off + ps],
            );
        }
        mr.memory_mut()
            .write_at(k as usize * ps, &stage[..n as usize * ps])
            .ctx(|| "filling a buffer")?;
        k += n;
    }
    Ok(())
}

/// Check NIC `j`'s slots of `mr` against what repeat `rep` (counted from 0 over the whole
/// run, warm-up included) left there under `ver`; the error names the first bad byte.
#[allow(clippy::too_many_arguments)]
pub fn verify_pages<M: MemoryRegion>(
    mr: &M,
    layout: &PageLayout,
    seed: u64,
    gpu: u64,
    j: usize,
    nic: usize,
    rep: u64,
    ver: &Versions,
) -> Result<()> {
    let ps = layout.page_size;
    let per = (STAGE / ps).max(1) as u64;
    let mut want = vec![0u8; ps];
    let mut stage = Vec::new();
    let slots = layout.slots(j);
    let mut k = 0;
    while k < slots {
        let n = per.min(slots - k);
        let start = k as usize * ps;
        // Copied out, host memory too: a region lends no slice of its bytes.
        stage.resize(n as usize * ps, 0);
        mr.memory()
            .read_at(start, &mut stage)
            .ctx(|| "reading a buffer back")?;
        let got = &stage[..];
        for i in 0..n {
            ver.expected(layout, seed, gpu, j, k + i, rep, &mut want);
            let g = &got[i as usize * ps..(i as usize + 1) * ps];
            if g != &want[..] {
                let at = g.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                let page = layout.page_of(j, k + i);
                return Err(Error::Verify(format!(
                    "NIC {nic} (GPU index {gpu}): page {page} (slot {}) after repeat {rep}, byte {at}: got {:#04x}, expected {:#04x}",
                    k + i, g[at], want[at]
                )));
            }
        }
        k += n;
    }
    Ok(())
}

/// The source slot a WRITE of repeat `rep` into target slot `slot` reads, of `n` slots.
#[inline]
pub fn rotated(slot: u64, rep: u64, n: u64) -> u64 {
    if n <= 1 {
        slot
    } else {
        (slot + rep % n) % n
    }
}

/// One message of `len` bytes: the pattern every SEND and ping-pong message carries (the same
/// at every slot and in every message, so a receiver checks any of them against it).
fn message(seed: u64, len: usize) -> Vec<u8> {
    let mut one = vec![0u8; len];
    fill_pattern(seed, u64::MAX, 0, &mut one);
    one
}

/// Fill `len` bytes at the start of `mr` with one message's pattern, `slots` times back to back.
pub fn fill_messages<M: MemoryRegion>(
    mr: &mut M,
    seed: u64,
    len: usize,
    slots: usize,
) -> Result<()> {
    let one = message(seed, len);
    for s in 0..slots {
        mr.memory_mut()
            .write_at(s * len, &one)
            .ctx(|| "filling a send buffer")?;
    }
    Ok(())
}

/// The latency ping-pong's two buffers in `mr`, `len` bytes each, written before the run: the
/// one this side sends from (at `src`) with the message pattern, the one the peer's messages
/// land in (at `dst`) with zeros, which [`verify_lat`] checks after the run. (Host memory is
/// its own pages before this, never the kernel's zero page: `HostBuffer::at_page_offset`.)
pub fn fill_lat<M: MemoryRegion>(
    mr: &mut M,
    seed: u64,
    len: usize,
    src: usize,
    dst: usize,
) -> Result<()> {
    let mut one = message(seed, len);
    mr.memory_mut()
        .write_at(src, &one)
        .ctx(|| "filling the ping-pong's send buffer")?;
    one.fill(0);
    mr.memory_mut()
        .write_at(dst, &one)
        .ctx(|| "clearing the ping-pong's receive buffer")
}

/// After a ping-pong: the buffer at `dst` holds the peer's last message, the pattern its
/// [`fill_lat`] wrote (the same seed on both sides).
pub fn verify_lat<M: MemoryRegion>(mr: &M, seed: u64, len: usize, dst: usize) -> Result<()> {
    match Pattern::new(seed, len).mismatch(mr, dst)? {
        None => Ok(()),
        Some((at, got, want)) => Err(Error::Verify(format!(
            "the peer's last ping-pong message, byte {at} of {len}: got {got:#04x}, expected \
             {want:#04x}"
        ))),
    }
}

/// One message's pattern, and a buffer to read a message back into.
struct Pattern {
    want: Vec<u8>,
    got: Vec<u8>,
}

impl Pattern {
    fn new(seed: u64, len: usize) -> Self {
        Self {
            got: vec![0u8; len],
            want: message(seed, len),
        }
    }

    /// The first byte of the message at `offset` of `mr` that is not the pattern's:
    /// (index, found, expected).
    fn mismatch<M: MemoryRegion>(
        &mut self,
        mr: &M,
        offset: usize,
    ) -> Result<Option<(usize, u8, u8)>> {
        mr.memory()
            .read_at(offset, &mut self.got)
            .ctx(|| "reading a receive buffer back")?;
        if self.got == self.want {
            return Ok(None);
        }
        Ok(self
            .got
            .iter()
            .zip(&self.want)
            .position(|(a, b)| a != b)
            .map(|at| (at, self.got[at], self.want[at])))
    }
}

/// Check that the first `slots` message slots of `mr` hold the message pattern.
pub fn verify_messages<M: MemoryRegion>(
    mr: &M,
    seed: u64,
    len: usize,
    slots: usize,
    nic: usize,
) -> Result<()> {
    let mut p = Pattern::new(seed, len);
    for s in 0..slots {
        if let Some((at, got, want)) = p.mismatch(mr, s * len)? {
            return Err(Error::Verify(format!(
                "NIC {nic}: receive slot {s}, byte {at}: got {got:#04x}, expected {want:#04x}"
            )));
        }
    }
    Ok(())
}

/// Wait until the GPUs of these memories have run everything queued on them (their
/// contexts' `cuCtxSynchronize`); nothing for host memory.
///
/// A provider's CUDA copies into `GpuBuffer` memory have run before the operation completes
/// (the buffers carry `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`); on memory without the attribute
/// libfabric's shm completed a WRITE between processes while its device-to-device copy was
/// still queued (measured on an H100: 256 MiB regions "moved" at 95 Tbit/s). This wait, which
/// the workloads' delivery step makes at the end of every phase, keeps any such copy inside
/// the clock.
pub fn gpu_drain_all<'a>(mems: impl IntoIterator<Item = &'a Memory>) -> Result<()> {
    #[cfg(feature = "cuda")]
    for m in mems {
        if let Memory::Gpu(g) = m {
            g.context()
                .synchronize()
                .map_err(|e| Error::Unavailable(format!("cuCtxSynchronize: {e:?}")))?;
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = mems.into_iter();
    Ok(())
}

/// Zero the first `len` bytes of `mr`.
pub fn zero<M: MemoryRegion>(mr: &mut M, len: usize) -> Result<()> {
    let len = len.min(mr.len());
    let z = vec![0u8; STAGE.min(len)];
    let mut off = 0;
    while off < len {
        let n = z.len().min(len - off);
        mr.memory_mut()
            .write_at(off, &z[..n])
            .ctx(|| "clearing a buffer")?;
        off += n;
    }
    Ok(())
}

mod versions;

pub use versions::{check_words_per_page, CheckKind, RepeatCheck, Versions, CHECK_STRIDE, WINDOW};

#[cfg(test)]
mod tests;
