//! UCX's log off stdout. UCX prints its warnings and errors to stdout unless `UCX_LOG_FILE`
//! says otherwise, after `--json`'s document, and libucs reads that variable before `main`.
//! So the first endpoint or probe of a process pushes a handler (ucx-sys's `csrc/log.c`)
//! that writes them to stderr, unless the user set `UCX_LOG_FILE` (UCX's own handler then
//! writes where it says) or `UCX_LOG_LEVEL_TRIGGER` (the levels that abort: the handler
//! leaves only FATAL to UCX). Fatal messages always go to UCX's handler, which aborts.

use std::sync::Once;

use ucx_sys as sys;

/// Pushes the handler once per process, before its first UCP context, where neither
/// `UCX_LOG_FILE` nor `UCX_LOG_LEVEL_TRIGGER` is set.
pub(crate) fn off_stdout() {
    static PUSH: Once = Once::new();
    PUSH.call_once(|| {
        let set = |k| std::env::var_os(k).is_some_and(|v| !v.is_empty());
        if !set("UCX_LOG_FILE") && !set("UCX_LOG_LEVEL_TRIGGER") {
            // SAFETY: called once (Once), before this process opened a UCP context; the
            // handler lives in the static library for the whole process.
            unsafe { sys::rs_ucx_log_push() };
        }
    });
}

/// Runs `f` with the handler writing to stdout, where the doctor captures UCX's words.
pub(crate) fn on_stdout<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: an atomic store of a flag the handler reads.
    unsafe { sys::rs_ucx_log_stream(1) };
    let r = f();
    // SAFETY: as above.
    unsafe { sys::rs_ucx_log_stream(0) };
    r
}
