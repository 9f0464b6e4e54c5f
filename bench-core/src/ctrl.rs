//! The control connection of a session: a TCP stream with timeouts on every read and write,
//! and a reader thread that turns the peer's messages into a channel and its disappearance
//! into a flag the data path can check without a syscall.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result, TransportContext};
use crate::proto::{self, Frame, Msg};

/// How often a blocked read wakes up to look at the stop flag.
const READ_TICK: Duration = Duration::from_millis(100);

/// How the chosen backend ends a process whose endpoints it gives up on (set once, where the
/// backend is chosen).
static ON_ABANDON: std::sync::OnceLock<fn(i32) -> !> = std::sync::OnceLock::new();

/// Have [`abandon`] end the process with `exit`: the backend's way out that does not touch
/// endpoints a dead peer may have wedged (`transport_efa::exit_abandoning_endpoints`).
pub fn on_abandon(exit: fn(i32) -> !) {
    let _ = ON_ABANDON.set(exit);
}

/// End the process with status `code` without closing its endpoints or running library
/// destructors: after a peer died, closing or finalising a provider can spin on a lock the
/// peer held, or race a thread still inside it. Output written so far is flushed first.
/// Without a backend's way out (verbs), a plain `exit`.
pub fn abandon(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    match ON_ABANDON.get() {
        Some(exit) => exit(i32::from(code)),
        None => std::process::exit(i32::from(code)),
    }
}
/// Bound on writing one message and on receiving the rest of a started one.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The watchdog's grace after an orderly end (either side said `Bye`): closing endpoints and
/// unregistering memory take their time, and a peer that tears down faster closes the
/// connection first, so the short grace of a peer's death would end a healthy process before
/// it printed its results. A teardown still inside the provider after this is stuck.
pub const TEARDOWN_GRACE: Duration = Duration::from_secs(30);

enum Event {
    Msg(Msg),
    Gone(Error),
}

/// Whether the peer is still there; cheap enough to read on every loop turn.
#[derive(Clone, Debug, Default)]
pub struct Liveness(Arc<LiveFlags>);

#[derive(Debug, Default)]
struct LiveFlags {
    gone: AtomicBool,
    /// Why the first peer went: rank 0 shares one flag over every rank's connection, and a
    /// survivor that left because of that first failure must not be named in its place.
    first: std::sync::OnceLock<String>,
    /// Guards of [`Liveness::busy`] alive: the process is using its endpoints.
    busy: AtomicUsize,
    /// A [`Watchdog::Warn`] gave up on the data path: it is stuck inside a provider call.
    abandoned: AtomicBool,
    /// The teardown's grace in ms where a side asked for more than [`TEARDOWN_GRACE`]
    /// ([`Ctrl::watch_teardown_after`]: many endpoints to close); 0 for the default. Every
    /// connection on this flag gives an orderly end at least this.
    teardown_ms: std::sync::atomic::AtomicU64,
}

impl Liveness {
    /// True once the control connection closed or failed.
    #[inline]
    pub fn gone(&self) -> bool {
        self.0.gone.load(Ordering::Relaxed)
    }
    fn mark_gone(&self, why: &str) {
        let _ = self.0.first.set(why.to_string());
        self.0.gone.store(true, Ordering::Relaxed)
    }
    /// A peer left in order: gone, but not the first failure a later watchdog should name.
    fn mark_left(&self) {
        self.0.gone.store(true, Ordering::Relaxed)
    }
    /// Give every orderly end on this flag at least `grace` for the teardown (a side with
    /// many endpoints to close; see `LiveFlags::teardown_ms`).
    pub fn raise_teardown_grace(&self, grace: Duration) {
        let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.0.teardown_ms.fetch_max(ms, Ordering::Relaxed);
    }
    /// The grace an orderly end gives the teardown (see `LiveFlags::teardown_ms`).
    fn teardown_grace(&self) -> Duration {
        match self.0.teardown_ms.load(Ordering::Relaxed) {
            0 => TEARDOWN_GRACE,
            ms => Duration::from_millis(ms).max(TEARDOWN_GRACE),
        }
    }
    /// Why the first peer on this flag went (see `LiveFlags::first`), once one did.
    fn first_gone(&self) -> Option<&str> {
        self.0.first.get().map(String::as_str)
    }
    /// Mark the endpoints in use until the guard drops: the watchdog acts only then. Guards
    /// nest: a whole job holds one, and each transfer inside it another.
    pub fn busy(&self) -> Busy<'_> {
        self.0.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }
    fn is_busy(&self) -> bool {
        self.0.busy.load(Ordering::Acquire) > 0
    }
    /// True once a [`Watchdog::Warn`] gave up on this data path (still inside a provider call
    /// its grace after the peer went): a server cannot wait for that session to end.
    pub fn abandoned(&self) -> bool {
        self.0.abandoned.load(Ordering::Acquire)
    }
}

/// See [`Liveness::busy`].
pub struct Busy<'a>(&'a Liveness);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0 .0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What to do when the peer is gone and the data path is still busy after a grace period.
///
/// Every wait of the data path is bounded, but only between provider calls: a call that never
/// returns cannot be timed out from inside. libfabric 1.x's `shm` is the case in point: its
/// shared queues are guarded by process-shared spinlocks, and a peer killed while holding one
/// leaves the survivor spinning inside `fi_cq_read`. The control connection's reader thread
/// sees the peer go; this is what it then does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watchdog {
    /// A client: report, and exit the process non-zero.
    Exit(Duration),
    /// A server session: report; the server keeps serving (the stuck thread is lost).
    Warn(Duration),
}

impl Watchdog {
    /// The same watchdog with at least `g` of grace.
    fn at_least(self, g: Duration) -> Self {
        match self {
            Watchdog::Exit(d) => Watchdog::Exit(d.max(g)),
            Watchdog::Warn(d) => Watchdog::Warn(d.max(g)),
        }
    }
}

/// What one event of the reader means (see [`verdict`]).
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    /// The peer went or failed: the reason, for the hook and the watchdog's report.
    why: Option<String>,
    /// The connection is over (the data path must stop waiting on this peer).
    gone: bool,
    /// Arm the watchdog, with this grace.
    watch: Option<Watchdog>,
}

/// The reader's reading of one event. `orderly`: the peer said `Bye`, or this side did; a
/// close then is the session's end, not a death. A death arms the watchdog with its grace;
/// an orderly end with at least [`TEARDOWN_GRACE`], so a teardown slower than the peer's is
/// not taken for a provider call stuck on a dead peer (and its results are not lost).
fn verdict(
    ev: &Event,
    orderly: bool,
    name: &str,
    watchdog: Option<Watchdog>,
    teardown: Duration,
) -> Verdict {
    let last = matches!(ev, Event::Gone(_));
    let why = match ev {
        Event::Gone(Error::PeerGone(m)) if !orderly => Some(format!("{name} is gone ({m})")),
        Event::Gone(e) if !orderly => Some(format!("{name} is gone ({e})")),
        Event::Gone(_) => None,
        Event::Msg(Msg::Abort { message, .. }) => Some(message.clone()),
        Event::Msg(Msg::Error { message }) => Some(format!("{name} failed: {message}")),
        Event::Msg(_) => None,
    };
    let gone = last || why.is_some();
    let watch = match (&why, gone) {
        (Some(_), _) => watchdog,
        (None, true) => watchdog.map(|w| w.at_least(teardown)),
        (None, false) => None,
    };
    Verdict { why, gone, watch }
}

/// See [`CtrlOpts::on_gone`].
pub type OnGone = Box<dyn FnOnce(&str) + Send>;

/// What a control connection does beyond reading and writing (see [`Ctrl::with`]).
#[derive(Default)]
pub struct CtrlOpts {
    pub watchdog: Option<Watchdog>,
    /// Share this liveness flag (rank 0: one flag for every rank's connection, so the data
    /// path stops when any rank goes).
    pub live: Option<Liveness>,
    /// Called once, from the reader thread, with the reason, when the peer goes without
    /// having said `Bye`, sends `Error`, or sends `Abort`.
    pub on_gone: Option<OnGone>,
    /// What to call the peer in messages (default: "the peer").
    pub name: Option<String>,
    /// Which session a [`Watchdog::Warn`] abandons, in its report (a server's "session 3 from
    /// ADDR", as its other lines say): a server serves several.
    pub label: Option<String>,
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
    /// This side sent `Bye`: the peer closing the connection after it is the session's end.
    bye_sent: Arc<AtomicBool>,
    /// The reader's watchdog and the session's label, for [`Ctrl::watch_teardown`].
    watchdog: Option<Watchdog>,
    label: Option<String>,
    /// An error message was sent: [`Ctrl::send_error`] sends one at most.
    error_sent: bool,
}

impl Ctrl {
    /// Take over a connected stream: set its timeouts and start the reader.
    pub fn new(stream: TcpStream) -> Result<Self> {
        Self::watched(stream, None)
    }

    /// Like [`Ctrl::new`], with a [`Watchdog`] for a data path stuck after the peer left.
    pub fn watched(stream: TcpStream, watchdog: Option<Watchdog>) -> Result<Self> {
        Self::with(
            stream,
            CtrlOpts {
                watchdog,
                ..CtrlOpts::default()
            },
        )
    }

    /// Take over a connected stream with the extras of `opts`.
    ///
    /// The peer counts as gone when its connection closes or fails, and also when it sends
    /// `Abort` (rank 0 telling a rank that the job is over).
    pub fn with(stream: TcpStream, opts: CtrlOpts) -> Result<Self> {
        let CtrlOpts {
            watchdog,
            live,
            mut on_gone,
            name,
            label,
        } = opts;
        let name = name.unwrap_or_else(|| "the peer".into());
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
        let live = live.unwrap_or_default();
        let stop = Arc::new(AtomicBool::new(false));
        let bye_sent = Arc::new(AtomicBool::new(false));
        let (live2, stop2, bye_sent2) = (live.clone(), stop.clone(), bye_sent.clone());
        let label2 = label.clone();
        let reader = std::thread::Builder::new()
            .name("ctrl-reader".into())
            .spawn(move || {
                let mut said_bye = false;
                loop {
                    let r =
                        proto::read_frame(&mut rd, IO_TIMEOUT, || !stop2.load(Ordering::Relaxed));
                    let ev = match r {
                        Ok(Frame::Msg(m)) => {
                            said_bye |= matches!(m, Msg::Bye);
                            Event::Msg(m)
                        }
                        Ok(Frame::Idle) => return,
                        Ok(Frame::Eof) => {
                            Event::Gone(Error::PeerGone("the control connection closed".into()))
                        }
                        Err(e) => Event::Gone(e),
                    };
                    let last = matches!(ev, Event::Gone(_));
                    if last && stop2.load(Ordering::Relaxed) {
                        // This side closed the connection.
                        return;
                    }
                    let orderly = said_bye || bye_sent2.load(Ordering::Acquire);
                    let v = verdict(&ev, orderly, &name, watchdog, live2.teardown_grace());
                    match &v.why {
                        Some(why) => live2.mark_gone(why),
                        None if v.gone => live2.mark_left(),
                        None => {}
                    }
                    if let Some(why) = &v.why {
                        if let Some(hook) = on_gone.take() {
                            hook(why);
                        }
                    }
                    let closed = tx.send(ev).is_err();
                    if let Some(w) = v.watch {
                        let why = v.why.unwrap_or_else(|| format!("{name} left"));
                        let _ = watch(&live2, &stop2, w, &why, label2.as_deref());
                    }
                    if closed || last {
                        return;
                    }
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
            bye_sent,
            watchdog,
            label,
            error_sent: false,
        })
    }

    /// This side failed (`why`) and is about to close its endpoints with the peer still
    /// connected (a peer that stopped: nothing on this connection arms the watchdog). Arm it
    /// now, with at least [`TEARDOWN_GRACE`]: a close that waits for operations the stopped
    /// peer never completes (efa's close waits for its sends) ends this process (`Exit`) or
    /// abandons the session (`Warn`) instead of hanging. Nothing happens where the data path
    /// is no longer busy by then, or this connection was dropped.
    pub fn watch_teardown(&self, why: &str) {
        self.watch_teardown_after(why, TEARDOWN_GRACE);
    }

    /// [`Ctrl::watch_teardown`] with at least `grace` (a teardown of many endpoints may need
    /// more than [`TEARDOWN_GRACE`]).
    pub fn watch_teardown_after(&self, why: &str, grace: Duration) {
        // A peer's orderly end, on this connection or another of the same flag, gives the
        // teardown as long.
        self.live.raise_teardown_grace(grace);
        let Some(w) = self.watchdog.map(|w| w.at_least(grace)) else {
            return;
        };
        let (live, stop) = (self.live.clone(), self.stop.clone());
        let (why, label) = (why.to_string(), self.label.clone());
        let _ = std::thread::Builder::new()
            .name("ctrl-teardown".into())
            .spawn(move || {
                let _ = watch(&live, &stop, w, &why, label.as_deref());
            });
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
        if matches!(msg, Msg::Bye) {
            // Before it leaves: the peer may close as soon as it reads it.
            self.bye_sent.store(true, Ordering::Release);
        }
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

    /// Send an error message to the peer, ignoring failure (we are closing anyway); the
    /// first only, so that a side may tell its peer before it closes its endpoints and again
    /// where it gives up, and the peer reads the first.
    pub fn send_error(&mut self, message: &str) {
        if std::mem::replace(&mut self.error_sent, true) {
            return;
        }
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

/// The peer is gone (`why`): give the data path `grace` to notice, then act if it is still
/// busy, naming the first peer that went on `live` (a shared flag's first failure, not a
/// survivor that left after it); `Warn` names the session as `label`. Returns whether it
/// acted (with `Exit` it does not return).
fn watch(live: &Liveness, stop: &AtomicBool, w: Watchdog, why: &str, label: Option<&str>) -> bool {
    let grace = match w {
        Watchdog::Exit(g) | Watchdog::Warn(g) => g,
    };
    let start = std::time::Instant::now();
    while start.elapsed() < grace {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(READ_TICK.min(grace));
    }
    if !live.is_busy() || stop.load(Ordering::Relaxed) {
        return false;
    }
    let what = stuck(live, why, grace);
    match w {
        Watchdog::Exit(_) => {
            eprintln!("rdma-bench: error: {what}; exiting");
            abandon(1);
        }
        Watchdog::Warn(_) => {
            live.0.abandoned.store(true, Ordering::Release);
            eprintln!("{}", abandoned(label, &what))
        }
    }
    true
}

/// The watchdog's words: the first peer gone on `live` (else `why`), and what is stuck.
fn stuck(live: &Liveness, why: &str, grace: Duration) -> String {
    format!(
        "{}; {:.0} s later this process is still inside a provider call that has not \
         returned (libfabric 1.x shm spins forever on a queue lock a dead peer held)",
        live.first_gone().unwrap_or(why),
        grace.as_secs_f64()
    )
}

/// A [`Watchdog::Warn`]'s line: which session it abandons, and why.
fn abandoned(label: Option<&str>, what: &str) -> String {
    match label {
        Some(l) => format!("rdma-bench: session abandoned ({l}): {what}"),
        None => format!("rdma-bench: session abandoned: {what}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 0 shares one flag over every rank's connection: when a killed rank's failure
    /// makes another rank leave, the watchdog names the killed rank, whichever connection's
    /// watchdog fires first (the kill soak's "exit 1 without naming" the killed rank).
    #[test]
    fn the_watchdog_names_the_first_peer_gone() {
        let live = Liveness::default();
        assert!(stuck(&live, "rank 2 is gone", READ_TICK).starts_with("rank 2 is gone;"));
        live.mark_gone("rank 3 is gone (the control connection closed)");
        live.mark_gone("rank 2 is gone (the control connection closed)");
        let m = stuck(
            &live.clone(),
            "rank 2 is gone (the control connection closed)",
            READ_TICK,
        );
        assert!(m.starts_with("rank 3 is gone"), "{m}");
    }

    /// A server serves several sessions: the watchdog's line says which one it abandoned, in
    /// the words of the server's other lines for it.
    #[test]
    fn an_abandoned_session_is_named() {
        let l = abandoned(Some("session 3 from 127.0.0.1:5000"), "the peer is gone");
        assert!(
            l.contains("session abandoned (session 3 from 127.0.0.1:5000): the peer is gone"),
            "{l}"
        );
    }

    /// A peer's death arms the watchdog with its grace; the end of a session, after either
    /// side said `Bye`, with the teardown's: a client whose teardown outlasts the server's by
    /// 2 s was ended with exit 1 before it printed its results.
    #[test]
    fn an_orderly_close_gives_the_teardown_its_grace() {
        let w = Some(Watchdog::Exit(Duration::from_secs(2)));
        let closed = || Event::Gone(Error::PeerGone("the control connection closed".into()));
        let died = verdict(&closed(), false, "the server", w, TEARDOWN_GRACE);
        assert_eq!(
            died.why.as_deref(),
            Some("the server is gone (the control connection closed)")
        );
        assert!(died.gone);
        assert_eq!(died.watch, w);
        let ended = verdict(&closed(), true, "the server", w, TEARDOWN_GRACE);
        assert_eq!(
            ended,
            Verdict {
                why: None,
                gone: true,
                watch: Some(Watchdog::Exit(TEARDOWN_GRACE)),
            }
        );
        // A teardown that asked for longer (a rank with many links) gets it.
        let ninety = Duration::from_secs(90);
        assert_eq!(
            verdict(&closed(), true, "x", w, ninety).watch,
            Some(Watchdog::Exit(ninety))
        );
        // A grace already longer stays.
        let long = Some(Watchdog::Warn(Duration::from_secs(60)));
        assert_eq!(
            verdict(&closed(), true, "x", long, TEARDOWN_GRACE).watch,
            long
        );
        // Messages: only Abort and Error are fatal, Bye or not.
        let bye = verdict(&Event::Msg(Msg::Bye), false, "x", w, TEARDOWN_GRACE);
        assert_eq!((bye.why, bye.gone, bye.watch), (None, false, None));
        let err = Event::Msg(Msg::Error {
            message: "no".into(),
        });
        let failed = verdict(&err, true, "rank 2", w, TEARDOWN_GRACE);
        assert_eq!(failed.why.as_deref(), Some("rank 2 failed: no"));
        assert_eq!(failed.watch, w);
    }

    /// The same over a real connection: this side's `Bye` makes the peer's close orderly.
    #[test]
    fn a_close_after_this_sides_bye_is_the_sessions_end() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut ctrl = Ctrl::new(a).unwrap();
        let live = ctrl.liveness();
        ctrl.send(&Msg::Bye).unwrap();
        drop(b);
        let start = std::time::Instant::now();
        while !live.gone() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(live.gone(), "the close was not seen");
        assert_eq!(live.first_gone(), None, "an orderly end named as a failure");
        assert!(matches!(
            ctrl.recv(Duration::from_secs(1), "x"),
            Err(Error::PeerGone(_))
        ));
    }

    /// This side failed with its peer still connected (a stopped peer): `watch_teardown`
    /// arms the watchdog, which acts where the data path is still busy after the grace (an
    /// endpoint close that does not return), and not where it went idle or the connection
    /// was dropped.
    #[test]
    fn a_teardown_after_this_sides_failure_is_watched() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_b, _) = l.accept().unwrap();
        let opts = |live| CtrlOpts {
            watchdog: Some(Watchdog::Warn(Duration::from_millis(20))),
            live: Some(live),
            ..CtrlOpts::default()
        };
        let wait = |live: &Liveness| {
            let start = std::time::Instant::now();
            while !live.abandoned() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        // Still busy (the close hangs): abandoned.
        let live = Liveness::default();
        let ctrl = Ctrl::with(a.try_clone().unwrap(), opts(live.clone())).unwrap();
        let busy = live.busy();
        ctrl.watch_teardown_after("this side failed", Duration::from_millis(50));
        wait(&live);
        assert!(live.abandoned(), "a close that hangs was not caught");
        drop(busy);
        drop(ctrl);
        // Idle by the grace's end (the close returned): nothing.
        let live = Liveness::default();
        let ctrl = Ctrl::with(a, opts(live.clone())).unwrap();
        let busy = live.busy();
        // A grace a loaded box cannot outlast between the two lines (300 ms could be).
        ctrl.watch_teardown_after("this side failed", Duration::from_secs(2));
        drop(busy);
        std::thread::sleep(Duration::from_millis(2500));
        assert!(!live.abandoned(), "a close that returned was abandoned");
        drop(ctrl);
    }

    /// A side that asks for a longer teardown (`watch_teardown_after`) gets it from every
    /// connection on its flag: rank 0's other ranks' orderly ends arm no shorter watch.
    #[test]
    fn a_longer_teardown_grace_holds_for_the_whole_flag() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_b, _) = l.accept().unwrap();
        let live = Liveness::default();
        let ctrl = Ctrl::with(
            a,
            CtrlOpts {
                watchdog: Some(Watchdog::Exit(Duration::from_secs(2))),
                live: Some(live.clone()),
                ..CtrlOpts::default()
            },
        )
        .unwrap();
        assert_eq!(live.teardown_grace(), TEARDOWN_GRACE);
        ctrl.watch_teardown_after("many links", Duration::from_secs(90));
        assert_eq!(live.clone().teardown_grace(), Duration::from_secs(90));
        drop(ctrl);
    }

    #[test]
    fn watchdog_acts_only_on_a_busy_data_path() {
        let w = Watchdog::Warn(Duration::from_millis(50));
        let live = Liveness::default();
        let stop = AtomicBool::new(false);
        assert!(
            !watch(&live, &stop, w, "x", None),
            "idle data path: nothing to do"
        );
        let busy = live.busy();
        let inner = live.busy();
        drop(inner);
        assert!(!live.abandoned());
        assert!(
            watch(&live, &stop, w, "x", None),
            "busy after the grace period (guards nest): report"
        );
        assert!(
            live.abandoned(),
            "a server must know it cannot wait for this session"
        );
        stop.store(true, Ordering::Relaxed);
        assert!(
            !watch(&live, &stop, w, "x", None),
            "the session closed normally"
        );
        drop(busy);
        assert!(!live.is_busy());
    }
}
