//! What this backend says about itself (the parts of `crate::INFO`: its options and NIC
//! driver) and what an open endpoint runs on (`Endpoint::runtime_facts`).

use std::collections::BTreeMap;

use transport_core::{mapped_library, OptionInfo, Runtime, Transport};

use crate::endpoint::Endpoint;

/// The options of `NicDesc::options` (the crate docs say what each does).
pub(crate) const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        key: "port",
        values: "1..=255",
        help: "the port (default 1)",
    },
    OptionInfo {
        key: "gid",
        values: "0..=255",
        help: "force the local GID index",
    },
    OptionInfo {
        key: "timeout",
        values: "0..=31",
        help: "RC local ACK timeout exponent, 4.096 us * 2^t (default 14)",
    },
    OptionInfo {
        key: "retry_cnt",
        values: "0..=7",
        help: "transport retries (default 7)",
    },
    OptionInfo {
        key: "rnr_retry",
        values: "0..=7",
        help: "receiver-not-ready retries, 7 = forever (default 7)",
    },
    OptionInfo {
        key: "min_rnr_timer",
        values: "0..=31",
        help: "(default 12)",
    },
    OptionInfo {
        key: "inline",
        values: "0..=4096",
        help: "largest inline payload asked for (default 128)",
    },
    OptionInfo {
        key: "imm_depth",
        values: "N",
        help: "receives kept posted for immediates (default 512)",
    },
    OptionInfo {
        key: "chain_bytes",
        values: "N",
        help: "payload after which post_writes closes a chain (default 65536)",
    },
    OptionInfo {
        key: "sl",
        values: "0..=15",
        help: "service level",
    },
    OptionInfo {
        key: "tc",
        values: "0..=255",
        help: "GRH traffic class (RoCE v2: DSCP << 2 | ECN)",
    },
    OptionInfo {
        key: "traffic_class",
        values: "0..=255",
        help: "the same as tc",
    },
    OptionInfo {
        key: "hop_limit",
        values: "0..=255",
        help: "GRH hop limit (default 64)",
    },
    OptionInfo {
        key: "relaxed_ordering",
        values: "on|off",
        help: "register regions with IBV_ACCESS_RELAXED_ORDERING (default on)",
    },
];

/// Every verbs run goes over the machine's RDMA NICs; the instance table names ConnectX's
/// driver.
pub(crate) fn nic_driver(_provider: Option<&str>) -> Option<&'static str> {
    Some("mlx5")
}

/// rdma-core's release from libibverbs' file name, `libibverbs.so.1.<ABI>.<release>`
/// (`libibverbs.so.1.14.44.0` is rdma-core 44.0).
fn rdma_core_release(path: &str) -> Option<String> {
    let file = std::path::Path::new(path).file_name()?.to_str()?;
    let rest = file.strip_prefix("libibverbs.so.")?;
    let parts: Vec<&str> = rest.split('.').collect();
    (parts.len() > 2 && parts.iter().all(|p| p.chars().all(|c| c.is_ascii_digit())))
        .then(|| parts[2..].join("."))
}

impl Endpoint {
    /// What this endpoint runs on (`Transport::runtime`).
    pub(crate) fn runtime_facts(&self) -> Runtime {
        let ep = self;
        let path = mapped_library("libibverbs");
        let mut settings = BTreeMap::new();
        settings.insert("port".into(), ep.port().to_string());
        settings.insert(
            "link_layer".into(),
            if ep.is_roce() { "RoCE" } else { "InfiniBand" }.into(),
        );
        settings.insert("active_mtu".into(), ep.active_mtu().to_string());
        settings.insert("gid_index".into(), ep.gid_index().to_string());
        settings.insert("traffic_class".into(), ep.traffic_class().to_string());
        settings.insert(
            "relaxed_ordering".into(),
            if ep.relaxed_ordering() { "on" } else { "off" }.into(),
        );
        Runtime {
            backend: Endpoint::BACKEND.into(),
            library: "rdma-core".into(),
            version: path.as_deref().and_then(rdma_core_release),
            path,
            provider: None,
            fabric: None,
            device: ep.device().to_string(),
            firmware: ep.firmware().map(str::to_string),
            settings,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use transport_core::{check_options, Error, NicDesc, Transport};

    use super::*;
    use crate::INFO;

    #[test]
    fn the_release_comes_from_the_file_name() {
        assert_eq!(
            rdma_core_release("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0").as_deref(),
            Some("44.0")
        );
        assert_eq!(
            rdma_core_release("/opt/rdma/lib/libibverbs.so.1.14.56.1").as_deref(),
            Some("56.1")
        );
        assert_eq!(rdma_core_release("/usr/lib/libibverbs.so.1"), None);
        assert_eq!(rdma_core_release("/usr/lib/libfabric.so.1.20.0"), None);
    }

    /// Every key the endpoint reads is listed; an unknown one is refused before any device
    /// is opened (it used to be ignored: `tcc=104` ran at traffic class 0).
    #[test]
    fn options_are_checked_against_the_list() {
        assert_eq!(Endpoint::BACKEND, "verbs");
        let keys = [
            "port",
            "gid",
            "timeout",
            "retry_cnt",
            "rnr_retry",
            "min_rnr_timer",
            "inline",
            "imm_depth",
            "chain_bytes",
            "sl",
            "tc",
            "traffic_class",
            "hop_limit",
            "relaxed_ordering",
        ];
        let all: BTreeMap<String, String> =
            keys.iter().map(|k| (k.to_string(), "1".into())).collect();
        check_options(&INFO, &all).unwrap();
        assert_eq!(INFO.options.len(), keys.len());
        match Endpoint::open(&NicDesc::default().with_option("tcc", "104")) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("unknown verbs option `tcc=104`"), "{m}");
                assert!(m.contains("tc=0..=255"), "{m}");
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
