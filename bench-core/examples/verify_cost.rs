//! What the write workload's check at each immediate (`buffers::RepeatCheck`) costs the
//! target: time per immediate and per word read, for slots that hold whole pages of one
//! repeat (the common case), on this CPU. A CPU figure, not a network one:
//!
//!   cargo run --release -p bench-core --example verify_cost
use bench_core::buffers::{self, PageLayout, RepeatCheck, Versions};
use std::time::Instant;
use transport_core::{HostBuffer, Memory};
fn main() {
    for (ps, pages) in [(4096usize, 256u64), (65536, 256), (1 << 20, 16)] {
        let layout = PageLayout {
            page_size: ps,
            pages,
            used: 1,
        };
        let n = layout.slots(0);
        let ver = Versions::new(ps, n, true);
        let mut chk = RepeatCheck::new(&layout, ver, 5, 0, 0, 0).unwrap();
        let mut mem = Memory::Host(HostBuffer::new((n as usize + 1) * ps));
        let mut page = vec![0u8; ps];
        for k in 0..n {
            ver.expected(&layout, 5, 0, 0, k, 1000, &mut page);
            mem.write_at(k as usize * ps, &page).unwrap();
        }
        let mr = Plain(mem);
        let it = 2000;
        let t = Instant::now();
        for _ in 0..it {
            chk.check(&mr, 1000).unwrap();
        }
        let d = t.elapsed().as_nanos() as f64 / it as f64;
        let words = buffers::check_words_per_page(ps) as f64 * n as f64;
        println!("{ps} B x {n} slots: {:.1} us per immediate, {words} words, {:.2} ns/word, {:.2} GB/s of slot bytes", d / 1e3, d / words, (ps as f64 * n as f64) / d);
    }
}
/// Host memory that is no registration: enough to run the check.
struct Plain(Memory);
impl transport_core::MemoryRegion for Plain {
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
