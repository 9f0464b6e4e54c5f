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
    let mut mr = Plain(alloc(kind, 0, len).unwrap());
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
}

#[test]
fn fill_and_verify_host() {
    fill_verify_round(MemKind::Host);
}

/// The same through CUDA copies, where this machine has a GPU (skipped elsewhere).
#[test]
fn fill_and_verify_gpu() {
    if !cuda_driver() || cuda_devices().unwrap_or(0) == 0 {
        eprintln!("fill_and_verify_gpu: skipped, no CUDA device");
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

/// The immediate check: a slot still holding the previous repeat's page fails, naming
/// both repeats; newer pages (the initiator runs ahead) and torn words pass.
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
    let mut mr = Plain(Memory::Host(HostBuffer::new(n as usize * 4096)));
    let put = |mr: &mut Plain, g: u64| {
        let mut page = vec![0u8; 4096];
        for k in 0..n {
            ver.expected(&layout, 5, 0, 0, k, g, &mut page);
            mr.0.write_at(k as usize * 4096, &page).unwrap();
        }
    };
    put(&mut mr, 1000);
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
    mr.0.write_at(17 * 4096, &[0x55; 8]).unwrap();
    chk.check(&mr, 1000).unwrap();
    assert_eq!(chk.torn, 1);
    // Too short a period for a mid-run check: 16 pages of 4 KiB.
    let small = PageLayout {
        page_size: 4096,
        pages: 16,
        used: 1,
    };
    assert!(RepeatCheck::new(&small, Versions::new(4096, 16, true), 5, 0, 0, 0).is_none());
}

#[test]
fn pattern_differs_by_page_and_handles_tails() {
    let (mut a, mut b) = ([0u8; 13], [0u8; 13]);
    fill_pattern(1, 0, 0, &mut a);
    fill_pattern(1, 0, 1, &mut b);
    assert_ne!(a, b);
    assert!(a.iter().any(|&x| x != 0));
}
