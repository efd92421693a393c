//! Committed groups handed to an [`Applier`], and snapshots of what it holds.
//!
//! Raft applies each committed entry once per run of a voter, in log order. The
//! applier's state is in memory, so after a restart it is rebuilt: from the newest
//! snapshot (kept in the file `raft-snapshot`, written aside and renamed), then by the
//! committed entries after it, which Raft applies again. An applier therefore sees
//! index `i` only after every index below it, and sees each index once per run.
//!
//! A snapshot is taken under the same lock as [`Applier::apply`], so it holds exactly
//! the entries up to the log id it names.

use crate::log_store::sync_dir;
use crate::{GroupLog, MAX_RECORD, NodeId, storage_error};
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StoredMembership,
};
use openraft::{ErrorSubject, ErrorVerb};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::io::{self, Cursor};
use std::path::PathBuf;
use std::sync::Arc;

/// The snapshot file's name in the voter's directory.
pub const FILE: &str = "raft-snapshot";

/// What committed groups are applied to.
pub trait Applier: Send + Sync + 'static {
    /// Applies the committed group at Raft log index `index`.
    fn apply(&self, index: u64, group: &[u8]) -> Result<(), String>;
    /// Everything applied so far, as bytes [`Applier::restore`] takes.
    fn snapshot(&self) -> Result<Vec<u8>, String>;
    /// Replaces the state with a snapshot's.
    fn restore(&self, snapshot: &[u8]) -> Result<(), String>;
}

type Membership = StoredMembership<NodeId, BasicNode>;

/// A snapshot on disk: its meta and the applier's bytes.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

struct State {
    last_applied: Option<LogId<NodeId>>,
    membership: Membership,
    snapshot: Option<Arc<SnapshotFile>>,
    /// Snapshots taken by this run, for their ids.
    taken: u64,
}

/// The state machine of one voter; clones share it.
pub struct StateMachine<A: Applier> {
    applier: Arc<A>,
    dir: PathBuf,
    state: Arc<Mutex<State>>,
}

impl<A: Applier> Clone for StateMachine<A> {
    fn clone(&self) -> Self {
        Self {
            applier: self.applier.clone(),
            dir: self.dir.clone(),
            state: self.state.clone(),
        }
    }
}

impl<A: Applier> StateMachine<A> {
    /// The state machine in `dir`: the applier restored from the snapshot there, if
    /// any.
    pub fn open(dir: impl Into<PathBuf>, applier: Arc<A>) -> Result<Self, String> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(FILE);
        let snapshot = match std::fs::read(&path) {
            Ok(bytes) => Some(Arc::new(
                decode_snapshot(&bytes).map_err(|e| format!("{}: {e}", path.display()))?,
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let mut state = State {
            last_applied: None,
            membership: Membership::default(),
            snapshot: None,
            taken: 0,
        };
        if let Some(snapshot) = snapshot {
            applier
                .restore(&snapshot.data)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            state.last_applied = snapshot.meta.last_log_id;
            state.membership = snapshot.meta.last_membership.clone();
            state.snapshot = Some(snapshot);
        }
        Ok(Self {
            applier,
            dir,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// The index of the last entry applied.
    pub fn applied_index(&self) -> Option<u64> {
        self.state.lock().last_applied.map(|id| id.index)
    }

    /// Writes `snapshot` aside, fsyncs it and renames it over the current one.
    fn save(&self, snapshot: &SnapshotFile) -> io::Result<()> {
        let payload = postcard::to_allocvec(snapshot).map_err(io::Error::other)?;
        if payload.len() > MAX_RECORD {
            return Err(io::Error::other(format!(
                "a snapshot of {} bytes is larger than the {MAX_RECORD} a voter reads back",
                payload.len()
            )));
        }
        let mut bytes = Vec::with_capacity(payload.len() + 8);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let aside = self.dir.join(format!("{FILE}.new"));
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&aside)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
        }
        std::fs::rename(&aside, self.dir.join(FILE))?;
        sync_dir(&self.dir)
    }
}

fn decode_snapshot(bytes: &[u8]) -> Result<SnapshotFile, String> {
    if bytes.len() < 8 {
        return Err(format!("{} bytes is no snapshot", bytes.len()));
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if len != bytes.len() - 8 {
        return Err(format!(
            "the snapshot claims {len} bytes and {} follow",
            bytes.len() - 8
        ));
    }
    if crc32fast::hash(&bytes[8..]) != crc {
        return Err("the snapshot fails its checksum".into());
    }
    postcard::from_bytes(&bytes[8..]).map_err(|e| format!("the snapshot does not decode: {e}"))
}

impl<A: Applier> RaftSnapshotBuilder<GroupLog> for StateMachine<A> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<GroupLog>, StorageError<NodeId>> {
        let this = self.clone();
        let snapshot = tokio::task::spawn_blocking(move || {
            let mut state = this.state.lock();
            let data = this
                .applier
                .snapshot()
                .map_err(|e| storage_error(ErrorSubject::StateMachine, ErrorVerb::Read, e))?;
            state.taken += 1;
            let meta = SnapshotMeta {
                last_log_id: state.last_applied,
                last_membership: state.membership.clone(),
                snapshot_id: format!(
                    "{}-{}",
                    state.last_applied.map_or(0, |id| id.index),
                    state.taken
                ),
            };
            let snapshot = Arc::new(SnapshotFile { meta, data });
            this.save(&snapshot)
                .map_err(|e| storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
            state.snapshot = Some(snapshot.clone());
            Ok::<_, Box<StorageError<NodeId>>>(snapshot)
        })
        .await
        .map_err(|e| storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?
        .map_err(|e| *e)?;
        Ok(Snapshot {
            meta: snapshot.meta.clone(),
            snapshot: Box::new(Cursor::new(snapshot.data.clone())),
        })
    }
}

impl<A: Applier> RaftStateMachine<GroupLog> for StateMachine<A> {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        let state = self.state.lock();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<u64>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<GroupLog>> + Send,
        I::IntoIter: Send,
    {
        let mut replies = Vec::new();
        let mut state = self.state.lock();
        for entry in entries {
            let id = entry.log_id;
            match &entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(group) => self
                    .applier
                    .apply(id.index, &group.0)
                    .map_err(|e| storage_error(ErrorSubject::Apply(id), ErrorVerb::Write, e))?,
                EntryPayload::Membership(membership) => {
                    state.membership = StoredMembership::new(Some(id), membership.clone());
                }
            }
            state.last_applied = Some(id);
            replies.push(id.index);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let snapshot = Arc::new(SnapshotFile {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        });
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut state = this.state.lock();
            this.applier
                .restore(&snapshot.data)
                .map_err(|e| storage_error(ErrorSubject::StateMachine, ErrorVerb::Write, e))?;
            this.save(&snapshot).map_err(|e| {
                storage_error(
                    ErrorSubject::Snapshot(Some(snapshot.meta.signature())),
                    ErrorVerb::Write,
                    e,
                )
            })?;
            state.last_applied = snapshot.meta.last_log_id;
            state.membership = snapshot.meta.last_membership.clone();
            state.snapshot = Some(snapshot);
            Ok::<_, Box<StorageError<NodeId>>>(())
        })
        .await
        .map_err(|e| storage_error(ErrorSubject::StateMachine, ErrorVerb::Write, e))?
        .map_err(|e| *e)
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<GroupLog>>, StorageError<NodeId>> {
        Ok(self.state.lock().snapshot.as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}
