//! A node's stream table: which streams are open, who may send on them, how
//! many messages each may still have buffered here, and where arriving
//! messages go. It knows nothing about sockets; a backend feeds it the frames
//! it receives ([`Hub::deliver`], [`Hub::credit`]) and carries what endpoints
//! send through the [`Wire`] trait.
//!
//! Rights: a peer may only send on a stream addressed to this node, only as
//! the node the stream was first seen from (or that its receive endpoint
//! expects), never after the stream's end, and never more messages than the
//! credits this node granted. It may only return credits for streams this
//! node sends to it. A peer that breaks a rule is a protocol violator; the
//! backend disconnects it.

use crate::frame::StreamKey;
use crate::pool::{BufferPool, Held};
use crate::stats::PeerCounters;
use crate::{NodeId, TransportConfig, TransportError, node_name};
use parking_lot::Mutex;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::{Notify, Semaphore};

/// Streams a peer may open towards this node before any endpoint here expects them.
pub const MAX_PENDING_STREAMS: usize = 4096;

/// Carries frames to other nodes; implemented by each backend (the TCP multiplexer).
pub(crate) trait Wire: Send + Sync {
    /// Queues a message of stream `key` for `peer`, after the stream's earlier frames.
    /// `msg` is `None` for a bare end-of-stream marker.
    fn data(&self, peer: NodeId, key: StreamKey, msg: Option<Held>, last: bool);
    /// Queues the failure of stream `key`, after its data; `token` is dropped once written.
    fn error(&self, peer: NodeId, key: StreamKey, text: String, token: Option<Held>);
    /// Returns `n` credits of stream `key` to its sender `peer`; jumps the data queue.
    fn credit(&self, peer: NodeId, key: StreamKey, n: u32);
}

/// What a receive endpoint gets from one of its streams.
#[derive(Debug)]
pub(crate) enum Event {
    Data {
        msg: Held,
        last: bool,
    },
    /// End of stream without a message.
    Last,
    Failed(TransportError),
}

/// The queue a receive endpoint reads; events are tagged with the source's index.
#[derive(Default)]
pub(crate) struct RecvQueue {
    pub events: Mutex<VecDeque<(usize, Event)>>,
    pub notify: Notify,
    /// Bytes of the messages in `events`.
    pub bytes: AtomicUsize,
}

impl RecvQueue {
    fn push(&self, source: usize, ev: Event) {
        if let Event::Data { msg, .. } = &ev {
            self.bytes.fetch_add(msg.message().len(), Ordering::Relaxed);
        }
        self.events.lock().push_back((source, ev));
        self.notify.notify_one();
    }
}

enum Sink {
    /// No endpoint expects the stream yet: hold its events (bounded by credits).
    Pending(VecDeque<Event>),
    Open {
        queue: Arc<RecvQueue>,
        source: usize,
    },
    /// The endpoint was dropped: messages are dropped and credited at once.
    Discard,
}

struct InStream {
    src: NodeId,
    /// Messages delivered and not yet released by the consumer.
    buffered: u32,
    ended: bool,
    sink: Sink,
}

/// The sending side of one stream: its credits.
pub(crate) struct OutStream {
    pub key: StreamKey,
    pub dest: NodeId,
    pub credits: Semaphore,
    /// Initial credits, announced by the receiver in its handshake.
    pub window: std::sync::atomic::AtomicU32,
    /// Whether the receiver's window is known (the connection is up, or it is this node).
    pub connected: AtomicBool,
}

#[derive(Default)]
struct State {
    inbound: HashMap<StreamKey, InStream>,
    outbound: HashMap<StreamKey, Arc<OutStream>>,
    released: HashSet<u64>,
    lost: HashMap<NodeId, String>,
    /// Receive windows of connected peers.
    windows: HashMap<NodeId, u32>,
    known: HashSet<NodeId>,
    pending: HashMap<NodeId, usize>,
}

/// Peers that broke a rule, with the rule (to be disconnected by the backend).
pub(crate) type Violators = Vec<(NodeId, String)>;

/// What became of a delivered event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivered {
    Queued,
    /// Its query was released; the event is dropped.
    Dropped,
    /// Its endpoint is gone; the message is dropped and its credit must go back.
    Discarded,
}

/// The node's stream table.
pub(crate) struct Hub {
    pub node: NodeId,
    /// Messages per stream a sender may have buffered here.
    pub window: u32,
    pub send_pool: BufferPool,
    pub recv_pool: BufferPool,
    state: Mutex<State>,
    counters: Mutex<HashMap<NodeId, Arc<PeerCounters>>>,
}

impl Hub {
    /// The stream table of `node` with the window and buffer pools `config` sets.
    pub fn for_config(node: NodeId, config: &TransportConfig) -> Self {
        Self::new(
            node,
            config.window,
            BufferPool::new(config.message_size, config.send_buffers),
            BufferPool::new(config.message_size, config.recv_buffers),
        )
    }

    pub fn new(node: NodeId, window: u32, send_pool: BufferPool, recv_pool: BufferPool) -> Self {
        Self {
            node,
            window: window.max(1),
            send_pool,
            recv_pool,
            state: Mutex::new(State::default()),
            counters: Mutex::new(HashMap::new()),
        }
    }

    #[cfg(test)]
    pub fn debug_state(&self) -> String {
        let st = self.state.lock();
        let mut out = String::new();
        let mut ins: Vec<_> = st.inbound.iter().collect();
        ins.sort_by_key(|(k, _)| **k);
        for (k, s) in ins {
            let sink = match &s.sink {
                Sink::Pending(e) => format!("pending {}", e.len()),
                Sink::Open { queue, .. } => format!("open, queued {}", queue.events.lock().len()),
                Sink::Discard => "discard".into(),
            };
            out += &format!(
                "  in {k} from {} buffered {} ended {} {sink}\n",
                s.src, s.buffered, s.ended
            );
        }
        let mut outs: Vec<_> = st.outbound.iter().collect();
        outs.sort_by_key(|(k, _)| **k);
        for (k, s) in outs {
            out += &format!(
                "  out {k} credits {} closed {}\n",
                s.credits.available_permits(),
                s.credits.is_closed()
            );
        }
        out
    }

    /// Figures kept per peer (this node included, for its local streams).
    pub fn counters(&self, peer: NodeId) -> Arc<PeerCounters> {
        Arc::clone(self.counters.lock().entry(peer).or_default())
    }

    pub fn all_counters(&self) -> Vec<(NodeId, Arc<PeerCounters>)> {
        let mut v: Vec<_> = self
            .counters
            .lock()
            .iter()
            .map(|(k, v)| (*k, Arc::clone(v)))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    pub fn set_known(&self, peers: impl IntoIterator<Item = NodeId>) {
        self.state.lock().known.extend(peers);
    }

    pub fn is_known(&self, peer: NodeId) -> bool {
        peer == self.node || self.state.lock().known.contains(&peer)
    }

    pub fn lost_reason(&self, peer: NodeId) -> Option<String> {
        self.state.lock().lost.get(&peer).cloned()
    }

    /// The error for a stream whose credits were closed.
    pub fn closed_error(&self, key: StreamKey, dest: NodeId) -> TransportError {
        let st = self.state.lock();
        if st.released.contains(&key.query) {
            TransportError::Cancelled(key)
        } else if let Some(reason) = st.lost.get(&dest) {
            TransportError::PeerLost {
                peer: dest,
                reason: reason.clone(),
            }
        } else {
            TransportError::Cancelled(key)
        }
    }

    /// A connection to `peer` is up; its streams get the window it announced.
    pub fn connected(&self, peer: NodeId, window: u32) {
        let mut st = self.state.lock();
        st.windows.insert(peer, window);
        st.known.insert(peer);
        for s in st.outbound.values() {
            if s.dest == peer && !s.connected.swap(true, Ordering::AcqRel) {
                s.window.store(window, Ordering::Release);
                s.credits.add_permits(window as usize);
            }
        }
    }

    /// Registers the sending side of streams `keys`.
    pub fn open_send(
        &self,
        keys: &[(StreamKey, NodeId)],
    ) -> Result<Vec<Arc<OutStream>>, TransportError> {
        let mut st = self.state.lock();
        for (key, _) in keys {
            if st.outbound.contains_key(key) {
                return Err(TransportError::AlreadyOpen(*key));
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        for &(key, dest) in keys {
            let window = if dest == self.node {
                Some(self.window)
            } else {
                st.windows.get(&dest).copied()
            };
            let s = Arc::new(OutStream {
                key,
                dest,
                credits: Semaphore::new(window.unwrap_or(0) as usize),
                window: window.unwrap_or(0).into(),
                connected: AtomicBool::new(window.is_some()),
            });
            if st.lost.contains_key(&dest) || st.released.contains(&key.query) {
                s.credits.close();
            }
            st.outbound.insert(key, Arc::clone(&s));
            out.push(s);
        }
        Ok(out)
    }

    /// Registers a receive endpoint for `sources` (stream key and expected sender each).
    /// Returns the endpoint's queue and the peers found to have sent on these streams
    /// without the right to (to be disconnected).
    pub fn open_receive(
        &self,
        sources: &[(StreamKey, NodeId)],
    ) -> Result<(Arc<RecvQueue>, Violators), TransportError> {
        let queue = Arc::new(RecvQueue::default());
        let mut violators = vec![];
        let mut st = self.state.lock();
        if let Some((key, _)) = sources.first()
            && st.released.contains(&key.query)
        {
            return Err(TransportError::Cancelled(*key));
        }
        for (key, _) in sources {
            if matches!(
                st.inbound.get(key),
                Some(InStream {
                    sink: Sink::Open { .. } | Sink::Discard,
                    ..
                })
            ) {
                return Err(TransportError::AlreadyOpen(*key));
            }
        }
        for (i, &(key, src)) in sources.iter().enumerate() {
            let lost = st.lost.get(&src).cloned();
            let prior = st.inbound.remove(&key);
            let mut stream = InStream {
                src,
                buffered: 0,
                ended: false,
                sink: Sink::Open {
                    queue: Arc::clone(&queue),
                    source: i,
                },
            };
            if let Some(prior) = prior {
                if let Some(n) = st.pending.get_mut(&prior.src) {
                    *n = n.saturating_sub(1);
                }
                if prior.src == src {
                    stream.buffered = prior.buffered;
                    stream.ended = prior.ended;
                    if let Sink::Pending(events) = prior.sink {
                        for ev in events {
                            queue.push(i, ev);
                        }
                    }
                } else {
                    violators.push((
                        prior.src,
                        format!("sent on stream {key}, which belongs to {}", node_name(src)),
                    ));
                }
            }
            if let Some(reason) = lost
                && !stream.ended
            {
                stream.ended = true;
                queue.push(
                    i,
                    Event::Failed(TransportError::PeerLost { peer: src, reason }),
                );
            }
            st.inbound.insert(key, stream);
        }
        Ok((queue, violators))
    }

    /// A receive endpoint was dropped: later messages on its streams are dropped and
    /// credited, and so are the ones it never took. Returns the credits to send back.
    pub fn close_receive(
        &self,
        keys: &[StreamKey],
        queue: &RecvQueue,
    ) -> Vec<(NodeId, StreamKey, u32)> {
        let mut st = self.state.lock();
        let mut credits: HashMap<StreamKey, u32> = HashMap::new();
        for (source, ev) in queue.events.lock().drain(..) {
            if matches!(ev, Event::Data { .. }) {
                *credits.entry(keys[source]).or_default() += 1;
            }
        }
        queue.bytes.store(0, Ordering::Relaxed);
        let mut out = vec![];
        for key in keys {
            if let Some(s) = st.inbound.get_mut(key) {
                s.sink = Sink::Discard;
                if let Some(&n) = credits.get(key) {
                    s.buffered = s.buffered.saturating_sub(n);
                    out.push((s.src, *key, n));
                }
            }
        }
        out
    }

    /// Whether `peer` may send a data message with a body on `key` now (a bare
    /// end-of-stream marker needs no credit): checked from the frame's header and
    /// stream key, before its body is read or any buffer taken for it, by the rules
    /// [`Hub::deliver`] enforces (the stream is this node's, belongs to the peer, has
    /// not ended, and has credit; a new stream is within the pending cap).
    pub fn admits(&self, peer: NodeId, key: StreamKey) -> Result<(), String> {
        self.addressed_here(key)?;
        let st = self.state.lock();
        if st.released.contains(&key.query) {
            return Ok(());
        }
        match st.inbound.get(&key) {
            None => within_pending_cap(&st.pending, peer),
            Some(stream) => {
                sent_by(stream, key, peer)?;
                if stream.ended {
                    return Err(ended(key));
                }
                self.within_credit(stream, key)
            }
        }
    }

    /// A stream key from a peer must name this node as its receiver.
    fn addressed_here(&self, key: StreamKey) -> Result<(), String> {
        if key.to != self.node {
            return Err(format!(
                "sent on stream {key}, which is addressed to node {}, not to this node",
                key.to
            ));
        }
        Ok(())
    }

    /// A data message needs a credit, unless the stream's messages are discarded.
    fn within_credit(&self, stream: &InStream, key: StreamKey) -> Result<(), String> {
        if stream.buffered >= self.window && !matches!(stream.sink, Sink::Discard) {
            return Err(format!(
                "flow control violated on stream {key}: more than {} messages without credit",
                self.window
            ));
        }
        Ok(())
    }

    /// Hands an event from `peer` to its stream. An `Err` names the rule the peer broke.
    pub fn deliver(&self, peer: NodeId, key: StreamKey, ev: Event) -> Result<Delivered, String> {
        self.addressed_here(key)?;
        let mut st = self.state.lock();
        if st.released.contains(&key.query) {
            return Ok(Delivered::Dropped);
        }
        let st = &mut *st;
        let stream = match st.inbound.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                within_pending_cap(&st.pending, peer)?;
                *st.pending.entry(peer).or_default() += 1;
                e.insert(InStream {
                    src: peer,
                    buffered: 0,
                    ended: false,
                    sink: Sink::Pending(VecDeque::new()),
                })
            }
        };
        sent_by(stream, key, peer)?;
        if stream.ended {
            if matches!(ev, Event::Failed(TransportError::PeerLost { .. })) {
                return Ok(Delivered::Dropped);
            }
            return Err(ended(key));
        }
        let is_data = matches!(ev, Event::Data { .. });
        if is_data {
            self.within_credit(stream, key)?;
        }
        if matches!(
            ev,
            Event::Data { last: true, .. } | Event::Last | Event::Failed(_)
        ) {
            stream.ended = true;
        }
        if is_data {
            if matches!(stream.sink, Sink::Discard) {
                return Ok(Delivered::Discarded);
            }
            stream.buffered += 1;
        }
        match &mut stream.sink {
            Sink::Pending(events) => events.push_back(ev),
            Sink::Open { queue, source } => queue.push(*source, ev),
            Sink::Discard => {}
        }
        Ok(Delivered::Queued)
    }

    /// Delivers an event of one of this node's streams to itself (no socket involved).
    pub fn deliver_local(&self, key: StreamKey, ev: Event) {
        match self.deliver(self.node, key, ev) {
            Ok(Delivered::Discarded) => self.credit_local(key, 1),
            Ok(_) => {}
            // Credits bound local streams exactly as remote ones, so this is a bug.
            Err(e) => tracing::error!(node = self.node, "local stream broke a rule: {e}"),
        }
    }

    /// The consumer released one message of `key`: returns the node to credit.
    pub fn released_one(&self, key: StreamKey) -> Option<NodeId> {
        let mut st = self.state.lock();
        let s = st.inbound.get_mut(&key)?;
        s.buffered = s.buffered.saturating_sub(1);
        Some(s.src)
    }

    /// Credits of a local stream.
    pub fn credit_local(&self, key: StreamKey, n: u32) {
        if let Err(e) = self.credit(self.node, key, n) {
            tracing::error!(node = self.node, "local credit broke a rule: {e}");
        }
    }

    /// `peer` returned `n` credits on stream `key`.
    pub fn credit(&self, peer: NodeId, key: StreamKey, n: u32) -> Result<(), String> {
        let st = self.state.lock();
        let Some(s) = st.outbound.get(&key) else {
            if st.released.contains(&key.query) {
                return Ok(());
            }
            return Err(format!(
                "returned credit on stream {key}, which this node never opened"
            ));
        };
        if s.dest != peer {
            return Err(format!(
                "returned credit on stream {key}, whose receiver is {}",
                node_name(s.dest)
            ));
        }
        if s.credits.is_closed() {
            return Ok(());
        }
        let window = s.window.load(Ordering::Acquire) as usize;
        if s.credits.available_permits() + n as usize > window {
            return Err(format!(
                "returned more credit on stream {key} than its window of {window}"
            ));
        }
        s.credits.add_permits(n as usize);
        Ok(())
    }

    /// Fails every stream that involves `peer`. Returns false if it was already lost.
    pub fn mark_lost(&self, peer: NodeId, reason: &str) -> bool {
        let mut st = self.state.lock();
        if st.lost.contains_key(&peer) {
            return false;
        }
        st.lost.insert(peer, reason.to_string());
        st.windows.remove(&peer);
        for s in st.inbound.values_mut() {
            if s.src == peer && !s.ended {
                s.ended = true;
                let ev = Event::Failed(TransportError::PeerLost {
                    peer,
                    reason: reason.to_string(),
                });
                match &mut s.sink {
                    Sink::Pending(events) => events.push_back(ev),
                    Sink::Open { queue, source } => queue.push(*source, ev),
                    Sink::Discard => {}
                }
            }
        }
        for s in st.outbound.values() {
            if s.dest == peer {
                s.credits.close();
            }
        }
        true
    }

    /// Forgets every stream of `query`; its later frames are dropped and its endpoints fail
    /// with [`TransportError::Cancelled`].
    pub fn release_query(&self, query: u64) {
        let mut st = self.state.lock();
        st.released.insert(query);
        let st = &mut *st;
        st.inbound.retain(|key, s| {
            if key.query != query {
                return true;
            }
            if let Some(n) = st.pending.get_mut(&s.src)
                && matches!(s.sink, Sink::Pending(_))
            {
                *n = n.saturating_sub(1);
            }
            if let Sink::Open { queue, source } = &s.sink
                && !s.ended
            {
                queue.push(*source, Event::Failed(TransportError::Cancelled(*key)));
            }
            false
        });
        st.outbound.retain(|key, s| {
            if key.query == query {
                s.credits.close();
                false
            } else {
                true
            }
        });
    }
}

/// A peer may open at most [`MAX_PENDING_STREAMS`] streams that no endpoint here
/// expects yet (`pending` counts them per peer).
fn within_pending_cap(pending: &HashMap<NodeId, usize>, peer: NodeId) -> Result<(), String> {
    if pending.get(&peer).copied().unwrap_or(0) >= MAX_PENDING_STREAMS {
        return Err(format!(
            "opened more than {MAX_PENDING_STREAMS} streams no endpoint here expects"
        ));
    }
    Ok(())
}

/// Only the stream's sender may send on it.
fn sent_by(stream: &InStream, key: StreamKey, peer: NodeId) -> Result<(), String> {
    if stream.src != peer {
        return Err(format!(
            "sent on stream {key}, which belongs to {}",
            node_name(stream.src)
        ));
    }
    Ok(())
}

/// Nothing may be sent on a stream after its end.
fn ended(key: StreamKey) -> String {
    format!("sent on stream {key} after its end")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolBuffer;

    fn hub() -> Hub {
        Hub::new(2, 2, BufferPool::new(64, 4), BufferPool::new(64, 4))
    }

    fn key(from: u32) -> StreamKey {
        StreamKey {
            query: 1,
            exchange: 1,
            from,
            to: 2,
        }
    }

    fn data(last: bool) -> Event {
        let msg = PoolBuffer::unpooled(4).freeze(None, None);
        Event::Data {
            msg: msg.hold(),
            last,
        }
    }

    #[test]
    fn events_wait_for_their_endpoint_and_rights_are_checked() {
        let h = hub();
        assert_eq!(h.deliver(1, key(0), data(false)), Ok(Delivered::Queued));
        // Another node may not join a stream that belongs to node 1.
        assert!(
            h.deliver(3, key(0), data(false))
                .unwrap_err()
                .contains("worker 1")
        );
        // A stream addressed elsewhere.
        let mut k = key(0);
        k.to = 5;
        assert!(
            h.deliver(1, k, data(false))
                .unwrap_err()
                .contains("addressed to node 5")
        );
        // Flow control: the window is 2 messages.
        assert_eq!(h.deliver(1, key(0), data(false)), Ok(Delivered::Queued));
        assert!(
            h.deliver(1, key(0), data(false))
                .unwrap_err()
                .contains("flow control")
        );
        // The endpoint finds the two messages that arrived before it opened.
        let (q, bad) = h.open_receive(&[(key(0), 1)]).unwrap();
        assert!(bad.is_empty());
        assert_eq!(q.events.lock().len(), 2);
        assert_eq!(h.released_one(key(0)), Some(1));
        assert_eq!(h.deliver(1, key(0), data(true)), Ok(Delivered::Queued));
        assert!(
            h.deliver(1, key(0), data(false))
                .unwrap_err()
                .contains("after its end")
        );
    }

    /// `admits` answers, from the stream key alone, what `deliver` would for a data
    /// message: the multiplexer asks it before it reads a frame's body.
    #[test]
    fn admission_before_the_body_agrees_with_delivery() {
        let h = hub();
        assert_eq!(h.admits(1, key(0)), Ok(()));
        let mut elsewhere = key(0);
        elsewhere.to = 5;
        assert!(h.admits(1, elsewhere).unwrap_err().contains("node 5"));
        h.deliver(1, key(0), data(false)).unwrap();
        assert!(h.admits(3, key(0)).unwrap_err().contains("worker 1"));
        h.deliver(1, key(0), data(false)).unwrap();
        assert!(h.admits(1, key(0)).unwrap_err().contains("flow control"));
        h.open_receive(&[(key(0), 1)]).unwrap();
        h.released_one(key(0));
        assert_eq!(h.admits(1, key(0)), Ok(()));
        h.deliver(1, key(0), data(true)).unwrap();
        assert!(h.admits(1, key(0)).unwrap_err().contains("after its end"));
    }

    #[test]
    fn a_pending_stream_from_the_wrong_node_is_reported_when_its_endpoint_opens() {
        let h = hub();
        h.deliver(3, key(0), data(false)).unwrap();
        let (_, bad) = h.open_receive(&[(key(0), 1)]).unwrap();
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, 3);
        assert!(bad[0].1.contains("belongs to worker 1"), "{}", bad[0].1);
    }

    #[test]
    fn credits_only_for_own_streams_and_within_the_window() {
        let h = hub();
        let k = StreamKey {
            query: 1,
            exchange: 1,
            from: 0,
            to: 4,
        };
        assert!(h.credit(4, k, 1).unwrap_err().contains("never opened"));
        let s = h.open_send(&[(k, 4)]).unwrap();
        h.connected(4, 3);
        assert_eq!(s[0].credits.available_permits(), 3);
        assert!(
            h.credit(5, k, 1)
                .unwrap_err()
                .contains("whose receiver is worker 4")
        );
        assert!(h.credit(4, k, 1).unwrap_err().contains("window"));
        s[0].credits.try_acquire().unwrap().forget();
        h.credit(4, k, 1).unwrap();
        assert_eq!(s[0].credits.available_permits(), 3);
    }

    #[test]
    fn losing_a_peer_fails_its_streams_and_releasing_a_query_drops_late_frames() {
        let h = hub();
        let (q, _) = h.open_receive(&[(key(0), 1), (key(1), 3)]).unwrap();
        let out = h
            .open_send(&[(
                StreamKey {
                    query: 1,
                    exchange: 9,
                    from: 0,
                    to: 1,
                },
                1,
            )])
            .unwrap();
        assert!(h.mark_lost(1, "gone"));
        assert!(!h.mark_lost(1, "gone again"));
        assert!(out[0].credits.is_closed());
        let (src, ev) = q.events.lock().pop_front().unwrap();
        assert_eq!(src, 0);
        assert!(matches!(
            ev,
            Event::Failed(TransportError::PeerLost { peer: 1, .. })
        ));
        h.release_query(1);
        assert!(matches!(
            q.events.lock().pop_front(),
            Some((1, Event::Failed(TransportError::Cancelled(_))))
        ));
        assert_eq!(h.deliver(3, key(1), data(false)), Ok(Delivered::Dropped));
        assert!(
            h.credit(1, key(0), 1).is_ok(),
            "late credits of a released query"
        );
        assert!(matches!(
            h.open_receive(&[(key(0), 1)]),
            Err(TransportError::Cancelled(_))
        ));
    }

    #[test]
    fn a_closed_endpoint_credits_back_what_it_never_took() {
        let h = hub();
        let keys = [key(0)];
        let (q, _) = h.open_receive(&[(key(0), 1)]).unwrap();
        h.deliver(1, key(0), data(false)).unwrap();
        let credits = h.close_receive(&keys, &q);
        assert_eq!(credits, vec![(1, key(0), 1)]);
        assert_eq!(h.deliver(1, key(0), data(false)), Ok(Delivered::Discarded));
    }
}
