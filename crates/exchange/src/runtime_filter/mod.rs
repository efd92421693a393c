//! Run-time filters: a hash join's build keys prune its probe input where it is read.
//!
//! DataFusion pushes a dynamic filter from a hash join's build side into the probe
//! side's scan, but waits for every partition's build side first, and a Gyre worker
//! runs one partition of each stage. Gyre's filters work per worker instead:
//! - [`FilterSourceExec`] sits on a join's build input and, as the rows pass, collects
//!   their key hashes ([`KeyFilterBuilder`]); at the end it publishes a [`KeyFilter`]
//!   in the query's [`FilterSlots`] on this node, and when targets elsewhere need it,
//!   sends it to every worker ([`network`]);
//! - [`FilterTargetExec`] sits on the probe input where it is read (above the table
//!   scan, below the projections, filters and aggregations in between, in the join's
//!   stage or in the stage that sends it the probe rows) and, on its first poll,
//!   waits for the filter ([`FilterFrom`]), then drops every row whose key the build
//!   side lacks.
//!
//! Which filter a target needs depends on where its rows go. In the join's own stage
//! this worker's probe rows reach this worker's join: a row the local build side lacks
//! matches nothing, whatever the partitioning. In a stage that sends the probe rows
//! through an exchange, rows go to every worker: the target needs every key of the
//! join, which a `CollectLeft` build side holds on each worker and a partitioned one
//! holds split across the workers (the target unites every worker's part). Filters
//! serve only joins that drop probe rows without a match (inner, left, left
//! semi/anti/mark, right semi). A source dropped before its end publishes a filter that
//! keeps every row, so no target waits for ever.
//!
//! The wait costs little: a hash join reads its build side to the end before it polls
//! its probe side, so probe rows could not be joined earlier anyway. A target keeps
//! filtering only while it prunes: after [`CHECK_AFTER_ROWS`] rows, a filter that
//! dropped less than a tenth of them steps aside.

mod keys;
pub mod network;

pub use keys::{FilterSlots, KeyFilter, KeyFilterBuilder, MAX_FILTER_KEYS};

use crate::context::{ExchangeId, QueryContext};
use arrow::array::RecordBatch;
use arrow::compute::filter_record_batch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;
use keys::key_columns;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Probe rows a target filters before it decides whether filtering pays.
pub const CHECK_AFTER_ROWS: usize = 100_000;

fn names(plan: &dyn ExecutionPlan, columns: &[usize]) -> String {
    let schema = plan.schema();
    let n: Vec<String> = columns
        .iter()
        .map(|&c| format!("{}@{c}", schema.field(c).name()))
        .collect();
    n.join(", ")
}

fn check_columns(input: &Arc<dyn ExecutionPlan>, columns: &[usize]) -> Result<()> {
    let width = input.schema().fields().len();
    if columns.is_empty() || columns.iter().any(|&c| c >= width) {
        return Err(internal_datafusion_err!(
            "run-time filter on columns {columns:?} of an input with {width}"
        ));
    }
    Ok(())
}

/// The build side of a run-time filter: passes its input on and publishes the hashes
/// of the key `columns` as filter `id` once the input ends.
#[derive(Debug)]
pub struct FilterSourceExec {
    input: Arc<dyn ExecutionPlan>,
    id: u32,
    columns: Vec<usize>,
    /// The filter exchange on which this worker's part also goes to every worker.
    ship: Option<ExchangeId>,
    metrics: ExecutionPlanMetricsSet,
}

impl FilterSourceExec {
    pub fn try_new(input: Arc<dyn ExecutionPlan>, id: u32, columns: Vec<usize>) -> Result<Self> {
        check_columns(&input, &columns)?;
        Ok(Self {
            input,
            id,
            columns,
            ship: None,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
    /// The same source, its filter also sent to every worker on filter exchange
    /// `exchange` (for targets in stages that read the join's probe rows elsewhere).
    pub fn shipped_on(mut self, exchange: Option<ExchangeId>) -> Self {
        self.ship = exchange;
        self
    }
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }
    pub fn ship(&self) -> Option<ExchangeId> {
        self.ship
    }
}

impl DisplayAs for FilterSourceExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "FilterSourceExec: run-time filter {} on [{}]",
            self.id,
            names(self.input.as_ref(), &self.columns)
        )?;
        match self.ship {
            Some(x) => write!(f, ", sent to every worker on exchange {x}"),
            None => Ok(()),
        }
    }
}

/// Publishes its builder's filter when dropped: at the input's end, or earlier (the
/// consumer stopped) with a filter that keeps every row.
struct Publisher {
    qc: Arc<QueryContext>,
    id: u32,
    partition: usize,
    ship: Option<ExchangeId>,
    builder: Option<KeyFilterBuilder>,
    complete: bool,
    keys: Gauge,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let filter = Arc::new(match (self.complete, self.builder.take()) {
            (true, Some(b)) => b.finish(),
            _ => KeyFilter::pass_all(),
        });
        self.keys.set(filter.keys().unwrap_or(0));
        self.qc
            .runtime_filters
            .publish(self.id, self.partition, Arc::clone(&filter));
        let (Some(exchange), Ok(rt)) = (self.ship, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let (qc, partition) = (Arc::clone(&self.qc), self.partition);
        rt.spawn(async move {
            if let Err(e) = network::ship(&qc, exchange, partition, &filter).await {
                tracing::debug!(
                    query = qc.query_id,
                    exchange,
                    "run-time filter not sent: {e}"
                );
            }
        });
    }
}

/// A source's stream between polls: its input and what it has gathered so far.
struct Source {
    input: SendableRecordBatchStream,
    publisher: Publisher,
    columns: Vec<usize>,
    time: Time,
}

impl Source {
    /// The input's next batch, its keys added to the filter; at the end the filter is
    /// complete.
    async fn next(&mut self) -> Option<Result<RecordBatch>> {
        let batch = match self.input.next().await {
            Some(Ok(b)) => b,
            other => {
                self.publisher.complete = other.is_none();
                return other;
            }
        };
        let _t = self.time.timer();
        if let Some(b) = &mut self.publisher.builder
            && let Err(e) = b.add(&key_columns(&batch, &self.columns), batch.num_rows())
        {
            return Some(Err(e));
        }
        Some(Ok(batch))
    }
}

impl ExecutionPlan for FilterSourceExec {
    fn name(&self) -> &'static str {
        "FilterSourceExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| internal_datafusion_err!("a filter source has one child"))?;
        Ok(Arc::new(
            Self::try_new(input, self.id, self.columns.clone())?.shipped_on(self.ship),
        ))
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
        let qc = QueryContext::of(&context)?;
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let keys = MetricBuilder::new(&self.metrics).gauge("filter_keys", partition);
        let time = MetricBuilder::new(&self.metrics).subset_time("filter_build_time", partition);
        let publisher = Publisher {
            qc,
            id: self.id,
            partition,
            ship: self.ship,
            builder: Some(KeyFilterBuilder::default()),
            complete: false,
            keys,
        };
        let source = Source {
            input,
            publisher,
            columns: self.columns.clone(),
            time,
        };
        let s = futures::stream::unfold(Some(source), |source| async move {
            let mut source = source?;
            match source.next().await {
                Some(Ok(batch)) => Some((Ok(batch), Some(source))),
                // Dropping the publisher publishes a filter that keeps every row.
                Some(Err(e)) => Some((Err(e), None)),
                None => None,
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, s)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// Where a target finds its filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FilterFrom {
    /// This node's source of the same partition.
    Partition,
    /// This node's source of partition 0: a build side collected once for every
    /// partition (as `CollectLeft` joins do), which holds every key of the join.
    Shared,
    /// Every worker's part, sent on this filter exchange (a partitioned join whose
    /// probe rows this stage sends).
    Workers(ExchangeId),
}

/// The probe side of a run-time filter: on its first poll waits for filter `id`, then
/// drops the rows of its input whose key `columns` the build side lacks.
#[derive(Debug)]
pub struct FilterTargetExec {
    input: Arc<dyn ExecutionPlan>,
    id: u32,
    columns: Vec<usize>,
    from: FilterFrom,
    metrics: ExecutionPlanMetricsSet,
}

impl FilterTargetExec {
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        id: u32,
        columns: Vec<usize>,
        from: FilterFrom,
    ) -> Result<Self> {
        check_columns(&input, &columns)?;
        Ok(Self {
            input,
            id,
            columns,
            from,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }
    pub fn from(&self) -> FilterFrom {
        self.from
    }
}

impl DisplayAs for FilterTargetExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "FilterTargetExec: run-time filter {} on [{}]",
            self.id,
            names(self.input.as_ref(), &self.columns)
        )?;
        match self.from {
            FilterFrom::Workers(x) => write!(f, ", from every worker on exchange {x}"),
            FilterFrom::Partition | FilterFrom::Shared => Ok(()),
        }
    }
}

/// A target's stream between polls.
struct Target {
    input: SendableRecordBatchStream,
    columns: Vec<usize>,
    qc: Arc<QueryContext>,
    id: u32,
    partition: usize,
    from: FilterFrom,
    /// `None` until the first poll has waited for it.
    filter: Option<Arc<KeyFilter>>,
    /// Scratch space for the key hashes of a batch.
    hashes: Vec<u64>,
    seen: usize,
    pruned: usize,
    /// Off once the filter proved not to prune.
    active: bool,
    baseline: BaselineMetrics,
    rows_pruned: Count,
    wait: Time,
}

impl Target {
    /// The next batch with a row the filter keeps, pruned; the first call waits for the
    /// filter.
    async fn next(&mut self) -> Option<Result<RecordBatch>> {
        let filter = match &self.filter {
            Some(f) => Arc::clone(f),
            None => {
                let _t = self.wait.timer();
                let slots = &self.qc.runtime_filters;
                let f = match self.from {
                    FilterFrom::Partition => slots.wait(self.id, self.partition).await,
                    FilterFrom::Shared => slots.wait(self.id, 0).await,
                    FilterFrom::Workers(x) => match network::gather(&self.qc, x).await {
                        Ok(f) => f,
                        Err(e) => return Some(Err(e)),
                    },
                };
                self.active = f.keys().is_some();
                self.filter = Some(Arc::clone(&f));
                f
            }
        };
        loop {
            let batch = match self.input.next().await? {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            if !self.active {
                self.baseline.record_output(batch.num_rows());
                return Some(Ok(batch));
            }
            let out = {
                let _t = self.baseline.elapsed_compute().timer();
                prune(&filter, &batch, &self.columns, &mut self.hashes)
            };
            let out = match out {
                Ok(o) => o,
                Err(e) => return Some(Err(e)),
            };
            let dropped = batch.num_rows() - out.num_rows();
            self.seen += batch.num_rows();
            self.pruned += dropped;
            self.rows_pruned.add(dropped);
            if self.seen >= CHECK_AFTER_ROWS && self.pruned * 10 < self.seen {
                self.active = false;
            }
            if out.num_rows() > 0 {
                self.baseline.record_output(out.num_rows());
                return Some(Ok(out));
            }
        }
    }
}

/// The rows of `batch` that `filter` keeps, judged by the key `columns`.
fn prune(
    filter: &KeyFilter,
    batch: &RecordBatch,
    columns: &[usize],
    hashes: &mut Vec<u64>,
) -> Result<RecordBatch> {
    let keys = key_columns(batch, columns);
    match filter.may_match(&keys, batch.num_rows(), hashes)? {
        Some(keep) => Ok(filter_record_batch(batch, &keep)?),
        None => Ok(batch.clone()),
    }
}

impl ExecutionPlan for FilterTargetExec {
    fn name(&self) -> &'static str {
        "FilterTargetExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| internal_datafusion_err!("a filter target has one child"))?;
        Ok(Arc::new(Self::try_new(
            input,
            self.id,
            self.columns.clone(),
            self.from,
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
        let qc = QueryContext::of(&context)?;
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let target = Target {
            input,
            columns: self.columns.clone(),
            qc,
            id: self.id,
            partition,
            from: self.from,
            filter: None,
            hashes: Vec::new(),
            seen: 0,
            pruned: 0,
            active: true,
            baseline: BaselineMetrics::new(&self.metrics, partition),
            rows_pruned: MetricBuilder::new(&self.metrics).counter("rows_pruned", partition),
            wait: MetricBuilder::new(&self.metrics).subset_time("filter_wait", partition),
        };
        let s = futures::stream::unfold(target, |mut target| async move {
            let next = target.next().await?;
            Some((next, target))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, s)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
