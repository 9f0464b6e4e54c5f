//! The command ring: its memory layout (the ABI a GPU kernel or a CPU thread writes) and the
//! protocol both sides follow.
//!
//! # Layout (version 2; offsets in bytes from the start of the block, all little-endian)
//! The ring lives in one contiguous block the caller provides, 64-byte aligned, at least
//! [`RingLayout::bytes`] long. For a GPU producer it is host memory the GPU can reach:
//! `cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE)` (no write-combining:
//! the proxy reads it) with the kernel given `cuMemHostGetDevicePointer`'s pointer and the
//! proxy the host pointer. Every word below sits on its own 64-byte cache line, so a producer
//! spinning on one does not steal the line the proxy writes.
//!
//! | offset                         | size      | word            | written by       | read by            |
//! |--------------------------------|-----------|-----------------|------------------|--------------------|
//! | 0                              | 4         | magic [`MAGIC`] | [`Ring::init`]   | [`Ring::attach`]   |
//! | 4                              | 4         | version [`VERSION`] | init         | attach             |
//! | 8                              | 4         | capacity (commands, a power of two) | init | all          |
//! | 12                             | 4         | arrival slots (counters)            | init | all          |
//! | 16                             | 8         | block length in bytes               | init | attach       |
//! | [`OFF_HEAD`] = 64              | 8         | head: positions claimed | producers (atomic add) | producers |
//! | [`OFF_TAIL`] = 128             | 8         | tail: positions consumed | proxy (Release)  | producers (Acquire) |
//! | [`OFF_DONE`] = 192             | 8         | done: commands completed locally | proxy (Release) | waiters (Acquire) |
//! | [`OFF_ERROR`] = 256            | 4         | error word ([`ERR_NONE`], ...)  | proxy (Release)  | everyone (Acquire) |
//! | [`OFF_ARRIVALS`] = 320 + 64 i  | 8         | arrivals\[i\]: counted immediates | proxy (Release) | waiters (Acquire) |
//! | 320 + 64 slots + 32 k          | 32        | command slot k ([`Command`]) | producers | proxy |
//!
//! Positions are 64-bit and only grow; position `p` lives in slot `p & (capacity - 1)`.
//!
//! # The command ([`Command`], 32 bytes: four 64-bit words, little-endian)
//! | offset | size | field    | meaning |
//! |--------|------|----------|---------|
//! | 0      | 4    | `seq`    | the ready word: `(p + 1) as u32` for position `p` ([`seq_for`]) |
//! | 4      | 4    | `len`    | bytes to write |
//! | 8      | 4    | `imm`    | the immediate ([`OP_WRITE_IMM`] only); `imm >> 16` names the arrival counter it bumps at the receiver ([`ARRIVAL_SHIFT`]) |
//! | 12     | 1    | `op`     | [`OP_WRITE`], [`OP_WRITE_IMM`], [`OP_FENCE`] |
//! | 13     | 1    | `flags`  | bit 7: the lap flag; bits 6..0 reserved, 0 |
//! | 14     | 2    | `peer`   | index into the proxy's peer table |
//! | 16     | 8    | `local`  | bit 63: the lap flag; local region index (bits 62..47) and byte offset in it (bits 46..0): [`pack`] |
//! | 24     | 8    | `remote` | bit 63: the lap flag; the peer's region index (bits 62..47) and byte offset (bits 46..0) |
//!
//! Every word of a published command says which lap it belongs to: word 0 by `seq`, words
//! 1-3 by their lap flag, [`lap_flag`]`(p)` = 1 on the ring's first lap (the block starts
//! zeroed), 0 on the second, and so on. A word is stored and loaded whole (an aligned 64-bit
//! access, single-copy atomic on the CPU and, `st.relaxed.sys`, in the PTX memory model), so
//! once all four are this lap's the command is the producer's, whatever order its words
//! landed in: no fence is needed between them (NCCL's LL protocol carries a flag in every
//! 8-byte word for the same reason). A fence is needed only for what the command points at.
//!
//! [`OP_FENCE`] carries nothing but its position and `op`: the proxy posts nothing after it
//! until every command before it has completed locally (a flush; "data, fence, flag" orders
//! the flag after the data on fabrics that do not order WRITEs).
//!
//! # Protocol, and which fence orders what
//! **Producer** (a GPU thread, or a CPU thread through [`Ring::push`]), for one command:
//! 1. Claim a position: `p = atomic add(head, 1)`; on the GPU `atomicAdd_system` (or
//!    `atomicAdd` where one GPU is the only producer). The proxy never reads `head`, so
//!    producers may instead claim positions with any counter they share (a warp leader, a
//!    counter in GPU memory), as long as every position is claimed exactly once.
//! 2. Wait for room: until `p - tail < capacity`, reading `tail` with Acquire (GPU: a
//!    volatile or `ld.acquire.sys` load), and give up when the error word is non-zero
//!    (the proxy is gone or failed: nothing more will be consumed).
//! 3. Store words 1-3 ([`Command::words`]), each whole (GPU: `st.relaxed.sys.u64`).
//! 4. Store word 0, either
//!    - **ordered** (the default: GPU `proxy_push`, every CPU [`Ring::push`]): with
//!      **Release**, system scope (GPU: `st.release.sys`). It orders every store this thread
//!      made before, above all to the source buffer the NIC is about to read, before the
//!      command; or
//!    - **unfenced** (GPU `proxy_push_unfenced`): a relaxed store like the others. Valid
//!      only when the thread wrote none of the source bytes since its last system-scope
//!      fence: they were in place before the kernel was launched (what the benchmark's
//!      latency kernel and `proxy_issue` publish), or the kernel fenced after writing them.
//!      It saves the fence, 0.56 us of the PCIe floor's round trip on an H200 (`figures_latency_sync`,
//!      docs/measurements.md).
//!
//! **Proxy** (one thread per ring, [`crate::Proxy`]), at its position `t` (= tail):
//! 1. Load slot `t`'s four words (relaxed, each whole); the command is ready when word 0's
//!    `seq` is `(t + 1) as u32` (a stale lap never is: capacity is at most 2^24) and words
//!    1-3 carry `t`'s lap flag ([`Command::from_words`]); then an **Acquire** fence, which
//!    pairs with an ordered producer's Release: its source bytes are visible after it.
//! 2. Post (batched: everything ready from `t` on, up to a fence or a
//!    batch's worth, in one `post_writes` call).
//! 3. For what was accepted: store `tail` with **Release**: the slots are free again, and the
//!    Release orders the proxy's reads of them before a producer's next writes. A command the
//!    queue did not take stays in its slot (tail does not pass it) and is posted again after
//!    a poll: never dropped.
//!
//! **Counters** (`done`, `arrivals[i]`): monotonic, written by the proxy alone with a
//! **Release** store after the event they count: `done` after the WRITE's local completion
//! (its source buffer may be reused); `arrivals[i]` at the receiver after the RemoteWrite
//! completions carrying `imm >> 16 == i` were polled **and**, for a landing region in GPU
//! memory, after `make_gpu_visible` on it returned. A waiter loads them with **Acquire** (GPU:
//! `ld.acquire.sys`, or a volatile load followed by `__threadfence_system()`) and then reads the
//! landed bytes. "N WRITEs landed at the peer" is known only from `arrivals` at the peer,
//! never from local completions: libfabric RDM and EFA's SRD deliver out of order.
//!
//! **Error word**: 0 while the proxy runs. The proxy stores a non-zero code (Release) before it
//! returns: [`ERR_STOPPED`] when asked to stop, else the reason it failed. Producers and
//! waiters check it whenever they spin, so nothing hangs on a dead proxy.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod layout;
mod stall;
pub use layout::*;
pub use stall::StallWatch;

/// A view of a ring in memory someone else owns (a `cuMemHostAlloc` block, a [`RingMemory`]).
///
/// Every shared word, command words included, is read and written atomically; a command is
/// taken by the proxy only once all its words carry their position's lap, and written by a
/// producer only after it saw the slot freed (Acquire of tail).
#[derive(Clone, Copy, Debug)]
pub struct Ring<'a> {
    base: NonNull<u8>,
    capacity: u32,
    slots: u32,
    _mem: PhantomData<&'a [u8]>,
}

// SAFETY: the ring is shared memory by design: every word two threads touch is accessed
// atomically, and the protocol above gives each command slot to one side at a time.
unsafe impl Send for Ring<'_> {}
// SAFETY: as above.
unsafe impl Sync for Ring<'_> {}

impl<'a> Ring<'a> {
    /// Lay out a fresh ring in `len` bytes at `base`: zero them and write the header.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes for `'a`, and nobody else may
    /// use it as anything but this ring for `'a`. Only one side calls `init` (the others
    /// [`attach`](Ring::attach)).
    pub unsafe fn init(base: *mut u8, len: usize, layout: RingLayout) -> Result<Self, RingError> {
        let base = Self::check_block(base, len, layout.bytes())?;
        // SAFETY: the caller gives us `len >= layout.bytes()` writable bytes at `base`.
        unsafe { std::ptr::write_bytes(base.as_ptr(), 0, layout.bytes()) };
        let ring = Self {
            base,
            capacity: layout.capacity,
            slots: layout.arrival_slots,
            _mem: PhantomData,
        };
        ring.u32_at(8).store(layout.capacity, Ordering::Relaxed);
        ring.u32_at(12)
            .store(layout.arrival_slots, Ordering::Relaxed);
        ring.u64_at(16)
            .store(layout.bytes() as u64, Ordering::Relaxed);
        ring.u32_at(4).store(VERSION, Ordering::Relaxed);
        ring.u32_at(0).store(MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// A view of a ring another side laid out with [`init`](Ring::init).
    ///
    /// # Safety
    /// As for [`init`](Ring::init): `base` valid for `len` bytes for `'a`, used only as this
    /// ring.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Result<Self, RingError> {
        let base = Self::check_block(base, len, OFF_ARRIVALS)?;
        let header = Self {
            base,
            capacity: 2,
            slots: 1,
            _mem: PhantomData,
        };
        let (magic, version) = (
            header.u32_at(0).load(Ordering::Acquire),
            header.u32_at(4).load(Ordering::Relaxed),
        );
        if magic != MAGIC || version != VERSION {
            return Err(RingError::Layout(format!(
                "no version-{VERSION} ring here (magic {magic:#x}, version {version})"
            )));
        }
        let layout = RingLayout::new(
            header.u32_at(8).load(Ordering::Relaxed),
            header.u32_at(12).load(Ordering::Relaxed),
        )?;
        Self::check_block(base.as_ptr(), len, layout.bytes())?;
        Ok(Self {
            base,
            capacity: layout.capacity,
            slots: layout.arrival_slots,
            _mem: PhantomData,
        })
    }

    fn check_block(base: *mut u8, len: usize, need: usize) -> Result<NonNull<u8>, RingError> {
        let base = NonNull::new(base).ok_or_else(|| RingError::Layout("null block".into()))?;
        if !(base.as_ptr() as usize).is_multiple_of(LINE) {
            return Err(RingError::Layout(format!(
                "block at {:p} is not {LINE}-byte aligned",
                base.as_ptr()
            )));
        }
        if len < need {
            return Err(RingError::Layout(format!(
                "block of {len} bytes; the ring needs {need}"
            )));
        }
        Ok(base)
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is a 4-aligned offset inside the header (checked at init/attach), the
        // block outlives 'a, and the word is only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast()) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as `u32_at`, 8-aligned (the block is 64-aligned, every u64 offset is 8k).
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast()) }
    }

    /// The layout.
    pub fn layout(&self) -> RingLayout {
        RingLayout {
            capacity: self.capacity,
            arrival_slots: self.slots,
        }
    }

    /// The block's start (for a GPU producer: map this, or hand it the device pointer of it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Commands it holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// `head`: positions claimed by producers.
    pub fn head(&self) -> &AtomicU64 {
        self.u64_at(OFF_HEAD)
    }

    /// `tail`: positions the proxy consumed (posted, or finished for a fence).
    pub fn tail(&self) -> &AtomicU64 {
        self.u64_at(OFF_TAIL)
    }

    /// `done`: commands completed locally (WRITEs whose local completion came, fences passed).
    pub fn done(&self) -> &AtomicU64 {
        self.u64_at(OFF_DONE)
    }

    /// The error word.
    pub fn error_word(&self) -> &AtomicU32 {
        self.u32_at(OFF_ERROR)
    }

    /// The error word's value, Acquire.
    pub fn error(&self) -> u32 {
        self.error_word().load(Ordering::Acquire)
    }

    /// Store `code` in the error word unless one is there already (the first reason wins).
    pub fn set_error(&self, code: u32) {
        let _ =
            self.error_word()
                .compare_exchange(ERR_NONE, code, Ordering::AcqRel, Ordering::Acquire);
    }

    /// `arrivals[slot]`, or `None` past the ring's slots.
    pub fn arrivals(&self, slot: u32) -> Option<&AtomicU64> {
        (slot < self.slots).then(|| self.u64_at(OFF_ARRIVALS + LINE * slot as usize))
    }

    fn slot_ptr(&self, pos: u64) -> *mut Command {
        let k = (pos & (self.capacity as u64 - 1)) as usize;
        let off = self.layout().commands_offset() + COMMAND_BYTES * k;
        // SAFETY: k < capacity, so the slot lies inside the block checked at init/attach.
        unsafe { self.base.as_ptr().add(off).cast() }
    }

    fn words_of(&self, pos: u64) -> [&AtomicU64; 4] {
        let w = self.slot_ptr(pos).cast::<u64>();
        // SAFETY: the slot is 32-byte aligned inside the block (slot_ptr), so its four u64
        // words are aligned and in bounds; slot words are only ever accessed atomically.
        std::array::from_fn(|i| unsafe { AtomicU64::from_ptr(w.add(i)) })
    }

    /// CPU producer: claim a position, wait for room (failing when the error word is set),
    /// then store `cmd`'s words, word 0 last with Release (ordered: see the protocol).
    /// Returns the position. `cmd.seq` is ignored. Allocates nothing; while the ring is full it
    /// spins, then yields the core (`backoff`: a proxy may share it on a small host).
    pub fn push(&self, cmd: &Command) -> Result<u64, RingError> {
        let pos = self.head().fetch_add(1, Ordering::Relaxed);
        self.wait_room(pos)?;
        self.write_claimed(pos, cmd);
        Ok(pos)
    }

    /// Wait until position `pos` (claimed) has a free slot.
    fn wait_room(&self, pos: u64) -> Result<(), RingError> {
        let mut spins = 0u32;
        while pos.wrapping_sub(self.tail().load(Ordering::Acquire)) >= self.capacity as u64 {
            let e = self.error();
            if e != ERR_NONE {
                return Err(RingError::ProxyGone(e));
            }
            backoff(&mut spins);
        }
        Ok(())
    }

    /// Write a command into the slot of a position this producer claimed and found room for.
    /// The slot belongs to this producer: it claimed `pos` (head) and saw the proxy release
    /// the slot's previous lap (tail, Acquire).
    fn write_claimed(&self, pos: u64, cmd: &Command) {
        let w = cmd.words(pos, self.capacity);
        let slot = self.words_of(pos);
        for i in 1..4 {
            slot[i].store(w[i], Ordering::Relaxed);
        }
        // The producer's fence: Release orders every store this thread made before (the
        // source buffer above all) before the command.
        slot[0].store(w[0], Ordering::Release);
    }

    /// Proxy: the command at `pos` if its producer published all of it (its four words carry
    /// `pos`'s ready word and lap), else `None`; then an Acquire fence, the pair of an ordered
    /// producer's Release.
    #[inline]
    pub fn peek(&self, pos: u64) -> Option<Command> {
        let slot = self.words_of(pos);
        let w0 = slot[0].load(Ordering::Relaxed);
        if w0 as u32 != seq_for(pos) {
            return None;
        }
        let w = [
            w0,
            slot[1].load(Ordering::Relaxed),
            slot[2].load(Ordering::Relaxed),
            slot[3].load(Ordering::Relaxed),
        ];
        let cmd = Command::from_words(w, pos, self.capacity)?;
        std::sync::atomic::fence(Ordering::Acquire);
        Some(cmd)
    }

    /// Proxy: everything before `tail` is consumed (Release: the reads of those slots happen
    /// before any producer's reuse of them).
    #[inline]
    pub fn release(&self, tail: u64) {
        self.tail().store(tail, Ordering::Release);
    }

    /// Wait until `done >= n` (Acquire), failing when the error word is set first or after
    /// `timeout`.
    pub fn wait_done(&self, n: u64, timeout: Duration) -> Result<(), RingError> {
        self.wait_counter(self.done(), n, timeout, "local completions")
    }

    /// Wait until `arrivals[slot] >= n` (Acquire): `n` WRITEs counted by their immediates have
    /// landed here (and are visible to GPU work launched after, for GPU landing regions).
    pub fn wait_arrivals(&self, slot: u32, n: u64, timeout: Duration) -> Result<(), RingError> {
        let c = self
            .arrivals(slot)
            .ok_or_else(|| RingError::Layout(format!("no arrival slot {slot}")))?;
        self.wait_counter(c, n, timeout, "arrivals")
    }

    fn wait_counter(
        &self,
        c: &AtomicU64,
        n: u64,
        timeout: Duration,
        what: &'static str,
    ) -> Result<(), RingError> {
        let start = Instant::now();
        let mut spins = 0u32;
        while c.load(Ordering::Acquire) < n {
            let e = self.error();
            if e != ERR_NONE && c.load(Ordering::Acquire) < n {
                return Err(RingError::ProxyGone(e));
            }
            if spins % 1024 == 1023 && start.elapsed() > timeout {
                return Err(RingError::Timeout(timeout, what));
            }
            backoff(&mut spins);
        }
        Ok(())
    }
}

fn backoff(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if *spins < 256 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A ring in host memory this crate allocates (64-byte aligned, zeroed): for CPU producers
/// and tests. A GPU producer's ring lives in `cuMemHostAlloc` memory instead
/// ([`Ring::init`] on its pointer).
pub struct RingMemory {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
    ring: RingLayout,
}

// SAFETY: the memory is owned; shared use goes through `Ring`, which is Sync.
unsafe impl Send for RingMemory {}
// SAFETY: as above.
unsafe impl Sync for RingMemory {}

impl RingMemory {
    /// Allocate and lay out a ring.
    pub fn new(ring: RingLayout) -> Self {
        let layout = std::alloc::Layout::from_size_align(ring.bytes(), 4096)
            .expect("ring sizes are bounded well below isize::MAX");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        let mem = Self { ptr, layout, ring };
        // SAFETY: we own `layout.size()` bytes at `ptr`, aligned to 4096.
        unsafe { Ring::init(ptr.as_ptr(), layout.size(), ring) }
            .expect("a RingLayout always fits the block sized from it");
        mem
    }

    /// The ring in it.
    pub fn ring(&self) -> Ring<'_> {
        Ring {
            base: self.ptr,
            capacity: self.ring.capacity,
            slots: self.ring.arrival_slots,
            _mem: PhantomData,
        }
    }
}

impl Drop for RingMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; borrows of `ring()` ended.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_the_documented_one() {
        let l = RingLayout::new(8, 3).unwrap();
        assert_eq!(l.commands_offset(), 320 + 3 * 64);
        assert_eq!(l.bytes(), 320 + 3 * 64 + 8 * 32);
        assert!(RingLayout::new(6, 1).is_err());
        assert!(RingLayout::new(8, 0).is_err());
        let c = Command::write(3, pack(2, 0x1234), pack(5, 7), 4096, Some(immediate(9, 1)));
        // SAFETY: reading a repr(C) struct's bytes.
        let b: [u8; 32] = unsafe { std::mem::transmute(c) };
        assert_eq!(&b[4..8], &4096u32.to_le_bytes());
        assert_eq!(&b[8..12], &0x0009_0001u32.to_le_bytes());
        assert_eq!(&b[12..16], &[OP_WRITE_IMM, 0, 3, 0]);
        assert_eq!(&b[16..24], &(0x0001_0000_0000_1234u64).to_le_bytes());
        // The slot's words are the struct's bytes, plus the ready word and the lap flags.
        let w = c.words(0, 8);
        for k in 1..4 {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&b[8 * k..8 * k + 8]);
            let lap = if k == 1 {
                1 << LAP_BIT_WORD1
            } else {
                1 << LAP_BIT_ADDR
            };
            assert_eq!(w[k], u64::from_le_bytes(raw) | lap, "word {k}");
        }
        assert_eq!(unpack(c.remote), (5, 7));
    }

    #[test]
    fn the_cuda_header_says_what_the_rust_side_does() {
        for (name, v) in [
            ("PROXY_RING_MAGIC", format!("{MAGIC:#x}u")),
            ("PROXY_RING_VERSION", format!("{VERSION}u")),
            ("PROXY_OFF_HEAD", OFF_HEAD.to_string()),
            ("PROXY_OFF_TAIL", OFF_TAIL.to_string()),
            ("PROXY_OFF_DONE", OFF_DONE.to_string()),
            ("PROXY_OFF_ERROR", OFF_ERROR.to_string()),
            ("PROXY_OFF_ARRIVALS", OFF_ARRIVALS.to_string()),
            ("PROXY_LINE", LINE.to_string()),
            ("PROXY_OP_WRITE", OP_WRITE.to_string()),
            ("PROXY_OP_WRITE_IMM", OP_WRITE_IMM.to_string()),
            ("PROXY_OP_FENCE", OP_FENCE.to_string()),
            ("PROXY_ARRIVAL_SHIFT", ARRIVAL_SHIFT.to_string()),
            ("PROXY_OFFSET_BITS", OFFSET_BITS.to_string()),
            ("PROXY_LAP_BIT_WORD1", LAP_BIT_WORD1.to_string()),
            ("PROXY_LAP_BIT_ADDR", LAP_BIT_ADDR.to_string()),
        ] {
            let line = format!("#define {name} {v}\n");
            assert!(CUDA_HEADER.contains(&line), "CUDA_HEADER lacks {line:?}");
        }
    }

    /// Commands, positions and capacities both encoders below run over.
    fn encoding_cases() -> Vec<(Command, u64, u32)> {
        let mut v = Vec::new();
        for (i, &(pos, cap)) in [
            (0u64, 2u32),
            (1, 2),
            (2, 2),
            (5, 4),
            (77, 64),
            (1 << 30, 1 << 24),
        ]
        .iter()
        .enumerate()
        {
            let mut c = Command::write(
                0xfffe - i as u16,
                pack(0xffff, (1 << OFFSET_BITS) - 1 - i as u64),
                pack(i as u16, 0x1234_5678 + i as u64),
                u32::MAX - i as u32,
                Some(immediate(i as u16, 0xabcd)),
            );
            c.flags = 0xff; // reserved bits: only 6..0 travel, bit 7 is the lap's
            v.push((c, pos, cap));
        }
        v.push((Command::fence(), 3, 2));
        v
    }

    #[test]
    fn words_carry_the_lap_and_decode_back() {
        for (c, pos, cap) in encoding_cases() {
            let w = c.words(pos, cap);
            let lap = lap_flag(pos, cap);
            assert_eq!((w[1] >> LAP_BIT_WORD1) & 1, lap);
            assert_eq!(w[2] >> LAP_BIT_ADDR, lap);
            assert_eq!(w[3] >> LAP_BIT_ADDR, lap);
            let want = Command {
                seq: seq_for(pos),
                flags: c.flags & 0x7f,
                ..c
            };
            assert_eq!(Command::from_words(w, pos, cap), Some(want));
            // Any one word of the slot's previous lap (or of zeroed memory on lap 0) and the
            // command is not there yet.
            let before = Command::fence().words(pos.wrapping_sub(cap as u64), cap);
            for k in 0..4 {
                let mut torn = w;
                torn[k] = if pos < cap as u64 { 0 } else { before[k] };
                assert_eq!(Command::from_words(torn, pos, cap), None, "word {k} stale");
            }
        }
        assert_eq!(
            (
                lap_flag(0, 4),
                lap_flag(3, 4),
                lap_flag(4, 4),
                lap_flag(8, 4)
            ),
            (1, 1, 0, 1)
        );
    }

    /// A producer's words may land in any order (unfenced, or a GPU's stores crossing
    /// PCIe): the proxy takes the command only when the last of them landed, on every lap.
    #[test]
    fn peek_waits_for_every_word_in_any_order() {
        let mem = RingMemory::new(RingLayout::new(2, 1).unwrap());
        let ring = mem.ring();
        for (pos, order) in [
            [0, 1, 2, 3],
            [3, 2, 1, 0],
            [1, 0, 3, 2],
            [2, 3, 0, 1],
            [0, 3, 1, 2],
        ]
        .into_iter()
        .enumerate()
        {
            let pos = pos as u64;
            let cmd = Command::write(1, pack(0, 64 * pos), pack(1, pos), 8, Some(immediate(0, 7)));
            let w = cmd.words(pos, 2);
            let slot = ring.words_of(pos);
            for (n, &k) in order.iter().enumerate() {
                assert_eq!(ring.peek(pos), None, "pos {pos}: {n} of 4 words landed");
                slot[k].store(w[k], Ordering::Relaxed);
            }
            let got = ring.peek(pos).expect("all four landed");
            assert_eq!(
                got,
                Command {
                    seq: seq_for(pos),
                    ..cmd
                }
            );
            ring.release(pos + 1);
        }
    }

    /// `proxy_ring.cuh`'s `proxy_words`, compiled for the host with clang-16 and run, encodes
    /// the same words as [`Command::words`] (the kernels store what the proxy decodes). Skips,
    /// saying so, where no clang-16 is installed.
    #[test]
    fn the_cuda_header_encodes_commands_as_the_rust_side_does() {
        use std::process::Command as Cmd;
        let Some(clang) = crate::clang16() else {
            eprintln!("SKIPPED: no clang-16 to compile the CUDA header for the host with");
            return;
        };
        let mut main = String::from(
            "#include <stdio.h>\n#define __device__\n#define __forceinline__ inline\n\
             #define __align__(n) alignas(n)\n\
             unsigned long long atomicAdd_system(unsigned long long *, unsigned long long);\n\
             void __threadfence_system();\n",
        );
        main.push_str(CUDA_HEADER);
        main.push_str("int main() {\n  unsigned long long w[4];\n");
        for (c, pos, cap) in encoding_cases() {
            main.push_str(&format!(
                "  {{ proxy_cmd c = {{0, {}u, {}u, {}, {}, {}, {}ull, {}ull}};\n    \
                 proxy_words({pos}ull, {cap}u, &c, w);\n    \
                 printf(\"%llx %llx %llx %llx\\n\", w[0], w[1], w[2], w[3]); }}\n",
                c.len, c.imm, c.op, c.flags, c.peer, c.local, c.remote
            ));
        }
        main.push_str("  return 0;\n}\n");
        let dir = std::env::temp_dir().join(format!("proxy-words-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, bin) = (dir.join("words.cc"), dir.join("words"));
        std::fs::write(&src, &main).unwrap();
        let cc = Cmd::new(clang)
            .args(["-x", "c++", "-std=c++17", "-Werror", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            cc.status.success(),
            "{}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = Cmd::new(&bin).output().unwrap();
        std::fs::remove_dir_all(&dir).ok();
        let got = String::from_utf8(out.stdout).unwrap();
        let want: String = encoding_cases()
            .iter()
            .map(|(c, pos, cap)| {
                let w = c.words(*pos, *cap);
                format!("{:x} {:x} {:x} {:x}\n", w[0], w[1], w[2], w[3])
            })
            .collect();
        assert_eq!(
            got, want,
            "proxy_words (CUDA header) and Command::words disagree"
        );
    }

    #[test]
    fn push_then_peek_round_trips_and_wraps() {
        let mem = RingMemory::new(RingLayout::new(4, 1).unwrap());
        let ring = mem.ring();
        for p in 0..10u64 {
            assert_eq!(ring.peek(p), None);
            let cmd = Command::write(1, pack(0, p), pack(0, 2 * p), 8, None);
            assert_eq!(ring.push(&cmd).unwrap(), p);
            let got = ring.peek(p).unwrap();
            assert_eq!((got.seq, got.local, got.remote), (p as u32 + 1, p, 2 * p));
            assert_eq!(
                got,
                Command {
                    seq: p as u32 + 1,
                    ..cmd
                }
            );
            ring.release(p + 1);
        }
        // SAFETY: the block is RingMemory's, alive for the borrow.
        let again = unsafe { Ring::attach(ring.as_ptr(), ring.layout().bytes()) }.unwrap();
        assert_eq!(again.layout(), ring.layout());
    }

    #[test]
    fn a_producer_waiting_for_room_sees_the_error_word() {
        let mem = RingMemory::new(RingLayout::new(2, 1).unwrap());
        let ring = mem.ring();
        ring.push(&Command::fence()).unwrap();
        ring.push(&Command::fence()).unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| ring.push(&Command::fence()));
            std::thread::sleep(Duration::from_millis(50));
            ring.set_error(ERR_COMPLETION);
            assert_eq!(h.join().unwrap(), Err(RingError::ProxyGone(ERR_COMPLETION)));
        });
        assert!(matches!(
            ring.wait_done(1, Duration::from_secs(5)),
            Err(RingError::ProxyGone(ERR_COMPLETION))
        ));
    }
}
