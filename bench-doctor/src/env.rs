//! `FI_*` / `NCCL_*` settings that conflict with the machine: one table of rules, each a
//! condition, a status and a one-line fix. README.md lists the same table.

use crate::report::{Check, Status};
use crate::sys::Facts;

/// The environment as doctor sees it (this process's, or a test's).
pub struct Env<'a>(pub &'a [(String, String)]);

impl Env<'_> {
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.trim())
    }
    fn is(&self, k: &str, v: &str) -> bool {
        self.get(k).is_some_and(|x| x.eq_ignore_ascii_case(v))
    }
    fn one_of(&self, k: &str, vs: &[&str]) -> bool {
        vs.iter().any(|v| self.is(k, v))
    }
}

/// What a rule looks at.
pub struct Ctx<'a> {
    pub env: Env<'a>,
    pub facts: &'a Facts,
    /// The loaded libfabric's version (`major`, `minor`), where known.
    pub libfabric: Option<(u32, u32)>,
}

impl Ctx<'_> {
    /// Whether applications can ask for libfabric API 1.18 or later (the library is 1.18+),
    /// `None` where the version is unknown.
    fn api_1_18(&self) -> Option<bool> {
        self.libfabric.map(|v| v >= (1, 18))
    }
    fn gpus(&self) -> usize {
        self.facts.gpus().len()
    }
    fn rdma(&self) -> bool {
        !self.facts.ib.is_empty()
    }
}

/// One rule: fires when `when` returns the message.
pub struct Rule {
    pub id: &'static str,
    pub status: Status,
    pub when: fn(&Ctx<'_>) -> Option<String>,
    pub fix: &'static str,
}

/// The rules, in the order doctor reports them.
pub const RULES: &[Rule] = &[
    Rule {
        id: "fi-provider-not-efa",
        status: Status::Fail,
        when: |c| {
            let p = c.env.get("FI_PROVIDER")?;
            (c.facts.has_efa() && !p.split(',').any(|x| x.trim() == "efa"))
                .then(|| format!("FI_PROVIDER={p} on an EFA host: libfabric will not use the EFA devices"))
        },
        fix: "unset FI_PROVIDER (or set FI_PROVIDER=efa)",
    },
    Rule {
        id: "fi-provider-efa-absent",
        status: Status::Fail,
        when: |c| {
            (c.env.is("FI_PROVIDER", "efa") && !c.facts.has_efa())
                .then(|| "FI_PROVIDER=efa but this host has no EFA device: libfabric finds no provider".into())
        },
        fix: "unset FI_PROVIDER on this host",
    },
    Rule {
        id: "efa-device-rdma-off",
        status: Status::Fail,
        when: |c| {
            (c.env.one_of("FI_EFA_USE_DEVICE_RDMA", &["0", "false", "no", "off"])
                && c.facts.has_efa()
                && c.gpus() > 0)
                .then(|| {
                    let default = match c.api_1_18() {
                        Some(true) => "unset, it is on wherever the device supports RDMA \
                                       for applications asking libfabric API 1.18 or later \
                                       (rdma-bench, aws-ofi-nccl)",
                        Some(false) => "this libfabric is older than 1.18, where the p4d and \
                                        p5 EFA generations default to off anyway",
                        None => "its default depends on the libfabric API version asked",
                    };
                    format!("FI_EFA_USE_DEVICE_RDMA=0 with GPUs: EFA emulates WRITEs over SENDs and copies GPU data instead of GPUDirect RDMA ({default})")
                })
        },
        fix: "unset FI_EFA_USE_DEVICE_RDMA with libfabric 1.18 or later (the EFA installer's \
              2.x); with an older libfabric set FI_EFA_USE_DEVICE_RDMA=1 or upgrade",
    },
    Rule {
        id: "efa-device-rdma-old-api",
        status: Status::Warn,
        when: |c| {
            (c.api_1_18() == Some(false)
                && c.facts.efa_gen1_or_2()
                && c.env.get("FI_EFA_USE_DEVICE_RDMA").is_none())
                .then(|| {
                    format!(
                        "libfabric {}.{} predates API 1.18: its efa provider turns device RDMA off on this EFA generation (0xefa0/0xefa1: p4d, p5), so WRITEs are emulated over SENDs and GPU memory is copied",
                        c.libfabric.map_or(0, |v| v.0),
                        c.libfabric.map_or(0, |v| v.1)
                    )
                })
        },
        fix: "use the EFA installer's libfabric 2.x (/opt/amazon/efa), or set \
              FI_EFA_USE_DEVICE_RDMA=1",
    },
    Rule {
        id: "hmem-p2p-off",
        status: Status::Warn,
        when: |c| {
            (c.env.one_of("FI_HMEM_DISABLE_P2P", &["1", "yes", "true"]) && c.gpus() > 0)
                .then(|| "FI_HMEM_DISABLE_P2P set with GPUs: GPU data goes through host bounce buffers".into())
        },
        fix: "unset FI_HMEM_DISABLE_P2P",
    },
    Rule {
        id: "nccl-net-socket",
        status: Status::Fail,
        when: |c| {
            (c.env.is("NCCL_NET", "Socket") && c.rdma())
                .then(|| "NCCL_NET=Socket on a host with RDMA devices: NCCL runs over TCP".into())
        },
        fix: "unset NCCL_NET",
    },
    Rule {
        id: "nccl-net-ib-on-efa",
        status: Status::Fail,
        when: |c| {
            (c.env.is("NCCL_NET", "IB") && c.facts.has_efa() && !c.facts.has_mlx5())
                .then(|| "NCCL_NET=IB on an EFA host: EFA is reached through the aws-ofi-nccl (libfabric) plugin, not NCCL's IB transport".into())
        },
        fix: "unset NCCL_NET so NCCL picks the aws-ofi-nccl plugin",
    },
    Rule {
        id: "nccl-net-vs-fi-provider",
        status: Status::Warn,
        when: |c| {
            let net = c.env.get("NCCL_NET")?;
            let p = c.env.get("FI_PROVIDER")?;
            (net.eq_ignore_ascii_case("IB") || net.eq_ignore_ascii_case("Socket")).then(|| {
                format!("NCCL_NET={net} with FI_PROVIDER={p}: FI_PROVIDER only steers the libfabric plugin, which NCCL_NET={net} bypasses")
            })
        },
        fix: "drop one of the two: NCCL_NET for NCCL's own transports, FI_PROVIDER for the libfabric plugin",
    },
    Rule {
        id: "nccl-ib-disabled",
        status: Status::Fail,
        when: |c| {
            (c.env.one_of("NCCL_IB_DISABLE", &["1", "true"]) && c.facts.has_mlx5())
                .then(|| "NCCL_IB_DISABLE=1 on a ConnectX host: NCCL falls back to TCP sockets".into())
        },
        fix: "unset NCCL_IB_DISABLE",
    },
    Rule {
        id: "nccl-gdr-off",
        status: Status::Warn,
        when: |c| {
            (c.env.one_of("NCCL_NET_GDR_LEVEL", &["LOC", "0"]) && c.gpus() > 0 && c.rdma())
                .then(|| "NCCL_NET_GDR_LEVEL=LOC: GPUDirect RDMA off, network data staged through host memory".into())
        },
        fix: "unset NCCL_NET_GDR_LEVEL (NCCL picks it from the topology)",
    },
    Rule {
        id: "nccl-p2p-off",
        status: Status::Warn,
        when: |c| {
            (c.env.one_of("NCCL_P2P_DISABLE", &["1", "true"]) && c.gpus() > 1)
                .then(|| "NCCL_P2P_DISABLE=1: GPU-to-GPU traffic inside the node goes through host memory".into())
        },
        fix: "unset NCCL_P2P_DISABLE",
    },
    Rule {
        id: "nccl-ib-hca-absent",
        status: Status::Warn,
        when: |c| {
            let v = c.env.get("NCCL_IB_HCA")?;
            if v.starts_with('^') || c.facts.ib.is_empty() {
                return None;
            }
            let missing: Vec<&str> = v
                .trim_start_matches('=')
                .split(',')
                .map(|x| x.split(':').next().unwrap_or("").trim())
                .filter(|x| !x.is_empty())
                .filter(|x| !c.facts.ib.iter().any(|d| d.name.starts_with(x)))
                .collect();
            (!missing.is_empty())
                .then(|| format!("NCCL_IB_HCA names {} which this host lacks", missing.join(", ")))
        },
        fix: "list devices from /sys/class/infiniband in NCCL_IB_HCA, or unset it",
    },
];

/// Every rule that fires, or one ok check saying how many settings were looked at.
pub fn checks(ctx: &Ctx<'_>) -> Vec<Check> {
    let mut out: Vec<Check> = RULES
        .iter()
        .filter_map(|r| {
            (r.when)(ctx).map(|msg| Check {
                id: format!("env.{}", r.id),
                status: r.status,
                summary: msg,
                fix: Some(r.fix.to_string()),
            })
        })
        .collect();
    if out.is_empty() {
        let set: Vec<&str> = ctx
            .env
            .0
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| k.starts_with("FI_") || k.starts_with("NCCL_"))
            .collect();
        out.push(Check {
            id: "env".into(),
            status: Status::Ok,
            summary: if set.is_empty() {
                "no FI_* or NCCL_* settings".into()
            } else {
                format!("no conflict among {}", set.join(", "))
            },
            fix: None,
        });
    }
    out
}
