//! The endpoint abstraction of the RDMA-aware shuffle paper, over any backend.
//!
//! A [`SendEndpoint`] is one producer's side of an exchange: streams from one
//! sender slot to a set of destination nodes. [`SendEndpoint::acquire`]
//! returns a free pool buffer reserved for a destination, a transmission
//! group or all destinations; the caller fills it (Arrow IPC) and
//! [`SendEndpoint::put`]s it, possibly as its streams' last message. One
//! buffer put to several destinations is one reference-counted message: it is
//! encoded once and written to each peer without copies.
//!
//! A [`ReceiveEndpoint`] is one consumer's side: the streams from a set of
//! expected (sender slot, node) sources to this node. [`ReceiveEndpoint::get`]
//! returns the next message from any source, with its source and whether it
//! is that source's last; `None` once every source's last message arrived
//! (exact termination). [`ReceiveEndpoint::release`] gives the buffer back
//! and returns the credit to its sender.
//!
//! Flow control is credit-based per stream: a sender may have at most the
//! receiving node's window of messages (announced in the handshake) sent and
//! not yet released, so the receiving node buffers at most `window` messages
//! per stream whatever the consumer's speed. Unlike the paper, `acquire` takes
//! the credits before the buffer and `put` never waits: the pool is shared by
//! every exchange of the node, and a buffer held while waiting for a slow
//! consumer could starve the producer that consumer is waiting for (a hash
//! join reads its build side to the end before its probe side). So a pool
//! buffer is never held across a wait on a consumer.
//!
//! Errors travel with the data: [`SendEndpoint::fail`] (or dropping an
//! unfinished endpoint) fails the sender's streams at their receivers; a lost
//! peer fails every endpoint that involves it, naming it.
//!
//! Two backends implement them: the hub of the TCP transport ([`hub`]:
//! credits per stream, frames through the multiplexer) and the verbs designs
//! of [`crate::design`] ([`over_design`]: the paper's credits and registered
//! buffers, messages larger than a buffer cut into several and joined again).

pub(crate) mod hub;
pub(crate) mod over_design;

use crate::stats::{ReceiveEndpointStats, SendEndpointStats};
use crate::{NodeId, TransportError};
pub(crate) use hub::{HubBuffer, HubReceive, HubReceived, HubSend};
pub use over_design::Traffic;
pub(crate) use over_design::{
    DesignEndpointBuffer, DesignReceived, DesignReceiving, DesignSending,
};

/// What a send endpoint connects: stream keys `(query, exchange, from, d)` for each
/// destination `d`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSpec {
    pub query: u64,
    pub exchange: u32,
    /// The producing slot (partition).
    pub from: u32,
    pub destinations: Vec<NodeId>,
    /// Transmission groups (multicast): sets of destinations, addressed by index.
    pub groups: Vec<Vec<NodeId>>,
}

/// What a receive endpoint reads: stream keys `(query, exchange, slot, this node)`
/// with the node expected to send each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveSpec {
    pub query: u64,
    pub exchange: u32,
    /// (sender slot, sender node) of every expected source.
    pub sources: Vec<(u32, NodeId)>,
}

/// The destinations of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum To {
    Node(NodeId),
    /// Transmission group `i` of the endpoint's spec.
    Group(usize),
    All,
}

pub(crate) fn misuse(msg: impl Into<String>) -> TransportError {
    TransportError::Misuse(msg.into())
}

/// A send spec's destinations, and its transmission groups as positions among
/// them: resolved alike by every kind of send endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Destinations {
    nodes: Vec<NodeId>,
    groups: Vec<Vec<usize>>,
}

impl Destinations {
    pub(crate) fn new(spec: &SendSpec) -> Result<Self, TransportError> {
        if spec.destinations.is_empty() {
            return Err(misuse("a send endpoint needs at least one destination"));
        }
        let nodes = spec.destinations.clone();
        let mut distinct = nodes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != nodes.len() {
            return Err(misuse("a send endpoint lists a destination twice"));
        }
        let index = |n: &NodeId| {
            nodes.iter().position(|d| d == n).ok_or_else(|| {
                misuse(format!(
                    "transmission group member {n} is not a destination"
                ))
            })
        };
        let groups = spec
            .groups
            .iter()
            .map(|g| g.iter().map(index).collect::<Result<Vec<_>, _>>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { nodes, groups })
    }

    pub(crate) fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// Positions of the destinations `to` names.
    pub(crate) fn targets(&self, to: To) -> Result<Vec<usize>, TransportError> {
        match to {
            To::Node(n) => self
                .nodes
                .iter()
                .position(|d| *d == n)
                .map(|i| vec![i])
                .ok_or_else(|| misuse(format!("node {n} is not a destination of this endpoint"))),
            To::Group(g) => self
                .groups
                .get(g)
                .cloned()
                .ok_or_else(|| misuse(format!("no transmission group {g}"))),
            To::All => Ok((0..self.nodes.len()).collect()),
        }
    }
}

/// A buffer reserved for a set of destinations (their credits are taken). Fill it
/// with `std::io::Write` or [`SendBuffer::extend_from_slice`]; put it, or drop it to
/// give everything back.
#[derive(Debug)]
pub struct SendBuffer(pub(crate) BufferOf);

#[derive(Debug)]
pub(crate) enum BufferOf {
    Hub(HubBuffer),
    Design(DesignEndpointBuffer),
}

impl SendBuffer {
    pub fn len(&self) -> usize {
        match &self.0 {
            BufferOf::Hub(b) => b.len(),
            BufferOf::Design(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes that fit in one message (more makes an oversize message).
    pub fn capacity(&self) -> usize {
        match &self.0 {
            BufferOf::Hub(b) => b.capacity(),
            BufferOf::Design(b) => b.capacity(),
        }
    }

    /// A copy of the bytes written so far.
    pub fn to_vec(&self) -> Vec<u8> {
        match &self.0 {
            BufferOf::Hub(b) => b.as_slice().to_vec(),
            BufferOf::Design(b) => b.to_vec(),
        }
    }

    /// A hub buffer's bytes (tests check where they are).
    #[cfg(test)]
    pub(crate) fn hub_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            BufferOf::Hub(b) => Some(b.as_slice()),
            BufferOf::Design(_) => None,
        }
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        match &mut self.0 {
            BufferOf::Hub(b) => b.vec_mut().extend_from_slice(bytes),
            BufferOf::Design(b) => b.extend_from_slice(bytes),
        }
    }
}

impl std::io::Write for SendBuffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The producing side of an exchange (see the module doc).
#[derive(Debug)]
pub struct SendEndpoint(SendOf);

#[derive(Debug)]
enum SendOf {
    Hub(HubSend),
    Design(DesignSending),
}

impl From<HubSend> for SendEndpoint {
    fn from(e: HubSend) -> Self {
        Self(SendOf::Hub(e))
    }
}

impl From<DesignSending> for SendEndpoint {
    fn from(e: DesignSending) -> Self {
        Self(SendOf::Design(e))
    }
}

impl SendEndpoint {
    pub fn destinations(&self) -> &[NodeId] {
        match &self.0 {
            SendOf::Hub(e) => e.destinations(),
            SendOf::Design(e) => e.destinations(),
        }
    }

    /// Bytes a message should stay within.
    pub fn message_size(&self) -> usize {
        match &self.0 {
            SendOf::Hub(e) => e.message_size(),
            SendOf::Design(e) => e.message_size(),
        }
    }

    /// Reserves a credit on every stream `to` names (waiting for their receivers to
    /// have room) and then a free buffer (waiting while every buffer is in use).
    pub async fn acquire(&self, to: To) -> Result<SendBuffer, TransportError> {
        Ok(SendBuffer(match &self.0 {
            SendOf::Hub(e) => BufferOf::Hub(e.acquire(to).await?),
            SendOf::Design(e) => BufferOf::Design(e.acquire(to).await?),
        }))
    }

    /// Sends a filled buffer to the destinations it was acquired for; never waits.
    /// With `last`, it is the final message of those streams (an empty last message
    /// is the same as [`SendEndpoint::finish`] for those streams).
    pub fn put(&self, buf: SendBuffer, last: bool) -> Result<(), TransportError> {
        match (&self.0, buf.0) {
            (SendOf::Hub(e), BufferOf::Hub(b)) => e.put(b, last),
            (SendOf::Design(e), BufferOf::Design(b)) => e.put(b, last),
            _ => Err(misuse("a buffer put to an endpoint of another transport")),
        }
    }

    /// Ends every stream that has not sent its last message yet (a bare
    /// end-of-stream marker, which needs no credit).
    pub fn finish(&self) {
        match &self.0 {
            SendOf::Hub(e) => e.finish(),
            SendOf::Design(e) => e.finish(),
        }
    }

    /// Fails every unfinished stream: its receivers get `message` as an error.
    pub fn fail(&self, message: &str) {
        match &self.0 {
            SendOf::Hub(e) => e.fail(message),
            SendOf::Design(e) => e.fail(message),
        }
    }

    /// Waits until every message, end-of-stream marker and error sent so far was
    /// carried to its peers (or, locally, queued for its consumer).
    pub async fn flushed(&self) {
        match &self.0 {
            SendOf::Hub(e) => e.flushed().await,
            SendOf::Design(e) => e.flushed().await,
        }
    }

    pub fn stats(&self) -> SendEndpointStats {
        match &self.0 {
            SendOf::Hub(e) => e.stats(),
            SendOf::Design(e) => e.stats(),
        }
    }
}

/// One message taken from a receive endpoint; dropping it releases it.
#[derive(Debug)]
pub struct Received {
    /// Index of the source in the endpoint's spec.
    pub source: usize,
    /// The sender slot and node.
    pub slot: u32,
    pub node: NodeId,
    /// Whether this is the source's last message.
    pub last: bool,
    of: ReceivedOf,
}

#[derive(Debug)]
enum ReceivedOf {
    Hub(HubReceived),
    Design(DesignReceived),
}

impl Received {
    /// The message; empty for a bare end-of-stream marker.
    pub fn data(&self) -> &[u8] {
        match &self.of {
            ReceivedOf::Hub(r) => r.data(),
            ReceivedOf::Design(r) => r.data(),
        }
    }

    /// The message as `Bytes`. What is decoded from it may outlive the release: a
    /// hub's buffer is then detached from its pool (see [`crate::pool`]), a
    /// registered buffer's bytes are copied.
    pub fn bytes(&self) -> bytes::Bytes {
        match &self.of {
            ReceivedOf::Hub(r) => r.bytes(),
            ReceivedOf::Design(r) => r.bytes(),
        }
    }
}

/// The consuming side of an exchange (see the module doc).
#[derive(Debug)]
pub struct ReceiveEndpoint(ReceiveOf);

#[derive(Debug)]
enum ReceiveOf {
    Hub(HubReceive),
    Design(DesignReceiving),
}

impl From<HubReceive> for ReceiveEndpoint {
    fn from(e: HubReceive) -> Self {
        Self(ReceiveOf::Hub(e))
    }
}

impl From<DesignReceiving> for ReceiveEndpoint {
    fn from(e: DesignReceiving) -> Self {
        Self(ReceiveOf::Design(e))
    }
}

impl ReceiveEndpoint {
    /// Bytes of the messages that arrived and were not taken yet, in memory the
    /// node allocates for them (a design's registered buffers are allocated
    /// when the endpoint opens, and count as none).
    pub fn queued_bytes(&self) -> usize {
        match &self.0 {
            ReceiveOf::Hub(e) => e.queued_bytes(),
            ReceiveOf::Design(e) => e.queued_bytes(),
        }
    }

    /// Sources whose last message has not arrived yet.
    pub fn remaining(&self) -> usize {
        match &self.0 {
            ReceiveOf::Hub(e) => e.remaining(),
            ReceiveOf::Design(e) => e.remaining(),
        }
    }

    /// The next message from any source (in order per source); `None` once every
    /// source sent its last message; the error that ended a source otherwise.
    pub async fn get(&self) -> Result<Option<Received>, TransportError> {
        Ok(match &self.0 {
            ReceiveOf::Hub(e) => e.get().await?.map(|r| Received {
                source: r.source,
                slot: r.slot,
                node: r.node,
                last: r.last,
                of: ReceivedOf::Hub(r),
            }),
            ReceiveOf::Design(e) => e.get().await?.map(|r| Received {
                source: r.source,
                slot: r.slot,
                node: r.node,
                last: r.last,
                of: ReceivedOf::Design(r),
            }),
        })
    }

    /// Gives a message's buffer back and its credit to its sender (dropping a
    /// [`Received`] does the same).
    pub fn release(&self, r: Received) {
        drop(r);
    }

    pub fn stats(&self) -> ReceiveEndpointStats {
        match &self.0 {
            ReceiveOf::Hub(e) => e.stats(),
            ReceiveOf::Design(e) => e.stats(),
        }
    }
}
