//! The slots whose operation (or a step of one) finished, in order: written by UCX's callbacks
//! inside progress, read by `poll`.

use std::cell::Cell;

/// A ring of slot indices behind shared references (the callbacks hold only `&Shared`). A slot
/// is in it at most once (queued when its operation or step finishes, taken out by `poll`
/// before it runs another), so a ring as large as the slab never overflows; no allocation,
/// no borrow flag.
pub(super) struct Done {
    ring: Box<[Cell<u32>]>,
    mask: u32,
    head: Cell<u32>,
    tail: Cell<u32>,
}

impl Done {
    /// A ring for a slab of `slots` slots.
    pub(super) fn new(slots: usize) -> Done {
        let n = slots.max(1).next_power_of_two();
        Done {
            ring: (0..n).map(|_| Cell::new(0)).collect(),
            mask: (n - 1) as u32,
            head: Cell::new(0),
            tail: Cell::new(0),
        }
    }

    #[inline]
    pub(super) fn push(&self, slot: u32) {
        let t = self.tail.get();
        debug_assert!(self.len() < self.ring.len(), "a slot was queued twice");
        self.ring[(t & self.mask) as usize].set(slot);
        self.tail.set(t.wrapping_add(1));
    }

    #[inline]
    pub(super) fn pop(&self) -> Option<u32> {
        let h = self.head.get();
        if h == self.tail.get() {
            return None;
        }
        self.head.set(h.wrapping_add(1));
        Some(self.ring[(h & self.mask) as usize].get())
    }

    #[inline]
    pub(super) fn len(&self) -> usize {
        self.tail.get().wrapping_sub(self.head.get()) as usize
    }

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.head.get() == self.tail.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_in_first_out_across_the_wrap() {
        let d = Done::new(3);
        for round in 0..5u32 {
            for k in 0..3 {
                d.push(round * 10 + k);
            }
            assert_eq!(d.len(), 3);
            for k in 0..3 {
                assert_eq!(d.pop(), Some(round * 10 + k));
            }
            assert!(d.is_empty() && d.pop().is_none());
        }
    }
}
