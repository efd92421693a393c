//! The seam between the stage splitter and operators that own exchanges.
//!
//! Most rows cross the network in the exchanges the stage splitter places wherever a
//! plan moves between workers. Some operators move rows themselves: a cyclo-join
//! rotates one input around the workers' ring, a Flow-Join routes its probe input and
//! its heavy keys' traffic, a Neo-Join places both inputs by its assignment, a Neo
//! aggregation its input. The splitter knows such an operator only through
//! [`NetworkOperator`]: how many exchange ids it needs, where its inputs must run, and
//! a copy of it that uses the ids it is handed. Every worker decodes the same plan, so
//! every worker opens the same streams.
//!
//! [`network_operator`] is the one place that lists these operators.

use crate::context::ExchangeId;
use crate::{CycloJoinExec, FlowJoinExec, NeoAggregateExec, NeoJoinExec};
use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlan;
use std::sync::Arc;

/// Where a network operator's inputs must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputsAt {
    /// Already on the workers, partition `i` on worker `i`, as planned: the operator
    /// reroutes them itself (a Flow-Join's unshuffled probe input).
    Workers,
    /// Anywhere: the splitter brings partition `i` of each input to worker `i`.
    PlacedOnWorkers,
}

/// An operator that sends and receives rows through exchanges of its own.
pub trait NetworkOperator {
    /// How many consecutive exchange ids it uses.
    fn exchanges(&self) -> u32;

    /// Where its inputs must run.
    fn inputs_at(&self) -> InputsAt;

    /// The same operator using the exchange ids `first..first + exchanges()`.
    fn with_exchanges(&self, first: ExchangeId) -> Result<Arc<dyn ExecutionPlan>>;
}

/// `plan` as a network operator, if it is one.
pub fn network_operator(plan: &dyn ExecutionPlan) -> Option<&dyn NetworkOperator> {
    if let Some(join) = plan.downcast_ref::<CycloJoinExec>() {
        return Some(join);
    }
    if let Some(join) = plan.downcast_ref::<FlowJoinExec>() {
        return Some(join);
    }
    if let Some(join) = plan.downcast_ref::<NeoJoinExec>() {
        return Some(join);
    }
    if let Some(aggregate) = plan.downcast_ref::<NeoAggregateExec>() {
        return Some(aggregate);
    }
    None
}

/// The hash join a network operator runs itself over inputs it moves (a Flow-Join's,
/// a Neo-Join's): planner passes rewrite that join's inputs, never the join.
pub fn wrapped_join(plan: &dyn ExecutionPlan) -> Option<&Arc<dyn ExecutionPlan>> {
    if let Some(flow) = plan.downcast_ref::<FlowJoinExec>() {
        return Some(flow.join());
    }
    plan.downcast_ref::<NeoJoinExec>().map(NeoJoinExec::join)
}
