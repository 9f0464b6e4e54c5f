//! Tests only: a good job's end. Rank 0 hands its report over before any of its links closes,
//! so a close that hangs (a peer that stopped after the last barrier) cannot lose the report.

use std::cell::Cell;
use std::net::TcpListener;
use std::time::Duration;

use transport_core::{
    BackendInfo, Caps, Completion, EndpointAddr, LocalSlice, Memory, NicDesc, PeerId, Post,
    RemoteMr, RemoteRegion, RemoteSlice, Result, Runtime, Transport, WriteOp,
};

use super::job::{job, Job};
use crate::launch::{Launch, Launcher, Rendezvous};
use bench_core::config::{Pattern, Workload};
use bench_core::plan::{Plan, WorkloadSpec};
use bench_core::side::SideCfg;

thread_local! {
    /// Endpoints this thread (one rank) has closed.
    static CLOSED: Cell<usize> = const { Cell::new(0) };
}

/// libfabric's endpoint, counting its closes on the thread that closes it.
struct Counted(transport_efa::Endpoint);

impl Drop for Counted {
    fn drop(&mut self) {
        CLOSED.with(|c| c.set(c.get() + 1));
    }
}

impl Transport for Counted {
    type Mr = <transport_efa::Endpoint as Transport>::Mr;
    type RemoteKey = <transport_efa::Endpoint as Transport>::RemoteKey;
    const INFO: &'static BackendInfo = transport_efa::Endpoint::INFO;

    fn open(nic: &NicDesc) -> Result<Self> {
        transport_efa::Endpoint::open(nic).map(Counted)
    }
    fn provider(&self) -> &str {
        self.0.provider()
    }
    fn nic_name(&self) -> &str {
        self.0.nic_name()
    }
    fn address(&self) -> EndpointAddr {
        self.0.address()
    }
    fn add_peer(&mut self, addr: &EndpointAddr) -> Result<PeerId> {
        self.0.add_peer(addr)
    }
    fn register(&mut self, mem: Memory) -> Result<Self::Mr> {
        self.0.register(mem)
    }
    fn deregister(&mut self, mr: Self::Mr) -> Result<Memory> {
        self.0.deregister(mr)
    }
    fn import(&mut self, peer: PeerId, mr: &RemoteMr) -> Result<RemoteRegion<Self::RemoteKey>> {
        self.0.import(peer, mr)
    }
    fn post_send(&mut self, peer: PeerId, buf: LocalSlice<'_, Self::Mr>, ctx: u64) -> Result<Post> {
        self.0.post_send(peer, buf, ctx)
    }
    fn post_recv(&mut self, buf: LocalSlice<'_, Self::Mr>, ctx: u64) -> Result<Post> {
        self.0.post_recv(buf, ctx)
    }
    fn post_write(
        &mut self,
        peer: PeerId,
        buf: LocalSlice<'_, Self::Mr>,
        remote: RemoteSlice<Self::RemoteKey>,
        imm: Option<u32>,
        ctx: u64,
    ) -> Result<Post> {
        self.0.post_write(peer, buf, remote, imm, ctx)
    }
    fn post_writes(&mut self, ops: &[WriteOp<'_, Self::Mr, Self::RemoteKey>]) -> Result<usize> {
        self.0.post_writes(ops)
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        self.0.poll(out)
    }
    fn caps(&self) -> &Caps {
        self.0.caps()
    }
    fn make_gpu_visible(&mut self, mr: &Self::Mr) -> Result<()> {
        self.0.make_gpu_visible(mr)
    }
    fn details(&self) -> String {
        self.0.details()
    }
    fn runtime(&self) -> Runtime {
        self.0.runtime()
    }
}

/// Two ranks of one job, each on its own thread, over libfabric's shm provider: rank 0's
/// report comes out while every one of its links is still open, and each link closes after.
#[test]
fn rank_0_reports_before_its_links_close() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address").port()
    };
    let rank = move |rank: u32| {
        std::thread::spawn(move || {
            let cfg = SideCfg {
                provider: Some("shm".into()),
                ..SideCfg::default()
            };
            let work = WorkloadSpec {
                workload: Workload::Write,
                size: Some(4096),
                iters: Some(4),
                rounds: Some(1),
                ..WorkloadSpec::default()
            };
            let plan = Plan::new(&work, true).expect("the plan");
            let launch = Launch {
                launcher: Launcher::Torchrun,
                rank,
                world: 2,
                local_rank: rank,
            };
            let rdv = Rendezvous {
                host: "127.0.0.1".into(),
                port,
                from: "the test",
            };
            let j = Job {
                cfg: &cfg,
                plan: &plan,
                pattern: Pattern::Pairwise,
                launch: &launch,
                rdv: &rdv,
                provider: "shm".into(),
                timeout: Duration::from_secs(60),
            };
            // (reports, links closed when the report came)
            let mut seen: Vec<(bool, usize)> = Vec::new();
            let r = job::<Counted>(&j, &mut |rep| {
                seen.push((
                    rep.verified && rep.runs.iter().all(|r| r.bytes > 0),
                    CLOSED.get(),
                ))
            });
            (r.map_err(|e| e.to_string()), seen, CLOSED.get())
        })
    };
    let (r0, r1) = (rank(0), rank(1));
    let (r0, r1) = (r0.join().expect("rank 0"), r1.join().expect("rank 1"));
    let (res, seen, closed) = r0;
    res.expect("rank 0's job");
    assert_eq!(
        seen,
        vec![(true, 0)],
        "one verified report, before any close"
    );
    assert!(
        closed >= 2,
        "rank 0 closed {closed} links, pairwise opens 2"
    );
    let (res, seen, closed) = r1;
    res.expect("rank 1's job");
    assert!(seen.is_empty(), "only rank 0 reports");
    assert!(closed >= 2, "rank 1 closed {closed} links");
}
