//! Turning libfabric return codes into [`transport_core::Error`]s.

use std::ffi::CStr;

use libfabric_sys as fi;
use transport_core::Error;

/// `fi_strerror` of a libfabric error number (positive or negative).
pub(crate) fn strerror(code: i64) -> String {
    let errnum = code.unsigned_abs().min(i32::MAX as u64) as i32;
    // SAFETY: fi_strerror accepts any int and returns a pointer to a static NUL-terminated
    // string (or a strerror() buffer that stays valid until the next call on this thread);
    // it is copied out at once.
    let p = unsafe { fi::fi_strerror(errnum) };
    if p.is_null() {
        return format!("libfabric error {errnum}");
    }
    // SAFETY: non-null pointer to a NUL-terminated string, see above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A failed libfabric call as [`Error::Provider`]: `ret` is what the call returned
/// (a negative `FI_E*`), `hint` says what to do about it.
pub(crate) fn provider(call: &'static str, ret: i64, hint: impl Into<String>) -> Error {
    Error::Provider {
        call,
        code: ret.clamp(i32::MIN as i64, i32::MAX as i64) as i32,
        msg: strerror(ret),
        hint: hint.into(),
    }
}

/// The version of the libfabric library loaded at run time, as `major.minor`.
pub(crate) fn runtime_version() -> String {
    // SAFETY: fi_version takes no arguments and only returns a number.
    let v = unsafe { fi::fi_version() };
    format!("{}.{}", fi::fi_major(v), fi::fi_minor(v))
}

/// The major version of the libfabric library in use.
pub(crate) fn runtime_major() -> u32 {
    // SAFETY: fi_version takes no arguments and only returns a number.
    let v = unsafe { fi::fi_version() };
    fi::fi_major(v)
}

/// A C string owned by libfabric (or NULL) as a Rust string.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the caller promises a valid NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
