//! UCX's statuses as this crate's errors: UCX's own text, and what to do.

use std::ffi::CStr;

use transport_core::{hint, Error, Result};
use ucx_sys as sys;

/// UCX's own text for `status`.
pub(crate) fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string takes any status value and returns a pointer to a static,
    // NUL-terminated string (an "unknown" one for values it does not know).
    let p = unsafe { sys::ucs_status_string(status) };
    if p.is_null() {
        return format!("UCX status {status}");
    }
    // SAFETY: p is non-null and points to a static NUL-terminated string (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// What to do about an operation UCX failed, by its status; never empty.
pub(super) fn completion_hint(status: sys::ucs_status_t) -> &'static str {
    match status {
        sys::UCS_ERR_CANCELED => {
            "cancelled because the endpoint to this peer failed or is closing: look for the \
             first error"
        }
        sys::UCS_ERR_MESSAGE_TRUNCATED => hint::TOO_LONG,
        sys::UCS_ERR_UNREACHABLE | sys::UCS_ERR_NOT_CONNECTED | sys::UCS_ERR_REJECTED => {
            "the peer cannot be reached: check that it runs and the address it sent, and that \
             UCX_TLS leaves a transport both sides share"
        }
        sys::UCS_ERR_CONNECTION_RESET | sys::UCS_ERR_TIMED_OUT => hint::PEER_GONE,
        s if (sys::UCS_ERR_LAST_LINK_FAILURE..=sys::UCS_ERR_FIRST_LINK_FAILURE).contains(&s) => {
            "the link to the peer failed: check the NIC and its port, then reopen both ends"
        }
        s if (sys::UCS_ERR_LAST_ENDPOINT_FAILURE..=sys::UCS_ERR_FIRST_ENDPOINT_FAILURE)
            .contains(&s) =>
        {
            hint::PEER_GONE
        }
        _ => "run again with UCX_LOG_LEVEL=warn (or debug) for UCX's own log of it",
    }
}

pub(super) fn provider_error(call: &'static str, status: sys::ucs_status_t, hint: &str) -> Error {
    Error::Provider {
        call,
        code: i32::from(status),
        msg: status_text(status),
        hint: hint.to_string(),
    }
}

pub(super) fn check(call: &'static str, status: sys::ucs_status_t, hint: &str) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(provider_error(call, status, hint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Endpoint;
    use transport_core::{CompletionKind, Op};

    #[test]
    fn every_failed_status_has_a_hint() {
        for st in sys::UCS_ERR_LAST..0 {
            assert!(!completion_hint(st).is_empty(), "status {st}");
        }
        assert!(completion_hint(sys::UCS_ERR_ENDPOINT_TIMEOUT).contains("still runs"));
        assert!(completion_hint(sys::UCS_ERR_MESSAGE_TRUNCATED).contains("larger receives"));
        assert!(completion_hint(-45).contains("link"));
        let c = Endpoint::completion_error(Op::Send, 3, sys::UCS_ERR_CANCELED, "tagged send");
        let CompletionKind::Error(e) = c.kind else {
            panic!("not an error: {c:?}")
        };
        let text = e.to_string();
        assert!(text.contains("tagged send") && text.ends_with("look for the first error"));
    }

    #[test]
    fn status_text_is_ucx_own() {
        assert_eq!(status_text(sys::UCS_OK), "Success");
        assert!(status_text(sys::UCS_ERR_NO_DEVICE).contains("No such device"));
    }
}
