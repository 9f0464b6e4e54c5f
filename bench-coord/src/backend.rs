//! The one place a backend is chosen: everything below is generic over `Transport`.

use transport_core::Transport;

use bench_core::config::Backend;
#[cfg(not(all(feature = "efa", feature = "verbs")))]
use bench_core::error::Error;
use bench_core::error::Result;

/// Work that runs on whichever backend is chosen at run time.
pub trait WithTransport {
    type Output;
    /// Run on backend `T`.
    fn call<T: Transport>(self) -> Result<Self::Output>;
}

/// Run `w` on `backend`, or say the build lacks it.
pub fn dispatch<W: WithTransport>(backend: Backend, w: W) -> Result<W::Output> {
    match backend {
        Backend::Efa => {
            #[cfg(feature = "efa")]
            {
                bench_core::ctrl::on_abandon(transport_efa::exit_abandoning_endpoints);
                w.call::<transport_efa::Endpoint>()
            }
            #[cfg(not(feature = "efa"))]
            {
                drop(w);
                Err(Error::Unavailable(
                    "--backend efa: this rdma-bench was built without the `efa` feature (libfabric); rebuild with --features efa".into(),
                ))
            }
        }
        Backend::Verbs => {
            #[cfg(feature = "verbs")]
            {
                w.call::<transport_verbs::Endpoint>()
            }
            #[cfg(not(feature = "verbs"))]
            {
                drop(w);
                Err(Error::Unavailable(
                    "--backend verbs: this rdma-bench was built without the `verbs` feature (ibverbs); rebuild with --features verbs".into(),
                ))
            }
        }
    }
}

/// Backends this build has.
pub fn built() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "efa") {
        v.push("efa");
    }
    if cfg!(feature = "verbs") {
        v.push("verbs");
    }
    v
}
