//! Benchmark buffers: allocation on the host or a GPU, the data pattern, filling and checking
//! through `Memory::write_at`/`read_at` (CUDA copies for GPU memory), and the page layout of
//! the `write` workload.

use transport_core::{HostBuffer, Memory, MemoryRegion};

use crate::config::MemKind;
use crate::error::{Error, Result, TransportContext};

/// Bytes staged per CUDA copy when filling or checking GPU memory.
const STAGE: usize = 4 << 20;

/// Allocate `len` zeroed bytes of `kind` memory on GPU `ordinal` (ignored for host memory).
pub fn alloc(kind: MemKind, ordinal: usize, len: usize) -> Result<Memory> {
    match kind {
        MemKind::Host => Ok(Memory::Host(HostBuffer::new(len))),
        MemKind::Cuda => alloc_gpu(ordinal, len),
    }
}

#[cfg(feature = "cuda")]
fn alloc_gpu(ordinal: usize, len: usize) -> Result<Memory> {
    transport_core::GpuBuffer::alloc(ordinal, len)
        .map(Memory::Gpu)
        .ctx(|| format!("allocating {len} bytes on GPU {ordinal}"))
}

#[cfg(not(feature = "cuda"))]
fn alloc_gpu(_ordinal: usize, _len: usize) -> Result<Memory> {
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

/// The bytes of page `page` of GPU `gpu` for `seed`, into `out`.
pub fn fill_pattern(seed: u64, gpu: u64, page: u64, out: &mut [u8]) {
    let base = splitmix(seed ^ gpu.wrapping_mul(0x1000_0000_01b3) ^ page.wrapping_mul(0x5bd1_e995));
    let mut chunks = out.chunks_exact_mut(8);
    let mut w = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&splitmix(base ^ w).to_le_bytes());
        w += 1;
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&splitmix(base ^ w).to_le_bytes()[..n]);
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

/// Fill NIC `j`'s slots of `mr` with the pattern of the pages they hold.
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
    let slots = layout.slots(j);
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

/// Check NIC `j`'s slots of `mr` against the pattern; the error names the first bad byte.
pub fn verify_pages<M: MemoryRegion>(
    mr: &M,
    layout: &PageLayout,
    seed: u64,
    gpu: u64,
    j: usize,
    nic: usize,
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
        let got: &[u8] = match mr.memory().host() {
            Some(h) => &h.as_slice()[start..start + n as usize * ps],
            None => {
                stage.resize(n as usize * ps, 0);
                mr.memory()
                    .read_at(start, &mut stage)
                    .ctx(|| "reading a buffer back")?;
                &stage
            }
        };
        for i in 0..n {
            let page = layout.page_of(j, k + i);
            fill_pattern(seed, gpu, page, &mut want);
            let g = &got[i as usize * ps..(i as usize + 1) * ps];
            if g != &want[..] {
                let at = g.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(Error::Verify(format!(
                    "NIC {nic} (GPU index {gpu}): page {page}, byte {at}: got {:#04x}, expected {:#04x}",
                    g[at], want[at]
                )));
            }
        }
        k += n;
    }
    Ok(())
}

/// Fill `len` bytes at the start of `mr` with one message's pattern, `slots` times back to back.
pub fn fill_messages<M: MemoryRegion>(
    mr: &mut M,
    seed: u64,
    len: usize,
    slots: usize,
) -> Result<()> {
    let mut one = vec![0u8; len];
    fill_pattern(seed, u64::MAX, 0, &mut one);
    for s in 0..slots {
        mr.memory_mut()
            .write_at(s * len, &one)
            .ctx(|| "filling a send buffer")?;
    }
    Ok(())
}

/// Check that the first `slots` message slots of `mr` hold the message pattern.
pub fn verify_messages<M: MemoryRegion>(
    mr: &M,
    seed: u64,
    len: usize,
    slots: usize,
    nic: usize,
) -> Result<()> {
    let mut want = vec![0u8; len];
    fill_pattern(seed, u64::MAX, 0, &mut want);
    let mut got = vec![0u8; len];
    for s in 0..slots {
        mr.memory()
            .read_at(s * len, &mut got)
            .ctx(|| "reading a receive buffer back")?;
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(Error::Verify(format!(
                "NIC {nic}: receive slot {s}, byte {at}: got {:#04x}, expected {:#04x}",
                got[at], want[at]
            )));
        }
    }
    Ok(())
}

/// Zero the first `len` bytes of `mr`.
/// Wait until every copy the provider queued into these regions' GPUs has finished, and say
/// how long that took; zero for host memory.
///
/// Between processes libfabric's shm moves GPU memory by CUDA IPC with a device-to-device
/// `cudaMemcpy`, which returns before the copy is done: the immediate that announces a
/// WRITE can arrive while its bytes are still on the way. A target that counts time until
/// the last immediate would then report how fast copies were queued, not how fast they ran
/// (measured on an H100: 256 MiB regions "moved" at 95 Tbit/s). The write workload's target
/// adds this wait to the run's time.
pub fn gpu_drain<M: MemoryRegion>(regions: &[M]) -> Result<std::time::Duration> {
    let start = std::time::Instant::now();
    #[cfg(feature = "cuda")]
    for mr in regions {
        if let Memory::Gpu(g) = mr.memory() {
            g.context()
                .synchronize()
                .map_err(|e| Error::Unavailable(format!("cuCtxSynchronize: {e:?}")))?;
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = regions;
    Ok(start.elapsed())
}

pub fn zero<M: MemoryRegion>(mr: &mut M, len: usize) -> Result<()> {
    let len = len.min(mr.len());
    if let Some(h) = mr.memory_mut().host_bytes() {
        h[..len].fill(0);
        return Ok(());
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_covers_every_page_once() {
        for (pages, used) in [(10u64, 3usize), (1, 4), (16, 1), (7, 7), (5, 8)] {
            let l = PageLayout {
                page_size: 64,
                pages,
                used,
            };
            let mut seen = vec![0; pages as usize];
            for j in 0..used {
                let order = l.post_order(42, 1, j);
                assert_eq!(order.len() as u64, l.slots(j));
                for &p in &order {
                    seen[p as usize] += 1;
                    assert_eq!(p as usize % used, j);
                    assert!((p as u64 / used as u64) < l.slots(j));
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{pages} pages on {used}");
        }
    }

    #[test]
    fn order_is_shuffled_and_deterministic() {
        let l = PageLayout {
            page_size: 64,
            pages: 64,
            used: 1,
        };
        let a = l.post_order(1, 0, 0);
        assert_eq!(a, l.post_order(1, 0, 0));
        assert_ne!(a, (0..64).collect::<Vec<u32>>());
        assert_ne!(a, l.post_order(2, 0, 0));
    }

    /// A region that is no registration at all: enough to exercise filling and checking.
    struct Plain(Memory);
    impl MemoryRegion for Plain {
        fn memory(&self) -> &Memory {
            &self.0
        }
        fn memory_mut(&mut self) -> transport_core::MemoryMut<'_> {
            transport_core::MemoryMut::new(&mut self.0)
        }
        fn remote(&self) -> transport_core::RemoteMr {
            transport_core::RemoteMr {
                addr: 0,
                len: self.0.len() as u64,
                key: 0,
            }
        }
    }

    /// Fill, check, catch a wrong seed and one flipped byte, clear; pages of an odd size and
    /// more of them than one staging copy holds.
    fn fill_verify_round(kind: MemKind) {
        let layout = PageLayout {
            page_size: 4099,
            pages: 3000,
            used: 2,
        };
        let len = layout.slots(1) as usize * layout.page_size;
        let mut mr = Plain(alloc(kind, 0, len).unwrap());
        assert_eq!(kind == MemKind::Cuda, matches!(mr.0, Memory::Gpu(_)));
        fill_pages(&mut mr, &layout, 7, 1, 1).unwrap();
        verify_pages(&mr, &layout, 7, 1, 1, 3).unwrap();
        assert!(verify_pages(&mr, &layout, 8, 1, 1, 3).is_err());
        let at = len - 5;
        let mut b = [0u8];
        mr.0.read_at(at, &mut b).unwrap();
        mr.0.write_at(at, &[b[0] ^ 0x40]).unwrap();
        let e = verify_pages(&mr, &layout, 7, 1, 1, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("NIC 3") && e.contains("page 2999"), "{e}");
        zero(&mut mr, len).unwrap();
        let mut all = vec![1u8; len];
        mr.0.read_at(0, &mut all).unwrap();
        assert!(all.iter().all(|&x| x == 0));
        fill_messages(&mut mr, 3, 100, 5).unwrap();
        verify_messages(&mr, 3, 100, 5, 0).unwrap();
        assert!(verify_messages(&mr, 4, 100, 5, 0).is_err());
    }

    #[test]
    fn fill_and_verify_host() {
        fill_verify_round(MemKind::Host);
    }

    /// The same through CUDA copies, where this machine has a GPU (skipped elsewhere).
    #[test]
    fn fill_and_verify_gpu() {
        if !cuda_driver() || cuda_devices().unwrap_or(0) == 0 {
            eprintln!("fill_and_verify_gpu: skipped, no CUDA device");
            return;
        }
        fill_verify_round(MemKind::Cuda);
        eprintln!("fill_and_verify_gpu: ran on GPU 0");
    }

    #[test]
    fn pattern_differs_by_page_and_handles_tails() {
        let (mut a, mut b) = ([0u8; 13], [0u8; 13]);
        fill_pattern(1, 0, 0, &mut a);
        fill_pattern(1, 0, 1, &mut b);
        assert_ne!(a, b);
        assert!(a.iter().any(|&x| x != 0));
    }
}
