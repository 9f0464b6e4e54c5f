//! Frames: a 4-byte big-endian length, then the JSON of one [`Msg`]; encoding, decoding
//! (with every bound checked) and reading and writing them on a connection.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use super::{proto, validate, Msg, MAX_FRAME};
use crate::error::{Error, Result};

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
                let t = *started.get_or_insert_with(Instant::now);
                overdue(t, frame_timeout)?;
            }
            Err(e) if is_timeout(&e) => {
                if let Some(t) = started {
                    overdue(t, frame_timeout)?;
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
            // A peer that trickles bytes never lets the read time out: check at every read.
            Ok(n) => {
                got += n;
                overdue(start, frame_timeout)?;
            }
            Err(e) if is_timeout(&e) => overdue(start, frame_timeout)?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(gone_or_io(e)),
        }
    }
    decode_body(&body).map(Frame::Msg)
}

/// A frame that started at `start` must be whole within `frame_timeout`.
fn overdue(start: Instant, frame_timeout: Duration) -> Result<()> {
    if start.elapsed() > frame_timeout {
        return Err(Error::Timeout {
            what: "the rest of a control message".into(),
            after: frame_timeout,
        });
    }
    Ok(())
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
    use crate::config::Knobs;
    use crate::proto::fixtures::{hello, join, links, nic, rank_done, request};
    use crate::proto::{Done, LinkStats, LinkWire, Links, RunSpec};
    use proptest::prelude::*;
    use transport_core::{KeyBytes, RemoteMr};

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

    /// A peer that sends one byte every 2 ms: no read ever times out.
    struct Trickle(std::io::Cursor<Vec<u8>>);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            std::thread::sleep(Duration::from_millis(2));
            let n = buf.len().min(1);
            self.0.read(&mut buf[..n])
        }
    }

    #[test]
    fn a_trickled_frame_is_held_to_the_frame_timeout() {
        let f = encode(&Msg::Hello(hello())).unwrap();
        assert!(
            f.len() > 100,
            "the frame must outlast the timeout: {} bytes",
            f.len()
        );
        let mut r = Trickle(std::io::Cursor::new(f));
        let t = std::time::Instant::now();
        let got = read_frame(&mut r, Duration::from_millis(50), || true);
        assert!(matches!(got, Err(Error::Timeout { .. })), "{:?}", got.err());
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // A frame that trickles in within the timeout still reads.
        let f = encode(&Msg::Bye).unwrap();
        let mut r = Trickle(std::io::Cursor::new(f));
        assert!(matches!(
            read_frame(&mut r, Duration::from_secs(5), || true),
            Ok(Frame::Msg(Msg::Bye))
        ));
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
            gbps in any::<f64>(), key_len in 1usize..=KeyBytes::MAX_LEN,
        ) {
            let mut h = hello();
            h.gpus = gpus;
            h.nics_per_gpu = npg;
            h.nics = (0..nics).map(|i| {
                let mut n = nic(i as u32);
                n.addr = vec![0; addr_len];
                let key = KeyBytes::new(vec![0xa5; key_len]).unwrap();
                n.mrs = vec![RemoteMr { addr, len, key }; mrs];
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
                    mr: with_mr.then_some(RemoteMr {
                        addr: mr_addr,
                        len: mr_len,
                        key: KeyBytes::from_u32(1),
                    }),
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
