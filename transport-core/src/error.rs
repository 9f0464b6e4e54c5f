use std::fmt;
use std::time::Duration;

/// Shorthand for this crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The operation a completion or error belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Send,
    Recv,
    Write,
    RemoteWrite,
    Unknown,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Write => "write",
            Op::RemoteWrite => "remote write",
            Op::Unknown => "operation",
        })
    }
}

/// A failed operation, as the provider reported it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{op} (ctx {ctx:#x}) failed: {msg} (error {code}, provider error {prov_errno}){}",
    Hint(.hint)
)]
pub struct CompletionError {
    pub op: Op,
    pub ctx: u64,
    /// Provider error code (libfabric `FI_E*`, verbs `ibv_wc_status`, UCX `ucs_status_t`).
    pub code: i32,
    /// Provider-specific error (libfabric `prov_errno`, verbs vendor error).
    pub prov_errno: i32,
    /// The provider's own text (`fi_strerror` and `fi_cq_strerror`, `ibv_wc_status_str`,
    /// `ucs_status_string`).
    pub msg: String,
    /// What to do about it, chosen by the backend from the code; never empty.
    pub hint: &'static str,
}

/// [`CompletionError::hint`]s that mean the same on every backend, in one set of words.
pub mod hint {
    pub const PEER_GONE: &str =
        "the peer went away or did not answer: check that it still runs, then reopen both ends";
    pub const BAD_REMOTE: &str = "the remote key, address or length lies outside the peer's \
        region: check the RemoteMr the peer sent and the slice's offset and length";
    pub const TOO_LONG: &str =
        "the message is longer than the receive buffer: post larger receives";
    pub const NO_RECV: &str =
        "the peer had no receive posted in time: post receives before the peer sends";
    pub const NOT_REGISTERED: &str =
        "the local buffer is not in a region of this endpoint: register it with this endpoint";
}

/// A hint after the error's text, as ". {hint}" (nothing where the hint is empty).
struct Hint<'a>(&'a str);

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        write!(f, ". {}", self.0)
    }
}

/// Everything that can go wrong, with the provider's own words and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A provider call failed.
    #[error("{call} failed: {msg} ({code}). {hint}")]
    Provider {
        call: &'static str,
        code: i32,
        msg: String,
        hint: String,
    },
    /// No usable NIC or provider.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// The caller passed something unusable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Peer address bytes that this backend cannot read.
    #[error("bad peer address: {0}")]
    BadAddress(String),
    /// The NIC, provider or build cannot do this.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A wait ran out.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// CUDA is missing or failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// An operation completed with an error.
    #[error(transparent)]
    Completion(Box<CompletionError>),
}
