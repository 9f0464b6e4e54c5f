//! A UCP context's resources (`transport/device`), as `ucp_context_print_info` lists them:
//! read from a live context, or from one opened for the purpose. The endpoint checks a named
//! device against them; the doctor judges them.

use std::ffi::CString;
use std::ptr;

use ucx_sys as sys;

use super::{init_context, status_text};

/// One transport on one device, as UCX names them (`tcp` on `lo`, `rc_verbs` on `mlx5_0:1`,
/// `posix` on `memory`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resource {
    pub tl: String,
    pub dev: String,
}

impl Resource {
    /// InfiniBand / RoCE transports (libuct_ib: rc, ud, dc, with or without mlx5 offload).
    pub(crate) fn rdma(&self) -> bool {
        ["rc", "ud", "dc"]
            .iter()
            .any(|p| self.tl == *p || self.tl.starts_with(&format!("{p}_")))
    }
    pub(crate) fn cuda(&self) -> bool {
        crate::CUDA_COPIES.contains(&self.tl.as_str())
    }
    /// Between nodes: what is neither shared memory nor a GPU copy.
    pub(crate) fn network(&self) -> bool {
        self.rdma() || self.tl == "tcp"
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tl, self.dev)
    }
}

/// The `resource` lines of `ucp_context_print_info`:
/// `#      resource 1  :  md 1  dev 1  flags -- tcp/lo`.
pub(crate) fn resources(info: &str) -> Vec<Resource> {
    info.lines()
        .filter(|l| l.trim_start_matches(['#', ' ']).starts_with("resource"))
        .filter_map(|l| l.rsplit_once("-- "))
        .filter_map(|(_, r)| r.trim().split_once('/'))
        .map(|(tl, dev)| Resource {
            tl: tl.to_string(),
            dev: dev.to_string(),
        })
        .collect()
}

/// The devices named in `NET_DEVICES`, in the order named, where no resource of the context
/// uses any of them; empty where one is used. UCX only warns about a name it does not have
/// and runs on what it has (with none of the names, on shared memory alone), so such a run
/// would carry a label that is not what moved its bytes. A list where some name is used is
/// left alone: a device of a transport not named (`veth0` beside `rxe0:1` with `TLS=rc_verbs`)
/// is a list shared between runs, not a mistake. `all`, a list that excludes (`^...`) and
/// names with wildcards are UCX's to match: none is missing.
pub(crate) fn missing_devices<'a>(named: &'a str, resources: &[Resource]) -> Vec<&'a str> {
    if named.trim() == "all" || named.trim_start().starts_with('^') {
        return Vec::new();
    }
    let names: Vec<&str> = named
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let used = |d: &&str| resources.iter().any(|r| r.dev == *d);
    if names.iter().any(|d| d.contains(['*', '?'])) || names.iter().any(used) {
        return Vec::new();
    }
    names
}

/// The resources (`transport/device`) of a live context, from `ucp_context_print_info`.
pub(crate) fn context_resources(ctx: sys::ucp_context_h) -> Vec<Resource> {
    resources(&print_info(ctx))
}

/// Opens a UCP context as a run's endpoint would (`TLS`, `NET_DEVICES` where named; the
/// features the backend uses), reads its resources and whether it takes CUDA memory, and
/// closes it. UCX logs what it warns about to stdout (the doctor captures it).
pub(crate) fn open_resources(
    named_tls: Option<&str>,
    named_devices: Option<&str>,
) -> Result<(Vec<Resource>, bool), String> {
    let mut config: *mut sys::ucp_config_t = ptr::null_mut();
    // SAFETY: NULL prefix and file (UCX reads its UCX_* environment); config a valid out pointer.
    let st = unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) };
    if st != sys::UCS_OK {
        return Err(format!("ucp_config_read: {}", status_text(st)));
    }
    let mut r = Ok(());
    for (name, value) in [("TLS", named_tls), ("NET_DEVICES", named_devices)] {
        let Some(value) = value else { continue };
        let (Ok(n), Ok(v)) = (CString::new(name), CString::new(value)) else {
            r = Err(format!("{name}={value:?}: a NUL byte"));
            break;
        };
        // SAFETY: config is live; both strings are NUL-terminated and outlive the call.
        let st = unsafe { sys::ucp_config_modify(config, n.as_ptr(), v.as_ptr()) };
        if st != sys::UCS_OK {
            r = Err(format!("UCX refused {name}={value}: {}", status_text(st)));
            break;
        }
    }
    let ctx = r.and_then(|_| init_context(config, false).map_err(status_text));
    // SAFETY: config came from ucp_config_read and is released once.
    unsafe { sys::ucp_config_release(config) };
    let ctx = ctx?;
    let mut attr = sys::ucp_context_attr_t {
        field_mask: u64::from(sys::UCP_ATTR_FIELD_MEMORY_TYPES),
        ..Default::default()
    };
    // SAFETY: ctx is live; attr a valid in/out struct.
    let st = unsafe { sys::ucp_context_query(ctx, &mut attr) };
    let cuda_memory =
        st == sys::UCS_OK && attr.memory_types & (1 << sys::UCS_MEMORY_TYPE_CUDA) != 0;
    let info = print_info(ctx);
    // SAFETY: ctx came from ucp_init and is cleaned up once; nothing else holds it.
    unsafe { sys::ucp_cleanup(ctx) };
    Ok((resources(&info), cuda_memory))
}

/// `ucp_context_print_info` into a string.
fn print_info(ctx: sys::ucp_context_h) -> String {
    // SAFETY: ctx is live; f is an open stream (glibc's FILE, which bindgen's FILE is).
    crate::printed(|f| unsafe { sys::ucp_context_print_info(ctx, f.cast()) })
}
