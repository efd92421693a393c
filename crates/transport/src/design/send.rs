//! The sending endpoint of the verbs designs: credits, registered buffers and,
//! per [`Primitive`], how a filled buffer reaches its destinations.
//!
//! States of a stream: connecting (offer made, waiting for the receiver's),
//! open (credits or buffers flow), finished (last message or marker sent),
//! failed (a completion error or a lost peer; every later call errs).

use super::message::{
    DROPPED, DesignConfig, ENTRY, FLAG_ERROR, FLAG_LAST, FLAG_MORE, FLAG_STARVED, HEADER,
    Primitive, carrier_err, free_entry, header, lost, write_imm,
};
use super::{Connector, Offer, Side, handshake};
use crate::endpoint::{Destinations, To};
use crate::frame::StreamKey;
use crate::verbs::{
    Carrier, Completion, CompletionQueue, QpAddr, QpKind, QueuePair, RecvWr, Region, RemoteRegion,
    SendOp, SendWr, WcOp, WcStatus,
};
use crate::{NodeId, TransportError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::OnceCell;

/// A request's id: its stream and buffer, so a completion names both.
fn request_id(stream: usize, buffer: u32) -> u64 {
    (stream as u64) << 32 | buffer as u64
}

fn request_stream(id: u64) -> usize {
    (id >> 32) as usize
}

fn request_buffer(id: u64) -> usize {
    (id & 0xffff_ffff) as usize
}

/// What a post carries.
#[derive(Clone, Copy)]
enum Post {
    /// A buffer of data, the stream's last if `last`.
    Data { last: bool },
    /// An end-of-stream or error marker (its stream already counts as ended).
    Marker,
}

/// The part of a sender's state one stream needs.
struct OutLink {
    dest: NodeId,
    key: StreamKey,
    qp: Arc<dyn QueuePair>,
    /// The receiver's datagram queue pair (datagram designs).
    to_datagrams: OnceLock<QpAddr>,
    /// Where this stream's data (Write: the receiver's buffers) or notices
    /// (Read: its valid queue) land at the receiver, once connected.
    remote: OnceLock<(RemoteRegion, u64)>,
    /// Credits taken.
    sent: AtomicU64,
    /// Read: buffers the receiver said it read; with the window, the stream's
    /// credit (so one slow destination cannot hold every send buffer).
    released: AtomicU64,
    /// Credits taken by reservations dropped unsent, with the receiver buffer
    /// each named (Write): taken again before new ones.
    spare: Mutex<Vec<u32>>,
    /// Sequence number of the next message, held while it is posted so that
    /// threads sharing the endpoint (SE) post a stream's messages in order.
    seq: Mutex<u64>,
    finished: AtomicBool,
}

struct SendState {
    free: Vec<usize>,
    /// Destinations each buffer still waits for (completions, or Read's release notices).
    pending: Vec<u32>,
    error: Option<TransportError>,
}

/// Reservations dropped without being put: their buffers and credits go back.
type Returns = Arc<Mutex<Vec<(usize, Vec<(usize, u32)>)>>>;

/// A registered buffer reserved for some destinations (their credits are taken).
/// Dropping it unsent gives both back.
pub struct DesignBuffer {
    index: usize,
    len: usize,
    /// Whether a credit of it had to be waited for (an adaptive receiver
    /// lends the stream a buffer more).
    starved: bool,
    /// The message continues in the streams' next one.
    more: bool,
    /// Streams and, for Write, the receiver buffer each credit named.
    targets: Vec<(usize, u32)>,
    cap: usize,
    ptr: *mut u8,
    /// Keeps the bytes `ptr` points into registered while the reservation lives.
    _region: Arc<Region>,
    returns: Returns,
    put: bool,
}

impl Drop for DesignBuffer {
    fn drop(&mut self) {
        if !self.put {
            let targets = std::mem::take(&mut self.targets);
            self.returns.lock().push((self.index, targets));
        }
    }
}

// SAFETY: the buffer's bytes belong to this reservation until it is put or dropped.
unsafe impl Send for DesignBuffer {}
// SAFETY: a shared reference reads only the reservation's own fields; its bytes
// are written through `&mut self` alone.
unsafe impl Sync for DesignBuffer {}

impl std::fmt::Debug for DesignBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesignBuffer")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("targets", &self.targets)
            .finish()
    }
}

impl DesignBuffer {
    /// Payload bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Payload bytes the buffer holds at most.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Marks the message as continued by the streams' next one (which the
    /// receiver sees as [`super::Received::more`]): a message larger than a
    /// buffer goes as several. Not for a last message.
    pub fn set_more(&mut self, more: bool) {
        self.more = more;
    }

    /// The payload written so far.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: this reservation's bytes after the header, written up to `len`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(HEADER), self.len) }
    }

    /// Appends `bytes`; false (and nothing written) if they do not fit.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() > self.cap - self.len {
            return false;
        }
        // SAFETY: inside this reservation's buffer, after its header.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.add(HEADER + self.len),
                bytes.len(),
            )
        };
        self.len += bytes.len();
        true
    }
}

/// The producing side of an exchange over a verbs design.
pub struct DesignSend {
    carrier: Arc<dyn Carrier>,
    connector: Arc<dyn Connector>,
    config: DesignConfig,
    links: Vec<OutLink>,
    dests: Destinations,
    scq: Arc<dyn CompletionQueue>,
    rcq: Arc<dyn CompletionQueue>,
    /// The endpoint's one datagram queue pair (datagram designs).
    pub(super) datagrams: Option<Arc<dyn QueuePair>>,
    /// This endpoint's sender slot.
    from: u32,
    buffers: Arc<Region>,
    /// One slot per destination: its credit count (and Write's free queue),
    /// written by the receiver; or Read's staged valid-queue entries.
    slots: Region,
    state: Mutex<SendState>,
    returns: Returns,
    connected: OnceCell<()>,
    credit_wait_ns: AtomicU64,
}

impl DesignSend {
    /// Opens streams `(query, exchange, from, d)` to every destination `d`.
    pub fn open(
        carrier: Arc<dyn Carrier>,
        connector: Arc<dyn Connector>,
        config: DesignConfig,
        spec: crate::SendSpec,
    ) -> Result<Self, TransportError> {
        config.check()?;
        config.check_carrier(&*carrier)?;
        let dests = Destinations::new(&spec)?;
        let n = dests.nodes().len();
        if config.notify_recvs() as usize > carrier.recv_depth() {
            return Err(TransportError::Misuse(format!(
                "{} receives per stream for the receiver's credit writes (a window of up to \
                 {}) exceed the carrier's receive depth of {}",
                config.notify_recvs(),
                config.adaptive.unwrap_or(config.window),
                carrier.recv_depth()
            )));
        }
        let depth = (config.send_buffers * n + 64).next_power_of_two();
        let scq = carrier.create_cq(depth).map_err(carrier_err)?;
        let rcq = carrier
            .create_cq((config.notify_recvs() as usize * n * 2).next_power_of_two())
            .map_err(carrier_err)?;
        let datagrams = match config.primitive {
            Primitive::Datagram => Some(
                carrier
                    .create_qp(QpKind::Ud, &scq, &rcq)
                    .map_err(carrier_err)?,
            ),
            _ => None,
        };
        let mut links = Vec::with_capacity(n);
        for &dest in dests.nodes() {
            let qp = carrier
                .create_qp(QpKind::Rc, &scq, &rcq)
                .map_err(carrier_err)?;
            for i in 0..config.notify_recvs() {
                qp.post_recv(RecvWr { id: i, local: None })
                    .map_err(carrier_err)?;
            }
            links.push(OutLink {
                dest,
                key: StreamKey {
                    query: spec.query,
                    exchange: spec.exchange,
                    from: spec.from,
                    to: dest,
                },
                qp,
                to_datagrams: OnceLock::new(),
                remote: OnceLock::new(),
                sent: AtomicU64::new(0),
                released: AtomicU64::new(0),
                spare: Mutex::new(Vec::new()),
                seq: Mutex::new(0),
                finished: AtomicBool::new(false),
            });
        }
        let buffers = Arc::new(
            carrier
                // One more than the pool: the reserve a dropped endpoint's error marker uses.
                .register((config.send_buffers + 1) * config.message_size)
                .map_err(carrier_err)?,
        );
        let slots = carrier.register(n * config.slot()).map_err(carrier_err)?;
        // SAFETY: nothing writes the fresh slots yet.
        unsafe { slots.slice_mut(0, n * config.slot()) }.fill(0);
        Ok(Self {
            state: Mutex::new(SendState {
                free: (0..config.send_buffers).rev().collect(),
                pending: vec![0; config.send_buffers],
                error: None,
            }),
            carrier,
            connector,
            config,
            links,
            dests,
            scq,
            rcq,
            datagrams,
            from: spec.from,
            buffers,
            slots,
            returns: Returns::default(),
            connected: OnceCell::new(),
            credit_wait_ns: AtomicU64::new(0),
        })
    }

    pub fn destinations(&self) -> &[NodeId] {
        self.dests.nodes()
    }

    /// How many destinations other than this node `to` names.
    pub fn remote_targets(&self, to: To) -> usize {
        let me = self.carrier.node();
        self.dests.targets(to).map_or(0, |t| {
            t.iter().filter(|&&i| self.dests.nodes()[i] != me).count()
        })
    }

    /// Payload bytes a message holds at most.
    pub fn message_size(&self) -> usize {
        self.config.payload()
    }

    /// Queue pairs and registered bytes this endpoint holds.
    pub fn footprint(&self) -> super::Footprint {
        super::Footprint {
            queue_pairs: (self.links.len() + self.datagrams.iter().len()) as u64,
            registered_bytes: (self.buffers.len() + self.slots.len()) as u64,
        }
    }

    /// Whether every stream is connected (nothing can be put before).
    pub fn is_connected(&self) -> bool {
        self.connected.initialized()
    }

    /// Time spent waiting for credits.
    pub fn credit_wait(&self) -> Duration {
        Duration::from_nanos(self.credit_wait_ns.load(Ordering::Relaxed))
    }

    /// Connects every stream now rather than at the first acquire (waits for
    /// every receiver to open).
    pub async fn connect(&self) -> Result<(), TransportError> {
        self.connected
            .get_or_try_init(|| self.connect_all())
            .await
            .map(|_| ())
    }

    async fn connect_all(&self) -> Result<(), TransportError> {
        let node = self.carrier.node();
        let primitive = self.config.primitive;
        let meets = self.links.iter().enumerate().map(|(i, l)| {
            // The receiver writes credits into our slot, or (Read) reads our buffers.
            let (region, offset) = match primitive {
                Primitive::Read => (self.buffers.remote(node), 0),
                _ => (self.slots.remote(node), (i * self.config.slot()) as u64),
            };
            let offer = Offer {
                qp: l.qp.addr(),
                region: Some(region),
                offset,
                datagrams: self.datagrams.as_ref().map(|q| q.addr()),
                terms: self.config.terms(),
            };
            let connector = Arc::clone(&self.connector);
            let timeout = self.config.timeout;
            async move {
                handshake(
                    &*connector,
                    l.key,
                    Side::Sender,
                    l.dest,
                    offer,
                    timeout,
                    |theirs| {
                        match primitive {
                            Primitive::Datagram => {
                                let Some(to) = theirs.datagrams.filter(|q| q.node == l.dest) else {
                                    return Err(lost(
                                        l.dest,
                                        "its offer names no datagram queue pair",
                                    ));
                                };
                                let _ = l.to_datagrams.set(to);
                            }
                            Primitive::Read | Primitive::Write => {
                                let Some(region) = theirs.region.filter(|r| r.node == l.dest)
                                else {
                                    return Err(lost(l.dest, "its offer names no region"));
                                };
                                let _ = l.remote.set((region, theirs.offset));
                            }
                            Primitive::Send => {}
                        }
                        l.qp.connect(theirs.qp).map_err(carrier_err)
                    },
                )
                .await
                .map(|_| ())
            }
        });
        for r in futures::future::join_all(meets).await {
            r?;
        }
        Ok(())
    }

    /// The credit count of stream `t`, as its receiver last wrote it (Read:
    /// the window plus the buffers it read).
    fn credit_of(&self, t: usize) -> u64 {
        if self.config.primitive == Primitive::Read {
            let released = self.links[t].released.load(Ordering::Acquire);
            return self.config.window as u64 + released;
        }
        let at = t * self.config.slot() + self.config.count_at();
        // SAFETY: the count is 8-aligned inside the slot region; receivers write
        // it whole, and an atomic load reads either the old or the new count.
        let p = unsafe { self.slots.slice(at, 8) }.as_ptr() as *const AtomicU64;
        unsafe { &*p }.load(Ordering::Acquire)
    }

    /// The receiver buffer Write credit number `credit` of stream `t` names: entry
    /// `credit` of the free queue the receiver writes with its counts. `None`
    /// while the entry is not there yet: it carries its credit's number, since
    /// nothing orders the bytes of one write before the count's.
    fn freed_buffer(&self, t: usize, credit: u64) -> Option<Result<u32, TransportError>> {
        let window = self.config.window as u64;
        let at = t * self.config.slot() + 4 * (credit % window) as usize;
        // SAFETY: an aligned word inside the stream's slot, read whole.
        let p = unsafe { self.slots.slice(at, 4) }.as_ptr() as *const AtomicU32;
        let (tag, buffer) = free_entry(unsafe { &*p }.load(Ordering::Acquire));
        if tag != credit as u16 {
            return None;
        }
        if buffer as u64 >= window {
            return Some(Err(lost(
                self.links[t].dest,
                format!("it credited buffer {buffer} of a window of {window}"),
            )));
        }
        Some(Ok(buffer))
    }

    /// Gives credits taken but not used back to their streams.
    fn spare(&self, targets: &[(usize, u32)]) {
        for &(t, buffer) in targets {
            self.links[t].spare.lock().push(buffer);
        }
    }

    /// Moves reservations dropped unsent back: their credits to the streams'
    /// spares, their buffers to the free list. Returns whether there were any.
    fn take_returns(&self) -> bool {
        let returned = std::mem::take(&mut *self.returns.lock());
        for (index, targets) in &returned {
            self.spare(targets);
            self.state.lock().free.push(*index);
        }
        !returned.is_empty()
    }

    /// Moves completions: frees carried buffers, re-posts notification
    /// receives, notes errors. Returns whether there were any.
    fn reap(&self) -> bool {
        let returned = self.take_returns();
        let mut out: Vec<Completion> = Vec::new();
        self.scq.poll(&mut out, 256);
        self.rcq.poll(&mut out, 256);
        if out.is_empty() {
            return returned;
        }
        let mut st = self.state.lock();
        let carried = |st: &mut SendState, i: usize| {
            if i < st.pending.len() && st.pending[i] > 0 {
                st.pending[i] -= 1;
                if st.pending[i] == 0 {
                    st.free.push(i);
                }
            }
        };
        for c in out {
            let sent = matches!(c.op, WcOp::Send | WcOp::Write);
            // Our requests name their stream and buffer; notices come from the stream.
            let link = match sent {
                true => self.links.get(request_stream(c.id)),
                false => c
                    .src
                    .and_then(|s| self.links.iter().find(|l| l.dest == s.node)),
            };
            if c.status != WcStatus::Success {
                let peer = link.map_or(0, |l| l.dest);
                st.error
                    .get_or_insert(lost(peer, format!("a request ended with {:?}", c.status)));
                if sent {
                    carried(&mut st, request_buffer(c.id));
                }
                continue;
            }
            match (c.op, self.config.primitive) {
                (WcOp::Send | WcOp::Write, _) => carried(&mut st, request_buffer(c.id)),
                (WcOp::RecvWriteImm, Primitive::Read) => {
                    // A receiver read a buffer: its immediate names which.
                    if let Some(l) = link {
                        let _ = l.qp.post_recv(RecvWr {
                            id: c.id,
                            local: None,
                        });
                        l.released.fetch_add(1, Ordering::AcqRel);
                        carried(&mut st, c.imm.unwrap_or(u32::MAX) as usize);
                    }
                }
                (WcOp::RecvWriteImm, _) => {
                    // A credit update (its count is in the slot already).
                    if let Some(l) = link.filter(|l| !l.finished.load(Ordering::Relaxed)) {
                        let _ = l.qp.post_recv(RecvWr {
                            id: c.id,
                            local: None,
                        });
                    }
                }
                _ => {}
            }
        }
        true
    }

    fn error(&self) -> Option<TransportError> {
        self.state.lock().error.clone()
    }

    /// Waits for completions on either queue, at most the configured timeout;
    /// false after a timeout.
    async fn wait(&self) -> bool {
        let a = self.scq.events().notified();
        let b = self.rcq.events().notified();
        tokio::pin!(a, b);
        a.as_mut().enable();
        b.as_mut().enable();
        // Anything that arrived before the futures were enabled.
        if self.reap() {
            return true;
        }
        let wait = async {
            tokio::select! {
                _ = &mut a => {},
                _ = &mut b => {},
            }
        };
        // Credits are plain slot writes plus a notification, so look at the slots
        // now and then too.
        tokio::time::timeout(Duration::from_millis(20), wait)
            .await
            .is_ok()
    }

    /// Takes a credit of stream `t`; returns the receiver buffer it names
    /// (Write) and whether the credit had to be waited for.
    async fn take_credit(&self, t: usize) -> Result<(u32, bool), TransportError> {
        let l = &self.links[t];
        let start = std::time::Instant::now();
        let mut last_progress = start;
        let mut waited = false;
        loop {
            self.take_returns();
            if let Some(buffer) = l.spare.lock().pop() {
                return Ok((buffer, waited));
            }
            let sent = l.sent.load(Ordering::Acquire);
            if self.credit_of(t) > sent {
                // Read the credit's free-queue entry before taking it: while `sent`
                // stays put no message beyond it can be released, so the entry
                // cannot be rewritten before the swap succeeds.
                let buffer = match self.config.primitive {
                    Primitive::Write => match self.freed_buffer(t, sent) {
                        Some(b) => b,
                        None => {
                            // The count arrived before its entry: the write is landing.
                            tokio::task::yield_now().await;
                            continue;
                        }
                    },
                    _ => Ok(0),
                };
                if l.sent
                    .compare_exchange(sent, sent + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.credit_wait_ns
                        .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    return buffer.map(|b| (b, waited));
                }
                continue;
            }
            self.reap();
            if let Some(e) = self.error() {
                return Err(e);
            }
            waited = true;
            if self.wait().await {
                last_progress = std::time::Instant::now();
            } else if !self.carrier.is_alive(l.dest) {
                return Err(lost(l.dest, "its process is gone"));
            } else if last_progress.elapsed() > self.config.timeout {
                return Err(lost(
                    l.dest,
                    format!(
                        "no credit for stream {} in {:?}",
                        l.key, self.config.timeout
                    ),
                ));
            }
        }
    }

    /// Waits for a buffer of the pool to come back, at most the timeout
    /// without any progress.
    async fn take_buffer(&self) -> Result<usize, TransportError> {
        let mut last_progress = std::time::Instant::now();
        loop {
            self.reap();
            if let Some(e) = self.error() {
                return Err(e);
            }
            if let Some(index) = self.state.lock().free.pop() {
                return Ok(index);
            }
            if self.wait().await {
                last_progress = std::time::Instant::now();
            } else if last_progress.elapsed() > self.config.timeout {
                return Err(self.stuck("no send buffer came back"));
            }
        }
    }

    /// Why waiting for buffers to come back gave up.
    fn stuck(&self, what: &str) -> TransportError {
        let dest = self.links.first().map_or(0, |l| l.dest);
        lost(
            dest,
            format!(
                "{what} in {:?}: every one of the {} is reserved or not yet carried \
                 to (or, for Read, read by) its destinations",
                self.config.timeout, self.config.send_buffers
            ),
        )
    }

    /// Reserves a credit on every stream `to` names, then a registered buffer.
    pub async fn acquire(&self, to: To) -> Result<DesignBuffer, TransportError> {
        self.connect().await?;
        let streams = self.dests.targets(to)?;
        if streams.is_empty() {
            return Err(TransportError::Misuse(format!(
                "{to:?} names no destination"
            )));
        }
        if let Some(&t) = streams
            .iter()
            .find(|&&t| self.links[t].finished.load(Ordering::Acquire))
        {
            return Err(TransportError::Misuse(format!(
                "stream {} already sent its last message",
                self.links[t].key
            )));
        }
        let mut targets = Vec::with_capacity(streams.len());
        let mut starved = false;
        for &t in &streams {
            match self.take_credit(t).await {
                Ok((buffer, waited)) => {
                    starved |= waited;
                    targets.push((t, buffer));
                }
                Err(e) => {
                    self.spare(&targets);
                    return Err(e);
                }
            }
        }
        let index = match self.take_buffer().await {
            Ok(index) => index,
            Err(e) => {
                self.spare(&targets);
                return Err(e);
            }
        };
        let cap = self.config.payload();
        // SAFETY: the buffer is this reservation's until put or dropped.
        let ptr = unsafe {
            self.buffers
                .slice_mut(index * self.config.message_size, self.config.message_size)
        }
        .as_mut_ptr();
        Ok(DesignBuffer {
            index,
            len: 0,
            starved,
            more: false,
            targets,
            cap,
            ptr,
            _region: Arc::clone(&self.buffers),
            returns: Arc::clone(&self.returns),
            put: false,
        })
    }

    /// Sends a filled buffer to the destinations it was acquired for; never waits.
    /// A `last` buffer ends its streams.
    pub fn put(&self, mut buf: DesignBuffer, last: bool) -> Result<(), TransportError> {
        if let Some(e) = self.error() {
            return Err(e); // the reservation goes back as it drops
        }
        if buf.len == 0 && !last {
            return Err(TransportError::Misuse("an empty message".into()));
        }
        if buf.more && last {
            return Err(TransportError::Misuse(
                "a last message cannot continue in another".into(),
            ));
        }
        buf.put = true;
        let n = buf.targets.len() as u32;
        self.state.lock().pending[buf.index] = n;
        let mut flags = if last { FLAG_LAST } else { 0 };
        if buf.starved {
            flags |= FLAG_STARVED;
        }
        if buf.more {
            flags |= FLAG_MORE;
        }
        // SAFETY: the header bytes of this reservation's buffer.
        unsafe {
            buf.ptr
                .copy_from_nonoverlapping(header(flags, buf.len, self.from).as_ptr(), HEADER)
        };
        for (k, &(t, buffer)) in buf.targets.iter().enumerate() {
            let posted = self.post_data(
                t,
                buf.index as u32,
                HEADER + buf.len,
                buffer,
                Post::Data { last },
            );
            if let Err(e) = posted {
                // The rest are not sent: their credits and the buffer's share go back.
                let mut st = self.state.lock();
                st.error.get_or_insert(e.clone());
                self.spare(&buf.targets[k..]);
                st.pending[buf.index] -= n - k as u32;
                if st.pending[buf.index] == 0 {
                    st.free.push(buf.index);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Carries bytes `..len` of buffer `index` on stream `t` as its next message:
    /// a send, a write into receiver buffer `into`, or (Read) an entry in the
    /// receiver's valid queue naming the buffer (`DROPPED`: none). Data goes
    /// only to a stream that has not ended (checked under the stream's lock,
    /// against a marker or another task's last message).
    fn post_data(
        &self,
        t: usize,
        index: u32,
        len: usize,
        into: u32,
        post: Post,
    ) -> Result<(), TransportError> {
        let l = &self.links[t];
        let mut seq = l.seq.lock();
        if let Post::Data { last } = post {
            if l.finished.load(Ordering::Acquire) {
                return Err(TransportError::Misuse(format!(
                    "stream {} already ended",
                    l.key
                )));
            }
            if last {
                l.finished.store(true, Ordering::Release);
            }
        }
        let local = self
            .buffers
            .sge(index as usize * self.config.message_size, len);
        let send = |op| SendWr {
            id: request_id(t, index),
            op,
            local,
            dest: None,
            signaled: true,
        };
        let remote = || {
            l.remote
                .get()
                .copied()
                .ok_or_else(|| lost(l.dest, "not connected"))
        };
        let posted = match self.config.primitive {
            Primitive::Send => l.qp.post_send(send(SendOp::Send {
                imm: Some(*seq as u32),
            })),
            Primitive::Datagram => {
                let Some(&to) = l.to_datagrams.get() else {
                    return Err(lost(l.dest, "not connected"));
                };
                let qp = self.datagrams.as_ref().expect("datagram designs have one");
                qp.post_send(SendWr {
                    dest: Some(to),
                    ..send(SendOp::Send {
                        imm: Some(*seq as u32),
                    })
                })
            }
            Primitive::Write => {
                let (region, base) = remote()?;
                let offset = (into as u64)
                    .checked_mul(self.config.message_size as u64)
                    .and_then(|o| o.checked_add(base))
                    .ok_or_else(|| lost(l.dest, "its buffers lie outside any region"))?;
                l.qp.post_send(send(SendOp::Write {
                    remote: region,
                    offset,
                    imm: Some(write_imm(*seq, into)),
                }))
            }
            Primitive::Read => {
                let (region, base) = remote()?;
                let entry = (*seq % self.config.valid_entries() as u64) as usize * ENTRY;
                let offset = base
                    .checked_add(entry as u64)
                    .ok_or_else(|| lost(l.dest, "its valid queue lies outside any region"))?;
                let at = t * self.config.slot() + entry;
                // SAFETY: the stream's staging entry for this sequence number; the
                // carrier copies it at post (a NIC would send it inline).
                let e = unsafe { self.slots.slice_mut(at, ENTRY) };
                e[..4].copy_from_slice(&index.to_le_bytes());
                e[4..].copy_from_slice(&(len as u32).to_le_bytes());
                l.qp.post_send(SendWr {
                    id: request_id(t, index),
                    op: SendOp::Write {
                        remote: region,
                        offset,
                        imm: Some(*seq as u32),
                    },
                    local: self.slots.sge(at, ENTRY),
                    dest: None,
                    // The buffer is free once the receiver says it read it.
                    signaled: false,
                })
            }
        };
        posted.map_err(carrier_err)?;
        *seq += 1;
        Ok(())
    }

    /// Posts `flags | FLAG_LAST` with `text` from buffer `index` to each stream of
    /// `streams`, as their next message (into the receiver's reserve buffer).
    fn post_marker(
        &self,
        index: usize,
        flags: u32,
        text: &str,
        streams: &[usize],
    ) -> Result<(), TransportError> {
        let body = &text.as_bytes()[..text.len().min(self.config.payload())];
        let off = index * self.config.message_size;
        // SAFETY: a buffer no request reads: taken from the free list, or the reserve.
        unsafe { self.buffers.slice_mut(off + HEADER, body.len()) }.copy_from_slice(body);
        // SAFETY: as above.
        unsafe { self.buffers.slice_mut(off, HEADER) }.copy_from_slice(&header(
            flags | FLAG_LAST,
            body.len(),
            self.from,
        ));
        for &t in streams {
            self.post_data(
                t,
                index as u32,
                HEADER + body.len(),
                self.config.window,
                Post::Marker,
            )?;
        }
        Ok(())
    }

    /// Sends a marker (end of stream or error) to every unfinished stream; markers
    /// need no credit (each stream's receiver keeps one buffer in reserve).
    async fn mark(&self, flags: u32, text: &str) -> Result<(), TransportError> {
        self.connect().await?;
        if self
            .links
            .iter()
            .all(|l| l.finished.load(Ordering::Acquire))
        {
            return Ok(());
        }
        // The buffer first: streams count as ended only once their marker goes.
        let index = self.take_buffer().await?;
        let unfinished: Vec<usize> = (0..self.links.len())
            .filter(|&t| {
                let _order = self.links[t].seq.lock();
                !self.links[t].finished.swap(true, Ordering::AcqRel)
            })
            .collect();
        let mut st = self.state.lock();
        if unfinished.is_empty() {
            st.free.push(index);
            return Ok(());
        }
        st.pending[index] = unfinished.len() as u32;
        drop(st);
        self.post_marker(index, flags, text, &unfinished)
    }

    /// Ends every stream that has not sent its last message yet.
    pub async fn finish(&self) -> Result<(), TransportError> {
        self.mark(0, "").await
    }

    /// Fails every unfinished stream: its receiver gets `message` as an error.
    pub async fn fail(&self, message: &str) -> Result<(), TransportError> {
        self.mark(FLAG_ERROR, message).await
    }

    /// Waits until every buffer put so far has been carried (its completions
    /// seen; for Read, every receiver has read it).
    pub async fn flushed(&self) -> Result<(), TransportError> {
        let mut last_progress = std::time::Instant::now();
        loop {
            self.reap();
            if let Some(e) = self.error() {
                return Err(e);
            }
            if self.state.lock().pending.iter().all(|p| *p == 0) {
                return Ok(());
            }
            if self.wait().await {
                last_progress = std::time::Instant::now();
            } else if last_progress.elapsed() > self.config.timeout {
                return Err(self.stuck("the buffers put did not all come back"));
            }
        }
    }
}

impl Drop for DesignSend {
    /// Streams not finished fail at their receivers (as a dropped TCP endpoint's
    /// do) instead of leaving them waiting: an error marker from the reserve
    /// buffer, or for Read (whose receivers could no longer read it) a
    /// valid-queue entry naming no buffer; a Read sender's messages not read
    /// yet go with it, so it is flushed first. The shared-memory carrier copies
    /// at post; a NIC's carrier must keep the region registered until the
    /// requests complete.
    fn drop(&mut self) {
        if self.connected.get().is_none() {
            return; // the receivers' handshakes time out
        }
        let unfinished: Vec<usize> = (0..self.links.len())
            .filter(|&t| !self.links[t].finished.swap(true, Ordering::AcqRel))
            .collect();
        if unfinished.is_empty() {
            return;
        }
        if self.config.primitive == Primitive::Read {
            for t in unfinished {
                let _ = self.post_data(t, DROPPED, 0, 0, Post::Marker);
            }
        } else {
            let _ = self.post_marker(
                self.config.send_buffers,
                FLAG_ERROR,
                "the sending endpoint was dropped before it finished",
                &unfinished,
            );
        }
    }
}
