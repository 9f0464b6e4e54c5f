//! Pinning a thread to a core near its GPU (`--pin`), through `core_affinity` (no unsafe here).

use crate::topo_glue::Hints;

/// The core the thread driving GPU `ordinal` (the `index`-th GPU of the run, of `count`)
/// should run on: the first core topo places near the GPU, else an even spread over the
/// machine's cores.
pub fn core_for(
    hints: Option<&Hints>,
    ordinal: usize,
    index: usize,
    count: usize,
) -> Option<usize> {
    if let Some(cores) = hints.and_then(|h| h.cores.get(ordinal)) {
        if !cores.is_empty() {
            // Two GPUs sharing a socket get different cores from its list.
            return Some(cores[index % cores.len()]);
        }
    }
    let all = core_affinity::get_core_ids()?;
    if all.is_empty() {
        return None;
    }
    let slot = index * all.len() / count.max(1);
    all.get(slot % all.len()).map(|c| c.id)
}

/// Cores a `cpu_set_t` holds (glibc's `CPU_SETSIZE`): `core_affinity` indexes one with the
/// core's number and panics past it.
const CPU_SETSIZE: usize = 1024;

/// Pin the calling thread to `core`; false where the OS refused, or where the core's number
/// is past what `sched_setaffinity`'s set holds (a topology file may name any).
pub fn pin_current(core: usize) -> bool {
    core < CPU_SETSIZE && core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core past what the affinity set holds (a topology file may list any number) is a
    /// refusal, not a panic inside `core_affinity`.
    #[test]
    fn a_core_past_the_set_is_refused() {
        for core in [CPU_SETSIZE, 2048, usize::MAX] {
            let pinned = std::thread::spawn(move || pin_current(core))
                .join()
                .expect("pin_current panicked");
            assert!(!pinned, "core {core}");
        }
    }
}
