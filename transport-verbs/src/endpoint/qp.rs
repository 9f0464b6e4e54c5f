//! Queue pairs: the RC pair of one peer (data and message QP), their creation into INIT, the
//! INIT -> RTR -> RTS connection against the peer's address, the shared receive queues they
//! draw from, and what `ibv_query_qp` reports back.

use std::ptr;

use ibverbs_sys as sys;
use transport_core::{NicDesc, Result};

use super::Endpoint;
use crate::addr::{WireAddr, LINK_ETH};
use crate::gid::{gid_text, PeerPath};
use crate::options::{opt, opt_any};
use crate::util::{check, errno, errno_text, provider_err, MEMLOCK_HINT};

/// Queue-pair timing, from [`NicDesc::options`] (see the crate docs).
#[derive(Clone, Copy, Debug)]
pub(super) struct ConnOpts {
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    sl: u8,
    pub(super) traffic_class: u8,
    hop_limit: u8,
}

impl ConnOpts {
    /// The timing options of `nic`, with their defaults and ranges.
    pub(super) fn from_nic(nic: &NicDesc) -> Result<Self> {
        Ok(ConnOpts {
            timeout: opt(nic, "timeout", 14u8, 31)?,
            retry_cnt: opt(nic, "retry_cnt", 7u8, 7)?,
            rnr_retry: opt(nic, "rnr_retry", 7u8, 7)?,
            min_rnr_timer: opt(nic, "min_rnr_timer", 12u8, 31)?,
            sl: opt(nic, "sl", 0u8, 15)?,
            traffic_class: opt_any(nic, &["tc", "traffic_class"], 255u8)?.unwrap_or(0),
            hop_limit: opt(nic, "hop_limit", 64u8, 255)?,
        })
    }
}

/// One RC queue pair and the contexts of its outstanding send-queue work requests.
pub(super) struct Qp {
    pub(super) qp: *mut sys::ibv_qp,
    pub(super) qpn: u32,
    pub(super) psn: u32,
    /// Posted, not yet completed (every WR is signaled).
    pub(super) outstanding: usize,
    /// Next ring slot: always `< ctx.len()` (`post_write` stores there unchecked).
    pub(super) head: usize,
    /// Caller contexts by ring slot. Completions of one send queue come in order, so a slot is
    /// free again once `outstanding < depth`.
    pub(super) ctx: Box<[u64]>,
}

/// A peer: a data QP (WRITE, WRITE with immediate; its receives come from the immediate SRQ)
/// and a message QP (SEND; its receives come from the application's SRQ).
pub(super) struct QpPair {
    pub(super) data: Qp,
    pub(super) msg: Qp,
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
    pub(super) fn create_srq(&self, depth: usize, what: &str) -> Result<*mut sys::ibv_srq> {
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

    pub(super) fn create_pair(&mut self) -> Result<QpPair> {
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
    pub(super) fn connect_qp(
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

pub(super) fn query_av(q: &Qp) -> Result<QueriedAv> {
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

pub(super) fn destroy_qp(q: &Qp) {
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
