//! The pair every case runs on: opening and connecting two endpoints, warming both paths up,
//! and the bounded post-and-poll helpers the cases share.

use std::time::Duration;

use transport_core::{
    Error, HostBuffer, LocalSlice, Memory, MemoryRegion, PeerId, Post, RemoteRegion, Result,
    Transport,
};

/// Every wait in the suite gives up after this long.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Two connected endpoints.
pub struct Pair<T: Transport> {
    pub a: T,
    pub b: T,
    /// `b` as seen from `a`.
    pub a_to_b: PeerId,
    /// `a` as seen from `b`.
    pub b_to_a: PeerId,
}

impl<T: Transport> Pair<T> {
    /// A region of side b as side a imports it: the target of a's WRITEs to b.
    pub fn import_on_a(&mut self, mr: &T::Mr) -> Result<RemoteRegion<T::RemoteKey>> {
        self.a.import(self.a_to_b, &mr.remote())
    }

    /// A region of side a as side b imports it: the target of b's WRITEs to a.
    pub fn import_on_b(&mut self, mr: &T::Mr) -> Result<RemoteRegion<T::RemoteKey>> {
        self.b.import(self.b_to_a, &mr.remote())
    }
}

/// Open both sides and connect them, or `None` when there is no device and none is required.
pub fn connect<T: Transport>(open: &dyn Fn(usize) -> Result<T>) -> Result<Option<Pair<T>>> {
    let mut a = match open(0) {
        Ok(a) => a,
        Err(Error::NoDevice(why)) if std::env::var("CONFORMANCE_REQUIRE_DEVICE").is_err() => {
            let backend = std::any::type_name::<T>().split("::").next().unwrap_or("?");
            transport_core::skip::note(&format!("no device ({backend})"), &why);
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut b = open(1)?;
    let (addr_a, addr_b) = (a.address(), b.address());
    let a_to_b = a.add_peer(&addr_b)?;
    let b_to_a = b.add_peer(&addr_a)?;
    let mut pair = Pair {
        a,
        b,
        a_to_b,
        b_to_a,
    };
    warm_up(&mut pair)?;
    Ok(Some(pair))
}

/// Post with `post` until it is accepted, polling both sides in between (bounded).
pub fn post_retry<T: Transport>(
    p: &mut Pair<T>,
    what: &str,
    mut post: impl FnMut(&mut Pair<T>) -> Result<Post>,
    mut seen: impl FnMut(usize, &transport_core::Completion) -> Result<()>,
) -> Result<()> {
    let start = std::time::Instant::now();
    while post(p)? == Post::QueueFull {
        if start.elapsed() > TIMEOUT {
            return Err(Error::Timeout {
                what: what.into(),
                after: TIMEOUT,
            });
        }
        poll_both(p, &mut seen)?;
    }
    Ok(())
}

/// One SEND and one WRITE with immediate each way, so both directions of both paths are
/// connected.
///
/// Connectionless providers set up their path to a new peer lazily (libfabric's `shm` and
/// `tcp;ofi_rxm` answer the first post with `-FI_EAGAIN` until both sides have progressed),
/// which an application sees as [`Post::QueueFull`] and handles by polling and posting again.
/// WRITEs may take a path of their own (the efa backend aims them at a data endpoint where
/// the provider wants receives posted for immediates), so they are warmed up too. The cases
/// then start from a pair on which a full queue means a full queue.
pub fn warm_up<T: Transport>(p: &mut Pair<T>) -> Result<()> {
    let reg = |t: &mut T, b: u8| t.register(Memory::Host(HostBuffer::from_slice(&[b])));
    let (sa, ra) = (reg(&mut p.a, 1)?, reg(&mut p.a, 0)?);
    let (sb, rb) = (reg(&mut p.b, 2)?, reg(&mut p.b, 0)?);
    let (wa, wb) = (reg(&mut p.a, 0)?, reg(&mut p.b, 0)?);
    let (wa_remote, wb_remote) = (p.import_on_b(&wa)?.all(), p.import_on_a(&wb)?.all());
    let done = std::cell::Cell::new(0);
    let count = |_: usize, c: &transport_core::Completion| -> Result<()> {
        c.check()?;
        done.set(done.get() + 1);
        Ok(())
    };
    let (a_to_b, b_to_a) = (p.a_to_b, p.b_to_a);
    post_retry(
        p,
        "warm-up recv",
        |p| p.a.post_recv(LocalSlice::all(&ra), 1),
        count,
    )?;
    post_retry(
        p,
        "warm-up recv",
        |p| p.b.post_recv(LocalSlice::all(&rb), 2),
        count,
    )?;
    post_retry(
        p,
        "warm-up send a->b",
        |p| p.a.post_send(a_to_b, LocalSlice::all(&sa), 3),
        count,
    )?;
    post_retry(
        p,
        "warm-up send b->a",
        |p| p.b.post_send(b_to_a, LocalSlice::all(&sb), 4),
        count,
    )?;
    post_retry(
        p,
        "warm-up write a->b",
        |p| {
            p.a.post_write(a_to_b, LocalSlice::all(&sa), wb_remote, Some(5), 5)
        },
        count,
    )?;
    post_retry(
        p,
        "warm-up write b->a",
        |p| {
            p.b.post_write(b_to_a, LocalSlice::all(&sb), wa_remote, Some(6), 6)
        },
        count,
    )?;
    // 4 sends and receives, 2 local WRITE completions, 2 immediates.
    let start = std::time::Instant::now();
    while done.get() < 8 {
        if start.elapsed() > TIMEOUT {
            return Err(Error::Timeout {
                what: "warm-up".into(),
                after: TIMEOUT,
            });
        }
        poll_both(p, count)?;
    }
    Ok(())
}

/// Poll each side once, handing every completion to `f`.
pub fn poll_both<T: Transport>(
    p: &mut Pair<T>,
    mut f: impl FnMut(usize, &transport_core::Completion) -> Result<()>,
) -> Result<()> {
    let mut buf: [transport_core::Completion; 16] = Default::default();
    for side in 0..2 {
        let t = if side == 0 { &mut p.a } else { &mut p.b };
        let n = t.poll(&mut buf)?;
        for c in &buf[..n] {
            f(side, c)?;
        }
    }
    Ok(())
}
