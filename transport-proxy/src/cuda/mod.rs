//! The device side of the proxy ring (feature `cuda`): the ring's memory in pinned,
//! device-mapped host memory, and CUDA C kernels compiled at run time with NVRTC that claim,
//! fill and publish commands and wait on a completion counter.
//!
//! Nothing here needs CUDA to build: cudarc loads `libcuda` and `libnvrtc` when first used,
//! and every entry point checks that they are there first ([`availability`]), so a machine
//! without them gets [`GpuError::NoDriver`] or [`GpuError::NoNvrtc`], never a panic.
//!
//! The kernels (`kernels/producer.cu`) follow the protocol of `ring/mod.rs` and are compiled with
//! its `CUDA_HEADER` in front (the offsets and the command struct, checked against the Rust
//! constants there), so the kernel and the proxy cannot disagree on an offset. The source
//! file says which fence orders what.
//!
//! Here: errors, availability, contexts and mapped host memory; `kernels.rs` the compiled
//! kernels and their launches; `producer.rs` a ring in mapped memory and the producer
//! bench-core's gpu-write uses.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::PushKernelArg;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig};

mod kernels;
mod produce;
mod producer;

pub use kernels::*;
pub use produce::*;
pub use producer::*;

/// The kernels' CUDA C source, compiled at run time by NVRTC.
pub const PRODUCER_SRC: &str = include_str!("../../kernels/producer.cu");

/// A kernel of the kind a program writes for itself, through `proxy_ring.cuh`'s `proxy_push`
/// alone (compiled after [`PRODUCER_SRC`]; [`Produce::push`] launches it).
pub const PUSH_EXAMPLE_SRC: &str = include_str!("../../kernels/push_example.cu");

/// What can go wrong on the device side.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library: tests say "SKIPPED: no CUDA driver" and skip.
    #[error("no CUDA driver (libcuda.so) found: install the NVIDIA driver")]
    NoDriver,
    /// A driver but no device.
    #[error("the CUDA driver sees no GPU")]
    NoDevice,
    /// No NVRTC library (the kernels cannot be compiled).
    #[error(
        "no NVRTC library (libnvrtc.so) found: install the CUDA toolkit's NVRTC and put its \
         lib64 (e.g. /usr/local/cuda/lib64) on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// NVRTC refused the source; the log says where.
    #[error("NVRTC could not compile {name} with {options:?}: {code}\n--- NVRTC log ---\n{log}")]
    Compile {
        name: String,
        options: Vec<String>,
        code: String,
        log: String,
    },
    /// A driver call failed.
    #[error("{what}: {err}")]
    Cuda { what: String, err: String },
    /// A caller's argument does not fit.
    #[error("{0}")]
    Invalid(String),
    /// A kernel gave up waiting (the proxy stopped consuming, or never completed).
    #[error("{0}")]
    Timeout(String),
}

fn cuda(what: &str, e: impl std::fmt::Debug) -> GpuError {
    GpuError::Cuda {
        what: what.to_string(),
        err: format!("{e:?}"),
    }
}

/// Whether a CUDA driver library can be loaded (cudarc panics on first use without one).
pub fn driver_present() -> bool {
    // SAFETY: this only tries `dlopen` on the CUDA driver's library names and closes what it
    // opened; its initialisers are the ones any CUDA program runs.
    unsafe { sys::is_culib_present() }
}

/// Whether an NVRTC library can be loaded (cudarc panics on first use without one).
pub fn nvrtc_present() -> bool {
    // SAFETY: as for driver_present: `dlopen` of NVRTC's library names, closed again.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// `Ok` where kernels can be compiled and run on GPU 0: a driver, a device and NVRTC.
pub fn availability() -> Result<(), GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => return Err(GpuError::NoDevice),
        Err(e) => return Err(cuda("cuDeviceGetCount", e)),
    }
    if !nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    Ok(())
}

/// The primary context of GPU `ordinal`, after [`availability`].
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>, GpuError> {
    availability()?;
    CudaContext::new(ordinal).map_err(|e| cuda("cuCtxCreate (primary context)", e))
}

/// Pinned host memory mapped into the GPU's address space: `cuMemHostAlloc(DEVICEMAP |
/// PORTABLE)`, zeroed, with its device address from `cuMemHostGetDevicePointer`. The ring
/// block lives here: the CPU reads and writes it through [`MappedHost::host_ptr`], kernels
/// through [`MappedHost::device_ptr`]. Freed on drop.
pub struct MappedHost {
    ctx: Arc<CudaContext>,
    host: *mut u8,
    dev: u64,
    len: usize,
}

// SAFETY: the block is plain memory owned by this value; it has no thread affinity (the
// context is bound again before it is freed), and who writes which byte when is the ring's
// protocol, which every user of the pointers keeps.
unsafe impl Send for MappedHost {}
// SAFETY: shared access only hands out raw pointers; see Send.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// Allocate `len` zeroed bytes (at least one page) in `ctx`.
    pub fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        if len == 0 {
            return Err(GpuError::Invalid(
                "a mapped block needs at least one byte".into(),
            ));
        }
        ctx.bind_to_thread()
            .map_err(|e| cuda("cuCtxSetCurrent", e))?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the context is current; cuMemHostAlloc returns a fresh page-locked
        // allocation of len bytes (or an error), owned by the value built below and freed
        // once, in Drop.
        let host = unsafe { result::malloc_host(len, flags) }
            .map_err(|e| cuda(&format!("cuMemHostAlloc({len}, DEVICEMAP | PORTABLE)"), e))?
            as *mut u8;
        let mut block = Self {
            ctx: ctx.clone(),
            host,
            dev: 0,
            len,
        };
        // SAFETY: host points to len writable bytes that nothing else uses yet.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host is the start of a DEVICEMAP allocation of the current context and dev
        // a valid out pointer; flags must be 0.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda("cuMemHostGetDevicePointer", r));
        }
        block.dev = dev;
        Ok(block)
    }

    /// The block as the CPU sees it.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The block as kernels see it.
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: [`MappedHost::alloc`] refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Read the u64 at byte `offset` (8-aligned) with a volatile load: for results a kernel
    /// wrote, read after the stream synchronised.
    pub fn read_u64(&self, offset: usize) -> u64 {
        assert!(
            offset.is_multiple_of(8) && offset.checked_add(8).is_some_and(|e| e <= self.len),
            "read_u64({offset}) out of the block"
        );
        // SAFETY: in bounds and aligned (checked above); the block lives as long as self.
        unsafe { std::ptr::read_volatile(self.host.add(offset) as *const u64) }
    }

    /// Zero `[offset, offset + len)` with volatile stores (before a kernel uses it).
    pub fn zero(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "zero({offset}, {len}) out of the block"
        );
        for i in 0..len {
            // SAFETY: in bounds (checked above); no kernel uses this range while it is zeroed.
            unsafe { std::ptr::write_volatile(self.host.add(offset + i), 0) };
        }
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: host came from cuMemHostAlloc in this context and is freed once, here;
            // kernels that used it were synchronised by their owners before the drop.
            let _ = unsafe { result::free_host(self.host as *mut c_void) };
        }
    }
}

/// The byte command `i`'s payload holds at offset `j` when the kernel fills it (the same
/// function as the kernel's `payload_byte`).
pub fn payload_byte(i: u64, j: u64, salt: u32) -> u8 {
    (i.wrapping_mul(131)
        .wrapping_add(j.wrapping_mul(7))
        .wrapping_add(j >> 8)
        .wrapping_add(salt as u64)
        & 0xff) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_byte_matches_the_kernels_formula() {
        // The kernel: (i * 131 + j * 7 + (j >> 8) + salt) & 0xff.
        assert!(PRODUCER_SRC.contains("(u8)((i * 131u + j * 7u + (j >> 8) + salt) & 0xff)"));
        assert_eq!(payload_byte(0, 0, 0), 0);
        assert_eq!(payload_byte(1, 0, 0), 131);
        assert_eq!(payload_byte(0, 256, 3), ((256 * 7 + 1 + 3) & 0xff) as u8);
    }

    #[test]
    fn the_kernels_use_the_rings_header_not_their_own_offsets() {
        let src = kernel_source();
        assert!(
            src.starts_with(crate::ring::CUDA_HEADER.trim_end())
                || src.contains("struct __align__(32) proxy_cmd")
        );
        for m in [
            "PROXY_OFF_TAIL",
            "PROXY_OFF_ERROR",
            "PROXY_OFF_ARRIVALS",
            "PROXY_OFF_HEAD",
            "PROXY_OP_WRITE_IMM",
            "PROXY_ARRIVAL_SHIFT",
        ] {
            assert!(PRODUCER_SRC.contains(m), "the kernels do not use {m}");
        }
    }

    #[test]
    fn the_kernels_constants_are_the_rust_ones() {
        for (name, v) in [
            ("SYNC_SC_FENCE", SYNC_SC_FENCE),
            ("SYNC_RELAXED_POLL", SYNC_RELAXED_POLL),
            ("SYNC_NO_FENCE", SYNC_NO_FENCE),
            ("SYNC_UNFENCED", SYNC_UNFENCED),
        ] {
            let line = format!("#define {name} {v}u\n");
            assert!(PRODUCER_SRC.contains(&line), "producer.cu lacks {line:?}");
        }
        // The failure word proxy_push's refusal reaches the host as.
        let line = format!("#define PROXY_PUSH_WRONG_RING {PUSH_WRONG_RING:#x}u\n");
        assert!(
            crate::ring::CUDA_HEADER.contains(&line),
            "proxy_ring.cuh lacks {line:?}"
        );
    }

    /// The kernels as NVRTC gets them parse and compile to PTX with clang's CUDA mode (for
    /// sm_90, without a CUDA installation: kernels/clang_shim.h declares what NVRTC
    /// predefines). Not NVRTC itself, which only the GPU host has, but a typo or a type error
    /// shows here, before a GPU run. Skips, saying so, where no clang-16 is installed.
    #[test]
    fn kernels_parse_with_clang() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let Some(clang) = crate::clang16() else {
            eprintln!("SKIPPED: no clang-16 to check the kernels' syntax with");
            return;
        };
        let dir = std::env::temp_dir().join(format!("proxy-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shim = dir.join("clang_shim.h");
        std::fs::write(&shim, include_str!("../../kernels/clang_shim.h")).unwrap();
        let out = dir.join("producer.ptx");
        let mut child = Command::new(clang)
            .args([
                "-x",
                "cuda",
                "--cuda-gpu-arch=sm_90",
                "-nocudainc",
                "-nocudalib",
            ])
            .args([
                "--cuda-device-only",
                "-std=c++17",
                "-S",
                "-Werror",
                "-include",
            ])
            .arg(&shim)
            .arg("-o")
            .arg(&out)
            .arg("-")
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(kernel_source().as_bytes())
            .unwrap();
        let res = child.wait_with_output().unwrap();
        let ptx = std::fs::read_to_string(&out).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            res.status.success(),
            "clang rejects the kernels:\n{}",
            String::from_utf8_lossy(&res.stderr)
        );
        // Each kernel's parameters, as sizes in bytes, in the order the launches in this
        // file push them (a kernel whose signature drifts from its launch fails here).
        for (k, sizes) in [
            (
                "proxy_produce",
                &[8, 8, 8, 8, 4, 4, 8, 4, 8, 8, 8, 8, 4, 4, 8, 4, 4, 8, 8][..],
            ),
            ("proxy_wait", &[8, 8, 8, 8, 8][..]),
            (
                "proxy_pingpong",
                &[8, 8, 8, 8, 8, 4, 4, 8, 4, 8, 8, 4, 4, 8, 4, 4, 4, 8, 8][..],
            ),
            ("proxy_issue", &[8, 8, 8, 8, 8][..]),
            ("proxy_flag_pingpong", &[8, 8, 8, 4, 8][..]),
            ("proxy_spin", &[8, 8, 4, 4, 8, 8][..]),
            (
                "proxy_push_example",
                &[8, 8, 8, 4, 4, 8, 4, 8, 8, 8, 8, 4, 8, 4, 4, 8][..],
            ),
        ] {
            let at = ptx
                .find(&format!(".entry {k}("))
                .unwrap_or_else(|| panic!("no kernel {k} in the PTX"));
            let params = &ptx[at..at + ptx[at..].find(')').unwrap()];
            let got: Vec<usize> = params
                .lines()
                .filter_map(|l| {
                    let l = l.trim();
                    l.strip_prefix(".param .b")
                        .or_else(|| l.strip_prefix(".param .u"))
                        .and_then(|r| r.split_whitespace().next())
                        .and_then(|b| b.parse::<usize>().ok())
                        .map(|bits| bits / 8)
                })
                .collect();
            assert_eq!(got, sizes, "{k}'s parameters (bytes) in the PTX");
        }
        // The protocol's loads and stores made it into the code.
        assert!(ptx.contains("ld.acquire.sys.global.u64"));
        assert!(ptx.contains("st.release.sys.global.u64"));
        assert!(ptx.contains("st.relaxed.sys.global.u64"));
        // proxy_push's one load of the header's first 16 bytes.
        assert!(ptx.contains("ld.volatile.global.v4.u32"));
    }

    #[test]
    fn without_a_driver_everything_says_so() {
        if driver_present() {
            return;
        }
        assert!(matches!(availability(), Err(GpuError::NoDriver)));
        assert!(matches!(context(0), Err(GpuError::NoDriver)));
    }
}
