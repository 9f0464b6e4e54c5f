//! UCX's callbacks: a request finished (send, put, flush, active message, receive), an
//! immediate or a WRITE carried whole arrived (or landed, by rendezvous), a peer failed. Each
//! writes into the endpoint's slab or queues, or has UCX receive into a region, nothing else.

use super::*;

/// The active message id of an immediate; its header is the immediate (4) and the
/// initiator's origin (8, `frame::origin`), little endian.
pub(super) const AM_IMM: u32 = 0x1d;
/// Header of an `AM_IMM`.
pub(super) const IMM_HDR: usize = 12;
/// The active message id of a WRITE with immediate carried whole: the header is the
/// immediate, the target address, the region's token and the initiator's origin, the data
/// the bytes ([`INLINE_MAX`] at most, or any number to a peer whose WRITEs are active
/// messages). Into host memory it is sent eager: the target assembles a message of many
/// fragments in a buffer of its size, then the handler copies it into the region. Into GPU
/// memory it is sent as a rendezvous (`UCP_AM_SEND_FLAG_RNDV`), which the handler has UCX
/// receive into the region (`ucp_am_recv_data_nbx`, with a CUDA copy), the immediate queued
/// once that completed.
pub(super) const AM_WRITE_IMM: u32 = 0x1e;
/// The active message id of a WRITE without immediate carried whole: the header is
/// `AM_WRITE_IMM`'s, its immediate unused.
pub(super) const AM_WRITE: u32 = 0x1f;
/// Largest WRITE with immediate sent as one active message (host memory on both sides, no
/// put of this peer unflushed): UCX 1.22 runs every put into heap memory over cma, one
/// process_vm_writev per put, which an 8-byte credit WRITE paid on every 64 messages.
pub(super) const INLINE_MAX: usize = 64;
/// Header of an `AM_WRITE_IMM`: immediate (4), target address (8), the target region's token
/// (8, from its key) and the initiator's origin (8, `frame::origin`), little endian.
pub(super) const INLINE_HDR: usize = 28;
/// `UCP_AM_RECV_ATTR_FLAG_RNDV` (ucp.h: `UCS_BIT(17)` in 1.13 and 1.22; not in the bindings).
pub(super) const AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;

/// A send, put, flush or active message finished (or failed): note it in its slot and queue
/// the slot.
/// # Safety
/// UCX calls it, inside the post call or `ucp_worker_progress`, for a request posted with
/// `params`: `user` is a `Slot` of a live endpoint's slab.
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
/// # Safety
/// As [`on_send`]; `info`, where not null, is valid for the call.
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

/// An immediate arrived: its header is the value and the initiator's origin. Runs after the
/// flush that made the WRITE's bytes visible here had completed at the initiator.
/// # Safety
/// UCX calls it as the `AM_IMM` handler set at open: `arg` is the endpoint's boxed `Shared`,
/// and `header_len` bytes are readable at `header`.
pub(super) unsafe extern "C" fn on_imm(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    _data: *mut c_void,
    _len: usize,
    _param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    if header_len != IMM_HDR || header.is_null() {
        return sys::UCS_OK;
    }
    let mut h = [0u8; IMM_HDR];
    // SAFETY: UCX passes header_len (IMM_HDR, checked) readable bytes at header.
    unsafe { ptr::copy_nonoverlapping(header as *const u8, h.as_mut_ptr(), IMM_HDR) };
    let (imm, origin) = read_imm_header(&h);
    // SAFETY: arg is the endpoint's boxed Shared (set with the handler, alive with the worker).
    let shared = unsafe { &*(arg as *const Shared) };
    queue(shared, origin, Some(imm));
    sys::UCS_OK
}

/// A WRITE with immediate carried whole (`AM_WRITE_IMM`): the bytes land at the address its
/// header names, then the immediate is queued, so the immediate is never seen before the
/// bytes.
/// # Safety
/// As [`land`]: UCX calls it as the `AM_WRITE_IMM` handler set at open.
pub(super) unsafe extern "C" fn on_write_imm(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX's arguments for this handler, passed on as they came.
    unsafe { land(arg, header, header_len, data, len, param, true) }
}

/// A WRITE without immediate carried whole (`AM_WRITE`): the bytes land at the address its
/// header names.
/// # Safety
/// As [`land`]: UCX calls it as the `AM_WRITE` handler set at open.
pub(super) unsafe extern "C" fn on_write(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: as in on_write_imm.
    unsafe { land(arg, header, header_len, data, len, param, false) }
}

/// The bytes of an `AM_WRITE` or `AM_WRITE_IMM`, landed at the address its header names, and
/// its immediate (`with_imm`) queued after them. An eager message into host memory is copied
/// here; a rendezvous (into any memory: the sender asks for one into GPU memory) UCX
/// receives into the region (`ucp_am_recv_data_nbx`), and `on_landed` queues the immediate
/// once it completed. Every immediate waits behind the rendezvous that arrived before it
/// (`Landings`). Nothing is sent back but what UCX's rendezvous sends itself. A range
/// outside the region whose token the header names (or a token of no region here: a stale
/// or foreign key), a header of another size or an eager message into GPU memory is dropped
/// (an honest peer checked the range against the key it imported before sending); a
/// rendezvous so dropped completes the sender's send with `UCS_ERR_INVALID_PARAM`.
///
/// # Safety
/// UCX's arguments to an active message handler of this endpoint's worker, whose `arg` is the
/// endpoint's boxed `Shared`.
unsafe fn land(
    arg: *mut c_void,
    header: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const sys::ucp_am_recv_param_t,
    with_imm: bool,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes a valid param for the call's duration where it passes one.
    let rndv = !param.is_null() && unsafe { (*param).recv_attr } & AM_RECV_ATTR_FLAG_RNDV != 0;
    let refused = if rndv {
        sys::UCS_ERR_INVALID_PARAM
    } else {
        sys::UCS_OK
    };
    if header_len != INLINE_HDR || header.is_null() || (len > 0 && data.is_null()) {
        return refused;
    }
    let mut h = [0u8; INLINE_HDR];
    // SAFETY: UCX passes header_len (INLINE_HDR, checked) readable bytes at header.
    unsafe { ptr::copy_nonoverlapping(header as *const u8, h.as_mut_ptr(), INLINE_HDR) };
    let (imm, addr, token, origin) = read_write_header(&h);
    let (imm, addr) = (with_imm.then_some(imm), addr as usize);
    // SAFETY: arg is the endpoint's boxed Shared (set with the handler, alive with the worker);
    // no borrow of its RefCells is held while progress runs.
    let shared = unsafe { &*(arg as *const Shared) };
    let region = shared.landable.borrow().iter().copied().find(|r| {
        r.token == token
            && addr >= r.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= r.base + r.len)
    });
    let Some(region) = region else {
        return refused;
    };
    if rndv {
        let mut p = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE,
            user_data: arg,
            memory_type: region.mtype,
            ..Default::default()
        };
        p.cb.recv_am = Some(on_landed);
        // SAFETY: the worker is this handler's; data is the rendezvous descriptor UCX passed
        // (it takes it over); [addr, addr + len) lies in a region this endpoint registered
        // (checked above) of the memory type named, whose memory stays allocated while it is
        // in the table (a dropped region's waits in the graveyard until the endpoint goes,
        // after its worker); the callback's user_data is the boxed Shared, alive with the
        // worker.
        let r =
            unsafe { sys::ucp_am_recv_data_nbx(shared.worker, data, addr as *mut c_void, len, &p) };
        match sys::ptr_status(r) {
            Ok(None) => queue(shared, origin, imm),
            Ok(Some(req)) => shared.landings.borrow_mut().begin(origin, req, imm),
            // UCX owns the descriptor and completes the sender's send; nothing landed.
            Err(_) => {}
        }
        return sys::UCS_INPROGRESS;
    }
    if region.mtype != sys::UCS_MEMORY_TYPE_HOST {
        return sys::UCS_OK;
    }
    if len > 0 {
        // SAFETY: [addr, addr + len) lies in a host region this endpoint registered (checked
        // above), whose memory stays allocated while it is in the table (deregister removes
        // it; a dropped region's memory waits in the graveyard until the endpoint goes); the
        // data are len readable bytes UCX passes for the call (not a rendezvous, checked).
        unsafe { ptr::copy_nonoverlapping(data as *const u8, addr as *mut u8, len) };
    }
    queue(shared, origin, imm);
    sys::UCS_OK
}

// The two headers' layouts, written by the initiator's post and read by these handlers.

/// An `AM_IMM`'s header: immediate `imm` from `origin`.
pub(super) fn imm_header(imm: u32, origin: u64) -> [u8; IMM_HDR] {
    let mut h = [0u8; IMM_HDR];
    h[..4].copy_from_slice(&imm.to_le_bytes());
    h[4..].copy_from_slice(&origin.to_le_bytes());
    h
}

/// An `AM_IMM`'s immediate and origin.
fn read_imm_header(h: &[u8; IMM_HDR]) -> (u32, u64) {
    (le32(&h[..4]), le64(&h[4..]))
}

/// An `AM_WRITE` or `AM_WRITE_IMM`'s header: immediate `imm` (unused in `AM_WRITE`), the
/// target address `addr` in the region of token `token`, from `origin`.
pub(super) fn write_header(imm: u32, addr: u64, token: u64, origin: u64) -> [u8; INLINE_HDR] {
    let mut h = [0u8; INLINE_HDR];
    h[..4].copy_from_slice(&imm.to_le_bytes());
    h[4..12].copy_from_slice(&addr.to_le_bytes());
    h[12..20].copy_from_slice(&token.to_le_bytes());
    h[20..].copy_from_slice(&origin.to_le_bytes());
    h
}

/// An `AM_WRITE` or `AM_WRITE_IMM`'s immediate, address, token and origin.
fn read_write_header(h: &[u8; INLINE_HDR]) -> (u32, u64, u64, u64) {
    (
        le32(&h[..4]),
        le64(&h[4..12]),
        le64(&h[12..20]),
        le64(&h[20..]),
    )
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// Queue the immediate, if any, of a WRITE from `origin` whose bytes are in: behind any
/// rendezvous of that initiator that arrived before it and is still landing (`Landings`).
fn queue(shared: &Shared, origin: u64, imm: Option<u32>) {
    if let Some(v) = imm {
        let mut imms = shared.imms.borrow_mut();
        shared.landings.borrow_mut().arrived(origin, v, &mut imms);
    }
}

/// UCX finished receiving a rendezvous WRITE into a region (`land`): release its immediate
/// where its bytes are in, and those held behind it, in order (`Landings`); free the request.
/// # Safety
/// UCX calls it once, for a request `ucp_am_recv_data_nbx` returned in [`land`]: `user_data`
/// is the endpoint's boxed `Shared`.
pub(super) unsafe extern "C" fn on_landed(
    request: *mut c_void,
    status: sys::ucs_status_t,
    _length: usize,
    user_data: *mut c_void,
) {
    // SAFETY: user_data is the endpoint's boxed Shared (given in `land`), alive with the
    // worker whose progress calls this.
    let shared = unsafe { &*(user_data as *const Shared) };
    let mut imms = shared.imms.borrow_mut();
    let landed = status == sys::UCS_OK;
    shared
        .landings
        .borrow_mut()
        .finish(request, landed, &mut imms);
    // SAFETY: a request ucp_am_recv_data_nbx returned, completed now, freed once.
    unsafe { sys::ucp_request_free(request) };
}

/// A peer's endpoint failed: remember UCX's status; later posts to it are refused.
/// # Safety
/// UCX calls it as the error handler of a peer's `ucp_ep`: `arg` is that peer's boxed `Peer`,
/// alive until after the `ucp_ep` is closed.
pub(super) unsafe extern "C" fn on_peer_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    // SAFETY: arg is the peer's boxed `Peer`, which lives until after its ucp_ep is closed.
    let p = unsafe { &*(arg as *const Peer) };
    p.failed.set(status);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a post writes, a handler reads back, field by field.
    #[test]
    fn headers_read_back_what_was_written() {
        let origin = 0x0102_0304_0506_0708;
        assert_eq!(
            read_imm_header(&imm_header(0xdead_beef, origin)),
            (0xdead_beef, origin)
        );
        let h = write_header(7, 0x7f00_0000_1000, 0xabcd, origin);
        assert_eq!(read_write_header(&h), (7, 0x7f00_0000_1000, 0xabcd, origin));
    }
}
