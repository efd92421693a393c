//! Where the planner puts radix joins: with `SET gyre.join_kernel = radix`, every
//! partitioned hash join the radix kernel can run ([`RadixJoinExec::supports`]: one
//! integer key, NULLs matching nothing, no null-aware anti join, no pushed-down limit)
//! becomes a [`RadixJoinExec`] around it. The join keeps its inputs, type, filter,
//! projection, partitioning and order, so nothing above it changes. It runs before the
//! Flow-Join rule, which leaves the joins it wrapped alone.

use crate::options::{GyreOptions, JoinKernel};
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;
use gyre_exchange::RadixJoinExec;
use std::sync::Arc;

/// The physical optimizer rule that places radix joins (`gyre.join_kernel`).
#[derive(Debug, Default)]
pub struct RadixJoinRule;

impl PhysicalOptimizerRule for RadixJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match GyreOptions::of(config).join_kernel {
            JoinKernel::Hash => Ok(plan),
            JoinKernel::Radix => plan_radix_joins(plan),
        }
    }

    fn name(&self) -> &str {
        "gyre_radix_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Wraps every hash join of `plan` the radix kernel can run.
pub fn plan_radix_joins(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let eligible = node
            .downcast_ref::<HashJoinExec>()
            .is_some_and(|hj| RadixJoinExec::supports(hj).is_ok());
        if !eligible {
            return Ok(Transformed::no(node));
        }
        Ok(Transformed::yes(
            Arc::new(RadixJoinExec::try_new(node)?) as Arc<dyn ExecutionPlan>
        ))
    })
    .map(|t| t.data)
}
