//! The hot path on ibverbs: one 8-byte WRITE with immediate on an RC queue pair, posted and
//! completed on both sides, through the `Transport` trait and through bare verbs calls with
//! the same flags (signaled, inline where the backend inlines), side by side.
//!
//! `cargo bench -p transport-verbs --bench hot_path` (needs an RDMA device; side 0 opens
//! `$VERBS_DEV0`, side 1 `$VERBS_DEV1`, else the first device; without one it says so and
//! exits 0). In the Soft-RoCE VM: `ci/verbs-bench.sh`.
//!
//! Each iteration posts a batch of `BATCH` WRITEs and polls both CQs until every local
//! completion and every immediate is in, so the per-operation time is the iteration time /
//! `BATCH`. Both paths do the same work per completion: the trait path keeps local `Write`
//! completions and `RemoteWrite` immediates and sums their contexts and immediate values; the
//! raw path looks at each work completion's status and opcode, sums `wr_id`s and immediate
//! values, and reposts the zero-length receives that the immediates consumed from the
//! backend's immediate SRQ in chains of the backend's batch size, as the backend does. The
//! difference between the two is what the trait (checks, context ring, completion mapping)
//! costs per operation. The raw path runs on its own pair of endpoints, whose own posting
//! and polling it never uses.
//!
//! Two measurements, as `transport_conformance::ab` says (which holds what this bench shares
//! with transport-efa's hot_path bench, the trait loop included): criterion, then an
//! interleaved A/B pass of `AB_ROUNDS` rounds of `AB_ITERS` iterations, whose paired
//! difference is the figure to quote on a shared or virtual host. `HOT_PATH_AB=ROUNDS,ITERS`
//! changes its size; without `--bench` (`cargo test --benches`) it is a short smoke pass.
//!
//! Each loop is one `#[inline(never)]` function (`TraitPath::iteration`,
//! `RawPath::iteration`), so an instruction profiler can count them apart:
//! `ci/verbs-bench.sh --callgrind` runs this under callgrind in the Soft-RoCE VM and prints
//! instructions per operation of each.

use std::ptr;

use transport_conformance::ab;
use transport_core::{Error, MemoryRegion, Result, Transport};
use transport_verbs::raw::sys;
use transport_verbs::Endpoint;

const BATCH: usize = 32;
const LEN: usize = 8;
const GROUP: &str = "verbs_write_imm_8B";
const AB_ROUNDS: usize = 400;
const AB_ITERS: usize = 100;

fn open(side: usize) -> Result<Endpoint> {
    Endpoint::open(&transport_verbs::test_nic(side)?)
}

type Setup = ab::Setup<Endpoint>;

/// Two connected endpoints with a source and a target region of `LEN * BATCH` bytes.
fn setup() -> Setup {
    let p = transport_conformance::connect(&open)
        .expect("opening and connecting two verbs endpoints")
        .expect("main() checked that a device is there");
    Setup::new(p, LEN * BATCH)
}

/// The trait loop ([`ab::TraitLoop`]): any other completion is a failure, contexts and
/// immediates are summed, as the raw loop does.
struct TraitPath(ab::TraitLoop<Endpoint, BATCH, LEN>);

impl TraitPath {
    /// One iteration: BATCH WRITEs posted, their completions and immediates read.
    #[inline(never)]
    fn iteration(&mut self) -> u64 {
        self.0.iteration(u64::wrapping_add, true)
    }
}

/// Take up to `wcs.len()` work completions from `cq`; how many.
fn poll_cq(cq: *mut sys::ibv_cq, wcs: &mut [sys::ibv_wc; BATCH]) -> usize {
    // SAFETY: `cq` is the live CQ of an endpoint that outlives the bench; `wcs` holds BATCH
    // entries, the count passed.
    let n = unsafe { sys::ibvs_poll_cq(cq, BATCH as i32, wcs.as_mut_ptr()) };
    assert!(n >= 0, "ibv_poll_cq: {n}");
    n as usize
}

#[cold]
fn unexpected(side: &str, wc: &sys::ibv_wc) -> ! {
    panic!(
        "unexpected work completion on the {side}: status {} opcode {} wr_id {:#x}",
        wc.status, wc.opcode, wc.wr_id
    )
}

/// The raw loop's state: a pair of endpoints of its own, used through their verbs handles.
/// The endpoints' accounting (outstanding WRs, immediate receives to repost) never sees these
/// operations, so nothing may post or poll on them through the trait.
struct RawPath {
    /// Owns the endpoints and regions the raw handles below point into.
    _s: Setup,
    pa: transport_verbs::raw::Parts,
    pb: transport_verbs::raw::Parts,
    qp: *mut sys::ibv_qp,
    addr: u64,
    lkey: u32,
    remote_addr: u64,
    rkey: u32,
    send_flags: u32,
    /// The immediate receives of the backend: zero-length, chained, reposted once
    /// `imm_threshold` were consumed (as `Endpoint::poll` does).
    imm_wrs: Vec<sys::ibv_recv_wr>,
    imm_to_post: usize,
    wcs: [sys::ibv_wc; BATCH],
    sge: sys::ibv_sge,
    wr: sys::ibv_send_wr,
}

impl RawPath {
    fn new() -> Self {
        let mut s = setup();
        let remote = s.a.import(s.peer, &s.dst.remote()).unwrap();
        let rkey = remote.key;
        let pa = s.a.raw_parts();
        let pb = s.b.raw_parts();
        let qp = s.a.raw_data_qp(s.peer).unwrap();
        let (addr, lkey) = (s.src.raw_addr(), s.src.lkey());
        // The backend's flags for an 8-byte WRITE from host memory.
        let send_flags = sys::IBV_SEND_SIGNALED
            | if s.a.raw_inline(LEN) {
                sys::IBV_SEND_INLINE
            } else {
                0
            };
        let imm_wrs = (0..pb.imm_batch)
            .map(|_| sys::ibv_recv_wr {
                wr_id: pb.imm_wr_id,
                next: ptr::null_mut(),
                sg_list: ptr::null_mut(),
                num_sge: 0,
            })
            .collect();
        RawPath {
            _s: s,
            pa,
            pb,
            qp,
            addr,
            lkey,
            remote_addr: remote.addr,
            rkey,
            send_flags,
            imm_wrs,
            imm_to_post: 0,
            wcs: [sys::ibv_wc::default(); BATCH],
            sge: sys::ibv_sge::default(),
            wr: sys::ibv_send_wr::default(),
        }
    }

    /// One iteration, as [`TraitPath::iteration`] does it.
    #[inline(never)]
    fn iteration(&mut self) -> u64 {
        let (mut posted, mut w, mut imm, mut sum) = (0, 0, 0, 0u64);
        while w < BATCH || imm < BATCH {
            while posted < BATCH {
                let i = posted;
                self.sge = sys::ibv_sge {
                    addr: self.addr + (i * LEN) as u64,
                    length: LEN as u32,
                    lkey: self.lkey,
                };
                let wr = &mut self.wr;
                wr.wr_id = i as u64;
                wr.next = ptr::null_mut();
                wr.sg_list = &mut self.sge;
                wr.num_sge = 1;
                wr.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.send_flags = self.send_flags;
                wr.__bindgen_anon_1.imm_data = (i as u32).to_be();
                wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: self.remote_addr + (i * LEN) as u64,
                    rkey: self.rkey,
                };
                let mut bad = ptr::null_mut();
                // SAFETY: `qp` is the connected data QP of an endpoint that outlives the bench
                // (owned by `_s`); `wr` and `sge` live across the call (the provider copies
                // them, and reads the inline payload before returning); the SGE lies in `src`,
                // registered on that endpoint and alive for the whole bench. Each iteration
                // completes its BATCH WRs before the next posts, so the send queue
                // (tx_depth >= BATCH) never overflows.
                let rc = unsafe { sys::ibvs_post_send(self.qp, wr, &mut bad) };
                if rc != 0 {
                    assert!(
                        rc == libc::ENOMEM || rc == libc::EAGAIN,
                        "ibv_post_send: {rc}"
                    );
                    break;
                }
                posted += 1;
            }
            let n = poll_cq(self.pa.cq, &mut self.wcs);
            for wc in &self.wcs[..n] {
                match wc.opcode {
                    sys::IBV_WC_RDMA_WRITE if wc.status == sys::IBV_WC_SUCCESS => {
                        w += 1;
                        sum = sum.wrapping_add(wc.wr_id);
                    }
                    _ => unexpected("writer", wc),
                }
            }
            let n = poll_cq(self.pb.cq, &mut self.wcs);
            for wc in &self.wcs[..n] {
                match wc.opcode {
                    sys::IBV_WC_RECV_RDMA_WITH_IMM
                        if wc.status == sys::IBV_WC_SUCCESS && wc.wr_id == self.pb.imm_wr_id =>
                    {
                        imm += 1;
                        self.imm_to_post += 1;
                        // SAFETY: a successful RECV_RDMA_WITH_IMM carries imm_data.
                        let v = u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data });
                        sum = sum.wrapping_add(u64::from(v));
                    }
                    _ => unexpected("target", wc),
                }
            }
            while self.imm_to_post >= self.pb.imm_threshold {
                let n = self.imm_to_post.min(self.pb.imm_batch);
                let base = self.imm_wrs.as_mut_ptr();
                for k in 0..n {
                    // SAFETY: `k < n <= imm_batch == imm_wrs.len()`: `base.add(k)` and (where
                    // `k + 1 < n`) `base.add(k + 1)` point into `imm_wrs`, not otherwise
                    // borrowed here.
                    unsafe {
                        (*base.add(k)).next = if k + 1 < n {
                            base.add(k + 1)
                        } else {
                            ptr::null_mut()
                        };
                    }
                }
                let mut bad = ptr::null_mut();
                // SAFETY: `imm_srq` is the live immediate SRQ of `b` (owned by `_s`); the chain
                // is `n` initialised zero-length WRs in `imm_wrs`, alive across the call (the
                // provider copies them). Each replaces one the immediates consumed, so the SRQ
                // never holds more than the backend sized it for.
                let rc = unsafe { sys::ibvs_post_srq_recv(self.pb.imm_srq, base, &mut bad) };
                assert_eq!(rc, 0, "ibv_post_srq_recv");
                self.imm_to_post -= n;
            }
        }
        sum
    }
}

fn main() {
    // No RDMA device (no RDMA stack: ENOSYS, or an empty list): nothing to measure.
    match open(0) {
        Err(Error::NoDevice(why)) => {
            println!("verbs hot_path bench: skipped, no RDMA device: {why}");
            return;
        }
        Err(e) => panic!("opening a verbs endpoint: {e}"),
        Ok(ep) => drop(ep),
    }
    let mut t = TraitPath(ab::TraitLoop::new(setup()));
    let mut r = RawPath::new();
    ab::compare(
        GROUP,
        "raw_verbs",
        BATCH,
        (AB_ROUNDS, AB_ITERS),
        || t.iteration(),
        || r.iteration(),
    );
}
