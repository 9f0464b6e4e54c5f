//! Both sides of a loopback in one process: neither closes its endpoints while the other may
//! still use them.
//!
//! libfabric's shm maps a peer's region once per process, so an endpoint that closes while
//! the other side's thread in the same process is still posting to it unmaps the queue that
//! thread is in (a SIGSEGV in `pthread_spin_lock`, seen with `loopback --idle-timeout 0.001`).
//! Separate processes keep their own mappings, so only a loopback needs this: its two
//! `Side`s share one [`TeardownGate`] (`SideCfg::teardown`),
//! and each waits at it, bounded, before it closes anything.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A gate the sides that opened endpoints arrive at before any of them closes them.
#[derive(Debug, Default)]
pub struct TeardownGate {
    /// (sides that opened their endpoints, sides at their teardown)
    count: Mutex<(u32, u32)>,
    all: Condvar,
}

impl TeardownGate {
    fn join(&self) {
        if let Ok(mut c) = self.count.lock() {
            c.0 += 1;
        }
    }

    /// Arrive, and wait until every side that joined has, or `bound` passes; whether every
    /// one had. A side that never opened its endpoints (it failed before) is not waited for.
    pub(crate) fn arrive(&self, bound: Duration) -> bool {
        let Ok(mut c) = self.count.lock() else {
            return false;
        };
        c.1 += 1;
        self.all.notify_all();
        let end = Instant::now() + bound;
        while c.1 < c.0 {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            c = match self.all.wait_timeout(c, left) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
        true
    }
}

/// Held by a `Side` ahead of its endpoints: joins the gate when the side
/// opens, arrives at it when the side drops, before the endpoints close.
#[derive(Debug, Default)]
pub(crate) struct AtTeardown {
    gate: Option<(Arc<TeardownGate>, Duration)>,
}

impl AtTeardown {
    /// Join `gate` (where there is one); wait at most `bound` for the others at the drop.
    pub(crate) fn join(gate: Option<&Arc<TeardownGate>>, bound: Duration) -> Self {
        if let Some(g) = gate {
            g.join();
        }
        AtTeardown {
            gate: gate.map(|g| (g.clone(), bound)),
        }
    }
}

impl Drop for AtTeardown {
    fn drop(&mut self) {
        if let Some((g, bound)) = self.gate.take() {
            // Past the bound the other side is stuck in a call of its own; closing is then
            // the lesser risk than never ending.
            let _ = g.arrive(bound);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn both_sides_go_on_together_or_at_the_bound() {
        let bound = Duration::from_secs(10);
        let g = Arc::new(TeardownGate::default());
        let a = AtTeardown::join(Some(&g), bound);
        let b = AtTeardown::join(Some(&g), bound);
        let t0 = Instant::now();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(b);
        });
        drop(a);
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "went on before the other side"
        );
        late.join().unwrap();
        // A side that never opened is not waited for; one that opened and hangs, at most
        // the bound.
        let g = Arc::new(TeardownGate::default());
        let t0 = Instant::now();
        drop(AtTeardown::join(Some(&g), bound));
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "waited for a side that never opened"
        );
        let g = Arc::new(TeardownGate::default());
        let _stuck = AtTeardown::join(Some(&g), bound);
        let t0 = Instant::now();
        drop(AtTeardown::join(Some(&g), Duration::from_millis(200)));
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the bound was not kept"
        );
    }
}
