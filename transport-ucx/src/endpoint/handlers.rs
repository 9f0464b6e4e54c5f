//! UCX's callbacks: a request finished (send, put, flush, active message, receive), an
//! immediate or a WRITE carried whole arrived, a peer failed. Each writes into the
//! endpoint's slab or queues, nothing else.

use super::*;

/// A send, put, flush or active message finished (or failed): note it in its slot and queue
/// the slot.
pub(super) unsafe extern "C" fn on_send(
    _req: *mut c_void,
    status: sys::ucs_status_t,
    user: *mut c_void,
) {
    // SAFETY: user is the `&Slot` given at post: the slab lives as long as the worker whose
    // progress calls this, and slots are only read through shared references (Cells).
    let s = unsafe { &*(user as *const Slot) };
    s.status.set(status);
    // SAFETY: `shared` points at the Box<Shared> that holds this slot.
    let shared = unsafe { &*s.shared.get() };
    if s.state.get() == State::Send {
        let n = &shared.sends_unfinished;
        n.set(n.get().saturating_sub(1));
    }
    shared.done.push(s.index);
}

/// A receive finished: its length is in `info`.
pub(super) unsafe extern "C" fn on_recv(
    _req: *mut c_void,
    status: sys::ucs_status_t,
    info: *const sys::ucp_tag_recv_info_t,
    user: *mut c_void,
) {
    // SAFETY: as in on_send.
    let s = unsafe { &*(user as *const Slot) };
    s.status.set(status);
    if !info.is_null() {
        // SAFETY: UCX passes a valid info for the call's duration; the slot's `info` is only
        // read in poll, not while progress runs.
        unsafe { *s.info.get() = *info };
    }
    // SAFETY: as in on_send.
    let shared = unsafe { &*s.shared.get() };
    shared.done.push(s.index);
}

/// An immediate arrived: its 4-byte header is the value. Runs after the flush that made the
/// WRITE's bytes visible here had completed at the initiator.
pub(super) unsafe extern "C" fn on_imm(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    _data: *mut c_void,
    _len: usize,
    _param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    if header_len != 4 || header.is_null() {
        return sys::UCS_OK;
    }
    // SAFETY: UCX passes header_len (4, checked) readable bytes; read unaligned.
    let imm = unsafe { ptr::read_unaligned(header as *const u32) };
    // SAFETY: arg is the endpoint's boxed Shared (set with the handler, alive with the worker).
    let shared = unsafe { &*(arg as *const Shared) };
    shared.imms.borrow_mut().push_back(u32::from_le(imm));
    sys::UCS_OK
}

/// A WRITE with immediate carried whole (`AM_WRITE_IMM`): copy the bytes to the address its
/// header names, then queue the immediate, so the immediate is never seen before the bytes.
pub(super) unsafe extern "C" fn on_write_imm(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX's arguments for this handler, passed on as they came.
    if let Some((shared, imm)) = unsafe { land(arg, header, header_len, data, len, param) } {
        shared.imms.borrow_mut().push_back(imm);
    }
    sys::UCS_OK
}

/// A WRITE without immediate carried whole (`AM_WRITE`, option `write=am`): copy the bytes
/// to the address its header names.
pub(super) unsafe extern "C" fn on_write(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: as in on_write_imm.
    unsafe { land(arg, header, header_len, data, len, param) };
    sys::UCS_OK
}

/// The bytes of an `AM_WRITE` or `AM_WRITE_IMM`, copied to the address its header names;
/// the endpoint's queues and the header's immediate, or `None` where nothing was written. A
/// range outside the host region whose token the header names (or a token of no region
/// here: a stale or foreign key), a header of another size or a rendezvous is dropped (an
/// honest peer checked the range against the key it imported before sending). Nothing is
/// sent back.
///
/// # Safety
/// UCX's arguments to an active message handler of this endpoint's worker, whose `arg` is the
/// endpoint's boxed `Shared`.
unsafe fn land<'a>(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> Option<(&'a Shared, u32)> {
    if header_len != INLINE_HDR || header.is_null() || (len > 0 && data.is_null()) {
        return None;
    }
    // SAFETY: UCX passes a valid param for the call's duration where it passes one.
    if !param.is_null() && unsafe { (*param).recv_attr } & AM_RECV_ATTR_FLAG_RNDV != 0 {
        return None;
    }
    let mut h = [0u8; INLINE_HDR];
    // SAFETY: UCX passes header_len (INLINE_HDR, checked) readable bytes at header.
    unsafe { ptr::copy_nonoverlapping(header as *const u8, h.as_mut_ptr(), INLINE_HDR) };
    let imm = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let mut a = [0u8; 8];
    a.copy_from_slice(&h[4..12]);
    let addr = u64::from_le_bytes(a) as usize;
    a.copy_from_slice(&h[12..20]);
    let token = u64::from_le_bytes(a);
    // SAFETY: arg is the endpoint's boxed Shared (set with the handler, alive with the worker);
    // no borrow of its RefCells is held while progress runs.
    let shared = unsafe { &*(arg as *const Shared) };
    let fits = shared.host_regions.borrow().iter().any(|r| {
        r.token == token
            && addr >= r.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= r.base + r.len)
    });
    if !fits {
        return None;
    }
    if len > 0 {
        // SAFETY: [addr, addr + len) lies in a host region this endpoint registered (checked
        // above), whose memory stays allocated while it is in the table (deregister removes
        // it; a dropped region's memory waits in the graveyard until the endpoint goes); the
        // data are len readable bytes UCX passes for the call (not a rendezvous, checked).
        unsafe { ptr::copy_nonoverlapping(data as *const u8, addr as *mut u8, len) };
    }
    Some((shared, imm))
}

/// A peer's endpoint failed: remember UCX's status; later posts to it are refused.
pub(super) unsafe extern "C" fn on_peer_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: arg is the peer's boxed `Peer`, which lives until after its ucp_ep is closed.
    let p = unsafe { &*(arg as *const Peer) };
    p.failed.set(status);
}
