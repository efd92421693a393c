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
        let columns = self.columns.clone();
        let s = futures::stream::unfold(Some((input, publisher)), move |state| {
            let (columns, time) = (columns.clone(), time.clone());
            async move {
                let (mut input, mut publisher) = state?;
                match input.next().await {
                    Some(Ok(batch)) => {
                        let added = {
                            let _t = time.timer();
                            match &mut publisher.builder {
                                Some(b) => b.add(&key_columns(&batch, &columns), batch.num_rows()),
                                None => Ok(()),
                            }
                        };
                        Some((added.map(|()| batch), Some((input, publisher))))
                    }
                    // Dropping the publisher publishes a filter that keeps every row.
                    Some(Err(e)) => Some((Err(e), None)),
                    None => {
                        publisher.complete = true;
                        None
                    }
                }
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

/// What a target's stream carries between polls.
struct Target {
    input: SendableRecordBatchStream,
    filter: Option<Arc<KeyFilter>>,
    seen: usize,
    pruned: usize,
    /// Off once the filter proved not to prune.
    active: bool,
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
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let pruned_m: Count = MetricBuilder::new(&self.metrics).counter("rows_pruned", partition);
        let wait: Time = MetricBuilder::new(&self.metrics).subset_time("filter_wait", partition);
        let (id, slot) = (self.id, if self.shared { 0 } else { partition });
        let columns = self.columns.clone();
        let state = Target {
            input,
            filter: None,
            seen: 0,
            pruned: 0,
            active: true,
        };
        let s = futures::stream::unfold(state, move |mut st| {
            let (qc, columns, baseline, pruned_m, wait) = (
                Arc::clone(&qc),
                columns.clone(),
                baseline.clone(),
                pruned_m.clone(),
                wait.clone(),
            );
            async move {
                if st.filter.is_none() {
                    let _t = wait.timer();
                    let f = qc.runtime_filters.wait(id, slot).await;
                    st.active = f.keys().is_some();
                    st.filter = Some(f);
                }
                loop {
                    let batch = match st.input.next().await? {
                        Ok(b) => b,
                        Err(e) => return Some((Err(e), st)),
                    };
                    if !st.active {
                        baseline.record_output(batch.num_rows());
                        return Some((Ok(batch), st));
                    }
                    let out = {
                        let _t = baseline.elapsed_compute().timer();
                        prune(&st, &batch, &columns)
                    };
                    let out = match out {
                        Ok(o) => o,
                        Err(e) => return Some((Err(e), st)),
                    };
                    st.seen += batch.num_rows();
                    st.pruned += batch.num_rows() - out.num_rows();
                    pruned_m.add(batch.num_rows() - out.num_rows());
                    if st.seen >= CHECK_AFTER_ROWS && st.pruned * 10 < st.seen {
                        st.active = false;
                    }
                    if out.num_rows() > 0 {
                        baseline.record_output(out.num_rows());
                        return Some((Ok(out), st));
                    }
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, s)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The rows of `batch` the target's filter keeps.
fn prune(st: &Target, batch: &RecordBatch, columns: &[usize]) -> Result<RecordBatch> {
    let Some(filter) = &st.filter else {
        return Ok(batch.clone());
    };
    match filter.may_match(&key_columns(batch, columns), batch.num_rows())? {
        Some(keep) => Ok(filter_record_batch(batch, &keep)?),
        None => Ok(batch.clone()),
    }
}
