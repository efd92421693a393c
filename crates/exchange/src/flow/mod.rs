//! [`FlowJoinExec`]: Flow-Join (thesis Ch. 4) for Gyre's partitioned hash joins.
//!
//! A partitioned hash join sends every probe row to the worker owning its key's hash
//! partition. With a heavy-hitter key, one worker receives most of the probe input and
//! the others wait. A `FlowJoinExec` wraps such a join (a DataFusion `HashJoinExec`
//! whose probe child is the probe input *before* its shuffle) and routes the probe rows
//! itself:
//!
//! - every probe row's partitioning hash (DataFusion's repartition hash, so the build
//!   side's placement is unchanged) is counted in a SpaceSaving histogram
//!   (`gyre_join::flow::detect`); after ~1% of the expected input and then periodically
//!   each worker reports its candidates to worker 0, which announces the global list;
//! - rows whose hash is heavy stay on their worker; the owner of each heavy hash
//!   broadcasts the build rows with that hash to every worker (selective broadcast);
//! - the worker's result is the union of DataFusion hash joins: the usual one (the
//!   worker's build partition with the probe rows routed to it) and one heavy join per
//!   detection round (the build rows broadcast for that round's keys with the probe
//!   rows of those keys kept local).
//!
//! Every probe row takes exactly one of the two paths, and either path sees every build
//! row of its hash, so rows sent before a key was found heavy stay correct. That is all
//! the probe-preserving joins (inner, right outer, right semi/anti/mark) need. A heavy
//! build row, though, is joined on every worker: the build-preserving joins (left and
//! full outer, left semi/anti/mark) combine its matches across workers before deciding
//! its fate ([`matches`]), with one more exchange.
//!
//! A join whose build input is shuffled can route that too ([`FlowInputs::routes_build`]):
//! build rows of keys heavy on the build side stay where they are and the probe rows of
//! those keys go to every worker, into one more join. There the roles swap: a build row
//! meets all probe rows of its key on its own worker, while a broadcast probe row is
//! joined on every worker, so the probe-preserving joins (right and full outer, right
//! semi/anti/mark) combine those probe rows' matches the same way. Keys heavy on both
//! sides are joined by Symmetric Fragment Replicate on a grid chosen per key; the rows
//! it replicates have their matches combined the same way, on whichever side the join
//! preserves (both in a full join).
//! Heavy hitters are detected on hashes, not key values: a collision only makes a key
//! take the heavy path too, which stays correct.
//!
//! With fetch on demand (`SET gyre.skew_fetch = on`, thesis 4.2.4) there is no global
//! probe-side list: each worker takes the keys its own detection finds heavy at once,
//! keeps their probe rows, and asks every owner for their build rows, which come to it
//! alone. A worker fetches only the keys it sees, and no router ever waits for worker 0.
//!
//! The join uses [`FlowJoinExec::exchanges`] consecutive exchange ids: the probe
//! shuffle, detection reports (to worker 0), announcements (from it), and one heavy
//! build broadcast per detection round, so that each round's heavy join can start as
//! soon as its build rows are complete; then, as the join needs them, the exchange of
//! build matches, the build shuffle, the broadcast of probe rows of build-heavy keys,
//! the exchange of probe matches, SFR's two and the fetch requests.

mod announcements;
mod combine;
mod lookup;
mod matches;
mod metrics;
mod owner;
mod router;
mod sfr;
mod shared;
mod wiring;

use matches::Tracking;

use crate::context::ExchangeId;
use crate::network::{InputsAt, NetworkOperator};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, JoinType, Result, internal_datafusion_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use gyre_join::flow::DetectionConfig;
use gyre_join::flow::control::Side;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Offset of the first heavy build broadcast among a Flow-Join's exchange ids (after
/// the probe shuffle, detection reports and announcements).
pub(crate) const HEAVY_EXCHANGES_FROM: u32 = 3;

/// Probe rows per worker assumed when the planner knew no estimate: detection then runs
/// at fixed row counts (first after ~10K rows), and keys heavy only after ~1M rows are
/// not looked for.
pub const DEFAULT_PROBE_ROWS_PER_WORKER: u64 = 1 << 20;

/// Session settings of skew detection (`SET gyre.skew_*`), carried in the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkewSettings {
    /// A key is heavy above this share of the probe input (0.0001 = 0.01%).
    pub threshold: f64,
    /// First detection after this share of a worker's expected probe rows.
    pub first: f64,
    /// Then again after every further share; 0 = once.
    pub every: f64,
    /// Count every `sample`-th row in the histogram (1 = all, as Flow-Join's detection in Rödiger's thesis does); the
    /// first detection window counts at this rate, later ones sparser
    /// (`gyre_join::flow::detect`).
    pub sample: u32,
    /// Which build-preserving joins to wrap (their build rows' matches are combined
    /// across workers).
    #[serde(default)]
    pub build_preserving: BuildPreserving,
    /// Whether joins whose build input is shuffled also route it and detect skew on it
    /// (`SET gyre.skew_build_side`).
    #[serde(default = "on")]
    pub build_side: bool,
    /// Whether keys heavy on both sides are joined by Symmetric Fragment Replicate
    /// (`SET gyre.skew_sfr`), rather than by broadcasting their probe rows.
    #[serde(default = "on")]
    pub sfr: bool,
    /// Fetch on demand (`SET gyre.skew_fetch`, thesis 4.2.4): each worker decides its
    /// own probe-side heavy hitters and asks their owners for their build rows, instead
    /// of reporting to worker 0 and waiting for one global list that every owner
    /// broadcasts. Keys heavy on both sides then have their probe rows broadcast (SFR
    /// needs one agreed list).
    #[serde(default)]
    pub fetch: bool,
}

fn on() -> bool {
    true
}

/// `SET gyre.skew_build_preserving`: which build-preserving joins get Flow-Joins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BuildPreserving {
    /// None: they stay plain partitioned joins.
    Off,
    /// Left semi, anti and mark joins, whose tracking costs nothing measurable (their
    /// counterpart outputs one id per matched build row).
    #[default]
    Semi,
    /// Also left and full outer joins, whose counterpart carries the id through every
    /// output row: 15-50% slower without skew (docs/results.md, "Flow-Join in SQL,
    /// build-preserving joins").
    All,
}

impl BuildPreserving {
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "off" | "false" | "0" => Ok(Self::Off),
            "semi" => Ok(Self::Semi),
            "all" | "on" | "true" | "1" => Ok(Self::All),
            other => Err(DataFusionError::Configuration(format!(
                "gyre.skew_build_preserving is off, semi or all, not '{other}'"
            ))),
        }
    }

    /// The setting's name, as [`BuildPreserving::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Semi => "semi",
            Self::All => "all",
        }
    }

    /// Whether a join of this type may become a Flow-Join under this setting.
    pub fn allows(self, join_type: JoinType) -> bool {
        match Tracking::of_build(join_type) {
            None => true,
            Some(Tracking::Rows) => self != Self::Off,
            Some(Tracking::Outer) => self == Self::All,
        }
    }
}

impl Default for SkewSettings {
    fn default() -> Self {
        let d = DetectionConfig::default();
        Self {
            threshold: d.threshold,
            first: d.first,
            every: d.every,
            sample: d.sample,
            build_preserving: BuildPreserving::default(),
            build_side: true,
            sfr: true,
            fetch: false,
        }
    }
}

impl SkewSettings {
    /// The detection configuration, checked.
    pub fn detection(&self) -> Result<DetectionConfig> {
        let c = DetectionConfig {
            threshold: self.threshold,
            first: self.first,
            every: self.every,
            sample: self.sample,
            ..DetectionConfig::default()
        };
        c.validate()
            .map_err(datafusion::error::DataFusionError::Plan)?;
        Ok(c)
    }
}

/// Whether a partitioned hash join of this type can take Flow-Join's heavy path. The
/// probe-preserving types (inner, right outer, right semi/anti/mark) need nothing more:
/// each probe row is joined exactly once. The build-preserving ones (left and full
/// outer, left semi/anti/mark) track their build rows' matches across workers
/// ([`matches`]), which a join that stops early (a pushed-down `fetch`) cannot finish.
pub fn flow_join_supported(join_type: JoinType, fetch: Option<usize>) -> bool {
    !preserves_build(join_type) || fetch.is_none()
}

/// What the planner knows of a Flow-Join's inputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowInputs {
    /// Probe rows the planner expects per worker (schedules probe-side detection).
    pub probe_rows_per_worker: Option<u64>,
    /// Whether the join's build child is the build input before its shuffle, which
    /// the Flow-Join then routes itself, detecting skew on it.
    pub routes_build: bool,
    /// Build rows the planner expects per worker (schedules build-side detection).
    pub build_rows_per_worker: Option<u64>,
}

/// Whether a join type emits build rows by their match state (left and full outer,
/// left semi/anti/mark), which a Flow-Join must combine across workers.
pub fn preserves_build(join_type: JoinType) -> bool {
    Tracking::of_build(join_type).is_some()
}

/// What one worker found and did, shown by `EXPLAIN ANALYZE` (the display of a plan
/// runs on the worker that executed it).
#[derive(Debug, Default)]
struct FlowReport {
    /// Probe-heavy hash -> (detection iteration, estimated probe rows, a key value seen).
    heavy: BTreeMap<u64, HeavyHitter>,
    /// The same for hashes heavy on the build side (estimated build rows).
    build_heavy: BTreeMap<u64, HeavyHitter>,
    /// Hashes heavy on both sides joined by SFR -> their grid (rows, columns).
    sfr: BTreeMap<u64, (usize, usize)>,
}

impl FlowReport {
    /// The heavy hitters found on `side`.
    fn heavy_of(&mut self, side: Side) -> &mut BTreeMap<u64, HeavyHitter> {
        match side {
            Side::Build => &mut self.build_heavy,
            Side::Probe => &mut self.heavy,
        }
    }
}

/// `sfr=N [key rows x cols, ...]` (at most 8 shown).
fn fmt_sfr(f: &mut fmt::Formatter, report: &FlowReport) -> fmt::Result {
    if report.sfr.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = report
        .sfr
        .iter()
        .take(8)
        .map(|(hash, (rows, cols))| {
            let key = [&report.build_heavy, &report.heavy]
                .iter()
                .find_map(|m| m.get(hash).and_then(|h| h.key.as_deref()))
                .unwrap_or("(key not seen here)");
            format!("{key} {rows}x{cols}")
        })
        .collect();
    write!(
        f,
        ", sfr={} [{}{}]",
        report.sfr.len(),
        shown.join(", "),
        if report.sfr.len() > shown.len() {
            ", ..."
        } else {
            ""
        }
    )
}

/// `name=N [key (~rows, round r), ...]`, the largest first (at most 8 shown).
fn fmt_heavy(
    f: &mut fmt::Formatter,
    name: &str,
    heavy: &BTreeMap<u64, HeavyHitter>,
) -> fmt::Result {
    if heavy.is_empty() {
        return Ok(());
    }
    let mut hh: Vec<&HeavyHitter> = heavy.values().collect();
    hh.sort_by_key(|h| std::cmp::Reverse(h.estimate));
    let shown: Vec<String> = hh
        .iter()
        .take(8)
        .map(|h| {
            format!(
                "{} (~{} rows, round {})",
                h.key.as_deref().unwrap_or("(key not seen here)"),
                h.estimate,
                h.iteration
            )
        })
        .collect();
    write!(
        f,
        ", {name}={} [{}{}]",
        hh.len(),
        shown.join(", "),
        if hh.len() > shown.len() { ", ..." } else { "" }
    )
}

#[derive(Debug, Clone)]
struct HeavyHitter {
    iteration: u32,
    estimate: u64,
    /// The key of the first row kept local or broadcast for this hash.
    key: Option<String>,
}

/// A partitioned hash join with skew detection and selective broadcast of heavy hitters.
#[derive(Debug)]
pub struct FlowJoinExec {
    /// `HashJoinExec` in partitioned mode: left = the build partitions (partition `i` on
    /// worker `i`), right = the probe input before its shuffle.
    join: Arc<dyn ExecutionPlan>,
    settings: SkewSettings,
    inputs: FlowInputs,
    /// First of the [`FlowJoinExec::exchanges`] exchange ids (set by the stage splitter).
    exchange: Option<ExchangeId>,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    report: Arc<Mutex<FlowReport>>,
}

impl FlowJoinExec {
    pub fn try_new(
        join: Arc<dyn ExecutionPlan>,
        settings: SkewSettings,
        inputs: FlowInputs,
        exchange: Option<ExchangeId>,
    ) -> Result<Self> {
        let Some(hj) = join.downcast_ref::<HashJoinExec>() else {
            return plan_err!("a Flow-Join wraps a hash join, not {}", join.name());
        };
        if *hj.partition_mode() != PartitionMode::Partitioned {
            return plan_err!("a Flow-Join wraps a partitioned hash join");
        }
        if !flow_join_supported(*hj.join_type(), hj.fetch()) {
            return plan_err!(
                "Flow-Join does not handle {} joins that stop after {:?} rows",
                hj.join_type(),
                hj.fetch()
            );
        }
        settings.detection()?;
        let n = hj.left().output_partitioning().partition_count();
        let m = hj.right().output_partitioning().partition_count();
        if n != m {
            return plan_err!("Flow-Join over {n} build and {m} probe partitions");
        }
        // Heavy keys are joined away from their owner, and the two joins' outputs
        // interleave: neither hash partitioning nor order survives.
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(join.schema()),
            Partitioning::UnknownPartitioning(n),
            join.pipeline_behavior(),
            join.boundedness(),
        ));
        Ok(Self {
            join,
            settings,
            inputs,
            exchange,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
            report: Arc::default(),
        })
    }

    /// The same join using the exchanges from `exchange` on.
    pub fn with_exchange(&self, exchange: ExchangeId) -> Result<Self> {
        Self::try_new(
            Arc::clone(&self.join),
            self.settings.clone(),
            self.inputs,
            Some(exchange),
        )
    }

    pub fn join(&self) -> &Arc<dyn ExecutionPlan> {
        &self.join
    }
    pub fn settings(&self) -> &SkewSettings {
        &self.settings
    }
    pub fn inputs(&self) -> FlowInputs {
        self.inputs
    }
    pub fn exchange(&self) -> Option<ExchangeId> {
        self.exchange
    }

    /// How many consecutive exchange ids the join uses.
    pub fn exchanges(&self) -> u32 {
        self.fetch_exchange() + u32::from(self.fetch())
    }

    /// Whether each worker fetches the build rows of its own heavy hitters.
    fn fetch(&self) -> bool {
        self.settings.fetch
    }

    /// Offset of the fetch requests (every worker to every worker), the last exchange.
    fn fetch_exchange(&self) -> u32 {
        self.sfr_exchanges_from() + 2 * u32::from(self.sfr())
    }

    /// Offset of the exchange of matches of probe rows broadcast for build-heavy keys
    /// (probe-preserving joins that route their build input).
    fn probe_matches_exchange(&self) -> u32 {
        self.build_exchanges_from() + 2
    }

    /// Offset of SFR's build and then probe rows (the last exchanges).
    fn sfr_exchanges_from(&self) -> u32 {
        self.build_exchanges_from()
            + 2 * u32::from(self.inputs.routes_build)
            + u32::from(self.probe_tracking().is_some())
    }

    /// Whether keys heavy on both sides take Symmetric Fragment Replicate, on two more
    /// exchanges (build and probe rows), the last ones.
    fn sfr(&self) -> bool {
        self.inputs.routes_build && self.settings.sfr && !self.fetch()
    }

    /// Offset of the build shuffle, then the broadcast of probe rows of build-heavy
    /// keys, then (probe-preserving joins) the exchange of those rows' matches, then
    /// (with SFR) its build and probe rows, among
    /// the exchange ids (joins that route their build input). Before them: the heavy
    /// build broadcasts of every round and (build-preserving joins) the exchange of
    /// build rows' matches.
    fn build_exchanges_from(&self) -> u32 {
        let rounds = self
            .settings
            .detection()
            .map_or(1, |c| c.iterations() as u32);
        HEAVY_EXCHANGES_FROM + rounds + u32::from(self.tracking().is_some())
    }

    /// How build rows' matches are combined across workers (build-preserving joins).
    fn tracking(&self) -> Option<Tracking> {
        Tracking::of_build(*self.hash_join().join_type())
    }

    /// How the matches of probe rows broadcast for build-heavy keys are combined across
    /// workers (probe-preserving joins that route their build input).
    fn probe_tracking(&self) -> Option<Tracking> {
        if !self.inputs.routes_build {
            return None;
        }
        Tracking::of_probe(*self.hash_join().join_type())
    }

    fn hash_join(&self) -> &HashJoinExec {
        self.join
            .downcast_ref::<HashJoinExec>()
            .expect("checked by try_new")
    }
}

impl DisplayAs for FlowJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "FlowJoinExec: skew detection on {} hashes, threshold={}%, first at {}%, every {}%",
            if self.inputs.routes_build {
                "build and probe"
            } else {
                "probe"
            },
            self.settings.threshold * 100.0,
            self.settings.first * 100.0,
            self.settings.every * 100.0
        )?;
        if self.settings.sample > 1 {
            write!(f, ", sample 1/{}", self.settings.sample)?;
        }
        if self.tracking().is_some() {
            write!(f, ", build matches combined across workers")?;
        }
        if self.probe_tracking().is_some() {
            write!(f, ", probe matches combined across workers")?;
        }
        if self.sfr() {
            write!(f, ", SFR for keys heavy on both sides")?;
        }
        if self.fetch() {
            write!(f, ", fetch on demand")?;
        }
        if let Some(e) = self.exchange {
            write!(f, ", exchanges={}..{}", e, e + self.exchanges() - 1)?;
        }
        let report = self.report.lock();
        fmt_heavy(f, "build_heavy_hitters", &report.build_heavy)?;
        fmt_heavy(f, "heavy_hitters", &report.heavy)?;
        fmt_sfr(f, &report)
    }
}

impl NetworkOperator for FlowJoinExec {
    fn exchanges(&self) -> u32 {
        FlowJoinExec::exchanges(self)
    }

    /// The wrapped join runs on the workers with its probe input unshuffled: the
    /// Flow-Join routes it.
    fn inputs_at(&self) -> InputsAt {
        InputsAt::Workers
    }

    fn with_exchanges(&self, first: ExchangeId) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.with_exchange(first)?))
    }
}

impl ExecutionPlan for FlowJoinExec {
    fn name(&self) -> &'static str {
        "FlowJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.join]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [join] = <[_; 1]>::try_from(children)
            .map_err(|_| internal_datafusion_err!("a Flow-Join has one child"))?;
        Ok(Arc::new(Self::try_new(
            join,
            self.settings.clone(),
            self.inputs,
            self.exchange,
        )?))
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
        wiring::execute(self, partition, context)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
