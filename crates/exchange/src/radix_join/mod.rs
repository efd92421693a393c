//! [`RadixJoinExec`]: a partitioned hash equi-join run by Gyre's radix-partitioned join
//! kernel (`gyre_join::radix`, Manegold, Boncz and Kersten's cache-conscious join as
//! the cyclo-join paper ports it, Sec. IV-C.1) instead of DataFusion's hash table.
//!
//! The node wraps the `HashJoinExec` the planner chose and keeps its meaning exactly:
//! the same inputs (partition `i` of the build and of the probe input, already
//! hash-partitioned alike), join type, filter, projection and output order. Only how
//! matches are found changes: the build partition is radix-partitioned into
//! cache-sized pieces with a bucket directory each, and probe rows are partitioned the
//! same way in chunks, so that each piece of the build side is probed while it stays in
//! cache ([`stream`] holds the per-partition state machine).
//!
//! It runs joins on one integer or date key (8 to 64 bits, signed or unsigned, any
//! expression of the inputs, [`key_type_supported`]) whose NULLs match nothing, of
//! every join type except null-aware anti joins, without a pushed-down limit
//! ([`RadixJoinExec::supports`]).

mod stream;

use crate::cyclo::key_type_supported;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{NullEquality, Result, Statistics, internal_datafusion_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use std::fmt;
use std::sync::Arc;

/// A partitioned hash join whose matches the radix join kernel finds.
#[derive(Debug)]
pub struct RadixJoinExec {
    /// The `HashJoinExec` (partitioned mode) this node runs, its only child (as a
    /// Flow-Join's): the join's inputs are the join's children, and planner passes that
    /// look for hash joins (run-time filters, stages) find it.
    join: Arc<dyn ExecutionPlan>,
    metrics: ExecutionPlanMetricsSet,
}

impl RadixJoinExec {
    /// Wraps `join`, which must be a hash join [`RadixJoinExec::supports`] accepts.
    pub fn try_new(join: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let Some(hj) = join.downcast_ref::<HashJoinExec>() else {
            return plan_err!("a radix join wraps a hash join, not {}", join.name());
        };
        if let Err(reason) = Self::supports(hj) {
            return plan_err!("the radix join kernel cannot run this join: {reason}");
        }
        Ok(Self {
            join,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Whether the kernel can run `hj`, and if not, why not.
    pub fn supports(hj: &HashJoinExec) -> std::result::Result<(), String> {
        if *hj.partition_mode() != PartitionMode::Partitioned {
            return Err(format!("{:?} mode, not partitioned", hj.partition_mode()));
        }
        if hj.null_aware {
            return Err("a null-aware anti join (NOT IN) matches NULL keys".into());
        }
        if hj.null_equality() != NullEquality::NullEqualsNothing {
            return Err("NULL keys match each other".into());
        }
        if let Some(fetch) = hj.fetch() {
            return Err(format!("it stops after {fetch} rows"));
        }
        let [(l, r)] = hj.on() else {
            return Err(format!("{} key columns, not one", hj.on().len()));
        };
        let (lt, rt) = (
            l.data_type(&hj.left().schema())
                .map_err(|e| e.to_string())?,
            r.data_type(&hj.right().schema())
                .map_err(|e| e.to_string())?,
        );
        if lt != rt || key_type_supported(&lt).is_none() {
            return Err(format!("keys of types {lt} and {rt}"));
        }
        let n = hj.left().output_partitioning().partition_count();
        let m = hj.right().output_partitioning().partition_count();
        if n != m {
            return Err(format!("{n} build and {m} probe partitions"));
        }
        Ok(())
    }

    /// The hash join this node runs.
    pub fn hash_join(&self) -> &HashJoinExec {
        self.join
            .downcast_ref::<HashJoinExec>()
            .expect("checked by try_new")
    }

    /// The hash join, as a plan node.
    pub fn join(&self) -> &Arc<dyn ExecutionPlan> {
        &self.join
    }
}

/// The radix kernel's stream for partition `partition` of `hj`, whose inputs may be
/// any plan (a Neo-Join runs it over the rows the assignment brings), its figures
/// in `metrics`.
pub(crate) fn radix_join_stream(
    hj: &HashJoinExec,
    partition: usize,
    context: Arc<TaskContext>,
    metrics: &ExecutionPlanMetricsSet,
) -> Result<SendableRecordBatchStream> {
    stream::RadixJoinStream::start(hj, partition, context, metrics)
}

/// Radix partitions a build side must span before the kernel pays off: a build side
/// that fits in one or two cache-sized partitions is probed about as fast through
/// DataFusion's hash table (docs/results.md, "The radix join kernel in SQL").
pub const MIN_RADIX_PARTITIONS: usize = 4;

/// Whether the radix kernel is expected to beat DataFusion's hash join on a build
/// side of `rows` rows (one partition's), with this machine's cache.
pub fn radix_pays_off(rows: u64) -> bool {
    let config = gyre_join::radix::RadixConfig::default();
    gyre_join::radix::RadixLayout::plan(rows as usize, &config)
        .is_ok_and(|layout| 1usize << layout.partition_bits() >= MIN_RADIX_PARTITIONS)
}

impl DisplayAs for RadixJoinExec {
    /// The join itself is the child below.
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RadixJoinExec: kernel=radix-partitioned hash")
    }
}

impl ExecutionPlan for RadixJoinExec {
    fn name(&self) -> &'static str {
        "RadixJoinExec"
    }

    /// The hash join's: same schema, partitioning and order (the stream keeps the
    /// probe order wherever the hash join does).
    fn properties(&self) -> &Arc<PlanProperties> {
        self.join.properties()
    }

    /// The join's output, in the join's order.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.join]
    }

    /// None of its own: the join's are the join's.
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
            .map_err(|_| internal_datafusion_err!("a radix join has one child, its hash join"))?;
        Ok(Arc::new(Self::try_new(join)?))
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
        let hj = self.hash_join();
        let n = hj.left().output_partitioning().partition_count();
        if partition >= n {
            return Err(internal_datafusion_err!(
                "radix join partition {partition} of {n}"
            ));
        }
        stream::RadixJoinStream::start(hj, partition, context, &self.metrics)
    }

    /// The join's: it returns the same rows.
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        match input_stats {
            [join] => Ok(Arc::clone(join)),
            _ => Err(internal_datafusion_err!(
                "a radix join has one child, its hash join"
            )),
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

#[cfg(test)]
mod tests;
