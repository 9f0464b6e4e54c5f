//! The kernels, compiled once per context with NVRTC, and their launches.

use super::*;

/// [`Kernels::set_sync`]: the command's words after `__threadfence_system` (fence.sc.sys),
/// relaxed, in place of word 0's `st.release.sys` (the protocol before 2026-11-28).
pub const SYNC_SC_FENCE: u32 = 1;
/// [`Kernels::set_sync`]: poll with `ld.relaxed.sys` and fence once (`fence.acq_rel.sys`) after
/// the count passed, in place of `ld.acquire.sys` on every poll.
pub const SYNC_RELAXED_POLL: u32 = 2;
/// [`Kernels::set_sync`], the floor only: the flag's store without a fence.
pub const SYNC_NO_FENCE: u32 = 4;
/// [`Kernels::set_sync`]: the command's words with no fence (`proxy_push_unfenced`: valid
/// for the latency kernel, whose payload is in place before its launch).
pub const SYNC_UNFENCED: u32 = 8;

/// One warp: the launch of the kernels one GPU thread runs (wait, ping-pongs).
const ONE_WARP: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (32, 1, 1),
    shared_mem_bytes: 0,
};

/// The compiled kernels, on one stream of one context.
pub struct Kernels {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    produce: CudaFunction,
    wait: CudaFunction,
    pingpong: CudaFunction,
    /// The producer's kernel (`producer.rs` launches it).
    pub(super) issue: CudaFunction,
    push_example: CudaFunction,
    flag_pingpong: CudaFunction,
    spin: CudaFunction,
    /// The latency kernel's pause between two polls of its counter, ns (0: none).
    poll_sleep_ns: u32,
    /// How the latency kernels publish and poll ([`Kernels::set_sync`]).
    sync: u32,
    /// The latency kernel starts polling this long before its fastest round trip so far
    /// would end, ns (0: from the publish on; [`Kernels::set_poll_margin`]).
    poll_margin_ns: u32,
    /// Status and result words the kernels write (host-mapped: readable after a sync).
    pub(super) scratch: MappedHost,
}

/// How long a kernel waits for the proxy before it gives up and says so.
pub const KERNEL_TIMEOUT_NS: u64 = 10_000_000_000;

/// The kernels' source as NVRTC compiles it: ring/layout.rs's CUDA header, then the kernels.
pub fn kernel_source() -> String {
    format!(
        "{}\n{}\n{}",
        crate::ring::CUDA_HEADER,
        PRODUCER_SRC,
        PUSH_EXAMPLE_SRC
    )
}

/// A kernel's failure word when `proxy_push` refused the block as not a ring of this layout
/// version (`proxy_ring.cuh`'s `PROXY_PUSH_WRONG_RING`).
pub const PUSH_WRONG_RING: u64 = 0x1_0000;

/// A kernel's failure word (1: timed out; 0x100 | code: the ring's error word;
/// [`PUSH_WRONG_RING`]) in words.
fn failure(word: u64, what: &str) -> GpuError {
    if word == PUSH_WRONG_RING {
        GpuError::Invalid(format!(
            "{what}: the block is not a version-{} ring (proxy_push checks its header)",
            crate::ring::VERSION
        ))
    } else if word & 0x100 != 0 {
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
            push_example: f("proxy_push_example")?,
            flag_pingpong: f("proxy_flag_pingpong")?,
            spin: f("proxy_spin")?,
            poll_sleep_ns: 0,
            // The latency kernels' payload is in place before their launch: no fence.
            sync: SYNC_UNFENCED,
            poll_margin_ns: 0,
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
            push_example: self.push_example.clone(),
            flag_pingpong: self.flag_pingpong.clone(),
            spin: self.spin.clone(),
            poll_sleep_ns: self.poll_sleep_ns,
            sync: self.sync,
            poll_margin_ns: self.poll_margin_ns,
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
    ///
    /// # Safety
    /// The kernel reads and writes through the device addresses it is given: `ring` must be
    /// a ring block laid out by [`Ring::init`](crate::Ring) in memory this context maps, and
    /// `p`'s `claim` (where set) a u64 and `src` (with `fill`) room for every page's payload
    /// there too; all of it must stay allocated, and no other writer may use the ring
    /// against its protocol, until [`Kernels::sync`] returns.
    pub unsafe fn produce(&self, ring: u64, p: &Produce) -> Result<(), GpuError> {
        if p.count == 0 {
            return Ok(());
        }
        if p.blocks == 0 || p.threads == 0 || !p.threads.is_multiple_of(32) || p.threads > 1024 {
            return Err(GpuError::Invalid(format!(
                "launch of {} blocks of {} threads: threads must be a multiple of 32, at most 1024",
                p.blocks, p.threads
            )));
        }
        if p.push && (p.claim.is_some() || p.op != crate::ring::OP_WRITE_IMM) {
            return Err(GpuError::Invalid(
                "Produce::push: proxy_push claims on the ring's head (claim: None) and the \
                 example sends WRITEs with immediate"
                    .into(),
            ));
        }
        self.scratch.zero(0, 8);
        let status = self.scratch.device_ptr();
        let claim = p.claim.unwrap_or(ring + crate::ring::OFF_HEAD as u64);
        let (src, fill, salt) = match p.fill {
            Some((src, salt)) => (src, 1u32, salt),
            None => (0u64, 0u32, 0u32),
        };
        let commands = p.command_args();
        let (op, slot) = (u32::from(p.op), u32::from(p.imm_slot));
        let timeout = KERNEL_TIMEOUT_NS;
        let cfg = LaunchConfig {
            grid_dim: (p.blocks, 1, 1),
            block_dim: (p.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (f, name) = if p.push {
            (&self.push_example, "proxy_push_example")
        } else {
            (&self.produce, "proxy_produce")
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&ring);
        if !p.push {
            b.arg(&claim);
        }
        commands.push(&mut b);
        if !p.push {
            b.arg(&op);
        }
        b.arg(&slot).arg(&src).arg(&fill).arg(&salt);
        if !p.push {
            b.arg(&timeout);
        }
        b.arg(&status);
        // SAFETY: the arguments match the kernel's parameters in number, order and size
        // (proxy_produce: ring, claim, the commands' ten, op, slot, src, fill, salt, timeout,
        // status; proxy_push_example the same without claim, op and timeout; pointers as u64
        // device addresses, u32 for unsigned int, u64 for unsigned long long;
        // kernels_parse_with_clang checks the sizes). ring is a mapped block Ring::init laid
        // out, claim a u64 the kernel may add to, src (when fill is set) a device address
        // with room for every page's payload, and status is scratch, which self owns and
        // sync() waits on before reading.
        unsafe { b.launch(cfg) }.map_err(|e| cuda(&format!("cuLaunchKernel({name})"), e))?;
        Ok(())
    }

    /// Wait for this stream's work, asking the driver every 20 us and sleeping between:
    /// `cuStreamSynchronize` spins in the driver for as long as the kernel runs (the latency
    /// kernel runs a whole step), beside the proxy thread's CUDA copies of the same context.
    fn synchronize(&self) -> Result<(), GpuError> {
        loop {
            // SAFETY: a query of a stream self owns (alive as long as self).
            match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {
                    std::thread::sleep(std::time::Duration::from_micros(20))
                }
                e => return Err(cuda("cuStreamQuery", e)),
            }
        }
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
    ///
    /// # Safety
    /// `ring` (a ring block, whose error word the kernel reads) and `counter` (an aligned
    /// u64) must be device addresses of memory this context maps, allocated until this
    /// returns.
    pub unsafe fn wait(&self, ring: u64, counter: u64, target: u64) -> Result<u64, GpuError> {
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

    /// Pause `ns` (`nanosleep`, at most about 1 ms) between two polls of the latency kernel's
    /// counter ([`Kernels::pingpong`]); 0, the default, spins. Each poll is a PCIe read.
    pub fn set_poll_sleep(&mut self, ns: u32) {
        self.poll_sleep_ns = ns;
    }

    /// Poll late: after each publish the latency kernel ([`Kernels::pingpong`]) sleeps until
    /// `ns` before its fastest round trip so far would end, then polls (0, the default: it
    /// polls from the publish on). Its polls are PCIe reads of mapped memory, which slow the
    /// CUDA copies a transport makes of GPU memory (`figures_copies_beside_kernels`); a round
    /// trip that ends sooner than the fastest minus `ns` is seen late by that much.
    pub fn set_poll_margin(&mut self, ns: u32) {
        self.poll_margin_ns = ns;
    }

    /// How the latency kernels order their publish and poll (`producer.cu`'s `SYNC_*`; 0 is
    /// the ring's ordered protocol: word 0 `st.release.sys`, every poll `ld.acquire.sys`;
    /// the default is [`SYNC_UNFENCED`], their payload being in place before the launch, as
    /// gpu-write's): [`SYNC_SC_FENCE`], [`SYNC_RELAXED_POLL`], and for
    /// [`Kernels::flag_pingpong`] only [`SYNC_NO_FENCE`] and `pollers << 8` (extra polling
    /// warps, at most 15).
    pub fn set_sync(&mut self, sync: u32) {
        self.sync = sync;
    }

    /// Latency: `iters` rounds of one command (one GPU thread, claimed from the ring's head)
    /// and a spin until the u64 at `counter` passes `base_count + round + 1`; the GPU's
    /// total ns and each round's.
    ///
    /// # Safety
    /// As [`Kernels::produce`] for `ring` and `p`, and `counter` an aligned u64 of memory
    /// this context maps; all of it allocated until this returns (it waits for the kernel).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn pingpong(
        &self,
        ring: u64,
        counter: u64,
        base_count: u64,
        iters: u64,
        p: &Produce,
    ) -> Result<Pingpong, GpuError> {
        let mut rounds = self
            .stream
            .alloc_zeros::<u32>(iters.max(1) as usize)
            .map_err(|e| cuda(&format!("cuMemAlloc({iters} rounds' cycles)"), e))?;
        self.scratch.zero(128, 32);
        let out = self.scratch.device_ptr() + 128;
        let timeout = KERNEL_TIMEOUT_NS;
        let len = p.len as u64;
        let [peer, lreg, rreg, op, slot] = [
            p.peer,
            p.local_region,
            p.remote_region,
            u16::from(p.op),
            p.imm_slot,
        ]
        .map(u32::from);
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
            .arg(&self.poll_sleep_ns)
            .arg(&self.sync)
            .arg(&self.poll_margin_ns)
            .arg(&out)
            .arg(&mut rounds);
        // SAFETY: arguments match proxy_pingpong's in number, order and size; ring and
        // counter are in the caller's mapped block, alive across this synchronous call; out
        // is scratch, owned by self; rounds is device memory of at least iters u32s, alive
        // until after the synchronize below.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("cuLaunchKernel(proxy_pingpong)", e))?;
        self.synchronize()?;
        let [done, ns, failed, cycles] = [128, 136, 144, 152].map(|o| self.scratch.read_u64(o));
        if failed != 0 || done != iters {
            return Err(failure(
                failed.max(1),
                &format!("the latency kernel after {done} of {iters} rounds"),
            ));
        }
        let rounds = self
            .stream
            .clone_dtoh(&rounds)
            .map_err(|e| cuda("cuMemcpyDtoH(the rounds' cycles)", e))?;
        Ok(Pingpong::from_cycles(ns, cycles, &rounds[..iters as usize]))
    }
}

/// What [`Kernels::pingpong`] measured: the GPU's total and each round trip (a round: its
/// wait for room in the ring, the publish, the poll until the answer is seen).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pingpong {
    /// All rounds, ns (`%globaltimer`).
    pub total_ns: u64,
    /// Each round, ns: the SM's cycles scaled by the run's ns per cycle (`%globaltimer` may
    /// tick once a microsecond, too coarse for one round). A round over 2^32 cycles reads
    /// `u64::MAX`.
    pub round_ns: Vec<u64>,
}

impl Pingpong {
    fn from_cycles(total_ns: u64, total_cycles: u64, rounds: &[u32]) -> Self {
        let per = total_ns as f64 / total_cycles.max(1) as f64;
        let round_ns = rounds
            .iter()
            .map(|&c| match c {
                u32::MAX => u64::MAX,
                c => (c as f64 * per).round() as u64,
            })
            .collect();
        Self { total_ns, round_ns }
    }
}

impl Kernels {
    /// The PCIe floor: `iters` rounds of one GPU thread storing `r + 1` to the u64 at device
    /// address `flags` (ordered as [`Kernels::set_sync`] says: by default with no fence, as
    /// the latency kernels publish) and spinning until the u64 128 bytes on (`flags + 128`) reads `r + 1`,
    /// which a CPU thread must echo (see `proxy_flag_pingpong`); the GPU's total ns. `flags`
    /// must be mapped host memory (a [`MappedHost`]'s device address).
    ///
    /// # Safety
    /// `flags` must be the device address of at least 136 bytes (8-aligned) of mapped host
    /// memory this context maps, allocated until this returns (it waits for the kernel).
    pub unsafe fn flag_pingpong(&self, flags: u64, iters: u64) -> Result<u64, GpuError> {
        self.scratch.zero(192, 24);
        let out = self.scratch.device_ptr() + 192;
        let timeout = KERNEL_TIMEOUT_NS;
        let pollers = (self.sync >> 8) & 15;
        let cfg = LaunchConfig {
            block_dim: (32 * (1 + pollers), 1, 1),
            ..ONE_WARP
        };
        let mut b = self.stream.launch_builder(&self.flag_pingpong);
        b.arg(&flags)
            .arg(&iters)
            .arg(&timeout)
            .arg(&self.sync)
            .arg(&out);
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

impl Kernels {
    /// Load, for measurements: launch `proxy_spin` (asynchronous; [`Kernels::sync_spin`]
    /// waits): every `stride`-th thread of `blocks` x `threads` polls the u64 at device address
    /// `counter` (mapped host or GPU memory) until it reaches `target`, pausing `sleep_ns`
    /// between polls. The pollers give up after [`KERNEL_TIMEOUT_NS`].
    ///
    /// # Safety
    /// `counter` must be the device address of an aligned u64 in memory this context maps,
    /// allocated until [`Kernels::sync_spin`] returns.
    pub unsafe fn spin(
        &self,
        counter: u64,
        target: u64,
        blocks: u32,
        threads: u32,
        stride: u32,
        sleep_ns: u32,
    ) -> Result<(), GpuError> {
        if blocks == 0 || threads == 0 || threads > 1024 || stride == 0 {
            return Err(GpuError::Invalid(format!(
                "spin: {blocks} blocks of {threads} threads, every {stride}th polling"
            )));
        }
        self.scratch.zero(256, 8);
        let status = self.scratch.device_ptr() + 256;
        let timeout = KERNEL_TIMEOUT_NS;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.spin);
        b.arg(&counter)
            .arg(&target)
            .arg(&stride)
            .arg(&sleep_ns)
            .arg(&timeout)
            .arg(&status);
        // SAFETY: the arguments match proxy_spin's (u64 device addresses, u64s, u32s); the
        // caller keeps counter's memory alive until sync_spin returns; status is scratch,
        // owned by self.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("cuLaunchKernel(proxy_spin)", e))?;
        Ok(())
    }

    /// Wait for [`Kernels::spin`]'s launch: an error if any poller gave up.
    pub fn sync_spin(&self) -> Result<(), GpuError> {
        self.synchronize()?;
        let gave_up = self.scratch.read_u64(256) & 0xffff_ffff;
        if gave_up != 0 {
            return Err(GpuError::Timeout(format!(
                "{gave_up} pollers of proxy_spin waited {} s and gave up",
                KERNEL_TIMEOUT_NS / 1_000_000_000
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_cycles_become_ns_at_the_run_s_rate() {
        // 2 GHz: 3000 ns of rounds took 6000 cycles.
        let p = Pingpong::from_cycles(3000, 6000, &[2000, 1000, u32::MAX]);
        assert_eq!(p.total_ns, 3000);
        assert_eq!(p.round_ns, vec![1000, 500, u64::MAX]);
    }
}
