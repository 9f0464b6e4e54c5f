//! A process whose pid once belonged to a killed one finds that process's `shm` regions
//! in /dev/shm under the names its own endpoints will take (`<pid>:<uid>:<index>`).
//! libfabric 1.x-2.5 fails `fi_enable` with -FI_EBUSY on such a file (the recorded pid is
//! alive: it is ours) and unlinks it in the same call; 2.6 retries under another name
//! itself. The backend retries once, so opening an endpoint must succeed on every release.
//!
//! Its own test binary: the provider's endpoint counter starts at 0 in this process, so the
//! planted names are exactly the first endpoints' names.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use transport_core::{NicDesc, Transport};
use transport_efa::Endpoint;

fn region(index: u32) -> PathBuf {
    let uid = fs::metadata("/proc/self").expect("/proc/self").uid();
    PathBuf::from(format!("/dev/shm/{}:{uid}:{index}", std::process::id()))
}

#[test]
fn endpoint_opens_over_a_dead_process_region_of_the_same_name() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        transport_core::skip::note("no /dev/shm", "/dev/shm is not a directory");
        return;
    }
    // A page of zeros: a region whose layout version is not the provider's, as a killed
    // process of another release, or a half-written one, leaves behind.
    for index in 0..4 {
        fs::write(region(index), vec![0u8; 4096]).expect("plant a stale region");
    }
    let opened: Vec<Endpoint> = (0..2)
        .map(|n| {
            Endpoint::open(&NicDesc::provider("shm"))
                .unwrap_or_else(|e| panic!("endpoint {n} over a stale region: {e}"))
        })
        .collect();
    let (a, b) = (&opened[0], &opened[1]);
    assert_ne!(a.address(), b.address());
    drop(opened);
    for index in 0..4 {
        let _ = fs::remove_file(region(index));
    }
}
