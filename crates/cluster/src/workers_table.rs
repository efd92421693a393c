//! `gyre_workers()`: the cluster's live workers and their counters as a table, for
//! people watching a cluster and for benchmarks that measure what each worker spent on
//! a query (read before and after it).

use crate::coordinator::Coordinator;
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
use std::sync::{Arc, Weak};

/// The name the function is called by.
pub const NAME: &str = "gyre_workers";

/// The table function; it holds the coordinator weakly, as the coordinator holds it.
#[derive(Debug)]
pub struct WorkersFunction(pub Weak<Coordinator>);

impl TableFunctionImpl for WorkersFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        if !args.is_empty() {
            return plan_err!("{NAME}() takes no arguments, got {}", args.len());
        }
        Ok(Arc::new(WorkersTable(Weak::clone(&self.0))))
    }
}

/// The columns of `gyre_workers()`.
pub fn schema() -> SchemaRef {
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
    ]))
}

#[derive(Debug)]
struct WorkersTable(Weak<Coordinator>);

#[async_trait]
impl TableProvider for WorkersTable {
    fn schema(&self) -> SchemaRef {
        schema()
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
            .0
            .upgrade()
            .ok_or_else(|| internal_datafusion_err!("the coordinator is shutting down"))?;
        let batch = batch(&coordinator.worker_stats().await?)?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            schema(),
            projection.cloned(),
        )?)
    }
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
    ];
    Ok(RecordBatch::try_new(schema(), columns)?)
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
    }
}
