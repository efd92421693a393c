//! From DataFusion's physical plan to a distributed plan.
//!
//! Planning happens in two steps. While DataFusion optimises the physical plan
//! for `n` partitions (one per worker), [`DistributedJoinSelection`] decides
//! for each hash join whether to broadcast its smaller input or repartition
//! both. Then [`split_into_stages`] cuts the optimised plan into stages at
//! every point where rows must cross the network (repartitions, merges,
//! broadcasts), replacing each cut with an exchange sender/receiver pair. In between,
//! [`plan_cyclo_joins`] turns the joins `gyre.join_strategy` (or their size) sends
//! around the workers' ring into cyclo-joins, and [`plan_flow_joins`] gives shuffled
//! partitioned hash joins Flow-Join's skew handling.

pub mod cyclo;
pub mod flow;
pub mod join_selection;
pub mod options;
pub mod replay;
pub mod stages;

pub use cyclo::plan_cyclo_joins;
pub use flow::plan_flow_joins;
pub use join_selection::DistributedJoinSelection;
pub use options::{GyreOptions, JoinStrategy};
pub use replay::ReplayExec;
pub use stages::{DistributedPlan, Stage, split_into_stages};
