//! A receiving link of `rdma-bench run` ([`ImmSink`]): counts its peer's immediates, one
//! per repeat; after the last one of a phase it lands its region (its clock stops there) and
//! acknowledges into the pad past the sending link's pages ([`ack_pad`]).

use std::time::Instant;
use transport_core::{Completion, CompletionKind, PeerId, RemoteRegion, RemoteSlice, Transport};

use super::ACK_PAD;
use crate::error::{Error, Result, TransportContext};
use crate::proto::NicStats;
use crate::workload::delivery::{land, post_ack, Clock, Delivered, Drain, ACK_LEN};
use crate::workload::{NicWork, Polled};

/// A receiving link: counts the peer's immediates, one per repeat; at the last one lands its
/// region and acknowledges.
pub struct ImmSink<'a, T: Transport> {
    link: usize,
    ep: &'a mut T,
    mr: &'a T::Mr,
    peer: PeerId,
    /// Where the acknowledgement lands (the tail of the sender's region).
    ack_to: RemoteSlice<T::RemoteKey>,
    /// Low 16 bits every immediate must carry: the sender's link index.
    tag: u32,
    /// Repeats expected at all (0: this link carries no pages in this run).
    active: bool,
    bytes_per_rep: u64,
    reps: u64,
    got: u64,
    /// Immediates that arrived before the phase started, and when the first did.
    carry: u64,
    carry_since: Option<Instant>,
    /// The first of them of this phase: the link's clock starts no later.
    since: Option<Instant>,
    /// Immediates of this phase that arrived before it started, not yet reported as ops.
    owed: u64,
    /// The phase's bytes landed here (the link's clock stops there).
    delivered: Option<Delivered>,
    /// The acknowledgement: 0 not posted, 1 posted, 2 completed here.
    ack: u8,
}

/// An [`ImmSink`] before its thread takes it.
pub struct SinkParts<'a, T: Transport> {
    pub link: usize,
    pub ep: &'a mut T,
    /// The link's region (where the pages land; the acknowledgement's source).
    pub mr: &'a mut T::Mr,
    pub peer: PeerId,
    /// Where the acknowledgement lands: the last [`ACK_PAD`] bytes of the sender's region
    /// ([`ack_pad`]).
    pub ack_to: RemoteSlice<T::RemoteKey>,
    pub tag: u32,
    pub active: bool,
    pub bytes_per_rep: u64,
    /// Immediates already received for this phase, and when the first came.
    pub early: u64,
    pub early_since: Option<Instant>,
}

impl<'a, T: Transport> ImmSink<'a, T> {
    pub fn new(p: SinkParts<'a, T>) -> Self {
        let mr: &'a T::Mr = p.mr;
        ImmSink {
            link: p.link,
            ep: p.ep,
            mr,
            peer: p.peer,
            ack_to: p.ack_to,
            tag: p.tag,
            active: p.active,
            bytes_per_rep: p.bytes_per_rep,
            reps: 0,
            got: 0,
            carry: p.early,
            carry_since: p.early_since,
            since: None,
            owed: 0,
            delivered: None,
            ack: 0,
        }
    }

    /// After the phase's last immediate: land the region, then acknowledge (again on a
    /// later turn where the queue was full).
    fn deliver(&mut self) -> Result<()> {
        if self.reps == 0 || self.got < self.reps || self.ack > 0 {
            return Ok(());
        }
        if self.delivered.is_none() {
            self.delivered = Some(land(self.ep, &[self.mr], Drain::Yes)?);
        }
        if post_ack(self.ep, self.peer, self.mr, self.ack_to, 0)? {
            self.ack = 1;
        }
        Ok(())
    }
}

impl<T: Transport> NicWork for ImmSink<'_, T> {
    fn start_phase(&mut self, iters: u64) {
        self.reps = if self.active { iters } else { 0 };
        self.got = 0;
        // Counted by the first poll, like any other completion: the loop that drives the
        // phase ends on the sum of the ops every poll reports, so ops counted only here
        // would leave it waiting for completions that already came.
        self.owed = std::mem::take(&mut self.carry);
        self.since = self.carry_since.take();
        self.delivered = None;
        self.ack = 0;
    }

    #[inline]
    fn post(&mut self, _max: usize) -> Result<usize> {
        Ok(0)
    }

    #[inline]
    fn poll(&mut self, buf: &mut [Completion]) -> Result<Polled> {
        let n = self
            .ep
            .poll(buf)
            .ctx(|| format!("polling link {}", self.link))?;
        let mut p = Polled {
            slots: n,
            ..Polled::default()
        };
        if self.owed > 0 {
            let k = std::mem::take(&mut self.owed);
            self.got += k;
            if self.got > self.reps {
                return Err(too_many(self.link, self.reps));
            }
            p.ops += k;
            p.bytes += k * self.bytes_per_rep;
        }
        for c in &buf[..n] {
            match c.kind {
                CompletionKind::RemoteWrite { imm } if imm & 0xffff == self.tag => {
                    self.got += 1;
                    if self.got > self.reps {
                        return Err(too_many(self.link, self.reps));
                    }
                    p.ops += 1;
                    p.bytes += self.bytes_per_rep;
                }
                CompletionKind::Write if self.ack == 1 => self.ack = 2,
                _ => {
                    return Err(crate::workload::unexpected(
                        c,
                        &format!("link {}", self.link),
                    ))
                }
            }
        }
        self.deliver()?;
        Ok(p)
    }

    #[inline]
    fn finished(&self) -> bool {
        self.got >= self.reps && (self.reps == 0 || self.ack == 2)
    }

    fn delivered(&self) -> Option<Delivered> {
        self.delivered
    }

    fn nic(&self) -> usize {
        self.link
    }

    /// From the phase's start, or from the first immediate that came before it (its peer
    /// left the barrier first), whichever is earlier, to delivery: every byte counted came
    /// inside the time it is divided by.
    fn stats(&self, clock: Clock) -> NicStats {
        let clock = rx_clock(clock, self.since);
        NicStats {
            bytes: self.got * self.bytes_per_rep,
            ops: self.got,
            seconds: self.delivered.map_or(0.0, |d| clock.stop(d).as_secs_f64()),
        }
    }
}

/// A receiving link's clock: the phase's, or one from `since` (the first immediate of the
/// phase, seen before it started) where that is earlier.
fn rx_clock(phase: Clock, since: Option<Instant>) -> Clock {
    match since {
        Some(t) if t < phase.started() => Clock::from(t),
        _ => phase,
    }
}

/// Where a receiving link acknowledges: the last [`ACK_PAD`] bytes of the sending link's
/// region `sender` (past its pages).
pub fn ack_pad<K: Copy>(sender: &RemoteRegion<K>, link: usize) -> Result<RemoteSlice<K>> {
    let at = sender.len.checked_sub(ACK_PAD as u64).ok_or_else(|| {
        Error::Protocol(format!(
            "link {link}: the sender's region has no room for the acknowledgement"
        ))
    })?;
    sender
        .slice(at, ACK_LEN as u64)
        .ctx(|| "the sender's acknowledgement pad")
}

#[cold]
#[inline(never)]
fn too_many(link: usize, reps: u64) -> Error {
    Error::Protocol(format!(
        "link {link} received more immediates than the {reps} expected"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Bytes that came before this rank's phase started count from when they came: the
    /// receive clock starts at the first early immediate, never later than the phase's.
    #[test]
    fn the_receive_clock_starts_at_the_first_early_immediate() {
        let t0 = Instant::now();
        let phase = Clock::from(t0 + Duration::from_millis(5));
        assert_eq!(rx_clock(phase, Some(t0)).started(), t0);
        assert_eq!(rx_clock(phase, None).started(), phase.started());
        let later = t0 + Duration::from_millis(9);
        assert_eq!(rx_clock(phase, Some(later)).started(), phase.started());
    }
}
