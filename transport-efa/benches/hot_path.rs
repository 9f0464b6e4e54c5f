//! The hot path on libfabric shm: one 8-byte WRITE with immediate, posted and completed on
//! both sides, through the `Transport` trait and through bare libfabric calls with the same
//! flags, side by side.
//!
//! `cargo bench -p transport-efa --bench hot_path`
//!
//! Each iteration posts a batch of `BATCH` WRITEs and polls until every local completion
//! and every immediate is in, so the per-operation time is the iteration time / `BATCH`.
//! The difference between the two is what the trait (context slab, checks, completion
//! mapping) costs per operation. The trait is measured twice, before and after the raw path,
//! so the run-to-run spread is visible next to the difference.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use transport_core::{
    Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, NicDesc, Post,
    Transport,
};
use transport_efa::raw::sys as fi;
use transport_efa::{Endpoint, Mr};

const BATCH: usize = 32;
const LEN: usize = 8;

/// Two connected shm endpoints, a registered source on the first and a target region on the
/// second.
struct Setup {
    a: Endpoint,
    b: Endpoint,
    peer: transport_core::PeerId,
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

fn trait_path(c: &mut Criterion) {
    let Setup {
        mut a,
        mut b,
        peer,
        src,
        dst,
    } = setup();
    let remote = dst.remote();
    let mut out: [Completion; 64] = std::array::from_fn(|_| Completion::default());
    let mut g = c.benchmark_group("shm_write_imm_8B");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("trait", |bench| {
        bench.iter(|| {
            let (mut posted, mut w, mut imm) = (0, 0, 0);
            while w < BATCH || imm < BATCH {
                while posted < BATCH {
                    let local = LocalSlice {
                        mr: &src,
                        offset: posted * LEN,
                        len: LEN,
                    };
                    let r = remote.slice((posted * LEN) as u64, LEN as u64).unwrap();
                    match a.post_write(peer, local, r, Some(posted as u32), posted as u64) {
                        Ok(Post::Posted) => posted += 1,
                        Ok(Post::QueueFull) => break,
                        Err(e) => panic!("post_write: {e}"),
                    }
                }
                let n = a.poll(&mut out).unwrap();
                w += out[..n]
                    .iter()
                    .filter(|c| c.kind == CompletionKind::Write)
                    .count();
                imm += b.poll(&mut out).unwrap();
            }
        })
    });
    g.finish();
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

fn raw_path(c: &mut Criterion) {
    let Setup {
        a,
        b,
        peer,
        src,
        dst,
    } = setup();
    let remote = dst.remote();
    let pa = a.raw_parts();
    let pb = b.raw_parts();
    let dest = a.raw_peer(peer).unwrap();
    let (buf, desc) = src.raw_buf();
    // Contexts with room for FI_CONTEXT2 scratch, as the backend's slab provides.
    let mut ctxs: Vec<fi::fi_context2> = (0..BATCH)
        // SAFETY: fi_context2 is plain data; zero is a valid value.
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    let mut entries = [const { MaybeUninit::<fi::fi_cq_data_entry>::uninit() }; 64];
    let flags = fi::FI_COMPLETION | fi::FI_REMOTE_CQ_DATA | pa.write_flags;
    let mut g = c.benchmark_group("shm_write_imm_8B");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("raw_libfabric", |bench| {
        bench.iter(|| {
            let (mut posted, mut w, mut imm) = (0, 0, 0);
            while w < BATCH || imm < BATCH {
                while posted < BATCH {
                    let i = posted;
                    // SAFETY: the endpoint, region and peer are live for the whole bench;
                    // each context is reused only after its completion was read.
                    let ret = unsafe {
                        fi::rs_fi_writemsg1(
                            pa.ep,
                            (buf as usize + i * LEN) as *mut c_void,
                            LEN,
                            desc,
                            dest,
                            remote.addr + (i * LEN) as u64,
                            remote.key,
                            i as u64,
                            (&mut ctxs[i] as *mut fi::fi_context2).cast(),
                            flags,
                        )
                    };
                    if ret != 0 {
                        assert_eq!(ret, -(fi::FI_EAGAIN as isize), "fi_writemsg");
                        break;
                    }
                    posted += 1;
                }
                w += cq_read(pa.cq, &mut entries);
                imm += cq_read(pb.cq, &mut entries);
            }
        })
    });
    g.finish();
    drop((src, dst));
}

criterion_group!(benches, trait_path, raw_path, trait_path_again);

fn trait_path_again(c: &mut Criterion) {
    trait_path(c)
}
criterion_main!(benches);
