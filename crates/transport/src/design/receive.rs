//! The receiving endpoint of the verbs designs: how messages arrive per
//! [`Primitive`], the checks every message passes, and credits back.
//!
//! States of a stream: connecting, open, ended (its last message or marker
//! arrived, and with datagrams every message before it), failed.
//!
//! How a message arrives:
//! - Send: in one of the stream's posted receive buffers, its sequence number
//!   as the immediate.
//! - Datagram: in a buffer of the endpoint's pool; the header's slot and the
//!   completion's source node name the stream.
//! - Write: the sender wrote it into a buffer the receiver freed; a buffer-less
//!   receive completes with an immediate naming the buffer and the sequence.
//! - Read: the sender wrote an entry (buffer, length) into the stream's valid
//!   queue with its sequence as the immediate; the receiver reads the buffer
//!   into one of its own when it has one free, and tells the sender at once
//!   (a zero-length write whose immediate names the buffer), so the sender's
//!   buffer is held only until every destination has read it.
//!
//! Buffers come from a [`BufferPool`]: the endpoint's own, or (send/receive
//! designs) one its node shares. With adaptive buffers (the paper's section
//! 6.2) a stream's window moves: a message whose sender waited for credit
//! before it (a header flag) gets its stream one more buffer from the pool,
//! with a credit write saying so; when one look at the completion queue finds
//! k > 1 messages of a stream waiting, k - 1 of its buffers leave circulation
//! as they are released, down to one. Two refinements of the paper's rules:
//! its receiver grows when it finds nothing to read, which cannot tell a
//! sender short of credit from a slow one (the flag can); and messages found
//! together right after the consumer waited are a burst (a sender answering
//! a credit write), not a backlog, so they retire nothing. A stream that
//! ended gives its buffers back as they are released.

use super::message::{
    DROPPED, DesignConfig, ENTRY, FLAG_ERROR, FLAG_LAST, FLAG_MORE, FLAG_STARVED, HEADER,
    Primitive, carrier_err, free_entry_of, lost, word,
};
use super::pool::BufferPool;
use super::{Connector, Offer, Side, handshake};
use crate::frame::StreamKey;
use crate::verbs::{
    Carrier, Completion, CompletionQueue, QpKind, QueuePair, RecvWr, Region, RemoteRegion, SendOp,
    SendWr, WcOp, WcStatus,
};
use crate::{NodeId, TransportError};
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A stream's credit: receives (or, Write, buffers) handed to the sender so
/// far, and releases since the last write-back. Under one lock so that counts
/// go out in order and Write's free queue is whole before the count covers it.
struct Credit {
    posted: u64,
    since: u64,
    /// Buffers in circulation for the stream's credits (the reserve apart).
    window: u32,
    /// Of them, how many leave circulation as they are released (adaptive).
    retire: u32,
}

/// Receives posted on a datagram endpoint's one queue pair and how many its
/// streams need (window and reserve of each stream not ended).
#[derive(Default)]
struct Circulation {
    posted: usize,
    needed: usize,
}

/// The work-request id of a receive: Send's name their stream too.
fn recv_id(primitive: Primitive, source: usize, buffer: u32) -> u64 {
    match primitive {
        Primitive::Send => ((source as u64) << 32) | buffer as u64,
        _ => buffer as u64,
    }
}

/// The stream (Send's; 0 for datagrams) and buffer a receive's id names.
fn split_recv_id(id: u64) -> (usize, usize) {
    ((id >> 32) as usize, (id & 0xffff_ffff) as usize)
}

/// The part of a receiver's state one stream needs.
struct InLink {
    slot: u32,
    node: NodeId,
    key: StreamKey,
    qp: Arc<dyn QueuePair>,
    /// Where this side writes at the sender, once connected: its credit slot,
    /// or (Read) its buffers, which are also read from.
    peer: Mutex<Option<(RemoteRegion, u64)>>,
    /// The sender's datagram queue pair, the only one its data may come from
    /// (datagram designs).
    datagrams_from: std::sync::OnceLock<crate::verbs::QpAddr>,
    credit: Mutex<Credit>,
}

/// A message taken from a receive endpoint; give it back with [`DesignReceive::release`].
#[derive(Debug)]
pub struct Received {
    /// Position of the source in the endpoint's spec.
    pub source: usize,
    /// The sender's slot and node.
    pub slot: u32,
    pub node: NodeId,
    /// Whether this is the source's last message.
    pub last: bool,
    /// Its position in its stream. Datagrams may arrive out of order: a
    /// consumer that needs the stream's order restores it from this.
    pub seq: u64,
    /// The message continues in the stream's next one.
    pub more: bool,
    /// The sender marked it as its stream's last (with datagrams, not
    /// necessarily the last to arrive).
    pub closes: bool,
    buffer: usize,
    len: usize,
}

/// A Read stream's announced buffers and its own buffers free to read into.
#[derive(Default)]
struct Reads {
    /// Announcements arrived (the next one's sequence number).
    announced: u64,
    /// Announced sender buffers not read yet: (buffer, bytes).
    waiting: VecDeque<(u32, u32)>,
    free: Vec<usize>,
}

struct RecvState {
    ended: Vec<bool>,
    /// Messages arrived per stream, and how many its last message says it sent.
    arrived: Vec<u64>,
    total: Vec<Option<u64>>,
    remaining: usize,
    ready: VecDeque<Completion>,
    error: Option<TransportError>,
    /// Per stream (Read).
    reads: Vec<Reads>,
    /// Per buffer being read into (Read): the sender buffer it reads.
    reading: Vec<Option<u32>>,
}

/// What arrived, once the primitive's part is done.
struct Arrival {
    source: usize,
    buffer: usize,
    bytes: usize,
    /// The immediate's sequence number, if it carries one (in-order streams
    /// check it against their own count).
    seq: Option<u64>,
}

/// The consuming side of an exchange over a verbs design.
pub struct DesignReceive {
    carrier: Arc<dyn Carrier>,
    config: DesignConfig,
    links: Arc<Vec<InLink>>,
    rcq: Arc<dyn CompletionQueue>,
    _scq: Arc<dyn CompletionQueue>,
    /// The endpoint's one datagram queue pair, whose receives are one pool
    /// (datagram designs).
    pub(super) datagrams: Option<Arc<dyn QueuePair>>,
    /// Where the buffers come from; `buffers` is its region.
    pool: Arc<BufferPool>,
    /// Whether the pool is shared with other endpoints (or only this one's).
    shared: bool,
    buffers: Arc<Region>,
    /// The pool's buffers this endpoint holds (send/receive designs).
    held: Mutex<HashSet<u32>>,
    circulation: Mutex<Circulation>,
    /// Buffers lent to starved streams and taken out of circulation (adaptive).
    lent: AtomicU64,
    retired: AtomicU64,
    /// The consumer found nothing to read since the last look that found
    /// messages: those that arrive next are not a backlog.
    idle: std::sync::atomic::AtomicBool,
    /// One slot per stream: staging for the credit (and Write's free queue)
    /// written to the sender, or (Read) the valid queue the sender writes.
    slots: Arc<Region>,
    state: Mutex<RecvState>,
    /// Why connecting failed, set by the connecting task.
    connect_error: Arc<Mutex<Option<TransportError>>>,
    connecting: tokio::task::JoinHandle<()>,
    /// Credit counts written back to senders (after the first).
    credit_updates: AtomicU64,
    /// Held by the task in `get`: a stream's messages are checked in the order
    /// they completed, whoever consumes them.
    getting: tokio::sync::Mutex<()>,
}

impl Drop for DesignReceive {
    fn drop(&mut self) {
        self.connecting.abort();
        let held: Vec<u32> = self.held.lock().drain().collect();
        if !self.shared || held.is_empty() {
            return; // an own pool goes with the endpoint
        }
        if self.state.lock().remaining == 0 {
            self.pool.give(held);
            return;
        }
        // A sender that still has credit may be landing a message in a posted
        // receive while its queue pair goes: its buffers return to the pool
        // once any such sender has failed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (pool, linger) = (Arc::clone(&self.pool), self.config.timeout);
            runtime.spawn(async move {
                tokio::time::sleep(linger).await;
                pool.give(held);
            });
        }
    }
}

/// Writes stream `i`'s credit count `posted` (after Write's free queue) into
/// the sender's slot, with the count as immediate to wake a waiting sender.
fn write_credit(
    config: &DesignConfig,
    slots: &Region,
    l: &InLink,
    i: usize,
    posted: u64,
) -> Result<(), TransportError> {
    let Some((remote, offset)) = *l.peer.lock() else {
        return Ok(());
    };
    let at = i * config.slot();
    let len = config.count_at() + 8;
    // SAFETY: this stream's staging slot; the carrier copies it at post (a NIC
    // would send it inline, as the paper does).
    unsafe { slots.slice_mut(at + config.count_at(), 8) }.copy_from_slice(&posted.to_le_bytes());
    l.qp.post_send(SendWr {
        id: u64::MAX,
        op: SendOp::Write {
            remote,
            offset,
            imm: Some(posted as u32),
        },
        local: slots.sge(at, len),
        dest: None,
        signaled: false,
    })
    .map_err(carrier_err)
}

impl DesignReceive {
    /// Opens the streams `(query, exchange, slot, this node)` from every source and
    /// starts connecting them (senders may send once connected, whether or not
    /// anyone reads yet: the window is posted). The endpoint registers a pool
    /// of its own: a window and a reserve per stream.
    pub fn open(
        carrier: Arc<dyn Carrier>,
        connector: Arc<dyn Connector>,
        config: DesignConfig,
        spec: crate::ReceiveSpec,
    ) -> Result<Self, TransportError> {
        Self::open_in(carrier, connector, config, spec, None)
    }

    /// Like [`Self::open`], with the buffers taken from `pool`, which the
    /// node's endpoints share (send/receive designs).
    pub fn open_pooled(
        carrier: Arc<dyn Carrier>,
        connector: Arc<dyn Connector>,
        config: DesignConfig,
        spec: crate::ReceiveSpec,
        pool: Arc<BufferPool>,
    ) -> Result<Self, TransportError> {
        Self::open_in(carrier, connector, config, spec, Some(pool))
    }

    fn open_in(
        carrier: Arc<dyn Carrier>,
        connector: Arc<dyn Connector>,
        config: DesignConfig,
        spec: crate::ReceiveSpec,
        pool: Option<Arc<BufferPool>>,
    ) -> Result<Self, TransportError> {
        config.check()?;
        config.check_carrier(&*carrier)?;
        let me = carrier.node();
        let n = spec.sources.len();
        let per = config.per_stream();
        let primitive = config.primitive;
        let (recvs, on_one_qp) = match primitive {
            Primitive::Datagram => (per, n.max(1) * per),
            Primitive::Read => (config.valid_entries(), config.valid_entries()),
            Primitive::Send | Primitive::Write => (per, per),
        };
        if on_one_qp > carrier.recv_depth() {
            return Err(TransportError::Misuse(format!(
                "{on_one_qp} receives on one queue pair (a window of {} per stream) exceed \
                 the carrier's receive depth of {}",
                config.window,
                carrier.recv_depth()
            )));
        }
        // Completions outstanding at most: every receive posted and (Read) a
        // read per buffer; an adaptive stream may have its largest window posted.
        let most = config.adaptive.map_or(per, |max| max as usize + 1);
        let rcq = carrier
            .create_cq((n * (recvs.max(most) + most) + 64).next_power_of_two())
            .map_err(carrier_err)?;
        let scq = carrier.create_cq(64).map_err(carrier_err)?;
        let shared = pool.is_some();
        let pool = match pool {
            Some(pool) => {
                if !matches!(primitive, Primitive::Send | Primitive::Datagram)
                    || pool.message_size() != config.message_size
                    || pool.node() != me
                {
                    return Err(TransportError::Misuse(format!(
                        "a shared buffer pool serves the send/receive designs of its own node \
                         with its message size ({} bytes)",
                        pool.message_size()
                    )));
                }
                pool
            }
            None => BufferPool::register(&*carrier, n.max(1) * per, config.message_size)?,
        };
        let buffers = Arc::clone(pool.region());
        // A fresh own pool hands out 0, 1, 2, ...: Read and Write address
        // stream i's buffers as i * per + b.
        let Some(taken) = pool.take(n * per) else {
            return Err(TransportError::Misuse(format!(
                "the buffer pool has {} of its {} buffers free, fewer than the {} that {n} \
                 streams need",
                pool.capacity() - pool.in_use(),
                pool.capacity(),
                n * per
            )));
        };
        let slots = Arc::new(
            carrier
                .register(n.max(1) * config.slot())
                .map_err(carrier_err)?,
        );
        // SAFETY: nothing writes the fresh slots yet.
        unsafe { slots.slice_mut(0, n.max(1) * config.slot()) }.fill(0);
        let datagrams = match primitive {
            Primitive::Datagram => Some(
                carrier
                    .create_qp(QpKind::Ud, &scq, &rcq)
                    .map_err(carrier_err)?,
            ),
            _ => None,
        };
        let mut links = Vec::with_capacity(n);
        for (i, &(slot, node)) in spec.sources.iter().enumerate() {
            // Datagrams: this queue pair only writes credits. Read: its reads
            // complete where the announcements do.
            let (send_cq, recv_cq) = match primitive {
                Primitive::Datagram => (&scq, &scq),
                Primitive::Read => (&rcq, &rcq),
                _ => (&scq, &rcq),
            };
            let qp = carrier
                .create_qp(QpKind::Rc, send_cq, recv_cq)
                .map_err(carrier_err)?;
            for b in 0..recvs {
                let (on, wr) = match primitive {
                    Primitive::Send | Primitive::Datagram => {
                        let buffer = taken[i * per + b];
                        let at = buffer as usize * config.message_size;
                        (
                            datagrams.as_ref().unwrap_or(&qp),
                            RecvWr {
                                id: recv_id(primitive, i, buffer),
                                local: Some(buffers.sge(at, config.message_size)),
                            },
                        )
                    }
                    // Buffer-less: the immediate says where the data is.
                    Primitive::Read | Primitive::Write => (
                        &qp,
                        RecvWr {
                            id: i as u64,
                            local: None,
                        },
                    ),
                };
                on.post_recv(wr).map_err(carrier_err)?;
            }
            if primitive == Primitive::Write {
                // The free queue starts with every buffer but the reserve.
                for b in 0..config.window {
                    let at = i * config.slot() + 4 * b as usize;
                    let entry = free_entry_of(b as u64, b);
                    // SAFETY: this stream's staging slot, not posted yet.
                    unsafe { slots.slice_mut(at, 4) }.copy_from_slice(&entry.to_le_bytes());
                }
            }
            links.push(InLink {
                slot,
                node,
                key: StreamKey {
                    query: spec.query,
                    exchange: spec.exchange,
                    from: slot,
                    to: me,
                },
                qp,
                peer: Mutex::new(None),
                datagrams_from: std::sync::OnceLock::new(),
                credit: Mutex::new(Credit {
                    posted: config.window as u64,
                    since: 0,
                    window: config.window,
                    retire: 0,
                }),
            });
        }
        let links = Arc::new(links);
        let connect_error = Arc::new(Mutex::new(None));
        let connecting = {
            let links = Arc::clone(&links);
            let slots = Arc::clone(&slots);
            let buffers = Arc::clone(&buffers);
            let config = config.clone();
            let connect_error = Arc::clone(&connect_error);
            let rcq = Arc::clone(&rcq);
            let datagram_addr = datagrams.as_ref().map(|q| q.addr());
            tokio::spawn(async move {
                let meets = links.iter().enumerate().map(|(i, l)| {
                    let connector = Arc::clone(&connector);
                    let (slots, buffers, config) = (&slots, &buffers, &config);
                    async move {
                        // The sender writes into our buffers (Write) or valid queue (Read).
                        let (region, offset) = match config.primitive {
                            Primitive::Write => (
                                Some(buffers.remote(me)),
                                (i * config.per_stream() * config.message_size) as u64,
                            ),
                            Primitive::Read => (Some(slots.remote(me)), (i * config.slot()) as u64),
                            _ => (None, 0),
                        };
                        let offer = Offer {
                            qp: l.qp.addr(),
                            region,
                            offset,
                            datagrams: datagram_addr,
                            terms: config.terms(),
                        };
                        let theirs = handshake(
                            &*connector,
                            l.key,
                            Side::Receiver,
                            l.node,
                            offer,
                            config.timeout,
                            |theirs| {
                                let Some(region) = theirs.region.filter(|r| r.node == l.node)
                                else {
                                    return Err(lost(l.node, "its offer names no region"));
                                };
                                if config.primitive == Primitive::Datagram {
                                    let Some(from) = theirs.datagrams.filter(|q| q.node == l.node)
                                    else {
                                        return Err(lost(
                                            l.node,
                                            "its offer names no datagram queue pair",
                                        ));
                                    };
                                    let _ = l.datagrams_from.set(from);
                                }
                                *l.peer.lock() = Some((region, theirs.offset));
                                l.qp.connect(theirs.qp).map_err(carrier_err)
                            },
                        )
                        .await;
                        if let Err(e) = theirs {
                            *l.peer.lock() = None;
                            return Err(e);
                        }
                        if !config.credited() {
                            return Ok(());
                        }
                        // The first credit: the whole window.
                        let posted = l.credit.lock().posted;
                        write_credit(config, slots, l, i, posted)
                    }
                });
                let failed = futures::future::join_all(meets)
                    .await
                    .into_iter()
                    .find_map(Result::err);
                if let Some(e) = failed {
                    *connect_error.lock() = Some(e);
                    rcq.events().notify_waiters();
                }
            })
        };
        let reads = (0..n)
            .map(|i| Reads {
                free: match primitive {
                    Primitive::Read => (i * per..(i + 1) * per).rev().collect(),
                    _ => Vec::new(),
                },
                ..Reads::default()
            })
            .collect();
        Ok(Self {
            carrier,
            state: Mutex::new(RecvState {
                ended: vec![false; n],
                arrived: vec![0; n],
                total: vec![None; n],
                remaining: n,
                ready: VecDeque::new(),
                error: None,
                reads,
                reading: vec![None; n * per],
            }),
            config,
            links,
            rcq,
            _scq: scq,
            datagrams,
            pool,
            shared,
            buffers,
            held: Mutex::new(match primitive {
                Primitive::Send | Primitive::Datagram => taken.into_iter().collect(),
                _ => HashSet::new(),
            }),
            circulation: Mutex::new(Circulation {
                posted: if primitive == Primitive::Datagram {
                    n * per
                } else {
                    0
                },
                needed: n * per,
            }),
            lent: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            idle: std::sync::atomic::AtomicBool::new(true),
            slots,
            connect_error,
            connecting,
            credit_updates: AtomicU64::new(0),
            getting: tokio::sync::Mutex::new(()),
        })
    }

    /// Queue pairs and registered bytes this endpoint holds (of a shared
    /// pool, the buffers it holds now).
    pub fn footprint(&self) -> super::Footprint {
        let buffers = match self.shared {
            true => self.held.lock().len() * self.config.message_size,
            false => self.buffers.len(),
        };
        super::Footprint {
            queue_pairs: (self.links.len() + self.datagrams.iter().len()) as u64,
            registered_bytes: (buffers + self.slots.len()) as u64,
        }
    }

    /// Buffers lent to starved streams, and taken out of circulation, so far
    /// (adaptive buffers).
    pub fn lent(&self) -> u64 {
        self.lent.load(Ordering::Relaxed)
    }

    pub fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Receive buffers the endpoint holds now: of its pool (send/receive
    /// designs), or its fixed window and reserve per stream.
    pub fn buffers_held(&self) -> usize {
        match self.config.primitive {
            Primitive::Send | Primitive::Datagram => self.held.lock().len(),
            _ => self.links.len() * self.config.per_stream(),
        }
    }

    /// Credit counts written back to the senders since the first.
    pub fn credit_updates(&self) -> u64 {
        self.credit_updates.load(Ordering::Relaxed)
    }

    /// Streams that have not ended yet.
    pub fn remaining(&self) -> usize {
        self.state.lock().remaining
    }

    /// Hands a freed buffer of stream `source` back: re-posts its receive
    /// (Send, Datagram: with the buffer; Write: buffer-less, the buffer joining
    /// the free queue) and, if `counts`, every `credit_every` buffers writes the
    /// credit back. Read's buffers go back to the stream's free list instead.
    fn give_back(&self, source: usize, buffer: usize, counts: bool) -> Result<(), TransportError> {
        let Some(l) = self.links.get(source) else {
            return Ok(()); // no streams: nothing was posted
        };
        // An ended stream gets nothing more: no credit, and on its own queue
        // pair no receive (its sender may be gone); Send's buffer goes back to
        // the pool.
        let ended = self.state.lock().ended[source];
        let counts = counts && !ended;
        let c = &self.config;
        if ended && c.primitive == Primitive::Write {
            return Ok(());
        }
        if c.primitive == Primitive::Read {
            self.state.lock().reads[source].free.push(buffer);
            return self.pump_reads(source);
        }
        let mut credit = l.credit.lock();
        if matches!(c.primitive, Primitive::Send | Primitive::Datagram) {
            let mut circ = self.circulation.lock();
            // Out of circulation, without credit: a buffer marked for it while
            // the stream keeps one.
            let retire = counts && credit.retire > 0 && credit.window > 1;
            if retire {
                credit.retire -= 1;
                credit.window -= 1;
                circ.needed -= 1;
                self.retired.fetch_add(1, Ordering::Relaxed);
            }
            // Back to the pool: Send's for an ended stream or retired; a
            // datagram endpoint's beyond the receives its streams need (their
            // credit still counts: the receives are shared).
            let surplus = match c.primitive {
                Primitive::Datagram => circ.posted >= circ.needed,
                _ => ended || retire,
            };
            if surplus {
                drop(circ);
                self.held.lock().remove(&(buffer as u32));
                self.pool.give([buffer as u32]);
            } else {
                if c.primitive == Primitive::Datagram {
                    circ.posted += 1;
                }
                self.post_buffer(source, buffer as u32)?;
            }
            if retire {
                return self.write_back_due(source, &mut credit);
            }
        } else {
            // Write: a buffer-less receive, the buffer joining the free queue.
            l.qp.post_recv(RecvWr {
                id: source as u64,
                local: None,
            })
            .map_err(carrier_err)?;
        }
        if !counts {
            return Ok(());
        }
        if c.primitive == Primitive::Write {
            let entry = (credit.posted % c.window as u64) as usize;
            let own = (buffer - source * c.per_stream()) as u32;
            let e = free_entry_of(credit.posted, own);
            // SAFETY: the stream's staging free queue, under its credit lock.
            unsafe { self.slots.slice_mut(source * c.slot() + 4 * entry, 4) }
                .copy_from_slice(&e.to_le_bytes());
        }
        credit.posted += 1;
        credit.since += 1;
        self.write_back_due(source, &mut credit)
    }

    /// Posts a receive into pool buffer `buffer` for stream `source` (Send: on
    /// its queue pair; datagrams: on the endpoint's one).
    fn post_buffer(&self, source: usize, buffer: u32) -> Result<(), TransportError> {
        let c = &self.config;
        let at = buffer as usize * c.message_size;
        self.datagrams
            .as_ref()
            .unwrap_or(&self.links[source].qp)
            .post_recv(RecvWr {
                id: recv_id(c.primitive, source, buffer),
                local: Some(self.buffers.sge(at, c.message_size)),
            })
            .map_err(carrier_err)
    }

    /// Writes stream `source`'s credit back once `credit_every` releases are
    /// untold, or (adaptive) its whole window is: a window shrunk below the
    /// interval must not leave its sender waiting for a write that never comes.
    fn write_back_due(&self, source: usize, credit: &mut Credit) -> Result<(), TransportError> {
        let c = &self.config;
        if credit.since == 0 || credit.since < c.credit_every.min(credit.window) as u64 {
            return Ok(());
        }
        credit.since = 0;
        self.credit_updates.fetch_add(1, Ordering::Relaxed);
        write_credit(c, &self.slots, &self.links[source], source, credit.posted)
    }

    /// Adaptive buffers: lends stream `i`, whose sender waited for credit
    /// before its latest message, one more buffer from the pool, and tells
    /// the sender.
    fn lend_to(&self, i: usize) -> Result<(), TransportError> {
        let Some(max) = self.config.adaptive else {
            return Ok(());
        };
        let c = &self.config;
        let l = &self.links[i];
        if self.state.lock().ended[i] || l.peer.lock().is_none() {
            return Ok(());
        }
        let mut credit = l.credit.lock();
        // Messages piling up say the consumer, not the window, holds the
        // sender back: a buffer more would only wait too.
        if credit.window >= max || credit.retire > 0 {
            return Ok(());
        }
        let mut circ = self.circulation.lock();
        let room = match c.primitive {
            Primitive::Datagram => circ.posted < self.carrier.recv_depth(),
            _ => (credit.window as usize + 1) < self.carrier.recv_depth(),
        };
        if !room {
            return Ok(());
        }
        let Some(taken) = self.pool.take(1) else {
            return Ok(()); // the pool is empty: the window stays
        };
        let buffer = taken[0];
        self.held.lock().insert(buffer);
        if let Err(e) = self.post_buffer(i, buffer) {
            self.held.lock().remove(&buffer);
            self.pool.give([buffer]);
            return Err(e);
        }
        if c.primitive == Primitive::Datagram {
            circ.posted += 1;
        }
        circ.needed += 1;
        drop(circ);
        credit.window += 1;
        credit.posted += 1;
        credit.since = 0;
        self.lent.fetch_add(1, Ordering::Relaxed);
        self.credit_updates.fetch_add(1, Ordering::Relaxed);
        write_credit(c, &self.slots, l, i, credit.posted)
    }

    /// Adaptive buffers: where one look at the completion queue found k > 1
    /// messages of a stream waiting, all but one of their buffers leave
    /// circulation when released (per stream: several senders' messages
    /// arriving together say nothing about any one's window).
    fn mark_retirements(&self, found: &[Completion]) {
        if self.config.adaptive.is_none() || found.len() < 2 {
            return;
        }
        let mut waiting = vec![0u32; self.links.len()];
        for c in found {
            let stream = match &self.datagrams {
                None => Some(split_recv_id(c.id).0),
                Some(_) => self
                    .links
                    .iter()
                    .position(|l| l.datagrams_from.get() == c.src.as_ref()),
            };
            if let Some(w) = stream.and_then(|i| waiting.get_mut(i)) {
                *w += 1;
            }
        }
        for (l, k) in self.links.iter().zip(waiting) {
            if k > 1 {
                let mut credit = l.credit.lock();
                credit.retire = (credit.retire + k - 1).min(credit.window - 1);
            }
        }
    }

    /// A stream ended: what it needed leaves the endpoint's circulation.
    fn ended(&self, source: usize) {
        if matches!(self.config.primitive, Primitive::Send | Primitive::Datagram) {
            let window = self.links[source].credit.lock().window as usize;
            let mut circ = self.circulation.lock();
            circ.needed = circ.needed.saturating_sub(window + 1);
        }
    }

    /// Reads announced buffers of stream `source` while it has buffers free.
    fn pump_reads(&self, source: usize) -> Result<(), TransportError> {
        let l = &self.links[source];
        let Some((remote, _)) = *l.peer.lock() else {
            return Ok(());
        };
        let mut st = self.state.lock();
        loop {
            let r = &mut st.reads[source];
            if r.waiting.is_empty() || r.free.is_empty() {
                return Ok(());
            }
            let (from, bytes) = r.waiting.pop_front().expect("checked");
            let into = r.free.pop().expect("checked");
            st.reading[into] = Some(from);
            l.qp.post_send(SendWr {
                id: into as u64,
                op: SendOp::Read {
                    remote,
                    offset: from as u64 * self.config.message_size as u64,
                },
                local: self
                    .buffers
                    .sge(into * self.config.message_size, bytes as usize),
                dest: None,
                signaled: true,
            })
            .map_err(carrier_err)?;
        }
    }

    /// A completion of a Read stream: an announcement (queue a read, or fail for
    /// a dropped sender) or a finished read (tell the sender its buffer is free).
    fn on_read_stream(&self, c: &Completion) -> Result<Option<Arrival>, TransportError> {
        let per = self.config.per_stream();
        if c.op == WcOp::Read {
            let buffer = c.id as usize;
            let source = buffer / per;
            let from = self
                .state
                .lock()
                .reading
                .get_mut(buffer)
                .and_then(Option::take);
            let Some(from) = from else {
                return Err(TransportError::Misuse(format!(
                    "a read completed into buffer {buffer}, which was not being read into"
                )));
            };
            let l = &self.links[source];
            if let Some((remote, offset)) = *l.peer.lock() {
                l.qp.post_send(SendWr {
                    // An error completion names the stream.
                    id: source as u64,
                    op: SendOp::Write {
                        remote,
                        offset,
                        imm: Some(from),
                    },
                    local: self.slots.sge(source * self.config.slot(), 0),
                    dest: None,
                    signaled: false,
                })
                .map_err(carrier_err)?;
            }
            return Ok(Some(Arrival {
                source,
                buffer,
                bytes: c.bytes as usize,
                seq: None,
            }));
        }
        let source = c.id as usize;
        let l = &self.links[source];
        let Some(seq) = c.imm else {
            return Err(lost(l.node, "an announcement without a sequence number"));
        };
        let entries = self.config.valid_entries() as u64;
        {
            let mut st = self.state.lock();
            let r = &mut st.reads[source];
            if seq != r.announced as u32 {
                return Err(lost(
                    l.node,
                    format!("stream {}: an announcement out of sequence", l.key),
                ));
            }
            let at = source * self.config.slot() + (r.announced % entries) as usize * ENTRY;
            r.announced += 1;
            // SAFETY: the entry the sender wrote before this announcement's
            // immediate; it is not rewritten before the next lap of the queue.
            let e = unsafe { self.slots.slice(at, ENTRY) };
            let (from, bytes) = (word(e, 0), word(e, 4));
            if from == DROPPED {
                return Err(TransportError::Remote {
                    peer: l.node,
                    message: "the sending endpoint was dropped before it finished".into(),
                });
            }
            if from as usize > self.config.send_buffers
                || (bytes as usize) < HEADER
                || bytes as usize > self.config.message_size
            {
                return Err(lost(
                    l.node,
                    format!("stream {}: announced {bytes} bytes in buffer {from}", l.key),
                ));
            }
            r.waiting.push_back((from, bytes));
        }
        l.qp.post_recv(RecvWr {
            id: source as u64,
            local: None,
        })
        .map_err(carrier_err)?;
        self.pump_reads(source)?;
        Ok(None)
    }

    /// Finds what arrived from a completion: its stream, buffer and bytes.
    /// `None` for a completion that brings no message yet.
    fn arrival(&self, c: &Completion) -> Result<Option<Arrival>, TransportError> {
        let per = self.config.per_stream();
        let failed = |peer| lost(peer, format!("a request ended with {:?}", c.status));
        if c.status != WcStatus::Success {
            let peer = match self.config.primitive {
                Primitive::Datagram => c.src.map_or(0, |a| a.node),
                Primitive::Send => self.links.get(split_recv_id(c.id).0).map_or(0, |l| l.node),
                Primitive::Read | Primitive::Write => {
                    let i = match c.op {
                        WcOp::Read => c.id as usize / per,
                        _ => c.id as usize,
                    };
                    self.links.get(i).map_or(0, |l| l.node)
                }
            };
            if self.config.primitive == Primitive::Read && c.op == WcOp::Read {
                // The announced buffer is gone: its sender went before it was read.
                return Err(lost(
                    peer,
                    format!(
                        "reading a buffer it announced ended with {:?} (was its sending \
                         endpoint dropped before it was flushed?)",
                        c.status
                    ),
                ));
            }
            return Err(failed(peer));
        }
        match self.config.primitive {
            Primitive::Send | Primitive::Datagram => {
                let (stream, buffer) = split_recv_id(c.id);
                if buffer >= self.pool.capacity()
                    || stream >= self.links.len().max(1)
                    || c.op != WcOp::Recv
                {
                    return Err(TransportError::Misuse(format!(
                        "a completion for unknown buffer {buffer}"
                    )));
                }
                if self.datagrams.is_some() {
                    let mut circ = self.circulation.lock();
                    circ.posted = circ.posted.saturating_sub(1);
                }
                let bytes = (c.bytes as usize).min(self.config.message_size);
                let source = match &self.datagrams {
                    None => Some(stream),
                    Some(_) if bytes < HEADER => None,
                    Some(_) => {
                        // SAFETY: the sender wrote the buffer before its completion.
                        let h = unsafe {
                            self.buffers
                                .slice(buffer * self.config.message_size, HEADER)
                        };
                        // The stream the header names, if it came from that
                        // stream's sender.
                        let slot = word(h, 8);
                        self.links.iter().position(|l| {
                            l.slot == slot && l.datagrams_from.get() == c.src.as_ref()
                        })
                    }
                };
                let Some(source) = source else {
                    // Nobody's stream: give the buffer back to the pool.
                    let from = c
                        .src
                        .map_or("an unknown node".into(), |a| crate::node_name(a.node));
                    tracing::warn!("a datagram from {from} names no stream of this endpoint");
                    self.give_back(0, buffer, false)?;
                    return Ok(None);
                };
                let Some(seq) = c.imm else {
                    return Err(lost(
                        self.links[source].node,
                        format!("stream {}: no sequence number", self.links[source].key),
                    ));
                };
                Ok(Some(Arrival {
                    source,
                    buffer,
                    bytes,
                    seq: Some(seq as u64),
                }))
            }
            Primitive::Write => {
                let source = c.id as usize;
                let (Some(l), Some(imm), WcOp::RecvWriteImm) =
                    (self.links.get(source), c.imm, c.op)
                else {
                    return Err(TransportError::Misuse(
                        "a completion for no stream of this endpoint".into(),
                    ));
                };
                let own = (imm & 0xffff) as usize;
                if own >= per {
                    return Err(lost(
                        l.node,
                        format!("stream {}: a write into buffer {own}", l.key),
                    ));
                }
                Ok(Some(Arrival {
                    source,
                    buffer: source * per + own,
                    bytes: (c.bytes as usize).min(self.config.message_size),
                    seq: Some((imm >> 16) as u64),
                }))
            }
            Primitive::Read => {
                if c.op != WcOp::Read
                    && (c.op != WcOp::RecvWriteImm || c.id as usize >= self.links.len())
                {
                    return Err(TransportError::Misuse(
                        "a completion for no stream of this endpoint".into(),
                    ));
                }
                self.on_read_stream(c)
            }
        }
    }

    /// The next message from any source; `None` once every source sent its last.
    pub async fn get(&self) -> Result<Option<Received>, TransportError> {
        let _one_at_a_time = self.getting.lock().await;
        let mut last_progress = std::time::Instant::now();
        loop {
            let c = {
                let mut st = self.state.lock();
                if let Some(e) = &st.error {
                    return Err(e.clone());
                }
                if st.remaining == 0 {
                    return Ok(None);
                }
                if st.ready.is_empty() {
                    let mut out = Vec::new();
                    self.rcq.poll(&mut out, 64);
                    if !out.is_empty() && !self.idle.swap(false, Ordering::Relaxed) {
                        self.mark_retirements(&out);
                    }
                    st.ready.extend(out);
                }
                st.ready.pop_front()
            };
            let Some(c) = c else {
                self.idle.store(true, Ordering::Relaxed);
                if let Some(e) = self.connect_error.lock().clone() {
                    return Err(self.fail_with(e));
                }
                let notified = self.rcq.events().notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let mut probe = Vec::new();
                if self.rcq.poll(&mut probe, 64) > 0 {
                    self.state.lock().ready.extend(probe);
                    continue;
                }
                if tokio::time::timeout(Duration::from_millis(100), notified)
                    .await
                    .is_ok()
                {
                    last_progress = std::time::Instant::now();
                    continue;
                }
                if let Some(e) = self.stalled(last_progress) {
                    return Err(self.fail_with(e));
                }
                continue;
            };
            let arrival = match self.arrival(&c) {
                Ok(Some(a)) => a,
                Ok(None) => continue,
                Err(e) => return Err(self.fail_with(e)),
            };
            match self.accept(arrival) {
                Ok(Some(r)) => return Ok(Some(r)),
                Ok(None) => continue,
                Err(e) => return Err(self.fail_with(e)),
            }
        }
    }

    /// Why a receiver that has seen nothing for a while should give up, if it should.
    fn stalled(&self, last_progress: std::time::Instant) -> Option<TransportError> {
        let st = self.state.lock();
        if let Some(i) = (0..self.links.len())
            .find(|&i| !st.ended[i] && !self.carrier.is_alive(self.links[i].node))
        {
            return Some(lost(self.links[i].node, "its process is gone"));
        }
        if let Some(i) = (0..self.links.len()).find(|&i| {
            !st.ended[i] && st.total[i].is_some() && last_progress.elapsed() > self.config.timeout
        }) {
            let (arrived, total) = (st.arrived[i], st.total[i].unwrap_or(0));
            return Some(lost(
                self.links[i].node,
                format!(
                    "stream {}: {arrived} of its {total} messages arrived within {:?}",
                    self.links[i].key, self.config.timeout
                ),
            ));
        }
        if last_progress.elapsed() > self.config.timeout.saturating_mul(6) {
            return Some(TransportError::Misuse(
                "no message from any source for a minute".into(),
            ));
        }
        None
    }

    /// Checks an arrived message against its stream: header, sequence, end.
    /// Returns it for the consumer, or `None` for a bare end-of-stream marker.
    fn accept(&self, a: Arrival) -> Result<Option<Received>, TransportError> {
        let Arrival {
            source,
            buffer,
            bytes,
            seq,
        } = a;
        let l = &self.links[source];
        let off = buffer * self.config.message_size;
        let bad = |why: &str| {
            lost(
                l.node,
                format!("stream {}: a malformed message ({why})", l.key),
            )
        };
        if bytes < HEADER {
            return Err(bad("shorter than its header"));
        }
        // SAFETY: the message landed before its completion; nothing writes the
        // buffer again until it is given back.
        let h = unsafe { self.buffers.slice(off, HEADER) };
        let flags = word(h, 0);
        let len = word(h, 4) as usize;
        if len != bytes - HEADER || word(h, 8) != l.slot {
            return Err(bad("its length or slot disagrees with what arrived"));
        }
        let (ended_now, seq) = {
            let mut st = self.state.lock();
            if st.ended[source] {
                return Err(bad("after the stream's end"));
            }
            let this = st.arrived[source];
            // A connection delivers in order: the next is the one counted next
            // (as far as the immediate carries it: Write's holds 16 bits).
            let bits = match self.config.primitive {
                Primitive::Write => 0xffff,
                _ => 0xffff_ffff,
            };
            let seq = match seq {
                Some(s) if self.config.in_order() => {
                    if (s ^ this) & bits != 0 {
                        return Err(bad("out of sequence"));
                    }
                    this
                }
                Some(s) => s,
                None => this,
            };
            st.arrived[source] += 1;
            if flags & FLAG_LAST != 0 {
                if st.total[source].is_some() {
                    return Err(bad("a second last message"));
                }
                st.total[source] = Some(seq + 1);
            }
            match st.total[source] {
                Some(t) if st.arrived[source] > t => {
                    return Err(bad("more messages than the stream sent"));
                }
                Some(t) if st.arrived[source] == t => {
                    st.ended[source] = true;
                    st.remaining -= 1;
                    (true, seq)
                }
                _ => (false, seq),
            }
        };
        if ended_now {
            self.ended(source);
        } else if flags & FLAG_STARVED != 0 {
            self.lend_to(source)?;
        }
        if flags & FLAG_ERROR != 0 {
            // SAFETY: as above.
            let text = unsafe { self.buffers.slice(off + HEADER, len) };
            return Err(TransportError::Remote {
                peer: l.node,
                message: String::from_utf8_lossy(text).into_owned(),
            });
        }
        if len == 0 && flags & FLAG_LAST != 0 {
            // A bare end-of-stream marker (in the stream's reserve): pooled
            // buffers go back.
            if self.config.primitive != Primitive::Write {
                self.give_back(source, buffer, false)?;
            }
            return Ok(None);
        }
        if len == 0 {
            return Err(bad("empty"));
        }
        Ok(Some(Received {
            source,
            slot: l.slot,
            node: l.node,
            last: ended_now,
            seq,
            more: flags & FLAG_MORE != 0,
            closes: flags & FLAG_LAST != 0,
            buffer,
            len,
        }))
    }

    fn fail_with(&self, e: TransportError) -> TransportError {
        self.state.lock().error.get_or_insert(e).clone()
    }

    /// The payload of a received message.
    pub fn data(&self, r: &Received) -> &[u8] {
        // SAFETY: the buffer is not given back while `r` lives.
        unsafe {
            self.buffers
                .slice(r.buffer * self.config.message_size + HEADER, r.len)
        }
    }

    /// Gives the buffer back and, every `credit_every` buffers, writes the
    /// stream's credit back to its sender.
    pub fn release(&self, r: Received) -> Result<(), TransportError> {
        let given = match (r.last, self.config.primitive) {
            // The buffer goes back, without credit for an ended stream.
            (last, Primitive::Send | Primitive::Datagram | Primitive::Read) => {
                self.give_back(r.source, r.buffer, !last)
            }
            // The stream is over: nothing more will arrive for it.
            (true, _) => Ok(()),
            (false, _) => self.give_back(r.source, r.buffer, true),
        };
        given.map_err(|e| self.fail_with(e))
    }
}
