//! Rank 0's side of the rendezvous ([`Hub`]): it listens, accepts and checks every other
//! rank's join, routes endpoints between them, and keeps the job's first failure, told to every
//! rank at once.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::launch::Rendezvous;
use bench_core::ctrl::{Ctrl, CtrlOpts, Liveness, Watchdog, IO_TIMEOUT};
use bench_core::error::{Error, Result, TransportContext};
use bench_core::proto::{self, Frame, Join, LinkWire, Links, Msg};

/// How long rank 0 keeps answering late ranks after the rendezvous failed.
const LINGER: Duration = Duration::from_secs(10);

/// The rendezvous failed: tell ranks that connect late, so they exit at once instead of
/// waiting for a rank 0 that is gone.
fn linger(listener: &TcpListener, mut left: usize, for_: Duration, why: &str) {
    let start = Instant::now();
    while left > 0 && start.elapsed() < for_ {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = read_one(&mut s, Duration::from_secs(1), "its join message");
                let _ = proto::write_msg(
                    &mut s,
                    &Msg::Error {
                        message: format!("the job failed at the rendezvous: {why}"),
                    },
                );
                left -= 1;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The ranks not yet joined.
fn missing(joined: &[bool]) -> Vec<usize> {
    (0..joined.len()).filter(|&r| !joined[r]).collect()
}

/// `rank 2`, `ranks 1 and 2`, `ranks 1, 2 and 5`: every message names a rank as "rank N".
pub fn rank_list(ranks: &[usize]) -> String {
    match ranks {
        [] => "no rank".into(),
        [r] => format!("rank {r}"),
        [init @ .., last] => format!(
            "ranks {} and {last}",
            init.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Who a rank is, as rank 0 saw it join.
#[derive(Clone, Debug)]
pub struct Member {
    pub rank: u32,
    pub host: String,
    pub local_rank: u32,
    pub pid: u32,
}

type Writers = Arc<Mutex<Vec<Option<TcpStream>>>>;
type Failure = Arc<Mutex<Option<(u32, String)>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Send `msg` to every rank but `except` (errors ignored: the job is ending).
pub(super) fn broadcast(writers: &Writers, except: Option<u32>, msg: &Msg) {
    let mut w = lock(writers);
    for (r, s) in w.iter_mut().enumerate() {
        if Some(r as u32) == except {
            continue;
        }
        if let Some(s) = s {
            let _ = proto::write_msg(s, msg);
        }
    }
}

/// Record the first failure of the job and tell every other rank; false when the job had
/// already failed.
///
/// The failure is visible ([`check`]) only once every rank has been told: rank 0's main
/// thread, which learns of it there, may end the process at once.
pub(super) fn fail_job(writers: &Writers, failed: &Failure, rank: u32, message: String) -> bool {
    let mut f = lock(failed);
    if f.is_some() {
        return false;
    }
    broadcast(
        writers,
        Some(rank),
        &Msg::Abort {
            rank,
            message: message.clone(),
        },
    );
    *f = Some((rank, message));
    true
}

/// The job's first failure, as an error.
fn check(failed: &Failure) -> Result<()> {
    if let Some((rank, message)) = lock(failed).clone() {
        return Err(Error::RankFailed { rank, message });
    }
    Ok(())
}

/// Rank 0's side: a control connection per rank.
pub struct Hub {
    pub(super) ctrls: Vec<Option<Ctrl>>,
    pub(super) writers: Writers,
    pub(super) live: Liveness,
    pub(super) failed: Failure,
    /// Every rank reached the last barrier: each has sent its results, so a rank that dies
    /// now fails nothing.
    pub(super) complete: Arc<AtomicBool>,
    pub members: Vec<Member>,
}

/// Listen where the other ranks will look for rank 0: the rendezvous address where it is
/// this machine's, else every interface on its port.
pub fn listen(rdv: &Rendezvous) -> Result<TcpListener> {
    let addrs: Vec<SocketAddr> = (rdv.host.as_str(), rdv.port)
        .to_socket_addrs()
        .map_err(|e| {
            Error::Usage(format!(
                "rendezvous {rdv} (from {}): cannot resolve {}: {e}",
                rdv.from, rdv.host
            ))
        })?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpListener::bind(a) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    // The name may resolve to an address of another interface (or a NAT): any interface.
    match TcpListener::bind(("0.0.0.0", rdv.port)) {
        Ok(l) => Ok(l),
        Err(e) => Err(Error::Io {
            what: format!(
                "rank 0 listening on {rdv} (from {}){}; is another job using the port? pick \
                 one with --rendezvous HOST:PORT or MASTER_PORT",
                rdv.from,
                last.map(|l| format!(" ({l})")).unwrap_or_default()
            ),
            source: e,
        }),
    }
}

/// Read one message from a stream that has no reader thread yet, within `timeout`.
fn read_one(s: &mut TcpStream, timeout: Duration, what: &str) -> Result<Msg> {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .ctx(|| "setting a read timeout")?;
    let start = Instant::now();
    match proto::read_frame(s, IO_TIMEOUT, || start.elapsed() < timeout)? {
        Frame::Msg(m) => Ok(m),
        Frame::Eof => Err(Error::PeerGone(format!("closed before sending {what}"))),
        Frame::Idle => Err(Error::Timeout {
            what: what.to_string(),
            after: timeout,
        }),
    }
}

/// Differences between two ranks' options, as `name: rank 0 has X, it has Y`.
fn spec_diff(mine: &proto::RankSpec, theirs: &proto::RankSpec) -> Vec<String> {
    let (a, b) = (
        serde_json::to_value(mine).unwrap_or_default(),
        serde_json::to_value(theirs).unwrap_or_default(),
    );
    let mut out = Vec::new();
    json_diff("", &a, &b, &mut out);
    out
}

fn json_diff(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    if out.len() >= 8 || a == b {
        return;
    }
    let name = |k: &str| match k {
        "build" => "rdma-bench version".to_string(),
        k if path.is_empty() => k.to_string(),
        k => format!("{path}.{k}"),
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                json_diff(&name(k), va, y.get(k).unwrap_or(&Value::Null), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                json_diff(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        (Value::Array(x), Value::Array(y)) => out.push(format!(
            "{path}: rank 0 has {} entries, it has {}",
            x.len(),
            y.len()
        )),
        _ => out.push(format!("{path}: rank 0 has {a}, it has {b}")),
    }
}

/// The peer end of each of `mine`'s links, from every rank's announced links.
pub(super) fn route(
    rank: u32,
    mine: &[LinkWire],
    all: &HashMap<u32, Links>,
) -> Result<Vec<LinkWire>> {
    let mut out = Vec::with_capacity(mine.len());
    for l in mine {
        let other = all
            .get(&l.peer)
            .and_then(|p| {
                p.links
                    .iter()
                    .find(|k| k.peer == rank && k.nic == l.nic && k.send != l.send)
            })
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "rank {} announced no {} endpoint for rank {rank} on NIC {}",
                    l.peer,
                    if l.send { "receiving" } else { "sending" },
                    l.nic
                ))
            })?;
        let mut w = other.clone();
        w.peer = l.peer;
        out.push(w);
    }
    Ok(out)
}

impl Hub {
    /// Accept every other rank's `Join` and check it against this rank's.
    pub fn accept(
        listener: &TcpListener,
        me: &Join,
        timeout: Duration,
        grace: Duration,
    ) -> Result<Hub> {
        let world = me.world;
        let mut hub = Hub {
            ctrls: (0..world).map(|_| None).collect(),
            writers: Arc::new(Mutex::new((0..world).map(|_| None).collect())),
            live: Liveness::default(),
            failed: Arc::new(Mutex::new(None)),
            complete: Arc::new(AtomicBool::new(false)),
            members: vec![Member {
                rank: 0,
                host: me.host.clone(),
                local_rank: me.local_rank,
                pid: me.pid,
            }],
        };
        match hub.accept_all(listener, me, timeout, grace) {
            Ok(()) => Ok(hub),
            Err(e) => {
                let msg = format!("rank 0: {e}");
                let _ = fail_job(&hub.writers, &hub.failed, 0, msg.clone());
                let joined = hub.members.len();
                linger(listener, world as usize - joined, timeout.min(LINGER), &msg);
                Err(e)
            }
        }
    }

    fn accept_all(
        &mut self,
        listener: &TcpListener,
        me: &Join,
        timeout: Duration,
        grace: Duration,
    ) -> Result<()> {
        listener
            .set_nonblocking(true)
            .ctx(|| "making the rendezvous listener non-blocking")?;
        let start = Instant::now();
        let world = me.world;
        let mut joined = vec![false; world as usize];
        joined[0] = true;
        while joined.iter().any(|j| !j) {
            self.check_failed()?;
            // Every turn, not only when no one connects: connections that never say who they
            // are (a port scanner, a rank restarted in a loop) must not hold rank 0 here.
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: format!(
                        "{} of {world} to join at the rendezvous; were all ranks started, \
                         with the same rendezvous address?",
                        rank_list(&missing(&joined))
                    ),
                    after: timeout,
                });
            }
            let (mut s, from) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => {
                    return Err(Error::Io {
                        what: "accepting a rank".into(),
                        source: e,
                    })
                }
            };
            s.set_nonblocking(false)
                .ctx(|| "configuring a rank's connection")?;
            let left = timeout.saturating_sub(start.elapsed());
            let join = match read_one(&mut s, IO_TIMEOUT.min(left), "its join message") {
                Ok(Msg::Join(j)) => j,
                Ok(m) => {
                    let e = format!("a rank connecting from {from} sent {} first", m.kind());
                    let _ = proto::write_msg(&mut s, &Msg::Error { message: e.clone() });
                    return Err(Error::Protocol(e));
                }
                // Gone before it said who it is (a rank killed as it connected): nothing
                // to name yet. Its rank stays missing, and the rendezvous timeout names it.
                Err(e @ (Error::PeerGone(_) | Error::Io { .. } | Error::Timeout { .. })) => {
                    eprintln!(
                        "rdma-bench: rank 0: a connection from {from} ended before its join \
                         message ({e}); still waiting for {}",
                        rank_list(&missing(&joined))
                    );
                    continue;
                }
                Err(e) => {
                    let _ = proto::write_msg(
                        &mut s,
                        &Msg::Error {
                            message: format!("rank 0 refused this rank: {e}"),
                        },
                    );
                    return Err(Error::Protocol(format!(
                        "a rank connecting from {from} was refused: {e}"
                    )));
                }
            };
            let refuse = |s: &mut TcpStream, why: String| -> Error {
                let _ = proto::write_msg(
                    s,
                    &Msg::Error {
                        message: format!("rank 0 refused rank {}: {why}", join.rank),
                    },
                );
                Error::Protocol(format!(
                    "rank {} (on {}, pid {}) was refused: {why}",
                    join.rank, join.host, join.pid
                ))
            };
            if join.world != world {
                let why = format!(
                    "it belongs to a job of {} ranks, rank 0 to one of {world}",
                    join.world
                );
                return Err(refuse(&mut s, why));
            }
            if joined[join.rank as usize] {
                let why = format!("rank {} joined twice; check the launcher", join.rank);
                return Err(refuse(&mut s, why));
            }
            let diff = spec_diff(&me.spec, &join.spec);
            if !diff.is_empty() {
                let why = format!(
                    "it was started with other options: {}; start every rank with the same \
                     rdma-bench and flags",
                    diff.join("; ")
                );
                return Err(refuse(&mut s, why));
            }
            let r = join.rank;
            let wr = s.try_clone().ctx(|| "cloning a rank's connection")?;
            let (writers, failed) = (self.writers.clone(), self.failed.clone());
            let complete = self.complete.clone();
            let ctrl = Ctrl::with(
                s,
                CtrlOpts {
                    watchdog: Some(Watchdog::Exit(grace)),
                    live: Some(self.live.clone()),
                    on_gone: Some(Box::new(move |why: &str| {
                        if complete.load(Ordering::Acquire) {
                            eprintln!(
                                "rdma-bench: rank 0: {why}, after the last barrier: the job's \
                                 results are complete"
                            );
                        } else if fail_job(&writers, &failed, r, why.to_string()) {
                            eprintln!("rdma-bench: rank 0: {why}; aborting the job");
                        }
                    })),
                    name: Some(format!("rank {r} (on {}, pid {})", join.host, join.pid)),
                    ..CtrlOpts::default()
                },
            )?;
            lock(&self.writers)[r as usize] = Some(wr);
            // Another rank may have died while this one was joining, its Abort broadcast
            // before this rank could be written to: tell it now (twice is harmless).
            // fail_job holds `failed` until its broadcast is done, so this sees either a
            // failure already broadcast or one whose broadcast includes this rank.
            if let Some((rank, message)) = lock(&self.failed).clone() {
                let _ = self.send(r, &Msg::Abort { rank, message });
            }
            self.ctrls[r as usize] = Some(ctrl);
            self.members.push(Member {
                rank: r,
                host: join.host.clone(),
                local_rank: join.local_rank,
                pid: join.pid,
            });
            joined[r as usize] = true;
        }
        self.members.sort_by_key(|m| m.rank);
        Ok(())
    }

    pub(super) fn send(&self, rank: u32, msg: &Msg) -> Result<()> {
        let mut w = lock(&self.writers);
        match w.get_mut(rank as usize).and_then(|s| s.as_mut()) {
            Some(s) => proto::write_msg(s, msg),
            None => Err(Error::Protocol(format!("rank {rank} is not connected"))),
        }
    }

    pub(super) fn check_failed(&self) -> Result<()> {
        check(&self.failed)
    }

    /// Wait until every other rank sent what `want` accepts, polling (`poll`) meanwhile.
    pub(super) fn collect<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        mut want: impl FnMut(u32, Msg) -> Result<Option<T>>,
        poll: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<(u32, T)>> {
        let start = Instant::now();
        let n = self.ctrls.len();
        let mut got: Vec<Option<T>> = (0..n).map(|_| None).collect();
        let mut have = 1;
        while have < n {
            poll()?;
            self.check_failed()?;
            let failed = &self.failed;
            for (r, (slot, c)) in got.iter_mut().zip(self.ctrls.iter_mut()).enumerate() {
                let Some(c) = c.as_mut().filter(|_| slot.is_none()) else {
                    continue;
                };
                match c.try_recv() {
                    Ok(Some(m)) => {
                        if let Some(v) = want(r as u32, m)? {
                            *slot = Some(v);
                            have += 1;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // The reader's hook has recorded it (or will in a moment).
                        std::thread::sleep(Duration::from_millis(50));
                        check(failed)?;
                        return Err(Error::RankFailed {
                            rank: r as u32,
                            message: e.to_string(),
                        });
                    }
                }
            }
            if start.elapsed() > timeout {
                let missing: Vec<usize> = (1..n).filter(|&r| got[r].is_none()).collect();
                return Err(Error::Timeout {
                    what: format!("{} to {what}", rank_list(&missing)),
                    after: timeout,
                });
            }
            std::thread::yield_now();
        }
        Ok(got
            .into_iter()
            .enumerate()
            .filter_map(|(r, v)| v.map(|v| (r as u32, v)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(peer: u32, nic: u32, send: bool) -> LinkWire {
        LinkWire {
            peer,
            nic,
            send,
            name: "x".into(),
            addr: vec![peer as u8, nic as u8, send as u8],
            mr: (!send).then_some(transport_core::RemoteMr {
                addr: 64,
                len: 64,
                key: transport_core::KeyBytes::from_u64(1),
            }),
            max_write_size: 0,
        }
    }

    #[test]
    fn routing_pairs_each_sender_with_its_receiver() {
        let mut all = HashMap::new();
        // Incast of 3 ranks, one NIC: 1 and 2 send to 0.
        all.insert(
            0,
            Links {
                rank: 0,
                links: vec![link(1, 0, false), link(2, 0, false)],
            },
        );
        all.insert(
            1,
            Links {
                rank: 1,
                links: vec![link(0, 0, true)],
            },
        );
        all.insert(
            2,
            Links {
                rank: 2,
                links: vec![link(0, 0, true)],
            },
        );
        let r1 = route(1, &all[&1].links, &all).unwrap();
        assert_eq!(
            r1[0].addr,
            vec![1, 0, 0],
            "rank 1 writes to 0's receiver for 1"
        );
        assert!(r1[0].mr.is_some());
        let r0 = route(0, &all[&0].links, &all).unwrap();
        assert_eq!(r0[1].addr, vec![0, 0, 1]);
        assert_eq!(r0[1].peer, 2);
        all.get_mut(&2).unwrap().links.clear();
        assert!(route(0, &all[&0].links, &all)
            .unwrap_err()
            .to_string()
            .contains("rank 2"));
    }

    /// Connections that never say who they are, one after another past the deadline (a
    /// port scanner, a rank restarted in a loop), do not keep rank 0 waiting: the rendezvous
    /// times out on time and names the rank still missing.
    #[test]
    fn silent_connections_do_not_hold_the_rendezvous_past_its_timeout() {
        use bench_core::config::{MemKind, Pattern, Workload};
        use bench_core::proto::{RankSpec, MAGIC, VERSION};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let me = Join {
            magic: MAGIC.into(),
            version: VERSION,
            rank: 0,
            world: 2,
            local_rank: 0,
            host: "h".into(),
            pid: 1,
            spec: RankSpec {
                build: "b".into(),
                backend: "x".into(),
                provider: "x".into(),
                pattern: Pattern::Pairwise,
                workload: Workload::Write,
                gpus: 1,
                nics_per_gpu: 1,
                mem: MemKind::Host,
                seed: 0,
                verify: false,
                runs: Vec::new(),
            },
        };
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let scanner = std::thread::spawn(move || {
            let (mut held, t0) = (Vec::new(), Instant::now());
            while !s2.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(15) {
                if let Ok(c) = std::net::TcpStream::connect(addr) {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let start = Instant::now();
        let r = Hub::accept(
            &listener,
            &me,
            Duration::from_millis(500),
            Duration::from_secs(1),
        );
        let took = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        scanner.join().unwrap();
        let e = r.err().expect("a timeout").to_string();
        assert!(e.contains("rank 1"), "{e}");
        assert!(took < Duration::from_secs(10), "took {took:?}");
    }

    #[test]
    fn rank_lists_always_say_rank_n() {
        assert_eq!(rank_list(&[2]), "rank 2");
        assert_eq!(rank_list(&[1, 2]), "ranks 1 and 2");
        assert_eq!(rank_list(&[1, 2, 5]), "ranks 1, 2 and 5");
        assert_eq!(missing(&[true, false, true, false]), vec![1, 3]);
    }
}
