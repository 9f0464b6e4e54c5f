//! A UCP context's resources (`transport/device`), as `ucp_context_print_info` lists them:
//! read from a live context, or from one opened for the purpose. The endpoint checks a named
//! device against them; the doctor judges them.

use ucx_sys as sys;

use super::open::{context_with, Opening};
use super::status_text;

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

/// `resources` as UCX writes them, comma separated (`tcp/lo, posix/memory`).
pub(crate) fn listed(resources: &[Resource]) -> String {
    resources
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `resource` lines of `ucp_context_print_info`:
/// `#      resource 1  :  md 1  dev 1  flags -- tcp/lo`.
/// The last word is the resource, whatever its flags (`--`, `a-` for an auxiliary one).
pub(crate) fn resources(info: &str) -> Vec<Resource> {
    info.lines()
        .filter(|l| l.trim_start_matches(['#', ' ']).starts_with("resource"))
        .filter_map(|l| l.split_whitespace().last())
        .filter_map(|r| r.split_once('/'))
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
/// is a list shared between runs, not a mistake. A resource uses a name that is its device or
/// that device's name without the port (`mlx5_0` for `mlx5_0:1`: UCX 1.21 and later match
/// it). UCX matches names exactly otherwise (no wildcards); `all` anywhere in the list takes
/// every device, and a list that excludes (`^...`, UCX 1.21 and later) is UCX's to match.
pub(crate) fn missing_devices<'a>(named: &'a str, resources: &[Resource]) -> Vec<&'a str> {
    let names: Vec<&str> = named
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let used = |d: &&str| {
        resources
            .iter()
            .any(|r| r.dev == *d || r.dev.split_once(':').is_some_and(|(base, _)| base == *d))
    };
    if names.iter().any(|d| *d == "all" || d.starts_with('^')) || names.iter().any(used) {
        return Vec::new();
    }
    names
}

/// `NET_DEVICES` for what a run names: an RDMA device without a port (an ibverbs name, as
/// the topology gives it: `mlx5_0`) becomes one name per port of it under `sysfs`
/// (`mlx5_0:1`), which is how UCX names it and what UCX before 1.21 matches; other names
/// stay as they are.
pub(crate) fn ucx_device_names(named: &str, sysfs: &std::path::Path) -> String {
    named
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .flat_map(|d| {
            let mut ports: Vec<String> = if d.contains(':') || d.contains('/') {
                Vec::new()
            } else {
                std::fs::read_dir(sysfs.join(d).join("ports"))
                    .map(|r| {
                        r.flatten()
                            .filter_map(|e| e.file_name().into_string().ok())
                            .filter(|p| p.parse::<u32>().is_ok())
                            .map(|p| format!("{d}:{p}"))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            ports.sort();
            if ports.is_empty() {
                vec![d.to_string()]
            } else {
                ports
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Where the node's RDMA devices are (`/sys/class/infiniband`).
pub(crate) const RDMA_SYSFS: &str = "/sys/class/infiniband";

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
    let ctx = context_with(named_tls, named_devices, false).map_err(|e| match e {
        Opening::Refused(e) => e.to_string(),
        Opening::Init(st) => status_text(st),
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn res(list: &[&str]) -> Vec<Resource> {
        list.iter()
            .map(|r| {
                let (tl, dev) = r.split_once('/').unwrap();
                Resource {
                    tl: tl.into(),
                    dev: dev.into(),
                }
            })
            .collect()
    }

    #[test]
    fn an_auxiliary_resource_is_listed_too() {
        let info = "#      resource 0  :  md 0  dev 0  flags -- rc_verbs/mlx5_0:1
#      resource 1  :  md 0  dev 0  flags a- ud_verbs/mlx5_0:1
";
        assert_eq!(
            resources(info),
            res(&["rc_verbs/mlx5_0:1", "ud_verbs/mlx5_0:1"])
        );
    }

    #[test]
    fn a_name_without_its_port_is_used_where_ucx_took_it() {
        let cx = res(&["rc_mlx5/mlx5_0:1", "posix/memory"]);
        assert!(missing_devices("mlx5_0", &cx).is_empty());
        assert!(missing_devices("mlx5_0:1", &cx).is_empty());
        assert_eq!(missing_devices("mlx5_1", &cx), ["mlx5_1"]);
        assert_eq!(missing_devices("mlx5_*", &cx), ["mlx5_*"]);
        assert!(missing_devices("junk,all", &cx).is_empty());
    }

    #[test]
    fn an_rdma_device_gets_its_ports() {
        let root = std::env::temp_dir().join(format!("rb-ucx-sysfs-{}", std::process::id()));
        for p in ["mlx5_0/ports/1", "mlx5_1/ports/1", "mlx5_1/ports/2"] {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        assert_eq!(
            ucx_device_names("mlx5_0,mlx5_1,lo,rxe0:1", &root),
            "mlx5_0:1,mlx5_1:1,mlx5_1:2,lo,rxe0:1"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
