//! The messages of `rdma-bench run`: N ranks meet at rank 0.
//!
//! Each rank connects to rank 0 and sends `Join` (who it is, and the options every rank must
//! share), then `Links` (one entry per endpoint it opened for a peer). Rank 0 checks every
//! `Join` against its own, answers each rank with `Links` (the peer ends of its endpoints, in
//! the same order), and from then on releases `Barrier`s and collects a `RankDone` per rank
//! and run (run 0's with the rank's run-record facts). A rank that fails sends `Error`; rank
//! 0 then sends every other rank `Abort` naming it, and so when a rank's control connection
//! closes without `Bye`.

use serde::{Deserialize, Serialize};
use transport_core::RemoteMr;

use crate::config::{Knobs, MemKind, Pattern, Workload};
use crate::record::Facts;

/// Most ranks one job may have (every rank keeps a control connection to rank 0).
pub const MAX_RANKS: u32 = 4096;
/// Most endpoints (links) one rank may announce.
pub const MAX_LINKS: usize = 1 << 16;
/// Most runs (sizes, ladder stages) in one job.
pub const MAX_RUNS: usize = 256;

/// One run as every rank must see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub stage: Option<String>,
    pub size: u64,
    /// Pages per GPU and peer.
    pub pages: u64,
    pub iters: u64,
    pub knobs: Knobs,
}

/// The options every rank of a job must share; rank 0 refuses a rank whose differ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSpec {
    /// rdma-bench's own version.
    pub build: String,
    pub backend: String,
    pub provider: String,
    pub pattern: Pattern,
    pub workload: Workload,
    /// GPUs (NIC groups) per rank.
    pub gpus: u32,
    pub nics_per_gpu: u32,
    pub mem: MemKind,
    pub seed: u64,
    pub verify: bool,
    pub runs: Vec<RunSpec>,
}

/// A rank's opening message to rank 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Join {
    pub magic: String,
    pub version: u32,
    pub rank: u32,
    pub world: u32,
    pub local_rank: u32,
    pub host: String,
    pub pid: u32,
    pub spec: RankSpec,
}

/// One endpoint of a link: this rank's NIC `nic` towards rank `peer`, for sending or receiving.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkWire {
    pub peer: u32,
    pub nic: u32,
    /// The endpoint WRITEs (true) or receives WRITEs (false).
    pub send: bool,
    /// NIC name as opened.
    pub name: String,
    pub addr: Vec<u8>,
    /// The receive region (receiving endpoints only).
    pub mr: Option<RemoteMr>,
    pub max_write_size: u64,
}

/// A rank's endpoints (rank to rank 0), or the peer ends of them (rank 0 to a rank).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Links {
    pub rank: u32,
    pub links: Vec<LinkWire>,
}

/// What one link measured in the timed phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStats {
    pub peer: u32,
    pub nic: u32,
    pub send: bool,
    pub bytes: u64,
    pub ops: u64,
    pub seconds: f64,
}

/// One rank's result of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankDone {
    pub rank: u32,
    pub id: u32,
    /// The rank's timed phase, first thread start to last thread end.
    pub seconds: f64,
    pub verified: bool,
    /// NIC names, by NIC index.
    pub nics: Vec<String>,
    pub links: Vec<LinkStats>,
    pub cores: Vec<u32>,
    /// What the rank is and runs on, for the job's run record: in its result of run 0 only,
    /// read once its endpoints were connected, since a backend may decide per peer (UCX's
    /// `write=auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<Box<Facts>>,
}
