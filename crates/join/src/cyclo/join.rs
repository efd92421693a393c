//! Cyclo-join (paper Sec. IV): one input stays in place, the fragments of the other
//! travel the Data Roundabout once, and every node joins every passing fragment with its
//! stationary part; after one revolution the full result is spread over the nodes.
//!
//! Three steps, so an operator can run the CPU-heavy setup wherever it likes:
//! 1. [`agree`]: the ring members exchange their input sizes (a tiny all-to-all), check
//!    that they run the same join, and derive the same plan: which input rotates (the
//!    smaller one by default) and, for the hash join, one radix layout for all nodes (so
//!    a fragment partitioned at its origin suits every node's table).
//! 2. [`PreparedCycloJoin::prepare`]: the setup phase, done once: the stationary part is
//!    hashed, sorted or compacted; the local rotating part is cut into fragments, each
//!    partitioned or sorted at its origin (paper Sec. IV-D), ready to ship.
//! 3. [`PreparedCycloJoin::run`]: one revolution of the roundabout; each node's result
//!    pairs go to its [`ResultSink`].

use std::time::{Duration, Instant};

use gyre_transport::{ReceiveEndpoint, SendEndpoint, To, Transport, node_name};

use crate::keys::Keys;
use crate::pairs::JoinPairs;
use crate::radix::{RadixConfig, RadixLayout};
use crate::{KeyDomain, l2_cache_bytes};

use super::error::{CycloError, Result};
use super::fragment::{ByteColumn, FragmentView};
use super::local::{CycloAlgorithm, FragmentLimits, Side, Stationary, prepare_rotating};
use super::roundabout::{
    JoinEntity, RingSpec, RoundaboutConfig, RoundaboutFigures, run_roundabout,
};

/// A node's local part of one join input: keys (with validity) and the `u64` payload
/// and variable-length byte columns that travel with the keys if this input rotates.
#[derive(Debug, Clone)]
pub struct Relation<'a> {
    pub keys: Keys<'a>,
    pub payload: Vec<&'a [u64]>,
    pub bytes: Vec<ByteColumn<'a>>,
}

/// Which input travels the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotate {
    /// The one with fewer non-NULL rows over the whole ring (left on a tie).
    Smaller,
    Left,
    Right,
}

/// How a cyclo-join runs; every ring member must use the same options.
#[derive(Debug, Clone)]
pub struct CycloOptions {
    /// Threads of the setup and join phases (0 = all cores).
    pub threads: usize,
    pub rotate: Rotate,
    /// Partition or sort fragments once at their origin (else on every node).
    pub prepare_rotating: bool,
    pub roundabout: RoundaboutConfig,
    /// Cache the radix join sizes its partitions for; the first ring member's value
    /// (with its `max_bits_per_pass`) is used by all, so all tables share one layout.
    pub radix_cache_bytes: usize,
    pub radix_max_bits_per_pass: u32,
    /// Most rows of a rotating fragment (0: as many as fit a buffer); bounds the work
    /// one fragment makes when a join may explode.
    pub max_fragment_rows: usize,
}

impl Default for CycloOptions {
    fn default() -> Self {
        let radix = RadixConfig::for_cache(l2_cache_bytes());
        CycloOptions {
            threads: 0,
            rotate: Rotate::Smaller,
            prepare_rotating: true,
            roundabout: RoundaboutConfig::default(),
            radix_cache_bytes: radix.cache_bytes,
            radix_max_bits_per_pass: radix.max_bits_per_pass,
            max_fragment_rows: 0,
        }
    }
}

/// What every ring member agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingPlan {
    pub rotating: Side,
    /// Non-NULL rows of each input over the whole ring.
    pub left_rows: u64,
    pub right_rows: u64,
    /// Most non-NULL stationary rows on one node.
    pub largest_stationary: u64,
    /// Radix layout shared by all nodes (hash join only).
    pub layout: Option<RadixLayout>,
}

/// Words of the agreement message.
const AGREE_WORDS: usize = 10;

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// A digest of everything ring members must agree on.
fn fingerprint(algorithm: &CycloAlgorithm, options: &CycloOptions) -> u64 {
    let text = format!(
        "{} {:?} {} {:?}",
        algorithm.describe(),
        options.rotate,
        options.prepare_rotating,
        options.roundabout
    );
    fnv(0xcbf2_9ce4_8422_2325, text.as_bytes())
}

fn domain_word(d: KeyDomain) -> u64 {
    match d {
        KeyDomain::Unsigned => 0,
        KeyDomain::Signed => 1,
    }
}

/// Opens `exchange` from this ring member to every other one and back; returns the
/// other members' ring positions with the two endpoints.
fn open_to_others(
    t: &dyn Transport,
    ring: &RingSpec,
    exchange: u32,
) -> Result<(Vec<usize>, SendEndpoint, ReceiveEndpoint)> {
    let others: Vec<usize> = (0..ring.len()).filter(|&i| i != ring.index).collect();
    let (send, recv) =
        gyre_transport::open_to_others(t, ring.query, exchange, &ring.nodes, ring.index)?;
    Ok((others, send, recv))
}

/// Every node sends `words` to every other and gets theirs, by ring position.
async fn all_to_all(
    t: &dyn Transport,
    ring: &RingSpec,
    exchange: u32,
    words: &[u64],
) -> Result<Vec<Vec<u64>>> {
    let n = ring.len();
    let mut out = vec![Vec::new(); n];
    out[ring.index] = words.to_vec();
    if n == 1 {
        return Ok(out);
    }
    let (_, send, recv) = open_to_others(t, ring, exchange)?;
    let mut buf = send.acquire(To::All).await?;
    for w in words {
        buf.extend_from_slice(&w.to_le_bytes());
    }
    send.put(buf, true)?;
    while let Some(m) = recv.get().await? {
        let from = m.slot as usize;
        if m.data().is_empty() {
            continue;
        }
        if m.data().len() != words.len() * 8 || !out[from].is_empty() {
            return Err(CycloError::Protocol(format!(
                "{} sent a malformed message on exchange {exchange}",
                node_name(m.node)
            )));
        }
        out[from] = m
            .data()
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
    }
    // Written before anybody may release the query.
    send.flushed().await;
    Ok(out)
}

/// Sends `mine[i]` to ring member `i` (any length, in as many messages as it takes) and
/// returns what every member sent to this one (this node's own entry is `mine[me]`).
/// Used after a revolution to return per-origin results, such as which rotating rows
/// matched, to the origin.
pub async fn scatter(
    t: &dyn Transport,
    ring: &RingSpec,
    exchange: u32,
    mine: Vec<Vec<u64>>,
) -> Result<Vec<Vec<u64>>> {
    let n = ring.len();
    if mine.len() != n {
        return Err(CycloError::Spec(format!(
            "scatter of {} word vectors over a ring of {n}",
            mine.len()
        )));
    }
    let mut mine = mine;
    let mut out = vec![Vec::new(); n];
    out[ring.index] = std::mem::take(&mut mine[ring.index]);
    if n == 1 {
        return Ok(out);
    }
    let (others, send, recv) = open_to_others(t, ring, exchange)?;
    let words_per_message = (t.message_size() / 8).max(1);
    let sending = async {
        for &i in &others {
            for chunk in mine[i].chunks(words_per_message) {
                let mut buf = send.acquire(To::Node(ring.nodes[i])).await?;
                for w in chunk {
                    buf.extend_from_slice(&w.to_le_bytes());
                }
                send.put(buf, false)?;
            }
        }
        send.finish();
        // Written before anybody may release the query.
        send.flushed().await;
        Ok::<_, CycloError>(())
    };
    let receiving = async {
        let mut bytes: Vec<Vec<u8>> = vec![Vec::new(); n];
        while let Some(m) = recv.get().await? {
            let from = m.slot as usize;
            if from >= n || from == ring.index {
                return Err(CycloError::Protocol(format!(
                    "{} sent words from ring position {from} on exchange {exchange}",
                    node_name(m.node)
                )));
            }
            bytes[from].extend_from_slice(m.data());
        }
        for (from, b) in bytes.into_iter().enumerate() {
            if b.len() % 8 != 0 {
                return Err(CycloError::Protocol(format!(
                    "{} sent {} bytes on exchange {exchange}, not whole words",
                    node_name(ring.nodes[from]),
                    b.len()
                )));
            }
            if from != ring.index {
                out[from] = b
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                    .collect();
            }
        }
        Ok::<_, CycloError>(out)
    };
    let ((), out) = tokio::try_join!(sending, receiving)?;
    Ok(out)
}

/// A barrier: returns once every ring member called it with the same `exchange`.
pub async fn barrier(t: &dyn Transport, ring: &RingSpec, exchange: u32) -> Result<()> {
    all_to_all(t, ring, exchange, &[0]).await.map(|_| ())
}

/// What [`PreparedCycloJoin::prepare`] would refuse in this node's inputs.
fn check_inputs(
    left: &Relation<'_>,
    right: &Relation<'_>,
    algorithm: &CycloAlgorithm,
    options: &CycloOptions,
) -> Result<()> {
    algorithm.check()?;
    options.roundabout.check()?;
    if left.keys.domain() != right.keys.domain() {
        return Err(CycloError::Join(crate::JoinError::DomainMismatch {
            left: left.keys.domain(),
            right: right.keys.domain(),
        }));
    }
    for (name, rel) in [("left", left), ("right", right)] {
        if rel.keys.len() > crate::MAX_ROWS {
            return Err(CycloError::Join(crate::JoinError::TooManyRows {
                rows: rel.keys.len(),
                max: crate::MAX_ROWS,
            }));
        }
        if let Some(c) = rel.payload.iter().position(|c| c.len() != rel.keys.len()) {
            return Err(CycloError::Spec(format!(
                "{name} payload column {c} has {} rows, its keys {}",
                rel.payload[c].len(),
                rel.keys.len()
            )));
        }
    }
    Ok(())
}

/// Step 1: agree on the plan over `exchange` (the library's joins use
/// `ring.exchange + 1`). Every ring member calls it.
pub async fn agree(
    t: &dyn Transport,
    ring: &RingSpec,
    exchange: u32,
    left: &Relation<'_>,
    right: &Relation<'_>,
    algorithm: &CycloAlgorithm,
    options: &CycloOptions,
) -> Result<RingPlan> {
    ring.check(t)?;
    // Errors in this node's own inputs are reported to the ring first (a flag in the
    // message), so that the other members fail too instead of waiting for this one.
    let local = check_inputs(left, right, algorithm, options);
    let mine = [
        left.keys.valid_count() as u64,
        right.keys.valid_count() as u64,
        domain_word(left.keys.domain()),
        fingerprint(algorithm, options),
        left.payload.len() as u64,
        right.payload.len() as u64,
        options.radix_cache_bytes as u64,
        u64::from(options.radix_max_bits_per_pass),
        u64::from(local.is_err()),
        0,
    ];
    let all = all_to_all(t, ring, exchange, &mine).await?;
    local?;
    for (i, theirs) in all.iter().enumerate() {
        let who = node_name(ring.nodes[i]);
        if theirs.len() != AGREE_WORDS {
            return Err(CycloError::Protocol(format!(
                "{who} did not report its sizes"
            )));
        }
        if theirs[8] != 0 {
            return Err(CycloError::Disagreement(format!(
                "{who} refused its inputs (see its error)"
            )));
        }
        if theirs[3] != mine[3] {
            return Err(CycloError::Disagreement(format!(
                "{who} runs a different join or options than this node ({})",
                algorithm.describe()
            )));
        }
        if theirs[2] != mine[2] {
            return Err(CycloError::Disagreement(format!(
                "{who} has keys of another signedness than this node"
            )));
        }
        if theirs[4..6] != mine[4..6] {
            return Err(CycloError::Disagreement(format!(
                "{who} has other payload columns than this node"
            )));
        }
    }
    let left_rows: u64 = all.iter().map(|w| w[0]).sum();
    let right_rows: u64 = all.iter().map(|w| w[1]).sum();
    let rotating = match options.rotate {
        Rotate::Left => Side::Left,
        Rotate::Right => Side::Right,
        Rotate::Smaller if left_rows <= right_rows => Side::Left,
        Rotate::Smaller => Side::Right,
    };
    let stationary_word = match rotating {
        Side::Left => 1,
        Side::Right => 0,
    };
    let largest_stationary = all.iter().map(|w| w[stationary_word]).max().unwrap_or(0);
    let layout = match algorithm {
        CycloAlgorithm::Hash => {
            let config = RadixConfig {
                cache_bytes: all[0][6] as usize,
                max_bits_per_pass: all[0][7] as u32,
                ..RadixConfig::default()
            };
            Some(RadixLayout::plan(largest_stationary as usize, &config)?)
        }
        _ => None,
    };
    Ok(RingPlan {
        rotating,
        left_rows,
        right_rows,
        largest_stationary,
        layout,
    })
}

/// Where a node's share of the result goes: called on the join entity's thread for every
/// fragment with matches, with `(fragment row, stationary row)` pairs; stationary rows
/// index the node's stationary input (NULL rows included).
pub trait ResultSink: Send + 'static {
    fn consume(&mut self, fragment: &FragmentView<'_>, pairs: &JoinPairs) -> Result<()>;

    /// A cross product ([`CycloAlgorithm::CrossProduct`]): every fragment row paired
    /// with every one of the stationary rows `stationary`; the sink keeps the pairs its
    /// own condition accepts and returns how many. The default lists the pairs in
    /// chunks of at most [`CROSS_CHUNK_PAIRS`] and passes them all to
    /// [`ResultSink::consume`].
    fn consume_cross(&mut self, fragment: &FragmentView<'_>, stationary: &[u32]) -> Result<u64> {
        for_each_cross_chunk(fragment.rows(), stationary, CROSS_CHUNK_PAIRS, |pairs| {
            self.consume(fragment, pairs)
        })?;
        Ok((fragment.rows() * stationary.len()) as u64)
    }
}

/// Every pair of the rows `0..rows` with the rows `stationary`, in chunks of at most
/// `max_pairs` pairs (at least one row's pairs each), for `f`.
pub fn for_each_cross_chunk<E>(
    rows: usize,
    stationary: &[u32],
    max_pairs: usize,
    mut f: impl FnMut(&JoinPairs) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let rows_per_chunk = (max_pairs / stationary.len().max(1)).max(1);
    for start in (0..rows).step_by(rows_per_chunk) {
        let end = (start + rows_per_chunk).min(rows);
        f(&JoinPairs::cross(start as u32..end as u32, stationary))?;
    }
    Ok(())
}

/// Pairs per call of [`ResultSink::consume`] when a cross product is listed.
pub const CROSS_CHUNK_PAIRS: usize = 1 << 16;

/// Time spent in the setup phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetupFigures {
    /// Hashing, sorting or compacting the stationary part.
    pub stationary: Duration,
    /// Cutting the local rotating part into fragments and partitioning or sorting them.
    pub rotating: Duration,
}

impl SetupFigures {
    pub fn total(&self) -> Duration {
        self.stationary + self.rotating
    }
}

/// Step 2's result: a node's setup work, ready for the revolution.
#[derive(Debug)]
pub struct PreparedCycloJoin {
    plan: RingPlan,
    algorithm: CycloAlgorithm,
    stationary: Stationary,
    fragments: Vec<Vec<u64>>,
    options: CycloOptions,
    setup: SetupFigures,
    rotating_rows: usize,
}

impl PreparedCycloJoin {
    /// Step 2: the setup phase (CPU only, no communication).
    pub fn prepare(
        plan: &RingPlan,
        left: &Relation<'_>,
        right: &Relation<'_>,
        algorithm: &CycloAlgorithm,
        options: &CycloOptions,
    ) -> Result<Self> {
        let (rot, stat) = match plan.rotating {
            Side::Left => (left, right),
            Side::Right => (right, left),
        };
        let t0 = Instant::now();
        let stationary =
            Stationary::prepare(&stat.keys, algorithm, plan.layout.clone(), options.threads)?;
        let stationary_time = t0.elapsed();
        let t1 = Instant::now();
        let limits = FragmentLimits {
            rows: options.max_fragment_rows,
            buffer_bytes: options.roundabout.buffer_bytes,
        };
        let fragments = prepare_rotating(
            rot,
            algorithm,
            plan.layout.as_ref(),
            limits,
            options.prepare_rotating,
            options.threads,
        )?;
        Ok(PreparedCycloJoin {
            plan: plan.clone(),
            algorithm: algorithm.clone(),
            stationary,
            fragments,
            options: options.clone(),
            setup: SetupFigures {
                stationary: stationary_time,
                rotating: t1.elapsed(),
            },
            rotating_rows: rot.keys.valid_count(),
        })
    }

    pub fn plan(&self) -> &RingPlan {
        &self.plan
    }

    pub fn setup(&self) -> SetupFigures {
        self.setup
    }

    /// Fragments this node injects into the ring.
    pub fn fragments(&self) -> usize {
        self.fragments.len()
    }

    /// Step 3: one revolution (exchange `ring.exchange`). Returns this node's figures and
    /// the sink.
    pub async fn run<S: ResultSink>(
        self,
        t: &dyn Transport,
        ring: &RingSpec,
        sink: S,
    ) -> Result<(CycloRunFigures, S)> {
        let entity = CycloEntity {
            stationary: self.stationary,
            algorithm: self.algorithm,
            rotating: self.plan.rotating,
            threads: self.options.threads,
            sink,
            results: 0,
        };
        let injected = self.fragments.len() as u64;
        let (ring_figures, entity) =
            run_roundabout(t, ring, &self.options.roundabout, self.fragments, entity).await?;
        Ok((
            CycloRunFigures {
                setup: self.setup,
                ring: ring_figures,
                results: entity.results,
                fragments_injected: injected,
                rotating_rows_local: self.rotating_rows as u64,
            },
            entity.sink,
        ))
    }
}

/// A node's figures of one cyclo-join.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycloRunFigures {
    pub setup: SetupFigures,
    pub ring: RoundaboutFigures,
    /// Result pairs produced on this node.
    pub results: u64,
    pub fragments_injected: u64,
    /// Non-NULL rows of the rotating input that started here.
    pub rotating_rows_local: u64,
}

struct CycloEntity<S> {
    stationary: Stationary,
    algorithm: CycloAlgorithm,
    rotating: Side,
    threads: usize,
    sink: S,
    results: u64,
}

impl<S: ResultSink> JoinEntity for CycloEntity<S> {
    fn join(&mut self, fragment: &FragmentView<'_>) -> Result<()> {
        if let Some(rows) = self.stationary.cross_rows() {
            if !fragment.is_empty() && !rows.is_empty() {
                self.results += self.sink.consume_cross(fragment, rows)?;
            }
            return Ok(());
        }
        let pairs = self
            .stationary
            .join(fragment, self.rotating, &self.algorithm, self.threads)?;
        self.results += pairs.len() as u64;
        if !pairs.is_empty() {
            self.sink.consume(fragment, &pairs)?;
        }
        Ok(())
    }
}

/// All three steps: agree, prepare, run (the setup runs on the calling thread).
pub async fn cyclo_join<S: ResultSink>(
    t: &dyn Transport,
    ring: &RingSpec,
    left: &Relation<'_>,
    right: &Relation<'_>,
    algorithm: &CycloAlgorithm,
    options: &CycloOptions,
    sink: S,
) -> Result<(RingPlan, CycloRunFigures, S)> {
    let plan = agree(t, ring, ring.exchange + 1, left, right, algorithm, options).await?;
    let prepared = PreparedCycloJoin::prepare(&plan, left, right, algorithm, options)?;
    let (figures, sink) = prepared.run(t, ring, sink).await?;
    Ok((plan, figures, sink))
}
