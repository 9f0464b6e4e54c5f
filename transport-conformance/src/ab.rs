//! What the backends' hot-path benches share: the endpoints and regions they measure on
//! ([`Setup`]), the loop through the `Transport` trait ([`TraitLoop`]), and the two
//! measurements of it against the backend's bare-calls loop ([`compare`]):
//!
//! - criterion, one function after the other (trait, raw, trait again: the spread between
//!   the two trait runs is the host's drift);
//! - then an interleaved A/B pass ([`run`]): rounds, each timing iterations of the trait loop
//!   and then of the raw loop, both pairs of endpoints open throughout. It prints the median
//!   and minimum ns/op of each and the median of the per-round differences, which cancels
//!   drift slower than one round (a few ms). On a shared or virtual host that paired figure
//!   is the one to quote. `HOT_PATH_AB=ROUNDS,ITERS` changes its size ([`size`]); without
//!   `--bench` (`cargo test --benches`) it is a short smoke pass.
//!
//! Each bench wraps [`TraitLoop::iteration`] and its raw loop in an `#[inline(never)]`
//! function of its own (`TraitPath::iteration`, `RawPath::iteration`), so an instruction
//! profiler can count them apart (`ci/verbs-bench.sh --callgrind`).

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use transport_core::{
    Completion, CompletionKind, HostBuffer, LocalSlice, Memory, MemoryRegion, PeerId, Post,
    RemoteRegion, RemoteSlice, Transport,
};

use crate::Pair;

/// Two connected endpoints, a registered source on the first and a target region on the
/// second.
pub struct Setup<T: Transport> {
    pub a: T,
    pub b: T,
    /// `b` as seen from `a`.
    pub peer: PeerId,
    pub src: T::Mr,
    pub dst: T::Mr,
}

impl<T: Transport> Setup<T> {
    /// Register `bytes` of host memory on each side of `p`: the source on `a`, the target on
    /// `b`.
    pub fn new(mut p: Pair<T>, bytes: usize) -> Self {
        let src = p.a.register(Memory::Host(HostBuffer::new(bytes))).unwrap();
        let dst = p.b.register(Memory::Host(HostBuffer::new(bytes))).unwrap();
        Setup {
            a: p.a,
            b: p.b,
            peer: p.a_to_b,
            src,
            dst,
        }
    }
}

/// The trait loop's state: `BATCH` WRITEs of `LEN` bytes with immediates an iteration, from
/// `src` to `dst` (which hold `BATCH * LEN` bytes).
pub struct TraitLoop<T: Transport, const BATCH: usize, const LEN: usize> {
    s: Setup<T>,
    /// `dst` as `a` imported it.
    remote: RemoteRegion<T::RemoteKey>,
    out: [Completion; 64],
}

impl<T: Transport, const BATCH: usize, const LEN: usize> TraitLoop<T, BATCH, LEN> {
    pub fn new(mut s: Setup<T>) -> Self {
        let remote = s.a.import(s.peer, &s.dst.remote()).unwrap();
        TraitLoop {
            s,
            remote,
            out: std::array::from_fn(|_| Completion::default()),
        }
    }

    /// One iteration: BATCH WRITEs posted, their completions and immediates read. Each local
    /// `Write` completion's context and each immediate's value is folded into the result with
    /// `fold`; an error completion fails the bench, a completion of another kind fails it
    /// where `strict`, else is passed over. The `RemoteSlice` of each WRITE is built from the fields of the region `a`
    /// imported once, as a bare loop computes the remote address, with no check of its own.
    ///
    /// Always inlined, so that it is all in the bench's own `#[inline(never)]` function.
    #[inline(always)]
    pub fn iteration(&mut self, fold: impl Fn(u64, u64) -> u64, strict: bool) -> u64 {
        let Setup {
            a, b, peer, src, ..
        } = &mut self.s;
        let (remote, out) = (&self.remote, &mut self.out);
        let (mut posted, mut w, mut imm, mut acc) = (0, 0, 0, 0u64);
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
                match c.kind {
                    CompletionKind::Write => {
                        w += 1;
                        acc = fold(acc, c.ctx);
                    }
                    // An error never counts, so the loop would spin for ever on it.
                    _ if strict || matches!(c.kind, CompletionKind::Error(_)) => {
                        panic!("unexpected completion on the writer: {c:?}")
                    }
                    _ => {}
                }
            }
            let n = b.poll(out).unwrap();
            for c in &out[..n] {
                match c.kind {
                    CompletionKind::RemoteWrite { imm: v } => {
                        imm += 1;
                        acc = fold(acc, u64::from(v));
                    }
                    // An error never counts, so the loop would spin for ever on it.
                    _ if strict || matches!(c.kind, CompletionKind::Error(_)) => {
                        panic!("unexpected completion on the target: {c:?}")
                    }
                    _ => {}
                }
            }
        }
        acc
    }
}

/// Both measurements in criterion group `group`: the functions `trait`, `raw` and `trait #2`
/// one after the other, then the interleaved A/B pass of [`size`]`(full)`. Each call of a
/// loop is `batch` operations.
pub fn compare(
    group: &str,
    raw: &str,
    batch: usize,
    full: (usize, usize),
    mut trait_loop: impl FnMut() -> u64,
    mut raw_loop: impl FnMut() -> u64,
) {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, group, batch, "trait", &mut trait_loop);
    bench(&mut c, group, batch, raw, &mut raw_loop);
    bench(&mut c, group, batch, "trait #2", &mut trait_loop);
    c.final_summary();
    run(group, batch, size(full), trait_loop, raw_loop);
}

fn bench(c: &mut Criterion, group: &str, batch: usize, name: &str, f: &mut impl FnMut() -> u64) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(batch as u64));
    g.bench_function(name, |bench| bench.iter(|| black_box(f())));
    g.finish();
}

/// Rounds and iterations for the pass: `HOT_PATH_AB=ROUNDS,ITERS` where set, else `full`
/// under `cargo bench` (which passes `--bench`), else a short smoke pass (`cargo test
/// --benches`).
/// A value that is not two counts of at least 1 stops the bench: a figure from other rounds
/// than asked for, or from none, would be quoted as the one asked for.
pub fn size(full: (usize, usize)) -> (usize, usize) {
    match std::env::var("HOT_PATH_AB") {
        Ok(v) => parse_size(&v).unwrap_or_else(|| {
            panic!("HOT_PATH_AB={v:?}: want ROUNDS,ITERS, two counts of at least 1 (e.g. 400,100)")
        }),
        Err(_) if std::env::args().any(|a| a == "--bench") => full,
        Err(_) => (3, 2),
    }
}

fn parse_size(v: &str) -> Option<(usize, usize)> {
    let (r, i) = v.split_once(',')?;
    let (r, i): (usize, usize) = (r.trim().parse().ok()?, i.trim().parse().ok()?);
    (r > 0 && i > 0).then_some((r, i))
}

/// ns per operation of `iters` calls of `f`, each call `ops` operations.
fn ns_per_op(iters: usize, ops: usize, f: &mut impl FnMut() -> u64) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        black_box(f());
    }
    t.elapsed().as_nanos() as f64 / (iters * ops).max(1) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Run `rounds` rounds of `iters` calls of the trait loop and then of the raw loop (each call
/// `ops` operations) and print the medians, minima and the median per-round difference.
pub fn run(
    group: &str,
    ops: usize,
    (rounds, iters): (usize, usize),
    mut trait_loop: impl FnMut() -> u64,
    mut raw_loop: impl FnMut() -> u64,
) {
    assert!(
        rounds > 0 && iters > 0 && ops > 0,
        "{group}: {rounds} rounds x {iters} iterations x {ops} ops measure nothing"
    );
    let (mut tt, mut rr, mut d) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let a = ns_per_op(iters, ops, &mut trait_loop);
        let b = ns_per_op(iters, ops, &mut raw_loop);
        tt.push(a);
        rr.push(b);
        d.push(a - b);
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (tmin, rmin) = (min(&tt), min(&rr));
    println!("{group} interleaved A/B, {rounds} rounds x {iters} iterations x {ops} ops:");
    println!(
        "  trait {:7.1} ns/op median, {:7.1} min",
        median(&mut tt),
        tmin
    );
    println!(
        "  raw   {:7.1} ns/op median, {:7.1} min",
        median(&mut rr),
        rmin
    );
    println!(
        "  trait - raw, median of per-round differences: {:.1} ns/op (min - min: {:.1})",
        median(&mut d),
        tmin - rmin
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_path_ab_takes_two_counts_of_at_least_one() {
        assert_eq!(parse_size("400,100"), Some((400, 100)));
        assert_eq!(parse_size(" 3 , 2 "), Some((3, 2)));
        for bad in ["0,100", "5,0", "400x100", "400", "", "-1,2", "a,b"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    #[should_panic(expected = "measure nothing")]
    fn a_pass_of_no_rounds_is_refused() {
        run("g", 32, (0, 10), || 0, || 0);
    }
}
