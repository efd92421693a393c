//! The communication multiplexer: one per node, on a dedicated OS thread
//! running its own single-threaded tokio runtime. It owns every data
//! connection of the node (one TCP connection per pair of nodes; the lower id
//! dials), performs the handshake ([`crate::auth`]), and runs a reader and a
//! writer task per connection. Compute threads never touch a socket: send
//! endpoints put messages into per-peer queues here and return at once;
//! readers hand incoming messages to the receive endpoints through the
//! [`Hub`]. Compute waits on the network only through backpressure (credits
//! and the buffer pool).
//!
//! Per peer, the writer writes in this order: control frames (credits, the
//! scheduler's Ready/Grant/EndTurn), then data frames (messages, end-of-stream
//! markers and stream errors, in the order they were put). Data frames are
//! only queued once their stream holds a credit, so the queues are bounded by
//! the credits and the pool. When data may be written is up to the
//! [`Scheduler`] (free or phased, see [`crate::schedule`]).
//!
//! The reader validates every frame (magic, version, kind, length, checksum)
//! and every right (see [`Hub`]); the first violation disconnects the peer
//! with a logged error naming it and its address, and fails every endpoint
//! that involves it. Large message bodies are read straight into receive-pool
//! buffers (small ones into exact-size allocations, oversize ones into their
//! own and counted). The reader never waits for a consumer.
//!
//! The link rate the multiplexer reports is the bytes of data frames written
//! divided by the time at least one connection was writing one, counted once
//! 16 MiB have been written: with all peers busy that is the node's outgoing
//! link capacity as TCP delivers it.

use crate::auth::{self, Challenge, Hello, Role, Transcript};
use crate::frame::{
    Control, FLAG_LAST, FrameError, FrameHeader, FrameKind, HEADER_LEN, StreamKey, data_crc,
    encode_header,
};
use crate::hub::{Delivered, Event, Hub, Wire};
use crate::pool::{Held, PoolBuffer};
use crate::schedule::{Action, Schedule, Scheduler};
use crate::seal::{DATA_OVERHEAD, KeyShare, Opener, Sealer, TAG_LEN};
use crate::stats::PeerCounters;
use crate::{NodeId, TransportConfig, TransportError, node_name};
use bytes::{BufMut, Bytes};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Largest payload of a control frame.
const MAX_CONTROL: usize = 64 * 1024;
/// How long each handshake step may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes written before the measured link rate is reported.
const LINK_RATE_MIN_BYTES: u64 = 16 << 20;
/// Why a peer is lost when its side of the connection ended in order (EOF).
const CLEAN_CLOSE: &str = "closed the connection";

enum OutFrame {
    Data {
        key: StreamKey,
        msg: Option<Held>,
        last: bool,
    },
    Error {
        key: StreamKey,
        text: String,
        _token: Option<Held>,
    },
}

impl OutFrame {
    fn query(&self) -> u64 {
        match self {
            Self::Data { key, .. } | Self::Error { key, .. } => key.query,
        }
    }
}

struct Conn {
    addr: SocketAddr,
    tasks: [AbortHandle; 2],
}

/// What is waiting to be written to one peer.
#[derive(Default)]
struct PeerLink {
    control: VecDeque<Control>,
    credits: Vec<(StreamKey, u32)>,
    data: VecDeque<OutFrame>,
    wake: Arc<Notify>,
    conn: Option<Conn>,
}

struct MuxState {
    addrs: HashMap<NodeId, SocketAddr>,
    peers: HashMap<NodeId, PeerLink>,
    dialing: HashSet<NodeId>,
    lost: HashSet<NodeId>,
    sched: Scheduler,
    shut: bool,
}

#[derive(Default)]
struct LinkMeter {
    writing: usize,
    since: Option<Instant>,
    busy: Duration,
    bytes: u64,
}

impl LinkMeter {
    fn begin(&mut self) {
        if self.writing == 0 {
            self.since = Some(Instant::now());
        }
        self.writing += 1;
    }

    fn end(&mut self, bytes: usize) {
        self.writing = self.writing.saturating_sub(1);
        self.bytes += bytes as u64;
        if self.writing == 0
            && let Some(t) = self.since.take()
        {
            self.busy += t.elapsed();
        }
    }

    fn rate(&self) -> Option<f64> {
        (self.bytes >= LINK_RATE_MIN_BYTES && !self.busy.is_zero())
            .then(|| self.bytes as f64 / self.busy.as_secs_f64())
    }
}

/// What a writer does next.
enum Next {
    Control(Control),
    Frame(OutFrame),
    Idle,
    Gone,
}

/// Why a reader stopped.
enum ReadEnd {
    Closed,
    Io(std::io::Error),
    Protocol(String),
}

impl From<FrameError> for ReadEnd {
    fn from(e: FrameError) -> Self {
        Self::Protocol(e.to_string())
    }
}

/// The multiplexer of one node.
pub(crate) struct Mux {
    pub node: NodeId,
    pub hub: Arc<Hub>,
    config: TransportConfig,
    handle: tokio::runtime::Handle,
    state: Mutex<MuxState>,
    changed: Notify,
    meter: Mutex<LinkMeter>,
    stop: Arc<Notify>,
    pub tid: Option<u32>,
    pub protocol_errors: AtomicU64,
    pub oversize_received: AtomicU64,
}

impl Mux {
    /// Starts the multiplexer thread, accepting connections on `listener`.
    pub fn start(
        node: NodeId,
        hub: Arc<Hub>,
        listener: std::net::TcpListener,
        config: TransportConfig,
    ) -> std::io::Result<Arc<Self>> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(Notify::new());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread_stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name(format!("gyre-mux-{node}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let listener = rt.block_on(async { TcpListener::from_std(listener) });
                let _ = tx.send(
                    listener.map(|l| (rt.handle().clone(), l, crate::cpu::current_thread_id())),
                );
                rt.block_on(thread_stop.notified());
                // Dropping the runtime drops every connection task and closes the sockets.
            })?;
        let (handle, listener, tid) = rx
            .recv()
            .map_err(|_| std::io::Error::other("multiplexer thread died at start"))??;
        let mux = Self::new(node, hub, config, handle, stop, tid);
        let weak = Arc::downgrade(&mux);
        mux.handle.spawn(async move {
            loop {
                let accepted = listener.accept().await;
                let Some(mux) = weak.upgrade() else { return };
                match accepted {
                    Ok((sock, remote)) => {
                        tokio::spawn(async move {
                            if let Err((claimed, e)) = Arc::clone(&mux).accept(sock, remote).await {
                                mux.protocol_errors.fetch_add(1, Ordering::Relaxed);
                                let who = claimed.map_or("an unknown node".to_string(), |n| {
                                    format!("{} (claimed)", node_name(n))
                                });
                                tracing::error!(
                                    node = mux.node,
                                    "rejected data connection from {who} at {remote}: {e}"
                                );
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(node = mux.node, "accept failed: {e}");
                        drop(mux);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        });
        Ok(mux)
    }

    /// The multiplexer's state, driven by tasks on `handle`; `start` adds the thread
    /// and the listener.
    pub(crate) fn new(
        node: NodeId,
        hub: Arc<Hub>,
        config: TransportConfig,
        handle: tokio::runtime::Handle,
        stop: Arc<Notify>,
        tid: Option<u32>,
    ) -> Arc<Self> {
        let mut sched = Scheduler::new(node, config.schedule);
        sched.set_ring([node]);
        Arc::new(Self {
            node,
            hub,
            config,
            handle,
            state: Mutex::new(MuxState {
                addrs: HashMap::new(),
                peers: HashMap::new(),
                dialing: HashSet::new(),
                lost: HashSet::new(),
                sched,
                shut: false,
            }),
            changed: Notify::new(),
            meter: Mutex::new(LinkMeter::default()),
            stop,
            tid,
            protocol_errors: AtomicU64::new(0),
            oversize_received: AtomicU64::new(0),
        })
    }

    /// Sets the data addresses of the cluster and dials the peers this node must dial.
    pub fn set_peers(self: &Arc<Self>, peers: &HashMap<NodeId, SocketAddr>) {
        let mut to_dial = vec![];
        {
            let mut st = self.state.lock();
            if st.shut {
                return;
            }
            for (&id, &addr) in peers {
                if id == self.node {
                    continue;
                }
                st.addrs.insert(id, addr);
                let connected = st.peers.get(&id).is_some_and(|l| l.conn.is_some());
                if id > self.node && !connected && !st.lost.contains(&id) && st.dialing.insert(id) {
                    to_dial.push((id, addr));
                }
            }
            let ring: Vec<NodeId> = st.addrs.keys().copied().collect();
            st.sched.set_ring(ring);
        }
        self.hub.set_known(peers.keys().copied());
        self.changed.notify_waiters();
        for (id, addr) in to_dial {
            let mux = Arc::clone(self);
            self.handle.spawn(async move {
                if let Err((e, handshake)) = Arc::clone(&mux).dial(id, addr).await {
                    let reason = if handshake {
                        format!("handshake failed: {e}")
                    } else {
                        format!("cannot connect: {e}")
                    };
                    mux.lose(id, reason, handshake);
                }
            });
        }
    }

    #[cfg(test)]
    pub fn debug_state(&self) -> String {
        let st = self.state.lock();
        let mut out = format!("node {} sched {:?}\n", self.node, st.sched);
        for (p, l) in &st.peers {
            out += &format!(
                "  peer {p}: control {:?} credits {} data {} conn {}\n",
                l.control,
                l.credits.len(),
                l.data.len(),
                l.conn.is_some()
            );
        }
        out
    }

    pub fn schedule(&self) -> Schedule {
        self.state.lock().sched.mode()
    }

    pub fn set_schedule(&self, mode: Schedule) {
        let mut st = self.state.lock();
        let st = &mut *st;
        let peers = &st.peers;
        let actions = st
            .sched
            .set_mode(mode, |p| peers.get(&p).is_some_and(|l| !l.data.is_empty()));
        apply(st, actions);
    }

    pub fn link_rate(&self) -> Option<f64> {
        self.meter.lock().rate()
    }

    pub fn turns(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.sched.turns_taken, st.sched.turns_granted)
    }

    pub fn is_connected(&self, peer: NodeId) -> bool {
        self.state
            .lock()
            .peers
            .get(&peer)
            .is_some_and(|l| l.conn.is_some())
    }

    /// Drops everything queued for `query`.
    pub fn purge(&self, query: u64) {
        let mut dropped = vec![];
        {
            let mut st = self.state.lock();
            for link in st.peers.values_mut() {
                let (keep, drop): (VecDeque<_>, VecDeque<_>) =
                    link.data.drain(..).partition(|f| f.query() != query);
                link.data = keep;
                dropped.extend(drop);
                link.credits.retain(|(k, _)| k.query != query);
            }
        }
        drop(dropped);
    }

    /// Disconnects `peer` for good and fails everything that involves it.
    pub fn lose(&self, peer: NodeId, reason: String, protocol: bool) {
        let (link, addr, shutting_down, clean_close) = {
            let mut st = self.state.lock();
            if !st.lost.insert(peer) {
                return;
            }
            let shutting_down = st.shut;
            let clean_close = reason == CLEAN_CLOSE;
            st.dialing.remove(&peer);
            let link = st.peers.remove(&peer);
            let actions = st.sched.peer_lost(peer);
            apply(&mut st, actions);
            let addr = link
                .as_ref()
                .and_then(|l| l.conn.as_ref().map(|c| c.addr))
                .or_else(|| st.addrs.get(&peer).copied());
            (link, addr, shutting_down, clean_close)
        };
        // The reason names the peer's address; the error built from it names the node.
        let reason = match addr {
            Some(a) => format!("{a}: {reason}"),
            None => reason,
        };
        if protocol {
            self.protocol_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                node = self.node,
                "disconnecting {} at {reason}",
                node_name(peer)
            );
        } else if shutting_down {
            // Our own shutdown: expected, not worth a warning.
            tracing::debug!(node = self.node, "closed {} at {reason}", node_name(peer));
        } else if clean_close {
            // The peer ended the connection in order (it shut down or restarted); whether
            // that is a failure is for the membership layer to say, which it does.
            tracing::info!(node = self.node, "lost {} at {reason}", node_name(peer));
        } else {
            tracing::warn!(node = self.node, "lost {} at {reason}", node_name(peer));
        }
        self.hub.mark_lost(peer, &reason);
        if let Some(link) = link
            && let Some(conn) = &link.conn
        {
            for t in &conn.tasks {
                t.abort();
            }
        }
        self.changed.notify_waiters();
    }

    /// Closes every connection and stops the thread.
    pub fn shutdown(&self) {
        let peers: Vec<NodeId> = {
            let mut st = self.state.lock();
            if st.shut {
                return;
            }
            st.shut = true;
            st.peers.keys().chain(st.addrs.keys()).copied().collect()
        };
        for p in peers {
            self.lose(p, "transport shut down".into(), false);
        }
        self.stop.notify_one();
    }

    fn enqueue(&self, peer: NodeId, frame: OutFrame) {
        let mut st = self.state.lock();
        if st.lost.contains(&peer) || st.shut {
            return;
        }
        let st = &mut *st;
        let link = st.peers.entry(peer).or_default();
        link.data.push_back(frame);
        link.wake.notify_one();
        if let Some(a) = st.sched.data_queued(peer) {
            apply(st, vec![a]);
        }
    }

    fn next_write(&self, peer: NodeId) -> Next {
        let mut st = self.state.lock();
        let st = &mut *st;
        let Some(link) = st.peers.get_mut(&peer) else {
            return Next::Gone;
        };
        if let Some(c) = link.control.pop_front() {
            return Next::Control(c);
        }
        if !link.credits.is_empty() {
            let (k, n) = link.credits.remove(0);
            return Next::Control(Control::Credit(k, n));
        }
        if st.sched.may_send(peer)
            && let Some(f) = link.data.pop_front()
        {
            st.sched.sent_one(peer);
            return Next::Frame(f);
        }
        if st.sched.in_turn(peer) {
            let more = !link.data.is_empty();
            let actions = st.sched.end_turn(peer, more);
            apply(st, actions);
            return Next::Control(Control::EndTurn { more });
        }
        Next::Idle
    }

    /// Connects and authenticates; on error, also says whether the handshake failed.
    async fn dial(self: Arc<Self>, peer: NodeId, addr: SocketAddr) -> Result<(), (String, bool)> {
        let mut sock = self.connect(addr).await.map_err(|e| (e, false))?;
        let (window, keys) = self
            .dial_handshake(peer, addr, &mut sock)
            .await
            .map_err(|e| (e, true))?;
        self.install(peer, addr, sock, window, keys)
            .map_err(|e| (e, false))
    }

    /// This node's hello, with a fresh nonce and key share.
    fn hello(&self) -> Result<(Hello, KeyShare), String> {
        let share = KeyShare::new()?;
        let hello = Hello {
            node: self.node,
            window: self.hub.window,
            nonce: auth::nonce(),
            share: share.public(),
            seal: self.config.encrypt_links,
        };
        Ok((hello, share))
    }

    async fn connect(&self, addr: SocketAddr) -> Result<TcpStream, String> {
        let deadline = tokio::time::Instant::now() + self.config.connect_timeout;
        let sock = loop {
            match TcpStream::connect(addr).await {
                Ok(s) => break s,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!("connect to {addr} failed ({e}), retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e.to_string()),
            }
        };
        sock.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(sock)
    }

    /// The dialer's half of the handshake; returns the acceptor's receive window and,
    /// on a sealed link, its keys.
    async fn dial_handshake(
        &self,
        peer: NodeId,
        addr: SocketAddr,
        sock: &mut TcpStream,
    ) -> Result<(u32, Option<LinkKeys>), String> {
        let secret = self.config.secret.as_bytes();
        let (hello, share) = self.hello()?;
        write_frame(sock, FrameKind::Hello, 0, &hello.encode())
            .await
            .map_err(|e| e.to_string())?;
        let (kind, _, payload) = read_handshake(sock)
            .await
            .map_err(|e| format!("no valid reply to hello ({e})"))?;
        let ch = Challenge::decode(kind, &payload).map_err(|e| e.to_string())?;
        if ch.hello.node != peer {
            return Err(format!(
                "expected {} at {addr}, found node {}",
                node_name(peer),
                ch.hello.node
            ));
        }
        let t = Transcript {
            dialer: hello,
            acceptor: ch.hello,
        };
        if !t.verify(secret, Role::Acceptor, &ch.proof) {
            return Err("failed the handshake: its proof does not match the cluster secret".into());
        }
        if ch.hello.seal != hello.seal {
            return Err(sealing_mismatch(ch.hello.seal));
        }
        let keys = hello
            .seal
            .then(|| share.link_keys(secret, &t, Role::Dialer))
            .transpose()?;
        write_frame(sock, FrameKind::Proof, 0, &t.prove(secret, Role::Dialer))
            .await
            .map_err(|e| e.to_string())?;
        let (kind, _, _) = read_handshake(sock)
            .await
            .map_err(|e| format!("rejected the handshake ({e})"))?;
        if kind != FrameKind::Welcome {
            return Err(format!("answered the handshake with a {kind:?} frame"));
        }
        Ok((ch.hello.window, keys))
    }

    async fn accept(
        self: Arc<Self>,
        mut sock: TcpStream,
        remote: SocketAddr,
    ) -> Result<(), (Option<NodeId>, String)> {
        sock.set_nodelay(true).map_err(|e| (None, e.to_string()))?;
        let (kind, _, payload) = read_handshake(&mut sock)
            .await
            .map_err(|e| (None, format!("no valid hello ({e})")))?;
        let hello = Hello::decode(kind, &payload).map_err(|e| (None, e.to_string()))?;
        let peer = hello.node;
        let fail = |e: String| (Some(peer), e);
        if peer == self.node {
            return Err(fail("it claims to be this node".into()));
        }
        // The peer table may reach this node a moment after the peer's first attempt.
        let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
        loop {
            let notified = self.changed.notified();
            {
                let st = self.state.lock();
                if st.lost.contains(&peer) {
                    return Err(fail(
                        "it was disconnected before; a lost node must rejoin under a new id".into(),
                    ));
                }
                if st.peers.get(&peer).is_some_and(|l| l.conn.is_some()) {
                    return Err(fail("it is already connected".into()));
                }
                if st.addrs.contains_key(&peer) {
                    break;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(fail("not a member of this cluster".into()));
            }
        }
        let secret = self.config.secret.as_bytes();
        let (mine, share) = self.hello().map_err(fail)?;
        let t = Transcript {
            dialer: hello,
            acceptor: mine,
        };
        let challenge = Challenge {
            hello: mine,
            proof: t.prove(secret, Role::Acceptor),
        };
        write_frame(&mut sock, FrameKind::Challenge, 0, &challenge.encode())
            .await
            .map_err(|e| fail(e.to_string()))?;
        let (kind, _, payload) = read_handshake(&mut sock)
            .await
            .map_err(|e| fail(format!("no valid proof ({e})")))?;
        let proof = auth::decode_proof(kind, &payload).map_err(|e| fail(e.to_string()))?;
        if !t.verify(secret, Role::Dialer, &proof) {
            return Err(fail("failed the handshake: wrong cluster secret".into()));
        }
        if hello.seal != mine.seal {
            return Err(fail(sealing_mismatch(hello.seal)));
        }
        let keys = mine
            .seal
            .then(|| share.link_keys(secret, &t, Role::Acceptor))
            .transpose()
            .map_err(fail)?;
        write_frame(&mut sock, FrameKind::Welcome, 0, &[])
            .await
            .map_err(|e| fail(e.to_string()))?;
        self.install(peer, remote, sock, hello.window, keys)
            .map_err(fail)
    }

    fn install(
        self: &Arc<Self>,
        peer: NodeId,
        addr: SocketAddr,
        sock: TcpStream,
        window: u32,
        keys: Option<LinkKeys>,
    ) -> Result<(), String> {
        let (rd, wr) = sock.into_split();
        let (sealer, opener) = keys.unzip();
        let wake = {
            let mut st = self.state.lock();
            st.dialing.remove(&peer);
            if st.shut || st.lost.contains(&peer) {
                return Err("the peer was lost meanwhile".into());
            }
            let link = st.peers.entry(peer).or_default();
            if link.conn.is_some() {
                return Err("it is already connected".into());
            }
            let wake = Arc::clone(&link.wake);
            let writer =
                tokio::spawn(Arc::clone(self).write_loop(peer, wr, sealer, Arc::clone(&wake)));
            let reader = tokio::spawn(Arc::clone(self).read_loop(peer, rd, opener));
            link.conn = Some(Conn {
                addr,
                tasks: [writer.abort_handle(), reader.abort_handle()],
            });
            wake
        };
        self.hub.connected(peer, window);
        wake.notify_one();
        self.changed.notify_waiters();
        tracing::debug!(node = self.node, peer, %addr, sealed = self.config.encrypt_links, "data connection up");
        Ok(())
    }

    async fn write_loop(
        self: Arc<Self>,
        peer: NodeId,
        wr: OwnedWriteHalf,
        mut sealer: Option<Sealer>,
        wake: Arc<Notify>,
    ) {
        let mut w = BufWriter::with_capacity(64 * 1024, wr);
        let counters = self.hub.counters(peer);
        loop {
            let res = match self.next_write(peer) {
                Next::Gone => return,
                Next::Idle => {
                    if let Err(e) = w.flush().await {
                        self.lose(peer, format!("write failed: {e}"), false);
                        return;
                    }
                    wake.notified().await;
                    continue;
                }
                Next::Control(c) => write_control(&mut w, &c, &counters, sealer.as_mut()).await,
                Next::Frame(OutFrame::Error { key, text, .. }) => {
                    let c = Control::Error(key, text);
                    write_control(&mut w, &c, &counters, sealer.as_mut()).await
                }
                Next::Frame(OutFrame::Data { key, msg, last }) => {
                    self.meter.lock().begin();
                    let r = write_data(&mut w, key, msg.as_ref(), last, &counters, sealer.as_mut())
                        .await;
                    let n = msg.as_ref().map_or(0, |m| m.message().len());
                    self.meter.lock().end(HEADER_LEN + StreamKey::LEN + n);
                    r
                }
            };
            if let Err(e) = res {
                self.lose(peer, format!("write failed: {e}"), false);
                return;
            }
        }
    }

    /// Reads `peer`'s frames until its connection ends or it breaks the protocol, and
    /// then loses it.
    pub(crate) async fn read_loop(
        self: Arc<Self>,
        peer: NodeId,
        rd: impl AsyncRead + Unpin,
        mut opener: Option<Opener>,
    ) {
        let mut rd = BufReader::with_capacity(64 * 1024, rd);
        let counters = self.hub.counters(peer);
        loop {
            match self
                .read_one(peer, &mut rd, &counters, opener.as_mut())
                .await
            {
                Ok(()) => {}
                Err(ReadEnd::Closed) => {
                    self.lose(peer, CLEAN_CLOSE.to_string(), false);
                    return;
                }
                Err(ReadEnd::Io(e)) => {
                    self.lose(peer, format!("read failed: {e}"), false);
                    return;
                }
                Err(ReadEnd::Protocol(e)) => {
                    self.lose(peer, format!("protocol error: {e}"), true);
                    return;
                }
            }
        }
    }

    async fn read_one(
        &self,
        peer: NodeId,
        rd: &mut (impl AsyncRead + Unpin),
        counters: &PeerCounters,
        mut opener: Option<&mut Opener>,
    ) -> Result<(), ReadEnd> {
        let mut header = [0u8; HEADER_LEN];
        read_exact(rd, &mut header, "header", true).await?;
        let h = FrameHeader::decode(&header)?;
        PeerCounters::add(&counters.frames_received, 1);
        PeerCounters::add(&counters.bytes_received, (HEADER_LEN + h.len) as u64);
        match h.kind {
            FrameKind::Data => {
                let overhead = if opener.is_some() { DATA_OVERHEAD } else { 0 };
                if h.len < StreamKey::LEN + overhead {
                    return Err(FrameError::BadLength {
                        kind: h.kind,
                        len: h.len,
                    }
                    .into());
                }
                let mut kb = [0u8; StreamKey::LEN];
                read_exact(rd, &mut kb, "stream key", false).await?;
                if let Some(o) = opener.as_deref_mut() {
                    let tag = read_tag(rd).await?;
                    o.open(&header, &mut kb, &tag)?;
                }
                let body_len = h.len - StreamKey::LEN - overhead;
                // The sender must be allowed to send on this stream before a byte of
                // the body is buffered for it. A bare end-of-stream marker has no body
                // and needs no credit: `deliver` checks it.
                if body_len > 0 {
                    self.hub
                        .admits(peer, StreamKey::from_bytes(&kb))
                        .map_err(ReadEnd::Protocol)?;
                }
                let size = self.hub.recv_pool.message_size();
                let mut buf = if body_len > size {
                    self.oversize_received.fetch_add(1, Ordering::Relaxed);
                    PoolBuffer::unpooled(body_len)
                } else if body_len >= size / 4 {
                    self.hub.recv_pool.take()
                } else {
                    PoolBuffer::unpooled(body_len)
                };
                read_body(rd, buf.vec_mut(), body_len).await?;
                match opener {
                    Some(o) => {
                        let tag = read_tag(rd).await?;
                        o.open(&[], buf.vec_mut(), &tag)?;
                    }
                    None => {
                        let mut crc = crc32fast::Hasher::new();
                        crc.update(&kb);
                        crc.update(buf.as_slice());
                        h.verify_crc(crc.finalize())?;
                    }
                }
                PeerCounters::add(&counters.messages_received, 1);
                let key = StreamKey::from_bytes(&kb);
                let last = h.flags & FLAG_LAST != 0;
                let ev = if body_len == 0 && last {
                    // A bare end-of-stream marker: sent without a credit.
                    Event::Last
                } else {
                    let msg = buf.freeze(None, None);
                    let held = msg.hold();
                    Event::Data { msg: held, last }
                };
                match self.hub.deliver(peer, key, ev) {
                    Ok(Delivered::Discarded) => self.credit(peer, key, 1),
                    Ok(_) => {}
                    Err(e) => return Err(ReadEnd::Protocol(e)),
                }
                Ok(())
            }
            FrameKind::Hello | FrameKind::Challenge | FrameKind::Proof | FrameKind::Welcome => {
                Err(FrameError::Unexpected(h.kind).into())
            }
            kind => {
                let overhead = if opener.is_some() { TAG_LEN } else { 0 };
                if h.len > MAX_CONTROL || h.len < overhead {
                    return Err(FrameError::BadLength { kind, len: h.len }.into());
                }
                let mut p = vec![0u8; h.len];
                read_exact(rd, &mut p, "payload", false).await?;
                match opener {
                    Some(o) => {
                        let tag: [u8; TAG_LEN] = p
                            .split_off(h.len - TAG_LEN)
                            .try_into()
                            .expect("TAG_LEN bytes split off");
                        o.open(&header, &mut p, &tag)?;
                    }
                    None => h.verify_crc(crc32fast::hash(&p))?,
                }
                let c = Control::decode(kind, h.flags, Bytes::from(p))?;
                self.on_control(peer, c).map_err(ReadEnd::Protocol)
            }
        }
    }

    fn on_control(&self, peer: NodeId, c: Control) -> Result<(), String> {
        match c {
            Control::Error(key, message) => {
                let ev = Event::Failed(TransportError::Remote { peer, message });
                self.hub.deliver(peer, key, ev).map(|_| ())
            }
            Control::Credit(key, n) => self.hub.credit(peer, key, n),
            Control::Ready => {
                let mut st = self.state.lock();
                let actions = st.sched.on_ready(peer);
                apply(&mut st, actions);
                Ok(())
            }
            Control::Grant { .. } => {
                let mut st = self.state.lock();
                let actions = st.sched.on_grant(peer);
                apply(&mut st, actions);
                Ok(())
            }
            Control::EndTurn { more } => {
                let mut st = self.state.lock();
                let actions = st.sched.on_end_turn(peer, more)?;
                apply(&mut st, actions);
                Ok(())
            }
        }
    }
}

/// Carries out the scheduler's actions (state locked).
fn apply(st: &mut MuxState, actions: Vec<Action>) {
    for a in actions {
        let (peer, c) = match a {
            Action::SendReady(p) => (p, Some(Control::Ready)),
            Action::SendGrant(p, phase) => (p, Some(Control::Grant { phase })),
            Action::SendEndTurn(p) => (p, Some(Control::EndTurn { more: false })),
            Action::Wake(p) => (p, None),
        };
        if st.lost.contains(&peer) {
            continue;
        }
        let link = st.peers.entry(peer).or_default();
        if let Some(c) = c {
            link.control.push_back(c);
        }
        link.wake.notify_one();
    }
}

impl Wire for Mux {
    fn data(&self, peer: NodeId, key: StreamKey, msg: Option<Held>, last: bool) {
        self.enqueue(peer, OutFrame::Data { key, msg, last });
    }

    fn error(&self, peer: NodeId, key: StreamKey, text: String, token: Option<Held>) {
        self.enqueue(
            peer,
            OutFrame::Error {
                key,
                text,
                _token: token,
            },
        );
    }

    fn credit(&self, peer: NodeId, key: StreamKey, n: u32) {
        let mut st = self.state.lock();
        if st.lost.contains(&peer) || st.shut {
            return;
        }
        let link = st.peers.entry(peer).or_default();
        match link.credits.iter_mut().find(|(k, _)| *k == key) {
            Some((_, m)) => *m += n,
            None => link.credits.push((key, n)),
        }
        link.wake.notify_one();
    }
}

async fn write_control(
    w: &mut BufWriter<OwnedWriteHalf>,
    c: &Control,
    counters: &PeerCounters,
    sealer: Option<&mut Sealer>,
) -> std::io::Result<()> {
    let (kind, flags, payload) = c.encode();
    let len = match sealer {
        Some(s) => {
            let header = FrameHeader::encode(kind, flags, payload.len() + TAG_LEN, 0);
            let mut sealed = payload.to_vec();
            let tag = s.seal(&header, &mut sealed)?;
            w.write_all(&header).await?;
            w.write_all(&sealed).await?;
            w.write_all(&tag).await?;
            payload.len() + TAG_LEN
        }
        None => {
            w.write_all(&encode_header(kind, flags, &payload)).await?;
            w.write_all(&payload).await?;
            payload.len()
        }
    };
    PeerCounters::add(&counters.frames_sent, 1);
    PeerCounters::add(&counters.bytes_sent, (HEADER_LEN + len) as u64);
    Ok(())
}

async fn write_data(
    w: &mut BufWriter<OwnedWriteHalf>,
    key: StreamKey,
    msg: Option<&Held>,
    last: bool,
    counters: &PeerCounters,
    sealer: Option<&mut Sealer>,
) -> std::io::Result<()> {
    let mut kb = key.to_bytes();
    let body: &[u8] = msg.map_or(&[], |m| m.message().as_slice());
    let flags = if last { FLAG_LAST } else { 0 };
    let len = match sealer {
        Some(s) => {
            let len = StreamKey::LEN + body.len() + DATA_OVERHEAD;
            let header = FrameHeader::encode(FrameKind::Data, flags, len, 0);
            let tag = s.seal(&header, &mut kb)?;
            w.write_all(&header).await?;
            w.write_all(&kb).await?;
            w.write_all(&tag).await?;
            w.write_all(s.seal_copy(body)?).await?;
            len
        }
        None => {
            let body_crc = msg
                .and_then(|m| m.message().crc())
                .unwrap_or_else(|| crc32fast::hash(body));
            let crc = data_crc(&kb, body_crc, body.len());
            let len = StreamKey::LEN + body.len();
            w.write_all(&FrameHeader::encode(FrameKind::Data, flags, len, crc))
                .await?;
            w.write_all(&kb).await?;
            w.write_all(body).await?;
            len
        }
    };
    PeerCounters::add(&counters.frames_sent, 1);
    PeerCounters::add(&counters.messages_sent, 1);
    PeerCounters::add(&counters.bytes_sent, (HEADER_LEN + len) as u64);
    Ok(())
}

/// The keys of a sealed link: this end's sealer and opener.
type LinkKeys = (Sealer, Opener);

/// Why two nodes' links cannot be set up: one seals them, the other does not.
fn sealing_mismatch(peer_seals: bool) -> String {
    let (who, other) = if peer_seals {
        ("it", "this node")
    } else {
        ("this node", "it")
    };
    format!(
        "{who} encrypts its data links and {other} does not (every node of a cluster needs \
         the same --encrypt-links)"
    )
}

/// Reads the authentication tag that ends a sealed part of a frame.
async fn read_tag(rd: &mut (impl AsyncRead + Unpin)) -> Result<[u8; TAG_LEN], ReadEnd> {
    let mut tag = [0u8; TAG_LEN];
    read_exact(rd, &mut tag, "authentication tag", false).await?;
    Ok(tag)
}

/// Fills `buf`; a clean end of the connection before the first byte of a frame is
/// `Closed`, anywhere else a truncated frame.
async fn read_exact(
    rd: &mut (impl AsyncRead + Unpin),
    buf: &mut [u8],
    what: &'static str,
    frame_start: bool,
) -> Result<(), ReadEnd> {
    let mut got = 0;
    while got < buf.len() {
        let n = rd.read(&mut buf[got..]).await.map_err(ReadEnd::Io)?;
        if n == 0 {
            if got == 0 && frame_start {
                return Err(ReadEnd::Closed);
            }
            return Err(FrameError::Truncated {
                what,
                got,
                want: buf.len(),
            }
            .into());
        }
        got += n;
    }
    Ok(())
}

/// Reads `n` bytes into the spare capacity of `v` (no zeroing first).
async fn read_body(
    rd: &mut (impl AsyncRead + Unpin),
    v: &mut Vec<u8>,
    n: usize,
) -> Result<(), ReadEnd> {
    v.reserve(n);
    while v.len() < n {
        let want = n - v.len();
        let got = rd
            .read_buf(&mut (&mut *v).limit(want))
            .await
            .map_err(ReadEnd::Io)?;
        if got == 0 {
            return Err(FrameError::Truncated {
                what: "message body",
                got: v.len(),
                want: n,
            }
            .into());
        }
    }
    Ok(())
}

/// Writes one frame straight to a socket (handshake).
pub(crate) async fn write_frame(
    sock: &mut TcpStream,
    kind: FrameKind,
    flags: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    sock.write_all(&encode_header(kind, flags, payload)).await?;
    sock.write_all(payload).await?;
    sock.flush().await
}

/// Reads one handshake frame, within the handshake timeout.
pub(crate) async fn read_handshake(
    sock: &mut TcpStream,
) -> Result<(FrameKind, u8, Vec<u8>), String> {
    let read = async {
        let mut header = [0u8; HEADER_LEN];
        read_exact(sock, &mut header, "header", true).await?;
        let h = FrameHeader::decode(&header)?;
        if h.len > MAX_CONTROL {
            return Err(FrameError::BadLength {
                kind: h.kind,
                len: h.len,
            }
            .into());
        }
        let mut p = vec![0u8; h.len];
        read_exact(sock, &mut p, "payload", false).await?;
        h.verify_crc(crc32fast::hash(&p))?;
        Ok::<_, ReadEnd>((h.kind, h.flags, p))
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, read).await {
        Err(_) => Err(format!("nothing within {HANDSHAKE_TIMEOUT:?}")),
        Ok(Err(ReadEnd::Closed)) => Err("connection closed".into()),
        Ok(Err(ReadEnd::Io(e))) => Err(e.to_string()),
        Ok(Err(ReadEnd::Protocol(e))) => Err(e),
        Ok(Ok(f)) => Ok(f),
    }
}
