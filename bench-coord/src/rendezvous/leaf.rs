//! Another rank's side of the rendezvous ([`Leaf`]): its one connection to rank 0, where an
//! `Abort` from rank 0, or rank 0's connection closing, is the failure of the rank it names.

use std::time::{Duration, Instant};

use crate::launch::Rendezvous;
use bench_core::ctrl::{Ctrl, CtrlOpts, Watchdog};
use bench_core::error::{Error, Result};
use bench_core::proto::{Join, Msg};

/// Another rank's side: its connection to rank 0.
pub struct Leaf {
    pub(super) ctrl: Ctrl,
    pub(super) rank: u32,
}

/// Rank 0's connection closing is rank 0's failure.
fn leaf_err(e: Error) -> Error {
    match e {
        Error::PeerGone(m) => Error::RankFailed {
            rank: 0,
            message: format!("rank 0 is gone ({m})"),
        },
        e => e,
    }
}

impl Leaf {
    /// Connect to rank 0 (retrying until `timeout`) and join.
    pub fn join(rdv: &Rendezvous, me: &Join, timeout: Duration, grace: Duration) -> Result<Leaf> {
        let stream = crate::session::connect(&rdv.to_string(), timeout).map_err(|e| match e {
            Error::Timeout { after, .. } => Error::Timeout {
                what: format!(
                    "rank 0 at {rdv} (from {}); is rank 0 running, and is that its host?",
                    rdv.from
                ),
                after,
            },
            e => e,
        })?;
        let mut ctrl = Ctrl::with(
            stream,
            CtrlOpts {
                watchdog: Some(Watchdog::Exit(grace)),
                name: Some("rank 0".into()),
                ..CtrlOpts::default()
            },
        )?;
        // Rank 0 may die as this rank joins: name it.
        ctrl.send(&Msg::Join(me.clone())).map_err(leaf_err)?;
        Ok(Leaf {
            ctrl,
            rank: me.rank,
        })
    }

    /// The next message; `Abort` becomes the failure of the rank it names.
    pub(super) fn recv(&mut self, timeout: Duration, what: &str) -> Result<Msg> {
        match self.ctrl.recv(timeout, what) {
            Ok(Msg::Abort { rank, message }) => Err(Error::RankFailed { rank, message }),
            Ok(m) => Ok(m),
            Err(e) => Err(leaf_err(e)),
        }
    }

    /// Like `recv`, polling meanwhile.
    pub(super) fn recv_polling(
        &mut self,
        timeout: Duration,
        what: &str,
        poll: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Msg> {
        let start = Instant::now();
        loop {
            poll()?;
            let m = self.ctrl.try_recv().map_err(leaf_err)?;
            match m {
                Some(Msg::Abort { rank, message }) => {
                    return Err(Error::RankFailed { rank, message })
                }
                Some(m) => return Ok(m),
                None => {}
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
            std::thread::yield_now();
        }
    }
}
