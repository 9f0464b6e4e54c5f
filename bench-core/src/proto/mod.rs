//! The out-of-band control protocol: JSON messages, each behind a 4-byte big-endian length.
//!
//! A session is: client `Hello` -> server `Welcome` (or `Error`), then per run client
//! `Request` -> server `Ready` -> (the transfer) -> server `Done` (or `Error`), and finally
//! client `Bye`. `--workload gpu-write` runs in steps instead of requests: client `GpuStep` ->
//! server `Ready` -> (the step) -> server `GpuStepDone` (or `Error`). Every count and length that arrives is checked against the limits below before
//! it is used; a frame that does not decode is an error, never a panic.
//!
//! Here: the limits and [`Msg`], every message. The modules behind it (all re-exported here):
//! `session`, the client's and the server's messages; `ranks`, those of `rdma-bench run`;
//! `frame`, encoding, decoding and reading frames; `validate`, the checks of what arrives.

mod frame;
mod ranks;
mod session;
mod validate;

#[cfg(test)]
mod fixtures;

use serde::{Deserialize, Serialize};

use crate::error::Error;

pub use frame::{decode_body, decode_frame, encode, read_frame, write_msg, Frame};
pub use ranks::{
    Join, LinkStats, LinkWire, Links, RankDone, RankSpec, RunSpec, MAX_LINKS, MAX_RANKS, MAX_RUNS,
};
pub use session::{
    Done, GpuStep, GpuStepDone, GpuStepKind, Hello, NicStats, NicWire, Request, Welcome,
    MAX_IMM_EVERY,
};
pub use validate::validate;

/// First field of `Hello` and `Welcome`.
pub const MAGIC: &str = "rdma-bench";
/// Bumped on any incompatible change of the messages or of what they mean (2: the write
/// workload's source turns by one slot per repeat, which the target's check relies on; 3: a
/// region's key is bytes, sent as a hex string, where it was a number, and every phase of
/// write, rate, send and `rdma-bench run` ends with the target's delivery acknowledgement,
/// which the initiator waits for, and sending links carry a region; 4: a rank's run-record
/// facts come with its result of run 0, read after it connected, not with its links, and a
/// client's hello carries none, since the server keeps no record).
pub const VERSION: u32 = 4;
/// Largest frame accepted.
pub const MAX_FRAME: usize = 1 << 20;
/// Largest endpoint address accepted.
pub const MAX_ADDR: usize = 4096;
/// Largest remote key accepted: a region's key (`RemoteMr::key`) is 1 to this many bytes,
/// sent as hex. `KeyBytes` holds no other, so a key outside the bound fails to decode and the
/// message is refused (`validate`'s tests show it).
pub const MAX_KEY: usize = transport_core::KeyBytes::MAX_LEN;
/// Most NICs one session may use.
pub const MAX_NICS: usize = 1024;
/// Largest region a peer may announce (64 TiB, beyond any host's or GPU's memory): a length
/// past it is refused before it sizes anything (the server's buffer, a step's checks).
pub const MAX_REGION: u64 = 1 << 46;
/// Regions per NIC: the data buffer, then a small control buffer (credits).
pub const MRS_PER_NIC: usize = 2;
/// Largest name (provider, backend, NIC, a run record's facts) accepted.
pub const MAX_NAME: usize = 256;
/// Largest file path accepted (a run record's library file).
pub const MAX_PATH: usize = 4096;
/// Most settings or GPUs one side's run-record facts may list.
pub const MAX_FACTS: usize = 64;
/// Largest error text accepted.
pub const MAX_TEXT: usize = 64 * 1024;
/// Most latency round trips in one request (samples are kept in memory).
pub const MAX_LAT_ITERS: u64 = 10_000_000;
/// Most repeats or messages in one request.
pub const MAX_ITERS: u64 = 1 << 40;
/// Largest batch.
pub const MAX_BATCH: u32 = 4096;
/// Largest window (operations in flight per NIC).
pub const MAX_WINDOW: u32 = 1 << 16;
/// Largest warm-up.
pub const MAX_WARMUP: u32 = 1_000_000;
/// Bytes of the control region of each NIC.
pub const CTRL_LEN: usize = 4096;

/// Every control message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    Hello(Hello),
    Welcome(Welcome),
    Request(Request),
    Ready { id: u32 },
    Done(Done),
    Error { message: String },
    Bye,
    Join(Join),
    Links(Links),
    Barrier { id: u32 },
    RankDone(RankDone),
    Abort { rank: u32, message: String },
    GpuStep(GpuStep),
    GpuStepDone(GpuStepDone),
}

impl Msg {
    /// Short name for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Hello(_) => "hello",
            Msg::Welcome(_) => "welcome",
            Msg::Request(_) => "request",
            Msg::Ready { .. } => "ready",
            Msg::Done(_) => "done",
            Msg::Error { .. } => "error",
            Msg::Bye => "bye",
            Msg::Join(_) => "join",
            Msg::Links(_) => "links",
            Msg::Barrier { .. } => "barrier",
            Msg::RankDone(_) => "rank_done",
            Msg::Abort { .. } => "abort",
            Msg::GpuStep(_) => "gpu_step",
            Msg::GpuStepDone(_) => "gpu_step_done",
        }
    }
}

fn proto(msg: impl Into<String>) -> Error {
    Error::Protocol(msg.into())
}
