//! The `shm` provider's shared-memory regions in /dev/shm, and ending a process without
//! closing its endpoints ([`exit_abandoning_endpoints`]).

/// The shared-memory regions process `pid` of this user has in /dev/shm: libfabric's `shm`
/// names its endpoints' regions `<pid>:<uid>:<n>` (2.6 may add `:<seed>`).
pub fn shm_regions_of(pid: u32) -> Vec<std::path::PathBuf> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let prefix = format!("{pid}:{uid}:");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Removes the `shm` regions of process `pid`, which is gone (killed) or about to exit
/// without closing its endpoints: libfabric unlinks a region only when its endpoint closes
/// (its exit handler frees the names, not the files), so otherwise each endpoint leaves its
/// region, 16 MiB by default, until reboot, under a name the next process given that pid
/// takes. Peers that already mapped a region keep their mapping.
pub fn remove_shm_regions_of(pid: u32) {
    for path in shm_regions_of(pid) {
        let _ = std::fs::remove_file(path);
    }
}

/// [`remove_shm_regions_of`] this process, for one about to exit with a worker stuck inside
/// the provider after a peer died. Never call it while this process will go on using an
/// `shm` endpoint.
pub fn remove_shm_regions_of_this_process() {
    remove_shm_regions_of(std::process::id());
}

/// Ends this process at once with exit status `code`, leaving every endpoint as it is: for a
/// process that gives up on endpoints a dead peer may have wedged (a thread spinning inside
/// `shm` on a queue lock the peer died holding, or an operation to it still in flight).
///
/// It first removes this process's `shm` regions ([`remove_shm_regions_of_this_process`]),
/// then calls `_exit`: no `atexit` handler and no library destructor runs. `exit` would run
/// libfabric's `fi_fini` (every provider's cleanup: 1.17's `shm` frees its list of endpoint
/// names, which it searches when it maps a peer, and its saved signal actions) while another
/// thread may still be inside the provider, and would close nothing that matters here: the
/// kernel releases the rest. Flush buffered output (stdout) first: nothing is flushed here.
pub fn exit_abandoning_endpoints(code: i32) -> ! {
    remove_shm_regions_of_this_process();
    // SAFETY: _exit has no preconditions; it ends the process without returning and runs no
    // code of this process (no handler, no destructor) that could touch a wedged endpoint.
    unsafe { libc::_exit(code) }
}
