//! Generates the bindings with bindgen (libclang 14 or newer: 14 and 16 give the same bindings)
//! from the system's `ucp/api/ucp.h`, found through pkg-config (`ucx.pc`, Debian's
//! `libucx-dev`), compiles the log handler (`csrc/log.c`), and links libucp and libucs.

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
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    println!("cargo:rerun-if-env-changed=UCX_INCLUDE_DIR");

    // UCX: pkg-config first (libucx-dev ships ucx.pc), plain -lucp -lucs else.
    let mut includes: Vec<PathBuf> = Vec::new();
    match pkg_config::Config::new()
        .atleast_version("1.12")
        .cargo_metadata(false)
        .probe("ucx")
    {
        Ok(lib) => {
            includes.extend(lib.include_paths);
            for d in &lib.link_paths {
                println!("cargo:rustc-link-search=native={}", d.display());
            }
        }
        Err(e) => println!("cargo:warning=pkg-config found no ucx ({e}); linking -lucp -lucs"),
    }
    if let Ok(dir) = env::var("UCX_INCLUDE_DIR") {
        includes.insert(0, dir.into());
    }
    let header_ok = includes
        .iter()
        .map(|d| d.as_path())
        .chain([Path::new("/usr/include"), Path::new("/usr/local/include")])
        .any(|d| d.join("ucp/api/ucp.h").exists());
    if !header_ok {
        panic!(
            "ucp/api/ucp.h not found: install UCX's development headers (Debian/Ubuntu: \
             `apt-get install libucx-dev`; RHEL: `ucx-devel`), or set UCX_INCLUDE_DIR"
        );
    }

    // The log handler (csrc/log.c), linked before the libraries it calls.
    println!("cargo:rerun-if-changed=csrc/log.c");
    let mut cc = cc::Build::new();
    cc.file("csrc/log.c")
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2);
    for d in &includes {
        cc.include(d);
    }
    cc.compile("rs_ucx_log");
    // Only what the bindings call: UCP, and UCS for ucs_status_string and the log handler.
    println!("cargo:rustc-link-lib=ucp");
    println!("cargo:rustc-link-lib=ucs");

    if env::var_os("LIBCLANG_PATH").is_none() {
        if let Some(dir) = default_libclang_dir() {
            // The build script is single-threaded here, and bindgen has not loaded libclang yet.
            env::set_var("LIBCLANG_PATH", &dir);
        }
    }

    let mut builder = bindgen::Builder::default()
        .header("src/wrapper.h")
        // Only the calls transport-ucx makes, and what they take.
        .allowlist_function("ucp_(init_version|cleanup|config_read|config_release|config_modify)")
        .allowlist_function("ucp_(get_version|get_version_string|context_query|context_print_info)")
        .allowlist_function("ucp_worker_(create|destroy|progress|get_address|release_address)")
        .allowlist_function("ucp_worker_set_am_recv_handler")
        .allowlist_function("ucp_ep_(create|close_nbx|flush_nbx|rkey_unpack|print_info)")
        .allowlist_function("ucp_(mem_map|mem_unmap|rkey_pack|rkey_buffer_release|rkey_destroy)")
        .allowlist_function("ucp_(put_nbx|am_send_nbx|am_recv_data_nbx|tag_send_nbx|tag_recv_nbx)")
        .allowlist_function("ucp_request_(free|cancel|check_status)")
        .allowlist_function("ucs_status_string")
        .allowlist_var("UC[PS]_API_(MAJOR|MINOR)")
        .allowlist_type("ucs_memory_type")
        .allowlist_type("ucp_(params_field|feature|worker_params_field|ep_params_field)")
        .allowlist_type("ucp_(err_handling_mode_t|ep_close_flags_t|mem_map_params_field)")
        .allowlist_type("ucp_(op_attr_t|am_handler_param_field|am_cb_flags|am_send_flags)")
        .allowlist_type("ucp_(context_attr_field|am_recv_attr)")
        .allowlist_type("ucp_send_am_flags")
        .allowlist_type("ucs_(status_t|thread_mode_t)")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .impl_debug(false)
        .generate_comments(false)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for d in &includes {
        builder = builder.clang_arg(format!("-I{}", d.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|e| {
        panic!(
            "bindgen failed on ucp/api/ucp.h: {e}. It needs libclang 14 or newer: install \
             libclang-dev (or libclang-16-dev) and set LIBCLANG_PATH=/usr/lib/llvm-N/lib"
        )
    });
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}
