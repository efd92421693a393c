//! Gyre's data plane: how streams of Arrow IPC messages move between nodes.
//!
//! Exchange operators never touch sockets. They ask a [`Transport`] for a
//! [`StreamSender`] or [`StreamReceiver`] identified by a [`StreamKey`] and the
//! peer node, and move opaque byte messages through them. The transport owns
//! the connections, flow control (credits) and failure detection, so a
//! different backend (a multiplexer, RDMA-style endpoints) can be swapped in
//! without changing the operators.

pub mod frame;
pub mod stream;
pub mod tcp;

pub use frame::{FrameError, StreamKey};
pub use stream::{StreamReceiver, StreamSender};
pub use tcp::{TcpTransport, TransportConfig};

use std::fmt;

/// Identifies a node of the cluster: 0 is the coordinator, workers count from 1.
pub type NodeId = u32;

/// The node id of the coordinator.
pub const COORDINATOR: NodeId = 0;

/// Human-readable name of a node, used in every error message.
pub fn node_name(id: NodeId) -> String {
    if id == COORDINATOR {
        "coordinator".to_string()
    } else {
        format!("worker {id}")
    }
}

/// Errors of the data plane. Every variant names the peer or stream involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The connection to a peer failed or was closed.
    PeerLost { peer: NodeId, reason: String },
    /// No connection to the peer could be made in time.
    Unreachable { peer: NodeId, reason: String },
    /// The peer is not part of the cluster this node knows.
    UnknownPeer(NodeId),
    /// The remote sender of a stream reported an error.
    Remote { peer: NodeId, message: String },
    /// The stream was already opened on this node.
    AlreadyOpen(StreamKey),
    /// The query was released while the stream was in use.
    Cancelled(StreamKey),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PeerLost { peer, reason } => {
                write!(f, "connection to {} lost: {reason}", node_name(*peer))
            }
            Self::Unreachable { peer, reason } => {
                write!(f, "cannot reach {}: {reason}", node_name(*peer))
            }
            Self::UnknownPeer(p) => write!(f, "unknown peer node {p}"),
            Self::Remote { peer, message } => write!(f, "{}: {message}", node_name(*peer)),
            Self::AlreadyOpen(k) => write!(f, "stream {k} is already open"),
            Self::Cancelled(k) => write!(f, "stream {k} was cancelled"),
        }
    }
}

impl std::error::Error for TransportError {}

/// Totals a transport has moved since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
}

/// The seam between exchange operators and the network.
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// This node's id.
    fn node_id(&self) -> NodeId;

    /// Opens the sending side of stream `key` towards node `dest`.
    fn sender(&self, key: StreamKey, dest: NodeId) -> Result<StreamSender, TransportError>;

    /// Opens the receiving side of stream `key` whose sender is node `src`.
    fn receiver(&self, key: StreamKey, src: NodeId) -> Result<StreamReceiver, TransportError>;

    /// Drops every buffered message and open stream of `query`; late frames are discarded.
    fn release_query(&self, query: u64);

    /// Whether the connection to `peer` was lost (a lost peer never comes back under the same id).
    fn is_lost(&self, peer: NodeId) -> bool;

    /// Byte and frame counters.
    fn stats(&self) -> TransportStats;
}
