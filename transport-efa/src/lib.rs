//! The libfabric backend of [`transport_core`]: one [`Endpoint`] is one `FI_EP_RDM`
//! endpoint on one libfabric domain.
//!
//! The provider is chosen at run time, by name ([`NicDesc::provider`]; `efa`, the AWS
//! Elastic Fabric Adapter, where none is named): `shm` (same host, shared memory) or `tcp`
//! (sockets; on libfabric 1.17 its RDM endpoint is `tcp;ofi_rxm`). The NIC is the
//! libfabric domain named in [`NicDesc::device`] (`rdmap79s0`, `lo`, `eth0`); `None` takes
//! the provider's first.
//!
//! ```no_run
//! use transport_core::{wait::wait_pair, CompletionKind, HostBuffer, LocalSlice, Memory,
//!                      MemoryRegion, NicDesc, Transport};
//! use transport_efa::Endpoint;
//! # fn main() -> transport_core::Result<()> {
//! let mut a = Endpoint::open(&NicDesc::provider("shm"))?;
//! let mut b = Endpoint::open(&NicDesc::provider("shm"))?;
//! let to_b = a.add_peer(&b.address())?;
//! b.add_peer(&a.address())?;
//! let src = a.register(Memory::Host(HostBuffer::from_slice(b"hello")))?;
//! let dst = b.register(Memory::Host(HostBuffer::new(5)))?;
//! let remote = a.import(to_b, &dst.remote())?; // the key bytes, read once
//! let _ = a.post_write(to_b, LocalSlice::all(&src), remote.all(), Some(42), 1)?;
//! wait_pair(&mut a, &mut b, "write", std::time::Duration::from_secs(5), |side, c| {
//!     c.check()?;
//!     Ok(side == 1 && c.kind == CompletionKind::RemoteWrite { imm: 42 })
//! })?;
//! assert_eq!(dst.memory().host().map(|h| h.to_vec()), Some(b"hello".to_vec()));
//! # Ok(()) }
//! ```
//!
//! Two endpoints of one process (as here, and `rdma-bench loopback`): poll each once after
//! both `add_peer` calls and before either posts from another thread, or posts something
//! larger than an inject. libfabric 2.6's `shm` counts a side connected once it processed
//! its peer's connection request, while the peer records where it mapped that side's
//! region only when it processes that side's own: a command the peer must hand back (a
//! delivery-complete WRITE, a message above the inject size) posted in between carries an
//! address computed from 0, and the peer dies of SIGSEGV on its next poll
//! (`tests/shm_same_process.rs` shows both orders). Between processes nothing is needed.
//!
//! GPU memory: a thread that posts or polls on an endpoint with GPU memory registered needs
//! the device's CUDA context current ([`transport_core::cuda_enter_device`]), not only the
//! thread that registered it. shm takes its CUDA IPC handles on the posting thread; from a
//! thread without a context it copies through host bounce buffers instead ("unable to use
//! IPC for msg, fallback to using SAR" at `FI_LOG_LEVEL=warn`, silent otherwise) until a
//! CUDA runtime call makes one current there (`tests/gpu_ipc.rs` shows both).
//!
//! # Options ([`NicDesc::options`])
//! - `mr_mode=strict`: ask the provider for EFA's memory registration mode
//!   (`FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY`), so that `tcp` and
//!   `shm` run the code paths `efa` needs. [`Endpoint::mr_mode`] says what was granted.
//! - `hmem=auto|on|off`: ask for `FI_HMEM` (GPU memory). `auto` (default) asks where a CUDA
//!   device is present, unless [`NicDesc::gpu_memory`] says the endpoint registers host memory
//!   only, and falls back to host memory only; `on` fails to open without it. Asking has a
//!   price on `shm`: an endpoint with `FI_HMEM` gets no single-copy (CMA) path for host memory.
//! - `write_completion=auto|delivery|transmit`: when a WRITE completes at the initiator.
//!   `delivery` (`FI_DELIVERY_COMPLETE`: the target has the data, so a bad key or range comes
//!   back as an error completion) is the default everywhere but `efa`, whose device
//!   acknowledgement already reports remote failures, and `shm`, which reports none either
//!   way and pays for `delivery` with its slow segmented protocol up to 4 KiB (both
//!   `transmit`, the provider default).
//! - `fabric=NAME`: only that libfabric fabric (e.g. `efa-direct`; by default `efa` prefers
//!   the `efa` fabric, the full RDM protocol).
//! - `shm=off|on`: whether the efa provider may hand same-host peers to its shm
//!   sub-provider (`FI_OPT_SHARED_MEMORY_PERMITTED`). Off by default, so a run between
//!   endpoints of one host measures the NIC, not memory copies.
//! - `cuda_api=auto|on|off`: `FI_OPT_CUDA_API_PERMITTED`. `auto` forbids the provider's own
//!   CUDA calls on efa where GPU memory may be registered (every GPU byte then moves by
//!   GPUDirect RDMA; where the device cannot, GPU memory is refused saying why) and leaves
//!   other providers alone (shm's GPU path is CUDA calls).
//! - `gpu_ipc=on|off`: register GPU memory with `FI_HMEM_DEVICE_ONLY` (on), which shm needs
//!   to move it between processes by CUDA IPC; `off` for peers in the same process, where
//!   IPC cannot work and shm copies through the host instead.
//! - `rx_cq_data=auto|on`: `on` takes the `FI_RX_CQ_DATA` path (below) on any provider,
//!   for tests.
//!
//! # NICs
//! [`NicDesc::pci`] picks the domain at that PCI function (`fi_info->nic->bus_attr`), as
//! NIXL and pplx-garden match a GPU's NICs; [`NicDesc::device`] names a domain, or an ibverbs
//! device whose efa domain carries a suffix (`rdmap79s0` is `rdmap79s0-rdm`). Nothing
//! matching is an error that lists every domain offered with its PCI address ([`match_nic`],
//! [`Endpoint::domains`]).
//!
//! # Environment
//! - `FI_TCP_IFACE=lo` keeps the `tcp` provider on the loopback interface.
//! - Build: `PKG_CONFIG_PATH=/opt/amazon/efa/lib/pkgconfig` builds against the EFA
//!   installer's libfabric 2.x; `LIBCLANG_PATH` points bindgen at libclang (see
//!   `libfabric-sys`).
//!
//! # Behaviour
//! - Memory registration follows the `mr_mode` the provider returned: descriptors are always
//!   passed (`FI_MR_LOCAL`), the remote address is the virtual address under
//!   `FI_MR_VIRT_ADDR` and an offset otherwise ([`RemoteMr::addr`] is then 0), keys are the
//!   provider's under `FI_MR_PROV_KEY` and our own unique ones otherwise, regions are bound
//!   to the endpoint and enabled under `FI_MR_ENDPOINT`. A key travels as its 8 bytes
//!   ([`KeyBytes::from_u64`]); [`Transport::import`] reads them back into the `u64` every
//!   WRITE carries (`Transport::RemoteKey`), so a post costs what it did with integer keys.
//! - Every operation's context is a slot of a fixed slab (see `slab.rs`): posting and polling
//!   allocate nothing, take no lock of ours and make no system call of their own. A full slab
//!   or `-FI_EAGAIN` is [`Post::QueueFull`].
//! - WRITE with immediate is `fi_writemsg` with `FI_REMOTE_CQ_DATA`; the target gets one
//!   completion (flags `FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA`) and the application posts no
//!   receive for it. Where the provider wants a receive posted for every immediate
//!   (`FI_RX_CQ_DATA`: efa-direct on devices without unsolicited write receive), the
//!   endpoint opens a second libfabric endpoint for WRITEs to land on, keeps zero-length
//!   receives posted there and reposts each from `poll`; its address carries both names.
//! - The API version asked is the highest both the library and the headers know (efa keeps
//!   device RDMA on from 1.18 and takes dmabufs from 1.20), never below 1.17
//!   ([`EndpointInfo::api_version`]).
//! - The domain is opened `FI_THREAD_DOMAIN`: the endpoint serializes its own calls, so the
//!   provider takes no lock per operation. A [`MemoryRegion`] is `Send` and may be dropped
//!   (deregistered) on another thread while the endpoint is polled: providers guard their
//!   registration maps with the domain's own lock whatever the threading model.
//! - Progress is manual: poll every endpoint taking part in a transfer.
//!
//! # Known provider limits (libfabric 1.17)
//! - `shm` guards its shared-memory queues with process-shared spinlocks. A peer process
//!   killed while it holds one leaves this side spinning inside `fi_cq_read` forever: no
//!   timeout of the caller can interrupt a call that does not return. `rdma-bench` guards
//!   against it with a watchdog on its control connection; an application using `shm`
//!   between processes that may die needs the same. `tcp` reports a dead peer as an error
//!   completion ("Connection reset by peer").
//! - `shm` drops a WRITE whose key or range the target cannot verify without answering the
//!   initiator. Before 2.6, a WRITE that waits for the target's answer (any size with
//!   `write_completion=delivery` on 1.17 and 2.1.0; above the 4 KiB inject size at the
//!   default transmit completion too on 2.1.0) then never completes, nor does any later
//!   operation to that peer; the others complete as sent and the pair goes on working, and
//!   2.6 recovers in every case (`tests/conformance_shm.rs`). `tcp` grants
//!   no memory registration mode bits at all, so `mr_mode=strict` is a request there.

#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod about; // what the backend says about itself: INFO, the doctor's probe, an endpoint's runtime
mod addr; // peers' addresses: add_peer, the AV, each post's destination
mod cq; // the completion path: a CQ entry as a Completion, an error entry
mod domain; // the fabric and domain, shared by the endpoint and its regions
mod endpoint; // Endpoint, EndpointInfo, and impl Transport: the table of contents
mod error; // libfabric return codes as transport_core errors
mod gpu; // GPU memory registration: a dmabuf, or the device address
mod grave; // regions dropped while their endpoint lives, closed once nothing uses them
mod imm; // receives for immediates, where the provider wants them (FI_RX_CQ_DATA)
mod mr; // MrMode, Mr, and registration
mod nic; // matching a NIC to a domain: Pci, DomainInfo, match_nic
mod open; // opening an endpoint: its objects, the endpoint options, the limits
mod options; // the backend options of NicDesc::options
mod post; // the post path: its checks, one WRITE, a post's return code
mod select; // fi_getinfo, the API version and threading model, the entry chosen
mod shm; // the shm provider's regions in /dev/shm; exit_abandoning_endpoints
mod slab; // operation contexts, a fixed slab

use transport_core::{BackendInfo, ProviderInfo};
// Named by the crate docs.
#[cfg(doc)]
use transport_core::{KeyBytes, MemoryRegion, NicDesc, Post, RemoteMr, Transport};

pub use crate::about::{libfabric_release, probe};
pub use crate::endpoint::{Endpoint, EndpointInfo};
pub use crate::imm::MAX_IMM_RECVS;
pub use crate::mr::{Mr, MrMode};
pub use crate::nic::{match_nic, DomainInfo, Pci};
pub use crate::shm::{
    exit_abandoning_endpoints, remove_shm_regions_of, remove_shm_regions_of_this_process,
    shm_regions_of,
};

/// This backend, as `Transport::INFO` gives it (the parts in `about.rs`).
pub(crate) const INFO: BackendInfo = BackendInfo {
    // Named after the library, not its efa provider: a run over shm or tcp prints
    // `libfabric/shm`, and only one over the efa provider says `libfabric/efa`. `efa`, its
    // name before, is still accepted (`--backend efa`, `compare --pairs efa:shm`, a peer's
    // hello).
    name: "libfabric",
    aliases: &["efa"],
    help: "libfabric: AWS EFA (--provider efa), and the shm and tcp providers anywhere",
    library: "libfabric",
    provider: Some(ProviderInfo {
        names: "efa, shm, tcp, verbs;ofi_rxm",
        loopback_default: "shm",
        env: about::provider_env,
    }),
    devices: "domains: rdmap79s0-rdm on efa, or its device rdmap79s0",
    nic_driver: about::nic_driver,
    options: about::OPTIONS,
    options_env: None,
    // Both sides in one process: shm cannot move GPU memory between them by CUDA IPC (CUDA
    // opens no handle in the process that made it), so GPU regions are registered without
    // FI_HMEM_DEVICE_ONLY and shm copies through the host (tests/gpu_ipc.rs).
    same_process_gpu: &[("gpu_ipc", "off")],
    probe: Some(about::probe),
    exit_abandoning: Some(shm::exit_abandoning_endpoints),
};

/// Largest single message or WRITE offered, even where the provider reports no limit
/// (`SIZE_MAX`): 1 GiB, the EFA device's RDMA limit. Larger transfers are split by the caller.
pub const MAX_TRANSFER: usize = 1 << 30;

/// Raw handles for the benchmark that compares this backend with bare libfabric calls.
/// Not a supported API: nothing outside this crate's benches should use it.
#[doc(hidden)]
pub mod raw {
    pub use libfabric_sys as sys;

    /// An endpoint's libfabric objects and the flags its WRITEs carry.
    #[derive(Clone, Copy, Debug)]
    pub struct Parts {
        pub ep: *mut sys::fid_ep,
        pub cq: *mut sys::fid_cq,
        pub write_flags: u64,
    }
}
