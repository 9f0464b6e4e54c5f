//! Unit tests of `buffers`.
use super::*;

#[test]
fn layout_covers_every_page_once() {
    for (pages, used) in [(10u64, 3usize), (1, 4), (16, 1), (7, 7), (5, 8)] {
        let l = PageLayout {
            page_size: 64,
            pages,
            used,
        };
        let mut seen = vec![0; pages as usize];
        for j in 0..used {
            let order = l.post_order(42, 1, j);
            assert_eq!(order.len() as u64, l.slots(j));
            for &p in &order {
                seen[p as usize] += 1;
                assert_eq!(p as usize % used, j);
                assert!((p as u64 / used as u64) < l.slots(j));
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{pages} pages on {used}");
    }
}

#[test]
fn order_is_shuffled_and_deterministic() {
    let l = PageLayout {
        page_size: 64,
        pages: 64,
        used: 1,
    };
    let a = l.post_order(1, 0, 0);
    assert_eq!(a, l.post_order(1, 0, 0));
    assert_ne!(a, (0..64).collect::<Vec<u32>>());
    assert_ne!(a, l.post_order(2, 0, 0));
}

/// A region that is no registration at all: enough to exercise filling and checking.
struct Plain(Memory);
impl MemoryRegion for Plain {
    fn memory(&self) -> &Memory {
        &self.0
    }
    fn memory_mut(&mut self) -> transport_core::MemoryMut<'_> {
        transport_core::MemoryMut::new(&mut self.0)
    }
    fn remote(&self) -> transport_core::RemoteMr {
        transport_core::RemoteMr {
            addr: 0,
            len: self.0.len() as u64,
            key: transport_core::KeyBytes::from_u64(0),
        }
    }
}

/// Fill, check, catch a wrong seed and one flipped byte, clear; pages of an odd size and
/// more of them than one staging copy holds.
fn fill_verify_round(kind: MemKind) {
    let layout = PageLayout {
        page_size: 4099,
        pages: 3000,
        used: 2,
    };
    let len = layout.slots(1) as usize * layout.page_size;
    let none = Versions::none(layout.page_size);
    let mut mr = Plain(alloc(kind, 0, len, 0).unwrap());
    assert_eq!(kind == MemKind::Cuda, matches!(mr.0, Memory::Gpu(_)));
    fill_pages(&mut mr, &layout, 7, 1, 1).unwrap();
    verify_pages(&mr, &layout, 7, 1, 1, 3, 0, &none).unwrap();
    assert!(verify_pages(&mr, &layout, 8, 1, 1, 3, 0, &none).is_err());
    let at = len - 5;
    let mut b = [0u8];
    mr.0.read_at(at, &mut b).unwrap();
    mr.0.write_at(at, &[b[0] ^ 0x40]).unwrap();
    let e = verify_pages(&mr, &layout, 7, 1, 1, 3, 0, &none)
        .unwrap_err()
        .to_string();
    assert!(e.contains("NIC 3") && e.contains("page 2999"), "{e}");
    let _ = none;
    zero(&mut mr, len).unwrap();
    let mut all = vec![1u8; len];
    mr.0.read_at(0, &mut all).unwrap();
    assert!(all.iter().all(|&x| x == 0));
    fill_messages(&mut mr, 3, 100, 5).unwrap();
    verify_messages(&mr, 3, 100, 5, 0).unwrap();
    assert!(verify_messages(&mr, 4, 100, 5, 0).is_err());
    // The ping-pong: the send buffer holds the pattern, the receive buffer zeros until the
    // peer's message (here: the send buffer's bytes) lands in it.
    fill_lat(&mut mr, 9, 100, 0, 100).unwrap();
    let e = verify_lat(&mr, 9, 100, 100).unwrap_err().to_string();
    assert!(e.contains("byte 0 of 100: got 0x00"), "{e}");
    verify_lat(&mr, 9, 100, 0).unwrap();
    let mut msg = vec![0u8; 100];
    mr.0.read_at(0, &mut msg).unwrap();
    mr.0.write_at(100, &msg).unwrap();
    verify_lat(&mr, 9, 100, 100).unwrap();
    mr.0.write_at(199, &[msg[99] ^ 1]).unwrap();
    let e = verify_lat(&mr, 9, 100, 100).unwrap_err().to_string();
    assert!(e.contains("byte 99 of 100"), "{e}");
}

#[test]
fn fill_and_verify_host() {
    fill_verify_round(MemKind::Host);
}

/// The same through CUDA copies, where this machine has a GPU (skipped elsewhere).
#[test]
fn fill_and_verify_gpu() {
    if !cuda_driver() || cuda_devices().unwrap_or(0) == 0 {
        transport_core::skip::note("no CUDA device", "no CUDA driver or device on this machine");
        return;
    }
    fill_verify_round(MemKind::Cuda);
    eprintln!("fill_and_verify_gpu: ran on GPU 0");
}

/// What a slot holds names the repeat that wrote it, modulo the period, through the
/// source's turning and shifting; the final bytes after each repeat are those `expected`
/// computes from a plain copy of the source at the offsets the active side reads.
#[test]
fn versions_name_the_repeat_a_slot_holds() {
    let layout = PageLayout {
        page_size: 256,
        pages: 40,
        used: 2,
    };
    let j = 1;
    let n = layout.slots(j);
    let ver = Versions::new(256, n, true);
    assert_eq!((ver.shifts(), ver.period()), (4, 4 * n));
    // The source: n slots and the slack page, as fill_pages writes them.
    let mut src = vec![0u8; (n as usize + 1) * 256];
    for s in 0..=n {
        let off = s as usize * 256;
        fill_pattern(7, 3, layout.page_of(j, s), &mut src[off..off + 256]);
    }
    let mut want = vec![0u8; 256];
    for h in 0..3 * ver.period() {
        let (turn, shift) = ver.of_repeat(h);
        for k in 0..n {
            let at = rotated(k, turn, n) as usize * 256 + shift;
            let got = &src[at..at + 256];
            ver.expected(&layout, 7, 3, j, k, h, &mut want);
            assert_eq!(got, &want[..], "repeat {h} slot {k}");
            let word = [
                got[0], got[1], got[2], got[3], got[4], got[5], got[6], got[7],
            ];
            assert_eq!(
                ver.decode(&layout, 7, 3, j, k, word),
                Some(h % ver.period())
            );
            let last: [u8; 8] = got[248..256].try_into().unwrap();
            assert_eq!(
                ver.decode_last(&layout, 7, 3, j, k, last),
                Some(h % ver.period()),
                "repeat {h} slot {k}: last word"
            );
        }
    }
    // Words that are no page start of this NIC: another NIC's page, a mid-page word.
    let mut other = [0u8; 8];
    fill_pattern(7, 3, layout.page_of(0, 1), &mut other);
    assert_eq!(ver.decode(&layout, 7, 3, j, 0, other), None);
    assert_eq!(ver.decode(&layout, 7, 3, j, 0, [0xab; 8]), None);
    // Without verification, or with too few slots, nothing turns.
    let none = Versions::none(256);
    assert_eq!(none.of_repeat(12345), (0, 0));
    assert_eq!(Versions::new(256, Versions::MIN_SLOTS - 1, true), none);
}

/// The pages `ver` leaves in NIC `j`'s slots after repeat `g`, written into `mr`.
fn put(mr: &mut Plain, layout: &PageLayout, ver: &Versions, seed: u64, j: usize, g: u64) {
    let ps = layout.page_size;
    let mut page = vec![0u8; ps];
    for k in 0..layout.slots(j) {
        ver.expected(layout, seed, 0, j, k, g, &mut page);
        mr.0.write_at(k as usize * ps, &page).unwrap();
    }
}

/// The immediate check: a slot still holding the previous repeat's page fails, naming
/// both repeats, in its first word or its last; newer pages (the initiator runs ahead) pass,
/// and so does a word that names no page once (a read racing a WRITE), but not twice in a
/// row at the same slot.
#[test]
fn repeat_check_catches_a_stale_slot() {
    let layout = PageLayout {
        page_size: 4096,
        pages: 256,
        used: 1,
    };
    let n = layout.slots(0);
    let ver = Versions::new(4096, n, true);
    let mut chk = RepeatCheck::new(&layout, ver, 5, 0, 0, 2).expect("long period");
    assert_eq!(chk.kind(), CheckKind::Order);
    let mut mr = Plain(Memory::Host(HostBuffer::new((n as usize + 1) * 4096)));
    put(&mut mr, &layout, &ver, 5, 0, 1000);
    chk.check(&mr, 1000).unwrap();
    chk.check(&mr, 990).unwrap(); // pages newer than the immediate: fine
    let mut page = vec![0u8; 4096];
    ver.expected(&layout, 5, 0, 0, 17, 999, &mut page);
    mr.0.write_at(17 * 4096, &page).unwrap();
    let e = chk.check(&mr, 1000).unwrap_err().to_string();
    assert!(
        e.contains("NIC 2") && e.contains("slot 17") && e.contains("repeat 999"),
        "{e}"
    );
    // Only the end of the page is stale (a WRITE whose last piece was lost).
    put(&mut mr, &layout, &ver, 5, 0, 1000);
    ver.expected(&layout, 5, 0, 0, 18, 999, &mut page);
    mr.0.write_at(18 * 4096 + 4096 - 64, &page[4096 - 64..])
        .unwrap();
    let e = chk.check(&mr, 1000).unwrap_err().to_string();
    assert!(
        e.contains("slot 18") && e.contains("repeat 999") && e.contains("last word"),
        "{e}"
    );
    // A word that names no page: once is a race, twice in a row at that slot is a failure.
    put(&mut mr, &layout, &ver, 5, 0, 1000);
    mr.0.write_at(17 * 4096, &[0x55; 8]).unwrap();
    chk.check(&mr, 1000).unwrap();
    assert_eq!(chk.torn, 1);
    let e = chk.check(&mr, 1000).unwrap_err().to_string();
    assert!(
        e.contains("slot 17") && e.contains("two checks in a row"),
        "{e}"
    );
    // Torn, then whole again: the count starts over.
    let mut chk = RepeatCheck::new(&layout, ver, 5, 0, 0, 2).unwrap();
    put(&mut mr, &layout, &ver, 5, 0, 1000);
    mr.0.write_at(4096 - 8, &[0x66; 8]).unwrap(); // slot 0's last word
    chk.check(&mr, 1000).unwrap();
    put(&mut mr, &layout, &ver, 5, 0, 1001);
    chk.check(&mr, 1001).unwrap();
    mr.0.write_at(4096 - 8, &[0x66; 8]).unwrap();
    chk.check(&mr, 1001).unwrap();
    assert_eq!(chk.torn, 2);
}

/// A slot nothing wrote (a lost WRITE into a zeroed buffer) and a stale page whose first
/// word is junk each fail by the second check, under every kind of check.
#[test]
fn repeat_check_fails_a_slot_never_written() {
    for (pages, ps) in [(256u64, 4096usize), (16, 4096), (64, 64)] {
        let layout = PageLayout {
            page_size: ps,
            pages,
            used: 1,
        };
        let n = layout.slots(0);
        let ver = Versions::new(ps, n, true);
        let mut chk = RepeatCheck::new(&layout, ver, 9, 0, 0, 0).unwrap();
        let mut mr = Plain(Memory::Host(HostBuffer::new((n as usize + 1) * ps)));
        put(&mut mr, &layout, &ver, 9, 0, 50); // the initiator ahead of the checks
        chk.check(&mr, 40).unwrap();
        // Slot 3 never written.
        mr.0.write_at(3 * ps, &vec![0u8; ps]).unwrap();
        let mut failed = None;
        for g in 40..44 {
            if let Err(e) = chk.check(&mr, g) {
                failed = Some(e.to_string());
                break;
            }
        }
        let e = failed
            .unwrap_or_else(|| panic!("{pages} x {ps}: a zeroed slot passed ({} torn)", chk.torn));
        assert!(e.contains("slot 3"), "{e}");
    }
}

/// Periods too short to tell older from newer: whole pages of any repeat pass, 64 slots an
/// immediate in turn, and a slot that is no page at two of its checks in a row fails.
#[test]
fn short_periods_check_whole_pages_in_turn() {
    let layout = PageLayout {
        page_size: 64,
        pages: 200,
        used: 1,
    };
    let n = layout.slots(0);
    let ver = Versions::new(64, n, true);
    assert!(ver.period() < RepeatCheck::MIN_PERIOD);
    let mut chk = RepeatCheck::new(&layout, ver, 3, 0, 0, 0).unwrap();
    assert_eq!(chk.kind(), CheckKind::Whole);
    let mut mr = Plain(Memory::Host(HostBuffer::new((n as usize + 1) * 64)));
    put(&mut mr, &layout, &ver, 3, 0, 7);
    // An older page passes: nothing tells it from a newer one.
    let mut page = vec![0u8; 64];
    ver.expected(&layout, 3, 0, 0, 150, 2, &mut page);
    mr.0.write_at(150 * 64, &page).unwrap();
    for g in 7..7 + 2 * n.div_ceil(64) {
        chk.check(&mr, g).unwrap();
    }
    // Slot 199 junk: read at its turn (every 4th immediate), fails at its second.
    mr.0.write_at(199 * 64 + 56, &[0xee; 8]).unwrap();
    let mut at = None;
    for g in 100..120 {
        if let Err(e) = chk.check(&mr, g) {
            assert!(e.to_string().contains("slot 199"), "{e}");
            at = Some(g);
            break;
        }
    }
    assert!(at.is_some(), "a junk slot passed");
    assert_eq!(chk.torn, 2);
}

/// A source that does not turn (one buffer, fewer than 16 slots): every slot must hold its
/// own page, first and last word, at every immediate; a slot nothing wrote fails at once.
#[test]
fn fixed_pages_are_checked_at_every_immediate() {
    for (pages, ps) in [(1u64, 65536usize), (5, 4096), (3, 12), (4, 3), (1, 8)] {
        let layout = PageLayout {
            page_size: ps,
            pages,
            used: 1,
        };
        let n = layout.slots(0);
        let ver = Versions::new(ps, n, true);
        assert_eq!(ver, Versions::none(ps));
        let mut chk = RepeatCheck::new(&layout, ver, 4, 0, 0, 1).unwrap();
        assert_eq!(chk.kind(), CheckKind::Fixed);
        let len = ((n as usize + 1) * ps).max(64);
        let mut mr = Plain(Memory::Host(HostBuffer::new(len)));
        put(&mut mr, &layout, &ver, 4, 0, 0);
        chk.check(&mr, 0).unwrap();
        chk.check(&mr, 77).unwrap();
        let k = n - 1;
        // The last byte of the last slot wrong (for pages of 8 bytes or fewer, the first).
        let at = k as usize * ps + ps - 1;
        let mut b = [0u8; 1];
        mr.0.read_at(at, &mut b).unwrap();
        mr.0.write_at(at, &[b[0] ^ 1]).unwrap();
        let e = chk.check(&mr, 78).unwrap_err().to_string();
        assert!(
            e.contains(&format!("slot {k}'s")) && e.contains("NIC 1"),
            "{e}"
        );
        // A zeroed slot fails at its first check.
        put(&mut mr, &layout, &ver, 4, 0, 0);
        mr.0.write_at(0, &vec![0u8; ps]).unwrap();
        let e = chk.check(&mr, 79).unwrap_err().to_string();
        assert!(e.contains("slot 0's"), "{pages} x {ps}: {e}");
    }
    // A turning source over pages that are no whole number of words: no mid-run check.
    let odd = PageLayout {
        page_size: 100,
        pages: 32,
        used: 1,
    };
    assert!(RepeatCheck::new(&odd, Versions::new(100, 32, true), 5, 0, 0, 0).is_none());
}

#[test]
fn pattern_differs_by_page_and_handles_tails() {
    let (mut a, mut b) = ([0u8; 13], [0u8; 13]);
    fill_pattern(1, 0, 0, &mut a);
    fill_pattern(1, 0, 1, &mut b);
    assert_ne!(a, b);
    assert!(a.iter().any(|&x| x != 0));
}

/// Bytes `[from, to)` of NIC `j`'s slot `k` as repeat `h` leaves them, written into `mr`: a
/// piece of an older (or newer) repeat inside a slot.
#[allow(clippy::too_many_arguments)]
fn put_piece(
    mr: &mut Plain,
    layout: &PageLayout,
    ver: &Versions,
    seed: u64,
    j: usize,
    k: u64,
    h: u64,
    (from, to): (usize, usize),
) {
    let ps = layout.page_size;
    let mut page = vec![0u8; ps];
    ver.expected(layout, seed, 0, j, k, h, &mut page);
    mr.0.write_at(k as usize * ps + from, &page[from..to])
        .unwrap();
}

/// A WRITE whose middle piece was dropped (EFA_SIM_LOSE_WRITE_PERMILLE, a device that loses
/// an MTU packet) leaves the older repeat's bytes there while the first and last words are
/// new: the check reads a word every 1 KiB of each page, so one stale word at a mid-page
/// stride position fails naming the slot and the repeat, and so does a stale piece of 1 KiB
/// anywhere in the page (every 8-byte position), on a page whose repeat is shifted too.
#[test]
fn repeat_check_catches_a_piece_lost_inside_a_page() {
    let ps = 8192;
    for (used, j) in [(1usize, 0usize), (2, 1)] {
        let layout = PageLayout {
            page_size: ps,
            pages: 160 * used as u64,
            used,
        };
        let n = layout.slots(j);
        let ver = Versions::new(ps, n, true);
        let mut chk = RepeatCheck::new(&layout, ver, 5, 0, j, 3).expect("long period");
        assert_eq!(chk.kind(), CheckKind::Order);
        let mut mr = Plain(Memory::Host(HostBuffer::new((n as usize + 1) * ps)));
        // Repeat 1000 turns slot 17's source by 6 cache lines (1000 / 160 = 6): its tail comes
        // from the next source page.
        assert_ne!(ver.of_repeat(1000).1, 0);
        put(&mut mr, &layout, &ver, 5, j, 1000);
        chk.check(&mr, 1000).unwrap();
        // One word, at byte 2048 of slot 17, still the previous repeat's.
        put_piece(&mut mr, &layout, &ver, 5, j, 17, 999, (2048, 2056));
        let e = chk.check(&mr, 1000).unwrap_err().to_string();
        assert!(
            e.contains("NIC 3")
                && e.contains("slot 17 still held the page of repeat 999")
                && e.contains("byte 2048"),
            "{e}"
        );
        // A lost piece of 1 KiB at every word position of the page.
        for from in (0..=ps - 1024).step_by(8) {
            put_piece(&mut mr, &layout, &ver, 5, j, 17, 1000, (0, ps));
            put_piece(&mut mr, &layout, &ver, 5, j, 17, 999, (from, from + 1024));
            let e = chk
                .check(&mr, 1000)
                .map(|()| panic!("used {used}: a stale piece at byte {from} passed"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("slot 17 still held the page of repeat 999"),
                "piece at byte {from}: {e}"
            );
        }
    }
}

/// The initiator runs ahead of the checks: a slot read while newer repeats land in it, piece
/// by piece in any order (the middle first), holds pieces of several newer repeats. No false
/// alarm, and no read counted as racing a landing WRITE (every word names a page).
#[test]
fn pieces_of_newer_repeats_inside_a_page_pass() {
    let ps = 8192;
    let layout = PageLayout {
        page_size: ps,
        pages: 160,
        used: 1,
    };
    let n = layout.slots(0);
    let ver = Versions::new(ps, n, true);
    let mut chk = RepeatCheck::new(&layout, ver, 5, 0, 0, 0).unwrap();
    let mut mr = Plain(Memory::Host(HostBuffer::new((n as usize + 1) * ps)));
    put(&mut mr, &layout, &ver, 5, 0, 1001);
    put_piece(&mut mr, &layout, &ver, 5, 0, 9, 1002, (3000, 4000));
    put_piece(&mut mr, &layout, &ver, 5, 0, 9, 1003, (5000, 7000));
    put_piece(&mut mr, &layout, &ver, 5, 0, 10, 1004, (1024, 2048));
    for g in 995..=1001 {
        chk.check(&mr, g).unwrap();
    }
    assert_eq!(chk.torn, 0);
    // The immediate of 1002 with slot 9 still mostly 1001's fails.
    let e = chk.check(&mr, 1002).unwrap_err().to_string();
    assert!(e.contains("still held the page of repeat 1001"), "{e}");
}

/// A short period (whole pages of any repeat) and a source that does not turn (its own page)
/// read the mid-page words too: junk at byte 1024 of a slot fails by its second check, a
/// zeroed piece inside a fixed page at its first.
#[test]
fn whole_and_fixed_checks_read_inside_the_page() {
    let layout = PageLayout {
        page_size: 4096,
        pages: 64,
        used: 1,
    };
    let n = layout.slots(0);
    let ver = Versions::new(4096, n, true);
    let mut chk = RepeatCheck::new(&layout, ver, 3, 0, 0, 0).unwrap();
    assert_eq!(chk.kind(), CheckKind::Whole);
    let mut mr = Plain(Memory::Host(HostBuffer::new((n as usize + 1) * 4096)));
    put(&mut mr, &layout, &ver, 3, 0, 7);
    chk.check(&mr, 7).unwrap();
    mr.0.write_at(5 * 4096 + 1024, &[0xee; 8]).unwrap();
    let e = (7..9)
        .find_map(|g| chk.check(&mr, g).err())
        .map(|e| e.to_string())
        .expect("junk inside a slot passed");
    assert!(
        e.contains("slot 5") && e.contains("two checks in a row"),
        "{e}"
    );

    let layout = PageLayout {
        page_size: 65536,
        pages: 2,
        used: 1,
    };
    let ver = Versions::new(65536, 2, true);
    assert_eq!(ver, Versions::none(65536));
    let mut chk = RepeatCheck::new(&layout, ver, 4, 0, 0, 1).unwrap();
    assert_eq!(chk.kind(), CheckKind::Fixed);
    let mut mr = Plain(Memory::Host(HostBuffer::new(3 * 65536)));
    put(&mut mr, &layout, &ver, 4, 0, 0);
    chk.check(&mr, 0).unwrap();
    mr.0.write_at(65536 + 30000, &[0u8; 8928]).unwrap();
    let e = chk.check(&mr, 1).unwrap_err().to_string();
    assert!(e.contains("slot 1's") && e.contains("NIC 1"), "{e}");
}
