//! Versions of a page: which repeat of the write workload left the bytes a slot holds, and the
//! checks that read them back (whole pages, or words at a stride), naming a lost or late WRITE.

use transport_core::{HostBuffer, MemoryRegion};

use super::{fill_at, mask, rotated, PageLayout};
use crate::error::{Error, Result};

/// Most repeats a NIC keeps in flight at once (the write workload's window).
pub const WINDOW: u64 = 4;

/// Where repeat `h` of the write workload reads the page it writes into target slot `k`: from
/// source slot `(k + h) % slots`, shifted by `64 * ((h / slots) % shifts)` bytes into the next
/// slot (the source has one slack page after its slots for that). Every repeat then leaves
/// different bytes in a slot, and what a slot holds names the repeat that wrote it, modulo
/// [`Versions::period`] (`slots * shifts`): a WRITE that was lost, or that landed after a newer
/// one, leaves an older repeat's page behind where a check can see it.
///
/// Only while bytes are verified: with `--no-verify` the source is not turned
/// ([`Versions::none`]), so nothing changes what a measurement reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versions {
    slots: u64,
    shifts: u64,
    page_size: usize,
}

/// Bytes the source shifts by per step: a cache line, so sources stay 64-byte aligned.
const SHIFT_STEP: usize = 64;

impl Versions {
    /// No turning: repeat after repeat, every slot gets the same page.
    pub fn none(page_size: usize) -> Self {
        Versions {
            slots: 0,
            shifts: 1,
            page_size,
        }
    }

    /// Fewest slots the source turns over: with fewer, keeping two WRITEs of one slot out of
    /// flight together (which turning needs on an unordered fabric) would stall the posting
    /// (one buffer: one WRITE at a time), so such runs keep one page per slot and the final
    /// check.
    pub const MIN_SLOTS: u64 = 16;

    /// Turning over `slots` source slots (at least [`Self::MIN_SLOTS`], else
    /// [`Self::none`]), shifting too where `slack` (the source has a page after its slots)
    /// and pages hold at least two cache lines.
    pub fn new(page_size: usize, slots: u64, slack: bool) -> Self {
        if slots < Self::MIN_SLOTS {
            return Self::none(page_size);
        }
        let shifts = if slack && page_size.is_multiple_of(SHIFT_STEP) && page_size >= 2 * SHIFT_STEP
        {
            (page_size / SHIFT_STEP) as u64
        } else {
            1
        };
        Versions {
            slots,
            shifts,
            page_size,
        }
    }

    /// Source slots turned over (0: none).
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Shift steps per page (1: no shifting), as the `Request` carries it.
    pub fn shifts(&self) -> u64 {
        self.shifts
    }

    /// Repeats after which the bytes of a slot come back.
    pub fn period(&self) -> u64 {
        self.slots.max(1) * self.shifts
    }

    /// The source slot and the byte shift of repeat `h` (one division per repeat).
    #[inline]
    pub fn of_repeat(&self, h: u64) -> (u64, usize) {
        if self.slots <= 1 && self.shifts <= 1 {
            return (0, 0);
        }
        let n = self.slots.max(1);
        let turn = h % n;
        let shift = if self.shifts > 1 {
            ((h / n) % self.shifts) as usize * SHIFT_STEP
        } else {
            0
        };
        (turn, shift)
    }

    /// The bytes target slot `k` of NIC `j` holds after repeat `h`, into `out` (one page).
    #[allow(clippy::too_many_arguments)]
    pub fn expected(
        &self,
        layout: &PageLayout,
        seed: u64,
        gpu: u64,
        j: usize,
        k: u64,
        h: u64,
        out: &mut [u8],
    ) {
        let ps = self.page_size as u64;
        let (turn, shift) = self.of_repeat(h);
        let s = rotated(k, turn, self.slots);
        let head = out.len() - shift;
        fill_at(
            seed,
            gpu,
            layout.page_of(j, s) * ps + shift as u64,
            &mut out[..head],
        );
        if shift > 0 {
            // The rest comes from the next source slot, or the slack page after the last.
            fill_at(seed, gpu, layout.page_of(j, s + 1) * ps, &mut out[head..]);
        }
    }

    /// The source slot and the byte offset in its page of `word`, where `word` is a word of
    /// NIC `j`'s source (`None`: a word of no page of it, or pages not a whole number of words).
    #[inline]
    fn locate(&self, layout: &PageLayout, m: u64, j: usize, word: [u8; 8]) -> Option<(u64, u64)> {
        let ps = self.page_size as u64;
        if !ps.is_multiple_of(8) || ps == 0 {
            return None;
        }
        let pos = (u64::from_le_bytes(word) ^ m).checked_mul(8)?;
        let (page, off) = (pos / ps, pos % ps);
        let used = layout.used as u64;
        if page < j as u64 || !(page - j as u64).is_multiple_of(used) {
            return None;
        }
        Some(((page - j as u64) / used, off))
    }

    /// The repeat, modulo the period, that reads source slot `s` shifted by `q` steps into
    /// target slot `k`.
    #[inline]
    fn repeat_of(&self, s: u64, q: u64, k: u64) -> u64 {
        let n = self.slots.max(1);
        (s + n - k % n) % n + n * q
    }

    /// What repeat, modulo [`Self::period`], left `word` (the first 8 bytes of target slot
    /// `k` of NIC `j`); `None` where the word is no page start of this NIC's source (bytes of
    /// two WRITEs mixed by a read while one landed, or memory nothing wrote).
    pub fn decode(
        &self,
        layout: &PageLayout,
        seed: u64,
        gpu: u64,
        j: usize,
        k: u64,
        word: [u8; 8],
    ) -> Option<u64> {
        let (s, q) = self.decode_source(layout, mask(seed, gpu), j, k, word)?;
        Some(self.repeat_of(s, q, k))
    }

    /// The source slot and shift step of the repeat that left `word` at the start of target
    /// slot `k` (see [`Self::decode`]).
    #[inline]
    fn decode_source(
        &self,
        layout: &PageLayout,
        m: u64,
        j: usize,
        k: u64,
        word: [u8; 8],
    ) -> Option<(u64, u64)> {
        self.decode_at(layout, m, j, k, 0, word)
    }

    /// The source slot and shift step of the repeat that left `word` at byte `o` (a multiple of
    /// 8 below the page size) of target slot `k`: a repeat shifting its source by `q` steps
    /// reads byte `o` from byte `o + 64 q` of its source slot, or, past that page's end, from
    /// byte `o + 64 q - page` of the next source page (the slack page after the last). `None`
    /// as for [`Self::decode`].
    #[inline]
    fn decode_at(
        &self,
        layout: &PageLayout,
        m: u64,
        j: usize,
        k: u64,
        o: u64,
        word: [u8; 8],
    ) -> Option<(u64, u64)> {
        let (s, off) = self.locate(layout, m, j, word)?;
        let (ps, step) = (self.page_size as u64, SHIFT_STEP as u64);
        // off >= o: from the repeat's own source slot (o + 64 q < page); below: from the next.
        let (s, d) = if off >= o {
            (s, off - o)
        } else {
            (s.checked_sub(1)?, off + ps - o)
        };
        let q = d / step;
        if d % step != 0
            || s >= self.slots.max(1)
            || q >= self.shifts
            || (self.slots == 0 && s != k)
        {
            return None;
        }
        Some((s, q))
    }

    /// The 8 bytes at byte `o` (a multiple of 8 below the page size) of a target slot that the
    /// repeat reading source slot `s` shifted by `q` steps leaves (see [`Self::decode_at`];
    /// multiplications only: the check's common case, a whole page).
    #[inline]
    fn word_at(&self, layout: &PageLayout, m: u64, j: usize, s: u64, q: u64, o: u64) -> [u8; 8] {
        let ps = self.page_size as u64;
        let from = o + q * SHIFT_STEP as u64;
        let pos = if from < ps {
            layout.page_of(j, s) * ps + from
        } else {
            layout.page_of(j, s + 1) * ps + from - ps
        };
        ((pos / 8) ^ m).to_le_bytes()
    }

    /// What repeat, modulo [`Self::period`], left `word` as the last 8 bytes of target slot
    /// `k` of NIC `j`: the end of the source page, or, where the repeat shifts its source by
    /// `shift` bytes, the word before `shift` of the next source page (the slack page after
    /// the last). `None` as for [`Self::decode`].
    pub fn decode_last(
        &self,
        layout: &PageLayout,
        seed: u64,
        gpu: u64,
        j: usize,
        k: u64,
        word: [u8; 8],
    ) -> Option<u64> {
        self.decode_last_m(layout, mask(seed, gpu), j, k, word)
    }

    #[inline]
    fn decode_last_m(
        &self,
        layout: &PageLayout,
        m: u64,
        j: usize,
        k: u64,
        word: [u8; 8],
    ) -> Option<u64> {
        let o = (self.page_size as u64).checked_sub(8)?;
        let (s, q) = self.decode_at(layout, m, j, k, o, word)?;
        Some(self.repeat_of(s, q, k))
    }
}

/// Slots the check of a short-period run reads per immediate, in turn (see [`RepeatCheck`]).
const SLOTS_PER_CHECK: u64 = 64;

/// Bytes between the words [`RepeatCheck`] reads in a page: no larger than the smallest piece
/// a device may drop out of a WRITE (a packet: EFA's MTU is 8928 bytes, InfiniBand's at most
/// 4096, RoCE's commonly 1024), so a piece lost anywhere in a page covers a word the check
/// reads.
pub const CHECK_STRIDE: usize = 1024;

/// The byte offsets of the words [`RepeatCheck`] reads in a page of `ps` bytes (at least 8):
/// every [`CHECK_STRIDE`] bytes from the first word, and the last word. Any run of
/// `CHECK_STRIDE` bytes or more inside the page holds one of them whole where it starts and
/// ends on a word boundary (a packet's bytes are a multiple of 8 on every device here).
#[inline]
fn check_offsets(ps: usize) -> impl Iterator<Item = usize> {
    (0..ps - 8)
        .step_by(CHECK_STRIDE)
        .chain(std::iter::once(ps - 8))
}

/// Words [`RepeatCheck`] reads per slot of `ps` bytes: `ceil((ps - 8) / 1024) + 1` (5 for
/// 4 KiB pages, 65 for 64 KiB, 1025 for 1 MiB: one 8-byte load per KiB of the page, a
/// hundred-and-twenty-eighth of its bytes).
pub fn check_words_per_page(ps: usize) -> usize {
    if ps <= 8 {
        1
    } else {
        check_offsets(ps).count()
    }
}

/// What [`RepeatCheck`] can tell from a slot's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// The source turns with a period long enough to tell an older repeat from a newer one:
    /// every slot, every immediate; a slot with a word behind the immediate's repeat fails.
    Order,
    /// The source turns, with a period too short to tell older from newer: every word read of
    /// each slot must name a page of this run (64 slots per immediate, in
    /// turn).
    Whole,
    /// The source does not turn (one buffer, fewer than [`Versions::MIN_SLOTS`] slots): every
    /// WRITE of a slot writes the same bytes, so every word read of every slot must be exactly
    /// those bytes at every immediate (a race cannot change them).
    Fixed,
}

/// The target's check of each immediate: when the immediate of repeat `g` arrives on a NIC,
/// no slot of that NIC may hold an older repeat's page, nor bytes that are no page of the run,
/// anywhere in the page. It reads one 8-byte word every [`CHECK_STRIDE`] bytes of each page
/// and its last word ([`check_words_per_page`]: 5 loads for a 4 KiB page, 65 for 64 KiB),
/// each naming the repeat that wrote it ([`Versions::decode`], [`Versions::decode_last`]),
/// so a WRITE of which one packet was lost (its first and last words new, a piece inside
/// still the older repeat's) shows, and the check stays on whenever bytes are verified. The
/// common case, a whole page of one repeat, decodes the first word only and compares the
/// others with what that repeat leaves (no division). Host memory only; the full check after
/// the run covers GPU memory.
///
/// The initiator does not wait for the target to read its immediates, so a slot may hold a
/// repeat far newer than `g`, or pieces of several newer ones; it is told from an older one by
/// the period of the versions, which must exceed twice what the target can lag
/// ([`RepeatCheck::MIN_PERIOD`]: the target's completion queue holds a few thousand immediates
/// at most). Shorter periods check that each slot holds pieces of pages of the run
/// ([`CheckKind::Whole`]); a source that does not turn, that each slot holds exactly its page
/// ([`CheckKind::Fixed`]).
///
/// A slot with a word of an older repeat's page is a WRITE (or a piece of one) that was lost
/// or that landed after the immediate meant to announce it: the error names the slot, both
/// repeats and the word. A word that names no page is a read that raced a landing WRITE, once:
/// the same slot read so at its next check too is memory no WRITE of the run wrote (a lost
/// WRITE into a fresh buffer, a stale page of another run) and fails.
pub struct RepeatCheck {
    nic: usize,
    j: usize,
    gpu: u64,
    seed: u64,
    layout: PageLayout,
    ver: Versions,
    /// The pattern's mask for this NIC's GPU (`mask(seed, gpu)`).
    mask: u64,
    kind: CheckKind,
    /// Slots whose words named no page at their last check, a bit each.
    torn_last: Vec<u64>,
    /// The next slot a [`CheckKind::Whole`] check reads.
    cursor: u64,
    /// Slots that matched no page at some check.
    pub torn: u64,
    /// Immediates checked.
    pub checked: u64,
}

/// How an error names the word at byte `o` of a page of `ps` bytes.
fn which_word(o: usize, ps: usize) -> String {
    if o == 0 {
        "first word".into()
    } else if o + 8 == ps {
        "last word".into()
    } else {
        format!("word at byte {o}")
    }
}

impl RepeatCheck {
    /// Periods below this cannot tell a newer repeat from an older one (see
    /// [`CheckKind::Whole`]).
    pub const MIN_PERIOD: u64 = 1 << 13;

    /// The check of NIC `j` (index `nic`) of GPU index `gpu` under `ver`, or `None` where
    /// the source turns over pages that are not a whole number of words (no word names its
    /// place).
    pub fn new(
        layout: &PageLayout,
        ver: Versions,
        seed: u64,
        gpu: u64,
        j: usize,
        nic: usize,
    ) -> Option<Self> {
        let ps = layout.page_size;
        let kind = if ver.slots() == 0 {
            CheckKind::Fixed
        } else if !ps.is_multiple_of(8) {
            return None;
        } else if ver.period() >= Self::MIN_PERIOD {
            CheckKind::Order
        } else {
            CheckKind::Whole
        };
        Some(RepeatCheck {
            nic,
            j,
            gpu,
            seed,
            layout: *layout,
            ver,
            mask: mask(seed, gpu),
            kind,
            torn_last: vec![0; layout.slots(j).div_ceil(64) as usize],
            cursor: 0,
            torn: 0,
            checked: 0,
        })
    }

    /// What this check can tell.
    pub fn kind(&self) -> CheckKind {
        self.kind
    }

    /// The immediate of repeat `g` arrived: check the slots of `mr`.
    pub fn check<M: MemoryRegion>(&mut self, mr: &M, g: u64) -> Result<()> {
        let Some(h) = mr.memory().host() else {
            return Ok(());
        };
        self.checked += 1;
        let slots = self.layout.slots(self.j);
        if self.kind == CheckKind::Fixed {
            return (0..slots).try_for_each(|k| self.check_fixed(h, k, g));
        }
        let (first, n) = match self.kind {
            CheckKind::Whole => (self.cursor, SLOTS_PER_CHECK.min(slots)),
            _ => (0, slots),
        };
        let period = self.ver.period();
        let gp = g % period;
        let mut k = first;
        for _ in 0..n {
            self.check_turned(h, k, g, gp, period)?;
            k += 1;
            if k == slots {
                k = 0;
            }
        }
        self.cursor = k;
        Ok(())
    }

    /// Slot `k` lies inside `h` (else an error naming it).
    #[inline]
    fn in_region(&self, h: &HostBuffer, k: u64) -> Result<usize> {
        let ps = self.layout.page_size;
        let at = k as usize * ps;
        match at.checked_add(ps) {
            Some(end) if end <= h.len() => Ok(at),
            _ => Err(Error::Verify(format!(
                "NIC {}: slot {k} ({ps} bytes at {at}) is past the end of the {}-byte region",
                self.nic,
                h.len()
            ))),
        }
    }

    /// The word at byte `at` of `h`, inside the region ([`Self::in_region`] checked it).
    #[inline]
    fn word(h: &HostBuffer, at: usize) -> [u8; 8] {
        h.peek8(at).unwrap_or_default()
    }

    /// Slot `k` at the immediate of repeat `g` (`gp`: `g` modulo the period).
    #[inline]
    fn check_turned(&mut self, h: &HostBuffer, k: u64, g: u64, gp: u64, period: u64) -> Result<()> {
        let at = self.in_region(h, k)?;
        let (l, v, m, j) = (&self.layout, &self.ver, self.mask, self.j);
        let ps = l.page_size;
        let (bit, w) = ((k % 64) as u32, (k / 64) as usize);
        let first = Self::word(h, at);
        // The whole page of one repeat (the common case): the first word names it, the others
        // are compared with what it leaves.
        if let Some((sl, q)) = v.decode_source(l, m, j, k, first) {
            let whole = check_offsets(ps.max(8))
                .skip(1)
                .all(|o| Self::word(h, at + o) == v.word_at(l, m, j, sl, q, o as u64));
            if whole {
                self.torn_last[w] &= !(1 << bit);
                return self.behind(v.repeat_of(sl, q, k), g, gp, period, k, 0);
            }
        }
        // Pieces of several repeats, or bytes that are no page: each word on its own.
        let mut stale = None;
        for o in check_offsets(ps.max(8)) {
            let word = Self::word(h, at + o);
            let Some((sl, q)) = v.decode_at(l, m, j, k, o as u64, word) else {
                self.torn += 1;
                if self.torn_last[w] & (1 << bit) != 0 {
                    let bad = if o == 0 {
                        String::new()
                    } else {
                        format!(", {} {}", which_word(o, ps), hex8(word))
                    };
                    return Err(Error::Verify(format!(
                        "NIC {}: slot {k} held bytes that are no page of this run at two checks \
                         in a row (the last at the immediate of repeat {g}; first word {}{bad}): \
                         a WRITE that never landed, or memory of something else",
                        self.nic,
                        hex8(first),
                    )));
                }
                self.torn_last[w] |= 1 << bit;
                return Ok(());
            };
            if stale.is_none() {
                stale = self
                    .behind(v.repeat_of(sl, q, k), g, gp, period, k, o)
                    .err();
            }
        }
        self.torn_last[w] &= !(1 << bit);
        stale.map_or(Ok(()), Err)
    }

    /// Under [`CheckKind::Order`], an error where repeat `x` (modulo the period), read in the
    /// word at byte `o` of slot `k`, is behind the immediate's repeat `g` (`gp` modulo it).
    #[inline]
    fn behind(&self, x: u64, g: u64, gp: u64, period: u64, k: u64, o: usize) -> Result<()> {
        if self.kind != CheckKind::Order {
            return Ok(());
        }
        // How far ahead of g the word's repeat is, modulo the period: a repeat behind g shows
        // as almost a whole period ahead.
        let ahead = (x + period - gp) % period;
        if ahead <= period / 2 {
            return Ok(());
        }
        let behind = period - ahead;
        Err(Error::Verify(format!(
            "NIC {}: when the immediate of repeat {g} arrived, slot {k} still held the page of \
             repeat {} (its {}): a WRITE of repeat {g} was lost, or landed after the immediate \
             that announced it",
            self.nic,
            g.saturating_sub(behind),
            which_word(o, self.layout.page_size)
        )))
    }

    /// A source that does not turn: slot `k` holds its own page, byte for byte, in every word
    /// the check reads (its only word, for pages of 8 bytes or fewer).
    fn check_fixed(&self, h: &HostBuffer, k: u64, g: u64) -> Result<()> {
        let ps = self.layout.page_size;
        let base = self.layout.page_of(self.j, k) * ps as u64;
        let n = ps.min(8);
        for off in check_offsets(ps.max(8)) {
            let off = off.min(ps - n);
            let at = k as usize * ps + off;
            // The n bytes at `at`, read as 8 bytes that fit the region.
            let from = at.min(h.len().saturating_sub(8));
            let Some(got) = h.peek8(from) else {
                return Err(Error::Verify(format!(
                    "NIC {}: slot {k} ({ps} bytes at {}) is past the end of the {}-byte region",
                    self.nic,
                    k as usize * ps,
                    h.len()
                )));
            };
            let got = &got[at - from..at - from + n];
            let mut want = [0u8; 8];
            fill_at(self.seed, self.gpu, base + off as u64, &mut want[..n]);
            if got != &want[..n] {
                let which = match off {
                    0 => format!("first {n} bytes"),
                    o if o + n == ps => format!("last {n} bytes"),
                    o => format!("{n} bytes at byte {o}"),
                };
                return Err(Error::Verify(format!(
                    "NIC {}: when the immediate of repeat {g} arrived, slot {k}'s {which} were \
                     {}, not its page's {}: every WRITE of the slot writes that page, so none \
                     of them landed there",
                    self.nic,
                    hex8_n(got),
                    hex8_n(&want[..n])
                )));
            }
            if ps <= 8 {
                break;
            }
        }
        Ok(())
    }
}

fn hex8(w: [u8; 8]) -> String {
    hex8_n(&w)
}

fn hex8_n(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
