//! The hot-path benches' interleaved A/B pass: the trait loop and the bare-calls loop of a
//! backend, timed in alternating blocks with both sets of endpoints open, reported as the
//! median of the per-round differences (which cancels drift slower than one round).

use std::hint::black_box;
use std::time::Instant;

/// Rounds and iterations for the pass: `HOT_PATH_AB=ROUNDS,ITERS` where set, else `full`
/// under `cargo bench` (which passes `--bench`), else a short smoke pass (`cargo test
/// --benches`).
pub fn size(full: (usize, usize)) -> (usize, usize) {
    std::env::var("HOT_PATH_AB")
        .ok()
        .and_then(|v| {
            let (r, i) = v.split_once(',')?;
            Some((r.trim().parse().ok()?, i.trim().parse().ok()?))
        })
        .unwrap_or(if std::env::args().any(|a| a == "--bench") {
            full
        } else {
            (3, 2)
        })
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
