//! The libfabric backend of [`transport_core`]: one [`Endpoint`] is one `FI_EP_RDM`
//! endpoint on one libfabric domain.
//!
//! The provider is chosen at run time: `efa` where present (AWS Elastic Fabric Adapter),
//! otherwise the one named in [`NicDesc::provider`]: `shm` (same host, shared memory) or
//! `tcp` (sockets; on libfabric 1.17 its RDM endpoint is `tcp;ofi_rxm`). The NIC is the
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
//! let _ = a.post_write(to_b, LocalSlice::all(&src), dst.remote().all(), Some(42), 1)?;
//! wait_pair(&mut a, &mut b, "write", std::time::Duration::from_secs(5), |side, c| {
//!     c.check()?;
//!     Ok(side == 1 && c.kind == CompletionKind::RemoteWrite { imm: 42 })
//! })?;
//! assert_eq!(dst.memory().host().map(|h| h.as_slice()), Some(&b"hello"[..]));
//! # Ok(()) }
//! ```
//!
//! # Options ([`NicDesc::options`])
//! - `mr_mode=strict`: ask the provider for EFA's memory registration mode
//!   (`FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY`), so that `tcp` and
//!   `shm` run the code paths `efa` needs. [`Endpoint::mr_mode`] says what was granted.
//! - `hmem=auto|on|off`: ask for `FI_HMEM` (GPU memory). `auto` (default) asks where a CUDA
//!   device is present and falls back to host memory only; `on` fails to open without it.
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
//!   to the endpoint and enabled under `FI_MR_ENDPOINT`.
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
//!   initiator. A WRITE that waits for the target's answer (above 4 KiB, or any size with
//!   `write_completion=delivery`) then never completes, nor does any later operation to that
//!   peer; one of up to 4 KiB under the default transmit completion completes as sent and
//!   the pair goes on working (`tests/conformance_shm.rs`). `tcp` grants
//!   no memory registration mode bits at all, so `mr_mode=strict` is a request there.

#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod domain;
mod error;
mod gpu;
mod imm;
mod mr;
mod nic;
mod options;
mod select;
mod shm;
mod slab;

use std::ffi::c_void;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libfabric_sys as fi;
use transport_core::{
    Caps, Completion, CompletionError, CompletionKind, EndpointAddr, Error, LocalSlice, Memory,
    NicDesc, Op, PeerId, Post, RemoteSlice, Result, Transport, WriteOp,
};

// Named by the crate docs.
#[cfg(doc)]
use transport_core::{MemoryRegion, RemoteMr};

use crate::domain::{Domain, Fabric, NEXT_DOMAIN_ID};
use crate::error::{provider, runtime_version};
use crate::imm::ImmRecvs;
use crate::mr::RegisterOn;
use crate::options::{CudaApi, Options, WriteCompletion};
use crate::select::Selected;
use crate::slab::{Kind, Slab};

pub use crate::mr::{Mr, MrMode};
pub use crate::nic::{match_nic, DomainInfo, Pci};
pub use crate::shm::{
    exit_abandoning_endpoints, remove_shm_regions_of, remove_shm_regions_of_this_process,
    shm_regions_of,
};

/// Largest single message or WRITE offered, even where the provider reports no limit
/// (`SIZE_MAX`): 1 GiB, the EFA device's RDMA limit. Larger transfers are split by the caller.
pub const MAX_TRANSFER: usize = 1 << 30;

/// Most operations kept in flight per direction, whatever depth the provider reports.
const MAX_DEPTH: usize = 16 * 1024;
/// Depth assumed where the provider reports none.
const DEFAULT_DEPTH: usize = 256;
/// Completions read per `fi_cq_read`.
const POLL_BATCH: usize = 32;

/// A libfabric `FI_EP_RDM` endpoint with its completion queue and address vector.
///
/// See the [crate documentation](crate) for how it is opened and what it guarantees.
pub struct Endpoint {
    ep: *mut fi::fid_ep,
    cq: *mut fi::fid_cq,
    av: *mut fi::fid_av,
    /// Operation contexts; freed after `ep` is closed (Drop closes, then fields drop).
    slab: Slab,
    /// The data endpoint and its receives, where immediates need posted receives
    /// (`FI_RX_CQ_DATA`, see `imm.rs`); closed in Drop with `ep`.
    imm: Option<ImmRecvs>,
    /// The buffer those receives point into; deregistered after the data endpoint closed.
    imm_mr: Option<Mr>,
    domain: Arc<Domain>,
    /// Where SENDs to each peer go.
    peers: Vec<fi::fi_addr_t>,
    /// Where WRITEs to each peer go: its data endpoint where it has one, else `peers`.
    write_peers: Vec<fi::fi_addr_t>,
    addr: EndpointAddr,
    /// Length of one endpoint's own address (the message endpoint's).
    own_addr_len: usize,
    addr_format: u32,
    provider: String,
    fabric: String,
    nic: String,
    caps: Caps,
    mr_mode: MrMode,
    requested_mr_mode: MrMode,
    /// Completion semantics added to every WRITE (`FI_DELIVERY_COMPLETE` or nothing).
    write_flags: u64,
    /// Flags of GPU memory registrations (`FI_HMEM_DEVICE_ONLY` unless `gpu_ipc=off`).
    hmem_flags: u64,
    gpu_reason: Option<String>,
    /// Send the provider's connection request from `add_peer` (see [`Endpoint::announce`]).
    announce_peers: bool,
    info: EndpointInfo,
}

/// How an endpoint was opened: the settings that decide how it behaves on real hardware,
/// for logs and tests ([`Endpoint::info`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// The libfabric API version asked of `fi_getinfo` (`major.minor`): the highest both
    /// the loaded library and the headers know, so the efa provider keeps device RDMA on and
    /// accepts dmabuf registrations (1.18 and 1.20 turn those on).
    pub api_version: String,
    /// The threading model granted (`FI_THREAD_DOMAIN` asked; see the crate docs).
    pub threading: &'static str,
    /// Whether the provider may move this endpoint's traffic to same-host peers through
    /// shared memory: `Some(false)` where `FI_OPT_SHARED_MEMORY_PERMITTED` was set off (efa
    /// by default, so a same-host run measures the NIC), `None` where the provider does not
    /// take the option (it uses no shm of its own, or predates 1.18).
    pub shm_permitted: Option<bool>,
    /// `FI_OPT_CUDA_API_PERMITTED` as set, where it was set (GPU memory on efa: `false`).
    pub cuda_api_permitted: Option<bool>,
    /// Whether the provider emulates WRITEs over SENDs (`FI_OPT_EFA_EMULATED_WRITE`), where
    /// it says.
    pub emulated_write: Option<bool>,
    /// Whether a peer's WRITE with immediate consumes a posted receive (`FI_RX_CQ_DATA`):
    /// then immediates go to a data endpoint of their own, with receives posted for them.
    pub rx_cq_data: bool,
    /// The NIC's PCI function, where the provider reports it.
    pub pci: Option<Pci>,
}

impl fmt::Display for EndpointInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yn = |b: Option<bool>| match b {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        write!(
            f,
            "api {}, {}, shm {}, cuda api {}, emulated write {}, rx_cq_data {}",
            self.api_version,
            self.threading,
            yn(self.shm_permitted),
            yn(self.cuda_api_permitted),
            yn(self.emulated_write),
            if self.rx_cq_data { "yes" } else { "no" }
        )?;
        if let Some(p) = self.pci {
            write!(f, ", PCI {p}")?;
        }
        Ok(())
    }
}

// SAFETY: the endpoint owns its libfabric objects; every call on them takes `&mut self`, so
// one thread at a time uses them (FI_THREAD_DOMAIN's contract), and regions that may be
// dropped elsewhere only touch the provider's registration map, which it guards with the
// domain's own lock (see `select::THREADING`). The slab's slots and the immediate receives'
// contexts are only touched through `&mut self`.
unsafe impl Send for Endpoint {}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("fabric", &self.fabric)
            .field("nic", &self.nic)
            .field("mr_mode", &self.mr_mode)
            .field("addr", &self.addr)
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Endpoint first (it references the CQ and AV), then AV and CQ; the domain and fabric
        // close when the last region lets go of them.
        // SAFETY: each pointer is NULL or an object opened in `open`, closed once here.
        unsafe {
            if let Some(imm) = &self.imm {
                if !imm.ep.is_null() {
                    fi::rs_fi_close(fi::rs_fi_ep_fid(imm.ep));
                }
            }
            if !self.ep.is_null() {
                fi::rs_fi_close(fi::rs_fi_ep_fid(self.ep));
            }
            if !self.av.is_null() {
                fi::rs_fi_close(fi::rs_fi_av_fid(self.av));
            }
            if !self.cq.is_null() {
                fi::rs_fi_close(fi::rs_fi_cq_fid(self.cq));
            }
        }
    }
}

/// Hint for failures while opening.
fn open_hint(v: &select::View) -> String {
    format!(
        "opening provider {} on domain {} (fabric {}, libfabric {}) failed; check the device \
         and its permissions, or choose another provider/device",
        v.prov_name,
        v.domain_name,
        v.fabric_name,
        runtime_version()
    )
}

fn check(call: &'static str, ret: i32, v: &select::View) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(provider(call, ret.into(), open_hint(v)))
    }
}

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

impl Endpoint {
    /// Raw handles (see [`raw`]); the endpoint keeps owning them.
    #[doc(hidden)]
    pub fn raw_parts(&self) -> raw::Parts {
        raw::Parts {
            ep: self.ep,
            cq: self.cq,
            write_flags: self.write_flags,
        }
    }

    /// The libfabric address of `peer` (see [`raw`]).
    #[doc(hidden)]
    pub fn raw_peer(&self, peer: PeerId) -> Result<fi::fi_addr_t> {
        self.dest(peer)
    }
}

impl Endpoint {
    /// The memory registration mode the provider granted.
    pub fn mr_mode(&self) -> MrMode {
        self.mr_mode
    }

    /// The memory registration mode offered to `fi_getinfo`: [`MrMode::STRICT`] with
    /// `mr_mode=strict`, else [`MrMode::SUPPORTED`] (plus `FI_MR_HMEM` where GPU memory was
    /// asked for). Providers drop the bits they do not need; [`mr_mode`](Self::mr_mode) is
    /// what they kept.
    pub fn requested_mr_mode(&self) -> MrMode {
        self.requested_mr_mode
    }

    /// The libfabric fabric opened (e.g. `efa`, `shm`, `127.0.0.1/32`).
    pub fn fabric_name(&self) -> &str {
        &self.fabric
    }

    /// The libfabric library version in use, as `major.minor`.
    pub fn libfabric_version() -> String {
        runtime_version()
    }

    /// The libfabric version whose headers this crate was built against, as `major.minor`.
    pub fn libfabric_header_version() -> String {
        let (major, minor) = fi::HEADER_VERSION;
        format!("{major}.{minor}")
    }

    /// Every libfabric provider present on this host (any endpoint type), e.g. for a
    /// `--provider` help text.
    pub fn available_providers() -> Vec<String> {
        select::available_providers()
    }

    /// How the endpoint was opened: API version, threading model, shm and CUDA settings,
    /// emulated WRITEs, `FI_RX_CQ_DATA`, the NIC's PCI function.
    pub fn info(&self) -> &EndpointInfo {
        &self.info
    }

    /// What libfabric offers as RDM domains with this backend's capabilities (all providers,
    /// or the one named, e.g. `efa`): what [`NicDesc::device`] and [`NicDesc::pci`] are
    /// matched against ([`match_nic`]).
    pub fn domains(provider: Option<&str>) -> Result<Vec<DomainInfo>> {
        select::offered(provider)
    }

    /// `Ok` where GPU memory can be registered on this endpoint, else
    /// [`Error::Unsupported`] saying why (no `FI_HMEM` in the provider, no CUDA device, ...).
    pub fn gpu_support(&self) -> Result<()> {
        mr::gpu_support(&self.provider, self.gpu_reason.as_deref())
    }

    /// What registering a region needs of this endpoint ([`Mr::register`]).
    fn register_on(&self) -> RegisterOn<'_> {
        RegisterOn {
            domain: &self.domain,
            mr_mode: self.mr_mode,
            provider: &self.provider,
            gpu_reason: self.gpu_reason.as_deref(),
            hmem_flags: self.hmem_flags,
            ep: self.ep,
            data_ep: self.imm.as_ref().map(|i| i.ep).filter(|p| !p.is_null()),
        }
    }

    fn open_inner(nic: &NicDesc) -> Result<Self> {
        let opts = Options::parse(&nic.options)?;
        let sel: Selected = select::select(nic, &opts)?;
        let v = sel.view().clone();
        let info = sel.info();

        let mut fabric_ptr: *mut fi::fid_fabric = ptr::null_mut();
        // SAFETY: info is a live entry of sel's list; fabric_ptr is a valid out pointer.
        let ret = unsafe { fi::rs_fi_fabric(info, &mut fabric_ptr) };
        check("fi_fabric", ret, &v)?;
        let fabric = Fabric(fabric_ptr);
        let mut dom: *mut fi::fid_domain = ptr::null_mut();
        // SAFETY: the fabric was just opened from this info; dom is a valid out pointer.
        let ret = unsafe { fi::rs_fi_domain(fabric.0, info, &mut dom) };
        check("fi_domain", ret, &v)?;
        let domain = Arc::new(Domain {
            ptr: dom,
            id: NEXT_DOMAIN_ID.fetch_add(1, Ordering::Relaxed),
            next_key: AtomicU64::new(1),
            _fabric: fabric,
        });

        let depth = |d: usize| {
            if d == 0 {
                DEFAULT_DEPTH
            } else {
                d.min(MAX_DEPTH)
            }
        };
        let (tx, rx) = (depth(v.tx_size), depth(v.rx_size));
        let max = v.max_msg_size.min(MAX_TRANSFER);
        let write_flags = match opts.write_completion {
            WriteCompletion::Delivery => fi::FI_DELIVERY_COMPLETE,
            WriteCompletion::Transmit => 0,
            // EFA reports a remote failure (bad key, bad range) to the initiator with the
            // device's acknowledgement. shm never reports one, whatever the flags (see
            // `remote_write_errors`), and FI_DELIVERY_COMPLETE only costs there: it moves
            // WRITEs of up to 4 KiB from the inject buffer to the segmented (SAR) protocol
            // (`smr_select_proto`). Elsewhere (tcp) the default completion only says the data
            // left the local buffer, and a remote failure would go unseen.
            WriteCompletion::Auto if matches!(v.core(), "efa" | "shm") => 0,
            WriteCompletion::Auto => fi::FI_DELIVERY_COMPLETE,
        };
        let caps = Caps {
            max_msg_size: max,
            max_write_size: max,
            tx_depth: tx,
            rx_depth: rx,
            inject_size: v.inject_size,
            cq_data_size: v.cq_data_size,
            gpu_memory: sel.gpu_reason.is_none() && v.caps & fi::FI_HMEM != 0,
            link_gbps: (v.link_speed > 0).then(|| v.link_speed as f64 / 1e9),
            remote_write_errors: remote_write_errors(v.core(), write_flags),
        };
        let mut requested_mr_mode = if opts.mr_strict {
            MrMode::STRICT
        } else {
            MrMode::SUPPORTED
        };
        if sel.gpu_reason.is_none() {
            requested_mr_mode.0 |= fi::FI_MR_HMEM;
        }
        let rx_cq_data = (v.mode | v.rx_mode) & fi::FI_RX_CQ_DATA != 0 || opts.rx_cq_data_forced;
        let mut ep = Endpoint {
            ep: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            slab: Slab::new(tx, rx),
            imm: None,
            imm_mr: None,
            domain,
            peers: Vec::new(),
            write_peers: Vec::new(),
            addr: EndpointAddr(Vec::new()),
            own_addr_len: 0,
            addr_format: v.addr_format,
            provider: v.prov_name.clone(),
            fabric: v.fabric_name.clone(),
            nic: v.domain_name.clone(),
            caps,
            mr_mode: MrMode(v.mr_mode),
            requested_mr_mode,
            write_flags,
            hmem_flags: if opts.gpu_ipc {
                fi::FI_HMEM_DEVICE_ONLY
            } else {
                0
            },
            gpu_reason: sel.gpu_reason.clone(),
            announce_peers: v.core() == "shm" && error::runtime_major() >= 2,
            info: EndpointInfo {
                api_version: select::version_string(if v.api_version > 0 {
                    v.api_version
                } else {
                    select::api_version()
                }),
                threading: select::threading_name(v.threading),
                shm_permitted: None,
                cuda_api_permitted: None,
                emulated_write: None,
                rx_cq_data,
                pci: v.pci,
            },
        };
        if v.cq_data_size < select::CQ_DATA_SIZE {
            return Err(Error::Unsupported(format!(
                "provider {} carries only {} bytes of remote CQ data; 4 are needed for \
                 immediates",
                v.prov_name, v.cq_data_size
            )));
        }

        // Remote writes with immediates land in the CQ too, beyond the posted operations:
        // leave room for them.
        let cq_size = ((tx + rx) * 2).max(1024);
        let dom = ep.domain.ptr;
        // SAFETY: dom is the live domain; the out pointers are fields of ep, which closes
        // them on drop if a later step fails.
        unsafe {
            check(
                "fi_cq_open",
                fi::rs_fi_cq_open_data(dom, cq_size, &mut ep.cq),
                &v,
            )?;
            check(
                "fi_av_open",
                fi::rs_fi_av_open_table(dom, 64, &mut ep.av),
                &v,
            )?;
        }
        ep.ep = ep.open_ep(info, &v, &opts)?;
        if rx_cq_data {
            let data = ep.open_ep(info, &v, &opts)?;
            // Owned from here on, so Drop closes it whatever fails next.
            ep.imm = Some(ImmRecvs::new(data, 1, ptr::null_mut(), ptr::null_mut()));
            let mr = ep.register(Memory::Host(transport_core::HostBuffer::new(imm::BUF_LEN)))?;
            let (buf, desc) = mr.raw_buf();
            ep.imm_mr = Some(mr);
            let mut recvs = ImmRecvs::new(data, rx.min(imm::MAX_IMM_RECVS), buf, desc);
            let posted = recvs.post_all();
            ep.imm = Some(recvs);
            if let Err(ret) = posted {
                return Err(provider(
                    "fi_recv",
                    ret as i64,
                    "posting the receives for immediates (FI_RX_CQ_DATA) on the data endpoint \
                     failed",
                ));
            }
        }

        let mut addr = ep.name(ep.ep, &v)?;
        ep.own_addr_len = addr.len();
        if let Some(data) = ep.imm.as_ref().map(|i| i.ep) {
            addr.extend_from_slice(&ep.name(data, &v)?);
        }
        ep.addr = EndpointAddr(addr);
        ep.read_limits();
        Ok(ep)
    }

    /// Open, configure, bind and enable one libfabric endpoint on this endpoint's domain, CQ
    /// and AV (the message endpoint, and the data endpoint where immediates need receives).
    fn open_ep(
        &mut self,
        info: *mut fi::fi_info,
        v: &select::View,
        opts: &Options,
    ) -> Result<*mut fi::fid_ep> {
        let mut raw: *mut fi::fid_ep = ptr::null_mut();
        // SAFETY: the domain is live and info is the entry it was opened from.
        let ret = unsafe { fi::rs_fi_endpoint(self.domain.ptr, info, &mut raw) };
        check("fi_endpoint", ret, v)?;
        // Closes the endpoint if a step below fails.
        struct Guard(*mut fi::fid_ep);
        impl Drop for Guard {
            fn drop(&mut self) {
                if !self.0.is_null() {
                    // SAFETY: an endpoint opened above and not handed out, closed once.
                    unsafe { fi::rs_fi_close(fi::rs_fi_ep_fid(self.0)) };
                }
            }
        }
        let mut guard = Guard(raw);
        // SAFETY: raw is the endpoint just opened; cq and av are open on the same domain.
        unsafe {
            check(
                "fi_ep_bind(cq)",
                fi::rs_fi_ep_bind(
                    raw,
                    fi::rs_fi_cq_fid(self.cq),
                    fi::FI_TRANSMIT | fi::FI_RECV,
                ),
                v,
            )?;
            check(
                "fi_ep_bind(av)",
                fi::rs_fi_ep_bind(raw, fi::rs_fi_av_fid(self.av), 0),
                v,
            )?;
        }
        self.set_options(raw, v, opts)?;
        // SAFETY: raw is bound to its CQ and AV.
        let mut ret = unsafe { fi::rs_fi_enable(raw) };
        // shm names its region after the process id and an endpoint counter, and treats an
        // existing file of that name as busy when its recorded pid is alive or its layout
        // version differs. A region left by a killed process whose pid this process now has
        // (or by another libfabric release) therefore fails fi_enable with -FI_EBUSY on
        // 1.x-2.5; the provider unlinks that stale file in the same failing call, so a second
        // fi_enable creates the region afresh. 2.6 retries under a random name by itself. A
        // live endpoint cannot own the name: it carries this process's pid and a counter this
        // process never reuses.
        if ret == -fi::FI_EBUSY && v.core() == "shm" {
            // SAFETY: as above.
            ret = unsafe { fi::rs_fi_enable(raw) };
        }
        check("fi_enable", ret, v)?;
        guard.0 = ptr::null_mut();
        Ok(raw)
    }

    /// Endpoint options, set before `fi_enable` (efa reads them there).
    ///
    /// - `FI_OPT_SHARED_MEMORY_PERMITTED` off on efa (unless `shm=on`): the efa provider hands
    ///   peers on the same host to its shm sub-provider, so a "same host" efa run would
    ///   measure memory copies, not the NIC. aws-ofi-nccl and pplx-garden turn it off too.
    /// - `FI_OPT_CUDA_API_PERMITTED` off on efa where GPU memory may be registered (as
    ///   aws-ofi-nccl and pplx-garden): every GPU byte then moves by GPUDirect RDMA, never by
    ///   the provider's CUDA copies through the host. Where the device has no peer-to-peer
    ///   path the provider refuses (`-FI_EOPNOTSUPP`), and GPU memory is refused on this
    ///   endpoint with that reason (`cuda_api=on` permits the copies). shm's GPU support is
    ///   CUDA calls, so shm keeps the default unless `cuda_api=off`.
    fn set_options(
        &mut self,
        raw: *mut fi::fid_ep,
        v: &select::View,
        opts: &Options,
    ) -> Result<()> {
        // The option unknown to this provider or library: nothing to set.
        let unknown = |r: i32| r == -fi::FI_ENOPROTOOPT || r == -fi::FI_ENOSYS;
        let gpu = self.gpu_reason.is_none();
        for (opt, want) in endpoint_options(v.core(), gpu, opts) {
            // SAFETY: raw is an open endpoint, not yet enabled.
            let r = unsafe { fi::rs_fi_ep_setopt_bool(raw, opt.optname(), want as i32) };
            match opt {
                EpOpt::SharedMemoryPermitted => {
                    if r == 0 {
                        self.info.shm_permitted = Some(want);
                    } else if !(unknown(r) || want && r == -fi::FI_EINVAL) {
                        return Err(provider(
                            "fi_setopt(FI_OPT_SHARED_MEMORY_PERMITTED)",
                            r.into(),
                            "the efa provider refused the shared-memory setting; report this \
                             with `fi_info -p efa -v`",
                        ));
                    }
                }
                EpOpt::CudaApiPermitted => {
                    if r == 0 {
                        self.info.cuda_api_permitted = Some(want);
                    } else if r == -fi::FI_EOPNOTSUPP && !want {
                        // efa: no peer-to-peer path to the GPU; shm: GPU memory is CUDA calls.
                        self.gpu_reason = Some(format!(
                            "provider {} cannot move GPU memory without calling CUDA itself \
                             (FI_OPT_CUDA_API_PERMITTED=false refused: no GPUDirect RDMA \
                             peer-to-peer path); load nvidia-peermem or use a dmabuf-capable \
                             driver, or allow the provider's CUDA copies with the option \
                             cuda_api=on",
                            v.prov_name
                        ));
                        self.caps.gpu_memory = false;
                    } else if !unknown(r) && r != -fi::FI_EINVAL {
                        return Err(provider(
                            "fi_setopt(FI_OPT_CUDA_API_PERMITTED)",
                            r.into(),
                            format!("provider {} refused the CUDA API setting", v.prov_name),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The address of one of this endpoint's libfabric endpoints.
    fn name(&self, raw: *mut fi::fid_ep, v: &select::View) -> Result<Vec<u8>> {
        let mut name = vec![0u8; 256];
        let mut len = name.len();
        // SAFETY: the endpoint is enabled; name has `len` writable bytes.
        let mut ret =
            unsafe { fi::rs_fi_getname(fi::rs_fi_ep_fid(raw), name.as_mut_ptr().cast(), &mut len) };
        if ret == -(fi::FI_ETOOSMALL as i32) && len > name.len() {
            name.resize(len, 0);
            // SAFETY: as above, with the length the provider asked for.
            ret = unsafe {
                fi::rs_fi_getname(fi::rs_fi_ep_fid(raw), name.as_mut_ptr().cast(), &mut len)
            };
        }
        check("fi_getname", ret, v)?;
        name.truncate(len);
        Ok(name)
    }

    /// The provider's own message and WRITE size limits, where it reports them per endpoint
    /// (`FI_OPT_MAX_MSG_SIZE`, `FI_OPT_MAX_RMA_SIZE`, libfabric >= 1.20), and whether efa
    /// emulates WRITEs. `ep_attr->max_msg_size` is the larger of the two limits: on efa-direct
    /// a SEND is capped at the device's MTU (about 8 KiB) while a WRITE may be 1 GiB.
    fn read_limits(&mut self) {
        let get = |opt: i32| {
            let mut n: usize = 0;
            // SAFETY: ep is enabled; n is a valid out pointer for a size_t.
            let r = unsafe { fi::rs_fi_ep_getopt_size(self.ep, opt, &mut n) };
            (r == 0 && n > 0).then_some(n)
        };
        let (msg, rma) = limits(
            self.caps.max_msg_size,
            get(fi::RS_FI_OPT_MAX_MSG_SIZE),
            get(fi::RS_FI_OPT_MAX_RMA_SIZE),
        );
        (self.caps.max_msg_size, self.caps.max_write_size) = (msg, rma);
        if self.provider.split(';').next() == Some("efa") {
            let mut b: i32 = 0;
            // SAFETY: ep is enabled; b is a valid out pointer.
            let r = unsafe {
                fi::rs_fi_ep_getopt_bool(self.ep, fi::RS_FI_OPT_EFA_EMULATED_WRITE, &mut b)
            };
            if r == 0 {
                self.info.emulated_write = Some(b != 0);
            }
        }
    }

    /// A peer's address as its message endpoint's and, where it has one, its data endpoint's
    /// (see `imm.rs`): an endpoint with a data endpoint publishes both names back to back.
    fn split_address<'a>(&self, bytes: &'a [u8]) -> Result<(&'a [u8], Option<&'a [u8]>)> {
        if self.addr_format == fi::FI_ADDR_STR {
            // Two NUL-terminated strings, or one.
            return Ok(match bytes.iter().position(|&b| b == 0) {
                Some(nul) if nul + 1 < bytes.len() => (&bytes[..=nul], Some(&bytes[nul + 1..])),
                _ => (bytes, None),
            });
        }
        let one = self.own_addr_len;
        Ok(if one > 0 && bytes.len() == 2 * one {
            (&bytes[..one], Some(&bytes[one..]))
        } else {
            (bytes, None)
        })
    }

    /// Insert one address into the AV.
    fn insert(&mut self, bytes: &[u8]) -> Result<fi::fi_addr_t> {
        let mut fi_addr: fi::fi_addr_t = fi::FI_ADDR_UNSPEC_;
        // SAFETY: av is open; bytes holds one address of a length checked by check_address;
        // fi_addr is a valid out pointer for one address.
        let ret =
            unsafe { fi::rs_fi_av_insert(self.av, bytes.as_ptr().cast(), 1, &mut fi_addr, 0) };
        if ret != 1 || fi_addr == fi::FI_ADDR_UNSPEC_ {
            return Err(Error::BadAddress(format!(
                "provider {} did not accept the {}-byte address ({})",
                self.provider,
                bytes.len(),
                if ret < 0 {
                    error::strerror(ret.into())
                } else {
                    format!("fi_av_insert inserted {ret} of 1")
                }
            )));
        }
        Ok(fi_addr)
    }

    /// Check address bytes against the provider's address format before inserting them.
    fn check_address(&self, bytes: &[u8]) -> Result<()> {
        const AF_INET: u16 = 2;
        const AF_INET6: u16 = 10;
        let own = &self.addr.0;
        let fmt = self.addr_format;
        let bad = |what: String| {
            Err(Error::BadAddress(format!(
                "{} bytes are not {what} as provider {} uses",
                bytes.len(),
                self.provider
            )))
        };
        if bytes.is_empty() {
            return Err(Error::BadAddress("empty address".into()));
        }
        // Socket addresses: length and address family must match.
        let shapes: &[(usize, u16)] = if fmt == fi::FI_SOCKADDR_IN {
            &[(16, AF_INET)]
        } else if fmt == fi::FI_SOCKADDR_IN6 {
            &[(28, AF_INET6)]
        } else if fmt == fi::FI_SOCKADDR {
            &[(16, AF_INET), (28, AF_INET6)]
        } else {
            &[]
        };
        if !shapes.is_empty() {
            let family = u16::from_ne_bytes([bytes[0], *bytes.get(1).unwrap_or(&0)]);
            return if shapes
                .iter()
                .any(|&(len, fam)| bytes.len() == len && family == fam)
            {
                Ok(())
            } else {
                bad("a socket address (sockaddr_in/sockaddr_in6)".into())
            };
        }
        if fmt == fi::FI_ADDR_STR {
            // "scheme://...", one NUL at the end; the scheme must be ours.
            let text = match bytes.split_last() {
                Some((0, text)) if !text.contains(&0) => text,
                _ => return bad("a NUL-terminated address string".into()),
            };
            let scheme = |b: &[u8]| {
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|s| s.split_once("://").map(|(s, _)| s.to_string()))
            };
            let ours = scheme(own.split(|&b| b == 0).next().unwrap_or(&[]));
            if scheme(text).is_none() || scheme(text) != ours || bytes.len() > own.len().max(256) {
                return bad(format!("a `{}://` address", ours.unwrap_or_default()));
            }
            return Ok(());
        }
        // Fixed-size binary addresses (FI_ADDR_EFA, ...): the length must be ours.
        if bytes.len() != self.own_addr_len {
            return bad(format!("an address of {} bytes", self.own_addr_len));
        }
        Ok(())
    }

    /// Make the provider send its connection request to a new peer now, before this
    /// endpoint is next polled: a zero-length WRITE, which libfabric 2.x's `shm` answers with
    /// `-FI_EAGAIN` after queueing its request (`smr_verify_peer`).
    ///
    /// Why: in libfabric 2.x's `shm`, a peer endpoint of the same process is mapped by a
    /// shortcut in `smr_map_to_region` that skips `smr_map_to_endpoint`, so the only other
    /// place that records where the peer mapped our region (`peer_data[id].local_region`)
    /// is the processing of our connection request. A side that processes the other's
    /// request first counts itself connected without ever sending its own, and its first
    /// command that the peer must hand back (any delivery-complete WRITE, any message above
    /// the inject size) carries an address computed from 0: the peer dereferences a bare
    /// offset and dies of SIGSEGV in `smr_progress_cmd`. When each side sends its own
    /// request before it polls, both requests are processed and both addresses set.
    ///
    /// Harmless elsewhere: between processes the request just goes out earlier. Where the
    /// pair is already connected (this endpoint processed the peer's request before
    /// `add_peer`), the WRITE executes: zero bytes to key 0, which the target refuses or
    /// ignores, with a context-free completion that [`Transport::poll`] skips. That order
    /// (poll a peer's request before adding it) is the one this cannot repair.
    fn announce(&mut self, dest: fi::fi_addr_t) {
        // SAFETY: ep is enabled and dest was just inserted into its AV; a zero-length WRITE
        // reads no buffer (NULL, no descriptor needed for 0 bytes) and its NULL context is
        // never dereferenced by us (not a slab slot).
        let ret = unsafe {
            fi::rs_fi_write(
                self.ep,
                ptr::null(),
                0,
                ptr::null_mut(),
                dest,
                0,
                0,
                ptr::null_mut(),
            )
        };
        // -FI_EAGAIN is the expected answer; 0 means the pair was already connected; any
        // error shows up again, with its text, on the first real post to this peer.
        let _ = ret;
    }

    /// The destination of `peer`.
    #[inline]
    fn dest(&self, peer: PeerId) -> Result<fi::fi_addr_t> {
        match self.peers.get(peer.0 as usize) {
            Some(&a) => Ok(a),
            None => Err(self.unknown_peer(peer)),
        }
    }

    #[cold]
    #[inline(never)]
    fn unknown_peer(&self, peer: PeerId) -> Error {
        Error::InvalidArgument(format!(
            "unknown peer {}: this endpoint has {} peer(s)",
            peer.0,
            self.peers.len()
        ))
    }

    /// Buffer address and descriptor of a local slice, after checking it is ours and intact.
    #[inline]
    fn local(&self, s: &LocalSlice<'_, Mr>) -> Result<(*mut c_void, *mut c_void)> {
        let mr = s.mr;
        if mr.domain_id != self.domain.id {
            return Err(invalid(format_args!(
                "the local region was registered on another endpoint; register it on the \
                 endpoint that posts"
            )));
        }
        match s.offset.checked_add(s.len) {
            Some(end) if end <= mr.len => {}
            _ => {
                return Err(invalid(format_args!(
                    "local range {}+{} does not fit the {}-byte region",
                    s.offset, s.len, mr.len
                )))
            }
        }
        Ok(((mr.base as usize + s.offset) as *mut c_void, mr.desc))
    }

    /// Map a post's return code; a post that did not happen gives its slot back.
    #[inline(always)]
    fn posted(&mut self, call: &'static str, ret: isize, slot: *mut c_void) -> Result<Post> {
        if ret == 0 {
            Ok(Post::Posted)
        } else {
            self.not_posted(call, ret, slot)
        }
    }

    /// The slow half of [`Self::posted`]: give the slot back and map the return code.
    #[cold]
    #[inline(never)]
    fn not_posted(&mut self, call: &'static str, ret: isize, slot: *mut c_void) -> Result<Post> {
        self.slab.release(slot);
        if ret == -(fi::FI_EAGAIN as isize) {
            Ok(Post::QueueFull)
        } else {
            Err(provider(
                call,
                ret as i64,
                format!("the provider {} refused the operation", self.provider),
            ))
        }
    }

    /// Validate one WRITE; returns (dest, local address, descriptor).
    ///
    /// The hot path: every condition is evaluated without a branch of its own and checked
    /// once; which one failed is worked out again, out of line, only on failure.
    #[inline(always)]
    fn write_args(
        &self,
        peer: PeerId,
        buf: &LocalSlice<'_, Mr>,
        remote: &RemoteSlice,
    ) -> Result<(fi::fi_addr_t, *mut c_void, *mut c_void)> {
        let mr = buf.mr;
        let end = buf.offset.wrapping_add(buf.len);
        let ok = (mr.domain_id == self.domain.id)
            & (end >= buf.offset)
            & (end <= mr.len)
            & (buf.len <= self.caps.max_write_size)
            & (buf.len as u64 <= remote.len);
        match self.write_peers.get(peer.0 as usize) {
            Some(&dest) if ok => Ok((
                dest,
                (mr.base as usize + buf.offset) as *mut c_void,
                mr.desc,
            )),
            _ => Err(self.write_error(peer, buf, remote)),
        }
    }

    /// Why [`Self::write_args`] refused a WRITE (the first failed check, in order).
    #[cold]
    #[inline(never)]
    fn write_error(&self, peer: PeerId, buf: &LocalSlice<'_, Mr>, remote: &RemoteSlice) -> Error {
        if let Err(e) = self.dest(peer) {
            return e;
        }
        if let Err(e) = self.local(buf) {
            return e;
        }
        if buf.len > self.caps.max_write_size {
            return invalid(format_args!(
                "a {}-byte WRITE exceeds the largest the endpoint offers ({} bytes)",
                buf.len, self.caps.max_write_size
            ));
        }
        invalid(format_args!(
            "a {}-byte WRITE does not fit the {}-byte remote range",
            buf.len, remote.len
        ))
    }

    /// Post one WRITE with libfabric flags (FI_MORE for batches).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn write_one(
        &mut self,
        dest: fi::fi_addr_t,
        addr: *mut c_void,
        desc: *mut c_void,
        len: usize,
        remote: &RemoteSlice,
        imm: Option<u32>,
        ctx: u64,
        more: bool,
    ) -> Result<Post> {
        let Some(slot) = self.slab.acquire(Kind::Write, ctx) else {
            return Ok(Post::QueueFull);
        };
        let mut flags = fi::FI_COMPLETION | self.write_flags;
        if more {
            flags |= fi::FI_MORE;
        }
        if imm.is_some() {
            flags |= fi::FI_REMOTE_CQ_DATA;
        }
        // SAFETY: ep is enabled; [addr, addr+len) lies in a region registered on this domain
        // (checked by `local`), which the caller keeps alive until the completion; slot is a
        // slab slot that stays valid until the completion returns it.
        let ret = unsafe {
            fi::rs_fi_writemsg1(
                self.ep,
                addr,
                len,
                desc,
                dest,
                remote.addr,
                remote.key,
                u64::from(imm.unwrap_or(0)),
                slot,
                flags,
            )
        };
        self.posted("fi_writemsg", ret, slot)
    }

    /// Map one successful CQ entry; `None` for entries that are none of ours to report.
    #[inline(always)]
    fn completion(&mut self, e: &fi::fi_cq_data_entry) -> Option<Completion> {
        let remote_data = e.flags & fi::FI_REMOTE_CQ_DATA != 0;
        match self.slab.release(e.op_context) {
            Some((ctx, kind)) => {
                let kind = match kind {
                    Kind::Send => CompletionKind::Send,
                    Kind::Recv => CompletionKind::Recv {
                        len: e.len,
                        imm: remote_data.then_some(e.data as u32),
                    },
                    Kind::Write => CompletionKind::Write,
                    Kind::Free => return None,
                };
                Some(Completion { ctx, kind })
            }
            // No context of ours: a peer's WRITE with immediate landed here.
            None if remote_data => {
                // Under FI_RX_CQ_DATA it consumed one of the data endpoint's receives.
                if let Some(imm) = self.imm.as_mut() {
                    if let Some(i) = imm.index_of(e.op_context) {
                        imm.repost(i);
                    }
                }
                Some(Completion {
                    ctx: 0,
                    kind: CompletionKind::RemoteWrite { imm: e.data as u32 },
                })
            }
            None => {
                // A receive for immediates that completed without one (nothing to report).
                if let Some(imm) = self.imm.as_mut() {
                    if let Some(i) = imm.index_of(e.op_context) {
                        imm.repost(i);
                    }
                }
                None
            }
        }
    }

    /// Read one error entry (after `-FI_EAVAIL`). Allocates: error path only.
    #[cold]
    fn error_completion(&mut self) -> Result<Option<Completion>> {
        let mut e = fi::fi_cq_err_entry::default();
        // SAFETY: cq is open; e is a zeroed entry (err_data_size 0: the provider lends its
        // own buffer for err_data, valid until the next read on this CQ).
        let ret = unsafe { fi::rs_fi_cq_readerr(self.cq, &mut e, 0) };
        if ret == -(fi::FI_EAGAIN as isize) {
            return Ok(None);
        }
        if ret < 0 {
            return Err(provider(
                "fi_cq_readerr",
                ret as i64,
                "the completion queue could not be read",
            ));
        }
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: cq is open; err_data comes from the entry just read and is still valid; buf
        // has buf.len() writable bytes. The returned pointer is buf or a provider string.
        let prov = unsafe {
            let p = fi::rs_fi_cq_strerror(
                self.cq,
                e.prov_errno,
                e.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            );
            error::cstr(p)
        };
        let imm_recv = self.imm.as_ref().and_then(|i| i.index_of(e.op_context));
        let (ctx, op) = match self.slab.release(e.op_context) {
            Some((ctx, kind)) => (ctx, kind.op()),
            None if e.flags & fi::FI_REMOTE_WRITE != 0 || imm_recv.is_some() => {
                (0, Op::RemoteWrite)
            }
            None => (0, Op::Unknown),
        };
        if let (Some(i), Some(imm)) = (imm_recv, self.imm.as_mut()) {
            imm.repost(i);
        }
        let mut msg = error::strerror(e.err.into());
        if !prov.is_empty() && prov != msg {
            msg.push_str(": ");
            msg.push_str(&prov);
        }
        Ok(Some(Completion {
            ctx,
            kind: CompletionKind::Error(Box::new(CompletionError {
                op,
                ctx,
                code: e.err,
                prov_errno: e.prov_errno,
                msg,
            })),
        }))
    }
}

impl Transport for Endpoint {
    type Mr = Mr;

    const BACKEND: &'static str = "efa";

    fn open(nic: &NicDesc) -> Result<Self> {
        Self::open_inner(nic)
    }

    fn provider(&self) -> &str {
        &self.provider
    }

    fn nic_name(&self) -> &str {
        &self.nic
    }

    fn address(&self) -> EndpointAddr {
        self.addr.clone()
    }

    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        let (msg, data) = self.split_address(&addr.0)?;
        self.check_address(msg)?;
        if let Some(d) = data {
            self.check_address(d)?;
        }
        let id = u32::try_from(self.peers.len())
            .map_err(|_| Error::InvalidArgument("too many peers".into()))?;
        let to = self.insert(msg)?;
        let write_to = match data {
            Some(d) => self.insert(d)?,
            None => to,
        };
        self.peers.push(to);
        self.write_peers.push(write_to);
        if self.announce_peers {
            self.announce(to);
            if write_to != to {
                self.announce(write_to);
            }
        }
        Ok(PeerId(id))
    }

    fn register(&mut self, mem: Memory) -> Result<Mr> {
        Mr::register(self.register_on(), mem)
    }

    fn deregister(&mut self, mr: Mr) -> Result<Memory> {
        mr.into_memory()
    }

    #[inline]
    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, Mr>, ctx: u64) -> Result<Post> {
        let dest = self.dest(peer)?;
        let (addr, desc) = self.local(&buf)?;
        if buf.len > self.caps.max_msg_size {
            return Err(Error::InvalidArgument(format!(
                "a {}-byte SEND exceeds the largest message the endpoint offers ({} bytes)",
                buf.len, self.caps.max_msg_size
            )));
        }
        let Some(slot) = self.slab.acquire(Kind::Send, ctx) else {
            return Ok(Post::QueueFull);
        };
        // SAFETY: ep is enabled; the buffer lies in a region of this domain kept alive by
        // the caller until the completion; slot stays valid until the completion.
        let ret = unsafe { fi::rs_fi_send(self.ep, addr, buf.len, desc, dest, slot) };
        self.posted("fi_send", ret, slot)
    }

    #[inline]
    fn post_recv(&mut self, buf: LocalSlice<'_, Mr>, ctx: u64) -> Result<Post> {
        let (addr, desc) = self.local(&buf)?;
        let Some(slot) = self.slab.acquire(Kind::Recv, ctx) else {
            return Ok(Post::QueueFull);
        };
        // SAFETY: as for post_send; FI_ADDR_UNSPEC receives from any peer.
        let ret =
            unsafe { fi::rs_fi_recv(self.ep, addr, buf.len, desc, fi::FI_ADDR_UNSPEC_, slot) };
        self.posted("fi_recv", ret, slot)
    }

    #[inline]
    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, Mr>,
        remote: RemoteSlice,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        let (dest, addr, desc) = self.write_args(peer, &buf, &remote)?;
        self.write_one(dest, addr, desc, buf.len, &remote, imm, ctx, false)
    }

    /// Batched WRITEs: every operation but the last of the batch carries `FI_MORE`, so the
    /// provider may ring the doorbell once. The batch is cut to the free send slots first,
    /// so the last one posted normally carries no `FI_MORE`; where the provider itself says
    /// `-FI_EAGAIN` mid-batch, the operations already posted are flushed by the next post or
    /// poll (progress is manual).
    ///
    /// Every operation is checked before any is posted, so an invalid one fails the call with
    /// nothing posted. A provider error after some were posted returns their count; the error
    /// comes back when the rest is posted.
    #[inline]
    fn post_writes(&mut self, ops: &[WriteOp<'_, Mr>]) -> Result<usize> {
        let n = ops.len().min(self.slab.tx_free());
        for op in &ops[..n] {
            self.write_args(op.peer, &op.local, &op.remote)?;
        }
        for (i, op) in ops[..n].iter().enumerate() {
            let (dest, addr, desc) = self.write_args(op.peer, &op.local, &op.remote)?;
            let more = i + 1 < n;
            match self.write_one(
                dest,
                addr,
                desc,
                op.local.len,
                &op.remote,
                op.imm,
                op.ctx,
                more,
            ) {
                Ok(Post::Posted) => {}
                Ok(Post::QueueFull) => return Ok(i),
                Err(e) if i == 0 => return Err(e),
                Err(_) => return Ok(i),
            }
        }
        Ok(n)
    }

    #[inline]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if let Some(imm) = self.imm.as_mut() {
            imm.retry();
        }
        let mut entries = [const { MaybeUninit::<fi::fi_cq_data_entry>::uninit() }; POLL_BATCH];
        let want = out.len().min(POLL_BATCH);
        // SAFETY: cq is open in FI_CQ_FORMAT_DATA, so each entry is a fi_cq_data_entry;
        // entries has room for `want` of them.
        let ret = unsafe { fi::rs_fi_cq_read(self.cq, entries.as_mut_ptr().cast(), want) };
        if ret > 0 {
            let mut n = 0;
            // ret <= want <= out.len(), so every mapped entry has a place in `out`.
            let mut dst = out.iter_mut();
            for slot in &entries[..(ret as usize).min(want)] {
                // SAFETY: the provider wrote the first `ret` entries (at most `want`).
                let e = unsafe { slot.assume_init_ref() };
                if let Some(c) = self.completion(e) {
                    if let Some(o) = dst.next() {
                        *o = c;
                        n += 1;
                    }
                }
            }
            return Ok(n);
        }
        if ret == 0 || ret == -(fi::FI_EAGAIN as isize) {
            return Ok(0);
        }
        if ret == -(fi::FI_EAVAIL as isize) {
            return match self.error_completion()? {
                Some(c) => {
                    out[0] = c;
                    Ok(1)
                }
                None => Ok(0),
            };
        }
        Err(provider(
            "fi_cq_read",
            ret as i64,
            format!("the completion queue of provider {} failed", self.provider),
        ))
    }

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn details(&self) -> String {
        format!("fabric {}, {}", self.fabric, self.info)
    }
}

/// An endpoint option this backend sets (`fi_setopt`, level `FI_OPT_ENDPOINT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EpOpt {
    /// `FI_OPT_SHARED_MEMORY_PERMITTED`.
    SharedMemoryPermitted,
    /// `FI_OPT_CUDA_API_PERMITTED`.
    CudaApiPermitted,
}

impl EpOpt {
    fn optname(self) -> i32 {
        match self {
            EpOpt::SharedMemoryPermitted => fi::RS_FI_OPT_SHARED_MEMORY_PERMITTED,
            EpOpt::CudaApiPermitted => fi::RS_FI_OPT_CUDA_API_PERMITTED,
        }
    }
}

/// The options set on an endpoint of `core` provider, and their values (see
/// [`Endpoint::set_options`]): on efa, shared memory off unless `shm=on`, and the provider's
/// CUDA calls off where GPU memory may be registered; elsewhere only what `cuda_api` asks.
fn endpoint_options(core: &str, gpu: bool, opts: &Options) -> Vec<(EpOpt, bool)> {
    let efa = core == "efa";
    let mut out = Vec::new();
    if efa {
        out.push((EpOpt::SharedMemoryPermitted, opts.shm_permitted));
    }
    let cuda = match opts.cuda_api {
        CudaApi::Auto if efa => Some(false),
        CudaApi::Auto => None,
        CudaApi::On => Some(true),
        CudaApi::Off => Some(false),
    };
    if let Some(want) = cuda.filter(|_| gpu) {
        out.push((EpOpt::CudaApiPermitted, want));
    }
    out
}

/// Message and WRITE size limits from `ep_attr->max_msg_size` and, where the provider
/// answers them (libfabric >= 1.20), `FI_OPT_MAX_MSG_SIZE` and `FI_OPT_MAX_RMA_SIZE`, capped at
/// [`MAX_TRANSFER`]. On efa-direct `ep_attr->max_msg_size` is the larger of the device's
/// MTU and its RDMA limit (`efa_prov_info.c`), so only the options say that a SEND is capped
/// at the MTU (about 8 KiB) while a WRITE may be 1 GiB.
fn limits(info_max: usize, opt_msg: Option<usize>, opt_rma: Option<usize>) -> (usize, usize) {
    let base = info_max.min(MAX_TRANSFER);
    let pick = |o: Option<usize>| o.filter(|&n| n > 0).map_or(base, |n| n.min(MAX_TRANSFER));
    (pick(opt_msg), pick(opt_rma))
}

/// Whether a WRITE the target refuses comes back to the initiator as an error completion
/// ([`Caps::remote_write_errors`]).
///
/// - `efa`: the device's acknowledgement carries the target's verdict.
/// - Others with `FI_DELIVERY_COMPLETE` (`tcp`): the initiator's completion waits for the
///   target, which answers with an error; without it (`write_completion=transmit`) the
///   completion only says the data left.
/// - `shm`, whatever the flags: the target checks the key and range (`ofi_mr_map_verify` in
///   `smr_progress_cmd_rma`) and drops a bad WRITE, but answers nothing on 1.17 and 2.1 and
///   hands the command back as a success on 2.6 (read in 1.17.1, 2.1.0 and 2.6.0's sources,
///   and run on each; no `mr_mode` bit changes that path). The target memory is safe; the
///   initiator is not told.
fn remote_write_errors(core: &str, write_flags: u64) -> bool {
    match core {
        "shm" => false,
        "efa" => true,
        _ => write_flags & fi::FI_DELIVERY_COMPLETE != 0,
    }
}

/// An invalid-argument error, built out of line: the checks on the post path stay small.
#[cold]
#[inline(never)]
fn invalid(args: fmt::Arguments<'_>) -> Error {
    Error::InvalidArgument(args.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// efa gets shared memory off (a same-host run measures the NIC, not shm's copies) and,
    /// with GPU memory, the provider's CUDA calls off (GPUDirect RDMA or nothing), as
    /// aws-ofi-nccl and pplx-garden set them; no other provider gets either unless asked.
    /// The backend set neither.
    #[test]
    fn endpoint_options_follow_the_provider() {
        let o = |kv: &[(&str, &str)]| {
            let m = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Options::parse(&m).unwrap()
        };
        use EpOpt::*;
        assert_eq!(
            endpoint_options("efa", true, &o(&[])),
            [(SharedMemoryPermitted, false), (CudaApiPermitted, false)]
        );
        assert_eq!(
            endpoint_options("efa", false, &o(&[])),
            [(SharedMemoryPermitted, false)]
        );
        assert_eq!(
            endpoint_options("efa", true, &o(&[("shm", "on"), ("cuda_api", "on")])),
            [(SharedMemoryPermitted, true), (CudaApiPermitted, true)]
        );
        assert_eq!(endpoint_options("shm", true, &o(&[])), []);
        assert_eq!(
            endpoint_options("tcp", false, &o(&[("cuda_api", "off")])),
            []
        );
        assert_eq!(
            endpoint_options("shm", true, &o(&[("cuda_api", "off")])),
            [(CudaApiPermitted, false)]
        );
    }

    /// efa-direct reports `max_msg_size` 1 GiB (the larger of MTU and RDMA limit) while a
    /// SEND is capped at the MTU: the per-endpoint options give each its own limit. The
    /// backend reported 1 GiB for both, so a large SEND failed at the provider.
    #[test]
    fn send_and_write_limits_are_the_providers_own() {
        let gib = 1 << 30;
        assert_eq!(limits(gib, Some(8928), Some(gib)), (8928, gib));
        assert_eq!(limits(usize::MAX, Some(usize::MAX), None), (gib, gib));
        assert_eq!(limits(65536, None, None), (65536, 65536));
        assert_eq!(limits(gib, Some(0), Some(4096)), (gib, 4096));
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;

    fn tcp(hmem: &str) -> NicDesc {
        let mut nic = NicDesc::provider("tcp").with_option("hmem", hmem);
        nic.device = Some("lo".into());
        nic
    }

    /// tcp on libfabric 1.17 has no FI_HMEM: asking for it fails to open, clearly.
    #[test]
    fn hmem_on_without_fi_hmem_is_unsupported() {
        match Endpoint::open(&tcp("on")) {
            Err(Error::Unsupported(m)) => {
                assert!(m.contains("FI_HMEM"), "{m}");
                assert!(m.contains("tcp"), "{m}");
            }
            Ok(ep) => {
                // A libfabric whose tcp has FI_HMEM: then GPU memory is allowed.
                assert!(ep.gpu_support().is_ok());
                assert!(ep.caps().gpu_memory);
            }
            Err(e) => panic!("expected Unsupported, got {e}"),
        }
    }

    /// Without FI_HMEM (or a GPU), an endpoint says why GPU memory cannot be registered.
    #[test]
    fn gpu_support_names_the_reason() {
        let ep = Endpoint::open(&tcp("off")).expect("open tcp");
        assert!(!ep.caps().gpu_memory);
        match ep.gpu_support() {
            Err(Error::Unsupported(m)) => assert!(m.contains("hmem=off"), "{m}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
        let ep = Endpoint::open(&tcp("auto")).expect("open tcp");
        if ep.caps().gpu_memory {
            return; // a GPU host with a CUDA-enabled libfabric
        }
        let e = ep.gpu_support().expect_err("no GPU memory here");
        eprintln!("{e}");
    }
}
