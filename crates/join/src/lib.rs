//! Gyre's joins: local kernels, the skew sketch, and the distributed join strategies.
//!
//! - [`radix`]: radix-partitioned hash equi-join (setup once, probe many fragments);
//! - [`sort_merge`]: sort-merge join with equality, band and inequality predicates;
//! - [`nested_loops`]: blocked nested loops for any other predicate;
//! - [`space_saving`]: the SpaceSaving heavy-hitter histogram Flow-Join uses;
//! - [`reference`]: obviously-correct joins the tests compare against;
//! - [`cyclo`]: cyclo-join on the Data Roundabout (ring of nodes, one input rotating);
//! - [`flow`]: the parts of Flow-Join (heavy-hitter detection, its messages, the SFR
//!   grid) that the SQL operator in gyre-exchange uses;
//! - [`neo`]: Neo-Join's histograms, partition assignment (MILP) and open-shop
//!   schedule.
//!
//! Every kernel returns [`JoinPairs`] (row index pairs), so callers `take` whatever
//! payload columns they need. NULL keys never match. The kernels depend only on Arrow's
//! array types, not on DataFusion; the distributed strategies run over the
//! transport's endpoints, so they work between real hosts.

pub mod cache;
pub mod cyclo;
pub mod error;
pub mod flow;
pub mod keys;
mod memory;
pub mod neo;
pub mod nested_loops;
pub mod pairs;
mod partition;
pub mod radix;
pub mod reference;
pub mod sort_merge;
pub mod space_saving;
pub mod zipf;

pub use cache::{default_threads, l2_cache_bytes};
pub use error::{JoinError, Result};
pub use keys::{KeyDomain, Keys, MAX_ROWS};
pub use nested_loops::{nested_loops_join, nested_loops_join_keys, nested_loops_join_values};
pub use pairs::JoinPairs;
pub use radix::{
    PartitionedProbe, ProbeMode, RadixConfig, RadixHashTable, RadixLayout, radix_join,
    radix_join_arrays,
};
pub use sort_merge::{
    MergePredicate, SortedKeys, merge_join, sort_merge_join, sort_merge_join_arrays,
};
pub use space_saving::{Candidate, SpaceSaving};
pub use zipf::Zipf;
