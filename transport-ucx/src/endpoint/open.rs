//! Opening an endpoint: UCP's configuration from the NIC's description and options, the
//! context, the worker, its active-message handlers, and the slab.

use super::*;

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

    pub(super) fn open_ucx(nic: &NicDesc) -> Result<Self> {
        check_options(&crate::INFO, &nic.options)?;
        crate::log::off_stdout();
        let peer_errors = match nic.options.get("peer_errors").map(String::as_str) {
            None | Some("auto") => !crate::without_peer_failure(nic.provider.as_deref()),
            Some("on") => true,
            Some("off") => false,
            Some(v) => return Err(crate::INFO.unknown_option("peer_errors", v)),
        };
        let name_memory = match nic.options.get("memh").map(String::as_str) {
            None | Some("on") => true,
            Some("off") => false,
            Some(v) => return Err(crate::INFO.unknown_option("memh", v)),
        };
        let multi_send = match nic.options.get("multi_send").map(String::as_str) {
            None | Some("stream") => true,
            Some("off") => false,
            Some(v) => return Err(crate::INFO.unknown_option("multi_send", v)),
        };
        let write = match nic.options.get("write").map(String::as_str) {
            None | Some("auto") => Write::Auto,
            Some("am") => Write::Am,
            Some("put") => Write::Put,
            Some(v) => return Err(crate::INFO.unknown_option("write", v)),
        };
        let skip_max = nic
            .number_option("ucx", "progress_skip", 0..=SKIP_LIMIT)?
            .unwrap_or(SKIP_DEFAULT);
        let burst = nic
            .number_option("ucx", "progress_burst", 1..=BURST_LIMIT)?
            .unwrap_or_else(|| crate::default_burst(nic.provider.as_deref()));
        // UCX's names: an RDMA device the topology gave without its port gets its ports.
        let devices = nic
            .device
            .as_deref()
            .map(|d| resources::ucx_device_names(d, std::path::Path::new(resources::RDMA_SYSFS)));
        let ctx = match context_with(nic.provider.as_deref(), devices.as_deref(), true) {
            Ok(ctx) => ctx,
            Err(Opening::Refused(e)) => return Err(e),
            Err(Opening::Init(
                st @ (sys::UCS_ERR_NO_DEVICE | sys::UCS_ERR_NO_ELEM | sys::UCS_ERR_UNSUPPORTED),
            )) => {
                return Err(Error::NoDevice(format!(
                    "UCX opened no transport for TLS={} NET_DEVICES={}: {} (see `ucx_info -d`)",
                    nic.provider.as_deref().unwrap_or("(default)"),
                    devices.as_deref().unwrap_or("(default)"),
                    status_text(st)
                )))
            }
            Err(Opening::Init(st)) => {
                return Err(provider_error("ucp_init", st, "see `ucx_info -d`"))
            }
        };
        let mut attr = sys::ucp_context_attr_t {
            field_mask: u64::from(
                sys::UCP_ATTR_FIELD_MEMORY_TYPES | sys::UCP_ATTR_FIELD_REQUEST_SIZE,
            ),
            ..Default::default()
        };
        // SAFETY: ctx is live; attr is a valid in/out struct.
        let st = unsafe { sys::ucp_context_query(ctx, &mut attr) };
        let cuda = st == sys::UCS_OK && attr.memory_types & (1 << sys::UCS_MEMORY_TYPE_CUDA) != 0;
        let ctx = Arc::new(Context { ctx, cuda });
        check(
            "ucp_context_query",
            st,
            "UCX could not describe its context; check the install with `ucx_info -v`",
        )?;
        if let Some(d) = devices.as_deref() {
            let have = resources::context_resources(ctx.ctx);
            let missing = missing_devices(d, &have);
            if !missing.is_empty() {
                let tls = nic.provider.as_deref();
                // What every device would give, for the error only (a second context).
                let all = open_resources(tls, None)
                    .map(|(r, _)| resources::listed(&r))
                    .unwrap_or_else(|e| e);
                return Err(Error::NoDevice(format!(
                    "UCX uses no device named ({}) with TLS={} (the run would go on {} and \
                     carry a name that did not move its bytes); with every device UCX has {} \
                     (see `ucx_info -d`)",
                    missing.join(", "),
                    tls.unwrap_or("(default)"),
                    resources::listed(&have),
                    all
                )));
            }
        }

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
        let requests = match Requests::new(tx + rx, attr.request_size) {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: the worker was just created, nothing uses it; destroyed once, before
                // the context (its Arc, dropped on return) is cleaned up.
                unsafe { sys::ucp_worker_destroy(worker) };
                return Err(e);
            }
        };
        let slots: Box<[Slot]> = (0..tx + rx)
            .map(|i| Slot {
                shared: Cell::new(ptr::null()),
                index: i as u32,
                request: requests.handle(i),
                state: Cell::new(State::Free),
                ctx: Cell::new(0),
                peer: Cell::new(0),
                imm: Cell::new([0; IMM_HDR]),
                seq: Cell::new(0),
                hdr: Cell::new([0; INLINE_HDR]),
                req: Cell::new(ptr::null_mut()),
                status: Cell::new(sys::UCS_OK),
                info: UnsafeCell::new(sys::ucp_tag_recv_info_t::default()),
            })
            .collect();
        let shared = Box::new(Shared {
            slots,
            _requests: requests,
            done: Done::new(tx + rx),
            imms: RefCell::new(VecDeque::with_capacity(IMM_QUEUE)),
            landable: RefCell::new(Vec::new()),
            worker,
            landings: RefCell::new(Landings::with_capacity((tx + rx).min(LANDING_ROOM))),
            sends_unfinished: Cell::new(0),
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
            origin: 0,
            peers: Vec::new(),
            imported: Vec::new(),
            shared,
            free_tx: (0..tx as u32).rev().collect(),
            free_rx: (tx as u32..(tx + rx) as u32).rev().collect(),
            instant: Vec::with_capacity(tx + rx),
            caps: Caps::default(),
            grave: Arc::new(Mutex::new(Vec::new())),
            tls: nic.provider.clone().unwrap_or_else(|| "all".into()),
            // CUDA copies (cuda_copy, cuda_ipc) need nothing; a NIC's GPUDirect RDMA writes
            // (rc with a CUDA-enabled UCX, which `all` takes where there is one) the flush.
            landing: crate::landing_for(nic.provider.as_deref()),
            devices: devices.unwrap_or_else(|| "all".into()),
            version: Self::ucx_version(),
            recv_info_at_once: crate::loaded_version() >= RECV_INFO_SINCE,
            peer_errors,
            name_memory,
            write,
            skip_max,
            burst,
            skipped: 0,
            streams: Streams::new(multi_send),
        };

        // on_imm only reads Shared; on_write and on_write_imm read it shared and write only
        // into regions this endpoint registered (checked against `landable`).
        let handlers: [(u32, sys::ucp_am_recv_callback_t); 3] = [
            (AM_IMM, Some(on_imm)),
            (AM_WRITE_IMM, Some(on_write_imm)),
            (AM_WRITE, Some(on_write)),
        ];
        for (id, cb) in handlers {
            let hparams = sys::ucp_am_handler_param_t {
                field_mask: u64::from(
                    sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                        | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                        | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                        | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
                ),
                id,
                flags: sys::UCP_AM_FLAG_WHOLE_MSG,
                cb,
                arg: sp as *mut c_void,
            };
            // SAFETY: worker is live; arg points at the boxed Shared, which lives as long as
            // the worker (the worker is destroyed first in Drop), and each handler uses it as
            // the comment above says.
            let st = unsafe { sys::ucp_worker_set_am_recv_handler(ep.worker, &hparams) };
            check(
                "ucp_worker_set_am_recv_handler",
                st,
                "the worker refused an active-message handler; this UCX may lack AM support \
                 (`ucx_info -v`: 1.13 or later)",
            )?;
        }

        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: worker is live; out pointers valid.
        let st = unsafe { sys::ucp_worker_get_address(ep.worker, &mut addr, &mut len) };
        check(
            "ucp_worker_get_address",
            st,
            "the worker has no address to give peers; check `ucx_info -d` for a transport \
             that can reach them",
        )?;
        // SAFETY: UCX returned `len` readable bytes at addr, released right after the copy.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker; released once.
        unsafe { sys::ucp_worker_release_address(ep.worker, addr) };
        ep.address = frame::wrap(Kind::Address, &bytes);
        ep.origin = frame::origin(&bytes);

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
}

/// Why [`context_with`] opened no context.
pub(crate) enum Opening {
    /// UCX's environment could not be read, or UCX refused a setting.
    Refused(Error),
    /// `ucp_init`'s status.
    Init(sys::ucs_status_t),
}

/// A UCP context on UCX's environment, with `TLS` and `NET_DEVICES` where named (see
/// [`init_context`]): what an endpoint and the doctor's probe open.
pub(crate) fn context_with(
    tls: Option<&str>,
    devices: Option<&str>,
    shared_workers: bool,
) -> std::result::Result<sys::ucp_context_h, Opening> {
    let mut config: *mut sys::ucp_config_t = ptr::null_mut();
    // SAFETY: NULL prefix and file: UCX reads its UCX_* environment; config_p is a valid out
    // pointer.
    let st = unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) };
    check(
        "ucp_config_read",
        st,
        "check the UCX_* environment variables",
    )
    .map_err(Opening::Refused)?;
    let modify = |name: &str, value: Option<&str>| -> Result<()> {
        let Some(value) = value else { return Ok(()) };
        let (n, v) = (cstring("UCX setting", name)?, cstring("UCX value", value)?);
        // SAFETY: config is the live config read above; both strings are NUL-terminated and
        // outlive the call (UCX copies the value).
        let st = unsafe { sys::ucp_config_modify(config, n.as_ptr(), v.as_ptr()) };
        check(
            "ucp_config_modify",
            st,
            &format!("UCX refused {name}={value}: see `ucx_info -d` for what this host has"),
        )
    };
    let ctx = modify("TLS", tls)
        .and_then(|_| modify("NET_DEVICES", devices))
        .map_err(Opening::Refused)
        .and_then(|_| init_context(config, shared_workers).map_err(Opening::Init));
    // SAFETY: config came from ucp_config_read and is released once; UCX copied what it
    // needed into the context.
    unsafe { sys::ucp_config_release(config) };
    ctx
}

/// `ucp_init` with RMA, TAG and AM, on `config` (the caller releases it), for workers of
/// several threads where `shared_workers`; the context, or UCX's status.
fn init_context(
    config: *const sys::ucp_config_t,
    shared_workers: bool,
) -> Result<sys::ucp_context_h, sys::ucs_status_t> {
    let mut field_mask = u64::from(sys::UCP_PARAM_FIELD_FEATURES);
    if shared_workers {
        field_mask |= u64::from(sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED);
    }
    let params = sys::ucp_params_t {
        field_mask,
        features: u64::from(sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_TAG | sys::UCP_FEATURE_AM),
        mt_workers_shared: i32::from(shared_workers),
        ..Default::default()
    };
    let mut ctx: sys::ucp_context_h = ptr::null_mut();
    // SAFETY: params and config are valid for the call; ctx is a valid out pointer. ucp_init
    // is this static inline call with the header's API version.
    let st = unsafe {
        sys::ucp_init_version(
            sys::UCP_API_MAJOR,
            sys::UCP_API_MINOR,
            &params,
            config,
            &mut ctx,
        )
    };
    if st == sys::UCS_OK {
        Ok(ctx)
    } else {
        Err(st)
    }
}
