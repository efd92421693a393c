//! Chooses broadcast or repartition for each hash join from input sizes.
//!
//! With `n` workers, repartitioning both inputs moves `(n-1)/n` of each input
//! that is not already partitioned on the join key, while broadcasting the
//! smaller input moves `(n-1)` times its size. Broadcasting is therefore
//! cheaper exactly when the other input is at least `n-1` times larger (when
//! neither input is co-located). Broadcasting is only allowed where every
//! worker can produce its share of the result from its own copy of the build
//! side: inner joins and joins that preserve only the probe side.

use crate::cyclo::JoinStrategy;
use crate::placed_keys::narrow_to_placed_keys;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{JoinType, Result};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};
use std::sync::Arc;

/// Resolves `PartitionMode::Auto` hash joins for a cluster of
/// `target_partitions` workers. Runs before DataFusion's `JoinSelection`.
#[derive(Debug, Default)]
pub struct DistributedJoinSelection;

/// Whether a collect-left join of this type stays correct when each worker
/// holds its own full copy of the left (build) input: no build row needs match
/// state from other workers (a build row matched by no probe row of one worker may be
/// matched on another): exactly the types that do not preserve the build side, which
/// a Flow-Join has to track across workers for the same reason.
pub fn broadcast_safe(join_type: JoinType) -> bool {
    !gyre_exchange::flow::preserves_build(join_type)
}

pub(crate) fn estimated_bytes(plan: &Arc<dyn ExecutionPlan>) -> Option<f64> {
    let stats = StatisticsContext::new()
        .compute(plan.as_ref(), &StatisticsArgs::new())
        .ok()?;
    if let Some(b) = stats.total_byte_size.get_value() {
        return Some(*b as f64);
    }
    // Without byte sizes, rows times a nominal width still orders the inputs.
    stats.num_rows.get_value().map(|r| *r as f64 * 64.0)
}

/// Estimated output rows of `plan`, if its statistics know them.
pub(crate) fn estimated_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<u64> {
    let stats = StatisticsContext::new()
        .compute(plan.as_ref(), &StatisticsArgs::new())
        .ok()?;
    stats.num_rows.get_value().map(|r| *r as u64)
}

/// Whether `plan` is already hash-partitioned on exactly `keys` over `n` partitions.
fn co_located(
    plan: &Arc<dyn ExecutionPlan>,
    keys: &[Arc<dyn datafusion::physical_expr::PhysicalExpr>],
    n: usize,
) -> bool {
    match plan.output_partitioning() {
        Partitioning::Hash(exprs, count) => {
            *count == n && exprs.len() == keys.len() && exprs.iter().zip(keys).all(|(a, b)| a.eq(b))
        }
        _ => false,
    }
}

/// The decision for one join, exposed for tests and `EXPLAIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinDistribution {
    /// Broadcast the left input (after an optional swap of the inputs).
    Broadcast { swap: bool },
    /// Hash-partition the inputs not already partitioned on the key.
    Repartition,
}

/// The distribution `SET gyre.join_strategy = 'broadcast'` asks for: broadcast the
/// smaller input where the join type allows it (either input otherwise), else repartition.
pub fn choose_broadcast(
    left_bytes: Option<f64>,
    right_bytes: Option<f64>,
    join_type: JoinType,
    n: usize,
) -> JoinDistribution {
    if n <= 1 {
        return JoinDistribution::Repartition;
    }
    let prefer_swap = matches!((left_bytes, right_bytes), (Some(l), Some(r)) if r < l);
    for swap in [prefer_swap, !prefer_swap] {
        let oriented = if swap { join_type.swap() } else { join_type };
        if broadcast_safe(oriented) && (!swap || join_type.supports_swap()) {
            return JoinDistribution::Broadcast { swap };
        }
    }
    JoinDistribution::Repartition
}

/// Chooses a distribution from sizes, co-location and join type.
pub fn choose(
    left_bytes: Option<f64>,
    right_bytes: Option<f64>,
    left_colocated: bool,
    right_colocated: bool,
    join_type: JoinType,
    n: usize,
) -> JoinDistribution {
    let (Some(l), Some(r)) = (left_bytes, right_bytes) else {
        return JoinDistribution::Repartition;
    };
    if n <= 1 {
        return JoinDistribution::Repartition;
    }
    let frac = (n as f64 - 1.0) / n as f64;
    let shuffle_cost =
        if left_colocated { 0.0 } else { l * frac } + if right_colocated { 0.0 } else { r * frac };
    let (small, swap) = if r < l { (r, true) } else { (l, false) };
    let oriented = if swap { join_type.swap() } else { join_type };
    if !broadcast_safe(oriented) || (swap && !join_type.supports_swap()) {
        return JoinDistribution::Repartition;
    }
    let broadcast_cost = small * (n as f64 - 1.0);
    if broadcast_cost <= shuffle_cost {
        JoinDistribution::Broadcast { swap }
    } else {
        JoinDistribution::Repartition
    }
}

impl PhysicalOptimizerRule for DistributedJoinSelection {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let n = config.execution.target_partitions;
        let strategy = JoinStrategy::of(config);
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            if *join.partition_mode() != PartitionMode::Auto || join.null_aware {
                return Ok(Transformed::no(node));
            }
            let left_keys: Vec<_> = join.on().iter().map(|(l, _)| Arc::clone(l)).collect();
            let right_keys: Vec<_> = join.on().iter().map(|(_, r)| Arc::clone(r)).collect();
            if strategy == JoinStrategy::Auto
                && !co_located(join.left(), &left_keys, n)
                && !co_located(join.right(), &right_keys, n)
                && let Some(narrowed) = narrow_to_placed_keys(join, n)?
            {
                let keys = |left: bool| -> Vec<_> {
                    narrowed
                        .on()
                        .iter()
                        .map(|(l, r)| Arc::clone(if left { l } else { r }))
                        .collect()
                };
                let decision = choose(
                    estimated_bytes(join.left()),
                    estimated_bytes(join.right()),
                    co_located(join.left(), &keys(true), n),
                    co_located(join.right(), &keys(false), n),
                    *join.join_type(),
                    n,
                );
                if decision == JoinDistribution::Repartition {
                    let partitioned = narrowed
                        .builder()
                        .with_partition_mode(PartitionMode::Partitioned)
                        .build()?;
                    return Ok(Transformed::yes(Arc::new(partitioned)));
                }
            }
            let decision = match strategy {
                // Neo-Joins replace the shuffled joins after optimisation.
                JoinStrategy::Shuffle | JoinStrategy::Neo => JoinDistribution::Repartition,
                JoinStrategy::Broadcast => choose_broadcast(
                    estimated_bytes(join.left()),
                    estimated_bytes(join.right()),
                    *join.join_type(),
                    n,
                ),
                // Cyclo-joins replace eligible joins after optimisation; the others
                // (and every join under `auto`) are distributed by size.
                JoinStrategy::Auto | JoinStrategy::Cyclo => choose(
                    estimated_bytes(join.left()),
                    estimated_bytes(join.right()),
                    co_located(join.left(), &left_keys, n),
                    co_located(join.right(), &right_keys, n),
                    *join.join_type(),
                    n,
                ),
            };
            let new: Arc<dyn ExecutionPlan> = match decision {
                JoinDistribution::Broadcast { swap: true } => {
                    join.swap_inputs(PartitionMode::CollectLeft)?
                }
                JoinDistribution::Broadcast { swap: false } => Arc::new(
                    join.builder()
                        .with_partition_mode(PartitionMode::CollectLeft)
                        .build()?,
                ),
                JoinDistribution::Repartition => Arc::new(
                    join.builder()
                        .with_partition_mode(PartitionMode::Partitioned)
                        .build()?,
                ),
            };
            Ok(Transformed::yes(new))
        })
        .data()
    }

    fn name(&self) -> &str {
        "gyre_distributed_join_selection"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_when_other_side_is_n_minus_1_times_larger() {
        // 4 workers: broadcast pays off once the big side is >= 3x the small one.
        let d = |l: f64, r: f64| choose(Some(l), Some(r), false, false, JoinType::Inner, 4);
        assert_eq!(d(100.0, 300.0), JoinDistribution::Broadcast { swap: false });
        assert_eq!(d(100.0, 299.0), JoinDistribution::Repartition);
        assert_eq!(d(300.0, 100.0), JoinDistribution::Broadcast { swap: true });
        assert_eq!(d(300.0, 299.0), JoinDistribution::Repartition);
    }

    #[test]
    fn co_located_inputs_need_no_shuffle() {
        let d = choose(Some(100.0), Some(1e9), true, true, JoinType::Inner, 4);
        assert_eq!(d, JoinDistribution::Repartition);
    }

    #[test]
    fn preserved_build_side_is_never_broadcast() {
        // LEFT JOIN with a small left side: its unmatched rows need a global view.
        let d = choose(Some(1.0), Some(1e9), false, false, JoinType::Left, 4);
        assert_eq!(d, JoinDistribution::Repartition);
        // LEFT JOIN with a small right side: swapped to RIGHT with the small side as build.
        let d = choose(Some(1e9), Some(1.0), false, false, JoinType::Left, 4);
        assert_eq!(d, JoinDistribution::Broadcast { swap: true });
        let d = choose(Some(1.0), Some(1e9), false, false, JoinType::Full, 4);
        assert_eq!(d, JoinDistribution::Repartition);
        let d = choose(Some(1e9), Some(1.0), false, false, JoinType::LeftSemi, 4);
        assert_eq!(d, JoinDistribution::Broadcast { swap: true });
    }

    #[test]
    fn forced_broadcast_picks_the_smaller_allowed_side() {
        let b = |l: f64, r: f64, t| choose_broadcast(Some(l), Some(r), t, 4);
        assert_eq!(
            b(1e9, 1.0, JoinType::Inner),
            JoinDistribution::Broadcast { swap: true }
        );
        assert_eq!(
            b(1.0, 1e9, JoinType::Inner),
            JoinDistribution::Broadcast { swap: false }
        );
        // LEFT JOIN: only the right side may be the broadcast build side.
        assert_eq!(
            b(1.0, 1e9, JoinType::Left),
            JoinDistribution::Broadcast { swap: true }
        );
        assert_eq!(b(1.0, 1e9, JoinType::Full), JoinDistribution::Repartition);
        assert_eq!(
            choose_broadcast(Some(1.0), Some(2.0), JoinType::Inner, 1),
            JoinDistribution::Repartition
        );
    }

    #[test]
    fn unknown_sizes_and_single_worker_repartition() {
        assert_eq!(
            choose(None, Some(1.0), false, false, JoinType::Inner, 4),
            JoinDistribution::Repartition
        );
        assert_eq!(
            choose(Some(1.0), Some(1e9), false, false, JoinType::Inner, 1),
            JoinDistribution::Repartition
        );
    }
}
