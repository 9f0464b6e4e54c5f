//! `RDMA_BENCH_COMMIT`: the git commit this rdma-bench is built from (the run record's
//! `commit`), or `unknown` where the workspace is not a git work tree of its own.

#[path = "build/commit.rs"]
mod commit;

fn main() {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
    let workspace = std::path::Path::new(&manifest).join("..");
    let (hash, watch) = commit::commit(&workspace);
    println!("cargo:rustc-env=RDMA_BENCH_COMMIT={hash}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/commit.rs");
    for p in watch {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
