//! The one error type of the join kernels: every refusal names its cause.

use std::fmt;

use arrow_schema::DataType;

/// Why a join kernel refused its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// The key column's type is not an integer type the kernels understand.
    UnsupportedKeyType(DataType),
    /// Row indices are emitted as `u32` (what Arrow's `take` wants); a larger input
    /// must be split into fragments by the caller.
    TooManyRows { rows: usize, max: usize },
    /// One side is signed and the other unsigned: comparing raw bits would give
    /// wrong answers, so the caller must cast one side first (as SQL type coercion does).
    DomainMismatch {
        left: crate::KeyDomain,
        right: crate::KeyDomain,
    },
    /// A probe fragment was partitioned with a different radix layout than the
    /// prepared build side it is joined with.
    LayoutMismatch,
    /// A configuration value outside its valid range.
    InvalidConfig(String),
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::UnsupportedKeyType(t) => {
                write!(f, "join key type {t} is not supported (integer types only)")
            }
            JoinError::TooManyRows { rows, max } => write!(
                f,
                "join input has {rows} rows, more than the {max} a fragment may hold (u32 row indices)"
            ),
            JoinError::DomainMismatch { left, right } => write!(
                f,
                "join keys mix {left:?} and {right:?} integers; cast one side first"
            ),
            JoinError::LayoutMismatch => write!(
                f,
                "probe fragment was partitioned with a different radix layout than the build side"
            ),
            JoinError::InvalidConfig(msg) => write!(f, "invalid join configuration: {msg}"),
        }
    }
}

impl std::error::Error for JoinError {}

/// Result alias for the kernels.
pub type Result<T> = std::result::Result<T, JoinError>;
