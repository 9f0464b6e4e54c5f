//! `send`: SEND/RECV bandwidth with credits.
//!
//! The passive side keeps `depth` receives posted per NIC and returns credits with a small
//! WRITE-with-immediate into the sender's control region (the immediate is the count), so
//! the sender never sends into a receive queue that is not ready, and no receive is left
//! posted at the end. After the last message of each phase it lands the region and
//! acknowledges the same way ([`super::delivery::ACK_IMM`]); the sender's clock for the NIC
//! stops at that acknowledgement.

use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, LocalSlice, PeerId, Post, RemoteRegion, Transport,
};

use super::delivery::{Acks, Clock, Delivered, ACK_IMM, MAX_CREDIT_IMM};
use super::{NicWork, Polled};
use crate::ctrl::Ctrl;
use crate::error::{Error, Result, TransportContext};
use crate::proto::{Done, Msg, NicStats};
use crate::report::Progress;

/// Fewest receives the passive side keeps posted per NIC, where its receive queue holds them.
pub const MIN_RECV_DEPTH: u64 = 256;
/// Most receives the passive side keeps posted per NIC.
pub const MAX_RECV_DEPTH: u64 = 1024;
/// Bytes the posted receives aim to cover: the sender's credit window. Above what a kernel
/// buffers in a TCP connection (Linux's default `tcp_wmem` and `tcp_rmem` maxima, 4 and 6 MiB)
/// and an RDMA NIC's bandwidth-delay product, so that credits are not what paces small
/// messages: with 256 receives of 4 KiB (1 MiB) ucx over tcp moved about 4% less than with
/// 1024 (docs/measurements.md, U145). Messages of 64 KiB and more keep 256 receives.
pub const RECV_WINDOW: u64 = 16 << 20;

/// Receives the passive side keeps posted per NIC for messages of `size` bytes: enough to
/// cover [`RECV_WINDOW`], between [`MIN_RECV_DEPTH`] and [`MAX_RECV_DEPTH`], no more than its
/// receive queue holds (`rx_cap`; 0, unknown, is taken as 64) or than the run's `total`
/// messages, and at least 1. `transport-ucx/compare-tag.sh`'s warm-up (`send_depth` in
/// `ci/suspect.sh`) follows the same rule.
pub fn recv_depth(rx_cap: usize, size: u64, total: u64) -> u64 {
    let cap = if rx_cap == 0 { 64 } else { rx_cap as u64 };
    let want = (RECV_WINDOW / size.max(1)).clamp(MIN_RECV_DEPTH, MAX_RECV_DEPTH);
    want.min(cap).min(total).max(1)
}

/// One NIC's share of an active send, before its thread takes it.
pub struct SendParts<'a, T: Transport> {
    pub nic: usize,
    pub ep: &'a mut T,
    pub src: &'a mut T::Mr,
    pub peer: PeerId,
    pub size: usize,
    /// Credits granted up front (the receives the peer posted).
    pub initial_credits: u64,
    /// Messages over every phase (warm-up and timed).
    pub total: u64,
    pub max_inflight: usize,
}

/// One NIC's active send state.
pub struct SendActive<'a, T: Transport> {
    nic: usize,
    ep: &'a mut T,
    slice: LocalSlice<'a, T::Mr>,
    peer: PeerId,
    size: u64,
    total: u64,
    granted: u64,
    sent_all: u64,
    phase: u64,
    sent: u64,
    completed: u64,
    inflight: usize,
    max_inflight: usize,
    /// The receiver's acknowledgement of this phase ([`super::delivery`]).
    acked: Option<Delivered>,
    /// Its last SEND completed here and the acknowledgement arrived.
    delivered: Option<Delivered>,
}

impl<'a, T: Transport> SendActive<'a, T> {
    pub fn new(p: SendParts<'a, T>) -> Self {
        let src: &'a T::Mr = p.src;
        SendActive {
            nic: p.nic,
            ep: p.ep,
            slice: LocalSlice {
                mr: src,
                offset: 0,
                len: p.size,
            },
            peer: p.peer,
            size: p.size as u64,
            total: p.total,
            granted: p.initial_credits.min(p.total),
            sent_all: 0,
            phase: 0,
            sent: 0,
            completed: 0,
            inflight: 0,
            max_inflight: p.max_inflight.max(1),
            acked: None,
            delivered: None,
        }
    }
}

impl<T: Transport> NicWork for SendActive<'_, T> {
    fn start_phase(&mut self, iters: u64) {
        self.phase = iters;
        self.sent = 0;
        self.completed = 0;
        self.acked = None;
        self.delivered = None;
    }

    #[inline]
    fn post(&mut self, max: usize) -> Result<usize> {
        let mut k = 0;
        while k < max
            && self.sent < self.phase
            && self.sent_all < self.granted
            && self.inflight < self.max_inflight
        {
            match self
                .ep
                .post_send(self.peer, self.slice, self.sent_all)
                .ctx(|| format!("posting a SEND on NIC {}", self.nic))?
            {
                Post::Posted => {
                    self.sent += 1;
                    self.sent_all += 1;
                    self.inflight += 1;
                    k += 1;
                }
                Post::QueueFull => break,
            }
        }
        Ok(k)
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
                CompletionKind::Send => {
                    self.inflight = self.inflight.saturating_sub(1);
                    self.completed += 1;
                    p.ops += 1;
                    p.bytes += self.size;
                }
                CompletionKind::RemoteWrite { imm: ACK_IMM } => match self.acked {
                    None => self.acked = Delivered::acknowledged(c),
                    Some(_) => {
                        return Err(super::unexpected(c, &format!("SEND on NIC {}", self.nic)))
                    }
                },
                CompletionKind::RemoteWrite { imm } => {
                    self.granted += u64::from(*imm);
                    if self.granted > self.total {
                        return Err(Error::Protocol(format!(
                            "NIC {}: the receiver granted {} credits for {} messages",
                            self.nic, self.granted, self.total
                        )));
                    }
                }
                _ => return Err(super::unexpected(c, &format!("SEND on NIC {}", self.nic))),
            }
        }
        if self.delivered.is_none() && self.completed >= self.phase {
            self.delivered = self.acked.map(Delivered::renewed);
        }
        Ok(p)
    }

    #[inline]
    fn finished(&self) -> bool {
        self.completed >= self.phase && (self.phase == 0 || self.delivered.is_some())
    }

    fn delivered(&self) -> Option<Delivered> {
        self.delivered
    }

    fn nic(&self) -> usize {
        self.nic
    }

    fn stats(&self, clock: Clock) -> NicStats {
        NicStats {
            bytes: self.completed * self.size,
            ops: self.completed,
            seconds: self.delivered.map_or(0.0, |d| clock.stop(d).as_secs_f64()),
        }
    }
}

/// Context of the receiver's acknowledgement WRITEs (credit WRITEs use 0).
const ACK_CTX: u64 = 1;

/// One NIC of the receiving side.
pub struct RecvNic<'a, T: Transport> {
    pub ep: &'a mut T,
    pub data: &'a T::Mr,
    /// Local source of credit WRITEs.
    pub credit_src: &'a T::Mr,
    pub peer: PeerId,
    /// The sender's control region on this NIC, as `ep` imported it.
    pub remote_ctrl: RemoteRegion<T::RemoteKey>,
    /// Messages expected over every phase; 0: the NIC takes no part.
    pub total: u64,
    pub depth: u64,
    pub size: usize,
    /// Every receive into the first slot (`--single-buffer`).
    single: bool,
    posted: u64,
    received: u64,
    pending_credit: u64,
    credit_inflight: u64,
    /// Slots whose re-post met a full queue.
    repost: Vec<u32>,
    /// The end of each phase acknowledged ([`super::delivery`]).
    acks: Acks,
}

impl<'a, T: Transport> RecvNic<'a, T> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ep: &'a mut T,
        data: &'a T::Mr,
        credit_src: &'a T::Mr,
        peer: PeerId,
        remote_ctrl: RemoteRegion<T::RemoteKey>,
        total: u64,
        depth: u64,
        size: usize,
    ) -> Self {
        RecvNic {
            ep,
            data,
            credit_src,
            peer,
            remote_ctrl,
            total,
            depth,
            size,
            single: false,
            posted: 0,
            received: 0,
            pending_credit: 0,
            credit_inflight: 0,
            repost: Vec::with_capacity(depth as usize),
            acks: Acks::new(0, total),
        }
    }

    /// Acknowledge the end of the sender's warm-up phase too, after its `warm` messages.
    pub fn warm_up(mut self, warm: u64) -> Self {
        self.acks = Acks::new(warm.min(self.total), self.total);
        self
    }

    /// Post every receive into the first slot, as fi_*_bw do (`--single-buffer`).
    pub fn single_buffer(mut self, on: bool) -> Self {
        self.single = on;
        self
    }

    /// The receives the sender may use up front: `min(depth, total)`.
    pub fn initial(&self) -> u64 {
        self.depth.min(self.total)
    }

    fn slot(&self, s: u32) -> LocalSlice<'a, T::Mr> {
        let s = if self.single { 0 } else { s as usize };
        LocalSlice {
            mr: self.data,
            offset: s * self.size,
            len: self.size,
        }
    }

    /// Post the initial receives (before the request goes out).
    pub fn prepost(&mut self, nic: usize) -> Result<()> {
        for s in 0..self.initial() as u32 {
            match self
                .ep
                .post_recv(self.slot(s), u64::from(s))
                .ctx(|| format!("posting a receive on NIC {nic}"))?
            {
                Post::Posted => self.posted += 1,
                Post::QueueFull => {
                    return Err(Error::Protocol(format!(
                        "NIC {nic}: the receive queue filled after {s} receives"
                    )))
                }
            }
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.received == self.total && self.credit_inflight == 0 && self.acks.settled(self.received)
    }
}

/// The receiving side: keep receives posted, return credits, until every NIC has its messages
/// and the sender's `Done` arrived.
pub fn receive<T: Transport>(
    nics: &mut [RecvNic<'_, T>],
    ctrl: &mut Ctrl,
    idle: Duration,
    progress: &mut Progress,
) -> Result<Done> {
    let total: u64 = nics.iter().map(|n| n.total).sum();
    let mut buf = vec![Completion::default(); super::POLL_BATCH];
    let mut done: Option<Done> = None;
    let (mut turns, mut seen) = (0u32, u64::MAX);
    let mut last_progress = Instant::now();
    loop {
        let mut got = 0;
        for (i, n) in nics.iter_mut().enumerate() {
            let k = n.ep.poll(&mut buf).ctx(|| format!("polling NIC {i}"))?;
            for c in &buf[..k] {
                match &c.kind {
                    CompletionKind::Recv { len, .. } => {
                        if *len != n.size {
                            return Err(Error::Protocol(format!(
                                "NIC {i}: received {len} bytes, expected {}",
                                n.size
                            )));
                        }
                        n.received += 1;
                        if n.posted < n.total {
                            n.repost.push(c.ctx as u32);
                        }
                    }
                    CompletionKind::Write if c.ctx == ACK_CTX && n.acks.inflight > 0 => {
                        n.acks.inflight -= 1
                    }
                    CompletionKind::Write => {
                        n.credit_inflight = n.credit_inflight.saturating_sub(1)
                    }
                    _ => return Err(super::unexpected(c, &format!("receive on NIC {i}"))),
                }
            }
            // Re-post, then hand the sender one credit per re-posted receive.
            while let Some(&s) = n.repost.last() {
                if n.posted >= n.total {
                    n.repost.clear();
                    break;
                }
                match n
                    .ep
                    .post_recv(n.slot(s), u64::from(s))
                    .ctx(|| format!("re-posting a receive on NIC {i}"))?
                {
                    Post::Posted => {
                        n.repost.pop();
                        n.posted += 1;
                        n.pending_credit += 1;
                    }
                    Post::QueueFull => break,
                }
            }
            let threshold = (n.depth / 4).max(1);
            if n.pending_credit >= threshold || (n.pending_credit > 0 && n.posted == n.total) {
                let imm = n.pending_credit.min(u64::from(MAX_CREDIT_IMM)) as u32;
                let src = LocalSlice {
                    mr: n.credit_src,
                    offset: 0,
                    len: 8,
                };
                let dst = n
                    .remote_ctrl
                    .slice(0, 8)
                    .ctx(|| "the sender's control region")?;
                if n.ep
                    .post_write(n.peer, src, dst, Some(imm), 0)
                    .ctx(|| format!("returning credits on NIC {i}"))?
                    == Post::Posted
                {
                    n.pending_credit -= u64::from(imm);
                    n.credit_inflight += 1;
                }
            }
            // The end of a phase: land the messages, then acknowledge.
            // Most turns have nothing to land or post: skip the region's bounds check too.
            if n.total > 0 && n.acks.wants_step(n.received) {
                let to = n
                    .remote_ctrl
                    .slice(0, super::delivery::ACK_LEN as u64)
                    .ctx(|| "the sender's control region")?;
                n.acks
                    .step(n.received, n.ep, n.data, n.peer, n.credit_src, to, ACK_CTX)?;
            }
            got += n.received;
        }
        turns = turns.wrapping_add(1);
        if turns % 64 == 0 {
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
            if nics.iter().all(|n| n.done()) {
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
                    what: format!("messages: {got} of {total} arrived"),
                    after: idle,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::recv_depth;

    #[test]
    fn receive_depth_covers_the_window_within_its_bounds() {
        let u = u64::MAX;
        // Small messages: the most; 16 KiB is the largest size that still gets it.
        assert_eq!(recv_depth(4096, 4096, u), 1024);
        assert_eq!(recv_depth(4096, 16384, u), 1024);
        // Between: the window's worth.
        assert_eq!(recv_depth(4096, 32768, u), 512);
        // 64 KiB and up: the fewest, as before the window.
        assert_eq!(recv_depth(4096, 65536, u), 256);
        assert_eq!(recv_depth(4096, 1 << 20, u), 256);
        assert_eq!(recv_depth(4096, 1 << 30, u), 256);
        // The receive queue, the run's messages and 1 bound it; 0 is a queue of 64.
        assert_eq!(recv_depth(1024, 4096, u), 1024);
        assert_eq!(recv_depth(300, 4096, u), 300);
        assert_eq!(recv_depth(0, 4096, u), 64);
        assert_eq!(recv_depth(4096, 4096, 10), 10);
        assert_eq!(recv_depth(4096, 4096, 0), 1);
        assert_eq!(recv_depth(4096, 0, u), 1024);
    }
}
