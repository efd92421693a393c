//! Where run-time filters go (`gyre_exchange::runtime_filter`): each worker stage's
//! hash joins that drop unmatched probe rows, and whose build side may lack some keys
//! (a filter, join or limit sits between it and its scans), get a filter source on
//! their build input and a target as deep in their probe input as the key columns can
//! be followed.
//!
//! A filter pays only where it saves work a join cannot: checking a row's key costs
//! about what the join's own probe of it costs. So the target is placed below
//! projections (of plain columns), filters and aggregations (on their group keys: the
//! rows of a key the join drops are not aggregated), and across exchanges, but not
//! below other joins, whose probes would cost as much as the checks they save. It stops
//! there (or at a scan) and goes above it. A target that would sit right below its
//! join prunes nothing the join would not, so none is placed there. Flow-Joins route
//! their probe rows between workers: their joins get no filter (their inputs' joins
//! may). A Neo-Join collects its whole build side before its probe side, then routes
//! both: its probe input gets a target of every worker's build keys (as below), even
//! right above a scan, since each row it drops is neither histogrammed nor routed.
//! A Neo aggregation moves groups between workers like an exchange: a target goes
//! below it only with the whole build side's keys.
//!
//! Where the probe rows come from another worker stage (an exchange receiver), the
//! target goes into that stage, on the sender's input, and the rows are pruned before
//! they cross the network:
//! - a `CollectLeft` join's build side is on every worker whole, so the target waits
//!   for this node's filter ([`FilterFrom::Shared`]);
//! - a partitioned join's build side is split by key, so every worker's part goes to
//!   every worker on a filter exchange of its own and the target unites them
//!   ([`FilterFrom::Workers`]).
//!
//! No wait can close a cycle: a target waits only for the build side of its own join,
//! which never reads the target's stage (that stage feeds the join's probe side), and
//! a build side's own targets wait for joins deeper in it.

use crate::options::GyreOptions;
use crate::stages::DistributedPlan;
use datafusion::common::{JoinType, NullEquality, Result, internal_err};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};
use gyre_exchange::{
    ExchangeId, ExchangeReceiverExec, ExchangeSenderExec, FilterFrom, FilterSourceExec,
    FilterTargetExec, NeoAggregateExec, NeoJoinExec, Placement, wrapped_join,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Places run-time filters in the worker stages of `plan` (when the session's
/// `gyre.runtime_filters` is on).
pub fn place_runtime_filters(plan: &mut DistributedPlan, options: &GyreOptions) -> Result<()> {
    if !options.runtime_filters {
        return Ok(());
    }
    let senders = plan
        .stages
        .iter()
        .filter_map(|s| {
            let x = s.plan.downcast_ref::<ExchangeSenderExec>()?.exchange();
            Some((x, Arc::clone(&s.plan)))
        })
        .collect();
    let mut p = Placer {
        next_id: 0,
        next_exchange: plan.exchanges,
        remote: Vec::new(),
        senders,
    };
    for stage in &mut plan.stages {
        if stage.placement == Placement::Workers {
            stage.plan = p.rewrite(Arc::clone(&stage.plan))?;
        }
    }
    // Targets in the stages that send probe rows; placing one may lead on to the
    // stage that sends that stage's rows.
    while let Some(t) = p.remote.pop() {
        let Some(stage) = plan.stages.iter_mut().find(|s| {
            s.plan
                .downcast_ref::<ExchangeSenderExec>()
                .is_some_and(|x| x.exchange() == t.exchange)
        }) else {
            return internal_err!("no stage sends exchange {}", t.exchange);
        };
        let sender = Arc::clone(&stage.plan);
        let input = p.place_or_target(sender.children()[0], t.columns, t.id, t.from)?;
        stage.plan = sender.replace_children(vec![input], recompute())?;
    }
    plan.exchanges = p.next_exchange;
    Ok(())
}

/// A target to place in the stage that sends `exchange`, on `columns` of its sender's
/// input.
struct Remote {
    exchange: ExchangeId,
    columns: Vec<usize>,
    id: u32,
    from: FilterFrom,
}

struct Placer {
    next_id: u32,
    next_exchange: ExchangeId,
    remote: Vec<Remote>,
    /// Each stage that sends an exchange, by the exchange's id.
    senders: HashMap<ExchangeId, Arc<dyn ExecutionPlan>>,
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

impl Placer {
    fn rewrite(&mut self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(wrapped) = wrapped_join(plan.as_ref()) {
            let join = Arc::clone(wrapped);
            let children = join
                .children()
                .into_iter()
                .map(|c| self.rewrite(Arc::clone(c)))
                .collect::<Result<Vec<_>>>()?;
            let mut join = join.replace_children(children, recompute())?;
            if plan.is::<NeoJoinExec>()
                && let Some(filtered) = self.filter_neo_join(&join)?
            {
                join = filtered;
            }
            return plan.replace_children(vec![join], recompute());
        }
        let children = plan
            .children()
            .into_iter()
            .map(|c| self.rewrite(Arc::clone(c)))
            .collect::<Result<Vec<_>>>()?;
        let plan = match children.is_empty() {
            true => plan,
            false => plan.replace_children(children, recompute())?,
        };
        let Some(hj) = plan.downcast_ref::<HashJoinExec>() else {
            return Ok(plan);
        };
        let Some((build, probe)) = self.filter_keys(hj) else {
            return Ok(plan);
        };
        let id = self.next_id;
        let (from, ship) = match hj.partition_mode() {
            PartitionMode::CollectLeft => (FilterFrom::Shared, None),
            _ => (FilterFrom::Partition, Some(self.next_exchange)),
        };
        let remote_before = self.remote.len();
        let Some(probe_input) = self.place(hj.right(), &probe, id, from)? else {
            return Ok(plan);
        };
        self.next_id += 1;
        // Only a filter with a target in another stage is sent over the network.
        let ship = ship.filter(|_| {
            self.remote[remote_before..]
                .iter()
                .any(|r| matches!(r.from, FilterFrom::Workers(_)))
        });
        if ship.is_some() {
            self.next_exchange += 1;
        }
        let build_input = FilterSourceExec::try_new(Arc::clone(hj.left()), id, build)?;
        let build_input = Arc::new(build_input.shipped_on(ship));
        plan.replace_children(vec![build_input, probe_input], recompute())
    }

    /// The build and probe columns of a filter for `hj`, if it drops unmatched probe
    /// rows, its build side may lack keys, and its keys are plain columns of one type.
    fn filter_keys(&self, hj: &HashJoinExec) -> Option<(Vec<usize>, Vec<usize>)> {
        if !drops_unmatched_probe_rows(*hj.join_type())
            || hj.null_equality() != NullEquality::NullEqualsNothing
            || hj.null_aware
            || !self.drops_rows(hj.left())
        {
            return None;
        }
        let (left, right) = (hj.left().schema(), hj.right().schema());
        let mut build = Vec::new();
        let mut probe = Vec::new();
        for (l, r) in hj.on() {
            let (l, r) = (l.downcast_ref::<Column>()?, r.downcast_ref::<Column>()?);
            // Equal types hash alike on both sides.
            if left.field(l.index()).data_type() != right.field(r.index()).data_type() {
                return None;
            }
            build.push(l.index());
            probe.push(r.index());
        }
        Some((build, probe))
    }

    /// `join` (a Neo-Join's hash join) with a filter source on its build input, shipped
    /// to every worker, and a target of all workers' parts on its probe input: any
    /// worker may join a probe row, so only the union of the build keys can drop it.
    /// No wait closes a cycle: each worker's build side is collected before its probe
    /// side, and none needs another worker's rows (the filter is sent by a task of its
    /// own).
    fn filter_neo_join(
        &mut self,
        join: &Arc<dyn ExecutionPlan>,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(hj) = join.downcast_ref::<HashJoinExec>() else {
            return Ok(None);
        };
        let Some((build, probe)) = self.filter_keys(hj) else {
            return Ok(None);
        };
        let (id, exchange) = (self.next_id, self.next_exchange);
        let from = FilterFrom::Workers(exchange);
        let probe_input = self.place_or_target(hj.right(), probe, id, from)?;
        self.next_id += 1;
        self.next_exchange += 1;
        let build_input = FilterSourceExec::try_new(Arc::clone(hj.left()), id, build)?;
        let build_input = Arc::new(build_input.shipped_on(Some(exchange)));
        Ok(Some(Arc::clone(join).replace_children(
            vec![build_input, probe_input],
            recompute(),
        )?))
    }

    /// Whether `plan` may leave out some keys of the tables it reads: whether a filter,
    /// a join, a limit (anything but a scan and operators that pass every row or group
    /// rows) sits between it and its scans, in this stage or in the stages it receives.
    /// A build side that reads a whole table holds every key that the probe side's
    /// foreign keys refer to: its filter would prune nothing and only cost the wait.
    fn drops_rows(&self, plan: &Arc<dyn ExecutionPlan>) -> bool {
        if let Some(r) = plan.downcast_ref::<ExchangeReceiverExec>() {
            return match self.senders.get(&r.exchange()) {
                Some(sender) => self.drops_rows(sender),
                None => true,
            };
        }
        let passes_rows = plan.is::<ProjectionExec>()
            || plan.is::<AggregateExec>()
            || plan.is::<NeoAggregateExec>()
            || plan.is::<CoalescePartitionsExec>()
            || plan.is::<RepartitionExec>()
            || plan.is::<CooperativeExec>()
            || plan.is::<ExchangeSenderExec>()
            || plan.is::<FilterSourceExec>();
        if !passes_rows {
            return !plan.children().is_empty();
        }
        plan.children().into_iter().any(|c| self.drops_rows(c))
    }

    /// `node` with a target of filter `id` placed as deep as [`Self::place`] can, or
    /// right above it where the columns cannot be followed.
    fn place_or_target(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        columns: Vec<usize>,
        id: u32,
        from: FilterFrom,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match self.place(node, &columns, id, from)? {
            Some(placed) => Ok(placed),
            None => Ok(Arc::new(FilterTargetExec::try_new(
                Arc::clone(node),
                id,
                columns,
                from,
            )?)),
        }
    }

    /// `node` with a target of filter `id` placed below it, on the input its `columns`
    /// come from, or (`node` receiving another worker stage's rows) recorded for that
    /// stage; `None` when they cannot be followed into any input.
    fn place(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        columns: &[usize],
        id: u32,
        from: FilterFrom,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(r) = node.downcast_ref::<ExchangeReceiverExec>()
            && r.producer() == Placement::Workers
        {
            // A partition's filter is this worker's part only: the sending stage's
            // rows go to every worker, so they need every part.
            let from = match from {
                FilterFrom::Partition => FilterFrom::Workers(self.next_exchange),
                other => other,
            };
            self.remote.push(Remote {
                exchange: r.exchange(),
                columns: columns.to_vec(),
                id,
                from,
            });
            return Ok(Some(Arc::clone(node)));
        }
        // A Neo aggregation moves its groups between workers, as an exchange does: a
        // target below it needs the whole build side's keys (a broadcast join's, or
        // every worker's part as under a Neo-Join). A partitioned join's own part
        // never reaches one: such a join needs its input hash-partitioned, so the
        // planner leaves the aggregation below it a plain one.
        if let Some(neo) = node.downcast_ref::<NeoAggregateExec>() {
            if matches!(from, FilterFrom::Partition) {
                return Ok(None);
            }
            let Some((child, inner)) = follow(neo.aggregate().as_ref(), columns) else {
                return Ok(None);
            };
            let placed = self.place_or_target(&child, inner, id, from)?;
            let aggregate =
                Arc::clone(neo.aggregate()).replace_children(vec![placed], recompute())?;
            return Ok(Some(
                Arc::clone(node).replace_children(vec![aggregate], recompute())?,
            ));
        }
        let Some((child, inner)) = follow(node.as_ref(), columns) else {
            return Ok(None);
        };
        let placed = self.place_or_target(&child, inner, id, from)?;
        Ok(Some(
            Arc::clone(node).replace_children(vec![placed], recompute())?,
        ))
    }
}

/// The only input of `node`, with the indices there that `columns` of its output come
/// from unchanged, if `node` keeps each row's partition.
fn follow(
    node: &dyn ExecutionPlan,
    columns: &[usize],
) -> Option<(Arc<dyn ExecutionPlan>, Vec<usize>)> {
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
        return Some((Arc::clone(p.input()), inner));
    }
    if node.is::<FilterTargetExec>() || node.is::<FilterSourceExec>() {
        return Some((Arc::clone(node.children()[0]), columns.to_vec()));
    }
    if let Some(f) = node.downcast_ref::<FilterExec>() {
        let inner = match f.projection() {
            Some(p) => columns
                .iter()
                .map(|&c| p.get(c).copied())
                .collect::<Option<Vec<_>>>()?,
            None => columns.to_vec(),
        };
        return Some((Arc::clone(f.input()), inner));
    }
    // A group's rows all carry its key, so a key the join will not match drops the
    // whole group either way; only plain grouping (no grouping sets, which emit keys
    // as nulls, and no group limit, which keeps some groups) is followed.
    if let Some(a) = node.downcast_ref::<AggregateExec>() {
        let group = a.group_expr();
        if !group.is_single() || a.limit_options().is_some() {
            return None;
        }
        let inner = columns
            .iter()
            .map(|&c| {
                group
                    .expr()
                    .get(c)?
                    .0
                    .downcast_ref::<Column>()
                    .map(Column::index)
            })
            .collect::<Option<Vec<_>>>()?;
        return Some((Arc::clone(a.input()), inner));
    }
    None
}
