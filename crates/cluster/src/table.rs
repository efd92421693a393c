//! Distributed tables: the catalog entry the coordinator plans with, and the
//! operators that read and write a worker's partition of a table.

use crate::modify::{GyreModifyExec, Modification};
use crate::progress::ReadCounters;
use crate::storage::WorkerStorage;
use arrow::array::{RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{
    ColumnStatistics, Constraints, DFSchema, DataFusionError, Result, Statistics,
    internal_datafusion_err, internal_err, not_impl_err, plan_datafusion_err, plan_err,
};
use datafusion::datasource::TableType;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::coop::make_cooperative;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream, StatisticsArgs,
};
use futures::TryStreamExt;
use gyre_exchange::QueryContext;
use gyre_transport::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// How a table's rows are spread over the workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TablePlacement {
    /// Row goes to worker `hash(column) mod n`, with the hash DataFusion's repartitioning
    /// uses, so joins and aggregations on the column need no shuffle.
    Hash { column: String },
    /// Rows stay where they were produced (for example, as generated).
    Chunked,
}

impl fmt::Display for TablePlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hash { column } => write!(f, "hash({column})"),
            Self::Chunked => write!(f, "chunked"),
        }
    }
}

/// What the coordinator knows about a table.
#[derive(Debug, Clone)]
pub struct TableMeta {
    pub name: String,
    pub schema: SchemaRef,
    pub placement: TablePlacement,
    /// Partition `i` lives on `workers[i]`.
    pub workers: Vec<NodeId>,
    pub rows: u64,
    pub column_bytes: Vec<u64>,
    /// Per column, for the planner's estimates (unknown until rows are committed).
    pub columns: Vec<ColumnStatistics>,
    pub rules: TableRules,
}

/// What a table's definition says beyond its columns, as DataFusion's planner uses it:
/// keys (functional dependencies, for grouping and scalar subqueries) and the values
/// an insert fills in for columns it leaves out.
#[derive(Debug, Clone, Default)]
pub struct TableRules {
    pub constraints: Constraints,
    pub column_defaults: HashMap<String, Expr>,
}

impl TableMeta {
    fn key_index(&self) -> Option<usize> {
        match &self.placement {
            TablePlacement::Hash { column } => self.schema.index_of(column).ok(),
            TablePlacement::Chunked => None,
        }
    }
}

/// The workers a query runs on, attached to the planning session.
#[derive(Debug, Clone)]
pub struct QueryWorkers(pub Vec<NodeId>);

impl QueryWorkers {
    /// The workers of the query `state` plans.
    pub fn of(state: &dyn Session) -> Result<Arc<Self>> {
        state
            .config()
            .get_extension::<QueryWorkers>()
            .ok_or_else(|| internal_datafusion_err!("no worker set for this query"))
    }
}

/// The coordinator's [`TableProvider`] for a distributed table.
#[derive(Debug)]
pub struct DistributedTable {
    pub meta: TableMeta,
}

#[async_trait]
impl TableProvider for DistributedTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.meta.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn constraints(&self) -> Option<&Constraints> {
        Some(&self.meta.rules.constraints)
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.meta.rules.column_defaults.get(column)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let workers = QueryWorkers::of(state)?;
        let meta = &self.meta;
        let lost: Vec<String> = meta
            .workers
            .iter()
            .enumerate()
            .filter(|(_, w)| !workers.0.contains(w))
            .map(|(i, w)| format!("partition {i} (held by worker {w})"))
            .collect();
        if !lost.is_empty() {
            return plan_err!(
                "table '{}' lost {}: the worker holding it is gone; reload the table",
                meta.name,
                lost.join(", ")
            );
        }
        // Workers that joined after the table was loaded hold none of it: their
        // partitions of the scan read nothing.
        let holders = workers.0.iter().map(|w| meta.workers.contains(w)).collect();
        let hash_key = if meta.workers == workers.0 {
            meta.key_index()
                .map(|k| meta.schema.field(k).name().clone())
        } else {
            None
        };
        Ok(Arc::new(
            GyreScanExec::new(
                meta.name.clone(),
                Arc::clone(&meta.schema),
                projection.cloned(),
                holders,
                hash_key,
                meta.rows,
                meta.column_bytes.clone(),
            )?
            .with_column_statistics(meta.columns.clone()),
        ))
    }

    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.modify(state, filters, None)
    }

    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.modify(state, filters, Some(assignments))
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return not_impl_err!("{insert_op} into distributed tables");
        }
        self.require_current_workers(state, "INSERT")?;
        Ok(Arc::new(GyreInsertExec::new(
            input,
            self.meta.name.clone(),
            self.meta.key_index(),
        )))
    }
}

impl DistributedTable {
    /// The table's rows and column figures (inexact), columns in the table's order.
    pub fn statistics(&self) -> Statistics {
        let meta = &self.meta;
        let mut stats = Statistics::new_unknown(&meta.schema)
            .with_num_rows(Precision::Inexact(meta.rows as usize));
        if meta.columns.len() == meta.schema.fields().len() {
            stats.column_statistics = meta.columns.clone();
        }
        stats
    }

    /// Changing a table writes on every query worker, so the table must be held by
    /// exactly those: not after a holder died, nor after a worker joined.
    fn require_current_workers(&self, state: &dyn Session, what: &str) -> Result<()> {
        let meta = &self.meta;
        let workers = QueryWorkers::of(state)?;
        if meta.workers != workers.0 {
            return plan_err!(
                "{what} into '{}' refused: the table is held by workers {:?} but workers {:?} \
                 are alive now; reload the table (CREATE TABLE ... AS SELECT) to place it on them",
                meta.name,
                meta.workers,
                workers.0
            );
        }
        Ok(())
    }

    /// A delete (no assignments) or update of this table on every worker.
    fn modify(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
        assignments: Option<Vec<(String, Expr)>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let meta = &self.meta;
        self.require_current_workers(
            state,
            if assignments.is_some() {
                "UPDATE"
            } else {
                "DELETE"
            },
        )?;
        let df_schema = DFSchema::try_from(Arc::clone(&meta.schema))?;
        let physical = |e: &Expr| state.create_physical_expr(e.clone(), &df_schema);
        let filters = filters.iter().map(physical).collect::<Result<Vec<_>>>()?;
        let modification = match assignments {
            None => Modification::Delete,
            Some(assignments) => {
                let mut out = Vec::with_capacity(assignments.len());
                for (column, expr) in &assignments {
                    let Ok(index) = meta.schema.index_of(column) else {
                        return plan_err!(
                            "UPDATE failed: column '{column}' does not exist in table '{}'",
                            meta.name
                        );
                    };
                    if meta.key_index() == Some(index) {
                        return not_impl_err!(
                            "UPDATE of column '{column}': it places the rows of table '{}' \
                             on the workers, and updated rows would have to move",
                            meta.name
                        );
                    }
                    out.push((index, physical(expr)?));
                }
                Modification::Update(out)
            }
        };
        Ok(Arc::new(GyreModifyExec::new(
            meta.name.clone(),
            Arc::clone(&meta.schema),
            meta.workers.len(),
            filters,
            modification,
        )))
    }
}

/// The executing worker's tables (an error anywhere but on a worker).
pub(crate) fn storage_of(ctx: &TaskContext) -> Result<Arc<WorkerStorage>> {
    ctx.session_config()
        .get_extension::<WorkerStorage>()
        .ok_or_else(|| internal_datafusion_err!("table access outside of a worker"))
}

/// Reads the partition of a table that lives on the executing worker.
#[derive(Debug)]
pub struct GyreScanExec {
    pub table: String,
    pub table_schema: SchemaRef,
    pub projection: Option<Vec<usize>>,
    /// One entry per query worker: whether it holds a part of the table. A worker
    /// that joined after the table was loaded holds none and reads nothing.
    pub holders: Vec<bool>,
    /// Set when the table is hash-partitioned on this column over exactly this query's workers.
    pub hash_key: Option<String>,
    pub rows: u64,
    pub column_bytes: Vec<u64>,
    /// The whole table's column statistics (not projected); empty when unknown.
    pub column_stats: Vec<ColumnStatistics>,
    props: Arc<PlanProperties>,
}

impl GyreScanExec {
    pub fn new(
        table: String,
        table_schema: SchemaRef,
        projection: Option<Vec<usize>>,
        holders: Vec<bool>,
        hash_key: Option<String>,
        rows: u64,
        column_bytes: Vec<u64>,
    ) -> Result<Self> {
        let schema = match &projection {
            Some(p) => Arc::new(table_schema.project(p).map_err(|e| {
                plan_datafusion_err!("scan of '{table}' with projection {p:?}: {e}")
            })?),
            None => Arc::clone(&table_schema),
        };
        let partitions = holders.len();
        let partitioning = hash_key
            .as_ref()
            .and_then(|k| schema.index_of(k).ok().map(|i| (k, i)))
            .map(|(k, i)| {
                Partitioning::Hash(
                    vec![Arc::new(Column::new(k, i)) as Arc<dyn PhysicalExpr>],
                    partitions,
                )
            })
            .unwrap_or(Partitioning::UnknownPartitioning(partitions));
        let props = Arc::new(
            PlanProperties::new(
                EquivalenceProperties::new(schema),
                partitioning,
                EmissionType::Incremental,
                Boundedness::Bounded,
            )
            .with_scheduling_type(SchedulingType::Cooperative),
        );
        Ok(Self {
            table,
            table_schema,
            projection,
            holders,
            hash_key,
            rows,
            column_bytes,
            column_stats: vec![],
            props,
        })
    }

    /// The scan with the table's column statistics (one per table column, or none).
    pub fn with_column_statistics(mut self, column_stats: Vec<ColumnStatistics>) -> Self {
        if column_stats.len() == self.table_schema.fields().len() {
            self.column_stats = column_stats;
        }
        self
    }

    fn projected_columns(&self) -> Vec<usize> {
        match &self.projection {
            Some(p) => p.clone(),
            None => (0..self.table_schema.fields().len()).collect(),
        }
    }
}

impl DisplayAs for GyreScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let cols: Vec<&str> = self
            .projected_columns()
            .iter()
            .map(|&i| self.table_schema.field(i).name().as_str())
            .collect();
        write!(
            f,
            "GyreScanExec: table={}, projection=[{}], partitioning={}",
            self.table,
            cols.join(", "),
            self.properties().output_partitioning()
        )
    }
}

impl ExecutionPlan for GyreScanExec {
    fn name(&self) -> &'static str {
        "GyreScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let batches = match self.holders.get(partition) {
            Some(true) => storage_of(&context)?.part(&self.table)?.batches.clone(),
            Some(false) => vec![],
            None => {
                return internal_err!(
                    "scan of '{}' has {} partitions, not {}",
                    self.table,
                    self.holders.len(),
                    partition + 1
                );
            }
        };
        // Memory never makes the stream wait: it yields to tokio by budget, so that
        // a canceled query stops however much CPU its operators take per batch.
        let stream = MemoryStream::try_new(batches, self.schema(), self.projection.clone())?;
        let Some(read) = context.session_config().get_extension::<ReadCounters>() else {
            return Ok(make_cooperative(Box::pin(stream)));
        };
        let counted = stream.inspect_ok(move |b| {
            read.add_rows(b.num_rows());
            read.add_bytes(b.get_array_memory_size() as u64);
        });
        Ok(make_cooperative(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            counted,
        ))))
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let share = if args.partition().is_some() {
            self.holders.iter().filter(|&&h| h).count().max(1) as u64
        } else {
            1
        };
        let cols = self.projected_columns();
        let bytes: u64 = cols
            .iter()
            .map(|&i| self.column_bytes.get(i).copied().unwrap_or(0))
            .sum();
        let mut stats = Statistics::default()
            .with_num_rows(Precision::Inexact((self.rows / share) as usize))
            .with_total_byte_size(Precision::Inexact((bytes / share) as usize));
        for &i in &cols {
            let column = match self.column_stats.get(i) {
                Some(c) => ColumnStatistics {
                    null_count: c.null_count.map(|n| n / share as usize),
                    ..c.clone()
                },
                None => ColumnStatistics::new_unknown(),
            };
            stats = stats.add_column_statistics(column);
        }
        Ok(Arc::new(stats))
    }
}

/// Appends its input to the executing worker's partition of a table.
///
/// The rows become visible when the query commits. A hash-placed table
/// requires its input hash-partitioned on the key, so each row lands on the
/// worker that owns its key.
#[derive(Debug)]
pub struct GyreInsertExec {
    pub input: Arc<dyn ExecutionPlan>,
    pub table: String,
    pub key: Option<usize>,
    props: Arc<PlanProperties>,
}

/// The schema of an insert's result: the number of rows written.
pub fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

impl GyreInsertExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, table: String, key: Option<usize>) -> Self {
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            input,
            table,
            key,
            props,
        }
    }
}

impl DisplayAs for GyreInsertExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "GyreInsertExec: table={}", self.table)
    }
}

impl ExecutionPlan for GyreInsertExec {
    fn name(&self) -> &'static str {
        "GyreInsertExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        match self.key {
            Some(k) => {
                let field = self.input.schema().field(k).name().clone();
                vec![Distribution::KeyPartitioned(vec![Arc::new(Column::new(
                    &field, k,
                ))])]
            }
            None => vec![Distribution::UnspecifiedDistribution],
        }
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .into_iter()
            .next()
            .ok_or_else(|| internal_datafusion_err!("insert needs an input"))?;
        Ok(Arc::new(Self::new(input, self.table.clone(), self.key)))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let storage = storage_of(&context)?;
        let qc = QueryContext::of(&context)?;
        let input = self.input.execute(partition, context)?;
        let table = self.table.clone();
        let fut = async move {
            let batches: Vec<RecordBatch> = input.try_collect().await?;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            storage.stage_insert(qc.query_id, &table, batches)?;
            RecordBatch::try_new(
                count_schema(),
                vec![Arc::new(UInt64Array::from(vec![rows as u64]))],
            )
            .map_err(DataFusionError::from)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            futures::stream::once(fut),
        )))
    }
}
