//! A secondary's tables: Arrow batches with row versions, so that a snapshot at an
//! LSN is taken without copying data.
//!
//! ScyPer's secondaries fork a snapshot at exactly the LSN of the primary's snapshot
//! transaction (Rödiger's thesis, section 5.2.2). Here a table is a list of sealed
//! Arrow chunks and an open tail of rows in Arrow builders. Every row version records
//! the LSN that created it and the LSN that deleted it (`u64::MAX` while live): an
//! insert appends a version, a delete stamps one, an update does both. A snapshot at
//! LSN `s` seals the tail and keeps references to the chunks; it sees a version when
//! `created <= s < deleted`. Later deletes stamp LSNs above `s`, so the snapshot never
//! changes, and nothing is copied until a scan filters out invisible versions (none,
//! for a chunk every version of which is visible).

use crate::columnar::RowsToBatch;
use crate::error::{Error, Result};
use crate::store::{Key, Row, RowOp, Store, TableDef, TableId};
use crate::value::Value;
use arrow_array::{BooleanArray, RecordBatch};
use std::collections::hash_map::Entry as Slot;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Rows sealed into one Arrow batch, with their versions' ids and LSNs.
#[derive(Debug)]
struct Chunk {
    batch: RecordBatch,
    /// Each version's id, ascending: a live version is found by its id, which stays
    /// the same when chunks merge and drop dead versions.
    ids: Vec<u64>,
    created: Arc<[u64]>,
    deleted: Arc<[AtomicU64]>,
    /// Versions stamped deleted.
    stamped: usize,
    /// The LSN by which half of the versions were deleted (they are stamped in LSN
    /// order): once no snapshot is older, compacting frees at least half the chunk.
    half_dead_at: Option<u64>,
}

impl Chunk {
    fn new(batch: RecordBatch, ids: Vec<u64>, created: Vec<u64>, deleted: Vec<u64>) -> Self {
        let mut stamps: Vec<u64> = deleted.iter().copied().filter(|d| *d != LIVE).collect();
        let half = ids.len().div_ceil(2);
        let half_dead_at =
            (half > 0 && stamps.len() >= half).then(|| *stamps.select_nth_unstable(half - 1).1);
        Self {
            batch,
            ids,
            created: created.into(),
            deleted: deleted.into_iter().map(AtomicU64::new).collect(),
            stamped: stamps.len(),
            half_dead_at,
        }
    }

    fn len(&self) -> usize {
        self.ids.len()
    }
}

const LIVE: u64 = u64::MAX;

/// Rows in the tail are sealed into a chunk once there are this many; merges make
/// chunks no larger.
const CHUNK_ROWS: usize = 64 * 1024;

/// Rows a tail's builders have room for at least (they grow as rows arrive): most
/// tables seal at a snapshot long before `CHUNK_ROWS`, and some hold a few rows.
const TAIL_ROWS: usize = 1024;

#[derive(Debug)]
pub struct VersionedTable {
    def: Arc<TableDef>,
    /// Sealed chunks, in id order.
    chunks: Vec<Chunk>,
    /// Rows since the last seal, already in Arrow builders: each is copied in as it is
    /// applied, while it is in the cache.
    tail: RowsToBatch,
    tail_created: Vec<u64>,
    tail_deleted: Vec<u64>,
    /// The id of the tail's first row; the tail's row `i` has id `tail_first + i`.
    tail_first: u64,
    /// Each key's live version.
    live: HashMap<Key, Live, foldhash::fast::RandomState>,
    /// Keys whose row in the secondary's row store is not current: changed by
    /// operations applied here alone ([`VersionedStore::apply_alone`]), for
    /// [`VersionedStore::catch_up`]. A key may appear more than once.
    behind: Vec<Key>,
}

/// A key's live version.
#[derive(Debug)]
struct Live {
    id: u64,
    /// The row, while the row store does not have it (`None`: the row store's row is
    /// current). Held alone here, so a patch changes it in place.
    row: Option<Row>,
}

impl VersionedTable {
    fn new(def: TableDef) -> Self {
        Self {
            tail: RowsToBatch::new(&def.columns, TAIL_ROWS),
            def: Arc::new(def),
            chunks: vec![],
            tail_created: vec![],
            tail_deleted: vec![],
            tail_first: 0,
            live: HashMap::default(),
            behind: vec![],
        }
    }

    pub fn def(&self) -> &Arc<TableDef> {
        &self.def
    }

    /// Live rows.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Row versions stored (live and dead) and sealed chunks, for memory accounting.
    pub fn versions(&self) -> (usize, usize) {
        let sealed: usize = self.chunks.iter().map(|c| c.ids.len()).sum();
        (sealed + self.tail.len(), self.chunks.len())
    }

    /// Inserts a row the row store holds too.
    fn insert(&mut self, lsn: u64, row: &[Value], horizon: u64) -> Result<()> {
        self.def.check_row(row)?;
        self.insert_checked(lsn, row, self.def.key_of(row), None, horizon)
    }

    /// Inserts a row already checked against the table, whose key is `key`; `alone`
    /// is the row when the row store does not get it.
    fn insert_checked(
        &mut self,
        lsn: u64,
        row: &[Value],
        key: Key,
        alone: Option<Row>,
        horizon: u64,
    ) -> Result<()> {
        let id = self.tail_first + self.tail.len() as u64;
        match self.live.entry(key) {
            Slot::Occupied(o) => {
                return Err(Error::Constraint(format!(
                    "duplicate key {:?} in {}",
                    o.key(),
                    self.def.name
                )));
            }
            Slot::Vacant(v) => {
                if alone.is_some() {
                    self.behind.push(v.key().clone());
                }
                v.insert(Live { id, row: alone });
            }
        };
        self.append(lsn, row, horizon);
        Ok(())
    }

    /// Replaces the live version of `key` by `row` (checked against the table, and
    /// of that key): one lookup. `alone` is the row when the row store does not get
    /// it.
    fn update_checked(
        &mut self,
        lsn: u64,
        row: &[Value],
        key: &Key,
        alone: Option<Row>,
        horizon: u64,
    ) -> Result<()> {
        let id = self.tail_first + self.tail.len() as u64;
        let Some(live) = self.live.get_mut(key) else {
            return Err(Error::Constraint(format!(
                "no row with key {key:?} in {}",
                self.def.name
            )));
        };
        let old = std::mem::replace(&mut live.id, id);
        let current = alone.is_some();
        if std::mem::replace(&mut live.row, alone).is_none() && current {
            self.behind.push(key.clone());
        }
        self.stamp_deleted(old, lsn);
        self.append(lsn, row, horizon);
        Ok(())
    }

    /// Sets `columns` of the live row of `key` (checked), as a new version the row
    /// store does not get; `base` is the row store's row when this table holds none.
    fn patch_alone(
        &mut self,
        lsn: u64,
        key: &Key,
        columns: Vec<(u32, Value)>,
        base: impl FnOnce() -> Option<Row>,
        horizon: u64,
    ) -> Result<()> {
        let missing = || {
            Error::Constraint(format!(
                "no row with key {key:?} in {} to update",
                self.def.name
            ))
        };
        let live = self.live.get_mut(key).ok_or_else(missing)?;
        let mut row = match live.row.take() {
            Some(row) => row,
            None => base().ok_or_else(missing)?,
        };
        // In place when this table held the row alone (the tail copied its values).
        let values = Arc::make_mut(&mut row);
        for (at, value) in columns {
            values[at as usize] = value;
        }
        let values = Arc::clone(&row);
        self.update_checked(lsn, &values, key, Some(row), horizon)
    }

    /// Adds a version at the end of the tail (its id's entry in `live` is made).
    fn append(&mut self, lsn: u64, row: &[Value], horizon: u64) {
        self.tail.append(row);
        self.tail_created.push(lsn);
        self.tail_deleted.push(LIVE);
        if self.tail.len() >= CHUNK_ROWS {
            self.seal(horizon);
        }
    }

    /// Deletes the live version of `key`; `alone` when the row store does not.
    fn delete(&mut self, lsn: u64, key: &Key, alone: bool) -> Result<()> {
        let live = self.live.remove(key).ok_or_else(|| {
            Error::Constraint(format!("no row with key {key:?} in {}", self.def.name))
        })?;
        if alone && live.row.is_none() {
            self.behind.push(key.clone());
        }
        self.stamp_deleted(live.id, lsn);
        Ok(())
    }

    /// Marks version `id` deleted at `lsn`.
    fn stamp_deleted(&mut self, id: u64, lsn: u64) {
        if id >= self.tail_first {
            self.tail_deleted[(id - self.tail_first) as usize] = lsn;
            return;
        }
        let c = self
            .chunks
            .partition_point(|c| c.ids.last().is_some_and(|l| *l < id));
        let chunk = &mut self.chunks[c];
        let at = chunk
            .ids
            .binary_search(&id)
            .expect("a live version is in the chunk its id falls in");
        chunk.deleted[at].store(lsn, Ordering::Release);
        chunk.stamped += 1;
        if chunk.half_dead_at.is_none() && 2 * chunk.stamped >= chunk.len() {
            chunk.half_dead_at = Some(lsn);
        }
    }

    /// Turns the tail into a chunk, then collects garbage: versions deleted at or
    /// before `horizon` are seen by no kept or future snapshot (a query still reading
    /// an older one holds the chunks it had).
    ///
    /// Garbage is dropped where that copies little: a chunk half of whose versions
    /// are garbage is rewritten without them, and neighbours within a factor of two
    /// of each other in size that together hold at most [`CHUNK_ROWS`] versions become
    /// one (so a version is copied a few times while its chunk grows to that size,
    /// the newest chunks merging like a binary counter). Full chunks are never
    /// merged: that would copy every version again at each doubling, for no faster
    /// scan.
    fn seal(&mut self, horizon: u64) {
        if !self.tail.is_empty() {
            let batch = self.tail.finish();
            let n = batch.num_rows() as u64;
            // A finished builder keeps no room: the next tail gets room for as many
            // rows as this one held, rather than growing again by doubling (each
            // step a copy and fresh pages).
            self.tail = RowsToBatch::new(&self.def.columns, batch.num_rows().max(TAIL_ROWS));
            self.chunks.push(Chunk::new(
                batch,
                (self.tail_first..self.tail_first + n).collect(),
                std::mem::take(&mut self.tail_created),
                std::mem::take(&mut self.tail_deleted),
            ));
            self.tail_first += n;
        }
        self.chunks.retain_mut(|c| match c.half_dead_at {
            Some(at) if at <= horizon => match merge(&[c], horizon) {
                Some(compacted) => {
                    *c = compacted;
                    true
                }
                None => false,
            },
            _ => true,
        });
        let mut i = self.chunks.len();
        while i > 1 {
            let (a, b) = (&self.chunks[i - 2], &self.chunks[i - 1]);
            if a.len() + b.len() <= CHUNK_ROWS && a.len() <= 2 * b.len() && b.len() <= 2 * a.len() {
                let b = self.chunks.remove(i - 1);
                match merge(&[&self.chunks[i - 2], &b], horizon) {
                    Some(merged) => self.chunks[i - 2] = merged,
                    None => {
                        self.chunks.remove(i - 2);
                    }
                }
                // The merged chunk may now merge with the one before it.
                i = (i - 1).min(self.chunks.len());
            } else {
                i -= 1;
            }
        }
    }

    fn snapshot(&mut self, lsn: u64, horizon: u64) -> TableSnapshot {
        self.seal(horizon);
        TableSnapshot {
            lsn,
            def: Arc::clone(&self.def),
            chunks: self
                .chunks
                .iter()
                .map(|c| SnapshotChunk {
                    batch: c.batch.clone(),
                    created: Arc::clone(&c.created),
                    deleted: Arc::clone(&c.deleted),
                })
                .collect(),
        }
    }
}

/// Adjacent chunks as one, without the versions deleted at or before `horizon` (none
/// if nothing is left).
fn merge(chunks: &[&Chunk], horizon: u64) -> Option<Chunk> {
    let mut ids = vec![];
    let mut created = vec![];
    let mut deleted = vec![];
    let mut parts = vec![];
    for c in chunks {
        let keep: Vec<bool> = c
            .deleted
            .iter()
            .map(|d| d.load(Ordering::Acquire) > horizon)
            .collect();
        for (i, k) in keep.iter().enumerate() {
            if *k {
                ids.push(c.ids[i]);
                created.push(c.created[i]);
                deleted.push(c.deleted[i].load(Ordering::Acquire));
            }
        }
        if keep.iter().all(|k| *k) {
            parts.push(c.batch.clone());
        } else if keep.iter().any(|k| *k) {
            let mask = BooleanArray::from(keep);
            parts.push(
                arrow_select::filter::filter_record_batch(&c.batch, &mask)
                    .expect("a mask as long as the batch"),
            );
        }
    }
    if ids.is_empty() {
        return None;
    }
    let batch = match parts.as_slice() {
        [one] => one.clone(),
        _ => arrow_select::concat::concat_batches(&chunks[0].batch.schema(), &parts)
            .expect("chunks of one table"),
    };
    Some(Chunk::new(batch, ids, created, deleted))
}

#[derive(Debug, Clone)]
struct SnapshotChunk {
    batch: RecordBatch,
    created: Arc<[u64]>,
    deleted: Arc<[AtomicU64]>,
}

/// A table as it was at one LSN.
#[derive(Debug, Clone)]
pub struct TableSnapshot {
    lsn: u64,
    def: Arc<TableDef>,
    chunks: Vec<SnapshotChunk>,
}

impl TableSnapshot {
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    pub fn def(&self) -> &Arc<TableDef> {
        &self.def
    }

    /// The visible rows as values, in key order (for checks and small tables).
    pub fn rows(&self) -> Result<Vec<Vec<Value>>> {
        let mut rows = vec![];
        for b in self.batches() {
            rows.extend(crate::columnar::from_batch(&self.def, &b)?);
        }
        rows.sort_by_key(|r| self.def.key_of(r));
        Ok(rows)
    }

    /// The rows visible at the snapshot's LSN: whole chunks where every version is, a
    /// filtered copy where some are not.
    pub fn batches(&self) -> Vec<RecordBatch> {
        let mut out = Vec::with_capacity(self.chunks.len());
        for c in &self.chunks {
            let visible: Vec<bool> = c
                .created
                .iter()
                .zip(c.deleted.iter())
                .map(|(&created, deleted)| {
                    created <= self.lsn && self.lsn < deleted.load(Ordering::Acquire)
                })
                .collect();
            let n = visible.iter().filter(|v| **v).count();
            if n == visible.len() {
                out.push(c.batch.clone());
            } else if n > 0 {
                let mask = BooleanArray::from(visible);
                out.push(
                    arrow_select::filter::filter_record_batch(&c.batch, &mask)
                        .expect("a mask as long as the batch"),
                );
            }
        }
        out
    }
}

/// Every table of a secondary, and the LSN of the last entry applied.
#[derive(Debug, Default)]
pub struct VersionedStore {
    tables: BTreeMap<TableId, VersionedTable>,
    names: HashMap<String, TableId>,
    lsn: u64,
    /// The oldest LSN a kept or future snapshot may be at: versions deleted at or
    /// before it are garbage.
    horizon: u64,
}

/// Every table at one LSN.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub lsn: u64,
    pub tables: BTreeMap<String, TableSnapshot>,
}

impl VersionedStore {
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// Lets seals drop versions no snapshot at `horizon` or later sees (the caller
    /// keeps no snapshot older than it).
    pub fn set_horizon(&mut self, horizon: u64) {
        self.horizon = self.horizon.max(horizon.min(self.lsn));
    }

    pub fn table(&self, name: &str) -> Option<&VersionedTable> {
        self.names.get(name).and_then(|id| self.tables.get(id))
    }

    fn table_mut(&mut self, id: TableId) -> Result<&mut VersionedTable> {
        self.tables
            .get_mut(&id)
            .ok_or_else(|| Error::NoSuchTable(format!("#{}", id.0)))
    }

    /// Adds a table with its first rows, created at `lsn`.
    pub fn create_table(&mut self, lsn: u64, def: TableDef, rows: Vec<Vec<Value>>) -> Result<()> {
        def.validate()?;
        if self.names.contains_key(&def.name) || self.tables.contains_key(&def.id) {
            return Err(Error::TableExists(def.name));
        }
        let (id, name) = (def.id, def.name.clone());
        let mut table = VersionedTable::new(def);
        // One allocation for the keys of a loaded table, not one per doubling.
        table.live.reserve(rows.len());
        for row in rows {
            table.insert(lsn, &row, self.horizon)?;
        }
        self.tables.insert(id, table);
        self.names.insert(name, id);
        Ok(())
    }

    pub fn drop_table(&mut self, id: TableId) -> Result<()> {
        let t = self
            .tables
            .remove(&id)
            .ok_or_else(|| Error::NoSuchTable(format!("#{}", id.0)))?;
        self.names.remove(&t.def.name);
        Ok(())
    }

    /// Applies one row operation of the transaction with LSN `lsn`, checked, with no
    /// row store beside these tables (a patch changes a row applied here).
    pub fn apply(&mut self, lsn: u64, op: &RowOp) -> Result<()> {
        self.apply_alone(lsn, op.clone(), None)
    }

    /// Applies a row operation, checked, that the row store does not get: the table
    /// keeps the row until [`VersionedStore::catch_up`] hands it over. A patch of a
    /// row the row store is current for reads it from `base`.
    pub(crate) fn apply_alone(&mut self, lsn: u64, op: RowOp, base: Option<&Store>) -> Result<()> {
        let horizon = self.horizon;
        let id = op.table();
        let t = self.table_mut(id)?;
        match op {
            RowOp::Insert { row, .. } => {
                t.def.check_row(&row)?;
                let key = t.def.key_of(&row);
                t.insert_checked(lsn, &Arc::clone(&row), key, Some(row), horizon)
            }
            RowOp::Update { row, .. } => {
                t.def.check_row(&row)?;
                let key = t.def.key_of(&row);
                t.update_checked(lsn, &Arc::clone(&row), &key, Some(row), horizon)
            }
            RowOp::Delete { key, .. } => {
                t.def.check_key(&key)?;
                t.delete(lsn, &Key::encode(&key), true)
            }
            RowOp::Patch { key, columns, .. } => {
                t.def.check_key(&key)?;
                t.def.check_patch(&columns)?;
                let key = Key::encode(&key);
                let base = || base?.table(id).ok()?.rows.get(&key).cloned();
                t.patch_alone(lsn, &key, columns, base, horizon)
            }
        }
    }

    /// Applies an operation the row store has just applied (and so checked), with
    /// the key of its row as the row store encoded it: its row is appended without
    /// another check or encoding. A patch came back from the row store as the update
    /// it stands for.
    pub(crate) fn apply_checked(&mut self, lsn: u64, op: RowOp, key: Key) -> Result<()> {
        let horizon = self.horizon;
        match op {
            RowOp::Insert { table, row } => self
                .table_mut(table)?
                .insert_checked(lsn, &row, key, None, horizon),
            RowOp::Update { table, row } => self
                .table_mut(table)?
                .update_checked(lsn, &row, &key, None, horizon),
            RowOp::Delete { table, .. } => self.table_mut(table)?.delete(lsn, &key, false),
            RowOp::Patch { table, .. } => Err(Error::Unsupported(format!(
                "a change of some columns of table #{} without the row it changes",
                table.0
            ))),
        }
    }

    /// Live rows, over every table.
    pub fn live_rows(&self) -> u64 {
        self.tables.values().map(|t| t.len() as u64).sum()
    }

    /// Whether the row store lags behind some table (operations applied alone).
    pub(crate) fn ahead(&self) -> bool {
        self.tables.values().any(|t| !t.behind.is_empty())
    }

    /// Brings `store`'s rows up to these tables: each row changed by operations
    /// applied alone moves into it (the tables keep the versions), each such row
    /// deleted leaves it. One write per key, however often the key changed.
    pub(crate) fn catch_up(&mut self, store: &mut Store) -> Result<()> {
        for (id, t) in &mut self.tables {
            if t.behind.is_empty() {
                continue;
            }
            let rows = &mut store.table_mut(*id)?.rows;
            for key in t.behind.drain(..) {
                match t.live.get_mut(&key) {
                    Some(Live {
                        row: row @ Some(_), ..
                    }) => {
                        rows.insert(key, row.take().expect("matched Some"));
                    }
                    Some(_) => {}
                    None => {
                        rows.remove(&key);
                    }
                }
            }
        }
        Ok(())
    }

    /// Marks the transaction with LSN `lsn` as applied: entries arrive in LSN order.
    pub fn advance(&mut self, lsn: u64) -> Result<()> {
        if lsn <= self.lsn {
            return Err(Error::Constraint(format!(
                "log entry {lsn} after {}: out of order",
                self.lsn
            )));
        }
        self.lsn = lsn;
        Ok(())
    }

    /// Every table as of now (the last applied LSN).
    pub fn snapshot(&mut self) -> Snapshot {
        let (lsn, horizon) = (self.lsn, self.horizon);
        Snapshot {
            lsn,
            tables: self
                .tables
                .values_mut()
                .map(|t| (t.def.name.clone(), t.snapshot(lsn, horizon)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Row, Store};
    use crate::value::{Column, ColumnType};
    use rand::{Rng, SeedableRng};

    fn def(id: u32, name: &str) -> TableDef {
        TableDef {
            id: TableId(id),
            name: name.into(),
            columns: vec![
                Column::new("k", ColumnType::Int64, false),
                Column::new("v", ColumnType::Text, true),
            ],
            key: vec![0],
            placement: Default::default(),
        }
    }

    /// Random inserts, updates and deletes on two tables; snapshots at random LSNs
    /// match the row store at that LSN, then and after everything that followed.
    #[test]
    fn snapshots_match_the_row_store_at_their_lsn() {
        let mut versioned = VersionedStore::default();
        let mut reference = Store::default();
        for id in 0..2 {
            versioned
                .create_table(0, def(id, &format!("t{id}")), vec![])
                .unwrap();
            reference.create_table(def(id, &format!("t{id}"))).unwrap();
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e3779b97f4a7c15);
        let mut rand = move |n: u64| rng.random_range(0..n);
        let mut kept: Vec<(Snapshot, Store)> = vec![];
        for lsn in 1..=3000u64 {
            let ops = 1 + rand(4);
            for _ in 0..ops {
                let table = TableId(rand(2) as u32);
                let k = rand(200) as i64;
                let exists = reference
                    .table(table)
                    .unwrap()
                    .rows
                    .contains_key(&Key::encode(&[Value::Int(k)]));
                let row: Row = vec![Value::Int(k), Value::Text(format!("{lsn}").into())].into();
                let op = match (exists, rand(3)) {
                    (false, _) => RowOp::Insert { table, row },
                    (true, 0) => RowOp::Delete {
                        table,
                        key: vec![Value::Int(k)],
                    },
                    (true, _) => RowOp::Update { table, row },
                };
                versioned.apply(lsn, &op).unwrap();
                reference.apply(op).unwrap();
            }
            versioned.advance(lsn).unwrap();
            if rand(100) == 0 {
                kept.push((versioned.snapshot(), reference.clone()));
            }
            // Merges may drop what only snapshots older than 50 LSNs saw; the
            // snapshots kept here still hold the chunks they had.
            versioned.set_horizon(lsn.saturating_sub(50));
        }
        assert!(kept.len() > 10);
        // 3000 transactions of up to 4 changes on 400 keys: without garbage there
        // would be thousands of versions.
        let (versions, chunks) = versioned.table("t0").unwrap().versions();
        assert!(versions < 1500, "{versions} versions in {chunks} chunks");
        assert!(chunks < 20, "{chunks} chunks");
        kept.push((versioned.snapshot(), reference.clone()));
        for (snapshot, store) in &kept {
            for id in 0..2 {
                let t = &snapshot.tables[&format!("t{id}")];
                assert_eq!(
                    t.rows().unwrap(),
                    store.table(TableId(id)).unwrap().to_rows(),
                    "at {}",
                    snapshot.lsn
                );
            }
        }
        // Errors the primary never logs are refused, not applied.
        let dup = RowOp::Insert {
            table: TableId(0),
            row: vec![Value::Int(-1), Value::Null].into(),
        };
        versioned.apply(3001, &dup).unwrap();
        assert!(versioned.apply(3001, &dup).is_err());
        assert!(versioned.advance(5).is_err());
        let wrong = RowOp::Insert {
            table: TableId(1),
            row: vec![Value::Text("x".into()), Value::Null].into(),
        };
        assert!(versioned.apply(3002, &wrong).is_err());
        let missing = RowOp::Update {
            table: TableId(0),
            row: vec![Value::Int(-2), Value::Null].into(),
        };
        let err = versioned.apply(3002, &missing).unwrap_err().to_string();
        assert!(err.contains("no row with key"), "{err}");
    }

    /// A snapshot shares its chunks: taking one copies no data, and a chunk whose rows
    /// are all visible is handed out as it is.
    #[test]
    fn snapshots_share_chunks() {
        let mut v = VersionedStore::default();
        let rows: Vec<Vec<Value>> = (0..1000)
            .map(|k| vec![Value::Int(k), Value::Null])
            .collect();
        v.create_table(1, def(0, "t"), rows).unwrap();
        v.advance(1).unwrap();
        let a = v.snapshot();
        let b = v.snapshot();
        let (ba, bb) = (a.tables["t"].batches(), b.tables["t"].batches());
        assert_eq!(ba.len(), 1);
        assert!(ba[0].column(0).to_data().ptr_eq(&bb[0].column(0).to_data()));
        v.apply(
            2,
            &RowOp::Delete {
                table: TableId(0),
                key: vec![Value::Int(5)],
            },
        )
        .unwrap();
        v.advance(2).unwrap();
        let c = v.snapshot();
        assert_eq!(a.tables["t"].batches()[0].num_rows(), 1000);
        assert_eq!(c.tables["t"].batches()[0].num_rows(), 999);
    }

    /// Full chunks are not copied again when more are sealed; chunks whose versions
    /// are mostly garbage are rewritten without it, so updating every row again and
    /// again keeps about one version of each; snapshots see the right rows throughout.
    #[test]
    fn full_chunks_stay_put_and_garbage_goes() {
        let rows = (CHUNK_ROWS * 2 + CHUNK_ROWS / 3) as i64;
        let mut v = VersionedStore::default();
        let row = |k: i64, lsn: u64| vec![Value::Int(k), Value::Text(format!("{lsn}").into())];
        v.create_table(1, def(0, "t"), (0..rows).map(|k| row(k, 1)).collect())
            .unwrap();
        v.advance(1).unwrap();
        let first = v.snapshot();
        let first_chunk = |t: &VersionedTable| t.chunks[0].batch.column(1).to_data();
        let sealed = first_chunk(v.table("t").unwrap());
        let mut lsn = 1;
        for round in 0..4 {
            for k in 0..rows {
                lsn += 1;
                let op = RowOp::Update {
                    table: TableId(0),
                    row: row(k, lsn).into(),
                };
                v.apply(lsn, &op).unwrap();
                v.advance(lsn).unwrap();
            }
            if round == 0 {
                // Nothing is garbage yet (the first snapshot may still be read), and
                // the first chunk was not copied by the seals since.
                let (versions, _) = v.table("t").unwrap().versions();
                assert_eq!(versions as i64, 2 * rows);
                v.snapshot();
                assert!(first_chunk(v.table("t").unwrap()).ptr_eq(&sealed));
            }
            v.set_horizon(lsn);
            let now = v.snapshot();
            let t = &now.tables["t"];
            let (versions, chunks) = v.table("t").unwrap().versions();
            assert!(versions as i64 <= 2 * rows + 1, "{versions} versions");
            assert!(chunks <= 12, "{chunks} chunks");
            let seen = t.rows().unwrap();
            assert_eq!(seen.len() as i64, rows);
            for (k, r) in seen.iter().enumerate() {
                assert_eq!(r, &row(k as i64, lsn - (rows - 1 - k as i64) as u64));
            }
        }
        // The first snapshot still reads the chunks it had.
        assert_eq!(first.tables["t"].rows().unwrap().len() as i64, rows);
        assert_eq!(first.tables["t"].rows().unwrap()[7], row(7, 1));
    }
}
