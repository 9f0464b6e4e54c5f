//! The control connection of a session: a TCP stream with timeouts on every read and write,
//! and a reader thread that turns the peer's messages into a channel and its disappearance
//! into a flag the data path can check without a syscall.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result, TransportContext};
use crate::proto::{self, Frame, Msg};

/// How often a blocked read wakes up to look at the stop flag.
const READ_TICK: Duration = Duration::from_millis(100);
/// Bound on writing one message and on receiving the rest of a started one.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

enum Event {
    Msg(Msg),
    Gone(Error),
}

/// Whether the peer is still there; cheap enough to read on every loop turn.
#[derive(Clone, Debug, Default)]
pub struct Liveness(Arc<AtomicBool>);

impl Liveness {
    /// True once the control connection closed or failed.
    #[inline]
    pub fn gone(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    fn mark_gone(&self) {
        self.0.store(true, Ordering::Relaxed)
    }
}

/// One side's end of a control connection.
pub struct Ctrl {
    stream: TcpStream,
    rx: Receiver<Event>,
    live: Liveness,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    peer: String,
    /// Why the peer is gone, once known.
    gone_reason: Option<String>,
}

impl Ctrl {
    /// Take over a connected stream: set its timeouts and start the reader.
    pub fn new(stream: TcpStream) -> Result<Self> {
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "peer".into());
        stream.set_nodelay(true).ctx(|| "setting TCP_NODELAY")?;
        stream
            .set_write_timeout(Some(IO_TIMEOUT))
            .ctx(|| "setting the write timeout")?;
        stream
            .set_read_timeout(Some(READ_TICK))
            .ctx(|| "setting the read timeout")?;
        let mut rd = stream.try_clone().ctx(|| "cloning the control socket")?;
        let (tx, rx) = mpsc::channel();
        let live = Liveness::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (live2, stop2) = (live.clone(), stop.clone());
        let reader = std::thread::Builder::new()
            .name("ctrl-reader".into())
            .spawn(move || loop {
                let r = proto::read_frame(&mut rd, IO_TIMEOUT, || !stop2.load(Ordering::Relaxed));
                let ev = match r {
                    Ok(Frame::Msg(m)) => Event::Msg(m),
                    Ok(Frame::Idle) => return,
                    Ok(Frame::Eof) => {
                        Event::Gone(Error::PeerGone("the control connection closed".into()))
                    }
                    Err(e) => Event::Gone(e),
                };
                let last = matches!(ev, Event::Gone(_));
                if last {
                    live2.mark_gone();
                }
                if tx.send(ev).is_err() || last {
                    return;
                }
            })
            .ctx(|| "starting the control reader thread")?;
        Ok(Ctrl {
            stream,
            rx,
            live,
            stop,
            reader: Some(reader),
            peer,
            gone_reason: None,
        })
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The liveness flag, to hand to the data path.
    pub fn liveness(&self) -> Liveness {
        self.live.clone()
    }

    /// Send one message (bounded by the write timeout).
    pub fn send(&mut self, msg: &Msg) -> Result<()> {
        proto::write_msg(&mut self.stream, msg).map_err(|e| match e {
            Error::Io { source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                Error::PeerGone(format!("control connection lost: {source}"))
            }
            other => other,
        })
    }

    /// Send an error message to the peer, ignoring failure (we are closing anyway).
    pub fn send_error(&mut self, message: &str) {
        let mut m = message.to_string();
        if m.len() > proto::MAX_TEXT {
            let mut cut = proto::MAX_TEXT;
            while !m.is_char_boundary(cut) {
                cut -= 1;
            }
            m.truncate(cut);
        }
        let _ = self.send(&Msg::Error { message: m });
    }

    fn gone_error(&mut self, e: Error) -> Error {
        self.gone_reason = Some(e.to_string());
        e
    }

    /// Wait for the next message; an `Error` message from the peer becomes `Error::Refused`.
    pub fn recv(&mut self, timeout: Duration, what: &str) -> Result<Msg> {
        if let Some(r) = &self.gone_reason {
            return Err(Error::PeerGone(r.clone()));
        }
        match self.rx.recv_timeout(timeout) {
            Ok(Event::Msg(Msg::Error { message })) => Err(Error::Refused(message)),
            Ok(Event::Msg(m)) => Ok(m),
            Ok(Event::Gone(e)) => Err(self.gone_error(e)),
            Err(RecvTimeoutError::Timeout) => Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
            }),
            Err(RecvTimeoutError::Disconnected) => {
                Err(Error::PeerGone("the control connection closed".into()))
            }
        }
    }

    /// A message if one is waiting; never blocks.
    pub fn try_recv(&mut self) -> Result<Option<Msg>> {
        if let Some(r) = &self.gone_reason {
            return Err(Error::PeerGone(r.clone()));
        }
        match self.rx.try_recv() {
            Ok(Event::Msg(Msg::Error { message })) => Err(Error::Refused(message)),
            Ok(Event::Msg(m)) => Ok(Some(m)),
            Ok(Event::Gone(e)) => Err(self.gone_error(e)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => {
                Err(Error::PeerGone("the control connection closed".into()))
            }
        }
    }
}

impl Drop for Ctrl {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}
