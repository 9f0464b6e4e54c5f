//! The doctor's errors: its inputs cannot be read (exit status 2, as a usage error), or the
//! instance table is unusable.

/// Shorthand for this crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What stops the doctor before any check runs, or an instance-table lookup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag names something that does not exist (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// Not available in this build or on this machine.
    #[error("{0}")]
    Unavailable(String),
}

impl Error {
    /// Process exit status for this error (as rdma-bench's own errors: usage 2, else 1).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Unavailable(_) => 1,
        }
    }
}
