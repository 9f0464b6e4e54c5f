//! The out-of-band control protocol: JSON messages, each behind a 4-byte big-endian length.
//!
//! A session is: client `Hello` -> server `Welcome` (or `Error`), then per run client
//! `Request` -> server `Ready` -> (the transfer) -> server `Done` (or `Error`), and finally
//! client `Bye`. Every count and length that arrives is checked against the limits below before
//! it is used; a frame that does not decode is an error, never a panic.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use transport_core::RemoteMr;

use crate::config::{Knobs, LatOp, MemKind, Pattern, Workload};
use crate::error::{Error, Result};

/// First field of `Hello` and `Welcome`.
pub const MAGIC: &str = "rdma-bench";
/// Bumped on any incompatible change of the messages or of what they mean (2: the write
/// workload's source turns by one slot per repeat, which the target's check relies on).
pub const VERSION: u32 = 2;
/// Largest frame accepted.
pub const MAX_FRAME: usize = 1 << 20;
/// Largest endpoint address accepted.
pub const MAX_ADDR: usize = 4096;
/// Most NICs one session may use.
pub const MAX_NICS: usize = 1024;
/// Regions per NIC: the data buffer, then a small control buffer (credits).
pub const MRS_PER_NIC: usize = 2;
/// Largest name (provider, backend, NIC) accepted.
pub const MAX_NAME: usize = 256;
/// Largest error text accepted.
pub const MAX_TEXT: usize = 64 * 1024;
/// Most latency round trips in one request (samples are kept in memory).
pub const MAX_LAT_ITERS: u64 = 10_000_000;
/// Most repeats or messages in one request.
pub const MAX_ITERS: u64 = 1 << 40;
/// Largest batch.
pub const MAX_BATCH: u32 = 4096;
/// Largest warm-up.
pub const MAX_WARMUP: u32 = 1_000_000;
/// Bytes of the control region of each NIC.
pub const CTRL_LEN: usize = 4096;

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
    pub nics: Vec<NicWire>,
}

/// Server's answer to a good `Hello`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub magic: String,
    pub version: u32,
    pub mem: MemKind,
    pub nics: Vec<NicWire>,
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

// ---------------------------------------------------------------------------------------
// `rdma-bench run`: N ranks meet at rank 0.
//
// Each rank connects to rank 0 and sends `Join` (who it is, and the options every rank must
// share), then `Links` (one entry per endpoint it opened for a peer). Rank 0 checks every
// `Join` against its own, answers each rank with `Links` (the peer ends of its endpoints, in
// the same order), and from then on releases `Barrier`s and collects a `RankDone` per rank
// and run. A rank that fails sends `Error`; rank 0 then sends every other rank `Abort`
// naming it, and so when a rank's control connection closes without `Bye`.

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
}

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
        }
    }
}

fn proto(msg: impl Into<String>) -> Error {
    Error::Protocol(msg.into())
}

/// Encode one frame: length prefix, then JSON.
pub fn encode(msg: &Msg) -> Result<Vec<u8>> {
    let body =
        serde_json::to_vec(msg).map_err(|e| proto(format!("encoding {}: {e}", msg.kind())))?;
    if body.len() > MAX_FRAME {
        return Err(proto(format!(
            "{} message of {} bytes is over the {MAX_FRAME}-byte limit",
            msg.kind(),
            body.len()
        )));
    }
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decode a frame body (the bytes after the length) and check every bound in it.
pub fn decode_body(body: &[u8]) -> Result<Msg> {
    if body.len() > MAX_FRAME {
        return Err(proto(format!(
            "frame of {} bytes is over the limit",
            body.len()
        )));
    }
    let msg: Msg = serde_json::from_slice(body)
        .map_err(|e| proto(format!("peer sent a message that does not decode: {e}")))?;
    validate(&msg)?;
    Ok(msg)
}

/// Decode one whole frame (length prefix included) from a byte slice. For tests and fuzzing.
pub fn decode_frame(bytes: &[u8]) -> Result<Msg> {
    let Some((head, rest)) = bytes.split_first_chunk::<4>() else {
        return Err(proto("frame shorter than its length prefix"));
    };
    let len = u32::from_be_bytes(*head) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(proto(format!(
            "frame length {len} out of range (1..={MAX_FRAME})"
        )));
    }
    if rest.len() != len {
        return Err(proto(format!(
            "frame says {len} bytes, {} arrived",
            rest.len()
        )));
    }
    decode_body(rest)
}

fn check_name(what: &str, s: &str) -> Result<()> {
    if s.len() > MAX_NAME {
        return Err(proto(format!(
            "{what} is {} bytes long (limit {MAX_NAME})",
            s.len()
        )));
    }
    Ok(())
}

fn check_nics(nics: &[NicWire]) -> Result<()> {
    if nics.is_empty() || nics.len() > MAX_NICS {
        return Err(proto(format!(
            "{} NICs announced (allowed: 1..={MAX_NICS})",
            nics.len()
        )));
    }
    for (i, n) in nics.iter().enumerate() {
        check_name("NIC name", &n.name)?;
        if n.addr.is_empty() || n.addr.len() > MAX_ADDR {
            return Err(proto(format!(
                "NIC {i}: address of {} bytes (allowed: 1..={MAX_ADDR})",
                n.addr.len()
            )));
        }
        if n.mrs.len() != MRS_PER_NIC {
            return Err(proto(format!(
                "NIC {i}: {} memory regions announced, expected {MRS_PER_NIC}",
                n.mrs.len()
            )));
        }
        if n.mrs[1].len < CTRL_LEN as u64 {
            return Err(proto(format!("NIC {i}: control region too small")));
        }
        for m in &n.mrs {
            if m.addr.checked_add(m.len).is_none() {
                return Err(proto(format!(
                    "NIC {i}: region {m:?} wraps the address space"
                )));
            }
        }
        if let Some(g) = n.link_gbps {
            if !g.is_finite() || g < 0.0 {
                return Err(proto(format!("NIC {i}: link speed {g} is not a speed")));
            }
        }
    }
    Ok(())
}

/// Check every bound that does not depend on this side's configuration.
pub fn validate(msg: &Msg) -> Result<()> {
    match msg {
        Msg::Hello(h) => {
            check_magic(&h.magic, h.version)?;
            check_name("backend", &h.backend)?;
            check_name("provider", &h.provider)?;
            check_nics(&h.nics)?;
            let want = (h.gpus as u64).checked_mul(h.nics_per_gpu as u64);
            if h.gpus == 0 || h.nics_per_gpu == 0 || want != Some(h.nics.len() as u64) {
                return Err(proto(format!(
                    "hello announces {} GPUs x {} NICs per GPU but carries {} NICs",
                    h.gpus,
                    h.nics_per_gpu,
                    h.nics.len()
                )));
            }
            for (i, n) in h.nics.iter().enumerate() {
                if n.gpu as usize != i / h.nics_per_gpu as usize {
                    return Err(proto(format!("NIC {i} claims GPU {}", n.gpu)));
                }
            }
            Ok(())
        }
        Msg::Welcome(w) => {
            check_magic(&w.magic, w.version)?;
            check_nics(&w.nics)
        }
        Msg::Request(r) => {
            if r.shifts == 0 || r.shifts > 1 << 16 {
                return Err(proto(format!("request of {} source shifts", r.shifts)));
            }
            if r.imm_every == 0
                || r.imm_every > MAX_IMM_EVERY
                || r.count.saturating_mul(u64::from(r.imm_every)) > 1 << 20
            {
                return Err(proto(format!(
                    "request of --imm-every {} over {} pages",
                    r.imm_every, r.count
                )));
            }
            check_run(r.workload, r.size, r.count, r.iters, &r.knobs)
        }
        Msg::Error { message } => {
            if message.len() > MAX_TEXT {
                return Err(proto("error text too long"));
            }
            Ok(())
        }
        Msg::Done(d) => {
            if d.per_nic.len() > MAX_NICS || d.cores.len() > MAX_NICS {
                return Err(proto("done message lists too many NICs"));
            }
            if !d.seconds.is_finite() || d.seconds < 0.0 {
                return Err(proto("done message with a bad duration"));
            }
            for n in &d.per_nic {
                if !n.seconds.is_finite() || n.seconds < 0.0 {
                    return Err(proto("done message with a bad NIC duration"));
                }
            }
            Ok(())
        }
        Msg::Ready { .. } | Msg::Bye | Msg::Barrier { .. } => Ok(()),
        Msg::Join(j) => {
            check_magic(&j.magic, j.version)?;
            check_name("host name", &j.host)?;
            if j.world < 2 || j.world > MAX_RANKS || j.rank >= j.world {
                return Err(proto(format!(
                    "rank {} of a job of {} (allowed: 2..={MAX_RANKS} ranks)",
                    j.rank, j.world
                )));
            }
            let sp = &j.spec;
            check_name("build", &sp.build)?;
            check_name("backend", &sp.backend)?;
            check_name("provider", &sp.provider)?;
            let nics = (sp.gpus as u64).checked_mul(sp.nics_per_gpu as u64);
            if sp.gpus == 0 || sp.nics_per_gpu == 0 || nics.map_or(true, |n| n > MAX_NICS as u64) {
                return Err(proto(format!(
                    "{} GPUs x {} NICs per rank (allowed: 1..={MAX_NICS} NICs)",
                    sp.gpus, sp.nics_per_gpu
                )));
            }
            if sp.runs.is_empty() || sp.runs.len() > MAX_RUNS {
                return Err(proto(format!(
                    "{} runs (allowed: 1..={MAX_RUNS})",
                    sp.runs.len()
                )));
            }
            for r in &sp.runs {
                if let Some(s) = &r.stage {
                    check_name("stage", s)?;
                }
                check_run(sp.workload, r.size, r.pages, r.iters, &r.knobs)?;
            }
            Ok(())
        }
        Msg::Links(l) => {
            if l.rank >= MAX_RANKS || l.links.len() > MAX_LINKS {
                return Err(proto(format!(
                    "links of rank {}: {} entries (allowed: up to {MAX_LINKS})",
                    l.rank,
                    l.links.len()
                )));
            }
            for (i, k) in l.links.iter().enumerate() {
                check_name("NIC name", &k.name)?;
                if k.peer >= MAX_RANKS || k.nic as usize >= MAX_NICS {
                    return Err(proto(format!(
                        "link {i}: peer {} NIC {} out of range",
                        k.peer, k.nic
                    )));
                }
                if k.addr.is_empty() || k.addr.len() > MAX_ADDR {
                    return Err(proto(format!(
                        "link {i}: address of {} bytes (allowed: 1..={MAX_ADDR})",
                        k.addr.len()
                    )));
                }
                match (&k.mr, k.send) {
                    (Some(m), false) if m.addr.checked_add(m.len).is_some() => {}
                    (None, true) => {}
                    _ => {
                        return Err(proto(format!(
                            "link {i}: a receiving link carries one region that does not wrap, \
                             a sending link none"
                        )))
                    }
                }
            }
            Ok(())
        }
        Msg::RankDone(d) => {
            if d.rank >= MAX_RANKS || d.links.len() > MAX_LINKS || d.nics.len() > MAX_NICS {
                return Err(proto("rank result out of bounds"));
            }
            if d.cores.len() > MAX_NICS {
                return Err(proto("rank result lists too many cores"));
            }
            for n in &d.nics {
                check_name("NIC name", n)?;
            }
            if !d.seconds.is_finite() || d.seconds < 0.0 {
                return Err(proto("rank result with a bad duration"));
            }
            for l in &d.links {
                if !l.seconds.is_finite() || l.seconds < 0.0 || l.nic as usize >= d.nics.len() {
                    return Err(proto("rank result with a bad link"));
                }
            }
            Ok(())
        }
        Msg::Abort { rank, message } => {
            if *rank >= MAX_RANKS || message.len() > MAX_TEXT {
                return Err(proto("abort message out of bounds"));
            }
            Ok(())
        }
    }
}

/// The numbers of one run (a server request, or a run of a rank job).
fn check_run(workload: Workload, size: u64, count: u64, iters: u64, knobs: &Knobs) -> Result<()> {
    if size == 0 {
        return Err(proto("request of size 0"));
    }
    if iters == 0 || iters > MAX_ITERS {
        return Err(proto(format!("request of {iters} iterations")));
    }
    if workload == Workload::Lat && iters > MAX_LAT_ITERS {
        return Err(proto(format!(
            "{iters} latency round trips (limit {MAX_LAT_ITERS})"
        )));
    }
    if count == 0 || count > MAX_ITERS {
        return Err(proto(format!("request count {count}")));
    }
    if knobs.batch == 0 || knobs.batch > MAX_BATCH {
        return Err(proto(format!(
            "batch {} (allowed: 1..={MAX_BATCH})",
            knobs.batch
        )));
    }
    if knobs.warmup > MAX_WARMUP {
        return Err(proto(format!("warm-up {} over {MAX_WARMUP}", knobs.warmup)));
    }
    Ok(())
}

fn check_magic(magic: &str, version: u32) -> Result<()> {
    if magic != MAGIC {
        return Err(proto(format!(
            "peer is not rdma-bench (magic {:?})",
            magic.chars().take(32).collect::<String>()
        )));
    }
    if version != VERSION {
        return Err(proto(format!(
            "protocol version mismatch: peer speaks {version}, this side {VERSION}; run the same rdma-bench on both sides"
        )));
    }
    Ok(())
}

/// Write one message; the socket's write timeout bounds it.
pub fn write_msg(w: &mut impl Write, msg: &Msg) -> Result<()> {
    let frame = encode(msg)?;
    w.write_all(&frame)
        .and_then(|_| w.flush())
        .map_err(|e| Error::Io {
            what: format!("sending {} message", msg.kind()),
            source: e,
        })
}

/// Outcome of waiting for a frame.
pub enum Frame {
    Msg(Msg),
    /// The peer closed the connection between frames.
    Eof,
    /// Nothing arrived before the caller's `idle` check said to stop waiting.
    Idle,
}

/// Read one frame. The socket must have a read timeout (it is the poll interval): between
/// frames this keeps waiting while `keep_waiting()` says so; once a frame has started, the
/// whole frame must arrive within `frame_timeout`.
pub fn read_frame(
    r: &mut impl Read,
    frame_timeout: Duration,
    mut keep_waiting: impl FnMut() -> bool,
) -> Result<Frame> {
    let mut head = [0u8; 4];
    let mut got = 0;
    let mut started: Option<Instant> = None;
    while got < 4 {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(Frame::Eof),
            Ok(0) => return Err(Error::PeerGone("connection closed inside a frame".into())),
            Ok(n) => {
                got += n;
                started.get_or_insert_with(Instant::now);
            }
            Err(e) if is_timeout(&e) => {
                if let Some(t) = started {
                    if t.elapsed() > frame_timeout {
                        return Err(Error::Timeout {
                            what: "the rest of a control message".into(),
                            after: frame_timeout,
                        });
                    }
                } else if !keep_waiting() {
                    return Ok(Frame::Idle);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(gone_or_io(e)),
        }
    }
    let len = u32::from_be_bytes(head) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(proto(format!(
            "peer announced a {len}-byte message (allowed: 1..={MAX_FRAME}); is it rdma-bench?"
        )));
    }
    let start = started.unwrap_or_else(Instant::now);
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match r.read(&mut body[got..]) {
            Ok(0) => return Err(Error::PeerGone("connection closed inside a frame".into())),
            Ok(n) => got += n,
            Err(e) if is_timeout(&e) => {
                if start.elapsed() > frame_timeout {
                    return Err(Error::Timeout {
                        what: "the rest of a control message".into(),
                        after: frame_timeout,
                    });
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(gone_or_io(e)),
        }
    }
    decode_body(&body).map(Frame::Msg)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn gone_or_io(e: std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            Error::PeerGone(format!("control connection lost: {e}"))
        }
        _ => Error::Io {
            what: "reading the control connection".into(),
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Threads;
    use proptest::prelude::*;

    fn nic(gpu: u32) -> NicWire {
        NicWire {
            gpu,
            name: "lo".into(),
            addr: vec![1, 2, 3],
            mrs: vec![
                RemoteMr {
                    addr: 0,
                    len: 1 << 20,
                    key: 7,
                },
                RemoteMr {
                    addr: 4096,
                    len: CTRL_LEN as u64,
                    key: 8,
                },
            ],
            max_write_size: 1 << 30,
            max_msg_size: 1 << 20,
            rx_depth: 128,
            link_gbps: None,
        }
    }

    pub(crate) fn hello() -> Hello {
        Hello {
            magic: MAGIC.into(),
            version: VERSION,
            backend: "efa".into(),
            provider: "shm".into(),
            gpus: 2,
            nics_per_gpu: 1,
            mem: MemKind::Host,
            nics: vec![nic(0), nic(1)],
        }
    }

    fn request() -> Request {
        Request {
            id: 1,
            workload: Workload::Write,
            size: 4096,
            count: 16,
            iters: 3,
            seed: 9,
            op: LatOp::WriteImm,
            knobs: Knobs {
                threads: Threads::PerGpu,
                ..Knobs::baseline()
            },
            imm_every: 1,
            verify: true,
            shifts: 64,
        }
    }

    fn join() -> Join {
        Join {
            magic: MAGIC.into(),
            version: VERSION,
            rank: 1,
            world: 4,
            local_rank: 1,
            host: "node01".into(),
            pid: 42,
            spec: RankSpec {
                build: "0.1.0".into(),
                backend: "efa".into(),
                provider: "shm".into(),
                pattern: Pattern::AllToAll,
                workload: Workload::Write,
                gpus: 2,
                nics_per_gpu: 2,
                mem: MemKind::Host,
                seed: 1,
                verify: true,
                runs: vec![RunSpec {
                    stage: None,
                    size: 4096,
                    pages: 16,
                    iters: 3,
                    knobs: Knobs::baseline(),
                }],
            },
        }
    }

    fn link(send: bool) -> LinkWire {
        LinkWire {
            peer: 2,
            nic: 1,
            send,
            name: "rdmap0".into(),
            addr: vec![9; 32],
            mr: (!send).then_some(RemoteMr {
                addr: 4096,
                len: 1 << 20,
                key: 3,
            }),
            max_write_size: 1 << 30,
        }
    }

    fn links() -> Links {
        Links {
            rank: 1,
            links: vec![link(true), link(false)],
        }
    }

    fn rank_done() -> RankDone {
        RankDone {
            rank: 3,
            id: 0,
            seconds: 0.5,
            verified: true,
            nics: vec!["a".into(), "b".into()],
            links: vec![LinkStats {
                peer: 0,
                nic: 1,
                send: true,
                bytes: 10,
                ops: 1,
                seconds: 0.25,
            }],
            cores: vec![3],
        }
    }

    #[test]
    fn rank_messages_bounds() {
        for m in [
            Msg::Join(join()),
            Msg::Links(links()),
            Msg::RankDone(rank_done()),
        ] {
            validate(&m).unwrap();
        }
        let bad_join = |f: fn(&mut Join)| {
            let mut j = join();
            f(&mut j);
            validate(&Msg::Join(j)).unwrap_err().to_string()
        };
        assert!(bad_join(|j| j.version = 9).contains("version mismatch"));
        assert!(bad_join(|j| j.world = 1).contains("rank"));
        assert!(bad_join(|j| j.rank = 4).contains("rank 4"));
        assert!(bad_join(|j| j.world = MAX_RANKS + 1).contains("rank"));
        assert!(bad_join(|j| j.spec.runs.clear()).contains("runs"));
        assert!(bad_join(|j| j.spec.runs[0].size = 0).contains("size 0"));
        assert!(bad_join(|j| j.spec.gpus = 0).contains("GPUs"));
        assert!(bad_join(|j| j.host = "h".repeat(MAX_NAME + 1)).contains("host"));
        let bad_links = |f: fn(&mut Links)| {
            let mut l = links();
            f(&mut l);
            validate(&Msg::Links(l)).is_err()
        };
        assert!(bad_links(|l| l.links[0].mr = l.links[1].mr));
        assert!(bad_links(|l| l.links[1].mr = None));
        assert!(bad_links(
            |l| l.links[1].mr.as_mut().unwrap().addr = u64::MAX
        ));
        assert!(bad_links(|l| l.links[0].addr.clear()));
        assert!(bad_links(|l| l.links[0].peer = MAX_RANKS));
        let mut d = rank_done();
        d.links[0].nic = 2;
        assert!(
            validate(&Msg::RankDone(d)).is_err(),
            "NIC index past the names"
        );
        let mut d = rank_done();
        d.seconds = f64::NAN;
        assert!(validate(&Msg::RankDone(d)).is_err());
        assert!(validate(&Msg::Abort {
            rank: 0,
            message: "x".repeat(MAX_TEXT + 1)
        })
        .is_err());
    }

    #[test]
    fn round_trip() {
        for m in [
            Msg::Join(join()),
            Msg::Links(links()),
            Msg::Barrier { id: 7 },
            Msg::RankDone(rank_done()),
            Msg::Abort {
                rank: 2,
                message: "rank 2 is gone".into(),
            },
            Msg::Hello(hello()),
            Msg::Request(request()),
            Msg::Ready { id: 3 },
            Msg::Done(Done::default()),
            Msg::Error {
                message: "no".into(),
            },
            Msg::Bye,
        ] {
            let f = encode(&m).unwrap();
            assert_eq!(decode_frame(&f).unwrap(), m);
            let mut cur = std::io::Cursor::new(f);
            match read_frame(&mut cur, Duration::from_secs(1), || false).unwrap() {
                Frame::Msg(got) => assert_eq!(got, m),
                _ => panic!("no message"),
            }
        }
    }

    #[test]
    fn bounds() {
        let mut h = hello();
        h.version = VERSION + 1;
        assert!(validate(&Msg::Hello(h))
            .unwrap_err()
            .to_string()
            .contains("version"));
        let mut h = hello();
        h.nics_per_gpu = 3;
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.gpus = u32::MAX;
        h.nics_per_gpu = u32::MAX;
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.nics[0].addr = vec![0; MAX_ADDR + 1];
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.nics[1].mrs.pop();
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut h = hello();
        h.nics[1].mrs[0].addr = u64::MAX;
        assert!(validate(&Msg::Hello(h)).is_err());
        let mut r = request();
        r.size = 0;
        assert!(validate(&Msg::Request(r)).is_err());
        let mut r = request();
        r.knobs.batch = 0;
        assert!(validate(&Msg::Request(r)).is_err());
        let mut r = request();
        r.workload = Workload::Lat;
        r.iters = MAX_LAT_ITERS + 1;
        assert!(validate(&Msg::Request(r)).is_err());
        for (k, count) in [(0, 16), (MAX_IMM_EVERY + 1, 1), (MAX_IMM_EVERY, 1 << 20)] {
            let mut r = request();
            (r.imm_every, r.count) = (k, count);
            assert!(
                validate(&Msg::Request(r)).is_err(),
                "imm_every {k} x {count}"
            );
        }
        // A request from a peer that predates --imm-every means one pass per immediate.
        let mut v = serde_json::to_value(Msg::Request(request())).unwrap();
        v.as_object_mut().unwrap().remove("imm_every").unwrap();
        match serde_json::from_value::<Msg>(v).unwrap() {
            Msg::Request(r) => assert_eq!(r.imm_every, 1),
            m => panic!("{}", m.kind()),
        }
        assert!(decode_frame(&[0, 0, 0, 0]).is_err());
        assert!(decode_frame(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_frame(&[0, 0]).is_err());
    }

    #[test]
    fn truncated_stream_is_an_error() {
        let f = encode(&Msg::Hello(hello())).unwrap();
        for cut in [1, 3, 4, 10, f.len() - 1] {
            let mut cur = std::io::Cursor::new(f[..cut].to_vec());
            let r = read_frame(&mut cur, Duration::from_secs(1), || false);
            assert!(r.is_err(), "cut at {cut}");
        }
        let mut empty = std::io::Cursor::new(Vec::new());
        assert!(matches!(
            read_frame(&mut empty, Duration::from_secs(1), || false),
            Ok(Frame::Eof)
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Garbage never panics the decoder.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode_frame(&bytes);
            let _ = decode_body(&bytes);
            let mut cur = std::io::Cursor::new(bytes);
            let _ = read_frame(&mut cur, Duration::from_millis(10), || false);
        }

        /// Valid frames with bytes flipped or cut never panic either.
        #[test]
        fn mutated_frames_never_panic(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            cut in any::<usize>(),
            kind in 0usize..5,
        ) {
            let m = match kind {
                0 => Msg::Hello(hello()),
                1 => Msg::Join(join()),
                2 => Msg::Links(links()),
                3 => Msg::RankDone(rank_done()),
                _ => Msg::Abort { rank: 1, message: "gone".into() },
            };
            let mut f = encode(&m).unwrap();
            for (at, b) in flips {
                let i = at % f.len();
                f[i] ^= b;
            }
            let keep = 1 + cut % f.len();
            let _ = decode_frame(&f[..keep]);
            let _ = decode_frame(&f);
        }

        /// Any field values in a well-formed JSON hello are checked, not trusted.
        #[test]
        fn any_hello_fields_never_panic(
            gpus in any::<u32>(), npg in any::<u32>(), nics in 0usize..6,
            addr_len in 0usize..5000, mrs in 0usize..4, len in any::<u64>(), addr in any::<u64>(),
            gbps in any::<f64>(),
        ) {
            let mut h = hello();
            h.gpus = gpus;
            h.nics_per_gpu = npg;
            h.nics = (0..nics).map(|i| {
                let mut n = nic(i as u32);
                n.addr = vec![0; addr_len];
                n.mrs = vec![RemoteMr { addr, len, key: 1 }; mrs];
                n.link_gbps = Some(gbps);
                n
            }).collect();
            let body = serde_json::to_vec(&Msg::Hello(h)).unwrap();
            let _ = decode_body(&body);
        }

        /// Any numbers in a request are checked, not trusted.
        #[test]
        fn any_request_never_panics(size in any::<u64>(), count in any::<u64>(),
            iters in any::<u64>(), batch in any::<u32>(), warmup in any::<u32>()) {
            let mut r = request();
            r.size = size;
            r.count = count;
            r.iters = iters;
            r.knobs.batch = batch;
            r.knobs.warmup = warmup;
            let body = serde_json::to_vec(&Msg::Request(r)).unwrap();
            let _ = decode_body(&body);
        }

        /// Any field values in a well-formed join are checked, not trusted.
        #[test]
        fn any_join_fields_never_panic(
            rank in any::<u32>(), world in any::<u32>(), gpus in any::<u32>(), npg in any::<u32>(),
            runs in 0usize..4, size in any::<u64>(), pages in any::<u64>(), iters in any::<u64>(),
            batch in any::<u32>(), host_len in 0usize..400,
        ) {
            let mut j = join();
            j.rank = rank;
            j.world = world;
            j.spec.gpus = gpus;
            j.spec.nics_per_gpu = npg;
            j.host = "h".repeat(host_len);
            j.spec.runs = (0..runs).map(|_| RunSpec {
                stage: Some("s".into()),
                size,
                pages,
                iters,
                knobs: Knobs { batch, ..Knobs::baseline() },
            }).collect();
            let body = serde_json::to_vec(&Msg::Join(j)).unwrap();
            let _ = decode_body(&body);
        }

        /// Any links and results are checked, not trusted.
        #[test]
        fn any_links_and_results_never_panic(
            n in 0usize..6, peer in any::<u32>(), nic in any::<u32>(), send in any::<bool>(),
            addr_len in 0usize..5000, with_mr in any::<bool>(), mr_addr in any::<u64>(),
            mr_len in any::<u64>(), secs in any::<f64>(), names in 0usize..4,
        ) {
            let l = Links {
                rank: peer,
                links: (0..n).map(|_| LinkWire {
                    peer,
                    nic,
                    send,
                    name: "n".into(),
                    addr: vec![0; addr_len],
                    mr: with_mr.then_some(RemoteMr { addr: mr_addr, len: mr_len, key: 1 }),
                    max_write_size: mr_len,
                }).collect(),
            };
            let _ = decode_body(&serde_json::to_vec(&Msg::Links(l)).unwrap());
            let mut d = rank_done();
            d.rank = peer;
            d.seconds = secs;
            d.nics = (0..names).map(|i| i.to_string()).collect();
            d.links = (0..n).map(|_| LinkStats { peer, nic, send, bytes: mr_len, ops: 1, seconds: secs }).collect();
            let _ = decode_body(&serde_json::to_vec(&Msg::RankDone(d)).unwrap());
        }
    }
}
