//! The endpoints of the hub-backed transports (TCP): credits per stream in the
//! hub, frames through a [`Wire`].

use super::{Destinations, ReceiveSpec, SendSpec, To, misuse};
use crate::frame::{MAX_PAYLOAD, StreamKey};
use crate::hub::{Event, Hub, OutStream, RecvQueue, Wire};
use crate::pool::{Held, PoolBuffer};
use crate::stats::{PeerCounters, ReceiveEndpointStats, SendEndpointStats};
use crate::{NodeId, TransportError};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, TryAcquireError};

struct Outstanding {
    n: AtomicUsize,
    notify: Notify,
}

/// A buffer reserved for a set of destinations (their credits are taken). Fill it with
/// `std::io::Write` or [`HubBuffer::vec_mut`]; put it, or drop it to give everything back.
pub struct HubBuffer {
    buf: Option<PoolBuffer>,
    targets: Vec<usize>,
    credits: Vec<Arc<OutStream>>,
}

impl std::fmt::Debug for HubBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubBuffer")
            .field("len", &self.len())
            .field("targets", &self.targets)
            .finish()
    }
}

impl HubBuffer {
    fn buf(&self) -> &PoolBuffer {
        self.buf.as_ref().expect("present until put")
    }

    pub fn len(&self) -> usize {
        self.buf().len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf().is_empty()
    }

    /// Bytes that fit without growing the buffer (an oversize message).
    pub fn capacity(&self) -> usize {
        self.buf().capacity()
    }

    pub fn vec_mut(&mut self) -> &mut Vec<u8> {
        self.buf.as_mut().expect("present until put").vec_mut()
    }

    pub fn as_slice(&self) -> &[u8] {
        self.buf().as_slice()
    }
}

impl std::io::Write for HubBuffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.vec_mut().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for HubBuffer {
    fn drop(&mut self) {
        // Not put: the reserved credits go back to their streams.
        for s in self.credits.drain(..) {
            if !s.credits.is_closed() {
                s.credits.add_permits(1);
            }
        }
    }
}

/// The producing side of an exchange (see the module doc).
pub struct HubSend {
    hub: Arc<Hub>,
    wire: Arc<dyn Wire>,
    connect_timeout: Duration,
    dests: Destinations,
    streams: Vec<Arc<OutStream>>,
    peer_counters: Vec<Arc<PeerCounters>>,
    finished: Mutex<Vec<bool>>,
    outstanding: Arc<Outstanding>,
    messages: AtomicU64,
    bytes: AtomicU64,
    oversize: AtomicU64,
    credit_wait_ns: AtomicU64,
    acquire_wait_ns: AtomicU64,
}

impl std::fmt::Debug for HubSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubSend")
            .field("dests", &self.dests)
            .finish()
    }
}

impl HubSend {
    pub(crate) fn open(
        hub: Arc<Hub>,
        wire: Arc<dyn Wire>,
        connect_timeout: Duration,
        spec: SendSpec,
    ) -> Result<Self, TransportError> {
        let dests = Destinations::new(&spec)?;
        let keys: Vec<(StreamKey, NodeId)> = dests
            .nodes()
            .iter()
            .map(|&d| {
                (
                    StreamKey {
                        query: spec.query,
                        exchange: spec.exchange,
                        from: spec.from,
                        to: d,
                    },
                    d,
                )
            })
            .collect();
        let streams = hub.open_send(&keys)?;
        let peer_counters = dests.nodes().iter().map(|d| hub.counters(*d)).collect();
        Ok(Self {
            hub,
            wire,
            connect_timeout,
            finished: Mutex::new(vec![false; dests.nodes().len()]),
            dests,
            streams,
            peer_counters,
            outstanding: Arc::new(Outstanding {
                n: AtomicUsize::new(0),
                notify: Notify::new(),
            }),
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            oversize: AtomicU64::new(0),
            credit_wait_ns: AtomicU64::new(0),
            acquire_wait_ns: AtomicU64::new(0),
        })
    }

    pub fn destinations(&self) -> &[NodeId] {
        self.dests.nodes()
    }

    /// Size of a pool buffer: what a message should stay within.
    pub fn message_size(&self) -> usize {
        self.hub.send_pool.message_size()
    }

    async fn take_credit(&self, t: usize) -> Result<(), TransportError> {
        let s = &self.streams[t];
        match s.credits.try_acquire() {
            Ok(p) => {
                p.forget();
                return Ok(());
            }
            Err(TryAcquireError::Closed) => return Err(self.hub.closed_error(s.key, s.dest)),
            Err(TryAcquireError::NoPermits) => {}
        }
        let start = Instant::now();
        let res = loop {
            if s.connected.load(Ordering::Acquire) {
                break s.credits.acquire().await;
            }
            match tokio::time::timeout(self.connect_timeout, s.credits.acquire()).await {
                Ok(r) => break r,
                Err(_) if s.connected.load(Ordering::Acquire) => continue,
                Err(_) => {
                    return Err(if self.hub.is_known(s.dest) {
                        TransportError::Unreachable {
                            peer: s.dest,
                            reason: format!("no data connection after {:?}", self.connect_timeout),
                        }
                    } else {
                        TransportError::UnknownPeer(s.dest)
                    });
                }
            }
        };
        let waited = start.elapsed().as_nanos() as u64;
        self.credit_wait_ns.fetch_add(waited, Ordering::Relaxed);
        PeerCounters::add(&self.peer_counters[t].credit_wait_ns, waited);
        match res {
            Ok(p) => {
                p.forget();
                Ok(())
            }
            Err(_) => Err(self.hub.closed_error(s.key, s.dest)),
        }
    }

    /// Reserves a credit on every stream `to` names (waiting for their receivers to have
    /// room) and then a free pool buffer (waiting while every buffer is in use).
    pub async fn acquire(&self, to: To) -> Result<HubBuffer, TransportError> {
        let targets = self.dests.targets(to)?;
        if targets.is_empty() {
            return Err(misuse("no destination to send to"));
        }
        {
            let finished = self.finished.lock();
            if let Some(&t) = targets.iter().find(|&&t| finished[t]) {
                return Err(misuse(format!(
                    "stream {} already sent its last message",
                    self.streams[t].key
                )));
            }
        }
        let mut out = HubBuffer {
            buf: None,
            targets: vec![],
            credits: vec![],
        };
        for &t in &targets {
            self.take_credit(t).await?;
            out.credits.push(Arc::clone(&self.streams[t]));
        }
        out.targets = targets;
        let start = Instant::now();
        out.buf = Some(self.hub.send_pool.acquire().await);
        self.acquire_wait_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// Sends a filled buffer to the destinations it was acquired for; never waits.
    /// With `last`, it is the final message of those streams (an empty last message is
    /// the same as [`HubSend::finish`] for those streams).
    pub fn put(&self, mut buf: HubBuffer, last: bool) -> Result<(), TransportError> {
        if buf.len() > MAX_PAYLOAD - StreamKey::LEN {
            return Err(TransportError::TooLarge {
                bytes: buf.len(),
                max: MAX_PAYLOAD - StreamKey::LEN,
            });
        }
        let mut finished = self.finished.lock();
        if let Some(&t) = buf.targets.iter().find(|&&t| finished[t]) {
            return Err(misuse(format!(
                "stream {} already sent its last message",
                self.streams[t].key
            )));
        }
        let pool_buf = buf.buf.take().expect("present until put");
        if pool_buf.is_oversize() {
            self.oversize.fetch_add(1, Ordering::Relaxed);
        }
        buf.credits.clear(); // the credits are spent now
        let targets = std::mem::take(&mut buf.targets);
        let crc = crc32fast::hash(pool_buf.as_slice());
        let msg = pool_buf.freeze(Some(crc), Some(self.outstanding_until_released()));
        let len = msg.len();
        // Every hold exists before the first is handed on, so the buffer cannot be
        // released while some destinations are still to come. This node's own copy
        // does not keep the send buffer leased (see `Message::local_hold`).
        let holds: Vec<Held> = targets
            .iter()
            .map(|&t| match self.dests.nodes()[t] == self.hub.node {
                true => msg.local_hold(),
                false => msg.hold(),
            })
            .collect();
        msg.end_lease();
        drop(msg);
        for (&t, held) in targets.iter().zip(holds) {
            let (key, dest) = (self.streams[t].key, self.dests.nodes()[t]);
            if dest == self.hub.node {
                let c = &self.peer_counters[t];
                PeerCounters::add(&c.messages_sent, 1);
                PeerCounters::add(&c.bytes_sent, len as u64);
                self.hub.deliver_local(key, Event::Data { msg: held, last });
            } else {
                self.wire.data(dest, key, Some(held), last);
            }
            if last {
                finished[t] = true;
            }
        }
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    /// An empty message whose holds [`HubSend::flushed`] waits for: end-of-stream
    /// markers and errors carry one, so a flushed endpoint has written them too. It is
    /// returned as a hold of its own, which the caller keeps until every destination has
    /// its hold (`token.message().hold()`): otherwise the first marker written would
    /// release the token, and `flushed` would return while the others still queue.
    fn token(&self) -> Held {
        PoolBuffer::unpooled(0)
            .freeze(Some(0), Some(self.outstanding_until_released()))
            .hold()
    }

    /// Counts one more message [`HubSend::flushed`] waits for; the returned
    /// callback (a message's `on_release`) counts it off.
    fn outstanding_until_released(&self) -> Arc<dyn Fn() + Send + Sync> {
        self.outstanding.n.fetch_add(1, Ordering::AcqRel);
        let outstanding = Arc::clone(&self.outstanding);
        Arc::new(move || {
            if outstanding.n.fetch_sub(1, Ordering::AcqRel) == 1 {
                outstanding.notify.notify_waiters();
            }
        })
    }

    /// Ends every stream that has not sent its last message yet (a bare end-of-stream
    /// marker, which needs no credit).
    pub fn finish(&self) {
        let token = self.token();
        let mut finished = self.finished.lock();
        for (t, done) in finished.iter_mut().enumerate() {
            if *done {
                continue;
            }
            *done = true;
            let (key, dest) = (self.streams[t].key, self.dests.nodes()[t]);
            if dest == self.hub.node {
                self.hub.deliver_local(key, Event::Last);
            } else {
                // An empty message with the last flag is the marker on the wire.
                self.wire
                    .data(dest, key, Some(token.message().hold()), true);
            }
        }
    }

    /// Fails every unfinished stream: its receivers get `message` as an error.
    pub fn fail(&self, message: &str) {
        let token = self.token();
        let mut finished = self.finished.lock();
        for (t, done) in finished.iter_mut().enumerate() {
            if *done {
                continue;
            }
            *done = true;
            let (key, dest) = (self.streams[t].key, self.dests.nodes()[t]);
            if dest == self.hub.node {
                let ev = Event::Failed(TransportError::Remote {
                    peer: dest,
                    message: message.to_string(),
                });
                self.hub.deliver_local(key, ev);
            } else {
                self.wire
                    .error(dest, key, message.to_string(), Some(token.message().hold()));
            }
        }
    }

    /// Waits until every message, end-of-stream marker and error sent so far was written
    /// to its peers (or, locally, queued for its consumer).
    pub async fn flushed(&self) {
        loop {
            let notified = self.outstanding.notify.notified();
            if self.outstanding.n.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    pub fn stats(&self) -> SendEndpointStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SendEndpointStats {
            messages: l(&self.messages),
            bytes: l(&self.bytes),
            oversize: l(&self.oversize),
            credit_wait: Duration::from_nanos(l(&self.credit_wait_ns)),
            acquire_wait: Duration::from_nanos(l(&self.acquire_wait_ns)),
        }
    }
}

impl Drop for HubSend {
    fn drop(&mut self) {
        if self.finished.lock().iter().any(|f| !f) {
            // Dropped before finishing (its task was cancelled or failed): tell the
            // receivers, so they never wait for an end that cannot come.
            self.fail("the sender was cancelled before it finished");
        }
    }
}

/// Gives a received message's credit back when it is released (or dropped).
struct CreditReturn {
    hub: Arc<Hub>,
    wire: Arc<dyn Wire>,
    key: StreamKey,
}

/// One message taken from a receive endpoint.
pub struct HubReceived {
    /// Index of the source in the endpoint's spec.
    pub source: usize,
    /// The sender slot and node.
    pub slot: u32,
    pub node: NodeId,
    /// Whether this is the source's last message.
    pub last: bool,
    msg: Option<Held>,
    credit: Option<CreditReturn>,
}

impl std::fmt::Debug for HubReceived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubReceived")
            .field("slot", &self.slot)
            .field("node", &self.node)
            .field("last", &self.last)
            .field("len", &self.data().len())
            .finish()
    }
}

impl HubReceived {
    /// The message; empty for a bare end-of-stream marker.
    pub fn data(&self) -> &[u8] {
        self.msg.as_ref().map_or(&[], |m| m.message().as_slice())
    }

    /// The message as `Bytes` without copying. What is decoded from it may outlive the
    /// release: the buffer is then detached from its pool (see [`crate::pool`]).
    pub fn bytes(&self) -> bytes::Bytes {
        self.msg
            .as_ref()
            .map_or_else(bytes::Bytes::new, |m| m.message().bytes())
    }
}

impl Drop for HubReceived {
    fn drop(&mut self) {
        if let Some(c) = self.credit.take()
            && let Some(src) = c.hub.released_one(c.key)
        {
            if src == c.hub.node {
                c.hub.credit_local(c.key, 1);
            } else {
                c.wire.credit(src, c.key, 1);
            }
        }
        self.msg.take();
    }
}

/// The consuming side of an exchange (see the module doc).
pub struct HubReceive {
    hub: Arc<Hub>,
    wire: Arc<dyn Wire>,
    keys: Vec<StreamKey>,
    nodes: Vec<NodeId>,
    queue: Arc<RecvQueue>,
    done: Mutex<Vec<bool>>,
    remaining: AtomicUsize,
    error: Mutex<Option<TransportError>>,
    messages: AtomicU64,
    bytes: AtomicU64,
    wait_ns: AtomicU64,
}

impl std::fmt::Debug for HubReceive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubReceive")
            .field("sources", &self.nodes)
            .finish()
    }
}

impl HubReceive {
    /// Opens the endpoint; also returns peers found to have sent on its streams without
    /// the right to (the backend disconnects them).
    pub(crate) fn open(
        hub: Arc<Hub>,
        wire: Arc<dyn Wire>,
        spec: ReceiveSpec,
    ) -> Result<(Self, Vec<(NodeId, String)>), TransportError> {
        let sources: Vec<(StreamKey, NodeId)> = spec
            .sources
            .iter()
            .map(|&(slot, node)| {
                (
                    StreamKey {
                        query: spec.query,
                        exchange: spec.exchange,
                        from: slot,
                        to: hub.node,
                    },
                    node,
                )
            })
            .collect();
        let mut keys: Vec<StreamKey> = sources.iter().map(|(k, _)| *k).collect();
        keys.sort();
        keys.dedup();
        if keys.len() != sources.len() {
            return Err(misuse("a receive endpoint lists a source slot twice"));
        }
        let (queue, violators) = hub.open_receive(&sources)?;
        let n = sources.len();
        Ok((
            Self {
                hub,
                wire,
                keys: sources.iter().map(|(k, _)| *k).collect(),
                nodes: sources.iter().map(|(_, n)| *n).collect(),
                queue,
                done: Mutex::new(vec![false; n]),
                remaining: AtomicUsize::new(n),
                error: Mutex::new(None),
                messages: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                wait_ns: AtomicU64::new(0),
            },
            violators,
        ))
    }

    /// Bytes of the messages that arrived and were not taken yet: at most the sources'
    /// credits' worth, plus oversize messages.
    pub fn queued_bytes(&self) -> usize {
        self.queue.bytes.load(Ordering::Relaxed)
    }

    /// Sources whose last message has not arrived yet.
    pub fn remaining(&self) -> usize {
        self.remaining.load(Ordering::Acquire)
    }

    fn source_done(&self, i: usize) {
        let mut done = self.done.lock();
        if !done[i] {
            done[i] = true;
            self.remaining.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The next message from any source (in order per source); `None` once every source
    /// sent its last message; the error that ended a source otherwise.
    pub async fn get(&self) -> Result<Option<HubReceived>, TransportError> {
        let mut waited: Option<Instant> = None;
        let res = loop {
            if let Some(e) = self.error.lock().clone() {
                break Err(e);
            }
            let next = self.queue.events.lock().pop_front();
            match next {
                Some((i, Event::Data { msg, last })) => {
                    self.queue
                        .bytes
                        .fetch_sub(msg.message().len(), Ordering::Relaxed);
                    if last {
                        self.source_done(i);
                    }
                    self.messages.fetch_add(1, Ordering::Relaxed);
                    self.bytes
                        .fetch_add(msg.message().len() as u64, Ordering::Relaxed);
                    break Ok(Some(HubReceived {
                        source: i,
                        slot: self.keys[i].from,
                        node: self.nodes[i],
                        last,
                        msg: Some(msg),
                        credit: Some(CreditReturn {
                            hub: Arc::clone(&self.hub),
                            wire: Arc::clone(&self.wire),
                            key: self.keys[i],
                        }),
                    }));
                }
                Some((i, Event::Last)) => {
                    self.source_done(i);
                    break Ok(Some(HubReceived {
                        source: i,
                        slot: self.keys[i].from,
                        node: self.nodes[i],
                        last: true,
                        msg: None,
                        credit: None,
                    }));
                }
                Some((_, Event::Failed(e))) => {
                    *self.error.lock() = Some(e.clone());
                    break Err(e);
                }
                None if self.remaining() == 0 => break Ok(None),
                None => {
                    waited.get_or_insert_with(Instant::now);
                    self.queue.notify.notified().await;
                }
            }
        };
        if let Some(t) = waited {
            self.wait_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        res
    }

    /// Gives a message's buffer back and its credit to its sender (dropping a
    /// [`HubReceived`] does the same).
    pub fn release(&self, r: HubReceived) {
        drop(r);
    }

    pub fn stats(&self) -> ReceiveEndpointStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReceiveEndpointStats {
            messages: l(&self.messages),
            bytes: l(&self.bytes),
            wait: Duration::from_nanos(l(&self.wait_ns)),
        }
    }
}

impl Drop for HubReceive {
    fn drop(&mut self) {
        for (src, key, n) in self.hub.close_receive(&self.keys, &self.queue) {
            if src == self.hub.node {
                self.hub.credit_local(key, n);
            } else {
                self.wire.credit(src, key, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::BufferPool;

    /// A wire that writes the first frame it gets at once (drops its hold) and keeps
    /// the others queued until told to write them.
    #[derive(Default)]
    struct FirstWrittenAtOnce {
        queued: Mutex<Vec<Held>>,
        calls: AtomicUsize,
    }

    impl FirstWrittenAtOnce {
        fn take(&self, held: Option<Held>) {
            if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
                self.queued.lock().extend(held);
            }
        }
    }

    impl Wire for FirstWrittenAtOnce {
        fn data(&self, _: NodeId, _: StreamKey, msg: Option<Held>, _: bool) {
            self.take(msg);
        }
        fn error(&self, _: NodeId, _: StreamKey, _: String, token: Option<Held>) {
            self.take(token);
        }
        fn credit(&self, _: NodeId, _: StreamKey, _: u32) {}
    }

    /// Whether `flushed` returns within a short wait.
    async fn flushes(ep: &HubSend) -> bool {
        tokio::time::timeout(Duration::from_millis(100), ep.flushed())
            .await
            .is_ok()
    }

    // A marker written to one peer must not count as written to all: the query's
    // release after `flushed` would drop the others, and those peers would wait forever.
    #[tokio::test]
    async fn flushed_waits_for_the_end_markers_and_errors_to_every_peer() {
        for fail in [false, true] {
            let hub = Arc::new(Hub::new(
                1,
                4,
                BufferPool::new(64, 4),
                BufferPool::new(64, 4),
            ));
            let wire = Arc::new(FirstWrittenAtOnce::default());
            let spec = SendSpec {
                query: 1,
                exchange: 1,
                from: 0,
                destinations: vec![2, 3, 4],
                groups: vec![],
            };
            let ep = HubSend::open(
                Arc::clone(&hub),
                Arc::clone(&wire) as Arc<dyn Wire>,
                Duration::from_secs(1),
                spec,
            )
            .unwrap();
            if fail {
                ep.fail("stopped");
            } else {
                ep.finish();
            }
            assert_eq!(wire.queued.lock().len(), 2);
            assert!(
                !flushes(&ep).await,
                "fail={fail}: flushed with 2 peers to go"
            );
            wire.queued.lock().pop();
            assert!(
                !flushes(&ep).await,
                "fail={fail}: flushed with 1 peer to go"
            );
            wire.queued.lock().pop();
            assert!(flushes(&ep).await, "fail={fail}: everything was written");
        }
    }
}
