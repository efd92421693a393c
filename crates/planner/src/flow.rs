//! Where the planner puts Flow-Joins: partitioned hash joins whose probe input
//! is shuffled become [`FlowJoinExec`]s, which route that shuffle themselves, detect heavy
//! hitters while it streams and keep them local (`gyre_exchange::flow`).
//!
//! On by default; `SET gyre.skew_detection = off` keeps DataFusion's joins. A join is
//! rewritten only where that is safe:
//! - a partitioned `HashJoinExec`, not null-aware, of any type ([`flow_join_supported`]:
//!   a build-preserving one only without a pushed-down `fetch`, and only as far as
//!   `gyre.skew_build_preserving` allows: semi/anti/mark by default, outer joins with
//!   `all`);
//! - its probe (right) input is a hash `RepartitionExec` on exactly the probe keys into
//!   one partition per worker, over an input with one partition per worker, without
//!   order preservation;
//! - if its build (left) input is such a shuffle too, the Flow-Join routes the build
//!   input as well and detects skew on it (`gyre.skew_build_side`, on by default);
//! - nothing above relies on the join's output being hash-partitioned or ordered (heavy
//!   keys are joined on every worker): no ancestor requires a hash distribution that
//!   reaches the join through operators passing partitioning through, or an order
//!   that reaches it through operators keeping their input's order (a sort above
//!   makes its own), and no interleave (a union of inputs hash-partitioned alike)
//!   above it;
//! - it is not in the recursive term of a recursive query, which runs on the
//!   coordinator beside its work table, as DataFusion planned it;
//! - it is not run by the radix join kernel (`gyre.join_kernel = radix`).

use crate::join_selection::estimated_rows;
use crate::options::GyreOptions;
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::physical_expr::Distribution;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::union::InterleaveExec;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    ReplaceChildrenOptions,
};
use gyre_exchange::flow::{FlowInputs, flow_join_supported};
use gyre_exchange::{FlowJoinExec, NeoAggregateExec, RadixJoinExec, SkewSettings, wrapped_join};
use std::sync::Arc;

pub(crate) fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

/// Rewrites the eligible joins of `plan` (optimised for `n` workers) into Flow-Joins;
/// `settings` is `None` when skew detection is off.
/// The physical optimizer rule that places Flow-Joins: [`plan_flow_joins`] over one
/// partition per worker (`target_partitions`), with the session's `gyre.skew_*`
/// settings.
#[derive(Debug, Default)]
pub struct FlowJoinRule;

impl PhysicalOptimizerRule for FlowJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let workers = config.execution.target_partitions;
        plan_flow_joins(plan, workers, GyreOptions::of(config).skew_detection())
    }

    fn name(&self) -> &str {
        "gyre_flow_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

pub fn plan_flow_joins(
    plan: Arc<dyn ExecutionPlan>,
    n: usize,
    settings: Option<&SkewSettings>,
) -> Result<Arc<dyn ExecutionPlan>> {
    match settings {
        Some(s) if n > 1 => {
            rewrite_unpinned(plan, Pinned::default(), &|node| flow_join(node, n, s))
        }
        _ => Ok(plan),
    }
}

/// A rewrite of one node, if it applies.
pub(crate) type Convert<'a> =
    dyn Fn(&Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> + 'a;

/// What an ancestor relies on from a node: its hash partitioning, its order.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pinned {
    pub partitioning: bool,
    pub ordering: bool,
}

/// Replaces, bottom-up, every node `convert` rewrites and on which nothing above
/// relies for its hash partitioning or order (see the module doc); the joins and
/// aggregates a network operator or radix join wraps stay as they are. A node's hash
/// partitioning is relied on through operators that pass it on; its order only
/// through operators that keep their input's order (not through a sort, which makes
/// its own).
pub(crate) fn rewrite_unpinned(
    node: Arc<dyn ExecutionPlan>,
    pinned: Pinned,
    convert: &Convert<'_>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let distributions = node.input_distribution_requirements();
    let orderings = node.required_input_ordering();
    let keeps_order = node.maintains_input_order();
    let passes_partitioning = !node.is::<RepartitionExec>()
        && matches!(node.output_partitioning(), Partitioning::Hash(..));
    let ordered = node.output_ordering().is_some();
    // The hash join (or aggregate) a radix join or network operator runs, and the
    // inputs of an interleave, which merges partition i of every input (they must stay
    // hash-partitioned alike; it states no requirement DataFusion would check).
    let wraps = node.is::<InterleaveExec>()
        || node.is::<RadixJoinExec>()
        || node.is::<NeoAggregateExec>()
        || wrapped_join(node.as_ref()).is_some();
    let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
    let mut new_children = Vec::with_capacity(children.len());
    let mut changed = false;
    for (i, child) in children.iter().enumerate() {
        if node.is::<RecursiveQueryExec>() && i == 1 {
            new_children.push(Arc::clone(child));
            continue;
        }
        let needs = Pinned {
            partitioning: wraps
                || matches!(
                    distributions.child_distribution(i),
                    Some(Distribution::KeyPartitioned(_))
                )
                || (pinned.partitioning && passes_partitioning),
            ordering: wraps
                || orderings.get(i).is_some_and(Option::is_some)
                || (pinned.ordering && ordered && keeps_order.get(i).copied().unwrap_or(true)),
        };
        let new = rewrite_unpinned(Arc::clone(child), needs, convert)?;
        changed |= !Arc::ptr_eq(&new, child);
        new_children.push(new);
    }
    let node = if changed {
        node.replace_children(new_children, recompute())?
    } else {
        node
    };
    if !pinned.partitioning
        && !pinned.ordering
        && let Some(new) = convert(&node)?
    {
        return Ok(new);
    }
    Ok(node)
}

/// The Flow-Join for `node`, if it is an eligible join.
fn flow_join(
    node: &Arc<dyn ExecutionPlan>,
    n: usize,
    settings: &SkewSettings,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(hj) = node.downcast_ref::<HashJoinExec>() else {
        return Ok(None);
    };
    if *hj.partition_mode() != PartitionMode::Partitioned
        || !flow_join_supported(*hj.join_type(), hj.fetch())
        || !settings.build_preserving.allows(*hj.join_type())
        || hj.null_aware
        || hj.left().output_partitioning().partition_count() != n
    {
        return Ok(None);
    }
    let probe_keys: Vec<_> = hj.on().iter().map(|(_, r)| Arc::clone(r)).collect();
    let Some(probe) = unshuffled(hj.right(), &probe_keys, n) else {
        return Ok(None);
    };
    let per_worker = |p: &Arc<dyn ExecutionPlan>| estimated_rows(p).map(|r| (r / n as u64).max(1));
    let mut inputs = FlowInputs {
        probe_rows_per_worker: per_worker(&probe),
        ..FlowInputs::default()
    };
    let build_keys: Vec<_> = hj.on().iter().map(|(l, _)| Arc::clone(l)).collect();
    let build = match unshuffled(hj.left(), &build_keys, n) {
        Some(input) if settings.build_side => {
            inputs.routes_build = true;
            inputs.build_rows_per_worker = per_worker(&input);
            input
        }
        _ => Arc::clone(hj.left()),
    };
    let join = Arc::clone(node).replace_children(vec![build, probe], recompute())?;
    Ok(Some(Arc::new(FlowJoinExec::try_new(
        join,
        settings.clone(),
        inputs,
        None,
    )?)))
}

/// The input of `plan` if `plan` is a hash shuffle on exactly `keys` into `n`
/// partitions, of an input with `n` partitions, without order preservation.
pub(crate) fn unshuffled(
    plan: &Arc<dyn ExecutionPlan>,
    keys: &[Arc<dyn PhysicalExpr>],
    n: usize,
) -> Option<Arc<dyn ExecutionPlan>> {
    let rep = plan.downcast_ref::<RepartitionExec>()?;
    let Partitioning::Hash(exprs, count) = rep.partitioning() else {
        return None;
    };
    (*count == n
        && !rep.preserve_order()
        && rep.input().output_partitioning().partition_count() == n
        && exprs.len() == keys.len()
        && exprs.iter().zip(keys).all(|(a, b)| a.eq(b)))
    .then(|| Arc::clone(rep.input()))
}
