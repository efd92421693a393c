//! A worker's share of every table, held in memory.

use arrow::array::RecordBatch;
use arrow::compute::cast;
use arrow::datatypes::SchemaRef;
use datafusion::common::{Result, exec_err};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// The rows of one table that live on this worker.
#[derive(Debug, Clone)]
pub struct TablePart {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

/// Size figures of a table part, reported to the coordinator for planning.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartStats {
    pub rows: u64,
    /// In-memory bytes of each column.
    pub column_bytes: Vec<u64>,
}

impl TablePart {
    pub fn stats(&self) -> PartStats {
        let mut column_bytes = vec![0u64; self.schema.fields().len()];
        let mut rows = 0;
        for b in &self.batches {
            rows += b.num_rows() as u64;
            for (i, c) in b.columns().iter().enumerate() {
                column_bytes[i] += c.get_array_memory_size() as u64;
            }
        }
        PartStats { rows, column_bytes }
    }
}

/// `batch` with the column types of `schema` (the table `table`'s).
fn conform(batch: RecordBatch, schema: &SchemaRef, table: &str) -> Result<RecordBatch> {
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

/// Rows a query inserted, per table, not yet visible.
type StagedInserts = Vec<(String, Vec<RecordBatch>)>;

/// All table parts of a worker, plus inserts staged until their query commits.
#[derive(Debug, Default)]
pub struct WorkerStorage {
    tables: RwLock<HashMap<String, Arc<TablePart>>>,
    staged: Mutex<HashMap<u64, StagedInserts>>,
}

impl WorkerStorage {
    pub fn create_table(&self, name: &str, schema: SchemaRef) {
        self.tables.write().insert(
            name.to_string(),
            Arc::new(TablePart {
                schema,
                batches: vec![],
            }),
        );
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

    /// Keeps rows inserted by `query` aside until [`WorkerStorage::finish_query`],
    /// in the table's own column types: a plan may produce another physical type than
    /// its logical schema declares (a string expression as `Utf8View` where the table
    /// says `Utf8`), and every reader relies on the table's types.
    pub fn stage_insert(&self, query: u64, table: &str, batches: Vec<RecordBatch>) -> Result<()> {
        let schema = Arc::clone(&self.part(table)?.schema);
        let batches = batches
            .into_iter()
            .map(|b| conform(b, &schema, table))
            .collect::<Result<Vec<_>>>()?;
        self.staged
            .lock()
            .entry(query)
            .or_default()
            .push((table.to_string(), batches));
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
        for (name, batches) in staged {
            if let Some(part) = tables.get_mut(&name) {
                let mut new = TablePart::clone(part);
                new.batches.extend(batches);
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray, StringViewArray};
    use arrow::datatypes::{DataType, Field, Schema};

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
}
