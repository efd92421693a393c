//! A worker's share of every table, held in memory.

use arrow::array::RecordBatch;
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

    /// Keeps rows inserted by `query` aside until [`WorkerStorage::finish_query`].
    pub fn stage_insert(&self, query: u64, table: &str, batches: Vec<RecordBatch>) {
        self.staged
            .lock()
            .entry(query)
            .or_default()
            .push((table.to_string(), batches));
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
