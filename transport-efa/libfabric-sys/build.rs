//! Build script for libfabric-sys.
//!
//! 1. Finds libfabric with pkg-config (`libfabric.pc`). Debian's `libfabric-dev` (1.17) is
//!    found as is; the EFA installer's 2.x under `/opt/amazon/efa` is found by putting its
//!    pkgconfig folder first: `PKG_CONFIG_PATH=/opt/amazon/efa/lib/pkgconfig` (`lib64` on
//!    some distributions). `LIBFABRIC_NO_PKG_CONFIG=1` skips pkg-config and uses
//!    `LIBFABRIC_INCLUDE_DIR` / `LIBFABRIC_LIB_DIR` instead.
//! 2. Compiles `csrc/rs_fi.c`, real functions around libfabric's `static inline` API.
//! 3. Generates Rust bindings with bindgen. bindgen needs libclang: it is found through
//!    `LIBCLANG_PATH` (a folder holding `libclang.so`, e.g. `/usr/lib/llvm-16/lib`) or
//!    clang-sys's default search (`llvm-config --libdir`, `/usr/lib/llvm-*/lib`, ...).

use std::collections::HashSet;
use std::env;
use std::path::{Path, PathBuf};

/// Types the `#define` constants by what they are: the error numbers are exactly the macros
/// `rdma/fi_errno.h` defines (`FI_EAGAIN`, `FI_ENOKEY`, ...), compared with negated
/// `int`/`ssize_t` returns, so `i32`; every other `FI_*`/`FID_*` macro is a capability, mode
/// or flag bit, a 64-bit mask. A name prefix cannot tell them apart: 2.x added
/// `FI_EXACT_DIRECTED_RECV (1ULL << 48)`, a flag that starts like an error name.
#[derive(Debug)]
struct IntTypes {
    errnos: HashSet<String>,
}

impl IntTypes {
    /// The macro names `#define`d in `fi_errno.h` (lines commented out with `//` excluded).
    fn from_headers(include_paths: &[PathBuf]) -> Self {
        let header = include_paths
            .iter()
            .map(|p| p.join("rdma/fi_errno.h"))
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("/usr/include/rdma/fi_errno.h"));
        println!("cargo:rerun-if-changed={}", header.display());
        let text = std::fs::read_to_string(&header).unwrap_or_else(|e| {
            panic!(
                "reading {}: {e}; the libfabric headers look incomplete (reinstall                  libfabric-dev, or point PKG_CONFIG_PATH at a complete install)",
                header.display()
            )
        });
        let errnos = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("#define"))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .collect::<HashSet<_>>();
        assert!(
            errnos.contains("FI_EAGAIN"),
            "{} defines no FI_EAGAIN: not libfabric's error header",
            header.display()
        );
        IntTypes { errnos }
    }
}

impl bindgen::callbacks::ParseCallbacks for IntTypes {
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        if self.errnos.contains(name) || name.starts_with("RS_FI_OPT_") {
            // Error numbers, and option names (`int optname`).
            Some(IntKind::I32)
        } else if name.starts_with("FI_") || name.starts_with("FID_") {
            // Capability, mode and flag bits are 64-bit masks.
            Some(IntKind::U64)
        } else {
            None
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/rs_fi.c");
    println!("cargo:rerun-if-changed=csrc/rs_fi.h");
    // pkg-config is asked without cargo metadata, so name its inputs here: another
    // PKG_CONFIG_PATH (another libfabric) must regenerate the bindings.
    for var in [
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
        "LIBCLANG_PATH",
        "LIBFABRIC_NO_PKG_CONFIG",
        "LIBFABRIC_INCLUDE_DIR",
        "LIBFABRIC_LIB_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let (include_paths, link_paths) = find_libfabric();

    // The C wrappers first, so the linker sees them before -lfabric.
    let mut cc = cc::Build::new();
    cc.file("csrc/rs_fi.c")
        .include("csrc")
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2);
    for p in &include_paths {
        cc.include(p);
    }
    cc.compile("rs_fi");

    for p in &link_paths {
        println!("cargo:rustc-link-search=native={}", p.display());
    }
    println!("cargo:rustc-link-lib=dylib=fabric");
    if let Some(p) = include_paths.first() {
        // Dependents' build scripts can read this as DEP_FABRIC_INCLUDE.
        println!("cargo:include={}", p.display());
    }

    let mut builder = bindgen::Builder::default()
        .header("csrc/rs_fi.h")
        .clang_arg("-Icsrc")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .parse_callbacks(Box::new(IntTypes::from_headers(&include_paths)))
        .allowlist_function("fi_.*")
        .allowlist_function("rs_fi_.*")
        .allowlist_type("fi_.*|fid.*|rs_fi_.*")
        .allowlist_var("FI_.*|FID_.*|RS_FI_.*")
        // The static inline functions are reached through csrc/rs_fi.c only.
        .generate_inline_functions(false)
        // Structs whose fields moved between 1.x and 2.x: Rust never looks inside them.
        .opaque_type("fi_mr_attr")
        .opaque_type("fi_mr_dmabuf")
        .opaque_type("fi_domain_attr")
        .opaque_type("fid_nic")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(false)
        .size_t_is_usize(true);
    for p in &include_paths {
        builder = builder.clang_arg(format!("-I{}", p.display()));
    }
    let bindings = match builder.generate() {
        Ok(b) => b,
        Err(e) => panic!(
            "bindgen failed on the libfabric headers: {e}.\n\
             bindgen needs libclang: install libclang-dev (Debian: `apt-get install libclang-dev`) \
             or point LIBCLANG_PATH at the folder holding libclang.so, e.g. \
             LIBCLANG_PATH=/usr/lib/llvm-16/lib"
        ),
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs into OUT_DIR");
}

/// Include and library folders of libfabric.
fn find_libfabric() -> (Vec<PathBuf>, Vec<PathBuf>) {
    if env::var_os("LIBFABRIC_NO_PKG_CONFIG").is_some() {
        let inc = env::var_os("LIBFABRIC_INCLUDE_DIR").map(PathBuf::from);
        let lib = env::var_os("LIBFABRIC_LIB_DIR").map(PathBuf::from);
        return (inc.into_iter().collect(), lib.into_iter().collect());
    }
    match pkg_config::Config::new()
        .atleast_version("1.17")
        .cargo_metadata(false)
        .probe("libfabric")
    {
        Ok(lib) => {
            let mut inc = lib.include_paths.clone();
            // Debian's libfabric.pc has an empty Cflags: the headers are in /usr/include.
            if inc.is_empty() {
                let guess = Path::new("/usr/include");
                if guess.join("rdma/fabric.h").exists() {
                    inc.push(guess.to_path_buf());
                }
            }
            (inc, lib.link_paths)
        }
        Err(e) => panic!(
            "libfabric >= 1.17 not found by pkg-config: {e}\n\
             Install it (Debian/Ubuntu: `apt-get install libfabric-dev`), or on an EFA host \
             point pkg-config at the EFA installer's copy: \
             PKG_CONFIG_PATH=/opt/amazon/efa/lib/pkgconfig (or .../lib64/pkgconfig), \
             or set LIBFABRIC_NO_PKG_CONFIG=1 with LIBFABRIC_INCLUDE_DIR and LIBFABRIC_LIB_DIR."
        ),
    }
}
