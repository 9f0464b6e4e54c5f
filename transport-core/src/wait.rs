//! Bounded waits: every wait in this project has a timeout.

use std::time::{Duration, Instant};

use crate::{Completion, Error, Result, Transport};

/// Poll `t` until `done` returns true for the completions seen so far, or `timeout` passes.
///
/// `done` is called once per completion; an `Err` from it stops the wait. Every completion
/// polled reaches `done`: those that came in the same poll after the one that ended the wait
/// too, so none is taken from the queue unseen.
pub fn wait_for<T: Transport>(
    t: &mut T,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&Completion) -> Result<bool>,
) -> Result<()> {
    wait_with(what, timeout, |buf, _| t.poll(buf), 1, |_, c| done(c))
}

/// Poll two endpoints in turn until `done` returns true, or `timeout` passes.
///
/// Progress is manual on every backend, so a transfer between two endpoints driven from one
/// thread must poll both. `done` gets the side (0 or 1) and the completion: every one polled,
/// as in [`wait_for`].
pub fn wait_pair<A: Transport, B: Transport>(
    a: &mut A,
    b: &mut B,
    what: &str,
    timeout: Duration,
    done: impl FnMut(usize, &Completion) -> Result<bool>,
) -> Result<()> {
    let poll = |buf: &mut [Completion], side| {
        if side == 0 {
            a.poll(buf)
        } else {
            b.poll(buf)
        }
    };
    wait_with(what, timeout, poll, 2, done)
}

/// The loop of both waits: poll each of `sides` in turn, hand `done` every completion. The
/// deadline is checked on every turn, not only on empty ones: a backend that never stops
/// returning completions (one it repeats, a flood of unexpected ones) must still end the wait.
/// The rest of a poll's batch after the completion that ended the wait still goes to `done`
/// (its answer no longer matters): dropped, a completion the caller did not expect (a second
/// one for an operation, say) would pass unseen.
fn wait_with(
    what: &str,
    timeout: Duration,
    mut poll: impl FnMut(&mut [Completion], usize) -> Result<usize>,
    sides: usize,
    mut done: impl FnMut(usize, &Completion) -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut buf: [Completion; 16] = Default::default();
    loop {
        let mut seen = 0;
        for side in 0..sides {
            let n = poll(&mut buf, side)?;
            seen += n;
            let mut finished = false;
            for c in &buf[..n] {
                finished |= done(side, c)?;
            }
            if finished {
                return Ok(());
            }
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        if seen == 0 {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend whose queue never empties (the same completion again and again) still ends
    /// the wait at its deadline.
    #[test]
    fn an_endless_stream_of_completions_times_out() {
        let t0 = Instant::now();
        let poll = |buf: &mut [Completion], _| {
            buf[0] = Completion::default();
            Ok(1)
        };
        let r = wait_with("endless", Duration::from_millis(50), poll, 2, |_, _| {
            Ok(false)
        });
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    /// The completions polled with the one that ends the wait reach `done` too.
    #[test]
    fn the_rest_of_the_batch_is_not_dropped() {
        let mut seen = Vec::new();
        let poll = |buf: &mut [Completion], _| {
            for (i, c) in buf[..3].iter_mut().enumerate() {
                c.ctx = i as u64;
            }
            Ok(3)
        };
        let r = wait_with("three", Duration::from_secs(5), poll, 1, |_, c| {
            seen.push(c.ctx);
            Ok(c.ctx == 0)
        });
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(seen, [0, 1, 2]);
    }

    /// `done` sees each side's completions with its side, and ends the wait.
    #[test]
    fn done_ends_the_wait_with_the_side() {
        let mut sides = Vec::new();
        let poll = |buf: &mut [Completion], side: usize| {
            buf[0] = Completion::default();
            Ok(usize::from(side == 1))
        };
        let r = wait_with("one", Duration::from_secs(5), poll, 2, |s, _| {
            sides.push(s);
            Ok(true)
        });
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(sides, [1]);
    }
}
