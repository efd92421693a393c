//! Where the planner puts Neo-Joins (`SET gyre.join_strategy = 'neo'`): partitioned
//! hash joins that shuffle at least one input become [`NeoJoinExec`]s over the
//! unshuffled inputs, which place both by Neo-Join's assignment instead
//! (`gyre_exchange::neo_join`). With `auto` (and `gyre.neo_min_saving` not off) the
//! joins that shuffle both inputs become Neo-Joins that choose at run time between the
//! assignment and a hash shuffle (with one input already placed on the key, a hash
//! shuffle moves only the other one, without collecting both first). Where a join is
//! safe to rewrite is Flow-Join's rule (nothing above relies on its hash partitioning
//! or order); the join must have one integer or date key ([`NeoJoinExec::supports`]).
//! A join whose inputs are both co-located already moves nothing and stays.

use crate::flow::{recompute, rewrite_unpinned, unshuffled};
use crate::options::{GyreOptions, JoinStrategy};
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use gyre_exchange::{NeoJoinExec, NeoSettings};
use std::sync::Arc;

/// The physical optimizer rule that places Neo-Joins over one partition per worker.
#[derive(Debug, Default)]
pub struct NeoJoinRule;

impl PhysicalOptimizerRule for NeoJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let n = config.execution.target_partitions;
        let mut settings = GyreOptions::of(config).neo;
        match JoinStrategy::of(config) {
            JoinStrategy::Neo => settings.min_saving = None,
            JoinStrategy::Auto if settings.min_saving.is_some() => {}
            _ => return Ok(plan),
        }
        if n < 2 {
            return Ok(plan);
        }
        rewrite_unpinned(plan, false, &|node| neo_join(node, n, settings))
    }

    fn name(&self) -> &str {
        "gyre_neo_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The Neo-Join for `node`, if it is an eligible join.
fn neo_join(
    node: &Arc<dyn ExecutionPlan>,
    n: usize,
    settings: NeoSettings,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(hj) = node.downcast_ref::<HashJoinExec>() else {
        return Ok(None);
    };
    if *hj.partition_mode() != PartitionMode::Partitioned
        || hj.left().output_partitioning().partition_count() != n
        || NeoJoinExec::supports(hj).is_err()
    {
        return Ok(None);
    }
    let keys = |left: bool| -> Vec<_> {
        hj.on()
            .iter()
            .map(|(l, r)| Arc::clone(if left { l } else { r }))
            .collect()
    };
    let build = unshuffled(hj.left(), &keys(true), n);
    let probe = unshuffled(hj.right(), &keys(false), n);
    // Both co-located: nothing to move. A shuffle Neo-Join cannot take over (other
    // keys, order kept) would move the rows twice.
    let other_shuffle = |side: &Option<_>, input: &Arc<dyn ExecutionPlan>| {
        side.is_none() && input.is::<RepartitionExec>()
    };
    let run_time = settings.min_saving.is_some();
    if (build.is_none() && probe.is_none())
        || (run_time && (build.is_none() || probe.is_none()))
        || other_shuffle(&build, hj.left())
        || other_shuffle(&probe, hj.right())
    {
        return Ok(None);
    }
    let build = build.unwrap_or_else(|| Arc::clone(hj.left()));
    let probe = probe.unwrap_or_else(|| Arc::clone(hj.right()));
    let join = Arc::clone(node).replace_children(vec![build, probe], recompute())?;
    Ok(Some(Arc::new(NeoJoinExec::try_new(join, settings, None)?)))
}
