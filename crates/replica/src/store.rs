//! The primary's row store: tables of rows indexed by primary key.
//!
//! Each table is a persistent ordered map from key to row (`imbl::OrdMap`): lookups and
//! range scans by key prefix serve the stored procedures, and cloning a table is O(1),
//! so a checkpoint copies the whole store under the lock and writes it while
//! transactions go on. Rows are shared slices and keys order-preserving bytes held in
//! the tree's nodes ([`crate::key`]), both cheap to clone when the map copies a node.
//!
//! [`Store::apply`] is the one place a row changes: transactions call it and record its
//! undo, recovery calls it to replay physical log entries.

use crate::error::{Error, Result};
use crate::value::{Column, Value, schema_of};
use arrow_schema::SchemaRef;
use imbl::OrdMap;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A table's number, stable across restarts (logged with its creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TableId(pub u32);

pub use crate::key::Key;
pub type Row = Arc<[Value]>;

/// The column that numbers the rows of a table without a primary key of its own: its
/// last column and its key, assigned by the primary on insert (the greatest number
/// in the table plus one) and hidden from queries. Physical log entries carry it, so
/// replay and the secondaries know each row by it as by any key.
pub const ROW_ID: &str = "_gyre_row_id";

/// What a transactional table is: its columns and which of them form the primary key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDef {
    pub id: TableId,
    pub name: String,
    pub columns: Vec<Column>,
    /// Column indexes of the primary key, in key order.
    pub key: Vec<usize>,
    /// Where the secondaries keep its rows.
    #[serde(default)]
    pub placement: Placement,
}

/// Where a transactional table's rows live on the secondaries. The primary holds every
/// row either way: its transactions need the whole state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Placement {
    /// Every secondary holds every row (ScyPer's full replication).
    #[default]
    Full,
    /// Each row lives on the one secondary its primary key hashes to, so the
    /// secondaries together hold the table once. A secondary can then not replay a
    /// procedure that reads such a table, so transactions that touch one are logged
    /// physically.
    Partitioned,
    /// For a table without a primary key: runs of [`CHUNK_ROWS`] consecutive row
    /// numbers are dealt to the secondaries in turn, so rows loaded together stay
    /// together (the time-of-creation locality Neo-Join exploits) while the
    /// secondaries together hold the table once. Logged as a partitioned table is.
    Chunked,
    /// Each row lives in the block its key hashes to ([`crate::rendezvous::BLOCKS`]
    /// of them), and each block on the `replicas` secondaries of highest rendezvous
    /// weight ([`crate::rendezvous`]): losing fewer than `replicas` secondaries loses
    /// no block, and a secondary that joins takes only its share. Logged as a
    /// partitioned table is.
    Fragmented { replicas: u8 },
}

/// Rows per chunk of a [`Placement::Chunked`] table.
pub const CHUNK_ROWS: i64 = 1 << 16;

impl Placement {
    /// The name `WITH (replication = ...)` takes.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Full => "full",
            Placement::Partitioned => "partitioned",
            Placement::Chunked => "chunked",
            Placement::Fragmented { .. } => "fragmented",
        }
    }

    /// The copies of each row the secondaries keep together, with `secondaries` of them.
    pub fn copies(self, secondaries: usize) -> usize {
        match self {
            Placement::Full => secondaries,
            Placement::Partitioned | Placement::Chunked => 1,
            Placement::Fragmented { replicas } => usize::from(replicas).min(secondaries),
        }
    }

    /// Whether each secondary keeps only its share of the rows (so that it cannot
    /// replay a procedure reading them).
    pub fn splits_rows(self) -> bool {
        !matches!(self, Placement::Full)
    }

    /// The chunk of a [`Placement::Chunked`] table a row number falls in.
    pub fn chunk_of(row_id: i64) -> i64 {
        row_id.saturating_sub(1).max(0) / CHUNK_ROWS
    }
}

/// A placement by its name, in any case (`fragmented` with two copies of each block).
impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        [
            Placement::Full,
            Placement::Partitioned,
            Placement::Chunked,
            Placement::Fragmented { replicas: 2 },
        ]
        .into_iter()
        .find(|p| s.eq_ignore_ascii_case(p.name()))
        .ok_or_else(|| format!("placement {s}: expected full, partitioned, chunked or fragmented"))
    }
}

impl TableDef {
    /// Every stored column's type, the row id's too.
    pub fn schema(&self) -> SchemaRef {
        schema_of(&self.columns)
    }

    /// Whether the rows are numbered by a [`ROW_ID`] (the table has no primary key of
    /// its own).
    pub fn has_row_id(&self) -> bool {
        self.columns.last().is_some_and(|c| c.name == ROW_ID)
    }

    /// The columns queries see: all but the row id.
    pub fn visible_columns(&self) -> &[Column] {
        &self.columns[..self.columns.len() - usize::from(self.has_row_id())]
    }

    /// The schema queries see.
    pub fn visible_schema(&self) -> SchemaRef {
        schema_of(self.visible_columns())
    }

    /// The key a row gets: the primary key's columns, or for a table without one the
    /// row id column ([`ROW_ID`]) appended to `columns`. Checks first that the user's
    /// `columns` are some and do not take the row id's name.
    pub fn keyed(
        columns: &mut Vec<Column>,
        key: &[&str],
    ) -> std::result::Result<Vec<usize>, String> {
        if columns.is_empty() {
            return Err("a table needs a column".into());
        }
        if columns.iter().any(|c| c.name == ROW_ID) {
            return Err(format!(
                "the column name {ROW_ID} is reserved for the row numbers of a table \
                 without a primary key"
            ));
        }
        if key.is_empty() {
            columns.push(Column::new(ROW_ID, crate::value::ColumnType::Int64, false));
            return Ok(vec![columns.len() - 1]);
        }
        key.iter()
            .map(|k| {
                columns
                    .iter()
                    .position(|c| c.name == *k)
                    .ok_or_else(|| format!("no column {k}"))
            })
            .collect()
    }

    /// Checks the definition itself: at least one column, names unique, decimals that
    /// Arrow can hold, a key of distinct existing columns.
    pub fn validate(&self) -> Result<()> {
        if self.columns.is_empty() {
            return Err(Error::Constraint(format!(
                "table {} has no columns",
                self.name
            )));
        }
        if let Some(at) = self.columns.iter().position(|c| c.name == ROW_ID) {
            let last = self.columns.len() - 1;
            let c = &self.columns[at];
            if at != last
                || self.key != [last]
                || c.column_type != crate::value::ColumnType::Int64
                || c.nullable
            {
                return Err(Error::Constraint(format!(
                    "table {}: the column name {ROW_ID} is reserved for the row numbers of \
                     a table without a primary key",
                    self.name
                )));
            }
        }
        let mut names = std::collections::HashSet::new();
        for c in &self.columns {
            if let crate::value::ColumnType::Decimal { precision, scale } = c.column_type
                && let Err(e) = arrow_array::types::validate_decimal_precision_and_scale::<
                    arrow_array::types::Decimal128Type,
                >(precision, scale)
            {
                return Err(Error::Constraint(format!(
                    "table {}: column {}: {e}",
                    self.name, c.name
                )));
            }
            if !names.insert(c.name.as_str()) {
                return Err(Error::Constraint(format!(
                    "table {} has two columns named {}",
                    self.name, c.name
                )));
            }
        }
        if self.key.is_empty() {
            return Err(Error::Constraint(format!(
                "table {} needs a primary key",
                self.name
            )));
        }
        if self.placement == Placement::Chunked && !self.has_row_id() {
            return Err(Error::Constraint(format!(
                "table {}: chunked placement deals rows out by their row numbers, which only \
                 a table without a primary key has (use partitioned)",
                self.name
            )));
        }
        if let Placement::Fragmented { replicas } = self.placement
            && !(1..=crate::rendezvous::MAX_REPLICAS).contains(&replicas)
        {
            return Err(Error::Constraint(format!(
                "table {}: {replicas} replicas of each block; from 1 to {} are possible",
                self.name,
                crate::rendezvous::MAX_REPLICAS
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for &k in &self.key {
            if k >= self.columns.len() || !seen.insert(k) {
                return Err(Error::Constraint(format!(
                    "table {}: primary key column {k} does not exist or repeats",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// The key of a row (already checked to have every column).
    pub fn key_of(&self, row: &[Value]) -> Key {
        Key::encode_columns(row, &self.key)
    }

    /// The values of a row's key (already checked to have every column).
    pub fn key_values(&self, row: &[Value]) -> Vec<Value> {
        self.key.iter().map(|&k| row[k].clone()).collect()
    }

    /// Whether `row` fits the table: one value per column, each of the column's type,
    /// NULL only where allowed and never in the key.
    pub fn check_row(&self, row: &[Value]) -> Result<()> {
        if row.len() != self.columns.len() {
            return Err(Error::Constraint(format!(
                "table {} has {} columns, the row {}",
                self.name,
                self.columns.len(),
                row.len()
            )));
        }
        for (i, (c, v)) in self.columns.iter().zip(row).enumerate() {
            if v.is_null() && self.key.contains(&i) {
                return Err(Error::Constraint(format!(
                    "NULL in {}.{}, a primary key column",
                    self.name, c.name
                )));
            }
            self.check_value(i, v)?;
        }
        Ok(())
    }

    /// Whether `value` fits column `at` (its type, NULL only where allowed); the error
    /// names the table and the column.
    pub fn check_value(&self, at: usize, value: &Value) -> Result<()> {
        let c = &self.columns[at];
        c.check(value)
            .map_err(|e| Error::Constraint(format!("{}.{}: {e}", self.name, c.name)))
    }

    /// Checks the columns a [`RowOp::Patch`] sets: each in range, not part of the key,
    /// and a value of its type.
    pub fn check_patch(&self, columns: &[(u32, Value)]) -> Result<()> {
        for (at, value) in columns {
            let at = *at as usize;
            if at >= self.columns.len() || self.key.contains(&at) {
                return Err(Error::Constraint(format!(
                    "a change of {} names column {at}, which is not one of its {} non-key \
                     columns",
                    self.name,
                    self.columns.len() - self.key.len()
                )));
            }
            self.check_value(at, value)?;
        }
        Ok(())
    }

    /// Checks a key given on its own (for a delete or a lookup): one value per key
    /// column, of its type.
    pub fn check_key(&self, key: &[Value]) -> Result<()> {
        if key.len() != self.key.len() {
            return Err(Error::Constraint(format!(
                "the key of {} has {} columns, not {}",
                self.name,
                self.key.len(),
                key.len()
            )));
        }
        for (&k, v) in self.key.iter().zip(key) {
            let c = &self.columns[k];
            if let Err(e) = c.column_type.check(v) {
                return Err(Error::Constraint(format!("{}.{}: {e}", self.name, c.name)));
            }
        }
        Ok(())
    }
}

/// One table: its definition and its rows by key.
#[derive(Debug, Clone)]
pub struct Table {
    pub def: Arc<TableDef>,
    pub rows: OrdMap<Key, Row>,
}

impl Table {
    /// Inserts a row, checked against the definition, unless its key is taken; returns
    /// its key.
    fn insert(&mut self, row: Row) -> Result<Key> {
        self.def.check_row(&row)?;
        let key = self.def.key_of(&row);
        // One walk down the tree: a duplicate is rare, and then put back.
        if let Some(old) = self.rows.insert(key.clone(), row) {
            self.rows.insert(key.clone(), old);
            return Err(Error::Constraint(format!(
                "duplicate key {key:?} in {}",
                self.def.name
            )));
        }
        Ok(key)
    }

    /// Every row, in key order, as owned values.
    pub fn to_rows(&self) -> Vec<Vec<Value>> {
        self.rows.values().map(|r| r.to_vec()).collect()
    }
}

/// One change to one row, as transactions make it and as physical log entries carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RowOp {
    /// Rows are shared: the row store, the transaction's redo and a secondary's
    /// columnar tail hold one copy.
    Insert {
        table: TableId,
        #[serde(with = "crate::value::shared_row")]
        row: Row,
    },
    /// Replaces the row with the same key (the key does not change).
    Update {
        table: TableId,
        #[serde(with = "crate::value::shared_row")]
        row: Row,
    },
    Delete {
        table: TableId,
        key: Vec<Value>,
    },
    /// An update as a physical log entry carries it: the key and the columns that
    /// changed (position, new value), never a key column. A TPC-C stock update changes
    /// 4 of 17 columns, so the log holds about a fifth of the row. Applying it reads the
    /// row, so a transaction's own operations are always whole rows.
    Patch {
        table: TableId,
        key: Vec<Value>,
        columns: Vec<(u32, Value)>,
    },
}

impl RowOp {
    /// The table it changes.
    pub fn table(&self) -> TableId {
        match self {
            RowOp::Insert { table, .. }
            | RowOp::Update { table, .. }
            | RowOp::Delete { table, .. }
            | RowOp::Patch { table, .. } => *table,
        }
    }

    /// The update that takes a row from `old` to `new` (same key, whose columns are
    /// `key`) as the log carries it: a [`RowOp::Patch`] of the changed columns when
    /// that names fewer values than the whole row, else the [`RowOp::Update`]. Values
    /// compare exactly (floats by their bits), so a replica never misses a change.
    pub fn update_for_log(table: TableId, key: &[usize], old: &[Value], new: &Row) -> RowOp {
        let changed: Vec<usize> = (0..new.len())
            .filter(|&i| old.get(i) != Some(&new[i]))
            .collect();
        if old.len() == new.len() && key.len() + changed.len() < new.len() {
            RowOp::Patch {
                table,
                key: key.iter().map(|&k| new[k].clone()).collect(),
                columns: changed
                    .into_iter()
                    .map(|i| (i as u32, new[i].clone()))
                    .collect(),
            }
        } else {
            RowOp::Update {
                table,
                row: Arc::clone(new),
            }
        }
    }
}

/// How to take a [`RowOp`] back.
#[derive(Debug)]
pub(crate) enum Undo {
    /// Puts back the row (with its key) an update replaced or a delete removed.
    Restore(TableId, Key, Row),
    Remove(TableId, Key),
    /// Puts back the values a patch replaced, given in the order it replaced them.
    Unpatch(TableId, Key, Vec<(u32, Value)>),
}

/// Every table, and the LSN of the last transaction applied to them. Cloning it is
/// O(1): the maps are persistent.
#[derive(Debug, Clone, Default)]
pub struct Store {
    tables: OrdMap<TableId, Table>,
    names: imbl::HashMap<String, TableId>,
    next_table: u32,
    /// A table whose rows arrive in several log entries (a bulk load): invisible until
    /// its last entry, never in a checkpoint (a load holds the primary throughout).
    loading: Option<Table>,
    /// The LSN of the last log entry applied (0: none yet).
    pub lsn: u64,
    /// The definitions of the tables that follow their files, by name
    /// ([`crate::log::Entry::FileTable`]).
    file_tables: OrdMap<String, Arc<[u8]>>,
}

impl Store {
    /// The definitions of the tables that follow their files, by name.
    pub fn file_tables(&self) -> impl Iterator<Item = (&String, &Arc<[u8]>)> {
        self.file_tables.iter()
    }

    /// Records (`Some`) or forgets (`None`) the definition of the table `name` that
    /// follows its files.
    pub fn set_file_table(&mut self, name: String, definition: Option<Vec<u8>>) {
        match definition {
            Some(d) => {
                self.file_tables.insert(name, d.into());
            }
            None => {
                self.file_tables.remove(&name);
            }
        }
    }

    pub fn table_id(&self, name: &str) -> Result<TableId> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| Error::NoSuchTable(name.to_string()))
    }

    pub fn table(&self, id: TableId) -> Result<&Table> {
        self.tables
            .get(&id)
            .ok_or_else(|| Error::NoSuchTable(format!("#{}", id.0)))
    }

    pub(crate) fn table_mut(&mut self, id: TableId) -> Result<&mut Table> {
        self.tables
            .get_mut(&id)
            .ok_or_else(|| Error::NoSuchTable(format!("#{}", id.0)))
    }

    /// Keeps only the rows of table `id` whose `keep` is true, one per row in key
    /// order.
    pub fn retain_rows(&mut self, id: TableId, keep: &[bool]) -> Result<()> {
        let t = self.table_mut(id)?;
        if keep.len() != t.rows.len() {
            return Err(Error::Constraint(format!(
                "{} rows of {} to keep or drop, not {}",
                t.rows.len(),
                t.def.name,
                keep.len()
            )));
        }
        t.rows = t
            .rows
            .iter()
            .zip(keep)
            .filter(|(_, keep)| **keep)
            .map(|((k, r), _)| (k.clone(), r.clone()))
            .collect();
        Ok(())
    }

    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.tables.values()
    }

    /// The id the next created table gets.
    pub fn next_table_id(&self) -> TableId {
        TableId(self.next_table)
    }

    /// Adds a table (checked); its id must be the next one, so that replay and the
    /// primary agree.
    pub fn create_table(&mut self, def: TableDef) -> Result<()> {
        self.check_new(&def)?;
        self.next_table = def.id.0 + 1;
        self.names.insert(def.name.clone(), def.id);
        self.tables.insert(
            def.id,
            Table {
                def: Arc::new(def),
                rows: OrdMap::new(),
            },
        );
        Ok(())
    }

    /// Whether `def` can be created: valid, its name free, its id the next one.
    fn check_new(&self, def: &TableDef) -> Result<()> {
        def.validate()?;
        let loading = self.loading.as_ref().map(|t| t.def.name.as_str());
        if self.names.contains_key(&def.name) || loading == Some(def.name.as_str()) {
            return Err(Error::TableExists(def.name.clone()));
        }
        if def.id.0 < self.next_table || self.tables.contains_key(&def.id) {
            return Err(Error::Constraint(format!(
                "table id {} of {} is taken",
                def.id.0, def.name
            )));
        }
        Ok(())
    }

    /// Starts loading a new table ([`crate::log::Entry::LoadBegin`]): checked as
    /// [`Store::create_table`] checks, its id taken, but not visible yet.
    pub(crate) fn begin_load(&mut self, def: TableDef) -> Result<()> {
        if let Some(t) = &self.loading {
            return Err(Error::Constraint(format!(
                "a load of {} starts while the load of {} is unfinished",
                def.name, t.def.name
            )));
        }
        self.check_new(&def)?;
        self.next_table = def.id.0 + 1;
        self.loading = Some(Table {
            def: Arc::new(def),
            rows: OrdMap::new(),
        });
        Ok(())
    }

    /// The definition of the table being loaded, if it is `id`.
    pub fn loading(&self, id: TableId) -> Result<&Arc<TableDef>> {
        match &self.loading {
            Some(t) if t.def.id == id => Ok(&t.def),
            _ => Err(Error::Constraint(format!(
                "rows for table #{} arrive, but no load of it is under way",
                id.0
            ))),
        }
    }

    /// Adds rows to the table being loaded, each checked as an insert is.
    pub(crate) fn load_rows(&mut self, id: TableId, rows: Vec<Vec<Value>>) -> Result<()> {
        self.loading(id)?;
        let t = self.loading.as_mut().expect("checked above");
        for row in rows {
            t.insert(row.into())?;
        }
        Ok(())
    }

    /// Ends the load of table `id`: with `commit` the table becomes visible with its
    /// rows, which are returned; otherwise it is discarded.
    pub(crate) fn end_load(&mut self, id: TableId, commit: bool) -> Result<Option<&Table>> {
        self.loading(id)?;
        let t = self.loading.take().expect("checked above");
        if !commit {
            return Ok(None);
        }
        self.names.insert(t.def.name.clone(), id);
        self.tables.insert(id, t);
        Ok(self.tables.get(&id))
    }

    /// The unfinished load, taken away (recovery drops it: it was never acknowledged).
    pub(crate) fn take_unfinished_load(&mut self) -> Option<Table> {
        self.loading.take()
    }

    /// Adds a table with its rows, as a checkpoint holds them.
    pub(crate) fn restore_table(&mut self, def: TableDef, rows: OrdMap<Key, Row>) -> Result<()> {
        let id = def.id;
        self.create_table(def)?;
        self.table_mut(id)?.rows = rows;
        Ok(())
    }

    pub(crate) fn set_next_table_id(&mut self, id: u32) {
        self.next_table = self.next_table.max(id);
    }

    pub fn drop_table(&mut self, id: TableId) -> Result<()> {
        let table = self
            .tables
            .remove(&id)
            .ok_or_else(|| Error::NoSuchTable(format!("#{}", id.0)))?;
        self.names.remove(&table.def.name);
        Ok(())
    }

    /// Applies one change, checked, and returns how to undo it and the change as
    /// applied: a [`RowOp::Patch`] becomes the whole-row update it stands for (what a
    /// transaction keeps, as the secondaries' columnar tables append whole rows). A
    /// patch is refused if its row is missing or it names a column out of range or
    /// part of the key (a log entry is checked like any input).
    pub(crate) fn apply(&mut self, op: RowOp) -> Result<(Undo, RowOp)> {
        match op {
            RowOp::Insert { table, row } => {
                let key = self.table_mut(table)?.insert(Arc::clone(&row))?;
                Ok((Undo::Remove(table, key), RowOp::Insert { table, row }))
            }
            RowOp::Update { table, row } => {
                let t = self.table_mut(table)?;
                t.def.check_row(&row)?;
                let key = t.def.key_of(&row);
                match t.rows.get_mut(&key) {
                    Some(old) => {
                        let old = std::mem::replace(old, Arc::clone(&row));
                        Ok((Undo::Restore(table, key, old), RowOp::Update { table, row }))
                    }
                    None => Err(Error::Constraint(format!(
                        "no row with key {key:?} in {} to update",
                        t.def.name
                    ))),
                }
            }
            RowOp::Patch {
                table,
                key,
                columns,
            } => {
                let t = self.table_mut(table)?;
                t.def.check_key(&key)?;
                let encoded = Key::encode(&key);
                let Some(row) = t.rows.get_mut(&encoded) else {
                    return Err(Error::Constraint(format!(
                        "no row with key {key:?} in {} to update",
                        t.def.name
                    )));
                };
                t.def.check_patch(&columns)?;
                // In place when nothing else holds the row (a secondary's replay: its
                // columnar tables copy rows in as they come), so that the row is
                // neither copied nor are its texts' counts touched; else a copy.
                let values = Arc::make_mut(row);
                let previous = columns
                    .into_iter()
                    .map(|(at, value)| (at, std::mem::replace(&mut values[at as usize], value)))
                    .collect();
                let row = Arc::clone(row);
                Ok((
                    Undo::Unpatch(table, encoded, previous),
                    RowOp::Update { table, row },
                ))
            }
            RowOp::Delete { table, key } => {
                let t = self.table_mut(table)?;
                t.def.check_key(&key)?;
                let encoded = Key::encode(&key);
                match t.rows.remove(&encoded) {
                    Some(old) => Ok((
                        Undo::Restore(table, encoded, old),
                        RowOp::Delete { table, key },
                    )),
                    None => Err(Error::Constraint(format!(
                        "no row with key {key:?} in {} to delete",
                        t.def.name
                    ))),
                }
            }
        }
    }

    /// Takes back one change made by [`Store::apply`] (in reverse order of applying).
    pub(crate) fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Restore(table, key, row) => {
                if let Some(t) = self.tables.get_mut(&table) {
                    t.rows.insert(key, row);
                }
            }
            Undo::Remove(table, key) => {
                if let Some(t) = self.tables.get_mut(&table) {
                    t.rows.remove(&key);
                }
            }
            Undo::Unpatch(table, key, previous) => {
                if let Some(row) = self
                    .tables
                    .get_mut(&table)
                    .and_then(|t| t.rows.get_mut(&key))
                {
                    let values = Arc::make_mut(row);
                    for (at, value) in previous.into_iter().rev() {
                        values[at as usize] = value;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::ColumnType;

    fn accounts() -> TableDef {
        TableDef {
            id: TableId(0),
            name: "accounts".into(),
            columns: vec![
                Column::new("id", ColumnType::Int64, false),
                Column::new("balance", ColumnType::Int64, true),
            ],
            key: vec![0],
            placement: Placement::Full,
        }
    }

    /// A definition from the log is hostile: a decimal Arrow cannot hold (a scale
    /// above its precision, a precision of 0 or above 38) is refused, naming the
    /// column, before a secondary builds a column of it.
    #[test]
    fn decimals_arrow_cannot_hold_are_refused() {
        for (precision, scale) in [(12, 18), (0, 0), (39, 2)] {
            let mut def = accounts();
            def.columns[1].column_type = ColumnType::Decimal { precision, scale };
            let e = def.validate().unwrap_err().to_string();
            assert!(e.contains("accounts: column balance"), "{e}");
            assert!(Store::default().create_table(def).is_err());
        }
        let mut def = accounts();
        def.columns[1].column_type = ColumnType::Decimal {
            precision: 38,
            scale: -2,
        };
        def.validate().unwrap();
    }

    #[test]
    fn apply_and_undo() {
        let mut s = Store::default();
        s.create_table(accounts()).unwrap();
        let t = TableId(0);
        let u1 = s
            .apply(RowOp::Insert {
                table: t,
                row: vec![Value::Int(1), Value::Int(10)].into(),
            })
            .unwrap();
        let dup = s.apply(RowOp::Insert {
            table: t,
            row: vec![Value::Int(1), Value::Int(11)].into(),
        });
        assert!(matches!(dup, Err(Error::Constraint(_))));
        // The refused insert left the row it collided with as it was.
        let key = Key::encode(&[Value::Int(1)]);
        assert_eq!(s.table(t).unwrap().rows[&key][1], Value::Int(10));
        let u2 = s
            .apply(RowOp::Update {
                table: t,
                row: vec![Value::Int(1), Value::Null].into(),
            })
            .unwrap();
        assert!(
            s.apply(RowOp::Insert {
                table: t,
                row: vec![Value::Null, Value::Int(1)].into(),
            })
            .is_err()
        );
        assert_eq!(s.table(t).unwrap().rows.len(), 1);
        s.undo(u2.0);
        assert_eq!(s.table(t).unwrap().rows[&key][1], Value::Int(10));
        s.undo(u1.0);
        assert!(s.table(t).unwrap().rows.is_empty());
    }

    #[test]
    fn updates_are_logged_as_the_columns_they_change() {
        let t = TableId(0);
        let key = [0];
        let old = [Value::Int(1), Value::Int(5), Value::Float(0.0), Value::Null];
        // One column of four: a patch. -0.0 is a change, as floats compare by bits.
        let new: Row = [
            Value::Int(1),
            Value::Int(5),
            Value::Float(-0.0),
            Value::Null,
        ]
        .into();
        assert_eq!(
            RowOp::update_for_log(t, &key, &old, &new),
            RowOp::Patch {
                table: t,
                key: vec![Value::Int(1)],
                columns: vec![(2, Value::Float(-0.0))],
            }
        );
        // Key and changes would name as many values as the row: the row.
        let most: Row = [
            Value::Int(1),
            Value::Int(6),
            Value::Float(1.0),
            Value::Int(0),
        ]
        .into();
        assert!(matches!(
            RowOp::update_for_log(t, &key, &old, &most),
            RowOp::Update { .. }
        ));
    }

    #[test]
    fn patches_change_only_non_key_columns_of_a_row_that_exists() {
        let mut s = Store::default();
        s.create_table(accounts()).unwrap();
        let t = TableId(0);
        s.apply(RowOp::Insert {
            table: t,
            row: vec![Value::Int(1), Value::Int(10)].into(),
        })
        .unwrap();
        let patch = |key: i64, at: u32, v: Value| RowOp::Patch {
            table: t,
            key: vec![Value::Int(key)],
            columns: vec![(at, v)],
        };
        let key = Key::encode(&[Value::Int(1)]);
        for (bad, why) in [
            (patch(1, 0, Value::Int(2)), "names column 0"),
            (patch(1, 2, Value::Int(2)), "names column 2"),
            (patch(2, 1, Value::Int(2)), "no row with key"),
            (patch(1, 1, Value::Text("x".into())), "balance"),
        ] {
            let err = s.apply(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert_eq!(s.table(t).unwrap().rows[&key][1], Value::Int(10));
        }
        let (undo, applied) = s.apply(patch(1, 1, Value::Int(11))).unwrap();
        assert_eq!(s.table(t).unwrap().rows[&key][1], Value::Int(11));
        // What the transaction keeps (and a secondary's columns append) is the row.
        assert_eq!(
            applied,
            RowOp::Update {
                table: t,
                row: vec![Value::Int(1), Value::Int(11)].into(),
            }
        );
        s.undo(undo);
        assert_eq!(s.table(t).unwrap().rows[&key][1], Value::Int(10));
    }

    /// A patch may name its columns in any order and one column twice: the columns
    /// apply in the order given, as one assignment after another would.
    #[test]
    fn a_patch_applies_its_columns_in_the_order_given() {
        let mut s = Store::default();
        let mut def = accounts();
        def.columns
            .push(Column::new("name", ColumnType::Text, true));
        def.columns
            .push(Column::new("limit", ColumnType::Int64, true));
        s.create_table(def).unwrap();
        let t = TableId(0);
        let row = |v: [Value; 4]| -> Row { v.into() };
        s.apply(RowOp::Insert {
            table: t,
            row: row([Value::Int(1), Value::Int(10), "a".into(), Value::Int(5)]),
        })
        .unwrap();
        let key = Key::encode(&[Value::Int(1)]);
        let patch = RowOp::Patch {
            table: t,
            key: vec![Value::Int(1)],
            columns: vec![
                (3, Value::Int(6)),
                (1, Value::Int(11)),
                (3, Value::Null),
                (1, Value::Int(12)),
            ],
        };
        let first = row([Value::Int(1), Value::Int(10), "a".into(), Value::Int(5)]);
        let want = row([Value::Int(1), Value::Int(12), "a".into(), Value::Null]);
        // Applied in place (nothing else holds the row), then undone in place.
        let at = Arc::as_ptr(&s.table(t).unwrap().rows[&key]);
        let (undo, applied) = s.apply(patch.clone()).unwrap();
        assert_eq!(Arc::as_ptr(&s.table(t).unwrap().rows[&key]), at);
        assert_eq!(
            applied,
            RowOp::Update {
                table: t,
                row: want.clone()
            }
        );
        drop(applied);
        s.undo(undo);
        assert_eq!(s.table(t).unwrap().rows[&key], first);
        assert_eq!(Arc::as_ptr(&s.table(t).unwrap().rows[&key]), at);
        // A row someone else holds (a reader's copy, a transaction's redo) is copied,
        // not changed under them.
        let held = Arc::clone(&s.table(t).unwrap().rows[&key]);
        let (undo, _) = s.apply(patch).unwrap();
        assert_eq!(s.table(t).unwrap().rows[&key], want);
        assert_eq!(held, first);
        s.undo(undo);
        assert_eq!(s.table(t).unwrap().rows[&key], first);
    }

    /// Rows are shared slices in memory and sequences in the log, encoded as the
    /// `Vec<Value>` they were before: logs written then still read.
    #[test]
    fn shared_rows_encode_as_vectors_did() {
        #[derive(Serialize)]
        enum Before {
            Insert { table: TableId, row: Vec<Value> },
            Update { table: TableId, row: Vec<Value> },
        }
        let row = vec![Value::Int(7), Value::Text("seven".into())];
        let pairs = [
            (
                RowOp::Insert {
                    table: TableId(3),
                    row: row.clone().into(),
                },
                Before::Insert {
                    table: TableId(3),
                    row: row.clone(),
                },
            ),
            (
                RowOp::Update {
                    table: TableId(3),
                    row: row.clone().into(),
                },
                Before::Update {
                    table: TableId(3),
                    row: row.clone(),
                },
            ),
        ];
        for (op, before) in pairs {
            let bytes = postcard::to_allocvec(&before).unwrap();
            assert_eq!(postcard::to_allocvec(&op).unwrap(), bytes);
            assert_eq!(postcard::from_bytes::<RowOp>(&bytes).unwrap(), op);
        }
    }

    #[test]
    fn definitions_are_checked() {
        let mut d = accounts();
        d.key = vec![];
        assert!(d.validate().is_err());
        d.key = vec![0, 0];
        assert!(d.validate().is_err());
        d.key = vec![2];
        assert!(d.validate().is_err());
        let mut s = Store::default();
        s.create_table(accounts()).unwrap();
        let mut again = accounts();
        again.id = TableId(1);
        assert!(matches!(s.create_table(again), Err(Error::TableExists(_))));
    }
}
