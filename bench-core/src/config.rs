//! The vocabulary shared by the command line, the wire and the report.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A closed set of named values, as a command line offers them: every value, its name and a
/// line of help. The `rdma-bench` binary turns each into a flag's possible values; this crate
/// names no command-line parser.
pub trait Choice: Copy + Send + Sync + 'static {
    /// Every value, in the order `--help` lists them.
    const ALL: &'static [Self];
    /// The value's name on the command line, on the wire and in reports.
    fn name(self) -> &'static str;
    /// One line of help for the value (`""`: none).
    fn help(self) -> &'static str {
        ""
    }
    /// The value called `s`.
    fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == s)
    }
}

/// `impl Choice` from a list of `Value => ("name", "help")`.
macro_rules! choice {
    ($t:ty { $($v:ident => ($name:literal, $help:literal)),+ $(,)? }) => {
        impl Choice for $t {
            const ALL: &'static [Self] = &[$(<$t>::$v),+];
            fn name(self) -> &'static str {
                match self { $(<$t>::$v => $name),+ }
            }
            fn help(self) -> &'static str {
                match self { $(<$t>::$v => $help),+ }
            }
        }
    };
}

choice!(MemKind { Host => ("host", ""), Cuda => ("cuda", "") });
choice!(Workload {
    Write => ("write", "Paged scatter WRITE, one immediate per NIC per repeat (the write-up's transfer)"),
    Send => ("send", "SEND/RECV bandwidth"),
    Lat => ("lat", "Ping-pong latency (one-way, half the round trip)"),
    Rate => ("rate", "Small-message WRITE rate in Mops"),
    GpuWrite => ("gpu-write", "WRITEs issued through a proxy ring (transport-proxy) beside host-initiated ones: ring rate, latency (half the round trip), bandwidth to delivery (loopback, or client and server; -n N: N round trips, N x 256 KiB a size, N x 2000 ring commands)"),
});
choice!(LatOp {
    WriteImm => ("write-imm", "RDMA WRITE with immediate; the target sees a completion, posts no receive"),
    Send => ("send", "SEND into a posted receive"),
});
choice!(Pattern {
    Pairwise => ("pairwise", "Rank i with rank i xor 1, both ways"),
    AllToAll => ("all-to-all", "Every rank WRITEs a slice into every other rank, one immediate per peer (MoE dispatch)"),
    Incast => ("incast", "Every other rank into rank 0"),
    Bisection => ("bisection", "The first half with the second half: rank i with rank i + N/2, both ways"),
});
choice!(Threads {
    One => ("one", "One thread polls and posts on every NIC"),
    PerGpu => ("per-gpu", "One thread per GPU, each driving its GPU's NIC group"),
});

/// Where the benchmark's buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemKind {
    Host,
    Cuda,
}

impl fmt::Display for MemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemKind::Host => "host",
            MemKind::Cuda => "cuda",
        })
    }
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Paged scatter WRITE, one immediate per NIC per repeat (the write-up's transfer).
    Write,
    /// SEND/RECV bandwidth.
    Send,
    /// Ping-pong latency (one-way, half the round trip).
    Lat,
    /// Small-message WRITE rate in Mops.
    Rate,
    /// WRITEs issued through a proxy ring (a producer writes commands, a proxy thread posts
    /// them: `transport-proxy`) beside host-initiated WRITEs; loopback, or server and client.
    #[serde(rename = "gpu-write")]
    GpuWrite,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Write => "write",
            Workload::Send => "send",
            Workload::Lat => "lat",
            Workload::Rate => "rate",
            Workload::GpuWrite => "gpu-write",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The operation the latency test bounces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatOp {
    /// RDMA WRITE with immediate; the target sees a completion, posts no receive.
    WriteImm,
    /// SEND into a posted receive.
    Send,
}

impl fmt::Display for LatOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LatOp::WriteImm => "write-imm",
            LatOp::Send => "send",
        })
    }
}

/// Who WRITEs to whom in `rdma-bench run` (N ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Rank i with rank i xor 1, both ways.
    Pairwise,
    /// Every rank WRITEs a slice into every other rank, one immediate per peer (MoE dispatch).
    AllToAll,
    /// Every other rank into rank 0.
    Incast,
    /// The first half with the second half: rank i with rank i + N/2, both ways.
    Bisection,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Pairwise => "pairwise",
            Pattern::AllToAll => "all-to-all",
            Pattern::Incast => "incast",
            Pattern::Bisection => "bisection",
        }
    }

    /// The ranks `rank` WRITEs to, in a job of `world`; `None` for a pattern the job size
    /// does not allow.
    pub fn targets(self, rank: u32, world: u32) -> Option<Vec<u32>> {
        match self {
            Pattern::Pairwise | Pattern::Bisection if !world.is_multiple_of(2) => None,
            Pattern::Pairwise => Some(vec![rank ^ 1]),
            Pattern::Bisection => {
                let h = world / 2;
                Some(vec![if rank < h { rank + h } else { rank - h }])
            }
            Pattern::AllToAll => Some((0..world).filter(|&r| r != rank).collect()),
            Pattern::Incast => Some(if rank == 0 { Vec::new() } else { vec![0] }),
        }
    }

    /// The ranks that WRITE to `rank`.
    pub fn sources(self, rank: u32, world: u32) -> Option<Vec<u32>> {
        match self {
            Pattern::Incast => Some(if rank == 0 {
                (1..world).collect()
            } else {
                Vec::new()
            }),
            // The others are symmetric.
            _ => self.targets(rank, world),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many threads drive the NICs of the active side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Threads {
    /// One thread polls and posts on every NIC.
    One,
    /// One thread per GPU, each driving its GPU's NIC group.
    PerGpu,
}

impl fmt::Display for Threads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Choice::name(*self))
    }
}

/// The optimisation ladder's knobs, one per step of the write-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knobs {
    /// Spread each GPU's pages over its whole NIC group (off: the first NIC of each group).
    pub nic_groups: bool,
    /// Repeats run before timing starts.
    pub warmup: u32,
    pub threads: Threads,
    /// Pin each thread to a core near its GPU.
    pub pin: bool,
    /// Per-thread counters instead of shared atomics.
    pub sharded: bool,
    /// Operations handed to the NIC per loop turn (one `post_writes` call).
    pub batch: u32,
    /// Drain every completion queue, then post queued work (`batch` per NIC in turn) until
    /// every queue is full.
    pub lazy: bool,
    /// Operations each NIC keeps in flight at most (SEND and WRITE workloads: posted and not
    /// yet reported complete); 0: the endpoint's send queue depth. Not a step of the ladder:
    /// every stage keeps it, as a comparison with another tool's window does.
    #[serde(default)]
    pub window: u32,
}

impl Knobs {
    /// Where the ladder starts: nothing turned on.
    pub fn baseline() -> Self {
        Knobs {
            nic_groups: false,
            warmup: 0,
            threads: Threads::One,
            pin: false,
            sharded: false,
            batch: 1,
            lazy: false,
            window: 0,
        }
    }

    /// What a NIC whose send queue holds `depth` operations keeps in flight at most.
    pub fn in_flight(&self, depth: usize) -> usize {
        match self.window {
            0 => depth,
            w => depth.min(w as usize),
        }
        .max(1)
    }

    /// The ladder: every stage adds one step of the write-up to the previous one.
    /// `full` holds the values the last stages use (warm-up count, batch size).
    pub fn ladder(full: &Knobs) -> Vec<(&'static str, Knobs)> {
        let mut k = Knobs {
            window: full.window,
            ..Knobs::baseline()
        };
        let mut out = vec![("baseline", k)];
        k.nic_groups = true;
        out.push(("+nic groups", k));
        k.warmup = full.warmup.max(1);
        out.push(("+warm-up", k));
        k.threads = Threads::PerGpu;
        out.push(("+thread per GPU", k));
        k.pin = true;
        out.push(("+pin", k));
        k.sharded = true;
        out.push(("+per-thread state", k));
        k.batch = if full.batch > 1 { full.batch } else { 16 };
        out.push(("+batch", k));
        k.lazy = true;
        out.push(("+lazy posting", k));
        out
    }
}

/// The knobs in words, for people (`-v`): "nic groups, warm-up 1, one thread, ...".
impl fmt::Display for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut w: Vec<String> = Vec::new();
        w.push(
            if self.nic_groups {
                "nic groups"
            } else {
                "first NIC per GPU"
            }
            .into(),
        );
        w.push(match self.warmup {
            0 => "no warm-up".into(),
            n => format!("warm-up {n}"),
        });
        w.push(match self.threads {
            Threads::One => "one thread".into(),
            Threads::PerGpu => "thread per GPU".into(),
        });
        if self.pin {
            w.push("pinned".into());
        }
        if self.sharded {
            w.push("per-thread state".into());
        }
        w.push(format!("batch {}", self.batch));
        if self.lazy {
            w.push("lazy posting".into());
        }
        if self.window > 0 {
            w.push(format!("window {}", self.window));
        }
        f.write_str(&w.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::{Choice, LatOp, MemKind, Pattern, Threads, Workload};

    /// Every choice's name parses back to it, and matches its `Display` and serde name (the
    /// command line, the wire and the report say the same word).
    #[test]
    fn choice_names_round_trip() {
        fn check<T: Choice + std::fmt::Display + serde::Serialize + PartialEq + std::fmt::Debug>() {
            for &v in T::ALL {
                assert_eq!(T::from_name(v.name()), Some(v));
                assert_eq!(v.to_string(), v.name());
                assert_eq!(
                    serde_json::to_string(&v).unwrap(),
                    format!("\"{}\"", v.name())
                );
            }
            assert_eq!(T::from_name("bogus"), None);
        }
        check::<MemKind>();
        check::<Workload>();
        check::<LatOp>();
        check::<Pattern>();
        check::<Threads>();
    }

    #[test]
    fn patterns() {
        assert_eq!(Pattern::Pairwise.targets(2, 4), Some(vec![3]));
        assert_eq!(Pattern::Pairwise.targets(3, 4), Some(vec![2]));
        assert_eq!(Pattern::Pairwise.targets(0, 3), None);
        assert_eq!(Pattern::Bisection.targets(1, 4), Some(vec![3]));
        assert_eq!(Pattern::Bisection.targets(3, 4), Some(vec![1]));
        assert_eq!(Pattern::AllToAll.targets(1, 4), Some(vec![0, 2, 3]));
        assert_eq!(Pattern::AllToAll.sources(1, 4), Some(vec![0, 2, 3]));
        assert_eq!(Pattern::Incast.targets(0, 4), Some(vec![]));
        assert_eq!(Pattern::Incast.targets(2, 4), Some(vec![0]));
        assert_eq!(Pattern::Incast.sources(0, 4), Some(vec![1, 2, 3]));
        assert_eq!(Pattern::Incast.sources(3, 4), Some(vec![]));
        // Every WRITE has a receiver that expects it.
        for p in [
            Pattern::Pairwise,
            Pattern::AllToAll,
            Pattern::Incast,
            Pattern::Bisection,
        ] {
            for w in [2u32, 4, 6] {
                for r in 0..w {
                    for t in p.targets(r, w).unwrap() {
                        assert!(p.sources(t, w).unwrap().contains(&r), "{p} {r}->{t} of {w}");
                    }
                }
            }
        }
    }
}
