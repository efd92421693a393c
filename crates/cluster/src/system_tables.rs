//! The cluster's own figures as table functions, for people watching a cluster and
//! for benchmarks, which read them before and after what they measure:
//!
//! - `gyre_workers()`: the live workers and their counters (what each spent on a
//!   query, how each follows the primary's log);
//! - `gyre_primary()`: the primary's log and the transactions it ran.

use crate::coordinator::{Coordinator, PrimaryFigures};
use crate::protocol::WorkerStats;
use arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, internal_datafusion_err, plan_err};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::BoxFuture;
use std::sync::{Arc, Weak};

/// A table function without arguments whose one batch the coordinator makes when it is
/// scanned. It holds the coordinator weakly, as the coordinator holds it.
pub struct SystemTable {
    pub name: &'static str,
    schema: fn() -> SchemaRef,
    rows: for<'a> fn(&'a Coordinator) -> BoxFuture<'a, Result<RecordBatch>>,
    coordinator: Weak<Coordinator>,
}

impl std::fmt::Debug for SystemTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}()", self.name)
    }
}

/// Every system table of `coordinator`.
pub fn all(coordinator: &Weak<Coordinator>) -> Vec<Arc<SystemTable>> {
    let table = |name, schema, rows| {
        Arc::new(SystemTable {
            name,
            schema,
            rows,
            coordinator: Weak::clone(coordinator),
        })
    };
    vec![
        table(WORKERS, workers_schema, |c| Box::pin(workers_batch(c))),
        table(PRIMARY, primary_schema, |c| {
            Box::pin(async { primary_batch(&c.primary_figures()) })
        }),
    ]
}

impl TableFunctionImpl for SystemTable {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        if !args.is_empty() {
            return plan_err!("{}() takes no arguments, got {}", self.name, args.len());
        }
        Ok(Arc::new(SystemScan {
            schema: (self.schema)(),
            rows: self.rows,
            coordinator: Weak::clone(&self.coordinator),
        }))
    }
}

/// The name `gyre_workers()` is called by.
pub const WORKERS: &str = "gyre_workers";

/// The name `gyre_primary()` is called by.
pub const PRIMARY: &str = "gyre_primary";

/// The columns of `gyre_workers()`.
pub fn workers_schema() -> SchemaRef {
    let u64 = |name: &str| Field::new(name, DataType::UInt64, false);
    Arc::new(Schema::new(vec![
        Field::new("worker", DataType::UInt32, false),
        Field::new("address", DataType::Utf8, false),
        Field::new("cpu_seconds", DataType::Float64, true),
        u64("bytes_sent"),
        u64("bytes_received"),
        u64("tables"),
        u64("rows"),
        u64("table_bytes"),
        u64("queries"),
        // Its replica of the transactional tables.
        u64("replayed_lsn"),
        u64("replica_rows"),
        // Bytes of the primary's state received to start replicas from.
        u64("replica_state_bytes"),
        u64("replayed_entries"),
        Field::new("replay_seconds", DataType::Float64, false),
        Field::new("replay_lag_ms_p99", DataType::Float64, true),
        Field::new("snapshot_wait_ms_p50", DataType::Float64, true),
    ]))
}

/// The columns of `gyre_primary()`.
pub fn primary_schema() -> SchemaRef {
    let u64 = |name: &str| Field::new(name, DataType::UInt64, false);
    Arc::new(Schema::new(vec![
        u64("lsn"),
        u64("durable_lsn"),
        u64("log_entries"),
        u64("log_raw_bytes"),
        u64("log_written_bytes"),
        u64("calls_committed"),
        Field::new("call_seconds", DataType::Float64, false),
        u64("secondaries"),
    ]))
}

struct SystemScan {
    schema: SchemaRef,
    rows: for<'a> fn(&'a Coordinator) -> BoxFuture<'a, Result<RecordBatch>>,
    coordinator: Weak<Coordinator>,
}

impl std::fmt::Debug for SystemScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemScan").finish()
    }
}

#[async_trait]
impl TableProvider for SystemScan {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let coordinator = self
            .coordinator
            .upgrade()
            .ok_or_else(|| internal_datafusion_err!("the coordinator is shutting down"))?;
        let batch = (self.rows)(&coordinator).await?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            Arc::clone(&self.schema),
            projection.cloned(),
        )?)
    }
}

fn primary_batch(p: &PrimaryFigures) -> Result<RecordBatch> {
    let u64 = |v: u64| -> ArrayRef { Arc::new(UInt64Array::from(vec![v])) };
    let columns: Vec<ArrayRef> = vec![
        u64(p.lsn),
        u64(p.durable_lsn),
        u64(p.log.entries),
        u64(p.log.raw_bytes),
        u64(p.log.written_bytes),
        u64(p.calls),
        Arc::new(Float64Array::from(vec![p.call_seconds])),
        u64(p.secondaries as u64),
    ];
    Ok(RecordBatch::try_new(primary_schema(), columns)?)
}

async fn workers_batch(c: &Coordinator) -> Result<RecordBatch> {
    batch(&c.worker_stats().await?)
}

fn batch(workers: &[(u32, String, WorkerStats)]) -> Result<RecordBatch> {
    let u64s = |f: fn(&WorkerStats) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(
            workers.iter().map(|(_, _, s)| f(s)),
        ))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(workers.iter().map(|w| w.0))),
        Arc::new(StringArray::from_iter_values(
            workers.iter().map(|w| w.1.as_str()),
        )),
        Arc::new(Float64Array::from_iter(
            workers.iter().map(|(_, _, s)| s.cpu_seconds),
        )),
        u64s(|s| s.bytes_sent),
        u64s(|s| s.bytes_received),
        u64s(|s| s.tables),
        u64s(|s| s.rows),
        u64s(|s| s.table_bytes),
        u64s(|s| s.queries),
        u64s(|s| s.secondary.lsn),
        u64s(|s| s.secondary.rows),
        u64s(|s| s.secondary.state_bytes),
        u64s(|s| s.secondary.entries),
        Arc::new(Float64Array::from_iter_values(
            workers.iter().map(|(_, _, s)| s.secondary.replay_seconds),
        )),
        Arc::new(Float64Array::from_iter(
            workers.iter().map(|(_, _, s)| s.secondary.lag_ms_p99),
        )),
        Arc::new(Float64Array::from_iter(
            workers
                .iter()
                .map(|(_, _, s)| s.secondary.snapshot_wait_ms_p50),
        )),
    ];
    Ok(RecordBatch::try_new(workers_schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use crate::LocalCluster;
    use arrow::array::AsArray;
    use arrow::datatypes::UInt64Type;

    /// The counters follow what the workers hold and what a query moved.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counters_follow_the_tables_held_and_the_bytes_moved() {
        let cluster = LocalCluster::start(3, 1, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let c = &cluster.coordinator;
        let totals = || async {
            let r = c
                .sql_one(
                    "SELECT count(*)::BIGINT UNSIGNED, sum(rows), sum(tables), \
                     sum(bytes_received) FROM gyre_workers()",
                )
                .await
                .unwrap();
            let b = &r.batches[0];
            (0..4)
                .map(|i| b.column(i).as_primitive::<UInt64Type>().value(0))
                .collect::<Vec<u64>>()
        };
        let before = totals().await;
        assert_eq!(&before[..3], &[3, 0, 0]);
        c.sql("CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 100000)")
            .await
            .unwrap();
        let after = totals().await;
        assert_eq!(&after[..3], &[3, 100_000, 3]);
        // 100K 8-byte keys reached the workers over the transport.
        assert!(after[3] >= before[3] + 800_000, "{before:?} -> {after:?}");
        let e = c.sql("SELECT * FROM gyre_workers(1)").await.unwrap_err();
        assert!(e.to_string().contains("takes no arguments"), "{e}");
        // The primary has logged nothing: no transactional table was touched.
        let r = c
            .sql_one("SELECT lsn, calls_committed, secondaries FROM gyre_primary()")
            .await
            .unwrap();
        let b = &r.batches[0];
        let values: Vec<u64> = (0..3)
            .map(|i| b.column(i).as_primitive::<UInt64Type>().value(0))
            .collect();
        assert_eq!(values, [0, 0, 3]);
    }
}
