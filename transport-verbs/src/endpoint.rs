//! The endpoint: one device context, one CQ, two SRQs, and two RC queue pairs per peer.

use std::ffi::CStr;
use std::ptr;
use std::sync::Arc;

use ibverbs_sys as sys;
use transport_core::{
    Caps, Completion, CompletionError, CompletionKind, EndpointAddr, Error, LocalSlice, Memory,
    NicDesc, Op, PeerId, Post, RemoteSlice, Result, Transport, WriteOp,
};

use crate::addr::{WireAddr, LINK_ETH, LINK_IB};
use crate::device::{open_domain, query_port, read_gid_table, Domain};
use crate::gid::{candidates, describe_candidates, gid_text, peer_path, GidEntry, PeerPath};
use crate::mr::{region_access, VerbsMr, ACCESS_RELAXED_ORDERING};
use crate::options::{forced_gid, opt, opt_any};
use crate::util::{check, errno, errno_text, provider_err, MEMLOCK_HINT};

/// Completions taken from the CQ per `ibv_poll_cq` call (the endpoint's own array).
const POLL_BATCH: usize = 32;
/// Work requests chained into one `ibv_post_send`.
const POST_BATCH: usize = 32;
/// Immediate-receive WRs reposted per chained `ibv_post_srq_recv`.
const IMM_BATCH: usize = 32;

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

/// Queue-pair timing, from [`NicDesc::options`] (see the crate docs).
#[derive(Clone, Copy, Debug)]
struct ConnOpts {
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    sl: u8,
    traffic_class: u8,
    hop_limit: u8,
}

/// One RC queue pair and the contexts of its outstanding send-queue work requests.
struct Qp {
    qp: *mut sys::ibv_qp,
    qpn: u32,
    psn: u32,
    /// Posted, not yet completed (every WR is signaled).
    outstanding: usize,
    /// Next ring slot.
    head: usize,
    /// Caller contexts by ring slot. Completions of one send queue come in order, so a slot is
    /// free again once `outstanding < depth`.
    ctx: Box<[u64]>,
}

/// A peer: a data QP (WRITE, WRITE with immediate; its receives come from the immediate SRQ)
/// and a message QP (SEND; its receives come from the application's SRQ).
struct QpPair {
    data: Qp,
    msg: Qp,
}

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
    // ---- hot-path scratch, allocated once
    wcs: Box<[sys::ibv_wc]>,
    wrs: Box<[sys::ibv_send_wr]>,
    sges: Box<[sys::ibv_sge]>,
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

fn psn_for(qpn: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = t ^ (u64::from(qpn) << 17) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) & 0xff_ffff) as u32
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

    fn create_cq(ctx: *mut sys::ibv_context, want: usize) -> Result<(*mut sys::ibv_cq, usize)> {
        // SAFETY: `ctx` is open; no completion channel, no vector.
        let cq =
            unsafe { sys::ibv_create_cq(ctx, want as i32, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(provider_err(
                "ibv_create_cq",
                errno(),
                format!("{want} entries; lower tx_depth/rx_depth. {MEMLOCK_HINT}"),
            ));
        }
        // SAFETY: `cq` is valid; `cqe` is what the provider granted.
        let got = unsafe { (*cq).cqe }.max(0) as usize;
        Ok((cq, got))
    }

    fn create_srq(&self, depth: usize, what: &str) -> Result<*mut sys::ibv_srq> {
        let mut a = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr: depth as u32,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: `pd` is live; `a` is a valid init attribute.
        let srq = unsafe { sys::ibv_create_srq(self.domain.pd, &mut a) };
        if srq.is_null() {
            return Err(provider_err(
                "ibv_create_srq",
                errno(),
                format!("{what} SRQ of {depth} entries; lower rx_depth. {MEMLOCK_HINT}"),
            ));
        }
        Ok(srq)
    }

    /// CQ entries needed with `peers` connected pairs plus the pending one.
    fn cq_needed(&self, peers: usize) -> usize {
        self.imm_depth + self.caps.rx_depth + (peers + 1) * 2 * self.caps.tx_depth
    }

    fn ensure_cq(&mut self, peers: usize) -> Result<()> {
        let need = self.cq_needed(peers);
        if need <= self.cq_cap {
            return Ok(());
        }
        let want = need.max(self.cq_cap * 2);
        // SAFETY: `cq` is live; resizing keeps its queued completions.
        let rc = unsafe { sys::ibv_resize_cq(self.cq, want as i32) };
        check(
            rc,
            "ibv_resize_cq",
            format!(
                "growing the CQ to {want} entries for {peers} peers; lower tx_depth, or use fewer \
                 peers per endpoint"
            ),
        )?;
        // SAFETY: `cq` is live.
        self.cq_cap = unsafe { (*self.cq).cqe }.max(0) as usize;
        Ok(())
    }

    fn create_qp(&mut self, srq: *mut sys::ibv_srq, remote_access: bool) -> Result<Qp> {
        let depth = self.caps.tx_depth;
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq,
            cap: sys::ibv_qp_cap {
                max_send_wr: depth as u32,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: self.caps.inject_size as u32,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `pd`, `cq` and `srq` are live; `init` is a valid init attribute.
        let mut qp = unsafe { sys::ibv_create_qp(self.domain.pd, &mut init) };
        if qp.is_null() && self.caps.inject_size > 0 {
            // Some providers refuse inline data: go without.
            init.cap.max_inline_data = 0;
            // SAFETY: as above.
            qp = unsafe { sys::ibv_create_qp(self.domain.pd, &mut init) };
            if !qp.is_null() {
                self.caps.inject_size = 0;
            }
        }
        if qp.is_null() {
            return Err(provider_err(
                "ibv_create_qp",
                errno(),
                format!("RC QP with {depth} send WRs; lower tx_depth. {MEMLOCK_HINT}"),
            ));
        }
        // SAFETY: `qp` is valid.
        let qpn = unsafe { (*qp).qp_num };
        let q = Qp {
            qp,
            qpn,
            psn: psn_for(qpn),
            outstanding: 0,
            head: 0,
            ctx: vec![0u64; depth].into_boxed_slice(),
        };
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: if remote_access {
                sys::IBV_ACCESS_LOCAL_WRITE
                    | sys::IBV_ACCESS_REMOTE_WRITE
                    | sys::IBV_ACCESS_REMOTE_READ
            } else {
                sys::IBV_ACCESS_LOCAL_WRITE
            },
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS;
        // SAFETY: `qp` is valid and in RESET; the attributes named by `mask` are set.
        let rc = unsafe { sys::ibv_modify_qp(qp, &mut a, mask as i32) };
        if rc != 0 {
            destroy_qp(&q);
            return Err(provider_err(
                "ibv_modify_qp(INIT)",
                rc,
                "port or pkey index 0 unusable",
            ));
        }
        Ok(q)
    }

    fn create_pair(&mut self) -> Result<QpPair> {
        let data = self.create_qp(self.imm_srq, true)?;
        match self.create_qp(self.recv_srq, false) {
            Ok(msg) => Ok(QpPair { data, msg }),
            Err(e) => {
                destroy_qp(&data);
                Err(e)
            }
        }
    }

    /// INIT -> RTR -> RTS against the remote QP `rqpn`/`rpsn`, from and to the GIDs of `path`.
    fn connect_qp(
        &self,
        q: &Qp,
        r: &WireAddr,
        path: &PeerPath,
        rqpn: u32,
        rpsn: u32,
    ) -> Result<()> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: u32::from(self.mtu.min(r.mtu)),
            dest_qp_num: rqpn,
            rq_psn: rpsn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: self.opts.min_rnr_timer,
            ..Default::default()
        };
        a.ah_attr.port_num = self.port;
        a.ah_attr.sl = self.opts.sl;
        // InfiniBand routes by LID (0 on RoCE); a GRH is added on RoCE, or on request.
        a.ah_attr.dlid = r.lid;
        if self.grh && path.dgid != [0; 16] {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: path.dgid };
            a.ah_attr.grh.sgid_index = path.sgid_index;
            a.ah_attr.grh.hop_limit = self.opts.hop_limit;
            a.ah_attr.grh.traffic_class = self.opts.traffic_class;
        }
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: `q.qp` is a live QP in INIT; the attributes named by `mask` are set.
        let rc = unsafe { sys::ibv_modify_qp(q.qp, &mut a, mask as i32) };
        check(
            rc,
            "ibv_modify_qp(RTR)",
            if self.link_layer == LINK_ETH {
                format!(
                    "the peer's GID {} must be reachable from this GID [{}] {}{} (same IP subnet \
                     or routed, neighbour resolvable over the netdev); check `ip addr` and \
                     `ip route get {}` on the RoCE interface, or force a GID with gid=N",
                    gid_text(&path.dgid),
                    path.sgid_index,
                    gid_text(&path.sgid),
                    path.netdev
                        .as_deref()
                        .map_or(String::new(), |n| format!(" on {n}")),
                    gid_text(&path.dgid),
                )
            } else {
                "the peer's LID must be reachable: is the port ACTIVE, does a subnet manager run?"
                    .to_string()
            },
        )?;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            sq_psn: q.psn,
            timeout: self.opts.timeout,
            retry_cnt: self.opts.retry_cnt,
            rnr_retry: self.opts.rnr_retry,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: `q.qp` is a live QP in RTR; the attributes named by `mask` are set.
        let rc = unsafe { sys::ibv_modify_qp(q.qp, &mut a, mask as i32) };
        check(
            rc,
            "ibv_modify_qp(RTS)",
            "timeout/retry options out of the device's range?",
        )
    }

    /// Post `n` (<= IMM_BATCH) zero-length receives to the immediate SRQ.
    /// Link `imm_wrs` into one chain of identical zero-length receives, once: posting `n` of
    /// them then only cuts the chain after the `n`-th. The boxed array never moves, so the
    /// links stay valid for the endpoint's life.
    fn link_imm_chain(&mut self) {
        let base = self.imm_wrs.as_mut_ptr();
        let len = self.imm_wrs.len();
        for (i, w) in self.imm_wrs.iter_mut().enumerate() {
            w.wr_id = TAG_IMM << TAG_SHIFT;
            w.sg_list = ptr::null_mut();
            w.num_sge = 0;
            w.next = if i + 1 < len {
                // SAFETY: `i + 1 < len`: a pointer into the same boxed array.
                unsafe { base.add(i + 1) }
            } else {
                ptr::null_mut()
            };
        }
    }

    fn post_imm_recvs(&mut self, n: usize) -> Result<()> {
        let n = n.min(self.imm_wrs.len());
        let Some(last) = n.checked_sub(1) else {
            return Ok(());
        };
        // Cut the chain after `n` for this post; linked again below.
        let next = std::mem::replace(&mut self.imm_wrs[last].next, ptr::null_mut());
        let mut bad = ptr::null_mut();
        // SAFETY: `imm_srq` is live; the chain is `n` initialised WRs in an array the endpoint
        // owns (copied by the provider before the call returns); no SGEs.
        let rc =
            unsafe { sys::ibvs_post_srq_recv(self.imm_srq, self.imm_wrs.as_mut_ptr(), &mut bad) };
        self.imm_wrs[last].next = next;
        check(
            rc,
            "ibv_post_srq_recv",
            "immediate receives; the SRQ is smaller than expected",
        )
    }

    fn repost_imm(&mut self) -> Result<()> {
        while self.imm_to_post > 0 {
            let n = self.imm_to_post.min(IMM_BATCH);
            self.post_imm_recvs(n)?;
            self.imm_to_post -= n;
        }
        Ok(())
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

    /// Check one WRITE and describe it; nothing is posted.
    ///
    /// The hot path: every condition is evaluated without a branch of its own and checked
    /// once; which one failed is worked out again, out of line, only on failure.
    #[inline(always)]
    fn prepare_write(&self, op: &WriteOp<'_, VerbsMr>) -> Result<Prepared> {
        let peer = op.peer.0 as usize;
        let len = op.local.len;
        let ok = Arc::ptr_eq(&op.local.mr.domain, &self.domain)
            & (peer < self.peers.len())
            & (len <= self.caps.max_write_size)
            & (len as u64 <= op.remote.len)
            & (op.remote.key <= u64::from(u32::MAX));
        if !ok {
            return Err(self.write_error(op));
        }
        Ok(Prepared {
            peer,
            sge: self.sge(&op.local),
            inline: self.can_inline(&op.local),
            opcode: if op.imm.is_some() {
                sys::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                sys::IBV_WR_RDMA_WRITE
            },
            imm: op.imm.unwrap_or(0),
            remote_addr: op.remote.addr,
            rkey: op.remote.key as u32,
        })
    }

    /// Why [`Self::prepare_write`] refused a WRITE (the first failed check, in order).
    #[cold]
    #[inline(never)]
    fn write_error(&self, op: &WriteOp<'_, VerbsMr>) -> Error {
        if let Err(e) = self.own_region(op.local.mr, "post_write") {
            return e;
        }
        if let Err(e) = self.peer_index(op.peer) {
            return e;
        }
        let len = op.local.len;
        if len > self.caps.max_write_size {
            return Error::InvalidArgument(format!(
                "write of {len} bytes exceeds the port's maximum message size {}",
                self.caps.max_write_size
            ));
        }
        if (len as u64) > op.remote.len {
            return Error::InvalidArgument(format!(
                "write of {len} bytes into a {}-byte remote slice",
                op.remote.len
            ));
        }
        Error::InvalidArgument(format!(
            "remote key {:#x} is not a verbs rkey (32 bits): is it from another backend?",
            op.remote.key
        ))
    }

    #[inline(always)]
    fn sge(&self, s: &LocalSlice<'_, VerbsMr>) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: s.mr.iova + s.offset as u64,
            length: s.len as u32,
            lkey: s.mr.lkey,
        }
    }

    #[inline(always)]
    fn can_inline(&self, s: &LocalSlice<'_, VerbsMr>) -> bool {
        s.len <= self.caps.inject_size && s.mr.host_addr != 0
    }

    /// Fill `self.wrs[i]` from `p` using ring slot `slot` of channel `chan`.
    #[inline(always)]
    fn fill(&mut self, i: usize, p: &Prepared, chan: u64, slot: usize) {
        self.sges[i] = p.sge;
        let sge_ptr: *mut sys::ibv_sge = &mut self.sges[i];
        let w = &mut self.wrs[i];
        w.wr_id = (TAG_SQ << TAG_SHIFT) | (chan << 56) | ((p.peer as u64) << 32) | slot as u64;
        w.next = ptr::null_mut();
        w.sg_list = sge_ptr;
        w.num_sge = i32::from(p.sge.length > 0);
        w.opcode = p.opcode;
        w.send_flags = sys::IBV_SEND_SIGNALED | if p.inline { sys::IBV_SEND_INLINE } else { 0 };
        w.__bindgen_anon_1.imm_data = p.imm.to_be();
        w.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: p.remote_addr,
            rkey: p.rkey,
        };
    }

    /// Post `self.wrs[..n]` (already chained) on `qp`; how many the provider took, or the
    /// error where it took none.
    #[inline(always)]
    fn post_chain(&mut self, qp: *mut sys::ibv_qp, n: usize) -> Result<usize> {
        let base = self.wrs.as_mut_ptr();
        for i in 0..n.saturating_sub(1) {
            // SAFETY: `i + 1 < n <= POST_BATCH`: pointers into the same boxed array.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: `qp` is a live connected QP; `wrs[..n]` is an initialised chain whose SGEs
        // point into `sges` and into registered memory kept alive by the caller's regions; the
        // provider copies (or, for inline, reads) them before returning.
        let rc = unsafe { sys::ibvs_post_send(qp, base, &mut bad) };
        if rc == 0 {
            return Ok(n);
        }
        // WRs before `bad` were posted.
        let taken = if bad.is_null() {
            0
        } else {
            // SAFETY: a non-null `bad` points into the chain (providers set it on failure).
            unsafe { bad.offset_from(base) }.max(0) as usize
        };
        if taken > 0 || rc == libc::ENOMEM || rc == libc::EAGAIN {
            return Ok(taken.min(n));
        }
        Err(provider_err(
            "ibv_post_send",
            rc,
            "is the peer's queue pair in the error state after an earlier failure?",
        ))
    }

    #[cold]
    fn wc_error(&self, op: Op, ctx: u64, wc: &sys::ibv_wc) -> Box<CompletionError> {
        // SAFETY: ibv_wc_status_str returns a static NUL-terminated string for any status.
        let text = unsafe { CStr::from_ptr(sys::ibv_wc_status_str(wc.status)) }.to_string_lossy();
        let hint = match wc.status {
            sys::IBV_WC_RETRY_EXC_ERR => {
                ": the peer did not answer (gone, unreachable, or its QP is in error)"
            }
            sys::IBV_WC_RNR_RETRY_EXC_ERR => ": the peer posted no receive in time",
            sys::IBV_WC_REM_ACCESS_ERR => {
                ": remote key, address or length outside the peer's region"
            }
            sys::IBV_WC_LOC_PROT_ERR => ": local buffer not in a region of this endpoint",
            sys::IBV_WC_LOC_LEN_ERR => ": message longer than the receive buffer",
            sys::IBV_WC_REM_INV_REQ_ERR => {
                ": the peer refused the request (message too long for its receive buffer?)"
            }
            sys::IBV_WC_WR_FLUSH_ERR => ": flushed, an earlier operation on this queue pair failed",
            _ => "",
        };
        Box::new(CompletionError {
            op,
            ctx,
            code: wc.status as i32,
            prov_errno: wc.vendor_err as i32,
            msg: format!(
                "{text}{hint} (device {}, qp {:#x}, vendor error {:#x})",
                self.domain.name, wc.qp_num, wc.vendor_err
            ),
        })
    }
}

/// `(slot + n) % depth` for `slot < depth` and `n <= depth`, without the division (`depth`
/// is a run-time value, so `%` would be one per post).
#[inline]
fn ring_add(slot: usize, n: usize, depth: usize) -> usize {
    debug_assert!(slot < depth && n <= depth);
    let s = slot + n;
    if s >= depth {
        s - depth
    } else {
        s
    }
}

/// A checked WRITE, ready to be put into a work request.
#[derive(Clone, Copy)]
struct Prepared {
    peer: usize,
    sge: sys::ibv_sge,
    inline: bool,
    opcode: sys::ibv_wr_opcode,
    imm: u32,
    remote_addr: u64,
    rkey: u32,
}

/// What `ibv_query_qp` reports of a connected queue pair's address vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueriedAv {
    /// Whether packets carry a GRH.
    pub is_global: bool,
    pub sgid_index: u8,
    pub dgid: [u8; 16],
    pub traffic_class: u8,
    pub hop_limit: u8,
}

fn query_av(q: &Qp) -> Result<QueriedAv> {
    let mut a = sys::ibv_qp_attr::default();
    let mut init = sys::ibv_qp_init_attr::default();
    // SAFETY: `q.qp` is a live QP; `a` and `init` are valid out-pointers.
    let rc = unsafe { sys::ibv_query_qp(q.qp, &mut a, sys::IBV_QP_AV as i32, &mut init) };
    check(
        rc,
        "ibv_query_qp",
        "the device cannot report the queue pair's state",
    )?;
    let g = &a.ah_attr.grh;
    Ok(QueriedAv {
        is_global: a.ah_attr.is_global != 0,
        sgid_index: g.sgid_index,
        // SAFETY: `raw` is the plain-bytes view of the GID union.
        dgid: unsafe { g.dgid.raw },
        traffic_class: g.traffic_class,
        hop_limit: g.hop_limit,
    })
}

fn destroy_qp(q: &Qp) {
    // SAFETY: `q.qp` is a live QP destroyed exactly once (callers drop the `Qp` afterwards).
    let rc = unsafe { sys::ibv_destroy_qp(q.qp) };
    if rc != 0 {
        eprintln!(
            "transport-verbs: ibv_destroy_qp({:#x}): {}",
            q.qpn,
            errno_text(rc)
        );
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
    const BACKEND: &'static str = "verbs";

    fn open(nic: &NicDesc) -> Result<Self> {
        let opts = ConnOpts {
            timeout: opt(nic, "timeout", 14u8, 31)?,
            retry_cnt: opt(nic, "retry_cnt", 7u8, 7)?,
            rnr_retry: opt(nic, "rnr_retry", 7u8, 7)?,
            min_rnr_timer: opt(nic, "min_rnr_timer", 12u8, 31)?,
            sl: opt(nic, "sl", 0u8, 15)?,
            traffic_class: opt_any(nic, &["tc", "traffic_class"], 255u8)?.unwrap_or(0),
            hop_limit: opt(nic, "hop_limit", 64u8, 255)?,
        };
        let inline = opt(nic, "inline", DEFAULT_INLINE, 4096)?;
        let imm_want = opt(nic, "imm_depth", DEFAULT_IMM_DEPTH, 1 << 20)?;
        let chain_bytes = opt(nic, "chain_bytes", DEFAULT_CHAIN_BYTES, usize::MAX)?.max(1);
        let access = region_access(nic)?;
        let forced = forced_gid(nic)?;
        let domain = Arc::new(open_domain(nic.device.as_deref())?);
        let port = nic.port.unwrap_or(1);
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
            wcs: vec![sys::ibv_wc::default(); POLL_BATCH].into_boxed_slice(),
            wrs: vec![sys::ibv_send_wr::default(); POST_BATCH].into_boxed_slice(),
            sges: vec![sys::ibv_sge::default(); POST_BATCH].into_boxed_slice(),
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
        ep.link_imm_chain();
        ep.imm_to_post = imm_depth;
        ep.repost_imm()?;
        ep.ensure_cq(0)?;
        ep.pending = Some(ep.create_pair()?);
        Ok(ep)
    }

    fn provider(&self) -> &str {
        &self.domain.name
    }

    fn nic_name(&self) -> &str {
        &self.domain.name
    }

    fn address(&self) -> EndpointAddr {
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

    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
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

    #[inline]
    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, VerbsMr>, ctx: u64) -> Result<Post> {
        self.own_region(buf.mr, "post_send")?;
        let pi = self.peer_index(peer)?;
        if buf.len > self.caps.max_msg_size {
            return Err(Error::InvalidArgument(format!(
                "send of {} bytes exceeds the port's maximum message size {}",
                buf.len, self.caps.max_msg_size
            )));
        }
        let depth = self.caps.tx_depth;
        let q = &self.peers[pi].msg;
        if q.outstanding >= depth {
            return Ok(Post::QueueFull);
        }
        let (qp, slot) = (q.qp, q.head);
        let p = Prepared {
            peer: pi,
            sge: self.sge(&buf),
            inline: self.can_inline(&buf),
            opcode: sys::IBV_WR_SEND,
            imm: 0,
            remote_addr: 0,
            rkey: 0,
        };
        self.fill(0, &p, CHAN_MSG, slot);
        if self.post_chain(qp, 1)? == 0 {
            return Ok(Post::QueueFull);
        }
        let q = &mut self.peers[pi].msg;
        q.ctx[slot] = ctx;
        q.head = ring_add(slot, 1, depth);
        q.outstanding += 1;
        Ok(Post::Posted)
    }

    #[inline]
    fn post_recv(&mut self, buf: LocalSlice<'_, VerbsMr>, ctx: u64) -> Result<Post> {
        self.own_region(buf.mr, "post_recv")?;
        if buf.len > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "receive buffer of {} bytes exceeds 4 GiB",
                buf.len
            )));
        }
        let Some(slot) = self.recv_free.pop() else {
            return Ok(Post::QueueFull);
        };
        let mut sge = self.sge(&buf);
        let mut wr = sys::ibv_recv_wr {
            wr_id: (TAG_RECV << TAG_SHIFT) | u64::from(slot),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(buf.len > 0),
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `recv_srq` is live; `wr` and `sge` live across the call (the provider copies
        // them); the SGE lies in a region of this endpoint kept alive by the caller.
        let rc = unsafe { sys::ibvs_post_srq_recv(self.recv_srq, &mut wr, &mut bad) };
        if rc != 0 {
            self.recv_free.push(slot);
            if rc == libc::ENOMEM {
                return Ok(Post::QueueFull);
            }
            return Err(provider_err("ibv_post_srq_recv", rc, "application receive"));
        }
        self.recv_ctx[slot as usize] = ctx;
        Ok(Post::Posted)
    }

    #[inline]
    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, VerbsMr>,
        remote: RemoteSlice,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        // The one-WRITE path: checked once, no chain.
        let p = self.prepare_write(&WriteOp {
            peer,
            local: buf,
            remote,
            imm,
            ctx,
        })?;
        let depth = self.caps.tx_depth;
        let q = &self.peers[p.peer].data;
        if q.outstanding >= depth {
            return Ok(Post::QueueFull);
        }
        let (qp, slot) = (q.qp, q.head);
        self.fill(0, &p, CHAN_DATA, slot);
        if self.post_chain(qp, 1)? == 0 {
            return Ok(Post::QueueFull);
        }
        let q = &mut self.peers[p.peer].data;
        q.ctx[slot] = ctx;
        q.head = ring_add(slot, 1, depth);
        q.outstanding += 1;
        Ok(Post::Posted)
    }

    /// Chains consecutive WRITEs to the same peer into one `ibv_post_send`: up to 32 WRs, and
    /// closes a chain once it carries `chain_bytes` (default 64 KiB) of payload. Every op is
    /// checked before anything is posted, so an `Err` means none was.
    #[inline]
    fn post_writes(&mut self, ops: &[WriteOp<'_, VerbsMr>]) -> Result<usize> {
        for op in ops {
            self.prepare_write(op)?;
        }
        let depth = self.caps.tx_depth;
        let mut i = 0;
        while i < ops.len() {
            let peer = ops[i].peer.0 as usize;
            let q = &self.peers[peer].data;
            let room = depth - q.outstanding;
            if room == 0 {
                break;
            }
            let (qp, head) = (q.qp, q.head);
            let (mut n, mut bytes) = (0, 0usize);
            while n < room.min(POST_BATCH)
                && bytes < self.chain_bytes
                && i + n < ops.len()
                && ops[i + n].peer.0 as usize == peer
            {
                let p = self.prepare_write(&ops[i + n])?;
                self.fill(n, &p, CHAN_DATA, ring_add(head, n, depth));
                bytes += p.sge.length as usize;
                n += 1;
            }
            let took = self.post_chain(qp, n)?;
            let q = &mut self.peers[peer].data;
            for k in 0..took {
                q.ctx[ring_add(head, k, depth)] = ops[i + k].ctx;
            }
            q.head = ring_add(head, took, depth);
            q.outstanding += took;
            i += took;
            if took < n {
                break;
            }
        }
        Ok(i)
    }

    #[inline]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let want = out.len().min(POLL_BATCH);
        if want == 0 {
            return Ok(0);
        }
        // SAFETY: `cq` is live; `wcs` holds POLL_BATCH >= `want` entries.
        let n = unsafe { sys::ibvs_poll_cq(self.cq, want as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(provider_err(
                "ibv_poll_cq",
                -n,
                "the completion queue is broken (overrun?); the endpoint must be reopened",
            ));
        }
        let mut k = 0;
        // n <= want <= out.len(), and every work completion maps to at most one completion.
        let mut dst = out.iter_mut();
        for wc in &self.wcs[..(n as usize).min(want)] {
            let ok = wc.status == sys::IBV_WC_SUCCESS;
            match wc.wr_id >> TAG_SHIFT {
                TAG_SQ => {
                    let slot = (wc.wr_id & 0xffff_ffff) as usize;
                    let peer = ((wc.wr_id >> 32) & 0xff_ffff) as usize;
                    let msg = (wc.wr_id >> 56) & 1 == CHAN_MSG;
                    let Some(p) = self.peers.get_mut(peer) else {
                        continue;
                    };
                    let q = if msg { &mut p.msg } else { &mut p.data };
                    q.outstanding = q.outstanding.saturating_sub(1);
                    let ctx = q.ctx.get(slot).copied().unwrap_or(0);
                    let (op, kind) = if msg {
                        (Op::Send, CompletionKind::Send)
                    } else {
                        (Op::Write, CompletionKind::Write)
                    };
                    let c = Completion {
                        ctx,
                        kind: if ok {
                            kind
                        } else {
                            CompletionKind::Error(self.wc_error(op, ctx, wc))
                        },
                    };
                    if let Some(o) = dst.next() {
                        *o = c;
                        k += 1;
                    }
                }
                TAG_RECV => {
                    let slot = (wc.wr_id & 0xffff_ffff) as u32;
                    let ctx = self.recv_ctx.get(slot as usize).copied().unwrap_or(0);
                    self.recv_free.push(slot);
                    let c = Completion {
                        ctx,
                        kind: if ok {
                            CompletionKind::Recv {
                                len: wc.byte_len as usize,
                                imm: (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0)
                                    // SAFETY: IBV_WC_WITH_IMM says the union holds imm_data.
                                    .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })),
                            }
                        } else {
                            CompletionKind::Error(self.wc_error(Op::Recv, ctx, wc))
                        },
                    };
                    if let Some(o) = dst.next() {
                        *o = c;
                        k += 1;
                    }
                }
                _ => {
                    // One of our zero-length immediate receives: consumed either way.
                    self.imm_to_post += 1;
                    if ok {
                        // SAFETY: a successful RECV_RDMA_WITH_IMM carries imm_data.
                        let imm = u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data });
                        if let Some(o) = dst.next() {
                            *o = Completion {
                                ctx: 0,
                                kind: CompletionKind::RemoteWrite { imm },
                            };
                            k += 1;
                        }
                    } else if wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                        // The writer gets the error completion; the application here posted
                        // nothing, so it gets none. Counted for diagnosis.
                        self.responder_errors += 1;
                        self.last_responder_error = Some(self.wc_error(Op::RemoteWrite, 0, wc));
                    }
                }
            }
        }
        if self.imm_to_post >= self.imm_repost_at {
            self.repost_imm()?;
        }
        Ok(k)
    }

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn details(&self) -> String {
        self.describe()
    }
}
