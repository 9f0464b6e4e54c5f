//! The [`Endpoint`]: its libfabric objects and settings, how it was opened
//! ([`EndpointInfo`]), its getters, and `impl Transport`, the table of contents of this
//! backend: each method hands its call to the module that does the work (`open.rs`,
//! `addr.rs`, `mr.rs`), or is built of the helpers of the post path (`post.rs`) and the
//! completion path (`cq.rs`).

use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;

use libfabric_sys as fi;
use transport_core::{
    BackendInfo, Caps, Completion, EndpointAddr, Error, LocalSlice, Memory, NicDesc, PeerId, Post,
    RemoteMr, RemoteRegion, RemoteSlice, Result, Runtime, Transport, WriteOp,
};

use crate::domain::Domain;
use crate::error::{provider, runtime_version};
use crate::grave::Grave;
use crate::imm::ImmRecvs;
use crate::mr::{self, Mr, MrMode, RegisterOn};
use crate::nic::{DomainInfo, Pci};
use crate::slab::{Kind, Slab};
use crate::{raw, select};

// Named by the docs.
#[cfg(doc)]
use crate::nic::match_nic;

/// Completions read per `fi_cq_read`.
const POLL_BATCH: usize = 32;

/// A libfabric `FI_EP_RDM` endpoint with its completion queue and address vector.
///
/// See the [crate documentation](crate) for how it is opened and what it guarantees.
pub struct Endpoint {
    pub(crate) ep: *mut fi::fid_ep,
    pub(crate) cq: *mut fi::fid_cq,
    pub(crate) av: *mut fi::fid_av,
    /// Operation contexts; freed after `ep` is closed (Drop closes, then fields drop).
    pub(crate) slab: Slab,
    /// The data endpoint and its receives, where immediates need posted receives
    /// (`FI_RX_CQ_DATA`, see `imm.rs`); closed in Drop with `ep`.
    pub(crate) imm: Option<ImmRecvs>,
    /// The buffer those receives point into; deregistered after the data endpoint closed.
    pub(crate) imm_mr: Option<Mr>,
    pub(crate) domain: Arc<Domain>,
    /// Where SENDs to each peer go.
    pub(crate) peers: Vec<fi::fi_addr_t>,
    /// Where WRITEs to each peer go: its data endpoint where it has one, else `peers`.
    pub(crate) write_peers: Vec<fi::fi_addr_t>,
    pub(crate) addr: EndpointAddr,
    /// Length of one endpoint's own address (the message endpoint's).
    pub(crate) own_addr_len: usize,
    pub(crate) addr_format: u32,
    pub(crate) provider: String,
    pub(crate) fabric: String,
    pub(crate) nic: String,
    pub(crate) caps: Caps,
    pub(crate) mr_mode: MrMode,
    pub(crate) requested_mr_mode: MrMode,
    /// Completion semantics added to every WRITE (`FI_DELIVERY_COMPLETE` or nothing).
    pub(crate) write_flags: u64,
    /// Flags of GPU memory registrations (`FI_HMEM_DEVICE_ONLY` unless `gpu_ipc=off`).
    pub(crate) hmem_flags: u64,
    pub(crate) gpu_reason: Option<String>,
    /// Send the provider's connection request from `add_peer` (see [`Endpoint::announce`]).
    pub(crate) announce_peers: bool,
    pub(crate) info: EndpointInfo,
    /// Regions dropped while an operation may still use them (`grave.rs`); emptied by
    /// `poll` once no operation is in flight, and by Drop after the endpoint closed.
    pub(crate) grave: Arc<Grave<Mr>>,
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
    /// The provider's own version (`fabric_attr->prov_version`, `major.minor`).
    pub provider_version: String,
    /// The NIC's firmware (`nic->device_attr->firmware`), where the provider reports it.
    pub firmware: Option<String>,
}

impl fmt::Display for EndpointInfo {
    /// In words, for `-v`: what is not known (`None`) is left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = |b: bool| if b { "on" } else { "off" };
        write!(f, "libfabric API {}, {}", self.api_version, self.threading)?;
        if let Some(b) = self.shm_permitted {
            write!(f, ", same-host shared memory {}", on(b))?;
        }
        if let Some(b) = self.cuda_api_permitted {
            write!(f, ", CUDA API in the provider {}", on(b))?;
        }
        if let Some(b) = self.emulated_write {
            f.write_str(if b {
                ", WRITEs emulated over SENDs"
            } else {
                ", WRITEs done by the device"
            })?;
        }
        if self.rx_cq_data {
            f.write_str(", immediates consume posted receives")?;
        }
        if let Some(p) = self.pci {
            write!(f, ", PCI {p}")?;
        }
        Ok(())
    }
}

// SAFETY: the endpoint owns its libfabric objects; every call on them takes `&mut self`, so
// one thread at a time uses them (FI_THREAD_DOMAIN's contract). A region dropped on another
// thread while the endpoint lives makes no libfabric call there: it waits in the endpoint's
// grave (a lock), and the endpoint closes it on its own thread. The slab's slots and the
// immediate receives' contexts are only touched through `&mut self`.
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
        let mut eps_closed = true;
        // SAFETY: each pointer is NULL or an object opened in `open`, closed once here.
        unsafe {
            if let Some(imm) = &self.imm {
                if !imm.ep.is_null() {
                    eps_closed &= fi::rs_fi_close(fi::rs_fi_ep_fid(imm.ep)) == 0;
                }
            }
            if !self.ep.is_null() {
                eps_closed &= fi::rs_fi_close(fi::rs_fi_ep_fid(self.ep)) == 0;
            }
            if !self.av.is_null() {
                fi::rs_fi_close(fi::rs_fi_av_fid(self.av));
            }
            if !self.cq.is_null() {
                fi::rs_fi_close(fi::rs_fi_cq_fid(self.cq));
            }
        }
        if !eps_closed {
            // The provider may still hold the operations' contexts and write into the
            // regions: leak them rather than free what it may use.
            std::mem::forget(std::mem::replace(&mut self.slab, Slab::new(0, 0)));
            std::mem::forget(self.imm.take());
            std::mem::forget(self.imm_mr.take());
            self.grave.leak();
            // Regions the caller still holds are buried here when dropped, and never freed.
            std::mem::forget(self.grave.clone());
            return;
        }
        // Nothing runs any more: the regions dropped meanwhile, and the endpoint's own, go.
        drop(self.imm_mr.take());
        self.grave.empty();
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
            grave: Some(&self.grave),
        }
    }
}

// The table of contents: each method hands its call to the module that does the work, but
// the post and poll methods keep their bodies here, built of `post.rs`'s and `cq.rs`'s
// helpers. Moved behind a forwarding method, their machine code in other crates changed
// (hot_path bench: with the body `#[inline(always)]` its loop took in all of `poll`, with
// `#[inline]` a generic caller's `poll` did), as rustc's MIR inliner inlines forwarders.
impl Transport for Endpoint {
    type Mr = Mr;
    /// libfabric's `fi_mr_key`, carried as is by every WRITE.
    type RemoteKey = u64;

    const INFO: &'static BackendInfo = &crate::INFO;

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
        self.insert_peer(addr)
    }

    fn register(&mut self, mem: Memory) -> Result<Mr> {
        Mr::register(self.register_on(), mem)
    }

    fn deregister(&mut self, mr: Mr) -> Result<Memory> {
        if !mr.buried_in(&self.grave) {
            // Its own endpoint may have operations on it: dropped, it waits for them there.
            return Err(Error::InvalidArgument(
                "deregister: the region was registered on another endpoint; deregister it \
                 there. The region is dropped: its endpoint frees it once nothing uses it"
                    .into(),
            ));
        }
        if !self.slab.idle() {
            // The provider may still use its memory; the region stays registered, and the
            // endpoint frees it once no operation is in flight (as a dropped region).
            return Err(Error::InvalidArgument(
                "deregister: operations of this endpoint are still in flight (a posted \
                 receive, a SEND or WRITE not completed); poll until they complete first. The \
                 region is dropped: the endpoint frees it once they have"
                    .into(),
            ));
        }
        mr.into_memory()
    }

    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<u64>> {
        self.dest(peer)?;
        RemoteRegion::new(mr, mr.key.to_u64("libfabric (efa backend)")?)
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
        // SAFETY: ep is enabled; the buffer lies in a region of this domain, which stays
        // registered and allocated until the completion even if dropped (a dropped region
        // waits in the grave until no slot is busy); slot stays valid until the completion.
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
        remote: RemoteSlice<u64>,
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
    fn post_writes(&mut self, ops: &[WriteOp<'_, Mr, u64>]) -> Result<usize> {
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
        if self.grave.pending() && self.slab.idle() {
            self.grave.empty();
        }
        if out.is_empty() {
            return Ok(0);
        }
        // A receive for immediates that cannot be posted again is reported once the CQ has
        // nothing more to hand out: no completion is lost to the error.
        let stuck = match self.imm.as_mut() {
            Some(imm) => imm.retry().err(),
            None => None,
        };
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
            return match stuck {
                None => Ok(0),
                Some(r) => Err(imm_repost_failed(r)),
            };
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
            format!(
                "the completion queue of provider {} failed; the endpoint is unusable: reopen it",
                self.provider
            ),
        ))
    }

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn details(&self) -> String {
        if self.fabric == self.provider {
            self.info.to_string()
        } else {
            format!("fabric {}, {}", self.fabric, self.info)
        }
    }

    fn runtime(&self) -> Runtime {
        self.runtime_facts()
    }

    #[inline]
    fn make_gpu_visible(&mut self, mr: &Mr) -> Result<()> {
        match transport_core::MemoryRegion::memory(mr) {
            // Host memory: nothing to look up (the ping-pong calls this per message).
            Memory::Host(_) => Ok(()),
            mem => transport_core::make_gpu_visible(mem, crate::gpu::landing(&self.provider)),
        }
    }
}

/// A receive for peers' immediates could not be posted again (not `-FI_EAGAIN`).
#[cold]
#[inline(never)]
fn imm_repost_failed(ret: isize) -> Error {
    provider(
        "fi_recv",
        ret as i64,
        "reposting a receive for peers' WRITE immediates failed: immediates may stop \
         arriving; reopen the endpoint",
    )
}
