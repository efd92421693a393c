//! Run-time filters: a hash join's build keys prune its probe input where it is read.
//!
//! DataFusion pushes a dynamic filter from a hash join's build side into the probe
//! side's scan, but waits for every partition's build side first, and a Gyre worker
//! runs one partition of each stage. Gyre's filters are per worker instead:
//! - [`FilterSourceExec`] sits on a join's build input and, as the rows pass, collects
//!   their key hashes ([`KeyFilterBuilder`]); at the end it publishes a [`KeyFilter`]
//!   in the query's [`FilterSlots`] on this node;
//! - [`FilterTargetExec`] sits on the probe input where it is read (above the table
//!   scan, below the projections, filters and inner joins in between) and, on its first
//!   poll, waits for the filter, then drops every row whose key the build side lacks.
//!
//! The planner places a pair only where this worker's probe rows reach this worker's
//! join (no exchange between the target and the join): a probe row the local build
//! side lacks then matches nothing, whatever the partitioning (a broadcast build side
//! holds every key, a co-partitioned one the keys of this worker's rows). And only for
//! joins that drop probe rows without a match (inner, left, left semi/anti/mark, right
//! semi). The wait costs nothing: a hash join reads its build side to the end before it
//! polls its probe side, and the target is polled only by that probe side. A source
//! dropped before its end publishes a filter that keeps every row, so no target waits
//! for ever.
//!
//! A target keeps filtering only while it prunes: after [`CHECK_AFTER_ROWS`] rows, a
//! filter that dropped less than a tenth of them steps aside.

mod keys;

pub use keys::{FilterSlots, KeyFilter, KeyFilterBuilder, MAX_FILTER_KEYS};

use crate::context::QueryContext;
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
    metrics: ExecutionPlanMetricsSet,
}

impl FilterSourceExec {
    pub fn try_new(input: Arc<dyn ExecutionPlan>, id: u32, columns: Vec<usize>) -> Result<Self> {
        check_columns(&input, &columns)?;
        Ok(Self {
            input,
            id,
            columns,
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
}

impl DisplayAs for FilterSourceExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "FilterSourceExec: run-time filter {} on [{}]",
            self.id,
            names(self.input.as_ref(), &self.columns)
        )
    }
}

/// Publishes its builder's filter when dropped: at the input's end, or earlier (the
/// consumer stopped) with a filter that keeps every row.
struct Publisher {
    qc: Arc<QueryContext>,
    id: u32,
    partition: usize,
    builder: Option<KeyFilterBuilder>,
    complete: bool,
    keys: Gauge,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let filter = match (self.complete, self.builder.take()) {
            (true, Some(b)) => b.finish(),
            _ => KeyFilter::pass_all(),
        };
        self.keys.set(filter.keys().unwrap_or(0));
        self.qc
            .runtime_filters
            .publish(self.id, self.partition, filter);
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
        Ok(Arc::new(Self::try_new(
            input,
            self.id,
            self.columns.clone(),
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
        let keys = MetricBuilder::new(&self.metrics).gauge("filter_keys", partition);
        let time = MetricBuilder::new(&self.metrics).subset_time("filter_build_time", partition);
        let publisher = Publisher {
            qc,
            id: self.id,
            partition,
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

/// The probe side of a run-time filter: on its first poll waits for filter `id`, then
/// drops the rows of its input whose key `columns` the build side lacks.
#[derive(Debug)]
pub struct FilterTargetExec {
    input: Arc<dyn ExecutionPlan>,
    id: u32,
    columns: Vec<usize>,
    /// The filter comes from partition 0 of the source (a build side collected once
    /// for every partition, as `CollectLeft` joins do), not from this partition's.
    shared: bool,
    metrics: ExecutionPlanMetricsSet,
}

impl FilterTargetExec {
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        id: u32,
        columns: Vec<usize>,
        shared: bool,
    ) -> Result<Self> {
        check_columns(&input, &columns)?;
        Ok(Self {
            input,
            id,
            columns,
            shared,
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
    pub fn shared(&self) -> bool {
        self.shared
    }
}

impl DisplayAs for FilterTargetExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "FilterTargetExec: run-time filter {} on [{}]",
            self.id,
            names(self.input.as_ref(), &self.columns)
        )
    }
}

/// A target's stream between polls.
struct Target {
    input: SendableRecordBatchStream,
    columns: Vec<usize>,
    qc: Arc<QueryContext>,
    id: u32,
    slot: usize,
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
                let f = self.qc.runtime_filters.wait(self.id, self.slot).await;
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
            self.shared,
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
            slot: if self.shared { 0 } else { partition },
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
