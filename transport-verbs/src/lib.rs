//! The [`Transport`](transport_core::Transport) trait over ibverbs: InfiniBand and RoCE
//! (including Soft-RoCE, `rdma_rxe`) with reliable-connected (RC) queue pairs.
//!
//! ```no_run
//! use transport_core::{NicDesc, Transport};
//! let nic = NicDesc::device("mlx5_0"); // or NicDesc::default(): the first device, port 1
//! let ep = transport_verbs::Endpoint::open(&nic)?;
//! # Ok::<(), transport_core::Error>(())
//! ```
//!
//! # Opening
//! - Device by name ([`NicDesc::device`](transport_core::NicDesc), default the first one),
//!   port `port=N` (option, default 1, which must be ACTIVE).
//! - GID: chosen per peer at `add_peer`, from the port's GID table and the GIDs the peer's
//!   address offers (its RoCE GIDs with their type, IP prefix and VLAN flag): RoCE v2 first,
//!   then the pair of GIDs on one IP subnet (the netdev and subnet that reach the peer), the
//!   untagged netdev before a VLAN (a VLAN only where its subnet alone reaches the peer), IPv4
//!   before IPv6, never a link-local pair by subnet; both ends rank the pairs alike and pick
//!   the same one ([`Endpoint::peer_path`] says which). A routed fabric (no shared subnet) gets
//!   the untagged IPv4 RoCE v2 GID. On InfiniBand the LID routes and no GRH is used.
//!   `gid=N` (option) forces the local index (and a GRH on InfiniBand); an empty index is an
//!   error naming `show_gids` and the sysfs path. The path MTU is the smaller of the two
//!   ports' active MTUs.
//! - Zero devices (no RDMA stack in the kernel, where `ibv_get_device_list` fails with `ENOSYS`,
//!   or an empty list) is [`Error::NoDevice`](transport_core::Error::NoDevice), never a panic.
//!   So is a device without RC queue pairs or shared receive queues: an AWS EFA device (vendor
//!   0x1d0f) is named as one, with libibverbs' own answer to an RC queue pair there
//!   (`EOPNOTSUPP`), and pointed at the efa backend (`ci/efa-sim.sh` shows it on the simulated
//!   device).
//! - `NicDesc::options` (any other key is refused, naming these): `port`, `timeout` (RC local
//!   ACK timeout exponent, 4.096 µs · 2^t, default 14 ≈ 67 ms), `retry_cnt` (default 7), `rnr_retry` (default 7 =
//!   forever), `min_rnr_timer` (default 12), `inline` (largest inline payload asked for, default
//!   128), `imm_depth` (default 512), `chain_bytes` (payload after which `post_writes` closes a
//!   chain, default 65536), `sl`, `tc` (alias `traffic_class`: the GRH traffic class of every
//!   queue pair, 0..=255, default 0; on RoCE v2 the IP header's DSCP and ECN bits, so DSCP 26
//!   is `tc=104`; [`Endpoint::traffic_class`]), `hop_limit`, `gid` (above),
//!   `relaxed_ordering` (`on`, the default, or `off`: see Memory). A dead peer is reported
//!   after about `timeout · (retry_cnt + 1)`.
//!
//! # Design: two RC queue pairs per peer
//! A WRITE with immediate consumes a receive work request at the target, and so does a SEND:
//! on one queue pair, an incoming immediate would swallow the application's next receive
//! buffer (or, with backend-owned zero-length receives in the same queue, a SEND would land in
//! a zero-length buffer and fail). So each peer gets two RC queue pairs, both on the
//! endpoint's one CQ:
//! - the **data QP** carries WRITE and WRITE with immediate. Its receives come from the
//!   *immediate SRQ*, shared by all data QPs, which only ever holds the backend's own
//!   zero-length work requests (`wr_id` tag 2), reposted in chained batches as `poll` consumes
//!   them. Each WRITE with immediate becomes exactly one
//!   [`RemoteWrite`](transport_core::CompletionKind::RemoteWrite); the application never posts
//!   receives for it.
//! - the **message QP** carries SEND. Its receives come from the *receive SRQ*, shared by all
//!   message QPs, which only ever holds the application's buffers (`post_recv` from any peer).
//!   Since no immediate ever arrives on a message QP, no receive buffer is ever swallowed.
//!
//! The price: a SEND and a WRITE to the same peer travel on different queue pairs, so they are
//! not ordered with respect to each other. The trait promises no such order anyway; signal
//! with a WRITE with immediate, or SEND after the WRITE's local completion (an RC WRITE
//! completes locally only once the target acknowledged it).
//!
//! [`Transport::address`](transport_core::Transport::address) describes the *pending* pair
//! and this side's GIDs (versioned, checksummed: see [`WireAddr`]); `add_peer` connects it
//! (INIT→RTR→RTS) and creates the next pending pair. Exchange addresses pairwise: `address()`
//! then `add_peer()` once per peer. After a failed `add_peer`, `address()` describes a fresh
//! pair.
//!
//! Errors on the backend's own immediate receives (a peer's WRITE with immediate that failed
//! here: wrong rkey, out of bounds) are not reported to this side's application, which posted
//! nothing; the writer gets the error completion. They are counted:
//! [`Endpoint::responder_errors`].
//!
//! # Hot path
//! Posting and polling allocate nothing, take no lock and make no system call of their own
//! (the provider may ring a doorbell): work requests are built in arrays the endpoint owns,
//! consecutive WRITEs to one peer are chained into one `ibv_post_send` (up to 32 WRs or 64 KiB
//! of payload per chain: chaining pays for small messages only), and `ibv_poll_cq`
//! fills a fixed 32-entry array. Every send-queue WR is signaled; the endpoint counts
//! outstanding WRs per queue pair and answers [`Post::QueueFull`](transport_core::Post) (or a
//! short count from `post_writes`) before the provider would refuse. Error completions carry
//! `ibv_wc_status_str` text and the vendor error, and allocate.
//!
//! A region's rkey travels as its 4 bytes in [`RemoteMr::key`](transport_core::RemoteMr);
//! [`Transport::import`](transport_core::Transport::import) reads them back once (refusing
//! key bytes of any other length: another backend's), and every WRITE work request carries
//! the `u32` itself (`Transport::RemoteKey`).
//!
//! # Memory
//! Host memory: `ibv_reg_mr`. GPU memory (feature `cuda`, on by default): a dmabuf from
//! `cuMemGetHandleForAddressRange` registered with `ibv_reg_dmabuf_mr`, else `ibv_reg_mr` on the
//! device pointer (needs `nvidia-peermem`), else [`Error::Unsupported`](transport_core::Error)
//! saying both reasons. A region holds an `Arc` to the protection domain, so it may outlive
//! its endpoint; posting a region of another endpoint is refused at post time.
//!
//! Every region asks for `IBV_ACCESS_RELAXED_ORDERING` unless `relaxed_ordering=off`: the NIC
//! may then reorder its PCIe writes into the region, which GPU memory behind a ConnectX-7
//! needs to get near 400 Gbit/s. RDMA WRITEs into one region are then not ordered with one
//! another; a completion (a WRITE's local one, or the immediate's `RemoteWrite`) still means
//! every byte before it is visible, which is all this crate promises. It is an optional flag
//! (`IBV_ACCESS_OPTIONAL_RANGE`): `ibv_reg_mr` here goes through `ibv_reg_mr_iova2`, which
//! clears it for a kernel without optional access flags, and a device without the feature
//! (Soft-RoCE) ignores it. [`VerbsMr::access`] says what a region asked for.
//!
//! # Drop order
//! Endpoint: queue pairs, then the SRQs and the CQ; the PD and the device context go with the
//! last `Arc` (the endpoint's or a region's).

mod about;
mod addr;
mod device;
mod endpoint;
mod gid;
mod gpu;
mod mr;
mod netdev;
mod options;
mod util;

pub use addr::{addr_len, WireAddr, ADDR_VERSION, MAX_GIDS};
pub use device::device_names;
pub use endpoint::{Endpoint, QueriedAv};
pub use gid::{gid_text, GidKind, PeerPath, WireGid};
pub use mr::{VerbsMr, ACCESS_RELAXED_ORDERING};

/// This backend, as `Transport::INFO` gives it (the parts in `about.rs`).
pub(crate) const INFO: transport_core::BackendInfo = transport_core::BackendInfo {
    name: "verbs",
    aliases: &[],
    help: "ibverbs RC (ConnectX, Soft-RoCE)",
    library: "verbs",
    provider: None,
    devices: "ibverbs devices: mlx5_0, rxe0",
    nic_driver: about::nic_driver,
    options: about::OPTIONS,
    options_env: Some(transport_core::OptionsEnv {
        name: "RDMA_BENCH_VERBS_OPTS",
        example: "timeout=20,retry_cnt=7",
    }),
    same_process_gpu: &[],
    // The node check reads the RDMA devices from sysfs itself.
    probe: None,
    exit_abandoning: None,
};

/// The NIC this crate's tests and benches open for `side` (0 or 1): `$VERBS_DEV<side>` (else
/// the first device) and `$VERBS_GID<side>` (else the automatic GID). Not a supported API.
#[doc(hidden)]
pub fn test_nic(side: usize) -> transport_core::Result<transport_core::NicDesc> {
    let mut nic = transport_core::NicDesc::default();
    if let Ok(d) = std::env::var(format!("VERBS_DEV{side}")) {
        nic.device = Some(d);
    }
    if let Ok(g) = std::env::var(format!("VERBS_GID{side}")) {
        if g.parse::<u8>().is_err() {
            return Err(transport_core::Error::InvalidArgument(format!(
                "VERBS_GID{side}={g}: not a GID index (0-255)"
            )));
        }
        nic.options.insert("gid".into(), g);
    }
    Ok(nic)
}

/// Raw handles for the benchmark that compares this backend with bare verbs calls
/// (`benches/hot_path.rs`). Not a supported API: nothing outside this crate's benches should
/// use it.
#[doc(hidden)]
pub mod raw {
    pub use ibverbs_sys as sys;

    /// An endpoint's verbs objects. The endpoint keeps owning them; whoever posts through
    /// them must keep the endpoint's accounting right (or not use the endpoint's own posting
    /// and polling any more).
    #[derive(Clone, Copy, Debug)]
    pub struct Parts {
        /// The one CQ of every queue pair of the endpoint.
        pub cq: *mut sys::ibv_cq,
        /// The SRQ of the backend's zero-length receives that WRITE with immediate consumes
        /// (shared by every data QP). Repost one for each immediate taken from the CQ.
        pub imm_srq: *mut sys::ibv_srq,
        /// `wr_id` the backend gives its own immediate receives.
        pub imm_wr_id: u64,
        /// Immediate receives reposted per chained `ibv_post_srq_recv` by the backend, and
        /// the count of consumed ones at which it reposts.
        pub imm_batch: usize,
        pub imm_threshold: usize,
    }
}

/// Whether GPU memory may be registrable: built with `cuda` and a CUDA driver is present.
fn gpu_possible() -> bool {
    #[cfg(feature = "cuda")]
    {
        transport_core::cuda_driver_present()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}
