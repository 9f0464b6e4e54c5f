//! The memory UCX runs the slab's operations in (`UCP_OP_ATTR_FIELD_REQUEST`): one request per
//! slot, so no operation takes a request from UCX's pool or hands one back
//! (`ucp_request_free`), which a receive that completes in progress otherwise pays each time.

use std::alloc::{self, Layout};
use std::ffi::c_void;
use std::ptr::NonNull;

use transport_core::{Error, Result};

/// `n` requests of UCX's `ucp_context_attr_t::request_size` bytes, each at a 64-byte boundary.
/// A field of the endpoint's `Shared`, dropped only after `Endpoint::drop` destroyed the
/// worker: UCX may write into a request until its operation ended, which the worker's
/// destruction forces.
pub(super) struct Requests {
    base: NonNull<u8>,
    layout: Layout,
    stride: usize,
    size: usize,
}

impl Requests {
    pub(super) fn new(n: usize, size: usize) -> Result<Requests> {
        let too_big = || Error::InvalidArgument(format!("{n} UCX requests of {size} bytes"));
        if size == 0 || n == 0 {
            return Err(Error::InvalidArgument(format!(
                "UCX reported a request size of {size} bytes for {n} slots"
            )));
        }
        let stride = size.checked_next_multiple_of(64).ok_or_else(too_big)?;
        let total = stride.checked_mul(n).ok_or_else(too_big)?;
        let layout = Layout::from_size_align(total, 64).map_err(|_| too_big())?;
        // SAFETY: the layout's size is non-zero (n and size are).
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(p) else {
            alloc::handle_alloc_error(layout)
        };
        Ok(Requests {
            base,
            layout,
            stride,
            size,
        })
    }

    /// The handle of request `i` as UCX takes it (`ucp_request_param_t::request`) and returns
    /// it: the request itself is the `size` bytes before it.
    pub(super) fn handle(&self, i: usize) -> *mut c_void {
        assert!(
            i < self.layout.size() / self.stride,
            "request {i} out of range"
        );
        // SAFETY: i * stride + size <= total (i < n, size <= stride): within the allocation
        // or one past its end, which UCX never reads (no user part: request_size is UCX's own).
        unsafe { self.base.as_ptr().add(i * self.stride + self.size) as *mut c_void }
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { alloc::dealloc(self.base.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_has_its_own_aligned_bytes() {
        let r = Requests::new(3, 200).unwrap();
        let h: Vec<usize> = (0..3).map(|i| r.handle(i) as usize).collect();
        for (i, &a) in h.iter().enumerate() {
            assert_eq!(
                (a - 200) % 64,
                0,
                "request {i} is not on a 64-byte boundary"
            );
            if i > 0 {
                assert!(
                    a - 200 >= h[i - 1],
                    "request {i} overlaps request {}",
                    i - 1
                );
            }
        }
        assert!(Requests::new(0, 200).is_err() && Requests::new(4, 0).is_err());
    }
}
