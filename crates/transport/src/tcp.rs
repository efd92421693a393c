//! The TCP backend: a [`Hub`] (stream table, credits, pools) plus a
//! [`Mux`] (the multiplexer thread that owns the connections).

use crate::endpoint::{ReceiveEndpoint, ReceiveSpec, SendEndpoint, SendSpec};
use crate::hub::{Hub, Wire};
use crate::mux::Mux;
use crate::schedule::Schedule;
use crate::stats::{PeerStats, TransportStats};
use crate::{NodeId, Transport, TransportError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The thesis' message size.
pub const DEFAULT_MESSAGE_SIZE: usize = 512 * 1024;

/// Settings of a TCP transport. All nodes of a cluster must share the secret; the other
/// settings are per node (each announces its receive window in the handshake).
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// A peer that does not know it cannot connect; it never goes on the wire.
    pub secret: String,
    /// How long to keep trying to reach a peer before its streams fail.
    pub connect_timeout: Duration,
    /// Size of each pooled message buffer.
    pub message_size: usize,
    /// Send buffers allocated up front; senders wait when all are in use.
    pub send_buffers: usize,
    /// Receive buffers allocated up front (more are allocated if consumers keep them).
    pub recv_buffers: usize,
    /// Messages a sender may have buffered at this node per stream (its credits).
    pub window: u32,
    pub schedule: Schedule,
    /// Link rate in bytes per second to assume until one is measured.
    pub link_rate_hint: Option<f64>,
    /// Encrypt and authenticate every frame on data links ([`crate::seal`]). Every
    /// node of a cluster must agree: a node refuses a peer that does not.
    pub encrypt_links: bool,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            secret: "gyre".to_string(),
            connect_timeout: Duration::from_secs(10),
            message_size: DEFAULT_MESSAGE_SIZE,
            send_buffers: 32,
            recv_buffers: 32,
            window: 8,
            schedule: Schedule::Free,
            link_rate_hint: None,
            encrypt_links: false,
        }
    }
}

/// A TCP [`Transport`]. Clones share the node; dropping the last one shuts it down.
#[derive(Clone)]
pub struct TcpTransport {
    hub: Arc<Hub>,
    mux: Arc<Mux>,
    addr: SocketAddr,
    config: Arc<TransportConfig>,
    _life: Arc<Life>,
}

/// Shuts the multiplexer down when the last handle goes (its tasks keep the mux alive).
struct Life(Arc<Mux>);

impl Drop for Life {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("node", &self.hub.node)
            .field("addr", &self.addr)
            .finish()
    }
}

impl TcpTransport {
    /// Binds the data listener of node `node` and starts its multiplexer.
    pub async fn bind(
        node: NodeId,
        listen: SocketAddr,
        config: TransportConfig,
    ) -> std::io::Result<Self> {
        Self::start(node, std::net::TcpListener::bind(listen)?, config)
    }

    /// Starts a transport on an already bound listener (so a node can learn its id after
    /// binding).
    pub fn from_listener(
        node: NodeId,
        listener: tokio::net::TcpListener,
        config: TransportConfig,
    ) -> std::io::Result<Self> {
        Self::start(node, listener.into_std()?, config)
    }

    fn start(
        node: NodeId,
        listener: std::net::TcpListener,
        config: TransportConfig,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let hub = Arc::new(Hub::for_config(node, &config));
        let mux = Mux::start(node, Arc::clone(&hub), listener, config.clone())?;
        Ok(Self {
            hub,
            _life: Arc::new(Life(Arc::clone(&mux))),
            mux,
            addr,
            config: Arc::new(config),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    /// Sets the data addresses of all nodes of the cluster and connects to new ones.
    pub fn set_peers(&self, peers: &HashMap<NodeId, SocketAddr>) {
        self.mux.set_peers(peers);
    }

    /// Declares a peer gone (for example when the coordinator saw it die).
    pub fn forget_peer(&self, peer: NodeId, reason: &str) {
        self.mux.lose(peer, reason.to_string(), false);
    }

    /// Whether a data connection to `peer` is up.
    pub fn is_connected(&self, peer: NodeId) -> bool {
        self.mux.is_connected(peer)
    }

    /// Closes every connection and stops the multiplexer thread.
    pub fn shutdown(&self) {
        self.mux.shutdown();
    }

    #[cfg(test)]
    pub(crate) fn debug_state(&self) -> String {
        self.mux.debug_state() + &self.hub.debug_state()
    }

    fn wire(&self) -> Arc<dyn Wire> {
        Arc::clone(&self.mux) as Arc<dyn Wire>
    }
}

impl Transport for TcpTransport {
    fn node_id(&self) -> NodeId {
        self.hub.node
    }

    fn open_send(&self, spec: SendSpec) -> Result<SendEndpoint, TransportError> {
        crate::endpoint::HubSend::open(
            Arc::clone(&self.hub),
            self.wire(),
            self.config.connect_timeout,
            spec,
        )
        .map(SendEndpoint::from)
    }

    fn open_receive(&self, spec: ReceiveSpec) -> Result<ReceiveEndpoint, TransportError> {
        let (ep, violators) =
            crate::endpoint::HubReceive::open(Arc::clone(&self.hub), self.wire(), spec)?;
        for (peer, reason) in violators {
            self.mux.lose(peer, reason, true);
        }
        Ok(ep.into())
    }

    fn release_query(&self, query: u64) {
        self.hub.release_query(query);
        self.mux.purge(query);
    }

    fn is_lost(&self, peer: NodeId) -> bool {
        self.hub.lost_reason(peer).is_some()
    }

    fn message_size(&self) -> usize {
        self.hub.send_pool.message_size()
    }

    fn link_rate(&self) -> Option<f64> {
        self.mux.link_rate().or(self.config.link_rate_hint)
    }

    fn schedule(&self) -> Schedule {
        self.mux.schedule()
    }

    fn set_schedule(&self, schedule: Schedule) {
        self.mux.set_schedule(schedule);
    }

    fn stats(&self) -> TransportStats {
        let me = self.hub.node;
        let peers: Vec<PeerStats> = self
            .hub
            .all_counters()
            .into_iter()
            .map(|(p, c)| c.snapshot(p))
            .collect();
        let remote = || peers.iter().filter(|p| p.peer != me);
        let send_pool = self.hub.send_pool.stats();
        let (turns_taken, turns_granted) = self.mux.turns();
        TransportStats {
            node: me,
            bytes_sent: remote().map(|p| p.bytes_sent).sum(),
            bytes_received: remote().map(|p| p.bytes_received).sum(),
            messages_sent: remote().map(|p| p.messages_sent).sum(),
            messages_received: remote().map(|p| p.messages_received).sum(),
            frames_sent: remote().map(|p| p.frames_sent).sum(),
            frames_received: remote().map(|p| p.frames_received).sum(),
            credit_wait: peers.iter().map(|p| p.credit_wait).sum(),
            acquire_wait: Duration::from_nanos(send_pool.acquire_wait_ns),
            send_pool,
            recv_pool: self.hub.recv_pool.stats(),
            oversize_received: self.mux.oversize_received.load(Ordering::Relaxed),
            measured_link_rate: self.mux.link_rate(),
            turns_taken,
            turns_granted,
            protocol_errors: self.mux.protocol_errors.load(Ordering::Relaxed),
            mux_cpu: self.mux.tid.and_then(crate::cpu::thread_cpu),
            peers,
        }
    }
}

/// Nodes `ids` in this process, all connected to each other over loopback: for
/// tests, examples and single-process benchmarks. Fails if a pair has not
/// connected within 10 s.
pub async fn loopback_cluster(
    ids: &[NodeId],
    config: TransportConfig,
) -> std::io::Result<Vec<TcpTransport>> {
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut nodes = Vec::with_capacity(ids.len());
    for &id in ids {
        nodes.push(TcpTransport::bind(id, any, config.clone()).await?);
    }
    let peers: HashMap<NodeId, SocketAddr> = nodes
        .iter()
        .map(|t| (t.node_id(), t.local_addr()))
        .collect();
    for t in &nodes {
        t.set_peers(&peers);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for a in &nodes {
        for b in &nodes {
            while a.node_id() != b.node_id() && !a.is_connected(b.node_id()) {
                if std::time::Instant::now() > deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "loopback node {} did not connect to node {} within 10 s",
                            a.node_id(),
                            b.node_id()
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    Ok(nodes)
}
