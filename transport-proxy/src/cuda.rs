//! The device side of the proxy ring (feature `cuda`): the ring's memory in pinned,
//! device-mapped host memory, and CUDA C kernels compiled at run time with NVRTC that claim,
//! fill and publish commands and wait on a completion counter.
//!
//! Nothing here needs CUDA to build: cudarc loads `libcuda` and `libnvrtc` when first used,
//! and every entry point checks that they are there first ([`availability`]), so a machine
//! without them gets [`GpuError::NoDriver`] or [`GpuError::NoNvrtc`], never a panic.
//!
//! The kernels (`kernels/producer.cu`) follow the protocol of `ring.rs` and are compiled with
//! its `CUDA_HEADER` in front (the offsets and the command struct, checked against the Rust
//! constants there), so the kernel and the proxy cannot disagree on an offset. The source
//! file says which fence orders what.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::PushKernelArg;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig};

/// The kernels' CUDA C source, compiled at run time by NVRTC.
pub const PRODUCER_SRC: &str = include_str!("../kernels/producer.cu");

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
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "read_u64({offset}) out of the block"
        );
        // SAFETY: in bounds and aligned (checked above); the block lives as long as self.
        unsafe { std::ptr::read_volatile(self.host.add(offset) as *const u64) }
    }

    /// Zero `[offset, offset + len)` with volatile stores (before a kernel uses it).
    pub fn zero(&self, offset: usize, len: usize) {
        assert!(
            offset + len <= self.len,
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

/// What [`Kernels::produce`] publishes: commands `first..first + count`. Command `i` WRITEs
/// `len` bytes from `local_off + (i % pages) * stride` of local region `local_region` to
/// `remote_off + (i % pages) * stride` of `peer`'s region `remote_region`; with
/// [`OP_WRITE_IMM`](crate::ring::OP_WRITE_IMM) its immediate is
/// [`immediate`](crate::ring::immediate)`(imm_slot, i as u16)`.
#[derive(Clone, Debug)]
pub struct Produce {
    pub first: u64,
    pub count: u64,
    pub peer: u16,
    pub local_region: u16,
    pub local_off: u64,
    pub remote_region: u16,
    pub remote_off: u64,
    pub len: u32,
    pub stride: u64,
    pub pages: u64,
    /// [`OP_WRITE`](crate::ring::OP_WRITE) or [`OP_WRITE_IMM`](crate::ring::OP_WRITE_IMM).
    pub op: u8,
    pub imm_slot: u16,
    /// The u64 (device address) warps claim positions from: `None` for the ring's head;
    /// `Some` for a counter in GPU memory that holds the ring's next position (the only
    /// producer of the ring then).
    pub claim: Option<u64>,
    /// `Some((device address of the local region, salt))`: each thread first fills its
    /// command's payload with [`payload_byte`], ordered before the command by the fence.
    pub fill: Option<(u64, u32)>,
    /// Blocks and threads per block of the launch.
    pub blocks: u32,
    pub threads: u32,
}

impl Produce {
    /// `cmd` alone, as command `first` of one warp (what [`Kernels::pingpong`] publishes each
    /// round: its immediate's low 16 bits become the round's position).
    pub fn single(cmd: &crate::Command, first: u64) -> Self {
        let (local_region, local_off) = crate::ring::unpack(cmd.local);
        let (remote_region, remote_off) = crate::ring::unpack(cmd.remote);
        Self {
            first,
            count: 1,
            peer: cmd.peer,
            local_region,
            local_off,
            remote_region,
            remote_off,
            len: cmd.len,
            stride: 0,
            pages: 1,
            op: cmd.op,
            imm_slot: (cmd.imm >> crate::ring::ARRIVAL_SHIFT) as u16,
            claim: None,
            fill: None,
            blocks: 1,
            threads: 32,
        }
    }
}

/// One warp: the launch of the kernels one GPU thread runs (wait, ping-pongs).
const ONE_WARP: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (32, 1, 1),
    shared_mem_bytes: 0,
};

/// The compiled kernels, on one stream of one context.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    produce: CudaFunction,
    wait: CudaFunction,
    pingpong: CudaFunction,
    issue: CudaFunction,
    flag_pingpong: CudaFunction,
    /// Status and result words the kernels write (host-mapped: readable after a sync).
    scratch: MappedHost,
}

/// How long a kernel waits for the proxy before it gives up and says so.
pub const KERNEL_TIMEOUT_NS: u64 = 10_000_000_000;

/// The kernels' source as NVRTC compiles it: ring.rs's CUDA header, then the kernels.
pub fn kernel_source() -> String {
    format!("{}\n{}", crate::ring::CUDA_HEADER, PRODUCER_SRC)
}

/// A kernel's failure word (1: timed out; 0x100 | code: the ring's error word) in words.
fn failure(word: u64, what: &str) -> GpuError {
    if word & 0x100 != 0 {
        let code = (word & 0xff) as u32;
        GpuError::Timeout(format!(
            "{what}: the proxy is gone ({}: {})",
            code,
            crate::ring::error_name(code)
        ))
    } else {
        GpuError::Timeout(format!(
            "{what}: waited {} s for the proxy and gave up",
            KERNEL_TIMEOUT_NS / 1_000_000_000
        ))
    }
}

impl Kernels {
    /// Compile the kernels for `ctx`'s GPU and load them. On a compile failure the error
    /// carries NVRTC's log.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        if !nvrtc_present() {
            return Err(GpuError::NoNvrtc);
        }
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| cuda("cuDeviceGetAttribute(COMPUTE_CAPABILITY)", e))?;
        if major < 7 {
            return Err(GpuError::Invalid(format!(
                "GPU of compute capability {major}.{minor}: the kernels need 7.0 or later \
                 (ld.acquire.sys, st.relaxed.sys, independent thread scheduling)"
            )));
        }
        let options = vec![
            format!("--gpu-architecture=compute_{major}{minor}"),
            "--std=c++17".to_string(),
        ];
        let opts = cudarc::nvrtc::CompileOptions {
            options: options.clone(),
            name: Some("producer.cu".into()),
            ..Default::default()
        };
        let compile_error = |code: String, log: String| GpuError::Compile {
            name: "producer.cu".into(),
            options: options.clone(),
            code,
            log,
        };
        let ptx =
            cudarc::nvrtc::compile_ptx_with_opts(kernel_source(), opts).map_err(|e| match e {
                cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
                    compile_error(format!("{nvrtc:?}"), log.to_string_lossy().into_owned())
                }
                other => compile_error(format!("{other:?}"), String::new()),
            })?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| cuda("cuModuleLoadData (the PTX NVRTC made)", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| cuda(&format!("cuModuleGetFunction({name})"), e))
        };
        let stream = ctx.new_stream().map_err(|e| cuda("cuStreamCreate", e))?;
        Ok(Self {
            ctx: ctx.clone(),
            stream,
            produce: f("proxy_produce")?,
            wait: f("proxy_wait")?,
            pingpong: f("proxy_pingpong")?,
            issue: f("proxy_issue")?,
            flag_pingpong: f("proxy_flag_pingpong")?,
            scratch: MappedHost::alloc(ctx, 4096)?,
        })
    }

    /// The context the kernels run in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The same kernels (no second compile) on a stream and scratch of their own: one per
    /// ring, so that producers of several rings run at once.
    pub fn fork(&self) -> Result<Self, GpuError> {
        Ok(Self {
            ctx: self.ctx.clone(),
            stream: self
                .ctx
                .new_stream()
                .map_err(|e| cuda("cuStreamCreate", e))?,
            produce: self.produce.clone(),
            wait: self.wait.clone(),
            pingpong: self.pingpong.clone(),
            issue: self.issue.clone(),
            flag_pingpong: self.flag_pingpong.clone(),
            scratch: MappedHost::alloc(&self.ctx, 4096)?,
        })
    }

    /// The GPU's streaming multiprocessors (for sizing launches).
    pub fn multiprocessors(&self) -> u32 {
        self.ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|n| n.max(1) as u32)
            .unwrap_or(1)
    }

    /// Launch the producer on the ring block at device address `ring` (asynchronous:
    /// [`Kernels::sync`] waits for it, and reports a producer that gave up).
    pub fn produce(&self, ring: u64, p: &Produce) -> Result<(), GpuError> {
        if p.count == 0 {
            return Ok(());
        }
        if p.blocks == 0 || p.threads == 0 || !p.threads.is_multiple_of(32) || p.threads > 1024 {
            return Err(GpuError::Invalid(format!(
                "launch of {} blocks of {} threads: threads must be a multiple of 32, at most 1024",
                p.blocks, p.threads
            )));
        }
        self.scratch.zero(0, 8);
        let status = self.scratch.device_ptr();
        let claim = p.claim.unwrap_or(ring + crate::ring::OFF_HEAD as u64);
        let (src, fill, salt) = match p.fill {
            Some((src, salt)) => (src, 1u32, salt),
            None => (0u64, 0u32, 0u32),
        };
        let len = p.len as u64;
        let (peer, lreg, rreg, op, slot) = (
            p.peer as u32,
            p.local_region as u32,
            p.remote_region as u32,
            p.op as u32,
            p.imm_slot as u32,
        );
        let timeout = KERNEL_TIMEOUT_NS;
        let cfg = LaunchConfig {
            grid_dim: (p.blocks, 1, 1),
            block_dim: (p.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.produce);
        b.arg(&ring)
            .arg(&claim)
            .arg(&p.first)
            .arg(&p.count)
            .arg(&peer)
            .arg(&lreg)
            .arg(&p.local_off)
            .arg(&rreg)
            .arg(&p.remote_off)
            .arg(&len)
            .arg(&p.stride)
            .arg(&p.pages)
            .arg(&op)
            .arg(&slot)
            .arg(&src)
            .arg(&fill)
            .arg(&salt)
            .arg(&timeout)
            .arg(&status);
        // SAFETY: the arguments match proxy_produce's parameters in number, order and size
        // (pointers as u64 device addresses, u32 for unsigned int, u64 for unsigned long
        // long); ring is a mapped block Ring::init laid out, claim a u64 the kernel may add
        // to, src (when fill is set) a device address with room for every page's payload,
        // and status is scratch, which self owns and sync() waits on before reading.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("cuLaunchKernel(proxy_produce)", e))?;
        Ok(())
    }

    /// Wait for this stream's work.
    fn synchronize(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(|e| cuda("cuStreamSynchronize", e))
    }

    /// Wait for everything launched so far; an error if a producer gave up.
    pub fn sync(&self) -> Result<(), GpuError> {
        self.synchronize()?;
        let st = self.scratch.read_u64(0) & 0xffff_ffff;
        if st != 0 {
            return Err(failure(
                st,
                "a producer thread waiting for room in the ring",
            ));
        }
        Ok(())
    }

    /// Run `proxy_wait` until the u64 at device address `counter` reaches `target`, and
    /// wait for it: the GPU's ns from the kernel's start until it saw the target.
    pub fn wait(&self, ring: u64, counter: u64, target: u64) -> Result<u64, GpuError> {
        self.scratch.zero(64, 32);
        let out = self.scratch.device_ptr() + 64;
        let timeout = KERNEL_TIMEOUT_NS;
        let cfg = ONE_WARP;
        let mut b = self.stream.launch_builder(&self.wait);
        b.arg(&ring)
            .arg(&counter)
            .arg(&target)
            .arg(&timeout)
            .arg(&out);
        // SAFETY: arguments match proxy_wait's (u64 device addresses and u64s); ring and
        // counter are in the caller's mapped block, alive across this synchronous call; out
        // is scratch, owned by self.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("cuLaunchKernel(proxy_wait)", e))?;
        self.synchronize()?;
        let [seen, done, start, err] = [64, 72, 80, 88].map(|o| self.scratch.read_u64(o));
        if done == 0 {
            let word = if err != 0 { 0x100 | err } else { 1 };
            return Err(failure(
                word,
                &format!(
                    "the kernel waiting for a counter to reach {target} (it stayed at {seen})"
                ),
            ));
        }
        Ok(done.saturating_sub(start))
    }

    /// Latency: `iters` rounds of one command (one GPU thread, claimed from the ring's head)
    /// and a spin until the u64 at `counter` passes `base_count + round + 1`; the GPU's
    /// total ns.
    #[allow(clippy::too_many_arguments)]
    pub fn pingpong(
        &self,
        ring: u64,
        counter: u64,
        base_count: u64,
        iters: u64,
        p: &Produce,
    ) -> Result<u64, GpuError> {
        self.scratch.zero(128, 24);
        let out = self.scratch.device_ptr() + 128;
        let timeout = KERNEL_TIMEOUT_NS;
        let len = p.len as u64;
        let (peer, lreg, rreg, op, slot) = (
            p.peer as u32,
            p.local_region as u32,
            p.remote_region as u32,
            p.op as u32,
            p.imm_slot as u32,
        );
        let cfg = ONE_WARP;
        let mut b = self.stream.launch_builder(&self.pingpong);
        b.arg(&ring)
            .arg(&counter)
            .arg(&base_count)
            .arg(&iters)
            .arg(&p.first)
            .arg(&peer)
            .arg(&lreg)
            .arg(&p.local_off)
            .arg(&rreg)
            .arg(&p.remote_off)
            .arg(&len)
            .arg(&op)
            .arg(&slot)
            .arg(&timeout)
            .arg(&out);
        // SAFETY: arguments match proxy_pingpong's in number, order and size; ring and
        // counter are in the caller's mapped block, alive across this synchronous call; out
        // is scratch, owned by self.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("cuLaunchKernel(proxy_pingpong)", e))?;
        self.synchronize()?;
        let [done, ns, failed] = [128, 136, 144].map(|o| self.scratch.read_u64(o));
        if failed != 0 || done != iters {
            return Err(failure(
                failed.max(1),
                &format!("the latency kernel after {done} of {iters} rounds"),
            ));
        }
        Ok(ns)
    }
}

impl Kernels {
    /// The PCIe floor: `iters` rounds of one GPU thread storing `r + 1` to the u64 at device
    /// address `flags` and spinning until the u64 128 bytes on (`flags + 128`) reads `r + 1`,
    /// which a CPU thread must echo (see `proxy_flag_pingpong`); the GPU's total ns. `flags`
    /// must be mapped host memory (a [`MappedHost`]'s device address).
    pub fn flag_pingpong(&self, flags: u64, iters: u64) -> Result<u64, GpuError> {
        self.scratch.zero(192, 24);
        let out = self.scratch.device_ptr() + 192;
        let timeout = KERNEL_TIMEOUT_NS;
        let cfg = ONE_WARP;
        let mut b = self.stream.launch_builder(&self.flag_pingpong);
        b.arg(&flags).arg(&iters).arg(&timeout).arg(&out);
        // SAFETY: arguments match proxy_flag_pingpong's (u64 device addresses and u64s);
        // flags is the caller's mapped memory with 136 bytes from it, alive across this
        // synchronous call; out is scratch, owned by self.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("cuLaunchKernel(proxy_flag_pingpong)", e))?;
        self.synchronize()?;
        let [done, ns, failed] = [192, 200, 208].map(|o| self.scratch.read_u64(o));
        if failed != 0 || done != iters {
            return Err(GpuError::Timeout(format!(
                "the flag ping-pong kernel after {done} of {iters} rounds: the CPU stopped \
                 echoing for {} s",
                KERNEL_TIMEOUT_NS / 1_000_000_000
            )));
        }
        Ok(ns)
    }
}

/// A ring in pinned, device-mapped host memory ([`MappedHost`]), laid out by
/// [`Ring::init`](crate::Ring::init): the proxy gets [`CudaRing::ring`], kernels
/// [`CudaRing::device_ptr`].
pub struct CudaRing {
    mem: MappedHost,
}

impl CudaRing {
    /// Allocate and lay out a ring of `layout` in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, layout: crate::RingLayout) -> Result<Self, GpuError> {
        let mem = MappedHost::alloc(ctx, layout.bytes())?;
        // SAFETY: mem holds layout.bytes() writable, page-aligned bytes that this CudaRing
        // owns and uses as nothing but this ring.
        unsafe { crate::Ring::init(mem.host_ptr(), mem.len(), layout) }
            .map_err(|e| GpuError::Invalid(e.to_string()))?;
        Ok(Self { mem })
    }

    /// The ring, for the proxy and CPU waiters.
    pub fn ring(&self) -> crate::Ring<'_> {
        // SAFETY: the block is self.mem's, alive as long as the borrow, laid out by new().
        unsafe { crate::Ring::attach(self.mem.host_ptr(), self.mem.len()) }
            .expect("a ring laid out by CudaRing::new attaches")
    }

    /// The block's device address, for kernels.
    pub fn device_ptr(&self) -> u64 {
        self.mem.device_ptr()
    }
}

/// A producer for a ring the caller owns in plain host memory (bench-core's gpu-write hands
/// its producer a [`Ring`](crate::Ring) in a [`RingMemory`](crate::RingMemory) and a list of
/// commands): per call it page-locks and maps the ring's block (`cuMemHostRegister(DEVICEMAP |
/// PORTABLE)`), copies the commands into a mapped staging buffer, launches `proxy_issue` (one
/// GPU thread per command: warp claims on head, room, fields, fence, ready word), waits for
/// it and unregisters the block. The registration lasts one call because the caller may free
/// the ring afterwards and a registration must not outlive its memory. A figure taken through
/// it includes a registration and a kernel launch per call; tests/gpu_proxy.rs measures
/// commands that kernels originate.
pub struct CudaProducer {
    kernels: Kernels,
    staging: std::sync::Mutex<MappedHost>,
}

impl CudaProducer {
    /// Compile the kernels on GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        let ctx = context(ordinal)?;
        let kernels = Kernels::load(&ctx)?;
        let staging = MappedHost::alloc(&ctx, 4096 * crate::ring::COMMAND_BYTES)?;
        Ok(Self {
            kernels,
            staging: std::sync::Mutex::new(staging),
        })
    }

    /// A ring its kernels reach without a registration per call: [`CudaRing`].
    pub fn ring_memory(&self, layout: crate::RingLayout) -> Result<CudaRing, GpuError> {
        CudaRing::new(&self.kernels.ctx, layout)
    }

    /// Publish `cmds` into `ring` from the GPU and return once every one is in the ring (the
    /// proxy consumes them meanwhile: more commands than the ring holds are fine). A ring in
    /// [`CudaRing`] memory is used as it is; any other is registered for the call.
    pub fn issue(&self, ring: crate::Ring<'_>, cmds: &[crate::Command]) -> Result<(), GpuError> {
        if cmds.is_empty() {
            return Ok(());
        }
        let mut staging = self
            .staging
            .lock()
            .map_err(|_| GpuError::Invalid("a CudaProducer call panicked earlier".into()))?;
        let need = std::mem::size_of_val(cmds);
        if staging.len() < need {
            *staging = MappedHost::alloc(&self.kernels.ctx, need.next_power_of_two())?;
        }
        // SAFETY: staging holds at least `need` bytes (just checked), no kernel uses it (the
        // previous call waited for its kernel), and Command is plain 32-byte repr(C) data.
        unsafe {
            std::ptr::copy_nonoverlapping(cmds.as_ptr().cast::<u8>(), staging.host_ptr(), need)
        };
        let (base, len) = (ring.as_ptr(), ring.layout().bytes());
        self.kernels
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda("cuCtxSetCurrent", e))?;
        let mut mapped: sys::CUdeviceptr = 0;
        // SAFETY: a query: it writes the device alias of base into mapped where base lies in
        // memory CUDA mapped (a CudaRing), and fails, writing nothing we use, elsewhere.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut mapped, base.cast(), 0) };
        if r == sys::CUresult::CUDA_SUCCESS {
            return self.launch_issue(base, cmds.len() as u64, staging.device_ptr());
        }
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: [base, base + len) is the ring's block, alive for this call (the Ring
        // borrows it); it is unregistered below before the call returns.
        let r = unsafe { sys::cuMemHostRegister_v2(base.cast(), len, flags) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda("cuMemHostRegister(the ring, DEVICEMAP | PORTABLE)", r));
        }
        let out = self.launch_issue(base, cmds.len() as u64, staging.device_ptr());
        // SAFETY: base was registered above by this call; the kernel that used it finished
        // (launch_issue synchronises, and on a launch error nothing ran).
        let u = unsafe { sys::cuMemHostUnregister(base.cast()) };
        out?;
        if u != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda("cuMemHostUnregister(the ring)", u));
        }
        Ok(())
    }

    /// Latency rounds on the GPU (the persistent `proxy_pingpong` kernel, one thread):
    /// `rounds` times, publish `cmd` into `ring` (its immediate's low 16 bits replaced by
    /// `(first + round) as u16`, its arrival slot kept) and spin until `ring`'s
    /// `arrivals[slot]` reaches `base + round + 1`; the GPU's total ns (its globaltimer).
    /// `ring` must be in memory the GPU reaches without a registration ([`CudaRing`],
    /// [`CudaProducer::ring_memory`]), and the kernel its only producer while it runs.
    pub fn pingpong(
        &self,
        ring: crate::Ring<'_>,
        slot: u32,
        cmd: &crate::Command,
        first: u64,
        base: u64,
        rounds: u64,
    ) -> Result<u64, GpuError> {
        if slot >= ring.layout().arrival_slots {
            return Err(GpuError::Invalid(format!(
                "arrival slot {slot}: the ring has {}",
                ring.layout().arrival_slots
            )));
        }
        if rounds == 0 {
            return Ok(0);
        }
        // One latency kernel at a time on this producer's stream and scratch.
        let _one = self
            .staging
            .lock()
            .map_err(|_| GpuError::Invalid("a CudaProducer call panicked earlier".into()))?;
        self.kernels
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda("cuCtxSetCurrent", e))?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: a query: it writes the device alias of the ring's block into dev where the
        // block lies in memory CUDA mapped, and fails, writing nothing we use, elsewhere.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ring.as_ptr().cast(), 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(GpuError::Invalid(
                "the latency kernel needs a ring in mapped memory (CudaProducer::ring_memory)"
                    .into(),
            ));
        }
        let p = Produce::single(cmd, first);
        let counter = dev + (crate::ring::OFF_ARRIVALS + crate::ring::LINE * slot as usize) as u64;
        self.kernels.pingpong(dev, counter, base, rounds, &p)
    }

    fn launch_issue(&self, base: *mut u8, n: u64, staged: u64) -> Result<(), GpuError> {
        let mut ring: sys::CUdeviceptr = 0;
        // SAFETY: base starts a range registered with DEVICEMAP in the current context; ring
        // is a valid out pointer; flags must be 0.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut ring, base.cast(), 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda("cuMemHostGetDevicePointer(the ring)", r));
        }
        let k = &self.kernels;
        k.scratch.zero(0, 8);
        let status = k.scratch.device_ptr();
        let timeout = KERNEL_TIMEOUT_NS;
        let threads = 256u32;
        let blocks = (n.div_ceil(threads as u64) as u32).clamp(1, 2 * k.multiprocessors());
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = k.stream.launch_builder(&self.kernels.issue);
        b.arg(&ring).arg(&staged).arg(&n).arg(&timeout).arg(&status);
        // SAFETY: the arguments match proxy_issue's (u64 device addresses, u64s); ring is the
        // registered block, staged holds n commands, status is scratch; sync() waits for the
        // kernel before any of them is released.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("cuLaunchKernel(proxy_issue)", e))?;
        k.sync()
    }
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

    /// The kernels as NVRTC gets them parse and compile to PTX with clang's CUDA mode (for
    /// sm_90, without a CUDA installation: kernels/clang_shim.h declares what NVRTC
    /// predefines). Not NVRTC itself, which only the GPU host has, but a typo or a type error
    /// shows here, before a GPU run. Skips, saying so, where no clang-16 is installed.
    #[test]
    fn kernels_parse_with_clang() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let clang = ["clang-16", "/usr/lib/llvm-16/bin/clang"]
            .into_iter()
            .find(|c| {
                Command::new(c)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
        let Some(clang) = clang else {
            eprintln!("SKIPPED: no clang-16 to check the kernels' syntax with");
            return;
        };
        let dir = std::env::temp_dir().join(format!("proxy-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shim = dir.join("clang_shim.h");
        std::fs::write(&shim, include_str!("../kernels/clang_shim.h")).unwrap();
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
                &[8, 8, 8, 8, 8, 4, 4, 8, 4, 8, 8, 4, 4, 8, 8][..],
            ),
            ("proxy_issue", &[8, 8, 8, 8, 8][..]),
            ("proxy_flag_pingpong", &[8, 8, 8, 8][..]),
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
        assert!(ptx.contains("st.relaxed.sys.global.u32"));
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
