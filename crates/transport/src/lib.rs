//! Gyre's data plane: how messages move between the nodes of a cluster.
//!
//! Exchange operators never touch sockets. They open endpoints through the
//! [`Transport`] trait, the seam where another backend (RDMA, say) can be
//! swapped in:
//!
//! - a [`SendEndpoint`] (`acquire` a pooled buffer for a destination, a
//!   transmission group or all; fill it; `put` it, possibly as the last
//!   message of its streams),
//! - a [`ReceiveEndpoint`] (`get` the next message, its source and whether it
//!   is the source's last; `release` it).
//!
//! The TCP backend ([`TcpTransport`]) runs one communication multiplexer per
//! node on a thread of its own ([`mux`]), which owns every connection; see
//! [`endpoint`] for flow control and termination, [`pool`] for message
//! buffers, [`schedule`] for the free and phased network schedules and
//! [`rounds`] for planned ones,
//! [`auth`] for the handshake and [`frame`] for the wire format. A backend
//! consists of a [`hub::Hub`] (backend-neutral stream table) and something
//! that carries frames between nodes.

pub mod auth;
pub mod bench;
pub mod cpu;
pub mod design;
pub mod endpoint;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod hub;
pub(crate) mod mux;
pub mod pool;
#[cfg(feature = "verbs")]
pub mod rdma;
pub mod rounds;
pub mod schedule;
pub mod seal;
pub mod shm;
pub mod stats;
pub mod tcp;
#[cfg(test)]
mod tcp_tests;
pub mod verbs;

pub use endpoint::{
    ReceiveEndpoint, ReceiveSpec, Received, SendBuffer, SendEndpoint, SendSpec, To,
};
pub use frame::{FrameError, StreamKey};
pub use pool::{Message, PoolStats};
pub use schedule::Schedule;
pub use stats::{PeerStats, ReceiveEndpointStats, SendEndpointStats, TransportStats};
pub use tcp::{DEFAULT_MESSAGE_SIZE, TcpTransport, TransportConfig, loopback_cluster};

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
    /// The connection to a peer failed, was closed, or the peer broke the protocol.
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
    /// A message larger than a frame may carry.
    TooLarge { bytes: usize, max: usize },
    /// An endpoint was used against its contract (a bug in the caller).
    Misuse(String),
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
            Self::TooLarge { bytes, max } => {
                write!(f, "a message of {bytes} bytes exceeds the maximum of {max}")
            }
            Self::Misuse(m) => write!(f, "transport misuse: {m}"),
        }
    }
}

impl std::error::Error for TransportError {}

/// Opens `exchange` of `query` from `nodes[index]` to every other of `nodes` and back
/// (all-to-all exchanges of small messages: histograms, markers). Each node's sender
/// and source slot is its position in `nodes`.
pub fn open_to_others(
    t: &dyn Transport,
    query: u64,
    exchange: u32,
    nodes: &[NodeId],
    index: usize,
) -> Result<(SendEndpoint, ReceiveEndpoint), TransportError> {
    let others: Vec<usize> = (0..nodes.len()).filter(|&i| i != index).collect();
    let send = t.open_send(SendSpec {
        query,
        exchange,
        from: index as u32,
        destinations: others.iter().map(|&i| nodes[i]).collect(),
        groups: vec![],
    })?;
    let recv = t.open_receive(ReceiveSpec {
        query,
        exchange,
        sources: others.iter().map(|&i| (i as u32, nodes[i])).collect(),
    })?;
    Ok((send, recv))
}

/// The seam between exchange operators and the network.
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// This node's id.
    fn node_id(&self) -> NodeId;

    /// Opens the sending side of an exchange.
    fn open_send(&self, spec: SendSpec) -> Result<SendEndpoint, TransportError>;

    /// Opens the receiving side of an exchange.
    fn open_receive(&self, spec: ReceiveSpec) -> Result<ReceiveEndpoint, TransportError>;

    /// Drops every buffered message and open stream of `query`; late frames are discarded.
    fn release_query(&self, query: u64);

    /// Whether the connection to `peer` was lost (a lost peer never comes back under the same id).
    fn is_lost(&self, peer: NodeId) -> bool;

    /// Size of a message buffer; senders should keep messages within it.
    fn message_size(&self) -> usize;

    /// Outgoing link rate in bytes per second: measured, else the configured hint.
    fn link_rate(&self) -> Option<f64>;

    /// The network schedule in force.
    fn schedule(&self) -> Schedule;

    /// Changes the network schedule (all nodes of a cluster should use the same one).
    fn set_schedule(&self, schedule: Schedule);

    /// Everything the transport measured.
    fn stats(&self) -> TransportStats;
}
