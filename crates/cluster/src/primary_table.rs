//! Transactional tables as DataFusion sees them: the primary's row store read as Arrow.
//!
//! A table created `WITH (replication = 'full')` lives in the primary's row store
//! ([`gyre_replica`]). A query reads it from one snapshot of that store, the same for
//! every table the statement reads: the last durable commit, or, inside a transaction,
//! the transaction's own state. The snapshot is taken when the statement is planned
//! and handed to the scans through the planning session ([`PrimarySnapshot`]); its rows
//! travel in the plan to wherever the scan runs.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Constraints, DataFusionError, Result};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use gyre_replica::columnar;
use gyre_replica::{Database, Store};
use std::sync::Arc;

/// Rows per record batch a scan produces.
const BATCH_ROWS: usize = 8192;

/// The state of the primary's tables a statement reads, attached to its planning
/// session.
#[derive(Debug, Clone)]
pub struct PrimarySnapshot(pub Arc<Store>);

/// The provider of one transactional table.
#[derive(Debug)]
pub struct PrimaryTable {
    pub name: String,
    pub schema: SchemaRef,
    pub constraints: Constraints,
    pub db: Arc<Database>,
}

impl PrimaryTable {
    /// The table's rows in `store`, as record batches of the table's schema.
    pub fn batches(&self, store: &Store) -> Result<Vec<RecordBatch>> {
        let id = store.table_id(&self.name).map_err(replica_err)?;
        let table = store.table(id).map_err(replica_err)?;
        let rows: Vec<&[gyre_replica::Value]> = table.rows.values().map(|r| &r[..]).collect();
        Ok(rows
            .chunks(BATCH_ROWS)
            .map(|chunk| columnar::to_batch(&table.def.columns, chunk.iter().copied()))
            .collect())
    }
}

#[async_trait]
impl TableProvider for PrimaryTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn constraints(&self) -> Option<&Constraints> {
        Some(&self.constraints)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let store = match state.config().get_extension::<PrimarySnapshot>() {
            Some(snapshot) => Arc::clone(&snapshot.0),
            None => self.db.snapshot(),
        };
        let batches = self.batches(&store)?;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            Arc::clone(&self.schema),
            projection.cloned(),
        )?)
    }
}

/// A row store error as DataFusion's: constraint violations and rollbacks are the
/// statement's fault, the rest the engine's.
pub fn replica_err(e: gyre_replica::Error) -> DataFusionError {
    DataFusionError::Execution(e.to_string())
}
