//! A secondary: replays the primary's log in LSN order and answers reads from
//! snapshots at exact LSNs.
//!
//! ScyPer's secondaries (Rödiger's thesis, section 5.2) replay the redo log they receive
//! by multicast. A logical entry is replayed by running its stored procedure again,
//! which needs the row store's key indexes, so a secondary keeps a row store and
//! applies the row operations each entry makes (as its procedure makes them again) to
//! it and to versioned Arrow tables ([`crate::versioned`]), from which snapshots are
//! cut without copying.
//!
//! A physical entry needs no index beyond the versioned tables' own map of live keys,
//! so its operations go to those tables alone, which keep the rows changed; the row
//! store catches up, one write per key changed, only when something reads it (a
//! logical entry, a table definition, [`Secondary::rows`]). A secondary fed physical
//! entries alone so replays each operation with one hash lookup rather than with two
//! descents of the row store's ordered index and an undo record, which is where the
//! thesis' replay beating execution comes from.
//!
//! A secondary given a [`Share`] keeps, of each table whose rows are split
//! ([`crate::store::Placement::splits_rows`]), only the rows whose keys the share
//! owns: it drops the others from the state it starts from and skips the row
//! operations on them. The primary logs every transaction that touches such a table
//! physically, so no replay needs the rows skipped.

use crate::database::{apply_create, replay};
use crate::error::{Error, Result};
use crate::log::Entry;
use crate::log::segment;
use crate::procedure::Procedures;
use crate::store::{Key, RowOp, Store, TableDef};
use crate::value::Value;
use crate::versioned::{Snapshot, VersionedStore};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many snapshots a secondary keeps by default: queries hold their own
/// references, so dropping one from here never disturbs a query running on it.
pub const KEEP_SNAPSHOTS: usize = 16;

/// Which rows of partitioned tables a secondary keeps.
pub trait Share: Send + Sync {
    /// For each key of `table` (its key columns' values, in key order), whether this
    /// secondary keeps the row.
    fn owns(&self, table: &TableDef, keys: &[Vec<Value>]) -> Result<Vec<bool>>;
}

/// Drops from `store` the rows of split tables that `share` does not own: what a
/// secondary with that share starts from (the primary sends no more than that).
pub fn keep_share(store: &mut Store, share: &dyn Share) -> Result<()> {
    let split: Vec<_> = store
        .tables()
        .filter(|t| t.def.placement.splits_rows())
        .map(|t| t.def.id)
        .collect();
    for id in split {
        let table = store.table(id)?;
        let keys: Vec<Vec<Value>> = table.rows.keys().map(Key::values).collect();
        let keep = share.owns(&table.def, &keys)?;
        if keep.iter().all(|k| *k) {
            continue;
        }
        store.retain_rows(id, &keep)?;
    }
    Ok(())
}

pub struct Secondary {
    rows: Store,
    versions: VersionedStore,
    procedures: Procedures,
    /// Time spent replaying, for the replay speed against the primary's execution.
    replay_time: Duration,
    /// The part of it spent on the versioned Arrow tables.
    columnar_time: Duration,
    replayed: u64,
    /// Snapshots cut at the primary's snapshot transactions, by LSN.
    snapshots: BTreeMap<u64, Snapshot>,
    keep: usize,
    /// Set when an entry failed to apply: the row store and the versioned tables may
    /// disagree from then on, so nothing more is applied.
    failed: Option<String>,
    /// The rows of partitioned tables kept (`None`: all of them).
    share: Option<Arc<dyn Share>>,
}

impl Secondary {
    /// A secondary of a primary that has logged nothing yet.
    pub fn new(procedures: Procedures) -> Self {
        Self {
            rows: Store::default(),
            versions: VersionedStore::default(),
            procedures,
            replay_time: Duration::ZERO,
            columnar_time: Duration::ZERO,
            replayed: 0,
            snapshots: BTreeMap::new(),
            keep: KEEP_SNAPSHOTS,
            failed: None,
            share: None,
        }
    }

    /// [`Secondary::from_state`] keeping, of partitioned tables, only the rows `share`
    /// owns.
    pub fn from_state_shared(
        mut store: Store,
        procedures: Procedures,
        share: Arc<dyn Share>,
    ) -> Result<Self> {
        keep_share(&mut store, share.as_ref())?;
        let mut secondary = Self::from_state(store, procedures)?;
        secondary.share = Some(share);
        Ok(secondary)
    }

    /// Of `rows` of `def`, those this secondary keeps.
    fn own_rows(&self, def: &TableDef, rows: Vec<Vec<Value>>) -> Result<Vec<Vec<Value>>> {
        let Some(share) = self.share.as_ref().filter(|_| def.placement.splits_rows()) else {
            return Ok(rows);
        };
        for row in &rows {
            def.check_row(row)?;
        }
        let keys: Vec<Vec<Value>> = rows.iter().map(|r| def.key_values(r)).collect();
        let keep = share.owns(def, &keys)?;
        Ok(rows
            .into_iter()
            .zip(keep)
            .filter_map(|(r, keep)| keep.then_some(r))
            .collect())
    }

    /// Of row operations, those on rows this secondary keeps.
    fn own_ops(&self, ops: Vec<RowOp>) -> Result<Vec<RowOp>> {
        let Some(share) = &self.share else {
            return Ok(ops);
        };
        let mut keep = vec![true; ops.len()];
        let mut by_table: BTreeMap<_, Vec<usize>> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            if self.rows.table(op.table())?.def.placement.splits_rows() {
                by_table.entry(op.table()).or_default().push(i);
            }
        }
        for (id, at) in by_table {
            let def = &self.rows.table(id)?.def;
            let mut keys = Vec::with_capacity(at.len());
            for &i in &at {
                keys.push(match &ops[i] {
                    RowOp::Insert { row, .. } | RowOp::Update { row, .. } => {
                        def.check_row(row)?;
                        def.key_values(row)
                    }
                    RowOp::Delete { key, .. } | RowOp::Patch { key, .. } => {
                        def.check_key(key)?;
                        key.clone()
                    }
                });
            }
            let owned = share.owns(def, &keys)?;
            for (i, owned) in at.into_iter().zip(owned) {
                keep[i] = owned;
            }
        }
        Ok(ops
            .into_iter()
            .zip(keep)
            .filter_map(|(op, keep)| keep.then_some(op))
            .collect())
    }

    /// A secondary that starts from the primary's state `store` (a checkpoint, or the
    /// state a joining secondary is sent) and replays the log after it. Its first
    /// snapshot is at the state's LSN.
    pub fn from_state(store: Store, procedures: Procedures) -> Result<Self> {
        let mut versions = VersionedStore::default();
        for table in store.tables() {
            versions.create_table(store.lsn, (*table.def).clone(), table.to_rows())?;
        }
        if store.lsn > 0 {
            versions.advance(store.lsn)?;
        }
        let mut secondary = Self::new(procedures);
        secondary.rows = store;
        secondary.versions = versions;
        let lsn = secondary.rows.lsn;
        secondary
            .snapshots
            .insert(lsn, secondary.versions.snapshot());
        secondary.versions.set_horizon(lsn);
        Ok(secondary)
    }

    /// Keeps the newest `keep` snapshots (at least one).
    pub fn keep_snapshots(&mut self, keep: usize) {
        self.keep = keep.max(1);
    }

    /// The LSN of the last entry applied.
    pub fn lsn(&self) -> u64 {
        self.rows.lsn
    }

    /// The row store (the state at [`Secondary::lsn`]), brought up to the rows
    /// changed by physical entries since it was last read.
    pub fn rows(&mut self) -> Result<&Store> {
        self.catch_up()?;
        Ok(&self.rows)
    }

    /// Live rows, over every table.
    pub fn live_rows(&self) -> u64 {
        self.versions.live_rows()
    }

    /// Moves the rows changed by physical entries into the row store (timed as
    /// replay: it is the rest of their work).
    fn catch_up(&mut self) -> Result<()> {
        if self.failed.is_none() && self.versions.ahead() {
            let started = Instant::now();
            let caught = self.versions.catch_up(&mut self.rows);
            self.replay_time += started.elapsed();
            if let Err(e) = &caught {
                self.failed = Some(e.to_string());
            }
            caught?;
        }
        Ok(())
    }

    /// Entries replayed so far, and the time their replay took.
    pub fn replay_stats(&self) -> (u64, Duration) {
        (self.replayed, self.replay_time)
    }

    /// The part of the replay time spent keeping the versioned Arrow tables.
    pub fn columnar_time(&self) -> Duration {
        self.columnar_time
    }

    /// Applies the log groups in `frames` (as the primary's log writes and ships them),
    /// which must continue this secondary's LSNs; returns how many entries they held.
    /// Each group is checked (sizes, checksum) before its entries are applied.
    pub fn apply_frames(&mut self, frames: &[u8]) -> Result<u64> {
        let mut at = 0;
        let mut n = 0;
        while at < frames.len() {
            let (first, entries, len) = segment::frame(&frames[at..])
                .map_err(|e| Error::Constraint(format!("shipped log group: {e}")))?;
            at += len;
            for (i, entry) in entries.into_iter().enumerate() {
                self.apply(first + i as u64, entry)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Applies the entry with LSN `lsn`, the next one. After an error the secondary
    /// refuses everything: it has to be rebuilt from a checkpoint and the log.
    pub fn apply(&mut self, lsn: u64, entry: Entry) -> Result<()> {
        if let Some(f) = &self.failed {
            return Err(Error::Constraint(format!(
                "the secondary failed earlier: {f}"
            )));
        }
        let result = self.apply_entry(lsn, entry);
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn apply_entry(&mut self, lsn: u64, entry: Entry) -> Result<()> {
        let expected = self.rows.lsn + 1;
        if lsn < expected {
            // A repeat of what is applied already (a resent group): nothing to do.
            return Ok(());
        }
        if lsn > expected {
            return Err(Error::Constraint(format!(
                "log entries {expected} to {} are missing",
                lsn - 1
            )));
        }
        let started = Instant::now();
        let diverged =
            |e: Error| Error::Constraint(format!("replaying LSN {lsn} on a secondary: {e}"));
        let snapshot = matches!(entry, Entry::Snapshot);
        if !matches!(entry, Entry::Physical { .. } | Entry::Snapshot) {
            self.catch_up().map_err(diverged)?;
        }
        let entry = match entry {
            Entry::CreateTable { def, rows } => {
                let rows = self.own_rows(&def, rows).map_err(diverged)?;
                Entry::CreateTable { def, rows }
            }
            Entry::Physical { ops } => Entry::Physical {
                ops: self.own_ops(ops).map_err(diverged)?,
            },
            Entry::LoadRows { table, rows } => {
                let def = self.rows.loading(table).map_err(diverged)?.clone();
                Entry::LoadRows {
                    table,
                    rows: self.own_rows(&def, rows).map_err(diverged)?,
                }
            }
            entry => entry,
        };
        match entry {
            entry @ Entry::CreateTable { .. } => {
                apply_create(&mut self.rows, &entry).map_err(diverged)?;
                self.rows.lsn = lsn;
                let Entry::CreateTable { def, rows } = entry else {
                    unreachable!("matched above")
                };
                self.versions
                    .create_table(lsn, def, rows)
                    .map_err(diverged)?;
            }
            Entry::DropTable(id) => {
                replay(&mut self.rows, &self.procedures, lsn, Entry::DropTable(id))
                    .map_err(diverged)?;
                self.versions.drop_table(id).map_err(diverged)?;
            }
            Entry::LoadEnd {
                table,
                commit: true,
            } => {
                let loaded = self.rows.end_load(table, true).map_err(diverged)?;
                let loaded = loaded.expect("a committed load is a table");
                let (def, rows) = ((*loaded.def).clone(), loaded.to_rows());
                self.rows.lsn = lsn;
                self.versions
                    .create_table(lsn, def, rows)
                    .map_err(diverged)?;
            }
            // Row changes to the versioned tables alone (the row store catches up
            // when read).
            Entry::Physical { ops } => {
                let columnar = Instant::now();
                for op in ops {
                    self.versions
                        .apply_alone(lsn, op, Some(&self.rows))
                        .map_err(diverged)?;
                }
                self.rows.lsn = lsn;
                self.columnar_time += columnar.elapsed();
            }
            // Row changes (none for a snapshot transaction or the rest of a load).
            entry => {
                let ops = replay(&mut self.rows, &self.procedures, lsn, entry).map_err(diverged)?;
                let columnar = Instant::now();
                for (op, key) in ops {
                    self.versions
                        .apply_checked(lsn, op, key)
                        .map_err(diverged)?;
                }
                self.columnar_time += columnar.elapsed();
            }
        }
        self.versions.advance(lsn).map_err(diverged)?;
        if snapshot {
            self.snapshots.insert(lsn, self.versions.snapshot());
            while self.snapshots.len() > self.keep {
                self.snapshots.pop_first();
            }
            if let Some(oldest) = self.snapshots.keys().next() {
                self.versions.set_horizon(*oldest);
            }
        }
        self.replay_time += started.elapsed();
        self.replayed += 1;
        Ok(())
    }

    /// Every table at the last applied LSN.
    pub fn snapshot(&mut self) -> Snapshot {
        self.versions.snapshot()
    }

    /// The snapshot a query that arrived at the primary at LSN `arrival` runs on: the
    /// oldest kept global snapshot at or after it, so that a query never sees a state
    /// older than its arrival (order-preserving serializability) and every secondary
    /// picks the same one. `None` until that snapshot has been replayed here.
    pub fn snapshot_for(&self, arrival: u64) -> Option<&Snapshot> {
        self.snapshots.range(arrival..).next().map(|(_, s)| s)
    }

    /// The snapshot cut at exactly `lsn`, if it is kept.
    pub fn snapshot_at(&self, lsn: u64) -> Option<&Snapshot> {
        self.snapshots.get(&lsn)
    }

    /// Why the snapshot at `lsn` cannot be read here (`None`: it can, or it is not
    /// replayed yet).
    pub fn missing_snapshot(&self, lsn: u64) -> Option<String> {
        if let Some(f) = &self.failed {
            return Some(format!("the secondary failed: {f}"));
        }
        if self.snapshots.contains_key(&lsn) || lsn > self.lsn() {
            return None;
        }
        Some(match self.snapshots.keys().next() {
            Some(&oldest) if oldest > lsn => format!(
                "the snapshot at LSN {lsn} is no longer kept (the oldest kept is at {oldest})"
            ),
            _ => format!("LSN {lsn} is not a snapshot transaction"),
        })
    }

    /// The LSNs of the snapshots kept.
    pub fn snapshot_lsns(&self) -> Vec<u64> {
        self.snapshots.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RowOp, TableDef, TableId};
    use crate::value::{Column, ColumnType, Value};
    use rand::{Rng, SeedableRng};
    use std::ops::Bound;

    /// Table `t`: one Int64 key column `k`.
    fn table_t() -> TableDef {
        TableDef {
            id: TableId(0),
            name: "t".into(),
            columns: vec![Column::new("k", ColumnType::Int64, false)],
            key: vec![0],
            placement: Default::default(),
        }
    }

    fn insert(k: i64) -> Entry {
        Entry::Physical {
            ops: vec![RowOp::Insert {
                table: TableId(0),
                row: vec![Value::Int(k)].into(),
            }],
        }
    }

    /// A group from a broken or hostile sender behind a valid checksum: entries of
    /// every kind a secondary replays (a load, then inserts, an update, a patch and a
    /// delete), with bytes changed or cut, are applied or refused with an error, never
    /// a panic. A refused group is never applied whole, and a secondary whose store
    /// refused a change refuses what follows.
    #[test]
    fn changed_groups_are_applied_or_refused_never_a_panic() {
        use crate::log::segment::{encode_entry, encode_frame};
        let def = TableDef {
            id: TableId(0),
            name: "w".into(),
            columns: vec![
                Column::new("k", ColumnType::Int64, false),
                Column::new("a", ColumnType::Int32, true),
                Column::new("b", ColumnType::Text, true),
            ],
            key: vec![0],
            placement: Default::default(),
        };
        let row = |k: i64, a: Value, b: Value| vec![Value::Int(k), a, b];
        let table = TableId(0);
        let entries = [
            Entry::LoadBegin { def },
            Entry::LoadRows {
                table,
                rows: (0..4)
                    .map(|k| row(k, Value::Int(k), Value::Text("x".into())))
                    .collect(),
            },
            Entry::LoadEnd {
                table,
                commit: true,
            },
            Entry::Physical {
                ops: vec![
                    RowOp::Insert {
                        table,
                        row: row(10, Value::Null, Value::Text("y".into())).into(),
                    },
                    RowOp::Update {
                        table,
                        row: row(1, Value::Int(5), Value::Null).into(),
                    },
                    RowOp::Patch {
                        table,
                        key: vec![Value::Int(2)],
                        columns: vec![(1, Value::Int(7)), (2, Value::Text("z".into()))],
                    },
                    RowOp::Delete {
                        table,
                        key: vec![Value::Int(3)],
                    },
                ],
            },
            Entry::Snapshot,
        ];
        let mut raw = vec![];
        for e in &entries {
            encode_entry(&mut raw, e);
        }
        let replay = |raw: &[u8]| {
            let mut s = Secondary::new(Procedures::new());
            let applied = s.apply_frames(&encode_frame(1, entries.len() as u32, raw));
            (s, applied)
        };
        let (mut s, applied) = replay(&raw);
        assert_eq!(applied.unwrap(), 5);
        assert_eq!(s.snapshot().tables["w"].rows().unwrap().len(), 4);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x2545_f491_4f6c_dd1d);
        let mut rand = move |n: usize| rng.random_range(0..n);
        let (mut undecodable, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut bytes = raw.clone();
            let at = rand(bytes.len());
            match rand(4) {
                0 => bytes.truncate(at),
                1 => bytes[at] ^= 1 << rand(8),
                2 => bytes[at] = [0, 0x7f, 0x80, 0xff][rand(4)],
                _ => bytes.insert(at, rand(256) as u8),
            }
            let (mut s, applied) = replay(&bytes);
            if applied.is_err() {
                assert!(s.lsn() < 5, "a refused group is not applied whole");
                if s.failed.is_some() {
                    refused += 1;
                    assert!(s.apply(s.lsn() + 1, Entry::Snapshot).is_err());
                } else {
                    undecodable += 1;
                }
            }
        }
        // Changes reach both the decoder's checks and the store's.
        assert!(
            undecodable > 5000 && refused > 500,
            "{undecodable} undecodable, {refused} refused by the store"
        );
    }

    #[test]
    fn snapshots_are_cut_at_snapshot_transactions_and_chosen_by_arrival() {
        // A secondary may start from an empty primary's state, at LSN 0.
        let empty = Secondary::from_state(Store::default(), Procedures::new()).unwrap();
        assert_eq!(empty.snapshot_lsns(), vec![0]);
        let mut s = Secondary::new(Procedures::new());
        s.keep_snapshots(3);
        let def = table_t();
        s.apply(1, Entry::CreateTable { def, rows: vec![] })
            .unwrap();
        let mut lsn = 1;
        let mut marks = vec![];
        for k in 0..20 {
            lsn += 1;
            s.apply(lsn, insert(k)).unwrap();
            if k % 4 == 3 {
                lsn += 1;
                s.apply(lsn, Entry::Snapshot).unwrap();
                marks.push(lsn);
            }
        }
        // The newest three are kept.
        assert_eq!(s.snapshot_lsns(), marks[marks.len() - 3..].to_vec());
        let rows = |snap: &Snapshot| -> usize {
            snap.tables["t"]
                .batches()
                .iter()
                .map(|b| b.num_rows())
                .sum()
        };
        // A query arriving at LSN a runs on the oldest snapshot at or after a.
        let a = marks[3] - 2;
        let chosen = s.snapshot_for(a).unwrap();
        assert_eq!(chosen.lsn, marks[3]);
        assert_eq!(rows(chosen), 16);
        assert_eq!(s.snapshot_for(marks[4]).unwrap().lsn, marks[4]);
        assert_eq!(s.snapshot_at(marks[4]).unwrap().lsn, marks[4]);
        assert!(s.snapshot_at(marks[4] - 1).is_none());
        assert!(s.missing_snapshot(marks[4]).is_none());
        assert!(s.missing_snapshot(lsn + 5).is_none(), "not replayed yet");
        let old = s.missing_snapshot(marks[0]).unwrap();
        assert!(old.contains("no longer kept"), "{old}");
        // A secondary started from the state at some LSN has its first snapshot there
        // and goes on with the log after it.
        let mut joined =
            Secondary::from_state(s.rows().unwrap().clone(), Procedures::new()).unwrap();
        assert_eq!(rows(joined.snapshot_at(lsn).unwrap()), 20);
        joined.apply(lsn + 1, insert(100)).unwrap();
        joined.apply(lsn + 2, Entry::Snapshot).unwrap();
        assert_eq!(rows(joined.snapshot_at(lsn + 2).unwrap()), 21);
        assert_eq!(rows(joined.snapshot_at(lsn).unwrap()), 20);
        assert!(s.snapshot_for(lsn + 1).is_none(), "not cut yet");
        // A repeat is ignored; a gap in the LSNs is refused, and after a failure
        // nothing more is applied.
        s.apply(lsn, Entry::Snapshot).unwrap();
        assert_eq!(s.lsn(), lsn);
        assert!(s.apply(lsn + 2, insert(99)).is_err());
        let err = s.apply(lsn + 1, insert(99)).unwrap_err();
        assert!(err.to_string().contains("failed earlier"), "{err}");
        assert_eq!(s.lsn(), lsn);
    }

    #[test]
    fn a_load_is_seen_whole_at_its_end_or_not_at_all() {
        let def = table_t();
        let rows = |r: std::ops::Range<i64>| r.map(|k| vec![Value::Int(k)]).collect();
        let count = |s: &mut Secondary| {
            let snapshot = s.snapshot();
            snapshot
                .tables
                .get("t")
                .map(|t| t.batches().iter().map(|b| b.num_rows()).sum::<usize>())
        };
        let mut s = Secondary::new(Procedures::new());
        let begin = || Entry::LoadBegin { def: def.clone() };
        let piece = |r| Entry::LoadRows {
            table: TableId(0),
            rows: rows(r),
        };
        s.apply(1, begin()).unwrap();
        s.apply(2, piece(0..10)).unwrap();
        s.apply(3, Entry::Snapshot).unwrap();
        assert_eq!(count(&mut s), None, "invisible while it loads");
        // The primary restarted inside the load: it ends it as discarded.
        let end = |commit| Entry::LoadEnd {
            table: TableId(0),
            commit,
        };
        s.apply(4, end(false)).unwrap();
        assert!(s.rows().unwrap().table_id("t").is_err());
        // The table's id is taken by the discarded load.
        let def = TableDef {
            id: TableId(1),
            ..def.clone()
        };
        s.apply(5, Entry::LoadBegin { def }).unwrap();
        for (lsn, r) in [(6, 0..10), (7, 10..25)] {
            let piece = Entry::LoadRows {
                table: TableId(1),
                rows: rows(r),
            };
            s.apply(lsn, piece).unwrap();
        }
        s.apply(
            8,
            Entry::LoadEnd {
                table: TableId(1),
                commit: true,
            },
        )
        .unwrap();
        assert_eq!(count(&mut s), Some(25));
        // Rows for a table no load is filling fail the secondary.
        let err = s.apply(9, piece(30..31)).unwrap_err();
        assert!(err.to_string().contains("no load"), "{err}");
    }

    /// Procedures whose outcome depends on the rows: `bump(k)` adds 100 to row `k`'s
    /// `a`, `count()` writes the number of rows with a key of at least 0 into row -1.
    /// Replayed after physical entries, they read what the row store caught up.
    struct Bump;
    impl crate::procedure::Procedure for Bump {
        fn name(&self) -> &str {
            "bump"
        }
        fn params(&self) -> Vec<Column> {
            vec![Column::new("k", ColumnType::Int64, false)]
        }
        fn run(&self, txn: &mut crate::txn::Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
            let t = TableId(0);
            let mut row = txn.get(t, &args[..1])?.expect("bumped rows exist").to_vec();
            row[1] = Value::Int(row[1].as_int().unwrap_or(0) + 100);
            txn.update(t, row)?;
            Ok(vec![])
        }
    }
    struct Count;
    impl crate::procedure::Procedure for Count {
        fn name(&self) -> &str {
            "count"
        }
        fn params(&self) -> Vec<Column> {
            vec![]
        }
        fn run(&self, txn: &mut crate::txn::Txn<'_>, _: &[Value]) -> Result<Vec<Vec<Value>>> {
            let t = TableId(0);
            let from = [Value::Int(0)];
            let all = txn.range(t, Bound::Included(&from[..]), Bound::Unbounded)?;
            let n = all.count() as i64;
            let row = vec![Value::Int(-1), Value::Int(n), Value::Null];
            if txn.get(t, &[Value::Int(-1)])?.is_some() {
                txn.update(t, row)?;
            } else {
                txn.insert(t, row)?;
            }
            Ok(vec![])
        }
    }

    /// Physical entries change the versioned tables alone; whatever reads the row
    /// store (a logical entry, `rows()`) finds it caught up. Random inserts, updates,
    /// patches (of rows the row store holds and of rows only the versioned tables
    /// hold), deletes and re-inserts, mixed with logical entries, against a model.
    #[test]
    fn physical_entries_leave_the_row_store_behind_until_it_is_read() {
        let table = TableId(0);
        let def = TableDef {
            id: table,
            name: "w".into(),
            columns: vec![
                Column::new("k", ColumnType::Int64, false),
                Column::new("a", ColumnType::Int64, true),
                Column::new("b", ColumnType::Text, true),
            ],
            key: vec![0],
            placement: Default::default(),
        };
        let procedures = Procedures::new().with(Bump).with(Count);
        let mut s = Secondary::new(procedures);
        let mut model: BTreeMap<i64, (Option<i64>, Option<String>)> = BTreeMap::new();
        let first: Vec<Vec<Value>> = (0..20)
            .map(|k| {
                vec![
                    Value::Int(k),
                    Value::Int(k),
                    Value::Text(format!("r{k}").into()),
                ]
            })
            .collect();
        for k in 0..20 {
            model.insert(k, (Some(k), Some(format!("r{k}"))));
        }
        s.apply(1, Entry::CreateTable { def, rows: first }).unwrap();
        let row = |k: i64, (a, b): &(Option<i64>, Option<String>)| -> Vec<Value> {
            vec![
                Value::Int(k),
                a.map_or(Value::Null, Value::Int),
                b.as_deref().map_or(Value::Null, |b| Value::Text(b.into())),
            ]
        };
        let expected = |model: &BTreeMap<i64, (Option<i64>, Option<String>)>| {
            model.iter().map(|(k, v)| row(*k, v)).collect::<Vec<_>>()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let mut rand = move |n: u64| rng.random_range(0..n);
        for lsn in 2..3000u64 {
            let entry = match rand(10) {
                0 => Entry::Snapshot,
                1 => {
                    let present: Vec<i64> = model.keys().copied().filter(|k| *k >= 0).collect();
                    let k = present[rand(present.len() as u64) as usize];
                    let v = model.get_mut(&k).unwrap();
                    v.0 = Some(v.0.unwrap_or(0) + 100);
                    Entry::Logical {
                        procedure: "bump".into(),
                        args: vec![Value::Int(k)],
                    }
                }
                2 => {
                    let n = model.keys().filter(|k| **k >= 0).count() as i64;
                    model.insert(-1, (Some(n), None));
                    Entry::Logical {
                        procedure: "count".into(),
                        args: vec![],
                    }
                }
                _ => {
                    let mut ops = vec![];
                    for _ in 0..1 + rand(4) {
                        let k = rand(40) as i64;
                        let op = match (model.contains_key(&k), rand(3)) {
                            (false, _) => {
                                let v = (Some(rand(1000) as i64), Some(format!("i{lsn}")));
                                let op = RowOp::Insert {
                                    table,
                                    row: row(k, &v).into(),
                                };
                                model.insert(k, v);
                                op
                            }
                            (true, 0) => {
                                model.remove(&k);
                                RowOp::Delete {
                                    table,
                                    key: vec![Value::Int(k)],
                                }
                            }
                            (true, 1) => {
                                let v = (None, Some(format!("u{lsn}")));
                                let op = RowOp::Update {
                                    table,
                                    row: row(k, &v).into(),
                                };
                                model.insert(k, v);
                                op
                            }
                            (true, _) => {
                                let a = rand(1000) as i64;
                                model.get_mut(&k).unwrap().0 = Some(a);
                                RowOp::Patch {
                                    table,
                                    key: vec![Value::Int(k)],
                                    columns: vec![(1, Value::Int(a))],
                                }
                            }
                        };
                        ops.push(op);
                    }
                    Entry::Physical { ops }
                }
            };
            let snapshot = matches!(entry, Entry::Snapshot);
            s.apply(lsn, entry).unwrap();
            if snapshot {
                let rows = s.snapshot_at(lsn).unwrap().tables["w"].rows().unwrap();
                assert_eq!(rows, expected(&model), "snapshot at {lsn}");
            }
            if rand(50) == 0 {
                let store = s.rows().unwrap();
                let rows = store.table(table).unwrap().to_rows();
                assert_eq!(rows, expected(&model), "row store at {lsn}");
            }
        }
        let store = s.rows().unwrap();
        assert_eq!(store.table(table).unwrap().to_rows(), expected(&model));
        assert_eq!(s.live_rows(), model.len() as u64);
    }

    /// A patch of a row the row store does not hold, or naming a key column, fails
    /// the secondary with an error that says so.
    #[test]
    fn bad_patches_fail_the_secondary() {
        for (columns, k, says) in [
            (vec![(0, Value::Int(1))], 1, "not one of its"),
            (vec![(5, Value::Int(1))], 1, "not one of its"),
            (vec![(1, Value::Int(1))], 7, "no row with key"),
        ] {
            let def = TableDef {
                columns: vec![
                    Column::new("k", ColumnType::Int64, false),
                    Column::new("a", ColumnType::Int64, true),
                ],
                ..table_t()
            };
            let rows = vec![vec![Value::Int(1), Value::Int(0)]];
            let mut s = Secondary::new(Procedures::new());
            s.apply(1, Entry::CreateTable { def, rows }).unwrap();
            let patch = RowOp::Patch {
                table: TableId(0),
                key: vec![Value::Int(k)],
                columns,
            };
            let err = s
                .apply(2, Entry::Physical { ops: vec![patch] })
                .unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
            assert!(s.apply(3, Entry::Snapshot).is_err());
        }
    }
}
