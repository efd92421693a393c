//! Serialisation of Gyre's own plan nodes, so stage plans can be shipped to
//! workers with DataFusion's protobuf plan format.

use crate::files::{FileCopyExec, FileSplitScanExec};
use crate::modify::{GyreModifyExec, Modification};
use crate::snapshot_scan::{SnapshotScanExec, SnapshotTable};
use crate::table::{GyreInsertExec, GyreScanExec};
use crate::tpch::TpchGenExec;
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::JoinSide;
use datafusion::common::parsers::CompressionTypeVariant;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{ColumnStatistics, Result, internal_datafusion_err, internal_err};
use datafusion::datasource::file_format::file_compression_type::FileCompressionType;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{LexOrdering, Partitioning, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, PhysicalGroupBy};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::sorts::partitioned_topk::{PartitionedTopKExec, WindowFnKind};
use datafusion_proto::generated::datafusion_common::ColumnStats;
use datafusion_proto::physical_plan::from_proto::parse_physical_expr;
use datafusion_proto::physical_plan::to_proto::serialize_physical_expr;
use datafusion_proto::physical_plan::{
    AsExecutionPlan, PhysicalExtensionCodec, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use gyre_exchange::{
    CycloJoinExec, CycloJoinType, CycloKernel, CycloSide, ExchangeReceiverExec, ExchangeSenderExec,
    FilterFrom, FilterSourceExec, FilterTargetExec, FlowJoinExec, NeoAggregateExec, NeoJoinExec,
    NeoSettings, Placement, RadixJoinExec, ReceiveMode, SendMode, SkewSettings, flow::FlowInputs,
};
use prost::Message;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Serialize, Deserialize)]
enum NodeProto {
    FilterSource {
        id: u32,
        columns: Vec<usize>,
        ship: Option<u32>,
    },
    FilterTarget {
        id: u32,
        columns: Vec<usize>,
        from: FilterFrom,
    },
    Scan {
        table: String,
        schema: Vec<u8>,
        projection: Option<Vec<usize>>,
        holders: Vec<bool>,
        hash_key: Option<String>,
        rows: u64,
        column_bytes: Vec<u64>,
        /// The table's column statistics, each a protobuf `ColumnStats`.
        column_stats: Vec<Vec<u8>>,
    },
    Insert {
        table: String,
        key: Option<usize>,
    },
    TpchGen {
        table: String,
        sf: f64,
        partitions: usize,
    },
    Sender {
        exchange: u32,
        producer: Placement,
        mode: ModeProto,
    },
    Receiver {
        exchange: u32,
        schema: Vec<u8>,
        producer: Placement,
        producer_partitions: usize,
        shuffle: bool,
        partitioning: PartitioningProto,
        ordering: Vec<SortProto>,
        constants: Vec<Vec<u8>>,
    },
    Flow {
        settings: SkewSettings,
        inputs: FlowInputs,
        exchange: Option<u32>,
    },
    /// A [`FileSplitScanExec`]: DataFusion's scan of the files, one file group per worker.
    FileScan {
        scan: Vec<u8>,
        /// DataFusion's plan format leaves the compression out (it decodes every CSV and
        /// JSON scan as uncompressed).
        compression: String,
    },
    /// A [`FileCopyExec`]: DataFusion's COPY plan over a placeholder input.
    FileCopy {
        template: Vec<u8>,
        write_id: String,
    },
    /// A [`GyreModifyExec`]: expressions over the table's columns.
    Modify {
        table: String,
        schema: Vec<u8>,
        partitions: usize,
        filters: Vec<Vec<u8>>,
        /// None for a delete.
        assignments: Option<Vec<(usize, Vec<u8>)>>,
    },
    /// DataFusion's per-partition top-k under a window function (its plan format has
    /// no message for it).
    PartitionedTopK {
        ordering: Vec<SortProto>,
        partition_prefix_len: usize,
        fetch: usize,
        rank: bool,
    },
    Cyclo {
        left_key: usize,
        right_key: usize,
        kernel: CycloKernel,
        /// Whether the left input travels the ring (else the right one).
        rotating_left: bool,
        join_type: CycloJoinType,
        exchange: Option<u32>,
        filter: Option<FilterProto>,
    },
    /// A [`RadixJoinExec`]: its one input is the hash join it runs.
    Radix,
    /// A [`NeoJoinExec`]: its one input is the hash join it runs.
    Neo {
        settings: NeoSettings,
        exchange: Option<u32>,
    },
    /// A [`NeoAggregateExec`]: its one input is the aggregate it runs; `key`, the
    /// group expression it places rows by.
    NeoAggregate {
        key: usize,
        settings: NeoSettings,
        exchange: Option<u32>,
    },
    /// A [`SnapshotScanExec`].
    SnapshotScan {
        table: String,
        schema: Vec<u8>,
        key: Vec<usize>,
        placement: gyre_replica::Placement,
        projection: Option<Vec<usize>>,
        lsn: u64,
        workers: usize,
        rows: u64,
    },
}

/// A join filter: its expression over its own intermediate schema, and where each
/// column of that schema comes from (`true` = left input).
#[derive(Serialize, Deserialize)]
struct FilterProto {
    expr: Vec<u8>,
    schema: Vec<u8>,
    columns: Vec<(usize, bool)>,
}

fn filter_proto(f: &JoinFilter, codec: &GyreCodec) -> Result<FilterProto> {
    Ok(FilterProto {
        expr: expr_bytes(f.expression(), codec)?,
        schema: schema_to_bytes(f.schema())?,
        columns: f
            .column_indices()
            .iter()
            .map(|c| match c.side {
                JoinSide::Left => Ok((c.index, true)),
                JoinSide::Right => Ok((c.index, false)),
                JoinSide::None => internal_err!("a join filter column of neither input"),
            })
            .collect::<Result<_>>()?,
    })
}

fn filter_from(f: &FilterProto, ctx: &TaskContext, codec: &GyreCodec) -> Result<JoinFilter> {
    let schema = schema_from_bytes(&f.schema)?;
    let expr = expr_from(&f.expr, ctx, &schema, codec)?;
    let columns = f
        .columns
        .iter()
        .map(|&(index, left)| ColumnIndex {
            index,
            side: if left {
                JoinSide::Left
            } else {
                JoinSide::Right
            },
        })
        .collect();
    Ok(JoinFilter::new(expr, columns, schema))
}

#[derive(Serialize, Deserialize)]
enum ModeProto {
    Shuffle(PartitioningProto),
    Gather,
    Broadcast,
    Scatter,
}

#[derive(Serialize, Deserialize)]
enum PartitioningProto {
    Hash(Vec<Vec<u8>>, usize),
    RoundRobin(usize),
    Unknown(usize),
}

#[derive(Serialize, Deserialize)]
struct SortProto {
    expr: Vec<u8>,
    descending: bool,
    nulls_first: bool,
}

/// Encodes and decodes Gyre's plan nodes inside DataFusion's plan protobuf.
#[derive(Debug, Default)]
pub struct GyreCodec;

pub fn schema_to_bytes(schema: &Schema) -> Result<Vec<u8>> {
    Ok(protobuf::Schema::try_from(schema)?.encode_to_vec())
}

pub fn schema_from_bytes(bytes: &[u8]) -> Result<SchemaRef> {
    let proto =
        protobuf::Schema::decode(bytes).map_err(|e| internal_datafusion_err!("bad schema: {e}"))?;
    Ok(Arc::new(Schema::try_from(&proto)?))
}

fn column_stats_from_bytes(encoded: &[Vec<u8>]) -> Result<Vec<ColumnStatistics>> {
    encoded
        .iter()
        .map(|bytes| {
            ColumnStats::decode(bytes.as_slice())
                .map(|c| ColumnStatistics::from(&c))
                .map_err(|e| internal_datafusion_err!("bad column statistics in a scan: {e}"))
        })
        .collect()
}

fn expr_bytes(e: &Arc<dyn PhysicalExpr>, codec: &GyreCodec) -> Result<Vec<u8>> {
    Ok(serialize_physical_expr(e, codec)?.encode_to_vec())
}

fn expr_from(
    bytes: &[u8],
    ctx: &TaskContext,
    schema: &Schema,
    codec: &GyreCodec,
) -> Result<Arc<dyn PhysicalExpr>> {
    let node = protobuf::PhysicalExprNode::decode(bytes)
        .map_err(|e| internal_datafusion_err!("bad expression: {e}"))?;
    parse_physical_expr(&node, ctx, schema, codec)
}

fn partitioning_proto(p: &Partitioning, codec: &GyreCodec) -> Result<PartitioningProto> {
    Ok(match p {
        Partitioning::Hash(exprs, n) => PartitioningProto::Hash(
            exprs
                .iter()
                .map(|e| expr_bytes(e, codec))
                .collect::<Result<_>>()?,
            *n,
        ),
        Partitioning::RoundRobinBatch(n) => PartitioningProto::RoundRobin(*n),
        other => PartitioningProto::Unknown(other.partition_count()),
    })
}

fn partitioning_from(
    p: &PartitioningProto,
    ctx: &TaskContext,
    schema: &Schema,
    codec: &GyreCodec,
) -> Result<Partitioning> {
    Ok(match p {
        PartitioningProto::Hash(exprs, n) => Partitioning::Hash(
            exprs
                .iter()
                .map(|e| expr_from(e, ctx, schema, codec))
                .collect::<Result<_>>()?,
            *n,
        ),
        PartitioningProto::RoundRobin(n) => Partitioning::RoundRobinBatch(*n),
        PartitioningProto::Unknown(n) => Partitioning::UnknownPartitioning(*n),
    })
}

fn ordering_proto(ordering: &[PhysicalSortExpr], codec: &GyreCodec) -> Result<Vec<SortProto>> {
    ordering
        .iter()
        .map(|s| {
            Ok(SortProto {
                expr: expr_bytes(&s.expr, codec)?,
                descending: s.options.descending,
                nulls_first: s.options.nulls_first,
            })
        })
        .collect()
}

fn ordering_from(
    ordering: &[SortProto],
    ctx: &TaskContext,
    schema: &Schema,
    codec: &GyreCodec,
) -> Result<Vec<PhysicalSortExpr>> {
    ordering
        .iter()
        .map(|s| {
            Ok(PhysicalSortExpr {
                expr: expr_from(&s.expr, ctx, schema, codec)?,
                options: arrow::compute::SortOptions {
                    descending: s.descending,
                    nulls_first: s.nulls_first,
                },
            })
        })
        .collect()
}

/// DataFusion's plan format writes an aggregate's grouping sets as one flag per group
/// expression and set, so the sets of `GROUPING SETS (())` (no expressions) come back
/// as no sets at all, and the aggregate as one that outputs nothing. A decoded
/// aggregate with grouping sets but no sets had the one empty set.
fn restore_empty_grouping_sets(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else {
            return Ok(Transformed::no(node));
        };
        let g = agg.group_expr();
        if !(g.has_grouping_set() && g.groups().is_empty() && g.expr().is_empty()) {
            return Ok(Transformed::no(node));
        }
        let group_by = PhysicalGroupBy::new(vec![], vec![], vec![vec![]], true);
        let fixed = AggregateExec::try_new(
            *agg.mode(),
            group_by,
            agg.aggr_expr().to_vec(),
            agg.filter_expr().to_vec(),
            Arc::clone(agg.input()),
            agg.input_schema(),
        )?
        .with_limit_options(agg.limit_options());
        Ok(Transformed::yes(Arc::new(fixed) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

impl GyreCodec {
    /// Serialises a whole stage plan.
    pub fn encode_plan(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
        Ok(protobuf::PhysicalPlanNode::try_from_physical_plan(plan, self)?.encode_to_vec())
    }

    /// Rebuilds a stage plan on a worker.
    pub fn decode_plan(&self, bytes: &[u8], ctx: &TaskContext) -> Result<Arc<dyn ExecutionPlan>> {
        let node = protobuf::PhysicalPlanNode::decode(bytes)
            .map_err(|e| internal_datafusion_err!("bad plan: {e}"))?;
        let plan = gyre_exchange::codec::contain_panics("a plan", || {
            node.try_into_physical_plan(ctx, self)
        })?;
        restore_empty_grouping_sets(plan)
    }
}

impl PhysicalExtensionCodec for GyreCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let node: NodeProto = postcard::from_bytes(buf)
            .map_err(|e| internal_datafusion_err!("bad Gyre plan node: {e}"))?;
        Ok(match node {
            NodeProto::Scan {
                table,
                schema,
                projection,
                holders,
                hash_key,
                rows,
                column_bytes,
                column_stats,
            } => Arc::new(
                GyreScanExec::new(
                    table,
                    schema_from_bytes(&schema)?,
                    projection,
                    holders,
                    hash_key,
                    rows,
                    column_bytes,
                )?
                .with_column_statistics(column_stats_from_bytes(&column_stats)?),
            ),
            NodeProto::SnapshotScan {
                table,
                schema,
                key,
                placement,
                projection,
                lsn,
                workers,
                rows,
            } => Arc::new(SnapshotScanExec::try_new(
                SnapshotTable {
                    name: table,
                    schema: schema_from_bytes(&schema)?,
                    key,
                    placement,
                    rows,
                },
                projection,
                lsn,
                workers,
            )?),
            NodeProto::Insert { table, key } => {
                let input = inputs
                    .first()
                    .ok_or_else(|| internal_datafusion_err!("insert without input"))?;
                Arc::new(GyreInsertExec::new(Arc::clone(input), table, key))
            }
            NodeProto::TpchGen {
                table,
                sf,
                partitions,
            } => Arc::new(TpchGenExec::try_new(&table, sf, partitions)?),
            NodeProto::Sender {
                exchange,
                producer,
                mode,
            } => {
                let input = inputs
                    .first()
                    .ok_or_else(|| internal_datafusion_err!("sender without input"))?;
                let mode = match mode {
                    ModeProto::Shuffle(p) => {
                        SendMode::Shuffle(partitioning_from(&p, ctx, &input.schema(), self)?)
                    }
                    ModeProto::Gather => SendMode::Gather,
                    ModeProto::Broadcast => SendMode::Broadcast,
                    ModeProto::Scatter => SendMode::Scatter,
                };
                Arc::new(ExchangeSenderExec::new(
                    Arc::clone(input),
                    exchange,
                    producer,
                    mode,
                ))
            }
            NodeProto::Receiver {
                exchange,
                schema,
                producer,
                producer_partitions,
                shuffle,
                partitioning,
                ordering,
                constants,
            } => {
                let schema = schema_from_bytes(&schema)?;
                let constants = constants
                    .iter()
                    .map(|c| expr_from(c, ctx, &schema, self))
                    .collect::<Result<_>>()?;
                let partitioning = partitioning_from(&partitioning, ctx, &schema, self)?;
                let sort = ordering_from(&ordering, ctx, &schema, self)?;
                Arc::new(
                    ExchangeReceiverExec::new(
                        exchange,
                        schema,
                        producer,
                        producer_partitions,
                        if shuffle {
                            ReceiveMode::Shuffle
                        } else {
                            ReceiveMode::Forward
                        },
                        partitioning,
                        LexOrdering::new(sort),
                    )
                    .with_constants(constants),
                )
            }
            NodeProto::FilterSource { id, columns, ship } => {
                let [input] = inputs else {
                    return internal_err!("a filter source has one input, got {}", inputs.len());
                };
                Arc::new(
                    FilterSourceExec::try_new(Arc::clone(input), id, columns)?.shipped_on(ship),
                )
            }
            NodeProto::FilterTarget { id, columns, from } => {
                let [input] = inputs else {
                    return internal_err!("a filter target has one input, got {}", inputs.len());
                };
                Arc::new(FilterTargetExec::try_new(
                    Arc::clone(input),
                    id,
                    columns,
                    from,
                )?)
            }
            NodeProto::Flow {
                settings,
                inputs: flow_inputs,
                exchange,
            } => {
                let [join] = inputs else {
                    return internal_err!("a Flow-Join has one input, got {}", inputs.len());
                };
                Arc::new(FlowJoinExec::try_new(
                    Arc::clone(join),
                    settings,
                    flow_inputs,
                    exchange,
                )?)
            }
            NodeProto::Radix => {
                let [join] = inputs else {
                    return internal_err!("a radix join has one input, got {}", inputs.len());
                };
                Arc::new(RadixJoinExec::try_new(Arc::clone(join))?)
            }
            NodeProto::Neo { settings, exchange } => {
                let [join] = inputs else {
                    return internal_err!("a Neo-Join has one input, got {}", inputs.len());
                };
                Arc::new(NeoJoinExec::try_new(Arc::clone(join), settings, exchange)?)
            }
            NodeProto::NeoAggregate {
                key,
                settings,
                exchange,
            } => {
                let [aggregate] = inputs else {
                    return internal_err!("a Neo aggregation has one input, got {}", inputs.len());
                };
                Arc::new(NeoAggregateExec::try_new(
                    Arc::clone(aggregate),
                    key,
                    settings,
                    exchange,
                )?)
            }
            NodeProto::FileScan { scan, compression } => {
                let scan = self.decode_plan(&scan, ctx)?;
                let mut config = scan
                    .downcast_ref::<DataSourceExec>()
                    .and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
                    .ok_or_else(|| internal_datafusion_err!("a file scan without its files"))?
                    .clone();
                config.file_compression_type =
                    FileCompressionType::from(compression.parse::<CompressionTypeVariant>()?);
                Arc::new(FileSplitScanExec::try_new(config)?)
            }
            NodeProto::FileCopy { template, write_id } => {
                let [input] = inputs else {
                    return internal_err!("a COPY has one input, got {}", inputs.len());
                };
                let template = self.decode_plan(&template, ctx)?;
                let sink = template
                    .downcast_ref::<DataSinkExec>()
                    .ok_or_else(|| internal_datafusion_err!("a COPY without its sink"))?;
                Arc::new(FileCopyExec::try_new(Arc::clone(input), sink, write_id)?)
            }
            NodeProto::Modify {
                table,
                schema,
                partitions,
                filters,
                assignments,
            } => {
                let schema = schema_from_bytes(&schema)?;
                let expr = |b: &[u8]| expr_from(b, ctx, &schema, self);
                let filters = filters.iter().map(|f| expr(f)).collect::<Result<_>>()?;
                let modification = match assignments {
                    None => Modification::Delete,
                    Some(a) => Modification::Update(
                        a.iter()
                            .map(|(i, e)| {
                                if *i >= schema.fields().len() {
                                    return internal_err!("an update of column {i}");
                                }
                                Ok((*i, expr(e)?))
                            })
                            .collect::<Result<_>>()?,
                    ),
                };
                Arc::new(GyreModifyExec::new(
                    table,
                    schema,
                    partitions,
                    filters,
                    modification,
                ))
            }
            NodeProto::PartitionedTopK {
                ordering,
                partition_prefix_len,
                fetch,
                rank,
            } => {
                let [input] = inputs else {
                    return internal_err!("a top-k has one input, got {}", inputs.len());
                };
                let sort = ordering_from(&ordering, ctx, &input.schema(), self)?;
                let expr = LexOrdering::new(sort)
                    .ok_or_else(|| internal_datafusion_err!("a top-k without an ordering"))?;
                Arc::new(PartitionedTopKExec::try_new(
                    Arc::clone(input),
                    expr,
                    partition_prefix_len,
                    fetch,
                    if rank {
                        WindowFnKind::Rank
                    } else {
                        WindowFnKind::RowNumber
                    },
                )?)
            }
            NodeProto::Cyclo {
                left_key,
                right_key,
                kernel,
                rotating_left,
                join_type,
                exchange,
                filter,
            } => {
                let [left, right] = inputs else {
                    return internal_err!("a cyclo-join needs two inputs, got {}", inputs.len());
                };
                let filter = filter
                    .as_ref()
                    .map(|f| filter_from(f, ctx, self))
                    .transpose()?;
                Arc::new(CycloJoinExec::try_new(
                    Arc::clone(left),
                    Arc::clone(right),
                    left_key,
                    right_key,
                    kernel,
                    filter,
                    if rotating_left {
                        CycloSide::Left
                    } else {
                        CycloSide::Right
                    },
                    join_type,
                    exchange,
                )?)
            }
        })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let proto = if let Some(s) = node.downcast_ref::<GyreScanExec>() {
            NodeProto::Scan {
                table: s.table.clone(),
                schema: schema_to_bytes(&s.table_schema)?,
                projection: s.projection.clone(),
                holders: s.holders.clone(),
                hash_key: s.hash_key.clone(),
                rows: s.rows,
                column_bytes: s.column_bytes.clone(),
                column_stats: s
                    .column_stats
                    .iter()
                    .map(|c| ColumnStats::from(c).encode_to_vec())
                    .collect(),
            }
        } else if let Some(s) = node.downcast_ref::<SnapshotScanExec>() {
            NodeProto::SnapshotScan {
                table: s.table.name.clone(),
                schema: schema_to_bytes(&s.table.schema)?,
                key: s.table.key.clone(),
                placement: s.table.placement,
                projection: s.projection.clone(),
                lsn: s.lsn,
                workers: s.properties().output_partitioning().partition_count(),
                rows: s.table.rows,
            }
        } else if let Some(i) = node.downcast_ref::<GyreInsertExec>() {
            NodeProto::Insert {
                table: i.table.clone(),
                key: i.key,
            }
        } else if let Some(g) = node.downcast_ref::<TpchGenExec>() {
            NodeProto::TpchGen {
                table: g.table.clone(),
                sf: g.scale_factor,
                partitions: g.partitions(),
            }
        } else if let Some(s) = node.downcast_ref::<ExchangeSenderExec>() {
            NodeProto::Sender {
                exchange: s.exchange(),
                producer: s.producer(),
                mode: match s.mode() {
                    SendMode::Shuffle(p) => ModeProto::Shuffle(partitioning_proto(p, self)?),
                    SendMode::Gather => ModeProto::Gather,
                    SendMode::Broadcast => ModeProto::Broadcast,
                    SendMode::Scatter => ModeProto::Scatter,
                },
            }
        } else if let Some(r) = node.downcast_ref::<ExchangeReceiverExec>() {
            NodeProto::Receiver {
                exchange: r.exchange(),
                schema: schema_to_bytes(&r.schema())?,
                producer: r.producer(),
                producer_partitions: r.producer_partitions(),
                shuffle: r.mode() == ReceiveMode::Shuffle,
                partitioning: partitioning_proto(
                    datafusion::physical_plan::ExecutionPlanProperties::output_partitioning(&node),
                    self,
                )?,
                ordering: r
                    .ordering()
                    .map(|o| ordering_proto(o, self))
                    .transpose()?
                    .unwrap_or_default(),
                constants: r
                    .constants()
                    .iter()
                    .map(|c| expr_bytes(c, self))
                    .collect::<Result<_>>()?,
            }
        } else if let Some(f) = node.downcast_ref::<FilterSourceExec>() {
            NodeProto::FilterSource {
                id: f.id(),
                columns: f.columns().to_vec(),
                ship: f.ship(),
            }
        } else if let Some(f) = node.downcast_ref::<FilterTargetExec>() {
            NodeProto::FilterTarget {
                id: f.id(),
                columns: f.columns().to_vec(),
                from: f.from(),
            }
        } else if let Some(f) = node.downcast_ref::<FlowJoinExec>() {
            NodeProto::Flow {
                settings: f.settings().clone(),
                inputs: f.inputs(),
                exchange: f.exchange(),
            }
        } else if node.is::<RadixJoinExec>() {
            NodeProto::Radix
        } else if let Some(neo) = node.downcast_ref::<NeoJoinExec>() {
            NodeProto::Neo {
                settings: neo.settings(),
                exchange: neo.exchange(),
            }
        } else if let Some(neo) = node.downcast_ref::<NeoAggregateExec>() {
            NodeProto::NeoAggregate {
                key: neo.key(),
                settings: neo.settings(),
                exchange: neo.exchange(),
            }
        } else if let Some(f) = node.downcast_ref::<FileSplitScanExec>() {
            let scan: Arc<dyn ExecutionPlan> =
                Arc::new(DataSourceExec::new(Arc::new(f.config().clone())));
            NodeProto::FileScan {
                scan: self.encode_plan(scan)?,
                compression: f.config().file_compression_type.get_variant().to_string(),
            }
        } else if let Some(c) = node.downcast_ref::<FileCopyExec>() {
            NodeProto::FileCopy {
                template: self.encode_plan(Arc::clone(c.template()))?,
                write_id: c.write_id().to_string(),
            }
        } else if let Some(m) = node.downcast_ref::<GyreModifyExec>() {
            NodeProto::Modify {
                table: m.table.clone(),
                schema: schema_to_bytes(&m.table_schema)?,
                partitions: m.partitions,
                filters: m
                    .filters
                    .iter()
                    .map(|f| expr_bytes(f, self))
                    .collect::<Result<_>>()?,
                assignments: match &m.modification {
                    Modification::Delete => None,
                    Modification::Update(a) => Some(
                        a.iter()
                            .map(|(i, e)| Ok((*i, expr_bytes(e, self)?)))
                            .collect::<Result<_>>()?,
                    ),
                },
            }
        } else if let Some(t) = node.downcast_ref::<PartitionedTopKExec>() {
            NodeProto::PartitionedTopK {
                ordering: ordering_proto(t.expr(), self)?,
                partition_prefix_len: t.partition_prefix_len(),
                fetch: t.fetch(),
                rank: match t.fn_kind() {
                    WindowFnKind::Rank => true,
                    WindowFnKind::RowNumber => false,
                },
            }
        } else if let Some(c) = node.downcast_ref::<CycloJoinExec>() {
            let (left_key, right_key) = c.keys();
            NodeProto::Cyclo {
                left_key,
                right_key,
                kernel: c.kernel(),
                rotating_left: c.rotating() == CycloSide::Left,
                join_type: c.join_type(),
                exchange: c.exchange(),
                filter: c.filter().map(|f| filter_proto(f, self)).transpose()?,
            }
        } else {
            return internal_err!("cannot serialise plan node {}", node.name());
        };
        buf.extend(
            postcard::to_allocvec(&proto)
                .map_err(|e| internal_datafusion_err!("cannot encode plan node: {e}"))?,
        );
        Ok(())
    }
}
