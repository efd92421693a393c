//! The Raft log on disk.
//!
//! One append-only file, `raft-log`, of records: an appended entry, a truncation (a new
//! leader's log disagreed with the tail), a purge (a snapshot covers the head), the
//! vote, the commit index. Each record is `length (u32 LE) | CRC-32 (u32 LE) |
//! postcard`, and every write is fsynced before Raft hears it is done: a vote or an
//! entry Raft counted on is never forgotten by a restart. The whole log is kept in
//! memory too (a snapshot purges its head), so reads never touch the disk.
//!
//! At open the records are replayed in order. A damaged record at the very end is a
//! write that a crash cut short, which nobody was told about: it is cut off. Damage
//! with records after it is not, and the log refuses to open.
//!
//! Once purged records outweigh the live ones, the file is rewritten with only the
//! live state (written aside, fsynced, renamed over the old one).

use crate::{GroupLog, MAX_RECORD, NodeId, storage_error};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, RaftLogId, RaftLogReader, StorageError, Vote};
use openraft::{ErrorSubject, ErrorVerb};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The log file's name in its directory.
pub const FILE: &str = "raft-log";

/// The file is rewritten when it is larger than this and than [`REWRITE_RATIO`] times
/// its live records.
const REWRITE_MIN_BYTES: u64 = 64 << 20;
const REWRITE_RATIO: u64 = 4;

/// Bytes before each record's payload: its length and CRC.
const HEADER: usize = 8;

#[derive(Serialize, Deserialize)]
enum Record {
    Append(Entry<GroupLog>),
    /// Entries from this index on are gone.
    Truncate(u64),
    /// Entries up to this one are gone (a snapshot holds them).
    Purge(LogId<NodeId>),
    Vote(Vote<NodeId>),
    Committed(Option<LogId<NodeId>>),
}

/// The durable Raft log of one voter; clones share it (Raft reads through one while it
/// writes through another).
#[derive(Clone)]
pub struct LogStore {
    state: Arc<Mutex<State>>,
    file: Arc<Mutex<LogFile>>,
}

/// What the records say, in memory.
#[derive(Default)]
struct State {
    /// Each entry with the size of its record.
    entries: BTreeMap<u64, (Entry<GroupLog>, u64)>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

impl State {
    fn apply(&mut self, record: Record, size: u64) {
        match record {
            Record::Append(entry) => {
                self.entries.insert(entry.get_log_id().index, (entry, size));
            }
            Record::Truncate(from) => {
                self.entries.split_off(&from);
            }
            Record::Purge(upto) => {
                self.entries = self.entries.split_off(&(upto.index + 1));
                self.last_purged = Some(upto);
            }
            Record::Vote(vote) => self.vote = Some(vote),
            Record::Committed(committed) => self.committed = committed,
        }
    }

    fn live_bytes(&self) -> u64 {
        self.entries.values().map(|(_, size)| size).sum::<u64>() + 3 * 64
    }
}

struct LogFile {
    dir: PathBuf,
    file: File,
    len: u64,
}

impl LogFile {
    /// Appends `bytes` (whole records) and waits until they are on disk.
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        self.file.sync_data()?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Replaces the file with `bytes`: written aside, fsynced, renamed over it.
    fn rewrite(&mut self, bytes: &[u8]) -> io::Result<()> {
        let aside = self.dir.join(format!("{FILE}.new"));
        let mut file = File::create(&aside)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&aside, self.dir.join(FILE))?;
        sync_dir(&self.dir)?;
        self.file = OpenOptions::new().append(true).open(self.dir.join(FILE))?;
        self.len = bytes.len() as u64;
        Ok(())
    }
}

/// Makes a rename or a new file in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One record's bytes.
fn encode(record: &Record, out: &mut Vec<u8>) -> u64 {
    let payload = postcard::to_allocvec(record).expect("a log record always encodes");
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    (HEADER + payload.len()) as u64
}

/// The records of a log file and the length of its undamaged part; an error for damage
/// that is not a torn last write.
fn decode_all(bytes: &[u8]) -> Result<(Vec<(Record, u64)>, usize), String> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < HEADER {
            break; // a torn header
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if len > MAX_RECORD {
            return Err(format!("record at byte {at} claims {len} bytes"));
        }
        if rest.len() - HEADER < len {
            break; // a torn payload
        }
        let payload = &rest[HEADER..HEADER + len];
        let end = at + HEADER + len;
        if crc32fast::hash(payload) != crc {
            if end == bytes.len() {
                break; // the last write, torn inside
            }
            return Err(format!(
                "record at byte {at} fails its checksum and {} bytes follow it",
                bytes.len() - end
            ));
        }
        let record: Record = postcard::from_bytes(payload)
            .map_err(|e| format!("record at byte {at} does not decode: {e}"))?;
        records.push((record, (HEADER + len) as u64));
        at = end;
    }
    Ok((records, at))
}

impl LogStore {
    /// Opens the log in `dir` (created if missing), replaying its records.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, String> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let (records, good) = decode_all(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut state = State::default();
        for (record, size) in records {
            state.apply(record, size);
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if good < bytes.len() {
            tracing::info!(
                "{}: a torn last write ({} bytes) is cut off",
                path.display(),
                bytes.len() - good
            );
            file.set_len(good as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        sync_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self {
            state: Arc::new(Mutex::new(state)),
            file: Arc::new(Mutex::new(LogFile {
                dir,
                file,
                len: good as u64,
            })),
        })
    }

    /// The index of the newest entry, if any.
    pub fn last_index(&self) -> Option<u64> {
        let state = self.state.lock();
        state
            .entries
            .last_key_value()
            .map(|(index, _)| *index)
            .or(state.last_purged.map(|id| id.index))
    }

    /// The file's size in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.file.lock().len
    }

    /// Applies `records` in memory, then writes them and waits for the disk.
    async fn persist(&self, records: Vec<Record>) -> io::Result<()> {
        let mut bytes = Vec::new();
        {
            let mut state = self.state.lock();
            for record in records {
                let size = encode(&record, &mut bytes);
                state.apply(record, size);
            }
        }
        let file = self.file.clone();
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || {
            let mut file = file.lock();
            file.write(&bytes)?;
            let live = state.lock().live_bytes();
            if file.len > REWRITE_MIN_BYTES && file.len > REWRITE_RATIO * live {
                let bytes = snapshot_records(&state.lock());
                file.rewrite(&bytes)?;
            }
            Ok(())
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// The live state as records: what a rewritten file holds.
fn snapshot_records(state: &State) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(vote) = state.vote {
        encode(&Record::Vote(vote), &mut out);
    }
    encode(&Record::Committed(state.committed), &mut out);
    if let Some(purged) = state.last_purged {
        encode(&Record::Purge(purged), &mut out);
    }
    for (entry, _) in state.entries.values() {
        encode(&Record::Append(entry.clone()), &mut out);
    }
    out
}

impl RaftLogReader<GroupLog> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<GroupLog>>, StorageError<NodeId>> {
        let state = self.state.lock();
        Ok(state
            .entries
            .range(range)
            .map(|(_, (entry, _))| entry.clone())
            .collect())
    }
}

impl RaftLogStorage<GroupLog> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<GroupLog>, StorageError<NodeId>> {
        let state = self.state.lock();
        let last = state
            .entries
            .last_key_value()
            .map(|(_, (entry, _))| *entry.get_log_id())
            .or(state.last_purged);
        Ok(LogState {
            last_purged_log_id: state.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.persist(vec![Record::Vote(*vote)])
            .await
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.state.lock().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.persist(vec![Record::Committed(committed)])
            .await
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.state.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<GroupLog>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<GroupLog>> + Send,
        I::IntoIter: Send,
    {
        let records: Vec<Record> = entries.into_iter().map(Record::Append).collect();
        match self.persist(records).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                callback.log_io_completed(Err(e));
                Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, message))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.persist(vec![Record::Truncate(log_id.index)])
            .await
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.persist(vec![Record::Purge(log_id)])
            .await
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Group;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64) -> Entry<GroupLog> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Group(vec![index as u8; 10])),
        }
    }

    fn indexes(store: &LogStore) -> Vec<u64> {
        store.state.lock().entries.keys().copied().collect()
    }

    async fn append(store: &mut LogStore, entries: Vec<Entry<GroupLog>>) {
        let records = entries.into_iter().map(Record::Append).collect();
        store.persist(records).await.unwrap();
    }

    #[tokio::test]
    async fn records_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        append(&mut store, (1..=10).map(|i| entry(1, i)).collect()).await;
        store
            .truncate(LogId::new(CommittedLeaderId::new(1, 1), 8))
            .await
            .unwrap();
        append(&mut store, vec![entry(2, 8)]).await;
        store
            .purge(LogId::new(CommittedLeaderId::new(1, 1), 3))
            .await
            .unwrap();
        let vote = Vote::new(2, 1);
        store.save_vote(&vote).await.unwrap();
        let mut reopened = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&reopened), (4..=8).collect::<Vec<_>>());
        assert_eq!(reopened.read_vote().await.unwrap(), Some(vote));
        let state = reopened.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.unwrap().index, 3);
        assert_eq!(state.last_log_id.unwrap().leader_id.term, 2);
    }

    #[tokio::test]
    async fn a_torn_last_write_is_cut_off_and_damage_before_the_end_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        append(&mut store, (1..=3).map(|i| entry(1, i)).collect()).await;
        let path = dir.path().join(FILE);
        let whole = std::fs::read(&path).unwrap();
        // Every cut inside the last record leaves the first two.
        let last = whole.len() - (whole.len() / 3);
        for cut in [whole.len() - 1, whole.len() - 5, last + 3] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let reopened = LogStore::open(dir.path()).unwrap();
            assert_eq!(indexes(&reopened), vec![1, 2], "cut at {cut}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), last as u64);
        }
        // A flipped byte in the first record, with records after it: refused.
        let mut damaged = whole.clone();
        damaged[HEADER + 2] ^= 0xff;
        std::fs::write(&path, &damaged).unwrap();
        let err = LogStore::open(dir.path()).err().unwrap();
        assert!(err.contains("fails its checksum"), "{err}");
        // A length no record has: refused before anything is allocated.
        let mut huge = whole;
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &huge).unwrap();
        let err = LogStore::open(dir.path()).err().unwrap();
        assert!(err.contains("claims"), "{err}");
    }

    #[tokio::test]
    async fn a_rewrite_keeps_the_live_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        append(&mut store, (1..=100).map(|i| entry(1, i)).collect()).await;
        store.save_vote(&Vote::new(1, 1)).await.unwrap();
        store
            .purge(LogId::new(CommittedLeaderId::new(1, 1), 90))
            .await
            .unwrap();
        let before = store.file_bytes();
        {
            let bytes = snapshot_records(&store.state.lock());
            store.file.lock().rewrite(&bytes).unwrap();
        }
        assert!(
            store.file_bytes() < before / 5,
            "{} of {before}",
            store.file_bytes()
        );
        append(&mut store, vec![entry(1, 101)]).await;
        let reopened = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&reopened), (91..=101).collect::<Vec<_>>());
        assert_eq!(reopened.state.lock().vote, Some(Vote::new(1, 1)));
    }
}
