//! The `Transport` trait and the types every RDMA backend shares.
//!
//! One [`Transport`] value is one endpoint on one NIC. Backends (`transport-efa` over
//! libfabric, `transport-verbs` over ibverbs, `transport-ucx` over UCX) implement it and describe themselves
//! ([`Transport::INFO`], [`BackendInfo`]); workloads are written once, generic over it. This
//! crate knows no backend. Its only FFI is the CUDA driver's, behind the `cuda` feature, for
//! [`GpuBuffer`]'s allocation and landing (`mem/cuda.rs`, through cudarc); without it, its
//! `unsafe` is [`HostBuffer`]'s: the allocation it owns as a raw pointer (so that no reference
//! to bytes a NIC may change lives), the copies in and out of it, and [`HostBuffer::peek8`]'s
//! volatile read.
//!
//! # What every backend guarantees
//! - Every operation carries a caller-chosen `u64` context, returned in its completion.
//!   Nothing is allocated per operation on the post/poll path (error completions excepted:
//!   they carry the provider's text).
//! - A full queue is an outcome ([`Post::QueueFull`], or a short count from
//!   [`Transport::post_writes`]), never an error: poll, then post again.
//! - A WRITE with an immediate produces exactly one [`CompletionKind::RemoteWrite`] at the
//!   target, carrying the immediate, after the written bytes are visible there. The target
//!   application never posts receives for immediates. So does a receive: its
//!   [`CompletionKind::Recv`] comes after its bytes. For GPU memory "visible" means visible
//!   to the CPU's next CUDA call on that memory and to every copy a provider made with CUDA
//!   ([`GpuBuffer`]s carry `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`, so libfabric's `shm` copy
//!   between processes has run when it completes the operation); for bytes a NIC wrote into
//!   GPU memory by GPUDirect RDMA, call [`Transport::make_gpu_visible`] before GPU work
//!   reads them (below).
//! - A failed operation produces a [`CompletionKind::Error`] carrying its context and the
//!   provider's own text, or the post itself returns an [`Error`]; nothing fails silently.
//! - Progress is manual: polling is what moves data. A side that never polls may stall its
//!   peer. Poll every endpoint that takes part in a transfer.
//!
//! # GPU memory and the consumer kernel
//! A NIC writing into GPU memory (GPUDirect RDMA: EFA, verbs) writes the completion into host
//! memory over another path than the bytes: the CPU can poll the completion while the bytes
//! are not yet visible to a kernel (or a copy on any stream) the GPU runs next. After the
//! completions that announce bytes in a region (its [`CompletionKind::RemoteWrite`]s and
//! [`CompletionKind::Recv`]s) and before launching the GPU work that reads them, call
//! [`Transport::make_gpu_visible`] on the region once (not once per completion: one call
//! covers every completion polled before it):
//! ```no_run
//! # use transport_core::Transport;
//! # fn consume<T: Transport>(ep: &mut T, landing: &T::Mr) -> transport_core::Result<()> {
//! // ... poll until the RemoteWrite that announces the region's bytes ...
//! ep.make_gpu_visible(landing)?;
//! // ... now launch the kernel that reads the region ...
//! # Ok(()) }
//! ```
//! It does what the GPU needs and nothing more: nothing for host memory or for bytes a
//! provider copied with CUDA (`shm`, `tcp`); nothing where the device orders GPUDirect RDMA
//! writes for its own context (Hopper and later on most platforms); else
//! `cuFlushGPUDirectRDMAWrites` (see [`GpuDirectFlush`] for how NCCL and aws-ofi-nccl do it).
//! It is never called on the post/poll path.
//!
//! # What is not guaranteed
//! - Completion order across operations, even on one peer. Count completions; do not rely on
//!   their order. (Verbs RC happens to be ordered per QP; libfabric RDM is not.)
//! - That a remote write without immediate is visible at the target before some later signal:
//!   use a WRITE with immediate (or a SEND after the write's local completion) to signal.
//! - That an operation still in flight succeeds once its region is dropped or deregistered.
//!   This endpoint's own operations cannot write into freed memory either way: a region
//!   dropped while one may use it stays registered and allocated until none does (or its
//!   device stopped using it before the drop returned), and [`Transport::deregister`] refuses
//!   while this endpoint has operations in flight, or for another endpoint's region. A peer's
//!   WRITE still on its way is another matter where the target checks no registration (UCX
//!   over tcp and cma): hand back memory peers write into only after their last WRITE's
//!   immediate. Keep a region until its operations completed.
//!
//! # Lifecycle
//! Endpoint `a` WRITEs into a region of endpoint `b`. Here both are in one program; between
//! machines the addresses and the [`RemoteMr`] travel over any channel (both serialize).
//! ```
//! use std::time::Duration;
//! use transport_core::wait::wait_pair;
//! use transport_core::{
//!     CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, Post, Result, Transport,
//! };
//!
//! fn write_once<T: Transport>(a: &mut T, b: &mut T) -> Result<()> {
//!     // 1. Addresses, pairwise: each side's `address()`, then the other's `add_peer()`.
//!     let (addr_a, addr_b) = (a.address(), b.address());
//!     let a_to_b = a.add_peer(&addr_b)?;
//!     b.add_peer(&addr_a)?;
//!     // 2. Memory: the target registers a region and publishes it as a `RemoteMr`: its
//!     //    address, length and key bytes (opaque: only the backend reads them).
//!     let src = a.register(Memory::Host(HostBuffer::from_slice(&[7; 4096])))?;
//!     let dst = b.register(Memory::Host(HostBuffer::new(4096)))?;
//!     let published = dst.remote();
//!     // 3. Import it once for the peer: the key bytes are read into what a post carries
//!     //    (`T::RemoteKey`). The endpoint owns whatever that took; it goes with the endpoint.
//!     let remote = a.import(a_to_b, &published)?;
//!     // 4. Post slices of it, and poll both sides (progress is manual): the WRITE completes
//!     //    on `a`, its immediate arrives on `b`, and then the bytes are there.
//!     let slice = remote.slice(0, 4096)?;
//!     let posted = a.post_write(a_to_b, LocalSlice::all(&src), slice, Some(1), 42)?;
//!     assert_eq!(posted, Post::Posted, "on a full queue: poll, then post again");
//!     let (mut wrote, mut landed) = (false, false);
//!     wait_pair(a, b, "the WRITE", Duration::from_secs(5), |side, c| {
//!         match (side, &c.check()?.kind) {
//!             (0, CompletionKind::Write) => wrote = true,
//!             (1, CompletionKind::RemoteWrite { imm: 1 }) => landed = true,
//!             _ => {}
//!         }
//!         Ok(wrote && landed)
//!     })?;
//!     assert_eq!(dst.memory().host().map(|h| h.to_vec()), Some(vec![7; 4096]));
//!     Ok(()) // the regions deregister as they drop, before the endpoints
//! }
//! ```
//! `transport-conformance`, the suite every backend passes, does this with each backend's
//! endpoints (its `warm_up` and `write_at_offset`).

//! # Misuse the compiler refuses
//! A region cannot be deregistered (or dropped) while a slice of it is still in use:
//! ```compile_fail
//! use transport_core::{LocalSlice, PeerId, Post, Transport};
//! fn misuse<T: Transport>(t: &mut T, mr: T::Mr) -> transport_core::Result<Post> {
//!     let s = LocalSlice::all(&mr);
//!     t.deregister(mr)?; // error: `mr` is borrowed by `s`
//!     t.post_send(PeerId(0), s, 0)
//! }
//! ```
//! A full queue cannot be ignored silently:
//! ```compile_fail
//! #![deny(unused_must_use)]
//! use transport_core::{LocalSlice, PeerId, Transport};
//! fn misuse<T: Transport>(t: &mut T, mr: &T::Mr) -> transport_core::Result<()> {
//!     t.post_send(PeerId(0), LocalSlice::all(mr), 0)?; // error: unused `Post`
//!     Ok(())
//! }
//! ```
//! Memory handed to a region belongs to it; it is not reachable afterwards:
//! ```compile_fail
//! use transport_core::{HostBuffer, Memory, Transport};
//! fn misuse<T: Transport>(t: &mut T) -> transport_core::Result<()> {
//!     let buf = HostBuffer::new(4096);
//!     let _mr = t.register(Memory::Host(buf))?;
//!     let _ = buf.to_vec(); // error: use of moved value
//!     Ok(())
//! }
//! ```
//! A region lends no slice of its bytes, which a NIC may change while it lives; it copies
//! them (`Memory::read_at`, `HostBuffer::to_vec`):
//! ```compile_fail
//! use transport_core::MemoryRegion;
//! fn misuse<M: MemoryRegion>(mr: &M) -> Option<&[u8]> {
//!     mr.memory().host().map(|h| h.as_slice()) // error: no method `as_slice`
//! }
//! ```
//! ```compile_fail
//! use transport_core::MemoryRegion;
//! fn misuse<M: MemoryRegion>(mr: &mut M) -> Option<&mut [u8]> {
//!     mr.memory_mut().host_bytes() // error: no method `host_bytes`
//! }
//! ```
//! ```compile_fail
//! use transport_core::{Memory, MemoryRegion};
//! fn misuse<M: MemoryRegion>(mr: &M) -> Option<&mut [u8]> {
//!     match mr.memory() {
//!         Memory::Host(h) => Some(h.as_mut_slice()), // error: `h` is a shared reference
//!         Memory::Gpu(_) => None,
//!     }
//! }
//! ```

mod backend;
mod error;
mod mem;
pub mod skip;
mod types;
pub mod wait;

pub use backend::{
    check_options, mapped_library, BackendInfo, Finding, FindingStatus, OptionInfo, OptionsEnv,
    Probe, ProbeAsk, ProviderInfo, Runtime,
};
pub use error::{hint, CompletionError, Error, Op, Result};
#[cfg(feature = "cuda")]
pub use mem::{
    cuda_context, cuda_current_device, cuda_device_count, cuda_driver_present, cuda_enter_device,
};
pub use mem::{
    dmabuf_range, make_gpu_visible, Dmabuf, DmabufRange, GpuBuffer, GpuDirectFlush, HostBuffer,
    Landing, Memory, MemoryMut, FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST,
    GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER, PAGE,
};
pub use types::{
    Caps, Completion, CompletionKind, EndpointAddr, KeyBytes, LocalSlice, NicDesc, PeerId, Post,
    RemoteMr, RemoteRegion, RemoteSlice, WriteOp,
};

/// A registered memory region owned by one endpoint's domain.
///
/// The region owns its [`Memory`]; dropping it deregisters it. Hand it back with
/// [`Transport::deregister`] to get the memory back.
///
/// An implementation lends its memory only as `&Memory` and [`MemoryMut`], never as
/// `&mut Memory` or `&mut HostBuffer`: [`HostBuffer::as_mut_slice`] is sound because only a
/// buffer's owner, with no region holding it, can call it.
pub trait MemoryRegion: Send {
    /// The registered memory: its bytes are copied out ([`Memory::read_at`]), never lent.
    fn memory(&self) -> &Memory;
    /// Writes into the registered bytes (to fill a buffer before a send), as copies
    /// ([`MemoryMut::write_at`]). The memory itself cannot be swapped out: peers may write
    /// into it until it is deregistered.
    fn memory_mut(&mut self) -> MemoryMut<'_>;
    /// What a peer needs to WRITE into this region. Serializable; send it over any channel.
    fn remote(&self) -> RemoteMr;
    /// Length in bytes.
    fn len(&self) -> usize {
        self.memory().len()
    }
    /// Whether the region is empty (never true for a registered region).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A bounds-checked local slice of this region for a post.
    fn slice(&self, offset: usize, len: usize) -> Result<LocalSlice<'_, Self>>
    where
        Self: Sized,
    {
        LocalSlice::new(self, offset, len)
    }
}

/// One endpoint on one NIC.
///
/// The lifecycle is: [`open`](Transport::open), exchange [`address`](Transport::address)es out
/// of band, [`add_peer`](Transport::add_peer), [`register`](Transport::register) memory and
/// exchange [`RemoteMr`]s, [`import`](Transport::import) each peer's once, then post and
/// [`poll`](Transport::poll) (the crate docs show it in code).
pub trait Transport: Send + Sized {
    /// The backend's registered memory region.
    type Mr: MemoryRegion;

    /// What the backend says about itself: its name, help, providers, options, NIC driver,
    /// and what a node check should ask of it (see [`BackendInfo`]).
    const INFO: &'static BackendInfo;

    /// Backend name as users type it ([`BackendInfo::name`]).
    const BACKEND: &'static str = Self::INFO.name;

    /// A peer's remote key as this endpoint's WRITEs carry it, read once from the key bytes
    /// by [`import`](Transport::import): the integer key itself where keys are integers (efa
    /// `u64`, verbs `u32`), so a post pays nothing for keys being opaque on the wire. A
    /// backend whose keys are handles that must be freed (UCX's `ucp_ep_rkey_unpack` gives an
    /// `ucp_rkey_h` that `ucp_rkey_destroy` must free before the peer's `ucp_ep` goes) keeps
    /// them in the endpoint and frees them with it (or with the peer); its `RemoteKey` is a
    /// token into that table, which its posts check, so a stale or foreign one is a refused
    /// post, never a dangling handle.
    type RemoteKey: Copy + Send + Sync + std::fmt::Debug + 'static;

    /// Open an endpoint on the NIC `nic` describes.
    fn open(nic: &NicDesc) -> Result<Self>;

    /// The provider (libfabric) or device (verbs) actually opened, e.g. `"shm"`, `"rxe0"`.
    fn provider(&self) -> &str;

    /// The NIC (libfabric domain, verbs device) actually opened, e.g. `"rdmap79s0"`.
    fn nic_name(&self) -> &str;

    /// What the next peer needs to reach this endpoint; send it over any channel.
    ///
    /// Connected backends (verbs RC) hand out a fresh queue pair per peer: exchange addresses
    /// pairwise, calling `address()` then `add_peer()` once per peer, in that order.
    fn address(&self) -> EndpointAddr;

    /// Add a peer from its address bytes. Garbage or wrong-length bytes are an error.
    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId>;

    /// Register memory (host or GPU) for local use and remote writes.
    fn register(&mut self, mem: Memory) -> Result<Self::Mr>;

    /// Deregister a region and get its memory back. A backend whose provider may still
    /// write into the memory after it (operations of this endpoint in flight) returns an
    /// error instead, and the region is dropped: it is freed once nothing uses it.
    fn deregister(&mut self, mr: Self::Mr) -> Result<Memory>;

    /// Read a peer's [`RemoteMr`] (from [`MemoryRegion::remote`] on the peer's side) for
    /// WRITEs from this endpoint to `peer`: its key bytes are checked and turned into
    /// [`Self::RemoteKey`] here, once, off the post path.
    ///
    /// An unknown peer, key bytes of another backend, or a region that wraps the address
    /// space is an error. Key bytes of the right form that name no region of the peer need
    /// not be (the peer alone knows its keys): a WRITE to them fails as a wrong key does,
    /// with an error completion (or, where [`Caps::remote_write_errors`] is false, a refusal
    /// at the target).
    ///
    /// The region is for `peer` on this endpoint only: post it to that peer.
    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<Self::RemoteKey>>;

    /// Post a SEND of `buf` to `peer`.
    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, Self::Mr>, ctx: u64) -> Result<Post>;

    /// Post a receive buffer for one incoming SEND (from any peer).
    fn post_recv(&mut self, buf: LocalSlice<'_, Self::Mr>, ctx: u64) -> Result<Post>;

    /// Post an RDMA WRITE of `buf` into `remote` on `peer`, with an optional 32-bit immediate.
    /// `remote` is a slice of a region [`import`](Transport::import)ed for `peer` on this
    /// endpoint.
    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, Self::Mr>,
        remote: RemoteSlice<Self::RemoteKey>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post>;

    /// Post many WRITEs. Returns how many were accepted, in order; fewer than `ops.len()`
    /// means the queue filled: poll, then post the rest.
    fn post_writes(&mut self, ops: &[WriteOp<'_, Self::Mr, Self::RemoteKey>]) -> Result<usize> {
        for (i, op) in ops.iter().enumerate() {
            if self.post_write(op.peer, op.local, op.remote, op.imm, op.ctx)? == Post::QueueFull {
                return Ok(i);
            }
        }
        Ok(ops.len())
    }

    /// Poll completions into `out`; returns how many were written. Never blocks.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;

    /// What this endpoint can do.
    fn caps(&self) -> &Caps;

    /// Make the bytes that operations completed (and polled) so far put into `mr` visible to
    /// work its GPU runs next: a consumer kernel, a copy on any stream (see the crate docs,
    /// "GPU memory and the consumer kernel"). Call it once after the completions that
    /// announce the bytes, before launching that work; host memory needs nothing and returns
    /// at once.
    ///
    /// Backends decide from how their provider moved the bytes ([`Landing`]): a NIC's
    /// GPUDirect RDMA writes get the device's flush ([`GpuDirectFlush`]); copies a provider
    /// made with CUDA have run already. An error says the GPU cannot make them visible (a
    /// driver without `cuFlushGPUDirectRDMAWrites` on a GPU that does not order them).
    /// Not for the post/poll path: a consumer calls it when it is about to read, and where a
    /// flush is needed it is a blocking driver call.
    fn make_gpu_visible(&mut self, mr: &Self::Mr) -> Result<()>;

    /// How the backend opened the endpoint, in one line for logs: settings that decide how it
    /// behaves on real hardware (efa: fabric, API version, threading model, shm, CUDA API,
    /// PCI address; verbs: the GID choice, the traffic class, relaxed ordering); empty where
    /// it has nothing to add to [`Transport::provider`] and [`Transport::nic_name`].
    fn details(&self) -> String {
        String::new()
    }

    /// What this endpoint runs on: the library loaded (name, version, file), the provider,
    /// fabric and NIC opened, the NIC's firmware where readable, and the settings that decide
    /// how it behaves. For run records and peers; not on the hot path.
    fn runtime(&self) -> Runtime;
}
