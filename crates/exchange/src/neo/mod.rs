//! Locality-sensitive data shuffling (Rödiger, *Scalable Distributed Query Processing
//! in Parallel Main-Memory Database Systems*, chapter 2): operators that reduce to
//! matching items by key move their inputs by Neo-Join's four phases instead of a
//! hash shuffle, so that rows already where their key's partition is processed stay
//! there. [`shuffle`] holds one worker's run of the phases for any number of inputs:
//!
//! 1. every worker collects its inputs, the workers agree on the key range
//!    (exchange +0), and each counts bytes per fine MSB-radix bucket and input, and
//!    the bytes a hash shuffle would send to each worker;
//! 2. worker 0 receives the histograms (+1), merges buckets into partitions
//!    (adaptive radix partitioning), assigns each partition to a worker or broadcasts
//!    one join input's part of it (`gyre_join::neo::assign`: the MILP with HiGHS
//!    within a time limit, else greedy) and sends the assignment to every worker (+2).
//!    Chosen at run time (`min_saving`), it sends "hash placement" instead when the
//!    assignment does not save enough of the busiest link: the rows then go where a
//!    hash shuffle sends them;
//! 3. the transfers' open-shop schedule: under `schedule = OpenShop` worker 0 sends
//!    each input's transfer matrix with the assignment, every worker computes the
//!    rounds from it and a round barrier (the last exchange) keeps them apart; under
//!    `Free` the schedule is only computed for EXPLAIN ANALYZE and the shuffle runs
//!    under the transport's schedule;
//! 4. every worker sends each row where its partition is processed (+3 for the first
//!    input, +4 for a join's second; rows of its own partitions go to itself) and runs
//!    the operator on what arrives.
//!
//! Two operators use it: [`NeoJoinExec`] (both inputs of an equi-join) and
//! [`NeoAggregateExec`] (the partial aggregates of a GROUP BY, which the thesis names
//! as the other operator the technique serves): after a Neo-Join or on tables in
//! generation order, a group's rows are mostly on one worker already, and that worker
//! aggregates it.

mod aggregate;
mod join;
mod shuffle;

pub use aggregate::NeoAggregateExec;
pub use join::{NeoJoinExec, broadcastable};

use crate::context::ExchangeId;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Exchange ids before the data exchanges: key range, histograms, assignment (of the
/// first decision, on a sample or on every row). Then one per input, then the
/// open-shop schedule's round barrier, then key range, histograms and assignment of
/// a second decision on every row, where the sample did not settle it.
const DOMAIN_EXCHANGE: u32 = 0;
const HISTOGRAM_EXCHANGE: u32 = 1;
const ASSIGNMENT_EXCHANGE: u32 = 2;
const FIRST_DATA_EXCHANGE: u32 = 3;

/// The first exchange of the second decision's three for `inputs` inputs.
const fn second_decision(inputs: u32) -> u32 {
    FIRST_DATA_EXCHANGE + inputs + 1
}

/// Exchange ids a Neo shuffle of `inputs` inputs uses.
pub const fn neo_exchanges(inputs: u32) -> u32 {
    second_decision(inputs) + 3
}

/// Longest time limit a plan may give the solver.
const MAX_SOLVER_MS: u32 = 60_000;

/// Partitions per worker adaptive radix partitioning aims for by default. Measured on
/// 4 emulated hosts (110 Mbit/s, 0.45 CPU, 4 M x 4 M rows): at locality 0.5 and at
/// Zipf 1 with ordered keys, 16 partitions moved within 4% of the bytes 64 to 1024
/// did, and took the least CPU (64 to 1024: 3-19% more); with 1 or 2 per worker the
/// heavy keys' range is cut too coarsely and 18% more bytes moved (docs/results.md).
pub const PARTITIONS_PER_WORKER: u32 = 4;

/// How a Neo shuffle (of a Neo-Join or a Neo aggregation) partitions and assigns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NeoSettings {
    /// Partitions adaptive radix partitioning aims for (plain radix partitioning: the
    /// next power of two); 0: [`PARTITIONS_PER_WORKER`] per worker.
    pub partitions: u32,
    /// Adaptive radix partitioning (else plain radix partitioning: equal key ranges,
    /// the thesis' baseline for skew).
    pub adaptive: bool,
    /// Fine histogram resolution: `2^fine_bits` buckets over the key range.
    pub fine_bits: u32,
    /// Solve the assignment MILP (else greedy only).
    pub milp: bool,
    /// The solver's time limit.
    pub solver_ms: u32,
    /// Allow selective broadcast where the join type permits it.
    pub selective_broadcast: bool,
    /// `Some(pct)`: chosen at run time (`gyre.join_strategy = 'auto'`): Neo-Join's
    /// assignment only where it cuts the busiest link by at least `pct` percent against
    /// hash placement, as the workers measured it; otherwise every row goes where a hash
    /// shuffle sends it. `None`: always the assignment.
    pub min_saving: Option<u32>,
    /// Join the arriving rows with the radix join kernel (`gyre_join::radix`) instead
    /// of DataFusion's hash table (`gyre.join_kernel`).
    #[serde(default)]
    pub radix_kernel: bool,
    /// How the assignment's transfers share the network (`gyre.neo_schedule`).
    #[serde(default)]
    pub schedule: NeoSchedule,
    /// Chosen at run time: rows of each input every worker decides on first
    /// (`gyre.neo_sample_rows`). Where they show hash placement to be as good, the
    /// rows stream where a hash shuffle sends them instead of being collected first;
    /// otherwise every worker collects all its rows and the decision is taken again.
    /// 0: decide on every row.
    #[serde(default = "default_sample_rows")]
    pub sample_rows: u32,
}

/// Rows per input and worker a decision at run time is first taken on: 2 batches of
/// Gyre's files, 16 of DataFusion's; about 32 rows per fine bucket.
pub const DEFAULT_SAMPLE_ROWS: u32 = 131_072;

fn default_sample_rows() -> u32 {
    DEFAULT_SAMPLE_ROWS
}

/// How a Neo-Join's shuffle uses the links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NeoSchedule {
    /// Every worker sends to every other at once, as TCP shares the links (the
    /// transport's own schedule applies). The default: on 4 emulated hosts at 110
    /// Mbit/s and 1 Gbit/s it was as fast as the open-shop rounds or faster
    /// (docs/results.md, "Open-shop rounds against a free shuffle").
    #[default]
    Free,
    /// Each side's transfers in the rounds of their open-shop schedule, synchronised
    /// (`gyre_transport::rounds`): no receiver ever has two senders.
    OpenShop,
}

impl NeoSchedule {
    pub fn name(self) -> &'static str {
        match self {
            Self::Free => "free",
            Self::OpenShop => "open-shop",
        }
    }
}

impl Default for NeoSettings {
    fn default() -> Self {
        Self {
            partitions: 0,
            adaptive: true,
            fine_bits: 12,
            milp: true,
            solver_ms: 100,
            selective_broadcast: true,
            min_saving: None,
            radix_kernel: false,
            schedule: NeoSchedule::Free,
            sample_rows: DEFAULT_SAMPLE_ROWS,
        }
    }
}

impl NeoSettings {
    /// Whether the settings are in range (a plan may come from the network).
    pub(crate) fn check(&self) -> datafusion::common::Result<()> {
        let max_bits = gyre_join::neo::histogram::MAX_FINE_BITS;
        if self.partitions > 1 << max_bits
            || self.fine_bits == 0
            || self.fine_bits > max_bits
            || self.solver_ms > MAX_SOLVER_MS
            || self.min_saving.is_some_and(|pct| pct > 100)
        {
            return datafusion::common::plan_err!("Neo shuffle settings out of range: {self:?}");
        }
        Ok(())
    }

    /// The partitions to aim for on `workers` workers.
    pub fn partitions_for(&self, workers: usize) -> u32 {
        match self.partitions {
            0 => PARTITIONS_PER_WORKER.saturating_mul(workers.max(1) as u32),
            p => p,
        }
    }
}

/// How a Neo shuffle shows in a plan: its partitioning, `own` (what the operator adds),
/// the run-time choice, the schedule, its `exchanges` (first id, count) and what
/// worker 0 decided.
fn fmt_shuffle(
    f: &mut fmt::Formatter,
    settings: &NeoSettings,
    workers: usize,
    own: &str,
    exchanges: Option<(ExchangeId, u32)>,
    report: &Mutex<NeoReport>,
) -> fmt::Result {
    write!(
        f,
        "target_partitions={}, partitioning={}{own}",
        settings.partitions_for(workers),
        if settings.adaptive {
            "adaptive"
        } else {
            "radix"
        }
    )?;
    if let Some(pct) = settings.min_saving {
        write!(f, ", min_saving={pct}%")?;
    }
    write!(f, ", schedule={}", settings.schedule.name())?;
    if let Some((first, count)) = exchanges {
        write!(f, ", exchanges={first}..{}", first + count - 1)?;
    }
    if let Some(plan) = &report.lock().plan {
        write!(f, ", {plan}")?;
    }
    Ok(())
}

/// What worker 0 decided and each worker moved, shown by EXPLAIN ANALYZE.
#[derive(Debug, Clone, Default)]
pub(crate) struct NeoReport {
    /// Worker 0 only: partitions, how they were assigned, solver time, broadcast
    /// partitions, busiest link and bytes moved against hash placement, rounds.
    pub plan: Option<String>,
}
