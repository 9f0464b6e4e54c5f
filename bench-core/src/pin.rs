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

/// Pin the calling thread to `core`; false where the OS refused.
pub fn pin_current(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}
