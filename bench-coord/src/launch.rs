//! Where `rdma-bench run` finds its place in a job: rank, world size and local rank from the
//! launcher that started it (Open MPI, Slurm, a PMI launcher, torchrun-style variables), and
//! where rank 0 waits for the others (`--rendezvous`, `MASTER_ADDR`, or the first node of the
//! Slurm step).
//!
//! Everything here reads the environment through a lookup function, so each launcher's
//! variables are unit-tested without touching the process environment.

use std::fmt;

use bench_core::error::{Error, Result};

pub use bench_core::proto::MAX_RANKS;
/// Rendezvous port when neither `--rendezvous`, `MASTER_PORT` nor a Slurm job id gives one
/// (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;
/// Most hosts a Slurm node list may expand to.
const MAX_HOSTS: usize = 1 << 16;

/// The engine that started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Launcher {
    /// `mpirun` / `mpiexec` of Open MPI (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`).
    Slurm,
    /// A PMI launcher such as MPICH's Hydra (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// torchrun-style variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`).
    Torchrun,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::OpenMpi => "Open MPI",
            Launcher::Slurm => "Slurm",
            Launcher::Pmi => "PMI",
            Launcher::Torchrun => "torchrun-style env",
        })
    }
}

/// This process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: u32,
    pub world: u32,
    /// Rank among the ranks of this node (picks the GPU with `--gpu-per-rank`).
    pub local_rank: u32,
}

/// Where rank 0 listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    pub host: String,
    pub port: u16,
    /// Which setting gave it, for messages.
    pub from: &'static str,
}

impl fmt::Display for Rendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

fn num(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Option<u32>> {
    match env(var) {
        None => Ok(None),
        Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| {
            Error::Usage(format!(
                "{var}={v:?} is not a rank number; is the launcher's environment intact?"
            ))
        }),
    }
}

/// Rank, world and local rank from the launcher's variables. Open MPI is looked at first (an
/// `mpirun` inside a Slurm allocation also sees the allocation's `SLURM_*`), then Slurm,
/// PMI, and torchrun-style variables.
pub fn detect(env: &dyn Fn(&str) -> Option<String>) -> Result<Launch> {
    let sets: [(Launcher, &str, &str, &[&str]); 4] = [
        (
            Launcher::OpenMpi,
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            &["OMPI_COMM_WORLD_LOCAL_RANK"],
        ),
        (
            Launcher::Slurm,
            "SLURM_PROCID",
            "SLURM_NTASKS",
            &["SLURM_LOCALID"],
        ),
        (
            Launcher::Pmi,
            "PMI_RANK",
            "PMI_SIZE",
            &["MPI_LOCALRANKID", "PMI_LOCAL_RANK"],
        ),
        (Launcher::Torchrun, "RANK", "WORLD_SIZE", &["LOCAL_RANK"]),
    ];
    for (launcher, rank_var, size_var, local_vars) in sets {
        let Some(rank) = num(env, rank_var)? else {
            continue;
        };
        let world = num(env, size_var)?.ok_or_else(|| {
            Error::Usage(format!(
                "{rank_var} is set but {size_var} is not: cannot tell the job's size ({launcher})"
            ))
        })?;
        let mut local_rank = 0;
        for v in local_vars {
            if let Some(l) = num(env, v)? {
                local_rank = l;
                break;
            }
        }
        let l = Launch {
            launcher,
            rank,
            world,
            local_rank,
        };
        l.check()?;
        return Ok(l);
    }
    Err(Error::Usage(
        "rdma-bench run: no launcher found: start it with srun, mpirun, or set RANK, WORLD_SIZE \
         (and MASTER_ADDR) in each process"
            .into(),
    ))
}

impl Launch {
    fn check(&self) -> Result<()> {
        if self.world < 2 || self.world > MAX_RANKS {
            return Err(Error::Usage(format!(
                "{}: a job of {} rank(s); rdma-bench run needs 2..={MAX_RANKS}",
                self.launcher, self.world
            )));
        }
        if self.rank >= self.world {
            return Err(Error::Usage(format!(
                "{}: rank {} is out of range for a job of {} ranks",
                self.launcher, self.rank, self.world
            )));
        }
        Ok(())
    }
}

/// Split `HOST:PORT` (`[V6]:PORT` for IPv6).
pub fn parse_host_port(s: &str) -> Result<(String, u16)> {
    let bad = || Error::Usage(format!("--rendezvous {s:?}: expected HOST:PORT"));
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(bad)?;
        (h, p)
    } else {
        s.rsplit_once(':').ok_or_else(bad)?
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = port.parse::<u16>().map_err(|_| bad())?;
    Ok((host.to_string(), port))
}

/// Where rank 0 listens: `--rendezvous` wins, then `MASTER_ADDR` (with `MASTER_PORT`), then
/// the first node of the Slurm step (`SLURM_STEP_NODELIST`, `SLURM_JOB_NODELIST`,
/// `SLURM_NODELIST`: Slurm puts task 0 on the first node). Without `MASTER_PORT` the port is
/// derived from the Slurm job id (two jobs sharing a node do not collide), else
/// [`DEFAULT_PORT`].
pub fn rendezvous(flag: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Rendezvous> {
    if let Some(f) = flag {
        let (host, port) = parse_host_port(f)?;
        return Ok(Rendezvous {
            host,
            port,
            from: "--rendezvous",
        });
    }
    let port = match env("MASTER_PORT") {
        Some(p) => p
            .trim()
            .parse::<u16>()
            .map_err(|_| Error::Usage(format!("MASTER_PORT={p:?} is not a port number")))?,
        None => match env("SLURM_JOB_ID").and_then(|j| j.trim().parse::<u64>().ok()) {
            Some(job) => 20000 + (job % 20000) as u16,
            None => DEFAULT_PORT,
        },
    };
    if let Some(host) = env("MASTER_ADDR").filter(|h| !h.trim().is_empty()) {
        return Ok(Rendezvous {
            host: host.trim().to_string(),
            port,
            from: "MASTER_ADDR",
        });
    }
    for var in [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ] {
        if let Some(list) = env(var).filter(|l| !l.trim().is_empty()) {
            let host = first_node(&list)?;
            return Ok(Rendezvous {
                host,
                port,
                from: var,
            });
        }
    }
    Err(Error::Usage(
        "rdma-bench run: no rendezvous address: pass --rendezvous HOST:PORT (rank 0's host), or \
         export MASTER_ADDR (mpirun -x MASTER_ADDR=...); under srun the first node is used"
            .into(),
    ))
}

fn nodelist_err(list: &str, why: &str) -> Error {
    Error::Usage(format!("Slurm node list {list:?}: {why}"))
}

/// Split at commas outside brackets.
fn top_level_items(list: &str) -> Result<Vec<&str>> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err(nodelist_err(list, "unbalanced ']'"));
                }
            }
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(nodelist_err(list, "unbalanced '['"));
    }
    out.push(&list[start..]);
    Ok(out
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect())
}

/// The values one bracket group stands for: `01-03,7` is 01, 02, 03, 7 (zero padding kept).
fn expand_ranges(list: &str, inner: &str, room: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for part in inner.split(',') {
        let part = part.trim();
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let ok = |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !ok(lo) || !ok(hi) {
            return Err(nodelist_err(list, &format!("bad range {part:?}")));
        }
        let (a, b): (u64, u64) = (
            lo.parse().map_err(|_| nodelist_err(list, "bad number"))?,
            hi.parse().map_err(|_| nodelist_err(list, "bad number"))?,
        );
        if b < a {
            return Err(nodelist_err(
                list,
                &format!("range {part:?} runs backwards"),
            ));
        }
        if (b - a) as usize >= room.saturating_sub(out.len()) {
            return Err(nodelist_err(list, "expands to too many hosts"));
        }
        for v in a..=b {
            out.push(format!("{v:0width$}", width = lo.len()));
        }
    }
    Ok(out)
}

/// One item such as `gpu-[01-02]-ib[1,3]`: the product of its bracket groups.
fn expand_item(list: &str, item: &str, room: usize) -> Result<Vec<String>> {
    let mut hosts = vec![String::new()];
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| nodelist_err(list, "unbalanced '['"))?;
        let prefix = &rest[..open];
        let vals = expand_ranges(list, &rest[open + 1..close], room)?;
        if hosts.len().saturating_mul(vals.len()) > room {
            return Err(nodelist_err(list, "expands to too many hosts"));
        }
        hosts = hosts
            .iter()
            .flat_map(|h| vals.iter().map(move |v| format!("{h}{prefix}{v}")))
            .collect();
        rest = &rest[close + 1..];
    }
    if rest.contains(']') {
        return Err(nodelist_err(list, "unbalanced ']'"));
    }
    for h in &mut hosts {
        h.push_str(rest);
    }
    Ok(hosts)
}

/// Expand a Slurm host list such as `node[01-03,7],login1` into host names.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for item in top_level_items(list)? {
        let room = MAX_HOSTS.saturating_sub(out.len());
        out.extend(expand_item(list, item, room)?);
        // A plain name is not held to `room` by `expand_item`.
        if out.len() > MAX_HOSTS {
            return Err(nodelist_err(list, "expands to too many hosts"));
        }
    }
    if out.is_empty() {
        return Err(nodelist_err(list, "no host in it"));
    }
    Ok(out)
}

/// The first host of a Slurm host list.
pub fn first_node(list: &str) -> Result<String> {
    let items = top_level_items(list)?;
    let first = items
        .first()
        .ok_or_else(|| nodelist_err(list, "no host in it"))?;
    expand_item(list, first, MAX_HOSTS)?
        .into_iter()
        .next()
        .ok_or_else(|| nodelist_err(list, "no host in it"))
}

/// This machine's host name (for reports).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn slurm() {
        let e = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "p5-[003-004]"),
            ("SLURM_JOB_ID", "123456"),
        ]);
        let l = detect(&e).unwrap();
        assert_eq!(
            l,
            Launch {
                launcher: Launcher::Slurm,
                rank: 5,
                world: 16,
                local_rank: 1
            }
        );
        let r = rendezvous(None, &e).unwrap();
        assert_eq!(r.host, "p5-003");
        assert_eq!(r.port, 20000 + (123456 % 20000) as u16);
        assert_eq!(r.from, "SLURM_JOB_NODELIST");
        // The step's node list wins over the job's; SLURM_NODELIST is the old name.
        let e = env(&[
            ("SLURM_STEP_NODELIST", "b[7-8]"),
            ("SLURM_JOB_NODELIST", "a[1-9]"),
        ]);
        assert_eq!(rendezvous(None, &e).unwrap().host, "b7");
        let e = env(&[("SLURM_NODELIST", "c1,c2")]);
        assert_eq!(rendezvous(None, &e).unwrap().host, "c1");
    }

    #[test]
    fn open_mpi_wins_over_the_allocation() {
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ]);
        let l = detect(&e).unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank),
            (Launcher::OpenMpi, 3, 4, 3)
        );
    }

    #[test]
    fn pmi_and_torchrun() {
        let e = env(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "8"),
            ("MPI_LOCALRANKID", "0"),
        ]);
        let l = detect(&e).unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank),
            (Launcher::Pmi, 2, 8, 0)
        );
        let e = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "1234"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
        ]);
        let l = detect(&e).unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.world, l.local_rank),
            (Launcher::Torchrun, 1, 2, 1)
        );
        let r = rendezvous(None, &e).unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.from),
            ("10.0.0.1", 1234, "MASTER_ADDR")
        );
        // The flag wins over everything.
        let r = rendezvous(Some("[::1]:99"), &e).unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 99));
        assert_eq!(r.to_string(), "[::1]:99");
        // No port anywhere: the default.
        let e = env(&[("MASTER_ADDR", "h")]);
        assert_eq!(rendezvous(None, &e).unwrap().port, DEFAULT_PORT);
    }

    #[test]
    fn bad_environments_say_what_is_wrong() {
        let e = |p: &[(&str, &str)]| detect(&env(p)).unwrap_err().to_string();
        assert!(e(&[]).contains("no launcher"));
        assert!(e(&[("RANK", "x"), ("WORLD_SIZE", "2")]).contains("RANK"));
        assert!(e(&[("RANK", "1")]).contains("WORLD_SIZE"));
        assert!(e(&[("RANK", "4"), ("WORLD_SIZE", "4")]).contains("out of range"));
        assert!(e(&[("RANK", "0"), ("WORLD_SIZE", "1")]).contains("2..="));
        let r = rendezvous(None, &env(&[("OMPI_COMM_WORLD_RANK", "0")]));
        assert!(r.unwrap_err().to_string().contains("--rendezvous"));
        for bad in ["host", ":1", "h:x", "h:70000", "[::1:5"] {
            assert!(rendezvous(Some(bad), &env(&[])).is_err(), "{bad}");
        }
        assert!(rendezvous(None, &env(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "p")])).is_err());
    }

    #[test]
    fn nodelists() {
        let x = |s: &str| expand_nodelist(s).unwrap();
        assert_eq!(x("node[01-03,7]"), ["node01", "node02", "node03", "node7"]);
        assert_eq!(x("a1,b[2-3],c"), ["a1", "b2", "b3", "c"]);
        assert_eq!(
            x("r[1-2]-n[08-09]-ib"),
            ["r1-n08-ib", "r1-n09-ib", "r2-n08-ib", "r2-n09-ib"]
        );
        assert_eq!(x("gpu[098-101]"), ["gpu098", "gpu099", "gpu100", "gpu101"]);
        assert_eq!(x(" single "), ["single"]);
        assert_eq!(first_node("node[01-03,7],x").unwrap(), "node01");
        assert_eq!(
            first_node("p5-dy-p5-48xlarge-[1-2]").unwrap(),
            "p5-dy-p5-48xlarge-1"
        );
        for bad in [
            "",
            "n[1-",
            "n]1[",
            "n[3-1]",
            "n[a-b]",
            "n[1-99999999]",
            ",,",
            // The most hosts, then plain names past them (the room left went below zero).
            "n[1-65536],a,b",
        ] {
            assert!(expand_nodelist(bad).is_err(), "{bad:?}");
        }
        assert!(first_node("[").is_err());
    }

    proptest::proptest! {
        /// Any string: an expansion or an error, never a panic or an endless loop.
        #[test]
        fn nodelist_never_panics(s in "[a-z0-9\\[\\],-]{0,40}") {
            let _ = expand_nodelist(&s);
            let _ = first_node(&s);
        }
    }
}
