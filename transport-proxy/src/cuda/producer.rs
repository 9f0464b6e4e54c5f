//! A ring in pinned, device-mapped host memory, and the producer for a ring the caller owns.

use super::*;

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
/// GPU thread per command: warp claims on head, room, the command's words without a fence), waits for
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

    /// Pause `ns` between two polls of the latency kernel's counter ([`CudaProducer::pingpong`];
    /// 0, the default, spins): see [`Kernels::set_poll_sleep`].
    pub fn set_poll_sleep(&mut self, ns: u32) {
        self.kernels.set_poll_sleep(ns);
    }

    /// Poll late ([`Kernels::set_poll_margin`]).
    pub fn set_poll_margin(&mut self, ns: u32) {
        self.kernels.set_poll_margin(ns);
    }

    /// How the latency kernel orders its publish and poll ([`Kernels::set_sync`]).
    pub fn set_sync(&mut self, sync: u32) {
        self.kernels.set_sync(sync);
    }

    /// A ring its kernels reach without a registration per call: [`CudaRing`].
    pub fn ring_memory(&self, layout: crate::RingLayout) -> Result<CudaRing, GpuError> {
        CudaRing::new(&self.kernels.ctx, layout)
    }

    /// Publish `cmds` into `ring` from the GPU and return once every one is in the ring (the
    /// proxy consumes them meanwhile: more commands than the ring holds are fine). A ring in
    /// [`CudaRing`] memory is used as it is; any other is registered for the call.
    ///
    /// No launch here waits on the proxy: commands go in launches of at most the ring's
    /// capacity, each only once this thread has seen room for all of it (the ring's tail),
    /// so the kernel's threads never poll the ring. Measured on an H200 (`tests/gpu_proxy.rs`,
    /// `figures_copies_beside_kernels`): while 4 blocks of GPU threads poll mapped host
    /// memory, every `cudaMemcpy` in the system takes 70-130 us instead of 7-10 (2 x SM
    /// blocks: 1-4 ms), and the copies are how shm moves GPU memory: the workload's small
    /// WRITEs of GPU memory ran at 0.12x the host's while its producers waited for room.
    pub fn issue(&self, ring: crate::Ring<'_>, cmds: &[crate::Command]) -> Result<(), GpuError> {
        if cmds.is_empty() {
            return Ok(());
        }
        let mut staging = self
            .staging
            .lock()
            .map_err(|_| GpuError::Invalid("a CudaProducer call panicked earlier".into()))?;
        let cap = ring.capacity() as usize;
        let need = std::mem::size_of_val(&cmds[..cmds.len().min(cap)]);
        if staging.len() < need {
            *staging = MappedHost::alloc(&self.kernels.ctx, need.next_power_of_two())?;
        }
        let (base, len) = (ring.as_ptr(), ring.layout().bytes());
        self.kernels
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda("cuCtxSetCurrent", e))?;
        let mut mapped: sys::CUdeviceptr = 0;
        // SAFETY: a query: it writes the device alias of base into mapped where base lies in
        // memory CUDA mapped (a CudaRing), and fails, writing nothing we use, elsewhere.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut mapped, base.cast(), 0) };
        let register = r != sys::CUresult::CUDA_SUCCESS;
        if register {
            let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
            // SAFETY: [base, base + len) is the ring's block, alive for this call (the Ring
            // borrows it); it is unregistered below before the call returns.
            let r = unsafe { sys::cuMemHostRegister_v2(base.cast(), len, flags) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(cuda("cuMemHostRegister(the ring, DEVICEMAP | PORTABLE)", r));
            }
        }
        let out = cmds.chunks(cap).try_for_each(|chunk| {
            room_for(&ring, chunk.len() as u64)?;
            // SAFETY: staging holds at least size_of_val(chunk) bytes (sized above for the
            // largest chunk), no kernel uses it (each launch is waited for), and Command is
            // plain 32-byte repr(C) data.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    chunk.as_ptr().cast::<u8>(),
                    staging.host_ptr(),
                    std::mem::size_of_val(chunk),
                )
            };
            self.launch_issue(base, chunk.len() as u64, staging.device_ptr())
        });
        if !register {
            return out;
        }
        // SAFETY: base was registered above by this call; every kernel that used it finished
        // (launch_issue synchronises, and on a launch error nothing ran).
        let u = unsafe { sys::cuMemHostUnregister(base.cast()) };
        out?;
        if u != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda("cuMemHostUnregister(the ring)", u));
        }
        Ok(())
    }

    /// Publish `count` copies of `cmd` (immediate's low 16 bits: each one's index) into
    /// `ring` from commands the GPU makes itself, as a kernel that computes its transfers does:
    /// one `proxy_produce` launch of 2 blocks per multiprocessor, 256 threads each (warp
    /// claims on the ring's head, a warp waits for room with one lane), nothing staged from
    /// the host; returns once every one is in the ring (the proxy consumes meanwhile).
    /// `ring` must be in memory the GPU reaches without a registration ([`CudaRing`]).
    pub fn generate(
        &self,
        ring: crate::Ring<'_>,
        cmd: &crate::Command,
        count: u64,
    ) -> Result<(), GpuError> {
        if count == 0 {
            return Ok(());
        }
        let (_one, dev) = self.mapped(&ring, "generate")?;
        let p = Produce {
            count,
            blocks: 2 * self.kernels.multiprocessors(),
            threads: 256,
            ..Produce::single(cmd, 0)
        };
        // SAFETY: dev is the device address of the ring's block, mapped in this context
        // (`mapped` checked) and borrowed by `ring` for this call, which waits for the kernel
        // (sync) before it returns; the commands are built from one, with no claim and no
        // payload.
        unsafe { self.kernels.produce(dev, &p) }?;
        self.kernels.sync()
    }

    /// Latency rounds on the GPU (the persistent `proxy_pingpong` kernel, one thread):
    /// `rounds` times, publish `cmd` into `ring` (its immediate's low 16 bits replaced by
    /// `(first + round) as u16`, its arrival slot kept) and spin until `ring`'s
    /// `arrivals[slot]` reaches `base + round + 1`; the GPU's total ns (its globaltimer) and
    /// each round's ([`Pingpong`]).
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
    ) -> Result<Pingpong, GpuError> {
        if slot >= ring.layout().arrival_slots {
            return Err(GpuError::Invalid(format!(
                "arrival slot {slot}: the ring has {}",
                ring.layout().arrival_slots
            )));
        }
        if rounds == 0 {
            return Ok(Pingpong::default());
        }
        let (_one, dev) = self.mapped(&ring, "the latency kernel")?;
        let p = Produce::single(cmd, first);
        let counter = dev + (crate::ring::OFF_ARRIVALS + crate::ring::LINE * slot as usize) as u64;
        // SAFETY: dev and counter (an arrivals line of the same block) are device addresses
        // of the ring's block, mapped in this context (`mapped` checked) and borrowed by
        // `ring` for this call, which waits for the kernel; one command, no claim, no payload.
        unsafe { self.kernels.pingpong(dev, counter, base, rounds, &p) }
    }

    /// For a kernel on `ring`: this producer's stream and scratch for the call (the guard),
    /// its context current on this thread, and the ring's device address; `who` needs a ring
    /// in mapped memory, an error elsewhere.
    fn mapped(
        &self,
        ring: &crate::Ring<'_>,
        who: &str,
    ) -> Result<(std::sync::MutexGuard<'_, MappedHost>, u64), GpuError> {
        let one = self
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
            return Err(GpuError::Invalid(format!(
                "{who} needs a ring in mapped memory (CudaProducer::ring_memory)"
            )));
        }
        Ok((one, dev))
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

/// Wait, on this thread, until `ring` has room for `n` more commands than its producers have
/// claimed (`tail + capacity >= head + n`), at most [`KERNEL_TIMEOUT_NS`]; the ring's error
/// word (a proxy that stopped) ends the wait with an error.
fn room_for(ring: &crate::Ring<'_>, n: u64) -> Result<(), GpuError> {
    use std::sync::atomic::Ordering;
    let want = ring.head().load(Ordering::Acquire) + n;
    let cap = u64::from(ring.capacity());
    let t0 = std::time::Instant::now();
    let limit = std::time::Duration::from_nanos(KERNEL_TIMEOUT_NS);
    let mut spin = 0u32;
    while ring.tail().load(Ordering::Acquire) + cap < want {
        let e = ring.error();
        if e != 0 {
            return Err(GpuError::Timeout(format!(
                "waiting for room in the ring: the proxy is gone ({e}: {})",
                crate::ring::error_name(e)
            )));
        }
        spin = spin.wrapping_add(1);
        if spin.is_multiple_of(1024) {
            if t0.elapsed() > limit {
                return Err(GpuError::Timeout(format!(
                    "waited {} s for room for {n} commands in the ring and gave up",
                    limit.as_secs()
                )));
            }
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
    Ok(())
}
