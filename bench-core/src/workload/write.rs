//! `write` and `rate`: the write-up's paged scatter WRITE.
//!
//! The active side writes each GPU's pages, in a random order, over the GPU's NICs; the last
//! WRITE of every repeat on every NIC carries an immediate and is posted once the NIC's other
//! WRITEs of that repeat have completed, so the immediate says the whole repeat landed. The
//! passive side waits for one immediate per NIC per repeat; after the last one of each phase
//! it lands the region and acknowledges ([`AckTo`], [`super::delivery`]), and the active
//! side's clock for the NIC stops at that acknowledgement.
//!
//! While bytes are verified the source turns with the repeat (`buffers::Versions`): what a
//! target slot holds names the repeat that wrote it, and the passive side checks, at each
//! immediate, that no slot still holds an older repeat's page (`buffers::RepeatCheck`): a
//! WRITE that was lost, or that landed after the immediate announcing it (SRD delivers out of
//! order), shows.

use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, LocalSlice, PeerId, RemoteRegion, RemoteSlice, Transport, WriteOp,
};

use super::delivery::{Acks, Clock, Delivered, ACK_LEN};
use super::{NicWork, Polled};
use crate::ctrl::Ctrl;
use crate::error::{Error, Result, TransportContext};
use crate::proto::{Done, Msg, NicStats};
use crate::report::Progress;

/// Repeats one NIC may have in flight at once.
const WINDOW: usize = crate::buffers::WINDOW as usize;
/// Context bit marking the immediate-carrying WRITE.
const IMM: u64 = 1 << 63;
/// Context bits 32..63: the target slot (bits 0..32: the repeat of the phase).
const SLOT_SHIFT: u32 = 32;

/// The context of a WRITE of repeat `r` into target slot `slot`.
#[inline(always)]
fn ctx_of(slot: u32, r: u64) -> u64 {
    (u64::from(slot) << SLOT_SHIFT) | (r & 0xffff_ffff)
}

/// The target slot of a WRITE's context.
#[inline(always)]
fn slot_of(ctx: u64) -> usize {
    ((ctx & !IMM) >> SLOT_SHIFT) as usize
}

/// The immediate of repeat `rep` on NIC `nic`: the NIC in the low 16 bits.
#[inline]
pub fn imm_of(nic: usize, rep: u64) -> u32 {
    ((rep as u32 & 0xffff) << 16) | (nic as u32 & 0xffff)
}

/// One NIC's share of an active write, before its thread takes it.
pub struct WriteParts<'a, T: Transport> {
    pub nic: usize,
    pub ep: &'a mut T,
    pub src: &'a mut T::Mr,
    pub peer: PeerId,
    /// The peer's data region on this NIC, as `ep` imported it.
    pub remote: RemoteRegion<T::RemoteKey>,
    /// Slots of this NIC's pages in the order they are posted (the last carries the immediate).
    pub slots: Vec<u32>,
    /// How the source turns with the repeat (`Versions::none()` when nothing is verified).
    pub ver: crate::buffers::Versions,
    pub page_size: usize,
    /// Most WRITEs in flight (the send queue depth).
    pub max_inflight: usize,
    pub batch: usize,
}

/// One NIC's active write state, owned by the thread that drives it.
pub struct WriteActive<'a, T: Transport> {
    nic: usize,
    ep: &'a mut T,
    src: &'a T::Mr,
    peer: PeerId,
    remote: RemoteRegion<T::RemoteKey>,
    slots: Vec<u32>,
    ver: crate::buffers::Versions,
    /// Source slots the source turns over (0 or 1: none).
    rotate: u64,
    /// While the source turns: target slots with a WRITE in flight, a bit each. Two WRITEs
    /// of one slot (of consecutive repeats) are never in flight together, so on an unordered
    /// fabric (SRD) the older cannot land last: a slot holds its latest repeat's page.
    busy: Vec<u64>,
    page_size: usize,
    ops: Vec<WriteOp<'a, T::Mr, T::RemoteKey>>,
    /// Pages per repeat without the immediate one.
    n1: usize,
    reps: u64,
    rep_base: u64,
    cur_rep: u64,
    cur_idx: usize,
    imm_next: u64,
    remaining: [usize; WINDOW],
    done_reps: u64,
    inflight: usize,
    max_inflight: usize,
    ops_done: u64,
    bytes: u64,
    /// The target's acknowledgement of this phase ([`super::delivery`]).
    acked: Option<Delivered>,
    /// When the phase's bytes were known to be in place: its last WRITE completed here and
    /// the acknowledgement arrived.
    delivered: Option<Delivered>,
}

impl<'a, T: Transport> WriteActive<'a, T> {
    pub fn new(p: WriteParts<'a, T>) -> Self {
        let src: &'a T::Mr = p.src;
        WriteActive {
            nic: p.nic,
            ep: p.ep,
            src,
            peer: p.peer,
            remote: p.remote,
            n1: p.slots.len().saturating_sub(1),
            rotate: p.ver.slots(),
            busy: vec![
                0;
                if p.ver.slots() > 1 {
                    p.ver.slots().div_ceil(64) as usize
                } else {
                    0
                }
            ],
            slots: p.slots,
            ver: p.ver,
            page_size: p.page_size,
            ops: Vec::with_capacity(p.batch.max(1) + WINDOW),
            reps: 0,
            rep_base: 0,
            cur_rep: 0,
            cur_idx: 0,
            imm_next: 0,
            remaining: [0; WINDOW],
            done_reps: 0,
            inflight: 0,
            max_inflight: p.max_inflight.max(1),
            ops_done: 0,
            bytes: 0,
            acked: None,
            delivered: None,
        }
    }

    /// How far the source is turned in repeat `r` of this phase (`buffers::Versions`): one
    /// division per repeat, none per WRITE.
    #[inline]
    fn shift(&self, r: u64) -> (u64, usize) {
        self.ver.of_repeat(self.rep_base + r)
    }

    /// The WRITE of target slot `slot` with the source turned by `shift`.
    #[inline]
    fn op(
        &self,
        slot: u32,
        shift: (u64, usize),
        imm: Option<u32>,
        ctx: u64,
    ) -> WriteOp<'a, T::Mr, T::RemoteKey> {
        let off = slot as usize * self.page_size;
        let mut src = u64::from(slot) + shift.0;
        if src >= self.rotate && self.rotate > 1 {
            src -= self.rotate;
        }
        let src = src as usize * self.page_size + shift.1;
        WriteOp {
            peer: self.peer,
            local: LocalSlice {
                mr: self.src,
                offset: src,
                len: self.page_size,
            },
            remote: RemoteSlice {
                addr: self.remote.addr + off as u64,
                len: self.page_size as u64,
                key: self.remote.key,
            },
            imm,
            ctx,
        }
    }

    /// Whether target slot `slot` has a WRITE in flight (never, where the source does not
    /// turn).
    #[inline(always)]
    fn busy(&self, slot: u32) -> bool {
        match self.busy.get(slot as usize / 64) {
            Some(w) => w & (1 << (slot % 64)) != 0,
            None => false,
        }
    }

    #[inline(always)]
    fn set_busy(&mut self, slot: usize, on: bool) {
        if let Some(w) = self.busy.get_mut(slot / 64) {
            if on {
                *w |= 1 << (slot % 64);
            } else {
                *w &= !(1 << (slot % 64));
            }
        }
    }

    #[inline]
    fn imm_ready(&self, r: u64) -> bool {
        r < self.reps
            && (self.n1 == 0 || (self.cur_rep > r && self.remaining[r as usize % WINDOW] == 0))
    }
}

impl<T: Transport> NicWork for WriteActive<'_, T> {
    fn start_phase(&mut self, iters: u64) {
        self.rep_base += self.reps;
        self.reps = if self.slots.is_empty() { 0 } else { iters };
        self.cur_rep = 0;
        self.cur_idx = 0;
        self.imm_next = 0;
        self.remaining = [0; WINDOW];
        self.done_reps = 0;
        self.ops_done = 0;
        self.bytes = 0;
        self.acked = None;
        self.delivered = None;
    }

    #[inline]
    fn post(&mut self, max: usize) -> Result<usize> {
        if self.reps == 0 {
            return Ok(0);
        }
        self.ops.clear();
        let room = self.max_inflight.saturating_sub(self.inflight);
        let max = max.min(room).min(self.ops.capacity());
        // Immediates whose repeat has fully completed go first, in repeat order.
        let mut r = self.imm_next;
        let last = self.slots[self.slots.len() - 1];
        while self.ops.len() < max && self.imm_ready(r) && !self.busy(last) {
            let op = self.op(
                last,
                self.shift(r),
                Some(imm_of(self.nic, self.rep_base + r)),
                IMM | ctx_of(last, r),
            );
            self.ops.push(op);
            self.set_busy(last as usize, true);
            r += 1;
        }
        let n_imm = self.ops.len();
        // Then this repeat's pages, at most WINDOW repeats ahead of the last immediate.
        if self.n1 > 0 {
            let (mut cr, mut ci) = (self.cur_rep, self.cur_idx);
            let mut shift = self.shift(cr);
            while self.ops.len() < max && cr < self.reps && cr < self.imm_next + WINDOW as u64 {
                let slot = self.slots[ci];
                if self.busy(slot) {
                    break; // its previous repeat's WRITE is still in flight
                }
                let op = self.op(slot, shift, None, ctx_of(slot, cr));
                self.ops.push(op);
                self.set_busy(slot as usize, true);
                ci += 1;
                if ci == self.n1 {
                    ci = 0;
                    cr += 1;
                    shift = self.shift(cr);
                }
            }
        }
        if self.ops.is_empty() {
            return Ok(0);
        }
        let acc = self
            .ep
            .post_writes(&self.ops)
            .ctx(|| format!("posting WRITEs on NIC {}", self.nic))?;
        if !self.busy.is_empty() {
            for i in acc..self.ops.len() {
                let slot = slot_of(self.ops[i].ctx);
                self.set_busy(slot, false);
            }
        }
        let imm_acc = acc.min(n_imm);
        self.imm_next += imm_acc as u64;
        for _ in imm_acc..acc {
            if self.cur_idx == 0 {
                self.remaining[self.cur_rep as usize % WINDOW] = self.n1;
            }
            self.cur_idx += 1;
            if self.cur_idx == self.n1 {
                self.cur_idx = 0;
                self.cur_rep += 1;
            }
        }
        self.inflight += acc;
        Ok(acc)
    }

    #[inline]
    fn poll(&mut self, buf: &mut [Completion]) -> Result<Polled> {
        let n = self
            .ep
            .poll(buf)
            .ctx(|| format!("polling NIC {}", self.nic))?;
        let mut p = Polled {
            slots: n,
            ..Polled::default()
        };
        for c in &buf[..n] {
            match &c.kind {
                CompletionKind::Write => {
                    self.inflight = self.inflight.saturating_sub(1);
                    if !self.busy.is_empty() {
                        self.set_busy(slot_of(c.ctx), false);
                    }
                    if c.ctx & IMM != 0 {
                        self.done_reps += 1;
                    } else {
                        let slot = &mut self.remaining[c.ctx as usize % WINDOW];
                        *slot = slot.saturating_sub(1);
                    }
                    p.ops += 1;
                    p.bytes += self.page_size as u64;
                }
                CompletionKind::RemoteWrite { .. } if self.acked.is_none() => {
                    match Delivered::acknowledged(c) {
                        Some(d) => self.acked = Some(d),
                        None => {
                            return Err(super::unexpected(c, &format!("WRITE on NIC {}", self.nic)))
                        }
                    }
                }
                _ => return Err(super::unexpected(c, &format!("WRITE on NIC {}", self.nic))),
            }
        }
        self.ops_done += p.ops;
        self.bytes += p.bytes;
        if self.delivered.is_none() && self.done_reps == self.reps {
            self.delivered = self.acked.map(Delivered::renewed);
        }
        Ok(p)
    }

    #[inline]
    fn finished(&self) -> bool {
        self.done_reps == self.reps && (self.reps == 0 || self.delivered.is_some())
    }

    fn delivered(&self) -> Option<Delivered> {
        self.delivered
    }

    fn nic(&self) -> usize {
        self.nic
    }

    fn stats(&self, clock: Clock) -> NicStats {
        NicStats {
            bytes: self.bytes,
            ops: self.ops_done,
            seconds: self.delivered.map_or(0.0, |d| clock.stop(d).as_secs_f64()),
        }
    }
}

/// What the target of a `write` or `rate` run acknowledges on one NIC (see
/// [`super::delivery`]): after its last immediate of each phase, it lands the region and
/// WRITEs [`super::delivery::ACK_IMM`] into the initiator's control region.
pub struct AckTo<'a, T: Transport> {
    /// The NIC's data region (what lands).
    pub data: &'a T::Mr,
    /// The acknowledgement's source (at least [`ACK_LEN`] bytes; the NIC's control region).
    pub src: &'a T::Mr,
    pub peer: PeerId,
    /// The initiator's control region on this NIC.
    pub to: RemoteSlice<T::RemoteKey>,
    /// Immediates of the warm-up phase (0: none) and of every phase together.
    pub acks: Acks,
}

impl<'a, T: Transport> AckTo<'a, T> {
    /// The acknowledgements of a NIC whose initiator runs `warm` repeats, then `total` in all.
    pub fn new(
        data: &'a T::Mr,
        src: &'a T::Mr,
        peer: PeerId,
        to: &RemoteRegion<T::RemoteKey>,
        warm: u64,
        total: u64,
    ) -> Result<Self> {
        Ok(AckTo {
            data,
            src,
            peer,
            to: to
                .slice(0, ACK_LEN as u64)
                .ctx(|| "the initiator's control region")?,
            acks: Acks::new(warm, total),
        })
    }
}

/// The passive side: poll every NIC until each has seen `expected[i]` immediates and the
/// peer's `Done` has arrived. Every immediate must name the NIC it arrived on.
///
/// `on_imm(nic, rep)` runs at each immediate, with the repeat it announces (counted from 0 over
/// the run; the immediate carries its low 16 bits, and immediates may arrive out of order).
///
/// `acks[i]` acknowledges NIC `i`'s phases ([`AckTo`]): the initiator's clock for the NIC
/// stops only when that acknowledgement arrives, after this side landed the bytes.
pub fn wait_imms<T: Transport>(
    eps: &mut [T],
    expected: &[u64],
    acks: &mut [AckTo<'_, T>],
    ctrl: &mut Ctrl,
    idle: Duration,
    progress: &mut Progress,
    on_imm: &mut dyn FnMut(usize, u64) -> Result<()>,
) -> Result<Done> {
    if acks.len() != eps.len() {
        return Err(Error::Protocol(format!(
            "{} acknowledgement plans for {} NICs",
            acks.len(),
            eps.len()
        )));
    }
    let total: u64 = expected.iter().sum();
    let mut counts = vec![0u64; eps.len()];
    let mut got = 0u64;
    let mut done: Option<Done> = None;
    let mut buf = vec![Completion::default(); super::POLL_BATCH];
    let mut turns: u32 = 0;
    let mut seen = 0u64;
    let mut last_progress = Instant::now();
    loop {
        for (i, ep) in eps.iter_mut().enumerate() {
            let n = ep.poll(&mut buf).ctx(|| format!("polling NIC {i}"))?;
            for c in &buf[..n] {
                match &c.kind {
                    CompletionKind::RemoteWrite { imm } => {
                        let nic = (*imm & 0xffff) as usize;
                        if nic != i {
                            return Err(Error::Protocol(format!(
                                "NIC {i} received the immediate {imm:#x} meant for NIC {nic}"
                            )));
                        }
                        // The repeat: the low 16 bits it carries, nearest to the count so far
                        // (at most WINDOW repeats of a NIC are in flight).
                        let low = u64::from(*imm >> 16);
                        let base = counts[i].saturating_sub(WINDOW as u64);
                        let rep = base + (low.wrapping_sub(base) & 0xffff);
                        counts[i] += 1;
                        if counts[i] > expected[i] {
                            return Err(Error::Protocol(format!(
                                "NIC {i} received more immediates than the {} expected",
                                expected[i]
                            )));
                        }
                        got += 1;
                        on_imm(i, rep)?;
                    }
                    CompletionKind::Write if acks[i].acks.inflight > 0 => {
                        acks[i].acks.inflight -= 1;
                    }
                    _ => return Err(super::unexpected(c, &format!("NIC {i}"))),
                }
            }
            let a = &mut acks[i];
            a.acks.step(counts[i], ep, a.data, a.peer, a.src, a.to, 0)?;
        }
        let settled = || acks.iter().zip(&counts).all(|(a, &n)| a.acks.settled(n));
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(64) {
            if done.is_none() {
                match ctrl.try_recv()? {
                    Some(Msg::Done(d)) => done = Some(d),
                    Some(m) => {
                        return Err(Error::Protocol(format!(
                            "expected the server's done message, got {}",
                            m.kind()
                        )))
                    }
                    None => {}
                }
            }
            if got == total && settled() {
                if let Some(d) = done.take() {
                    return Ok(d);
                }
            }
            if got != seen {
                seen = got;
                last_progress = Instant::now();
                progress.update(got, total);
            } else if last_progress.elapsed() > idle {
                return Err(Error::Timeout {
                    what: format!(
                        "immediates: {got} of {total} arrived (per NIC {counts:?} of {expected:?}){}",
                        if done.is_some() { "; the server says it finished" } else { "" }
                    ),
                    after: idle,
                });
            }
        }
    }
}
