//! Regions dropped while their endpoint lives. A provider may still use a region's memory
//! after the call that posted an operation on it returned: a posted receive, or a SEND or
//! WRITE it copies in pieces (shm, tcp and efa copy on the CPU during a later `fi_cq_read`).
//! Freeing the memory then would let the provider write into freed memory, and a region can
//! be dropped from safe code at any time (the trait's slices borrow it only for the post). So
//! a region dropped while its endpoint is open is closed by the endpoint, on the endpoint's
//! own thread (`FI_THREAD_DOMAIN`), once none of its operations is in flight, or when the
//! endpoint closes; a region dropped after its endpoint closes itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The endpoint's graveyard of regions `T` (`Mr`; shared with its regions, which hold it
/// weakly).
pub(crate) struct Grave<T> {
    /// Set while `dead` holds regions: the endpoint's poll reads it, one relaxed load.
    pending: AtomicBool,
    dead: Mutex<Vec<T>>,
}

impl<T> Default for Grave<T> {
    fn default() -> Self {
        Grave {
            pending: AtomicBool::new(false),
            dead: Mutex::new(Vec::new()),
        }
    }
}

impl<T> Grave<T> {
    /// Keep `mr` (dropped by its owner, still registered) until the endpoint lets it go.
    pub(crate) fn bury(&self, mr: T) {
        match self.dead.lock() {
            Ok(mut g) => {
                g.push(mr);
                self.pending.store(true, Ordering::Release);
            }
            // A thread panicked while holding the lock: leak the region rather than free
            // memory the provider may still write.
            Err(_) => std::mem::forget(mr),
        }
    }

    /// Whether regions wait here.
    #[inline(always)]
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Close and free every region here: the caller has no operation in flight, or has
    /// closed its endpoint.
    #[cold]
    pub(crate) fn empty(&self) {
        let dead = match self.dead.lock() {
            Ok(mut g) => {
                self.pending.store(false, Ordering::Relaxed);
                std::mem::take(&mut *g)
            }
            Err(_) => return,
        };
        // Each closes itself now (it holds no grave): fi_close, then its memory.
        drop(dead);
    }

    /// Keep every region here for good: the endpoint could not be closed, so the provider
    /// may still use them.
    #[cold]
    pub(crate) fn leak(&self) {
        if let Ok(mut g) = self.dead.lock() {
            std::mem::forget(std::mem::take(&mut *g));
        }
    }

    /// Regions waiting (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.dead.lock().map(|g| g.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use transport_core::wait::wait_pair;
    use transport_core::{
        CompletionKind, Error, HostBuffer, LocalSlice, Memory, NicDesc, Post, Result, Transport,
    };

    use crate::Endpoint;

    /// A region dropped with a receive posted into it stays registered and allocated until
    /// the receive completed (shm copies the SEND into it during a later poll); deregister
    /// refuses while operations are in flight; once none is, the endpoint's next poll frees
    /// what waited, and deregister hands memory back again.
    #[test]
    fn a_region_dropped_in_use_waits_for_its_operations() -> Result<()> {
        let open = || Endpoint::open(&NicDesc::provider("shm"));
        let (mut a, mut b) = (open()?, open()?);
        let to_b = a.add_peer(&b.address())?;
        b.add_peer(&a.address())?;
        let len = 256 << 10;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        let src = a.register(Memory::Host(HostBuffer::from_slice(&data)))?;
        let dst = b.register(Memory::Host(HostBuffer::new(len)))?;
        assert_eq!(b.post_recv(LocalSlice::all(&dst), 7)?, Post::Posted);
        drop(dst);
        assert_eq!(
            b.grave.len(),
            1,
            "a region dropped with a receive posted was freed"
        );
        let spare = b.register(Memory::Host(HostBuffer::new(4096)))?;
        match b.deregister(spare) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("in flight"), "{m}"),
            other => panic!("deregister with a receive posted: {other:?}"),
        }
        assert_eq!(b.grave.len(), 2, "the refused region waits too");
        // shm may answer "queue full" until the peers have met: poll both and post again.
        let mut out = vec![transport_core::Completion::default(); 4];
        let t0 = std::time::Instant::now();
        while a.post_send(to_b, LocalSlice::all(&src), 9)? != Post::Posted {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the SEND was never posted"
            );
            assert_eq!(
                a.poll(&mut out)? + b.poll(&mut out)?,
                0,
                "nothing was posted"
            );
        }
        let (mut sent, mut got) = (false, false);
        wait_pair(
            &mut a,
            &mut b,
            "the SEND",
            Duration::from_secs(20),
            |side, c| {
                match (side, &c.kind) {
                    (0, CompletionKind::Send) => sent = true,
                    (1, CompletionKind::Recv { len: n, .. }) => {
                        assert_eq!(*n, len);
                        got = true;
                    }
                    _ => {}
                }
                Ok(sent && got)
            },
        )?;
        // The receive completed: nothing is in flight, and the next poll frees both.
        b.poll(&mut out)?;
        assert_eq!(b.grave.len(), 0, "the grave was not emptied once idle");
        let r = b.register(Memory::Host(HostBuffer::new(4096)))?;
        assert_eq!(b.deregister(r)?.len(), 4096, "deregister when idle");
        Ok(())
    }
}
