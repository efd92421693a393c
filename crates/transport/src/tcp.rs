//! The TCP backend: one connection per pair of nodes, carrying every stream
//! between them.
//!
//! The node with the lower id dials the one with the higher id, so each pair
//! has exactly one connection. A connection starts with a `Hello` exchange
//! that proves knowledge of the cluster secret and names the node; a stranger
//! or a node that is not in the peer table is disconnected. Each connection
//! has a writer task fed by a bounded queue and a reader task that
//! demultiplexes frames into per-stream buffers. The reader never blocks on a
//! consumer: credits bound how much each stream may buffer, so one slow
//! stream cannot stall the others that share the connection.

use crate::frame::{
    FrameError, FrameHeader, FrameKind, HEADER_LEN, StreamFrame, StreamKey, encode_header,
};
use crate::stream::{FrameSink, INITIAL_CREDITS, Inbound, StreamReceiver, StreamSender};
use crate::{NodeId, Transport, TransportError, TransportStats, node_name};
use bytes::{BufMut, Bytes, BytesMut};
use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinHandle;

/// Settings of a TCP transport.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// Shared by all nodes of a cluster; a peer that does not know it cannot connect.
    pub secret: String,
    /// How long a sender waits for a connection to a peer to come up.
    pub connect_timeout: Duration,
    /// Frames queued per connection before senders wait.
    pub write_queue: usize,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            secret: "gyre".to_string(),
            connect_timeout: Duration::from_secs(10),
            write_queue: 64,
        }
    }
}

/// A TCP [`Transport`].
#[derive(Clone)]
pub struct TcpTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("node", &self.inner.node)
            .field("addr", &self.inner.addr)
            .finish()
    }
}

struct Inner {
    node: NodeId,
    addr: SocketAddr,
    config: TransportConfig,
    state: Mutex<State>,
    changed: Notify,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    accept_task: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    addrs: HashMap<NodeId, SocketAddr>,
    links: HashMap<NodeId, Link>,
    dialing: HashSet<NodeId>,
    lost: HashMap<NodeId, String>,
    inbound: HashMap<StreamKey, InboundEntry>,
    outbound: HashMap<StreamKey, (NodeId, Arc<Semaphore>)>,
    released: HashSet<u64>,
}

struct Link {
    tx: mpsc::Sender<(FrameKind, Bytes)>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

struct InboundEntry {
    src: NodeId,
    tx: mpsc::UnboundedSender<Inbound>,
    rx: Option<mpsc::UnboundedReceiver<Inbound>>,
    /// Messages buffered and not yet taken; a peer that exceeds its credits is cut off.
    buffered: Arc<AtomicU32>,
}

impl InboundEntry {
    fn new(src: NodeId) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            src,
            tx,
            rx: Some(rx),
            buffered: Arc::new(AtomicU32::new(0)),
        }
    }
}

impl TcpTransport {
    /// Binds the data listener of node `node` and starts accepting peers.
    pub async fn bind(
        node: NodeId,
        listen: SocketAddr,
        config: TransportConfig,
    ) -> std::io::Result<Self> {
        Self::from_listener(node, TcpListener::bind(listen).await?, config)
    }

    /// Starts a transport on an already bound listener (so a node can learn its id after
    /// binding). Must be called inside a tokio runtime.
    pub fn from_listener(
        node: NodeId,
        listener: TcpListener,
        config: TransportConfig,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            node,
            addr,
            config,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            frames_sent: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            accept_task: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, remote)) = listener.accept().await else {
                    continue;
                };
                let Some(inner) = weak.upgrade() else { return };
                tokio::spawn(async move {
                    if let Err(e) = inner.clone().accept(sock).await {
                        tracing::error!(node = inner.node, %remote, "rejected data connection: {e}");
                    }
                });
            }
        });
        *inner.accept_task.lock() = Some(task);
        Ok(Self { inner })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Sets the data addresses of all nodes of the cluster and connects to new ones.
    pub fn set_peers(&self, peers: &HashMap<NodeId, SocketAddr>) {
        let mut to_dial = vec![];
        {
            let mut st = self.inner.state.lock();
            for (&id, &addr) in peers {
                if id == self.inner.node {
                    continue;
                }
                st.addrs.insert(id, addr);
                if id > self.inner.node
                    && !st.links.contains_key(&id)
                    && !st.lost.contains_key(&id)
                    && st.dialing.insert(id)
                {
                    to_dial.push((id, addr));
                }
            }
        }
        self.inner.changed.notify_waiters();
        for (id, addr) in to_dial {
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move {
                if let Err(e) = inner.clone().dial(id, addr).await {
                    tracing::warn!(node = inner.node, peer = id, %addr, "dial failed: {e}");
                    inner.state.lock().dialing.remove(&id);
                    inner.mark_lost(id, format!("cannot connect to {addr}: {e}"));
                }
            });
        }
    }

    /// Declares a peer gone (for example when the coordinator saw it die).
    pub fn forget_peer(&self, peer: NodeId, reason: &str) {
        self.inner.mark_lost(peer, reason.to_string());
    }

    /// Stops accepting and closes every connection.
    pub fn shutdown(&self) {
        if let Some(t) = self.inner.accept_task.lock().take() {
            t.abort();
        }
        let peers: Vec<NodeId> = self.inner.state.lock().links.keys().copied().collect();
        for p in peers {
            self.inner.mark_lost(p, "transport shut down".into());
        }
    }
}

fn hello_payload(node: NodeId, secret: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u32_le(node);
    b.put_slice(secret.as_bytes());
    b.freeze()
}

async fn read_frame(sock: &mut (impl AsyncReadExt + Unpin)) -> Result<(FrameKind, Bytes), String> {
    let mut header = [0u8; HEADER_LEN];
    sock.read_exact(&mut header)
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    let h = FrameHeader::decode(&header).map_err(|e: FrameError| e.to_string())?;
    let mut payload = vec![0u8; h.len];
    sock.read_exact(&mut payload)
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    h.verify(&payload).map_err(|e| e.to_string())?;
    Ok((h.kind, Bytes::from(payload)))
}

async fn write_frame(
    sock: &mut (impl AsyncWriteExt + Unpin),
    kind: FrameKind,
    payload: &[u8],
) -> std::io::Result<()> {
    sock.write_all(&encode_header(kind, payload)).await?;
    sock.write_all(payload).await?;
    sock.flush().await
}

fn parse_hello(kind: FrameKind, payload: &[u8]) -> Result<(NodeId, &[u8]), String> {
    if kind != FrameKind::Hello || payload.len() < 4 {
        return Err(format!("expected a hello frame, got {kind:?}"));
    }
    let node = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    Ok((node, &payload[4..]))
}

impl Inner {
    async fn dial(self: Arc<Self>, peer: NodeId, addr: SocketAddr) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + self.config.connect_timeout;
        let mut sock = loop {
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
        let hello = hello_payload(self.node, &self.config.secret);
        write_frame(&mut sock, FrameKind::Hello, &hello)
            .await
            .map_err(|e| e.to_string())?;
        let (kind, payload) =
            tokio::time::timeout(self.config.connect_timeout, read_frame(&mut sock))
                .await
                .map_err(|_| "no hello reply (wrong cluster secret?)".to_string())??;
        let (node, _) = parse_hello(kind, &payload)?;
        if node != peer {
            return Err(format!("expected node {peer} at {addr}, found node {node}"));
        }
        self.install(peer, sock);
        Ok(())
    }

    async fn accept(self: Arc<Self>, mut sock: TcpStream) -> Result<(), String> {
        sock.set_nodelay(true).map_err(|e| e.to_string())?;
        let (kind, payload) = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut sock))
            .await
            .map_err(|_| "no hello within 5s".to_string())??;
        let (peer, secret) = parse_hello(kind, &payload)?;
        if secret != self.config.secret.as_bytes() {
            return Err(format!("node {peer} presented a wrong cluster secret"));
        }
        // The peer table may reach us a moment after the peer's first connection attempt.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let notified = self.changed.notified();
            if self.state.lock().addrs.contains_key(&peer) {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(format!("unknown peer node {peer}: not in this cluster"));
            }
        }
        let hello = hello_payload(self.node, &self.config.secret);
        write_frame(&mut sock, FrameKind::Hello, &hello)
            .await
            .map_err(|e| e.to_string())?;
        self.install(peer, sock);
        Ok(())
    }

    fn install(self: &Arc<Self>, peer: NodeId, sock: TcpStream) {
        let (mut rd, wr) = sock.into_split();
        let (tx, mut rx) = mpsc::channel::<(FrameKind, Bytes)>(self.config.write_queue);
        let me = Arc::clone(self);
        let writer = tokio::spawn(async move {
            let mut w = BufWriter::with_capacity(256 * 1024, wr);
            while let Some((kind, payload)) = rx.recv().await {
                let res = async {
                    w.write_all(&encode_header(kind, &payload)).await?;
                    w.write_all(&payload).await?;
                    if rx.is_empty() {
                        w.flush().await?;
                    }
                    std::io::Result::Ok(())
                }
                .await;
                if let Err(e) = res {
                    me.mark_lost(peer, format!("write failed: {e}"));
                    return;
                }
                me.bytes_sent
                    .fetch_add((HEADER_LEN + payload.len()) as u64, Ordering::Relaxed);
                me.frames_sent.fetch_add(1, Ordering::Relaxed);
            }
        });
        let me = Arc::clone(self);
        let reader = tokio::spawn(async move {
            loop {
                match read_frame(&mut rd).await {
                    Ok((kind, payload)) => {
                        me.bytes_received
                            .fetch_add((HEADER_LEN + payload.len()) as u64, Ordering::Relaxed);
                        me.frames_received.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = me.dispatch(peer, kind, payload) {
                            tracing::error!(
                                node = me.node,
                                "protocol error from {}: {e}; disconnecting",
                                node_name(peer)
                            );
                            me.mark_lost(peer, format!("protocol error: {e}"));
                            return;
                        }
                    }
                    Err(e) => {
                        if !e.contains("early eof") {
                            tracing::error!(node = me.node, "{} sent {e}", node_name(peer));
                        }
                        me.mark_lost(peer, e);
                        return;
                    }
                }
            }
        });
        let old = {
            let mut st = self.state.lock();
            st.dialing.remove(&peer);
            st.lost.remove(&peer);
            st.links.insert(peer, Link { tx, reader, writer })
        };
        if let Some(old) = old {
            old.reader.abort();
            old.writer.abort();
        }
        tracing::debug!(node = self.node, peer, "data connection up");
        self.changed.notify_waiters();
    }

    fn dispatch(&self, peer: NodeId, kind: FrameKind, payload: Bytes) -> Result<(), String> {
        let frame = StreamFrame::decode(kind, payload).map_err(|e| e.to_string())?;
        self.deliver(peer, frame)
    }

    /// Hands a frame from `peer` to the stream it belongs to.
    fn deliver(&self, peer: NodeId, frame: StreamFrame) -> Result<(), String> {
        let mut st = self.state.lock();
        let (key, event) = match frame {
            StreamFrame::Credit(key, n) => {
                if let Some((_, sem)) = st.outbound.get(&key) {
                    sem.add_permits(n as usize);
                }
                return Ok(());
            }
            StreamFrame::Data(key, body) => (key, Inbound::Data(body)),
            StreamFrame::End(key) => (key, Inbound::End),
            StreamFrame::Error(key, message) => (
                key,
                Inbound::Failed(TransportError::Remote { peer, message }),
            ),
        };
        if st.released.contains(&key.query) {
            return Ok(());
        }
        let entry = st
            .inbound
            .entry(key)
            .or_insert_with(|| InboundEntry::new(peer));
        if entry.src != peer {
            return Err(format!(
                "stream {key} belongs to {}, not to this peer",
                node_name(entry.src)
            ));
        }
        if matches!(event, Inbound::Data(_)) {
            let n = entry.buffered.fetch_add(1, Ordering::AcqRel) + 1;
            if n > INITIAL_CREDITS {
                return Err(format!(
                    "flow control violated on stream {key}: {n} messages without credit"
                ));
            }
        }
        let _ = entry.tx.send(event);
        Ok(())
    }

    fn mark_lost(&self, peer: NodeId, reason: String) {
        let link = {
            let mut st = self.state.lock();
            if st.lost.contains_key(&peer) && !st.links.contains_key(&peer) {
                return;
            }
            st.lost.insert(peer, reason.clone());
            st.dialing.remove(&peer);
            for entry in st.inbound.values() {
                if entry.src == peer {
                    let _ = entry.tx.send(Inbound::Failed(TransportError::PeerLost {
                        peer,
                        reason: reason.clone(),
                    }));
                }
            }
            for (dest, sem) in st.outbound.values() {
                if *dest == peer {
                    sem.close();
                }
            }
            st.links.remove(&peer)
        };
        if let Some(link) = link {
            link.reader.abort();
            link.writer.abort();
        }
        self.changed.notify_waiters();
    }

    async fn link_to(
        &self,
        dest: NodeId,
    ) -> Result<mpsc::Sender<(FrameKind, Bytes)>, TransportError> {
        let deadline = tokio::time::Instant::now() + self.config.connect_timeout;
        loop {
            let notified = self.changed.notified();
            {
                let st = self.state.lock();
                if let Some(link) = st.links.get(&dest) {
                    return Ok(link.tx.clone());
                }
                if let Some(reason) = st.lost.get(&dest) {
                    return Err(TransportError::PeerLost {
                        peer: dest,
                        reason: reason.clone(),
                    });
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let known = self.state.lock().addrs.contains_key(&dest);
                return Err(if known {
                    TransportError::Unreachable {
                        peer: dest,
                        reason: format!(
                            "no data connection after {:?}",
                            self.config.connect_timeout
                        ),
                    }
                } else {
                    TransportError::UnknownPeer(dest)
                });
            }
        }
    }
}

impl FrameSink for Inner {
    fn send_frame(
        &self,
        dest: NodeId,
        frame: StreamFrame,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        async move {
            if dest == self.node {
                // A node's streams to itself (its own share of a shuffle) skip the socket.
                return self
                    .deliver(dest, frame)
                    .map_err(|reason| TransportError::PeerLost { peer: dest, reason });
            }
            let tx = self.link_to(dest).await?;
            let (kind, payload) = frame.encode();
            tx.send((kind, payload))
                .await
                .map_err(|_| TransportError::PeerLost {
                    peer: dest,
                    reason: "connection closed".to_string(),
                })
        }
        .boxed()
    }
}

/// Lets stream handles reach the transport without keeping it alive.
struct SinkRef(Arc<Inner>);

impl FrameSink for SinkRef {
    fn send_frame(
        &self,
        dest: NodeId,
        frame: StreamFrame,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        self.0.send_frame(dest, frame)
    }
}

impl Transport for TcpTransport {
    fn node_id(&self) -> NodeId {
        self.inner.node
    }

    fn sender(&self, key: StreamKey, dest: NodeId) -> Result<StreamSender, TransportError> {
        let mut st = self.inner.state.lock();
        if st.outbound.contains_key(&key) {
            return Err(TransportError::AlreadyOpen(key));
        }
        let sem = Arc::new(Semaphore::new(INITIAL_CREDITS as usize));
        if st.lost.contains_key(&dest) || st.released.contains(&key.query) {
            sem.close();
        }
        st.outbound.insert(key, (dest, Arc::clone(&sem)));
        drop(st);
        Ok(StreamSender::new(
            key,
            dest,
            sem,
            Arc::new(SinkRef(Arc::clone(&self.inner))),
        ))
    }

    fn receiver(&self, key: StreamKey, src: NodeId) -> Result<StreamReceiver, TransportError> {
        let mut st = self.inner.state.lock();
        let lost = st.lost.get(&src).cloned();
        let entry = st
            .inbound
            .entry(key)
            .or_insert_with(|| InboundEntry::new(src));
        let Some(rx) = entry.rx.take() else {
            return Err(TransportError::AlreadyOpen(key));
        };
        if let Some(reason) = lost {
            let _ = entry.tx.send(Inbound::Failed(TransportError::PeerLost {
                peer: src,
                reason,
            }));
        }
        let buffered = Arc::clone(&entry.buffered);
        drop(st);
        Ok(StreamReceiver::new(
            key,
            src,
            rx,
            Arc::new(CreditingSink {
                inner: Arc::clone(&self.inner),
                buffered,
            }),
        ))
    }

    fn release_query(&self, query: u64) {
        let mut st = self.inner.state.lock();
        st.inbound.retain(|k, _| k.query != query);
        st.outbound.retain(|k, (_, sem)| {
            if k.query == query {
                sem.close();
                false
            } else {
                true
            }
        });
        st.released.insert(query);
    }

    fn is_lost(&self, peer: NodeId) -> bool {
        self.inner.state.lock().lost.contains_key(&peer)
    }

    fn stats(&self) -> TransportStats {
        TransportStats {
            bytes_sent: self.inner.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.inner.bytes_received.load(Ordering::Relaxed),
            frames_sent: self.inner.frames_sent.load(Ordering::Relaxed),
            frames_received: self.inner.frames_received.load(Ordering::Relaxed),
        }
    }
}

/// The receiver's sink: returning a credit also frees a buffer slot.
struct CreditingSink {
    inner: Arc<Inner>,
    buffered: Arc<AtomicU32>,
}

impl FrameSink for CreditingSink {
    fn send_frame(
        &self,
        dest: NodeId,
        frame: StreamFrame,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        if let StreamFrame::Credit(_, n) = &frame {
            self.buffered.fetch_sub(*n, Ordering::AcqRel);
        }
        self.inner.send_frame(dest, frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(secret_b: &str) -> (TcpTransport, TcpTransport) {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let a = TcpTransport::bind(1, any, TransportConfig::default())
            .await
            .unwrap();
        let cfg = TransportConfig {
            secret: secret_b.to_string(),
            connect_timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let b = TcpTransport::bind(2, any, cfg).await.unwrap();
        let peers: HashMap<NodeId, SocketAddr> = [(1, a.local_addr()), (2, b.local_addr())].into();
        a.set_peers(&peers);
        b.set_peers(&peers);
        (a, b)
    }

    fn key(exchange: u32) -> StreamKey {
        StreamKey {
            query: 1,
            exchange,
            from: 0,
            to: 0,
        }
    }

    #[tokio::test]
    async fn streams_deliver_in_order_both_ways() {
        let (a, b) = pair("gyre").await;
        let mut tx = a.sender(key(1), 2).unwrap();
        let mut back = b.sender(key(2), 1).unwrap();
        let producer = tokio::spawn(async move {
            for i in 0..100u32 {
                tx.send(Bytes::from(i.to_le_bytes().to_vec()))
                    .await
                    .unwrap();
            }
            tx.finish().await.unwrap();
        });
        back.send(Bytes::from_static(b"pong")).await.unwrap();
        back.finish().await.unwrap();
        let mut rx = b.receiver(key(1), 1).unwrap();
        for i in 0..100u32 {
            let m = rx.next().await.unwrap().unwrap();
            assert_eq!(m.as_ref(), &i.to_le_bytes());
        }
        assert_eq!(rx.next().await.unwrap(), None);
        producer.await.unwrap();
        let mut rx = a.receiver(key(2), 2).unwrap();
        assert_eq!(rx.next().await.unwrap().unwrap().as_ref(), b"pong");
        assert_eq!(rx.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn slow_consumer_bounds_buffering() {
        let (a, b) = pair("gyre").await;
        let mut tx = a.sender(key(1), 2).unwrap();
        let sent = Arc::new(AtomicU32::new(0));
        let sent2 = Arc::clone(&sent);
        tokio::spawn(async move {
            for _ in 0..100 {
                tx.send(Bytes::from(vec![0u8; 1024])).await.unwrap();
                sent2.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Nobody consumed: the producer must be stopped by its credits.
        assert_eq!(sent.load(Ordering::SeqCst), INITIAL_CREDITS);
        let mut rx = b.receiver(key(1), 1).unwrap();
        rx.next().await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(sent.load(Ordering::SeqCst), INITIAL_CREDITS + 1);
    }

    #[tokio::test]
    async fn wrong_secret_is_rejected() {
        let (a, _b) = pair("not-the-secret").await;
        let mut tx = a.sender(key(1), 2).unwrap();
        let err = tx.send(Bytes::from_static(b"x")).await.unwrap_err();
        assert!(
            matches!(
                err,
                TransportError::PeerLost { peer: 2, .. } | TransportError::Unreachable { .. }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn peer_loss_fails_open_streams() {
        let (a, b) = pair("gyre").await;
        let mut tx = a.sender(key(1), 2).unwrap();
        tx.send(Bytes::from_static(b"x")).await.unwrap();
        let mut rx = b.receiver(key(1), 1).unwrap();
        assert!(rx.next().await.unwrap().is_some());
        a.shutdown();
        let err = rx.next().await.unwrap_err();
        assert!(err.to_string().contains("worker 1"), "{err}");
    }

    #[tokio::test]
    async fn corrupt_frame_disconnects_peer() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let b = TcpTransport::bind(2, any, TransportConfig::default())
            .await
            .unwrap();
        b.set_peers(&[(1, any), (2, b.local_addr())].into());
        let mut rx = b.receiver(key(1), 1).unwrap();
        let mut sock = TcpStream::connect(b.local_addr()).await.unwrap();
        write_frame(&mut sock, FrameKind::Hello, &hello_payload(1, "gyre"))
            .await
            .unwrap();
        let (kind, _) = read_frame(&mut sock).await.unwrap();
        assert_eq!(kind, FrameKind::Hello);
        // A data frame whose checksum does not match its payload.
        let (kind, payload) = StreamFrame::Data(key(1), Bytes::from_static(b"rows")).encode();
        let mut header = encode_header(kind, &payload);
        header[12] ^= 0xff;
        sock.write_all(&header).await.unwrap();
        sock.write_all(&payload).await.unwrap();
        let err = rx.next().await.unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        assert!(b.is_lost(1));
    }
}
