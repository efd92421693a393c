//! The synthetic shuffle benchmark: every participating node calls
//! [`run_shuffle`] with the same [`ShuffleSpec`] (except `index`), at about
//! the same time.
//!
//! - Repartition: each of the n nodes sends `total_bytes / n`, split evenly
//!   over the n-1 other nodes (the share a node keeps in a real shuffle never
//!   crosses the network, so it is not sent).
//! - Broadcast: each node broadcasts `total_bytes / n` to all n-1 others, one
//!   message per buffer put to all destinations.
//!
//! The payload is generated once, before the clock starts; sending copies it
//! into pool buffers as an exchange's encoder would. Every message starts
//! with (source index, destination index, sequence number) and is otherwise
//! a prefix of the payload; the receiver checks each message's header, its
//! length against the plan and every byte against the payload, and the
//! message count per source, so a run that returns `Ok` moved every expected
//! byte intact and in order. Nodes meet at a barrier (an empty message from
//! every node to every node) before the clock starts and again after it
//! stops.

use crate::endpoint::{ReceiveSpec, SendSpec, To};
use crate::schedule::Schedule;
use crate::{NodeId, Transport, TransportError, cpu, node_name};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Query ids of benchmark runs (the engine counts its queries from 1).
pub const BENCH_QUERY_BASE: u64 = 1 << 63;
/// Bytes at the start of every message: source index, destination index, sequence.
pub const MESSAGE_HEADER: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Repartition,
    Broadcast,
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "repartition" | "shuffle" => Ok(Self::Repartition),
            "broadcast" => Ok(Self::Broadcast),
            other => Err(format!(
                "unknown pattern '{other}' (expected repartition or broadcast)"
            )),
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Repartition => "repartition",
            Self::Broadcast => "broadcast",
        })
    }
}

/// What to run; the same on every node except `index`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShuffleSpec {
    /// The participating nodes, in the same order on every node.
    pub nodes: Vec<NodeId>,
    /// This node's position in `nodes`.
    pub index: usize,
    pub pattern: Pattern,
    /// Bytes all nodes together send (see the module doc).
    pub total_bytes: u64,
    /// Bytes per message; at most the transport's buffer size.
    pub message_size: usize,
    pub schedule: Schedule,
    /// Distinguishes the runs of one cluster; every node of a run must use the same.
    pub run_id: u64,
}

impl ShuffleSpec {
    /// Whether this node (`me`, sending messages of at most `max_message` bytes)
    /// can run the spec.
    fn check(&self, me: NodeId, max_message: usize) -> Result<(), BenchError> {
        let n = self.nodes.len();
        if n < 2 {
            return Err(BenchError::Spec(
                "a shuffle needs at least two nodes".into(),
            ));
        }
        if self.index >= n || self.nodes[self.index] != me {
            return Err(BenchError::Spec(format!(
                "position {} does not name this node ({})",
                self.index,
                node_name(me)
            )));
        }
        if self.message_size < MESSAGE_HEADER || self.message_size > max_message {
            return Err(BenchError::Spec(format!(
                "message size {} must be between {MESSAGE_HEADER} and the endpoints' payload \
                 size {max_message}",
                self.message_size
            )));
        }
        Ok(())
    }
}

/// Traffic with one peer in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerFigures {
    pub peer: NodeId,
    /// Payload bytes sent to / received from the peer.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// When the peer's last message arrived, from the start.
    pub recv_done: Duration,
}

/// What one node measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ShuffleReport {
    pub node: NodeId,
    pub pattern: Pattern,
    pub schedule: Schedule,
    /// Payload bytes this node sent (a broadcast message counts once per destination).
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    /// Bytes on the wire (frame headers included), from the transport's counters.
    pub wire_bytes_sent: u64,
    pub wire_bytes_received: u64,
    /// From the start barrier until every message was written and every expected
    /// message arrived.
    pub elapsed: Duration,
    /// Until this node's last message was written to its sockets.
    pub send_elapsed: Duration,
    /// Until the last expected message arrived.
    pub recv_elapsed: Duration,
    pub peers: Vec<PeerFigures>,
    /// CPU time of the whole process during the run (all its threads; with several
    /// nodes in one process, theirs too).
    pub process_cpu: Option<Duration>,
    /// CPU time of this node's multiplexer thread during the run.
    pub mux_cpu: Option<Duration>,
    /// What a verbs design's run used (none for the TCP transport's).
    pub design: Option<DesignFigures>,
}

/// A node's cost of a run over a verbs design beyond time and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct DesignFigures {
    /// Opening and connecting the run's endpoints (waiting for every peer's).
    pub setup: Duration,
    /// Queue pairs and registered bytes of the node's endpoints.
    pub queue_pairs: u64,
    pub registered_bytes: u64,
    /// Time senders waited for credit, and credit updates receivers wrote.
    pub credit_wait: Duration,
    pub credit_updates: u64,
    /// The receiving endpoint's buffers over the run.
    pub buffers: BufferFigures,
}

/// A receiving endpoint's buffers over a run (sampled every millisecond),
/// and what adaptive buffering moved.
#[derive(Debug, Clone, PartialEq)]
pub struct BufferFigures {
    pub mean: f64,
    pub peak: u64,
    /// Buffers held over the run: at most 200 points, each the largest of
    /// an equal share of the samples.
    pub timeline: Vec<u32>,
    /// Buffers lent to streams whose senders waited for credit, and taken
    /// out of circulation where messages piled up.
    pub lent: u64,
    pub retired: u64,
}

impl ShuffleReport {
    /// Payload bytes per second sent.
    pub fn send_rate(&self) -> f64 {
        self.bytes_sent as f64 / self.send_elapsed.as_secs_f64().max(1e-9)
    }

    /// Payload bytes per second received.
    pub fn recv_rate(&self) -> f64 {
        self.bytes_received as f64 / self.recv_elapsed.as_secs_f64().max(1e-9)
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BenchError {
    Spec(String),
    Transport(TransportError),
    /// Data arrived wrong or incomplete.
    Verify(String),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Spec(m) => write!(f, "bad shuffle spec: {m}"),
            Self::Transport(e) => write!(f, "{e}"),
            Self::Verify(m) => write!(f, "verification failed: {m}"),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<TransportError> for BenchError {
    fn from(e: TransportError) -> Self {
        Self::Transport(e)
    }
}

/// The lengths of the messages node `src` sends to node `dst` (positions in `nodes`).
/// For a broadcast, `dst` is ignored: every destination gets the same messages.
pub fn plan(spec: &ShuffleSpec, src: usize, dst: usize) -> Vec<usize> {
    if src == dst {
        return vec![];
    }
    let n = spec.nodes.len() as u64;
    let per_node = spec.total_bytes / n;
    let bytes = match spec.pattern {
        Pattern::Broadcast => per_node,
        Pattern::Repartition => {
            // Split per_node over the n-1 others; the first `extra` get a byte more.
            let others = n - 1;
            let rank = ((dst + spec.nodes.len() - src) % spec.nodes.len()) as u64 - 1;
            per_node / others + u64::from(rank < per_node % others)
        }
    };
    let size = spec.message_size as u64;
    let mut out = vec![spec.message_size; (bytes / size) as usize];
    let rest = (bytes % size) as usize;
    if rest > 0 {
        out.push(rest.max(MESSAGE_HEADER));
    }
    out
}

fn payload(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(size);
    out
}

fn header(src: usize, dst: usize, seq: u64) -> [u8; MESSAGE_HEADER] {
    let mut h = [0u8; MESSAGE_HEADER];
    h[..4].copy_from_slice(&(src as u32).to_le_bytes());
    h[4..8].copy_from_slice(&(dst as u32).to_le_bytes());
    h[8..].copy_from_slice(&seq.to_le_bytes());
    h
}

/// A broadcast message names no single destination.
const ANY: usize = u32::MAX as usize;

/// Every node sends an empty message to every other one and waits for theirs.
async fn barrier(t: &dyn Transport, spec: &ShuffleSpec, exchange: u32) -> Result<(), BenchError> {
    let query = BENCH_QUERY_BASE | spec.run_id;
    let me = spec.nodes[spec.index];
    let others: Vec<NodeId> = spec.nodes.iter().copied().filter(|n| *n != me).collect();
    let send = t.open_send(SendSpec {
        query,
        exchange,
        from: spec.index as u32,
        destinations: others.clone(),
        groups: vec![],
    })?;
    let recv = t.open_receive(ReceiveSpec {
        query,
        exchange,
        sources: spec
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != me)
            .map(|(i, n)| (i as u32, *n))
            .collect(),
    })?;
    send.finish();
    while recv.get().await?.is_some() {}
    // Written before the caller may release the query (which drops what is queued).
    send.flushed().await;
    Ok(())
}

/// Runs one shuffle between `spec.nodes` (see the module doc); every node must call it.
pub async fn run_shuffle(
    t: &dyn Transport,
    spec: &ShuffleSpec,
) -> Result<ShuffleReport, BenchError> {
    spec.check(t.node_id(), t.message_size())?;
    let n = spec.nodes.len();
    let query = BENCH_QUERY_BASE | spec.run_id;
    let others: Vec<usize> = (1..n).map(|k| (spec.index + k) % n).collect();
    t.set_schedule(spec.schedule);
    let data = std::sync::Arc::new(payload(spec.message_size, 0x9e37_79b9_7f4a_7c15));
    barrier(t, spec, 0).await?;

    let send = std::sync::Arc::new(t.open_send(SendSpec {
        query,
        exchange: 1,
        from: spec.index as u32,
        destinations: others.iter().map(|&i| spec.nodes[i]).collect(),
        groups: vec![],
    })?);
    let recv = t.open_receive(ReceiveSpec {
        query,
        exchange: 1,
        sources: others.iter().map(|&i| (i as u32, spec.nodes[i])).collect(),
    })?;
    let stats0 = t.stats();
    let cpu0 = cpu::process_cpu();
    let start = Instant::now();
    let moved = exchange(
        spec,
        &data,
        &[Arc::clone(&send)],
        Senders::ONE,
        &recv,
        0,
        start,
    )
    .await?;
    let elapsed = start.elapsed();
    let cpu1 = cpu::process_cpu();
    let stats1 = t.stats();
    drop((send, recv));
    barrier(t, spec, 2).await?;
    t.release_query(query);
    Ok(moved.report(
        spec,
        elapsed,
        stats1.bytes_sent - stats0.bytes_sent,
        stats1.bytes_received - stats0.bytes_received,
        cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        stats0
            .mux_cpu
            .zip(stats1.mux_cpu)
            .map(|(a, b)| b.saturating_sub(a)),
    ))
}

/// How a node receives in a design run: from its own buffers or a pool the
/// node shares (adaptive buffers), and how much work each message costs.
#[derive(Debug, Clone, Default)]
pub struct Receiving {
    /// The node's shared pool (its carrier's), for `DesignReceive::open_pooled`.
    pub pool: Option<Arc<crate::design::BufferPool>>,
    /// Busy nanoseconds per KiB received, spent while the message's buffer is
    /// held: a query fragment's processing after its receive (the paper's
    /// cycles per tuple).
    pub ns_per_kib: u64,
}

/// Runs one shuffle between `spec.nodes` over a verbs design on `carrier`
/// (`config.primitive` chooses which), sent by `senders`. Every node must
/// call it. The same plan and checks as [`run_shuffle`]; there is no
/// multiplexer, so `mux_cpu` is `None`, and the wire bytes count each
/// message's design header.
pub async fn run_design_shuffle(
    carrier: Arc<dyn crate::verbs::Carrier>,
    connector: Arc<dyn crate::design::Connector>,
    config: crate::design::DesignConfig,
    spec: &ShuffleSpec,
    senders: Senders,
    receiving: Receiving,
) -> Result<ShuffleReport, BenchError> {
    use crate::design::{DesignReceive, DesignSend, HEADER};
    spec.check(carrier.node(), config.payload())?;
    if senders.threads == 0 {
        return Err(BenchError::Spec("a node needs a sending thread".into()));
    }
    let n = spec.nodes.len();
    let query = BENCH_QUERY_BASE | spec.run_id;
    let others: Vec<usize> = (1..n).map(|k| (spec.index + k) % n).collect();
    let data = Arc::new(payload(spec.message_size, 0x9e37_79b9_7f4a_7c15));
    // Source `i`'s stream `k` is slot `i * streams + k`.
    let open = |exchange: u32, senders: Senders| {
        let streams = senders.streams();
        let receive = ReceiveSpec {
            query,
            exchange,
            sources: others
                .iter()
                .flat_map(|&i| (0..streams).map(move |k| ((i * streams + k) as u32, i)))
                .map(|(slot, i)| (slot, spec.nodes[i]))
                .collect(),
        };
        let (on, meet, settings) = (Arc::clone(&carrier), Arc::clone(&connector), config.clone());
        let recv = match (&receiving.pool, exchange) {
            (Some(pool), 1) => {
                DesignReceive::open_pooled(on, meet, settings, receive, Arc::clone(pool))
            }
            _ => DesignReceive::open(on, meet, settings, receive),
        }?;
        let sends = (0..streams)
            .map(|k| {
                DesignSend::open(
                    Arc::clone(&carrier),
                    Arc::clone(&connector),
                    config.clone(),
                    SendSpec {
                        query,
                        exchange,
                        from: (spec.index * streams + k) as u32,
                        destinations: others.iter().map(|&i| spec.nodes[i]).collect(),
                        groups: vec![],
                    },
                )
                .map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok::<_, TransportError>((sends, recv))
    };
    // Connecting is the start barrier: every stream's handshake needs both sides.
    let opening = Instant::now();
    let (sends, recv) = open(1, senders)?;
    for r in futures::future::join_all(sends.iter().map(|s| s.connect())).await {
        r?;
    }
    let setup = opening.elapsed();
    let footprint = sends
        .iter()
        .map(|s| s.footprint())
        .fold(recv.footprint(), |a, b| a + b);
    let cpu0 = cpu::process_cpu();
    let start = Instant::now();
    // The receiving buffers over time, sampled every millisecond.
    let running = std::sync::atomic::AtomicBool::new(true);
    let sampling = async {
        let mut samples = vec![recv.buffers_held()];
        while running.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            samples.push(recv.buffers_held());
        }
        samples
    };
    let moving = async {
        let moved = exchange(
            spec,
            &data,
            &sends,
            senders,
            &recv,
            receiving.ns_per_kib,
            start,
        )
        .await;
        running.store(false, std::sync::atomic::Ordering::Relaxed);
        moved
    };
    let (moved, samples) = tokio::join!(moving, sampling);
    let moved = moved?;
    let elapsed = start.elapsed();
    let cpu1 = cpu::process_cpu();
    let credit_wait = sends.iter().map(|s| s.credit_wait()).sum();
    let credit_updates = recv.credit_updates();
    let buffers = BufferFigures {
        mean: samples.iter().sum::<usize>() as f64 / samples.len() as f64,
        peak: samples.iter().copied().max().unwrap_or(0) as u64,
        timeline: samples
            .chunks(samples.len().div_ceil(200).max(1))
            .map(|c| c.iter().copied().max().unwrap_or(0) as u32)
            .collect(),
        lent: recv.lent(),
        retired: recv.retired(),
    };
    drop((sends, recv));
    // The end barrier: no node's endpoints go before every node is done.
    let (sends, recv) = open(2, Senders::ONE)?;
    sends[0].finish().await?;
    while recv.get().await?.is_some() {}
    sends[0].flushed().await?;
    let copies = match spec.pattern {
        Pattern::Repartition => 1,
        Pattern::Broadcast => n as u64 - 1,
    };
    let wire_sent = moved.sent.iter().sum::<u64>() + moved.messages_sent * copies * HEADER as u64;
    let wire_received =
        moved.received.iter().sum::<u64>() + moved.messages_received * HEADER as u64;
    let mut report = moved.report(
        spec,
        elapsed,
        wire_sent,
        wire_received,
        cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        None,
    );
    report.design = Some(DesignFigures {
        setup,
        queue_pairs: footprint.queue_pairs,
        registered_bytes: footprint.registered_bytes,
        credit_wait,
        credit_updates,
        buffers,
    });
    Ok(report)
}

/// The bandwidth-delay product in buffers (the paper's equation 1): how many
/// messages of `message_size` bytes are in flight at `bytes_per_sec` during
/// one `round_trip`, so that a window of that many keeps the link busy when
/// the consumer adds no delay of its own.
pub fn bdp_window(bytes_per_sec: f64, round_trip: Duration, message_size: usize) -> u32 {
    let bytes = bytes_per_sec * round_trip.as_secs_f64();
    ((bytes / message_size.max(1) as f64).ceil() as u32).max(1)
}

/// The median round trip of a small message and its answer between the first
/// two of `carriers` over a verbs design: the latency of the bandwidth-delay
/// product (the paper takes it from qperf).
pub async fn design_round_trip(
    carriers: [Arc<dyn crate::verbs::Carrier>; 2],
    connector: Arc<dyn crate::design::Connector>,
    config: crate::design::DesignConfig,
    rounds: usize,
    run_id: u64,
) -> Result<Duration, BenchError> {
    use crate::design::{DesignReceive, DesignSend};
    let query = BENCH_QUERY_BASE | run_id;
    let nodes = [carriers[0].node(), carriers[1].node()];
    let mut ends = Vec::new();
    for k in 0..2 {
        let send = DesignSend::open(
            Arc::clone(&carriers[k]),
            Arc::clone(&connector),
            config.clone(),
            SendSpec {
                query,
                exchange: 3,
                from: k as u32,
                destinations: vec![nodes[1 - k]],
                groups: vec![],
            },
        )?;
        let recv = DesignReceive::open(
            Arc::clone(&carriers[k]),
            Arc::clone(&connector),
            config.clone(),
            ReceiveSpec {
                query,
                exchange: 3,
                sources: vec![(1 - k as u32, nodes[1 - k])],
            },
        )?;
        ends.push((send, recv));
    }
    let (a, b) = (&ends[0], &ends[1]);
    futures::future::try_join(a.0.connect(), b.0.connect()).await?;
    async fn hop(
        send: &DesignSend,
        to: NodeId,
        recv: &DesignReceive,
        last: bool,
    ) -> Result<(), TransportError> {
        let mut m = send.acquire(To::Node(to)).await?;
        m.extend_from_slice(&[7; 64]);
        send.put(m, last)?;
        match recv.get().await? {
            Some(m) => recv.release(m),
            None => Err(TransportError::Misuse(
                "a round trip's stream ended early".into(),
            )),
        }
    }
    let mut times = Vec::with_capacity(rounds);
    for r in 0..rounds.max(1) {
        let last = r + 1 == rounds.max(1);
        let start = Instant::now();
        hop(&a.0, nodes[1], &b.1, last).await?;
        hop(&b.0, nodes[0], &a.1, last).await?;
        times.push(start.elapsed());
    }
    for (send, recv) in &ends {
        send.flushed().await?;
        while recv.get().await?.is_some() {}
    }
    times.sort();
    Ok(times[times.len() / 2])
}

impl BenchSend for crate::design::DesignSend {
    type Buffer = crate::design::DesignBuffer;
    async fn acquire(&self, to: To) -> Result<Self::Buffer, TransportError> {
        self.acquire(to).await
    }
    fn append(buf: &mut Self::Buffer, bytes: &[u8]) {
        assert!(
            buf.extend_from_slice(bytes),
            "a benchmark message overfills its buffer"
        );
    }
    fn put(&self, buf: Self::Buffer, last: bool) -> Result<(), TransportError> {
        self.put(buf, last)
    }
    async fn finish(&self) -> Result<(), TransportError> {
        self.finish().await?;
        self.flushed().await
    }
}

impl BenchReceive for crate::design::DesignReceive {
    async fn next<T>(
        &self,
        f: impl FnOnce(u32, NodeId, bool, &[u8]) -> T,
    ) -> Result<Option<T>, TransportError> {
        let Some(r) = self.get().await? else {
            return Ok(None);
        };
        let out = f(r.slot, r.node, r.last, self.data(&r));
        self.release(r)?;
        Ok(Some(out))
    }
}

/// What a run's endpoints need to offer: Gyre's TCP endpoints and the
/// RDMA-aware designs ([`crate::design`]) are driven and checked by the same
/// code, so their figures compare.
pub trait BenchSend: Send + Sync + 'static {
    type Buffer: Send;
    fn acquire(&self, to: To) -> impl Future<Output = Result<Self::Buffer, TransportError>> + Send;
    /// Appends to a buffer (the run never overfills one).
    fn append(buf: &mut Self::Buffer, bytes: &[u8]);
    fn put(&self, buf: Self::Buffer, last: bool) -> Result<(), TransportError>;
    /// Ends every stream and waits until everything put is carried.
    fn finish(&self) -> impl Future<Output = Result<(), TransportError>> + Send;
}

/// The receiving half of [`BenchSend`].
pub trait BenchReceive {
    /// Hands the next message (source slot, node, last, payload) to `f` and
    /// gives its buffer back; `None` once every stream ended.
    fn next<T>(
        &self,
        f: impl FnOnce(u32, NodeId, bool, &[u8]) -> T,
    ) -> impl Future<Output = Result<Option<T>, TransportError>>;
}

impl BenchSend for crate::endpoint::SendEndpoint {
    type Buffer = crate::endpoint::SendBuffer;
    async fn acquire(&self, to: To) -> Result<Self::Buffer, TransportError> {
        self.acquire(to).await
    }
    fn append(buf: &mut Self::Buffer, bytes: &[u8]) {
        buf.extend_from_slice(bytes);
    }
    fn put(&self, buf: Self::Buffer, last: bool) -> Result<(), TransportError> {
        self.put(buf, last)
    }
    async fn finish(&self) -> Result<(), TransportError> {
        self.finish();
        self.flushed().await;
        Ok(())
    }
}

impl BenchReceive for crate::endpoint::ReceiveEndpoint {
    async fn next<T>(
        &self,
        f: impl FnOnce(u32, NodeId, bool, &[u8]) -> T,
    ) -> Result<Option<T>, TransportError> {
        let Some(r) = self.get().await? else {
            return Ok(None);
        };
        let out = f(r.slot, r.node, r.last, r.data());
        self.release(r);
        Ok(Some(out))
    }
}

/// What one node's half of a run moved.
struct Moved {
    sent: Vec<u64>,
    received: Vec<u64>,
    done: Vec<Duration>,
    messages_sent: u64,
    messages_received: u64,
    send_elapsed: Duration,
    recv_elapsed: Duration,
}

impl Moved {
    fn report(
        self,
        spec: &ShuffleSpec,
        elapsed: Duration,
        wire_bytes_sent: u64,
        wire_bytes_received: u64,
        process_cpu: Option<Duration>,
        mux_cpu: Option<Duration>,
    ) -> ShuffleReport {
        let n = spec.nodes.len();
        let peers = (1..n)
            .map(|k| (spec.index + k) % n)
            .map(|o| PeerFigures {
                peer: spec.nodes[o],
                bytes_sent: self.sent[o],
                bytes_received: self.received[o],
                recv_done: self.done[o],
            })
            .collect();
        ShuffleReport {
            node: spec.nodes[spec.index],
            pattern: spec.pattern,
            schedule: spec.schedule,
            bytes_sent: self.sent.iter().sum(),
            bytes_received: self.received.iter().sum(),
            messages_sent: self.messages_sent,
            messages_received: self.messages_received,
            wire_bytes_sent,
            wire_bytes_received,
            elapsed,
            send_elapsed: self.send_elapsed,
            recv_elapsed: self.recv_elapsed,
            peers,
            process_cpu,
            mux_cpu,
            design: None,
        }
    }
}

/// How a node's share is sent: by `threads` tasks, each through an endpoint
/// of its own (the paper's ME) or all through one (SE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Senders {
    pub threads: usize,
    pub shared: bool,
}

impl Senders {
    /// One task, one endpoint.
    pub const ONE: Senders = Senders {
        threads: 1,
        shared: false,
    };

    /// Streams a node sends each destination: one per endpoint.
    pub fn streams(self) -> usize {
        if self.shared { 1 } else { self.threads }
    }
}

/// Sends part `k` of `parts` of this node's share through `send`: the
/// messages whose sequence number is `k` modulo `parts`; with one part the
/// last message ends each stream, else `finish` does. Returns bytes per
/// destination and messages.
async fn send_part<S: BenchSend>(
    spec: &ShuffleSpec,
    data: &[u8],
    send: &S,
    k: usize,
    parts: usize,
) -> Result<(Vec<u64>, u64), BenchError> {
    let n = spec.nodes.len();
    let others: Vec<usize> = (1..n).map(|j| (spec.index + j) % n).collect();
    let mut sent = vec![0u64; n];
    let mut messages = 0u64;
    match spec.pattern {
        Pattern::Broadcast => {
            let lens = plan(spec, spec.index, others[0]);
            for (seq, &len) in lens.iter().enumerate().skip(k).step_by(parts) {
                let mut buf = send.acquire(To::All).await?;
                S::append(&mut buf, &header(spec.index, ANY, seq as u64));
                S::append(&mut buf, &data[MESSAGE_HEADER..len]);
                send.put(buf, parts == 1 && seq + 1 == lens.len())?;
                messages += 1;
                for &o in &others {
                    sent[o] += len as u64;
                }
            }
        }
        Pattern::Repartition => {
            // Round-robin over the destinations, so every one is fed all along.
            let plans: Vec<Vec<usize>> =
                others.iter().map(|&d| plan(spec, spec.index, d)).collect();
            let rounds = plans.iter().map(Vec::len).max().unwrap_or(0);
            for seq in (k..rounds).step_by(parts) {
                for (j, &d) in others.iter().enumerate() {
                    let Some(&len) = plans[j].get(seq) else {
                        continue;
                    };
                    let mut buf = send.acquire(To::Node(spec.nodes[d])).await?;
                    S::append(&mut buf, &header(spec.index, d, seq as u64));
                    S::append(&mut buf, &data[MESSAGE_HEADER..len]);
                    send.put(buf, parts == 1 && seq + 1 == plans[j].len())?;
                    messages += 1;
                    sent[d] += len as u64;
                }
            }
        }
    }
    Ok((sent, messages))
}

/// Sends this node's share and receives and checks everything sent to it.
/// `sends` holds one endpoint, or (ME) one per sending task; a source's
/// stream `k` is sender slot `source * senders.streams() + k`.
/// `ns_per_kib`: busy time per KiB received, spent holding the message.
#[allow(clippy::too_many_arguments)]
async fn exchange<S: BenchSend, R: BenchReceive>(
    spec: &ShuffleSpec,
    data: &Arc<Vec<u8>>,
    sends: &[Arc<S>],
    senders: Senders,
    recv: &R,
    ns_per_kib: u64,
    start: Instant,
) -> Result<Moved, BenchError> {
    let n = spec.nodes.len();
    let others: Vec<usize> = (1..n).map(|k| (spec.index + k) % n).collect();
    let threads = senders.threads.max(1);
    let sending = async {
        let tasks: Vec<_> = (0..threads)
            .map(|k| {
                let send = Arc::clone(&sends[if senders.shared { 0 } else { k }]);
                let (spec, data) = (spec.clone(), Arc::clone(data));
                tokio::spawn(async move {
                    let part = send_part(&spec, &data, &*send, k, threads).await?;
                    if !senders.shared {
                        send.finish().await?;
                    }
                    Ok::<_, BenchError>(part)
                })
            })
            .collect();
        let mut sent = vec![0u64; n];
        let mut messages = 0u64;
        for t in futures::future::join_all(tasks).await {
            let (s, m) =
                t.map_err(|e| BenchError::Spec(format!("a sending task failed: {e}")))??;
            sent.iter_mut().zip(s).for_each(|(a, b)| *a += b);
            messages += m;
        }
        if senders.shared {
            sends[0].finish().await?;
        }
        Ok::<_, BenchError>((sent, messages, start.elapsed()))
    };

    let receiving = async {
        let streams = senders.streams();
        let mut received = vec![0u64; n];
        // Per stream, the sequence number it carries next: its messages come in
        // order, every `streams`-th of its source's from its own; one endpoint
        // shared by several tasks (SE) carries them in any order.
        let ordered = !senders.shared || threads == 1;
        let mut next_seq: Vec<u64> = (0..n * streams).map(|s| (s % streams) as u64).collect();
        let mut seen: Vec<Vec<bool>> = vec![vec![]; n];
        let mut got = vec![0u64; n];
        let mut ended = vec![0usize; n];
        let mut done = vec![Duration::ZERO; n];
        let mut messages = 0u64;
        let expected: Vec<Vec<usize>> = (0..n).map(|s| plan(spec, s, spec.index)).collect();
        for (s, e) in expected.iter().enumerate() {
            seen[s] = vec![false; e.len()];
        }
        let want_dst = match spec.pattern {
            Pattern::Broadcast => ANY,
            Pattern::Repartition => spec.index,
        };
        let mut check = |slot: u32, node: NodeId, last: bool, m: &[u8]| {
            let stream = slot as usize;
            let src = stream / streams;
            if src >= n {
                return Err(BenchError::Verify(format!(
                    "a message from unknown slot {slot}"
                )));
            }
            if !m.is_empty() {
                let seq = match m.get(8..MESSAGE_HEADER) {
                    Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
                    None => u64::MAX,
                };
                let want_len = expected[src].get(seq as usize).copied();
                let wrong = |what: &str| {
                    Err(BenchError::Verify(format!(
                        "message {seq} from {} {what}",
                        node_name(node)
                    )))
                };
                let Some(want_len) = want_len else {
                    return wrong(&format!(
                        "is not among the {} messages planned",
                        expected[src].len()
                    ));
                };
                if ordered && seq != next_seq[stream] {
                    return wrong(&format!("came where {} was due", next_seq[stream]));
                }
                if seen[src][seq as usize] {
                    return wrong("came twice");
                }
                if m.len() != want_len || m[..MESSAGE_HEADER] != header(src, want_dst, seq) {
                    return wrong("has the wrong length or header");
                }
                if m[MESSAGE_HEADER..] != data[MESSAGE_HEADER..want_len] {
                    return wrong("has corrupt bytes");
                }
                if ns_per_kib > 0 {
                    let busy = Duration::from_nanos(ns_per_kib * m.len() as u64 / 1024);
                    let from = Instant::now();
                    while from.elapsed() < busy {
                        std::hint::spin_loop();
                    }
                }
                seen[src][seq as usize] = true;
                next_seq[stream] += streams as u64;
                got[src] += 1;
                received[src] += m.len() as u64;
                messages += 1;
            }
            if last {
                ended[src] += 1;
                if ended[src] == streams {
                    done[src] = start.elapsed();
                    if got[src] as usize != expected[src].len() {
                        return Err(BenchError::Verify(format!(
                            "{} ended after {} of {} messages",
                            node_name(node),
                            got[src],
                            expected[src].len()
                        )));
                    }
                }
            }
            Ok(())
        };
        while let Some(checked) = recv.next(&mut check).await? {
            checked?;
        }
        // Every source must have ended with all its messages.
        for &o in &others {
            if got[o] as usize != expected[o].len() {
                return Err(BenchError::Verify(format!(
                    "{} delivered {} of {} messages",
                    node_name(spec.nodes[o]),
                    got[o],
                    expected[o].len()
                )));
            }
        }
        Ok::<_, BenchError>((received, messages, done, start.elapsed()))
    };

    let (sent, got) = tokio::join!(sending, receiving);
    let ((sent, messages_sent, send_elapsed), (received, messages_received, done, recv_elapsed)) =
        (sent?, got?);
    Ok(Moved {
        sent,
        received,
        done,
        messages_sent,
        messages_received,
        send_elapsed,
        recv_elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pattern: Pattern, total: u64) -> ShuffleSpec {
        ShuffleSpec {
            nodes: vec![1, 2, 3],
            index: 0,
            pattern,
            total_bytes: total,
            message_size: 1000,
            schedule: Schedule::Free,
            run_id: 1,
        }
    }

    #[test]
    fn plans_add_up_to_the_total() {
        let s = spec(Pattern::Repartition, 30_001);
        let total: usize = (0..3)
            .flat_map(|src| (0..3).filter(move |d| *d != src).map(move |d| (src, d)))
            .map(|(src, d)| plan(&s, src, d).iter().sum::<usize>())
            .sum();
        // Each node sends 10_000 bytes, split 5_000 / 5_000.
        assert_eq!(total, 30_000);
        assert_eq!(plan(&s, 0, 1), vec![1000; 5]);
        let b = spec(Pattern::Broadcast, 3_500);
        assert_eq!(plan(&b, 0, 2), vec![1000, 166]);
    }

    /// Every node of an in-process shared-memory cluster runs the same spec over
    /// `primitive` (datagrams: messages of at most 4 KiB).
    async fn design_run(
        primitive: crate::design::Primitive,
        senders: Senders,
        nodes: u32,
        pattern: Pattern,
        total: u64,
        message: usize,
    ) -> Vec<ShuffleReport> {
        use crate::design::{DesignConfig, LocalConnector, Primitive};
        let (_dir, carriers) = crate::shm::test_nodes(nodes, 64 << 20);
        let connector = LocalConnector::new();
        let ids: Vec<NodeId> = (1..=nodes).collect();
        let runs = carriers.into_iter().enumerate().map(|(index, carrier)| {
            let connector = connector.clone();
            let spec = ShuffleSpec {
                nodes: ids.clone(),
                index,
                pattern,
                total_bytes: total,
                message_size: message,
                schedule: Schedule::Free,
                run_id: 7,
            };
            tokio::spawn(async move {
                let config = DesignConfig {
                    message_size: if primitive == Primitive::Datagram {
                        4096
                    } else {
                        8192
                    },
                    primitive,
                    ..Default::default()
                };
                run_design_shuffle(
                    carrier,
                    connector,
                    config,
                    &spec,
                    senders,
                    Receiving::default(),
                )
                .await
            })
        });
        futures::future::join_all(runs)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_design_shuffle_moves_and_checks_every_byte() {
        use crate::design::Primitive;
        for primitive in [Primitive::Send, Primitive::Read, Primitive::Write] {
            // 100 messages per pair and a short last one.
            let reports = design_run(
                primitive,
                Senders::ONE,
                4,
                Pattern::Repartition,
                4 * 3 * 8000 * 100 + 4 * 3 * 123,
                8000,
            )
            .await;
            for r in &reports {
                assert_eq!(r.bytes_sent, 3 * (8000 * 100 + 123), "{primitive:?}");
                assert_eq!(r.bytes_received, r.bytes_sent);
                assert_eq!(r.messages_received, 3 * 101);
                assert_eq!(r.wire_bytes_sent, r.bytes_sent + 3 * 101 * 16);
                assert!(r.mux_cpu.is_none());
            }
        }
        let reports = design_run(
            Primitive::Datagram,
            Senders::ONE,
            4,
            Pattern::Repartition,
            4 * 3 * 4000 * 300,
            4000,
        )
        .await;
        for r in &reports {
            assert_eq!(r.bytes_received, 3 * 4000 * 300);
            assert_eq!(r.messages_received, 3 * 300);
        }
        for primitive in [
            Primitive::Send,
            Primitive::Datagram,
            Primitive::Read,
            Primitive::Write,
        ] {
            let reports = design_run(
                primitive,
                Senders::ONE,
                3,
                Pattern::Broadcast,
                3 * 50_000,
                4000,
            )
            .await;
            for r in &reports {
                assert_eq!(r.bytes_sent, 2 * 50_000, "{primitive:?}");
                assert_eq!(r.bytes_received, 2 * 50_000);
            }
        }
    }

    /// Several sending tasks per node, through one shared endpoint (SE) or one
    /// each (ME): every message arrives once, with ME's streams in order; ME
    /// holds a queue pair per task and destination.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn several_senders_share_one_endpoint_or_open_their_own() {
        use crate::design::Primitive;
        for primitive in [
            Primitive::Send,
            Primitive::Datagram,
            Primitive::Read,
            Primitive::Write,
        ] {
            for shared in [true, false] {
                let senders = Senders { threads: 3, shared };
                let reports = design_run(
                    primitive,
                    senders,
                    3,
                    Pattern::Repartition,
                    3 * 2 * 3000 * 101,
                    3000,
                )
                .await;
                for r in &reports {
                    assert_eq!(
                        r.bytes_received,
                        2 * 3000 * 101,
                        "{primitive:?} {senders:?}"
                    );
                    assert_eq!(r.messages_received, 2 * 101);
                    let d = r.design.clone().expect("design figures");
                    // Per node: a queue pair per sending endpoint and source
                    // stream (and one per datagram endpoint).
                    let endpoints = if shared { 1 } else { 3 };
                    let datagram = u64::from(primitive == Primitive::Datagram);
                    assert_eq!(
                        d.queue_pairs,
                        endpoints * (2 + datagram) + 2 * endpoints + datagram,
                        "{primitive:?} {senders:?}"
                    );
                }
                let reports =
                    design_run(primitive, senders, 3, Pattern::Broadcast, 3 * 100_000, 3000).await;
                for r in &reports {
                    assert_eq!(r.bytes_received, 2 * 100_000, "{primitive:?} {senders:?}");
                }
            }
        }
    }

    /// Adaptive buffers in a run: receivers take their buffers from their
    /// node's pool and a consumer that spends time per message; every byte is
    /// checked as in any run, the figures say what circulated, and each pool
    /// has its buffers back afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_adaptive_run_lends_from_the_pool_and_checks_every_byte() {
        use crate::design::{BufferPool, DesignConfig, LocalConnector, Primitive};
        for primitive in [Primitive::Send, Primitive::Datagram] {
            let (_dir, carriers) = crate::shm::test_nodes(2, 64 << 20);
            let connector = LocalConnector::new();
            let config = DesignConfig {
                message_size: 4096,
                primitive,
                window: 2,
                credit_every: 1,
                adaptive: Some(32),
                ..Default::default()
            };
            let pools: Vec<_> = carriers
                .iter()
                .map(|c| BufferPool::register(&**c, 64, 4096).unwrap())
                .collect();
            let runs = carriers.iter().enumerate().map(|(index, carrier)| {
                let (carrier, connector, config) =
                    (Arc::clone(carrier), connector.clone(), config.clone());
                let receiving = Receiving {
                    pool: Some(Arc::clone(&pools[index])),
                    ns_per_kib: if index == 0 { 0 } else { 2_000 },
                };
                tokio::spawn(async move {
                    let spec = ShuffleSpec {
                        nodes: vec![1, 2],
                        index,
                        pattern: Pattern::Repartition,
                        total_bytes: 2 * 2_000_000,
                        message_size: 4000,
                        schedule: Schedule::Free,
                        run_id: 9,
                    };
                    run_design_shuffle(carrier, connector, config, &spec, Senders::ONE, receiving)
                        .await
                })
            });
            let reports: Vec<ShuffleReport> = futures::future::join_all(runs)
                .await
                .into_iter()
                .map(|r| r.unwrap().unwrap())
                .collect();
            for r in &reports {
                assert_eq!(r.bytes_received, 2_000_000, "{primitive:?}");
                let b = &r.design.as_ref().unwrap().buffers;
                assert!(!b.timeline.is_empty() && b.timeline.len() <= 200, "{b:?}");
                assert!(
                    b.peak >= 1 && b.peak <= 64 && b.mean <= b.peak as f64,
                    "{b:?}"
                );
            }
            // Node 1 consumes at once, so node 2's sender waits for credit: its
            // window grows from the pool.
            let fast = &reports[0].design.as_ref().unwrap().buffers;
            assert!(fast.lent > 0 && fast.peak > 3, "{primitive:?}: {fast:?}");
            for p in &pools {
                assert_eq!(p.in_use(), 0, "{primitive:?}: buffers not given back");
            }
        }
    }

    #[test]
    fn the_bandwidth_delay_product_counts_buffers_in_flight() {
        // The paper's EDR figures: 100 Gbit/s and a few microseconds.
        let w = bdp_window(12.5e9, Duration::from_micros(3), 64 * 1024);
        assert_eq!(w, 1 + (12.5e9 * 3e-6 / 65536.0) as u32);
        assert_eq!(bdp_window(1e9, Duration::ZERO, 4096), 1, "at least one");
        assert_eq!(bdp_window(1e9, Duration::from_millis(1), 4096), 245);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_trip_is_measured_over_a_design() {
        use crate::design::{DesignConfig, LocalConnector};
        let (_dir, carriers) = crate::shm::test_nodes(2, 16 << 20);
        let rtt = design_round_trip(
            [
                Arc::clone(&carriers[0]) as Arc<dyn crate::verbs::Carrier>,
                Arc::clone(&carriers[1]) as Arc<dyn crate::verbs::Carrier>,
            ],
            LocalConnector::new(),
            DesignConfig::default(),
            50,
            11,
        )
        .await
        .unwrap();
        assert!(
            rtt > Duration::ZERO && rtt < Duration::from_secs(1),
            "{rtt:?}"
        );
    }

    #[tokio::test]
    async fn a_design_shuffle_refuses_messages_larger_than_its_buffers() {
        use crate::design::{DesignConfig, LocalConnector};
        let (_dir, mut carriers) = crate::shm::test_nodes(1, 16 << 20);
        let carrier = carriers.pop().unwrap();
        let mut s = spec(Pattern::Repartition, 1 << 20);
        s.message_size = 64 * 1024;
        let err = run_design_shuffle(
            carrier,
            LocalConnector::new(),
            DesignConfig::default(),
            &s,
            Senders::ONE,
            Receiving::default(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, BenchError::Spec(m) if m.contains("payload size")),
            "{err}"
        );
    }
}
