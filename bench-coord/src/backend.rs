//! A backend as a program offers it: its description ([`transport_core::BackendInfo`]) and
//! this crate's entry points (loopback, server, client, a rank of `rdma-bench run`)
//! instantiated for it. A program keeps one table of them, a [`backend!`](crate::backend!)
//! line each ([`Backend::of`] for a backend it was built with, [`Backend::missing`] for one it
//! was not); everything below a [`Backend`] is generic over `Transport`, and this crate names
//! no backend.

use std::fmt;
use std::net::TcpStream;

use transport_core::{BackendInfo, Transport};

use bench_core::error::{Error, Result};
use bench_core::plan::Plan;
use bench_core::side::SideCfg;
use bench_core::workload::gpu_write::{GpuWriteCfg, GpuWriteReport, Producer};

use crate::ranks::{JobReport, RunCfg};
use crate::session::{self, ClientOut, ServerCfg};

type LoopbackFn = fn(&SideCfg, &ServerCfg, &Plan, bool) -> Result<ClientOut>;
type ServeFn = fn(&ServerCfg, &str) -> Result<()>;
type ClientFn = fn(&SideCfg, &Plan, TcpStream, bool) -> Result<ClientOut>;
type RankFn = fn(RunCfg, &mut dyn FnMut(&JobReport)) -> Result<()>;
type GpuWriteFn = fn(&SideCfg, &ServerCfg, &GpuWriteCfg, &dyn Producer) -> Result<GpuWriteReport>;
type GpuClientFn = fn(&SideCfg, TcpStream, &GpuWriteCfg, &dyn Producer) -> Result<GpuWriteReport>;

/// One backend of a program's table.
pub struct Backend {
    info: &'static BackendInfo,
    /// The Cargo feature that builds it in.
    feature: &'static str,
    run: Option<Entry>,
}

/// The entry points, for a backend the program was built with.
struct Entry {
    loopback: LoopbackFn,
    serve: ServeFn,
    client: ClientFn,
    rank: RankFn,
    gpu_write: GpuWriteFn,
    gpu_write_client: GpuClientFn,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.info.name)
            .field("built", &self.run.is_some())
            .finish()
    }
}

impl Backend {
    /// Backend `T`, built in.
    pub const fn of<T: Transport>() -> Backend {
        Backend {
            info: T::INFO,
            feature: T::INFO.name,
            run: Some(Entry {
                loopback: session::loopback::<T>,
                serve: session::serve::<T>,
                client: session::client::<T>,
                rank: crate::ranks::run::<T>,
                gpu_write: session::gpu_write_loopback::<T>,
                gpu_write_client: session::gpu_write_client::<T>,
            }),
        }
    }

    /// A backend this program was built without: `info` says no more than its name and
    /// aliases ([`missing_info!`](crate::missing_info)), and running it says how to build it
    /// in (with `feature`).
    pub const fn missing(info: &'static BackendInfo, feature: &'static str) -> Backend {
        Backend {
            info,
            feature,
            run: None,
        }
    }

    /// What the backend says about itself.
    pub fn info(&self) -> &'static BackendInfo {
        self.info
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.info.name
    }

    /// Whether this program was built with it.
    pub fn is_built(&self) -> bool {
        self.run.is_some()
    }

    /// `Ok` where this program was built with the backend, else the error saying how to build
    /// it in.
    pub fn check_built(&self) -> Result<()> {
        self.entry().map(|_| ())
    }

    /// The entry points (the backend's way out for a wedged process registered first), or
    /// the error that says how to build the backend in.
    fn entry(&self) -> Result<&Entry> {
        let Some(e) = &self.run else {
            return Err(Error::Unavailable(format!(
                "--backend {}: this rdma-bench was built without the `{}` feature; rebuild \
                 with --features {}",
                self.info.name, self.feature, self.feature
            )));
        };
        if let Some(exit) = self.info.exit_abandoning {
            bench_core::ctrl::on_abandon(exit);
        }
        Ok(e)
    }

    /// [`session::loopback`] on this backend.
    pub fn loopback(
        &self,
        client: &SideCfg,
        server: &ServerCfg,
        plan: &Plan,
        json: bool,
    ) -> Result<ClientOut> {
        (self.entry()?.loopback)(client, server, plan, json)
    }

    /// [`session::gpu_write_loopback`] on this backend.
    pub fn gpu_write(
        &self,
        client: &SideCfg,
        server: &ServerCfg,
        cfg: &GpuWriteCfg,
        producer: &dyn Producer,
    ) -> Result<GpuWriteReport> {
        (self.entry()?.gpu_write)(client, server, cfg, producer)
    }

    /// [`session::gpu_write_client`] on this backend.
    pub fn gpu_write_client(
        &self,
        client: &SideCfg,
        stream: TcpStream,
        cfg: &GpuWriteCfg,
        producer: &dyn Producer,
    ) -> Result<GpuWriteReport> {
        (self.entry()?.gpu_write_client)(client, stream, cfg, producer)
    }

    /// [`session::serve`] on this backend.
    pub fn serve(&self, cfg: &ServerCfg, listen: &str) -> Result<()> {
        (self.entry()?.serve)(cfg, listen)
    }

    /// [`session::client`] on this backend.
    pub fn client(
        &self,
        cfg: &SideCfg,
        plan: &Plan,
        stream: TcpStream,
        json: bool,
    ) -> Result<ClientOut> {
        (self.entry()?.client)(cfg, plan, stream, json)
    }

    /// [`crate::ranks::run`] on this backend: rank 0 hands its report to `emit`.
    pub fn rank(&self, cfg: RunCfg, emit: &mut dyn FnMut(&JobReport)) -> Result<()> {
        (self.entry()?.rank)(cfg, emit)
    }
}

/// One line of a program's table of backends: `backend!("verbs", transport_verbs::Endpoint)` is
/// [`Backend::of`] where the program's Cargo feature `verbs` is on, and [`Backend::missing`]
/// (named after the feature) where it is off. A backend named otherwise than its feature
/// gives its name and aliases too, `backend!("efa", transport_efa::Endpoint, "libfabric",
/// ["efa"])`, so that a build without it still knows them. The program's `Cargo.toml` makes
/// the feature pull in the backend crate.
#[macro_export]
macro_rules! backend {
    ($feature:literal, $ty:ty) => {
        $crate::backend!($feature, $ty, $feature, [])
    };
    ($feature:literal, $ty:ty, $name:literal, [$($alias:literal),*]) => {{
        #[cfg(feature = $feature)]
        const B: $crate::backend::Backend = $crate::backend::Backend::of::<$ty>();
        #[cfg(not(feature = $feature))]
        const B: $crate::backend::Backend = {
            const INFO: $crate::transport_core::BackendInfo =
                $crate::backend::missing_info!($feature, $name, [$($alias),*]);
            $crate::backend::Backend::missing(&INFO, $feature)
        };
        B
    }};
}

/// The description of a backend that is not built in: its name and aliases, and nothing else
/// it could only say itself.
#[doc(hidden)]
#[macro_export]
macro_rules! missing_info {
    ($feature:literal, $name:literal, [$($alias:literal),*]) => {
        $crate::transport_core::BackendInfo {
            name: $name,
            aliases: &[$($alias),*],
            help: concat!("not in this build (rebuild with --features ", $feature, ")"),
            library: $feature,
            provider: None,
            devices: "",
            nic_driver: $crate::backend::no_nic_driver,
            options: &[],
            options_env: None,
            same_process_gpu: &[],
            probe: None,
            exit_abandoning: None,
        }
    };
}

#[doc(hidden)]
pub use crate::missing_info;

/// The NIC driver of a backend that is not built in: none.
#[doc(hidden)]
pub fn no_nic_driver(_provider: Option<&str>) -> Option<&'static str> {
    None
}
