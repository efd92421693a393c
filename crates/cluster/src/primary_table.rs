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
//! The planning session hands the choice to the scans ([`PrimarySnapshot`]). Outside
//! a transaction the statement's first scan makes it, once for all of them: a
//! statement that reads no transactional table (a `CALL`) asks the primary for
//! nothing, as a copy of its state costs the transactions after it.

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
pub enum PrimarySnapshot {
    /// This state, read on the primary: a transaction's own, or a change's input.
    OnPrimary(Arc<Store>),
    /// Outside a transaction: where the statement reads, chosen by its first scan.
    Chosen(Arc<tokio::sync::OnceCell<Choice>>),
}

/// Where a statement outside a transaction reads, and the primary's state it plans
/// with.
#[derive(Debug)]
pub struct Choice {
    pub at: ReadAt,
    /// At [`ReadAt::Primary`] the state read; at a snapshot, the tables' definitions
    /// (as of the snapshot or later).
    pub store: Arc<Store>,
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
    /// Reads on the workers, at a global snapshot at least as new as the last commit
    /// when the first scan is planned.
    pub fn on_workers() -> Self {
        Self::Chosen(Arc::default())
    }

    /// The state `db` reads on the primary for this statement: its own state, or the
    /// last commit (once durable).
    pub async fn on_primary_store(&self, db: &Arc<Database>) -> Result<Arc<Store>> {
        match self {
            Self::OnPrimary(store) => Ok(Arc::clone(store)),
            Self::Chosen(_) => last_commit(db).await,
        }
    }

    /// Where the statement reads and the state it plans with, chosen once.
    async fn choose(&self, db: &Arc<Database>) -> Result<(ReadAt, Arc<Store>)> {
        let chosen = match self {
            Self::OnPrimary(store) => return Ok((ReadAt::Primary, Arc::clone(store))),
            Self::Chosen(chosen) => chosen,
        };
        let db = Arc::clone(db);
        let choice = chosen
            .get_or_try_init(|| {
                blocking(move || {
                    Ok(
                        match db.try_mark_snapshot_if_changed().map_err(replica_err)? {
                            Some(lsn) => Choice {
                                at: ReadAt::Snapshot(lsn),
                                store: db.catalog(),
                            },
                            None => Choice {
                                at: ReadAt::Primary,
                                store: db.snapshot(),
                            },
                        },
                    )
                })
            })
            .await?;
        Ok((choice.at, Arc::clone(&choice.store)))
    }
}

/// The primary's state as of its last commit ([`Database::snapshot`]), once it
/// confirmed that it still leads.
async fn last_commit(db: &Arc<Database>) -> Result<Arc<Store>> {
    let db = Arc::clone(db);
    blocking(move || {
        db.confirm_lead().map_err(replica_err)?;
        Ok(db.snapshot())
    })
    .await
}

/// Runs `f`, which may wait for the primary's lock or its log, off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DataFusionError::Execution(format!("reading the primary: {e}")))?
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
        let (read_at, store) = match state.config().get_extension::<PrimarySnapshot>() {
            Some(snapshot) => snapshot.choose(&self.db).await?,
            None => (ReadAt::Primary, last_commit(&self.db).await?),
        };
        let ReadAt::Snapshot(lsn) = read_at else {
            let batches = self.batches(&store)?;
            return Ok(MemorySourceConfig::try_new_exec(
                &[batches],
                Arc::clone(&self.schema),
                projection.cloned(),
            )?);
        };
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
