//! The carrier seam: a verbs-style interface below the endpoints, after the
//! RDMA primitives the RDMA-aware shuffle paper builds on (its section 2).
//!
//! A [`Carrier`] offers what an RDMA NIC offers: memory registered for
//! remote access ([`Region`]), queue pairs ([`QueuePair`], reliable connected
//! or unreliable datagram) and completion queues ([`CompletionQueue`]). Work is
//! posted asynchronously; its end shows up as a [`Completion`]:
//!
//! - two-sided send and receive: the receiver posts receive requests naming
//!   free buffers, and each arriving send consumes one (on a reliable
//!   connection a send with no posted receive fails the queue pair, on a
//!   datagram queue pair it is dropped);
//! - one-sided read and write into a peer's registered region, addressed by
//!   the region's key and an offset, the peer's CPU not involved; a write
//!   with immediate also consumes one of the target's posted receives and
//!   leaves a completion carrying the 32-bit immediate there.
//!
//! A reliable connection delivers in order, once, up to [`Carrier::max_message`]
//! bytes per request; a datagram queue pair talks to any other datagram queue
//! pair, carries at most 4 KiB per send and may drop. Addresses of queue pairs
//! and regions are exchanged out of band (as RDMA's connection managers do).
//!
//! Every carrier wakes waiters the same way: a completion queue's
//! [`CompletionQueue::events`] is notified after completions were added, so
//! endpoints wait without polling a core away (the paper's event-based mode,
//! its section 7.3.3).

use crate::NodeId;
use std::fmt;
use std::sync::Arc;
use tokio::sync::Notify;

/// A queue pair's number on its node.
pub type QpNum = u32;

/// Where a queue pair lives: what a peer needs to connect to it or send it a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpAddr {
    pub node: NodeId,
    pub qpn: QpNum,
}

impl fmt::Display for QpAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} queue pair {}", crate::node_name(self.node), self.qpn)
    }
}

/// The transport service of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpKind {
    /// Reliable connection: one peer queue pair, in order, once, reads and writes.
    Rc,
    /// Unreliable datagram: any peer, sends of at most [`UD_MTU`] bytes, may drop.
    Ud,
}

/// Largest datagram a UD queue pair carries (the paper's InfiniBand MTU).
pub const UD_MTU: usize = 4096;

/// A peer's registered region, as the peer advertised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    pub node: NodeId,
    pub key: u32,
    pub len: u64,
}

/// Bytes of a local registered region: the region's key, an offset and a length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub key: u32,
    pub offset: usize,
    pub len: usize,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided: consumes a receive posted at the peer.
    Send { imm: Option<u32> },
    /// One-sided: `local` lands at `offset` of `remote`. With an immediate it also
    /// consumes a posted receive at the peer and completes there.
    Write {
        remote: RemoteRegion,
        offset: u64,
        imm: Option<u32>,
    },
    /// One-sided: `local` is filled from `offset` of `remote`.
    Read { remote: RemoteRegion, offset: u64 },
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Comes back in the completion.
    pub id: u64,
    pub op: SendOp,
    pub local: Sge,
    /// The datagram's destination (UD only).
    pub dest: Option<QpAddr>,
    /// Whether a completion is wanted on success (errors always complete).
    pub signaled: bool,
}

/// A receive-queue work request: a buffer for the next send, or none for a
/// write with immediate (whose data lands where the writer says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    pub id: u64,
    pub local: Option<Sge>,
}

/// What a completed work request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOp {
    Send,
    Write,
    Read,
    /// A send arrived in a posted receive buffer.
    Recv,
    /// A write with immediate arrived (its data is in the writer's target region).
    RecvWriteImm,
}

/// How a work request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// A send found no posted receive at a reliable peer (the queue pair is now in error).
    ReceiverNotReady,
    /// The data did not fit the receive buffer.
    LocalLength,
    /// A key, offset or length outside the peer's registered region.
    RemoteAccess,
    /// The peer queue pair does not exist, is not connected to this one, or its node is gone.
    RemoteInvalid,
    /// The queue pair was in error before the request ran.
    Flushed,
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub id: u64,
    pub status: WcStatus,
    pub op: WcOp,
    /// Bytes moved (for receives: bytes that arrived).
    pub bytes: u32,
    pub imm: Option<u32>,
    /// For receives: the queue pair that sent.
    pub src: Option<QpAddr>,
}

/// Errors of posting and setting up (the completion's status reports the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarrierError {
    /// A queue, table or memory arena is full.
    Exhausted(String),
    /// A request against the rules (wrong kind, bad local key, too long...).
    Invalid(String),
    /// The peer node cannot be reached or does not speak this carrier.
    Peer { node: NodeId, reason: String },
    /// The operating system refused (mapping, files).
    System(String),
}

impl fmt::Display for CarrierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exhausted(m) => write!(f, "carrier resources exhausted: {m}"),
            Self::Invalid(m) => write!(f, "invalid carrier request: {m}"),
            Self::Peer { node, reason } => {
                write!(
                    f,
                    "carrier cannot reach {}: {reason}",
                    crate::node_name(*node)
                )
            }
            Self::System(m) => write!(f, "carrier system error: {m}"),
        }
    }
}

impl std::error::Error for CarrierError {}

/// A local region registered for remote access. Its bytes may be written by peers
/// at any time the protocol allows, so access is through raw slices whose
/// exclusivity the caller's protocol guarantees. Dropping it deregisters it.
pub struct Region {
    key: u32,
    ptr: *mut u8,
    len: usize,
    _owner: Arc<dyn RegionOwner>,
}

// SAFETY: the memory stays mapped while `_owner` lives; who touches which bytes
// when is the protocol's business, as with DMA.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

/// Keeps a region's memory and deregisters it when the [`Region`] goes.
pub trait RegionOwner: Send + Sync {
    fn deregister(&self, key: u32);
}

impl Region {
    /// For carriers: wraps registered memory at `ptr..ptr + len`.
    ///
    /// # Safety
    /// The memory must stay valid until `owner.deregister(key)` is called.
    pub unsafe fn new(key: u32, ptr: *mut u8, len: usize, owner: Arc<dyn RegionOwner>) -> Self {
        Self {
            key,
            ptr,
            len,
            _owner: owner,
        }
    }

    pub fn key(&self) -> u32 {
        self.key
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole region as a scatter-gather entry.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            key: self.key,
            offset,
            len,
        }
    }

    /// The region as a peer addresses it.
    pub fn remote(&self, node: NodeId) -> RemoteRegion {
        RemoteRegion {
            node,
            key: self.key,
            len: self.len as u64,
        }
    }

    /// Bytes `offset..offset + len`.
    ///
    /// # Safety
    /// No peer or local work request may write them while the slice lives.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(
            offset <= self.len && len <= self.len - offset,
            "outside the region"
        );
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }

    /// Bytes `offset..offset + len`, to fill.
    ///
    /// # Safety
    /// Nothing else may read or write them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(
            offset <= self.len && len <= self.len - offset,
            "outside the region"
        );
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self._owner.deregister(self.key);
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("key", &self.key)
            .field("len", &self.len)
            .finish()
    }
}

/// A completion queue. Completions of several queue pairs may share one.
pub trait CompletionQueue: Send + Sync {
    /// For carriers: the concrete queue behind the trait object.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Moves up to `max` completions into `out`; returns how many.
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize;
    /// Notified (`notify_waiters`) after completions were added: enable a
    /// `notified()` future, poll, and await it only if the poll found nothing.
    fn events(&self) -> &Notify;
}

/// A queue pair: a send queue and a receive queue.
pub trait QueuePair: Send + Sync {
    fn addr(&self) -> QpAddr;
    fn kind(&self) -> QpKind;
    /// Connects a reliable queue pair to its peer (both sides connect to each other).
    fn connect(&self, remote: QpAddr) -> Result<(), CarrierError>;
    /// Posts a send-queue request; its completion goes to the send completion queue.
    fn post_send(&self, wr: SendWr) -> Result<(), CarrierError>;
    /// Posts a receive request; its completion goes to the receive completion queue.
    fn post_recv(&self, wr: RecvWr) -> Result<(), CarrierError>;
}

/// A verbs-style device: memory registration, queue pairs and completion queues.
pub trait Carrier: Send + Sync + fmt::Debug {
    /// This node's id.
    fn node(&self) -> NodeId;
    /// A short name for reports (`shm`, `verbs`).
    fn name(&self) -> &'static str;
    /// Registers `len` bytes for local and remote access.
    fn register(&self, len: usize) -> Result<Region, CarrierError>;
    /// Creates a completion queue of `depth` entries.
    fn create_cq(&self, depth: usize) -> Result<Arc<dyn CompletionQueue>, CarrierError>;
    /// Creates a queue pair whose completions go to `send_cq` and `recv_cq` (made by this carrier).
    fn create_qp(
        &self,
        kind: QpKind,
        send_cq: &Arc<dyn CompletionQueue>,
        recv_cq: &Arc<dyn CompletionQueue>,
    ) -> Result<Arc<dyn QueuePair>, CarrierError>;
    /// Largest request a queue pair of `kind` carries.
    fn max_message(&self, kind: QpKind) -> usize;
    /// Receive requests a queue pair holds posted at most.
    fn recv_depth(&self) -> usize;
    /// Whether `node` is still there (its process alive, for carriers that can tell).
    fn is_alive(&self, node: NodeId) -> bool;
}

/// Waits until `cq` has completions and moves up to `max` into `out`, at most `timeout`.
/// Returns how many were moved (0 after the timeout).
pub async fn wait_poll(
    cq: &dyn CompletionQueue,
    out: &mut Vec<Completion>,
    max: usize,
    timeout: std::time::Duration,
) -> usize {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let notified = cq.events().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let n = cq.poll(out, max);
        if n > 0 {
            return n;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return cq.poll(out, max);
        }
    }
}
