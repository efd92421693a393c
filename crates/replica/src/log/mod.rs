//! The redo log: every committed transaction that changed data, in LSN order.
//!
//! ScyPer's primary (Rödiger's thesis, chapter 5) writes a redo log of committed
//! transactions only; undo stays in memory. An entry is *logical* (a stored procedure's
//! name and arguments, replayed by running it again) when the outcome depends only on
//! the database state, and *physical* (the row operations) otherwise. Entries are
//! written in groups ([`writer`]): one LZ4 block and one fsync per group, and a client
//! hears "committed" only when its entry's group is on disk.
//!
//! On disk the log is a directory of segments ([`segment`]), each named by the LSN of
//! its first entry. A checkpoint at LSN `c` makes every segment whose entries are all
//! at or below `c` unnecessary; recovery replays what follows the newest checkpoint.

pub mod segment;
pub mod writer;

use crate::store::{RowOp, TableDef, TableId};
use crate::value::Value;
use serde::{Deserialize, Serialize};

/// What one committed transaction did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// A deterministic stored procedure and its arguments.
    Logical {
        procedure: String,
        args: Vec<Value>,
    },
    /// The row operations, in the order they were made.
    Physical {
        ops: Vec<RowOp>,
    },
    /// A new table with its first rows (CREATE TABLE ... AS SELECT in one entry).
    CreateTable {
        def: TableDef,
        rows: Vec<Vec<Value>>,
    },
    DropTable(TableId),
    /// ScyPer's snapshot transaction: changes nothing; every secondary cuts a snapshot
    /// at exactly its LSN, so snapshots agree across secondaries.
    Snapshot,
    /// A bulk load (CREATE TABLE ... AS SELECT too large for one entry) starts: the
    /// table, invisible until [`Entry::LoadEnd`]. The load's entries have consecutive
    /// LSNs (it holds the primary), and a log that ends inside them is a load that was
    /// never acknowledged: recovery drops it and logs its end.
    LoadBegin {
        def: TableDef,
    },
    /// Rows of the table being loaded.
    LoadRows {
        table: TableId,
        rows: Vec<Vec<Value>>,
    },
    /// The load's last entry: the table becomes visible with every row of its
    /// `LoadRows` (`commit`), or is discarded.
    LoadEnd {
        table: TableId,
        commit: bool,
    },
    /// The definition of a table that follows its files (`CREATE EXTERNAL TABLE`), as
    /// the coordinator encodes it, or `None` when it is dropped: the catalog of those
    /// tables is durable and replicated with the log, so that a coordinator that
    /// restarts or is elected loads them again.
    FileTable {
        name: String,
        definition: Option<Vec<u8>>,
    },
}

/// Which entries committed transactions get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogMode {
    /// Logical for deterministic procedures, physical for everything else.
    #[default]
    Logical,
    /// Physical always: larger, but replay does no reads.
    Physical,
}

impl std::str::FromStr for LogMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "logical" => Ok(LogMode::Logical),
            "physical" => Ok(LogMode::Physical),
            other => Err(format!("log mode {other}: expected logical or physical")),
        }
    }
}
