//! The parts of Neo-Join (Rödiger, *Scalable Distributed Query Processing in Parallel
//! Main-Memory Database Systems*, chapter 2: "Locality-sensitive operators for
//! parallel main-memory database clusters") that do not depend on DataFusion.
//!
//! Neo-Join makes a distributed join move as few bytes as the data's placement
//! allows, and moves them without two senders sharing a receiver's link:
//!
//! 1. [`histogram`]: every node partitions both inputs by the most significant bits
//!    of the key (order-preserving, so clustered data stays clustered) and counts
//!    bytes per partition and side; adaptive radix partitioning merges fine buckets
//!    into balanced partitions.
//! 2. [`assign`]: the partition-to-node assignment that minimises the busiest link
//!    (a MILP solved by HiGHS within a time limit, or a greedy assignment), with
//!    selective broadcast of one side of skewed partitions.
//! 3. [`schedule`]: the resulting transfers as an open-shop schedule, rounds of
//!    matchings whose lengths add up to the lower bound.
//! 4. The shuffle by that assignment and schedule, joining as data arrives, is the
//!    engine's.

pub mod assign;
pub mod histogram;
pub mod schedule;

pub use assign::{
    AssignOptions, Assignment, Broadcastable, Costs, Method, Placement, Sizes, Solved, assign,
};
pub use histogram::{FineHistogram, PartitionMap, RadixDomain};
pub use schedule::{NodeRound, Round, Transfer, lower_bound, node_rounds, open_shop};

#[cfg(test)]
mod tests;
