//! What this backend says about itself (the parts of `crate::INFO`: its options, NIC driver,
//! provider environment), what a node check learns from the loaded libfabric ([`probe`]),
//! and what an open endpoint runs on (`Endpoint::runtime_facts`).

use std::os::raw::{c_char, c_void};

use libfabric_sys as fi;
use transport_core::{
    mapped_library, Finding, FindingStatus, NicDesc, OptionInfo, Probe, ProbeAsk, Runtime,
    Transport,
};

use crate::endpoint::Endpoint;
use crate::error::{cstr, runtime_version};

/// The options of `NicDesc::options` (the crate docs say what each does).
pub(crate) const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        key: "mr_mode",
        values: "strict|default",
        help: "strict: ask for EFA's registration mode on any provider",
    },
    OptionInfo {
        key: "hmem",
        values: "auto|on|off",
        help: "ask for FI_HMEM (GPU memory)",
    },
    OptionInfo {
        key: "write_completion",
        values: "auto|delivery|transmit",
        help: "when a WRITE completes at the initiator",
    },
    OptionInfo {
        key: "fabric",
        values: "NAME",
        help: "only that libfabric fabric (e.g. efa-direct)",
    },
    OptionInfo {
        key: "shm",
        values: "off|on",
        help: "whether efa may hand same-host peers to shm",
    },
    OptionInfo {
        key: "cuda_api",
        values: "auto|on|off",
        help: "FI_OPT_CUDA_API_PERMITTED",
    },
    OptionInfo {
        key: "rx_cq_data",
        values: "auto|on",
        help: "on: post receives for immediates on any provider (tests)",
    },
    OptionInfo {
        key: "gpu_ipc",
        values: "on|off",
        help: "register GPU memory with FI_HMEM_DEVICE_ONLY (CUDA IPC between processes)",
    },
];

/// The efa provider (named, or the default) goes over the machine's EFA devices; shm and tcp
/// copy memory.
pub(crate) fn nic_driver(provider: Option<&str>) -> Option<&'static str> {
    provider.is_none_or(|p| p == "efa").then_some("efa")
}

/// libfabric's tcp provider stays on the loopback interface unless told otherwise: traffic
/// of a run on one host (and of tests) never leaves it.
pub(crate) fn provider_env(provider: &str) -> &'static [(&'static str, &'static str)] {
    if provider.starts_with("tcp") {
        &[("FI_TCP_IFACE", "lo")]
    } else {
        &[]
    }
}

/// The loaded libfabric's release as it reports it (`fi_tostr(FI_TYPE_VERSION)`): `2.6.0`,
/// or the EFA installer's `2.1.0amzn3.0`, where [`Endpoint::libfabric_version`] is the API
/// version `2.1`.
pub fn libfabric_release() -> String {
    let mut buf = [0 as c_char; 128];
    let one: i32 = 1;
    // SAFETY: buf is writable for its length; libfabric writes a NUL-terminated string into
    // it and returns buf (or NULL); `one` is a valid pointer it does not read for this type
    // (NULL is refused before the type is looked at).
    let p = unsafe {
        fi::fi_tostr_r(
            buf.as_mut_ptr(),
            buf.len(),
            (&one as *const i32).cast::<c_void>(),
            fi::FI_TYPE_VERSION,
        )
    };
    // SAFETY: NULL or buf, which holds a NUL-terminated string.
    let s = unsafe { cstr(p) };
    if s.is_empty() {
        runtime_version()
    } else {
        s
    }
}

/// What the doctor asks of libfabric on this machine: its version and file, its providers,
/// whether an endpoint that must take GPU memory opens (on efa where present, else shm),
/// and whether the library names `libcuda.so` (a CUDA-enabled build loads or links it).
pub fn probe(ask: &ProbeAsk) -> Probe {
    let providers = Endpoint::available_providers();
    // What the run names is for libfabric only where the run is on libfabric.
    let findings = named(&ask.for_backend(&crate::INFO));
    let p = if providers.iter().any(|p| p == "efa") {
        "efa"
    } else {
        "shm"
    };
    let hmem = providers.iter().any(|x| x == p) && {
        let d = NicDesc::provider(p).with_option("hmem", "on");
        Endpoint::open(&d).is_ok_and(|ep| ep.caps().gpu_memory)
    };
    let path = mapped_library("libfabric");
    let cuda = path.as_deref().and_then(names_libcuda);
    Probe {
        library: "libfabric".into(),
        version: libfabric_release(),
        path,
        offers: providers,
        gpu: Some((p.into(), hmem)),
        cuda_in_library: cuda,
        findings,
    }
}

/// Whether an endpoint opens on what the run will name (`--provider`, each of `--devices`,
/// GPU memory with `--mem cuda`), one finding each; none where nothing was named.
fn named(ask: &ProbeAsk) -> Vec<Finding> {
    if ask.provider.is_none() && ask.devices.is_empty() {
        return Vec::new();
    }
    let devices: Vec<Option<&str>> = if ask.devices.is_empty() {
        vec![None]
    } else {
        ask.devices.iter().map(|d| Some(d.as_str())).collect()
    };
    devices
        .into_iter()
        .map(|d| {
            let nic = NicDesc {
                provider: ask.provider.clone(),
                device: d.map(str::to_string),
                ..NicDesc::default()
            }
            .with_gpu_memory(ask.gpu_memory);
            let nic = if ask.gpu_memory {
                nic.with_option("hmem", "on")
            } else {
                nic
            };
            let what = format!(
                "provider {}{}{}",
                ask.provider.as_deref().unwrap_or("(default)"),
                d.map(|d| format!(", device {d}")).unwrap_or_default(),
                if ask.gpu_memory { ", GPU memory" } else { "" }
            );
            match Endpoint::open(&nic) {
                Ok(ep) if ask.gpu_memory && !ep.caps().gpu_memory => Finding {
                    id: "libfabric.named".into(),
                    status: FindingStatus::Fail,
                    summary: format!("{what}: the endpoint opened, but takes no GPU memory"),
                    fix: Some(
                        "use a provider and libfabric built with FI_HMEM (CUDA) support".into(),
                    ),
                },
                Ok(ep) => Finding {
                    id: "libfabric.named".into(),
                    status: FindingStatus::Ok,
                    summary: format!(
                        "{what}: an endpoint opened ({} on {})",
                        ep.provider(),
                        ep.nic_name()
                    ),
                    fix: None,
                },
                Err(e) => Finding {
                    id: "libfabric.named".into(),
                    status: FindingStatus::Fail,
                    summary: format!("{what}: no endpoint opened: {e}"),
                    fix: Some(
                        "`fi_info -l` lists the providers here, `fi_info -p PROVIDER` their \
                         domains (the names --devices takes)"
                            .into(),
                    ),
                },
            }
        })
        .collect()
}

fn names_libcuda(path: &str) -> Option<bool> {
    let bytes = std::fs::read(path).ok()?;
    let needle = b"libcuda.so";
    Some(bytes.windows(needle.len()).any(|w| w == needle))
}

impl Endpoint {
    /// What this endpoint runs on (`Transport::runtime`).
    pub(crate) fn runtime_facts(&self) -> Runtime {
        let ep = self;
        let i = ep.info();
        let mut settings = std::collections::BTreeMap::new();
        let mut set = |k: &str, v: String| {
            settings.insert(k.to_string(), v);
        };
        set("api_version", i.api_version.clone());
        set("provider_version", i.provider_version.clone());
        set("threading", i.threading.to_string());
        set("mr_mode", ep.mr_mode().to_string());
        set(
            "write_completion",
            if ep.write_flags & fi::FI_DELIVERY_COMPLETE != 0 {
                "delivery"
            } else {
                "transmit"
            }
            .into(),
        );
        set("gpu_memory", ep.caps().gpu_memory.to_string());
        set("rx_cq_data", i.rx_cq_data.to_string());
        let opt = |b: Option<bool>| b.map(|b| b.to_string());
        for (k, v) in [
            ("shm_permitted", opt(i.shm_permitted)),
            ("cuda_api_permitted", opt(i.cuda_api_permitted)),
            ("emulated_write", opt(i.emulated_write)),
            ("pci", i.pci.map(|p| p.to_string())),
        ] {
            if let Some(v) = v {
                set(k, v);
            }
        }
        Runtime {
            backend: Endpoint::BACKEND.into(),
            library: "libfabric".into(),
            version: Some(libfabric_release()),
            path: mapped_library("libfabric"),
            provider: Some(ep.provider().to_string()),
            fabric: Some(ep.fabric_name().to_string()),
            device: ep.nic_name().to_string(),
            firmware: i.firmware.clone(),
            settings,
        }
    }
}

#[cfg(test)]
mod tests {
    use transport_core::{check_options, Transport};

    use super::*;
    use crate::INFO;

    /// The release libfabric reports begins with the API version `fi_version` gives.
    #[test]
    fn release_and_api_version_agree() {
        let r = libfabric_release();
        assert!(
            r.starts_with(&format!("{}.", Endpoint::libfabric_version())),
            "{r} vs {}",
            Endpoint::libfabric_version()
        );
    }

    #[test]
    fn describes_itself() {
        assert_eq!(Endpoint::BACKEND, "libfabric");
        // Its name before the rename still answers (a peer's hello, --backend efa).
        assert!(INFO.answers_to("efa") && INFO.answers_to("libfabric"));
        assert_eq!(nic_driver(None), Some("efa"));
        assert_eq!(nic_driver(Some("efa")), Some("efa"));
        assert_eq!(nic_driver(Some("shm")), None);
        assert_eq!(nic_driver(Some("tcp")), None);
        assert_eq!(provider_env("tcp;ofi_rxm"), &[("FI_TCP_IFACE", "lo")]);
        assert!(provider_env("shm").is_empty());
        // Every option the parser takes is listed, and nothing else.
        let mut o = std::collections::BTreeMap::new();
        for k in OPTIONS {
            o.insert(k.key.to_string(), "x".to_string());
        }
        check_options(&INFO, &o).unwrap();
        assert_eq!(
            INFO.known_options(),
            "mr_mode=strict|default, hmem=auto|on|off, write_completion=auto|delivery|transmit, \
             fabric=NAME, shm=off|on, cuda_api=auto|on|off, rx_cq_data=auto|on, gpu_ipc=on|off"
        );
    }

    #[test]
    fn runtime_names_what_was_opened() {
        let ep = Endpoint::open(&NicDesc::provider("shm")).unwrap();
        let r = ep.runtime();
        assert_eq!(
            (r.backend.as_str(), r.library.as_str()),
            ("libfabric", "libfabric")
        );
        assert_eq!(r.provider.as_deref(), Some(ep.provider()));
        assert_eq!(r.fabric.as_deref(), Some(ep.fabric_name()));
        assert_eq!(r.device, ep.nic_name());
        assert_eq!(r.version, Some(libfabric_release()));
        assert!(
            r.path
                .as_deref()
                .is_some_and(|p| p.contains("libfabric.so")),
            "{r:?}"
        );
        assert_eq!(r.settings["api_version"], ep.info().api_version);
        assert_eq!(r.settings["write_completion"], "transmit", "shm's default");
    }
}
