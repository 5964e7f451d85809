//! The crate's error type.

use std::path::{Path, PathBuf};

/// What can go wrong reading, importing, replaying or drawing a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A line of a trace is not a valid event.
    #[error("line {line}: {message}")]
    Parse {
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The trace's header names a newer format version.
    #[error("trace format version {found} is newer than this build reads (version {supported})")]
    Version {
        /// The version in the file.
        found: String,
        /// The version this build reads.
        supported: u32,
    },
    /// A PyTorch snapshot could not be read.
    #[error("not a PyTorch memory snapshot: {0}")]
    Snapshot(String),
    /// A file could not be opened, read or written.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The pool failed during a replay.
    #[error("replay: {0}")]
    Pool(#[from] gpumem::Error),
    /// The command line could not be parsed: clap's rendered message, and whether it is an
    /// error (`false` for `--help` and `--version`).
    #[error("{0}")]
    Usage(String, bool),
    /// A sum over the trace does not fit 64 bits (a hostile or corrupt trace: no device holds
    /// 2^64 bytes).
    #[error("the trace's {0} exceed 2^64 - 1 bytes")]
    Overflow(&'static str),
    /// A bad argument (an unknown policy name, an empty trace to plot).
    #[error("{0}")]
    InvalidArgument(String),
}

impl Error {
    /// An I/O error on `path`.
    pub(crate) fn file(path: &Path, source: std::io::Error) -> Self {
        Error::File { path: path.to_owned(), source }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
