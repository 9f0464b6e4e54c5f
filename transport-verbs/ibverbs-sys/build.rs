//! Generates the bindings with bindgen (libclang 14 or newer: 14 and 16 give the same bindings)
//! and compiles the C wrappers for the verbs calls that rdma-core only offers as `static
//! inline` functions or macros.

use std::env;
use std::path::{Path, PathBuf};

/// Where Debian and Ubuntu put libclang: the newest `/usr/lib/llvm-N/lib` with N >= 14.
fn default_libclang_dir() -> Option<PathBuf> {
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in std::fs::read_dir("/usr/lib").ok()?.flatten() {
        let name = entry.file_name();
        let Some(v) = name.to_str().and_then(|n| n.strip_prefix("llvm-")) else {
            continue;
        };
        let Ok(v) = v.parse::<u32>() else { continue };
        let lib = entry.path().join("lib");
        if v >= 14 && lib.join("libclang.so").exists() && best.as_ref().is_none_or(|b| v > b.0) {
            best = Some((v, lib));
        }
    }
    best.map(|b| b.1)
}

fn main() {
    println!("cargo:rerun-if-changed=src/wrapper.h");
    println!("cargo:rerun-if-changed=src/wrappers.c");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    println!("cargo:rerun-if-env-changed=IBVERBS_INCLUDE_DIR");

    // libibverbs: pkg-config first (libibverbs-dev ships libibverbs.pc), plain -libverbs else.
    let mut includes: Vec<PathBuf> = Vec::new();
    match pkg_config::Config::new()
        .atleast_version("1.8")
        .probe("libibverbs")
    {
        Ok(lib) => includes.extend(lib.include_paths),
        Err(e) => {
            println!("cargo:warning=pkg-config found no libibverbs ({e}); linking -libverbs");
            println!("cargo:rustc-link-lib=ibverbs");
        }
    }
    if let Ok(dir) = env::var("IBVERBS_INCLUDE_DIR") {
        includes.insert(0, dir.into());
    }
    let header_ok = includes
        .iter()
        .map(|d| d.as_path())
        .chain([Path::new("/usr/include"), Path::new("/usr/local/include")])
        .any(|d| d.join("infiniband/verbs.h").exists());
    if !header_ok {
        panic!(
            "infiniband/verbs.h not found: install rdma-core's development headers \
             (Debian/Ubuntu: `apt-get install libibverbs-dev`; RHEL: `rdma-core-devel`), \
             or set IBVERBS_INCLUDE_DIR"
        );
    }

    // The C wrappers.
    let mut build = cc::Build::new();
    build.file("src/wrappers.c").include("src").warnings(true);
    for d in &includes {
        build.include(d);
    }
    build.compile("ibverbs_wrappers");
    // The wrappers call into libibverbs: keep it after the static archive on the link line.
    println!("cargo:rustc-link-lib=ibverbs");

    // bindgen needs libclang at run time; point clang-sys at the newest LLVM when nobody else did.
    if env::var_os("LIBCLANG_PATH").is_none() {
        if let Some(dir) = default_libclang_dir() {
            // The build script is single-threaded here, and bindgen has not loaded libclang yet.
            env::set_var("LIBCLANG_PATH", &dir);
        }
    }

    let mut builder = bindgen::Builder::default()
        .header("src/wrapper.h")
        .clang_arg("-Isrc")
        .allowlist_function("ibv_.*")
        .allowlist_function("ibvs_.*")
        .allowlist_type("ibv_.*")
        // IB_UVERBS_ACCESS_OPTIONAL_RANGE: what IBV_ACCESS_OPTIONAL_RANGE names (a macro bindgen
        // cannot follow to the enum value).
        .allowlist_type("ib_uverbs_access_flags")
        .allowlist_var("IBV_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .impl_debug(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for d in &includes {
        builder = builder.clang_arg(format!("-I{}", d.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        panic!(
            "bindgen failed on infiniband/verbs.h: {e}. It needs libclang 14 or newer: \
             install libclang-dev (or libclang-16-dev) and set LIBCLANG_PATH=/usr/lib/llvm-N/lib"
        )
    });
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}
