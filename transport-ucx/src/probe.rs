//! What the doctor asks of UCX ([`BackendInfo::probe`](transport_core::BackendInfo::probe)):
//! the version of the libucp this process loaded, the transports a UCP context opens with
//! what the user named (`--provider` as `TLS`, `--devices` as `NET_DEVICES`, else UCX's own
//! `UCX_TLS` / `UCX_NET_DEVICES` and defaults), and warnings where UCX would quietly do
//! something else than asked: go over tcp where an RDMA device or transport was named (or
//! where this node has RDMA devices UCX cannot use), or copy GPU memory through the host.
//!
//! The transports are UCX's own list: the `resource` lines of `ucp_context_print_info` for a
//! context opened as a run's would be
//! ([`open_resources`](crate::endpoint::open_resources)). What is judged from them
//! ([`judge`]) is plain code over plain data, tested with fixtures below.

use std::ptr;

use transport_core::{mapped_library, Finding, FindingStatus, Probe, ProbeAsk};
use ucx_sys as sys;

use crate::endpoint::{missing_devices, Resource};

/// What a UCP context opened with the user's words has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Opened {
    pub resources: Vec<Resource>,
    /// `UCS_MEMORY_TYPE_CUDA` in the context's memory types.
    pub cuda_memory: bool,
    /// What UCX logged while opening it (its warnings, e.g. a device it does not have).
    pub said: Vec<String>,
    /// The loaded UCX's major and minor version.
    pub version: (u32, u32),
}

/// The first UCX that survives a peer dying during rc's wire-up: before it, the purge of a
/// failed endpoint asserts on a wire-up request (REQ, REP) still queued on the transport that
/// carries wire-up (`ucp_request.c:684`, "got REQ message", in `ucp_request_send_state_ff`),
/// and the process aborts. Commit 9ccaf31, "UCP/CORE: Remove assertion for checking
/// WIREUP_MSGs when purging", in 1.14.0. Reproduced over rc_verbs,tcp in the Soft-RoCE VM: a
/// client killed during its session's setup aborted the server (docs/known-limits.md).
const WIREUP_PURGE_SINCE: (u32, u32) = (1, 14);

/// The first UCX seen to survive a peer dying during wire-up over tcp. Before it, where UCX
/// was built with assertions (Debian's is; the wheels are not), a survivor can abort: tcp
/// fails the endpoint inside a wire-up send (`uct_tcp_ep_set_failed`) and UCX's purge finds
/// the message still counted ("Assertion `wireup_ep->pending_count == 0' failed", in
/// `ucp_wireup_ep_pending_purge`), or on 1.16 destroys a failed endpoint still sending
/// (`tcp_ep.c`, in `uct_tcp_ep_destroy_progress`). The kill soak's ranks killed during setup
/// over `all` on `lo`, 80 kills each, UCX built with assertions: a survivor aborted in 5 on
/// 1.13.1 (Debian's), 6 on 1.14.0, 1 on 1.16.0, none on 1.18.0 or 1.22.0
/// (docs/known-limits.md).
const TCP_WIREUP_PURGE_SINCE: (u32, u32) = (1, 18);

/// What the user named, with UCX's environment where the command line named nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Named {
    /// `--provider`, else `UCX_TLS`.
    pub tls: Option<String>,
    /// `--devices` (an RDMA device without a port as UCX names it, with its ports), else
    /// `UCX_NET_DEVICES`, split at commas.
    pub devices: Vec<String>,
    /// The devices are `UCX_NET_DEVICES`'s: a run checks only what `--devices` names.
    pub devices_from_env: bool,
    pub gpu_memory: bool,
}

impl Named {
    fn tls_rdma(&self) -> bool {
        crate::nic_driver(self.tls.as_deref()).is_some()
    }
}

/// The findings about UCX on this node. `rdma_devices`: the node's RDMA devices
/// (`/sys/class/infiniband`); `peer_memory`: whether a GPU peer-memory module is loaded.
pub(crate) fn judge(
    named: &Named,
    opened: &Result<Opened, String>,
    rdma_devices: &[String],
    peer_memory: bool,
) -> Vec<Finding> {
    let what = || {
        format!(
            "TLS={} NET_DEVICES={}",
            named.tls.as_deref().unwrap_or("(default)"),
            if named.devices.is_empty() {
                "(default)".to_string()
            } else {
                named.devices.join(",")
            }
        )
    };
    let f = |id: &str, status, summary: String, fix: Option<&str>| Finding {
        id: id.to_string(),
        status,
        summary,
        fix: fix.map(str::to_string),
    };
    let o = match opened {
        Ok(o) => o,
        Err(e) => {
            return vec![f(
                "ucx.transports",
                FindingStatus::Fail,
                format!("UCX opened no transport for {}: {e}", what()),
                Some("name transports and devices this host has (`ucx_info -d`)"),
            )]
        }
    };
    let list = |rs: &mut dyn Iterator<Item = &Resource>| {
        let v: Vec<String> = rs.map(Resource::to_string).collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let said = if o.said.is_empty() {
        String::new()
    } else {
        format!(" (UCX: {})", o.said.join("; "))
    };
    let names = named.devices.join(",");
    let missing = missing_devices(&names, &o.resources);
    let (status, no_device, fix) = if missing.is_empty() {
        (FindingStatus::Ok, String::new(), None)
    } else if named.devices_from_env {
        (
            // UCX's environment: UCX runs on what it has, under no name of the run's.
            FindingStatus::Warn,
            format!("no device named ({}) is UCX's; ", missing.join(", ")),
            Some("set UCX_NET_DEVICES to devices UCX has for these transports (`ucx_info -d`)"),
        )
    } else {
        (
            // A run's endpoint refuses such a name rather than run on what UCX has.
            FindingStatus::Fail,
            format!("no device named ({}) is UCX's; ", missing.join(", ")),
            Some("name devices UCX has for these transports (`ucx_info -d`), or none"),
        )
    };
    let mut out = vec![f(
        "ucx.transports",
        status,
        format!(
            "{}: {no_device}{}; between nodes: {}{said}",
            what(),
            list(&mut o.resources.iter()),
            list(&mut o.resources.iter().filter(|r| r.network()))
        ),
        fix,
    )];

    // An RDMA device the user named: `mlx5_0:1`, or a device of /sys/class/infiniband.
    let named_rdma_dev: Vec<&String> = named
        .devices
        .iter()
        .filter(|d| {
            let base = d.split(':').next().unwrap_or(d);
            rdma_devices.iter().any(|r| r == base)
                || d.rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u8>().is_ok())
        })
        .collect();
    let on_named = |r: &&Resource| named.devices.is_empty() || named.devices.contains(&r.dev);
    let rdma_used: Vec<&Resource> = o
        .resources
        .iter()
        .filter(|r| r.rdma())
        .filter(on_named)
        .collect();
    let network: Vec<&Resource> = o.resources.iter().filter(|r| r.network()).collect();
    let fix_rdma = "use a UCX with its verbs transports (libuct_ib.so: Debian/Ubuntu `libucx0`, \
                    or UCX built --with-verbs), check the device is up (`ibv_devinfo`) and that \
                    `ucx_info -d` lists rc/ud transports on it";
    let asked = if !named_rdma_dev.is_empty() {
        Some(format!(
            "RDMA device {} named",
            named_rdma_dev
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(",")
        ))
    } else if named.tls_rdma() {
        Some(format!(
            "RDMA transports named ({})",
            named.tls.as_deref().unwrap_or("")
        ))
    } else if named.tls.is_none() && named.devices.is_empty() && !rdma_devices.is_empty() {
        Some(format!(
            "this node has RDMA devices ({})",
            rdma_devices.join(", ")
        ))
    } else {
        None
    };
    if let Some(asked) = asked {
        if rdma_used.is_empty() {
            let instead = if network.is_empty() {
                "no network transport at all (only this node's shared memory)".to_string()
            } else {
                format!("{} instead", list(&mut network.iter().copied()))
            };
            out.push(f(
                "ucx.fallback",
                FindingStatus::Warn,
                format!("{asked}, but UCX has no RDMA transport on it: between nodes it would use {instead}"),
                Some(fix_rdma),
            ));
        }
    }

    // rc connects endpoint to endpoint: UCX wires it up over an auxiliary transport that
    // reaches the peer's worker address (ud, dc or tcp). With none, every ucp_ep_create to
    // another node fails: `no auxiliary transport to <...>: Unsupported operation` (select.c;
    // seen with TLS=rc_verbs on Soft-RoCE).
    let rc: Vec<&Resource> = o
        .resources
        .iter()
        .filter(|r| r.tl == "rc" || r.tl.starts_with("rc_"))
        .collect();
    let aux = o.resources.iter().any(|r| {
        r.tl == "tcp"
            || ["ud", "dc"]
                .iter()
                .any(|p| r.tl == *p || r.tl.starts_with(&format!("{p}_")))
    });
    if !rc.is_empty() && !aux {
        out.push(f(
            "ucx.wireup",
            FindingStatus::Warn,
            format!(
                "{}: {} but no transport to wire it up (ud, dc or tcp): UCX cannot connect to \
                 another node (`no auxiliary transport ... Unsupported operation`)",
                what(),
                list(&mut rc.iter().copied())
            ),
            Some("add ud_verbs or tcp to --provider / UCX_TLS, e.g. `--provider rc_verbs,ud_verbs` (on Soft-RoCE `rc_verbs,tcp`: ci/ucx-vm-test.sh)"),
        ));
    }

    // Endpoints are wired up by messages between the two workers (rc's over tcp, ud or dc).
    let tcp = o.resources.iter().any(|r| r.tl == "tcp");
    let mut aborts = Vec::new();
    if !rc.is_empty() && o.version < WIREUP_PURGE_SINCE {
        aborts.push(format!(
            "over {} (UCX's assertion \"got REQ message\" in ucp_request_send_state_ff, removed \
             in {}.{})",
            list(&mut rc.iter().copied()),
            WIREUP_PURGE_SINCE.0,
            WIREUP_PURGE_SINCE.1
        ));
    }
    if tcp && o.version < TCP_WIREUP_PURGE_SINCE {
        aborts.push(format!(
            "over tcp (assertions where UCX purges the failed endpoint, e.g. \"Assertion \
             `wireup_ep->pending_count == 0' failed\"; not seen from {}.{} on)",
            TCP_WIREUP_PURGE_SINCE.0, TCP_WIREUP_PURGE_SINCE.1
        ));
    }
    if !aborts.is_empty() {
        let since = if tcp && o.version < TCP_WIREUP_PURGE_SINCE {
            TCP_WIREUP_PURGE_SINCE
        } else {
            WIREUP_PURGE_SINCE
        };
        let fix = format!(
            "where a process must outlive its peers (a server for many clients), use UCX {}.{} \
             or later",
            since.0, since.1
        );
        out.push(f(
            "ucx.dead_peer",
            FindingStatus::Warn,
            format!(
                "UCX {}.{} built with assertions (Debian's is: `ucx_info -b | grep \
                 ENABLE_ASSERT`): a peer that dies while UCX wires up with it can abort this \
                 process {}: a client killed during its setup can take a server down",
                o.version.0,
                o.version.1,
                aborts.join("; and ")
            ),
            Some(&fix),
        ));
    }

    if named.gpu_memory {
        let cuda: Vec<&Resource> = o.resources.iter().filter(|r| r.cuda()).collect();
        let ipc = cuda.iter().any(|r| r.tl == "cuda_ipc");
        let warn = |s: String, fix: &str| f("ucx.cuda", FindingStatus::Warn, s, Some(fix));
        out.push(if !o.cuda_memory || cuda.is_empty() {
            warn(
                "--mem cuda, but this UCX has no CUDA memory domain (no cuda_copy, cuda_ipc): \
                 it does not know GPU memory, the ucx backend refuses it"
                    .to_string(),
                "use a UCX built with CUDA (libuct_cuda.so; e.g. the libucx-cu12 wheel's), \
                 and check `ucx_info -d | grep cuda`",
            )
        } else if !rdma_used.is_empty() && !peer_memory {
            warn(
                format!(
                    "--mem cuda over {}, but no GPU peer-memory module is loaded: UCX would \
                     stage GPU memory through host buffers (cuda_copy)",
                    list(&mut rdma_used.iter().copied())
                ),
                "load nvidia_peermem (or use dmabuf with the NVIDIA open kernel modules)",
            )
        } else if rdma_used.is_empty() && !ipc {
            warn(
                format!(
                    "--mem cuda with {}: no cuda_ipc, so GPU memory between processes is \
                     copied through the host",
                    list(&mut cuda.iter().copied())
                ),
                "use a UCX with cuda_ipc (libuct_cuda.so) on a node whose GPUs allow CUDA IPC",
            )
        } else {
            f(
                "ucx.cuda",
                FindingStatus::Ok,
                format!("--mem cuda: UCX has {}", list(&mut cuda.iter().copied())),
                None,
            )
        });
    }
    out
}

/// Opens a UCP context as a run's endpoint would (`TLS`, `NET_DEVICES` where named; the
/// features the backend uses) and reads its resources and memory types.
fn open(named_tls: Option<&str>, named_devices: Option<&str>) -> Result<Opened, String> {
    crate::log::off_stdout();
    let (r, log) =
        capture_stdout(|| crate::log::on_stdout(|| open_quiet(named_tls, named_devices)));
    // UCX's lines as it logs them, after its `UCX  ` tag: `WARN  transport 'rc_verbs' is not
    // available, please use one or more of: ...`, `ERROR no usable transports/devices ...`.
    let said: Vec<String> = log
        .lines()
        .filter_map(|l| l.split_once("UCX  ").map(|(_, w)| w.trim().to_string()))
        .map(|w| {
            w.trim_start_matches("WARN")
                .trim_start_matches("ERROR")
                .trim()
                .to_string()
        })
        .collect();
    // Still shown, but where it does not spoil `--json` on stdout.
    eprint!("{log}");
    match r {
        Ok(mut o) => {
            o.said = said;
            Ok(o)
        }
        Err(e) if said.is_empty() => Err(e),
        Err(e) => Err(format!("{e} (UCX: {})", said.join("; "))),
    }
}

/// Runs `f` with file descriptor 1 on a memory file, and returns what was written there: UCX
/// logs to stdout by default (`UCX_LOG_FILE`), which would spoil the doctor's `--json`.
fn capture_stdout<T>(f: impl FnOnce() -> T) -> (T, String) {
    use std::io::{Read, Seek, Write};
    use std::os::fd::FromRawFd;
    let _ = std::io::stdout().flush();
    // SAFETY: a NUL-terminated name; flags 0. A new descriptor or -1.
    let mem = unsafe { libc::memfd_create(c"ucx-log".as_ptr(), 0) };
    // SAFETY: dup of the process's stdout; a new descriptor or -1.
    let saved = unsafe { libc::dup(1) };
    // SAFETY: both descriptors checked valid before dup2 points 1 at the memory file.
    if mem < 0 || saved < 0 || unsafe { libc::dup2(mem, 1) } < 0 {
        for fd in [mem, saved] {
            if fd >= 0 {
                // SAFETY: a descriptor this function opened, closed once.
                unsafe { libc::close(fd) };
            }
        }
        return (f(), String::new());
    }
    let r = f();
    // SAFETY: NULL flushes every C stdio stream (UCX's fprintf to stdout may be buffered);
    // then 1 is pointed back at the saved stdout and the saved copy closed, once.
    unsafe {
        libc::fflush(ptr::null_mut());
        libc::dup2(saved, 1);
        libc::close(saved);
    }
    // SAFETY: mem is a descriptor this function opened; the File owns and closes it.
    let mut file = unsafe { std::fs::File::from_raw_fd(mem) };
    let mut s = String::new();
    let _ = file.rewind().and_then(|_| file.read_to_string(&mut s));
    (r, s)
}

pub(crate) fn open_quiet(
    named_tls: Option<&str>,
    named_devices: Option<&str>,
) -> Result<Opened, String> {
    let (resources, cuda_memory) = crate::endpoint::open_resources(named_tls, named_devices)?;
    Ok(Opened {
        resources,
        cuda_memory,
        said: Vec::new(),
        version: crate::loaded_version(),
    })
}
fn version() -> String {
    let (mut a, mut b, mut c) = (0u32, 0u32, 0u32);
    // SAFETY: three valid out pointers.
    unsafe { sys::ucp_get_version(&mut a, &mut b, &mut c) };
    format!("{a}.{b}.{c}")
}

/// This node's RDMA devices, from `/sys/class/infiniband`.
fn rdma_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(crate::endpoint::RDMA_SYSFS)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn peer_memory() -> bool {
    std::fs::read_to_string("/proc/modules").is_ok_and(|m| {
        m.lines().any(|l| {
            matches!(
                l.split_whitespace().next(),
                Some("nvidia_peermem" | "nv_peer_mem")
            )
        })
    })
}

/// The doctor's probe of UCX, with what the user named for this backend (see the module).
pub fn probe(ask: &ProbeAsk) -> Probe {
    let ask = ask.for_backend(&crate::INFO);
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    // As the endpoint names them to UCX (`mlx5_0` becomes `mlx5_0:1`).
    let devices = crate::endpoint::ucx_device_names(
        &ask.devices.join(","),
        std::path::Path::new(crate::endpoint::RDMA_SYSFS),
    );
    let named = Named {
        tls: ask.provider.clone().or_else(|| env("UCX_TLS")),
        devices: if ask.devices.is_empty() {
            env("UCX_NET_DEVICES")
                .map(|d| d.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default()
        } else {
            devices.split(',').map(str::to_string).collect()
        },
        devices_from_env: ask.devices.is_empty(),
        gpu_memory: ask.gpu_memory,
    };
    let opened = open(
        ask.provider.as_deref(),
        (!devices.is_empty()).then_some(devices.as_str()),
    );
    let findings = judge(&named, &opened, &rdma_devices(), peer_memory());
    let offers = match &opened {
        Ok(o) => {
            let mut t: Vec<String> = o.resources.iter().map(|r| r.tl.clone()).collect();
            t.dedup();
            t
        }
        Err(_) => Vec::new(),
    };
    Probe {
        library: "ucx".into(),
        version: version(),
        path: mapped_library("libucp"),
        offers,
        gpu: opened
            .as_ref()
            .ok()
            .map(|o| ("cuda_copy".to_string(), o.cuda_memory)),
        cuda_in_library: None,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::resources;

    /// `ucp_context_print_info` of UCX 1.13.1 on this kind of box, nothing named.
    const HERE: &str = "#
# UCP context
#
#     component 0  :  self
#     component 1  :  tcp
#     component 4  :  ib
#
#            md 0  :  component 0  self 
#            md 1  :  component 1  tcp 
#
#      resource 0  :  md 0  dev 0  flags -- self/memory0
#      resource 1  :  md 1  dev 1  flags -- tcp/lo
#      resource 2  :  md 1  dev 2  flags -- tcp/eth0
#      resource 3  :  md 2  dev 3  flags -- sysv/memory
#      resource 4  :  md 3  dev 3  flags -- posix/memory
#      resource 5  :  md 4  dev 3  flags -- cma/memory
#
";

    /// A ConnectX host's UCX with CUDA (the lines as UCX prints them).
    const CX: &str = "#      resource 0  :  md 0  dev 0  flags -- self/memory0
#      resource 1  :  md 1  dev 1  flags -- tcp/eth0
#      resource 2  :  md 2  dev 2  flags -- posix/memory
#      resource 3  :  md 3  dev 3  flags -- cuda_copy/cuda
#      resource 4  :  md 4  dev 3  flags -- cuda_ipc/cuda
#      resource 5  :  md 5  dev 4  flags -- rc_verbs/mlx5_0:1
#      resource 6  :  md 5  dev 4  flags -- rc_mlx5/mlx5_0:1
#      resource 7  :  md 5  dev 4  flags -- ud_verbs/mlx5_0:1
";

    fn opened(info: &str, cuda: bool) -> Result<Opened, String> {
        Ok(Opened {
            resources: resources(info),
            cuda_memory: cuda,
            said: Vec::new(),
            version: (1, 22),
        })
    }

    fn named(tls: Option<&str>, devices: &[&str], gpu: bool) -> Named {
        Named {
            tls: tls.map(str::to_string),
            devices: devices.iter().map(|s| s.to_string()).collect(),
            devices_from_env: false,
            gpu_memory: gpu,
        }
    }

    fn find<'a>(f: &'a [Finding], id: &str) -> Option<&'a Finding> {
        f.iter().find(|x| x.id == id)
    }

    /// The warning `id` among `f`, whose summary holds `says`.
    fn warned(f: &[Finding], id: &str, says: &str) {
        let w = find(f, id).unwrap_or_else(|| panic!("no {id} in {f:?}"));
        assert_eq!(w.status, FindingStatus::Warn, "{w:?}");
        assert!(w.summary.contains(says), "{id}: {}", w.summary);
    }

    #[test]
    fn resource_lines_parse() {
        let r = resources(HERE);
        assert_eq!(r.len(), 6);
        assert_eq!(r[1].to_string(), "tcp/lo");
        assert_eq!(r[5].to_string(), "cma/memory");
        assert_eq!(resources(CX)[5].to_string(), "rc_verbs/mlx5_0:1");
        assert!(resources("# UCP context\n#     md 0  :  component 0  self\n").is_empty());
    }

    #[test]
    fn here_nothing_named_is_ok() {
        let f = judge(&named(None, &[], false), &opened(HERE, false), &[], false);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].status, FindingStatus::Ok);
        assert!(
            f[0].summary.ends_with("between nodes: tcp/lo, tcp/eth0"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn an_rdma_device_named_but_only_tcp_warns() {
        // rxe0 is on the node, but this UCX has no verbs transport on it.
        let tcp_only = "#      resource 0  :  md 0  dev 0  flags -- tcp/eth0\n";
        let f = judge(
            &named(None, &["rxe0:1"], false),
            &opened(tcp_only, false),
            &["rxe0".into()],
            false,
        );
        warned(
            &f,
            "ucx.fallback",
            "RDMA device rxe0:1 named, but UCX has no RDMA transport on it: between nodes it would use tcp/eth0 instead",
        );
        // A device UCX does not have at all (named as `dev:port`), only shared memory left.
        let shm = "#      resource 0  :  md 0  dev 0  flags -- posix/memory\n";
        let f = judge(
            &named(None, &["mlx5_0:1"], false),
            &opened(shm, false),
            &[],
            false,
        );
        assert!(find(&f, "ucx.fallback")
            .unwrap()
            .summary
            .contains("no network transport at all"));
        // rc_verbs named as the transport.
        let f = judge(
            &named(Some("rc_verbs,tcp"), &[], false),
            &opened(tcp_only, false),
            &[],
            false,
        );
        assert!(find(&f, "ucx.fallback").is_some(), "{f:?}");
        // Nothing named, but the node has RDMA devices UCX cannot use.
        let f = judge(
            &named(None, &[], false),
            &opened(HERE, false),
            &["mlx5_0".into()],
            false,
        );
        assert!(find(&f, "ucx.fallback")
            .unwrap()
            .summary
            .starts_with("this node has RDMA devices (mlx5_0)"));
        // tcp named on purpose: no warning.
        let f = judge(
            &named(Some("tcp"), &["lo"], false),
            &opened(HERE, false),
            &["mlx5_0".into()],
            false,
        );
        assert!(find(&f, "ucx.fallback").is_none(), "{f:?}");
    }

    /// A device UCX does not have (it warns and runs on what it has) fails the finding, as
    /// the run's endpoint refuses it; `all`, exclusions and wildcards are UCX's to match.
    #[test]
    fn a_named_device_ucx_does_not_have_fails() {
        let here = resources(HERE);
        assert_eq!(missing_devices("lo", &here), Vec::<&str>::new());
        assert_eq!(missing_devices("junk, eth1", &here), ["junk", "eth1"]);
        // One name used: a list shared between runs (veth0 beside rxe0:1 with rc_verbs).
        assert!(missing_devices("lo,junk", &here).is_empty());
        for ucx_matches in ["all", "^lo", "", "junk,all"] {
            assert!(
                missing_devices(ucx_matches, &here).is_empty(),
                "{ucx_matches}"
            );
        }
        let f = judge(
            &named(None, &["junk"], false),
            &opened(HERE, false),
            &[],
            false,
        );
        let t = find(&f, "ucx.transports").unwrap();
        assert_eq!(t.status, FindingStatus::Fail, "{f:?}");
        assert!(
            t.summary.contains("no device named (junk) is UCX's; "),
            "{}",
            t.summary
        );
        let f = judge(
            &named(None, &["lo"], false),
            &opened(HERE, false),
            &[],
            false,
        );
        assert_eq!(
            find(&f, "ucx.transports").unwrap().status,
            FindingStatus::Ok
        );
        // From UCX_NET_DEVICES: a warning, as a run checks only what --devices names.
        let mut env = named(None, &["junk"], false);
        env.devices_from_env = true;
        let f = judge(&env, &opened(HERE, false), &[], false);
        assert_eq!(
            find(&f, "ucx.transports").unwrap().status,
            FindingStatus::Warn
        );
    }

    #[test]
    fn rc_without_an_auxiliary_transport_warns() {
        let rc = "#      resource 0  :  md 0  dev 0  flags -- rc_verbs/rxe0:1\n";
        let f = judge(
            &named(Some("rc_verbs"), &["rxe0:1"], false),
            &opened(rc, false),
            &["rxe0".into()],
            false,
        );
        warned(
            &f,
            "ucx.wireup",
            "TLS=rc_verbs NET_DEVICES=rxe0:1: rc_verbs/rxe0:1 but no transport to wire it up",
        );
        assert!(find(&f, "ucx.fallback").is_none(), "{f:?}");
        let rcud = "#      resource 0  :  md 0  dev 0  flags -- rc_verbs/rxe0:1
#      resource 1  :  md 0  dev 0  flags -- ud_verbs/rxe0:1
";
        let f = judge(
            &named(Some("rc_verbs,ud_verbs"), &["rxe0:1"], false),
            &opened(rcud, false),
            &["rxe0".into()],
            false,
        );
        assert!(find(&f, "ucx.wireup").is_none(), "{f:?}");
        assert_eq!(f.len(), 1, "{f:?}");
    }

    #[test]
    fn a_ucx_that_aborts_on_a_peer_dying_during_wire_up_warns() {
        let rctcp = "#      resource 0  :  md 0  dev 0  flags -- rc_verbs/rxe0:1
#      resource 1  :  md 1  dev 1  flags -- tcp/veth0
";
        let judged = |version, info| {
            let mut o = opened(info, false);
            if let Ok(o) = &mut o {
                o.version = version;
            }
            judge(
                &named(Some("rc_verbs,tcp"), &["rxe0:1", "veth0"], false),
                &o,
                &["rxe0".into()],
                false,
            )
        };
        let f = judged((1, 13), rctcp);
        warned(&f, "ucx.dead_peer", "UCX 1.13 built with assertions");
        warned(
            &f,
            "ucx.dead_peer",
            "dies while UCX wires up with it can abort",
        );
        warned(&f, "ucx.dead_peer", "over rc_verbs/rxe0:1 (UCX's assertion");
        warned(&f, "ucx.dead_peer", "; and over tcp (");
        // rc's abort ends at 1.14, tcp's later.
        let f = judged((1, 14), rctcp);
        warned(&f, "ucx.dead_peer", "UCX 1.14 built with assertions");
        assert!(!find(&f, "ucx.dead_peer")
            .unwrap()
            .summary
            .contains("rc_verbs"));
        assert!(find(&judged(TCP_WIREUP_PURGE_SINCE, rctcp), "ucx.dead_peer").is_none());
        // tcp alone.
        let tcp = "#      resource 1  :  md 1  dev 1  flags -- tcp/veth0\n";
        warned(
            &judged((1, 13), tcp),
            "ucx.dead_peer",
            "this process over tcp (",
        );
        assert!(find(&judged(TCP_WIREUP_PURGE_SINCE, tcp), "ucx.dead_peer").is_none());
        // Shared memory alone: no peer failure handling, no wire-up abort seen.
        let sm = "#      resource 2  :  md 2  dev 2  flags -- posix/memory\n";
        assert!(find(&judged((1, 13), sm), "ucx.dead_peer").is_none());
    }

    #[test]
    fn connectx_with_rdma_and_cuda_is_ok() {
        let f = judge(
            &named(Some("rc_verbs,cuda_copy,cuda_ipc"), &["mlx5_0:1"], true),
            &opened(CX, true),
            &["mlx5_0".into()],
            true,
        );
        assert!(find(&f, "ucx.fallback").is_none(), "{f:?}");
        assert_eq!(find(&f, "ucx.cuda").unwrap().status, FindingStatus::Ok);
        assert!(find(&f, "ucx.transports").unwrap().summary.contains(
            "between nodes: tcp/eth0, rc_verbs/mlx5_0:1, rc_mlx5/mlx5_0:1, ud_verbs/mlx5_0:1"
        ));
        // No peer memory: GPU memory would be staged through the host.
        let f = judge(
            &named(None, &["mlx5_0:1"], true),
            &opened(CX, true),
            &["mlx5_0".into()],
            false,
        );
        warned(&f, "ucx.cuda", "through host buffers");
    }

    #[test]
    fn cuda_asked_of_a_ucx_without_cuda_warns() {
        let f = judge(
            &named(Some("sm"), &[], true),
            &opened(HERE, false),
            &[],
            false,
        );
        warned(&f, "ucx.cuda", "no CUDA memory domain");
        // Not asked: nothing said about CUDA.
        let f = judge(
            &named(Some("sm"), &[], false),
            &opened(HERE, false),
            &[],
            false,
        );
        assert!(find(&f, "ucx.cuda").is_none());
    }

    #[test]
    fn a_context_that_does_not_open_fails_with_ucx_words() {
        let f = judge(
            &named(Some("rc_verbs"), &[], false),
            &Err("No such device".into()),
            &[],
            false,
        );
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, FindingStatus::Fail);
        assert_eq!(
            f[0].summary,
            "UCX opened no transport for TLS=rc_verbs NET_DEVICES=(default): No such device"
        );
    }

    /// Live: the loaded UCX opens with shared memory and says its version.
    #[test]
    fn live_probe_of_this_ucx() {
        let p = probe(&ProbeAsk {
            backend: Some("ucx".into()),
            provider: Some("tcp".into()),
            devices: vec!["lo".into()],
            gpu_memory: false,
        });
        assert!(p.version.starts_with("1."), "{p:?}");
        assert_eq!(p.offers, vec!["tcp"], "{p:?}");
        let t = p
            .findings
            .iter()
            .find(|f| f.id == "ucx.transports")
            .unwrap();
        assert!(
            t.summary.contains("TLS=tcp NET_DEVICES=lo: tcp/lo"),
            "{}",
            t.summary
        );
        // Asked of another backend: UCX's defaults, not tcp alone.
        let p = probe(&ProbeAsk {
            backend: Some("verbs".into()),
            provider: Some("tcp".into()),
            ..ProbeAsk::default()
        });
        let t = p
            .findings
            .iter()
            .find(|f| f.id == "ucx.transports")
            .unwrap();
        assert!(!t.summary.contains("TLS=tcp"), "{}", t.summary);
    }
}
