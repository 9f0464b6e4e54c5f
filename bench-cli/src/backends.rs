//! The one table of backends. Everything else follows from it: `--backend`'s values and help,
//! the help of `--provider`, `--devices` and `--nic-opt`, `compare --pairs`, the providers
//! and options each side gets, the server's checks (through `Transport::INFO`), which
//! backends this build has, and what the doctor asks.
//!
//! Adding a backend: its crate, one line here, and its feature in `Cargo.toml`.

use bench_coord::backend::Backend;
use transport_core::{BackendInfo, Probe, ProbeAsk};

/// Every backend this binary knows, built in or not, in the order `--help` lists them; the
/// first is the default.
pub static BACKENDS: &[Backend] = &[
    // Feature `efa` (the crate transport-efa), named after its library: `efa` is an alias.
    bench_coord::backend!("efa", transport_efa::Endpoint, "libfabric", ["efa"]),
    bench_coord::backend!("verbs", transport_verbs::Endpoint),
    bench_coord::backend!("ucx", transport_ucx::Endpoint),
];

/// The backend `s` names (its name or an alias).
pub fn find(s: &str) -> Option<&'static Backend> {
    BACKENDS.iter().find(|b| b.info().answers_to(s))
}

/// `--backend`'s default: the first backend of the table.
pub fn default_name() -> &'static str {
    BACKENDS[0].name()
}

/// The backends' names as a list for messages: `libfabric or verbs`, `a, b or c`.
pub fn names() -> String {
    let n: Vec<&str> = BACKENDS.iter().map(|b| b.name()).collect();
    match n.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => n.join(""),
    }
}

/// What the doctor asks each built-in backend's library.
pub fn probes() -> Vec<fn(&ProbeAsk) -> Probe> {
    BACKENDS
        .iter()
        .filter(|b| b.is_built())
        .filter_map(|b| b.info().probe)
        .collect()
}

/// The built-in backends, in the table's order.
pub(crate) fn built() -> impl Iterator<Item = &'static BackendInfo> {
    BACKENDS.iter().filter(|b| b.is_built()).map(|b| b.info())
}

/// `--provider`'s help: what each built-in backend with providers calls one.
pub fn provider_help() -> String {
    let with: Vec<_> = built()
        .filter_map(|i| Some((i, i.provider.as_ref()?)))
        .collect();
    if with.is_empty() {
        return "The provider, for a backend with providers: none in this build".into();
    }
    let what: Vec<String> = with
        .iter()
        .map(|(i, p)| format!("{}: {}", i.name, p.names))
        .collect();
    let loopback: Vec<String> = with
        .iter()
        .map(|(i, p)| format!("{} {}", i.name, p.loopback_default))
        .collect();
    format!(
        "The provider, for a backend with providers ({}). Not given: loopback and compare take \
         the backend's own ({}), server, client and run leave it to the backend",
        what.join("; "),
        loopback.join(", ")
    )
}

/// `--devices`' help: what a device name is to each built-in backend.
pub fn devices_help() -> String {
    let what: Vec<String> = built()
        .map(|i| format!("{}: {}", i.name, i.devices))
        .collect();
    format!(
        "NICs to use, comma separated ({}). Loopback gives the first half to one side and the \
         second half to the other",
        what.join("; ")
    )
}

/// `--nic-opt`'s help: each built-in backend's options, as `key=values` (`long`: each with
/// its line of help, and where the backend reads more from the environment).
pub fn options_help(long: bool) -> String {
    let mut s = String::from(
        "Backend option for every NIC, KEY=VALUE, repeatable; a key the backend does not list \
         is refused.",
    );
    for i in built() {
        if long {
            s.push_str(&format!("\n\n{}:", i.name));
            for o in i.options {
                s.push_str(&format!("\n  {}={}: {}", o.key, o.values, o.help));
            }
            if let Some(e) = &i.options_env {
                s.push_str(&format!(
                    "\n  (also ${}, e.g. {}, below the command line's)",
                    e.name, e.example
                ));
            }
        } else {
            s.push_str(&format!(" {}: {}.", i.name, i.known_options()));
        }
    }
    s
}

/// `compare --pairs`' help: the forms of a pair, with each built-in backend's.
pub fn pairs_help() -> String {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in built() {
        match &i.provider {
            Some(p) => with.push(format!("{}:{}", i.name, p.loopback_default)),
            None => without.push(format!("{}:DEV+DEV", i.name)),
        }
    }
    let mut forms = Vec::new();
    if !with.is_empty() {
        forms.push(format!("BACKEND:PROVIDER ({})", with.join(", ")));
    }
    if !without.is_empty() {
        forms.push(format!(
            "BACKEND:DEV+DEV, a device a side, for a backend without providers ({})",
            without.join(", ")
        ));
    }
    let mut s = format!("Pairs, comma separated: {}", forms.join(", or "));
    let aliases: Vec<String> = built()
        .flat_map(|i| {
            i.aliases
                .iter()
                .map(move |a| format!("`{a}:` for `{}:`", i.name))
        })
        .collect();
    if !aliases.is_empty() {
        s.push_str(&format!("; {} is accepted", aliases.join(", ")));
    }
    s
}

/// One `compare --pairs` entry: `BACKEND:PROVIDER` for a backend with providers
/// (`libfabric:shm`, or by an alias, `efa:shm`), `BACKEND:DEV[+DEV]` for one without (`verbs:rxe0+rxe1`: a device per side).
#[derive(Clone, Debug)]
pub struct Pair {
    pub backend: &'static Backend,
    /// The provider, for a backend with providers.
    pub provider: Option<String>,
    /// Devices (one per side, or one for both), for a backend without.
    pub devices: Vec<String>,
}

impl std::str::FromStr for Pair {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let without: Vec<String> = BACKENDS
            .iter()
            // A backend this build lacks describes itself without its providers: leave it
            // out rather than call it provider-less.
            .filter(|b| b.is_built() && b.info().provider.is_none())
            .map(|b| format!("{}:DEV[+DEV]", b.name()))
            .collect();
        let (name, rest) = s.split_once(':').ok_or_else(|| {
            let mut forms = vec!["BACKEND:PROVIDER".to_string()];
            forms.extend(without);
            format!("`{s}`: a pair is {}", forms.join(" or "))
        })?;
        let name = name.trim().to_ascii_lowercase();
        let rest = rest.trim();
        if rest.is_empty() {
            return Err(format!("`{s}`: nothing after `:`"));
        }
        let backend =
            find(&name).ok_or_else(|| format!("`{s}`: unknown backend `{name}` ({})", names()))?;
        Ok(if backend.info().provider.is_some() {
            Pair {
                backend,
                provider: Some(rest.to_string()),
                devices: Vec::new(),
            }
        } else {
            Pair {
                backend,
                provider: None,
                devices: rest.split('+').map(|d| d.trim().to_string()).collect(),
            }
        })
    }
}

/// By the backend's name, whatever the entry called it (`efa:shm` prints `libfabric:shm`).
impl std::fmt::Display for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.backend.name();
        match &self.provider {
            Some(p) => write!(f, "{name}:{p}"),
            None => write!(f, "{name}:{}", self.devices.join("+")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table() {
        assert_eq!(default_name(), "libfabric");
        assert_eq!(names(), "libfabric, verbs or ucx");
        // The old name is an alias of the libfabric backend.
        assert_eq!(find("efa").unwrap().name(), "libfabric");
        for b in BACKENDS {
            assert!(std::ptr::eq(find(b.name()).unwrap(), b));
            for a in b.info().aliases {
                assert!(std::ptr::eq(find(a).unwrap(), b), "{a}");
            }
        }
        assert!(find("nope").is_none());
        // Names and aliases are unique across the table.
        let mut all: Vec<&str> = BACKENDS
            .iter()
            .flat_map(|b| std::iter::once(b.name()).chain(b.info().aliases.iter().copied()))
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    /// Whether this build has the backend `name` (the tests below read a build of any
    /// features: `--no-default-features --features verbs` too).
    fn built(name: &str) -> bool {
        find(name).is_some_and(|b| b.is_built())
    }

    #[test]
    fn pairs() {
        if built("libfabric") {
            let p: Pair = "efa:shm".parse().unwrap();
            assert_eq!(p.provider.as_deref(), Some("shm"));
            assert_eq!(p.backend.name(), "libfabric");
            // Printed by the backend's name, not the alias typed.
            assert_eq!(p.to_string(), "libfabric:shm");
            let p: Pair = "libfabric:tcp".parse().unwrap();
            assert_eq!(p.to_string(), "libfabric:tcp");
        }
        if built("verbs") {
            let p: Pair = "verbs:rxe0+rxe1".parse().unwrap();
            assert_eq!(p.devices, vec!["rxe0", "rxe1"]);
            assert_eq!(p.to_string(), "verbs:rxe0+rxe1");
        }
        assert_eq!(
            "nope:foo".parse::<Pair>().unwrap_err(),
            "`nope:foo`: unknown backend `nope` (libfabric, verbs or ucx)"
        );
        let forms = if built("verbs") {
            "BACKEND:PROVIDER or verbs:DEV[+DEV]"
        } else {
            "BACKEND:PROVIDER"
        };
        assert_eq!(
            "efa".parse::<Pair>().unwrap_err(),
            format!("`efa`: a pair is {forms}")
        );
        assert!("efa:".parse::<Pair>().is_err());
    }
}
