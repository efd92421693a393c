//! Errors of the transactional core: each names its cause, so that a client, or an
//! operator reading a log file that does not recover, knows what went wrong.

use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum Error {
    /// A file or directory operation failed.
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    /// A log segment or checkpoint does not hold what it must (not a torn tail, which
    /// recovery cuts off silently).
    Corrupt {
        path: PathBuf,
        detail: String,
    },
    /// A row breaks the table's rules: duplicate or missing key, wrong type, NULL in a
    /// NOT NULL column.
    Constraint(String),
    /// The transaction's body asked to roll back (as 1% of TPC-C's New-Orders do).
    Aborted(String),
    NoSuchTable(String),
    TableExists(String),
    NoSuchProcedure(String),
    /// The call's arguments do not match the procedure's parameters.
    Arguments(String),
    Unsupported(String),
    /// A transaction could not start in time: another one holds the primary.
    Busy(String),
    /// The log writer failed earlier (a write or an fsync): nothing more commits, since
    /// whether the failed group reached the disk is unknown.
    LogFailed(String),
    Parquet(String),
    /// The primary could not confirm that it still leads the voters before a read:
    /// another may have been elected, and what this one holds may be stale.
    NotLeading(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: &Path, what: &'static str, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            what,
            source,
        }
    }

    pub(crate) fn corrupt(path: &Path, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, what, source } => {
                write!(f, "cannot {what} {}: {source}", path.display())
            }
            Error::Corrupt { path, detail } => write!(f, "{} is corrupt: {detail}", path.display()),
            Error::Constraint(m) => write!(f, "constraint violated: {m}"),
            Error::Aborted(m) => write!(f, "transaction rolled back: {m}"),
            Error::NoSuchTable(t) => write!(f, "no transactional table named {t}"),
            Error::TableExists(t) => write!(f, "table {t} already exists"),
            Error::NoSuchProcedure(p) => write!(f, "no stored procedure named {p}"),
            Error::Arguments(m) => write!(f, "wrong arguments: {m}"),
            Error::Unsupported(m) => write!(f, "not supported: {m}"),
            Error::Busy(m) => write!(f, "the primary is busy: {m}"),
            Error::LogFailed(m) => write!(f, "the redo log failed, nothing commits: {m}"),
            Error::Parquet(m) => write!(f, "checkpoint file: {m}"),
            Error::NotLeading(m) => write!(f, "no longer sure to be the primary: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
