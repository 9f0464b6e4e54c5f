//! Error helpers.

use transport_core::Error;

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `strerror` text for an errno value (positive or negative).
pub(crate) fn errno_text(e: i32) -> String {
    std::io::Error::from_raw_os_error(e.abs()).to_string()
}

/// A failed verbs call with its errno text and what to do.
pub(crate) fn provider_err(call: &'static str, code: i32, hint: impl Into<String>) -> Error {
    Error::Provider {
        call,
        code: code.abs(),
        msg: errno_text(code),
        hint: hint.into(),
    }
}

/// The memlock hint every registration and queue creation error carries.
pub(crate) const MEMLOCK_HINT: &str =
    "if this is ENOMEM or EPERM, raise the locked-memory limit (`ulimit -l unlimited`, or \
     memlock in /etc/security/limits.conf / LimitMEMLOCK= for services)";

/// `Ok` where a verbs call returned 0, else its error with `hint`.
pub(crate) fn check(rc: i32, call: &'static str, hint: impl Into<String>) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(provider_err(call, rc, hint))
    }
}

/// A fixed-size C char array (NUL-terminated, or full to its end) as trimmed text.
pub(crate) fn c_text(a: &[std::os::raw::c_char]) -> String {
    let b: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&b).trim().to_string()
}
