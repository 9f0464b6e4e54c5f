//! The hot path on libfabric shm: one 8-byte WRITE with immediate, posted and completed on
//! both sides, through the `Transport` trait and through bare libfabric calls with the same
//! flags, side by side.
//!
//! `cargo bench -p transport-efa --bench hot_path`
//!
//! Each iteration posts a batch of `BATCH` WRITEs and polls until every local completion
//! and every immediate is in, so the per-operation time is the iteration time / `BATCH`.
//! The difference between the two is what the trait (context slab, checks, completion
//! mapping) costs per operation.
//!
//! Both loops compute the same thing, as an application must: every completion is looked
//! at, a local WRITE completion is told from an immediate and its context is read back (the
//! raw loop through its own context array, as a bare libfabric program does), and the
//! immediate's value is read. The trait loop builds each `RemoteSlice` from the fields of the
//! region it imported once (`Transport::import`: the key bytes read back into libfabric's
//! `u64`), as the raw loop computes the remote address, with no check of its own.
//!
//! Two measurements, as `transport_conformance::ab` says (which holds what this bench shares
//! with transport-verbs' hot_path bench, the trait loop included): criterion, then an
//! interleaved A/B pass of `AB_ROUNDS` rounds of `AB_ITERS` iterations, whose paired
//! difference is the figure to quote on a shared or virtual host. `HOT_PATH_AB=ROUNDS,ITERS`
//! changes its size.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use transport_conformance::ab;
use transport_core::{MemoryRegion, NicDesc, RemoteRegion, Transport};
use transport_efa::raw::sys as fi;
use transport_efa::Endpoint;

const BATCH: usize = 32;
const GROUP: &str = "shm_write_imm_8B";
const LEN: usize = 8;
const AB_ROUNDS: usize = 400;
const AB_ITERS: usize = 100;

type Setup = ab::Setup<Endpoint>;

/// Two connected shm endpoints with a source and a target region of `LEN * BATCH` bytes.
fn setup() -> Setup {
    let open = |_| Endpoint::open(&NicDesc::provider("shm"));
    let p = transport_conformance::connect(&open)
        .expect("opening two shm endpoints")
        .expect("shm is always there");
    Setup::new(p, LEN * BATCH)
}

/// The trait loop ([`ab::TraitLoop`]): other completions are passed over, contexts and
/// immediates XORed, as the raw loop does.
struct TraitPath(ab::TraitLoop<Endpoint, BATCH, LEN>);

impl TraitPath {
    /// One iteration: BATCH WRITEs posted, their completions and immediates read.
    #[inline(never)]
    fn iteration(&mut self) -> u64 {
        self.0.iteration(|sink, v| sink ^ v, false)
    }
}

/// A bare libfabric program's operation context: the provider's scratch space first, then
/// what the program needs back on completion.
#[repr(C)]
struct RawCtx {
    fi_ctx: fi::fi_context2,
    user: u64,
}

/// Read up to 64 entries; returns how many.
fn cq_read(cq: *mut fi::fid_cq, buf: &mut [MaybeUninit<fi::fi_cq_data_entry>; 64]) -> usize {
    // SAFETY: cq is open in FI_CQ_FORMAT_DATA and buf holds 64 entries.
    let ret = unsafe { fi::rs_fi_cq_read(cq, buf.as_mut_ptr().cast(), 64) };
    assert!(
        ret >= 0 || ret == -(fi::FI_EAGAIN as isize),
        "fi_cq_read: {ret}"
    );
    ret.max(0) as usize
}

/// The raw loop's state: the same kind of endpoints and regions, used through their handles.
struct RawPath {
    /// Owns the endpoints and regions the raw handles below point into.
    _s: Setup,
    pa: transport_efa::raw::Parts,
    pb: transport_efa::raw::Parts,
    dest: fi::fi_addr_t,
    buf: *mut c_void,
    desc: *mut c_void,
    remote: RemoteRegion<u64>,
    ctxs: Vec<RawCtx>,
    entries: [MaybeUninit<fi::fi_cq_data_entry>; 64],
    flags: u64,
}

impl RawPath {
    fn new() -> Self {
        let mut s = setup();
        // The warm-up's regions, dropped with the endpoints open, are closed at each
        // endpoint's next poll: poll once, so that the raw loop (which never calls the
        // trait's poll) runs with the registrations the trait loop has.
        let mut none: [transport_core::Completion; 4] = Default::default();
        assert_eq!(
            s.a.poll(&mut none).unwrap() + s.b.poll(&mut none).unwrap(),
            0
        );
        let remote = s.a.import(s.peer, &s.dst.remote()).unwrap();
        let pa = s.a.raw_parts();
        let pb = s.b.raw_parts();
        let dest = s.a.raw_peer(s.peer).unwrap();
        let (buf, desc) = s.src.raw_buf();
        // Contexts with room for FI_CONTEXT2 scratch, as the backend's slab provides.
        let ctxs = (0..BATCH)
            .map(|i| RawCtx {
                fi_ctx: fi::fi_context2::default(),
                user: i as u64,
            })
            .collect();
        let flags = fi::FI_COMPLETION | fi::FI_REMOTE_CQ_DATA | pa.write_flags;
        RawPath {
            _s: s,
            pa,
            pb,
            dest,
            buf,
            desc,
            remote,
            ctxs,
            entries: [const { MaybeUninit::uninit() }; 64],
            flags,
        }
    }

    /// One iteration, as [`TraitPath::iteration`] does it.
    #[inline(never)]
    fn iteration(&mut self) -> u64 {
        let (mut posted, mut w, mut imm, mut sink) = (0, 0, 0, 0u64);
        while w < BATCH || imm < BATCH {
            while posted < BATCH {
                let i = posted;
                // SAFETY: the endpoint, region and peer are live for the whole bench (owned by
                // `_s`); each context is reused only after its completion was read.
                let ret = unsafe {
                    fi::rs_fi_writemsg1(
                        self.pa.ep,
                        (self.buf as usize + i * LEN) as *mut c_void,
                        LEN,
                        self.desc,
                        self.dest,
                        self.remote.addr + (i * LEN) as u64,
                        self.remote.key,
                        i as u64,
                        (&mut self.ctxs[i] as *mut RawCtx).cast(),
                        self.flags,
                    )
                };
                if ret != 0 {
                    assert_eq!(ret, -(fi::FI_EAGAIN as isize), "fi_writemsg");
                    break;
                }
                posted += 1;
            }
            let n = cq_read(self.pa.cq, &mut self.entries);
            for slot in &self.entries[..n] {
                // SAFETY: cq_read filled the first n entries.
                let e = unsafe { slot.assume_init_ref() };
                if e.flags & fi::FI_WRITE != 0 && !e.op_context.is_null() {
                    // SAFETY: a local completion's context is one of `ctxs`, alive for the
                    // whole bench.
                    sink ^= unsafe { (*e.op_context.cast::<RawCtx>()).user };
                    w += 1;
                }
            }
            let n = cq_read(self.pb.cq, &mut self.entries);
            for slot in &self.entries[..n] {
                // SAFETY: cq_read filled the first n entries.
                let e = unsafe { slot.assume_init_ref() };
                if e.flags & fi::FI_REMOTE_CQ_DATA != 0 {
                    sink ^= e.data & 0xffff_ffff;
                    imm += 1;
                }
            }
        }
        sink
    }
}

fn main() {
    let mut t = TraitPath(ab::TraitLoop::new(setup()));
    let mut r = RawPath::new();
    ab::compare(
        GROUP,
        "raw_libfabric",
        BATCH,
        (AB_ROUNDS, AB_ITERS),
        || t.iteration(),
        || r.iteration(),
    );
}
