//! `rdma-bench run`'s data path: one rank of N, generic over `Transport`.
//!
//! A rank opens one endpoint per link: per NIC, one towards every rank it WRITEs to (the
//! pattern's targets) and one for every rank that WRITEs to it (its sources). Each endpoint
//! has exactly one peer, so connected backends (verbs RC) get one queue pair per link and
//! RDM backends one address each; a sending endpoint only ever sees its own WRITEs complete
//! and a receiving one only immediates.
//!
//! Sending links run the `write` workload's [`WriteActive`] unchanged: the GPU's pages in a
//! random order over its NIC group, the last WRITE of each repeat carrying an immediate
//! once the others completed (one immediate per peer and repeat, as an MoE dispatch
//! signals). Receiving links ([`ImmSink`]) count those immediates; they sit in the same
//! thread groups and the same [`run_active`] loop as the senders, so every endpoint is polled
//! while the rank works, with the ladder's knobs.
//!
//! Delivery ([`super::delivery`]): after the last immediate of a phase a receiving link lands
//! its region (its own clock stops there) and acknowledges into the last [`ACK_PAD`] bytes of
//! the sending link's region, past its pages; the sending link's clock stops at that
//! acknowledgement.

use std::time::Instant;

use transport_core::{
    Completion, CompletionKind, EndpointAddr, MemoryRegion, PeerId, RemoteRegion, Transport,
};

use super::delivery::{Clock, Delivered};
use super::write::{WriteActive, WriteParts};
use super::{run_active, ActiveOut, Group, NicWork, Polled};
use crate::buffers::{self, PageLayout};
use crate::config::{Knobs, Threads};
use crate::ctrl::Liveness;
use crate::error::{Error, Result, TransportContext};
use crate::proto::{LinkStats, LinkWire, NicStats};
use crate::side::SideCfg;
use crate::topo_glue::Hints;

/// Largest region one link registers.
const MAX_DATA: u64 = 1 << 36;

/// Bytes past a sending link's pages where its receiver's acknowledgement lands.
pub const ACK_PAD: usize = 64;

mod sink; // a receiving link: ImmSink, SinkParts, ack_pad
pub use sink::{ack_pad, ImmSink, SinkParts};

/// One endpoint: NIC `nic` of this rank towards `peer_rank`, sending or receiving.
///
/// The endpoint is declared (and so dropped) before its region.
pub struct Link<T: Transport> {
    pub ep: T,
    /// Sending: the pages this rank writes. Receiving: where the peer's pages land.
    pub mr: T::Mr,
    pub peer_rank: u32,
    pub nic: usize,
    pub send: bool,
    pub peer: Option<PeerId>,
    /// Sending: the peer's landing region. Receiving: the peer's sending region, whose last
    /// [`ACK_PAD`] bytes take the acknowledgement. Both as `ep` imported them.
    pub remote: Option<RemoteRegion<T::RemoteKey>>,
    /// Receiving: the low 16 bits of the peer's immediates (its sending link's index).
    pub tag: u32,
    /// Receiving: immediates of the next phase that arrived while this rank still waited
    /// for the barrier that starts it (the peer was released first).
    pub early: u64,
    /// When the first of them was seen: the link's receive clock starts there, not at this
    /// rank's start, so that its figure holds no byte that came before its clock.
    pub early_since: Option<Instant>,
}

/// Index of the sending link of `rank` towards `target` on NIC `nic`: sending links come
/// first, target by target, NIC by NIC. The immediate of a sending link names its index, so
/// the receiver can tell a misrouted WRITE.
pub fn send_link_index(targets: &[u32], target: u32, nics: usize, nic: usize) -> Option<usize> {
    targets
        .iter()
        .position(|&t| t == target)
        .map(|p| p * nics + nic)
}

/// The pattern key of the pages GPU index `g` of `rank` sends (the receiver checks it).
pub fn page_key(rank: u32, g: usize) -> u64 {
    (u64::from(rank) << 16) | g as u64
}

/// Open every link of rank `rank` and register its region: `len(j)` bytes for NIC `j` of a
/// GPU.
pub fn open_links<T: Transport>(
    cfg: &SideCfg,
    pattern: crate::config::Pattern,
    rank: u32,
    world: u32,
    len: impl Fn(usize) -> u64,
) -> Result<Vec<Link<T>>> {
    let bad = || Error::Usage(format!("--pattern {pattern} with {world} ranks"));
    let targets = pattern.targets(rank, world).ok_or_else(bad)?;
    let sources = pattern.sources(rank, world).ok_or_else(bad)?;
    let (targets, sources) = (&targets[..], &sources[..]);
    let npg = cfg.nics_per_gpu;
    let nics = cfg.gpus.len() * npg;
    let mut links = Vec::with_capacity((targets.len() + sources.len()) * nics);
    for (send, peers) in [(true, targets), (false, sources)] {
        for &peer_rank in peers {
            for nic in 0..nics {
                let (g, j) = (nic / npg, nic % npg);
                let d = cfg.desc(g, j);
                let k = links.len();
                let mut ep = T::open(&d).ctx(|| {
                    format!(
                        "opening link {k} (NIC {nic}, GPU {}, {} rank {peer_rank}) on the {} backend",
                        cfg.gpus[g],
                        if send { "to" } else { "from" },
                        T::BACKEND
                    )
                })?;
                let tag = if send {
                    0
                } else {
                    let src_targets = pattern.targets(peer_rank, world).ok_or_else(bad)?;
                    let t = send_link_index(&src_targets, rank, nics, nic).ok_or_else(|| {
                        Error::Protocol(format!(
                            "rank {peer_rank} does not write to rank {rank} in {pattern}"
                        ))
                    })?;
                    t as u32 & 0xffff
                };
                let n = len(j);
                if n > MAX_DATA {
                    return Err(Error::Usage(format!(
                        "the runs need {n} bytes per link (size x pages); at most {MAX_DATA}"
                    )));
                }
                // A sending link's region has room for the acknowledgement past its pages.
                let n = n.max(64) as usize + if send { ACK_PAD } else { 0 };
                let m = buffers::alloc(cfg.mem, cfg.gpus[g], n, cfg.buf_offset)?;
                let mr = ep
                    .register(m)
                    .ctx(|| format!("registering {n} bytes of {} memory on link {k}", cfg.mem))?;
                if cfg.verbose > 1 {
                    eprintln!(
                        "rdma-bench: link {k}: NIC {nic} ({}), {} rank {peer_rank}, {n} bytes",
                        crate::units::provider_nic(ep.provider(), ep.nic_name()),
                        if send { "to" } else { "from" }
                    );
                }
                links.push(Link {
                    ep,
                    mr,
                    peer_rank,
                    nic,
                    send,
                    peer: None,
                    remote: None,
                    tag,
                    early: 0,
                    early_since: None,
                });
            }
        }
    }
    Ok(links)
}

/// What the peers need of this rank's links, in link order.
pub fn wire<T: Transport>(links: &[Link<T>]) -> Vec<LinkWire> {
    links
        .iter()
        .map(|l| LinkWire {
            peer: l.peer_rank,
            nic: l.nic as u32,
            send: l.send,
            name: l.ep.nic_name().to_string(),
            addr: l.ep.address().0,
            // Receiving: where the peer's pages land; sending: where the acknowledgement does.
            mr: Some(l.mr.remote()),
            max_write_size: l.ep.caps().max_write_size as u64,
        })
        .collect()
}

/// Add each link's peer end (as rank 0 routed it).
pub fn connect<T: Transport>(links: &mut [Link<T>], ends: Vec<LinkWire>) -> Result<()> {
    if ends.len() != links.len() {
        return Err(Error::Protocol(format!(
            "{} peer endpoints for {} links",
            ends.len(),
            links.len()
        )));
    }
    for (k, (l, e)) in links.iter_mut().zip(ends).enumerate() {
        let p = l.ep.add_peer(&EndpointAddr(e.addr)).ctx(|| {
            format!(
                "adding rank {}'s endpoint ({}) to link {k} (NIC {})",
                l.peer_rank, e.name, l.nic
            )
        })?;
        l.peer = Some(p);
        let Some(mr) = e.mr else {
            return Err(Error::Protocol(format!(
                "rank {} sent no region for link {k}",
                l.peer_rank
            )));
        };
        end_fits(l.send, l.mr.len() as u64, mr.len).map_err(|why| {
            Error::Protocol(format!(
                "rank {}'s region for link {k} (NIC {}) {why}; start every rank with the same \
                 rdma-bench",
                l.peer_rank, l.nic
            ))
        })?;
        let r = l.ep.import(p, &mr).ctx(|| {
            format!(
                "importing rank {}'s region ({}) on link {k} (NIC {})",
                l.peer_rank, e.name, l.nic
            )
        })?;
        l.remote = Some(r);
    }
    Ok(())
}

/// Whether the peer's end of a link, `peer` bytes, takes what this end puts there: a sending
/// link's pages (its own region of `own` bytes less the acknowledgement's pad), or a
/// receiving link's acknowledgement. Every rank sizes its regions from the same plan, so only
/// a peer that is not this rdma-bench fails here; without the check its WRITEs would land past
/// the region, which `shm` drops without a word.
fn end_fits(send: bool, own: u64, peer: u64) -> std::result::Result<(), String> {
    let need = if send {
        own.saturating_sub(ACK_PAD as u64)
    } else {
        ACK_PAD as u64
    };
    if peer < need {
        let what = if send {
            "the pages"
        } else {
            "the acknowledgement's pad"
        };
        return Err(format!("has {peer} bytes; {what} need {need}"));
    }
    Ok(())
}

/// One link's share of a phase, before its thread takes it.
pub enum LinkParts<'a, T: Transport> {
    Send(WriteParts<'a, T>),
    Recv(SinkParts<'a, T>),
}

/// One link's state in a phase.
// One per link, made once per phase: boxing the large variant would add a pointer chase to
// every post and poll of the hot path instead.
#[allow(clippy::large_enum_variant)]
pub enum LinkWork<'a, T: Transport> {
    Send(WriteActive<'a, T>),
    Recv(ImmSink<'a, T>),
}

impl<'a, T: Transport> LinkWork<'a, T> {
    pub fn new(p: LinkParts<'a, T>) -> Self {
        match p {
            LinkParts::Send(w) => LinkWork::Send(WriteActive::new(w)),
            LinkParts::Recv(r) => LinkWork::Recv(ImmSink::new(r)),
        }
    }
}

impl<T: Transport> NicWork for LinkWork<'_, T> {
    fn start_phase(&mut self, iters: u64) {
        match self {
            LinkWork::Send(w) => w.start_phase(iters),
            LinkWork::Recv(r) => r.start_phase(iters),
        }
    }
    #[inline]
    fn post(&mut self, max: usize) -> Result<usize> {
        match self {
            LinkWork::Send(w) => w.post(max),
            LinkWork::Recv(r) => r.post(max),
        }
    }
    #[inline]
    fn poll(&mut self, buf: &mut [Completion]) -> Result<Polled> {
        match self {
            LinkWork::Send(w) => w.poll(buf),
            LinkWork::Recv(r) => r.poll(buf),
        }
    }
    #[inline]
    fn finished(&self) -> bool {
        match self {
            LinkWork::Send(w) => w.finished(),
            LinkWork::Recv(r) => r.finished(),
        }
    }
    fn delivered(&self) -> Option<Delivered> {
        match self {
            LinkWork::Send(w) => w.delivered(),
            LinkWork::Recv(r) => r.delivered(),
        }
    }
    fn nic(&self) -> usize {
        match self {
            LinkWork::Send(w) => w.nic(),
            LinkWork::Recv(r) => r.nic(),
        }
    }
    fn stats(&self, clock: Clock) -> NicStats {
        match self {
            LinkWork::Send(w) => w.stats(clock),
            LinkWork::Recv(r) => r.stats(clock),
        }
    }
}

/// One run (one size) as this rank sees it.
pub struct Phase<'c> {
    pub rank: u32,
    pub world: u32,
    pub pattern: crate::config::Pattern,
    pub npg: usize,
    pub gpus: &'c [usize],
    pub layout: PageLayout,
    pub seed: u64,
    pub knobs: Knobs,
    pub live: &'c Liveness,
    pub idle: std::time::Duration,
    pub hints: Option<&'c Hints>,
}

impl Phase<'_> {
    fn slots(&self, nic: usize) -> u64 {
        self.layout.slots(nic % self.npg)
    }

    /// Fill the pages this rank sends; clear the regions others write into (when verifying).
    pub fn prepare<T: Transport>(&self, links: &mut [Link<T>], verify: bool) -> Result<()> {
        let seed = self.seed;
        let ps = self.layout.page_size;
        for l in links.iter_mut() {
            let (g, j) = (l.nic / self.npg, l.nic % self.npg);
            if self.slots(l.nic) == 0 {
                continue;
            }
            if l.send {
                buffers::fill_pages(&mut l.mr, &self.layout, seed, page_key(self.rank, g), j)?;
            } else if verify {
                buffers::zero(&mut l.mr, self.slots(l.nic) as usize * ps)?;
            }
        }
        Ok(())
    }

    /// Check every page every source wrote.
    pub fn verify<T: Transport>(&self, links: &[Link<T>]) -> Result<()> {
        let seed = self.seed;
        for l in links.iter().filter(|l| !l.send) {
            let (g, j) = (l.nic / self.npg, l.nic % self.npg);
            buffers::verify_pages(
                &l.mr,
                &self.layout,
                seed,
                page_key(l.peer_rank, g),
                j,
                l.nic,
                0,
                &buffers::Versions::none(self.layout.page_size),
            )
            .map_err(|e| Error::Verify(format!("data from rank {}: {e}", l.peer_rank)))?;
        }
        Ok(())
    }

    /// One phase of `iters` repeats over every link, with this run's knobs.
    pub fn run<T: Transport>(&self, links: &mut [Link<T>], iters: u64) -> Result<ActiveOut> {
        let used = self.layout.used;
        let size = self.layout.page_size;
        let n_links = links.len();
        let mut per_rep = 0u64;
        let mut parts: Vec<(usize, LinkParts<'_, T>)> = Vec::with_capacity(links.len());
        for (k, l) in links.iter_mut().enumerate() {
            let (g, j) = (l.nic / self.npg, l.nic % self.npg);
            let active = j < used && self.layout.slots(j) > 0;
            let Some(peer) = l.peer else {
                return Err(Error::Protocol(format!("link {k} has no peer")));
            };
            if l.send {
                let slots: Vec<u32> = if active {
                    self.layout
                        .post_order(self.seed, page_key(self.rank, g), j)
                        .into_iter()
                        .map(|p| p / used as u32)
                        .collect()
                } else {
                    Vec::new()
                };
                per_rep += slots.len() as u64;
                let remote = l
                    .remote
                    .ok_or_else(|| Error::Protocol(format!("link {k} has no remote region")))?;
                let c = l.ep.caps();
                let max_inflight = self.knobs.in_flight(c.tx_depth);
                parts.push((
                    g,
                    LinkParts::Send(WriteParts {
                        nic: k,
                        max_inflight,
                        ep: &mut l.ep,
                        src: &mut l.mr,
                        peer,
                        remote,
                        slots,
                        // (rdma-bench run checks the final state only)
                        ver: buffers::Versions::none(self.layout.page_size),
                        page_size: size,
                        batch: self.knobs.batch as usize,
                    }),
                ));
            } else {
                let (early, early_since) = (std::mem::take(&mut l.early), l.early_since.take());
                if early > 0 && !active {
                    return Err(Error::Protocol(format!(
                        "link {k} received {early} immediate(s) from rank {} in a run it \
                         takes no part in",
                        l.peer_rank
                    )));
                }
                if active {
                    per_rep += 1;
                }
                let sender = l
                    .remote
                    .ok_or_else(|| Error::Protocol(format!("link {k} has no sender region")))?;
                parts.push((
                    g,
                    LinkParts::Recv(SinkParts {
                        link: k,
                        tag: l.tag,
                        ep: &mut l.ep,
                        mr: &mut l.mr,
                        peer,
                        ack_to: ack_pad(&sender, k)?,
                        active,
                        bytes_per_rep: self.layout.slots(j) * size as u64,
                        early,
                        early_since,
                    }),
                ));
            }
        }
        let groups = match self.knobs.threads {
            Threads::One => vec![Group {
                gpu: self.gpus.first().copied().unwrap_or(0),
                parts: parts.into_iter().map(|(_, p)| p).collect(),
            }],
            Threads::PerGpu => {
                let mut gs: Vec<Group<LinkParts<'_, T>>> = self
                    .gpus
                    .iter()
                    .map(|&gpu| Group {
                        gpu,
                        parts: Vec::new(),
                    })
                    .collect();
                for (g, p) in parts {
                    if let Some(grp) = gs.get_mut(g) {
                        grp.parts.push(p);
                    }
                }
                gs
            }
        };
        let knobs = Knobs {
            warmup: 0,
            ..self.knobs
        };
        run_active(
            groups,
            n_links,
            &knobs,
            0,
            iters,
            |it| it.saturating_mul(per_rep),
            self.live,
            self.idle,
            self.hints,
            LinkWork::new,
        )
    }
}

/// Poll every link between phases, so the providers keep progressing. A sending link has
/// nothing left to complete; a receiving link may see the next phase's first immediates
/// (its peer left the barrier first): they are kept for that phase.
pub fn poll_idle<T: Transport>(links: &mut [Link<T>], buf: &mut [Completion]) -> Result<()> {
    for (k, l) in links.iter_mut().enumerate() {
        let n = l.ep.poll(buf).ctx(|| format!("polling link {k}"))?;
        for c in &buf[..n] {
            match c.kind {
                CompletionKind::RemoteWrite { imm } if !l.send && imm & 0xffff == l.tag => {
                    l.early += 1;
                    l.early_since.get_or_insert_with(Instant::now);
                }
                _ => return Err(super::unexpected(c, &format!("link {k} between phases"))),
            }
        }
    }
    Ok(())
}

/// The per-link figures of a phase, in link order.
pub fn link_stats<T: Transport>(links: &[Link<T>], out: &ActiveOut) -> Vec<LinkStats> {
    links
        .iter()
        .enumerate()
        .map(|(k, l)| {
            let s = out.per_nic.get(k).cloned().unwrap_or_default();
            LinkStats {
                peer: l.peer_rank,
                nic: l.nic as u32,
                send: l.send,
                bytes: s.bytes,
                ops: s.ops,
                seconds: s.seconds,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Pattern;

    #[test]
    fn every_receiver_knows_its_senders_link() {
        for p in [
            Pattern::Pairwise,
            Pattern::AllToAll,
            Pattern::Incast,
            Pattern::Bisection,
        ] {
            let w = 6;
            let nics = 3;
            let mut seen = std::collections::HashSet::new();
            for r in 0..w {
                for s in p.sources(r, w).unwrap() {
                    for nic in 0..nics {
                        let k = send_link_index(&p.targets(s, w).unwrap(), r, nics, nic).unwrap();
                        // Unique per sender, below the sender's sending links.
                        assert!(k < p.targets(s, w).unwrap().len() * nics);
                        assert!(seen.insert((s, k)), "{p}: {s} link {k} twice");
                    }
                }
            }
        }
    }

    /// A peer's landing region smaller than the pages, or a sending region without room for
    /// the acknowledgement, is refused at connect; what open_links registers passes.
    #[test]
    fn a_peer_region_too_small_is_refused() {
        let pages = 4096 * 8;
        let own_send = pages + ACK_PAD as u64;
        assert_eq!(end_fits(true, own_send, pages), Ok(()));
        let e = end_fits(true, own_send, pages - 1).unwrap_err();
        assert!(e.contains("the pages need 32768"), "{e}");
        assert_eq!(end_fits(false, pages, own_send), Ok(()));
        assert_eq!(end_fits(false, pages, ACK_PAD as u64), Ok(()));
        let e = end_fits(false, pages, ACK_PAD as u64 - 1).unwrap_err();
        assert!(e.contains("the acknowledgement's pad need 64"), "{e}");
    }
}
