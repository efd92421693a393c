//! Where the planner puts Neo shuffles (`SET gyre.join_strategy = 'neo'`):
//! - partitioned hash joins that shuffle at least one input become [`NeoJoinExec`]s
//!   over the unshuffled inputs, which place both by Neo-Join's assignment instead
//!   (`gyre_exchange::neo`); the join must have one integer or date key
//!   ([`NeoJoinExec::supports`]). A join whose inputs are both co-located already
//!   moves nothing and stays;
//! - partitioned aggregates over a hash shuffle on their group keys become
//!   [`NeoAggregateExec`]s over the unshuffled input, placed by one integer or date
//!   group key ([`NeoAggregateExec::supports`]; of several, the one with the most
//!   distinct values where statistics know, else the first).
//!
//! With `auto` (and `gyre.neo_min_saving` not off) the joins that shuffle both inputs
//! become Neo-Joins that choose at run time between the assignment and a hash shuffle
//! (with one input already placed on the key, a hash shuffle moves only the other one,
//! without collecting both first). GROUP BYs stay hash shuffles under `auto`: deciding
//! at run time made a GROUP BY whose groups are spread over the workers 13-19% slower
//! on 4 emulated hosts, against 3.5x faster where they were clustered at 110 Mbit/s
//! and 1.02x at 1 Gbit/s (docs/results.md, "Neo aggregations"). Where an operator is
//! safe to rewrite is Flow-Join's rule (nothing above relies on its hash partitioning
//! or order).

use crate::flow::{Pinned, recompute, rewrite_unpinned, unshuffled};
use crate::options::{GyreOptions, JoinStrategy};
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use gyre_exchange::{NeoAggregateExec, NeoJoinExec, NeoSettings};
use std::sync::Arc;

/// The physical optimizer rule that places Neo-Joins and Neo aggregations over one
/// partition per worker.
#[derive(Debug, Default)]
pub struct NeoRule;

impl PhysicalOptimizerRule for NeoRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let n = config.execution.target_partitions;
        let mut settings = GyreOptions::of(config).neo;
        let strategy = JoinStrategy::of(config);
        match strategy {
            JoinStrategy::Neo => settings.min_saving = None,
            JoinStrategy::Auto if settings.min_saving.is_some() => {}
            _ => return Ok(plan),
        }
        // Under `auto`, GROUP BYs keep their hash shuffle (see the module doc).
        let aggregates = strategy == JoinStrategy::Neo;
        if n < 2 {
            return Ok(plan);
        }
        rewrite_unpinned(
            plan,
            Pinned::default(),
            &|node| match neo_join(node, n, settings)? {
                Some(join) => Ok(Some(join)),
                None if aggregates => neo_aggregate(node, n, settings),
                None => Ok(None),
            },
        )
    }

    fn name(&self) -> &str {
        "gyre_neo_shuffles"
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

/// The Neo aggregation for `node`, if it is an eligible aggregate over a hash shuffle
/// on its group keys.
fn neo_aggregate(
    node: &Arc<dyn ExecutionPlan>,
    n: usize,
    settings: NeoSettings,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(agg) = node.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    let Ok(keys) = NeoAggregateExec::supports(agg) else {
        return Ok(None);
    };
    let group = agg.group_expr().input_exprs();
    let Some(input) = unshuffled(agg.input(), &group, n) else {
        return Ok(None);
    };
    // Placing rows by a key with few values leaves most workers idle: of several, the
    // key with the most distinct values where the statistics know them.
    let statistics = StatisticsContext::new()
        .compute(input.as_ref(), &StatisticsArgs::new())
        .ok();
    let distinct = |k: &usize| {
        let column = group[*k].downcast_ref::<Column>()?;
        match statistics
            .as_ref()?
            .column_statistics
            .get(column.index())?
            .distinct_count
        {
            Precision::Exact(d) | Precision::Inexact(d) => Some(d),
            Precision::Absent => None,
        }
    };
    let key = keys
        .iter()
        .rev()
        .max_by_key(|k| distinct(k).unwrap_or(0))
        .copied()
        .unwrap_or(keys[0]);
    let aggregate = Arc::clone(node).replace_children(vec![input], recompute())?;
    Ok(Some(Arc::new(NeoAggregateExec::try_new(
        aggregate, key, settings, None,
    )?)))
}
