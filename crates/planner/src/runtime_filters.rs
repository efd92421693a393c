//! Where run-time filters go (`gyre_exchange::runtime_filter`): each worker stage's
//! hash joins that drop unmatched probe rows get a filter source on their build input
//! and a target as deep in their probe input as the key columns can be followed, in
//! the same stage, with no exchange in between.
//!
//! The target is placed below operators that keep each row's partition: projections
//! (of plain columns), filters and inner hash joins (through the
//! probe side, or through the build side of a partitioned one). It stops at anything
//! else (a scan, an exchange, an aggregate, a `CollectLeft` join's shared build side)
//! and goes above it. A target that would sit right below its join prunes nothing the
//! join would not, so none is placed there. Flow-Joins route their probe rows between
//! workers: their joins get no filter (their inputs' joins may).

use crate::options::GyreOptions;
use crate::stages::DistributedPlan;
use datafusion::common::{JoinType, NullEquality, Result};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};
use gyre_exchange::{FilterSourceExec, FilterTargetExec, FlowJoinExec, Placement};
use std::sync::Arc;

/// Places run-time filters in the worker stages of `plan` (when the session's
/// `gyre.runtime_filters` is on).
pub fn place_runtime_filters(plan: &mut DistributedPlan, options: &GyreOptions) -> Result<()> {
    if !options.runtime_filters {
        return Ok(());
    }
    let mut next_id = 0;
    for stage in &mut plan.stages {
        if stage.placement == Placement::Workers {
            stage.plan = rewrite(Arc::clone(&stage.plan), &mut next_id)?;
        }
    }
    Ok(())
}

fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

/// Whether a join emits nothing for a probe row without a match.
fn drops_unmatched_probe_rows(t: JoinType) -> bool {
    matches!(
        t,
        JoinType::Inner
            | JoinType::Left
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
            | JoinType::RightSemi
    )
}

fn rewrite(plan: Arc<dyn ExecutionPlan>, next_id: &mut u32) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(flow) = plan.downcast_ref::<FlowJoinExec>() {
        let join = Arc::clone(flow.join());
        let children = join
            .children()
            .into_iter()
            .map(|c| rewrite(Arc::clone(c), next_id))
            .collect::<Result<Vec<_>>>()?;
        let join = join.replace_children(children, recompute())?;
        return plan.replace_children(vec![join], recompute());
    }
    let children = plan
        .children()
        .into_iter()
        .map(|c| rewrite(Arc::clone(c), next_id))
        .collect::<Result<Vec<_>>>()?;
    let plan = match children.is_empty() {
        true => plan,
        false => plan.replace_children(children, recompute())?,
    };
    let Some(hj) = plan.downcast_ref::<HashJoinExec>() else {
        return Ok(plan);
    };
    if !drops_unmatched_probe_rows(*hj.join_type())
        || hj.null_equality() != NullEquality::NullEqualsNothing
        || hj.null_aware
    {
        return Ok(plan);
    }
    let (left, right) = (hj.left().schema(), hj.right().schema());
    let mut build = Vec::new();
    let mut probe = Vec::new();
    for (l, r) in hj.on() {
        let (Some(l), Some(r)) = (l.downcast_ref::<Column>(), r.downcast_ref::<Column>()) else {
            return Ok(plan);
        };
        // Equal types hash alike on both sides.
        if left.field(l.index()).data_type() != right.field(r.index()).data_type() {
            return Ok(plan);
        }
        build.push(l.index());
        probe.push(r.index());
    }
    let id = *next_id;
    let shared = *hj.partition_mode() == PartitionMode::CollectLeft;
    let Some(probe_input) = below(hj.right(), &probe, id, shared)? else {
        return Ok(plan);
    };
    *next_id += 1;
    let build_input = Arc::new(FilterSourceExec::try_new(Arc::clone(hj.left()), id, build)?);
    plan.replace_children(vec![build_input, probe_input], recompute())
}

/// `node` with a target of filter `id` placed below it, on the input its `columns`
/// come from; `None` when they cannot be followed into any input.
fn below(
    node: &Arc<dyn ExecutionPlan>,
    columns: &[usize],
    id: u32,
    shared: bool,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some((child, inner, index)) = follow(node.as_ref(), columns) else {
        return Ok(None);
    };
    let placed = match below(&child, &inner, id, shared)? {
        Some(deeper) => deeper,
        None => Arc::new(FilterTargetExec::try_new(child, id, inner, shared)?),
    };
    let mut children: Vec<Arc<dyn ExecutionPlan>> =
        node.children().into_iter().map(Arc::clone).collect();
    children[index] = placed;
    Ok(Some(
        Arc::clone(node).replace_children(children, recompute())?,
    ))
}

/// The input of `node` that `columns` of its output come from unchanged, with their
/// indices there and the input's position, if `node` keeps each row's partition.
fn follow(
    node: &dyn ExecutionPlan,
    columns: &[usize],
) -> Option<(Arc<dyn ExecutionPlan>, Vec<usize>, usize)> {
    if let Some(p) = node.downcast_ref::<ProjectionExec>() {
        let inner = columns
            .iter()
            .map(|&c| {
                p.expr()
                    .get(c)?
                    .expr
                    .downcast_ref::<Column>()
                    .map(Column::index)
            })
            .collect::<Option<Vec<_>>>()?;
        return Some((Arc::clone(p.input()), inner, 0));
    }
    if let Some(f) = node.downcast_ref::<FilterExec>() {
        let inner = match f.projection() {
            Some(p) => columns
                .iter()
                .map(|&c| p.get(c).copied())
                .collect::<Option<Vec<_>>>()?,
            None => columns.to_vec(),
        };
        return Some((Arc::clone(f.input()), inner, 0));
    }
    if let Some(j) = node.downcast_ref::<HashJoinExec>() {
        if *j.join_type() != JoinType::Inner {
            return None;
        }
        let internal = match j.projection.as_ref() {
            Some(p) => columns
                .iter()
                .map(|&c| p.get(c).copied())
                .collect::<Option<Vec<_>>>()?,
            None => columns.to_vec(),
        };
        let left_width = j.left().schema().fields().len();
        if internal.iter().all(|&c| c >= left_width) {
            let inner = internal.iter().map(|&c| c - left_width).collect();
            return Some((Arc::clone(j.right()), inner, 1));
        }
        // A `CollectLeft` build side runs as partition 0 for every partition: a target
        // there would wait for the wrong partition's filter.
        if internal.iter().all(|&c| c < left_width)
            && *j.partition_mode() == PartitionMode::Partitioned
        {
            return Some((Arc::clone(j.left()), internal, 0));
        }
    }
    None
}
