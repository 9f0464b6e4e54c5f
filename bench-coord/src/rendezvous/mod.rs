//! The meeting point of `rdma-bench run`: every rank keeps one control connection to rank 0
//! (the versioned protocol of [`bench_core::proto`], over [`Ctrl`](bench_core::ctrl::Ctrl)).
//!
//! Rank 0 ([`Hub`]) accepts the other ranks, checks that each was started with the same
//! version and options, routes endpoint addresses and regions between them, releases
//! barriers and collects results. When a rank dies (its connection closes without `Bye`) or
//! fails (it sends `Error`), the connection's reader thread tells every other rank at once
//! with `Abort`, naming the rank; the data path of every rank sees its liveness flag drop, and
//! the control-connection watchdog ends a rank stuck inside a provider call.
//!
//! `hub.rs` is rank 0's side, `leaf.rs` another rank's; [`Coord`], here, is either, and what
//! the job does over them (exchange endpoints, barriers, results, failure, the end).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bench_core::ctrl::{Liveness, IO_TIMEOUT};
use bench_core::error::{Error, Result};
use bench_core::proto::{LinkWire, Links, Msg, RankDone};

mod hub;
mod leaf;

use hub::{broadcast, fail_job, route};
pub use hub::{listen, rank_list, Hub, Member};
pub use leaf::Leaf;

/// How long a rank waits for an abort after its own data path failed (the failure may be a
/// consequence of another rank dying; the job should name that rank).
const BLAME_WAIT: Duration = Duration::from_secs(1);

/// Either side.
pub enum Coord {
    Root(Hub),
    Leaf(Leaf),
}

fn unexpected(what: &str, m: &Msg) -> Error {
    Error::Protocol(format!("expected {what}, got {}", m.kind()))
}

impl Coord {
    /// Every rank's endpoints to rank 0; back to each rank the peer ends of its own.
    pub fn exchange(&mut self, mine: Links, timeout: Duration) -> Result<Vec<LinkWire>> {
        match self {
            Coord::Root(h) => {
                let rest = h.collect(
                    timeout,
                    "send their endpoints",
                    |r, m| match m {
                        Msg::Links(l) if l.rank == r => Ok(Some(l)),
                        m => Err(Error::Protocol(format!(
                            "rank {r}: expected its endpoints, got {}",
                            m.kind()
                        ))),
                    },
                    &mut || Ok(()),
                )?;
                let world = h.ctrls.len() as u32;
                let mut all: HashMap<u32, Links> = rest.into_iter().collect();
                all.insert(0, mine);
                for r in 1..world {
                    let routed = route(r, &all[&r].links, &all)?;
                    h.send(
                        r,
                        &Msg::Links(Links {
                            rank: r,
                            links: routed,
                        }),
                    )?;
                }
                route(0, &all[&0].links, &all)
            }
            Coord::Leaf(l) => {
                l.ctrl.send(&Msg::Links(mine.clone()))?;
                let m = l.recv(timeout, "the peers' endpoints from rank 0")?;
                let Msg::Links(got) = m else {
                    return Err(unexpected("the peers' endpoints", &m));
                };
                if got.rank != l.rank
                    || got.links.len() != mine.links.len()
                    || got
                        .links
                        .iter()
                        .zip(&mine.links)
                        .any(|(a, b)| a.peer != b.peer || a.nic != b.nic || a.send == b.send)
                {
                    return Err(Error::Protocol(
                        "rank 0 answered with endpoints that do not match this rank's".into(),
                    ));
                }
                Ok(got.links)
            }
        }
    }

    /// The flag the data path watches: rank 0's connection (a rank), any rank's (rank 0).
    pub fn liveness(&self) -> Liveness {
        match self {
            Coord::Root(h) => h.live.clone(),
            Coord::Leaf(l) => l.ctrl.liveness(),
        }
    }

    /// This rank is about to close its links (the job is done, or failed with its peers
    /// still connected): arm the watchdog now, with at least `grace`, so a close that waits
    /// forever on a peer that stopped ends the rank instead of hanging it (see
    /// [`Ctrl::watch_teardown_after`](bench_core::ctrl::Ctrl::watch_teardown_after)).
    pub fn watch_teardown(&self, why: &str, grace: Duration) {
        match self {
            Coord::Root(h) => {
                // Every rank's connection shares rank 0's liveness: one watch covers them.
                if let Some(c) = h.ctrls.iter().flatten().next() {
                    c.watch_teardown_after(why, grace);
                }
            }
            Coord::Leaf(l) => l.ctrl.watch_teardown_after(why, grace),
        }
    }

    /// Every rank waits here until all have arrived at barrier `id`.
    pub fn barrier(
        &mut self,
        id: u32,
        timeout: Duration,
        poll: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.barrier_inner(id, timeout, poll, false)
    }

    fn barrier_inner(
        &mut self,
        id: u32,
        timeout: Duration,
        poll: &mut dyn FnMut() -> Result<()>,
        last: bool,
    ) -> Result<()> {
        match self {
            Coord::Root(h) => {
                h.collect(
                    timeout,
                    &format!("reach barrier {id}"),
                    |r, m| match m {
                        Msg::Barrier { id: got } if got == id => Ok(Some(())),
                        m => Err(Error::Protocol(format!(
                            "rank {r}: expected barrier {id}, got {}",
                            m.kind()
                        ))),
                    },
                    poll,
                )?;
                if last {
                    h.complete.store(true, Ordering::Release);
                }
                broadcast(&h.writers, None, &Msg::Barrier { id });
                Ok(())
            }
            Coord::Leaf(l) => {
                l.ctrl.send(&Msg::Barrier { id })?;
                match l.recv_polling(timeout, &format!("barrier {id}"), poll)? {
                    Msg::Barrier { id: got } if got == id => Ok(()),
                    m => Err(unexpected(&format!("barrier {id}"), &m)),
                }
            }
        }
    }

    /// Rank 0 gets every rank's result (its own first); the others send theirs.
    pub fn gather(
        &mut self,
        mine: RankDone,
        timeout: Duration,
        poll: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Option<Vec<RankDone>>> {
        match self {
            Coord::Root(h) => {
                let id = mine.id;
                let rest = h.collect(
                    timeout,
                    &format!("send their results of run {id}"),
                    |r, m| match m {
                        Msg::RankDone(d) if d.rank == r && d.id == id => Ok(Some(d)),
                        m => Err(Error::Protocol(format!(
                            "rank {r}: expected its result of run {id}, got {}",
                            m.kind()
                        ))),
                    },
                    poll,
                )?;
                let mut all = vec![mine];
                all.extend(rest.into_iter().map(|(_, d)| d));
                Ok(Some(all))
            }
            Coord::Leaf(l) => {
                l.ctrl.send(&Msg::RankDone(mine))?;
                Ok(None)
            }
        }
    }

    /// This rank's own failure `e`, or the failure of the rank that caused it: tell the job,
    /// and return the error to print.
    pub fn fail(&mut self, e: Error) -> Error {
        if let Error::RankFailed { .. } = e {
            return e;
        }
        match self {
            Coord::Root(h) => {
                // A dead rank may be why this side failed: give its hook a moment. The data
                // path can see a dead peer (shm answers a WRITE to it with EIO) before the
                // control reader sees its socket close, so wait the whole moment.
                let start = Instant::now();
                while start.elapsed() < BLAME_WAIT {
                    if let Err(f) = h.check_failed() {
                        return f;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                if let Err(f) = h.check_failed() {
                    return f;
                }
                let _ = fail_job(&h.writers, &h.failed, 0, format!("rank 0: {e}"));
                e
            }
            Coord::Leaf(l) => {
                let start = Instant::now();
                loop {
                    match l.ctrl.try_recv() {
                        Ok(Some(Msg::Abort { rank, message })) => {
                            return Error::RankFailed { rank, message }
                        }
                        Ok(Some(_)) => continue,
                        Ok(None) => {}
                        Err(Error::PeerGone(m)) => {
                            return Error::RankFailed {
                                rank: 0,
                                message: format!("rank 0 is gone ({m})"),
                            }
                        }
                        Err(_) => break,
                    }
                    if start.elapsed() > BLAME_WAIT {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                l.ctrl.send_error(&format!("rank {}: {e}", l.rank));
                e
            }
        }
    }

    /// The end of a good job: everyone leaves together (rank 0 last).
    pub fn finish(
        &mut self,
        id: u32,
        timeout: Duration,
        poll: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.barrier_inner(id, timeout, poll, true)?;
        match self {
            Coord::Root(h) => {
                let _ = h.collect(
                    IO_TIMEOUT,
                    "say goodbye",
                    |_, m| match m {
                        Msg::Bye => Ok(Some(())),
                        m => Err(unexpected("bye", &m)),
                    },
                    &mut || Ok(()),
                );
                Ok(())
            }
            Coord::Leaf(l) => {
                // Past the last barrier every rank has sent its results: the job is done,
                // whether or not rank 0 is still there to hear the goodbye.
                let _ = l.ctrl.send(&Msg::Bye);
                Ok(())
            }
        }
    }
}
