//! The run record: what ran, where and on what, so that a person holding two results can
//! tell whether they are comparable.
//!
//! [`Facts`] are one process's: rdma-bench's version and commit, the host, its kernel and
//! instance type, the CUDA driver and GPUs with GPU memory, and the backend's [`Runtime`]
//! (library, version, provider, fabric or device, firmware). The server sends its own to the
//! client in its welcome, each rank to rank 0 with its first result, and a [`Record`] puts
//! this process's next to the others', with the command line and the time.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use transport_core::Runtime;

/// What one process is and runs on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Facts {
    /// rdma-bench's version.
    pub rdma_bench: String,
    /// The git commit it was built from; `unknown` where it was built outside git.
    pub commit: String,
    pub host: String,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// The instance type the doctor recognised, where it did.
    pub instance: Option<String>,
    /// With GPU memory: the CUDA driver and the GPUs used.
    pub cuda: Option<Cuda>,
    /// What the backend runs on ([`endpoints_runtime`]); `None` before any endpoint is open.
    pub backend: Option<Runtime>,
}

/// The CUDA driver and GPUs of a run with GPU memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Cuda {
    /// The driver's CUDA version (`cuDriverGetVersion`), e.g. `12.8`.
    pub driver: String,
    /// The name of each GPU used, in `--gpus` order.
    pub gpus: Vec<String>,
}

impl Facts {
    /// This process on this host: `version` and `commit` as built, the host name and kernel
    /// read here; the instance, CUDA and backend facts are the caller's to add.
    pub fn here(version: &str, commit: &str) -> Facts {
        Facts {
            rdma_bench: version.into(),
            commit: commit.into(),
            host: host_name(),
            kernel: kernel(),
            ..Facts::default()
        }
    }

    /// These facts with the backend's (`None`: no endpoint is open).
    pub fn with_backend(&self, backend: Option<Runtime>) -> Facts {
        Facts {
            backend,
            ..self.clone()
        }
    }
}

/// One backend record for all of a process's endpoints (`None` without any): the first
/// endpoint's, with each setting on which they differ listed by value, in the order first
/// seen, with how many endpoints have it (`put (3 endpoints); am (1 endpoint)`), since a
/// backend may decide per peer (UCX's `write=auto`). The device stays the first endpoint's
/// (the results name every NIC). A listing that would pass `max_len` bytes (the most a peer
/// accepts: `proto::MAX_NAME`) ends with the number of values left out.
pub fn endpoints_runtime(
    all: impl IntoIterator<Item = Runtime>,
    max_len: usize,
) -> Option<Runtime> {
    let all: Vec<Runtime> = all.into_iter().collect();
    let mut merged = all.first()?.clone();
    let keys: std::collections::BTreeSet<&String> =
        all.iter().flat_map(|r| r.settings.keys()).collect();
    for k in keys {
        let mut seen: Vec<(&str, usize)> = Vec::new();
        for r in &all {
            let v = r.settings.get(k).map_or("-", String::as_str);
            match seen.iter_mut().find(|(s, _)| *s == v) {
                Some((_, n)) => *n += 1,
                None => seen.push((v, 1)),
            }
        }
        if let [(v, _)] = seen[..] {
            merged.settings.insert(k.clone(), v.to_string());
            continue;
        }
        let mut text = String::new();
        for (i, (v, n)) in seen.iter().enumerate() {
            let item = format!(
                "{}{v} ({n} endpoint{})",
                if i == 0 { "" } else { "; " },
                if *n == 1 { "" } else { "s" }
            );
            let rest = seen.len() - i;
            // Room for the note of what is left out after this one.
            let note = match i {
                0 => format!("{rest} values, too long to list"),
                _ => format!("; {rest} more value{}", if rest == 1 { "" } else { "s" }),
            };
            if text.len() + item.len() + note.len() > max_len {
                text.push_str(&note);
                break;
            }
            text.push_str(&item);
        }
        merged.settings.insert(k.clone(), text);
    }
    Some(merged)
}

/// One compare pair's backends: the client side's and the server side's (both in this
/// process).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairRecord {
    pub pair: String,
    pub backend: Runtime,
    pub peer: Runtime,
}

/// Another rank's facts, where they differ from rank 0's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankFacts {
    pub rank: u32,
    #[serde(flatten)]
    pub facts: Facts,
}

/// The record of one command: this process's facts at the top, the peer's (the server, for a
/// client or loopback), each compare pair's backends, each rank's where it differs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The command line, one argument per entry.
    pub command: Vec<String>,
    /// When the record was made, UTC, RFC 3339 (`2025-01-31T12:00:00Z`).
    pub time_utc: String,
    #[serde(flatten)]
    pub this: Facts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<Facts>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<PairRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankFacts>,
}

impl Record {
    /// A record of this process's command line, now, with `this` process's facts.
    pub fn now(this: Facts) -> Record {
        Record {
            command: std::env::args().collect(),
            time_utc: utc(SystemTime::now()),
            this,
            peer: None,
            pairs: Vec::new(),
            ranks: Vec::new(),
        }
    }

    /// `(field, this side, peer)` rows for people (the HTML report): every fact, the peer's
    /// beside it where there is a peer.
    pub fn rows(&self) -> Vec<(String, String, Option<String>)> {
        let mut out = vec![
            ("command".to_string(), self.command.join(" "), None),
            ("time (UTC)".to_string(), self.time_utc.clone(), None),
        ];
        let mine = facts_rows(&self.this);
        let theirs = self.peer.as_ref().map(facts_rows).unwrap_or_default();
        let peer = |k: &str| {
            self.peer.as_ref().map(|_| {
                theirs
                    .iter()
                    .find(|t| t.0 == k)
                    .map_or_else(|| "-".to_string(), |t| t.1.clone())
            })
        };
        for (k, v) in &mine {
            out.push((k.clone(), v.clone(), peer(k)));
        }
        for (k, v) in theirs.iter().filter(|t| !mine.iter().any(|m| m.0 == t.0)) {
            out.push((k.clone(), "-".into(), Some(v.clone())));
        }
        out
    }
}

fn facts_rows(f: &Facts) -> Vec<(String, String)> {
    let mut v = vec![
        (
            "rdma-bench".into(),
            format!("{} ({})", f.rdma_bench, f.commit),
        ),
        ("host".into(), f.host.clone()),
        ("kernel".into(), f.kernel.clone()),
        (
            "instance".into(),
            f.instance.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "CUDA".into(),
            f.cuda.as_ref().map_or("-".into(), |c| {
                format!("driver {}, {}", c.driver, c.gpus.join(", "))
            }),
        ),
    ];
    match &f.backend {
        Some(b) => {
            let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
            v.push(("backend".into(), b.backend.clone()));
            v.push((
                "library".into(),
                format!("{} {} ({})", b.library, opt(&b.version), opt(&b.path)),
            ));
            v.push(("provider".into(), opt(&b.provider)));
            v.push(("fabric".into(), opt(&b.fabric)));
            v.push(("device".into(), b.device.clone()));
            v.push(("firmware".into(), opt(&b.firmware)));
            let s: Vec<String> = b.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            v.push(("settings".into(), s.join(", ")));
        }
        None => v.push(("backend".into(), "-".into())),
    }
    v
}

/// This machine's host name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The running kernel's release (`uname -r`), `unknown` where unreadable.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The CUDA driver and the names of GPUs `gpus` (CUDA ordinals); `None` without a driver or
/// without the `cuda` feature.
pub fn cuda(gpus: &[usize]) -> Option<Cuda> {
    #[cfg(feature = "cuda")]
    {
        topo::cuda_driver_and_names(gpus)
            .ok()
            .map(|(driver, gpus)| Cuda { driver, gpus })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = gpus;
        None
    }
}

/// `t` as RFC 3339 in UTC, to the second.
pub fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of day `z` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn utc_times() {
        let at = |s: u64| utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(at(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn facts_of_this_host_and_their_rows() {
        let f = Facts::here("1.2.3", "abc");
        assert!(!f.host.is_empty() && f.kernel != "unknown", "{f:?}");
        let mut r = Record::now(f.clone());
        assert!(r.time_utc.ends_with('Z') && !r.command.is_empty());
        let rows = r.rows();
        assert!(rows
            .iter()
            .any(|(k, v, p)| k == "rdma-bench" && v == "1.2.3 (abc)" && p.is_none()));
        r.peer = Some(f.with_backend(Some(Runtime {
            backend: "x".into(),
            device: "d0".into(),
            ..Runtime::default()
        })));
        let rows = r.rows();
        let dev = rows.iter().find(|(k, _, _)| k == "backend").unwrap();
        assert_eq!((dev.1.as_str(), dev.2.as_deref()), ("-", Some("x")));
        // Missing fields from a peer read as defaults.
        let f: Facts = serde_json::from_str(r#"{"host":"h"}"#).unwrap();
        assert_eq!((f.host.as_str(), f.backend.is_none()), ("h", true));
    }

    /// Settings the endpoints share read as one value; one they differ on lists each value
    /// with its count, within what a peer accepts.
    #[test]
    fn endpoints_runtime_lists_what_differs() {
        let ep = |dev: &str, kv: &[(&str, &str)]| Runtime {
            backend: "ucx".into(),
            device: dev.into(),
            settings: kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Runtime::default()
        };
        const MAX: usize = 256;
        assert!(endpoints_runtime(Vec::new(), MAX).is_none());
        let one = ep("lo", &[("write", "am"), ("tls", "tcp")]);
        assert_eq!(endpoints_runtime([one.clone()], MAX), Some(one.clone()));
        let all = [
            one.clone(),
            ep("eth0", &[("write", "put"), ("tls", "tcp")]),
            ep("lo", &[("write", "am"), ("tls", "tcp"), ("memh", "on")]),
        ];
        let m = endpoints_runtime(all, MAX).unwrap();
        assert_eq!(m.device, "lo");
        assert_eq!(m.settings["tls"], "tcp");
        assert_eq!(m.settings["write"], "am (2 endpoints); put (1 endpoint)");
        assert_eq!(m.settings["memh"], "- (2 endpoints); on (1 endpoint)");
        // 64 endpoints, each with its own long value: the listing stops within MAX.
        let long = (0..64).map(|i| ep("d", &[("write", &format!("{i:0>40}"))]));
        let w = &endpoints_runtime(long, MAX).unwrap().settings["write"];
        assert!(w.len() <= MAX, "{} bytes: {w}", w.len());
        assert!(w.ends_with("; 60 more values"), "{w}");
        // A first value too long: only how many there are.
        let two = [("x".repeat(300)), "y".into()].map(|v| ep("d", &[("write", &v)]));
        assert_eq!(
            endpoints_runtime(two, MAX).unwrap().settings["write"],
            "2 values, too long to list"
        );
    }
}
