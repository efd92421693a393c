//! From DataFusion's physical plan to a distributed plan.
//!
//! Planning happens in two steps. While DataFusion optimises the physical plan
//! for `n` partitions (one per worker), [`DistributedJoinSelection`] decides
//! for each hash join whether to broadcast its smaller input or repartition
//! both. Then [`split_into_stages`] cuts the optimised plan into stages at
//! every point where rows must cross the network (repartitions, merges,
//! broadcasts), replacing each cut with an exchange sender/receiver pair. In between,
//! [`plan_cyclo_joins`] turns the joins `gyre.join_strategy` (or their size) sends
//! around the workers' ring into cyclo-joins, [`plan_radix_joins`] hands the
//! partitioned joins `gyre.join_kernel` sends to it to the radix join kernel, and
//! [`plan_flow_joins`] gives shuffled partitioned hash joins Flow-Join's skew handling.
//! Last, [`place_runtime_filters`] gives the worker stages' hash joins run-time
//! filters on their probe inputs.

pub mod cyclo;
pub mod flow;
pub mod join_order;
pub mod join_selection;
pub mod neo;
pub mod options;
pub mod placed_keys;
pub mod radix;
pub mod replay;
pub mod runtime_filters;
pub mod stages;

pub use cyclo::{CycloJoinRule, plan_cyclo_joins};

use datafusion::physical_optimizer::PhysicalOptimizerRule;
use std::sync::Arc;

/// The rules that put Gyre's own joins (cyclo-joins, radix joins, Flow-Joins) into a
/// plan DataFusion has optimised, in order. They run after DataFusion's
/// optimiser, not among its rules: a Flow-Join's wrapped join no longer has its probe
/// input repartitioned (the Flow-Join routes it), which DataFusion's final check of a
/// plan's executable invariants refuses.
pub fn network_operator_rules() -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    vec![
        Arc::new(CycloJoinRule),
        Arc::new(NeoRule),
        Arc::new(RadixJoinRule::before_flow_joins()),
        Arc::new(FlowJoinRule),
        Arc::new(RadixJoinRule::after_flow_joins()),
    ]
}
pub use flow::{FlowJoinRule, plan_flow_joins};
pub use join_order::{JoinReorder, TableStatistics};
pub use join_selection::DistributedJoinSelection;
pub use neo::NeoRule;
pub use options::{GyreOptions, JoinKernel, JoinStrategy};
pub use radix::{RadixJoinRule, plan_radix_joins};
pub use replay::ReplayExec;
pub use runtime_filters::place_runtime_filters;
pub use stages::{DistributedPlan, Stage, split_into_stages};
