//! From a workload's settings ([`WorkloadSpec`], what `rdma-bench`'s workload flags fill in)
//! to the list of runs a client asks for.

use crate::config::{Knobs, LatOp, Threads, Workload};
use crate::error::{Error, Result};
use crate::proto::Request;

/// What to run and how: the workload and the ladder's knobs. Every field is a flag of
/// `rdma-bench loopback`, `client`, `compare` and `run` (named beside it); [`Default`] is what
/// those flags default to.
#[derive(Clone, Debug)]
pub struct WorkloadSpec {
    /// `--workload`.
    pub workload: Workload,
    /// `-s`: page or message size; `None`: the workload's default ([`defaults`]).
    pub size: Option<u64>,
    /// `--sizes`: a bandwidth-by-size table (non-empty: `size` is not used).
    pub sizes: Vec<u64>,
    /// `-n`: repeats of the whole page set (write, rate), messages per NIC (send), round trips
    /// (lat); with `imm_every` K, immediates (each after K passes over the page set).
    pub iters: Option<u64>,
    /// `--pages`: pages per GPU (write, rate).
    pub pages: Option<u64>,
    /// `--single-buffer`: one buffer per side, reused by every operation.
    pub single_buffer: bool,
    /// `--imm-every`: passes over the page set per immediate (write, rate); 1 by default.
    pub imm_every: u32,
    /// `--seed`: of the random page order and of the data pattern.
    pub seed: u64,
    /// `--verify` / `--no-verify`: `None` takes the command's default.
    pub verify: Option<bool>,
    /// `--op`: the latency workload's operation.
    pub op: LatOp,
    /// `--threads`, `--pin`, `--sharded`, `--batch`, `--lazy`: the ladder's knobs.
    pub threads: Threads,
    pub pin: bool,
    pub sharded: bool,
    pub batch: u32,
    pub lazy: bool,
    /// `--window`: operations in flight per NIC at most; 0: the send queue's depth.
    pub window: u32,
    /// `--warmup`: warm-up iterations; `None`: the workload's default.
    pub warmup: Option<u32>,
    /// `--no-nic-groups`: only the first NIC of each GPU's group.
    pub no_nic_groups: bool,
    /// `--ladder`: each stage adds one knob to the previous.
    pub ladder: bool,
    /// `--rounds`: the whole list this many times, interleaved; by default
    /// [`LADDER_ROUNDS`] with `--ladder` (a step must be told from noise), else 1.
    pub rounds: Option<u32>,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            workload: Workload::Write,
            size: None,
            sizes: Vec::new(),
            iters: None,
            pages: None,
            single_buffer: false,
            imm_every: 1,
            seed: 1,
            verify: None,
            op: LatOp::WriteImm,
            threads: Threads::One,
            pin: false,
            sharded: false,
            batch: 16,
            lazy: false,
            window: 0,
            warmup: None,
            no_nic_groups: false,
            ladder: false,
            rounds: None,
        }
    }
}

/// One run of a plan.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Ladder stage name.
    pub stage: Option<String>,
    /// Page or message size.
    pub size: u64,
    /// Pages per GPU (write, rate).
    pub pages: u64,
    /// Repeats (write, rate), messages per NIC (send), round trips (lat).
    pub iters: u64,
    pub knobs: Knobs,
}

/// Every run one command makes.
#[derive(Clone, Debug)]
pub struct Plan {
    pub workload: Workload,
    pub op: LatOp,
    pub seed: u64,
    pub verify: bool,
    pub ladder: bool,
    /// One buffer per side (`--single-buffer`): one page (write, rate), one receive buffer
    /// (send).
    pub single_buffer: bool,
    /// Passes over the page set per immediate (`--imm-every`, write and rate).
    pub imm_every: u32,
    /// Rounds (`--rounds`): `runs` holds the list this many times over, round after round.
    pub rounds: u32,
    pub runs: Vec<Planned>,
}

/// Most WRITEs one immediate may cover (`--imm-every` x pages).
pub const MAX_PASS_OPS: u64 = 1 << 20;

/// Most rounds one command may ask for.
pub const MAX_ROUNDS: u32 = 100;

/// Rounds `--ladder` runs without `--rounds`: enough for a spread, so that a step can be
/// told from noise.
pub const LADDER_ROUNDS: u32 = 3;

/// `flag`'s value `v` must lie in `lo..=hi`: the limits a server holds a request to, refused
/// here with the flag's name.
pub fn allowed<T: PartialOrd + std::fmt::Display>(flag: &str, v: T, lo: T, hi: T) -> Result<()> {
    if v < lo || v > hi {
        return Err(Error::Usage(format!("{flag} {v}: allowed {lo}..={hi}")));
    }
    Ok(())
}

/// Defaults per workload: (size, pages, iterations, warm-up).
pub fn defaults(w: Workload) -> (u64, u64, u64, u32) {
    match w {
        Workload::Write => (64 << 10, 256, 20, 1),
        Workload::Rate => (64, 4096, 20, 1),
        Workload::Send => (64 << 10, 2000, 0, 1),
        Workload::Lat => (8, 0, 1000, 100),
        Workload::GpuWrite => (64 << 10, 0, 1000, 0),
    }
}

impl Plan {
    /// Build the plan; `verify_default` is what `verify: None` means (`rdma-bench` verifies by
    /// default in every command: loopback, compare, client and run).
    pub fn new(w: &WorkloadSpec, verify_default: bool) -> Result<Self> {
        if w.workload == Workload::GpuWrite {
            return Err(Error::Usage(
                "--workload gpu-write runs in `rdma-bench loopback` and between `rdma-bench \
                 server` and `client`; `run` does not carry it"
                    .into(),
            ));
        }
        let (dsize, dpages, diters, dwarm) = defaults(w.workload);
        let diters = if w.workload == Workload::Send {
            2000
        } else {
            diters
        };
        let knobs = Knobs {
            nic_groups: !w.no_nic_groups,
            warmup: w.warmup.unwrap_or(dwarm),
            threads: w.threads,
            pin: w.pin,
            sharded: w.sharded,
            batch: w.batch,
            lazy: w.lazy,
            window: w.window,
        };
        allowed("--batch", knobs.batch, 1, crate::proto::MAX_BATCH)?;
        if knobs.window > crate::proto::MAX_WINDOW {
            return Err(Error::Usage(format!(
                "--window {}: allowed 1..={} (or 0, the send queue's depth)",
                knobs.window,
                crate::proto::MAX_WINDOW
            )));
        }
        let iters = w.iters.unwrap_or(diters);
        allowed("-n", iters, 1, crate::proto::MAX_ITERS)?;
        allowed("--warmup", knobs.warmup, 0, crate::proto::MAX_WARMUP)?;
        if w.workload == Workload::Lat && iters > crate::proto::MAX_LAT_ITERS {
            return Err(Error::Usage(format!(
                "-n {iters}: at most {} round trips",
                crate::proto::MAX_LAT_ITERS
            )));
        }
        if w.pages == Some(0) {
            return Err(Error::Usage(
                "--pages 0: at least 1 (--single-buffer for one buffer reused by every operation)"
                    .into(),
            ));
        }
        let pages = if w.single_buffer {
            1
        } else {
            w.pages.unwrap_or(dpages).max(1)
        };
        if matches!(w.workload, Workload::Write | Workload::Rate) && pages > u32::MAX as u64 {
            return Err(Error::Usage("--pages: at most 2^32-1".into()));
        }
        // One immediate covers --imm-every passes over the pages, --imm-every 1 included.
        if matches!(w.workload, Workload::Write | Workload::Rate)
            && pages.saturating_mul(u64::from(w.imm_every.max(1))) > MAX_PASS_OPS
        {
            return Err(Error::Usage(format!(
                "--pages {pages} x --imm-every {}: at most {MAX_PASS_OPS} WRITEs per immediate \
                 (fewer pages, or a larger --size for the same bytes)",
                w.imm_every
            )));
        }
        let sizes: Vec<u64> = if !w.sizes.is_empty() {
            w.sizes.clone()
        } else {
            vec![w.size.unwrap_or(dsize)]
        };
        if let Some(z) = sizes.iter().find(|&&s| s == 0) {
            return Err(Error::Usage(format!("size {z}: must be at least 1 byte")));
        }
        if w.imm_every == 0 || w.imm_every > crate::proto::MAX_IMM_EVERY {
            return Err(Error::Usage(format!(
                "--imm-every {}: allowed 1..={}",
                w.imm_every,
                crate::proto::MAX_IMM_EVERY
            )));
        }
        if w.imm_every > 1 && !matches!(w.workload, Workload::Write | Workload::Rate) {
            return Err(Error::Usage(
                "--imm-every applies to --workload write and rate".into(),
            ));
        }
        let rounds = w.rounds.unwrap_or(if w.ladder { LADDER_ROUNDS } else { 1 });
        if rounds == 0 || rounds > MAX_ROUNDS {
            return Err(Error::Usage(format!(
                "--rounds {rounds}: allowed 1..={MAX_ROUNDS}"
            )));
        }
        let runs: Vec<Planned> = if w.ladder {
            if w.workload == Workload::Lat {
                return Err(Error::Usage(
                    "--ladder measures bandwidth: use it with --workload write, rate or send"
                        .into(),
                ));
            }
            Knobs::ladder(&knobs)
                .into_iter()
                .map(|(name, k)| Planned {
                    stage: Some(name.to_string()),
                    size: sizes[0],
                    pages,
                    iters,
                    knobs: k,
                })
                .collect()
        } else {
            sizes
                .iter()
                .map(|&size| Planned {
                    stage: None,
                    size,
                    pages,
                    iters,
                    knobs,
                })
                .collect()
        };
        let per_round = runs.len();
        let runs = runs
            .into_iter()
            .cycle()
            .take(per_round * rounds as usize)
            .collect();
        Ok(Plan {
            workload: w.workload,
            op: w.op,
            seed: w.seed,
            verify: w.verify.unwrap_or(verify_default),
            ladder: w.ladder,
            single_buffer: w.single_buffer,
            imm_every: w.imm_every,
            rounds,
            runs,
        })
    }

    /// The server's request for run `p`: `count` pages (write, rate), receives kept posted
    /// (send) or 1 (lat); `shifts`, the source's shifts per repeat (1 where not verified).
    pub fn request(&self, p: &Planned, id: u32, count: u64, shifts: u64) -> Request {
        Request {
            verify: self.verify,
            shifts,
            id,
            workload: self.workload,
            size: p.size,
            count,
            iters: p.iters,
            seed: self.seed,
            op: self.op,
            knobs: p.knobs,
            imm_every: self.imm_every,
        }
    }

    /// Largest size in the plan.
    pub fn max_size(&self) -> u64 {
        self.runs.iter().map(|r| r.size).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{validate, Msg};
    use proptest::prelude::*;

    /// The request a client sends for one planned run: write and rate send their pages,
    /// send a receive depth (bench-coord's is at most the window), lat one.
    fn request(plan: &Plan, p: &Planned) -> Request {
        let count = match plan.workload {
            Workload::Write | Workload::Rate => p.pages,
            Workload::Send => u64::from(p.knobs.window.max(1)),
            _ => 1,
        };
        plan.request(p, 1, count, 1)
    }

    proptest! {
        /// A plan the client accepts is one every server accepts: a limit the wire holds
        /// that the plan does not is found at the server, naming flags the user never gave.
        #[test]
        fn an_accepted_plan_passes_the_wire_checks(
            wl in prop_oneof![
                Just(Workload::Write), Just(Workload::Rate), Just(Workload::Send), Just(Workload::Lat)
            ],
            pages in prop_oneof![Just(None), (1u64..1 << 22).prop_map(Some)],
            imm_every in prop_oneof![Just(1u32), 1u32..64, 0u32..=u32::MAX],
            iters in prop_oneof![Just(None), (1u64..1 << 12).prop_map(Some), any::<u64>().prop_map(Some)],
            warmup in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
            size in 1u64..1 << 24,
        ) {
            let w = WorkloadSpec {
                workload: wl,
                pages,
                imm_every,
                iters,
                warmup,
                size: Some(size),
                ..WorkloadSpec::default()
            };
            if let Ok(plan) = Plan::new(&w, true) {
                for p in &plan.runs {
                    let r = request(&plan, p);
                    prop_assert!(
                        validate(&Msg::Request(r.clone())).is_ok(),
                        "plan accepted {w:?} but the server refuses {r:?}: {:?}",
                        validate(&Msg::Request(r.clone())).err()
                    );
                }
            }
        }
    }

    #[test]
    fn pages_over_one_pass_are_refused_with_imm_every_one() {
        let w = WorkloadSpec {
            workload: Workload::Rate,
            pages: Some(2_000_000),
            ..WorkloadSpec::default()
        };
        match Plan::new(&w, true) {
            Err(Error::Usage(m)) => assert!(m.contains("--pages 2000000"), "{m}"),
            other => panic!("not refused: {other:?}"),
        }
        let w = WorkloadSpec {
            iters: Some(u64::MAX),
            ..WorkloadSpec::default()
        };
        assert!(matches!(Plan::new(&w, true), Err(Error::Usage(_))));
    }
}
