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
    let n = spec.nodes.len();
    if n < 2 {
        return Err(BenchError::Spec(
            "a shuffle needs at least two nodes".into(),
        ));
    }
    if spec.index >= n || spec.nodes[spec.index] != t.node_id() {
        return Err(BenchError::Spec(format!(
            "position {} does not name this node ({})",
            spec.index,
            node_name(t.node_id())
        )));
    }
    if spec.message_size < MESSAGE_HEADER || spec.message_size > t.message_size() {
        return Err(BenchError::Spec(format!(
            "message size {} must be between {MESSAGE_HEADER} and the transport's buffer size {}",
            spec.message_size,
            t.message_size()
        )));
    }
    let query = BENCH_QUERY_BASE | spec.run_id;
    let me = spec.nodes[spec.index];
    let others: Vec<usize> = (1..n).map(|k| (spec.index + k) % n).collect();
    t.set_schedule(spec.schedule);
    let data = payload(spec.message_size, 0x9e37_79b9_7f4a_7c15);
    barrier(t, spec, 0).await?;

    let send = t.open_send(SendSpec {
        query,
        exchange: 1,
        from: spec.index as u32,
        destinations: others.iter().map(|&i| spec.nodes[i]).collect(),
        groups: vec![],
    })?;
    let recv = t.open_receive(ReceiveSpec {
        query,
        exchange: 1,
        sources: others.iter().map(|&i| (i as u32, spec.nodes[i])).collect(),
    })?;
    let stats0 = t.stats();
    let cpu0 = cpu::process_cpu();
    let start = Instant::now();

    let sending = async {
        let mut sent = vec![0u64; n];
        let mut messages = 0u64;
        match spec.pattern {
            Pattern::Broadcast => {
                let lens = plan(spec, spec.index, others[0]);
                for (seq, &len) in lens.iter().enumerate() {
                    let mut buf = send.acquire(To::All).await?;
                    let v = buf.vec_mut();
                    v.extend_from_slice(&header(spec.index, ANY, seq as u64));
                    v.extend_from_slice(&data[MESSAGE_HEADER..len]);
                    send.put(buf, seq + 1 == lens.len())?;
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
                for seq in 0..rounds {
                    for (k, &d) in others.iter().enumerate() {
                        let Some(&len) = plans[k].get(seq) else {
                            continue;
                        };
                        let mut buf = send.acquire(To::Node(spec.nodes[d])).await?;
                        let v = buf.vec_mut();
                        v.extend_from_slice(&header(spec.index, d, seq as u64));
                        v.extend_from_slice(&data[MESSAGE_HEADER..len]);
                        send.put(buf, seq + 1 == plans[k].len())?;
                        messages += 1;
                        sent[d] += len as u64;
                    }
                }
            }
        }
        send.finish();
        send.flushed().await;
        Ok::<_, BenchError>((sent, messages, start.elapsed()))
    };

    let receiving = async {
        let mut received = vec![0u64; n];
        let mut next_seq = vec![0u64; n];
        let mut done = vec![Duration::ZERO; n];
        let mut messages = 0u64;
        let expected: Vec<Vec<usize>> = (0..n).map(|s| plan(spec, s, spec.index)).collect();
        while let Some(r) = recv.get().await? {
            let src = r.slot as usize;
            let m = r.data();
            if !m.is_empty() {
                let want_dst = match spec.pattern {
                    Pattern::Broadcast => ANY,
                    Pattern::Repartition => spec.index,
                };
                let seq = next_seq[src];
                let Some(&want_len) = expected[src].get(seq as usize) else {
                    return Err(BenchError::Verify(format!(
                        "{} sent more than the {} messages planned",
                        node_name(r.node),
                        expected[src].len()
                    )));
                };
                if m.len() != want_len || m[..MESSAGE_HEADER] != header(src, want_dst, seq) {
                    return Err(BenchError::Verify(format!(
                        "message {seq} from {} has the wrong length or header",
                        node_name(r.node)
                    )));
                }
                if m[MESSAGE_HEADER..] != data[MESSAGE_HEADER..want_len] {
                    return Err(BenchError::Verify(format!(
                        "message {seq} from {} has corrupt bytes",
                        node_name(r.node)
                    )));
                }
                next_seq[src] += 1;
                received[src] += m.len() as u64;
                messages += 1;
            }
            if r.last {
                done[src] = start.elapsed();
                if next_seq[src] as usize != expected[src].len() {
                    return Err(BenchError::Verify(format!(
                        "{} ended after {} of {} messages",
                        node_name(r.node),
                        next_seq[src],
                        expected[src].len()
                    )));
                }
            }
            recv.release(r);
        }
        Ok::<_, BenchError>((received, messages, done, start.elapsed()))
    };

    let (sent, got) = tokio::join!(sending, receiving);
    let ((sent, messages_sent, send_elapsed), (received, messages_received, done, recv_elapsed)) =
        (sent?, got?);
    let elapsed = start.elapsed();
    let cpu1 = cpu::process_cpu();
    let stats1 = t.stats();
    drop((send, recv));
    barrier(t, spec, 2).await?;
    t.release_query(query);

    let peers = others
        .iter()
        .map(|&o| PeerFigures {
            peer: spec.nodes[o],
            bytes_sent: sent[o],
            bytes_received: received[o],
            recv_done: done[o],
        })
        .collect();
    Ok(ShuffleReport {
        node: me,
        pattern: spec.pattern,
        schedule: spec.schedule,
        bytes_sent: sent.iter().sum(),
        bytes_received: received.iter().sum(),
        messages_sent,
        messages_received,
        wire_bytes_sent: stats1.bytes_sent - stats0.bytes_sent,
        wire_bytes_received: stats1.bytes_received - stats0.bytes_received,
        elapsed,
        send_elapsed,
        recv_elapsed,
        peers,
        process_cpu: cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        mux_cpu: stats0
            .mux_cpu
            .zip(stats1.mux_cpu)
            .map(|(a, b)| b.saturating_sub(a)),
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
}
