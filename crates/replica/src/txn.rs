//! The transaction handle stored procedures and interactive transactions work through.
//!
//! Transactions run one at a time on the primary (HyPer's serial execution), so a
//! [`Txn`] has the store to itself: reads see its own writes, and every write is applied
//! at once, with its undo kept in memory for a rollback and its [`RowOp`] kept for the
//! physical redo entry. Nothing is logged for a transaction that rolls back.

use crate::error::{Error, Result};
use crate::store::{Key, Row, RowOp, Store, Table, TableDef, TableId, Undo};
use crate::value::Value;
use std::cell::Cell;
use std::ops::Bound;

pub struct Txn<'a> {
    store: &'a mut Store,
    pending: Pending,
    /// Whether it read or wrote a table whose rows the secondaries split
    /// ([`crate::store::Placement::splits_rows`]).
    touched_partitioned: Cell<bool>,
}

/// What a transaction has done so far: kept apart from the store's borrow so that an
/// interactive transaction can hold it between statements.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    undo: Vec<Undo>,
    ops: Vec<RowOp>,
}

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl<'a> Txn<'a> {
    pub(crate) fn new(store: &'a mut Store) -> Self {
        Self::resume(store, Pending::default())
    }

    pub(crate) fn resume(store: &'a mut Store, pending: Pending) -> Self {
        Self {
            store,
            pending,
            touched_partitioned: Cell::new(false),
        }
    }

    /// The table `id`, noting whether it is partitioned.
    fn read(&self, id: TableId) -> Result<&Table> {
        let t = self.store.table(id)?;
        if t.def.placement.splits_rows() {
            self.touched_partitioned.set(true);
        }
        Ok(t)
    }

    /// Whether the transaction read or wrote a partitioned table: its outcome then
    /// depends on rows that a secondary holding part of that table does not have.
    pub fn touched_partitioned(&self) -> bool {
        self.touched_partitioned.get()
    }

    pub(crate) fn suspend(mut self) -> Pending {
        std::mem::take(&mut self.pending)
    }

    pub fn table(&self, name: &str) -> Result<TableId> {
        self.store.table_id(name)
    }

    pub fn def(&self, table: TableId) -> Result<&TableDef> {
        Ok(&self.read(table)?.def)
    }

    /// The row with this key, if there is one.
    pub fn get(&self, table: TableId, key: &[Value]) -> Result<Option<Row>> {
        let t = self.read(table)?;
        t.def.check_key(key)?;
        Ok(t.rows.get(&Key::encode(key)).cloned())
    }

    /// Rows whose keys lie between `lo` and `hi`, in key order.
    pub fn range<'s>(
        &'s self,
        table: TableId,
        lo: Bound<&[Value]>,
        hi: Bound<&[Value]>,
    ) -> Result<impl DoubleEndedIterator<Item = (&'s Key, &'s Row)> + 's> {
        let t = self.read(table)?;
        let bound = |b: Bound<&[Value]>| b.map(Key::encode);
        Ok(t.rows.range((bound(lo), bound(hi))))
    }

    /// Rows whose keys start with `prefix`, in key order (a shorter key sorts first, so
    /// they start at `prefix` itself).
    pub fn prefix<'s>(
        &'s self,
        table: TableId,
        prefix: &[Value],
    ) -> Result<impl DoubleEndedIterator<Item = (&'s Key, &'s Row)> + 's> {
        let t = self.read(table)?;
        Ok(t.rows.range((
            Bound::Included(Key::encode(prefix)),
            Bound::Excluded(Key::prefix_end(prefix)),
        )))
    }

    /// The row with the greatest key starting with `prefix` (the newest order of a
    /// customer, say), read from the end.
    pub fn last_with_prefix(&self, table: TableId, prefix: &[Value]) -> Result<Option<Row>> {
        Ok(self
            .prefix(table, prefix)?
            .next_back()
            .map(|(_, r)| r.clone()))
    }

    /// Every row of the table, in key order.
    pub fn scan(&self, table: TableId) -> Result<impl DoubleEndedIterator<Item = (&Key, &Row)>> {
        Ok(self.read(table)?.rows.iter())
    }

    /// Inserts a row. A table without a primary key numbers its rows: give the row
    /// without its row id and it gets the greatest one in the table plus one (which
    /// depends only on the table's state, so a procedure replays to the same numbers).
    pub fn insert(&mut self, table: TableId, mut row: Vec<Value>) -> Result<()> {
        let t = self.read(table)?;
        if t.def.has_row_id() && row.len() + 1 == t.def.columns.len() {
            let next = match t.rows.get_max() {
                None => 1,
                Some((_, last)) => last[t.def.key[0]]
                    .as_int()
                    .and_then(|id| id.checked_add(1))
                    .ok_or_else(|| {
                        Error::Constraint(format!("{}: row numbers are used up", t.def.name))
                    })?,
            };
            row.push(Value::Int(next));
        }
        self.apply_op(RowOp::Insert {
            table,
            row: row.into(),
        })
    }

    /// For each of `rows` (a row's values without its row id), the key of a distinct
    /// row of `table` holding these values: how a statement finds the rows it read in
    /// a table without a primary key. Equal rows are interchangeable, so it takes them
    /// in key order. An error if there are fewer such rows than asked for (the
    /// statement would change one row twice). Reads the whole table once.
    pub fn match_rows(&self, table: TableId, rows: &[Vec<Value>]) -> Result<Vec<Vec<Value>>> {
        let t = self.read(table)?;
        let width = t.def.visible_columns().len();
        let mut wanted: std::collections::HashMap<&[Value], Vec<usize>> =
            std::collections::HashMap::new();
        for (i, row) in rows.iter().enumerate().rev() {
            if row.len() != width {
                return Err(Error::Constraint(format!(
                    "{} has {width} columns, the row {}",
                    t.def.name,
                    row.len()
                )));
            }
            wanted.entry(&row[..]).or_default().push(i);
        }
        let mut keys: Vec<Option<Vec<Value>>> = vec![None; rows.len()];
        let mut left = rows.len();
        for (key, row) in t.rows.iter() {
            if left == 0 {
                break;
            }
            if let Some(waiting) = wanted.get_mut(&row[..width])
                && let Some(i) = waiting.pop()
            {
                keys[i] = Some(key.values());
                left -= 1;
            }
        }
        keys.into_iter()
            .zip(rows)
            .map(|(key, row)| {
                key.ok_or_else(|| {
                    Error::Constraint(format!(
                        "the statement changes the row {row:?} of {} more often than the \
                         table holds it",
                        t.def.name
                    ))
                })
            })
            .collect()
    }

    /// Replaces the row that has the same key; an error if there is none.
    pub fn update(&mut self, table: TableId, row: Vec<Value>) -> Result<()> {
        self.apply_op(RowOp::Update {
            table,
            row: row.into(),
        })
    }

    /// Sets some columns (position, value) of the row with this key; an error if there
    /// is none, or a column is out of range or part of the key. Only those values are
    /// checked, and the row changes in place when nothing else holds it (let go of the
    /// row you read first); an update copies the whole row, a TPC-C stock row's ten
    /// texts with it, to change four integers.
    pub fn patch(
        &mut self,
        table: TableId,
        key: &[Value],
        columns: Vec<(u32, Value)>,
    ) -> Result<()> {
        self.apply_op(RowOp::Patch {
            table,
            key: key.to_vec(),
            columns,
        })
    }

    /// Deletes the row with this key; false if there was none.
    pub fn delete(&mut self, table: TableId, key: &[Value]) -> Result<bool> {
        if self.get(table, key)?.is_none() {
            return Ok(false);
        }
        self.apply_op(RowOp::Delete {
            table,
            key: key.to_vec(),
        })?;
        Ok(true)
    }

    pub(crate) fn apply_op(&mut self, op: RowOp) -> Result<()> {
        self.read(op.table())?;
        let (undo, op) = self.store.apply(op)?;
        self.pending.undo.push(undo);
        self.pending.ops.push(op);
        Ok(())
    }

    /// Whether the transaction changed anything (only such transactions are logged).
    pub fn is_empty(&self) -> bool {
        self.pending.ops.is_empty()
    }

    /// The row operations made so far as a physical redo entry carries them: each
    /// update as the columns it changed ([`RowOp::update_for_log`]).
    pub(crate) fn log_ops(&self) -> Vec<RowOp> {
        self.pending
            .ops
            .iter()
            .zip(&self.pending.undo)
            .map(|(op, undo)| match (op, undo) {
                (RowOp::Update { table, row }, Undo::Restore(_, _, old)) => {
                    let t = self.store.table(*table);
                    let t = t.expect("a table the transaction updated");
                    RowOp::update_for_log(*table, &t.def.key, old, row)
                }
                // A patch logs as what it set.
                (RowOp::Update { table, row }, Undo::Unpatch(_, _, previous)) => {
                    let t = self.store.table(*table);
                    let t = t.expect("a table the transaction updated");
                    RowOp::Patch {
                        table: *table,
                        key: t.def.key.iter().map(|&k| row[k].clone()).collect(),
                        columns: previous
                            .iter()
                            .map(|(at, _)| (*at, row[*at as usize].clone()))
                            .collect(),
                    }
                }
                (op, _) => op.clone(),
            })
            .collect()
    }

    /// Forgets the undo: the transaction committed.
    pub(crate) fn take_ops(&mut self) -> Vec<RowOp> {
        self.pending.undo.clear();
        std::mem::take(&mut self.pending.ops)
    }

    /// Forgets the undo, as [`Txn::take_ops`] does, keeping each change's key as the
    /// row store encoded it: a secondary's columnar tables look the same key up.
    pub(crate) fn take_changes(&mut self) -> Vec<(RowOp, Key)> {
        let undo = std::mem::take(&mut self.pending.undo);
        std::mem::take(&mut self.pending.ops)
            .into_iter()
            .zip(undo)
            .map(|(op, undo)| match undo {
                Undo::Restore(_, key, _) | Undo::Remove(_, key) | Undo::Unpatch(_, key, _) => {
                    (op, key)
                }
            })
            .collect()
    }

    /// The store, for the commit that follows.
    pub(crate) fn store(&mut self) -> &mut Store {
        self.store
    }

    /// Takes back every change, newest first.
    pub(crate) fn rollback(&mut self) {
        while let Some(u) = self.pending.undo.pop() {
            self.store.undo(u);
        }
        self.pending.ops.clear();
    }

    /// Runs `body` on this transaction; a panic in it becomes an error, so that the
    /// caller rolls back instead of unwinding past the primary's lock.
    pub(crate) fn run_guarded<R>(
        &mut self,
        what: &str,
        body: impl FnOnce(&mut Txn<'_>) -> Result<R>,
    ) -> Result<R> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(self))) {
            Ok(out) => out,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Error::Aborted(format!("{what} panicked: {message}")))
            }
        }
    }

    /// An error that makes the caller roll the transaction back, with a reason.
    pub fn abort(reason: impl Into<String>) -> Error {
        Error::Aborted(reason.into())
    }
}

/// A transaction dropped before it committed (an error returned early, a panic) takes
/// its writes back, so the store never keeps part of one.
impl Drop for Txn<'_> {
    fn drop(&mut self) {
        self.rollback();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Placement;
    use crate::value::{Column, ColumnType};
    use std::sync::Arc;

    fn store_with_one_row() -> Store {
        let mut s = Store::default();
        s.create_table(TableDef {
            id: TableId(0),
            name: "stock".into(),
            columns: vec![
                Column::new("id", ColumnType::Int64, false),
                Column::new("quantity", ColumnType::Int64, false),
                Column::new("info", ColumnType::Text, true),
            ],
            key: vec![0],
            placement: Placement::Full,
        })
        .unwrap();
        let mut txn = Txn::new(&mut s);
        txn.insert(
            TableId(0),
            vec![Value::Int(1), Value::Int(10), Value::Text("a".into())],
        )
        .unwrap();
        txn.take_ops();
        drop(txn);
        s
    }

    /// A patch sets only the columns it names, in place when nothing else holds the
    /// row; it is logged as those columns; it refuses key columns, columns out of
    /// range, values of the wrong type and missing rows; a rollback puts the values
    /// back.
    #[test]
    fn a_patch_sets_its_columns_in_place_and_logs_only_them() {
        let mut s = store_with_one_row();
        let t = TableId(0);
        let key = [Value::Int(1)];
        let before = Arc::as_ptr(&s.table(t).unwrap().rows[&Key::encode(&key)]);
        let mut txn = Txn::new(&mut s);
        txn.patch(t, &key, vec![(1, Value::Int(7))]).unwrap();
        let row = txn.get(t, &key).unwrap().unwrap();
        assert_eq!(
            &row[..],
            &[Value::Int(1), Value::Int(7), Value::Text("a".into())]
        );
        assert_eq!(Arc::as_ptr(&row), before, "changed in place");
        drop(row);
        assert_eq!(
            txn.log_ops(),
            vec![RowOp::Patch {
                table: t,
                key: key.to_vec(),
                columns: vec![(1, Value::Int(7))],
            }]
        );
        for bad in [
            vec![(0, Value::Int(2))],
            vec![(3, Value::Int(2))],
            vec![(1, Value::Text("x".into()))],
        ] {
            assert!(txn.patch(t, &key, bad.clone()).is_err(), "{bad:?}");
        }
        assert!(
            txn.patch(t, &[Value::Int(2)], vec![(1, Value::Int(2))])
                .is_err()
        );
        txn.rollback();
        let row = txn.get(t, &key).unwrap().unwrap();
        assert_eq!(row[1], Value::Int(10));
    }
}
