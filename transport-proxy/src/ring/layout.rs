//! The ring's layout in memory: the header's words and their offsets, the command format and
//! its packing, the sizes a ring may take, and the error words (the module above documents
//! the protocol that uses them; `CUDA_HEADER` is the same layout for kernels).

use std::time::Duration;

/// `"PXRG"` little-endian: the block's first word.
pub const MAGIC: u32 = u32::from_le_bytes(*b"PXRG");
/// Layout version. Bumped on any change of the layout above (2: every command word carries
/// its lap, and `len` moved next to the ready word).
pub const VERSION: u32 = 2;
/// One cache line: the header's words each own one.
pub const LINE: usize = 64;
/// Bytes of one [`Command`].
pub const COMMAND_BYTES: usize = 32;
/// Offset of `head`.
pub const OFF_HEAD: usize = 64;
/// Offset of `tail`.
pub const OFF_TAIL: usize = 128;
/// Offset of `done`.
pub const OFF_DONE: usize = 192;
/// Offset of the error word.
pub const OFF_ERROR: usize = 256;
/// Offset of `arrivals[0]`; `arrivals[i]` is at `OFF_ARRIVALS + LINE * i`.
pub const OFF_ARRIVALS: usize = 320;
/// The largest capacity (commands): positions compare as `u32` in the ready word.
pub const MAX_CAPACITY: u32 = 1 << 24;
/// The most arrival counters (the immediate's top 16 bits name one).
pub const MAX_ARRIVAL_SLOTS: u32 = 1 << 16;

/// A WRITE without immediate: nothing is counted at the receiver.
pub const OP_WRITE: u8 = 1;
/// A WRITE with immediate: the receiver's proxy counts it in `arrivals[imm >> 16]`.
pub const OP_WRITE_IMM: u8 = 2;
/// Fence/flush: nothing after it is posted until everything before it completed locally.
pub const OP_FENCE: u8 = 3;

/// The immediate's bits above this name the arrival counter at the receiver.
pub const ARRIVAL_SHIFT: u32 = 16;
/// Bits of a region's byte offset in [`Command::local`] / [`Command::remote`] (bits 62..47
/// hold the region, bit 63 is the lap's in the ring).
pub const OFFSET_BITS: u32 = 47;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// The lap's bit in a command's second word (`flags` bit 7).
pub const LAP_BIT_WORD1: u32 = 47;
/// The lap's bit in its third and fourth words (`local`, `remote`).
pub const LAP_BIT_ADDR: u32 = 63;
const ADDR_MASK: u64 = !(1 << LAP_BIT_ADDR);

/// The error word: the proxy is running (or was never started).
pub const ERR_NONE: u32 = 0;
/// The proxy was asked to stop and did (no failure).
pub const ERR_STOPPED: u32 = 1;
/// A WRITE completed with an error (a wrong key, a dead peer).
pub const ERR_COMPLETION: u32 = 2;
/// A post, a poll or `make_gpu_visible` returned an error.
pub const ERR_TRANSPORT: u32 = 3;
/// A command named an unknown op, peer or region, or a range outside its region.
pub const ERR_BAD_COMMAND: u32 = 4;
/// An immediate named an arrival counter the ring does not have.
pub const ERR_BAD_IMMEDIATE: u32 = 5;
/// Commands were waiting and the proxy neither consumed nor completed one for the caller's
/// idle timeout (a peer that stopped polling, a proxy thread that died): set by a
/// [`StallWatch`](super::StallWatch), so a producer waiting for room gives up.
pub const ERR_STALLED: u32 = 6;

/// The layout above as CUDA C, for a kernel compiled at run time (NVRTC): prepend it to the
/// kernel's source, or `#include` `kernels/proxy_ring.cuh` from nvcc. `proxy_push` is the
/// producer protocol for one thread.
pub const CUDA_HEADER: &str = include_str!("../../kernels/proxy_ring.cuh");

/// `region` index and byte `offset` packed as [`Command::local`] and [`Command::remote`] hold
/// them. `offset` must be below 2^48.
#[inline]
pub const fn pack(region: u16, offset: u64) -> u64 {
    ((region as u64) << OFFSET_BITS) | (offset & OFFSET_MASK)
}

/// The region index and offset of a packed [`Command::local`] / [`Command::remote`].
#[inline]
pub const fn unpack(packed: u64) -> (u16, u64) {
    ((packed >> OFFSET_BITS) as u16, packed & OFFSET_MASK)
}

/// The ready word a command at position `pos` carries.
#[inline]
pub const fn seq_for(pos: u64) -> u32 {
    (pos as u32).wrapping_add(1)
}

/// The lap flag every word of the command at position `pos` carries in a ring of `capacity`
/// (a power of two): 1 on the first lap (a ring starts zeroed), then 0, 1, ...: bit
/// log2(capacity) of `pos`, inverted.
#[inline]
pub const fn lap_flag(pos: u64, capacity: u32) -> u64 {
    (pos & capacity as u64 == 0) as u64
}

/// The immediate that bumps `arrivals[slot]` at the receiver, with 16 bits of the
/// application's own.
#[inline]
pub const fn immediate(slot: u16, tag: u16) -> u32 {
    ((slot as u32) << ARRIVAL_SHIFT) | tag as u32
}

/// One command: 32 bytes, four 64-bit words in the ring (the module docs). In a slot each
/// word carries the position's lap: `seq` in word 0, [`LAP_BIT_WORD1`] (`flags` bit 7) in
/// word 1, [`LAP_BIT_ADDR`] of `local` and `remote`. [`Command::words`] and
/// [`Command::from_words`] convert; [`Ring::push`](super::Ring::push) and
/// [`Ring::peek`](super::Ring::peek) use them.
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Command {
    /// The ready word: `(position + 1) as u32` ([`seq_for`]); ignored by a push.
    pub seq: u32,
    /// Bytes to write.
    pub len: u32,
    /// The immediate ([`OP_WRITE_IMM`]); see [`immediate`].
    pub imm: u32,
    /// [`OP_WRITE`], [`OP_WRITE_IMM`] or [`OP_FENCE`].
    pub op: u8,
    /// Reserved: 0 (bit 7 is the lap's in the ring).
    pub flags: u8,
    /// Index into the proxy's peer table.
    pub peer: u16,
    /// Local region index and offset ([`pack`]).
    pub local: u64,
    /// The peer's region index and offset ([`pack`]).
    pub remote: u64,
}

const _: () = assert!(std::mem::size_of::<Command>() == COMMAND_BYTES);
const _: () = assert!(std::mem::align_of::<Command>() == COMMAND_BYTES);
const _: () = assert!(std::mem::offset_of!(Command, len) == 4);
const _: () = assert!(std::mem::offset_of!(Command, imm) == 8);
const _: () = assert!(std::mem::offset_of!(Command, op) == 12);
const _: () = assert!(std::mem::offset_of!(Command, flags) == 13);
const _: () = assert!(std::mem::offset_of!(Command, peer) == 14);
const _: () = assert!(std::mem::offset_of!(Command, local) == 16);
const _: () = assert!(std::mem::offset_of!(Command, remote) == 24);

impl Command {
    /// A WRITE of `len` bytes from `local` (packed) to `remote` (packed) on `peer`, with an
    /// immediate when `imm` is `Some`.
    pub const fn write(peer: u16, local: u64, remote: u64, len: u32, imm: Option<u32>) -> Self {
        let (op, imm) = match imm {
            Some(i) => (OP_WRITE_IMM, i),
            None => (OP_WRITE, 0),
        };
        Self {
            seq: 0,
            len,
            imm,
            op,
            flags: 0,
            peer,
            local,
            remote,
        }
    }

    /// A fence: nothing after it is posted until everything before it completed locally.
    pub const fn fence() -> Self {
        Self {
            seq: 0,
            len: 0,
            imm: 0,
            op: OP_FENCE,
            flags: 0,
            peer: 0,
            local: 0,
            remote: 0,
        }
    }

    /// The four words a producer stores for this command at position `pos` of a ring of
    /// `capacity`: `seq` ([`seq_for`]) and `len`; `imm`, `op`, `flags`, `peer`; `local`;
    /// `remote`; each with `pos`'s [`lap_flag`] (`flags` bit 7 and the addresses' bit 63 are
    /// replaced by it; [`pack`] never sets bit 63).
    #[inline]
    pub const fn words(&self, pos: u64, capacity: u32) -> [u64; 4] {
        let lap = lap_flag(pos, capacity);
        [
            seq_for(pos) as u64 | (self.len as u64) << 32,
            self.imm as u64
                | (self.op as u64) << 32
                | ((self.flags & 0x7f) as u64) << 40
                | (self.peer as u64) << 48
                | lap << LAP_BIT_WORD1,
            (self.local & ADDR_MASK) | lap << LAP_BIT_ADDR,
            (self.remote & ADDR_MASK) | lap << LAP_BIT_ADDR,
        ]
    }

    /// The command at position `pos` of a ring of `capacity` from the words read out of its
    /// slot, or `None` while any of them is not yet this position's (its ready word differs,
    /// or its lap flag is the previous lap's): each word is stored and loaded whole, so four
    /// words of this lap are the producer's whole command, in whatever order they landed.
    #[inline]
    pub const fn from_words(w: [u64; 4], pos: u64, capacity: u32) -> Option<Self> {
        let lap = lap_flag(pos, capacity);
        if w[0] as u32 != seq_for(pos)
            || (w[1] >> LAP_BIT_WORD1) & 1 != lap
            || w[2] >> LAP_BIT_ADDR != lap
            || w[3] >> LAP_BIT_ADDR != lap
        {
            return None;
        }
        Some(Self {
            seq: w[0] as u32,
            len: (w[0] >> 32) as u32,
            imm: w[1] as u32,
            op: (w[1] >> 32) as u8,
            flags: (w[1] >> 40) as u8 & 0x7f,
            peer: (w[1] >> 48) as u16,
            local: w[2] & ADDR_MASK,
            remote: w[3] & ADDR_MASK,
        })
    }
}

/// The shape of a ring: how many commands it holds and how many arrival counters it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Commands (a power of two, 2 ..= [`MAX_CAPACITY`]).
    pub capacity: u32,
    /// Arrival counters (1 ..= [`MAX_ARRIVAL_SLOTS`]): one per peer that WRITEs here.
    pub arrival_slots: u32,
}

impl RingLayout {
    /// A layout; an error where the capacity is not a power of two in range or the slots are
    /// out of range.
    pub fn new(capacity: u32, arrival_slots: u32) -> Result<Self, RingError> {
        if !capacity.is_power_of_two() || !(2..=MAX_CAPACITY).contains(&capacity) {
            return Err(RingError::Layout(format!(
                "capacity {capacity} must be a power of two from 2 to {MAX_CAPACITY}"
            )));
        }
        if !(1..=MAX_ARRIVAL_SLOTS).contains(&arrival_slots) {
            return Err(RingError::Layout(format!(
                "arrival slots {arrival_slots} must be 1 to {MAX_ARRIVAL_SLOTS}"
            )));
        }
        Ok(Self {
            capacity,
            arrival_slots,
        })
    }

    /// Offset of command slot 0.
    pub const fn commands_offset(&self) -> usize {
        OFF_ARRIVALS + LINE * self.arrival_slots as usize
    }

    /// Bytes the block needs.
    pub const fn bytes(&self) -> usize {
        self.commands_offset() + COMMAND_BYTES * self.capacity as usize
    }
}

/// What went wrong with a ring itself (its memory, or the proxy behind it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    /// A layout out of range, or memory that does not fit it.
    #[error("proxy ring: {0}")]
    Layout(String),
    /// The error word is set: the proxy stopped or failed; nothing more will be consumed.
    #[error("proxy ring: the proxy is gone ({}); nothing more will be consumed", error_name(*.0))]
    ProxyGone(u32),
    /// A wait ran out of time.
    #[error("proxy ring: timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
}

/// The name of an error-word code.
pub fn error_name(code: u32) -> &'static str {
    match code {
        ERR_NONE => "running",
        ERR_STOPPED => "stopped",
        ERR_COMPLETION => "a WRITE completed with an error",
        ERR_TRANSPORT => "the transport returned an error",
        ERR_BAD_COMMAND => "a command named an unknown op, peer or region",
        ERR_BAD_IMMEDIATE => "an immediate named an arrival counter the ring lacks",
        ERR_STALLED => {
            "commands waited and the proxy moved none for the idle timeout (is the peer still \
             polling?)"
        }
        _ => "unknown error code",
    }
}
