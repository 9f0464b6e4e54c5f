//! Tests only: a backend wrapped to hold a workload to "land before you answer".
//!
//! A side that received bytes (a WRITE's immediate or a SEND arrived) and then answers its
//! peer must first make them visible ([`Transport::make_gpu_visible`]): on GPU memory a NIC
//! wrote, an answer sent before that tells the peer about bytes this side's consumer cannot
//! see yet, and a clock that stops at the answer stops before delivery. Over host memory the
//! call returns at once, so a workload that skips it passes every byte check there;
//! [`Strict`] refuses its next WRITE or SEND instead. Receives are not answers and pass.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use transport_core::{
    BackendInfo, Caps, Completion, CompletionKind, EndpointAddr, Error, LocalSlice, Memory,
    NicDesc, PeerId, Post, RemoteMr, RemoteRegion, RemoteSlice, Result, Runtime, Transport,
    WriteOp,
};

/// `T`, refusing a WRITE or SEND while bytes that arrived are not made visible.
pub struct Strict<T> {
    pub inner: T,
    /// Arrivals polled since the last `make_gpu_visible`.
    unlanded: u64,
    /// Calls of `make_gpu_visible` that had arrivals to land (shared, read by the test).
    pub landings: Arc<AtomicU64>,
}

impl<T> Strict<T> {
    pub fn new(inner: T) -> Self {
        Strict {
            inner,
            unlanded: 0,
            landings: Arc::default(),
        }
    }

    fn answer_allowed(&self) -> Result<()> {
        if self.unlanded > 0 {
            return Err(Error::InvalidArgument(format!(
                "strict: a WRITE or SEND posted with {} arrival(s) not made visible \
                 (make_gpu_visible first)",
                self.unlanded
            )));
        }
        Ok(())
    }
}

impl<T: Transport> Transport for Strict<T> {
    type Mr = T::Mr;
    type RemoteKey = T::RemoteKey;
    const INFO: &'static BackendInfo = T::INFO;

    fn open(nic: &NicDesc) -> Result<Self> {
        T::open(nic).map(Strict::new)
    }
    fn provider(&self) -> &str {
        self.inner.provider()
    }
    fn nic_name(&self) -> &str {
        self.inner.nic_name()
    }
    fn address(&self) -> EndpointAddr {
        self.inner.address()
    }
    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        self.inner.add_peer(addr)
    }
    fn register(&mut self, mem: Memory) -> Result<Self::Mr> {
        self.inner.register(mem)
    }
    fn deregister(&mut self, mr: Self::Mr) -> Result<Memory> {
        self.inner.deregister(mr)
    }
    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<Self::RemoteKey>> {
        self.inner.import(peer, mr)
    }
    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, Self::Mr>, ctx: u64) -> Result<Post> {
        self.answer_allowed()?;
        self.inner.post_send(peer, buf, ctx)
    }
    fn post_recv(&mut self, buf: LocalSlice<'_, Self::Mr>, ctx: u64) -> Result<Post> {
        self.inner.post_recv(buf, ctx)
    }
    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, Self::Mr>,
        remote: RemoteSlice<Self::RemoteKey>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        self.answer_allowed()?;
        self.inner.post_write(peer, buf, remote, imm, ctx)
    }
    fn post_writes(&mut self, ops: &[WriteOp<'_, Self::Mr, Self::RemoteKey>]) -> Result<usize> {
        self.answer_allowed()?;
        self.inner.post_writes(ops)
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let n = self.inner.poll(out)?;
        self.unlanded += out[..n]
            .iter()
            .filter(|c| {
                matches!(
                    c.kind,
                    CompletionKind::RemoteWrite { .. } | CompletionKind::Recv { .. }
                )
            })
            .count() as u64;
        Ok(n)
    }
    fn caps(&self) -> &Caps {
        self.inner.caps()
    }
    fn make_gpu_visible(&mut self, mr: &Self::Mr) -> Result<()> {
        self.inner.make_gpu_visible(mr)?;
        if self.unlanded > 0 {
            self.landings.fetch_add(1, Ordering::Relaxed);
        }
        self.unlanded = 0;
        Ok(())
    }
    fn details(&self) -> String {
        self.inner.details()
    }
    fn runtime(&self) -> Runtime {
        self.inner.runtime()
    }
}

/// Two [`Strict`] endpoints of libfabric's shm provider, each the other's peer, with one host
/// region of `len` bytes each: (a, b, a's peer b, b's peer a, a's region, b's region).
pub type Pair = (
    Strict<transport_efa::Endpoint>,
    Strict<transport_efa::Endpoint>,
    PeerId,
    PeerId,
    <transport_efa::Endpoint as Transport>::Mr,
    <transport_efa::Endpoint as Transport>::Mr,
);

pub fn shm_pair(len: usize) -> Result<Pair> {
    let open = || transport_efa::Endpoint::open(&NicDesc::provider("shm")).map(Strict::new);
    let (mut a, mut b) = (open()?, open()?);
    let pb = a.add_peer(&b.address())?;
    let pa = b.add_peer(&a.address())?;
    let ma = a.register(Memory::Host(transport_core::HostBuffer::new(len)))?;
    let mb = b.register(Memory::Host(transport_core::HostBuffer::new(len)))?;
    Ok((a, b, pb, pa, ma, mb))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::LatOp;
    use crate::ctrl::Liveness;
    use crate::error::TransportContext;
    use crate::report::Progress;
    use crate::workload::lat::PingPong;
    use transport_core::MemoryRegion;

    const IDLE: Duration = Duration::from_secs(20);

    /// The ping-pong, over WRITE with immediate and over SEND: each side lands each message
    /// before it sends the next (the client: its next ping; the server: its answer).
    #[test]
    fn the_ping_pong_lands_each_message_before_the_next() -> crate::error::Result<()> {
        for op in [LatOp::WriteImm, LatOp::Send] {
            ping_pong(op).map_err(|e| crate::error::Error::Protocol(format!("{op:?}: {e}")))?;
        }
        Ok(())
    }

    /// One side of the ping-pong: it sends from the upper half of its region and receives
    /// into the lower half, and WRITEs into the peer's lower half.
    fn side<'a, T: Transport>(
        ep: &'a mut T,
        peer: PeerId,
        mr: &'a T::Mr,
        remote: &RemoteRegion<T::RemoteKey>,
        op: LatOp,
    ) -> crate::error::Result<PingPong<'a, T>> {
        Ok(PingPong {
            ep,
            peer,
            src: LocalSlice::new(mr, 4096, 64).ctx(|| "src")?,
            dst: LocalSlice::new(mr, 0, 64).ctx(|| "dst")?,
            remote: remote.slice(0, 64).ctx(|| "remote")?,
            op,
        })
    }

    fn ping_pong(op: LatOp) -> crate::error::Result<()> {
        let (mut a, mut b, pb, pa, ma, mb) = shm_pair(8192).ctx(|| "an shm pair")?;
        let (la, lb) = (a.landings.clone(), b.landings.clone());
        let ra = b.import(pa, &ma.remote()).ctx(|| "import")?;
        let rb = a.import(pb, &mb.remote()).ctx(|| "import")?;
        let (warm, iters) = (3u64, 20u64);
        let total = warm + iters;
        let live = Liveness::default();
        std::thread::scope(|s| -> crate::error::Result<()> {
            let server = s.spawn(move || -> crate::error::Result<()> {
                let mut pp = side(&mut b, pa, &mb, &ra, op)?;
                pp.prepare(total)?;
                pp.pong(total, &Liveness::default(), IDLE)
            });
            let mut pp = side(&mut a, pb, &ma, &rb, op)?;
            pp.prepare(total)?;
            let rtts = pp.ping(warm, iters, &live, IDLE, &mut Progress::new("lat", true))?;
            assert_eq!(rtts.len() as u64, iters);
            server.join().expect("the server thread")
        })?;
        assert_eq!(la.load(Ordering::Relaxed), total, "client landings");
        assert_eq!(lb.load(Ordering::Relaxed), total, "server landings");
        Ok(())
    }
}
