//! The Flow-Join benchmark (thesis Ch. 4.5.2): every node calls [`run_join`] with the
//! same [`JoinSpec`] (except `index`) at about the same time.
//!
//! Workload: tuples of a 64-bit key and a 64-bit payload. The build side has
//! `build_rows` unique keys per node (node i holds key numbers `i * build_rows ..`),
//! the probe side `probe_rows` per node whose key numbers are Zipf-distributed over all
//! build keys (rank 1 = key number 0; z = 0 is uniform). Key numbers are spread over the
//! 64-bit domain by a bijective mix, as the thesis uses 64-bit keys; ranks are not
//! shuffled further (the thesis does not), the hash partitioning decides which node owns
//! which heavy key. Each node generates its slice from `(seed, index)`, before the clock
//! starts. Nodes meet at a barrier before and after the timed join.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gyre_transport::bench::BENCH_QUERY_BASE;
use gyre_transport::{NodeId, ReceiveSpec, SendSpec, Transport};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::detect::DetectionConfig;
use super::exec::{FlowJoinConfig, NodeCounters, flow_join};
use super::{FlowError, JoinType, ROW_BITS, Rows, Strategy, mix64};
use crate::zipf::Zipf;

/// What to run; the same on every node except `index`.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinSpec {
    /// The participating nodes, in the same order on every node.
    pub nodes: Vec<NodeId>,
    /// This node's position in `nodes`.
    pub index: usize,
    /// Build (R) and probe (S) tuples generated per node.
    pub build_rows: u64,
    pub probe_rows: u64,
    /// Zipf exponent of the probe keys (0 = uniform).
    pub zipf: f64,
    pub seed: u64,
    pub strategy: Strategy,
    pub join: JoinType,
    /// Routing/probing threads per node.
    pub threads: usize,
    pub detection: DetectionConfig,
    /// Distinguishes the runs of one cluster; every node of a run must use the same.
    pub run_id: u64,
}

/// What one node measured.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinFigures {
    pub node: NodeId,
    pub strategy: Strategy,
    pub join: JoinType,
    pub zipf: f64,
    /// From the start barrier until this node's part of the join ended.
    pub elapsed: Duration,
    /// Result rows produced on this node, and their checksum (the cluster's result is
    /// the sum of rows and the wrapping sum of checksums).
    pub result_rows: u64,
    pub checksum: u64,
    /// Tuples routed, received, kept and broadcast; phases; heavy hitters found.
    pub counters: NodeCounters,
    /// CPU time of this node's process over `elapsed` (all its threads; nodes embedded
    /// in one process each see the whole process). `None` where it cannot be read.
    pub process_cpu: Option<Duration>,
}

impl JoinFigures {
    /// Input tuples of this node (R + S) per second.
    pub fn throughput(&self) -> f64 {
        (self.counters.build_rows + self.counters.probe_rows) as f64
            / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Tuples this node had to join: R received or kept, S received or kept, copies.
    pub fn join_input(&self) -> u64 {
        let c = &self.counters;
        c.build_received + c.build_kept + c.probe_received + c.probe_kept + c.copies_received
    }
}

/// The cluster's figures, from every node's [`JoinFigures`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFigures {
    pub nodes: usize,
    /// The slowest node's time.
    pub elapsed: Duration,
    /// All input tuples (R + S) per second of `elapsed`.
    pub throughput: f64,
    pub result_rows: u64,
    pub checksum: u64,
    /// Largest and mean per-node join input (see [`JoinFigures::join_input`]).
    pub max_input: u64,
    pub mean_input: f64,
    /// Distinct heavy hitters announced (or fetched), over both sides.
    pub heavy_hitters: usize,
}

impl ClusterFigures {
    pub fn from_nodes(figures: &[JoinFigures]) -> Self {
        let elapsed = figures.iter().map(|f| f.elapsed).max().unwrap_or_default();
        let input: u64 = figures
            .iter()
            .map(|f| f.counters.build_rows + f.counters.probe_rows)
            .sum();
        let inputs: Vec<u64> = figures.iter().map(JoinFigures::join_input).collect();
        let mut heavy: Vec<u64> = figures
            .iter()
            .flat_map(|f| f.counters.heavy.iter().map(|h| h.key))
            .collect();
        heavy.sort_unstable();
        heavy.dedup();
        ClusterFigures {
            nodes: figures.len(),
            elapsed,
            throughput: input as f64 / elapsed.as_secs_f64().max(1e-9),
            result_rows: figures.iter().map(|f| f.result_rows).sum(),
            checksum: figures.iter().fold(0u64, |a, f| a.wrapping_add(f.checksum)),
            max_input: inputs.iter().copied().max().unwrap_or(0),
            mean_input: inputs.iter().sum::<u64>() as f64 / figures.len().max(1) as f64,
            heavy_hitters: heavy.len(),
        }
    }
}

/// The 64-bit key of build key number `i` (a bijection, so keys stay unique).
pub fn key_of(i: u64) -> u64 {
    mix64(i ^ 0x5EED_0000_0000_0000)
}

/// This node's build slice: `build_rows` unique keys; the payload is the key number.
pub fn build_slice(spec: &JoinSpec) -> Rows {
    let base = spec.index as u64 * spec.build_rows;
    let (keys, payloads) = (0..spec.build_rows)
        .map(|j| (key_of(base + j), base + j))
        .unzip();
    Rows::new(keys, payloads)
}

/// This node's probe slice: Zipf-distributed keys over all build keys; the payload
/// names the node and row.
pub fn probe_slice(spec: &JoinSpec) -> Rows {
    let total = spec.build_rows * spec.nodes.len() as u64;
    let mut rng = SmallRng::seed_from_u64(mix64(spec.seed ^ mix64(spec.index as u64 + 1)));
    let zipf = (spec.zipf > 0.0 && total > 0).then(|| Zipf::new(total, spec.zipf));
    let mut keys = Vec::with_capacity(spec.probe_rows as usize);
    let mut payloads = Vec::with_capacity(spec.probe_rows as usize);
    for j in 0..spec.probe_rows {
        let number = match (&zipf, total) {
            (_, 0) => rng.random::<u64>(),
            (Some(z), _) => z.sample(&mut rng) - 1,
            (None, _) => rng.random_range(0..total),
        };
        keys.push(if total == 0 { number } else { key_of(number) });
        payloads.push(((spec.index as u64) << ROW_BITS) | j);
    }
    Rows::new(keys, payloads)
}

/// Every node sends an empty message to every node and waits for all of them (on
/// `exchange` of `query`, which the join itself does not use).
pub async fn barrier(
    t: &dyn Transport,
    nodes: &[NodeId],
    index: usize,
    query: u64,
    exchange: u32,
) -> Result<(), FlowError> {
    let send = t.open_send(SendSpec {
        query,
        exchange,
        from: index as u32,
        destinations: nodes.to_vec(),
        groups: vec![],
    })?;
    let recv = t.open_receive(ReceiveSpec {
        query,
        exchange,
        sources: nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u32, *n))
            .collect(),
    })?;
    send.finish();
    while let Some(m) = recv.get().await? {
        recv.release(m);
    }
    send.flushed().await;
    Ok(())
}

/// Generates this node's workload, runs the distributed join between the barriers and
/// reports what this node measured.
pub async fn run_join(spec: &JoinSpec, t: &dyn Transport) -> Result<JoinFigures, FlowError> {
    if !(spec.zipf >= 0.0 && spec.zipf.is_finite()) {
        return Err(FlowError::Input(format!(
            "Zipf exponent must be >= 0, got {}",
            spec.zipf
        )));
    }
    if spec.build_rows >= 1 << ROW_BITS || spec.probe_rows >= 1 << ROW_BITS {
        return Err(FlowError::Input("too many rows per node".into()));
    }
    let build = Arc::new(build_slice(spec));
    let probe = Arc::new(probe_slice(spec));
    let cfg = FlowJoinConfig {
        nodes: spec.nodes.clone(),
        index: spec.index,
        query: BENCH_QUERY_BASE | spec.run_id,
        strategy: spec.strategy,
        join: spec.join,
        threads: spec.threads,
        detection: spec.detection.clone(),
        collect: false,
    };
    barrier(t, &spec.nodes, spec.index, cfg.query, 1).await?;
    let cpu0 = gyre_transport::cpu::process_cpu();
    let start = Instant::now();
    let result = flow_join(t, &cfg, build, probe).await;
    let elapsed = start.elapsed();
    let process_cpu = cpu0
        .zip(gyre_transport::cpu::process_cpu())
        .map(|(a, b)| b.saturating_sub(a));
    let end = barrier(t, &spec.nodes, spec.index, cfg.query, 2).await;
    t.release_query(cfg.query);
    let (out, counters) = result?;
    end?;
    Ok(JoinFigures {
        node: spec.nodes[spec.index],
        strategy: spec.strategy,
        join: spec.join,
        zipf: spec.zipf,
        elapsed,
        result_rows: out.rows,
        checksum: out.checksum,
        counters,
        process_cpu,
    })
}
