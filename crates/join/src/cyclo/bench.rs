//! The cyclo-join benchmark driver: every ring member calls [`run_cyclo`] with the same
//! [`CycloSpec`] (but `index`), at about the same time, and gets its own figures.
//!
//! Workload (paper Sec. V; 64-bit key + 64-bit payload tuples): S has `s_rows` tuples
//! with unique keys 1..=s_rows in a scrambled order; R has `r_rows` tuples whose keys are
//! drawn from S's keys, uniformly (`zipf = 0`) or Zipf-distributed with exponent `zipf`
//! (the paper's skew experiments use 0 to 0.9), hot ranks scattered over the key space.
//! Payloads are global row numbers. So an equi-join returns exactly `r_rows` pairs and a
//! band of width c about `(2c + 1) r_rows`. With `zipf_s > 0`, S's keys are drawn too
//! (Zipf over the same key space, so duplicates pile up in a few hash buckets: the
//! collisions that make the paper's hash join degrade under skew); an equi-join then
//! returns about `r_rows` pairs when R is uniform, and far more when both are skewed. Each node generates its own slice of both
//! relations; a global row's values depend only on the seed and the row, so the same
//! spec gives the same data set on any number of nodes, and the same result: the
//! per-node checksums (order-independent) add up to the same total.
//!
//! Phases: generate; agree (sizes, plan); setup (timed); barrier; one revolution (timed:
//! join, sync and transmit-wait times, bytes); barrier; release of the streams.

use std::time::{Duration, Instant};

use gyre_transport::{NodeId, TcpTransport, Transport, TransportConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::keys::Keys;
use crate::pairs::JoinPairs;
use crate::sort_merge::MergePredicate;
use crate::zipf::Zipf;

use super::error::{CycloError, Result};
use super::fragment::FragmentView;
use super::join::{
    CycloOptions, PreparedCycloJoin, Relation, ResultSink, SetupFigures, agree, barrier,
};
use super::local::{CycloAlgorithm, Side, ThetaPredicate};
use super::roundabout::{RingSpec, RoundaboutFigures};

/// Query ids of cyclo-join benchmark runs (apart from the engine's and the shuffle
/// benchmark's).
pub const CYCLO_QUERY_BASE: u64 = (1 << 63) | (1 << 62);

/// What to run; the same on every node except `index`.
#[derive(Debug, Clone)]
pub struct CycloSpec {
    /// Ring members in ring order.
    pub nodes: Vec<NodeId>,
    /// This node's position in `nodes`.
    pub index: usize,
    pub r_rows: u64,
    pub s_rows: u64,
    /// Zipf exponent of R's keys over S's keys (0 = uniform).
    pub zipf: f64,
    /// Zipf exponent of S's keys (0 = unique keys).
    pub zipf_s: f64,
    pub seed: u64,
    /// The predicate is on (R key, S key).
    pub algorithm: CycloAlgorithm,
    /// Threads, rotation, buffer ring; `options.threads` is the join threads per node.
    pub options: CycloOptions,
    /// Distinguishes the runs of one cluster; every node of a run must use the same.
    pub run_id: u64,
}

impl CycloSpec {
    /// A spec with default options: all cores, the smaller input rotating.
    pub fn new(nodes: Vec<NodeId>, index: usize, algorithm: CycloAlgorithm) -> Self {
        CycloSpec {
            nodes,
            index,
            r_rows: 1 << 20,
            s_rows: 1 << 20,
            zipf: 0.0,
            zipf_s: 0.0,
            seed: 42,
            algorithm,
            options: CycloOptions::default(),
            run_id: 1,
        }
    }
}

/// What one node measured in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycloFigures {
    pub node: NodeId,
    pub index: usize,
    pub nodes: usize,
    pub algorithm: String,
    /// Which input travelled (R is the left input).
    pub rotating: Side,
    pub r_rows_local: u64,
    pub s_rows_local: u64,
    /// Generating this node's data (not part of the join).
    pub generate: Duration,
    pub setup: SetupFigures,
    /// Join, sync and transmit-wait times, fragments and fragment bytes.
    pub ring: RoundaboutFigures,
    pub fragments_injected: u64,
    /// Result pairs produced on this node and their order-independent checksum
    /// ([`pair_checksum`] summed, wrapping).
    pub results: u64,
    pub checksum: u64,
    /// Bytes on the wire during the revolution (frame headers included).
    pub wire_bytes_sent: u64,
    pub wire_bytes_received: u64,
}

/// Parses an algorithm as the CLI spells it: `hash`, `sort-merge` (equality),
/// `band:C` (`r.x BETWEEN s.y - C AND s.y + C`), `lt`, `le`, `gt`, `ge` (sort-merge on
/// `r.x op s.y`), `nl-band:C` (the band by nested loops), `theta:M:K` (nested loops on
/// `(r.x - s.y) mod M = K`).
pub fn parse_algorithm(s: &str) -> Result<CycloAlgorithm> {
    let bad = || {
        CycloError::Spec(format!(
            "unknown algorithm '{s}' (expected hash, sort-merge, band:C, lt, le, gt, ge, \
             nl-band:C or theta:M:K)"
        ))
    };
    let parts: Vec<&str> = s.split(':').collect();
    let int = |p: &str| p.trim().parse::<i64>().map_err(|_| bad());
    let algo = match parts.as_slice() {
        ["hash"] => CycloAlgorithm::Hash,
        ["sort-merge"] | ["eq"] => CycloAlgorithm::SortMerge(MergePredicate::Eq),
        ["band", c] => {
            let c = int(c)?;
            CycloAlgorithm::SortMerge(MergePredicate::Band { c1: c, c2: c })
        }
        ["lt"] => CycloAlgorithm::SortMerge(MergePredicate::Lt),
        ["le"] => CycloAlgorithm::SortMerge(MergePredicate::Le),
        ["gt"] => CycloAlgorithm::SortMerge(MergePredicate::Gt),
        ["ge"] => CycloAlgorithm::SortMerge(MergePredicate::Ge),
        ["nl-band", c] => {
            let c = int(c)?;
            CycloAlgorithm::NestedLoops(ThetaPredicate::Merge(MergePredicate::Band {
                c1: c,
                c2: c,
            }))
        }
        ["theta", m, k] => CycloAlgorithm::NestedLoops(ThetaPredicate::DiffMod {
            modulus: int(m)?,
            remainder: int(k)?,
        }),
        _ => return Err(bad()),
    };
    algo.check()?;
    Ok(algo)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The checksum of one result pair, by the R and S payloads (global row numbers);
/// results are summed with wrapping addition, so the total ignores order and placement.
pub fn pair_checksum(r_payload: u64, s_payload: u64) -> u64 {
    splitmix64(splitmix64(r_payload) ^ s_payload)
}

/// A bijection of `0..n`: `x -> (a x + c) mod n` with `a` coprime to `n`.
#[derive(Debug, Clone, Copy)]
struct Scramble {
    n: u64,
    a: u64,
    c: u64,
}

impl Scramble {
    fn new(n: u64, seed: u64) -> Self {
        fn gcd(mut a: u64, mut b: u64) -> u64 {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        }
        if n <= 1 {
            return Scramble { n, a: 1, c: 0 };
        }
        let mut a = (splitmix64(seed) % n).max(1);
        while gcd(a, n) != 1 {
            a = a % (n - 1) + 1;
        }
        Scramble {
            n,
            a,
            c: splitmix64(seed ^ 1) % n,
        }
    }

    fn apply(&self, x: u64) -> u64 {
        if self.n <= 1 {
            return x;
        }
        ((u128::from(x) * u128::from(self.a) + u128::from(self.c)) % u128::from(self.n)) as u64
    }
}

/// Rows `[start, end)` of a relation of `total` rows that node `index` of `n` holds.
pub fn slice_of(total: u64, n: usize, index: usize) -> (u64, u64) {
    let (n, i) = (n as u128, index as u128);
    let t = u128::from(total);
    ((t * i / n) as u64, (t * (i + 1) / n) as u64)
}

/// Rows per generator block: a block's values come from one seeded generator.
const BLOCK: u64 = 1 << 16;

/// The S tuples of global rows `[start, end)`: (keys, payloads).
pub fn generate_s(spec: &CycloSpec, start: u64, end: u64) -> (Vec<u64>, Vec<u64>) {
    if spec.zipf_s > 0.0 {
        return (
            drawn_keys(spec, spec.zipf_s, 0x53, start, end),
            (start..end).collect(),
        );
    }
    let perm = Scramble::new(spec.s_rows, spec.seed);
    let keys = (start..end).map(|g| perm.apply(g) + 1).collect();
    (keys, (start..end).collect())
}

/// The R tuples of global rows `[start, end)`: (keys, payloads).
pub fn generate_r(spec: &CycloSpec, start: u64, end: u64) -> (Vec<u64>, Vec<u64>) {
    (
        drawn_keys(spec, spec.zipf, 0x5253, start, end),
        (start..end).collect(),
    )
}

/// Keys of global rows `[start, end)` drawn from S's key space 1..=s_rows, uniformly or
/// with Zipf exponent `z` (hot ranks scrambled over the space); `tag` tells relations apart.
fn drawn_keys(spec: &CycloSpec, z: f64, tag: u64, start: u64, end: u64) -> Vec<u64> {
    let perm = Scramble::new(spec.s_rows, spec.seed);
    let zipf = (z > 0.0 && spec.s_rows > 0).then(|| Zipf::new(spec.s_rows, z));
    let mut keys = Vec::with_capacity((end - start) as usize);
    let mut g = start;
    while g < end {
        let block = g / BLOCK;
        let block_end = ((block + 1) * BLOCK).min(end);
        let mut rng = SmallRng::seed_from_u64(splitmix64(spec.seed ^ tag) ^ splitmix64(block));
        for row in block * BLOCK..block_end {
            let rank = match (&zipf, spec.s_rows) {
                (_, 0) => 1,
                (Some(z), _) => z.sample(&mut rng),
                (None, n) => rng.random_range(1..=n),
            };
            if row >= g {
                keys.push(perm.apply(rank - 1) + 1);
            }
        }
        g = block_end;
    }
    keys
}

/// Sums [`pair_checksum`] over a node's results.
struct ChecksumSink {
    rotating: Side,
    /// Payloads of the stationary input, by row.
    stationary_payload: Vec<u64>,
    checksum: u64,
}

impl ResultSink for ChecksumSink {
    fn consume(&mut self, fragment: &FragmentView<'_>, pairs: &JoinPairs) -> Result<()> {
        let rot = fragment.payload(0);
        let mut sum = 0u64;
        for (&f, &s) in pairs.left.iter().zip(&pairs.right) {
            let (a, b) = (rot[f as usize], self.stationary_payload[s as usize]);
            let (r, s) = match self.rotating {
                Side::Left => (a, b),
                Side::Right => (b, a),
            };
            sum = sum.wrapping_add(pair_checksum(r, s));
        }
        self.checksum = self.checksum.wrapping_add(sum);
        Ok(())
    }
}

fn check_spec(spec: &CycloSpec, t: &dyn Transport) -> Result<()> {
    if spec.nodes.is_empty() || spec.index >= spec.nodes.len() {
        return Err(CycloError::Spec(format!(
            "position {} is not in a ring of {} nodes",
            spec.index,
            spec.nodes.len()
        )));
    }
    if spec.nodes[spec.index] != t.node_id() {
        return Err(CycloError::Spec(format!(
            "position {} names node {}, but this is node {}",
            spec.index,
            spec.nodes[spec.index],
            t.node_id()
        )));
    }
    for z in [spec.zipf, spec.zipf_s] {
        if !(0.0..=5.0).contains(&z) {
            return Err(CycloError::Spec(format!(
                "zipf exponent {z} is outside 0..=5"
            )));
        }
    }
    let n = spec.nodes.len() as u64;
    if spec.r_rows.div_ceil(n) > u64::from(u32::MAX)
        || spec.s_rows.div_ceil(n) > u64::from(u32::MAX)
    {
        return Err(CycloError::Spec(
            "more than 2^32 rows per node (row indices are u32)".into(),
        ));
    }
    Ok(())
}

fn spawn_error(e: tokio::task::JoinError) -> CycloError {
    CycloError::Internal(format!("a setup thread panicked: {e}"))
}

/// Runs one cyclo-join between `spec.nodes` (see the module doc); every node must call it.
pub async fn run_cyclo(spec: &CycloSpec, t: &dyn Transport) -> Result<CycloFigures> {
    check_spec(spec, t)?;
    let ring = RingSpec {
        nodes: spec.nodes.clone(),
        index: spec.index,
        query: CYCLO_QUERY_BASE | spec.run_id,
        exchange: 0,
    };
    let result = run_ring(spec, t, &ring).await;
    // Also on failure: the abort notice was flushed to every peer before the error came up.
    t.release_query(ring.query);
    result
}

async fn run_ring(spec: &CycloSpec, t: &dyn Transport, ring: &RingSpec) -> Result<CycloFigures> {
    let n = ring.len();
    let ring = ring.clone();
    let gen_start = Instant::now();
    let (r, s) = {
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || {
            let (a, b) = slice_of(spec.r_rows, n, spec.index);
            let (c, d) = slice_of(spec.s_rows, n, spec.index);
            (generate_r(&spec, a, b), generate_s(&spec, c, d))
        })
        .await
        .map_err(spawn_error)?
    };
    let generate = gen_start.elapsed();
    let (r_rows_local, s_rows_local) = (r.0.len() as u64, s.0.len() as u64);
    let plan = {
        let left = Relation {
            keys: Keys::unsigned(&r.0),
            payload: vec![&r.1],
            bytes: vec![],
        };
        let right = Relation {
            keys: Keys::unsigned(&s.0),
            payload: vec![&s.1],
            bytes: vec![],
        };
        agree(
            t,
            &ring,
            ring.exchange + 1,
            &left,
            &right,
            &spec.algorithm,
            &spec.options,
        )
        .await?
    };
    let (prepared, stationary_payload) = {
        let (plan, algo, options) = (plan.clone(), spec.algorithm.clone(), spec.options.clone());
        tokio::task::spawn_blocking(move || {
            let left = Relation {
                keys: Keys::unsigned(&r.0),
                payload: vec![&r.1],
                bytes: vec![],
            };
            let right = Relation {
                keys: Keys::unsigned(&s.0),
                payload: vec![&s.1],
                bytes: vec![],
            };
            let prepared = PreparedCycloJoin::prepare(&plan, &left, &right, &algo, &options)?;
            let stationary_payload = match plan.rotating {
                Side::Left => s.1,
                Side::Right => r.1,
            };
            Ok::<_, CycloError>((prepared, stationary_payload))
        })
        .await
        .map_err(spawn_error)??
    };
    barrier(t, &ring, 3).await?;
    let stats0 = t.stats();
    let sink = ChecksumSink {
        rotating: plan.rotating,
        stationary_payload,
        checksum: 0,
    };
    let (figures, sink) = prepared.run(t, &ring, sink).await?;
    let stats1 = t.stats();
    barrier(t, &ring, 4).await?;
    Ok(CycloFigures {
        node: t.node_id(),
        index: spec.index,
        nodes: n,
        algorithm: spec.algorithm.describe(),
        rotating: plan.rotating,
        r_rows_local,
        s_rows_local,
        generate,
        setup: figures.setup,
        ring: figures.ring,
        fragments_injected: figures.fragments_injected,
        results: figures.results,
        checksum: sink.checksum,
        wire_bytes_sent: stats1.bytes_sent.saturating_sub(stats0.bytes_sent),
        wire_bytes_received: stats1.bytes_received.saturating_sub(stats0.bytes_received),
    })
}

/// The figures of one run as a table: a row per node (times in ms, fragment bytes in
/// MB) and a summary line with the maxima over nodes, the result count and the checksum
/// summed over nodes (the same on any ring size for the same spec).
pub fn format_table(figures: &[CycloFigures]) -> String {
    use std::fmt::Write;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut out = format!(
        "{:>5} {:>10} {:>10} {:>9} {:>9} {:>9} {:>10} {:>6} {:>8} {:>8} {:>11} {:>16}\n",
        "node",
        "setupS ms",
        "setupR ms",
        "join ms",
        "sync ms",
        "ring ms",
        "txwait ms",
        "frags",
        "MB sent",
        "MB recv",
        "results",
        "checksum"
    );
    for f in figures {
        let _ = writeln!(
            out,
            "{:>5} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>6} {:>8.1} {:>8.1} {:>11} {:>16x}",
            f.node,
            ms(f.setup.stationary),
            ms(f.setup.rotating),
            ms(f.ring.join),
            ms(f.ring.sync),
            ms(f.ring.elapsed),
            ms(f.ring.transmit_wait),
            f.ring.fragments_joined,
            f.ring.bytes_sent as f64 / 1e6,
            f.ring.bytes_received as f64 / 1e6,
            f.results,
            f.checksum
        );
    }
    let max = |g: &dyn Fn(&CycloFigures) -> Duration| {
        figures.iter().map(|f| ms(g(f))).fold(0.0, f64::max)
    };
    let results: u64 = figures.iter().map(|f| f.results).sum();
    let checksum = figures.iter().fold(0u64, |a, f| a.wrapping_add(f.checksum));
    let _ = writeln!(
        out,
        "ring of {}: {:?} rotates; max setup {:.1} ms, max join {:.1} ms, max sync {:.1} ms, \
         max ring {:.1} ms; {} results, checksum {:x}",
        figures.len(),
        figures.first().map_or(Side::Left, |f| f.rotating),
        max(&|f| f.setup.total()),
        max(&|f| f.ring.join),
        max(&|f| f.ring.sync),
        max(&|f| f.ring.elapsed),
        results,
        checksum
    );
    out
}

/// `n` TCP transports (nodes 1..=n) in this process, connected over loopback.
pub async fn loopback_ring(n: usize, config: TransportConfig) -> Result<Vec<TcpTransport>> {
    let ids: Vec<NodeId> = (1..=n as NodeId).collect();
    gyre_transport::loopback_cluster(&ids, config)
        .await
        .map_err(|e| CycloError::Spec(format!("cannot start a loopback ring: {e}")))
}

/// Runs `spec` on every node of an in-process ring (the spec's `nodes` and `index` are
/// set from `ring`); figures by ring position.
pub async fn run_on(ring: &[TcpTransport], spec: &CycloSpec) -> Result<Vec<CycloFigures>> {
    let ids: Vec<NodeId> = ring.iter().map(|t| t.node_id()).collect();
    let handles: Vec<_> = ring
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let t = t.clone();
            let mut spec = spec.clone();
            spec.nodes = ids.clone();
            spec.index = i;
            tokio::spawn(async move { run_cyclo(&spec, &t).await })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(
            h.await
                .map_err(|e| CycloError::Internal(format!("a node's task failed: {e}")))??,
        );
    }
    Ok(out)
}
