//! The cluster: coordinator, workers, the catalog of distributed tables and
//! the Arrow Flight SQL front door.

pub mod auth;
pub mod client_sessions;
pub mod codec;
pub mod column_stats;
pub mod coordinator;
pub mod execution;
pub mod failover;
pub mod files;
pub mod flight_sql;
pub mod host_shuffle;
pub mod local;
pub mod log_feed;
pub mod modify;
pub mod primary_table;
pub mod progress;
pub mod protocol;
pub mod reference;
pub mod session;
pub mod snapshot_scan;
pub mod storage;
pub mod system_tables;
pub mod table;
pub mod tpch;
pub mod worker;

pub use coordinator::{Coordinator, CoordinatorConfig, PrimaryConfig};
pub use local::{Limits, LocalCluster};
pub use worker::{Worker, WorkerConfig};
