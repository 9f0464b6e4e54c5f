//! Which posts ask UCX for its bandwidth protocols (`UCP_OP_ATTR_FLAG_MULTI_SEND`).
//!
//! UCX weighs the flag when it picks a protocol (UCX 1.22, `UCX_PROTO_INFO=y`: on an H200,
//! 4 KiB from GPU memory goes as a rendezvous staged through host fragments with cuda_copy
//! under it, as a cuda_ipc zero-copy rendezvous per message without it, run U6; over shared
//! memory the eager sizes move). ucx_perftest's stream tests (`tag_bw`, `ucp_put_bw`) set it
//! on every send and put (and receive, since 1.22's perftest), its ping-pongs (`tag_lat`,
//! `ucp_put_lat`) on none; so does this backend:
//! - a send is one of a stream when a send came before it and `poll` reported no receive
//!   since (a ping-pong's send answers a receive; a stream's follows the last send), or while
//!   another send is unfinished at UCX (counted there, not by the slots `poll` has yet to
//!   report: a ping-pong's last send may be finished at UCX and still wait to be reported);
//! - a put is one of a stream when a WRITE came before it and `poll` reported no immediate
//!   since (a ping-pong of WRITEs answers each immediate);
//! - a receive is one of a stream when [`STREAM_RECVS`] or more others are in flight.

use ucx_sys as sys;

/// Receives in flight from which the next one is posted as one of a stream. The latency
/// ping-pong keeps two posted ahead and posts its third beside them (bench-core's `lat`,
/// `AHEAD`): with a threshold of two its receives took the flag, and on the H200 a 4 KiB round
/// trip's half from GPU memory read 17 us through UCX's staged rendezvous against `tag_lat`'s
/// 150 through cuda_ipc (run U12), not like for like. The send workload keeps up to 256.
pub(super) const STREAM_RECVS: usize = 4;

/// What came since the last send and the last WRITE (see the module's text).
#[derive(Debug)]
pub(super) struct Streams {
    /// A send was posted and no receive was reported since.
    send: bool,
    /// A WRITE was posted and no immediate was reported since.
    write: bool,
    /// Streams ask at all (option `multi_send`; off: no call asks, for an A/B).
    asks: bool,
}

impl Streams {
    /// Streams that ask for UCX's bandwidth protocols where `asks`, or never.
    pub(super) fn new(asks: bool) -> Self {
        Self {
            send: false,
            write: false,
            asks,
        }
    }

    /// Whether a send posted now is one of a stream; `unfinished`: another send of this
    /// endpoint is unfinished at UCX.
    #[inline]
    pub(super) fn next_send(&self, unfinished: bool) -> bool {
        self.asks && (unfinished || self.send)
    }

    /// A send is posted: whether it is one of a stream.
    #[inline]
    pub(super) fn send(&mut self, unfinished: bool) -> bool {
        let stream = self.next_send(unfinished);
        self.send = true;
        stream
    }

    /// Whether a WRITE posted now is one of a stream.
    #[inline]
    pub(super) fn next_write(&self) -> bool {
        self.asks && self.write
    }

    /// A WRITE is posted: whether its put is one of a stream.
    #[inline]
    pub(super) fn write(&mut self) -> bool {
        let stream = self.next_write();
        self.write = true;
        stream
    }

    /// Whether a receive posted with `in_flight` others in flight is one of a stream.
    #[inline]
    pub(super) fn recv(&self, in_flight: usize) -> bool {
        self.asks && recv_is_stream(in_flight)
    }

    /// `poll` reported a receive: the next send may answer it.
    #[inline]
    pub(super) fn received(&mut self) {
        self.send = false;
    }

    /// `poll` reported an immediate: the next WRITE may answer it.
    #[inline]
    pub(super) fn notified(&mut self) {
        self.write = false;
    }
}

/// Whether a receive posted with `in_flight` others in flight is one of a stream.
#[inline]
pub(super) fn recv_is_stream(in_flight: usize) -> bool {
    in_flight >= STREAM_RECVS
}

/// Ask UCX for its bandwidth protocols in `p` where `stream`.
#[inline]
pub(super) fn ask(p: &mut sys::ucp_request_param_t, stream: bool) {
    if stream {
        p.op_attr_mask |= sys::UCP_OP_ATTR_FLAG_MULTI_SEND;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_pong_never_a_stream_always_after_its_first() {
        let mut s = Streams::new(true);
        // A ping-pong: each post answers the peer's.
        for _ in 0..3 {
            assert!(!s.send(false), "a ping-pong's send");
            s.received();
            assert!(!s.write(), "a ping-pong's WRITE");
            s.notified();
        }
        // A stream: every send after the first, whatever finished at UCX; immediates do not
        // end a stream of sends (the send workload's credits), nor receives one of WRITEs.
        let mut s = Streams::new(true);
        assert!(!s.send(false));
        assert!(s.send(false));
        s.notified();
        assert!(s.send(false));
        assert!(!s.write());
        s.received();
        assert!(s.write());
        // Another send unfinished at UCX: a stream's even right after a receive.
        s.received();
        assert!(s.next_send(true) && !s.next_send(false));
        assert!(!recv_is_stream(STREAM_RECVS - 1) && recv_is_stream(STREAM_RECVS));
        // Option multi_send=off: no call asks, whatever came before it.
        let mut s = Streams::new(false);
        assert!(!s.send(false) && !s.send(true) && !s.next_send(true));
        assert!(!s.write() && !s.write());
        assert!(!s.recv(STREAM_RECVS) && !s.recv(usize::MAX));
        let mut p = sys::ucp_request_param_t::default();
        ask(&mut p, false);
        assert_eq!(p.op_attr_mask, 0);
        ask(&mut p, true);
        assert_eq!(p.op_attr_mask, sys::UCP_OP_ATTR_FLAG_MULTI_SEND);
    }
}
