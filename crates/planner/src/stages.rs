//! Cutting an optimised physical plan into stages connected by exchanges.
//!
//! The plan was optimised for `n` partitions, one per worker, so partition `i`
//! of a partitioned operator runs on worker `i`. Walking the plan bottom-up,
//! every node gets a location:
//!
//! - `Workers`: partition `i` runs on worker `i` (table scans start here, and inserts
//!   and file writers are brought here);
//! - `Coordinator`: all partitions run on the coordinator (constants, final steps);
//! - `Merge`: a partition merge (`CoalescePartitionsExec`, `SortPreservingMergeExec`)
//!   over a worker input; where the merge runs is decided by its parent: on
//!   every worker for the build side of a broadcast join, else on the coordinator.
//!
//! Where a child's location differs from what its parent needs, the child
//! becomes its own stage ending in an [`ExchangeSenderExec`], and the parent
//! reads it through an [`ExchangeReceiverExec`]:
//!
//! | DataFusion node / situation          | exchange                              |
//! |--------------------------------------|---------------------------------------|
//! | `RepartitionExec` hash               | shuffle                               |
//! | merge under a collect-left join      | broadcast to all workers              |
//! | merge elsewhere, worker plan at root | gather to the coordinator             |
//! | coordinator plan under worker plan   | scatter (partition `i` to worker `i`) |
//!
//! Operators that move rows themselves (a cyclo-join's ring, a Flow-Join's routing)
//! are [`NetworkOperator`]s: each gets its inputs on the workers and a block of
//! consecutive exchange ids of the size it asks for.
//!
//! A recursive query (`RecursiveQueryExec`) runs on the coordinator: its recursive
//! term is executed once per iteration and must reach the work table in the same
//! process, so the path from the term to the work table stays whole; the parts of the
//! term that do not read the work table are distributed as usual, gathered once and
//! replayed to every iteration ([`ReplayExec`]).
//!
//! Collect-left joins whose build side is preserved (left outer, left
//! semi/anti, full, null-aware anti) cannot run on copies of the build side;
//! with more than one worker they run on the coordinator over gathered inputs.

use crate::join_selection::broadcast_safe;
use crate::replay::ReplayExec;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Result, internal_err};
use datafusion::physical_expr::AcrossPartitions;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode,
};
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::InterleaveExec;
use datafusion::physical_plan::work_table::WorkTableExec;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, Partitioning, displayable,
    replace_children_if_necessary,
};
use gyre_exchange::{
    ExchangeId, ExchangeReceiverExec, ExchangeSenderExec, InputsAt, NetworkOperator, Placement,
    ReceiveMode, SendMode, network_operator,
};
use std::fmt::Write;
use std::sync::Arc;

/// One piece of a distributed plan, run where its placement says.
#[derive(Debug, Clone)]
pub struct Stage {
    pub id: usize,
    pub placement: Placement,
    /// An [`ExchangeSenderExec`], or for the final stage the plan whose output is the result.
    pub plan: Arc<dyn ExecutionPlan>,
}

/// A plan cut into stages; the last stage runs on the coordinator and yields the result.
#[derive(Debug, Clone)]
pub struct DistributedPlan {
    pub stages: Vec<Stage>,
    pub workers: usize,
    /// Exchange ids in use: `0..exchanges` (a pass that adds one takes the next).
    pub exchanges: ExchangeId,
}

impl DistributedPlan {
    pub fn final_stage(&self) -> &Stage {
        self.stages
            .last()
            .expect("a distributed plan has a final stage")
    }

    /// Stages that run on the workers.
    pub fn worker_stages(&self) -> impl Iterator<Item = &Stage> {
        self.stages
            .iter()
            .filter(|s| s.placement == Placement::Workers)
    }

    /// The text `EXPLAIN` shows: every stage with its exchanges and join strategies.
    pub fn display(&self) -> String {
        let mut out = String::new();
        for stage in self.stages.iter().rev() {
            let role = if stage.id + 1 == self.stages.len() {
                "final stage".to_string()
            } else {
                "stage".to_string()
            };
            let _ = writeln!(
                out,
                "{role} {} on {}{}:",
                stage.id,
                stage.placement,
                if stage.placement == Placement::Workers {
                    format!(" ({} partitions, one per worker)", self.workers)
                } else {
                    String::new()
                }
            );
            let text = displayable(stage.plan.as_ref()).indent(true).to_string();
            for line in text.lines() {
                let _ = writeln!(out, "  {line}{}", join_note(line));
            }
        }
        out
    }
}

/// Names the distribution strategy of a join line in `EXPLAIN`.
fn join_note(line: &str) -> &'static str {
    let l = line.trim_start();
    if l.starts_with("HashJoinExec: mode=CollectLeft") {
        "  <- broadcast join"
    } else if l.starts_with("HashJoinExec: mode=Partitioned") {
        "  <- partitioned join"
    } else if l.starts_with("RadixJoinExec") {
        "  <- the partitioned join below, run by the radix join kernel"
    } else if l.starts_with("FlowJoinExec") {
        "  <- Flow-Join: partitioned, heavy hitters kept local, their build rows broadcast"
    } else if l.starts_with("NeoJoinExec") {
        "  <- Neo-Join: both inputs placed by a locality-aware assignment"
    } else if l.starts_with("NeoAggregateExec") {
        "  <- Neo aggregation: groups placed by a locality-aware assignment"
    } else if l.starts_with("CycloJoinExec") {
        "  <- cyclo-join (rotating input travels the ring of workers)"
    } else if l.starts_with("NestedLoopJoinExec") || l.starts_with("CrossJoinExec") {
        "  <- broadcast nested-loop join"
    } else {
        ""
    }
}

#[derive(Debug, Clone)]
enum Loc {
    Workers,
    Coordinator,
    /// A merge node whose (rewritten) input runs on the workers.
    Merge(Arc<dyn ExecutionPlan>),
}

struct Splitter<'a> {
    n: usize,
    stages: Vec<Stage>,
    next_exchange: ExchangeId,
    on_workers: &'a dyn Fn(&dyn ExecutionPlan) -> bool,
}

/// Splits `plan`, optimised for `workers` partitions, into stages.
///
/// `on_workers` tells which nodes read or write worker-resident data, so that their
/// partition `i` must run on worker `i`: leaves that read it (table partitions, file
/// splits) and nodes that write it (inserts, file writers), whose inputs are brought to
/// the workers. Every other leaf runs on the coordinator.
pub fn split_into_stages(
    plan: Arc<dyn ExecutionPlan>,
    workers: usize,
    on_workers: &dyn Fn(&dyn ExecutionPlan) -> bool,
) -> Result<DistributedPlan> {
    let mut s = Splitter {
        n: workers,
        stages: vec![],
        next_exchange: 0,
        on_workers,
    };
    let (root, loc) = s.visit(&plan)?;
    let mut root = s.gather_to_coordinator(root, loc)?;
    if root.output_partitioning().partition_count() > 1 {
        root = Arc::new(CoalescePartitionsExec::new(root));
    }
    let id = s.stages.len();
    s.stages.push(Stage {
        id,
        placement: Placement::Coordinator,
        plan: root,
    });
    Ok(DistributedPlan {
        stages: s.stages,
        workers,
        exchanges: s.next_exchange,
    })
}

/// For joins that hash or scan their whole left input on every partition:
/// whether that may be a per-worker copy.
fn collect_left_join(node: &dyn ExecutionPlan) -> Option<bool> {
    if let Some(j) = node.downcast_ref::<HashJoinExec>() {
        if *j.partition_mode() == PartitionMode::CollectLeft {
            return Some(broadcast_safe(*j.join_type()) && !j.null_aware);
        }
        return None;
    }
    if let Some(j) = node.downcast_ref::<NestedLoopJoinExec>() {
        return Some(broadcast_safe(*j.join_type()));
    }
    if node.is::<CrossJoinExec>() {
        return Some(true);
    }
    None
}

impl Splitter<'_> {
    fn partitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
        plan.output_partitioning().partition_count()
    }

    /// Makes `input` (running at `from`) a stage and returns the receiver its consumers read.
    fn exchange(
        &mut self,
        input: Arc<dyn ExecutionPlan>,
        from: Placement,
        mode: SendMode,
    ) -> Arc<dyn ExecutionPlan> {
        let exchange = self.next_exchange;
        self.next_exchange += 1;
        let producer_partitions = Self::partitions(&input);
        let schema = input.schema();
        let (recv_mode, partitioning, ordering) = match &mode {
            SendMode::Shuffle(p @ Partitioning::Hash(..)) => {
                (ReceiveMode::Shuffle, p.clone(), None)
            }
            SendMode::Shuffle(p) => (
                ReceiveMode::Shuffle,
                Partitioning::UnknownPartitioning(p.partition_count()),
                None,
            ),
            _ => (
                ReceiveMode::Forward,
                Partitioning::UnknownPartitioning(producer_partitions),
                input.output_ordering().cloned(),
            ),
        };
        // Only a value the same in every producer partition stays constant when the
        // exchange mixes partitions.
        let constants = input
            .equivalence_properties()
            .constants()
            .into_iter()
            .filter(|c| matches!(c.across_partitions, AcrossPartitions::Uniform(_)))
            .map(|c| c.expr)
            .collect();
        let id = self.stages.len();
        self.stages.push(Stage {
            id,
            placement: from,
            plan: Arc::new(ExchangeSenderExec::new(input, exchange, from, mode)),
        });
        Arc::new(
            ExchangeReceiverExec::new(
                exchange,
                schema,
                from,
                producer_partitions,
                recv_mode,
                partitioning,
                ordering,
            )
            .with_constants(constants),
        )
    }

    fn gather_to_coordinator(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        loc: Loc,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match loc {
            Loc::Coordinator => Ok(plan),
            Loc::Workers => Ok(self.exchange(plan, Placement::Workers, SendMode::Gather)),
            Loc::Merge(input) => {
                let r = self.exchange(input, Placement::Workers, SendMode::Gather);
                replace_children_if_necessary(plan, vec![r])
            }
        }
    }

    /// Makes the whole of `plan` available on every worker.
    fn replicate_on_workers(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        loc: Loc,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match loc {
            Loc::Coordinator => {
                Ok(self.exchange(plan, Placement::Coordinator, SendMode::Broadcast))
            }
            Loc::Merge(input) if self.n == 1 => replace_children_if_necessary(plan, vec![input]),
            Loc::Merge(input) => {
                let r = self.exchange(input, Placement::Workers, SendMode::Broadcast);
                replace_children_if_necessary(plan, vec![r])
            }
            Loc::Workers if self.n == 1 => Ok(plan),
            Loc::Workers => internal_err!("cannot replicate a partitioned worker plan"),
        }
    }

    /// Puts partition `i` of `plan` on worker `i`.
    fn place_on_workers(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        loc: Loc,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match loc {
            Loc::Workers => Ok(plan),
            Loc::Merge(input) if self.n == 1 => replace_children_if_necessary(plan, vec![input]),
            loc => {
                let plan = self.gather_to_coordinator(plan, loc)?;
                if Self::partitions(&plan) != self.n {
                    return internal_err!(
                        "cannot place {} partitions on {} workers",
                        Self::partitions(&plan),
                        self.n
                    );
                }
                Ok(self.exchange(plan, Placement::Coordinator, SendMode::Scatter))
            }
        }
    }

    fn visit(&mut self, node: &Arc<dyn ExecutionPlan>) -> Result<(Arc<dyn ExecutionPlan>, Loc)> {
        let children = node.children();
        if children.is_empty() {
            let loc = if (self.on_workers)(node.as_ref()) {
                Loc::Workers
            } else {
                Loc::Coordinator
            };
            return Ok((Arc::clone(node), loc));
        }

        if node.is::<RecursiveQueryExec>() {
            let (static_term, loc) = self.visit(children[0])?;
            let static_term = self.gather_to_coordinator(static_term, loc)?;
            let recursive_term = self.beside_work_table(children[1])?;
            let new =
                replace_children_if_necessary(Arc::clone(node), vec![static_term, recursive_term])?;
            return Ok((new, Loc::Coordinator));
        }

        if node.is::<InterleaveExec>() {
            // Partition i of every input holds the same hash values: an input that had
            // to leave the workers (a join run on the coordinator) is shuffled back by
            // the same hash, so that it lines up with the others again.
            let partitioning = children[0].output_partitioning().clone();
            let mut new_children = Vec::with_capacity(children.len());
            for c in &children {
                let (p, loc) = self.visit(c)?;
                let lined_up =
                    matches!(loc, Loc::Workers) && p.output_partitioning() == &partitioning;
                if lined_up {
                    new_children.push(p);
                    continue;
                }
                let (p, from) = match loc {
                    Loc::Workers => (p, Placement::Workers),
                    loc => (self.gather_to_coordinator(p, loc)?, Placement::Coordinator),
                };
                new_children.push(self.exchange(p, from, SendMode::Shuffle(partitioning.clone())));
            }
            let new = replace_children_if_necessary(Arc::clone(node), new_children)?;
            return Ok((new, Loc::Workers));
        }

        if let Some(rep) = node.downcast_ref::<RepartitionExec>() {
            let (child, loc) = self.visit(rep.input())?;
            let (child, from) = match loc {
                Loc::Workers => (child, Placement::Workers),
                loc => (
                    self.gather_to_coordinator(child, loc)?,
                    Placement::Coordinator,
                ),
            };
            let partitioning = rep.partitioning().clone();
            if partitioning.partition_count() != self.n {
                return internal_err!(
                    "repartition into {} partitions on {} workers",
                    partitioning.partition_count(),
                    self.n
                );
            }
            let identity = from == Placement::Workers
                && matches!(partitioning, Partitioning::RoundRobinBatch(_))
                && Self::partitions(&child) == self.n;
            let mut out = if identity {
                child
            } else {
                self.exchange(child, from, SendMode::Shuffle(partitioning))
            };
            if rep.preserve_order()
                && let Some(ordering) = node.output_ordering()
            {
                // A shuffle interleaves its senders; restore the order the parent relies on.
                out =
                    Arc::new(SortExec::new(ordering.clone(), out).with_preserve_partitioning(true));
            }
            return Ok((out, Loc::Workers));
        }

        if node.is::<CoalescePartitionsExec>() || node.is::<SortPreservingMergeExec>() {
            let (child, loc) = self.visit(children[0])?;
            return Ok(match loc {
                Loc::Workers => (Arc::clone(node), Loc::Merge(child)),
                loc => {
                    let child = self.gather_to_coordinator(child, loc)?;
                    (
                        replace_children_if_necessary(Arc::clone(node), vec![child])?,
                        Loc::Coordinator,
                    )
                }
            });
        }

        let mut visited = Vec::with_capacity(children.len());
        for c in &children {
            visited.push(self.visit(c)?);
        }

        if (self.on_workers)(node.as_ref()) {
            // It writes a worker's own data (an insert, a COPY): whatever it writes comes
            // to the workers, partition `i` to worker `i`.
            let mut new_children = Vec::with_capacity(visited.len());
            for (p, l) in visited {
                new_children.push(self.place_on_workers(p, l)?);
            }
            let new = replace_children_if_necessary(Arc::clone(node), new_children)?;
            return Ok((new, Loc::Workers));
        }

        if let Some(op) = network_operator(node.as_ref()) {
            return self.network_operator(node, op, visited);
        }

        if let Some(safe) = collect_left_join(node.as_ref()) {
            let probe_on_workers = matches!(visited[1].1, Loc::Workers);
            if probe_on_workers && (safe || self.n == 1) {
                let mut it = visited.into_iter();
                let (left, left_loc) = it.next().unwrap();
                let (right, _) = it.next().unwrap();
                let left = self.replicate_on_workers(left, left_loc)?;
                let new = replace_children_if_necessary(Arc::clone(node), vec![left, right])?;
                return Ok((new, Loc::Workers));
            }
            return self.all_to_coordinator(node, visited);
        }

        let any_workers = visited.iter().any(|(_, l)| matches!(l, Loc::Workers));
        let fits_workers = Self::partitions(node) == self.n
            && visited.iter().all(|(p, l)| match l {
                Loc::Workers => true,
                Loc::Coordinator => Self::partitions(p) == self.n,
                Loc::Merge(_) => self.n == 1,
            });
        if any_workers && fits_workers {
            let mut new_children = Vec::with_capacity(visited.len());
            for (p, l) in visited {
                new_children.push(self.place_on_workers(p, l)?);
            }
            let new = replace_children_if_necessary(Arc::clone(node), new_children)?;
            return Ok((new, Loc::Workers));
        }
        self.all_to_coordinator(node, visited)
    }

    /// An operator that owns exchanges: its inputs on the workers, and the next
    /// `op.exchanges()` exchange ids, the same on every worker.
    fn network_operator(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        op: &dyn NetworkOperator,
        visited: Vec<(Arc<dyn ExecutionPlan>, Loc)>,
    ) -> Result<(Arc<dyn ExecutionPlan>, Loc)> {
        let mut children = Vec::with_capacity(visited.len());
        for (p, l) in visited {
            children.push(match (op.inputs_at(), l) {
                (InputsAt::Workers, Loc::Workers) => p,
                (InputsAt::Workers, _) => {
                    return internal_err!("the input of {} is not on the workers", node.name());
                }
                (InputsAt::PlacedOnWorkers, l) => self.place_on_workers(p, l)?,
            });
        }
        let first = self.next_exchange;
        self.next_exchange += op.exchanges();
        let new = replace_children_if_necessary(op.with_exchanges(first)?, children)?;
        Ok((new, Loc::Workers))
    }

    /// A recursive term, kept in one piece on the coordinator along every path to the
    /// work table; every other input of it is distributed, gathered and replayed.
    fn beside_work_table(
        &mut self,
        plan: &Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let reads_work_table = plan.exists(|n| Ok(n.is::<WorkTableExec>()))?;
        if !reads_work_table {
            let stages = self.stages.len();
            let (p, loc) = self.visit(plan)?;
            if matches!(loc, Loc::Coordinator) && self.stages.len() == stages {
                return Ok(p);
            }
            let p = self.gather_to_coordinator(p, loc)?;
            return Ok(Arc::new(ReplayExec::new(p)));
        }
        let children = plan
            .children()
            .into_iter()
            .map(|c| self.beside_work_table(c))
            .collect::<Result<Vec<_>>>()?;
        replace_children_if_necessary(Arc::clone(plan), children)
    }

    fn all_to_coordinator(
        &mut self,
        node: &Arc<dyn ExecutionPlan>,
        visited: Vec<(Arc<dyn ExecutionPlan>, Loc)>,
    ) -> Result<(Arc<dyn ExecutionPlan>, Loc)> {
        let mut new_children = Vec::with_capacity(visited.len());
        for (p, l) in visited {
            new_children.push(self.gather_to_coordinator(p, l)?);
        }
        let new = replace_children_if_necessary(Arc::clone(node), new_children)?;
        Ok((new, Loc::Coordinator))
    }
}
