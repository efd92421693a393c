//! The consuming side of an exchange: a leaf of the stage that reads another
//! stage's output.
//!
//! Its memory counts in the worker's pool as `ExchangeReceiverExec[partition]`:
//! the messages the transport holds for it (at most its sources' credits) and the
//! batches decoded from the last one. The consumer only grows without checking the
//! limit: the senders' credits already bound those bytes and refusing them would
//! free nothing, but the pool sees them, so operators that can spill do so sooner.

use crate::codec::BatchDecoder;
use crate::context::{ExchangeId, Placement, QueryContext};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::{
    AcrossPartitions, ConstExpr, EquivalenceProperties, LexOrdering, PhysicalExpr,
};
use datafusion::physical_plan::coop::make_cooperative;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use gyre_transport::{ReceiveEndpoint, ReceiveSpec};
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

/// Which producer partitions a receiver partition reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiveMode {
    /// Partition `q` merges what every producer partition routed to it (a shuffle).
    Shuffle,
    /// Partition `p` is producer partition `p` (gather, broadcast, scatter).
    Forward,
}

/// Reads the batches of exchange `exchange` from the transport.
#[derive(Debug)]
pub struct ExchangeReceiverExec {
    exchange: ExchangeId,
    schema: SchemaRef,
    producer: Placement,
    producer_partitions: usize,
    mode: ReceiveMode,
    ordering: Option<LexOrdering>,
    /// Expressions with one value in every row the producer sends (after a filter
    /// `a = 1`, say), so in every row received, whatever the exchange.
    constants: Vec<Arc<dyn PhysicalExpr>>,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl ExchangeReceiverExec {
    /// The receiver of an exchange every worker sends to, as the joins a network
    /// operator builds at run time read it (Flow-Join's, Neo-Join's).
    pub(crate) fn shuffled(exchange: u32, schema: SchemaRef, n: usize) -> Self {
        Self::new(
            exchange,
            schema,
            Placement::Workers,
            n,
            ReceiveMode::Shuffle,
            Partitioning::UnknownPartitioning(n),
            None,
        )
    }

    /// `partitioning` describes the receiver's output; for [`ReceiveMode::Forward`] its
    /// partition count must equal `producer_partitions`. `ordering` is the sort order
    /// each producer partition guarantees, kept so merges above stay valid.
    pub fn new(
        exchange: ExchangeId,
        schema: SchemaRef,
        producer: Placement,
        producer_partitions: usize,
        mode: ReceiveMode,
        partitioning: Partitioning,
        ordering: Option<LexOrdering>,
    ) -> Self {
        let eq = match &ordering {
            Some(o) => {
                EquivalenceProperties::new_with_orderings(Arc::clone(&schema), [o.iter().cloned()])
            }
            None => EquivalenceProperties::new(Arc::clone(&schema)),
        };
        let props = Arc::new(
            PlanProperties::new(
                eq,
                partitioning,
                EmissionType::Incremental,
                Boundedness::Bounded,
            )
            .with_scheduling_type(SchedulingType::Cooperative),
        );
        Self {
            exchange,
            schema,
            producer,
            producer_partitions,
            mode,
            ordering,
            constants: vec![],
            props,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The receiver, knowing that `constants` have one value in every row the producer
    /// sends (declared heterogeneous: the value itself does not travel). Planning hints
    /// only: if DataFusion cannot take them, the receiver stays without.
    pub fn with_constants(mut self, constants: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        let mut props = PlanProperties::clone(&self.props);
        let added = props.eq_properties.add_constants(
            constants
                .iter()
                .map(|e| ConstExpr::new(Arc::clone(e), AcrossPartitions::Heterogeneous)),
        );
        if added.is_ok() {
            self.props = Arc::new(props);
            self.constants = constants;
        }
        self
    }

    pub fn constants(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.constants
    }

    pub fn exchange(&self) -> ExchangeId {
        self.exchange
    }
    pub fn producer(&self) -> Placement {
        self.producer
    }
    pub fn producer_partitions(&self) -> usize {
        self.producer_partitions
    }
    pub fn mode(&self) -> ReceiveMode {
        self.mode
    }
    pub fn ordering(&self) -> Option<&LexOrdering> {
        self.ordering.as_ref()
    }
}

impl DisplayAs for ExchangeReceiverExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let mode = match self.mode {
            ReceiveMode::Shuffle => "shuffle",
            ReceiveMode::Forward => "forward",
        };
        write!(
            f,
            "ExchangeReceiverExec: exchange={}, {mode} from {} {} partitions",
            self.exchange, self.producer_partitions, self.producer
        )
    }
}

struct RecvMetrics {
    rows: Count,
    batches: Count,
    bytes: Count,
    messages: Count,
    network_wait: Time,
    decode_time: Time,
}

/// State of one receiving partition while it is being read.
struct Inflow {
    endpoint: ReceiveEndpoint,
    /// One IPC stream per source.
    decoders: Vec<BatchDecoder>,
    /// Decoded batches not yet passed on, with their sizes.
    ready: VecDeque<(RecordBatch, usize)>,
    /// What the transport holds for this partition plus `ready`.
    memory: MemoryReservation,
    metrics: RecvMetrics,
}

impl Inflow {
    /// Brings the reservation to the bytes held now.
    fn account(&mut self) {
        let ready: usize = self.ready.iter().map(|(_, n)| n).sum();
        self.memory.resize(self.endpoint.queued_bytes() + ready);
    }
}

/// The bytes a batch's arrays use (slices of a shared message buffer count only their
/// own part).
fn batch_bytes(b: &RecordBatch) -> usize {
    b.columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum()
}

fn transport_err(e: gyre_transport::TransportError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

fn inflow_stream(inflow: Inflow) -> impl futures::Stream<Item = Result<RecordBatch>> + Send {
    futures::stream::try_unfold(inflow, |mut s| async move {
        loop {
            if let Some((batch, _)) = s.ready.pop_front() {
                s.account();
                s.metrics.rows.add(batch.num_rows());
                s.metrics.batches.add(1);
                return Ok(Some((batch, s)));
            }
            let t = s.metrics.network_wait.timer();
            let msg = s.endpoint.get().await.map_err(transport_err)?;
            t.done();
            let Some(msg) = msg else {
                s.memory.free();
                return Ok(None);
            };
            if msg.data().is_empty() {
                continue; // a bare end-of-stream marker
            }
            s.metrics.bytes.add(msg.data().len());
            s.metrics.messages.add(1);
            let batches = {
                let _t = s.metrics.decode_time.timer();
                s.decoders[msg.source].decode(msg.bytes())?
            };
            // Released at once: the buffer goes back to the pool, or is replaced in it
            // if the decoded batches are kept (they share its memory).
            s.endpoint.release(msg);
            s.ready.extend(batches.into_iter().map(|b| {
                let n = batch_bytes(&b);
                (b, n)
            }));
            s.account();
        }
    })
}

impl ExecutionPlan for ExchangeReceiverExec {
    fn name(&self) -> &'static str {
        "ExchangeReceiverExec"
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
        let qc = QueryContext::of(&context)?;
        let m = || MetricBuilder::new(&self.metrics);
        let metrics = RecvMetrics {
            rows: m().counter("rows_received", partition),
            batches: m().counter("batches_received", partition),
            bytes: m().counter("bytes_received", partition),
            messages: m().counter("messages_received", partition),
            network_wait: m().subset_time("network_wait", partition),
            decode_time: m().subset_time("decode_time", partition),
        };
        let slots: Vec<usize> = match self.mode {
            ReceiveMode::Shuffle => (0..self.producer_partitions).collect(),
            ReceiveMode::Forward => vec![partition],
        };
        let sources = slots
            .into_iter()
            .map(|slot| Ok((slot as u32, qc.node_of(self.producer, slot)?)))
            .collect::<Result<Vec<_>>>()?;
        let decoders = sources.iter().map(|_| BatchDecoder::default()).collect();
        let endpoint = qc
            .transport
            .open_receive(ReceiveSpec {
                query: qc.query_id,
                exchange: self.exchange,
                sources,
            })
            .map_err(transport_err)?;
        let memory = MemoryConsumer::new(format!("ExchangeReceiverExec[{partition}]"))
            .register(context.memory_pool());
        let stream = inflow_stream(Inflow {
            endpoint,
            decoders,
            ready: VecDeque::new(),
            memory,
            metrics,
        });
        // Arriving messages never make the stream wait once they are queued: it
        // yields to tokio by budget, so a query on a busy worker can still be stopped.
        Ok(make_cooperative(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        ))))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
