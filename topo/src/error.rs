//! Error type of the crate.

use std::path::PathBuf;

/// Everything that can go wrong while discovering or loading a topology.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The XML file could not be read (missing, unreadable, not UTF-8...).
    #[error("cannot read hwloc XML file {}: {source}", path.display())]
    XmlRead {
        /// The file that was asked for.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The XML document was read but is not a topology hwloc can load
    /// (malformed XML, not an hwloc export, or an export format newer than
    /// the system hwloc understands).
    #[error("{origin} is not a usable hwloc XML topology: {reason}")]
    XmlInvalid {
        /// Where the document came from: the file path, or `<xml buffer>`.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },

    /// hwloc itself failed (while configuring or loading the live topology).
    #[error("hwloc failed during {operation}: {message}")]
    Hwloc {
        /// The hwloc step that failed.
        operation: &'static str,
        /// hwloc's (or hwlocality's) description of the failure.
        message: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
