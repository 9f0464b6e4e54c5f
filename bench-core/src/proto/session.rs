//! The messages of a client-server session (`Hello`, `Welcome`, `Request`, `Done`) and the
//! NIC description both sides send.

use serde::{Deserialize, Serialize};
use transport_core::RemoteMr;

use crate::config::{Knobs, LatOp, MemKind, Workload};
use crate::record::Facts;

/// What one side tells the other about one of its NICs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NicWire {
    /// Index of the GPU (in this side's list) the NIC belongs to.
    pub gpu: u32,
    /// NIC name as opened.
    pub name: String,
    /// Endpoint address for this peer.
    pub addr: Vec<u8>,
    /// `[data, control]`.
    pub mrs: Vec<RemoteMr>,
    pub max_write_size: u64,
    pub max_msg_size: u64,
    pub rx_depth: u64,
    pub link_gbps: Option<f64>,
}

/// Client's opening message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: String,
    pub version: u32,
    pub backend: String,
    pub provider: String,
    pub gpus: u32,
    pub nics_per_gpu: u32,
    pub mem: MemKind,
    /// Bytes into a page where the client's data regions start (`--buf-offset`); the server
    /// places its own the same way.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub buf_offset: u32,
    pub nics: Vec<NicWire>,
}

/// Server's answer to a good `Hello`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub magic: String,
    pub version: u32,
    pub mem: MemKind,
    pub nics: Vec<NicWire>,
    /// What the server is and runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<Box<Facts>>,
}

/// One run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u32,
    pub workload: Workload,
    /// Page or message size.
    pub size: u64,
    /// Pages per GPU (write, rate); receives the client keeps posted per NIC (send).
    pub count: u64,
    /// Repeats (write, rate), messages per NIC (send), round trips (lat).
    pub iters: u64,
    pub seed: u64,
    pub op: LatOp,
    pub knobs: Knobs,
    /// write, rate: passes over the page set per immediate (`--imm-every`).
    #[serde(default = "one")]
    pub imm_every: u32,
    /// write, rate: the client checks bytes, so the server turns its source with the repeat
    /// (`buffers::Versions`), shifting it by `shifts` steps (1: turning only).
    #[serde(default)]
    pub verify: bool,
    #[serde(default = "one_u64")]
    pub shifts: u64,
}

fn one_u64() -> u64 {
    1
}

fn one() -> u32 {
    1
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Most passes over the page set one immediate may cover (`--imm-every`).
pub const MAX_IMM_EVERY: u32 = 4096;

/// What the server measured for one NIC.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NicStats {
    pub bytes: u64,
    pub ops: u64,
    pub seconds: f64,
}

/// The server's side of a finished run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub id: u32,
    pub seconds: f64,
    pub bytes: u64,
    pub ops: u64,
    pub per_nic: Vec<NicStats>,
    /// Cores the server's threads were pinned to, where pinned.
    pub cores: Vec<u32>,
}

/// What a step of `--workload gpu-write` measures (`GpuStep::kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuStepKind {
    /// Host-initiated ping-pong: the server's thread answers each WRITE+imm with one.
    HostLat,
    /// Through both rings: the server's echo answers each counted arrival with a command.
    ProxyLat,
    /// Host-initiated bandwidth: `n` WRITEs+imm, one answer after the last.
    HostBw,
    /// Through both rings: `n` commands, one answer after the last arrival.
    ProxyBw,
}

/// One step of `--workload gpu-write` (client -> server; the server answers `Ready` when it
/// is listening, then `GpuStepDone`, or `Error`). Both regions are split in two halves of
/// `half` bytes: the client WRITEs from its lower half into the server's lower half, the
/// server answers from its upper half into the client's upper half.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuStep {
    pub id: u32,
    pub kind: GpuStepKind,
    /// Bytes of each client WRITE and, in latency steps, of each answer (bandwidth: 8).
    pub size: u64,
    /// Timed WRITEs (latency: round trips; bandwidth: WRITEs before the answer).
    pub n: u64,
    /// Untimed latency round trips before the timed ones.
    pub warm: u64,
    pub half: u64,
    /// Ring capacity of the server's ring.
    pub capacity: u32,
    pub seed: u64,
    pub verify: bool,
    /// Pin the server's proxy (or host-path) thread near its GPU where its topology says.
    pub pin: bool,
    /// Proxy steps: the server answers through its own ring and proxy (a CPU echo pushing
    /// commands, as a GPU consumer's kernel would), not as in the host steps (a thread polling
    /// its endpoint and posting the answers itself).
    #[serde(default)]
    pub echo_ring: bool,
}

/// The server's side of a gpu-write step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuStepDone {
    pub id: u32,
    /// WRITEs the server counted by their immediates.
    pub arrivals: u64,
    /// Bytes of the landing region the server compared with the client's pattern (0 without
    /// verification).
    pub checked: u64,
    /// The core its proxy or host-path thread was pinned to.
    pub core: Option<u32>,
    /// It answered through its ring and proxy (the step's `echo_ring`, on a proxy step).
    #[serde(default)]
    pub by_ring: bool,
}
