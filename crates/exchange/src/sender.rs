//! The producing side of an exchange: the root of every non-final stage.

use crate::codec::BatchEncoder;
use crate::context::{ExchangeId, Placement, QueryContext};
use arrow::array::RecordBatch;
use arrow::compute::BatchCoalescer;
use bytes::Bytes;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{CardinalityEffect, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::repartition::BatchPartitioner;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use gyre_transport::{NodeId, StreamKey, StreamSender, node_name};
use std::fmt;
use std::sync::Arc;

/// Rows gathered per destination before a shuffle sends a message.
const TARGET_BATCH_ROWS: usize = 8192;

/// Where the rows of each producer partition go.
#[derive(Debug, Clone)]
pub enum SendMode {
    /// Rows are hash- or round-robin-partitioned over the workers (partition `q` to worker `q`).
    Shuffle(Partitioning),
    /// Producer partition `p` goes to the coordinator.
    Gather,
    /// Producer partition `p` goes to every worker (one encoded message shared by all).
    Broadcast,
    /// Producer partition `p` goes to worker `p`.
    Scatter,
}

impl fmt::Display for SendMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shuffle(Partitioning::Hash(exprs, n)) => {
                let exprs: Vec<String> = exprs.iter().map(|e| e.to_string()).collect();
                write!(f, "shuffle hash([{}]) to {n} workers", exprs.join(", "))
            }
            Self::Shuffle(p) => write!(f, "shuffle {p}"),
            Self::Gather => write!(f, "gather to coordinator"),
            Self::Broadcast => write!(f, "broadcast to all workers"),
            Self::Scatter => write!(f, "scatter partition i to worker i"),
        }
    }
}

/// Sends its input's batches to the consumers of exchange `exchange`.
///
/// Its own output is empty: executing a partition drives the input to the end,
/// streaming every batch out as soon as it is produced.
#[derive(Debug)]
pub struct ExchangeSenderExec {
    input: Arc<dyn ExecutionPlan>,
    exchange: ExchangeId,
    producer: Placement,
    mode: SendMode,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl ExchangeSenderExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        exchange: ExchangeId,
        producer: Placement,
        mode: SendMode,
    ) -> Self {
        let props = Arc::new(
            PlanProperties::clone(input.properties()).with_emission_type(EmissionType::Final),
        );
        Self {
            input,
            exchange,
            producer,
            mode,
            props,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
    pub fn exchange(&self) -> ExchangeId {
        self.exchange
    }
    pub fn producer(&self) -> Placement {
        self.producer
    }
    pub fn mode(&self) -> &SendMode {
        &self.mode
    }

    fn destinations(&self, qc: &QueryContext, partition: usize) -> Result<Vec<NodeId>> {
        Ok(match &self.mode {
            SendMode::Shuffle(p) => {
                if p.partition_count() != qc.workers.len() {
                    return internal_err!(
                        "shuffle into {} partitions on {} workers",
                        p.partition_count(),
                        qc.workers.len()
                    );
                }
                qc.workers.clone()
            }
            SendMode::Gather => vec![gyre_transport::COORDINATOR],
            SendMode::Broadcast => qc.workers.clone(),
            SendMode::Scatter => vec![qc.node_of(Placement::Workers, partition)?],
        })
    }
}

impl DisplayAs for ExchangeSenderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "ExchangeSenderExec: exchange={}, {}",
            self.exchange, self.mode
        )
    }
}

/// Per-partition counters of a sender.
struct SendMetrics {
    rows: Count,
    batches: Count,
    bytes: Count,
    network_wait: Time,
    encode_time: Time,
}

impl SendMetrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            rows: MetricBuilder::new(set).counter("rows_sent", partition),
            batches: MetricBuilder::new(set).counter("batches_sent", partition),
            bytes: MetricBuilder::new(set).counter("bytes_sent", partition),
            network_wait: MetricBuilder::new(set).subset_time("network_wait", partition),
            encode_time: MetricBuilder::new(set).subset_time("encode_time", partition),
        }
    }
}

/// One outgoing stream and its IPC state.
struct Outlet {
    sender: StreamSender,
    encoder: BatchEncoder,
    coalescer: BatchCoalescer,
}

async fn send_one(outlet: &mut Outlet, batch: &RecordBatch, m: &SendMetrics) -> Result<()> {
    let msg = {
        let _t = m.encode_time.timer();
        outlet.encoder.encode(batch)?
    };
    send_bytes(&mut outlet.sender, msg, batch.num_rows(), m).await
}

async fn send_bytes(
    sender: &mut StreamSender,
    msg: Bytes,
    rows: usize,
    m: &SendMetrics,
) -> Result<()> {
    m.rows.add(rows);
    m.batches.add(1);
    m.bytes.add(msg.len());
    let t = m.network_wait.timer();
    let res = sender.send(msg).await;
    t.done();
    res.map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
}

impl ExchangeSenderExec {
    async fn run(
        self: Arc<Self>,
        partition: usize,
        ctx: Arc<TaskContext>,
        qc: Arc<QueryContext>,
    ) -> Result<()> {
        let m = SendMetrics::new(&self.metrics, partition);
        let schema = self.input.schema();
        let dests = self.destinations(&qc, partition)?;
        let mut outlets = Vec::with_capacity(dests.len());
        for &dest in &dests {
            let key = StreamKey {
                query: qc.query_id,
                exchange: self.exchange,
                from: partition as u32,
                to: dest,
            };
            let sender = qc
                .transport
                .sender(key, dest)
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
            outlets.push(Outlet {
                sender,
                encoder: BatchEncoder::try_new(&schema, qc.compression)?,
                coalescer: BatchCoalescer::new(Arc::clone(&schema), TARGET_BATCH_ROWS),
            });
        }
        let result = self.pump(partition, &ctx, &mut outlets, &m).await;
        match result {
            Ok(()) => {
                for o in outlets {
                    o.sender
                        .finish()
                        .await
                        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
                }
                Ok(())
            }
            Err(e) => {
                let msg = format!("{} failed: {e}", node_name(qc.me()));
                for o in outlets {
                    let _ = o.sender.fail(msg.clone()).await;
                }
                Err(e)
            }
        }
    }

    async fn pump(
        &self,
        partition: usize,
        ctx: &Arc<TaskContext>,
        outlets: &mut [Outlet],
        m: &SendMetrics,
    ) -> Result<()> {
        let mut input = self.input.execute(partition, Arc::clone(ctx))?;
        let mut partitioner = match &self.mode {
            SendMode::Shuffle(p) => Some(BatchPartitioner::try_new(
                p.clone(),
                Time::new(),
                partition,
                self.input.output_partitioning().partition_count(),
            )?),
            _ => None,
        };
        while let Some(batch) = input.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            match (&mut partitioner, &self.mode) {
                (Some(partitioner), _) => {
                    let parts: Vec<(usize, RecordBatch)> =
                        partitioner.partition_iter(batch)?.collect::<Result<_>>()?;
                    for (q, part) in parts {
                        let outlet = &mut outlets[q];
                        outlet.coalescer.push_batch(part)?;
                        while let Some(full) = outlet.coalescer.next_completed_batch() {
                            send_one(outlet, &full, m).await?;
                        }
                    }
                }
                (None, SendMode::Broadcast) => {
                    // Every stream of a broadcast carries the same IPC bytes: encode once
                    // with the first stream's encoder and share the buffer.
                    let (first, rest) = outlets.split_first_mut().expect("no workers");
                    let msg = {
                        let _t = m.encode_time.timer();
                        first.encoder.encode(&batch)?
                    };
                    send_bytes(&mut first.sender, msg.clone(), batch.num_rows(), m).await?;
                    for o in rest {
                        send_bytes(&mut o.sender, msg.clone(), batch.num_rows(), m).await?;
                    }
                }
                (None, _) => send_one(&mut outlets[0], &batch, m).await?,
            }
        }
        if partitioner.is_some() {
            for outlet in outlets.iter_mut() {
                outlet.coalescer.finish_buffered_batch()?;
                while let Some(full) = outlet.coalescer.next_completed_batch() {
                    send_one(outlet, &full, m).await?;
                }
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for ExchangeSenderExec {
    fn name(&self) -> &'static str {
        "ExchangeSenderExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        if let SendMode::Shuffle(Partitioning::Hash(exprs, _)) = &self.mode {
            for e in exprs {
                if f(e)? == TreeNodeRecursion::Stop {
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| datafusion::error::DataFusionError::Internal("one child".into()))?;
        Ok(Arc::new(Self::new(
            input,
            self.exchange,
            self.producer,
            self.mode.clone(),
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let qc = QueryContext::of(&context)?;
        let me = Arc::new(Self {
            input: Arc::clone(&self.input),
            exchange: self.exchange,
            producer: self.producer,
            mode: self.mode.clone(),
            props: Arc::clone(&self.props),
            metrics: self.metrics.clone(),
        });
        let fut = me.run(partition, context, qc);
        let stream = futures::stream::once(fut).try_filter_map(|()| async { Ok(None) });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::Unknown
    }
}
