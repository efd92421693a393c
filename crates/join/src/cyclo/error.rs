//! Why a cyclo-join refused to run or stopped: every variant names its cause.

use std::fmt;

use gyre_transport::TransportError;

use crate::error::JoinError;

/// The error of the ring, the cyclo-join and its benchmark driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CycloError {
    /// The ring, the configuration or the inputs are inconsistent.
    Spec(String),
    /// The nodes of the ring disagree about the join (different specs).
    Disagreement(String),
    /// The transport failed (a peer was lost, a sender failed, ...).
    Transport(TransportError),
    /// A local join kernel refused its input.
    Join(JoinError),
    /// A fragment arrived malformed, out of order, or where it should not be.
    Protocol(String),
    /// The result sink refused a result.
    Sink(String),
    /// A thread of the ring stopped unexpectedly (a panic).
    Internal(String),
}

impl fmt::Display for CycloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CycloError::Spec(m) => write!(f, "bad cyclo-join spec: {m}"),
            CycloError::Disagreement(m) => write!(f, "ring members disagree: {m}"),
            CycloError::Transport(e) => write!(f, "cyclo-join transport: {e}"),
            CycloError::Join(e) => write!(f, "cyclo-join local join: {e}"),
            CycloError::Protocol(m) => write!(f, "data roundabout protocol: {m}"),
            CycloError::Sink(m) => write!(f, "cyclo-join result sink: {m}"),
            CycloError::Internal(m) => write!(f, "cyclo-join internal error: {m}"),
        }
    }
}

impl std::error::Error for CycloError {}

impl From<TransportError> for CycloError {
    fn from(e: TransportError) -> Self {
        CycloError::Transport(e)
    }
}

impl From<JoinError> for CycloError {
    fn from(e: JoinError) -> Self {
        CycloError::Join(e)
    }
}

pub type Result<T> = std::result::Result<T, CycloError>;
