//! Send/receive: the paper's MEMQ/SR and SEMQ/SR over reliable connections
//! (section 5.2, Algorithm 3) and, with [`SrConfig::datagrams`], MESQ/SR and
//! SESQ/SR over datagrams (section 5.3). The receiver posts `window` receive
//! buffers per stream (plus one kept in reserve for the stream's end-of-stream
//! or error marker), and the sender may send only into posted receives.
//!
//! On reliable connections each stream has a queue pair of its own, which
//! delivers in order. With datagrams, an endpoint's streams share one
//! datagram queue pair (its receives are one pool, sized per stream as
//! above), messages are at most the carrier's datagram size (4 KiB) and may
//! arrive out of order: a stream ends when its last message (whose sequence
//! number gives the stream's count) and all the others have arrived (the
//! paper's message counting); a stream whose messages do not all
//! arrive within the timeout fails. Credits travel the same way for both: a
//! reliable queue pair per stream carries only the receiver's credit writes
//! (the paper's code uses unreliable connections for them).
//!
//! Credits are the paper's stateless ones: the receiver writes into the
//! sender's credit slot the *absolute* number of receives it posted for the
//! stream so far, after every `credit_every` re-posted buffers, so a lost or
//! repeated update does no harm. The write carries the count as its immediate
//! too, which wakes a waiting sender through its completion queue instead of
//! having it spin on the slot (the paper busy-polls; two cores cannot spare
//! one per endpoint). A sender takes a credit with a compare-and-swap of its
//! `sent` counter against the slot (the paper's `attemptToGetCredit`), so one
//! endpoint may be shared by several threads (SE) or used by one (ME): the
//! two designs differ in how many endpoints an operator opens, not here.
//!
//! As in Gyre's TCP endpoints, [`SrSend::acquire`] takes the credits before
//! the buffer and [`SrSend::put`] never waits: a registered buffer is never
//! held while waiting for a slow consumer.
//!
//! Every message starts with a 16-byte header: flags (last, error), the
//! payload length and the sender's slot, the same for every destination of a
//! buffer (a NIC may read it while it goes to several). The stream's sequence
//! number travels as the send's immediate, so a last message also tells how
//! many the stream sent. The receiver checks them all; on a reliable
//! connection the sequence must come in order, so the last flag ends a stream
//! exactly.
//!
//! States of a stream at the sender: connecting (offer made, waiting for the
//! receiver's), open (credits flow), finished (last message or marker sent),
//! failed (a completion error or a lost peer; every later call errs). At the
//! receiver: connecting, open, ended (last arrived), failed.

use super::{Connector, Offer, Side, handshake};
use crate::endpoint::{Destinations, To};
use crate::frame::StreamKey;
use crate::verbs::{
    Carrier, CarrierError, Completion, CompletionQueue, QpKind, QueuePair, RecvWr, Region,
    RemoteRegion, SendOp, SendWr, WcOp, WcStatus,
};
use crate::{NodeId, TransportError};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::OnceCell;

/// Bytes of the header at the start of every message.
pub const HEADER: usize = 16;
const FLAG_LAST: u32 = 1;
const FLAG_ERROR: u32 = 2;
/// Bytes per credit slot (a cache line, as the paper pads them).
const SLOT: usize = 64;
/// Buffer-less receives a sender keeps posted per stream for credit notifications:
/// more than the credit writes a receiver can make before the sender next reaps.
fn notify_recvs(c: &SrConfig) -> u64 {
    (c.window / c.credit_every) as u64 + 4
}

/// Settings of the send/receive designs.
#[derive(Debug, Clone)]
pub struct SrConfig {
    /// Bytes of a registered message buffer, header included (the paper: 64 KiB on RC).
    pub message_size: usize,
    /// Receive buffers posted per stream: the credits a sender starts with.
    pub window: u32,
    /// Re-posted receives between two credit write-backs (the paper's f = 2).
    pub credit_every: u32,
    /// Registered buffers of a send endpoint.
    pub send_buffers: usize,
    /// How long a side waits for its peer to appear or to make progress.
    pub timeout: Duration,
    /// Data over one datagram queue pair per endpoint (MESQ/SR, SESQ/SR)
    /// rather than a reliable one per stream (MEMQ/SR, SEMQ/SR).
    pub datagrams: bool,
}

impl Default for SrConfig {
    fn default() -> Self {
        Self {
            message_size: 64 * 1024,
            window: 8,
            credit_every: 2,
            send_buffers: 16,
            timeout: Duration::from_secs(10),
            datagrams: false,
        }
    }
}

impl SrConfig {
    fn check(&self) -> Result<(), TransportError> {
        let bad = |m: &str| Err(TransportError::Misuse(format!("send/receive design: {m}")));
        if self.message_size <= HEADER {
            return bad("messages must be larger than their header");
        }
        if self.window == 0 || self.credit_every == 0 || self.credit_every > self.window {
            return bad("the credit write-back interval must be between 1 and the window");
        }
        if self.send_buffers == 0 {
            return bad("a send endpoint needs buffers");
        }
        Ok(())
    }

    /// Bytes a message's payload may take.
    pub fn payload(&self) -> usize {
        self.message_size - HEADER
    }
}

/// Datagram designs' messages must fit the carrier's datagrams.
fn check_datagram_size(carrier: &dyn Carrier, config: &SrConfig) -> Result<(), TransportError> {
    let max = carrier.max_message(QpKind::Ud);
    if config.message_size > max {
        return Err(TransportError::Misuse(format!(
            "messages of {} bytes over datagrams of at most {max}",
            config.message_size
        )));
    }
    Ok(())
}

fn carrier_err(e: CarrierError) -> TransportError {
    match e {
        CarrierError::Peer { node, reason } => TransportError::Unreachable { peer: node, reason },
        other => TransportError::Misuse(other.to_string()),
    }
}

fn lost(peer: NodeId, why: impl Into<String>) -> TransportError {
    TransportError::PeerLost {
        peer,
        reason: why.into(),
    }
}

/// A message's header: flags, payload length, sender slot (4 bytes reserved).
fn header(flags: u32, len: usize, from: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&flags.to_le_bytes());
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h[8..12].copy_from_slice(&from.to_le_bytes());
    h
}

fn word(h: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

/// The part of a sender's state one stream needs.
struct OutLink {
    dest: NodeId,
    key: StreamKey,
    qp: Arc<dyn QueuePair>,
    /// The receiver's datagram queue pair (datagram designs).
    to_datagrams: std::sync::OnceLock<crate::verbs::QpAddr>,
    /// Data messages sent (credits taken).
    sent: AtomicU64,
    /// Sequence number of the next message put.
    seq: AtomicU64,
    finished: AtomicBool,
}

struct SendState {
    free: Vec<usize>,
    /// Destinations each buffer still waits for completions from.
    pending: Vec<u32>,
    error: Option<TransportError>,
}

/// Reservations dropped without being put: their buffers and credits go back.
type Returns = Arc<Mutex<Vec<(usize, Vec<usize>)>>>;

/// A registered buffer reserved for some destinations (their credits are taken).
/// Dropping it unsent gives both back.
pub struct SrBuffer {
    index: usize,
    len: usize,
    targets: Vec<usize>,
    cap: usize,
    ptr: *mut u8,
    returns: Returns,
    put: bool,
}

impl Drop for SrBuffer {
    fn drop(&mut self) {
        if !self.put {
            let targets = std::mem::take(&mut self.targets);
            self.returns.lock().push((self.index, targets));
        }
    }
}

// SAFETY: the buffer's bytes belong to this reservation until it is put or dropped.
unsafe impl Send for SrBuffer {}

impl std::fmt::Debug for SrBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrBuffer")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("targets", &self.targets)
            .finish()
    }
}

impl SrBuffer {
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

/// The producing side of an exchange over send/receive on reliable connections.
pub struct SrSend {
    carrier: Arc<dyn Carrier>,
    connector: Arc<dyn Connector>,
    config: SrConfig,
    links: Vec<OutLink>,
    dests: Destinations,
    scq: Arc<dyn CompletionQueue>,
    rcq: Arc<dyn CompletionQueue>,
    /// The endpoint's one datagram queue pair (datagram designs).
    datagrams: Option<Arc<dyn QueuePair>>,
    /// This endpoint's sender slot.
    from: u32,
    buffers: Region,
    /// Credit slots, one per destination, written by the receivers.
    credits: Region,
    state: Mutex<SendState>,
    returns: Returns,
    connected: OnceCell<()>,
    credit_wait_ns: AtomicU64,
}

impl SrSend {
    /// Opens streams `(query, exchange, from, d)` to every destination `d`.
    pub fn open(
        carrier: Arc<dyn Carrier>,
        connector: Arc<dyn Connector>,
        config: SrConfig,
        spec: crate::SendSpec,
    ) -> Result<Self, TransportError> {
        config.check()?;
        let dests = Destinations::new(&spec)?;
        let n = dests.nodes().len();
        let depth = (config.send_buffers * n + 64).next_power_of_two();
        let scq = carrier.create_cq(depth).map_err(carrier_err)?;
        let rcq = carrier
            .create_cq((notify_recvs(&config) as usize * n * 2).next_power_of_two())
            .map_err(carrier_err)?;
        let datagrams = if config.datagrams {
            check_datagram_size(&*carrier, &config)?;
            Some(
                carrier
                    .create_qp(QpKind::Ud, &scq, &rcq)
                    .map_err(carrier_err)?,
            )
        } else {
            None
        };
        let mut links = Vec::with_capacity(n);
        for &dest in dests.nodes() {
            let qp = carrier
                .create_qp(QpKind::Rc, &scq, &rcq)
                .map_err(carrier_err)?;
            for i in 0..notify_recvs(&config) {
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
                to_datagrams: std::sync::OnceLock::new(),
                sent: AtomicU64::new(0),
                seq: AtomicU64::new(0),
                finished: AtomicBool::new(false),
            });
        }
        let buffers = carrier
            // One more than the pool: the reserve a dropped endpoint's error marker uses.
            .register((config.send_buffers + 1) * config.message_size)
            .map_err(carrier_err)?;
        let credits = carrier.register(n * SLOT).map_err(carrier_err)?;
        // SAFETY: nothing writes the fresh slots yet.
        unsafe { credits.slice_mut(0, n * SLOT) }.fill(0);
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
            credits,
            returns: Returns::default(),
            connected: OnceCell::new(),
            credit_wait_ns: AtomicU64::new(0),
        })
    }

    pub fn destinations(&self) -> &[NodeId] {
        self.dests.nodes()
    }

    /// Payload bytes a message holds at most.
    pub fn message_size(&self) -> usize {
        self.config.payload()
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
        let meets = self.links.iter().enumerate().map(|(i, l)| {
            let offer = Offer {
                qp: l.qp.addr(),
                region: Some(self.credits.remote(node)),
                offset: (i * SLOT) as u64,
                datagrams: self.datagrams.as_ref().map(|q| q.addr()),
            };
            let connector = Arc::clone(&self.connector);
            let timeout = self.config.timeout;
            let datagrams = self.datagrams.is_some();
            async move {
                handshake(
                    &*connector,
                    l.key,
                    Side::Sender,
                    l.dest,
                    offer,
                    timeout,
                    |theirs| {
                        if datagrams {
                            let Some(to) = theirs.datagrams.filter(|q| q.node == l.dest) else {
                                return Err(lost(l.dest, "its offer names no datagram queue pair"));
                            };
                            let _ = l.to_datagrams.set(to);
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

    fn credit_of(&self, t: usize) -> u64 {
        // SAFETY: the slot is 8-aligned inside the credit region; receivers write it
        // whole, and an atomic load reads either the old or the new count.
        let p = unsafe { self.credits.slice(t * SLOT, 8) }.as_ptr() as *const AtomicU64;
        unsafe { &*p }.load(Ordering::Acquire)
    }

    /// Moves completions: frees sent buffers, re-posts credit notifications, notes
    /// errors. Returns whether there were any.
    fn reap(&self) -> bool {
        let returned = std::mem::take(&mut *self.returns.lock());
        for (index, targets) in &returned {
            for &t in targets {
                self.links[t].sent.fetch_sub(1, Ordering::AcqRel);
            }
            self.state.lock().free.push(*index);
        }
        let mut out: Vec<Completion> = Vec::new();
        self.scq.poll(&mut out, 256);
        self.rcq.poll(&mut out, 256);
        if out.is_empty() {
            return !returned.is_empty();
        }
        let mut st = self.state.lock();
        for c in out {
            let link = |c: &Completion| {
                c.src
                    .and_then(|s| self.links.iter().find(|l| l.dest == s.node))
            };
            if c.status != WcStatus::Success {
                let peer = link(&c).map_or(0, |l| l.dest);
                st.error.get_or_insert(lost(
                    peer,
                    format!("a send/receive request ended with {:?}", c.status),
                ));
                if c.op == WcOp::Send && (c.id as usize) < st.pending.len() {
                    let i = c.id as usize;
                    st.pending[i] = st.pending[i].saturating_sub(1);
                    if st.pending[i] == 0 {
                        st.free.push(i);
                    }
                }
                continue;
            }
            match c.op {
                WcOp::Send => {
                    let i = c.id as usize;
                    if i < st.pending.len() && st.pending[i] > 0 {
                        st.pending[i] -= 1;
                        if st.pending[i] == 0 {
                            st.free.push(i);
                        }
                    }
                }
                WcOp::RecvWriteImm => {
                    if let Some(src) = c.src
                        && let Some(l) = self
                            .links
                            .iter()
                            .find(|l| l.dest == src.node && !l.finished.load(Ordering::Relaxed))
                    {
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

    async fn take_credit(&self, t: usize) -> Result<(), TransportError> {
        let l = &self.links[t];
        let start = std::time::Instant::now();
        let mut last_progress = start;
        loop {
            let sent = l.sent.load(Ordering::Acquire);
            if self.credit_of(t) > sent {
                if l.sent
                    .compare_exchange(sent, sent + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.credit_wait_ns
                        .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    return Ok(());
                }
                continue;
            }
            self.reap();
            if let Some(e) = self.error() {
                return Err(e);
            }
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

    /// Reserves a credit on every stream `to` names, then a registered buffer.
    pub async fn acquire(&self, to: To) -> Result<SrBuffer, TransportError> {
        self.connect().await?;
        let targets = self.dests.targets(to)?;
        if let Some(&t) = targets
            .iter()
            .find(|&&t| self.links[t].finished.load(Ordering::Acquire))
        {
            return Err(TransportError::Misuse(format!(
                "stream {} already sent its last message",
                self.links[t].key
            )));
        }
        for &t in &targets {
            self.take_credit(t).await?;
        }
        loop {
            self.reap();
            if let Some(e) = self.error() {
                return Err(e);
            }
            if let Some(index) = self.state.lock().free.pop() {
                let cap = self.config.payload();
                // SAFETY: the buffer is this reservation's until put or dropped.
                let ptr = unsafe {
                    self.buffers
                        .slice_mut(index * self.config.message_size, self.config.message_size)
                }
                .as_mut_ptr();
                return Ok(SrBuffer {
                    index,
                    len: 0,
                    targets,
                    cap,
                    ptr,
                    returns: Arc::clone(&self.returns),
                    put: false,
                });
            }
            self.wait().await;
        }
    }

    /// Sends a filled buffer to the destinations it was acquired for; never waits.
    pub fn put(&self, mut buf: SrBuffer, last: bool) -> Result<(), TransportError> {
        buf.put = true;
        if let Some(e) = self.error() {
            self.state.lock().free.push(buf.index);
            return Err(e);
        }
        self.state.lock().pending[buf.index] = buf.targets.len() as u32;
        let flags = if last { FLAG_LAST } else { 0 };
        // SAFETY: the header bytes of this reservation's buffer.
        unsafe {
            buf.ptr
                .copy_from_nonoverlapping(header(flags, buf.len, self.from).as_ptr(), HEADER)
        };
        for &t in &buf.targets {
            let l = &self.links[t];
            let seq = l.seq.fetch_add(1, Ordering::AcqRel);
            if last {
                l.finished.store(true, Ordering::Release);
            }
            self.post_data(l, buf.index, HEADER + buf.len, seq)?;
        }
        Ok(())
    }

    /// Sends bytes `..len` of buffer `index` on stream `l` as its message `seq`.
    fn post_data(
        &self,
        l: &OutLink,
        index: usize,
        len: usize,
        seq: u64,
    ) -> Result<(), TransportError> {
        let wr = SendWr {
            id: index as u64,
            op: SendOp::Send {
                imm: Some(seq as u32),
            },
            local: self.buffers.sge(index * self.config.message_size, len),
            dest: None,
            signaled: true,
        };
        match &self.datagrams {
            None => l.qp.post_send(wr),
            Some(qp) => {
                let Some(&to) = l.to_datagrams.get() else {
                    return Err(lost(l.dest, "not connected"));
                };
                qp.post_send(SendWr {
                    dest: Some(to),
                    ..wr
                })
            }
        }
        .map_err(carrier_err)
    }

    /// Posts `flags | FLAG_LAST` with `text` from buffer `index` to each stream of
    /// `streams`, as their next message.
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
            let l = &self.links[t];
            let seq = l.seq.fetch_add(1, Ordering::AcqRel);
            self.post_data(l, index, HEADER + body.len(), seq)?;
        }
        Ok(())
    }

    /// Sends a marker (end of stream or error) to every unfinished stream; markers
    /// need no credit (each stream's receiver keeps one receive in reserve).
    async fn mark(&self, flags: u32, text: &str) -> Result<(), TransportError> {
        self.connect().await?;
        let unfinished: Vec<usize> = (0..self.links.len())
            .filter(|&t| !self.links[t].finished.swap(true, Ordering::AcqRel))
            .collect();
        if unfinished.is_empty() {
            return Ok(());
        }
        let index = loop {
            self.reap();
            if let Some(i) = self.state.lock().free.pop() {
                break i;
            }
            if !self.wait().await && self.error().is_some() {
                return Err(self.error().expect("checked"));
            }
        };
        self.state.lock().pending[index] = unfinished.len() as u32;
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

    /// Waits until every buffer put so far has been carried (its completions seen).
    pub async fn flushed(&self) -> Result<(), TransportError> {
        loop {
            self.reap();
            if let Some(e) = self.error() {
                return Err(e);
            }
            if self.state.lock().pending.iter().all(|p| *p == 0) {
                return Ok(());
            }
            self.wait().await;
        }
    }
}

impl Drop for SrSend {
    /// Streams not finished fail at their receivers (as a dropped TCP endpoint's
    /// do) instead of leaving them waiting: an error marker from the reserve
    /// buffer. The shared-memory carrier copies at post; a NIC's carrier must
    /// keep the region registered until the sends complete.
    fn drop(&mut self) {
        if self.connected.get().is_none() {
            return; // the receivers' handshakes time out
        }
        let unfinished: Vec<usize> = (0..self.links.len())
            .filter(|&t| !self.links[t].finished.swap(true, Ordering::AcqRel))
            .collect();
        if !unfinished.is_empty() {
            let _ = self.post_marker(
                self.config.send_buffers,
                FLAG_ERROR,
                "the sending endpoint was dropped before it finished",
                &unfinished,
            );
        }
    }
}

/// The part of a receiver's state one stream needs.
struct InLink {
    slot: u32,
    node: NodeId,
    key: StreamKey,
    qp: Arc<dyn QueuePair>,
    /// The sender's credit slot, once connected.
    credit_to: Mutex<Option<(RemoteRegion, u64)>>,
    /// Receives posted that count as credit (the reserve not counted).
    posted: AtomicU64,
    since_credit: AtomicU64,
}

/// A message taken from a receive endpoint; give it back with [`SrReceive::release`].
#[derive(Debug)]
pub struct SrReceived {
    /// Position of the source in the endpoint's spec.
    pub source: usize,
    /// The sender's slot and node.
    pub slot: u32,
    pub node: NodeId,
    /// Whether this is the source's last message.
    pub last: bool,
    buffer: usize,
    len: usize,
}

struct RecvState {
    ended: Vec<bool>,
    /// Messages arrived per stream, and how many its last message says it sent.
    arrived: Vec<u64>,
    total: Vec<Option<u64>>,
    remaining: usize,
    ready: VecDeque<Completion>,
    error: Option<TransportError>,
}

/// The consuming side of an exchange over send/receive on reliable connections.
pub struct SrReceive {
    carrier: Arc<dyn Carrier>,
    config: SrConfig,
    links: Arc<Vec<InLink>>,
    rcq: Arc<dyn CompletionQueue>,
    _scq: Arc<dyn CompletionQueue>,
    /// The endpoint's one datagram queue pair, whose receives are one pool
    /// (datagram designs).
    datagrams: Option<Arc<dyn QueuePair>>,
    buffers: Arc<Region>,
    /// Staging for credit counts written to the senders.
    credit_src: Arc<Region>,
    state: Mutex<RecvState>,
    /// Why connecting failed, set by the connecting task.
    connect_error: Arc<Mutex<Option<TransportError>>>,
    connecting: tokio::task::JoinHandle<()>,
}

impl Drop for SrReceive {
    fn drop(&mut self) {
        self.connecting.abort();
    }
}

/// Buffers per stream: the window plus the reserve for the end marker.
fn per_stream(c: &SrConfig) -> usize {
    c.window as usize + 1
}

fn write_credit(
    credit_src: &Region,
    l: &InLink,
    index: usize,
    posted: u64,
) -> Result<(), TransportError> {
    let Some((remote, offset)) = *l.credit_to.lock() else {
        return Ok(());
    };
    // SAFETY: this stream's 8 staging bytes; the carrier copies them at post (a NIC
    // would send them inline, as the paper does).
    unsafe { credit_src.slice_mut(index * SLOT, 8) }.copy_from_slice(&posted.to_le_bytes());
    l.qp.post_send(SendWr {
        id: u64::MAX,
        op: SendOp::Write {
            remote,
            offset,
            imm: Some(posted as u32),
        },
        local: credit_src.sge(index * SLOT, 8),
        dest: None,
        signaled: false,
    })
    .map_err(carrier_err)
}

impl SrReceive {
    /// Opens the streams `(query, exchange, slot, this node)` from every source and
    /// starts connecting them (senders may send once connected, whether or not
    /// anyone reads yet: the posted receives are the window).
    pub fn open(
        carrier: Arc<dyn Carrier>,
        connector: Arc<dyn Connector>,
        config: SrConfig,
        spec: crate::ReceiveSpec,
    ) -> Result<Self, TransportError> {
        config.check()?;
        let me = carrier.node();
        let n = spec.sources.len();
        let per = per_stream(&config);
        let on_one_qp = if config.datagrams {
            n.max(1) * per
        } else {
            per
        };
        if on_one_qp > carrier.recv_depth() {
            return Err(TransportError::Misuse(format!(
                "{on_one_qp} receives on one queue pair (a window of {} per stream) exceed \
                 the carrier's receive depth of {}",
                config.window,
                carrier.recv_depth()
            )));
        }
        if config.datagrams {
            check_datagram_size(&*carrier, &config)?;
        }
        let rcq = carrier
            .create_cq((n * per + 64).next_power_of_two())
            .map_err(carrier_err)?;
        let scq = carrier.create_cq(64).map_err(carrier_err)?;
        let buffers = Arc::new(
            carrier
                .register(n.max(1) * per * config.message_size)
                .map_err(carrier_err)?,
        );
        let credit_src = Arc::new(carrier.register(n.max(1) * SLOT).map_err(carrier_err)?);
        let datagrams = if config.datagrams {
            Some(
                carrier
                    .create_qp(QpKind::Ud, &scq, &rcq)
                    .map_err(carrier_err)?,
            )
        } else {
            None
        };
        let mut links = Vec::with_capacity(n);
        for (i, &(slot, node)) in spec.sources.iter().enumerate() {
            // With datagrams this queue pair only writes credits.
            let qp = carrier
                .create_qp(
                    QpKind::Rc,
                    &scq,
                    if datagrams.is_some() { &scq } else { &rcq },
                )
                .map_err(carrier_err)?;
            for b in 0..per {
                let id = (i * per + b) as u64;
                datagrams
                    .as_ref()
                    .unwrap_or(&qp)
                    .post_recv(RecvWr {
                        id,
                        local: Some(
                            buffers.sge(id as usize * config.message_size, config.message_size),
                        ),
                    })
                    .map_err(carrier_err)?;
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
                credit_to: Mutex::new(None),
                posted: AtomicU64::new(config.window as u64),
                since_credit: AtomicU64::new(0),
            });
        }
        let links = Arc::new(links);
        let connect_error = Arc::new(Mutex::new(None));
        let connecting = {
            let links = Arc::clone(&links);
            let credit_src = Arc::clone(&credit_src);
            let timeout = config.timeout;
            let connect_error = Arc::clone(&connect_error);
            let rcq = Arc::clone(&rcq);
            let datagram_addr = datagrams.as_ref().map(|q| q.addr());
            tokio::spawn(async move {
                let meets = links.iter().enumerate().map(|(i, l)| {
                    let connector = Arc::clone(&connector);
                    let credit_src = Arc::clone(&credit_src);
                    async move {
                        let offer = Offer {
                            qp: l.qp.addr(),
                            region: None,
                            offset: 0,
                            datagrams: datagram_addr,
                        };
                        let theirs = handshake(
                            &*connector,
                            l.key,
                            Side::Receiver,
                            l.node,
                            offer,
                            timeout,
                            |theirs| {
                                if theirs.region.is_none() {
                                    return Err(lost(l.node, "its offer names no credit slot"));
                                }
                                l.qp.connect(theirs.qp).map_err(carrier_err)
                            },
                        )
                        .await?;
                        let Some(region) = theirs.region else {
                            return Err(lost(l.node, "its offer names no credit slot"));
                        };
                        *l.credit_to.lock() = Some((region, theirs.offset));
                        // The first credit: the whole window.
                        write_credit(&credit_src, l, i, l.posted.load(Ordering::Acquire))
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
        Ok(Self {
            carrier,
            state: Mutex::new(RecvState {
                ended: vec![false; n],
                arrived: vec![0; n],
                total: vec![None; n],
                remaining: n,
                ready: VecDeque::new(),
                error: None,
            }),
            config,
            links,
            rcq,
            _scq: scq,
            datagrams,
            buffers,
            credit_src,
            connect_error,
            connecting,
        })
    }

    /// Streams that have not ended yet.
    pub fn remaining(&self) -> usize {
        self.state.lock().remaining
    }

    fn repost(&self, source: usize, buffer: usize, counts: bool) -> Result<(), TransportError> {
        let l = &self.links[source];
        self.datagrams
            .as_ref()
            .unwrap_or(&l.qp)
            .post_recv(RecvWr {
                id: buffer as u64,
                local: Some(
                    self.buffers
                        .sge(buffer * self.config.message_size, self.config.message_size),
                ),
            })
            .map_err(carrier_err)?;
        if !counts {
            return Ok(());
        }
        let posted = l.posted.fetch_add(1, Ordering::AcqRel) + 1;
        if l.since_credit.fetch_add(1, Ordering::AcqRel) + 1 >= self.config.credit_every as u64 {
            l.since_credit.store(0, Ordering::Release);
            write_credit(&self.credit_src, l, source, posted)?;
        }
        Ok(())
    }

    /// The next message from any source; `None` once every source sent its last.
    pub async fn get(&self) -> Result<Option<SrReceived>, TransportError> {
        let per = per_stream(&self.config);
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
                    st.ready.extend(out);
                }
                st.ready.pop_front()
            };
            let Some(c) = c else {
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
                let st = self.state.lock();
                if let Some(i) = (0..self.links.len())
                    .find(|&i| !st.ended[i] && !self.carrier.is_alive(self.links[i].node))
                {
                    drop(st);
                    return Err(self.fail_with(lost(self.links[i].node, "its process is gone")));
                }
                if let Some(i) = (0..self.links.len()).find(|&i| {
                    !st.ended[i]
                        && st.total[i].is_some()
                        && last_progress.elapsed() > self.config.timeout
                }) {
                    let (arrived, total) = (st.arrived[i], st.total[i].unwrap_or(0));
                    drop(st);
                    return Err(self.fail_with(lost(
                        self.links[i].node,
                        format!(
                            "stream {}: {arrived} of its {total} messages arrived within {:?}",
                            self.links[i].key, self.config.timeout
                        ),
                    )));
                }
                if last_progress.elapsed() > self.config.timeout * 6 {
                    drop(st);
                    return Err(self.fail_with(TransportError::Misuse(
                        "no message from any source for a minute".into(),
                    )));
                }
                continue;
            };
            let buffer = c.id as usize;
            if buffer >= self.links.len() * per {
                return Err(self.fail_with(TransportError::Misuse(format!(
                    "a completion for unknown buffer {buffer}"
                ))));
            }
            if c.status != WcStatus::Success || c.op != WcOp::Recv {
                let peer = match &self.datagrams {
                    None => self.links[buffer / per].node,
                    Some(_) => c.src.map_or(0, |a| a.node),
                };
                return Err(
                    self.fail_with(lost(peer, format!("a receive ended with {:?}", c.status)))
                );
            }
            let off = buffer * self.config.message_size;
            let bytes = (c.bytes as usize).min(self.config.message_size);
            // SAFETY: the sender wrote this buffer before its completion; nothing
            // writes it again until it is re-posted.
            let h = unsafe { self.buffers.slice(off, HEADER.min(bytes)) };
            // A stream's own buffers, or (datagrams) the stream the header and the
            // sending node name.
            let source = match &self.datagrams {
                None => Some(buffer / per),
                Some(_) if h.len() < HEADER => None,
                Some(_) => {
                    let slot = word(h, 8);
                    let node = c.src.map(|a| a.node);
                    self.links
                        .iter()
                        .position(|l| l.slot == slot && Some(l.node) == node)
                }
            };
            let Some(source) = source else {
                // Nobody's stream: give the buffer back to the pool.
                let from = c
                    .src
                    .map_or("an unknown node".into(), |a| crate::node_name(a.node));
                tracing::warn!("a datagram from {from} names no stream of this endpoint");
                self.repost(0, buffer, false)?;
                continue;
            };
            let l = &self.links[source];
            let bad = |why: &str| {
                lost(
                    l.node,
                    format!("stream {}: a malformed message ({why})", l.key),
                )
            };
            if h.len() < HEADER {
                return Err(self.fail_with(bad("shorter than its header")));
            }
            let flags = word(h, 0);
            let len = word(h, 4) as usize;
            if len != bytes - HEADER || word(h, 8) != l.slot {
                return Err(self.fail_with(bad("its length or slot disagrees with what arrived")));
            }
            let Some(seq) = c.imm else {
                return Err(self.fail_with(bad("no sequence number")));
            };
            let ended_now = {
                let mut st = self.state.lock();
                if st.ended[source] {
                    drop(st);
                    return Err(self.fail_with(bad("after the stream's end")));
                }
                // A connection delivers in order: the next is the one counted next.
                if self.datagrams.is_none() && seq as u64 != st.arrived[source] {
                    drop(st);
                    return Err(self.fail_with(bad("out of sequence")));
                }
                st.arrived[source] += 1;
                if flags & FLAG_LAST != 0 {
                    if st.total[source].is_some() {
                        drop(st);
                        return Err(self.fail_with(bad("a second last message")));
                    }
                    st.total[source] = Some(seq as u64 + 1);
                }
                match st.total[source] {
                    Some(t) if st.arrived[source] > t => {
                        drop(st);
                        return Err(self.fail_with(bad("more messages than the stream sent")));
                    }
                    Some(t) if st.arrived[source] == t => {
                        st.ended[source] = true;
                        st.remaining -= 1;
                        true
                    }
                    _ => false,
                }
            };
            if flags & FLAG_ERROR != 0 {
                // SAFETY: as above.
                let text = unsafe { self.buffers.slice(off + HEADER, len) };
                return Err(self.fail_with(TransportError::Remote {
                    peer: l.node,
                    message: String::from_utf8_lossy(text).into_owned(),
                }));
            }
            if len == 0 && flags & FLAG_LAST != 0 {
                // A bare end-of-stream marker (in the stream's reserve receive).
                if self.datagrams.is_some() {
                    self.repost(source, buffer, false)?;
                }
                continue;
            }
            if len == 0 && flags & FLAG_LAST == 0 {
                return Err(self.fail_with(bad("empty")));
            }
            return Ok(Some(SrReceived {
                source,
                slot: l.slot,
                node: l.node,
                last: ended_now,
                buffer,
                len,
            }));
        }
    }

    fn fail_with(&self, e: TransportError) -> TransportError {
        self.state.lock().error.get_or_insert(e).clone()
    }

    /// The payload of a received message.
    pub fn data(&self, r: &SrReceived) -> &[u8] {
        // SAFETY: the buffer is not re-posted while `r` lives.
        unsafe {
            self.buffers
                .slice(r.buffer * self.config.message_size + HEADER, r.len)
        }
    }

    /// Gives the buffer back (re-posts it) and, every `credit_every` buffers,
    /// writes the stream's credit back to its sender.
    pub fn release(&self, r: SrReceived) -> Result<(), TransportError> {
        match (r.last, self.datagrams.is_some()) {
            // The stream is over: nothing more will arrive for it.
            (true, false) => Ok(()),
            // The pool's buffer goes back, without credit for an ended stream.
            (last, true) => self.repost(r.source, r.buffer, !last),
            (false, false) => self.repost(r.source, r.buffer, true),
        }
    }
}

#[cfg(test)]
mod tests;
