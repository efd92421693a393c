//! A worker's share of every table, held in memory.

use crate::column_stats::{ColumnSketch, sketch_columns};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::{BatchCoalescer, cast};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{Result, exec_err};
use datafusion::physical_plan::execution_plan::check_not_null_constraints;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// The rows of one table that live on this worker.
#[derive(Debug, Clone)]
pub struct TablePart {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// One per column, over `batches`: extended as rows are appended.
    pub sketches: Vec<ColumnSketch>,
}

/// Size figures of a table part, reported to the coordinator for planning.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartStats {
    pub rows: u64,
    /// In-memory bytes of each column.
    pub column_bytes: Vec<u64>,
    /// Per column: what the planner's estimates need (see [`crate::column_stats`]).
    pub columns: Vec<ColumnSketch>,
}

impl TablePart {
    fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        let sketches = sketch_columns(&batches, &schema);
        Self {
            schema,
            batches,
            sketches,
        }
    }

    /// Appends committed rows and adds them to the column sketches.
    fn append(&mut self, batches: Vec<RecordBatch>) {
        let added = sketch_columns(&batches, &self.schema);
        for ((sketch, extra), field) in self
            .sketches
            .iter_mut()
            .zip(&added)
            .zip(self.schema.fields())
        {
            sketch.merge(extra, field.data_type());
        }
        self.batches.extend(batches);
    }

    /// Rows and bytes, without the column sketches.
    fn size(&self) -> (u64, u64) {
        let stats = self.sizes();
        (stats.0, stats.1.iter().sum())
    }

    fn sizes(&self) -> (u64, Vec<u64>) {
        let mut column_bytes = vec![0u64; self.schema.fields().len()];
        let mut rows = 0;
        for b in &self.batches {
            rows += b.num_rows() as u64;
            for (i, c) in b.columns().iter().enumerate() {
                column_bytes[i] += column_bytes_of(c.as_ref());
            }
        }
        (rows, column_bytes)
    }

    pub fn stats(&self) -> PartStats {
        let (rows, column_bytes) = self.sizes();
        PartStats {
            rows,
            column_bytes,
            columns: self.sketches.clone(),
        }
    }
}

/// The bytes of `column`'s own rows. Batches read from files are often slices of one
/// larger decoded buffer, and a slice's `get_array_memory_size` is the whole buffer's:
/// summed over the slices, a table would seem many times its size to the planner.
fn column_bytes_of(column: &dyn Array) -> u64 {
    // A view holds strings of up to 12 bytes itself; longer ones live in data
    // buffers, which Arrow's slice size leaves out.
    let views = match column.data_type() {
        DataType::Utf8View => Some(column.as_string_view().views()),
        DataType::BinaryView => Some(column.as_binary_view().views()),
        _ => None,
    };
    let outside_views: usize = views.map_or(0, |views| {
        views
            .iter()
            .map(|&v| v as u32 as usize)
            .filter(|&len| len > 12)
            .sum()
    });
    let own = column
        .to_data()
        .get_slice_memory_size()
        .unwrap_or_else(|_| column.get_array_memory_size());
    (own + outside_views) as u64
}

/// `batch` with the column types of `schema` (the table `table`'s), refused when a
/// column declared NOT NULL holds a null (in DataFusion's words).
fn conform(batch: RecordBatch, schema: &SchemaRef, table: &str) -> Result<RecordBatch> {
    if batch.num_columns() == schema.fields().len() {
        let not_null: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| !schema.field(i).is_nullable())
            .collect();
        let batch = check_not_null_constraints(batch, &not_null)?;
        return conform_types(batch, schema, table);
    }
    conform_types(batch, schema, table)
}

fn conform_types(batch: RecordBatch, schema: &SchemaRef, table: &str) -> Result<RecordBatch> {
    if batch.schema().fields().len() != schema.fields().len() {
        return exec_err!(
            "{} columns inserted into table '{table}' of {} columns",
            batch.num_columns(),
            schema.fields().len()
        );
    }
    if batch
        .schema()
        .fields()
        .iter()
        .zip(schema.fields())
        .all(|(a, b)| a.data_type() == b.data_type())
    {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                return Ok(Arc::clone(c));
            }
            cast(c, f.data_type()).or_else(|e| {
                exec_err!(
                    "cannot store a {} column in column {} ({}) of table '{table}': {e}",
                    c.data_type(),
                    f.name(),
                    f.data_type()
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// A change a query made to a table part, not yet visible.
#[derive(Debug)]
enum Staged {
    /// Rows inserted.
    Append(Vec<RecordBatch>),
    /// The part's rows after a delete or update of the part `base`.
    Replace {
        base: Arc<TablePart>,
        batches: Vec<RecordBatch>,
    },
}

/// The changes of one query, per table, in the order they were made.
type StagedInserts = Vec<(String, Staged)>;

/// All table parts of a worker, plus inserts staged until their query commits.
#[derive(Debug, Default)]
pub struct WorkerStorage {
    tables: RwLock<HashMap<String, Arc<TablePart>>>,
    staged: Mutex<HashMap<u64, StagedInserts>>,
}

impl WorkerStorage {
    pub fn create_table(&self, name: &str, schema: SchemaRef) {
        self.tables
            .write()
            .insert(name.to_string(), Arc::new(TablePart::new(schema, vec![])));
    }

    pub fn drop_table(&self, name: &str) {
        self.tables.write().remove(name);
    }

    pub fn part(&self, name: &str) -> Result<Arc<TablePart>> {
        match self.tables.read().get(name) {
            Some(p) => Ok(Arc::clone(p)),
            None => exec_err!("table '{name}' has no partition on this worker"),
        }
    }

    pub fn table_names(&self) -> Vec<String> {
        self.tables.read().keys().cloned().collect()
    }

    /// Table parts held: (count, rows, in-memory bytes).
    pub fn held(&self) -> (u64, u64, u64) {
        let tables = self.tables.read();
        let (mut rows, mut bytes) = (0, 0);
        for part in tables.values() {
            let (r, b) = part.size();
            rows += r;
            bytes += b;
        }
        (tables.len() as u64, rows, bytes)
    }

    /// Keeps rows inserted by `query` aside (in batches of at most about
    /// [`STORED_BATCH_ROWS`] rows) until [`WorkerStorage::finish_query`],
    /// in the table's own column types: a plan may produce another physical type than
    /// its logical schema declares (a string expression as `Utf8View` where the table
    /// says `Utf8`), and every reader relies on the table's types.
    pub fn stage_insert(&self, query: u64, table: &str, batches: Vec<RecordBatch>) -> Result<()> {
        let schema = Arc::clone(&self.part(table)?.schema);
        let batches = batches
            .into_iter()
            .map(|b| conform(b, &schema, table))
            .collect::<Result<Vec<_>>>()?;
        let batches = in_stored_sizes(batches)?;
        self.staged
            .lock()
            .entry(query)
            .or_default()
            .push((table.to_string(), Staged::Append(batches)));
        Ok(())
    }

    /// Keeps the rows a delete or update by `query` left of the part `base` aside until
    /// [`WorkerStorage::finish_query`]. Rows inserted into the table after `base` was
    /// read are kept on commit (the coordinator runs one delete or update at a time).
    pub fn stage_replace(
        &self,
        query: u64,
        table: &str,
        base: Arc<TablePart>,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        self.staged
            .lock()
            .entry(query)
            .or_default()
            .push((table.to_string(), Staged::Replace { base, batches }));
        Ok(())
    }

    /// Makes the rows staged by `query` visible (commit) or discards them.
    /// Returns the new stats of every table that changed.
    pub fn finish_query(&self, query: u64, commit: bool) -> Vec<(String, PartStats)> {
        let Some(staged) = self.staged.lock().remove(&query) else {
            return vec![];
        };
        if !commit {
            return vec![];
        }
        let mut tables = self.tables.write();
        let mut changed = vec![];
        for (name, change) in staged {
            if let Some(part) = tables.get_mut(&name) {
                let new = match change {
                    Staged::Append(batches) => {
                        let mut new = TablePart::clone(part);
                        new.append(batches);
                        new
                    }
                    Staged::Replace { base, mut batches } => {
                        // Inserts only append: what the part holds beyond `base` came
                        // after the change was computed and stays.
                        batches.extend(appended_since(&base, part));
                        TablePart::new(Arc::clone(&part.schema), batches)
                    }
                };
                *part = Arc::new(new);
                if !changed.contains(&name) {
                    changed.push(name);
                }
            }
        }
        changed
            .into_iter()
            .map(|n| {
                let s = tables[&n].stats();
                (n, s)
            })
            .collect()
    }
}

/// The batches `now` holds beyond those of `base`, when `now` is `base` with batches
/// appended (none otherwise).
fn appended_since(base: &TablePart, now: &TablePart) -> Vec<RecordBatch> {
    let extends = now.batches.len() >= base.batches.len()
        && base.batches.iter().zip(&now.batches).all(|(a, b)| {
            a.num_rows() == b.num_rows()
                && a.columns()
                    .iter()
                    .zip(b.columns())
                    .all(|(x, y)| Arc::ptr_eq(x, y))
        });
    if extends {
        now.batches[base.batches.len()..].to_vec()
    } else {
        vec![]
    }
}

/// Rows of a stored batch (DataFusion's batch size): exchanges deliver rows in batches
/// as large as their messages, and an operator reserves memory for a whole batch at a
/// time, so a sort under a worker's memory limit could not spill in steps smaller
/// than several megabytes. Larger batches are copied into batches of this size once,
/// when they are inserted.
pub const STORED_BATCH_ROWS: usize = 8192;

fn in_stored_sizes(batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    if batches
        .iter()
        .all(|b| b.num_rows() <= 2 * STORED_BATCH_ROWS)
    {
        return Ok(batches);
    }
    let mut out = Vec::with_capacity(batches.len());
    for batch in batches {
        if batch.num_rows() <= 2 * STORED_BATCH_ROWS {
            out.push(batch);
            continue;
        }
        let mut chunks = BatchCoalescer::new(batch.schema(), STORED_BATCH_ROWS);
        chunks.push_batch(batch)?;
        chunks.finish_buffered_batch()?;
        while let Some(chunk) = chunks.next_completed_batch() {
            out.push(chunk);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int32Array, StringArray, StringViewArray};
    use arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn column_sizes_count_a_slice_s_own_rows() {
        let ints: ArrayRef = Arc::new(Int32Array::from_iter_values(0..1000));
        let long = "a string longer than twelve bytes";
        let views: ArrayRef = Arc::new(StringViewArray::from_iter_values(
            (0..1000).map(|i| if i % 2 == 0 { "short" } else { long }),
        ));
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int32, false),
            Field::new("s", DataType::Utf8View, false),
        ]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![ints, views]).unwrap();
        // Ten slices of one batch, as a file reader hands them out.
        let slices: Vec<RecordBatch> = (0..10).map(|i| batch.slice(i * 100, 100)).collect();
        let part = TablePart::new(schema, slices);
        let (rows, bytes) = part.sizes();
        assert_eq!(rows, 1000);
        assert_eq!(bytes[0], 4000);
        assert_eq!(bytes[1], 16 * 1000 + 500 * long.len() as u64);
    }

    #[test]
    fn inserted_rows_take_the_tables_column_types() {
        let storage = WorkerStorage::default();
        let table = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        storage.create_table("t", Arc::clone(&table));
        let view = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("s", DataType::Utf8View, true),
        ]));
        let batch = RecordBatch::try_new(
            view,
            vec![
                Arc::new(Int32Array::from(vec![1, 2])),
                Arc::new(StringViewArray::from(vec![Some("x"), None])),
            ],
        )
        .unwrap();
        storage.stage_insert(7, "t", vec![batch]).unwrap();
        storage.finish_query(7, true);
        let part = storage.part("t").unwrap();
        assert_eq!(part.batches[0].schema(), table);
        assert_eq!(
            part.batches[0].column(1).as_ref(),
            &StringArray::from(vec![Some("x"), None]) as &dyn arrow::array::Array
        );
        let wrong = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)])),
            vec![Arc::new(Int32Array::from(vec![1]))],
        )
        .unwrap();
        let e = storage.stage_insert(8, "t", vec![wrong]).unwrap_err();
        assert!(
            e.to_string().contains("1 columns inserted into table 't'"),
            "{e}"
        );
        assert!(storage.stage_insert(9, "missing", vec![]).is_err());
    }

    #[test]
    fn a_replaced_part_keeps_rows_inserted_after_it_was_read() {
        let storage = WorkerStorage::default();
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true)]));
        storage.create_table("t", Arc::clone(&schema));
        let rows = |v: Vec<i32>| {
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int32Array::from(v))]).unwrap()
        };
        storage
            .stage_insert(1, "t", vec![rows(vec![1, 2])])
            .unwrap();
        storage.finish_query(1, true);
        let base = storage.part("t").unwrap();
        // A delete of 2 computed from `base`; meanwhile 3 is inserted and committed.
        storage
            .stage_replace(2, "t", Arc::clone(&base), vec![rows(vec![1])])
            .unwrap();
        storage.stage_insert(3, "t", vec![rows(vec![3])]).unwrap();
        storage.finish_query(3, true);
        let changed = storage.finish_query(2, true);
        assert_eq!(changed[0].1.rows, 2);
        let part = storage.part("t").unwrap();
        let values: Vec<i32> = part
            .batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(values, vec![1, 3]);
        // A discarded change leaves the part alone.
        storage
            .stage_replace(4, "t", storage.part("t").unwrap(), vec![])
            .unwrap();
        storage.finish_query(4, false);
        assert_eq!(storage.part("t").unwrap().stats().rows, 2);
    }
}
