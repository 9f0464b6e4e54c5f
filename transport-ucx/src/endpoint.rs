//! The endpoint: a UCP context and worker, its peers, its regions, the keys it imported, and
//! the request slab its operations run in.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use transport_core::{
    check_options, mapped_library, BackendInfo, Caps, Completion, CompletionError, CompletionKind,
    EndpointAddr, Error, KeyBytes, Landing, LocalSlice, Memory, MemoryMut, MemoryRegion, NicDesc,
    Op, PeerId, Post, RemoteMr, RemoteRegion, RemoteSlice, Result, Runtime, Transport,
};
use ucx_sys as sys;

use crate::frame::{self, Kind};

/// The active message id of an immediate.
const AM_IMM: u32 = 0x1d;
/// The active message id of a small WRITE with immediate carried whole: the header is the
/// immediate and the target address, the data the bytes ([`INLINE_MAX`] at most).
const AM_WRITE_IMM: u32 = 0x1e;
/// Largest WRITE with immediate sent as one active message (host memory on both sides, no
/// put of this peer unflushed): UCX 1.22 runs every put into heap memory over cma, one
/// process_vm_writev per put, which an 8-byte credit WRITE paid on every 64 messages.
const INLINE_MAX: usize = 64;
/// Header of an `AM_WRITE_IMM`: immediate (4), target address (8) and the target region's
/// token (8, from its key), little endian.
const INLINE_HDR: usize = 20;
/// `UCP_AM_RECV_ATTR_FLAG_RNDV` (ucp.h: `UCS_BIT(17)` in 1.13 and 1.22; not in the bindings).
const AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;
/// The tag of every SEND (received with a full mask).
const SEND_TAG: u64 = 0x7263_6d61_5f73_6e64;
const DEFAULT_TX: usize = 1024;
const DEFAULT_RX: usize = 1024;
/// Immediates kept before `poll` hands them out; more only where the application does not
/// poll (the queue then grows, off the normal path).
const IMM_QUEUE: usize = 1 << 16;

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// UCX's own text for `status`.
pub(crate) fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string takes any status value and returns a pointer to a static,
    // NUL-terminated string (an "unknown" one for values it does not know).
    let p = unsafe { sys::ucs_status_string(status) };
    if p.is_null() {
        return format!("UCX status {status}");
    }
    // SAFETY: p is non-null and points to a static NUL-terminated string (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn provider_error(call: &'static str, status: sys::ucs_status_t, hint: &str) -> Error {
    Error::Provider {
        call,
        code: i32::from(status),
        msg: status_text(status),
        hint: hint.to_string(),
    }
}

fn check(call: &'static str, status: sys::ucs_status_t, hint: &str) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(provider_error(call, status, hint))
    }
}

/// The UCP context; shared by the endpoint and its regions so that a region outliving its
/// endpoint still unmaps into a live context.
struct Context {
    ctx: sys::ucp_context_h,
    cuda: bool,
}

// SAFETY: the context is created with `mt_workers_shared`, which makes its calls
// (ucp_mem_map, ucp_mem_unmap, ucp_rkey_pack, ucp_cleanup) safe from any thread; the handle
// itself is an opaque pointer that UCX owns.
unsafe impl Send for Context {}
// SAFETY: as above; every call taking `&Context` is thread-safe on such a context.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ctx came from ucp_init_version and is cleaned up once, here, after every
        // worker (the endpoint's, destroyed in its Drop) and every mapping (each region holds
        // an Arc of this) is gone.
        unsafe { sys::ucp_cleanup(self.ctx) };
    }
}

/// Memory of regions dropped while their endpoint lives: a peer's put over tcp or cma writes
/// at the address it was given without the target checking any registration, so a put still
/// on its way when a region is dropped must find the memory there. The endpoint frees it once
/// its worker is destroyed (nothing arrives any more).
type Graveyard = Mutex<Vec<Memory>>;

/// A registered region.
pub struct UcxMr {
    /// `None` only while the region is being taken apart (deregister, drop).
    mem: Option<Memory>,
    len: usize,
    grave: Weak<Graveyard>,
    map: Mapping,
    /// The endpoint that registered it.
    owner: u32,
    /// Start address of the memory (host or device pointer).
    base: usize,
    /// What `ucp_mem_map` was told the memory is: sends and receives name it (with the
    /// mapping) so that UCX does not detect it per call.
    mtype: sys::ucs_memory_type_t,
    remote: RemoteMr,
}

/// A `ucp_mem_map` handle and the context it belongs to; unmapped when dropped.
struct Mapping {
    memh: sys::ucp_mem_h,
    ctx: Arc<Context>,
}

// SAFETY: the memh is only used in ucp_mem_unmap on its (thread-safe, see Context) context.
unsafe impl Send for Mapping {}

impl Mapping {
    fn unmap(&mut self) -> sys::ucs_status_t {
        if self.memh.is_null() {
            return sys::UCS_OK;
        }
        // SAFETY: memh was returned by ucp_mem_map on ctx, which is alive (we hold an Arc),
        // and is unmapped once: it is nulled right after.
        let st = unsafe { sys::ucp_mem_unmap(self.ctx.ctx, self.memh) };
        self.memh = ptr::null_mut();
        st
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = self.unmap();
    }
}

impl Drop for UcxMr {
    fn drop(&mut self) {
        let _ = self.map.unmap();
        if let (Some(mem), Some(grave)) = (self.mem.take(), self.grave.upgrade()) {
            if let Ok(mut g) = grave.lock() {
                g.push(mem);
            }
        }
    }
}

const TAKEN: &str = "a region's memory is only taken when the region is consumed";

impl MemoryRegion for UcxMr {
    fn memory(&self) -> &Memory {
        self.mem.as_ref().expect(TAKEN)
    }
    fn memory_mut(&mut self) -> MemoryMut<'_> {
        MemoryMut::new(self.mem.as_mut().expect(TAKEN))
    }
    fn remote(&self) -> RemoteMr {
        self.remote.clone()
    }
}

/// A key imported with `import`: a token into the endpoint's table of unpacked rkeys, checked
/// by every post (a key of another endpoint or another peer is a refused post).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UcxKey {
    endpoint: u32,
    index: u32,
}

struct Imported {
    peer: u32,
    addr: u64,
    len: u64,
    rkey: sys::ucp_rkey_h,
    /// The peer registered the region as host memory (the key's first byte says so): its
    /// token, which a WRITE carried as an active message must name.
    host: Option<u64>,
}

/// A peer: its `ucp_ep` and the status its error handler reported (`UCS_OK` while healthy).
/// Boxed: the error handler's argument points at `failed`.
struct Peer {
    ep: sys::ucp_ep_h,
    failed: Cell<sys::ucs_status_t>,
    /// Puts posted to this peer, and how many of the first ones a completed flush covers:
    /// equal, every put is at the target and a WRITE with immediate may skip its own flush.
    puts: Cell<u64>,
    flushed: Cell<u64>,
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
    /// The active message's header: the immediate (valid until that send completes).
    imm: Cell<u32>,
    /// A flush's count of the peer's puts before it (`Peer::puts`).
    seq: Cell<u64>,
    /// An `AM_WRITE_IMM`'s header (valid until that send completes).
    hdr: Cell<[u8; INLINE_HDR]>,
    /// The request UCX returned, freed when the slot's completion is handled.
    req: Cell<*mut c_void>,
    status: Cell<sys::ucs_status_t>,
    /// For receives: where UCX writes the tag and length of an immediate completion.
    info: UnsafeCell<sys::ucp_tag_recv_info_t>,
}

/// What UCX's callbacks write, all behind shared references (`Cell`, `RefCell`): the callbacks
/// run inside `ucp_worker_progress`, called from `poll` and `Drop` while the endpoint holds no
/// borrow of these.
struct Shared {
    slots: Box<[Slot]>,
    /// Slots whose operation (or step of one) completed, in order.
    done: RefCell<VecDeque<u32>>,
    /// Immediates that arrived.
    imms: RefCell<VecDeque<u32>>,
    /// Host regions this endpoint registered (start, length): where an `AM_WRITE_IMM` may
    /// write. Changed only by register and deregister (`&mut self`, no progress running).
    host_regions: RefCell<Vec<HostRegion>>,
}

/// A host region this endpoint registered, as an `AM_WRITE_IMM` may write into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HostRegion {
    base: usize,
    len: usize,
    /// Travels in the region's key; a WRITE carried as an active message must name it. UCX
    /// checks a put's rkey; the handler, which writes by address, checks this instead, so a
    /// stale or foreign key does not write here (a guard against mistakes, not an attacker).
    token: u64,
}

/// A token for a region: unpredictable across regions and processes (`RandomState` draws its
/// keys from the OS once per thread and steps them per call).
fn region_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(0x7563_785f);
    h.finish()
}

/// One endpoint: a UCP context and worker.
pub struct Endpoint {
    id: u32,
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
    caps: Caps,
    grave: Arc<Graveyard>,
    tls: String,
    devices: String,
    version: String,
    /// UCP_ERR_HANDLING_MODE_PEER (option `peer_errors`, default on).
    peer_errors: bool,
    /// Sends and receives name their region's memh and memory type (option `memh`).
    name_memory: bool,
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
    /// UCX's version as the loaded library reports it, e.g. `1.13.1`.
    pub fn ucx_version() -> String {
        // SAFETY: returns a pointer to a static NUL-terminated string.
        let p = unsafe { sys::ucp_get_version_string() };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, static, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn open_ucx(nic: &NicDesc) -> Result<Self> {
        check_options(&crate::INFO, &nic.options)?;
        let peer_errors = match nic.options.get("peer_errors").map(String::as_str) {
            None | Some("auto") => !crate::shared_memory_only(nic.provider.as_deref()),
            Some("on") => true,
            Some("off") => false,
            Some(v) => return Err(crate::INFO.unknown_option("peer_errors", v)),
        };
        let name_memory = match nic.options.get("memh").map(String::as_str) {
            None | Some("on") => true,
            Some("off") => false,
            Some(v) => return Err(crate::INFO.unknown_option("memh", v)),
        };
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: NULL prefix and file: UCX reads its UCX_* environment; config_p is a valid
        // out pointer.
        let st = unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) };
        check(
            "ucp_config_read",
            st,
            "check the UCX_* environment variables",
        )?;
        let modify = |name: &str, value: &str| -> Result<()> {
            let (n, v) = (cstring("UCX setting", name)?, cstring("UCX value", value)?);
            // SAFETY: config is the live config read above; both strings are NUL-terminated
            // and outlive the call (UCX copies the value).
            let st = unsafe { sys::ucp_config_modify(config, n.as_ptr(), v.as_ptr()) };
            check(
                "ucp_config_modify",
                st,
                &format!("UCX refused {name}={value}: see `ucx_info -d` for what this host has"),
            )
        };
        let mut r = Ok(());
        if let Some(p) = nic.provider.as_deref() {
            r = r.and_then(|_| modify("TLS", p));
        }
        if let Some(d) = nic.device.as_deref() {
            r = r.and_then(|_| modify("NET_DEVICES", d));
        }
        let ctx = r.and_then(|_| {
            let params = sys::ucp_params_t {
                field_mask: u64::from(
                    sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                ),
                features: u64::from(
                    sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_TAG | sys::UCP_FEATURE_AM,
                ),
                mt_workers_shared: 1,
                ..Default::default()
            };
            let mut ctx: sys::ucp_context_h = ptr::null_mut();
            // SAFETY: params and config are valid for the call; ctx is a valid out pointer.
            // ucp_init is this static inline call with the header's API version.
            let st = unsafe {
                sys::ucp_init_version(
                    sys::UCP_API_MAJOR,
                    sys::UCP_API_MINOR,
                    &params,
                    config,
                    &mut ctx,
                )
            };
            match st {
                sys::UCS_OK => Ok(ctx),
                sys::UCS_ERR_NO_DEVICE | sys::UCS_ERR_NO_ELEM | sys::UCS_ERR_UNSUPPORTED => {
                    Err(Error::NoDevice(format!(
                        "UCX opened no transport for TLS={} NET_DEVICES={}: {} (see `ucx_info -d`)",
                        nic.provider.as_deref().unwrap_or("(default)"),
                        nic.device.as_deref().unwrap_or("(default)"),
                        status_text(st)
                    )))
                }
                _ => Err(provider_error("ucp_init", st, "see `ucx_info -d`")),
            }
        });
        // SAFETY: config came from ucp_config_read and is released once; UCX copied what it
        // needed into the context.
        unsafe { sys::ucp_config_release(config) };
        let ctx = ctx?;
        let mut attr = sys::ucp_context_attr_t {
            field_mask: u64::from(sys::UCP_ATTR_FIELD_MEMORY_TYPES),
            ..Default::default()
        };
        // SAFETY: ctx is live; attr is a valid in/out struct.
        let st = unsafe { sys::ucp_context_query(ctx, &mut attr) };
        let cuda = st == sys::UCS_OK && attr.memory_types & (1 << sys::UCS_MEMORY_TYPE_CUDA) != 0;
        let ctx = Arc::new(Context { ctx, cuda });

        let wparams = sys::ucp_worker_params_t {
            field_mask: u64::from(sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE),
            thread_mode: sys::UCS_THREAD_MODE_SERIALIZED,
            ..Default::default()
        };
        let mut worker: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: ctx is live; wparams valid; worker a valid out pointer.
        let st = unsafe { sys::ucp_worker_create(ctx.ctx, &wparams, &mut worker) };
        check("ucp_worker_create", st, "see `ucx_info -d`")?;

        let tx = nic.tx_depth.unwrap_or(DEFAULT_TX).clamp(1, 1 << 16);
        let rx = nic.rx_depth.unwrap_or(DEFAULT_RX).clamp(1, 1 << 16);
        let slots: Box<[Slot]> = (0..tx + rx)
            .map(|i| Slot {
                shared: Cell::new(ptr::null()),
                index: i as u32,
                state: Cell::new(State::Free),
                ctx: Cell::new(0),
                peer: Cell::new(0),
                imm: Cell::new(0),
                seq: Cell::new(0),
                hdr: Cell::new([0; INLINE_HDR]),
                req: Cell::new(ptr::null_mut()),
                status: Cell::new(sys::UCS_OK),
                info: UnsafeCell::new(sys::ucp_tag_recv_info_t::default()),
            })
            .collect();
        let shared = Box::new(Shared {
            slots,
            done: RefCell::new(VecDeque::with_capacity(tx + rx)),
            imms: RefCell::new(VecDeque::with_capacity(IMM_QUEUE)),
            host_regions: RefCell::new(Vec::new()),
        });
        let sp: *const Shared = &*shared;
        for s in shared.slots.iter() {
            s.shared.set(sp);
        }
        // Built now so that Drop cleans the worker up if anything below fails.
        let mut ep = Endpoint {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ctx,
            worker,
            address: Vec::new(),
            peers: Vec::new(),
            imported: Vec::new(),
            shared,
            free_tx: (0..tx as u32).rev().collect(),
            free_rx: (tx as u32..(tx + rx) as u32).rev().collect(),
            caps: Caps::default(),
            grave: Arc::new(Mutex::new(Vec::new())),
            tls: nic.provider.clone().unwrap_or_else(|| "all".into()),
            // The transports this backend opens move GPU memory with CUDA copies (cuda_copy,
            // cuda_ipc); a UCX with GPUDirect RDMA (rc with CUDA) would need the NIC's flush.
            landing: if crate::nic_driver(Some(nic.provider.as_deref().unwrap_or("all"))).is_some()
            {
                Landing::NicDma
            } else {
                Landing::ProviderCopy
            },
            devices: nic.device.clone().unwrap_or_else(|| "all".into()),
            version: Self::ucx_version(),
            peer_errors,
            name_memory,
        };

        let hparams = sys::ucp_am_handler_param_t {
            field_mask: u64::from(
                sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
            ),
            id: AM_IMM,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(on_imm),
            arg: sp as *mut c_void,
        };
        // SAFETY: worker is live; arg points at the boxed Shared, which lives as long as the
        // worker (the worker is destroyed first in Drop), and on_imm only reads it shared.
        let st = unsafe { sys::ucp_worker_set_am_recv_handler(ep.worker, &hparams) };
        check("ucp_worker_set_am_recv_handler", st, "")?;
        let hparams = sys::ucp_am_handler_param_t {
            id: AM_WRITE_IMM,
            cb: Some(on_write_imm),
            ..hparams
        };
        // SAFETY: as above; on_write_imm reads Shared shared and writes only into host
        // regions this endpoint registered (checked against `host_regions`).
        let st = unsafe { sys::ucp_worker_set_am_recv_handler(ep.worker, &hparams) };
        check("ucp_worker_set_am_recv_handler", st, "")?;

        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: worker is live; out pointers valid.
        let st = unsafe { sys::ucp_worker_get_address(ep.worker, &mut addr, &mut len) };
        check("ucp_worker_get_address", st, "")?;
        // SAFETY: UCX returned `len` readable bytes at addr, released right after the copy.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker; released once.
        unsafe { sys::ucp_worker_release_address(ep.worker, addr) };
        ep.address = frame::wrap(Kind::Address, &bytes);

        ep.caps = Caps {
            max_msg_size: 1 << 30,
            max_write_size: 1 << 30,
            tx_depth: tx,
            rx_depth: rx,
            inject_size: 0,
            cq_data_size: 4,
            gpu_memory: ep.ctx.cuda,
            link_gbps: None,
            // Out-of-range WRITEs and keys that are no keys are refused here, at post and
            // import; a key of the right form naming no region of the peer is not refused by
            // every UCX transport at the target (tcp and cma write where they are told).
            remote_write_errors: false,
        };
        Ok(ep)
    }

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

    fn take_slot(&mut self, rx: bool) -> Option<&Slot> {
        let i = if rx {
            self.free_rx.pop()?
        } else {
            self.free_tx.pop()?
        };
        Some(&self.shared.slots[i as usize])
    }

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
    /// return the error).
    #[inline]
    fn started(&mut self, i: u32, call: &'static str, r: sys::ucs_status_ptr_t) -> Result<Post> {
        let s = &self.shared.slots[i as usize];
        match sys::ptr_status(r) {
            Ok(Some(req)) => {
                s.req.set(req);
                Ok(Post::Posted)
            }
            Ok(None) => {
                s.status.set(sys::UCS_OK);
                self.shared.done.borrow_mut().push_back(i);
                Ok(Post::Posted)
            }
            Err(st) => {
                self.give_back(i);
                Err(provider_error(call, st, "the peer may be gone"))
            }
        }
    }

    fn params(s: &Slot) -> sys::ucp_request_param_t {
        let mut p = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
            user_data: s as *const Slot as *mut c_void,
            ..Default::default()
        };
        p.cb.send = Some(on_send);
        p
    }

    /// Name the memory of a send or receive: its type and its `ucp_mem_map` handle (the
    /// buffer lies inside the mapping: `local` checked it), as `ucx_perftest -z` does. Without
    /// them UCX detects the memory type per call (UCX 1.22's CUDA build: a memtype-cache
    /// lookup, and `cuPointerGetAttributes` where the cache has no device for the range) and
    /// looks a zero-copy send's registration up in its cache.
    #[inline]
    fn set_memory(p: &mut sys::ucp_request_param_t, mr: &UcxMr) {
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
        // SAFETY: ep is a live endpoint of this worker; the header is the slot's `imm`, which
        // stays valid and unchanged until the send completes (the slot is busy until then);
        // no data; the callback's user_data is the slot, alive as long as the endpoint.
        let r = unsafe {
            sys::ucp_am_send_nbx(
                ep,
                AM_IMM,
                s.imm.as_ptr() as *const c_void,
                4,
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
            })),
        }
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

/// A send, put, flush or active message finished (or failed): note it in its slot and queue
/// the slot.
unsafe extern "C" fn on_send(_req: *mut c_void, status: sys::ucs_status_t, user: *mut c_void) {
    // SAFETY: user is the `&Slot` given at post: the slab lives as long as the worker whose
    // progress calls this, and slots are only read through shared references (Cells).
    let s = unsafe { &*(user as *const Slot) };
    s.status.set(status);
    // SAFETY: `shared` points at the Box<Shared> that holds this slot.
    let shared = unsafe { &*s.shared.get() };
    shared.done.borrow_mut().push_back(s.index);
}

/// A receive finished: its length is in `info`.
unsafe extern "C" fn on_recv(
    _req: *mut c_void,
    status: sys::ucs_status_t,
    info: *const sys::ucp_tag_recv_info_t,
    user: *mut c_void,
) {
    // SAFETY: as in on_send.
    let s = unsafe { &*(user as *const Slot) };
    s.status.set(status);
    if !info.is_null() {
        // SAFETY: UCX passes a valid info for the call's duration; the slot's `info` is only
        // read in poll, not while progress runs.
        unsafe { *s.info.get() = *info };
    }
    // SAFETY: as in on_send.
    let shared = unsafe { &*s.shared.get() };
    shared.done.borrow_mut().push_back(s.index);
}

/// An immediate arrived: its 4-byte header is the value. Runs after the flush that made the
/// WRITE's bytes visible here had completed at the initiator.
unsafe extern "C" fn on_imm(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    _data: *mut c_void,
    _len: usize,
    _param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    if header_len != 4 || header.is_null() {
        return sys::UCS_OK;
    }
    // SAFETY: UCX passes header_len (4, checked) readable bytes; read unaligned.
    let imm = unsafe { ptr::read_unaligned(header as *const u32) };
    // SAFETY: arg is the endpoint's boxed Shared (set with the handler, alive with the worker).
    let shared = unsafe { &*(arg as *const Shared) };
    shared.imms.borrow_mut().push_back(u32::from_le(imm));
    sys::UCS_OK
}

/// A small WRITE with immediate carried whole (`AM_WRITE_IMM`): copy the bytes to the
/// address its header names, then queue the immediate, so the immediate is never seen before
/// the bytes. A range outside the host region whose token the header names (or a token of no
/// region here: a stale or foreign key), a header of another size, more than `INLINE_MAX`
/// bytes or a rendezvous are dropped (an honest peer checked the range against the key it
/// imported before sending).
unsafe extern "C" fn on_write_imm(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    if header_len != INLINE_HDR || header.is_null() || len > INLINE_MAX {
        return sys::UCS_OK;
    }
    if len > 0 && data.is_null() {
        return sys::UCS_OK;
    }
    // SAFETY: UCX passes a valid param for the call's duration where it passes one.
    if !param.is_null() && unsafe { (*param).recv_attr } & AM_RECV_ATTR_FLAG_RNDV != 0 {
        return sys::UCS_OK;
    }
    let mut h = [0u8; INLINE_HDR];
    // SAFETY: UCX passes header_len (INLINE_HDR, checked) readable bytes at header.
    unsafe { ptr::copy_nonoverlapping(header as *const u8, h.as_mut_ptr(), INLINE_HDR) };
    let imm = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let mut a = [0u8; 8];
    a.copy_from_slice(&h[4..12]);
    let addr = u64::from_le_bytes(a) as usize;
    a.copy_from_slice(&h[12..20]);
    let token = u64::from_le_bytes(a);
    // SAFETY: arg is the endpoint's boxed Shared (set with the handler, alive with the worker);
    // no borrow of its RefCells is held while progress runs.
    let shared = unsafe { &*(arg as *const Shared) };
    let fits = shared.host_regions.borrow().iter().any(|r| {
        r.token == token
            && addr >= r.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= r.base + r.len)
    });
    if !fits {
        return sys::UCS_OK;
    }
    if len > 0 {
        // SAFETY: [addr, addr + len) lies in a host region this endpoint registered (checked
        // above), whose memory stays allocated while it is in the table (deregister removes
        // it; a dropped region's memory waits in the graveyard until the endpoint goes); the
        // data are len readable bytes UCX passes for the call (not a rendezvous, checked).
        unsafe { ptr::copy_nonoverlapping(data as *const u8, addr as *mut u8, len) };
    }
    shared.imms.borrow_mut().push_back(imm);
    sys::UCS_OK
}

/// A peer's endpoint failed: remember UCX's status; later posts to it are refused.
unsafe extern "C" fn on_peer_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: arg is the peer's boxed `Peer`, which lives until after its ucp_ep is closed.
    let p = unsafe { &*(arg as *const Peer) };
    p.failed.set(status);
}

impl Transport for Endpoint {
    type Mr = UcxMr;
    type RemoteKey = UcxKey;
    const INFO: &'static BackendInfo = &crate::INFO;

    fn open(nic: &NicDesc) -> Result<Self> {
        Self::open_ucx(nic)
    }

    fn provider(&self) -> &str {
        &self.tls
    }

    fn nic_name(&self) -> &str {
        &self.devices
    }

    fn address(&self) -> EndpointAddr {
        EndpointAddr(self.address.clone())
    }

    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        let worker_addr = frame::unwrap(Kind::Address, &addr.0, "worker address")?;
        let peer = Box::new(Peer {
            ep: ptr::null_mut(),
            failed: Cell::new(sys::UCS_OK),
            puts: Cell::new(0),
            flushed: Cell::new(0),
        });
        let params = sys::ucp_ep_params_t {
            field_mask: u64::from(
                sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER,
            ),
            address: worker_addr.as_ptr() as *const sys::ucp_address_t,
            err_mode: if self.peer_errors {
                sys::UCP_ERR_HANDLING_MODE_PEER
            } else {
                sys::UCP_ERR_HANDLING_MODE_NONE
            },
            err_handler: sys::ucp_err_handler_t {
                cb: Some(on_peer_error),
                arg: &*peer as *const Peer as *mut c_void,
            },
            ..Default::default()
        };
        let mut ep: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: the worker is live; the address bytes passed the frame check (length and
        // hash of what a peer's ucp_worker_get_address gave) and outlive the call; the error
        // handler's arg is the boxed Peer, kept (boxed, never moved) until its ep is closed.
        let st = unsafe { sys::ucp_ep_create(self.worker, &params, &mut ep) };
        let hint = if crate::rc_without_wireup(&self.tls) {
            "no auxiliary wire-up transport: UCX connects rc_verbs (rc_mlx5) endpoints over \
             another transport that reaches the peer's worker address first (UCX's `no \
             auxiliary transport ... Unsupported operation`); add one to the transports, e.g. \
             --provider rc_verbs,tcp or rc_verbs,ud_verbs"
        } else if st == sys::UCS_ERR_UNREACHABLE && self.peer_errors {
            "no transport of TLS reaches the peer with peer error handling: UCX 1.13's \
             shared-memory transports (posix, sysv) have no peer failure handler; add tcp to \
             the transports or pass the option peer_errors=off or auto (a dead peer then \
             hangs operations instead of failing them)"
        } else {
            "is the peer's address from a live UCX endpoint, reachable over TLS?"
        };
        check("ucp_ep_create", st, hint)?;
        let mut peer = peer;
        peer.ep = ep;
        self.peers.push(peer);
        Ok(PeerId(self.peers.len() as u32 - 1))
    }

    fn register(&mut self, mut mem: Memory) -> Result<UcxMr> {
        if mem.is_empty() {
            return Err(Error::InvalidArgument("cannot register 0 bytes".into()));
        }
        let (base, mtype) = match &mut mem {
            Memory::Host(h) => (h.as_mut_ptr() as usize, sys::UCS_MEMORY_TYPE_HOST),
            Memory::Gpu(g) => {
                if !self.ctx.cuda {
                    return Err(Error::Unsupported(format!(
                        "this UCX ({} at {}) has no CUDA memory support (ucp_context_query \
                         lists no UCS_MEMORY_TYPE_CUDA): use a UCX built with CUDA, e.g. the \
                         libucx-cu12 wheel's, through LD_LIBRARY_PATH",
                        self.version,
                        mapped_library("libucp").unwrap_or_else(|| "libucp".into())
                    )));
                }
                (g.device_ptr() as usize, sys::UCS_MEMORY_TYPE_CUDA)
            }
        };
        let params = sys::ucp_mem_map_params_t {
            field_mask: u64::from(
                sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                    | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                    | sys::UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
            ),
            address: base as *mut c_void,
            length: mem.len(),
            memory_type: mtype,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: [base, base + len) is memory `mem` owns (host buffer or CUDA allocation),
        // which the region keeps, at the same address, until it is unmapped.
        let st = unsafe { sys::ucp_mem_map(self.ctx.ctx, &params, &mut memh) };
        check("ucp_mem_map", st, "")?;
        let map = Mapping {
            memh,
            ctx: self.ctx.clone(),
        };
        let mut buf: *mut c_void = ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: memh is the live mapping above; out pointers valid.
        let st = unsafe { sys::ucp_rkey_pack(self.ctx.ctx, memh, &mut buf, &mut size) };
        check("ucp_rkey_pack", st, "")?;
        // SAFETY: UCX returned `size` readable bytes at buf, released right after the copy.
        let packed = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: buf came from ucp_rkey_pack; released once.
        unsafe { sys::ucp_rkey_buffer_release(buf) };
        // The key's first byte says whether the region is host memory; a host region's
        // token follows it (a peer then may carry a small WRITE with immediate into it as one
        // active message, naming the token); UCX's packed key comes last.
        let host = (mtype == sys::UCS_MEMORY_TYPE_HOST).then(region_token);
        let head: Vec<u8> = match host {
            Some(t) => [&[1u8][..], &t.to_le_bytes()].concat(),
            None => vec![0],
        };
        let key = KeyBytes::new(frame::wrap(Kind::Rkey, &[&head[..], &packed[..]].concat()))
            .map_err(|_| {
                Error::Unsupported(format!(
                "UCX packed a {size}-byte remote key, more than a key may carry ({} bytes with \
                 its frame): name fewer transports (--provider)",
                KeyBytes::MAX_LEN
            ))
            })?;
        if let Some(token) = host {
            self.shared.host_regions.borrow_mut().push(HostRegion {
                base,
                len: mem.len(),
                token,
            });
        }
        Ok(UcxMr {
            remote: RemoteMr {
                addr: base as u64,
                len: mem.len() as u64,
                key,
            },
            len: mem.len(),
            mem: Some(mem),
            grave: Arc::downgrade(&self.grave),
            map,
            owner: self.id,
            base,
            mtype,
        })
    }

    /// The memory comes back at once. Over tcp and cma, UCX's target side checks no
    /// registration: a peer's put still on its way lands in it anyway. Deregister a region
    /// peers write into only after their last WRITE's immediate (as the trait asks); a
    /// region that is dropped instead stays allocated until the endpoint goes.
    fn deregister(&mut self, mr: UcxMr) -> Result<Memory> {
        let mut mr = mr;
        check("ucp_mem_unmap", mr.map.unmap(), "")?;
        // A region dropped instead stays in the table: its memory stays allocated (the
        // graveyard) until the endpoint goes.
        let mut regions = self.shared.host_regions.borrow_mut();
        if let Some(k) = regions
            .iter()
            .position(|r| (r.base, r.len) == (mr.base, mr.len))
        {
            regions.swap_remove(k);
        }
        drop(regions);
        Ok(mr.mem.take().expect(TAKEN))
    }

    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<UcxKey>> {
        let ep = self.peer(peer)?.ep;
        let framed = frame::unwrap(Kind::Rkey, mr.key.as_bytes(), "remote key")?;
        // The first byte: host memory (1, its token's 8 bytes next) or not (0); UCX's packed
        // key follows.
        let (host, packed) = match framed.split_first() {
            Some((&0, rest)) if !rest.is_empty() => (None, rest),
            Some((&1, rest)) if rest.len() > 8 => {
                let mut t = [0u8; 8];
                t.copy_from_slice(&rest[..8]);
                (Some(u64::from_le_bytes(t)), &rest[8..])
            }
            _ => {
                return Err(bad_key(
                    "the remote key has no memory-type byte (and host token) before UCX's \
                     packed key"
                        .into(),
                ))
            }
        };
        let mut rkey: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: ep is live; the packed bytes passed the frame check (their length and hash
        // are those ucp_rkey_pack gave the peer) and outlive the call; rkey a valid out ptr.
        let st =
            unsafe { sys::ucp_ep_rkey_unpack(ep, packed.as_ptr() as *const c_void, &mut rkey) };
        if st != sys::UCS_OK {
            return Err(bad_key(format!(
                "ucp_ep_rkey_unpack refused the remote key: {} (is the region still registered?)",
                status_text(st)
            )));
        }
        let index = self.imported.len() as u32;
        let region = RemoteRegion::new(
            mr,
            UcxKey {
                endpoint: self.id,
                index,
            },
        );
        match region {
            Ok(r) => {
                self.imported.push(Imported {
                    peer: peer.0,
                    addr: mr.addr,
                    len: mr.len,
                    rkey,
                    host,
                });
                Ok(r)
            }
            Err(e) => {
                // SAFETY: rkey was just unpacked and is destroyed once, here.
                unsafe { sys::ucp_rkey_destroy(rkey) };
                Err(e)
            }
        }
    }

    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, UcxMr>, ctx: u64) -> Result<Post> {
        let ep = self.peer(peer)?.ep;
        let addr = self.local(&buf)?;
        let Some(s) = self.take_slot(false) else {
            return Ok(Post::QueueFull);
        };
        s.state.set(State::Send);
        s.ctx.set(ctx);
        let i = s.index;
        let mut p = Self::params(s);
        if self.name_memory {
            Self::set_memory(&mut p, buf.mr);
        }
        // SAFETY: ep is live; [addr, addr + len) lies in a region this endpoint registered
        // (checked), which the caller keeps alive until the completion, and so its mapping
        // (the memh named in p); the slot outlives the operation.
        let r = unsafe { sys::ucp_tag_send_nbx(ep, addr, buf.len, SEND_TAG, &p) };
        self.started(i, "ucp_tag_send_nbx", r)
    }

    fn post_recv(&mut self, buf: LocalSlice<'_, UcxMr>, ctx: u64) -> Result<Post> {
        let addr = self.local(&buf)?;
        let Some(s) = self.take_slot(true) else {
            return Ok(Post::QueueFull);
        };
        s.state.set(State::Recv);
        s.ctx.set(ctx);
        let i = s.index;
        let mut p = Self::params(s);
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_RECV_INFO;
        p.cb.recv = Some(on_recv);
        p.recv_info.tag_info = s.info.get();
        if self.name_memory {
            Self::set_memory(&mut p, buf.mr);
        }
        // SAFETY: the worker is live; the buffer lies in a region of this endpoint (checked)
        // kept alive until the completion, and so its mapping (the memh named in p);
        // recv_info points at the slot's `info`, which lives with the endpoint.
        let r =
            unsafe { sys::ucp_tag_recv_nbx(self.worker, addr, buf.len, SEND_TAG, u64::MAX, &p) };
        self.started(i, "ucp_tag_recv_nbx", r)
    }

    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, UcxMr>,
        remote: RemoteSlice<UcxKey>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        let ep = self.peer(peer)?.ep;
        let addr = self.local(&buf)?;
        let k = remote.key;
        let imp = match self.imported.get(k.index as usize) {
            Some(imp) if k.endpoint == self.id && imp.peer == peer.0 => imp,
            _ => {
                return Err(bad_key(format!(
                    "remote key {k:?} was not imported for peer {} on this endpoint",
                    peer.0
                )))
            }
        };
        let fits = remote.addr >= imp.addr
            && remote
                .addr
                .checked_add(remote.len)
                .is_some_and(|end| end <= imp.addr + imp.len)
            && remote.len == buf.len as u64;
        if !fits {
            return Err(bad_key(format!(
                "remote range {:#x}+{} is outside the imported region {:#x}+{} (or its length \
                 differs from the local {} bytes)",
                remote.addr, remote.len, imp.addr, imp.len, buf.len
            )));
        }
        let rkey = imp.rkey;
        // A small WRITE with immediate between host memories, with every earlier put to this
        // peer known at the target (a flush covering it completed), goes as one active
        // message: the target's handler copies the bytes, then queues the immediate.
        let pr = &self.peers[peer.0 as usize];
        let token = imp.host;
        let inline = imm.is_some()
            && token.is_some()
            && buf.mr.mtype == sys::UCS_MEMORY_TYPE_HOST
            && buf.len <= INLINE_MAX
            && pr.puts.get() == pr.flushed.get();
        let Some(s) = self.take_slot(false) else {
            return Ok(Post::QueueFull);
        };
        s.ctx.set(ctx);
        s.peer.set(peer.0);
        let i = s.index;
        match imm {
            Some(v) if inline => {
                s.state.set(State::Notify);
                let mut h = [0u8; INLINE_HDR];
                h[..4].copy_from_slice(&v.to_le_bytes());
                h[4..12].copy_from_slice(&remote.addr.to_le_bytes());
                h[12..].copy_from_slice(&token.unwrap_or(0).to_le_bytes());
                s.hdr.set(h);
                let mut p = Self::params(s);
                p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
                p.flags = sys::UCP_AM_SEND_FLAG_EAGER;
                // SAFETY: ep is live; the header is the slot's `hdr`, unchanged until the send
                // completes (the slot is busy until then); the data is the local range, in a
                // region of this endpoint (checked) kept alive until the completion.
                let r = unsafe {
                    sys::ucp_am_send_nbx(
                        ep,
                        AM_WRITE_IMM,
                        s.hdr.as_ptr() as *const c_void,
                        INLINE_HDR,
                        addr,
                        buf.len,
                        &p,
                    )
                };
                self.started(i, "ucp_am_send_nbx", r)
            }
            None => {
                s.state.set(State::Put);
                let p = Self::params(s);
                // SAFETY: ep and rkey are live (the rkey was unpacked for this ep and is
                // destroyed only with the endpoint); the local range lies in a region of this
                // endpoint; the remote range lies in the imported region (checked above).
                let r = unsafe { sys::ucp_put_nbx(ep, addr, buf.len, remote.addr, rkey, &p) };
                let pr = &self.peers[peer.0 as usize];
                pr.puts.set(pr.puts.get() + 1);
                self.started(i, "ucp_put_nbx", r)
            }
            Some(v) => {
                s.state.set(State::Flush);
                s.imm.set(v.to_le());
                let none = sys::ucp_request_param_t::default();
                // SAFETY: as for the put above; no callback: the request (if any) is freed at
                // once and UCX releases it when it completes; the flush below reports it.
                let r = unsafe { sys::ucp_put_nbx(ep, addr, buf.len, remote.addr, rkey, &none) };
                match sys::ptr_status(r) {
                    // SAFETY: a request without callback, released once; UCX frees it when done.
                    Ok(Some(req)) => unsafe { sys::ucp_request_free(req) },
                    Ok(None) => {}
                    Err(st) => {
                        self.give_back(i);
                        return Err(provider_error("ucp_put_nbx", st, "the peer may be gone"));
                    }
                }
                let pr = &self.peers[peer.0 as usize];
                pr.puts.set(pr.puts.get() + 1);
                let s = &self.shared.slots[i as usize];
                s.seq.set(pr.puts.get());
                let p = Self::params(s);
                // SAFETY: ep is live; the slot outlives the flush.
                let r = unsafe { sys::ucp_ep_flush_nbx(ep, &p) };
                self.started(i, "ucp_ep_flush_nbx", r)
            }
        }
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        // SAFETY: the worker is live; callbacks run inside and only touch the slab through
        // shared references; no borrow of its RefCells is held across the call.
        unsafe { sys::ucp_worker_progress(self.worker) };
        let mut n = 0;
        while n < out.len() {
            let Some(imm) = self.shared.imms.borrow_mut().pop_front() else {
                break;
            };
            out[n] = Completion {
                ctx: 0,
                kind: CompletionKind::RemoteWrite { imm },
            };
            n += 1;
        }
        while n < out.len() {
            let Some(i) = self.shared.done.borrow_mut().pop_front() else {
                break;
            };
            let s = &self.shared.slots[i as usize];
            let req = s.req.replace(ptr::null_mut());
            if !req.is_null() {
                // SAFETY: the request's callback ran (that queued the slot); released once.
                unsafe { sys::ucp_request_free(req) };
            }
            let (st, ctx, state) = (s.status.get(), s.ctx.get(), s.state.get());
            if state == State::Flush && st == sys::UCS_OK {
                // Every put posted before this flush is at the target.
                let pr = &self.peers[s.peer.get() as usize];
                pr.flushed.set(pr.flushed.get().max(s.seq.get()));
            }
            let c = match state {
                State::Flush if st == sys::UCS_OK => match self.notify(i) {
                    Ok(false) => continue,
                    Ok(true) => Completion {
                        ctx,
                        kind: CompletionKind::Write,
                    },
                    Err(e) => Self::completion_error(Op::Write, ctx, e, "sending the immediate"),
                },
                State::Flush => Self::completion_error(Op::Write, ctx, st, "put and flush"),
                _ if st != sys::UCS_OK => {
                    let (op, what) = match state {
                        State::Send => (Op::Send, "tagged send"),
                        State::Recv => (Op::Recv, "tagged receive"),
                        State::Notify => (Op::Write, "sending the immediate"),
                        _ => (Op::Write, "put"),
                    };
                    Self::completion_error(op, ctx, st, what)
                }
                State::Send => Completion {
                    ctx,
                    kind: CompletionKind::Send,
                },
                State::Recv => {
                    // SAFETY: written by UCX (or on_recv) before the slot was queued; no
                    // progress runs while it is read.
                    let len = unsafe { (*s.info.get()).length };
                    Completion {
                        ctx,
                        kind: CompletionKind::Recv { len, imm: None },
                    }
                }
                State::Put | State::Notify => Completion {
                    ctx,
                    kind: CompletionKind::Write,
                },
                State::Free => continue,
            };
            self.give_back(i);
            out[n] = c;
            n += 1;
        }
        Ok(n)
    }

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn make_gpu_visible(&mut self, mr: &UcxMr) -> Result<()> {
        transport_core::make_gpu_visible(mr.memory(), self.landing)
    }

    fn details(&self) -> String {
        format!(
            "ucx {} TLS={} NET_DEVICES={} immediates: put, ep flush, active message",
            self.version, self.tls, self.devices
        )
    }

    fn runtime(&self) -> Runtime {
        let mut settings = BTreeMap::new();
        settings.insert("tls".into(), self.tls.clone());
        settings.insert("net_devices".into(), self.devices.clone());
        settings.insert(
            "immediate".into(),
            "ucp_put_nbx, ucp_ep_flush_nbx, ucp_am_send_nbx".into(),
        );
        settings.insert("cuda_memory".into(), self.ctx.cuda.to_string());
        settings.insert(
            "memh".into(),
            if self.name_memory { "on" } else { "off" }.into(),
        );
        settings.insert(
            "err_mode".into(),
            if self.peer_errors { "peer" } else { "none" }.into(),
        );
        Runtime {
            backend: Self::BACKEND.into(),
            library: "ucx".into(),
            version: Some(self.version.clone()),
            path: mapped_library("libucp"),
            provider: Some(self.tls.clone()),
            fabric: None,
            device: self.devices.clone(),
            firmware: None,
            settings,
        }
    }
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
        for s in self.shared.slots.iter() {
            let req = s.req.replace(ptr::null_mut());
            if !req.is_null() {
                // SAFETY: released once; UCX frees an unfinished one when it ends (and the
                // worker's destruction ends it).
                unsafe { sys::ucp_request_free(req) };
            }
        }
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

    #[test]
    fn status_text_is_ucx_own() {
        assert_eq!(status_text(sys::UCS_OK), "Success");
        assert!(status_text(sys::UCS_ERR_NO_DEVICE).contains("No such device"));
    }
}
