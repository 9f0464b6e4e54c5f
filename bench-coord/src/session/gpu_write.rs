//! `--workload gpu-write` in loopback: both sides in this process, NIC 0 of each, a proxy per
//! endpoint (`bench_core::workload::gpu_write`).

use transport_core::Transport;

use bench_core::error::{Error, Result};
use bench_core::side::{Side, SideCfg};
use bench_core::workload::gpu_write::{self, GpuWriteCfg, GpuWriteReport, Pair, Producer};

/// Open both sides, register a data region on each (host or GPU memory, as each side's
/// `mem` says), connect them, and run the workload over their first NICs.
pub fn gpu_write_loopback<T: Transport>(
    client: &SideCfg,
    server: &SideCfg,
    cfg: &GpuWriteCfg,
    producer: &dyn Producer,
) -> Result<GpuWriteReport> {
    let len = cfg.region_len();
    let mut a = Side::<T>::open(client)?;
    let mut b = Side::<T>::open(server)?;
    a.register(client.mem, len)?;
    b.register(server.mem, len)?;
    let (wa, wb) = (a.wire(), b.wire());
    a.connect(wb)?;
    b.connect(wa)?;
    a.settle()?;
    b.settle()?;
    if a.eps.is_empty() || b.eps.is_empty() {
        return Err(Error::Usage("gpu-write: no NIC on one side".into()));
    }
    let (a_to_b, remote) = (a.peers[0], a.imported[0][0]);
    // Regions are taken before their endpoints, and handed back in that order by `run`.
    let (src, dst) = (a.data.swap_remove(0), b.data.swap_remove(0));
    let (ep_a, ep_b) = (a.eps.swap_remove(0), b.eps.swap_remove(0));
    drop((a, b));
    gpu_write::run(
        Pair {
            a: ep_a,
            b: ep_b,
            a_to_b,
            src,
            dst,
            remote,
        },
        producer,
        cfg,
    )
}
