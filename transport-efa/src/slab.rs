//! Operation contexts without allocation.
//!
//! Every posted operation passes libfabric a pointer to one slot of a fixed slab. A slot
//! starts with a `struct fi_context2` (scratch space providers that need `FI_CONTEXT` /
//! `FI_CONTEXT2` write into) and holds the caller's `u64` context and the operation kind, so
//! a completion maps back to both with pointer arithmetic. The slab is sized at open time
//! (send queue depth + receive queue depth); free slots are chained through the slots
//! themselves on two lists (send side, receive side), so taking and giving back a slot is a
//! few loads and stores and the hot path never allocates. An empty list is a full queue.

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

/// The end of a free list.
const NONE: u32 = u32::MAX;

/// 128 bytes (a power of two: a context pointer maps back to its index with a mask and a
/// shift, no division), aligned to a cache line so no two slots share one.
#[repr(C, align(64))]
struct Slot {
    /// Must be first: the pointer handed to libfabric is the slot's address.
    fi_ctx: fi::fi_context2,
    user: u64,
    /// The next free slot on this slot's list while it is free.
    next: u32,
    kind: Kind,
}

/// The slab. Owns its slots; they must outlive every operation posted with them, so the
/// endpoint is closed before the slab is dropped.
pub(crate) struct Slab {
    base: NonNull<Slot>,
    len: usize,
    /// Heads of the free lists: send side (SEND, WRITE) and receive side. Only indexes below
    /// `len` are ever linked.
    tx_head: u32,
    rx_head: u32,
    tx_free: usize,
    /// Slots of both sides that an operation holds: none, and no operation of the endpoint
    /// uses a region (what a region dropped meanwhile waits for, see `grave.rs`).
    busy: usize,
}

impl Slab {
    /// `tx` send-side slots (SEND, WRITE) and `rx` receive slots.
    pub fn new(tx: usize, rx: usize) -> Self {
        let len = tx + rx;
        assert!(len < NONE as usize, "slab of {len} slots");
        // Each side's slots linked in index order, lowest first.
        let slots: Vec<Slot> = (0..len)
            .map(|i| {
                let next = i + 1;
                let end = if i < tx { tx } else { len };
                Slot {
                    fi_ctx: fi::fi_context2::default(),
                    user: 0,
                    next: if next < end { next as u32 } else { NONE },
                    kind: Kind::Free,
                }
            })
            .collect();
        let raw = Box::into_raw(slots.into_boxed_slice());
        // SAFETY: Box::into_raw never returns NULL (a zero-length slice gives a dangling,
        // non-null pointer).
        let base = unsafe { NonNull::new_unchecked(raw.cast::<Slot>()) };
        Slab {
            base,
            len,
            tx_head: if tx > 0 { 0 } else { NONE },
            rx_head: if rx > 0 { tx as u32 } else { NONE },
            tx_free: tx,
            busy: 0,
        }
    }

    /// Free send-side slots.
    #[inline]
    pub fn tx_free(&self) -> usize {
        self.tx_free
    }

    /// Whether no operation holds a slot.
    #[inline(always)]
    pub fn idle(&self) -> bool {
        self.busy == 0
    }

    /// Take a slot for `kind`; `None` where that side is full.
    #[inline(always)]
    pub fn acquire(&mut self, kind: Kind, user: u64) -> Option<*mut c_void> {
        let recv = kind == Kind::Recv;
        let head = if recv { self.rx_head } else { self.tx_head };
        if head == NONE {
            return None;
        }
        debug_assert!((head as usize) < self.len);
        // SAFETY: only indexes below len are ever linked (new and release), so the slot is
        // inside the allocation; it is free, so libfabric holds no pointer to it now.
        unsafe {
            let slot = self.base.as_ptr().add(head as usize);
            let next = (*slot).next;
            if recv {
                self.rx_head = next;
            } else {
                self.tx_head = next;
                self.tx_free -= 1;
            }
            (*slot).user = user;
            (*slot).kind = kind;
            self.busy += 1;
            Some(slot.cast())
        }
    }

    /// The slot index of a context pointer, where it is one of ours.
    #[inline(always)]
    fn index_of(&self, ctx: *mut c_void) -> Option<usize> {
        const SIZE: usize = std::mem::size_of::<Slot>();
        const _: () = assert!(SIZE.is_power_of_two());
        let off = (ctx as usize).wrapping_sub(self.base.as_ptr() as usize);
        let idx = off / SIZE;
        // One branch: below base wraps to a huge offset, so `idx < len` rejects it too.
        if !off.is_multiple_of(SIZE) || idx >= self.len {
            return None;
        }
        Some(idx)
    }

    /// Give back the slot `ctx` points at (an operation completed or was not posted),
    /// returning its user context and kind. `None` where `ctx` is not a busy slot of ours
    /// (NULL for remote-write completions).
    #[inline(always)]
    pub fn release(&mut self, ctx: *mut c_void) -> Option<(u64, Kind)> {
        let idx = self.index_of(ctx)?;
        // SAFETY: idx < len, so the slot is inside the allocation. The provider has finished
        // with it: it reported the operation's completion (or the post failed). A busy slot
        // is on no list, so linking it cannot make a cycle.
        unsafe {
            let slot = self.base.as_ptr().add(idx);
            let kind = (*slot).kind;
            if kind == Kind::Free {
                return None;
            }
            (*slot).kind = Kind::Free;
            self.busy -= 1;
            if kind == Kind::Recv {
                (*slot).next = self.rx_head;
                self.rx_head = idx as u32;
            } else {
                (*slot).next = self.tx_head;
                self.tx_head = idx as u32;
                self.tx_free += 1;
            }
            Some(((*slot).user, kind))
        }
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
        assert!(s.idle(), "every slot given back");
        // Slots come back in any order and can all be taken again, each once.
        let mut got: Vec<_> = (0..2).map(|i| s.acquire(Kind::Write, i).unwrap()).collect();
        assert!(s.acquire(Kind::Send, 9).is_none());
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 2);
        assert_eq!(s.tx_free(), 0);
        assert!(!s.idle());
    }

    #[test]
    fn empty_sides() {
        let mut s = Slab::new(0, 0);
        assert!(s.acquire(Kind::Write, 1).is_none());
        assert!(s.acquire(Kind::Recv, 1).is_none());
        assert_eq!(s.release(std::ptr::null_mut()), None);
    }
}
