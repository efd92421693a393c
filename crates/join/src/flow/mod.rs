//! The building blocks of Flow-Join (Rödiger, *Scalable Distributed Query Processing
//! in Parallel Main-Memory Database Systems*, chapter 4), a distributed hash join that
//! detects heavy hitters while the probe side streams and handles them by selective
//! broadcast instead of sending all their rows to one node. The operator that SQL
//! joins run is `FlowJoinExec` in gyre-exchange; these are its parts that do not
//! depend on DataFusion:
//!
//! - [`detect`]: SpaceSaving histograms, the detection schedule (first at ~1% of the
//!   input, then periodically), the node-level report and the coordinator that forms
//!   the global heavy-hitter list;
//! - [`control`]: the detection reports and announcements as messages;
//! - [`sfr`]: the Symmetric Fragment Replicate grid for keys heavy on both sides;
//! - [`direct_map`]: the router's lookup of the few heavy hashes.

pub mod control;
pub mod detect;
pub mod direct_map;
pub mod sfr;

pub use detect::DetectionConfig;
