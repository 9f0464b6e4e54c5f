//! The endpoint: a UCP context and worker, its peers, its regions, the keys it imported, and
//! the request slab its operations run in. `open.rs` opens it, `region.rs` holds registered
//! memory and imported keys, `transport.rs` is the trait (registration, keys, posting,
//! polling), `handlers.rs` UCX's callbacks into the slab and the active messages they take.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use transport_core::{
    check_options, mapped_library, BackendInfo, Caps, Completion, CompletionError, CompletionKind,
    EndpointAddr, Error, KeyBytes, Landing, LocalSlice, Memory, MemoryRegion, NicDesc, Op, PeerId,
    Post, RemoteMr, RemoteRegion, RemoteSlice, Result, Runtime, Transport,
};
use ucx_sys as sys;

use crate::frame::{self, Kind};

mod done;
mod handlers;
mod landings;
mod open;
mod region;
mod register;
mod requests;
mod resources;
#[cfg(test)]
pub(crate) use resources::resources;
pub(crate) use resources::{
    missing_devices, open_resources, ucx_device_names, Resource, RDMA_SYSFS,
};
mod status;
mod stream;
pub(crate) use status::status_text;
use status::{check, completion_hint, provider_error};
mod transport;

use done::Done;
use landings::Landings;
use region::{
    region_token, Context, Graveyard, Imported, Landable, Mapping, KEY_GPU, KEY_HOST, TAKEN,
};
pub use region::{UcxKey, UcxMr};
use requests::Requests;
use stream::Streams;

use handlers::*;

/// The tag of every SEND (received with a full mask).
const SEND_TAG: u64 = 0x7263_6d61_5f73_6e64;
/// The first UCX whose `ucp_tag_recv_nbx` writes `recv_info` when a receive completes inside
/// the call (its message had arrived before it): commit df0798c, "UCP/TAG: Populate tag_info
/// on immediate completion", in 1.16.0. Before it the length is left unwritten (Debian 12's
/// 1.13.1 reported such a receive as 0 bytes), so there a receive asks to complete through
/// its callback instead (`UCP_OP_ATTR_FLAG_NO_IMM_CMPL`), which carries the length.
const RECV_INFO_SINCE: (u32, u32) = (1, 16);
const DEFAULT_TX: usize = 1024;
/// Most entries (landings and immediates held behind them) made room for per initiator
/// (`landings.rs`).
const LANDING_ROOM: usize = 256;
const DEFAULT_RX: usize = 1024;
/// Immediates kept before `poll` hands them out; more only where the application does not
/// poll (the queue then grows, off the normal path).
const IMM_QUEUE: usize = 1 << 16;
/// Polls in a row that may report what is already queued without progressing the worker
/// (`Endpoint::progress_due`; option `progress_skip`); the next one progresses.
const SKIP_DEFAULT: u32 = 32;
/// The most `progress_skip` takes.
const SKIP_LIMIT: u32 = 1024;
/// The most `progress_burst` takes (its default: [`crate::default_burst`]).
const BURST_LIMIT: u32 = 64;

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// A peer: its `ucp_ep` and the status its error handler reported (`UCS_OK` while healthy).
/// Boxed: the error handler's argument points at `failed`.
struct Peer {
    ep: sys::ucp_ep_h,
    failed: Cell<sys::ucs_status_t>,
    /// Puts posted to this peer, and how many of the first ones a completed flush covers:
    /// equal, every put is at the target and a WRITE with immediate may skip its own flush.
    puts: Cell<u64>,
    flushed: Cell<u64>,
    /// By the memories of a WRITE ([`crate::write_kind`]): WRITEs to this peer between these
    /// are active messages carrying their bytes (a rendezvous into GPU memory), not puts
    /// (option `write`; by default where UCX would emulate the put: [`crate::puts_emulated`]).
    am_writes: [bool; 4],
}

/// How WRITEs go (option `write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    /// Per peer and pair of memories: active messages where UCX would emulate the put, puts
    /// otherwise.
    Auto,
    Am,
    Put,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Send,
    Recv,
    /// A put without immediate, waiting for its own completion.
    Put,
    /// A put with immediate, waiting for the flush that makes it visible.
    Flush,
    /// The flush completed; the active message carrying the immediate is on its way.
    Notify,
}

/// One slot of the request slab. Its address is stable (a boxed slice, made at open), so it is
/// the `user_data` of the operation that runs in it; UCX's callbacks reach the slab's shared
/// queues through `shared`.
struct Slot {
    shared: Cell<*const Shared>,
    index: u32,
    state: Cell<State>,
    ctx: Cell<u64>,
    peer: Cell<u32>,
    /// The `AM_IMM`'s header: the immediate and this endpoint's origin (valid until that send
    /// completes).
    imm: Cell<[u8; IMM_HDR]>,
    /// A flush's count of the peer's puts before it (`Peer::puts`).
    seq: Cell<u64>,
    /// An `AM_WRITE_IMM`'s header (valid until that send completes).
    hdr: Cell<[u8; INLINE_HDR]>,
    /// The slot's request in `Shared::requests`, as UCX takes it (`UCP_OP_ATTR_FIELD_REQUEST`):
    /// every operation that runs in the slot runs in it.
    request: *mut c_void,
    /// The request UCX returned for the operation in flight (`request`), null once its
    /// completion is handled; `Drop` cancels a receive still holding one.
    req: Cell<*mut c_void>,
    status: Cell<sys::ucs_status_t>,
    /// For receives: where UCX writes the tag and length of an immediate completion.
    info: UnsafeCell<sys::ucp_tag_recv_info_t>,
}

impl Slot {
    /// What the slot's send, receive, put or immediate reports once it finished with
    /// `UCS_OK`.
    #[inline]
    fn finished(&self) -> CompletionKind {
        match self.state.get() {
            State::Send => CompletionKind::Send,
            State::Recv => CompletionKind::Recv {
                // SAFETY: written by UCX (inside the post call that returned done, where the
                // loaded UCX does so: `recv_info_at_once`) or by on_recv, before the slot was
                // queued; no progress runs while it is read.
                len: unsafe { (*self.info.get()).length },
                imm: None,
            },
            _ => CompletionKind::Write,
        }
    }
}

/// What UCX's callbacks write, all behind shared references (`Cell`, `RefCell`): the callbacks
/// run inside `ucp_worker_progress`, called from `poll` and `Drop` while the endpoint holds no
/// borrow of these.
struct Shared {
    slots: Box<[Slot]>,
    /// The slots' requests (dropped with `Shared`, after `Endpoint::drop` destroyed the
    /// worker).
    _requests: Requests,
    /// Slots whose operation (or step of one) completed, in order.
    done: Done,
    /// Immediates that arrived.
    imms: RefCell<VecDeque<u32>>,
    /// Regions this endpoint registered: where an `AM_WRITE` or `AM_WRITE_IMM` may write.
    /// Changed only by register and deregister (`&mut self`, no progress running).
    landable: RefCell<Vec<Landable>>,
    /// The worker, for the handlers' `ucp_am_recv_data_nbx` (a rendezvous into GPU memory).
    worker: sys::ucp_worker_h,
    /// Rendezvous WRITEs UCX is receiving into GPU memory (`ucp_am_recv_data_nbx`'s request)
    /// and the immediates that arrived after them from the same initiator, released into
    /// `imms` in arrival order once that initiator's bytes before them are in (`landings.rs`).
    /// A queue per peer is made at `add_peer`, with room for a slab's worth (at most
    /// [`LANDING_ROOM`]); more grows it.
    landings: RefCell<Landings>,
    /// Tagged sends UCX has not finished (posted in progress, their callback not yet run):
    /// a send posted while another is unfinished is one of a stream (`stream.rs`).
    sends_unfinished: Cell<u32>,
}

/// One endpoint: a UCP context and worker.
pub struct Endpoint {
    id: u32,
    /// This worker's origin (`frame::origin` of its address), in every `AM_IMM`, `AM_WRITE`
    /// and `AM_WRITE_IMM` it sends.
    origin: u64,
    ctx: Arc<Context>,
    worker: sys::ucp_worker_h,
    address: Vec<u8>,
    /// Boxed: each peer's error handler holds its address, which must not move as the
    /// vector grows.
    #[allow(clippy::vec_box)]
    peers: Vec<Box<Peer>>,
    imported: Vec<Imported>,
    shared: Box<Shared>,
    /// Free slots: `[0, tx)` for sends and writes, `[tx, tx + rx)` for receives.
    free_tx: Vec<u32>,
    free_rx: Vec<u32>,
    /// Slots whose operation UCX finished inside its post call and that need no further step
    /// (a send, a receive, a put, an immediate; not a flush, which sends its immediate next):
    /// `poll` reports them first, without the general path through `Shared::done` (capacity:
    /// one per slot, so no growth).
    instant: Vec<u32>,
    caps: Caps,
    grave: Arc<Graveyard>,
    tls: String,
    devices: String,
    version: String,
    /// UCP_ERR_HANDLING_MODE_PEER (option `peer_errors`, default on).
    peer_errors: bool,
    /// Sends, receives and puts name their region's memh and memory type (option `memh`).
    name_memory: bool,
    /// How WRITEs go (option `write`), decided per peer at `add_peer`.
    write: Write,
    /// The loaded UCX writes a receive's length when it completes inside its post call
    /// ([`RECV_INFO_SINCE`]).
    recv_info_at_once: bool,
    /// Polls in a row that may skip progress (option `progress_skip`; 0: every poll
    /// progresses the worker).
    skip_max: u32,
    /// Most `ucp_worker_progress` calls in one poll (option `progress_burst`; see [`burst`]).
    burst: u32,
    /// Polls in a row that did not progress the worker.
    skipped: u32,
    /// Which sends and puts are one of a stream (`stream.rs`).
    streams: Streams,
    /// How peers' bytes land in GPU memory over `tls`, decided once at open (the ping-pong
    /// asks on every round trip).
    landing: Landing,
}

// SAFETY: the worker is created UCS_THREAD_MODE_SERIALIZED (any thread, one at a time), and
// every use of it and of the slab goes through `&mut self` (or Drop); the context is
// thread-safe (see Context). Nothing here is tied to the thread that made it.
unsafe impl Send for Endpoint {}

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument(format!("{what} `{s}` has a NUL byte")))
}

impl Endpoint {
    fn peer(&self, peer: PeerId) -> Result<&Peer> {
        let p = self
            .peers
            .get(peer.0 as usize)
            .ok_or_else(|| unknown_peer(peer))?;
        let failed = p.failed.get();
        if failed != sys::UCS_OK {
            return Err(peer_failed(peer, failed));
        }
        Ok(p)
    }

    #[inline]
    fn local(&self, buf: &LocalSlice<'_, UcxMr>) -> Result<*mut c_void> {
        if buf.mr.owner != self.id {
            return Err(foreign_region());
        }
        match buf.offset.checked_add(buf.len) {
            Some(end) if end <= buf.mr.len => {}
            _ => return Err(local_range(buf.offset, buf.len, buf.mr.len)),
        }
        Ok((buf.mr.base + buf.offset) as *mut c_void)
    }

    #[inline]
    fn take_slot(&mut self, rx: bool) -> Option<&Slot> {
        let i = if rx {
            self.free_rx.pop()?
        } else {
            self.free_tx.pop()?
        };
        Some(&self.shared.slots[i as usize])
    }

    #[inline]
    fn give_back(&mut self, i: u32) {
        let s = &self.shared.slots[i as usize];
        s.state.set(State::Free);
        if (i as usize) < self.caps.tx_depth {
            self.free_tx.push(i);
        } else {
            self.free_rx.push(i);
        }
    }

    /// Handle what a post call returned for the operation in slot `i`: in flight (keep the
    /// request), done at once (queue the slot as done), or failed (give the slot back and
    /// return the error). Inline, its error path out of line: every post ends here.
    #[inline(always)]
    fn started(&mut self, i: u32, call: &'static str, r: sys::ucs_status_ptr_t) -> Result<Post> {
        let s = &self.shared.slots[i as usize];
        match sys::ptr_status(r) {
            Ok(Some(req)) => {
                debug_assert_eq!(req, s.request, "UCX ran the operation in another request");
                s.req.set(req);
                if s.state.get() == State::Send {
                    // A send in progress at UCX: on_send uncounts it.
                    let n = &self.shared.sends_unfinished;
                    n.set(n.get() + 1);
                }
                Ok(Post::Posted)
            }
            Ok(None) => {
                s.status.set(sys::UCS_OK);
                if s.state.get() == State::Flush {
                    self.shared.done.push(i);
                } else {
                    self.instant.push(i);
                }
                Ok(Post::Posted)
            }
            Err(st) => self.post_failed(i, call, st),
        }
    }

    #[cold]
    #[inline(never)]
    fn post_failed(&mut self, i: u32, call: &'static str, st: sys::ucs_status_t) -> Result<Post> {
        self.give_back(i);
        Err(provider_error(call, st, "the peer may be gone"))
    }

    /// The parameters of an operation in slot `s`: its callback, with the slot as user data,
    /// run in the slot's own request. Both live as long as the endpoint's `Shared`, which
    /// outlives the worker, so every post's "the slot outlives the operation" covers the
    /// request UCX writes into too.
    #[inline]
    fn params(s: &Slot) -> sys::ucp_request_param_t {
        let mut p = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_REQUEST,
            user_data: s as *const Slot as *mut c_void,
            request: s.request,
            ..Default::default()
        };
        p.cb.send = Some(on_send);
        p
    }

    /// The parameters of a put from `mr`: with the slot's callback, or with none (`None`: the
    /// put before a WRITE's flush), naming the region where `named` (the endpoint's `memh`).
    #[inline]
    fn put_params(named: bool, s: Option<&Slot>, mr: &UcxMr) -> sys::ucp_request_param_t {
        let mut p = s.map_or_else(Default::default, Self::params);
        Self::set_memory(named, &mut p, mr);
        p
    }

    /// Where `named` (the endpoint's `memh`), name the memory of a send, receive or put: its
    /// type and its `ucp_mem_map` handle (the buffer lies inside the mapping: `local` checked
    /// it), as `ucx_perftest -z` does. Without
    /// them UCX detects the memory type per call (UCX 1.22's CUDA build: a memtype-cache
    /// lookup, and `cuPointerGetAttributes` where the cache has no device for the range) and
    /// registers a zero-copy operation's buffer itself: for a put over cma, UCX 1.22 makes a
    /// memory handle per put (`ucp_memh_get_slow`: a calloc and a free each time).
    #[inline]
    fn set_memory(named: bool, p: &mut sys::ucp_request_param_t, mr: &UcxMr) {
        if !named {
            return;
        }
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE | sys::UCP_OP_ATTR_FIELD_MEMH;
        p.memory_type = mr.mtype;
        p.memh = mr.map.memh;
    }

    /// Send the immediate of the WRITE in slot `i` (its flush completed).
    fn notify(&mut self, i: u32) -> std::result::Result<bool, sys::ucs_status_t> {
        let s = &self.shared.slots[i as usize];
        let ep = self.peers[s.peer.get() as usize].ep;
        let mut p = Self::params(s);
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = sys::UCP_AM_SEND_FLAG_EAGER;
        s.state.set(State::Notify);
        // SAFETY: ep is a live endpoint of this worker; the header is the slot's `imm`
        // (IMM_HDR bytes), which stays valid and unchanged until the send completes (the slot
        // is busy until then); no data; the callback's user_data is the slot, alive as long
        // as the endpoint.
        let r = unsafe {
            sys::ucp_am_send_nbx(
                ep,
                AM_IMM,
                s.imm.as_ptr() as *const c_void,
                IMM_HDR,
                ptr::null(),
                0,
                &p,
            )
        };
        match sys::ptr_status(r) {
            Ok(Some(req)) => {
                s.req.set(req);
                Ok(false)
            }
            Ok(None) => Ok(true),
            Err(st) => Err(st),
        }
    }

    fn completion_error(op: Op, ctx: u64, status: sys::ucs_status_t, what: &str) -> Completion {
        Completion {
            ctx,
            kind: CompletionKind::Error(Box::new(CompletionError {
                op,
                ctx,
                code: i32::from(status),
                prov_errno: 0,
                msg: format!("{} ({what})", status_text(status)),
                hint: completion_hint(status),
            })),
        }
    }

    /// Whether this poll progresses the worker. A put or send that UCX finished inside its
    /// post call (a bcopy over tcp, an eager message, UCX 1.13's put into heap memory as an
    /// active message) is queued already; reporting it needs no progress, and over tcp each
    /// progress is an `epoll_wait` and often a `recvfrom`. So a poll that finds something
    /// queued skips progress, up to `skip_max` polls in a row: a loop that posts and polls
    /// without pause still reads what its peers sent. `ucx_perftest`'s put_bw and tag_bw
    /// progress likewise only when their window is full (docs/measurements.md, U62).
    #[inline]
    fn progress_due(&mut self) -> bool {
        let queued = !self.instant.is_empty()
            || !self.shared.done.is_empty()
            || !self.shared.imms.borrow().is_empty();
        if queued && self.skipped < self.skip_max {
            self.skipped += 1;
            false
        } else {
            self.skipped = 0;
            true
        }
    }

    /// Whether a send, put or flush of this endpoint is still unfinished at UCX: more send
    /// slots taken than slots queued as done (an estimate that errs low: receives finished
    /// are queued too).
    #[inline]
    fn tx_unfinished(&self) -> bool {
        self.caps.tx_depth - self.free_tx.len() > self.shared.done.len() + self.instant.len()
    }

    /// Progress until `req` is done or `limit` passes; frees it.
    fn wait_request(&mut self, req: *mut c_void, limit: Duration) {
        let start = Instant::now();
        loop {
            // SAFETY: req is a live request of this worker (not yet freed).
            let st = unsafe { sys::ucp_request_check_status(req) };
            if st != sys::UCS_INPROGRESS || start.elapsed() > limit {
                break;
            }
            // SAFETY: the worker is live; callbacks only touch the slab through shared refs.
            unsafe { sys::ucp_worker_progress(self.worker) };
        }
        // SAFETY: req is released once; an unfinished one is released by UCX when it ends.
        unsafe { sys::ucp_request_free(req) };
    }
}

/// Call `progress` once, then again while the last call did something and `unfinished` says
/// operations are still running at UCX, `max` calls in all; returns how many it made. With 32
/// puts in flight over cma, each progress finishes one (UCX's scopy transports copy one
/// segment a call): one call a poll made the workload's loop turn once per put, and its post,
/// poll and bookkeeping cost about as many instructions as UCX's own put and progress
/// (docs/measurements.md, U59, U62). A ping-pong stops after one call: its send finished
/// inside the post call.
#[inline]
fn burst(max: u32, mut progress: impl FnMut() -> u32, unfinished: impl Fn() -> bool) -> u32 {
    let mut calls = 0;
    while calls < max {
        calls += 1;
        if progress() == 0 || !unfinished() {
            break;
        }
    }
    calls
}

#[cold]
fn unknown_peer(peer: PeerId) -> Error {
    Error::InvalidArgument(format!("unknown peer {}", peer.0))
}

#[cold]
fn peer_failed(peer: PeerId, st: sys::ucs_status_t) -> Error {
    provider_error(
        "ucp_ep (error handler)",
        st,
        &format!("peer {} failed or went away: reconnect to it", peer.0),
    )
}

#[cold]
fn foreign_region() -> Error {
    Error::InvalidArgument("the local region was registered on another endpoint".into())
}

#[cold]
fn local_range(offset: usize, len: usize, total: usize) -> Error {
    Error::InvalidArgument(format!(
        "local range {offset}+{len} does not fit the {total}-byte region"
    ))
}

#[cold]
fn bad_key(what: String) -> Error {
    Error::InvalidArgument(what)
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Receives still posted: cancel them (their callbacks queue the slots) and let the
        // cancellations run.
        for s in self.shared.slots.iter() {
            let req = s.req.get();
            if s.state.get() == State::Recv && !req.is_null() {
                // SAFETY: a live request of this worker.
                unsafe { sys::ucp_request_cancel(self.worker, req) };
            }
        }
        for _ in 0..64 {
            // SAFETY: the worker is live.
            unsafe { sys::ucp_worker_progress(self.worker) };
        }
        // The slots' requests are the endpoint's memory (`Shared::requests`), never UCX's to
        // free: an operation still in one ends with the worker below, before that memory goes.
        // No flush of operations still queued in UCX: a flush waits for the peer to progress
        // (a peer in the same thread, both ends of a loopback, does not while this one drops),
        // and UCX 1.13 aborts ("Fatal: unexpected error: Endpoint timeout", ucp_request.inl)
        // where a queued send fails while the flush progresses it. The forced close below
        // purges them instead; UCX may warn that they were not flushed.
        for imp in self.imported.drain(..) {
            // SAFETY: unpacked on a peer ep that is still open; destroyed once.
            unsafe { sys::ucp_rkey_destroy(imp.rkey) };
        }
        let peers = std::mem::take(&mut self.peers);
        for p in &peers {
            let mut params = sys::ucp_request_param_t {
                op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
                flags: sys::UCP_EP_CLOSE_FLAG_FORCE,
                ..Default::default()
            };
            params.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
            // SAFETY: p.ep is live and closed once.
            let r = unsafe { sys::ucp_ep_close_nbx(p.ep, &params) };
            if let Ok(Some(req)) = sys::ptr_status(r) {
                self.wait_request(req, Duration::from_secs(2));
            }
        }
        drop(peers);
        if !self.worker.is_null() {
            // SAFETY: every ep, rkey and request of the worker is closed or released above;
            // destroyed once. The AM handler's arg (Shared) is still alive here.
            unsafe { sys::ucp_worker_destroy(self.worker) };
            self.worker = ptr::null_mut();
        }
        // Nothing can arrive any more: the memory of regions dropped before us can go.
        if let Ok(mut g) = self.grave.lock() {
            g.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use transport_core::{HostBuffer, LocalSlice, Memory, Post, Transport};

    fn post(r: Result<Post>) {
        assert_eq!(r.expect("post"), Post::Posted);
    }

    /// Two endpoints of this process over shared memory (`peer_errors=off`, and `opts`), each
    /// the other's peer: (a, b, a's peer b, b's peer a).
    fn sm_pair(opts: &[(&str, &str)]) -> (Endpoint, Endpoint, PeerId, PeerId) {
        let mut all = vec![("peer_errors", "off")];
        all.extend_from_slice(opts);
        pair("sm", &all)
    }

    /// Two endpoints of this process over `tls` with options `opts`, as [`sm_pair`].
    fn pair(tls: &str, opts: &[(&str, &str)]) -> (Endpoint, Endpoint, PeerId, PeerId) {
        let mut nic = NicDesc::provider(tls);
        for (k, v) in opts {
            nic = nic.with_option(*k, *v);
        }
        let (mut a, mut b) = match (Endpoint::open(&nic), Endpoint::open(&nic)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => panic!("UCX over {tls}: {e}"),
        };
        let to_b = a.add_peer(&b.address()).expect("a's peer");
        let to_a = b.add_peer(&a.address()).expect("b's peer");
        (a, b, to_b, to_a)
    }

    /// `write=auto` decides per peer and pair of memories, from the lanes UCX gave its
    /// endpoint: puts between host memories where a shared-memory transport carries RMA (cma,
    /// with peer errors off), active messages into and out of GPU memory there (no cuda_ipc
    /// lane: this box has no CUDA, and UCX 1.22 has none within one process), and every WRITE
    /// an active message where UCX would emulate puts over tcp (sm and tcp named: with peer
    /// error handling UCX reaches this process's other endpoint over tcp alone).
    #[test]
    fn write_auto_follows_the_peers_lanes() {
        let write = |tls, opts: &[(&str, &str)]| {
            let (a, _b, _, _) = pair(tls, opts);
            a.runtime().settings["write"].clone()
        };
        assert_eq!(
            write("sm", &[("peer_errors", "off")]),
            "am host to GPU, GPU to host, GPU to GPU, put otherwise"
        );
        assert_eq!(write("sm,tcp", &[]), "am");
        assert_eq!(write("sm,tcp", &[("write", "put")]), "put");
        let a = Endpoint::open(&NicDesc::provider("tcp")).expect("tcp");
        assert!(
            a.runtime().settings["write"].starts_with("auto"),
            "no peer yet"
        );
    }

    /// `len` bytes of host memory registered on `ep`.
    fn host_region(ep: &mut Endpoint, len: usize) -> UcxMr {
        ep.register(Memory::Host(HostBuffer::new(len)))
            .expect("a host region")
    }

    /// A WRITE into GPU memory to a peer whose WRITEs are active messages (here tcp: UCX would
    /// emulate puts, whose target answers each and aborts where the initiator died) is sent as
    /// a rendezvous, which the target's handler has UCX receive into the region
    /// (`ucp_am_recv_data_nbx`); its immediate is queued once the bytes are in. No GPU here:
    /// a's import of b's host region is marked GPU memory (so a asks for the rendezvous), and
    /// b's table entry is of no memory type its handler copies into itself (an eager message
    /// would be dropped). A token of no region fails the initiator's WRITE: the handler
    /// refuses the rendezvous, and UCX completes the send with its status.
    #[test]
    fn writes_into_gpu_memory_land_by_rendezvous() {
        let (mut a, mut b, to_b, _) = pair("tcp", &[]);
        assert_eq!(a.runtime().settings["write"], "am");
        let len = 256 << 10;
        let mut src = host_region(&mut a, len);
        let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        src.memory_mut().write_at(0, &pattern).expect("fill");
        let dst = host_region(&mut b, 2 * len);
        b.shared.landable.borrow_mut()[0].mtype = sys::UCS_MEMORY_TYPE_UNKNOWN;
        let region = a.import(to_b, &dst.remote()).expect("import");
        a.imported[region.key.index as usize].host = false;
        let mut out = vec![Completion::default(); 8];
        let mut run = |a: &mut Endpoint, b: &mut Endpoint, off: u64, imm, ctx| {
            let remote = region.slice(off, len as u64).expect("remote slice");
            let local = LocalSlice::new(&src, 0, len).expect("slice");
            post(a.post_write(to_b, local, remote, imm, ctx));
            let (mut mine, mut theirs) = (None, Vec::new());
            let t0 = Instant::now();
            // a's completion, and b's immediate where a's WRITE succeeded.
            while mine.is_none()
                || (imm.is_some() && mine == Some(CompletionKind::Write) && theirs.is_empty())
            {
                let n = a.poll(&mut out).expect("a's poll");
                for c in &out[..n] {
                    assert_eq!(c.ctx, ctx);
                    mine = Some(c.kind.clone());
                }
                let n = b.poll(&mut out).expect("b's poll");
                theirs.extend(out[..n].iter().map(|c| c.kind.clone()));
                assert!(t0.elapsed() < Duration::from_secs(20), "no completion");
            }
            // What may still arrive at b after a's completion.
            for _ in 0..200 {
                let n = b.poll(&mut out).expect("b's poll");
                theirs.extend(out[..n].iter().map(|c| c.kind.clone()));
            }
            (mine.expect("a's completion"), theirs)
        };
        let (w, imms) = run(&mut a, &mut b, 0, Some(9), 1);
        assert_eq!(w, CompletionKind::Write);
        assert_eq!(imms, [CompletionKind::RemoteWrite { imm: 9 }]);
        let (w, imms) = run(&mut a, &mut b, len as u64, None, 2);
        assert_eq!((w, imms), (CompletionKind::Write, vec![]));
        let landed = dst.memory().host().expect("host").to_vec();
        assert!(
            landed[..len] == pattern[..],
            "the WRITE with immediate's bytes"
        );
        assert!(landed[len..] == pattern[..], "the WRITE's bytes");
        assert!(b.shared.landings.borrow().is_empty());
        // A stale or foreign token: nothing lands, no immediate, and a is told.
        a.imported[region.key.index as usize].token ^= 1;
        let (w, imms) = run(&mut a, &mut b, 0, Some(10), 3);
        assert!(
            matches!(&w, CompletionKind::Error(e) if e.code == i32::from(sys::UCS_ERR_INVALID_PARAM)),
            "{w:?}"
        );
        assert!(imms.is_empty(), "{imms:?}");
    }

    /// An immediate waits for its own initiator's landings only (`landings.rs`). Over tcp, a's
    /// rendezvous WRITE into b's "GPU" region (as above) cannot land while a does not progress:
    /// a's WRITE with immediate behind it waits, and c's, sent while a's lands, does not.
    #[test]
    fn an_immediate_waits_for_its_own_initiators_landings_only() {
        let (mut a, mut b, a_to_b, _) = pair("tcp", &[]);
        let mut c = Endpoint::open(&NicDesc::provider("tcp")).expect("tcp");
        let c_to_b = c.add_peer(&b.address()).expect("c's peer");
        b.add_peer(&c.address()).expect("b's peer");
        let len = 256 << 10;
        let mut src = host_region(&mut a, len);
        let pattern: Vec<u8> = (0..len).map(|i| (i * 5 + i / 4093) as u8).collect();
        src.memory_mut().write_at(0, &pattern).expect("fill");
        let (small_a, small_c) = (host_region(&mut a, 8), host_region(&mut c, 8));
        let gpu = host_region(&mut b, len);
        let host = host_region(&mut b, 16);
        b.shared.landable.borrow_mut()[0].mtype = sys::UCS_MEMORY_TYPE_UNKNOWN;
        let to_gpu = a.import(a_to_b, &gpu.remote()).expect("import");
        a.imported[to_gpu.key.index as usize].host = false;
        let a_host = a.import(a_to_b, &host.remote()).expect("import");
        let c_host = c.import(c_to_b, &host.remote()).expect("import");
        let mut out = vec![Completion::default(); 8];
        let mut imms = Vec::new();
        let mut poll = |ep: &mut Endpoint, imms: &mut Vec<u32>| {
            let n = ep.poll(&mut out).expect("poll");
            for c in &out[..n] {
                match c.kind {
                    CompletionKind::RemoteWrite { imm } => imms.push(imm),
                    CompletionKind::Write => {}
                    ref k => panic!("{k:?}"),
                }
            }
        };
        let small = |mr, ep: &mut Endpoint, to, remote: &RemoteRegion<UcxKey>, off, imm| {
            let r = remote.slice(off, 8).expect("remote slice");
            post(ep.post_write(
                to,
                LocalSlice::new(mr, 0, 8).expect("slice"),
                r,
                Some(imm),
                0,
            ));
        };
        // Both initiators' connections up first: one WRITE with immediate each.
        small(&small_a, &mut a, a_to_b, &a_host, 0, 1);
        small(&small_c, &mut c, c_to_b, &c_host, 8, 2);
        let t0 = Instant::now();
        while imms.len() < 2 {
            poll(&mut a, &mut Vec::new());
            poll(&mut c, &mut Vec::new());
            poll(&mut b, &mut imms);
            assert!(t0.elapsed() < Duration::from_secs(20), "{imms:?}");
        }
        for _ in 0..100 {
            poll(&mut a, &mut Vec::new());
            poll(&mut c, &mut Vec::new());
        }
        imms.clear();
        // a's rendezvous, and a's WRITE with immediate 5 behind it. a progresses until b began
        // receiving the rendezvous, no more: its bytes move only once a answers b.
        let whole = LocalSlice::new(&src, 0, len).expect("slice");
        let into = to_gpu.slice(0, len as u64).expect("remote slice");
        post(a.post_write(a_to_b, whole, into, None, 1));
        small(&small_a, &mut a, a_to_b, &a_host, 0, 5);
        while b.shared.landings.borrow().is_empty() {
            poll(&mut a, &mut Vec::new());
            poll(&mut b, &mut imms);
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "a's rendezvous never began"
            );
        }
        small(&small_c, &mut c, c_to_b, &c_host, 8, 7);
        while imms.is_empty() {
            poll(&mut c, &mut Vec::new());
            poll(&mut b, &mut imms);
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "c's immediate waits (behind a's landing?)"
            );
        }
        // Time for a's immediate to show, were it not held.
        for _ in 0..2000 {
            poll(&mut c, &mut Vec::new());
            poll(&mut b, &mut imms);
        }
        assert_eq!(
            imms,
            [7],
            "c's immediate at once, a's held behind a's landing"
        );
        while imms.len() < 2 {
            poll(&mut a, &mut Vec::new());
            poll(&mut b, &mut imms);
            assert!(t0.elapsed() < Duration::from_secs(20), "{imms:?}");
        }
        assert_eq!(imms, [7, 5]);
        let l = b.shared.landings.borrow();
        assert!(l.is_empty());
        assert_eq!(
            l.initiators(),
            2,
            "a's and c's origins as b computed them at add_peer"
        );
        drop(l);
        let landed = gpu.memory().host().expect("host").to_vec();
        assert!(landed[..] == pattern[..], "a's rendezvous WRITE's bytes");
    }

    /// Which posts ask UCX for its bandwidth protocols (UCP_OP_ATTR_FLAG_MULTI_SEND,
    /// `stream.rs`): a ping-pong's never (ucx_perftest's tag_lat and ucp_put_lat set it on
    /// neither side), a stream's yes (tag_bw and ucp_put_bw set it on every call), its sends
    /// and puts too where UCX finished each inside its post call (eager sends, cma puts). Over
    /// shared memory: two endpoints of this process; what `poll` reports ends a stream.
    #[test]
    fn only_a_stream_asks_for_bandwidth_protocols() {
        let (mut a, mut b, to_b, to_a) = sm_pair(&[]);
        // Above sm's eager sizes: a send stays unfinished at UCX until b takes it.
        let len = 4 << 20;
        let (src, dst) = (host_region(&mut a, len), host_region(&mut b, 8 * len));
        let (bsrc, adst) = (host_region(&mut b, 4096), host_region(&mut a, 4096));
        let at = |mr, i: usize| LocalSlice::new(mr, i * len, len).expect("slice");
        let mut out = vec![Completion::default(); 8];
        // Poll both until `done` holds of a's and b's completions so far.
        let mut until =
            |a: &mut Endpoint, b: &mut Endpoint, done: &dyn Fn(&[CompletionKind]) -> bool| {
                let (mut seen, t0) = (Vec::new(), Instant::now());
                while !done(&seen) {
                    for ep in [&mut *a, &mut *b] {
                        let n = ep.poll(&mut out).expect("poll");
                        seen.extend(out[..n].iter().map(|c| c.kind.clone()));
                    }
                    assert!(
                        t0.elapsed() < Duration::from_secs(10),
                        "never done: {seen:?}"
                    );
                }
            };
        // The latency ping-pong posts its third receive beside two (bench-core's lat, AHEAD).
        post(b.post_recv(at(&dst, 0), 0));
        post(b.post_recv(at(&dst, 1), 1));
        assert!(
            !stream::recv_is_stream(b.caps.rx_depth - b.free_rx.len()),
            "a ping-pong's receive would ask for bandwidth protocols"
        );
        // A stream's window of receives does.
        post(b.post_recv(at(&dst, 2), 2));
        post(b.post_recv(at(&dst, 3), 3));
        assert!(stream::recv_is_stream(b.caps.rx_depth - b.free_rx.len()));
        // A lone send: no stream's. Unfinished at UCX until b took it.
        assert!(!a.streams.next_send(a.shared.sends_unfinished.get() > 0));
        post(a.post_send(to_b, at(&src, 0), 10));
        assert_eq!(
            a.shared.sends_unfinished.get(),
            1,
            "a rendezvous send in flight"
        );
        until(&mut a, &mut b, &|k| k.contains(&CompletionKind::Send));
        // Finished at UCX and reported: a send posted now, with no answer between, is one
        // of a stream.
        assert_eq!(a.shared.sends_unfinished.get(), 0);
        assert!(a.streams.next_send(false), "a stream's second send");
        // b answers: a's next send, after a's poll reported the receive, is no stream's.
        post(a.post_recv(LocalSlice::new(&adst, 0, 4096).expect("slice"), 20));
        assert!(!b.streams.next_send(false), "b has only received");
        post(b.post_send(to_a, LocalSlice::new(&bsrc, 0, 4096).expect("slice"), 30));
        let recv =
            |k: &[CompletionKind]| k.iter().any(|k| matches!(k, CompletionKind::Recv { .. }));
        until(&mut a, &mut b, &recv);
        assert!(
            !a.streams.next_send(false),
            "a ping-pong's send after the answer"
        );
        // WRITEs: the first no stream's, the next one is; an immediate reported ends it.
        let bdst = b
            .import(to_a, &adst.remote())
            .expect("b imports a's region");
        let adst_b = a.import(to_b, &dst.remote()).expect("a imports b's region");
        assert!(!a.streams.next_write());
        let w = |r: &RemoteRegion<UcxKey>| r.slice(0, 4096).expect("remote slice");
        let small = LocalSlice::new(&src, 0, 4096).expect("slice");
        post(a.post_write(to_b, small, w(&adst_b), None, 40));
        assert!(a.streams.next_write(), "a stream's second WRITE");
        let from_b = LocalSlice::new(&bsrc, 0, 4096).expect("slice");
        post(b.post_write(to_a, from_b, w(&bdst), Some(7), 50));
        let imm = |k: &[CompletionKind]| k.contains(&CompletionKind::RemoteWrite { imm: 7 });
        until(&mut a, &mut b, &imm);
        assert!(
            !a.streams.next_write(),
            "a ping-pong's WRITE after the immediate"
        );
    }

    /// Option `multi_send`: `off` opens an endpoint none of whose calls asks for UCX's
    /// bandwidth protocols (an A/B of UCX's choices); a value it does not know is an error.
    #[test]
    fn multi_send_off_asks_for_nothing() {
        let nic = |v: &str| {
            NicDesc::provider("sm")
                .with_option("peer_errors", "off")
                .with_option("multi_send", v)
        };
        let ep = Endpoint::open(&nic("stream")).unwrap_or_else(|e| panic!("UCX over sm: {e}"));
        assert!(ep.streams.next_send(true) && ep.streams.recv(stream::STREAM_RECVS));
        let mut ep = Endpoint::open(&nic("off")).unwrap_or_else(|e| panic!("UCX over sm: {e}"));
        assert!(!ep.streams.send(true) && !ep.streams.send(false) && !ep.streams.write());
        assert!(!ep.streams.write() && !ep.streams.recv(usize::MAX));
        let e = Endpoint::open(&nic("always"))
            .err()
            .expect("multi_send=always refused");
        assert!(e.to_string().contains("multi_send"), "{e}");
    }

    /// Puts name their region's memh (option `memh`, on by default), the one before a WRITE's
    /// flush too: without it UCX 1.22 makes a memory handle per put, a calloc and a free on the
    /// post path (docs/measurements.md, U59).
    #[test]
    fn puts_name_their_region_unless_memh_is_off() {
        for (opt, named) in [(None, true), (Some("off"), false)] {
            let mut nic = NicDesc::provider("sm").with_option("peer_errors", "off");
            if let Some(v) = opt {
                nic = nic.with_option("memh", v);
            }
            let mut ep = Endpoint::open(&nic).unwrap_or_else(|e| panic!("UCX over sm: {e}"));
            let mr = host_region(&mut ep, 4096);
            let field = sys::UCP_OP_ATTR_FIELD_MEMH | sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE;
            let s = &ep.shared.slots[0];
            for p in [
                Endpoint::put_params(ep.name_memory, Some(s), &mr),
                Endpoint::put_params(ep.name_memory, None, &mr),
            ] {
                assert_eq!(p.op_attr_mask & field == field, named, "memh {opt:?}");
                assert_eq!(p.memh == mr.map.memh, named, "memh {opt:?}");
                assert_eq!(p.memory_type, if named { mr.mtype } else { 0 });
            }
            assert_ne!(
                Endpoint::put_params(ep.name_memory, Some(s), &mr).op_attr_mask
                    & sys::UCP_OP_ATTR_FIELD_CALLBACK,
                0
            );
            assert_eq!(
                Endpoint::put_params(ep.name_memory, None, &mr).op_attr_mask
                    & sys::UCP_OP_ATTR_FIELD_CALLBACK,
                0
            );
        }
    }

    /// A poll with something queued to report skips progress, at most `progress_skip` polls
    /// in a row: a loop that posts eager sends, which UCX finishes inside the post call, and
    /// polls without pause still receives its peer's message, at the first poll that
    /// progresses. With `progress_skip=0`, at the first poll.
    #[test]
    fn poll_skips_progress_while_it_has_something_to_report() {
        for (opt, first_progress) in [(None, SKIP_DEFAULT), (Some("5"), 5), (Some("0"), 0)] {
            let opts: Vec<(&str, &str)> = opt.map(|v| ("progress_skip", v)).into_iter().collect();
            let (mut a, mut b, to_b, to_a) = sm_pair(&opts);
            let (ma, mb) = (host_region(&mut a, 64), host_region(&mut b, 64));
            let at = |mr, off: usize| LocalSlice::new(mr, off, 8).expect("slice");
            post(a.post_recv(at(&ma, 0), 1));
            // Eager: in a's shared-memory FIFO once the post returns.
            post(b.post_send(to_a, at(&mb, 0), 2));
            let mut out = vec![Completion::default(); 8];
            let mut received = None;
            for turn in 0..4 * SKIP_DEFAULT {
                // An eager send of 8 bytes: finished (queued) inside the post call.
                post(a.post_send(to_b, at(&ma, 8), 100 + u64::from(turn)));
                assert!(!a.instant.is_empty(), "the send was not finished");
                let n = a.poll(&mut out).expect("a's poll");
                b.poll(&mut out[n..]).expect("b's poll");
                if out[..n]
                    .iter()
                    .any(|c| matches!(c.kind, CompletionKind::Recv { len: 8, .. }))
                {
                    received = Some(turn);
                    break;
                }
            }
            assert_eq!(received, Some(first_progress), "progress {opt:?}");
        }
    }

    /// Operations UCX finished inside their post calls are reported each with its own context:
    /// an eager send (from `instant`), and a receive posted after its message arrived (UCX
    /// matches the unexpected message at once) with the message's length: from `instant`
    /// where UCX writes the length then (1.16 on), else through the callback it is asked for
    /// (1.13 left the length unwritten, and this reported 0 bytes).
    #[test]
    fn operations_finished_inside_their_post_report_their_context_and_length() {
        let (mut a, mut b, to_b, _) = sm_pair(&[]);
        let (ma, mb) = (host_region(&mut a, 64), host_region(&mut b, 64));
        let mut out = vec![Completion::default(); 8];
        for (len, ctx) in [(24usize, 7u64), (5, 11)] {
            post(a.post_send(to_b, LocalSlice::new(&ma, 8, len).expect("slice"), ctx));
            assert_eq!(
                a.instant,
                [0],
                "the eager send was not finished inside its post"
            );
            let n = a.poll(&mut out).expect("a's poll");
            assert!(
                matches!(out[..n], [Completion { ctx: c, kind: CompletionKind::Send }] if c == ctx),
                "{:?}",
                &out[..n]
            );
            // b's progress takes the message in, unexpected: no receive is posted.
            for _ in 0..100 {
                assert_eq!(b.poll(&mut out).expect("b's poll"), 0);
            }
            post(b.post_recv(LocalSlice::new(&mb, 0, 64).expect("slice"), ctx + 1));
            let finished = if b.recv_info_at_once {
                b.instant.len()
            } else {
                b.shared.done.len()
            };
            assert_eq!(finished, 1, "the receive was not finished inside its post");
            let n = b.poll(&mut out).expect("b's poll");
            assert!(
                matches!(out[..n], [Completion { ctx: c, kind: CompletionKind::Recv { len: l, imm: None } }]
                    if c == ctx + 1 && l == len),
                "{:?}",
                &out[..n]
            );
            assert!(a.instant.is_empty() && b.instant.is_empty());
        }
    }

    /// A poll progresses again while the last call did something and operations are still
    /// unfinished, at most `progress_burst` times; once where either is not so.
    #[test]
    fn burst_progresses_while_it_helps() {
        let unfinished = std::cell::Cell::new(true);
        let calls = |max, did: u32, left: Option<u32>| {
            let made = std::cell::Cell::new(0);
            let n = burst(
                max,
                || {
                    made.set(made.get() + 1);
                    if left.is_some_and(|l| made.get() >= l) {
                        unfinished.set(false);
                    }
                    did
                },
                || unfinished.get(),
            );
            unfinished.set(true);
            assert_eq!(n, made.get());
            n
        };
        assert_eq!(
            calls(8, 1, None),
            8,
            "puts in flight, each call finishing one"
        );
        assert_eq!(calls(1, 1, None), 1, "progress_burst=1");
        assert_eq!(calls(8, 0, None), 1, "nothing happened");
        assert_eq!(
            calls(8, 1, Some(3)),
            3,
            "the last operation finished at the third call"
        );
        assert_eq!(calls(8, 1, Some(1)), 1, "a ping-pong's receive");
    }

    #[test]
    fn progress_options_out_of_range_are_refused() {
        for (key, v) in [
            ("progress_burst", "0"),
            ("progress_burst", "65"),
            ("progress_skip", "-1"),
            ("progress_skip", "x"),
        ] {
            let nic = NicDesc::provider("sm").with_option(key, v);
            match Endpoint::open(&nic) {
                Ok(_) => panic!("{key}={v} was taken"),
                Err(e) => assert!(e.to_string().contains(&format!("{key}={v}")), "{e}"),
            }
        }
    }
}
