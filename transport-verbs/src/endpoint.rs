//! The endpoint: one device context, one CQ, two SRQs, and two RC queue pairs per peer.
//!
//! This file holds the [`Endpoint`] (its fields, opening, peers, accessors, drop order) and
//! its [`Transport`] implementation, a table of contents whose hot-path methods delegate to:
//! - `qp`: a peer's two queue pairs, created into INIT and connected INIT -> RTR -> RTS;
//!   the shared receive queues; `ibv_query_qp`;
//! - `post`: SEND, receive and WRITE work requests, chains of WRITEs, the send rings;
//! - `cq`: the CQ and its size, polling it into completions, the immediate receives.
//!
//! The children are `impl Endpoint` blocks over its private fields; the wr_id layout below
//! is what `post` writes and `cq` reads.

mod cq;
mod post;
mod qp;

use std::ptr;
use std::sync::Arc;

use ibverbs_sys as sys;
use transport_core::{
    check_options, BackendInfo, Caps, Completion, CompletionError, EndpointAddr, Error, LocalSlice,
    Memory, NicDesc, PeerId, Post, RemoteMr, RemoteRegion, RemoteSlice, Result, Runtime, Transport,
    WriteOp,
};

use self::cq::{IMM_BATCH, POLL_BATCH};
use self::post::POST_BATCH;
pub use self::qp::QueriedAv;
use self::qp::{destroy_qp, query_av, ConnOpts, QpPair};
use crate::addr::{WireAddr, LINK_ETH, LINK_IB};
use crate::device::{open_domain, query_port, read_gid_table, require_rc_and_srq, Domain};
use crate::gid::{candidates, describe_candidates, gid_text, peer_path, GidEntry, PeerPath};
use crate::mr::{region_access, VerbsMr, ACCESS_RELAXED_ORDERING};
use crate::options::{forced_gid, opt};
use crate::util::{c_text, check};

const DEFAULT_TX_DEPTH: usize = 256;
const DEFAULT_RX_DEPTH: usize = 256;
const DEFAULT_IMM_DEPTH: usize = 512;
const DEFAULT_INLINE: u32 = 128;
/// Batching amortizes the per-post cost, which only matters for small messages; a chain of
/// large WRITEs only delays the start of the later ones. On Soft-RoCE, whose doorbell is a
/// system call that runs the protocol in the caller's context, chaining 64 KiB WRITEs halves
/// bandwidth (measured with `examples/verbs_bench.rs`).
const DEFAULT_CHAIN_BYTES: usize = 64 << 10;

// wr_id layout: bits 62..64 say who owns the work request.
const TAG_SHIFT: u32 = 62;
/// Send queue WR: bits 0..32 ring slot, 32..56 peer index, 56 channel (0 data, 1 message).
const TAG_SQ: u64 = 0;
/// Application receive: bits 0..32 slot in the receive context table.
const TAG_RECV: u64 = 1;
/// The backend's own zero-length receive for WRITE with immediate.
const TAG_IMM: u64 = 2;
const CHAN_DATA: u64 = 0;
const CHAN_MSG: u64 = 1;
const MAX_PEERS: usize = 1 << 24;

/// One verbs endpoint. See the crate documentation for the design.
pub struct Endpoint {
    domain: Arc<Domain>,
    port: u8,
    /// The GIDs this side offers its peers, best first (one where `gid=N` forced it; none on
    /// InfiniBand without a GID table).
    gids: Vec<GidEntry>,
    /// Whether the GID index was forced (`gid=N`, `NicDesc::gid_index`).
    gid_forced: bool,
    /// The GIDs each connected peer's queue pairs use (same index as `peers`).
    paths: Vec<PeerPath>,
    /// Access flags of every region registered here.
    access: u32,
    /// Whether packets carry a GRH: always on RoCE; on InfiniBand only with an explicit GID index.
    grh: bool,
    link_layer: u8,
    lid: u16,
    mtu: u8,
    /// The device's firmware version (`ibv_query_device`), empty where it reports none.
    firmware: String,
    opts: ConnOpts,
    caps: Caps,
    imm_depth: usize,
    /// A chain of WRITEs is closed once it carries this many payload bytes.
    chain_bytes: usize,
    cq: *mut sys::ibv_cq,
    /// CQ entries available (what ibv_create_cq/ibv_resize_cq granted).
    cq_cap: usize,
    /// Application receives (SENDs land here): shared by every message QP.
    recv_srq: *mut sys::ibv_srq,
    /// The backend's zero-length receives that WRITE with immediate consumes: shared by every
    /// data QP.
    imm_srq: *mut sys::ibv_srq,
    peers: Vec<QpPair>,
    /// The queue pairs `address()` describes; connected by the next `add_peer`.
    pending: Option<QpPair>,
    // ---- hot-path scratch, allocated once (fixed sizes: constant indexes need no check)
    wcs: Box<[sys::ibv_wc; POLL_BATCH]>,
    /// Send WRs for one post (a chain of up to `POST_BATCH`); `wrs[i].sg_list` is
    /// `&sges[i]`, set once at open.
    wrs: Box<[sys::ibv_send_wr; POST_BATCH]>,
    sges: Box<[sys::ibv_sge; POST_BATCH]>,
    imm_wrs: Box<[sys::ibv_recv_wr]>,
    /// Immediate receives consumed and not yet reposted.
    imm_to_post: usize,
    /// `poll` reposts once `imm_to_post` reaches this: `IMM_BATCH`, or a quarter of a smaller
    /// immediate SRQ.
    imm_repost_at: usize,
    /// Application receive contexts by slot, and the free slots.
    recv_ctx: Box<[u64]>,
    recv_free: Vec<u32>,
    responder_errors: u64,
    last_responder_error: Option<Box<CompletionError>>,
}

// SAFETY: the endpoint owns its verbs objects and uses them only through `&mut self` (or reads
// immutable attributes through `&self`); libibverbs objects may be used from any thread.
unsafe impl Send for Endpoint {}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "verbs::Endpoint({} {})",
            self.domain.name,
            self.describe()
        )
    }
}

impl Endpoint {
    /// The device opened.
    pub fn device(&self) -> &str {
        &self.domain.name
    }
    /// The port used.
    pub fn port(&self) -> u8 {
        self.port
    }
    /// The device's firmware version, as `ibv_query_device` reports it (`None`: empty).
    pub fn firmware(&self) -> Option<&str> {
        Some(self.firmware.as_str()).filter(|f| !f.is_empty())
    }
    /// The GID index this side prefers, before any peer is known: the forced one (`gid=N`,
    /// `NicDesc::gid_index`), else the best of the port's (untagged IPv4 RoCE v2 first). Each
    /// peer's queue pairs may use another: see [`Self::peer_path`].
    pub fn gid_index(&self) -> u8 {
        self.gids.first().map_or(0, |e| e.index)
    }
    /// The GID at [`Self::gid_index`] (zero on InfiniBand without a GID table).
    pub fn gid(&self) -> [u8; 16] {
        self.gids.first().map_or([0; 16], |e| e.wire.gid)
    }
    /// The GIDs `peer`'s queue pairs use, chosen at `add_peer` from both sides' tables.
    pub fn peer_path(&self, peer: PeerId) -> Result<&PeerPath> {
        Ok(&self.paths[self.peer_index(peer)?])
    }
    /// The GRH traffic class of every queue pair (option `tc`, alias `traffic_class`).
    pub fn traffic_class(&self) -> u8 {
        self.opts.traffic_class
    }
    /// Whether regions are registered with relaxed ordering (option `relaxed_ordering`).
    pub fn relaxed_ordering(&self) -> bool {
        self.access & ACCESS_RELAXED_ORDERING != 0
    }
    /// What the device reports for `peer`'s two queue pairs (data, message) with
    /// `ibv_query_qp`: the address vector the connection really uses.
    pub fn queried_av(&self, peer: PeerId) -> Result<[QueriedAv; 2]> {
        let p = &self.peers[self.peer_index(peer)?];
        Ok([query_av(&p.data)?, query_av(&p.msg)?])
    }
    /// One line for people: port, link, GID choice, traffic class, relaxed ordering, and the
    /// GIDs of the first peers.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "port {} ({}), {}, tc {}, relaxed ordering {}",
            self.port,
            if self.is_roce() { "RoCE" } else { "InfiniBand" },
            describe_candidates(&self.gids, self.gid_forced),
            self.opts.traffic_class,
            if self.relaxed_ordering() { "on" } else { "off" }
        );
        for (i, p) in self.paths.iter().enumerate().take(4) {
            s.push_str(&format!(
                "; peer {i}: [{}] {} -> {}",
                p.sgid_index,
                gid_text(&p.sgid),
                gid_text(&p.dgid)
            ));
            if let Some(n) = &p.netdev {
                s.push_str(&format!(" on {n}"));
            }
        }
        if self.paths.len() > 4 {
            s.push_str(&format!("; {} more peers", self.paths.len() - 4));
        }
        s
    }
    /// Whether the port is Ethernet (RoCE) rather than InfiniBand.
    pub fn is_roce(&self) -> bool {
        self.link_layer == LINK_ETH
    }
    /// The port's active MTU in bytes.
    pub fn active_mtu(&self) -> usize {
        128 << self.mtu
    }
    /// Number of connected peers.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }
    /// Responder-side errors on the backend's own immediate receives (a peer's WRITE with
    /// immediate that failed here: wrong key, out of bounds). The writer gets the error
    /// completion; this side only counts them.
    pub fn responder_errors(&self) -> (u64, Option<&CompletionError>) {
        (self.responder_errors, self.last_responder_error.as_deref())
    }

    /// A local slice of this endpoint's own region that lies inside it.
    #[inline]
    fn own_slice(&self, s: &LocalSlice<'_, VerbsMr>, what: &str) -> Result<()> {
        self.own_region(s.mr, what)?;
        if fits(s) {
            Ok(())
        } else {
            Err(local_range(s, what))
        }
    }

    fn own_region(&self, mr: &VerbsMr, what: &str) -> Result<()> {
        if Arc::ptr_eq(&mr.domain, &self.domain) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: the local region was registered on another endpoint ({}); register it \
                 on this one ({})",
                mr.domain.name, self.domain.name
            )))
        }
    }

    fn peer_index(&self, peer: PeerId) -> Result<usize> {
        let i = peer.0 as usize;
        if i < self.peers.len() {
            Ok(i)
        } else {
            Err(Error::InvalidArgument(format!(
                "unknown peer {}: this endpoint has {} peer(s)",
                peer.0,
                self.peers.len()
            )))
        }
    }
}

/// Whether `s` lies inside its region. A slice's fields are public, so one can reach a post
/// without [`LocalSlice::new`]'s check, and the provider copies an inline send's bytes itself:
/// every post checks. Branch-free, for the WRITE paths' combined checks.
#[inline(always)]
pub(crate) fn fits(s: &LocalSlice<'_, VerbsMr>) -> bool {
    let end = s.offset.wrapping_add(s.len);
    (end >= s.offset) & (end <= s.mr.len)
}

#[cold]
#[inline(never)]
pub(crate) fn local_range(s: &LocalSlice<'_, VerbsMr>, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what}: local range {}+{} does not fit the {}-byte region; take slices with \
         `LocalSlice::new` or `MemoryRegion::slice`, which check",
        s.offset, s.len, s.mr.len
    ))
}

impl Endpoint {
    /// [`Transport::open`]: options first, then the device, the port and its GIDs, the CQ,
    /// the two SRQs (the immediate one filled) and the first pending pair.
    fn open_nic(nic: &NicDesc) -> Result<Self> {
        check_options(&crate::INFO, &nic.options)?;
        let opts = ConnOpts::from_nic(nic)?;
        let inline = opt(nic, "inline", DEFAULT_INLINE, 4096)?;
        let imm_want = opt(nic, "imm_depth", DEFAULT_IMM_DEPTH, 1 << 20)?;
        let chain_bytes = opt(nic, "chain_bytes", DEFAULT_CHAIN_BYTES, usize::MAX)?.max(1);
        let access = region_access(nic)?;
        let forced = forced_gid(nic)?;
        let domain = Arc::new(open_domain(nic.device.as_deref())?);
        let port = opt(nic, "port", 1u8, 255)?;
        let pinfo = query_port(&domain, port)?;
        let table = read_gid_table(&domain, port, &pinfo);
        let gids = candidates(
            &table,
            pinfo.link_layer == LINK_ETH,
            forced,
            &domain.name,
            port,
        )?;
        let mut da = sys::ibv_device_attr::default();
        // SAFETY: `ctx` is open; `da` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_device(domain.ctx, &mut da) };
        check(
            rc,
            "ibv_query_device",
            "the device cannot report its limits",
        )?;
        require_rc_and_srq(&domain, &da, IMM_BATCH)?;
        let cap = |v: i32| v.max(1) as usize;
        let tx_depth = nic
            .tx_depth
            .unwrap_or(DEFAULT_TX_DEPTH)
            .clamp(1, cap(da.max_qp_wr));
        let rx_depth = nic
            .rx_depth
            .unwrap_or(DEFAULT_RX_DEPTH)
            .clamp(1, cap(da.max_srq_wr));
        let imm_depth = imm_want.clamp(IMM_BATCH, cap(da.max_srq_wr));
        let max_msg = pinfo.max_msg_sz as usize;
        let mut ep = Endpoint {
            domain,
            port,
            gids,
            gid_forced: forced.is_some(),
            paths: Vec::new(),
            access,
            grh: pinfo.link_layer == LINK_ETH || forced.is_some(),
            link_layer: pinfo.link_layer,
            lid: pinfo.lid,
            mtu: pinfo.active_mtu,
            firmware: c_text(&da.fw_ver),
            opts,
            caps: Caps {
                max_msg_size: max_msg,
                max_write_size: max_msg,
                tx_depth,
                rx_depth,
                inject_size: inline as usize,
                cq_data_size: 4,
                gpu_memory: crate::gpu_possible(),
                link_gbps: pinfo.gbps,
                // RC: the responder's NAK comes back as IBV_WC_REM_ACCESS_ERR.
                remote_write_errors: true,
            },
            imm_depth,
            chain_bytes,
            cq: ptr::null_mut(),
            cq_cap: 0,
            recv_srq: ptr::null_mut(),
            imm_srq: ptr::null_mut(),
            peers: Vec::new(),
            pending: None,
            wcs: Box::new([sys::ibv_wc::default(); POLL_BATCH]),
            wrs: Box::new([sys::ibv_send_wr::default(); POST_BATCH]),
            sges: Box::new([sys::ibv_sge::default(); POST_BATCH]),
            imm_wrs: vec![sys::ibv_recv_wr::default(); IMM_BATCH].into_boxed_slice(),
            imm_to_post: 0,
            imm_repost_at: IMM_BATCH.min(imm_depth / 4).max(1),
            recv_ctx: vec![0u64; rx_depth].into_boxed_slice(),
            recv_free: (0..rx_depth as u32).rev().collect(),
            responder_errors: 0,
            last_responder_error: None,
        };
        // From here on, `Drop` cleans up whatever was created.
        let want = ep.cq_needed(4).min(cap(da.max_cqe));
        let (cq, got) = Self::create_cq(ep.domain.ctx, want)?;
        ep.cq = cq;
        ep.cq_cap = got;
        ep.recv_srq = ep.create_srq(rx_depth, "receive")?;
        ep.imm_srq = ep.create_srq(imm_depth, "immediate")?;
        ep.link_send_sges();
        ep.link_imm_chain();
        ep.imm_to_post = imm_depth;
        ep.repost_imm()?;
        ep.ensure_cq(0)?;
        ep.pending = Some(ep.create_pair()?);
        Ok(ep)
    }

    /// [`Transport::address`]: the pending pair and this side's GIDs.
    fn pending_addr(&self) -> EndpointAddr {
        let p = self
            .pending
            .as_ref()
            .expect("an endpoint always has a pending queue pair");
        WireAddr {
            link_layer: self.link_layer,
            mtu: self.mtu,
            port: self.port,
            lid: self.lid,
            data_qpn: p.data.qpn,
            data_psn: p.data.psn,
            msg_qpn: p.msg.qpn,
            msg_psn: p.msg.psn,
            gids: self.gids.iter().map(|e| e.wire).collect(),
        }
        .encode()
    }

    /// [`Transport::add_peer`]: connect the pending pair to `addr` over the GIDs chosen for
    /// it, and create the next pending pair.
    fn connect_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        let r = WireAddr::decode(addr)?;
        if r.link_layer != self.link_layer {
            let name = |l| {
                if l == LINK_IB {
                    "InfiniBand"
                } else {
                    "Ethernet (RoCE)"
                }
            };
            return Err(Error::BadAddress(format!(
                "the peer's port is {}, this endpoint's ({} port {}) is {}",
                name(r.link_layer),
                self.domain.name,
                self.port,
                name(self.link_layer)
            )));
        }
        if self.peers.len() + 1 >= MAX_PEERS {
            return Err(Error::InvalidArgument(format!(
                "more than {MAX_PEERS} peers"
            )));
        }
        // The GIDs for this peer: from both sides' candidates, the same pair at both ends.
        let path = peer_path(&self.gids, &r.gids, self.link_layer == LINK_ETH)?;
        self.ensure_cq(self.peers.len() + 1)?;
        let next = self.create_pair()?;
        let cur = self.pending.take().expect("pending queue pair");
        let res = self
            .connect_qp(&cur.data, &r, &path, r.data_qpn, r.data_psn)
            .and_then(|()| self.connect_qp(&cur.msg, &r, &path, r.msg_qpn, r.msg_psn));
        self.pending = Some(next);
        match res {
            Ok(()) => {
                self.peers.push(cur);
                self.paths.push(path);
                Ok(PeerId((self.peers.len() - 1) as u32))
            }
            Err(e) => {
                // The half-connected pair is unusable; `address()` now describes a fresh one.
                destroy_qp(&cur.data);
                destroy_qp(&cur.msg);
                Err(e)
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Queue pairs first, then the SRQs and the CQ they use; the PD and the context go when
        // the last `Arc<Domain>` (this one, or a region's) is dropped.
        for p in self.peers.iter().chain(self.pending.iter()) {
            destroy_qp(&p.data);
            destroy_qp(&p.msg);
        }
        // SAFETY: every QP using the SRQs and the CQ is destroyed; each is destroyed once.
        unsafe {
            if !self.recv_srq.is_null() {
                sys::ibv_destroy_srq(self.recv_srq);
            }
            if !self.imm_srq.is_null() {
                sys::ibv_destroy_srq(self.imm_srq);
            }
            if !self.cq.is_null() {
                sys::ibv_destroy_cq(self.cq);
            }
        }
    }
}

impl Endpoint {
    /// Raw handles (see [`raw`](crate::raw)); the endpoint keeps owning them.
    #[doc(hidden)]
    pub fn raw_parts(&self) -> crate::raw::Parts {
        crate::raw::Parts {
            cq: self.cq,
            imm_srq: self.imm_srq,
            imm_wr_id: TAG_IMM << TAG_SHIFT,
            imm_batch: IMM_BATCH,
            imm_threshold: self.imm_repost_at,
        }
    }

    /// The data queue pair (WRITE, WRITE with immediate) of `peer` (see
    /// [`raw`](crate::raw)).
    #[doc(hidden)]
    pub fn raw_data_qp(&self, peer: PeerId) -> Result<*mut sys::ibv_qp> {
        Ok(self.peers[self.peer_index(peer)?].data.qp)
    }

    /// Whether a WRITE of `len` bytes from host memory is posted with `IBV_SEND_INLINE`.
    #[doc(hidden)]
    pub fn raw_inline(&self, len: usize) -> bool {
        len <= self.caps.inject_size
    }
}

impl Transport for Endpoint {
    type Mr = VerbsMr;
    const INFO: &'static BackendInfo = &crate::INFO;
    /// The peer region's rkey, which every WRITE work request carries as is.
    type RemoteKey = u32;

    fn open(nic: &NicDesc) -> Result<Self> {
        Self::open_nic(nic)
    }

    fn provider(&self) -> &str {
        &self.domain.name
    }

    fn nic_name(&self) -> &str {
        &self.domain.name
    }

    fn address(&self) -> EndpointAddr {
        self.pending_addr()
    }

    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        self.connect_peer(addr)
    }

    fn register(&mut self, mem: Memory) -> Result<VerbsMr> {
        VerbsMr::register(&self.domain, mem, self.access)
    }

    fn deregister(&mut self, mr: VerbsMr) -> Result<Memory> {
        if !Arc::ptr_eq(&mr.domain, &self.domain) {
            return Err(Error::InvalidArgument(format!(
                "the region belongs to another endpoint ({}); deregister it there (or drop it)",
                mr.domain.name
            )));
        }
        mr.into_memory()
    }

    /// The key bytes are the rkey's 4 ([`VerbsMr::remote`](transport_core::MemoryRegion::remote));
    /// any other length is a key of another backend, refused here rather than by the NIC.
    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<u32>> {
        self.peer_index(peer)?;
        RemoteRegion::new(mr, mr.key.to_u32("verbs")?)
    }

    #[inline]
    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, VerbsMr>, ctx: u64) -> Result<Post> {
        self.send_msg(peer, buf, ctx)
    }

    #[inline]
    fn post_recv(&mut self, buf: LocalSlice<'_, VerbsMr>, ctx: u64) -> Result<Post> {
        self.recv_msg(buf, ctx)
    }

    #[inline]
    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, VerbsMr>,
        remote: RemoteSlice<u32>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        self.write_one(peer, buf, remote, imm, ctx)
    }

    /// Chains consecutive WRITEs to the same peer into one `ibv_post_send`: up to 32 WRs, and
    /// closes a chain once it carries `chain_bytes` (default 64 KiB) of payload. Every op is
    /// checked before anything is posted, so an `Err` means none was.
    #[inline]
    fn post_writes(&mut self, ops: &[WriteOp<'_, VerbsMr, u32>]) -> Result<usize> {
        self.write_chained(ops)
    }

    #[inline]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        self.poll_cq(out)
    }

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn details(&self) -> String {
        self.describe()
    }

    fn runtime(&self) -> Runtime {
        self.runtime_facts()
    }

    /// The NIC writes every byte by DMA (GPUDirect RDMA for GPU memory): a GPU region gets
    /// its device's flush ([`transport_core::GpuDirectFlush`]), a host region nothing.
    fn make_gpu_visible(&mut self, mr: &VerbsMr) -> Result<()> {
        let mem = transport_core::MemoryRegion::memory(mr);
        transport_core::make_gpu_visible(mem, transport_core::Landing::NicDma)
    }
}
