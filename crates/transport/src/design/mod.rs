//! The RDMA-aware shuffle paper's endpoint designs over the [`crate::verbs`]
//! carrier seam (its section 5, Table 1). A design is named
//! `{SE|ME}{SQ|MQ}/{SR|RD|WR}`: one endpoint shared by a node's threads or one
//! per thread; one datagram queue pair per endpoint or one reliable queue pair
//! per peer; two-sided send/receive, one-sided read or one-sided write.
//!
//! The four primitives ([`Primitive`]) share one sending and one receiving
//! endpoint ([`send`], [`receive`]) and everything but how a message moves:
//!
//! - Credits are the paper's stateless ones (Algorithm 3): the receiver writes
//!   into the sender's slot the *absolute* number of buffers it handed out so
//!   far, after every `credit_every` released buffers, so a lost or repeated
//!   update does no harm. The write carries the count as its immediate too,
//!   which wakes a waiting sender through its completion queue instead of
//!   having it spin on the slot (the paper busy-polls; two cores cannot spare
//!   one per endpoint). A sender takes a credit with a compare-and-swap of its
//!   `sent` counter against the slot (the paper's `attemptToGetCredit`), so one
//!   endpoint may be shared by several threads (SE) or used by one (ME): the
//!   designs differ in how many endpoints an operator opens, not here.
//! - Send/receive (SR) over reliable connections: a queue pair per stream,
//!   delivering in order into the receiver's posted buffers.
//! - Send/receive over datagrams (SQ/SR): one datagram queue pair per endpoint,
//!   whose receives are one pool; messages of at most 4 KiB that may arrive out
//!   of order, so a stream ends when its last message (whose sequence number
//!   gives the count) and all before it arrived (the paper's message counting),
//!   and fails when they do not within the timeout. Credits still travel over a
//!   reliable queue pair per stream (the paper's code uses unreliable ones).
//! - RDMA Write (WR, "poll completion queue"): the receiver's credit write also
//!   carries its free queue, the buffers it released in order, in the same
//!   write just before the count (a write lands its last bytes last), so a
//!   credit names the buffer to write into: one notification per
//!   `credit_every` messages where the paper sends a free-queue entry per
//!   message besides. The data goes as a write with immediate (buffer, 16 bits
//!   of sequence) into a buffer-less receive.
//! - RDMA Read (RD, Algorithm 4): no credit writes; the sender announces a filled
//!   buffer in the receiver's valid queue (a write with the sequence as
//!   immediate), the receiver reads it into a buffer of its own and returns it
//!   at once with a zero-length write whose immediate names it (the free queue
//!   is the sender's completion queue), and a sender keeps at most a window
//!   of buffers in flight per destination, counted back from those notices. A
//!   broadcast buffer is reusable when every destination has read it, the
//!   paper's weakness of RD for broadcast.
//!
//! As in Gyre's TCP endpoints, [`DesignSend::acquire`] takes the credits before
//! the buffer and [`DesignSend::put`] never waits: a registered buffer is never
//! held while waiting for a slow consumer. Every message starts with a 16-byte
//! header (flags, payload length, sender slot); each stream's receiver keeps a
//! buffer in reserve for its end-of-stream or error marker, which needs no
//! credit (Read reads markers like data). On connections a stream's messages
//! must come in sequence, so the last flag ends it exactly; a receiving
//! endpoint checks messages one consumer at a time, in the order they
//! completed. Both sides' settings must agree (the offers carry them).
//!
//! Endpoints find each other through a [`Connector`]: each side of a stream
//! offers what its peer needs (its queue pair, where to write credits) under
//! the stream's key and receives the other side's offer, as RDMA's connection
//! managers exchange queue-pair numbers out of band. [`handshake`] adds their
//! third step (ready to use): neither side sends before both have connected,
//! since a reliable queue pair refuses requests from one it is not connected to.

mod message;
mod pool;
pub mod receive;
mod rendezvous;
pub mod send;
pub mod transport;

pub use message::{DesignConfig, HEADER, Primitive};
pub use pool::BufferPool;
pub use receive::{DesignReceive, Received};
pub use rendezvous::DirConnector;
pub use send::{DesignBuffer, DesignSend};
pub use transport::DesignTransport;

use crate::frame::StreamKey;
use crate::verbs::{QpAddr, RemoteRegion};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// What an endpoint holds of its carrier: the paper's cost of more endpoints
/// (ME) and deeper windows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub queue_pairs: u64,
    pub registered_bytes: u64,
}

impl std::ops::Add for Footprint {
    type Output = Footprint;
    fn add(self, o: Footprint) -> Footprint {
        Footprint {
            queue_pairs: self.queue_pairs + o.queue_pairs,
            registered_bytes: self.registered_bytes + o.registered_bytes,
        }
    }
}

/// The paper's eight designs and Gyre's TCP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Design {
    Tcp,
    MemqSr,
    SemqSr,
    MesqSr,
    SesqSr,
    MemqRd,
    SemqRd,
    MemqWr,
    SemqWr,
}

impl Design {
    pub const ALL: [Design; 9] = [
        Design::Tcp,
        Design::MemqSr,
        Design::SemqSr,
        Design::MesqSr,
        Design::SesqSr,
        Design::MemqRd,
        Design::SemqRd,
        Design::MemqWr,
        Design::SemqWr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Design::Tcp => "tcp",
            Design::MemqSr => "memq-sr",
            Design::SemqSr => "semq-sr",
            Design::MesqSr => "mesq-sr",
            Design::SesqSr => "sesq-sr",
            Design::MemqRd => "memq-rd",
            Design::SemqRd => "semq-rd",
            Design::MemqWr => "memq-wr",
            Design::SemqWr => "semq-wr",
        }
    }

    /// One endpoint per thread (ME) rather than one per node (SE).
    pub fn per_thread(self) -> bool {
        matches!(
            self,
            Design::MemqSr | Design::MesqSr | Design::MemqRd | Design::MemqWr
        )
    }

    /// How the design moves messages over a verbs carrier (`None`: TCP).
    pub fn primitive(self) -> Option<Primitive> {
        match self {
            Design::Tcp => None,
            Design::MemqSr | Design::SemqSr => Some(Primitive::Send),
            Design::MesqSr | Design::SesqSr => Some(Primitive::Datagram),
            Design::MemqRd | Design::SemqRd => Some(Primitive::Read),
            Design::MemqWr | Design::SemqWr => Some(Primitive::Write),
        }
    }
}

impl std::fmt::Display for Design {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Design {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase().replace('/', "-");
        Design::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Design::ALL.iter().map(|d| d.name()).collect();
                format!(
                    "unknown shuffle design '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// What one side of a stream offers the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// The side's queue pair for this stream.
    pub qp: QpAddr,
    /// Where the peer writes for this side: the sender's credit slot, or the
    /// receiver's buffers (one-sided designs).
    pub region: Option<RemoteRegion>,
    /// Offset of the slot in `region`.
    pub offset: u64,
    /// The side's datagram queue pair, where the stream's data goes over one
    /// (designs with a single queue pair per endpoint).
    pub datagrams: Option<QpAddr>,
    /// The side's settings that the other side's layout depends on
    /// ([`DesignConfig::terms`]): both sides must agree.
    pub terms: u64,
}

/// Which side of a stream offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Sender,
    Receiver,
}

impl Side {
    /// The side across the stream.
    pub fn other(self) -> Side {
        match self {
            Side::Sender => Side::Receiver,
            Side::Receiver => Side::Sender,
        }
    }
}

/// The steps of a stream's handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Queue pairs and regions are exchanged.
    Offer,
    /// The side has connected its queue pair to the peer's.
    Ready,
}

/// Brings the two sides of a stream together.
#[async_trait::async_trait]
pub trait Connector: Send + Sync {
    /// Offers `offer` as `side` of stream `key` in `phase` and waits (at most
    /// `timeout`) for the other side's offer in the same phase.
    async fn meet(
        &self,
        key: StreamKey,
        side: Side,
        phase: Phase,
        offer: Offer,
        timeout: Duration,
    ) -> Result<Offer, String>;

    /// `query` is over: its sides still waiting give up at once, and (for a
    /// while) so do those that come later.
    fn release(&self, _query: u64) {}
}

/// Connects one side of stream `key`: exchanges offers, lets `connect` bring
/// this side's queue pair up against the peer's offer, then waits until the
/// peer has done the same. Returns the peer's offer.
pub async fn handshake(
    connector: &dyn Connector,
    key: StreamKey,
    side: Side,
    peer: crate::NodeId,
    offer: Offer,
    timeout: Duration,
    connect: impl FnOnce(&Offer) -> Result<(), crate::TransportError>,
) -> Result<Offer, crate::TransportError> {
    let unreachable = |reason| crate::TransportError::Unreachable { peer, reason };
    let theirs = connector
        .meet(key, side, Phase::Offer, offer, timeout)
        .await
        .map_err(unreachable)?;
    if theirs.qp.node != peer {
        return Err(crate::TransportError::PeerLost {
            peer,
            reason: format!("stream {key} answered by {}", theirs.qp),
        });
    }
    if theirs.terms != offer.terms {
        return Err(crate::TransportError::PeerLost {
            peer,
            reason: format!(
                "stream {key}: its endpoint's settings (primitive, message size, window, \
                 buffers) differ from this one's"
            ),
        });
    }
    connect(&theirs)?;
    connector
        .meet(key, side, Phase::Ready, offer, timeout)
        .await
        .map_err(unreachable)?;
    Ok(theirs)
}

/// An offer waiting for its peer, and where to hand the peer's offer.
type Waiting = (Offer, oneshot::Sender<Offer>);

/// How long a released query's late sides are turned away.
const RELEASED_FOR: Duration = Duration::from_secs(60);

/// A connector for endpoints of one process (tests, embedded clusters, benchmarks).
#[derive(Default)]
pub struct LocalConnector {
    waiting: Mutex<HashMap<(StreamKey, Side, Phase), Waiting>>,
    /// Queries released lately, and when.
    released: Mutex<HashMap<u64, std::time::Instant>>,
}

impl LocalConnector {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

#[async_trait::async_trait]
impl Connector for LocalConnector {
    async fn meet(
        &self,
        key: StreamKey,
        side: Side,
        phase: Phase,
        offer: Offer,
        timeout: Duration,
    ) -> Result<Offer, String> {
        let other = side.other();
        if self.released.lock().contains_key(&key.query) {
            return Err(format!("stream {key}: its query is over"));
        }
        let rx = {
            let mut w = self.waiting.lock();
            if let Some((theirs, tx)) = w.remove(&(key, other, phase)) {
                let _ = tx.send(offer);
                return Ok(theirs);
            }
            if w.contains_key(&(key, side, phase)) {
                return Err(format!("stream {key} was offered twice by its {side:?}"));
            }
            let (tx, rx) = oneshot::channel();
            w.insert((key, side, phase), (offer, tx));
            rx
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(theirs)) => Ok(theirs),
            Ok(Err(_)) => Err(format!("stream {key}: its query is over")),
            Err(_) => {
                self.waiting.lock().remove(&(key, side, phase));
                Err(format!(
                    "the other side of stream {key} did not reach {phase:?} within {timeout:?}"
                ))
            }
        }
    }

    fn release(&self, query: u64) {
        {
            let mut released = self.released.lock();
            released.retain(|_, at| at.elapsed() < RELEASED_FOR);
            released.insert(query, std::time::Instant::now());
        }
        // Dropping a waiting side's sender tells it the query is over.
        self.waiting
            .lock()
            .retain(|(key, _, _), _| key.query != query);
    }
}

#[cfg(test)]
mod tests;
