//! Control messages between the coordinator and the workers.
//!
//! They travel as Arrow Flight `DoAction` calls of type [`ACTION`] whose body
//! is a postcard-encoded [`Request`] and whose single result is a [`Response`].
//! Data never goes this way; it moves through the transport.

use crate::auth::{NODE_HEADER, NodeKey};
use crate::progress::ReadFigures;
use crate::storage::PartStats;
use arrow_flight::Action;
use arrow_flight::flight_service_client::FlightServiceClient;
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use gyre_transport::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tonic::transport::Channel;

/// Accepted connections of a gRPC service, with Nagle's algorithm off: a reply's last
/// segment would otherwise wait for the peer's delayed ACK (40 ms per statement here).
///
/// A connection starts as a stranger: at most [`MAX_STRANGERS`] of those are open at
/// once, and one is closed if no call on it passes the gate within [`ADMITTED_WITHIN`]
/// (the gate marks it in `standings`: a bearer token, a control signature, or any call
/// when clients need no login). Admitted connections move to the listener's other
/// [`MAX_CONNECTIONS`] slots and stay as long as their clients like, so strangers who
/// fill their slots do not take the port from those who logged in.
pub fn incoming_nodelay(
    listener: tokio::net::TcpListener,
    standings: Standings,
) -> impl futures::Stream<Item = std::io::Result<Admitted>> {
    let strangers = Arc::new(tokio::sync::Semaphore::new(MAX_STRANGERS));
    let members = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |s| {
        let (strangers, members, refused, standings) = (
            Arc::clone(&strangers),
            Arc::clone(&members),
            Arc::clone(&refused),
            standings.clone(),
        );
        async move {
            let s = match s {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            let (Ok(slot), Ok(peer)) = (strangers.try_acquire_owned(), s.peer_addr()) else {
                // Closed at once; the log says so once per thousand refusals.
                if refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1000 == 0 {
                    tracing::warn!(
                        "refusing connections from {:?} and others: {MAX_STRANGERS} connections \
                         that have not logged in are open",
                        s.peer_addr().ok()
                    );
                }
                return None;
            };
            if let Err(e) = s.set_nodelay(true) {
                tracing::warn!("cannot turn Nagle's algorithm off: {e}");
            }
            Some(Ok(Admitted {
                stream: s,
                deadline: Some(Box::pin(tokio::time::sleep(ADMITTED_WITHIN))),
                _slot: slot,
                admitted: standings.enter(peer),
                members,
                standings,
                peer,
            }))
        }
    })
}

/// Most admitted connections one listener keeps open; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 1024;

/// Most connections without an admitted call one listener keeps open.
pub const MAX_STRANGERS: usize = 256;

/// A connection none of whose calls passed the gate this long after it opened is
/// closed: it would hold one of the listener's [`MAX_STRANGERS`] slots for nothing.
pub const ADMITTED_WITHIN: Duration = Duration::from_secs(15);

/// Which open connections of one listener had a call pass its gate, by peer address.
#[derive(Clone, Default)]
pub struct Standings(Arc<parking_lot::Mutex<HashMap<SocketAddr, Arc<AtomicBool>>>>);

impl Standings {
    /// A call from `peer` passed the gate: its connection is admitted.
    pub fn admit(&self, peer: SocketAddr) {
        if let Some(a) = self.0.lock().get(&peer) {
            a.store(true, Ordering::Relaxed);
        }
    }

    fn enter(&self, peer: SocketAddr) -> Arc<AtomicBool> {
        let a = Arc::new(AtomicBool::new(false));
        self.0.lock().insert(peer, Arc::clone(&a));
        a
    }
}

/// An accepted connection: holds its slot among the listener's connections while it is
/// open, and fails its next read once [`ADMITTED_WITHIN`] passed without an admitted
/// call.
pub struct Admitted {
    stream: tokio::net::TcpStream,
    /// Until the connection is admitted.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    _slot: tokio::sync::OwnedSemaphorePermit,
    admitted: Arc<AtomicBool>,
    members: Arc<tokio::sync::Semaphore>,
    standings: Standings,
    peer: SocketAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        // A new connection from the same address may have entered meanwhile.
        let mut standings = self.standings.0.lock();
        if standings
            .get(&self.peer)
            .is_some_and(|a| Arc::ptr_eq(a, &self.admitted))
        {
            standings.remove(&self.peer);
        }
    }
}

impl Admitted {
    /// Moves an admitted connection to a member slot (it keeps its stranger slot if
    /// every member slot is taken); fails a stranger past its deadline.
    fn check_standing(&mut self, cx: &mut std::task::Context<'_>) -> std::io::Result<()> {
        use std::future::Future;
        let Some(deadline) = self.deadline.as_mut() else {
            return Ok(());
        };
        if self.admitted.load(Ordering::Relaxed) {
            self.deadline = None;
            if let Ok(member) = Arc::clone(&self.members).try_acquire_owned() {
                self._slot = member;
            }
            return Ok(());
        }
        if deadline.as_mut().poll(cx).is_ready() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no call passed the gate within {ADMITTED_WITHIN:?}"),
            ));
        }
        Ok(())
    }
}

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl tokio::io::AsyncRead for Admitted {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check_standing(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Admitted {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The Flight action type of Gyre's control messages.
pub const ACTION: &str = "gyre.control";

/// Largest gRPC message between nodes (a stage plan with its literal rows, a report):
/// tonic refuses a larger one before reading it whole.
pub const MAX_CONTROL_MESSAGE: usize = 256 << 20;

/// Largest gRPC message a client may send to the coordinator (one batch of a bulk
/// insert, say) or receive from it in one piece; results stream in pieces of a few MB.
pub const MAX_CLIENT_MESSAGE: usize = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Worker to coordinator: join the cluster.
    Register {
        control_addr: String,
        data_addr: String,
        /// The worker's host shuffle ([`crate::host_shuffle::HostShuffle::id`]).
        #[serde(default)]
        host_shuffle: Option<String>,
    },
    /// Worker to coordinator: still alive. `incarnation` is what the coordinator
    /// answered the worker's registration with: an id the coordinator gave again
    /// after a restart is another worker's.
    Heartbeat {
        node: NodeId,
        #[serde(default)]
        incarnation: u64,
    },
    /// Worker to coordinator: a stage of a query failed.
    QueryFailed {
        query: u64,
        node: NodeId,
        error: String,
    },
    /// Coordinator to worker: the data addresses of every node.
    SetPeers {
        peers: Vec<(NodeId, String)>,
    },
    /// Coordinator to worker: run these stage plans of a query.
    StartQuery {
        query: u64,
        workers: Vec<NodeId>,
        stages: Vec<(usize, Vec<u8>)>,
        compression: Option<String>,
        /// How its exchanges move data (`gyre.shuffle_design`; none: tcp).
        #[serde(default)]
        shuffle_design: Option<String>,
        /// The session's changed `datafusion.execution.*` settings.
        #[serde(default)]
        execution: Vec<(String, String)>,
    },
    /// Coordinator to worker: the query is over; stop its tasks and commit or discard its inserts.
    FinishQuery {
        query: u64,
        commit: bool,
        metrics: bool,
    },
    CreateTable {
        name: String,
        schema: Vec<u8>,
    },
    /// Client to coordinator (empty `nodes`: all live workers), or coordinator to
    /// worker: run one synthetic shuffle between `nodes` (see `gyre_transport::bench`).
    BenchShuffle(ShuffleRun),
    /// Client to coordinator (empty `nodes`: all live workers), or coordinator to
    /// worker: run one synthetic distributed join between `nodes`.
    BenchJoin(JoinRun),
    DropTable {
        name: String,
    },
    /// Coordinator to worker: set up the object stores that serve these locations, with
    /// these options (see `files::stores`), before a statement reads or writes them.
    RegisterStore {
        locations: Vec<String>,
        options: Vec<(String, String)>,
    },
    /// Coordinator to worker: what the scans of a running query have read so far.
    Progress {
        query: u64,
    },
    /// Coordinator to worker: its process and transport counters (`gyre_workers()`).
    Stats,
    /// Worker to coordinator: send me the transactional tables' state and then their
    /// log as it becomes durable (a stream of [`crate::log_feed::FeedMessage`]s).
    SubscribeLog {
        node: NodeId,
        /// The worker has joined the log's multicast group: the stream carries only
        /// the state.
        #[serde(default)]
        multicast: bool,
    },
}

impl Request {
    /// What the request asks, as errors name it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Register { .. } => "Register",
            Self::Heartbeat { .. } => "Heartbeat",
            Self::QueryFailed { .. } => "QueryFailed",
            Self::SetPeers { .. } => "SetPeers",
            Self::StartQuery { .. } => "StartQuery",
            Self::FinishQuery { .. } => "FinishQuery",
            Self::CreateTable { .. } => "CreateTable",
            Self::BenchShuffle(_) => "BenchShuffle",
            Self::BenchJoin(_) => "BenchJoin",
            Self::DropTable { .. } => "DropTable",
            Self::RegisterStore { .. } => "RegisterStore",
            Self::Progress { .. } => "Progress",
            Self::Stats => "Stats",
            Self::SubscribeLog { .. } => "SubscribeLog",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    Ok,
    /// The worker's id, and a number the coordinator drew for this registration.
    Registered {
        node: NodeId,
        #[serde(default)]
        incarnation: u64,
    },
    /// A heartbeat's answer when the coordinator no longer counts the worker in (it
    /// restarted, or it declared the worker dead): the worker must join afresh.
    Forgotten {
        reason: String,
    },
    Finished {
        /// Per stage: the stage's plan rendered with this worker's metrics.
        stages: Vec<(usize, String)>,
        /// New sizes of the tables this query inserted into.
        tables: Vec<(String, PartStats)>,
    },
    /// One worker's figures of a synthetic shuffle.
    Shuffled(ShuffleFigures),
    /// Every worker's figures of a synthetic shuffle, in worker order.
    ShuffleResults(Vec<ShuffleFigures>),
    /// One worker's figures of a synthetic join.
    Joined(JoinFigures),
    /// Every worker's figures of a synthetic join, in worker order.
    JoinResults(Vec<JoinFigures>),
    /// What a query read on this worker (`None`: it is not running here).
    Progress(Option<ReadFigures>),
    Stats(WorkerStats),
}

/// A worker's counters since it started, as `SELECT * FROM gyre_workers()` shows them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// CPU time of the worker's process (`None` where it cannot be read). Embedded
    /// workers share one process, so each reports all of them.
    pub cpu_seconds: Option<f64>,
    /// Bytes this worker's transport sent to and received from other nodes.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Table parts it holds: how many, their rows and in-memory bytes.
    pub tables: u64,
    pub rows: u64,
    pub table_bytes: u64,
    /// Queries running on it.
    pub queries: u64,
    /// Its replica of the transactional tables ([`crate::worker::secondary`]).
    #[serde(default)]
    pub secondary: crate::worker::secondary::SecondaryFigures,
}

/// A synthetic shuffle run, as the control plane carries it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShuffleRun {
    pub run_id: u64,
    pub nodes: Vec<NodeId>,
    /// `repartition` or `broadcast`.
    pub pattern: String,
    pub total_bytes: u64,
    pub message_size: u64,
    /// `free` or `phased`.
    pub schedule: String,
}

/// A synthetic distributed join (the workload of Rödiger's Flow-Join experiments and of the cyclo-join paper: 64-bit
/// keys and payloads; build keys unique, probe keys uniform or Zipf over them), as the
/// control plane carries it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRun {
    pub run_id: u64,
    pub nodes: Vec<NodeId>,
    /// `hash` (plain partitioned hash join), `flow` (Flow-Join, global heavy-hitter
    /// list), `flow-fetch` (Flow-Join, fetch on demand), or `cyclo-ALGORITHM`
    /// (`gyre_join::cyclo::parse_algorithm`).
    pub strategy: String,
    pub build_rows: u64,
    pub probe_rows: u64,
    /// Zipf exponent of the probe keys (0: uniform).
    pub zipf: f64,
    /// Share of each worker's rows whose keys lie in that worker's range of the key
    /// domain (SQL strategies only); `None`: the build side hash-placed on its key.
    pub locality: Option<f64>,
    /// Key number i is key i (SQL strategies only): the heaviest keys are the smallest,
    /// as in the thesis' skew experiment; otherwise keys are spread over the domain.
    #[serde(default)]
    pub ordered_keys: bool,
    pub seed: u64,
    /// Join threads per worker (0: all cores).
    pub threads: u64,
}

/// What one worker measured in a synthetic join (seconds, tuples, bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinFigures {
    pub node: NodeId,
    pub strategy: String,
    /// Build and probe tuples this worker generated.
    pub build_rows_local: u64,
    pub probe_rows_local: u64,
    /// From the start of the join (data in memory) to this worker's last result.
    pub elapsed_s: f64,
    /// Cyclo-join: hash tables built, partitions or runs sorted (the part done once).
    /// Partitioned joins: until the build side's hash table was complete.
    pub setup_s: f64,
    /// Cyclo-join: time in the join kernels. Partitioned joins: the probe phase.
    pub join_s: f64,
    /// Cyclo-join: time the join entity waited for data from the network.
    pub sync_s: Option<f64>,
    /// Tuples this worker's join consumed (its share of the work).
    pub tuples_joined: u64,
    /// Bytes on the wire during the join.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Result tuples on this worker and their order-independent checksum (the
    /// workers' checksums add up, wrapping, to the same total whatever the strategy).
    pub results: u64,
    pub checksum: u64,
    /// Strategy-specific figures (name, value).
    pub details: Vec<(String, f64)>,
    /// Partitioned joins: CPU time of the worker's process during its part of the join
    /// (embedded workers share one process, so each sees all of them).
    #[serde(default)]
    pub process_cpu_s: Option<f64>,
}

/// What one worker measured in a synthetic shuffle (seconds, bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShuffleFigures {
    pub node: NodeId,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    pub wire_bytes_sent: u64,
    pub wire_bytes_received: u64,
    pub elapsed_s: f64,
    pub send_elapsed_s: f64,
    pub recv_elapsed_s: f64,
    /// CPU time of the worker's process during the run.
    pub process_cpu_s: Option<f64>,
    /// CPU time of the worker's communication multiplexer thread.
    pub mux_cpu_s: Option<f64>,
    /// Over a verbs design: what the worker's endpoints held and waited for.
    #[serde(default)]
    pub design: Option<DesignCost>,
}

/// A worker's endpoints over a verbs design: setup, resources and credit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DesignCost {
    /// Opening and connecting the endpoints (waiting for every peer's).
    pub setup_s: f64,
    pub queue_pairs: u64,
    /// Registered (pinned, on a NIC) bytes.
    pub registered_bytes: u64,
    /// Time senders waited for credit.
    pub credit_wait_s: f64,
    /// Credit counts receivers wrote back.
    pub credit_updates: u64,
    /// The receiving endpoint's buffers: mean and most over the run (sampled
    /// every millisecond), over time (at most 200 points), and what adaptive
    /// buffering lent to starved streams and took out of circulation.
    #[serde(default)]
    pub buffers_mean: f64,
    #[serde(default)]
    pub buffers_peak: u64,
    #[serde(default)]
    pub buffers_over_time: Vec<u32>,
    #[serde(default)]
    pub buffers_lent: u64,
    #[serde(default)]
    pub buffers_retired: u64,
}

impl From<gyre_transport::bench::ShuffleReport> for ShuffleFigures {
    fn from(r: gyre_transport::bench::ShuffleReport) -> Self {
        Self {
            node: r.node,
            bytes_sent: r.bytes_sent,
            bytes_received: r.bytes_received,
            messages_sent: r.messages_sent,
            messages_received: r.messages_received,
            wire_bytes_sent: r.wire_bytes_sent,
            wire_bytes_received: r.wire_bytes_received,
            elapsed_s: r.elapsed.as_secs_f64(),
            send_elapsed_s: r.send_elapsed.as_secs_f64(),
            recv_elapsed_s: r.recv_elapsed.as_secs_f64(),
            process_cpu_s: r.process_cpu.map(|d| d.as_secs_f64()),
            mux_cpu_s: r.mux_cpu.map(|d| d.as_secs_f64()),
            design: r.design.map(|d| DesignCost {
                setup_s: d.setup.as_secs_f64(),
                queue_pairs: d.queue_pairs,
                registered_bytes: d.registered_bytes,
                credit_wait_s: d.credit_wait.as_secs_f64(),
                credit_updates: d.credit_updates,
                buffers_mean: d.buffers.mean,
                buffers_peak: d.buffers.peak,
                buffers_over_time: d.buffers.timeline,
                buffers_lent: d.buffers.lent,
                buffers_retired: d.buffers.retired,
            }),
        }
    }
}

impl ShuffleFigures {
    /// Payload bytes per second sent.
    pub fn send_rate(&self) -> f64 {
        self.bytes_sent as f64 / self.send_elapsed_s.max(1e-9)
    }

    /// Payload bytes per second received.
    pub fn recv_rate(&self) -> f64 {
        self.bytes_received as f64 / self.recv_elapsed_s.max(1e-9)
    }
}

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("control messages serialise")
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    postcard::from_bytes(bytes)
        .map_err(|e| DataFusionError::Execution(format!("malformed control message: {e}")))
}

/// A connection to a node's control service; every message it sends is signed with the
/// cluster secret ([`crate::auth::node`]).
#[derive(Debug, Clone)]
pub struct ControlClient {
    addr: String,
    key: NodeKey,
    client: FlightServiceClient<Channel>,
    /// The node the calls are for (the coordinator is node 0): they are signed for it.
    to: NodeId,
}

impl ControlClient {
    /// A client of node `to` at `addr` (`host:port`), connected at its first call.
    pub fn connect_lazy(addr: &str, key: NodeKey, to: NodeId) -> Result<Self> {
        Self::connect_lazy_tls(addr, key, to, None)
    }

    /// As [`Self::connect_lazy`], over TLS when `ca` (PEM) is given: the node's
    /// certificate must chain to it.
    pub fn connect_lazy_tls(
        addr: &str,
        key: NodeKey,
        to: NodeId,
        ca: Option<&[u8]>,
    ) -> Result<Self> {
        let bad = |e: &dyn std::fmt::Display| {
            DataFusionError::Configuration(format!("bad address {addr}: {e}"))
        };
        let rest = match addr.split_once("://") {
            Some(("grpc+tls" | "https", _)) if ca.is_none() => {
                return Err(DataFusionError::Configuration(format!(
                    "{addr} speaks TLS: give the CA certificate of its certificate (--tls-ca)"
                )));
            }
            Some((_, rest)) => rest,
            None => addr,
        };
        let scheme = if ca.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{rest}");
        let mut endpoint = Channel::from_shared(url)
            .map_err(|e| bad(&e))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        if let Some(ca) = ca {
            endpoint = endpoint
                .tls_config(crate::auth::tls::trusting(ca))
                .map_err(|e| bad(&e))?;
        }
        Ok(Self {
            addr: addr.to_string(),
            key,
            client: FlightServiceClient::new(endpoint.connect_lazy())
                .max_decoding_message_size(MAX_CONTROL_MESSAGE)
                .max_encoding_message_size(MAX_CONTROL_MESSAGE),
            to,
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `req` as a control action signed for the node called.
    fn signed(&self, req: &Request) -> Result<tonic::Request<Action>> {
        let body = encode(req);
        let signature = self.key.sign(self.to, ACTION, &body);
        let mut request = tonic::Request::new(Action {
            r#type: ACTION.to_string(),
            body: body.into(),
        });
        let signature = signature
            .parse()
            .map_err(|_| DataFusionError::Internal("a signature is not a header value".into()))?;
        request.metadata_mut().insert(NODE_HEADER, signature);
        Ok(request)
    }

    /// Sends one request and waits for its response.
    pub async fn call(&self, req: &Request) -> Result<Response> {
        let request = self.signed(req)?;
        let mut client = self.client.clone();
        let mut stream = client
            .do_action(request)
            .await
            .map_err(|s| status_error(&self.addr, s))?
            .into_inner();
        let first = stream
            .next()
            .await
            .ok_or_else(|| DataFusionError::Execution(format!("{}: empty reply", self.addr)))?
            .map_err(|s| status_error(&self.addr, s))?;
        decode(&first.body)
    }
}

impl ControlClient {
    /// Sends one request whose reply is a stream of messages, and returns their bodies.
    pub async fn subscribe(
        &self,
        req: &Request,
    ) -> Result<futures::stream::BoxStream<'static, Result<bytes::Bytes>>> {
        let request = self.signed(req)?;
        let mut client = self.client.clone();
        let stream = client
            .do_action(request)
            .await
            .map_err(|s| status_error(&self.addr, s))?
            .into_inner();
        let addr = self.addr.clone();
        Ok(stream
            .map(move |r| r.map(|r| r.body).map_err(|s| status_error(&addr, s)))
            .boxed())
    }
}

/// A failed call as an error. A refusal (`Unauthenticated`) is a configuration error:
/// trying again will not help.
fn status_error(addr: &str, s: tonic::Status) -> DataFusionError {
    if s.code() == tonic::Code::Unauthenticated {
        return DataFusionError::Configuration(format!("{addr} refused: {}", s.message()));
    }
    DataFusionError::Execution(format!("{addr}: {}", s.message()))
}
