//! The one error type of rdma-bench: every failure says what happened and, where it can,
//! what to do.

use std::time::Duration;

/// Shorthand for this crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line asks for something impossible (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// A transport call failed.
    #[error("{what}: {source}")]
    Transport {
        what: String,
        #[source]
        source: transport_core::Error,
    },
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The peer sent something this side cannot accept, or refused what this side sent.
    #[error("{0}")]
    Protocol(String),
    /// The peer refused the handshake or a request, with its reason.
    #[error("peer refused: {0}")]
    Refused(String),
    /// The peer went away (its control connection closed).
    #[error("peer is gone: {0}")]
    PeerGone(String),
    /// A bounded wait ran out.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// Bytes that arrived differ from what was sent.
    #[error("verification failed: {0}")]
    Verify(String),
    /// Another rank of an `rdma-bench run` job failed or died; the job is over.
    #[error("rank {rank} failed, aborting the job: {message}")]
    RankFailed { rank: u32, message: String },
    /// Not available in this build or on this machine.
    #[error("{0}")]
    Unavailable(String),
    /// The run worked but fell short of a gate (`--expect`, `--min-pct`, `--min-gbps`;
    /// exit status 3).
    #[error("{0}")]
    Gate(String),
}

impl Error {
    /// Process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Gate(_) => 3,
            _ => 1,
        }
    }
}

/// Attach context to a transport result.
pub trait TransportContext<T> {
    /// Wrap the error with `what`, evaluated only on error.
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T> TransportContext<T> for transport_core::Result<T> {
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|source| Error::Transport {
            what: what().into(),
            source,
        })
    }
}

impl<T> TransportContext<T> for std::io::Result<T> {
    fn ctx<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|source| Error::Io {
            what: what().into(),
            source,
        })
    }
}
