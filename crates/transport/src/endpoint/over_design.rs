//! The endpoints over a verbs design ([`crate::design`]), as exchange operators
//! use them: a message may be larger than a registered buffer, and each
//! stream is an Arrow IPC stream whose order matters.
//!
//! Sending: a buffer is written in place while it fits; what does not fit
//! spills into memory of its own and goes, after the buffer, as the stream's
//! next messages, each marked as continued by the next (`more`). A spill
//! needs credits, and `put` never waits, so the rest is sent by a job that
//! waits for them; jobs run one after another in the order they were queued,
//! and while one is queued every later `put`, `finish` or `fail` queues too,
//! so no stream sees another message inside a cut one. `finish` and `fail`
//! are always jobs (a design's markers take a buffer, which may mean waiting
//! for one to come back). `acquire` waits until the jobs are done, so the
//! spill a producer may have in flight stays one message.
//!
//! Receiving: a cut message is joined again (copied into one piece) before
//! the consumer sees it; datagram designs, whose messages may arrive out of
//! order, get each stream's order back from the messages' sequence numbers
//! (early ones are copied aside and their buffers released). A whole message
//! in order stays in its registered buffer until released; its
//! [`DesignReceived::bytes`] is a copy, since the buffer is reused. A
//! receiving endpoint dropped before its streams ended goes on taking and
//! discarding their messages until they do, as a TCP endpoint's streams are
//! discarded: otherwise their senders would wait for credit forever.
//!
//! States of a sending endpoint: open (puts go straight to the design), or
//! draining (jobs queued; puts queue behind them); after `finish` or `fail`,
//! closed. Dropped while open or draining without `finish`, its jobs are
//! aborted and the design fails its unfinished streams.

use super::{ReceiveEndpointStats, SendEndpointStats, To};
use crate::design::{DesignBuffer, DesignReceive, DesignSend, Received as Arrival};
use crate::frame::MAX_PAYLOAD;
use crate::{NodeId, TransportError};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot};

/// The largest message (a whole one, however many buffers it takes).
const MAX_MESSAGE: usize = MAX_PAYLOAD;

/// Messages of one stream a datagram receiver keeps aside, waiting for an
/// earlier one: more means the stream lost a message or its sender misbehaves.
const MAX_EARLY: usize = 4096;

/// What a node's design endpoints moved to and from other nodes (for the
/// node's transport figures; messages to itself do not count, as the TCP
/// transport's local streams do not).
#[derive(Debug, Default)]
pub struct Traffic {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_received: AtomicU64,
}

/// A design buffer and what did not fit in it.
#[derive(Debug)]
pub(crate) struct DesignEndpointBuffer {
    to: To,
    first: DesignBuffer,
    rest: Vec<u8>,
}

impl DesignEndpointBuffer {
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.rest.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.first.capacity()
    }

    pub(crate) fn to_vec(&self) -> Vec<u8> {
        [self.first.as_slice(), &self.rest].concat()
    }

    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        if self.rest.is_empty() {
            let room = self.first.capacity() - self.first.len();
            let (head, tail) = bytes.split_at(room.min(bytes.len()));
            let fitted = self.first.extend_from_slice(head);
            debug_assert!(fitted, "within the room left");
            self.rest.extend_from_slice(tail);
        } else {
            self.rest.extend_from_slice(bytes);
        }
    }
}

/// Jobs queued on a sending endpoint.
#[derive(Default)]
struct Jobs {
    pending: usize,
    /// Signalled when the last queued job ends: the next one waits for it.
    last: Option<oneshot::Receiver<()>>,
    running: Vec<tokio::task::AbortHandle>,
}

struct Shared {
    ep: Arc<DesignSend>,
    jobs: Mutex<Jobs>,
    idle: Notify,
    /// The first error a job met; later calls return it.
    error: Mutex<Option<TransportError>>,
}

/// The producing side of an exchange over a verbs design (see the module doc).
pub(crate) struct DesignSending {
    shared: Arc<Shared>,
    /// Connects the streams from the start, as the receivers do: the handshake
    /// overlaps whatever the producer computes before its first message, and a
    /// receiver does not wait out its timeout for a slow first message.
    connecting: Option<tokio::task::AbortHandle>,
    traffic: Arc<Traffic>,
    finishing: AtomicBool,
    messages: AtomicU64,
    bytes: AtomicU64,
    oversize: AtomicU64,
    acquire_wait_ns: AtomicU64,
}

impl std::fmt::Debug for DesignSending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesignSending")
            .field("destinations", &self.shared.ep.destinations())
            .finish()
    }
}

/// Sends `rest` to `to` as the messages after one marked `more`: each but the
/// last continued by the next, the last ending the streams if `last`.
async fn send_rest(ep: &DesignSend, to: To, rest: &[u8], last: bool) -> Result<(), TransportError> {
    let pieces: Vec<&[u8]> = rest.chunks(ep.message_size()).collect();
    let n = pieces.len();
    for (i, piece) in pieces.into_iter().enumerate() {
        let mut b = ep.acquire(to).await?;
        b.extend_from_slice(piece);
        let final_piece = i + 1 == n;
        b.set_more(!final_piece);
        ep.put(b, last && final_piece)?;
    }
    Ok(())
}

impl DesignSending {
    pub(crate) fn new(ep: DesignSend, traffic: Arc<Traffic>) -> Self {
        let ep = Arc::new(ep);
        // Its error, if any, is met again by the first acquire or end.
        let connecting = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let ep = Arc::clone(&ep);
            runtime
                .spawn(async move {
                    let _ = ep.connect().await;
                })
                .abort_handle()
        });
        Self {
            traffic,
            connecting,
            shared: Arc::new(Shared {
                ep,
                jobs: Mutex::new(Jobs::default()),
                idle: Notify::new(),
                error: Mutex::new(None),
            }),
            finishing: AtomicBool::new(false),
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            oversize: AtomicU64::new(0),
            acquire_wait_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn destinations(&self) -> &[NodeId] {
        self.shared.ep.destinations()
    }

    pub(crate) fn message_size(&self) -> usize {
        self.shared.ep.message_size()
    }

    fn error(&self) -> Option<TransportError> {
        self.shared.error.lock().clone()
    }

    /// Queues `job` behind the jobs queued before it (`jobs` is the locked
    /// queue). A job after a failed one is skipped unless it is `always` run
    /// (an error marker).
    fn queue<F>(&self, jobs: &mut Jobs, always: bool, job: F) -> Result<(), TransportError>
    where
        F: Future<Output = Result<(), TransportError>> + Send + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            TransportError::Misuse("a design endpoint is used outside a tokio runtime".into())
        })?;
        let before = jobs.last.take();
        let (done, next) = oneshot::channel();
        jobs.last = Some(next);
        jobs.pending += 1;
        let shared = Arc::clone(&self.shared);
        let task = runtime.spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            let run = always || shared.error.lock().is_none();
            if run && let Err(e) = job.await {
                shared.error.lock().get_or_insert(e);
            }
            let _ = done.send(());
            let mut jobs = shared.jobs.lock();
            jobs.pending -= 1;
            if jobs.pending == 0 {
                jobs.last = None;
                jobs.running.clear();
            }
            drop(jobs);
            shared.idle.notify_waiters();
        });
        jobs.running.push(task.abort_handle());
        Ok(())
    }

    /// Waits until no job is queued; the error one met, if any.
    async fn settle(&self) -> Result<(), TransportError> {
        loop {
            let idle = self.shared.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.shared.jobs.lock().pending == 0 {
                break;
            }
            idle.await;
        }
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(crate) async fn acquire(&self, to: To) -> Result<DesignEndpointBuffer, TransportError> {
        self.settle().await?;
        let start = Instant::now();
        let first = self.shared.ep.acquire(to).await?;
        self.acquire_wait_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(DesignEndpointBuffer {
            to,
            first,
            rest: Vec::new(),
        })
    }

    pub(crate) fn put(&self, buf: DesignEndpointBuffer, last: bool) -> Result<(), TransportError> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        let len = buf.len();
        if len > MAX_MESSAGE {
            return Err(TransportError::TooLarge {
                bytes: len,
                max: MAX_MESSAGE,
            });
        }
        if len == 0 && !last {
            return Ok(()); // nothing to send: the reservation goes back as it drops
        }
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
        let remote = self.shared.ep.remote_targets(buf.to) as u64;
        self.traffic
            .messages_sent
            .fetch_add(remote, Ordering::Relaxed);
        self.traffic
            .bytes_sent
            .fetch_add(remote * len as u64, Ordering::Relaxed);
        let DesignEndpointBuffer {
            to,
            mut first,
            rest,
        } = buf;
        if !rest.is_empty() {
            self.oversize.fetch_add(1, Ordering::Relaxed);
        }
        let mut jobs = self.shared.jobs.lock();
        let ep = Arc::clone(&self.shared.ep);
        if jobs.pending > 0 {
            // Behind a cut message still going: after it, in order.
            return self.queue(&mut jobs, false, async move {
                first.set_more(!rest.is_empty());
                ep.put(first, last && rest.is_empty())?;
                send_rest(&ep, to, &rest, last).await
            });
        }
        first.set_more(!rest.is_empty());
        self.shared.ep.put(first, last && rest.is_empty())?;
        if rest.is_empty() {
            return Ok(());
        }
        self.queue(&mut jobs, false, async move {
            send_rest(&ep, to, &rest, last).await
        })
    }

    pub(crate) fn finish(&self) {
        self.finishing.store(true, Ordering::Release);
        let ep = Arc::clone(&self.shared.ep);
        let mut jobs = self.shared.jobs.lock();
        // Without a runtime nothing can be sent; the design fails the streams as it drops.
        // The job keeps the design until what it put is carried: its registered
        // buffers must outlive the endpoint until then (Read's receivers read
        // them from here; a NIC may still be sending from them).
        let _ = self.queue(&mut jobs, false, async move {
            ep.finish().await?;
            ep.flushed().await
        });
    }

    pub(crate) fn fail(&self, message: &str) {
        self.finishing.store(true, Ordering::Release);
        let (ep, message) = (Arc::clone(&self.shared.ep), message.to_string());
        let mut jobs = self.shared.jobs.lock();
        let _ = self.queue(&mut jobs, true, async move { ep.fail(&message).await });
    }

    /// As a TCP endpoint's: its markers count as sent once handed on, even
    /// to a receiver that has not opened yet (which operators rely on: a
    /// receiver may open only after its sender's task went on). A design
    /// cannot carry anything before its streams connect, so an endpoint not
    /// connected yet has put nothing, and its queued end (waiting for the
    /// receivers) is all there is: it goes on in the background, until the
    /// receivers come or the query is released.
    pub(crate) async fn flushed(&self) {
        if !self.shared.ep.is_connected() {
            return;
        }
        let _ = self.settle().await;
        let _ = self.shared.ep.flushed().await;
    }

    pub(crate) fn stats(&self) -> SendEndpointStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let credit_wait = self.shared.ep.credit_wait();
        let acquire = Duration::from_nanos(l(&self.acquire_wait_ns));
        SendEndpointStats {
            messages: l(&self.messages),
            bytes: l(&self.bytes),
            oversize: l(&self.oversize),
            credit_wait,
            acquire_wait: acquire.saturating_sub(credit_wait),
        }
    }
}

impl Drop for DesignSending {
    fn drop(&mut self) {
        if !self.finishing.load(Ordering::Acquire) {
            // Cancelled: what is queued goes, and the design fails the streams.
            for job in self.shared.jobs.lock().running.drain(..) {
                job.abort();
            }
            if let Some(c) = &self.connecting {
                c.abort();
            }
        }
    }
}

/// Where a received message's bytes are.
enum Body {
    /// In the endpoint's registered buffer, until released.
    Held(Arc<DesignReceive>, Option<Arrival>),
    /// Joined from several messages, or kept aside until its turn.
    Owned(Bytes),
}

/// A message taken from a [`DesignReceiving`]; dropping it releases it.
pub(crate) struct DesignReceived {
    pub(crate) source: usize,
    pub(crate) slot: u32,
    pub(crate) node: NodeId,
    pub(crate) last: bool,
    body: Body,
}

impl std::fmt::Debug for DesignReceived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesignReceived")
            .field("source", &self.source)
            .field("last", &self.last)
            .field("len", &self.data().len())
            .finish()
    }
}

impl DesignReceived {
    pub(crate) fn data(&self) -> &[u8] {
        match &self.body {
            Body::Held(ep, Some(r)) => ep.data(r),
            Body::Held(_, None) => &[],
            Body::Owned(b) => b,
        }
    }

    pub(crate) fn bytes(&self) -> Bytes {
        match &self.body {
            Body::Owned(b) => b.clone(),
            Body::Held(..) => Bytes::copy_from_slice(self.data()),
        }
    }
}

impl Drop for DesignReceived {
    fn drop(&mut self) {
        if let Body::Held(ep, r) = &mut self.body
            && let Some(r) = r.take()
        {
            // An error here is the endpoint's, and its next `get` returns it.
            let _ = ep.release(r);
        }
    }
}

/// A message kept aside (datagrams out of order).
struct Piece {
    data: Vec<u8>,
    more: bool,
    closes: bool,
}

/// Per stream: the next message in order, those that came early, and the
/// parts of a cut message so far.
#[derive(Default)]
struct Order {
    next: u64,
    early: BTreeMap<u64, Piece>,
    partial: Vec<u8>,
}

impl Order {
    /// Keeps message `seq`, which came before its turn.
    fn stash(&mut self, seq: u64, piece: Piece) -> Result<(), String> {
        if seq < self.next || self.early.contains_key(&seq) || self.early.len() >= MAX_EARLY {
            return Err(format!(
                "message {seq} while waiting for message {}",
                self.next
            ));
        }
        self.early.insert(seq, piece);
        Ok(())
    }

    /// The message kept aside whose turn it is, if any.
    fn take_next(&mut self) -> Option<Piece> {
        let piece = self.early.remove(&self.next)?;
        self.next += 1;
        Some(piece)
    }

    /// Adds the next piece of a message; the message and whether it is the
    /// stream's last, once whole.
    fn join(
        &mut self,
        data: &[u8],
        more: bool,
        closes: bool,
    ) -> Result<Option<(Bytes, bool)>, String> {
        if self.partial.len() + data.len() > MAX_MESSAGE {
            return Err(format!("a message of more than {MAX_MESSAGE} bytes"));
        }
        self.partial.extend_from_slice(data);
        match (more, closes) {
            (true, true) => Err("its last message is cut short".into()),
            (true, false) => Ok(None),
            (false, _) => Ok(Some((
                Bytes::from(std::mem::take(&mut self.partial)),
                closes,
            ))),
        }
    }

    /// Whether the stream ended inside a message or before one that came early.
    fn unfinished(&self) -> bool {
        !self.early.is_empty() || !self.partial.is_empty()
    }
}

/// The consuming side of an exchange over a verbs design (see the module doc).
pub(crate) struct DesignReceiving {
    ep: Arc<DesignReceive>,
    traffic: Arc<Traffic>,
    /// This node (its own messages are not traffic).
    me: NodeId,
    /// Streams deliver in order (all but datagram designs).
    in_order: bool,
    /// (slot, node) of every source.
    sources: Vec<(u32, NodeId)>,
    order: tokio::sync::Mutex<Vec<Order>>,
    messages: AtomicU64,
    bytes: AtomicU64,
    wait_ns: AtomicU64,
}

impl std::fmt::Debug for DesignReceiving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesignReceiving")
            .field("sources", &self.sources)
            .finish()
    }
}

impl DesignReceiving {
    pub(crate) fn new(
        ep: DesignReceive,
        in_order: bool,
        sources: Vec<(u32, NodeId)>,
        traffic: Arc<Traffic>,
        me: NodeId,
    ) -> Self {
        let n = sources.len();
        Self {
            ep: Arc::new(ep),
            traffic,
            me,
            in_order,
            sources,
            order: tokio::sync::Mutex::new((0..n).map(|_| Order::default()).collect()),
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn queued_bytes(&self) -> usize {
        0
    }

    pub(crate) fn remaining(&self) -> usize {
        self.ep.remaining()
    }

    fn broken(&self, source: usize, why: String) -> TransportError {
        let (slot, node) = self.sources[source];
        TransportError::PeerLost {
            peer: node,
            reason: format!("the stream from slot {slot}: {why}"),
        }
    }

    fn received(&self, source: usize, last: bool, body: Body) -> DesignReceived {
        let (slot, node) = self.sources[source];
        let r = DesignReceived {
            source,
            slot,
            node,
            last,
            body,
        };
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.bytes
            .fetch_add(r.data().len() as u64, Ordering::Relaxed);
        if node != self.me {
            let t = &self.traffic;
            t.messages_received.fetch_add(1, Ordering::Relaxed);
            t.bytes_received
                .fetch_add(r.data().len() as u64, Ordering::Relaxed);
        }
        r
    }

    /// Adds a piece of stream `source`'s next message; the message once whole.
    fn join(
        &self,
        order: &mut Order,
        source: usize,
        data: &[u8],
        more: bool,
        closes: bool,
    ) -> Result<Option<DesignReceived>, TransportError> {
        let whole = order
            .join(data, more, closes)
            .map_err(|why| self.broken(source, why))?;
        Ok(whole.map(|(bytes, last)| self.received(source, last, Body::Owned(bytes))))
    }

    pub(crate) async fn get(&self) -> Result<Option<DesignReceived>, TransportError> {
        let mut orders = self.order.lock().await;
        let started = Instant::now();
        let res = self.next(&mut orders).await;
        self.wait_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        res
    }

    async fn next(&self, orders: &mut [Order]) -> Result<Option<DesignReceived>, TransportError> {
        loop {
            // A message kept aside whose turn it is.
            if let Some((s, piece)) = orders
                .iter_mut()
                .enumerate()
                .find_map(|(s, o)| o.take_next().map(|p| (s, p)))
            {
                match self.join(&mut orders[s], s, &piece.data, piece.more, piece.closes)? {
                    Some(r) => return Ok(Some(r)),
                    None => continue,
                }
            }
            let Some(a) = self.ep.get().await? else {
                if let Some(s) = orders.iter().position(Order::unfinished) {
                    return Err(self.broken(s, "it ended inside a message".into()));
                }
                return Ok(None);
            };
            let s = a.source;
            let o = &mut orders[s];
            if !self.in_order && a.seq != o.next {
                let (seq, piece) = (
                    a.seq,
                    Piece {
                        data: self.ep.data(&a).to_vec(),
                        more: a.more,
                        closes: a.closes,
                    },
                );
                self.ep.release(a)?;
                o.stash(seq, piece).map_err(|why| self.broken(s, why))?;
                continue;
            }
            o.next += 1;
            if a.more || !o.partial.is_empty() {
                let joined = self.join(o, s, self.ep.data(&a), a.more, a.closes);
                self.ep.release(a)?;
                match joined? {
                    Some(r) => return Ok(Some(r)),
                    None => continue,
                }
            }
            let last = a.closes;
            return Ok(Some(self.received(
                s,
                last,
                Body::Held(Arc::clone(&self.ep), Some(a)),
            )));
        }
    }

    pub(crate) fn stats(&self) -> ReceiveEndpointStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReceiveEndpointStats {
            messages: l(&self.messages),
            bytes: l(&self.bytes),
            wait: Duration::from_nanos(l(&self.wait_ns)),
        }
    }
}

impl Drop for DesignReceiving {
    /// As a TCP endpoint's streams do once nobody reads them, the streams go
    /// on being taken and discarded until they end: their senders, which
    /// would otherwise wait for credit that never comes, finish. Operators
    /// drop a receiver early when they need no more of its rows (a join whose
    /// build side is empty never reads its probe side).
    fn drop(&mut self) {
        if self.ep.remaining() == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // nothing can run the endpoint: its senders time out
        };
        let ep = Arc::clone(&self.ep);
        runtime.spawn(async move {
            // Ends with the streams, or with the error a failed or lost sender
            // or the design's timeout brings.
            while let Ok(Some(a)) = ep.get().await {
                if ep.release(a).is_err() {
                    break;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(data: &[u8], more: bool, closes: bool) -> Piece {
        Piece {
            data: data.to_vec(),
            more,
            closes,
        }
    }

    /// What a stream delivers when its messages arrive in `arrivals` order
    /// (sequence number, piece), as the receiving endpoint runs it.
    fn deliver(arrivals: Vec<(u64, Piece)>) -> Result<Vec<(Vec<u8>, bool)>, String> {
        let mut o = Order::default();
        let mut out = vec![];
        let mut take = |o: &mut Order, p: Piece| -> Result<(), String> {
            if let Some((b, last)) = o.join(&p.data, p.more, p.closes)? {
                out.push((b.to_vec(), last));
            }
            Ok(())
        };
        for (seq, p) in arrivals {
            if seq != o.next {
                o.stash(seq, p)?;
                continue;
            }
            o.next += 1;
            take(&mut o, p)?;
            while let Some(p) = o.take_next() {
                take(&mut o, p)?;
            }
        }
        if o.unfinished() {
            return Err("unfinished".into());
        }
        Ok(out)
    }

    #[test]
    fn datagrams_out_of_order_come_out_whole_and_in_order() {
        // Messages: "ab" + "cd" (cut in two), "e", then the last "fg" + "h".
        let pieces = [
            piece(b"ab", true, false),
            piece(b"cd", false, false),
            piece(b"e", false, false),
            piece(b"fg", true, false),
            piece(b"h", false, true),
        ];
        let want = vec![
            (b"abcd".to_vec(), false),
            (b"e".to_vec(), false),
            (b"fgh".to_vec(), true),
        ];
        for order in [
            [0, 1, 2, 3, 4],
            [4, 3, 2, 1, 0],
            [1, 0, 3, 2, 4],
            [2, 4, 0, 3, 1],
        ] {
            let arrivals = order
                .iter()
                .map(|&i| {
                    let p = &pieces[i];
                    (i as u64, piece(&p.data, p.more, p.closes))
                })
                .collect();
            assert_eq!(deliver(arrivals).unwrap(), want, "arrival order {order:?}");
        }
    }

    #[test]
    fn a_stream_that_repeats_or_cuts_short_is_refused() {
        let twice = vec![
            (1, piece(b"b", false, false)),
            (1, piece(b"b", false, false)),
        ];
        assert!(deliver(twice).unwrap_err().contains("message 1"));
        let stale = vec![
            (0, piece(b"a", false, false)),
            (0, piece(b"a", false, false)),
        ];
        assert!(
            deliver(stale)
                .unwrap_err()
                .contains("waiting for message 1")
        );
        let cut_last = vec![(0, piece(b"a", true, true))];
        assert!(deliver(cut_last).unwrap_err().contains("cut short"));
        let gap = vec![
            (0, piece(b"a", false, false)),
            (2, piece(b"c", false, true)),
        ];
        assert_eq!(deliver(gap).unwrap_err(), "unfinished");
        let mut big = Order::default();
        let chunk = vec![0u8; MAX_MESSAGE / 2 + 1];
        assert!(big.join(&chunk, true, false).unwrap().is_none());
        assert!(
            big.join(&chunk, false, false)
                .unwrap_err()
                .contains("more than")
        );
    }
}
