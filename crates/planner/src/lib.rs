//! From DataFusion's physical plan to a distributed plan.
//!
//! Planning happens in two steps. While DataFusion optimises the physical plan
//! for `n` partitions (one per worker), [`DistributedJoinSelection`] decides
//! for each hash join whether to broadcast its smaller input or repartition
//! both. Then [`split_into_stages`] cuts the optimised plan into stages at
//! every point where rows must cross the network (repartitions, merges,
//! broadcasts), replacing each cut with an exchange sender/receiver pair.

pub mod join_selection;
pub mod stages;

pub use join_selection::DistributedJoinSelection;
pub use stages::{DistributedPlan, Stage, split_into_stages};
