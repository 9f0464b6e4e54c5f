//! `lat`: ping-pong on one NIC, WRITE-with-immediate or SEND. The client times round trips;
//! latency is reported one-way, as half the round trip. Each side lands what it received
//! ([`super::delivery::make_visible`]: for GPU memory, visible to its GPU) before it answers,
//! and the client's clock for a round trip stops only after it landed the answer. A round trip
//! runs from the previous one's clock read to its own: one clock read per round trip, and the round
//! trips add up to the wall time of the timed loop, re-posted receives included (what
//! `ucx_perftest`'s and perftest's overall latency divide by the iterations).
//!
//! The client lands answer `i`, posts ping `i + 1`, then reads the clock, while the ping
//! flies: the landing is on the path between an answer and the next ping, as the server's is
//! between a ping and its answer (on GPU memory a NIC wrote it is the device's flush, which a
//! consumer that reads the answer before it sends again pays), and the clock read is off it.
//! Each round trip stops after its own landing, never before, and holds one landing, one post
//! and one clock read; the post it holds is the next ping's (the first round trip holds the
//! first two). On UCX sm at 4 KiB, reading the clock after the post took its cost (about
//! 25 ns, `clock_gettime`) off each round trip; over host memory and provider copies the
//! landing costs a call that returns at once. (Until 2026-12-07 the client landed answer `i`
//! after posting ping `i + 1`, so on GPU memory a NIC wrote, its flush overlapped the ping's
//! flight; `workload::strict`'s test now refuses that order.)
//!
//! SEND keeps two receives posted on each side (`AHEAD`): the receive for message `i + 2` is
//! posted right after this side sent message `i` (the client) or answered it (the server),
//! while the message is in flight, a whole round trip before that message can come; a
//! re-post is never on the path between a message's arrival and the answer.

use std::time::{Duration, Instant};

use transport_core::{
    Completion, CompletionKind, LocalSlice, PeerId, Post, RemoteSlice, Transport,
};

use super::delivery::{make_visible, Clock, Delivered};
use crate::config::LatOp;
use crate::ctrl::Liveness;
use crate::error::{Error, Result, TransportContext};
use crate::report::Progress;

/// Polls between liveness and timeout checks while spinning.
const CHECK: u32 = 4096;

/// Receives each side keeps posted for SEND (see the module docs).
const AHEAD: u64 = 2;

/// One side's view of the ping-pong NIC.
pub struct PingPong<'a, T: Transport> {
    pub ep: &'a mut T,
    pub peer: PeerId,
    /// What this side sends (its own region).
    pub src: LocalSlice<'a, T::Mr>,
    /// Where the peer's message lands on this side (SEND: the receive buffer).
    pub dst: LocalSlice<'a, T::Mr>,
    /// Where this side's WRITE lands on the peer (of the peer's region as `ep` imported it).
    pub remote: RemoteSlice<T::RemoteKey>,
    pub op: LatOp,
}

fn check(live: &Liveness, since: Instant, idle: Duration, what: &str) -> Result<()> {
    if live.gone() {
        return Err(Error::PeerGone(
            "the control connection closed during the ping-pong".into(),
        ));
    }
    if since.elapsed() > idle {
        return Err(Error::Timeout {
            what: what.to_string(),
            after: idle,
        });
    }
    Ok(())
}

impl<T: Transport> PingPong<'_, T> {
    /// Post this side's message, polling (and counting local completions) while the queue is
    /// full.
    fn post_msg(&mut self, i: u64, local_done: &mut u64, buf: &mut [Completion]) -> Result<()> {
        loop {
            let r = match self.op {
                LatOp::WriteImm => {
                    self.ep
                        .post_write(self.peer, self.src, self.remote, Some(i as u32), i)
                }
                LatOp::Send => self.ep.post_send(self.peer, self.src, i),
            };
            // Matched, not `ctx`: the context is built only for an error (this is on the path
            // between a message's arrival and the answer).
            match r {
                Ok(Post::Posted) => return Ok(()),
                Ok(Post::QueueFull) => {}
                Err(e) => return Err(e).ctx(|| "posting a ping-pong message"),
            }
            let n = self.ep.poll(buf).ctx(|| "polling")?;
            for c in &buf[..n] {
                match &c.kind {
                    CompletionKind::Write | CompletionKind::Send => *local_done += 1,
                    _ => {
                        return Err(Error::Protocol(format!(
                            "unexpected completion {:?} while the queue was full",
                            c.kind
                        )))
                    }
                }
            }
        }
    }

    fn post_recv(&mut self, i: u64) -> Result<()> {
        match self
            .ep
            .post_recv(self.dst, i)
            .ctx(|| "posting a receive for the ping-pong")?
        {
            Post::Posted => Ok(()),
            Post::QueueFull => Err(Error::Protocol(format!(
                "the receive queue is full with {AHEAD} receives posted"
            ))),
        }
    }

    /// The ping-pong's own receives for the first `AHEAD` of `total` messages, before the
    /// first one (SEND only).
    pub fn prepare(&mut self, total: u64) -> Result<()> {
        if self.op == LatOp::Send {
            for i in 0..AHEAD.min(total) {
                self.post_recv(i)?;
            }
        }
        Ok(())
    }

    /// After message `i` went out (client) or was answered (server): the receive for message
    /// `i + AHEAD`, the next one's being posted already.
    #[inline]
    fn post_ahead(&mut self, i: u64, total: u64) -> Result<()> {
        if self.op == LatOp::Send && i + AHEAD < total {
            self.post_recv(i + AHEAD)?;
        }
        Ok(())
    }

    /// Wait for the peer's message `i`; counts local completions on the way.
    fn wait_msg(
        &mut self,
        i: u64,
        local_done: &mut u64,
        buf: &mut [Completion],
        live: &Liveness,
        idle: Duration,
    ) -> Result<()> {
        // The idle clock starts at the first check, not here: a message that comes within
        // CHECK polls (every one of a ping-pong) costs no clock read.
        let mut start: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            let n = match self.ep.poll(buf) {
                Ok(n) => n,
                Err(e) => return Err(e).ctx(|| "polling"),
            };
            let mut got = false;
            for c in &buf[..n] {
                match &c.kind {
                    CompletionKind::RemoteWrite { imm } if self.op == LatOp::WriteImm => {
                        if u64::from(*imm) != i & 0xffff_ffff {
                            return Err(Error::Protocol(format!(
                                "ping-pong {i}: immediate {imm} arrived"
                            )));
                        }
                        got = true;
                    }
                    CompletionKind::Recv { .. } if self.op == LatOp::Send => got = true,
                    CompletionKind::Write | CompletionKind::Send => *local_done += 1,
                    _ => return Err(super::unexpected(c, "ping-pong")),
                }
            }
            if got {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(CHECK) {
                let since = *start.get_or_insert_with(Instant::now);
                check(live, since, idle, "the peer's ping-pong message")?;
            }
        }
    }

    fn drain(
        &mut self,
        local_done: &mut u64,
        want: u64,
        buf: &mut [Completion],
        live: &Liveness,
        idle: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        while *local_done < want {
            let n = self.ep.poll(buf).ctx(|| "polling")?;
            for c in &buf[..n] {
                match &c.kind {
                    CompletionKind::Write | CompletionKind::Send => *local_done += 1,
                    _ => return Err(super::unexpected(c, "the drain after the ping-pong")),
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(CHECK) {
                check(live, start, idle, "the last ping-pong completions")?;
            }
        }
        Ok(())
    }

    /// The client: `warm + iters` round trips; returns the timed ones' round-trip times in ns.
    pub fn ping(
        &mut self,
        warm: u64,
        iters: u64,
        live: &Liveness,
        idle: Duration,
        progress: &mut Progress,
    ) -> Result<Vec<u64>> {
        let total = warm + iters;
        let mut rtts = Vec::with_capacity(iters as usize);
        let mut buf = vec![Completion::default(); 16];
        let mut local_done = 0u64;
        let mut clock = Clock::start();
        if total > 0 {
            self.post_msg(0, &mut local_done, &mut buf)?;
        }
        for i in 0..total {
            // The reply's receive is posted (prepare, or the previous turn); this one is for
            // the reply after next, posted while this ping is in flight.
            self.post_ahead(i, total)?;
            self.wait_msg(i, &mut local_done, &mut buf, live, idle)?;
            // The answer is landed before the next ping goes out, as the server lands each
            // ping before it answers; the clock is read after that ping, off the path.
            make_visible(self.ep, &[self.dst.mr])?;
            if i + 1 < total {
                self.post_msg(i + 1, &mut local_done, &mut buf)?;
            }
            let delivered = Delivered::after_visible();
            if i >= warm {
                rtts.push(clock.stop(delivered).as_nanos() as u64);
            }
            // The next round trip starts here.
            clock = Clock::from(delivered.at());
            if i % 4096 == 4095 {
                progress.update(i + 1, total);
            }
        }
        self.drain(&mut local_done, total, &mut buf, live, idle)?;
        Ok(rtts)
    }

    /// The server: answer `total` pings.
    pub fn pong(&mut self, total: u64, live: &Liveness, idle: Duration) -> Result<()> {
        let mut buf = vec![Completion::default(); 16];
        let mut local_done = 0u64;
        for i in 0..total {
            self.wait_msg(i, &mut local_done, &mut buf, live, idle)?;
            make_visible(self.ep, &[self.dst.mr])?;
            self.post_msg(i, &mut local_done, &mut buf)?;
            // The next ping's receive is posted (prepare, or the previous turn).
            self.post_ahead(i, total)?;
        }
        self.drain(&mut local_done, total, &mut buf, live, idle)
    }
}

/// `(min, p50, p99, max)` of one-way latency in microseconds from round trips in ns.
pub fn one_way_stats(rtts: &mut [u64]) -> Option<(f64, f64, f64, f64)> {
    if rtts.is_empty() {
        return None;
    }
    rtts.sort_unstable();
    let n = rtts.len();
    let us = |ns: u64| ns as f64 / 2.0 / 1000.0;
    let p = |q: usize| rtts[(n * q / 100).min(n - 1)];
    Some((us(rtts[0]), us(p(50)), us(p(99)), us(rtts[n - 1])))
}

#[cfg(test)]
mod tests {
    #[test]
    fn stats() {
        let mut v: Vec<u64> = (1..=100).map(|x| x * 2000).collect();
        let (min, p50, p99, max) = super::one_way_stats(&mut v).unwrap();
        assert_eq!(min, 1.0);
        assert_eq!(p50, 51.0);
        assert_eq!(p99, 100.0);
        assert_eq!(max, 100.0);
        assert!(super::one_way_stats(&mut []).is_none());
    }
}
