//! Where the planner puts radix joins. A partitioned hash join the radix kernel can
//! run ([`RadixJoinExec::supports`]: one integer key, NULLs matching nothing, no
//! null-aware anti join, no pushed-down limit) becomes a [`RadixJoinExec`] around it:
//! - with `SET gyre.join_kernel = radix`, every such join, before the Flow-Join rule
//!   (which then leaves them alone: the radix kernel has no skew handling);
//! - with `auto` (the default), after the Flow-Join rule, those that did not become
//!   Flow-Joins and whose build side the statistics estimate at enough rows per worker
//!   to span several cache-sized radix partitions ([`radix_pays_off`]), where the
//!   kernel beats DataFusion's hash table. Joins with a shuffled probe input keep
//!   Flow-Join's skew handling while skew detection is on; joins of co-located inputs
//!   and, with skew detection off, the others get the radix kernel.
//!
//! The join keeps its inputs, type, filter, projection, partitioning and order, so
//! nothing above it changes.

use crate::join_selection::estimated_rows;
use crate::options::{GyreOptions, JoinKernel};
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};
use gyre_exchange::radix_join::radix_pays_off;
use gyre_exchange::{NeoJoinExec, RadixJoinExec, wrapped_join};
use std::sync::Arc;

/// The physical optimizer rule that places radix joins (`gyre.join_kernel`), in one of
/// its two places among the rules.
#[derive(Debug)]
pub struct RadixJoinRule {
    /// Which setting this place serves: `radix` before the Flow-Join rule, `auto`
    /// after it.
    kernel: JoinKernel,
}

impl RadixJoinRule {
    /// The rule for `gyre.join_kernel = radix`, to run before the Flow-Join rule.
    pub fn before_flow_joins() -> Self {
        Self {
            kernel: JoinKernel::Radix,
        }
    }

    /// The rule for `gyre.join_kernel = auto`, to run after the Flow-Join rule.
    pub fn after_flow_joins() -> Self {
        Self {
            kernel: JoinKernel::Auto,
        }
    }
}

impl PhysicalOptimizerRule for RadixJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if GyreOptions::of(config).join_kernel != self.kernel {
            return Ok(plan);
        }
        // `auto` weighs each join's build side per worker; `radix` takes them all.
        let workers = (self.kernel == JoinKernel::Auto)
            .then(|| config.execution.target_partitions.max(1) as u64);
        plan_radix_joins(plan, workers)
    }

    fn name(&self) -> &str {
        "gyre_radix_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Wraps every hash join of `plan` the radix kernel can run, but those Flow-Joins run;
/// with `workers`, only those whose build side is estimated large enough per worker
/// for the kernel to pay off.
pub fn plan_radix_joins(
    plan: Arc<dyn ExecutionPlan>,
    workers: Option<u64>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let recompute = || ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
    let rewrite_children = |node: Arc<dyn ExecutionPlan>| -> Result<Arc<dyn ExecutionPlan>> {
        let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
        if children.is_empty() {
            return Ok(node);
        }
        let new = children
            .iter()
            .map(|c| plan_radix_joins(Arc::clone(c), workers))
            .collect::<Result<Vec<_>>>()?;
        match new.iter().zip(&children).all(|(a, b)| Arc::ptr_eq(a, b)) {
            true => Ok(node),
            false => node.replace_children(new, recompute()),
        }
    };
    // Decided on the join as planned, its inputs' estimates not yet behind radix joins.
    let kernel_pays_off = |hj: &HashJoinExec| {
        RadixJoinExec::supports(hj).is_ok()
            && workers.is_none_or(|n| {
                estimated_rows(hj.left()).is_some_and(|rows| radix_pays_off(rows / n))
            })
    };
    // A Neo-Join runs its local join itself: the kernel is one of its settings.
    if let Some(neo) = plan.downcast_ref::<NeoJoinExec>() {
        let join = rewrite_children(Arc::clone(neo.join()))?;
        let mut settings = neo.settings();
        // As for other joins (Neo-Join with the kernel took 0.58x its time with
        // DataFusion's hash table on 1 M x 16 M rows).
        settings.radix_kernel |= kernel_pays_off(neo.hash_join());
        if Arc::ptr_eq(&join, neo.join()) && settings == neo.settings() {
            return Ok(plan);
        }
        return Ok(Arc::new(NeoJoinExec::try_new(
            join,
            settings,
            neo.exchange(),
        )?));
    }
    // A Flow-Join runs the hash join below it itself: only that join's inputs change.
    if let Some(wrapped) = wrapped_join(plan.as_ref()) {
        let join = rewrite_children(Arc::clone(wrapped))?;
        if Arc::ptr_eq(&join, wrapped) {
            return Ok(plan);
        }
        return plan.replace_children(vec![join], recompute());
    }
    if plan.is::<RadixJoinExec>() {
        return Ok(plan);
    }
    let eligible = plan
        .downcast_ref::<HashJoinExec>()
        .is_some_and(kernel_pays_off);
    let plan = rewrite_children(plan)?;
    match eligible {
        true => Ok(Arc::new(RadixJoinExec::try_new(plan)?)),
        false => Ok(plan),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::{JoinType, NullEquality};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::joins::PartitionMode;

    /// A partitioned join of `build_rows` build rows in 4 partitions with 100 probe rows.
    fn join(build_rows: i64) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let part = |rows: i64| {
            let keys = Int64Array::from_iter_values(0..rows);
            vec![RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys)]).unwrap()]
        };
        let input = |rows: i64| {
            let parts = vec![part(rows / 4); 4];
            MemorySourceConfig::try_new_exec(&parts, Arc::clone(&schema), None).unwrap()
        };
        let key = || Arc::new(Column::new("k", 0)) as _;
        Arc::new(
            HashJoinExec::try_new(
                input(build_rows),
                input(100),
                vec![(key(), key())],
                None,
                &JoinType::Inner,
                None,
                PartitionMode::Partitioned,
                NullEquality::NullEqualsNothing,
                false,
            )
            .unwrap(),
        )
    }

    fn kernel(plan: Arc<dyn ExecutionPlan>, workers: Option<u64>) -> &'static str {
        let plan = plan_radix_joins(plan, workers).unwrap();
        match plan.is::<RadixJoinExec>() {
            true => "radix",
            false => "hash",
        }
    }

    #[test]
    fn auto_takes_the_radix_kernel_only_for_build_sides_beyond_the_cache() {
        // 4,000 rows fit one cache-sized partition on any machine; 8 million rows (2
        // million per worker, 32 MB of tuples) span many.
        assert_eq!(kernel(join(4_000), Some(4)), "hash");
        assert_eq!(kernel(join(8_000_000), Some(4)), "radix");
        // `radix` takes every join it can run, whatever its size.
        assert_eq!(kernel(join(4_000), None), "radix");
        assert!(!radix_pays_off(1_000));
        assert!(radix_pays_off(100_000_000));
    }
}
