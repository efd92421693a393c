//! Transactional tables as DataFusion sees them: the primary's row store read as Arrow.
//!
//! A table created `WITH (replication = 'full')` lives in the primary's row store
//! ([`gyre_replica`]) and, replayed from its log, on every worker. A query reads one
//! state of it, the same for every table the statement reads:
//!
//! - outside a transaction, a global snapshot on the workers: the primary's last
//!   snapshot transaction if nothing committed since the query arrived, else a new
//!   one marked for it ([`crate::snapshot_scan`]), so that no query sees a state older
//!   than one committed before it arrived. While another session's transaction holds
//!   the primary no snapshot can be marked, and the query reads the primary's last
//!   commit instead of waiting;
//! - inside a transaction, and where a change reads its input, the transaction's own
//!   state on the primary, whose rows travel in the plan to wherever the scan runs.
//!
//! The choice is made when the statement is planned and handed to the scans through
//! the planning session ([`PrimarySnapshot`]).

use crate::snapshot_scan::{SnapshotScanExec, SnapshotTable};
use crate::table::QueryWorkers;
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
pub struct PrimarySnapshot {
    /// The primary's state when the statement arrived (or its transaction's).
    pub store: Arc<Store>,
    /// Set when the statement reads on the workers: where it reads, chosen by its
    /// first scan.
    pub on_workers: Option<Arc<tokio::sync::OnceCell<ReadAt>>>,
}

/// Where a statement outside a transaction reads the transactional tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAt {
    /// On the workers, at the global snapshot with this LSN.
    Snapshot(u64),
    /// On the primary's state when the statement arrived: a transaction held the
    /// primary, so no snapshot could be marked, and a reader does not wait for it.
    Primary,
}

impl PrimarySnapshot {
    /// Reads `store` itself (a transaction's state, or a change's input).
    pub fn on_primary(store: Arc<Store>) -> Self {
        Self {
            store,
            on_workers: None,
        }
    }

    /// Reads on the workers, at a global snapshot at or after `store`'s LSN.
    pub fn on_workers(store: Arc<Store>) -> Self {
        Self {
            store,
            on_workers: Some(Arc::default()),
        }
    }
}

/// The provider of one transactional table.
#[derive(Debug)]
pub struct PrimaryTable {
    pub name: String,
    pub schema: SchemaRef,
    pub constraints: Constraints,
    pub db: Arc<Database>,
}

impl PrimaryTable {
    /// The table's rows in `store`, as record batches of the columns queries see.
    pub fn batches(&self, store: &Store) -> Result<Vec<RecordBatch>> {
        let id = store.table_id(&self.name).map_err(replica_err)?;
        let table = store.table(id).map_err(replica_err)?;
        let columns = table.def.visible_columns();
        let rows: Vec<&[gyre_replica::Value]> =
            table.rows.values().map(|r| &r[..columns.len()]).collect();
        Ok(rows
            .chunks(BATCH_ROWS)
            .map(|chunk| columnar::to_batch(columns, chunk.iter().copied()))
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
        let snapshot = match state.config().get_extension::<PrimarySnapshot>() {
            Some(snapshot) => snapshot,
            None => Arc::new(PrimarySnapshot::on_primary(self.db.snapshot())),
        };
        let db = Arc::clone(&self.db);
        let read_at = match &snapshot.on_workers {
            None => ReadAt::Primary,
            Some(chosen) => {
                *chosen
                    .get_or_try_init(|| async move {
                        let marked =
                            tokio::task::spawn_blocking(move || db.try_mark_snapshot_if_changed())
                                .await
                                .map_err(|e| {
                                    DataFusionError::Execution(format!("marking a snapshot: {e}"))
                                })?
                                .map_err(replica_err)?;
                        Ok::<_, DataFusionError>(marked.map_or(ReadAt::Primary, ReadAt::Snapshot))
                    })
                    .await?
            }
        };
        let ReadAt::Snapshot(lsn) = read_at else {
            let batches = self.batches(&snapshot.store)?;
            return Ok(MemorySourceConfig::try_new_exec(
                &[batches],
                Arc::clone(&self.schema),
                projection.cloned(),
            )?);
        };
        let store = &snapshot.store;
        let table = store
            .table_id(&self.name)
            .and_then(|id| store.table(id))
            .map_err(replica_err)?;
        let workers = QueryWorkers::of(state)?.0.len();
        // The replicas store a row id after the columns queries see: the scan reads
        // the stored columns and never outputs it.
        let projection = projection
            .cloned()
            .unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        let table = SnapshotTable {
            name: self.name.clone(),
            schema: table.def.schema(),
            key: table.def.key.clone(),
            placement: table.def.placement,
            rows: table.rows.len() as u64,
        };
        Ok(Arc::new(SnapshotScanExec::try_new(
            table,
            Some(projection),
            lsn,
            workers,
        )?))
    }
}

/// A row store error as DataFusion's: constraint violations and rollbacks are the
/// statement's fault, the rest the engine's.
pub fn replica_err(e: gyre_replica::Error) -> DataFusionError {
    DataFusionError::Execution(e.to_string())
}
