//! Bounded waits: every wait in this project has a timeout.

use std::time::{Duration, Instant};

use crate::{Completion, Error, Result, Transport};

/// Poll `t` until `done` returns true for the completions seen so far, or `timeout` passes.
///
/// `done` is called once per completion; an `Err` from it stops the wait.
pub fn wait_for<T: Transport>(
    t: &mut T,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&Completion) -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut buf: [Completion; 16] = Default::default();
    loop {
        let n = t.poll(&mut buf)?;
        for c in &buf[..n] {
            if done(c)? {
                return Ok(());
            }
        }
        if n == 0 {
            if start.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
            std::hint::spin_loop();
        }
    }
}

/// Poll two endpoints in turn until `done` returns true, or `timeout` passes.
///
/// Progress is manual on every backend, so a transfer between two endpoints driven from one
/// thread must poll both. `done` gets the side (0 or 1) and the completion.
pub fn wait_pair<A: Transport, B: Transport>(
    a: &mut A,
    b: &mut B,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(usize, &Completion) -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut buf: [Completion; 16] = Default::default();
    loop {
        let mut seen = 0;
        let n = a.poll(&mut buf)?;
        seen += n;
        for c in &buf[..n] {
            if done(0, c)? {
                return Ok(());
            }
        }
        let n = b.poll(&mut buf)?;
        seen += n;
        for c in &buf[..n] {
            if done(1, c)? {
                return Ok(());
            }
        }
        if seen == 0 && start.elapsed() > timeout {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
    }
}
