//! Raw bindings to UCX's UCP API, generated at build time with bindgen (libclang 14 or newer)
//! from the system's `ucp/api/ucp.h` (found through pkg-config `ucx`), limited to the calls
//! `transport-ucx` makes. Links libucp and libucs.
//!
//! `ucp_init` is a `static inline` wrapper in the header: call `ucp_init_version` with
//! [`UCP_API_MAJOR`] and [`UCP_API_MINOR`], as it does. `UCS_PTR_IS_ERR` and friends are
//! macros: [`ptr_status`] does what they do.
//!
//! Enums are plain constants without the enum's name (`UCS_OK`), each enum a type alias of
//! its integer type.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(clippy::all)]
#![allow(rustdoc::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

extern "C" {
    /// Pushes a handler on UCX's log stack that writes each message but a fatal one to
    /// stderr (or stdout, see [`rs_ucx_log_stream`]), a prefix on each line, and stops UCX's
    /// own printing; fatal messages go on to UCX's handler, which aborts (`csrc/log.c`).
    /// Once per process, before its first UCP context: pushing is not thread-safe.
    pub fn rs_ucx_log_push();
    /// Where the pushed handler writes: stdout where `to_stdout` is non-zero, else stderr.
    pub fn rs_ucx_log_stream(to_stdout: ::std::os::raw::c_int);
}

/// What a `ucs_status_ptr_t` holds: `Ok(None)` for `NULL` (done at once), `Ok(Some(req))` for a
/// request in flight, `Err(status)` for an error code (UCX's `UCS_PTR_IS_ERR`: the pointer is
/// an error code in `[UCS_ERR_LAST, -1]`).
#[inline]
pub fn ptr_status(p: ucs_status_ptr_t) -> Result<Option<ucs_status_ptr_t>, ucs_status_t> {
    let v = p as isize;
    if v == 0 {
        Ok(None)
    } else if v < 0 && v >= UCS_ERR_LAST as isize {
        Err(v as ucs_status_t)
    } else {
        Ok(Some(p))
    }
}
