//! Reads a transactional table on the workers, from one global snapshot.
//!
//! ScyPer answers analytical queries on its secondaries: the primary marks global
//! snapshots in its log, every secondary cuts one at exactly that LSN, and a query
//! runs on the same snapshot on every node it uses (Rödiger's thesis, section 5.2.2).
//! The workers split a table by key, not by position: worker `i` of `n` reads the rows
//! whose primary key hashes to `i` ([`KeyShare`], the hash DataFusion's repartitioning
//! uses). The scan is then hash-partitioned on the key, and a join or aggregation on
//! it needs no shuffle.
//!
//! A fully replicated table is whole on every worker, each laid out as its replay made
//! it, and each worker filters its share out of it. A partitioned table's replica on
//! worker `i` of `n` holds that share only (the log feed deals the rows out by the
//! same hash), so the worker reads all of it, once it holds the share the plan
//! expects.

use crate::progress::ReadCounters;
use crate::worker::secondary::WorkerSecondary;
use arrow::array::{Array, ArrayRef, BooleanArray, Int64Array};
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, Statistics, internal_datafusion_err, internal_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream, StatisticsArgs,
};
use futures::{StreamExt, TryStreamExt};
use gyre_exchange::key_hash::hash_keys;
pub use gyre_replica::Placement;
use gyre_replica::rendezvous;
use gyre_replica::secondary::Share;
use gyre_replica::{TableDef, Value};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A worker's share of the transactional tables whose rows are split: worker `index`
/// of `count` (by the place of `node` among the live `workers`, as queries number
/// them) holds the rows of partitioned tables whose primary key hashes to `index`, the
/// chunks of chunked tables numbered `index` modulo `count`, and the blocks of
/// fragmented tables that rendezvous hashing gives `node` among `workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyShare {
    pub index: u32,
    pub count: u32,
    pub node: u32,
    pub workers: Vec<u32>,
}

impl fmt::Display for KeyShare {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "share {} of {} (worker {} among {:?})",
            self.index, self.count, self.node, self.workers
        )
    }
}

/// What a scan needs a worker's replica to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Every row (a fully replicated table).
    Every,
    /// Share `index` of `count` of a partitioned or chunked table.
    Share { index: u32, count: u32 },
    /// The blocks of a fragmented table with `replicas` copies that `node` reads
    /// among the query's `readers`.
    Blocks {
        node: u32,
        readers: Vec<u32>,
        replicas: u8,
    },
}

impl Need {
    /// Whether a replica that holds `held` (`None`: every row) holds what is needed.
    pub fn covered_by(&self, held: Option<&KeyShare>) -> bool {
        let Some(held) = held else { return true };
        match self {
            Need::Every => true,
            Need::Share { index, count } => {
                (held.index, held.count) == (*index, *count) || held.count <= 1
            }
            Need::Blocks {
                node,
                readers,
                replicas,
            } => {
                held.node == *node
                    && (0..rendezvous::BLOCKS).all(|b| {
                        rendezvous::reader(b, readers) != Some(*node)
                            || rendezvous::holds(b, *node, &held.workers, *replicas)
                    })
            }
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Need::Every => write!(f, "every row"),
            Need::Share { index, count } => write!(f, "share {index} of {count}"),
            Need::Blocks { node, readers, .. } => {
                write!(f, "the blocks worker {node} reads among {readers:?}")
            }
        }
    }
}

/// The block of each row of a fragmented table, by its key columns.
fn blocks_of(keys: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    let mut hashes = Vec::new();
    hash_keys(keys, rows, &mut hashes)?;
    Ok(hashes.into_iter().map(rendezvous::block_of).collect())
}

/// Which rows fall in the blocks marked in `blocks`.
pub fn block_mask(keys: &[ArrayRef], rows: usize, blocks: &[bool]) -> Result<BooleanArray> {
    Ok(blocks_of(keys, rows)?
        .into_iter()
        .map(|b| Some(blocks[b as usize]))
        .collect())
}

impl KeyShare {
    /// Which rows of a table placed so, given their key columns, are in the share.
    pub fn mask(
        &self,
        placement: Placement,
        keys: &[ArrayRef],
        rows: usize,
    ) -> Result<BooleanArray> {
        match placement {
            Placement::Fragmented { replicas } => {
                let held = rendezvous::held_blocks(self.node, &self.workers, replicas);
                return block_mask(keys, rows, &held);
            }
            _ if self.count <= 1 => return Ok(BooleanArray::from(vec![true; rows])),
            Placement::Chunked => {
                let numbers = keys
                    .first()
                    .and_then(|k| k.as_any().downcast_ref::<Int64Array>())
                    .ok_or_else(|| {
                        internal_datafusion_err!("a chunked table's key is its row id")
                    })?;
                let (index, count) = (i64::from(self.index), i64::from(self.count));
                return Ok(numbers
                    .iter()
                    .map(|n| Some(Placement::chunk_of(n.unwrap_or(0)) % count == index))
                    .collect());
            }
            Placement::Full | Placement::Partitioned => {}
        }
        let mut hashes = Vec::new();
        hash_keys(keys, rows, &mut hashes)?;
        Ok(hashes
            .iter()
            .map(|h| Some(h % u64::from(self.count) == u64::from(self.index)))
            .collect())
    }
}

impl Share for KeyShare {
    fn owns(&self, table: &TableDef, keys: &[Vec<Value>]) -> gyre_replica::Result<Vec<bool>> {
        let columns: Vec<_> = table
            .key
            .iter()
            .map(|&k| table.columns[k].clone())
            .collect();
        let batch = gyre_replica::columnar::to_batch(&columns, keys.iter().map(Vec::as_slice));
        let mask = self
            .mask(table.placement, batch.columns(), keys.len())
            .map_err(|e| gyre_replica::Error::Constraint(format!("hashing keys: {e}")))?;
        Ok(mask.iter().map(|m| m == Some(true)).collect())
    }
}

/// What a snapshot scan reads.
#[derive(Debug, Clone)]
pub struct SnapshotTable {
    pub name: String,
    pub schema: SchemaRef,
    /// The primary key's columns: each worker reads the rows whose key hashes to it.
    pub key: Vec<usize>,
    /// Where its rows live: a replica of a table that is not `Full` holds only its
    /// worker's share.
    pub placement: Placement,
    /// Its rows at planning time (for the planner's estimates).
    pub rows: u64,
}

/// Scans a transactional table as of the global snapshot at `lsn`, partition `i` on
/// worker `i`.
#[derive(Debug)]
pub struct SnapshotScanExec {
    pub table: SnapshotTable,
    pub projection: Option<Vec<usize>>,
    /// The LSN of the snapshot transaction the query reads at.
    pub lsn: u64,
    props: Arc<PlanProperties>,
}

impl SnapshotScanExec {
    pub fn try_new(
        table: SnapshotTable,
        projection: Option<Vec<usize>>,
        lsn: u64,
        workers: usize,
    ) -> Result<Self> {
        let table_schema = &table.schema;
        let schema = match &projection {
            Some(p) => Arc::new(table_schema.project(p)?),
            None => Arc::clone(table_schema),
        };
        // A decoded plan is checked, never trusted.
        let columns = table_schema.fields().len();
        let key = &table.key;
        if key.is_empty() || key.iter().any(|&k| k >= columns) {
            return plan_err!(
                "scan of '{}': key columns {key:?} do not fit its {columns} columns",
                table.name
            );
        }
        let workers = workers.max(1);
        // Hash-partitioned on the key when the scan outputs every key column.
        let position = |k: usize| match &projection {
            Some(p) => p.iter().position(|&c| c == k),
            None => Some(k),
        };
        let key_exprs: Option<Vec<Arc<dyn PhysicalExpr>>> = key
            .iter()
            .map(|&k| {
                position(k).map(|i| {
                    Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>
                })
            })
            .collect();
        let partitioning = match key_exprs {
            // A chunked table's workers hold runs of row numbers, not hashes of them, and
            // a fragmented table's the blocks rendezvous hashing gives them.
            Some(exprs)
                if !exprs.is_empty()
                    && matches!(table.placement, Placement::Full | Placement::Partitioned) =>
            {
                Partitioning::Hash(exprs, workers)
            }
            _ => Partitioning::UnknownPartitioning(workers),
        };
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
            projection,
            lsn,
            props,
        })
    }

    fn workers(&self) -> usize {
        self.props.output_partitioning().partition_count()
    }
}

impl DisplayAs for SnapshotScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let schema = self.schema();
        let cols: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        write!(
            f,
            "SnapshotScanExec: table={}{}, snapshot_lsn={}, projection=[{}], workers={}, \
             partitioning={}",
            self.table.name,
            match self.table.placement {
                Placement::Full => String::new(),
                Placement::Partitioned => " (partitioned)".to_string(),
                Placement::Chunked => " (chunked)".to_string(),
                Placement::Fragmented { replicas } => format!(" (fragmented, {replicas} copies)"),
            },
            self.lsn,
            cols.join(", "),
            self.workers(),
            self.props.output_partitioning()
        )
    }
}

impl ExecutionPlan for SnapshotScanExec {
    fn name(&self) -> &'static str {
        "SnapshotScanExec"
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
        let workers = self.workers();
        if partition >= workers {
            return internal_err!(
                "scan of '{}' has {workers} partitions, not {}",
                self.table.name,
                partition + 1
            );
        }
        let secondary = context
            .session_config()
            .get_extension::<WorkerSecondary>()
            .ok_or_else(|| {
                internal_datafusion_err!("transactional tables are read on the workers only")
            })?;
        let read = context.session_config().get_extension::<ReadCounters>();
        let (table, lsn, projection) = (self.table.name.clone(), self.lsn, self.projection.clone());
        let placement = self.table.placement;
        let (index, count) = (partition as u32, workers as u32);
        // What this partition reads, and the rows of its replica it keeps: a fragmented
        // table's blocks whose reader among the query's workers it is, else its share
        // of the key's hash (or of the chunks).
        let (need, read_blocks) = match placement {
            Placement::Fragmented { replicas } => {
                let qc = context
                    .session_config()
                    .get_extension::<gyre_exchange::QueryContext>()
                    .ok_or_else(|| internal_datafusion_err!("a scan outside of a query"))?;
                if qc.workers.len() != workers {
                    return internal_err!(
                        "scan of '{}' has {workers} partitions for {} workers",
                        self.table.name,
                        qc.workers.len()
                    );
                }
                let node = qc.workers[partition];
                let readers = qc.workers.clone();
                let blocks = rendezvous::read_blocks(node, &readers);
                let need = Need::Blocks {
                    node,
                    readers,
                    replicas,
                };
                (need, Some(blocks))
            }
            _ if placement.splits_rows() => (Need::Share { index, count }, None),
            _ => (Need::Every, None),
        };
        let share = KeyShare {
            index,
            count,
            node: 0,
            workers: vec![],
        };
        let partitioned = placement.splits_rows();
        let batches = async move {
            let (snapshot, holds_more) = secondary.read(&table, lsn, &need).await?;
            // A partitioned table's replica holds this worker's share only, unless it
            // holds every row (the snapshot is from before the workers changed); a
            // fragmented table's holds every block this worker reads, and others.
            let filter = read_blocks.is_some() || (workers > 1 && (!partitioned || holds_more));
            let key = &snapshot.def().key;
            let mut out = Vec::new();
            for batch in snapshot.batches() {
                let mine = if !filter {
                    batch
                } else {
                    let keys: Vec<ArrayRef> =
                        key.iter().map(|&k| Arc::clone(batch.column(k))).collect();
                    let mask = match &read_blocks {
                        Some(blocks) => block_mask(&keys, batch.num_rows(), blocks)?,
                        None => share.mask(placement, &keys, batch.num_rows())?,
                    };
                    filter_record_batch(&batch, &mask)?
                };
                if mine.num_rows() == 0 {
                    continue;
                }
                out.push(match &projection {
                    Some(p) => mine.project(p)?,
                    None => mine,
                });
            }
            Ok::<_, datafusion::error::DataFusionError>(futures::stream::iter(
                out.into_iter().map(Ok),
            ))
        };
        let stream = futures::stream::once(batches)
            .try_flatten()
            .inspect_ok(move |b| {
                if let Some(read) = &read {
                    read.add_rows(b.num_rows());
                    read.add_bytes(b.get_array_memory_size() as u64);
                }
            });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream.boxed(),
        )))
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let share = if args.partition().is_some() {
            self.workers() as u64
        } else {
            1
        };
        Ok(Arc::new(
            Statistics::new_unknown(&self.schema())
                .with_num_rows(Precision::Inexact((self.table.rows / share) as usize)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{SnapshotScanExec, SnapshotTable, rendezvous};
    use arrow::array::ArrayRef;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::{ExecutionPlan, Partitioning};
    use std::sync::Arc;

    #[test]
    fn partitioned_by_the_key_only_when_it_is_projected_and_checked() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("w", DataType::Int64, false),
            Field::new("d", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        let scan = |key: Vec<usize>, projection: Option<Vec<usize>>| {
            let table = SnapshotTable {
                name: "t".into(),
                schema: Arc::clone(&schema),
                key,
                placement: gyre_replica::Placement::Full,
                rows: 10,
            };
            SnapshotScanExec::try_new(table, projection, 7, 3)
        };
        let hashed = scan(vec![0, 1], Some(vec![2, 1, 0])).unwrap();
        match hashed.properties().output_partitioning() {
            Partitioning::Hash(exprs, 3) => {
                let names: Vec<String> = exprs.iter().map(|e| e.to_string()).collect();
                assert_eq!(names, ["w@2", "d@1"]);
            }
            other => panic!("{other:?}"),
        }
        let partial = scan(vec![0, 1], Some(vec![2, 0])).unwrap();
        assert!(matches!(
            partial.properties().output_partitioning(),
            Partitioning::UnknownPartitioning(3)
        ));
        // Key columns or a projection beyond the table are refused, not indexed.
        assert!(scan(vec![3], None).is_err());
        assert!(scan(vec![], None).is_err());
        assert!(scan(vec![0], Some(vec![5])).is_err());
    }

    /// The rows a partitioned or fragmented replica keeps (by the keys' values, as the
    /// log brings them) are those a scan of the whole table picks for the same worker
    /// (by its Arrow columns); the shares hold every row as many times as the
    /// placement keeps copies, and a query's readers read each row once, from a worker
    /// that holds it.
    #[test]
    fn a_share_by_values_matches_the_scans_filter() {
        use super::{KeyShare, block_mask};
        use gyre_replica::secondary::Share;
        use gyre_replica::{Column, ColumnType, Placement, TableDef, TableId, Value};
        for placement in [
            Placement::Partitioned,
            Placement::Fragmented { replicas: 2 },
        ] {
            let def = TableDef {
                id: TableId(0),
                name: "t".into(),
                columns: vec![
                    Column::new("v", ColumnType::Float64, true),
                    Column::new("w", ColumnType::Int32, false),
                    Column::new("name", ColumnType::Text, false),
                ],
                key: vec![1, 2],
                placement,
            };
            let rows: Vec<Vec<Value>> = (0..1000)
                .map(|i| {
                    vec![
                        Value::Float(i as f64),
                        Value::Int(i % 7),
                        Value::Text(format!("n{i}").into()),
                    ]
                })
                .collect();
            let keys: Vec<Vec<Value>> = rows.iter().map(|r| def.key_values(r)).collect();
            let batch =
                gyre_replica::columnar::to_batch(&def.columns, rows.iter().map(Vec::as_slice));
            let key_columns = [batch.column(1).clone(), batch.column(2).clone()];
            let workers = vec![11, 12, 13];
            let mut holders = vec![0; rows.len()];
            let mut readers = vec![0; rows.len()];
            for index in 0..3 {
                let node = workers[index as usize];
                let share = KeyShare {
                    index,
                    count: 3,
                    node,
                    workers: workers.clone(),
                };
                let by_values = share.owns(&def, &keys).unwrap();
                let by_columns = share.mask(def.placement, &key_columns, rows.len()).unwrap();
                let reads = rendezvous::read_blocks(node, &workers);
                let read = block_mask(&key_columns, rows.len(), &reads).unwrap();
                for (i, owned) in by_values.iter().enumerate() {
                    assert_eq!(*owned, by_columns.value(i), "row {i}, {share}");
                    holders[i] += usize::from(*owned);
                    if placement != Placement::Partitioned && read.value(i) {
                        assert!(*owned, "row {i} read by worker {node}, which lacks it");
                        readers[i] += 1;
                    }
                }
                assert!(by_values.iter().filter(|o| **o).count() > 250, "{share}");
            }
            assert!(
                holders.iter().all(|&h| h == placement.copies(3)),
                "{placement:?}"
            );
            if placement != Placement::Partitioned {
                assert!(readers.iter().all(|&r| r == 1));
            }
        }
    }

    /// A chunked table's shares are runs of `CHUNK_ROWS` row numbers dealt in turn, the
    /// same by values (the log) and by columns (a scan), each row in one share.
    #[test]
    fn chunked_shares_are_runs_of_row_numbers() {
        use super::KeyShare;
        use gyre_replica::secondary::Share;
        use gyre_replica::store::CHUNK_ROWS;
        use gyre_replica::{Column, ColumnType, Placement, ROW_ID, TableDef, TableId, Value};
        let def = TableDef {
            id: TableId(0),
            name: "t".into(),
            columns: vec![
                Column::new("v", ColumnType::Text, true),
                Column::new(ROW_ID, ColumnType::Int64, false),
            ],
            key: vec![1],
            placement: Placement::Chunked,
        };
        def.validate().unwrap();
        let n = 5 * CHUNK_ROWS + 17;
        let keys: Vec<Vec<Value>> = (1..=n).map(|i| vec![Value::Int(i)]).collect();
        let column: ArrayRef = Arc::new(arrow::array::Int64Array::from_iter_values(1..=n));
        for index in 0..3 {
            let share = KeyShare {
                index,
                count: 3,
                node: index,
                workers: vec![0, 1, 2],
            };
            let by_values = share.owns(&def, &keys).unwrap();
            let by_columns = share
                .mask(def.placement, std::slice::from_ref(&column), keys.len())
                .unwrap();
            for (i, owned) in by_values.iter().enumerate() {
                assert_eq!(*owned, by_columns.value(i), "row {}, {share}", i + 1);
                let chunk = i as i64 / CHUNK_ROWS;
                assert_eq!(*owned, chunk % 3 == i64::from(index), "row {}", i + 1);
            }
        }
        // Only a table numbered by the primary can be chunked.
        let keyed = TableDef {
            columns: vec![Column::new("k", ColumnType::Int64, false)],
            key: vec![0],
            ..def
        };
        let err = keyed.validate().unwrap_err().to_string();
        assert!(err.contains("chunked placement"), "{err}");
    }
}
