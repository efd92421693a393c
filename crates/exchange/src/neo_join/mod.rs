//! [`NeoJoinExec`]: Neo-Join (Rödiger, *Scalable Distributed Query Processing in
//! Parallel Main-Memory Database Systems*, chapter 2), a distributed equi-join that
//! moves as few bytes as the data's placement allows.
//!
//! The node wraps a partitioned `HashJoinExec` whose inputs are *not* shuffled
//! (partition `i` of each input is whatever worker `i` holds) and replaces the two
//! hash shuffles with Neo-Join's four phases ([`stream`] holds one worker's run):
//!
//! 1. every worker collects both inputs, the workers agree on the key range
//!    (exchange +0), and each counts bytes per fine MSB-radix bucket and side, and
//!    the bytes a hash shuffle would send to each worker;
//! 2. worker 0 receives the histograms (+1), merges buckets into partitions
//!    (adaptive radix partitioning), assigns each partition to a worker or broadcasts
//!    one of its sides (`gyre_join::neo::assign`: the MILP with HiGHS within a time
//!    limit, else greedy) and sends the assignment to every worker (+2). Chosen at
//!    run time (`min_saving`), it sends "hash placement" instead when the assignment
//!    does not save enough of the busiest link: the rows then go where a hash shuffle
//!    sends them, and a table already hash-placed on the key stays put;
//! 3. the transfers' open-shop schedule: under `schedule = OpenShop` worker 0 sends
//!    each side's transfer matrix with the assignment, every worker computes the
//!    rounds from it and a round barrier (+5) keeps them apart; under `Free` the
//!    schedule is only computed for EXPLAIN ANALYZE and the shuffle runs under the
//!    transport's schedule;
//! 4. every worker sends each row where its partition is joined (+3 build, +4
//!    probe; rows of its own partitions go to itself) and runs the hash join (or the
//!    radix join kernel, `radix_kernel`) on what arrives.
//!
//! Broadcasting a side replicates its rows, so a partition's side is broadcast only
//! when the join never emits that side's rows on their own ([`broadcastable`]). Rows with a NULL key match
//! nothing and stay where they are.

mod stream;

use crate::RadixJoinExec;
use crate::context::ExchangeId;
use crate::network::{InputsAt, NetworkOperator};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{JoinType, Result, internal_datafusion_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use gyre_join::neo::Broadcastable;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Exchange ids a Neo-Join uses: key range, histograms, assignment, build rows, probe
/// rows, the open-shop schedule's round barrier.
pub const EXCHANGES_PER_NEO_JOIN: u32 = 6;
const DOMAIN_EXCHANGE: u32 = 0;
const HISTOGRAM_EXCHANGE: u32 = 1;
const ASSIGNMENT_EXCHANGE: u32 = 2;
const BUILD_EXCHANGE: u32 = 3;
const PROBE_EXCHANGE: u32 = 4;
const ROUND_EXCHANGE: u32 = 5;

/// Longest time limit a plan may give the solver.
const MAX_SOLVER_MS: u32 = 60_000;

/// Partitions per worker adaptive radix partitioning aims for by default. Measured on
/// 4 emulated hosts (110 Mbit/s, 0.45 CPU, 4 M x 4 M rows): at locality 0.5 and at
/// Zipf 1 with ordered keys, 16 partitions moved within 4% of the bytes 64 to 1024
/// did, and took the least CPU (64 to 1024: 3-19% more); with 1 or 2 per worker the
/// heavy keys' range is cut too coarsely and 18% more bytes moved (docs/results.md).
pub const PARTITIONS_PER_WORKER: u32 = 4;

/// How a Neo-Join partitions and assigns.
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
        }
    }
}

/// Which sides of a join's partitions may be broadcast without changing its answer:
/// a side whose rows the join never emits on their own (matched or not, as semi,
/// anti, mark and outer joins do), so a replicated row cannot come out twice.
pub fn broadcastable(join_type: JoinType) -> Broadcastable {
    use JoinType::*;
    Broadcastable {
        build: matches!(join_type, Inner | Right | RightSemi | RightAnti | RightMark),
        probe: matches!(join_type, Inner | Left | LeftSemi | LeftAnti | LeftMark),
    }
}

/// What worker 0 decided and each worker moved, shown by EXPLAIN ANALYZE.
#[derive(Debug, Clone, Default)]
pub(crate) struct NeoReport {
    /// Worker 0 only: partitions, how they were assigned, solver time, broadcast
    /// partitions, busiest link and bytes moved against hash placement, rounds.
    pub plan: Option<String>,
}

/// A distributed equi-join by Neo-Join's phases.
#[derive(Debug)]
pub struct NeoJoinExec {
    /// The partitioned `HashJoinExec` over the unshuffled inputs, its only child.
    join: Arc<dyn ExecutionPlan>,
    settings: NeoSettings,
    exchange: Option<ExchangeId>,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    report: Arc<Mutex<NeoReport>>,
}

impl NeoSettings {
    /// The partitions to aim for on `workers` workers.
    pub fn partitions_for(&self, workers: usize) -> u32 {
        match self.partitions {
            0 => PARTITIONS_PER_WORKER.saturating_mul(workers.max(1) as u32),
            p => p,
        }
    }
}

impl NeoJoinExec {
    pub fn try_new(
        join: Arc<dyn ExecutionPlan>,
        settings: NeoSettings,
        exchange: Option<ExchangeId>,
    ) -> Result<Self> {
        let Some(hj) = join.downcast_ref::<HashJoinExec>() else {
            return plan_err!("a Neo-Join wraps a hash join, not {}", join.name());
        };
        if let Err(reason) = Self::supports(hj) {
            return plan_err!("Neo-Join cannot run this join: {reason}");
        }
        let max_bits = gyre_join::neo::histogram::MAX_FINE_BITS;
        if settings.partitions > 1 << max_bits
            || settings.fine_bits == 0
            || settings.fine_bits > max_bits
            || settings.solver_ms > MAX_SOLVER_MS
            || settings.min_saving.is_some_and(|pct| pct > 100)
        {
            return plan_err!("Neo-Join settings out of range: {settings:?}");
        }
        let n = hj.left().output_partitioning().partition_count();
        // Rows are joined wherever the assignment puts their partition: the output is
        // neither hash-partitioned nor ordered.
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(join.schema()),
            Partitioning::UnknownPartitioning(n),
            join.pipeline_behavior(),
            join.boundedness(),
        ));
        Ok(Self {
            join,
            settings,
            exchange,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
            report: Arc::default(),
        })
    }

    /// Whether Neo-Join can run `hj`, and if not, why not: the joins the radix kernel
    /// runs (one integer or date key, NULLs matching nothing, no null-aware anti join,
    /// no pushed-down limit, as many build as probe partitions).
    pub fn supports(hj: &HashJoinExec) -> std::result::Result<(), String> {
        RadixJoinExec::supports(hj)
    }

    pub fn join(&self) -> &Arc<dyn ExecutionPlan> {
        &self.join
    }

    pub fn hash_join(&self) -> &HashJoinExec {
        self.join
            .downcast_ref::<HashJoinExec>()
            .expect("checked by try_new")
    }

    pub fn settings(&self) -> NeoSettings {
        self.settings
    }

    pub fn exchange(&self) -> Option<ExchangeId> {
        self.exchange
    }
}

impl NetworkOperator for NeoJoinExec {
    fn exchanges(&self) -> u32 {
        EXCHANGES_PER_NEO_JOIN
    }

    fn inputs_at(&self) -> InputsAt {
        InputsAt::Workers
    }

    fn with_exchanges(&self, first: ExchangeId) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            Arc::clone(&self.join),
            self.settings,
            Some(first),
        )?))
    }
}

impl DisplayAs for NeoJoinExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "NeoJoinExec: target_partitions={}, partitioning={}",
            self.settings
                .partitions_for(self.props.output_partitioning().partition_count()),
            if self.settings.adaptive {
                "adaptive"
            } else {
                "radix"
            }
        )?;
        let b = broadcastable(*self.hash_join().join_type());
        let sides = match (self.settings.selective_broadcast, b.build, b.probe) {
            (false, ..) | (true, false, false) => "none",
            (true, true, true) => "build or probe",
            (true, true, false) => "build",
            (true, false, true) => "probe",
        };
        write!(f, ", broadcast={sides}")?;
        if let Some(pct) = self.settings.min_saving {
            write!(f, ", min_saving={pct}%")?;
        }
        if self.settings.radix_kernel {
            write!(f, ", kernel=radix")?;
        }
        write!(f, ", schedule={}", self.settings.schedule.name())?;
        if let Some(e) = self.exchange {
            write!(f, ", exchanges={e}..{}", e + EXCHANGES_PER_NEO_JOIN - 1)?;
        }
        if let Some(plan) = &self.report.lock().plan {
            write!(f, ", {plan}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for NeoJoinExec {
    fn name(&self) -> &'static str {
        "NeoJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.join]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [join] = <[_; 1]>::try_from(children)
            .map_err(|_| internal_datafusion_err!("a Neo-Join has one child, its hash join"))?;
        Ok(Arc::new(Self::try_new(join, self.settings, self.exchange)?))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        stream::execute(self, partition, context)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
