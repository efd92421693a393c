//! ScyPer's transactional core (Rödiger's thesis, chapter 5; Mühlbauer et al.,
//! "ScyPer: Elastic OLAP Throughput on Transactional Data"): one primary runs every
//! transaction on a row store and writes a redo log of the committed ones.
//!
//! - [`value`]: values, column types and their checks.
//! - [`store`]: tables of rows by primary key; the one place a row changes.
//! - [`key`]: primary keys as order-preserving bytes.
//! - [`txn`]: the handle transactions read and write through, with undo for rollback.
//! - [`procedure`]: stored procedures, logged by name and arguments.
//! - [`log`]: the redo log: entries, segment format, group commit.
//! - [`checkpoint`]: the store at an LSN as Parquet, so recovery replays only the log
//!   after it.
//! - [`database`]: all of it together, with recovery on open; stored procedure calls
//!   queue and run back to back (`combining`).
//! - [`columnar`]: rows to Arrow batches and back.
//! - [`rendezvous`]: where the blocks of a fragmented table live.
//! - [`ship`]: the log multicast to secondaries, with NAK-based repair.
//! - [`secondary`]: replay of the shipped log into versioned tables.
//! - [`versioned`]: a secondary's tables, Arrow batches with row versions, and
//!   snapshots at an LSN.

pub mod checkpoint;
pub mod columnar;
mod combining;
pub mod database;
pub mod error;
pub mod key;
pub mod log;
pub mod procedure;
mod published;
pub mod rendezvous;
pub mod secondary;
pub mod ship;
pub mod store;
pub mod txn;
pub mod value;
pub mod versioned;

pub use database::{Database, Options, Recovery, Transaction};
pub use error::{Error, Result};
pub use key::Key;
pub use log::LogMode;
pub use procedure::{Procedure, Procedures};
pub use secondary::Secondary;
pub use store::{Placement, ROW_ID, Row, RowOp, Store, TableDef, TableId};
pub use txn::Txn;
pub use value::{Column, ColumnType, Value};
