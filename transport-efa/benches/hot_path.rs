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
//! immediate's value is read. The trait loop builds each `RemoteSlice` from the region's
//! fields, as the raw loop computes the remote address, with no check of its own.
//!
//! Two measurements:
//! - criterion, one function after the other (trait, raw, trait again: the spread between
//!   the two trait runs is the host's drift);
//! - then an interleaved A/B pass: `AB_ROUNDS` rounds, each timing `AB_ITERS` iterations of
//!   the trait loop and then of the raw loop, both pairs of endpoints open throughout. It
//!   prints the median and minimum ns/op of each and the median of the per-round differences,
//!   which cancels drift slower than one round (a few ms). On a shared or virtual host that
//!   paired figure is the one to quote. `HOT_PATH_AB=ROUNDS,ITERS` changes its size.

use std::ffi::c_void;
use std::hint::black_box;
use std::mem::MaybeUninit;

use criterion::{Criterion, Throughput};
use transport_core::{
    Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, PeerId,
    Post, RemoteMr, RemoteSlice, Transport,
};
use transport_efa::raw::sys as fi;
use transport_efa::{Endpoint, Mr};

const BATCH: usize = 32;
const GROUP: &str = "shm_write_imm_8B";
const LEN: usize = 8;
const AB_ROUNDS: usize = 400;
const AB_ITERS: usize = 100;

/// Two connected shm endpoints, a registered source on the first and a target region on the
/// second.
struct Setup {
    a: Endpoint,
    b: Endpoint,
    peer: PeerId,
    src: Mr,
    dst: Mr,
}

fn setup() -> Setup {
    let open = |_| Endpoint::open(&NicDesc::provider("shm"));
    let mut p = transport_conformance::connect(&open)
        .expect("opening two shm endpoints")
        .expect("shm is always there");
    let src =
        p.a.register(Memory::Host(HostBuffer::new(LEN * BATCH)))
            .unwrap();
    let dst =
        p.b.register(Memory::Host(HostBuffer::new(LEN * BATCH)))
            .unwrap();
    Setup {
        a: p.a,
        b: p.b,
        peer: p.a_to_b,
        src,
        dst,
    }
}

/// The trait loop's state.
struct TraitPath {
    s: Setup,
    remote: RemoteMr,
    out: [Completion; 64],
}

impl TraitPath {
    fn new() -> Self {
        let s = setup();
        let remote = s.dst.remote();
        TraitPath {
            s,
            remote,
            out: std::array::from_fn(|_| Completion::default()),
        }
    }

    /// One iteration: BATCH WRITEs posted, their completions and immediates read.
    #[inline(never)]
    fn iteration(&mut self) -> u64 {
        let Setup {
            a, b, peer, src, ..
        } = &mut self.s;
        let (remote, out) = (&self.remote, &mut self.out);
        let (mut posted, mut w, mut imm, mut sink) = (0, 0, 0, 0u64);
        while w < BATCH || imm < BATCH {
            while posted < BATCH {
                let local = LocalSlice {
                    mr: &*src,
                    offset: posted * LEN,
                    len: LEN,
                };
                let r = RemoteSlice {
                    addr: remote.addr + (posted * LEN) as u64,
                    len: LEN as u64,
                    key: remote.key,
                };
                match a.post_write(*peer, local, r, Some(posted as u32), posted as u64) {
                    Ok(Post::Posted) => posted += 1,
                    Ok(Post::QueueFull) => break,
                    Err(e) => panic!("post_write: {e}"),
                }
            }
            let n = a.poll(out).unwrap();
            for c in &out[..n] {
                if c.kind == CompletionKind::Write {
                    w += 1;
                    sink ^= c.ctx;
                }
            }
            let n = b.poll(out).unwrap();
            for c in &out[..n] {
                if let CompletionKind::RemoteWrite { imm: v } = c.kind {
                    imm += 1;
                    sink ^= u64::from(v);
                }
            }
        }
        sink
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
    remote: RemoteMr,
    ctxs: Vec<RawCtx>,
    entries: [MaybeUninit<fi::fi_cq_data_entry>; 64],
    flags: u64,
}

impl RawPath {
    fn new() -> Self {
        let s = setup();
        let remote = s.dst.remote();
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

fn bench(c: &mut Criterion, name: &str, mut f: impl FnMut() -> u64) {
    let mut g = c.benchmark_group(GROUP);
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function(name, |bench| bench.iter(|| black_box(f())));
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut t = TraitPath::new();
    let mut r = RawPath::new();
    bench(&mut c, "trait", || t.iteration());
    bench(&mut c, "raw_libfabric", || r.iteration());
    bench(&mut c, "trait #2", || t.iteration());
    c.final_summary();
    let size = transport_conformance::ab::size((AB_ROUNDS, AB_ITERS));
    transport_conformance::ab::run(GROUP, BATCH, size, || t.iteration(), || r.iteration());
}
