//! The testbed's error type: every failure names its cause (the command, the file, the host).

use std::fmt;

/// Why a testbed operation failed.
#[derive(Debug)]
pub enum Error {
    /// The operation changes network namespaces, qdiscs or cgroups and needs root.
    NotRoot(String),
    /// A cluster of this name already exists (state file or namespaces present).
    AlreadyExists(String),
    /// Bad input: a rate, quota, name, subnet or size that cannot be used.
    Invalid(String),
    /// An external command (`ip`, `tc`, ...) failed.
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// A file or process operation failed.
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A process of the testbed (a gyre node, a blast endpoint) failed or did not get ready.
    Process(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotRoot(what) => write!(
                f,
                "{what} needs root (it manages network namespaces, qdiscs and cgroups); run it as root, e.g. with sudo"
            ),
            Error::AlreadyExists(msg) | Error::Invalid(msg) | Error::Process(msg) => {
                f.write_str(msg)
            }
            Error::Command {
                command,
                status,
                stderr,
            } => {
                write!(f, "`{command}` failed ({status})")?;
                if !stderr.trim().is_empty() {
                    write!(f, ": {}", stderr.trim())?;
                }
                Ok(())
            }
            Error::Io { context, source } => write!(f, "{context}: {source}"),
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

pub type Result<T> = std::result::Result<T, Error>;
