//! `--workload gpu-write` over the session protocol: the client runs the producer and its
//! proxy, the server its proxy and the echo (`bench_core::workload::gpu_write`), on NIC 0 of
//! each side. Loopback runs the same two halves in one process
//! ([`super::loopback::gpu_write_loopback`]).

use std::net::TcpStream;
use std::time::Duration;

use transport_core::Transport;

use bench_core::ctrl::{Ctrl, Liveness, Watchdog};
use bench_core::error::{Error, Result};
use bench_core::proto::{GpuStep, GpuStepDone, Msg};
use bench_core::side::{Side, SideCfg};
use bench_core::workload::gpu_write::{self, End, GpuWriteCfg, GpuWriteReport, Producer};

use super::client::greet;
use super::layout::ServerCfg;
use super::timeouts::{peer_gone_cause, WATCHDOG_GRACE};

/// The client of a gpu-write session over `stream`.
pub fn gpu_write_client<T: Transport>(
    cfg: &SideCfg,
    stream: TcpStream,
    gcfg: &GpuWriteCfg,
    producer: &dyn Producer,
) -> Result<GpuWriteReport> {
    let mut ctrl = Ctrl::watched(stream, Some(Watchdog::Exit(WATCHDOG_GRACE)))?;
    let r = client_inner::<T>(cfg, &mut ctrl, gcfg, producer);
    r.map_err(|e| peer_gone_cause(e, &ctrl, "the server"))
}

fn client_inner<T: Transport>(
    cfg: &SideCfg,
    ctrl: &mut Ctrl,
    gcfg: &GpuWriteCfg,
    producer: &dyn Producer,
) -> Result<GpuWriteReport> {
    let live = ctrl.liveness();
    let _busy = live.busy();
    let mut side = Side::<T>::open(cfg)?;
    let r = client_steps(&mut side, cfg, ctrl, gcfg, producer, &live);
    // The server hears how it ended before the endpoints close: it ends its session and
    // stops using them (a loopback's server, in this process, is waited for before they
    // close: bench_core::teardown).
    match &r {
        Ok(_) => {
            let _ = ctrl.send(&Msg::Bye);
        }
        Err(e) if !matches!(e, Error::PeerGone(_) | Error::Refused(_)) => {
            ctrl.send_error(&format!("client: {e}"))
        }
        Err(_) => {}
    }
    r
}

/// The client's steps on its opened endpoints: regions, hello, every step.
fn client_steps<T: Transport>(
    side: &mut Side<T>,
    cfg: &SideCfg,
    ctrl: &mut Ctrl,
    gcfg: &GpuWriteCfg,
    producer: &dyn Producer,
    live: &Liveness,
) -> Result<GpuWriteReport> {
    if side.eps.is_empty() {
        return Err(Error::Usage("gpu-write: no NIC on this side".into()));
    }
    let len = gcfg.region_len();
    side.register(cfg.mem, len, cfg.buf_offset)?;
    greet(side, cfg, ctrl, len)?;
    let gpu = side.gpus.first().copied().unwrap_or(0);
    let (core, pinning) = gpu_write::proxy_core(gcfg.pin, cfg.hints.as_ref(), gpu, 0);
    on_nic0(side, core, live, gcfg.idle, |end, region| {
        gpu_write::client(end, region, producer, gcfg, ctrl, &pinning)
    })
}

/// The server's part of one gpu-write step, on NIC 0 of `side`.
pub(crate) fn serve_gpu_step<T: Transport>(
    side: &mut Side<T>,
    ctrl: &mut Ctrl,
    cfg: &ServerCfg,
    step: &GpuStep,
) -> Result<GpuStepDone> {
    if side.eps.is_empty() || side.data.is_empty() {
        return Err(Error::Protocol("gpu-write: no NIC on the server".into()));
    }
    ring_fits(step.capacity, cfg.max_mem)?;
    let live = ctrl.liveness();
    let _busy = live.busy();
    let gpu = side.gpus.first().copied().unwrap_or(0);
    let (core, _) = gpu_write::proxy_core(step.pin, cfg.side.hints.as_ref(), gpu, 1);
    let idle = cfg.side.idle.max(Duration::from_secs(30));
    let id = step.id;
    on_nic0(side, core, &live, idle, |end, region| {
        gpu_write::serve_step(end, region, step, || ctrl.send(&Msg::Ready { id }))
    })
}

/// The ring a step makes the server allocate is the client's to size (up to 2^24 commands,
/// 512 MiB): it is held to the server's `--max-mem`, as the regions are.
fn ring_fits(capacity: u32, max_mem: u64) -> Result<()> {
    let bytes = gpu_write::ring_bytes(capacity)?;
    if bytes > max_mem {
        return Err(Error::Protocol(format!(
            "gpu-write: the client's ring of {capacity} commands needs {bytes} bytes, over this \
             server's --max-mem {max_mem}"
        )));
    }
    Ok(())
}

/// NIC 0 of `side` as one end of gpu-write (its endpoint, its peer, the peer's data region as
/// imported, the proxy's core), with its own data region lent to `f` and put back after.
fn on_nic0<T: Transport, R>(
    side: &mut Side<T>,
    core: Option<usize>,
    live: &Liveness,
    idle: Duration,
    f: impl FnOnce(&mut End<'_, T>, T::Mr) -> Result<(R, T::Mr)>,
) -> Result<R> {
    let region = side.data.remove(0);
    let mut end = End {
        ep: &mut side.eps[0],
        peer: side.peers[0],
        remote: side.imported[0][0],
        core,
        live: live.clone(),
        idle,
    };
    let (r, region) = f(&mut end, region)?;
    side.data.insert(0, region);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_over_max_mem_is_refused() {
        let bytes = gpu_write::ring_bytes(1 << 24).unwrap();
        assert!(ring_fits(1 << 24, bytes).is_ok());
        let e = ring_fits(1 << 24, bytes - 1).unwrap_err().to_string();
        assert!(e.contains("--max-mem"), "{e}");
        assert!(ring_fits(4096, 1 << 30).is_ok());
    }
}
