//! What a backend says about itself: a [`BackendInfo`] for the program that offers it
//! ([`crate::Transport::INFO`]), the [`Runtime`] facts of an endpoint it opened
//! ([`crate::Transport::runtime`]), and the [`Probe`] a node check asks of it.
//!
//! A program that offers several backends (the `rdma-bench` binary) keeps one table of them
//! and takes everything else from here: the names users type, the help, the provider
//! defaults, the options each takes, the NIC driver that decides NIC placement, and what the
//! node check should ask. Nothing in this crate names a backend.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A backend's description of itself (one `const` per backend crate, [`crate::Transport::INFO`]).
#[derive(Debug)]
pub struct BackendInfo {
    /// The name users type (`--backend`), reports print and peers compare, e.g. `"verbs"`.
    pub name: &'static str,
    /// Other names accepted for it on a command line (a renamed backend keeps its old name).
    pub aliases: &'static [&'static str],
    /// One line of help for the name.
    pub help: &'static str,
    /// The library it drives, as users know it (`"libfabric"`), in messages about it.
    pub library: &'static str,
    /// Whether the backend runs over one of several providers its library offers, chosen by
    /// name (`NicDesc::provider`); `None` where a device name is all there is to choose.
    pub provider: Option<ProviderInfo>,
    /// What a device name (`NicDesc::device`, a program's `--devices`) names for this backend,
    /// in a few words with examples, for help: `"ibverbs devices: mlx5_0, rxe0"`.
    pub devices: &'static str,
    /// The driver of the NICs a run with this provider goes over, as an instance table names
    /// it (`"efa"`, `"mlx5"`); `None` where the provider uses no NIC of the machine's (a
    /// provider that copies memory). A run places its endpoints on each GPU's NIC group only
    /// where this is `Some`.
    pub nic_driver: fn(provider: Option<&str>) -> Option<&'static str>,
    /// Every option `NicDesc::options` may carry; any other key is refused at open
    /// ([`check_options`]).
    pub options: &'static [OptionInfo],
    /// An environment variable whose `key=value,...` the program hands every NIC as options
    /// (below the command line's own), where the backend has one.
    pub options_env: Option<OptionsEnv>,
    /// Options for endpoints whose peers are in the same process (both sides of a loopback)
    /// with GPU memory, unless given: what the backend needs where two endpoints of one
    /// process exchange GPU memory.
    pub same_process_gpu: &'static [(&'static str, &'static str)],
    /// What a node check should ask of the library, where it has more to say than the
    /// machine's own files (`None`: nothing), given what the user named ([`ProbeAsk`]).
    pub probe: Option<fn(&ProbeAsk) -> Probe>,
    /// How to end the process without closing endpoints a dead peer may have wedged, where
    /// the backend has a way of its own (plain `exit` otherwise).
    pub exit_abandoning: Option<fn(i32) -> !>,
}

/// How a backend's providers are chosen (see [`BackendInfo::provider`]).
#[derive(Debug)]
pub struct ProviderInfo {
    /// What a provider's name is, in a few words with examples, for help: `"efa, shm, tcp"`.
    pub names: &'static str,
    /// The provider a run with both sides in one process opens when none is named.
    pub loopback_default: &'static str,
    /// Environment variables a provider needs before any thread or library call exists,
    /// `(name, value)`, each set only where unset.
    pub env: fn(provider: &str) -> &'static [(&'static str, &'static str)],
}

/// One option of `NicDesc::options`.
#[derive(Debug)]
pub struct OptionInfo {
    pub key: &'static str,
    /// The values it takes, as users read them: `auto|on|off`, `NAME`, `0..=31`.
    pub values: &'static str,
    pub help: &'static str,
}

/// An environment variable of options (see [`BackendInfo::options_env`]).
#[derive(Debug)]
pub struct OptionsEnv {
    pub name: &'static str,
    /// A value to show in its error message, e.g. `timeout=20,retry_cnt=7`.
    pub example: &'static str,
}

impl BackendInfo {
    /// Whether `s` names this backend (its name or an alias).
    pub fn answers_to(&self, s: &str) -> bool {
        self.name == s || self.aliases.contains(&s)
    }

    /// Every option as `key=values`, comma separated, for messages.
    pub fn known_options(&self) -> String {
        let v: Vec<String> = self
            .options
            .iter()
            .map(|o| format!("{}={}", o.key, o.values))
            .collect();
        v.join(", ")
    }

    /// The error for an option this backend does not take as given.
    pub fn unknown_option(&self, key: &str, value: &str) -> Error {
        Error::InvalidArgument(format!(
            "unknown {} option `{key}={value}`; known options: {}",
            self.library,
            self.known_options()
        ))
    }
}

/// Refuse any key of `options` that `info` does not list.
pub fn check_options(info: &BackendInfo, options: &BTreeMap<String, String>) -> Result<()> {
    match options
        .iter()
        .find(|(k, _)| !info.options.iter().any(|o| o.key == k.as_str()))
    {
        Some((k, v)) => Err(info.unknown_option(k, v)),
        None => Ok(()),
    }
}

/// What an open endpoint runs on: the library the backend loaded and what it opened. Sent to
/// peers and written into run records, so two records can be compared.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runtime {
    /// [`crate::Transport::BACKEND`].
    pub backend: String,
    /// The library, e.g. `libfabric`, `rdma-core`.
    pub library: String,
    /// Its version as the loaded library reports it, where it does.
    pub version: Option<String>,
    /// The library file this process mapped, where known.
    pub path: Option<String>,
    /// The provider opened, for backends with providers (`tcp;ofi_rxm`).
    pub provider: Option<String>,
    /// The fabric opened, where the library has fabrics.
    pub fabric: Option<String>,
    /// The NIC opened (a libfabric domain, an ibverbs device).
    pub device: String,
    /// The NIC's firmware, where readable.
    pub firmware: Option<String>,
    /// Settings that decide how the endpoint behaves (API version, completion semantics,
    /// link layer, ...), by name.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

/// What the user named for a node check to ask a backend about (`doctor --backend B
/// --provider P --devices D --mem cuda`): the same words a run takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeAsk {
    /// The backend these are for; a probe of another backend takes none of them.
    pub backend: Option<String>,
    pub provider: Option<String>,
    pub devices: Vec<String>,
    /// Whether the run will use GPU memory.
    pub gpu_memory: bool,
}

impl ProbeAsk {
    /// What was named for the backend `info` (nothing where another backend was named).
    pub fn for_backend(&self, info: &BackendInfo) -> ProbeAsk {
        match &self.backend {
            Some(b) if info.answers_to(b) => self.clone(),
            _ => ProbeAsk::default(),
        }
    }
}

/// What a node check learns from a backend's library on this machine ([`BackendInfo::probe`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The library, e.g. `libfabric`.
    pub library: String,
    /// Its version as the loaded library reports it.
    pub version: String,
    /// The library file this process mapped, where known.
    pub path: Option<String>,
    /// What the library offers here (libfabric: its providers).
    pub offers: Vec<String>,
    /// The provider GPU memory was tried on, and whether an endpoint that must take GPU
    /// memory opened there; `None` where not tried.
    pub gpu: Option<(String, bool)>,
    /// Whether the library file names the CUDA driver library (`libcuda.so`); `None` where it
    /// could not be read.
    pub cuda_in_library: Option<bool>,
    /// The backend's own findings about this node, for the node check to list.
    pub findings: Vec<Finding>,
}

/// One finding of a backend about this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// A short id, e.g. `ucx.transports`.
    pub id: String,
    pub status: FindingStatus,
    pub summary: String,
    /// What to do, where something is wrong.
    pub fix: Option<String>,
}

/// How a [`Finding`] judges what it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FindingStatus {
    Ok,
    Warn,
    Fail,
}

/// The file of a shared library this process mapped, from `/proc/self/maps`: the first whose
/// file name starts with `stem.so` (e.g. `libfabric` finds `libfabric.so.1.27.0`).
pub fn mapped_library(stem: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let prefix = format!("{stem}.so");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(&prefix))
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: Option<&str>) -> Option<&'static str> {
        None
    }

    const INFO: BackendInfo = BackendInfo {
        name: "demo",
        aliases: &["old"],
        help: "",
        library: "libdemo",
        provider: None,
        devices: "demo devices",
        nic_driver: none,
        options: &[
            OptionInfo {
                key: "mode",
                values: "a|b",
                help: "",
            },
            OptionInfo {
                key: "depth",
                values: "N",
                help: "",
            },
        ],
        options_env: None,
        same_process_gpu: &[],
        probe: None,
        exit_abandoning: None,
    };

    #[test]
    fn options_outside_the_list_are_refused_naming_the_list() {
        let mut o = BTreeMap::new();
        o.insert("mode".to_string(), "a".to_string());
        check_options(&INFO, &o).unwrap();
        o.insert("mdoe".to_string(), "b".to_string());
        match check_options(&INFO, &o) {
            Err(Error::InvalidArgument(m)) => assert_eq!(
                m,
                "unknown libdemo option `mdoe=b`; known options: mode=a|b, depth=N"
            ),
            other => panic!("{other:?}"),
        }
        assert!(INFO.answers_to("demo") && INFO.answers_to("old") && !INFO.answers_to("x"));
    }

    #[test]
    fn this_test_binary_is_mapped_but_no_such_library() {
        assert_eq!(mapped_library("libno-such-library-here"), None);
        // The C library every Rust test binary links.
        assert!(mapped_library("libc").is_some_and(|p| p.contains("libc.so")));
    }
}
