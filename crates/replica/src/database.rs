//! The primary's database: the row store, its transactions, its log and checkpoints.
//!
//! Transactions run one at a time under one lock (HyPer's serial execution: no latches,
//! no lock manager). A transaction that changed data gets the next LSN and its redo
//! entry is queued while the lock is held, so log order is commit order; the caller is
//! told "committed" only after the entry's group is durable. Later transactions may read
//! its writes before that (early lock release): if the primary dies first, both are lost
//! together, since the log is replayed as a prefix.
//!
//! With a data directory, `open` recovers: the newest checkpoint, then the log after it
//! (logical entries by running their procedure again). Without one, nothing is written
//! and the database lives in memory.

use crate::checkpoint;
use crate::combining::{Combiner, Queued};
use crate::error::{Error, Result};
use crate::log::segment;
use crate::log::writer::{LogStats, LogWriter};
use crate::log::{Entry, LogMode};
use crate::procedure::{Procedure, Procedures};
use crate::published::{Published, READER_LOCK_WAIT};
use crate::store::{Key, Placement, RowOp, Store, TableDef, TableId};
use crate::txn::{Pending, Txn};
use crate::value::{Column, Value};
use parking_lot::{ArcMutexGuard, Mutex, RawMutex};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Options {
    /// Where the log and checkpoints live; `None` keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    pub log_mode: LogMode,
    /// Share fsyncs between transactions (on), or fsync each before the next runs.
    pub group_commit: bool,
    /// A log segment is closed once it holds this many bytes.
    pub segment_bytes: u64,
    /// How long a transaction waits for the one running now before it fails as busy.
    pub lock_wait: std::time::Duration,
    /// A table created with more rows than fit in about this many bytes is logged as a
    /// load in several entries ([`Entry::LoadBegin`]) of about this size each.
    pub load_piece_bytes: usize,
}

/// The default of [`Options::load_piece_bytes`]: small enough that a secondary
/// decodes a piece in a fraction of a second, large enough that a load of gigabytes
/// takes a few hundred entries.
pub const LOAD_PIECE_BYTES: usize = 16 << 20;

impl Default for Options {
    fn default() -> Self {
        Self {
            data_dir: None,
            log_mode: LogMode::Logical,
            group_commit: true,
            segment_bytes: 64 << 20,
            lock_wait: std::time::Duration::from_secs(10),
            load_piece_bytes: LOAD_PIECE_BYTES,
        }
    }
}

impl Options {
    pub fn durable(dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: Some(dir.into()),
            ..Self::default()
        }
    }
}

/// What recovery did when the database opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The LSN of the checkpoint loaded (0: none).
    pub checkpoint_lsn: u64,
    /// Log entries replayed after it.
    pub replayed: u64,
    /// Bytes cut off the log's end: a group torn by a crash, never acknowledged.
    pub torn_bytes: u64,
    /// A load the log ends inside (never acknowledged): dropped, and its end logged.
    pub dropped_load: Option<TableId>,
}

pub struct Database {
    store: Arc<Mutex<Store>>,
    /// What readers see: they never wait for a long transaction, and never see one
    /// that could still be lost.
    published: Published,
    log: Option<LogWriter>,
    checkpoints: Option<PathBuf>,
    procedures: Procedures,
    options: Options,
    recovery: Recovery,
    checkpointing: Mutex<()>,
    /// The log's written bytes when the last checkpoint began.
    checkpointed_at: std::sync::atomic::AtomicU64,
    /// The LSN of the last snapshot transaction.
    last_mark: std::sync::atomic::AtomicU64,
    /// Procedures called as transactions that committed a change, and the time their
    /// bodies ran: the original execution a secondary's replay is compared with.
    executed: Mutex<(u64, std::time::Duration)>,
    /// Run before a read is given its snapshot ([`Database::confirm_reads`]).
    lead_check: std::sync::OnceLock<LeadCheck>,
    /// Procedure calls waiting for the primary, run back to back by one caller.
    calls: Combiner<QueuedCall, CallOutcome>,
}

/// A procedure call waiting for the primary, and when it stops waiting.
struct QueuedCall {
    procedure: Arc<dyn Procedure>,
    args: Vec<Value>,
    deadline: std::time::Instant,
}

/// A call's rows and what its commit leaves to wait for.
type CallOutcome = Result<(Vec<Vec<Value>>, Committed)>;

/// Confirms that this primary still leads the voters: a majority answered it after the
/// call began (Raft's read index), so a read served now sees every acknowledged commit.
/// A primary cut off from the others would otherwise serve its last state as current
/// while another, elected without it, commits.
pub type LeadCheck = Box<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

impl Database {
    /// Opens (and recovers) the database. `procedures` must hold every procedure the
    /// log names.
    pub fn open(options: Options, procedures: Procedures) -> Result<Self> {
        let Some(dir) = options.data_dir.clone() else {
            return Ok(Self {
                store: Arc::default(),
                published: Published::new(&Store::default()),
                // Written nowhere, but shipped to secondaries all the same.
                log: Some(LogWriter::in_memory(1)?),
                checkpoints: None,
                procedures,
                options,
                recovery: Recovery::default(),
                checkpointing: Mutex::new(()),
                checkpointed_at: Default::default(),
                last_mark: Default::default(),
                executed: Default::default(),
                lead_check: Default::default(),
                calls: Default::default(),
            });
        };
        let log_dir = dir.join("log");
        let checkpoint_dir = dir.join("checkpoints");
        for d in [&dir, &log_dir, &checkpoint_dir] {
            std::fs::create_dir_all(d).map_err(|e| Error::io(d, "create", e))?;
        }
        remove_unfinished_checkpoints(&checkpoint_dir)?;
        let mut recovery = Recovery::default();
        let mut store = match checkpoint::list(&checkpoint_dir)?.last() {
            Some((lsn, path)) => {
                recovery.checkpoint_lsn = *lsn;
                checkpoint::load(path)?
            }
            None => Store::default(),
        };
        let segments = segment::list(&log_dir)?;
        let mut tail = None;
        for (i, (first, path)) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
            let scan = segment::scan(path, &bytes, last)?;
            if let Some((lsn, _)) = scan.entries.first()
                && lsn != first
            {
                return Err(Error::corrupt(
                    path,
                    format!("named for LSN {first}, starts at {lsn}"),
                ));
            }
            for (lsn, entry) in scan.entries {
                if lsn <= store.lsn {
                    continue;
                }
                if Some(lsn) != store.lsn.checked_add(1) {
                    return Err(Error::corrupt(
                        path,
                        format!(
                            "the log misses LSNs {} to {} (after the checkpoint at {})",
                            store.lsn + 1,
                            lsn - 1,
                            recovery.checkpoint_lsn
                        ),
                    ));
                }
                replay(&mut store, &procedures, lsn, entry)
                    .map_err(|e| Error::corrupt(path, format!("replaying LSN {lsn}: {e}")))?;
                recovery.replayed += 1;
            }
            recovery.torn_bytes += scan.torn_bytes;
            if last {
                tail = Some((path.clone(), scan.valid_len));
            }
        }
        if recovery.torn_bytes > 0 || recovery.replayed > 0 {
            tracing::info!(
                "{}: recovered to LSN {} (checkpoint {}, {} log entries replayed, {} torn bytes cut)",
                dir.display(),
                store.lsn,
                recovery.checkpoint_lsn,
                recovery.replayed,
                recovery.torn_bytes
            );
        }
        let unfinished = store.take_unfinished_load();
        let next = next_lsn(&store).map_err(|_| Error::corrupt(&dir, "the LSN is at its limit"))?;
        let log = LogWriter::open(&log_dir, next, tail, options.segment_bytes)?;
        if let Some(load) = unfinished {
            // Secondaries may hold part of it: the end tells them to drop it too.
            let id = load.def.id;
            log.append(
                next,
                &Entry::LoadEnd {
                    table: id,
                    commit: false,
                },
            )?;
            log.wait_durable(next)?;
            store.lsn = next;
            recovery.dropped_load = Some(id);
            tracing::info!(
                "{}: the log ends inside the load of table {} ({} rows, never acknowledged): \
                 dropped",
                dir.display(),
                load.def.name,
                load.rows.len()
            );
        }
        Ok(Self {
            published: Published::new(&store),
            store: Arc::new(Mutex::new(store)),
            log: Some(log),
            checkpoints: Some(checkpoint_dir),
            procedures,
            options,
            recovery,
            checkpointing: Mutex::new(()),
            checkpointed_at: Default::default(),
            last_mark: Default::default(),
            executed: Default::default(),
            lead_check: Default::default(),
            calls: Default::default(),
        })
    }

    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    pub fn procedures(&self) -> &Procedures {
        &self.procedures
    }

    /// Creates a table with these columns and primary key (column names).
    pub fn create_table(&self, name: &str, columns: Vec<Column>, key: &[&str]) -> Result<TableId> {
        self.create_table_with_rows(name, columns, key, Placement::Full, Vec::new())
    }

    /// Creates a table holding `rows` (CREATE TABLE ... AS SELECT), logged so that after
    /// a crash the table is there with all of them or not at all. Without `key` columns
    /// the rows are numbered ([`crate::store::ROW_ID`]).
    pub fn create_table_with_rows(
        &self,
        name: &str,
        columns: Vec<Column>,
        key: &[&str],
        placement: Placement,
        rows: Vec<Vec<Value>>,
    ) -> Result<TableId> {
        self.load_table(name, columns, key, placement, [Ok(rows)])
    }

    /// [`Database::create_table_with_rows`] with the rows given in batches, converted as
    /// they are needed. Rows that fit in [`Options::load_piece_bytes`] are one
    /// `CreateTable` entry; more are a load ([`Entry::LoadBegin`], one `LoadRows` per
    /// piece, `LoadEnd`) that holds the primary throughout and keeps at most two pieces
    /// waiting for the disk. A failure after the load began logs its end as discarded.
    pub fn load_table(
        &self,
        name: &str,
        columns: Vec<Column>,
        key: &[&str],
        placement: Placement,
        batches: impl IntoIterator<Item = Result<Vec<Vec<Value>>>>,
    ) -> Result<TableId> {
        let numbered = key.is_empty();
        let mut columns = columns;
        let key = TableDef::keyed(&mut columns, key)
            .map_err(|e| Error::Constraint(format!("table {name}: {e}")))?;
        let mut pieces = Pieces {
            batches: batches.into_iter(),
            held: Vec::new(),
            bytes: self.options.load_piece_bytes.max(1),
            next_number: numbered.then_some(1),
        };
        let mut store = self.lock()?;
        // A load holds the primary for long.
        self.published.acquired(&store, true);
        let def = TableDef {
            id: store.next_table_id(),
            name: name.to_string(),
            columns,
            key,
            placement,
        };
        let id = def.id;
        let first = pieces.next().transpose()?.unwrap_or_default();
        let Some(second) = pieces.next().transpose()? else {
            let entry = Entry::CreateTable { def, rows: first };
            self.commit_entry(store, &entry, |store| apply_create(store, &entry))?;
            return Ok(id);
        };
        let rest = [Ok(first), Ok(second)].into_iter().chain(pieces);
        match self.load_locked(&mut store, def, rest) {
            Ok(_) => {
                self.release_published(store)?;
                Ok(id)
            }
            Err(e) if store.loading(id).is_err() => Err(e),
            Err(e) => {
                // Entries of the load may be logged: end it, so that every secondary
                // drops what it holds of it.
                store.take_unfinished_load();
                let ended = next_lsn(&store).and_then(|lsn| {
                    self.append(
                        lsn,
                        &Entry::LoadEnd {
                            table: id,
                            commit: false,
                        },
                    )?;
                    store.lsn = lsn;
                    Ok(lsn)
                });
                if ended.is_ok() {
                    let _ = self.release_published(store);
                }
                Err(e)
            }
        }
    }

    /// Logs and applies a load's entries; returns the LSN of its `LoadEnd`.
    fn load_locked(
        &self,
        store: &mut Store,
        def: TableDef,
        pieces: impl Iterator<Item = Result<Vec<Vec<Value>>>>,
    ) -> Result<u64> {
        let id = def.id;
        // Each entry is encoded before its change goes to the store, which checks it:
        // an entry is logged only once it is known to apply.
        let log = |store: &mut Store, raw: Vec<u8>| -> Result<u64> {
            let lsn = next_lsn(store)?;
            if let Some(log) = &self.log {
                log.append_encoded(lsn, raw)?;
            }
            store.lsn = lsn;
            Ok(lsn)
        };
        let encoded = |entry: &Entry| {
            let mut raw = Vec::new();
            segment::encode_entry(&mut raw, entry);
            raw
        };
        let begin = encoded(&Entry::LoadBegin { def: def.clone() });
        store.begin_load(def)?;
        log(store, begin)?;
        let mut waiting = std::collections::VecDeque::new();
        for piece in pieces {
            let entry = Entry::LoadRows {
                table: id,
                rows: piece?,
            };
            let raw = encoded(&entry);
            let Entry::LoadRows { rows, .. } = entry else {
                unreachable!("built above")
            };
            store.load_rows(id, rows)?;
            waiting.push_back(log(store, raw)?);
            if waiting.len() > 2 {
                let oldest = waiting.pop_front().expect("three are waiting");
                self.wait_durable(oldest)?;
            }
        }
        let end = encoded(&Entry::LoadEnd {
            table: id,
            commit: true,
        });
        store.end_load(id, true)?;
        log(store, end)
    }

    /// Applies `change` (what `entry` says, as recovery applies it) and logs `entry` as
    /// the next transaction, both taken back if either fails; returns its LSN once it
    /// is durable and readers see it. For the entries that are not row changes.
    fn commit_entry(
        &self,
        mut store: parking_lot::MutexGuard<'_, Store>,
        entry: &Entry,
        change: impl FnOnce(&mut Store) -> Result<()>,
    ) -> Result<u64> {
        let lsn = next_lsn(&store)?;
        let before = store.clone();
        if let Err(e) = change(&mut store).and_then(|()| self.append(lsn, entry)) {
            *store = before;
            return Err(e);
        }
        store.lsn = lsn;
        self.release_published(store)
    }

    /// Notes the commit `store` ends with, releases the primary and, once that state
    /// is durable, lets readers see it at once (tables created, loaded or dropped).
    /// Returns its LSN.
    fn release_published(&self, store: parking_lot::MutexGuard<'_, Store>) -> Result<u64> {
        self.published.committed(store.lsn);
        let state = Arc::new(store.clone());
        drop(store);
        self.wait_durable(state.lsn)?;
        let lsn = state.lsn;
        self.published.publish(state);
        Ok(lsn)
    }

    /// Logs a snapshot transaction (ScyPer's global snapshot, thesis section 5.2.2) and
    /// returns its LSN once durable. Every secondary cuts a snapshot at that LSN.
    pub fn mark_snapshot(&self) -> Result<u64> {
        self.mark_locked(self.lock()?)
    }

    fn mark_locked(&self, store: parking_lot::MutexGuard<'_, Store>) -> Result<u64> {
        let lsn = self.commit_entry(store, &Entry::Snapshot, |_| Ok(()))?;
        self.last_mark
            .fetch_max(lsn, std::sync::atomic::Ordering::Relaxed);
        Ok(lsn)
    }

    /// [`Database::mark_snapshot`] if anything committed since the last mark (the
    /// periodic snapshot: an idle primary logs nothing); the last mark's LSN otherwise.
    pub fn mark_snapshot_if_changed(&self) -> Result<u64> {
        let last = self.last_mark.load(std::sync::atomic::Ordering::Relaxed);
        if self.lsn() > last {
            self.mark_snapshot()
        } else {
            Ok(last)
        }
    }

    /// [`Database::mark_snapshot_if_changed`] unless a transaction holds the primary
    /// for longer than [`READER_LOCK_WAIT`] (an interactive one may hold it for
    /// seconds): `None` then, for a reader must not wait for a writer.
    pub fn try_mark_snapshot_if_changed(&self) -> Result<Option<u64>> {
        self.confirm_lead()?;
        let last = self.last_mark.load(std::sync::atomic::Ordering::Relaxed);
        if self.lsn() <= last {
            return Ok(Some(last));
        }
        match self.store.try_lock_for(READER_LOCK_WAIT) {
            Some(store) => {
                self.published.acquired(&store, false);
                self.mark_locked(store).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Logs the definition of the table `name` that follows its files (`None`: it was
    /// dropped), durable (and replicated, with a replicator) when this returns.
    pub fn set_file_table(&self, name: &str, definition: Option<Vec<u8>>) -> Result<()> {
        let store = self.lock()?;
        let entry = Entry::FileTable {
            name: name.to_string(),
            definition,
        };
        let applied = entry.clone();
        self.commit_entry(store, &entry, move |store| {
            let Entry::FileTable { name, definition } = applied else {
                unreachable!("built above")
            };
            store.set_file_table(name, definition);
            Ok(())
        })?;
        Ok(())
    }

    pub fn drop_table(&self, name: &str) -> Result<()> {
        let store = self.lock()?;
        let id = store.table_id(name)?;
        self.commit_entry(store, &Entry::DropTable(id), |store| store.drop_table(id))?;
        Ok(())
    }

    /// The primary's lock, waited for at most `lock_wait`.
    fn lock(&self) -> Result<parking_lot::MutexGuard<'_, Store>> {
        let store = self
            .store
            .try_lock_for(self.options.lock_wait)
            .ok_or_else(|| busy(self.options.lock_wait))?;
        self.published.acquired(&store, false);
        Ok(store)
    }

    /// Runs a stored procedure as one transaction and returns its rows once it is
    /// durable. An error (or a panic) rolls it back and nothing is logged. Calls queue
    /// for the primary and run back to back ([`crate::combining`]); the wait for
    /// durability is each caller's own.
    pub fn call(&self, name: &str, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let procedure = self.procedures.for_call(name, args)?.clone();
        let call = QueuedCall {
            procedure,
            args: args.to_vec(),
            deadline: std::time::Instant::now() + self.options.lock_wait,
        };
        let (out, committed) = self.calls.call(
            call,
            |batch| self.run_calls(batch),
            || Err(Error::Aborted("the call's transaction panicked".into())),
        )?;
        self.acknowledge(committed)?;
        Ok(out)
    }

    /// Runs a batch of queued calls, each as its own transaction, under one hold of
    /// the primary's lock.
    fn run_calls(&self, batch: &[Arc<Queued<QueuedCall, CallOutcome>>]) {
        let mut store = match self.lock() {
            Ok(store) => store,
            Err(e) => {
                let reason = e.to_string();
                for call in batch {
                    call.finish(Err(Error::Busy(reason.clone())));
                }
                return;
            }
        };
        for call in batch {
            let outcome = if std::time::Instant::now() > call.job.deadline {
                Err(busy(self.options.lock_wait))
            } else {
                self.run_call(&mut store, &call.job)
            };
            match (&outcome, &self.log) {
                // Its caller waits next for the commit to be durable: the log wakes it
                // then, once.
                (Ok((_, committed)), Some(log)) if committed.changed => {
                    let lsn = committed.lsn;
                    log.unpark_when_durable(lsn, call.finish_waking_later(outcome));
                }
                _ => call.finish(outcome),
            }
        }
    }

    /// One call as one transaction: runs its body and queues its commit.
    fn run_call(&self, store: &mut Store, call: &QueuedCall) -> CallOutcome {
        let procedure = &call.procedure;
        let mut txn = Txn::new(store);
        let started = std::time::Instant::now();
        let out = txn.run_guarded(procedure.name(), |txn| procedure.run(txn, &call.args))?;
        let ran = started.elapsed();
        let changed = !txn.is_empty();
        // A secondary holding part of a table could not run the procedure again.
        let logical = (procedure.deterministic()
            && self.options.log_mode == LogMode::Logical
            && !txn.touched_partitioned())
        .then(|| Entry::Logical {
            procedure: procedure.name().to_string(),
            args: call.args.clone(),
        });
        let committed = self.commit(&mut txn, logical)?;
        if changed {
            let mut executed = self.executed.lock();
            executed.0 += 1;
            executed.1 += ran;
        }
        Ok((out, committed))
    }

    /// Procedures called as transactions that committed a change, and the time their
    /// bodies ran (not the commit).
    pub fn executed(&self) -> (u64, std::time::Duration) {
        *self.executed.lock()
    }

    /// Runs `body` as one transaction, logged physically, and returns once durable.
    pub fn transaction<R>(&self, body: impl FnOnce(&mut Txn<'_>) -> Result<R>) -> Result<R> {
        let mut store = self.lock()?;
        let mut txn = Txn::new(&mut store);
        let out = txn.run_guarded("the transaction", body)?;
        let committed = self.commit(&mut txn, None)?;
        drop(txn);
        drop(store);
        self.acknowledge(committed)?;
        Ok(out)
    }

    /// Starts an interactive transaction (BEGIN): it holds the primary until it commits
    /// or rolls back, as every transaction here runs alone.
    pub fn begin(self: &Arc<Self>) -> Transaction {
        let guard = self.store.lock_arc();
        self.published.acquired(&guard, true);
        Transaction {
            db: self.clone(),
            guard: Some(guard),
            pending: Some(Pending::default()),
        }
    }

    /// [`Database::begin`], waiting at most `lock_wait` for the transaction running now.
    pub fn try_begin(self: &Arc<Self>) -> Result<Transaction> {
        let wait = self.options.lock_wait;
        let guard = self
            .store
            .try_lock_arc_for(wait)
            .ok_or_else(|| busy(wait))?;
        self.published.acquired(&guard, true);
        Ok(Transaction {
            db: self.clone(),
            guard: Some(guard),
            pending: Some(Pending::default()),
        })
    }

    /// Gives the transaction its LSN and queues its entry (under the lock). Returns the
    /// LSN to wait for. A transaction that changed nothing waits for the last commit
    /// it may have read. Readers see the commit when they next ask
    /// ([`crate::published`]).
    fn commit(&self, txn: &mut Txn<'_>, logical: Option<Entry>) -> Result<Committed> {
        if txn.is_empty() {
            return Ok(Committed {
                lsn: txn.store().lsn,
                changed: false,
            });
        }
        let entry = logical.unwrap_or_else(|| Entry::Physical { ops: txn.log_ops() });
        let lsn = next_lsn(txn.store())?;
        if let Err(e) = self.append(lsn, &entry) {
            txn.rollback();
            return Err(e);
        }
        txn.take_ops();
        txn.store().lsn = lsn;
        self.published.committed(lsn);
        if !self.options.group_commit {
            // The next transaction runs only once this one is on disk.
            self.wait_durable(lsn)?;
        }
        Ok(Committed { lsn, changed: true })
    }

    /// Waits until a commit is durable. Returns its LSN, or none for a transaction
    /// that changed nothing.
    fn acknowledge(&self, committed: Committed) -> Result<Option<u64>> {
        self.wait_durable(committed.lsn)?;
        Ok(committed.changed.then_some(committed.lsn))
    }

    fn append(&self, lsn: u64, entry: &Entry) -> Result<()> {
        match &self.log {
            Some(log) => log.append(lsn, entry),
            None => Ok(()),
        }
    }

    fn wait_durable(&self, lsn: u64) -> Result<()> {
        match &self.log {
            Some(log) => log.wait_durable(lsn),
            None => Ok(()),
        }
    }

    /// Writes a checkpoint at the current LSN and drops the older checkpoints and the
    /// log segments it makes unnecessary. Transactions go on while it is written.
    /// Returns its LSN (none without a data directory).
    pub fn checkpoint(&self) -> Result<Option<u64>> {
        let (Some(log), Some(root)) = (&self.log, &self.checkpoints) else {
            return Ok(None);
        };
        let _one_at_a_time = self.checkpointing.lock();
        self.checkpoint_locked(log, root)
    }

    /// Writes a checkpoint if the log has grown by `bytes` since the last one began,
    /// unless one is being written. Returns its LSN if it wrote one.
    pub fn checkpoint_if_grown(&self, bytes: u64) -> Result<Option<u64>> {
        let (Some(log), Some(root)) = (&self.log, &self.checkpoints) else {
            return Ok(None);
        };
        if self.log_bytes_since_checkpoint() < bytes {
            return Ok(None);
        }
        let Some(_one_at_a_time) = self.checkpointing.try_lock() else {
            return Ok(None);
        };
        self.checkpoint_locked(log, root)
    }

    /// Log bytes written since the last checkpoint began (or since the log opened).
    pub fn log_bytes_since_checkpoint(&self) -> u64 {
        let written = self.log.as_ref().map_or(0, |l| l.stats().written_bytes);
        written.saturating_sub(
            self.checkpointed_at
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    fn checkpoint_locked(&self, log: &LogWriter, root: &Path) -> Result<Option<u64>> {
        let copy = self.store.lock().clone();
        let written = log.stats().written_bytes;
        // Nothing that might still be lost goes into a checkpoint.
        log.wait_durable(copy.lsn)?;
        log.roll();
        checkpoint::write(root, &copy)?;
        self.checkpointed_at
            .store(written, std::sync::atomic::Ordering::Relaxed);
        for (lsn, dir) in checkpoint::list(root)? {
            if lsn < copy.lsn {
                std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, "remove", e))?;
            }
        }
        let Some(log_dir) = log.dir() else {
            return Ok(Some(copy.lsn));
        };
        let segments = segment::list(log_dir)?;
        for pair in segments.windows(2) {
            if pair[1].0 <= copy.lsn + 1 {
                let path = &pair[0].1;
                std::fs::remove_file(path).map_err(|e| Error::io(path, "remove", e))?;
            }
        }
        Ok(Some(copy.lsn))
    }

    /// Reads the store as of the last commit ([`Database::snapshot`]).
    pub fn read<R>(&self, f: impl FnOnce(&Store) -> R) -> R {
        f(&self.snapshot())
    }

    /// The store as of the last commit when called, once it is durable (a group commit
    /// at most). It waits for a transaction holding the primary only briefly: one that
    /// holds it long left its starting state for readers.
    pub fn snapshot(&self) -> Arc<Store> {
        self.published
            .snapshot(&self.store, |lsn| self.wait_durable(lsn))
    }

    /// The last state readers were given, without asking for a newer one: its tables
    /// are current (creating, loading or dropping a table publishes), its rows may be
    /// older than the last commit. For looking up table definitions.
    pub fn catalog(&self) -> Arc<Store> {
        self.published.current()
    }

    /// The LSN of the last durable commit.
    pub fn lsn(&self) -> u64 {
        let last = self.published.last_commit();
        self.log
            .as_ref()
            .map_or(last, |log| last.min(log.durable_lsn()))
    }

    pub fn durable_lsn(&self) -> u64 {
        match &self.log {
            Some(log) => log.durable_lsn(),
            None => self.published.last_commit(),
        }
    }

    /// Hands each group of log entries, once durable (once logged, for a database in
    /// memory), to `shipper` (the multicast to secondaries).
    pub fn ship(&self, shipper: crate::log::writer::Shipper) -> Result<()> {
        match &self.log {
            Some(log) => {
                log.ship(shipper);
                Ok(())
            }
            None => Err(Error::Unsupported("this database keeps no log".into())),
        }
    }

    /// Counts a commit as durable only once `replicator` has its log group on a
    /// majority of the voters as well ([`LogWriter::replicate`]).
    pub fn replicate(&self, replicator: crate::log::writer::Replicator) -> Result<()> {
        match &self.log {
            Some(log) => {
                log.replicate(replicator);
                Ok(())
            }
            None => Err(Error::Unsupported("this database keeps no log".into())),
        }
    }

    /// Runs `check` before each read takes its snapshot (a voting primary's read index).
    /// Set once; later calls change nothing.
    pub fn confirm_reads(&self, check: LeadCheck) {
        let _ = self.lead_check.set(check);
    }

    /// Confirms that this primary still leads, if it votes with others
    /// ([`Database::confirm_reads`]); a primary alone always does.
    pub fn confirm_lead(&self) -> Result<()> {
        match self.lead_check.get() {
            Some(check) => check().map_err(Error::NotLeading),
            None => Ok(()),
        }
    }

    /// Applies log frames (as [`LogWriter`] writes them) that the primary committed: a
    /// standby coordinator follows the replicated log this way. Entries at or below
    /// this database's last entry are skipped, so that a primary applying its own
    /// groups as they come back changes nothing. The frames apply whole or not at all.
    /// Returns the LSN reached.
    pub fn apply_replicated(&self, frames: &[u8]) -> Result<u64> {
        let log = self
            .log
            .as_ref()
            .ok_or_else(|| Error::Unsupported("this database keeps no log".into()))?;
        let mut entries = Vec::new();
        let mut rest = frames;
        while !rest.is_empty() {
            let (first, group, used) = segment::frame(rest).map_err(|e| {
                Error::corrupt(
                    Path::new("(replicated log)"),
                    format!("a frame at byte {}: {e}", frames.len() - rest.len()),
                )
            })?;
            entries.extend((first..).zip(group));
            rest = &rest[used..];
        }
        let Some(last) = entries.last().map(|(lsn, _)| *lsn) else {
            return Ok(self.lsn());
        };
        if last <= log.appended_lsn() {
            return Ok(last);
        }
        let mut store = self.store.lock();
        let mut copy = store.clone();
        for (lsn, entry) in entries {
            if lsn <= copy.lsn {
                continue;
            }
            if lsn != copy.lsn + 1 {
                return Err(Error::corrupt(
                    Path::new("(replicated log)"),
                    format!("entry {lsn} follows {}", copy.lsn),
                ));
            }
            replay(&mut copy, &self.procedures, lsn, entry).map_err(|e| {
                Error::corrupt(
                    Path::new("(replicated log)"),
                    format!("replaying LSN {lsn}: {e}"),
                )
            })?;
        }
        log.advance_to(copy.lsn)?;
        *store = copy;
        self.release_replicated(store)
    }

    /// The whole state as one buffer (Parquet, as a checkpoint): a standby coordinator's
    /// snapshot, which [`Database::restore`] takes.
    pub fn state_bytes(&self) -> Result<Vec<u8>> {
        let copy = self.store.lock().clone();
        checkpoint::to_bytes(&copy)
    }

    /// Replaces the state with one [`Database::state_bytes`] made at a later LSN.
    pub fn restore(&self, bytes: bytes::Bytes) -> Result<u64> {
        let restored = checkpoint::from_bytes(bytes)?;
        let log = self
            .log
            .as_ref()
            .ok_or_else(|| Error::Unsupported("this database keeps no log".into()))?;
        let mut store = self.store.lock();
        if restored.lsn < store.lsn {
            return Err(Error::Unsupported(format!(
                "a state at LSN {} restored over one at {}",
                restored.lsn, store.lsn
            )));
        }
        log.advance_to(restored.lsn)?;
        *store = restored;
        self.release_replicated(store)
    }

    /// Publishes a state that arrived replicated (durable already).
    fn release_replicated(&self, store: parking_lot::MutexGuard<'_, Store>) -> Result<u64> {
        self.published.committed(store.lsn);
        let state = Arc::new(store.clone());
        drop(store);
        let lsn = state.lsn;
        self.published.publish(state);
        Ok(lsn)
    }

    pub fn log_stats(&self) -> Option<LogStats> {
        self.log.as_ref().map(LogWriter::stats)
    }

    pub fn data_dir(&self) -> Option<&Path> {
        self.options.data_dir.as_deref()
    }
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("data_dir", &self.options.data_dir)
            .field("lsn", &self.lsn())
            .finish()
    }
}

/// An interactive transaction: statements run through [`Transaction::run`] until
/// [`Transaction::commit`]; dropping it rolls back.
pub struct Transaction {
    db: Arc<Database>,
    guard: Option<ArcMutexGuard<RawMutex, Store>>,
    pending: Option<Pending>,
}

impl Transaction {
    /// Runs one statement. An error rolls the whole transaction back (as in
    /// PostgreSQL, the transaction cannot go on after a failed statement).
    pub fn run<R>(&mut self, statement: impl FnOnce(&mut Txn<'_>) -> Result<R>) -> Result<R> {
        let (Some(guard), Some(pending)) = (self.guard.as_mut(), self.pending.take()) else {
            return Err(Error::Aborted("the transaction has ended".into()));
        };
        let mut txn = Txn::resume(guard, pending);
        match txn.run_guarded("the statement", statement) {
            Ok(out) => {
                self.pending = Some(txn.suspend());
                Ok(out)
            }
            Err(e) => {
                txn.rollback();
                drop(txn);
                self.guard = None;
                Err(e)
            }
        }
    }

    /// Runs a stored procedure inside this transaction (logged physically with the
    /// rest of it).
    pub fn call(&mut self, name: &str, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let procedure = self.db.procedures.for_call(name, args)?.clone();
        self.run(|txn| procedure.run(txn, args))
    }

    /// Whether the transaction has changed anything so far.
    pub fn is_empty(&self) -> bool {
        self.pending.as_ref().is_none_or(Pending::is_empty)
    }

    /// The store with this transaction's own writes, to read without the lock (its
    /// statements' queries run on other threads).
    pub fn snapshot(&self) -> Result<Store> {
        match &self.guard {
            Some(guard) if self.pending.is_some() => Ok((**guard).clone()),
            _ => Err(Error::Aborted("the transaction has ended".into())),
        }
    }

    /// Whether the transaction can still run statements.
    pub fn is_open(&self) -> bool {
        self.guard.is_some() && self.pending.is_some()
    }

    /// Commits and returns once durable, with the LSN (none if nothing changed).
    pub fn commit(mut self) -> Result<Option<u64>> {
        let (Some(mut guard), Some(pending)) = (self.guard.take(), self.pending.take()) else {
            return Err(Error::Aborted("the transaction has ended".into()));
        };
        let mut txn = Txn::resume(&mut guard, pending);
        let committed = self.db.commit(&mut txn, None)?;
        drop(txn);
        drop(guard);
        self.db.acknowledge(committed)
    }

    pub fn rollback(mut self) {
        self.undo();
    }

    fn undo(&mut self) {
        if let (Some(guard), Some(pending)) = (self.guard.as_mut(), self.pending.take()) {
            Txn::resume(guard, pending).rollback();
        }
        self.guard = None;
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        self.undo();
    }
}

/// Applies one log entry to `store`, as recovery and secondaries do, and returns the
/// row operations it made (a logical entry's are those its procedure makes again),
/// each with the key of its row.
pub(crate) fn replay(
    store: &mut Store,
    procedures: &Procedures,
    lsn: u64,
    entry: Entry,
) -> Result<Vec<(RowOp, Key)>> {
    let ops = match entry {
        entry @ Entry::CreateTable { .. } => {
            apply_create(store, &entry)?;
            vec![]
        }
        Entry::DropTable(id) => {
            store.drop_table(id)?;
            vec![]
        }
        Entry::Physical { ops } => {
            let mut txn = Txn::new(store);
            for op in ops {
                if let Err(e) = txn.apply_op(op) {
                    txn.rollback();
                    return Err(e);
                }
            }
            txn.take_changes()
        }
        Entry::Snapshot => vec![],
        Entry::FileTable { name, definition } => {
            store.set_file_table(name, definition);
            vec![]
        }
        Entry::LoadBegin { def } => {
            store.begin_load(def)?;
            vec![]
        }
        Entry::LoadRows { table, rows } => {
            store.load_rows(table, rows)?;
            vec![]
        }
        Entry::LoadEnd { table, commit } => {
            store.end_load(table, commit)?;
            vec![]
        }
        Entry::Logical { procedure, args } => {
            let procedure = procedures.for_call(&procedure, &args)?.clone();
            let mut txn = Txn::new(store);
            txn.run_guarded(procedure.name(), |txn| procedure.run(txn, &args))?;
            if txn.touched_partitioned() {
                txn.rollback();
                return Err(Error::Constraint(format!(
                    "the logical entry {procedure} touched a partitioned table (the primary \
                     logs such transactions physically)",
                    procedure = procedure.name()
                )));
            }
            txn.take_changes()
        }
    };
    store.lsn = lsn;
    Ok(ops)
}

/// What a commit leaves to do once the lock is released.
struct Committed {
    /// Wait until this LSN is durable.
    lsn: u64,
    /// Whether the transaction changed anything (and `lsn` is its own).
    changed: bool,
}

fn next_lsn(store: &Store) -> Result<u64> {
    store
        .lsn
        .checked_add(1)
        .ok_or_else(|| Error::LogFailed("the LSNs are exhausted".into()))
}

fn busy(wait: std::time::Duration) -> Error {
    Error::Busy(format!(
        "another transaction has held the primary for more than {} ms",
        wait.as_millis()
    ))
}

/// Creates a table and inserts its first rows, as a `CreateTable` entry says.
pub(crate) fn apply_create(store: &mut Store, entry: &Entry) -> Result<()> {
    let Entry::CreateTable { def, rows } = entry else {
        unreachable!("called with CreateTable entries only")
    };
    store.create_table(def.clone())?;
    let mut txn = Txn::new(store);
    for row in rows {
        txn.insert(def.id, row.clone())?;
    }
    txn.take_ops();
    Ok(())
}

/// Rows regrouped into pieces of about `bytes` (as encoded), numbered when the table
/// has no key of its own.
struct Pieces<I> {
    batches: I,
    held: Vec<Vec<Value>>,
    bytes: usize,
    /// The next row number (`None`: the rows have a key).
    next_number: Option<i64>,
}

impl<I: Iterator<Item = Result<Vec<Vec<Value>>>>> Iterator for Pieces<I> {
    type Item = Result<Vec<Vec<Value>>>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut piece = Vec::new();
        let mut bytes = 0;
        loop {
            if self.held.is_empty() {
                match self.batches.next() {
                    Some(Ok(rows)) => self.held = rows,
                    Some(Err(e)) => return Some(Err(e)),
                    None if piece.is_empty() => return None,
                    None => return Some(Ok(piece)),
                }
                self.held.reverse();
                continue;
            }
            while let Some(mut row) = self.held.pop() {
                bytes += row.iter().map(Value::encoded_bytes).sum::<usize>();
                if let Some(number) = &mut self.next_number {
                    row.push(Value::Int(*number));
                    *number += 1;
                }
                piece.push(row);
                if bytes >= self.bytes {
                    return Some(Ok(piece));
                }
            }
        }
    }
}

fn remove_unfinished_checkpoints(root: &Path) -> Result<()> {
    for entry in std::fs::read_dir(root).map_err(|e| Error::io(root, "list", e))? {
        let entry = entry.map_err(|e| Error::io(root, "list", e))?;
        if entry.file_name().to_string_lossy().ends_with(".tmp") {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, "remove", e))?;
        }
    }
    Ok(())
}
