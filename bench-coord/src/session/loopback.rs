//! Loopback: both sides of a session in this process, a one-session server in a thread and
//! the client in the caller's, over a TCP connection on 127.0.0.1.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use transport_core::Transport;

use bench_core::error::{Error, Result, TransportContext};
use bench_core::plan::Plan;
use bench_core::side::SideCfg;
use bench_core::teardown::TeardownGate;
use bench_core::workload::gpu_write::{GpuWriteCfg, GpuWriteReport, Producer};

use super::client::{client, connect, ClientOut};
use super::gpu_write::gpu_write_client;
use super::layout::ServerCfg;
use super::server::session;
use super::timeouts::PREPARE_TIMEOUT;

/// Both sides in this process: a one-session server in a thread, the client in this one.
pub fn loopback<T: Transport>(
    client_cfg: &SideCfg,
    server_cfg: &ServerCfg,
    plan: &Plan,
    json: bool,
) -> Result<ClientOut> {
    let (client_cfg, server_cfg) = gated(client_cfg, server_cfg);
    with_server::<T, _>(&server_cfg, |st| client::<T>(&client_cfg, plan, st, json))
}

/// Both sides' configurations with one teardown gate: neither closes its endpoints while the
/// other, in this process, may still use them ([`bench_core::teardown`]).
fn gated(client: &SideCfg, server: &ServerCfg) -> (SideCfg, ServerCfg) {
    let gate = Some(Arc::new(TeardownGate::default()));
    let mut server = server.clone();
    server.side.teardown = gate.clone();
    let client = SideCfg {
        teardown: gate,
        ..client.clone()
    };
    (client, server)
}

/// Both sides in this process: a one-session server in a thread, the gpu-write client in
/// this one, over a TCP connection on 127.0.0.1 (as loopback runs every workload).
pub fn gpu_write_loopback<T: Transport>(
    client: &SideCfg,
    server: &ServerCfg,
    cfg: &GpuWriteCfg,
    producer: &dyn Producer,
) -> Result<GpuWriteReport> {
    let (client, server) = gated(client, server);
    with_server::<T, _>(&server, |st| {
        gpu_write_client::<T>(&client, st, cfg, producer)
    })
}

/// A one-session server in a thread, and `client` in this one over a connection to it.
pub(super) fn with_server<T: Transport, R>(
    server_cfg: &ServerCfg,
    client: impl FnOnce(std::net::TcpStream) -> Result<R>,
) -> Result<R> {
    let listener = TcpListener::bind("127.0.0.1:0").ctx(|| "binding 127.0.0.1")?;
    let addr = listener
        .local_addr()
        .ctx(|| "reading the loopback address")?;
    listener
        .set_nonblocking(true)
        .ctx(|| "making the loopback listener non-blocking")?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let server = s.spawn(|| -> Result<u64> {
            let start = Instant::now();
            let stream = loop {
                match listener.accept() {
                    Ok((st, _)) => break st,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if stop.load(Ordering::Relaxed) {
                            return Ok(0);
                        }
                        if start.elapsed() > PREPARE_TIMEOUT {
                            return Err(Error::Timeout {
                                what: "the loopback client to connect".into(),
                                after: PREPARE_TIMEOUT,
                            });
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        return Err(Error::Io {
                            what: "accepting the loopback client".into(),
                            source: e,
                        })
                    }
                }
            };
            stream
                .set_nonblocking(false)
                .ctx(|| "configuring the loopback connection")?;
            session::<T>(
                server_cfg,
                stream,
                "the loopback session",
                Default::default(),
            )
        });
        let client = connect(&addr.to_string(), Duration::from_secs(5)).and_then(client);
        stop.store(true, Ordering::Relaxed);
        let server = server.join().unwrap_or_else(|_| {
            Err(Error::Protocol(
                "the loopback server thread panicked".into(),
            ))
        });
        match (client, server) {
            (Ok(c), Ok(_)) => Ok(c),
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e),
        }
    })
}
