//! A watcher's look at a ring's progress, for producers that wait on the ring with no clock of
//! their own ([`Ring::push`] waits for room until the error word is set).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Ring, ERR_STALLED};

/// Commands claimed on a ring (`head`) that the proxy neither consumes (`tail`) nor completes
/// (`done`) for `idle` mean the proxy or its peer stalled: [`StallWatch::check`] then sets
/// [`ERR_STALLED`], and every producer waiting on the ring gives up. Call it from a thread
/// beside the producer, every few milliseconds.
#[derive(Debug)]
pub struct StallWatch {
    idle: Duration,
    seen: (u64, u64),
    since: Instant,
}

impl StallWatch {
    pub fn new(ring: Ring<'_>, idle: Duration) -> Self {
        StallWatch {
            idle,
            seen: progress(ring),
            since: Instant::now(),
        }
    }

    /// Look once; true when the ring stalled (the error word is then set).
    pub fn check(&mut self, ring: Ring<'_>) -> bool {
        let now = progress(ring);
        let waiting = ring.head().load(Ordering::Acquire) > now.1;
        if now != self.seen || !waiting {
            self.seen = now;
            self.since = Instant::now();
            return false;
        }
        if self.since.elapsed() > self.idle {
            ring.set_error(ERR_STALLED);
            return true;
        }
        false
    }
}

/// `(tail, done)`: what the proxy consumed and completed.
fn progress(ring: Ring<'_>) -> (u64, u64) {
    (
        ring.tail().load(Ordering::Acquire),
        ring.done().load(Ordering::Acquire),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Command, RingError, RingLayout, RingMemory};

    /// A producer pushing into a full ring that no proxy drains gives up once the watch
    /// sees no progress for its idle time (it spun for ever).
    #[test]
    fn a_stalled_ring_fails_its_producer() {
        let mem = RingMemory::new(RingLayout::new(2, 1).unwrap());
        let ring = mem.ring();
        // Before the watch: its idle clock starts no earlier, however late this thread runs.
        let start = Instant::now();
        let mut w = StallWatch::new(ring, Duration::from_millis(50));
        assert!(!w.check(ring), "nothing waits: no stall");
        ring.push(&Command::fence()).unwrap();
        ring.push(&Command::fence()).unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| ring.push(&Command::fence()));
            while !w.check(ring) {
                assert!(start.elapsed() < Duration::from_secs(5), "no stall seen");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(start.elapsed() >= Duration::from_millis(50));
            assert_eq!(h.join().unwrap(), Err(RingError::ProxyGone(ERR_STALLED)));
        });
    }

    /// Progress, or nothing waiting, is no stall however long it lasts.
    #[test]
    fn progress_restarts_the_clock() {
        let mem = RingMemory::new(RingLayout::new(4, 1).unwrap());
        let ring = mem.ring();
        // 8 steps of 300 ms: longer than the idle time in all, each check well within it
        // (150 ms of sleep against 1 s, room for a loaded box's late wake-ups).
        let mut w = StallWatch::new(ring, Duration::from_secs(1));
        for p in 0..8u64 {
            ring.push(&Command::fence()).unwrap();
            std::thread::sleep(Duration::from_millis(150));
            assert!(!w.check(ring), "step {p}");
            // The proxy consumes and completes it.
            ring.release(p + 1);
            ring.done().store(p + 1, Ordering::Release);
            std::thread::sleep(Duration::from_millis(150));
            assert!(!w.check(ring), "step {p}");
        }
        // Nothing waiting: even a watch with no patience at all sees no stall.
        let mut w = StallWatch::new(ring, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!w.check(ring), "idle, nothing waiting");
        assert_eq!(ring.error(), crate::ring::ERR_NONE);
    }
}
