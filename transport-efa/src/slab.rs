//! Operation contexts without allocation.
//!
//! Every posted operation passes libfabric a pointer to one slot of a fixed slab. A slot
//! starts with a `struct fi_context2` (scratch space providers that need `FI_CONTEXT` /
//! `FI_CONTEXT2` write into) and holds the caller's `u64` context and the operation kind, so
//! a completion maps back to both with pointer arithmetic. The slab is sized at open time
//! (send queue depth + receive queue depth); free slots are kept on two index stacks whose
//! capacity never grows, so the hot path never allocates. A full stack is a full queue.

use std::ffi::c_void;
use std::ptr::NonNull;

use libfabric_sys as fi;
use transport_core::Op;

/// What a slot's operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Free = 0,
    Send,
    Recv,
    Write,
}

impl Kind {
    pub fn op(self) -> Op {
        match self {
            Kind::Send => Op::Send,
            Kind::Recv => Op::Recv,
            Kind::Write => Op::Write,
            Kind::Free => Op::Unknown,
        }
    }
}

#[repr(C)]
struct Slot {
    /// Must be first: the pointer handed to libfabric is the slot's address.
    fi_ctx: fi::fi_context2,
    user: u64,
    kind: Kind,
}

/// The slab. Owns its slots; they must outlive every operation posted with them, so the
/// endpoint is closed before the slab is dropped.
pub(crate) struct Slab {
    base: NonNull<Slot>,
    len: usize,
    tx_free: Stack,
    rx_free: Stack,
}

/// A stack of free slot indexes with a fixed capacity: every index it can ever hold.
struct Stack {
    items: Box<[u32]>,
    len: usize,
}

impl Stack {
    /// Full, with `range` in pop order lowest first.
    fn full(range: std::ops::Range<u32>) -> Self {
        let items: Box<[u32]> = range.rev().collect();
        Stack {
            len: items.len(),
            items,
        }
    }

    #[inline(always)]
    fn pop(&mut self) -> Option<u32> {
        let len = self.len.checked_sub(1)?;
        self.len = len;
        self.items.get(len).copied()
    }

    /// Push an index taken from this stack: there is always room (a slot is released once).
    #[inline(always)]
    fn push(&mut self, idx: u32) {
        if let Some(top) = self.items.get_mut(self.len) {
            *top = idx;
            self.len += 1;
        }
    }
}

impl Slab {
    /// `tx` send-side slots (SEND, WRITE) and `rx` receive slots.
    pub fn new(tx: usize, rx: usize) -> Self {
        let len = tx + rx;
        let slots: Vec<Slot> = (0..len)
            .map(|_| Slot {
                fi_ctx: fi::fi_context2::default(),
                user: 0,
                kind: Kind::Free,
            })
            .collect();
        let raw = Box::into_raw(slots.into_boxed_slice());
        // SAFETY: Box::into_raw never returns NULL (a zero-length slice gives a dangling,
        // non-null pointer).
        let base = unsafe { NonNull::new_unchecked(raw.cast::<Slot>()) };
        // Pop order: lowest index first (irrelevant, but stable for debugging).
        let tx_free = Stack::full(0..tx as u32);
        let rx_free = Stack::full(tx as u32..len as u32);
        Slab {
            base,
            len,
            tx_free,
            rx_free,
        }
    }

    /// Free send-side slots.
    #[inline]
    pub fn tx_free(&self) -> usize {
        self.tx_free.len
    }

    /// Take a slot for `kind`; `None` where that side is full.
    #[inline(always)]
    pub fn acquire(&mut self, kind: Kind, user: u64) -> Option<*mut c_void> {
        let idx = if kind == Kind::Recv {
            self.rx_free.pop()?
        } else {
            self.tx_free.pop()?
        } as usize;
        debug_assert!(idx < self.len);
        // SAFETY: idx < len (only valid indices are ever on the free stacks), so the slot is
        // inside the allocation; it is free, so libfabric holds no pointer to it now.
        unsafe {
            let slot = self.base.as_ptr().add(idx);
            (*slot).user = user;
            (*slot).kind = kind;
            Some(slot.cast())
        }
    }

    /// The slot index of a context pointer, where it is one of ours.
    #[inline(always)]
    fn index_of(&self, ctx: *mut c_void) -> Option<usize> {
        let base = self.base.as_ptr() as usize;
        let off = (ctx as usize).checked_sub(base)?;
        let size = std::mem::size_of::<Slot>();
        if off % size != 0 || off / size >= self.len {
            return None;
        }
        Some(off / size)
    }

    /// Give back the slot `ctx` points at (an operation completed or was not posted),
    /// returning its user context and kind. `None` where `ctx` is not a busy slot of ours
    /// (NULL for remote-write completions).
    #[inline(always)]
    pub fn release(&mut self, ctx: *mut c_void) -> Option<(u64, Kind)> {
        let idx = self.index_of(ctx)?;
        // SAFETY: idx < len, so the slot is inside the allocation. The provider has finished
        // with it: it reported the operation's completion (or the post failed).
        let (user, kind) = unsafe {
            let slot = self.base.as_ptr().add(idx);
            let k = (*slot).kind;
            if k == Kind::Free {
                return None;
            }
            (*slot).kind = Kind::Free;
            ((*slot).user, k)
        };
        // The stacks were allocated with every index on them, so pushing back a busy slot's
        // index always has room.
        if kind == Kind::Recv {
            self.rx_free.push(idx as u32);
        } else {
            self.tx_free.push(idx as u32);
        }
        Some((user, kind))
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.base.as_ptr(), self.len);
        // SAFETY: base/len come from Box::into_raw of a boxed slice of exactly len slots,
        // freed once here.
        drop(unsafe { Box::from_raw(raw) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_release_round_trip() {
        let mut s = Slab::new(2, 1);
        let a = s.acquire(Kind::Write, 7).expect("slot");
        let b = s.acquire(Kind::Send, 8).expect("slot");
        assert!(s.acquire(Kind::Write, 9).is_none(), "tx side is full");
        let r = s.acquire(Kind::Recv, 10).expect("rx slot");
        assert!(s.acquire(Kind::Recv, 11).is_none());
        assert_eq!(s.release(b), Some((8, Kind::Send)));
        assert_eq!(s.release(b), None, "double release is ignored");
        assert_eq!(s.release(a), Some((7, Kind::Write)));
        assert_eq!(s.release(r), Some((10, Kind::Recv)));
        assert_eq!(s.release(std::ptr::null_mut()), None);
        assert_eq!(s.release((a as usize + 1) as *mut c_void), None);
        assert_eq!(s.tx_free(), 2);
    }
}
