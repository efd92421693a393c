//! Cyclo-join as a DataFusion operator: the SQL face of the Data Roundabout
//! (`gyre_join::cyclo`).
//!
//! - [`kernel`]: which local join the ring runs on the key columns, as the planner
//!   derived it from the join condition (hash, band, inequality, all pairs);
//! - [`words`]: how rotating rows travel: key words for the kernel, every column as
//!   `u64` words per row or, for strings and binaries, in the fragment's heap, rebuilt
//!   as Arrow arrays on arrival;
//! - [`exec`]: [`CycloJoinExec`], one revolution per worker, emitting joined batches
//!   with the residual filter applied (inner joins, and outer/semi/anti joins that
//!   preserve or filter the stationary input).

pub mod exec;
pub mod kernel;
pub mod words;

pub use exec::{CycloJoinExec, CycloJoinType, CycloSide, EXCHANGES_PER_CYCLO_JOIN};
pub use kernel::CycloKernel;
pub use words::{key_type_supported, travels};
