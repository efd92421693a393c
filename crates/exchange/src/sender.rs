//! The producing side of an exchange: the root of every non-final stage.

use crate::codec::BatchEncoder;
use crate::context::{ExchangeId, Placement, QueryContext};
use arrow::array::RecordBatch;
use arrow::compute::BatchCoalescer;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{CardinalityEffect, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::repartition::BatchPartitioner;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use gyre_transport::{NodeId, SendEndpoint, To, node_name};
use std::fmt;
use std::sync::Arc;

/// Share of a message buffer a coalesced batch aims to fill: IPC framing, padding and
/// the estimate's error take the rest, so that messages rarely outgrow their buffer.
const FILL: f64 = 0.75;

/// Rows per message before anything is known about the data.
const DEFAULT_ROWS: usize = 8192;

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
pub(crate) struct SendMetrics {
    rows: Count,
    batches: Count,
    bytes: Count,
    messages: Count,
    oversize: Count,
    /// Time waiting for credits and buffers (backpressure).
    network_wait: Time,
    credit_wait: Time,
    buffer_wait: Time,
    encode_time: Time,
    pool_high_water: Gauge,
}

impl SendMetrics {
    pub(crate) fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let m = || MetricBuilder::new(set);
        Self {
            rows: m().counter("rows_sent", partition),
            batches: m().counter("batches_sent", partition),
            bytes: m().counter("bytes_sent", partition),
            messages: m().counter("messages_sent", partition),
            oversize: m().counter("oversize_messages", partition),
            network_wait: m().subset_time("network_wait", partition),
            credit_wait: m().subset_time("credit_wait", partition),
            buffer_wait: m().subset_time("buffer_wait", partition),
            encode_time: m().subset_time("encode_time", partition),
            pool_high_water: m().gauge("send_pool_high_water", partition),
        }
    }
}

/// Rows per message, learned from the bytes per row of what was encoded so far.
#[derive(Debug, Clone, Copy)]
struct Sizer {
    target_bytes: f64,
    bytes_per_row: Option<f64>,
}

impl Sizer {
    fn new(message_size: usize) -> Self {
        Self {
            target_bytes: message_size as f64 * FILL,
            bytes_per_row: None,
        }
    }

    fn rows(&self) -> usize {
        self.bytes_per_row.map_or(DEFAULT_ROWS, |b| {
            (self.target_bytes / b.max(1.0)).clamp(1.0, (1 << 20) as f64) as usize
        })
    }

    /// A first guess from the memory a batch's rows take (close to their IPC size
    /// uncompressed). A slice counts only its own rows, except for types whose slice
    /// size arrow cannot tell (views): their whole buffers count, an overestimate, so
    /// the first message is small rather than oversize.
    fn guess(&mut self, batch: &RecordBatch) {
        if self.bytes_per_row.is_none() && batch.num_rows() > 0 {
            let bytes: usize = batch
                .columns()
                .iter()
                .map(|c| match c.data_type() {
                    DataType::Utf8View | DataType::BinaryView => c.get_array_memory_size(),
                    _ => c
                        .to_data()
                        .get_slice_memory_size()
                        .unwrap_or_else(|_| c.get_array_memory_size()),
                })
                .sum();
            self.bytes_per_row = Some(bytes as f64 / batch.num_rows() as f64);
        }
    }

    fn observe(&mut self, bytes: usize, rows: usize) {
        if rows > 0 {
            self.bytes_per_row = Some(bytes as f64 / rows as f64);
        }
    }
}

/// One destination set (a worker, the coordinator, or all workers) and its IPC stream.
///
/// Rows are copied into message-sized batches by a coalescer (which also compacts
/// slices and view arrays, whose IPC encoding would otherwise carry whole shared
/// buffers); each completed batch is encoded into one pooled buffer. The batch size
/// follows the bytes per row learned from what was encoded.
pub(crate) struct Outlet {
    to: To,
    schema: SchemaRef,
    encoder: BatchEncoder,
    coalescer: Option<BatchCoalescer>,
    coalesce_rows: usize,
    sizer: Sizer,
}

impl Outlet {
    /// An outlet for `ep` with the query's compression for the measured link.
    pub(crate) fn of_query(
        to: To,
        schema: &SchemaRef,
        qc: &QueryContext,
        ep: &SendEndpoint,
    ) -> Result<Self> {
        let compression = qc.compression.resolve(qc.transport.link_rate());
        Ok(Self::new(
            to,
            Arc::clone(schema),
            BatchEncoder::try_new(schema, compression)?,
            ep.message_size(),
        ))
    }

    pub(crate) fn new(
        to: To,
        schema: SchemaRef,
        encoder: BatchEncoder,
        message_size: usize,
    ) -> Self {
        Self {
            to,
            schema,
            encoder,
            coalescer: None,
            coalesce_rows: 0,
            sizer: Sizer::new(message_size),
        }
    }

    /// Makes the coalescer's batch size follow the learned one when it moved by more
    /// than a quarter, carrying over the rows it holds.
    fn resize(&mut self) -> Result<()> {
        let rows = self.sizer.rows();
        let (have, want) = (self.coalesce_rows, rows);
        if self.coalescer.is_some() && want * 4 >= have * 3 && want * 3 <= have * 4 {
            return Ok(());
        }
        let mut next = BatchCoalescer::new(Arc::clone(&self.schema), rows);
        if let Some(mut old) = self.coalescer.take() {
            old.finish_buffered_batch()?;
            while let Some(b) = old.next_completed_batch() {
                next.push_batch(b)?;
            }
        }
        self.coalescer = Some(next);
        self.coalesce_rows = rows;
        Ok(())
    }

    /// Adds rows; sends every message-sized batch that is complete.
    pub(crate) async fn push(
        &mut self,
        ep: &SendEndpoint,
        batch: RecordBatch,
        m: &SendMetrics,
    ) -> Result<()> {
        self.sizer.guess(&batch);
        self.resize()?;
        self.coalescer
            .as_mut()
            .expect("created by resize")
            .push_batch(batch)?;
        self.drain(ep, m).await
    }

    async fn drain(&mut self, ep: &SendEndpoint, m: &SendMetrics) -> Result<()> {
        loop {
            self.resize()?;
            let Some(full) = self
                .coalescer
                .as_mut()
                .and_then(|c| c.next_completed_batch())
            else {
                return Ok(());
            };
            self.send(ep, full, m).await?;
        }
    }

    /// Sends what is left.
    pub(crate) async fn flush(&mut self, ep: &SendEndpoint, m: &SendMetrics) -> Result<()> {
        if let Some(c) = &mut self.coalescer {
            c.finish_buffered_batch()?;
        }
        while let Some(full) = self
            .coalescer
            .as_mut()
            .and_then(|c| c.next_completed_batch())
        {
            self.send(ep, full, m).await?;
        }
        Ok(())
    }

    /// Encodes one batch into one message.
    async fn send(&mut self, ep: &SendEndpoint, batch: RecordBatch, m: &SendMetrics) -> Result<()> {
        let t = m.network_wait.timer();
        let buf = ep.acquire(self.to).await.map_err(transport_err)?;
        t.done();
        let buf = {
            let _t = m.encode_time.timer();
            self.encoder.encode_into(&batch, buf)?
        };
        self.sizer.observe(buf.len(), batch.num_rows());
        m.rows.add(batch.num_rows());
        m.batches.add(1);
        m.bytes.add(buf.len());
        m.messages.add(1);
        ep.put(buf, false).map_err(transport_err)
    }
}

pub(crate) fn transport_err(e: gyre_transport::TransportError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
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
        let ep = qc.open_send(self.exchange, partition, dests.clone())?;
        let compression = qc.compression.resolve(qc.transport.link_rate());
        let size = ep.message_size();
        let targets: Vec<To> = match &self.mode {
            SendMode::Shuffle(_) => dests.iter().map(|d| To::Node(*d)).collect(),
            SendMode::Broadcast => vec![To::All],
            SendMode::Gather | SendMode::Scatter => vec![To::Node(dests[0])],
        };
        let mut outlets = targets
            .into_iter()
            .map(|to| {
                let encoder = BatchEncoder::try_new(&schema, compression)?;
                Ok(Outlet::new(to, Arc::clone(&schema), encoder, size))
            })
            .collect::<Result<Vec<_>>>()?;
        let result = self.pump(partition, &ctx, &ep, &mut outlets, &m).await;
        let s = ep.stats();
        m.credit_wait.add_duration(s.credit_wait);
        m.buffer_wait.add_duration(s.acquire_wait);
        m.oversize.add(s.oversize as usize);
        m.pool_high_water
            .set_max(qc.transport.stats().send_pool.high_water);
        match result {
            Ok(()) => {
                ep.finish();
                Ok(())
            }
            Err(e) => {
                let place = format!(
                    "sender of exchange {} on {}",
                    self.exchange,
                    node_name(qc.me())
                );
                ep.fail(&crate::RelayedError::at(&e, &place).wire());
                Err(e)
            }
        }
    }

    async fn pump(
        &self,
        partition: usize,
        ctx: &Arc<TaskContext>,
        ep: &SendEndpoint,
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
            match &mut partitioner {
                Some(partitioner) => {
                    let parts: Vec<(usize, RecordBatch)> =
                        partitioner.partition_iter(batch)?.collect::<Result<_>>()?;
                    for (q, part) in parts {
                        if part.num_rows() > 0 {
                            outlets[q].push(ep, part, m).await?;
                        }
                    }
                }
                // Broadcast: one outlet addressed to all workers, so each message is
                // encoded once and shared. Gather and scatter: one destination.
                None => outlets[0].push(ep, batch, m).await?,
            }
        }
        for outlet in outlets.iter_mut() {
            outlet.flush(ep, m).await?;
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
