//! Receives for immediates, where the provider asks for them (`FI_RX_CQ_DATA`).
//!
//! Under the `FI_RX_CQ_DATA` mode a peer's WRITE with immediate data consumes a receive
//! posted at the target, and its completion comes back with that receive's context. efa's
//! `efa-direct` fabric asks for it on devices without "unsolicited write receive"
//! (`efa_user_info.c`). Application SENDs consume receives too, from the same queue, so
//! immediates get an endpoint of their own (the *data endpoint*, in the same domain and on the
//! same CQ and AV): peers aim their WRITEs at it, and it holds nothing but these receives, so
//! a SEND never lands in one and an immediate never takes an application buffer.
//!
//! Each receive is zero bytes long into one small registered buffer (efa-direct wants a
//! descriptor for every receive, even an empty one), with a context of its own; a completion
//! reposts the same receive at once, from `poll`, without allocating.

use std::ffi::c_void;
use std::ptr;

use libfabric_sys as fi;

/// Receives kept posted on the data endpoint, at most (fewer where the receive queue is
/// shorter): a run of more immediates than this holds only because each completed receive is
/// posted again.
pub const MAX_IMM_RECVS: usize = 1024;

/// One receive's context: scratch space for providers that need `FI_CONTEXT2`.
#[repr(C, align(64))]
#[derive(Default)]
struct Ctx {
    _fi_ctx: fi::fi_context2,
}

/// The data endpoint's receives.
pub(crate) struct ImmRecvs {
    /// The data endpoint; closed by the owning endpoint, before the contexts are freed.
    pub ep: *mut fi::fid_ep,
    ctxs: Box<[Ctx]>,
    /// Where every receive points: a registered buffer of [`BUF_LEN`] bytes.
    buf: *mut c_void,
    desc: *mut c_void,
    /// Receives that could not be reposted yet (`-FI_EAGAIN`), by index; never grows past
    /// the number of contexts (reserved at open).
    pending: Vec<u32>,
}

/// Bytes of the buffer every immediate receive points into.
pub(crate) const BUF_LEN: usize = 64;

impl ImmRecvs {
    /// `n` receive contexts for data endpoint `ep`, all pointing into `buf` (registered, with
    /// descriptor `desc`).
    pub fn new(ep: *mut fi::fid_ep, n: usize, buf: *mut c_void, desc: *mut c_void) -> Self {
        let n = n.clamp(1, MAX_IMM_RECVS);
        ImmRecvs {
            ep,
            ctxs: (0..n).map(|_| Ctx::default()).collect(),
            buf,
            desc,
            pending: Vec::with_capacity(n),
        }
    }

    /// How many receives there are.
    pub fn len(&self) -> usize {
        self.ctxs.len()
    }

    /// Post receive `i`; the provider's return code.
    #[inline]
    fn post(&mut self, i: usize) -> isize {
        let ctx: *mut c_void = (&mut self.ctxs[i] as *mut Ctx).cast();
        // SAFETY: ep is the enabled data endpoint; the zero-length receive reads no byte of
        // buf (which stays registered as long as this struct, and desc with it); ctx is a
        // context of this struct, alive until the endpoint is closed.
        unsafe { fi::rs_fi_recv(self.ep, self.buf, 0, self.desc, fi::FI_ADDR_UNSPEC_, ctx) }
    }

    /// Post every receive (at open). The first error other than `-FI_EAGAIN` is returned.
    pub fn post_all(&mut self) -> std::result::Result<(), isize> {
        for i in 0..self.len() {
            let ret = self.post(i);
            if ret == -(fi::FI_EAGAIN as isize) {
                self.pending.push(i as u32);
            } else if ret != 0 {
                return Err(ret);
            }
        }
        Ok(())
    }

    /// The index of `ctx` where it is one of these receives.
    #[inline(always)]
    pub fn index_of(&self, ctx: *mut c_void) -> Option<usize> {
        const SIZE: usize = std::mem::size_of::<Ctx>();
        let base = self.ctxs.as_ptr() as usize;
        let off = (ctx as usize).wrapping_sub(base);
        let idx = off / SIZE;
        (off.is_multiple_of(SIZE) && idx < self.ctxs.len()).then_some(idx)
    }

    /// Receive `i` completed: post it again, or keep it for [`Self::retry`] where the queue
    /// is full.
    #[inline]
    pub fn repost(&mut self, i: usize) {
        if self.post(i) != 0 && self.pending.len() < self.pending.capacity() {
            self.pending.push(i as u32);
        }
    }

    /// Post again what [`Self::repost`] could not (called from every poll; nothing to do in
    /// the common case). A failure other than `-FI_EAGAIN` is returned (the receive stays
    /// pending, so every later retry meets it again until it posts).
    #[inline]
    pub fn retry(&mut self) -> std::result::Result<(), isize> {
        while let Some(&i) = self.pending.last() {
            let ret = self.post(i as usize);
            if ret == -(fi::FI_EAGAIN as isize) {
                return Ok(());
            }
            if ret != 0 {
                return Err(ret);
            }
            self.pending.pop();
        }
        Ok(())
    }
}

impl Drop for ImmRecvs {
    fn drop(&mut self) {
        // The owning endpoint closed `ep` (cancelling the receives) before dropping this.
        self.ep = ptr::null_mut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_map_back_to_their_index() {
        let r = ImmRecvs::new(ptr::null_mut(), 3, ptr::null_mut(), ptr::null_mut());
        assert_eq!(r.len(), 3);
        for i in 0..3 {
            let p = (&r.ctxs[i] as *const Ctx).cast_mut().cast();
            assert_eq!(r.index_of(p), Some(i));
        }
        assert_eq!(r.index_of(ptr::null_mut()), None);
        let inside = (r.ctxs.as_ptr() as usize + 8) as *mut c_void;
        assert_eq!(r.index_of(inside), None);
        let past = (r.ctxs.as_ptr() as usize + 3 * 64) as *mut c_void;
        assert_eq!(r.index_of(past), None);
        assert_eq!(
            ImmRecvs::new(ptr::null_mut(), 0, ptr::null_mut(), ptr::null_mut()).len(),
            1
        );
    }

    /// What the fake provider's `fi_recv` returns.
    static RECV_RET: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

    /// A provider's `recv` op that posts nothing and returns `RECV_RET`.
    unsafe extern "C" fn fake_recv(
        _ep: *mut fi::fid_ep,
        _buf: *mut c_void,
        _len: usize,
        _desc: *mut c_void,
        _src: fi::fi_addr_t,
        _ctx: *mut c_void,
    ) -> isize {
        RECV_RET.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn a_repost_that_fails_other_than_eagain_is_reported_until_it_posts() {
        let set = |r: i32| RECV_RET.store(r as isize, std::sync::atomic::Ordering::Relaxed);
        // An endpoint whose only op is the fake `recv` (`fi_recv` calls `ep->msg->recv`).
        let mut msg = fi::fi_ops_msg {
            size: std::mem::size_of::<fi::fi_ops_msg>(),
            recv: Some(fake_recv),
            ..Default::default()
        };
        let mut ep = fi::fid_ep {
            msg: &mut msg,
            ..Default::default()
        };
        let mut r = ImmRecvs::new(&mut ep, 2, ptr::null_mut(), ptr::null_mut());
        set(-fi::FI_EAGAIN);
        r.repost(0);
        assert_eq!(r.pending, [0], "a full queue keeps the receive for later");
        assert_eq!(r.retry(), Ok(()), "a queue still full is not an error");
        set(-fi::FI_EINVAL);
        let einval = -(fi::FI_EINVAL as isize);
        assert_eq!(r.retry(), Err(einval));
        assert_eq!(r.retry(), Err(einval), "every poll meets it until it posts");
        assert_eq!(r.pending, [0], "the receive is not dropped");
        set(0);
        assert_eq!(r.retry(), Ok(()));
        assert!(r.pending.is_empty());
        // A repost that fails outright is kept too, and reported by the next retry.
        set(-fi::FI_EINVAL);
        r.repost(1);
        assert_eq!(r.retry(), Err(einval));
    }
}
