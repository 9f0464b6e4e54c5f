//! GPU-initiated WRITEs through any [`transport_core::Transport`]: producers (GPU threads, or
//! CPU threads) write fixed-size commands into a ring in host memory; a proxy thread per
//! endpoint posts them and publishes completion counters the producers wait on.
//!
//! The ring's layout and protocol (the ABI a CUDA kernel writes, with which fence orders
//! what) are in [`ring`]; [`ring::CUDA_HEADER`] is the same layout as CUDA C for NVRTC.
//!
//! # API
//! One ring and one [`Proxy`] per endpoint. The sender's proxy posts its ring's commands; the
//! receiver's proxy counts immediates into its ring's `arrivals` (slot `imm >> 16`), after
//! `make_gpu_visible` on its landing regions. A producer learns that WRITEs *landed* from the
//! receiver's `arrivals` only; the sender's `done` says the source buffer may be reused.
//! ```
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use transport_core::{HostBuffer, Memory, MemoryRegion, PeerId, Transport};
//! use transport_proxy::{immediate, pack, Command, Proxy, ProxyPeer, RingLayout, RingMemory};
//!
//! type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
//!
//! /// `a` WRITEs 4 KiB into `b` through a ring (`a_to_b`: `a.add_peer(&b.address())`, with
//! /// `b.add_peer(&a.address())` done too).
//! fn through_the_ring<T: Transport>(mut a: T, mut b: T, a_to_b: PeerId) -> Res<()> {
//!     let src = a.register(Memory::Host(HostBuffer::from_slice(&[7; 4096])))?;
//!     let dst = b.register(Memory::Host(HostBuffer::new(4096)))?;
//!     let remote = a.import(a_to_b, &dst.remote())?;
//!     // A GPU producer's ring lives in cuMemHostAlloc(DEVICEMAP) memory: `Ring::init` on it.
//!     let ring_a = RingMemory::new(RingLayout::new(1024, 1)?);
//!     let ring_b = RingMemory::new(RingLayout::new(2, 1)?); // 1 arrival slot: one writer
//!     // Commands name regions and peers by index into these tables.
//!     let peers = vec![ProxyPeer { id: a_to_b, regions: vec![remote] }];
//!     let pa = Proxy::<T>::new(ring_a.ring(), vec![src], peers);
//!     let pb = Proxy::<T>::new(ring_b.ring(), vec![dst], vec![]).landing(vec![0]);
//!     let (stop_a, stop_b) = (&AtomicBool::new(false), &AtomicBool::new(false));
//!     std::thread::scope(|s| -> Res<()> {
//!         // The proxies own their endpoint's regions while they run; they hand them back.
//!         let ha = s.spawn(move || (pa.run(&mut a, stop_a), pa));
//!         let hb = s.spawn(move || (pb.run(&mut b, stop_b), pb));
//!         // The producer: peer 0, local region 0 offset 0, the peer's region 0 offset 0.
//!         let cmd = Command::write(0, pack(0, 0), pack(0, 0), 4096, Some(immediate(0, 1)));
//!         ring_a.ring().push(&cmd)?;
//!         ring_b.ring().wait_arrivals(0, 1, Duration::from_secs(5))?; // landed at b
//!         ring_a.ring().wait_done(1, Duration::from_secs(5))?; // src reusable
//!         stop_a.store(true, std::sync::atomic::Ordering::Relaxed);
//!         stop_b.store(true, std::sync::atomic::Ordering::Relaxed);
//!         let (ra, _pa) = ha.join().expect("proxy a");
//!         let (rb, pb) = hb.join().expect("proxy b");
//!         ra?;
//!         rb?;
//!         let dst = &pb.regions()[0];
//!         assert_eq!(dst.memory().host().map(|h| h.to_vec()), Some(vec![7; 4096]));
//!         Ok(())
//!     })
//! }
//! ```
//! From a CUDA kernel the same command goes through `proxy_push(ring, &cmd)` (or
//! `proxy_push_unfenced` for a payload in place before the launch) of `kernels/proxy_ring.cuh`,
//! given the ring's device address; `kernels/push_example.cu` is a whole kernel doing it, run
//! by the GPU tests.
//!
//! A fence ([`Command::fence`]) holds back every later command until the earlier ones have
//! completed locally: with delivery-complete WRITEs (verbs RC, libfabric with delivery
//! completion) "data, fence, flag" lands the flag after the data; elsewhere count immediates.
//! [`drain_to_nothing`] consumes a ring without posting: the ring's own rate.
//!
//! # Waiting from a kernel
//! Every look a GPU thread takes at the ring or its counters is a read across PCIe, and such
//! reads slow every CUDA copy the GPU makes meanwhile, which is how libfabric's shm moves GPU
//! memory. On an H200 (`tests/gpu_proxy.rs`, `figures_copies_beside_kernels`), one polling
//! thread made an 8-byte `cudaMemcpy` 7.4-8.6 us (idle 7.4), 4 polling blocks 130 us and
//! 2 blocks per SM 1-4 ms, one lane per warp or per block alike. Wait with one thread
//! (the kernels here: a warp asks once for room, the latency kernel polls with one
//! thread), or make room before the launch as [`cuda::CudaProducer::issue`] does.

pub mod proxy;
pub mod ring;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use proxy::{
    drain_to_nothing, Proxy, ProxyError, ProxyPeer, ProxyStats, DEFAULT_BATCH, STOP_GRACE,
};
pub use ring::{immediate, pack, Command, Ring, RingError, RingLayout, RingMemory};

/// The clang-16 the unit tests compile CUDA C with (the kernels for sm_90, the ring's header
/// for the host), or `None` where none is installed (the tests then say SKIPPED).
#[cfg(test)]
pub(crate) fn clang16() -> Option<&'static str> {
    ["clang-16", "/usr/lib/llvm-16/bin/clang"]
        .into_iter()
        .find(|c| {
            std::process::Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}
