//! Figures the transport keeps, per node, per peer and per endpoint, for the
//! engine's metrics, `EXPLAIN ANALYZE` and the shuffle benchmark.

use crate::NodeId;
use crate::pool::PoolStats;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters of the traffic with one peer (updated by the multiplexer and endpoints).
#[derive(Debug, Default)]
pub struct PeerCounters {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_received: AtomicU64,
    pub frames_sent: AtomicU64,
    pub frames_received: AtomicU64,
    /// Nanoseconds senders on this node waited for credits from this peer.
    pub credit_wait_ns: AtomicU64,
}

impl PeerCounters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self, peer: NodeId) -> PeerStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PeerStats {
            peer,
            bytes_sent: l(&self.bytes_sent),
            bytes_received: l(&self.bytes_received),
            messages_sent: l(&self.messages_sent),
            messages_received: l(&self.messages_received),
            frames_sent: l(&self.frames_sent),
            frames_received: l(&self.frames_received),
            credit_wait: Duration::from_nanos(l(&self.credit_wait_ns)),
        }
    }
}

/// Traffic with one peer since the transport started. Bytes count whole frames
/// (headers included); messages count data frames. For the node itself, the
/// figures are its local streams, which skip the socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    pub peer: NodeId,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
    pub credit_wait: Duration,
}

/// Everything a transport measured since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransportStats {
    pub node: NodeId,
    /// Totals over remote peers (local streams excluded).
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Time senders waited for credits, all peers.
    pub credit_wait: Duration,
    /// Time senders waited for a free send buffer.
    pub acquire_wait: Duration,
    pub send_pool: PoolStats,
    pub recv_pool: PoolStats,
    /// Received data frames too large for a pool buffer (read into their own allocation).
    pub oversize_received: u64,
    /// Outgoing bytes per second while at least one connection had data to write, once
    /// enough bytes were seen to trust it (see `Multiplexer`).
    pub measured_link_rate: Option<f64>,
    /// Phased schedule: turns this node took as a sender and granted as a receiver.
    pub turns_taken: u64,
    pub turns_granted: u64,
    /// Peers disconnected for breaking the protocol or failing the handshake.
    pub protocol_errors: u64,
    /// Per peer, sorted by node id (this node's own entry holds its local streams).
    pub peers: Vec<PeerStats>,
    /// CPU time of the multiplexer thread, when the OS reports it.
    pub mux_cpu: Option<Duration>,
}

impl TransportStats {
    pub fn peer(&self, peer: NodeId) -> Option<&PeerStats> {
        self.peers.iter().find(|p| p.peer == peer)
    }
}

/// Figures of one send endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendEndpointStats {
    /// Messages put (a broadcast message counts once).
    pub messages: u64,
    /// Bytes put (a broadcast message counts once).
    pub bytes: u64,
    /// Messages that did not fit one pool buffer.
    pub oversize: u64,
    pub credit_wait: Duration,
    pub acquire_wait: Duration,
}

/// Figures of one receive endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiveEndpointStats {
    pub messages: u64,
    pub bytes: u64,
    /// Time `get` waited for a message.
    pub wait: Duration,
}
