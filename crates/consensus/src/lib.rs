//! Failover by consensus: the primary's redo log replicated by Raft among the
//! coordinators (ScyPer, Rödiger's thesis, chapter 5: secondaries notice a failed
//! primary, elect a new one, and the new primary goes on from the durable log).
//!
//! Each Raft entry is one *group* of the redo log: the bytes of one group commit, as
//! the primary's log writer framed them. The primary is the Raft leader; it proposes a
//! group and tells its clients "committed" only once Raft has it durable on a majority
//! of the voters, so losing the primary's disk loses no acknowledged transaction.
//! Raft's election restriction (a vote goes only to a candidate whose log is at least
//! as up to date) is the thesis' rule that the candidate with the highest durable LSN
//! wins.
//!
//! The crate knows neither the redo log's contents nor how nodes reach each other:
//! - [`Applier`]: what the committed groups are applied to (a coordinator's standby
//!   row store), and its snapshots;
//! - [`Carrier`]: how one voter's request reaches another (the cluster's signed
//!   control channel; an in-process router in tests).
//!
//! Modules:
//! - [`log_store`]: the Raft log on disk, fsynced before Raft hears it is written;
//! - [`state_machine`]: committed groups handed to the [`Applier`], snapshots kept on
//!   disk;
//! - [`network`]: Raft's requests as bytes over a [`Carrier`];
//! - [`node`]: one voter ([`Voter`]): start, bootstrap, propose, who leads.

pub mod log_store;
pub mod network;
pub mod node;
pub mod state_machine;

pub use network::{Carrier, RaftReply, RaftRpc};
pub use node::{ProposeError, Timing, Voter};
pub use openraft::ServerState;
pub use state_machine::Applier;

use serde::{Deserialize, Serialize};

/// A voter's id (its place in `--voters`, from 1).
pub type NodeId = u64;

/// One group of the redo log, as the primary's log writer framed it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group(pub Vec<u8>);

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group({} bytes)", self.0.len())
    }
}

openraft::declare_raft_types!(
    /// Raft over redo-log groups: a voter is named by its address, a committed group
    /// answers with its Raft log index.
    pub GroupLog:
        D = Group,
        R = u64,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// A storage failure as Raft's error: what failed (`subject`, `verb`) and why.
pub(crate) fn storage_error(
    subject: openraft::ErrorSubject<NodeId>,
    verb: openraft::ErrorVerb,
    why: impl std::fmt::Display,
) -> openraft::StorageError<NodeId> {
    openraft::StorageError::from_io_error(subject, verb, std::io::Error::other(why.to_string()))
}

/// The largest record the log store or a snapshot file reads: a longer length field is
/// damage, not data.
pub const MAX_RECORD: usize = 1 << 30;
