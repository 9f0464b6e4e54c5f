//! What a backend says about itself: its description ([`Transport::INFO`]) is consistent, and
//! what an open endpoint reports it runs on ([`Transport::runtime`]) names what was opened.

use std::collections::BTreeSet;

use transport_core::{check_options, Error, Result, Transport};

use crate::pair::Pair;

fn fail(what: String) -> Error {
    Error::InvalidArgument(what)
}

/// `INFO` names the backend as `BACKEND` does, its names and option keys are unique, it says
/// what its device names and (with providers) provider names are, every option has a usable
/// key, its values and help, and an option it does not list is refused;
/// each endpoint's `runtime()` names this backend, a library, the NIC `nic_name()` gives and,
/// for a backend with providers, the provider `provider()` gives.
pub fn describes_itself<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let info = T::INFO;
    if info.name != T::BACKEND || info.name.is_empty() {
        return Err(fail(format!(
            "INFO names {:?}, BACKEND {:?}",
            info.name,
            T::BACKEND
        )));
    }
    let mut names = BTreeSet::new();
    for n in std::iter::once(info.name).chain(info.aliases.iter().copied()) {
        if !names.insert(n) {
            return Err(fail(format!("the name {n:?} is given twice")));
        }
    }
    // Users read these in `--help` (`--devices`, `--provider`).
    if info.devices.is_empty() || info.provider.as_ref().is_some_and(|p| p.names.is_empty()) {
        return Err(fail(
            "INFO needs what a device name names and, with providers, what a provider is"
                .to_string(),
        ));
    }
    let mut keys = BTreeSet::new();
    for o in info.options {
        if !keys.insert(o.key) {
            return Err(fail(format!("option {:?} is listed twice", o.key)));
        }
        // Users read these in `--help` and in the error for an unknown option.
        let bad_key = o.key.is_empty() || o.key.contains([',', '=', ' ']);
        if bad_key || o.values.is_empty() || o.help.is_empty() {
            return Err(fail(format!(
                "option {:?} needs a key without ',', '=' or spaces, its values and a help line",
                o.key
            )));
        }
    }
    // A key the backend does not list is refused, naming the ones it does.
    let unknown = [("no-such-option".to_string(), "1".to_string())].into();
    match check_options(info, &unknown) {
        Err(Error::InvalidArgument(m))
            if info.options.iter().all(|o| m.contains(o.key)) && m.contains("no-such-option") => {}
        other => {
            return Err(fail(format!(
                "an unknown option was not refused with the known ones named: {other:?}"
            )))
        }
    }
    for ep in [&p.a, &p.b] {
        let r = ep.runtime();
        if r.backend != T::BACKEND || r.library.is_empty() || r.device != ep.nic_name() {
            return Err(fail(format!(
                "runtime() {r:?} does not name backend {}, a library and NIC {}",
                T::BACKEND,
                ep.nic_name()
            )));
        }
        if info.provider.is_some() && r.provider.as_deref() != Some(ep.provider()) {
            return Err(fail(format!(
                "runtime() names provider {:?}, the endpoint {}",
                r.provider,
                ep.provider()
            )));
        }
    }
    Ok(())
}
