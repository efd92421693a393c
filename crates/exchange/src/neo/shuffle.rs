//! One worker's Neo shuffle. [`execute`] builds the operator's local plan over the
//! exchanges that bring this worker its partitions' rows and starts the *router*
//! task that feeds them. The router's states, in order:
//!
//! 1. **Collect**: every local input, counted in the worker's memory pool; the key of
//!    every row, as the kernels' ordered 64-bit value. Chosen at run time, only the
//!    first `sample_rows` rows of each input at first, in input order; a first input
//!    that feeds a run-time filter is collected whole before the second is read,
//!    since the filter's target may hold back the second input (in this stage or in
//!    the stage sending it) until the first one ends.
//! 2. **Domain**: all workers swap their smallest and largest key (exchange +0), so
//!    that all use one fine-bucket domain.
//! 3. **Histogram**: bytes per fine bucket and input, and per worker a hash shuffle
//!    would send them to, sent to worker 0 (+1).
//! 4. **Assign** (worker 0): adaptive (or plain radix) partitions, the assignment and
//!    its schedule; the partition bounds and placements go to every worker (+2), or,
//!    chosen at run time, "hash placement" where the assignment saves too little.
//!    Decided on samples, "hash placement" stands, and anything else means "collect
//!    every row": states 1 to 4 again on all of them, with the three exchanges after
//!    the round barrier.
//! 5. **Route**: every row of the first input, then of the second, to the worker that
//!    processes its partition, or to all for a broadcast side (+3, +4), or where a
//!    hash shuffle sends it, the rows not collected as they arrive (a hash shuffle's
//!    cost, and the samples'); then end of stream. Rows this worker processes itself
//!    skip the transport: they go to its local plan through a channel, as the rows of
//!    the other workers arrive through the exchange. Under the open-shop schedule each
//!    input's rows move in the rounds of that input's schedule, which every worker
//!    computes from the transfer matrices worker 0 sends with the assignment, kept in
//!    step by a round barrier (the last exchange, `gyre_transport::rounds`).
//!
//! A join reads its build exchange to the end before its probe exchange, and every
//! router sends all build rows before any probe row, so no worker waits in a cycle.
//! Any failure fails every data endpoint, so every worker's local plan learns why.

use super::{
    ASSIGNMENT_EXCHANGE, DOMAIN_EXCHANGE, FIRST_DATA_EXCHANGE, HISTOGRAM_EXCHANGE, NeoReport,
    NeoSchedule, NeoSettings, second_decision,
};
use crate::RelayedError;
use crate::context::{ExchangeId, QueryContext};
use crate::key_hash::hash_keys;
use crate::memory::{collect_counted, collect_counted_prefix};
use crate::prepared::PreparedInputExec;
use crate::receiver::ExchangeReceiverExec;
use crate::runtime_filter::FilterSourceExec;
use crate::sender::{Outlet, SendMetrics, transport_err};
use crate::task::{AbortOnDrop, run_detached};
use arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow::buffer::NullBuffer;
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, internal_datafusion_err, internal_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream,
};
use futures::StreamExt;
use gyre_join::cyclo::{RingSpec, scatter};
use gyre_join::neo::{
    AssignOptions, Broadcastable, Costs, FineHistogram, Method, NodeRound, PartitionMap, Placement,
    RadixDomain, Sizes, Solved, assign, node_rounds, open_shop,
};
use gyre_join::{KeyDomain, Keys};
use gyre_transport::rounds::{Next, RoundBarrier};
use gyre_transport::{NodeId, SendEndpoint, To, node_name};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use strength_reduce::StrengthReducedU64;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The link rate the solver's time limit assumes (bytes per second, 1 Gbit/s) until
/// the transport has measured one. After run-time filters, TPC-H Q14's and Q19's
/// inputs are kilobytes, and the solver used its whole 100 ms on them without proving
/// an optimum: it now gets a tenth of the greedy assignment's shuffle time.
const ASSUMED_LINK_RATE: f64 = 125e6;

/// Placement codes on the wire (a worker's index otherwise).
const BROADCAST_BUILD: u64 = u64::MAX - 1;
const BROADCAST_PROBE: u64 = u64::MAX;
/// The whole assignment when the rows go where a hash shuffle sends them.
const HASH_PLACEMENT: u64 = u64::MAX;
/// The whole assignment when samples did not settle it: collect every row, decide again.
const COLLECT_ALL: u64 = u64::MAX - 1;

/// Where rows whose key is NULL go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NullKeys {
    /// They stay on the worker that has them: in a join they match nothing.
    Stay,
    /// All to worker 0: in an aggregation NULL is one group.
    ToFirstWorker,
}

/// A network operator that moves its inputs by a Neo shuffle, as the shuffle sees it.
pub(super) struct Shuffled<'a> {
    /// "Neo-Join", "Neo aggregation": how errors name it.
    pub what: &'static str,
    /// What runs on the rows that arrive: its children (one or two) are the operator's
    /// unshuffled inputs, replaced by streams of the rows this worker processes.
    pub local: &'a Arc<dyn ExecutionPlan>,
    /// Per input: how its local stand-in is named.
    pub input_names: &'static [&'static str],
    /// Per input: the integer or date key its rows are placed by.
    pub keys: Vec<PhysicalExprRef>,
    /// Which of two inputs may be broadcast instead of partitioned.
    pub broadcast: Broadcastable,
    pub nulls: NullKeys,
    pub settings: NeoSettings,
    pub exchange: Option<ExchangeId>,
    pub metrics: &'a ExecutionPlanMetricsSet,
    pub report: &'a Arc<Mutex<NeoReport>>,
}

/// Runs partition `partition` of `op`: its local plan, with `run_local` (given the
/// local plan over the arriving rows), and the router that feeds it.
pub(super) fn execute(
    op: Shuffled<'_>,
    partition: usize,
    ctx: Arc<TaskContext>,
    run_local: impl FnOnce(Arc<dyn ExecutionPlan>) -> Result<SendableRecordBatchStream>,
) -> Result<SendableRecordBatchStream> {
    let qc = QueryContext::of(&ctx)?;
    let n = qc.workers.len();
    let what = op.what;
    let Some(first) = op.exchange else {
        return internal_err!("a {what} ran without exchange ids");
    };
    let children: Vec<Arc<dyn ExecutionPlan>> = op.local.children().into_iter().cloned().collect();
    if children.is_empty()
        || children.len() > 2
        || children.len() != op.keys.len()
        || children.len() != op.input_names.len()
    {
        return internal_err!(
            "a {what} with {} inputs and {} keys",
            children.len(),
            op.keys.len()
        );
    }
    if let Some(c) = children
        .iter()
        .find(|c| c.output_partitioning().partition_count() != n)
        .or((partition >= n).then_some(&children[0]))
    {
        return internal_err!(
            "{what} partition {partition} of a plan for {} workers, run on {n}",
            c.output_partitioning().partition_count()
        );
    }
    // The data endpoints first: whatever fails later fails them, so no worker waits.
    let endpoints = (0..children.len() as u32)
        .map(|s| {
            qc.open_send(
                first + FIRST_DATA_EXCHANGE + s,
                partition,
                qc.workers.clone(),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let me = node_name(qc.me());
    let fail = move |eps: &[SendEndpoint], e: &DataFusionError| {
        let why = RelayedError::at(e, &format!("{me} in a {what}")).wire();
        for ep in eps {
            ep.fail(&why);
        }
    };
    let inputs = children
        .iter()
        .map(|c| c.execute(partition, Arc::clone(&ctx)))
        .collect::<Result<Vec<_>>>();
    let inputs = match inputs {
        Ok(inputs) => inputs,
        Err(e) => {
            fail(&endpoints, &e);
            return Err(e);
        }
    };

    // Each input of the local plan: the rows other workers send, and the rows this
    // worker keeps (no encoding, no transport).
    let (kept, kept_rx): (Vec<_>, Vec<_>) = children
        .iter()
        .map(|_| mpsc::unbounded_channel::<RecordBatch>())
        .unzip();
    let local = (|| {
        let arriving = children
            .iter()
            .zip(kept_rx)
            .enumerate()
            .map(|(s, (child, kept))| -> Result<Arc<dyn ExecutionPlan>> {
                let exchange = first + FIRST_DATA_EXCHANGE + s as u32;
                let schema = child.schema();
                let received = ExchangeReceiverExec::shuffled(exchange, Arc::clone(&schema), n)
                    .execute(partition, Arc::clone(&ctx))?;
                let kept = UnboundedReceiverStream::new(kept).map(Ok);
                let both =
                    RecordBatchStreamAdapter::new(schema, futures::stream::select(received, kept));
                Ok(PreparedInputExec::new(op.input_names[s], Box::pin(both), n))
            })
            .collect::<Result<Vec<_>>>()?;
        let local = Arc::clone(op.local).replace_children(
            arriving,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )?;
        run_local(local)
    })();
    let output = match local {
        Ok(output) => output,
        Err(e) => {
            fail(&endpoints, &e);
            return Err(e);
        }
    };

    let m = || MetricBuilder::new(op.metrics);
    let router = Router {
        whole_before: children.len() > 1 && feeds_filters(&children[0]),
        qc: Arc::clone(&qc),
        what,
        partition,
        first,
        settings: op.settings,
        broadcast: op.broadcast,
        nulls: op.nulls,
        keys: op.keys,
        schemas: children.iter().map(|c| c.schema()).collect(),
        report: Arc::clone(op.report),
        metrics: RouterMetrics {
            send: SendMetrics::new(op.metrics, partition),
            kept: m().counter("rows_kept", partition),
            shipped: m().counter("rows_shipped", partition),
            broadcast: m().counter("rows_broadcast", partition),
            plan_time: m().subset_time("plan_time", partition),
            round_wait: m().subset_time("round_wait", partition),
        },
    };
    let reservation =
        MemoryConsumer::new(format!("{what}[{partition}] inputs")).register(ctx.memory_pool());
    let (err_tx, err_rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let result = router.run(inputs, &endpoints, kept, &reservation).await;
        if let Err(e) = result {
            fail(&endpoints, &e);
            let _ = err_tx.send(e);
        }
    });
    // The router ends with the query's output: a failed local plan or a released
    // query stops it (the output runs detached, so a consumer that stops early does
    // not).
    let guard = AbortOnDrop(task);
    let schema = output.schema();
    let output = futures::stream::select(output, UnboundedReceiverStream::new(err_rx).map(Err))
        .map(move |batch| {
            let _ = &guard;
            batch
        });
    Ok(run_detached(schema, output.boxed()))
}

struct RouterMetrics {
    send: SendMetrics,
    kept: Count,
    shipped: Count,
    broadcast: Count,
    plan_time: Time,
    /// Time the open-shop schedule's barrier waited for other workers.
    round_wait: Time,
}

/// One side's collected rows with their ordered keys.
struct Side {
    batches: Vec<RecordBatch>,
    /// Bytes of the batches and of the keys and destinations below, as counted in
    /// the memory pool.
    batch_bytes: usize,
    key_bytes: usize,
    /// Per batch: the ordered key of every row and which are NULL.
    keys: Vec<(Vec<u64>, Option<NullBuffer>)>,
    /// Per batch and worker: the rows a hash shuffle sends there (a NULL key's row
    /// where [`Router::null_to`] says); empty unless hash placement may be chosen at
    /// run time.
    hash_to: Vec<Vec<Vec<u32>>>,
    /// Bytes a hash shuffle sends to each worker (this one's stay).
    hash_bytes: Vec<u64>,
    row_bytes: u64,
    /// Smallest and largest non-NULL key, if any.
    range: Option<(u64, u64)>,
}

impl Side {
    /// Every non-NULL ordered key.
    fn valid_keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys.iter().flat_map(|(keys, nulls)| {
            keys.iter()
                .enumerate()
                .filter(move |(i, _)| nulls.as_ref().is_none_or(|n| n.is_valid(*i)))
                .map(|(_, &k)| k)
        })
    }
}

/// Largest bytes a worker may report for one fine bucket: sums of many stay far from
/// overflowing (a peer's histogram is checked against it).
const MAX_BUCKET_BYTES: u64 = 1 << 48;

struct Router {
    /// Every input but the last is collected whole before the next one is read: the
    /// next one may wait for it to end.
    whole_before: bool,
    qc: Arc<QueryContext>,
    what: &'static str,
    partition: usize,
    first: u32,
    settings: NeoSettings,
    broadcast: Broadcastable,
    nulls: NullKeys,
    /// Per input.
    keys: Vec<PhysicalExprRef>,
    schemas: Vec<SchemaRef>,
    report: Arc<Mutex<NeoReport>>,
    metrics: RouterMetrics,
}

impl Router {
    /// Where this worker sends a row whose key is NULL, however the rows are placed.
    fn null_to(&self) -> usize {
        match self.nulls {
            NullKeys::Stay => self.partition,
            NullKeys::ToFirstWorker => 0,
        }
    }

    async fn run(
        &self,
        inputs: Vec<SendableRecordBatchStream>,
        endpoints: &[SendEndpoint],
        kept: Vec<mpsc::UnboundedSender<RecordBatch>>,
        reservation: &MemoryReservation,
    ) -> Result<()> {
        // Chosen at run time, the first decision is taken on each input's first rows.
        let sample = match self.settings.min_saving {
            Some(_) if self.settings.sample_rows > 0 => self.settings.sample_rows as usize,
            _ => usize::MAX,
        };
        let mut collected = Vec::with_capacity(inputs.len());
        let mut rests = Vec::with_capacity(inputs.len());
        let last = inputs.len() - 1;
        for (s, mut input) in inputs.into_iter().enumerate() {
            let rows = match self.whole_before && s < last {
                true => usize::MAX,
                false => sample,
            };
            let (batches, ended) = collect_counted_prefix(&mut input, rows, reservation).await?;
            collected.push(batches);
            rests.push((!ended).then_some(input));
        }
        let complete = rests.iter().all(Option::is_none);
        let mut sides = self.sides(collected, reservation)?;
        let mut routing = self.decide(0, &sides, complete).await?;
        if let Routing::CollectAll = routing {
            // The samples did not settle it: every row, and the decision again.
            let mut all = Vec::with_capacity(sides.len());
            for (side, rest) in sides.into_iter().zip(&mut rests) {
                reservation.shrink(side.key_bytes);
                let mut batches = side.batches;
                if let Some(rest) = rest.take() {
                    batches.extend(collect_counted(rest, reservation).await?);
                }
                all.push(batches);
            }
            sides = self.sides(all, reservation)?;
            routing = self
                .decide(second_decision(self.keys.len() as u32), &sides, true)
                .await?;
        }
        let assigned = match routing {
            Routing::Hash => {
                let each = sides.into_iter().zip(rests).zip(kept).enumerate();
                for (s, ((side, rest), kept)) in each {
                    self.route_by_hash(s, side, rest, &endpoints[s], kept, reservation)
                        .await?;
                }
                return Ok(());
            }
            Routing::Neo(assigned) if rests.iter().all(Option::is_none) => assigned,
            _ => {
                return internal_err!(
                    "a {} was told to place rows it has not collected",
                    self.what
                );
            }
        };
        let mut barrier = match &assigned.rounds {
            Some(_) => Some(
                RoundBarrier::open(
                    self.qc.transport.as_ref(),
                    self.qc.query_id,
                    self.first + FIRST_DATA_EXCHANGE + self.keys.len() as u32,
                    self.qc.workers.clone(),
                    self.partition,
                )
                .map_err(transport_err)?,
            ),
            None => None,
        };
        for (s, (side, kept)) in sides.into_iter().zip(kept).enumerate() {
            self.route(
                s,
                side,
                &assigned,
                &endpoints[s],
                kept,
                barrier.as_mut(),
                reservation,
            )
            .await?;
        }
        if let Some(barrier) = barrier {
            barrier.close().await.map_err(transport_err)?;
        }
        Ok(())
    }

    fn sides(
        &self,
        inputs: Vec<Vec<RecordBatch>>,
        reservation: &MemoryReservation,
    ) -> Result<Vec<Side>> {
        inputs
            .into_iter()
            .enumerate()
            .map(|(s, batches)| self.side(batches, s, reservation))
            .collect()
    }

    /// Collect: the ordered key of every row (counted in the worker's memory pool),
    /// the key range and the bytes per row.
    fn side(
        &self,
        batches: Vec<RecordBatch>,
        s: usize,
        reservation: &MemoryReservation,
    ) -> Result<Side> {
        let n = self.qc.workers.len();
        let mut keys = Vec::with_capacity(batches.len());
        let mut hash_to = Vec::with_capacity(batches.len());
        let mut hash_rows = vec![0u64; n];
        let mut hashes = Vec::new();
        let (mut bytes, mut rows, mut batch_bytes) = (0u64, 0u64, 0usize);
        let mut range: Option<(u64, u64)> = None;
        // Only a Neo shuffle chosen at run time may route by hash.
        let keep_hash_to = self.settings.min_saving.is_some();
        let row_key_bytes = if keep_hash_to { 12 } else { 8 };
        for batch in &batches {
            let array = self.key_array(s, batch)?;
            let k = Keys::from_array(array.as_ref())
                .map_err(|e| internal_datafusion_err!("{} key: {e}", self.what))?;
            reservation.try_grow(batch.num_rows() * row_key_bytes)?;
            let domain: KeyDomain = k.domain();
            let ordered: Vec<u64> = k.values().iter().map(|&v| domain.ordered(v)).collect();
            let nulls = k.nulls().cloned();
            for (i, &key) in ordered.iter().enumerate() {
                if nulls.as_ref().is_none_or(|n| n.is_valid(i)) {
                    range = Some(range.map_or((key, key), |(lo, hi)| (lo.min(key), hi.max(key))));
                }
            }
            let null_rows = match keep_hash_to {
                true => {
                    let mut to = vec![Vec::new(); n];
                    let null_rows = self.hash_lists(&array, &mut hashes, &mut to)?;
                    for (w, rows) in to.iter().enumerate() {
                        hash_rows[w] += rows.len() as u64;
                    }
                    hash_to.push(to);
                    null_rows
                }
                false => self.each_hash_destination(&array, &mut hashes, n, |_, w| {
                    hash_rows[w] += 1;
                })?,
            };
            // Only rows with a key count.
            hash_rows[self.null_to()] -= null_rows as u64;
            keys.push((ordered, nulls));
            for column in batch.columns() {
                bytes += column.to_data().get_slice_memory_size()? as u64;
            }
            rows += batch.num_rows() as u64;
            batch_bytes += batch.get_array_memory_size();
        }
        let row_bytes = bytes.checked_div(rows).unwrap_or(0).max(1);
        Ok(Side {
            batches,
            batch_bytes,
            key_bytes: rows as usize * row_key_bytes,
            keys,
            hash_to,
            hash_bytes: hash_rows.iter().map(|r| r * row_bytes).collect(),
            row_bytes,
            range,
        })
    }

    /// Input `s`'s key column of `batch`.
    fn key_array(&self, s: usize, batch: &RecordBatch) -> Result<ArrayRef> {
        self.keys[s].evaluate(batch)?.into_array(batch.num_rows())
    }

    /// Adds each row of `key` to the list of the worker a hash shuffle sends it to
    /// ([`Router::each_hash_destination`]). Returns the NULL keys' rows.
    fn hash_lists(
        &self,
        key: &ArrayRef,
        hashes: &mut Vec<u64>,
        lists: &mut [Vec<u32>],
    ) -> Result<usize> {
        // Room for an even share and then some: growing the lists from empty took half
        // the routing's time.
        let share = key.len() / lists.len() + key.len() / (8 * lists.len()) + 16;
        for list in lists.iter_mut() {
            list.reserve(share);
        }
        self.each_hash_destination(key, hashes, lists.len(), |row, to| {
            lists[to].push(row as u32)
        })
    }

    /// Calls `f(row, worker)` for each row of `key` with the worker of `workers` a
    /// hash shuffle sends it to, as DataFusion's hash repartitioning does (hash
    /// modulo the partitions); a NULL key's row with [`Router::null_to`]'s. Returns
    /// the NULL keys' rows.
    fn each_hash_destination(
        &self,
        key: &ArrayRef,
        hashes: &mut Vec<u64>,
        workers: usize,
        mut f: impl FnMut(usize, usize),
    ) -> Result<usize> {
        // Remainders by multiplication (as DataFusion's partitioner takes them): a
        // division per row was most of the routing's time.
        let n = StrengthReducedU64::new(workers as u64);
        hash_keys(std::slice::from_ref(key), key.len(), hashes)?;
        let Some(nulls) = key.logical_nulls().filter(|n| n.null_count() > 0) else {
            for (row, &hash) in hashes.iter().enumerate() {
                f(row, (hash % n) as usize);
            }
            return Ok(0);
        };
        let null_to = self.null_to();
        for (row, &hash) in hashes.iter().enumerate() {
            let to = match nulls.is_valid(row) {
                true => (hash % n) as usize,
                false => null_to,
            };
            f(row, to);
        }
        Ok(nulls.null_count())
    }

    fn ring(&self, exchange: u32) -> RingSpec {
        RingSpec {
            nodes: self.qc.workers.clone(),
            index: self.partition,
            query: self.qc.query_id,
            exchange,
        }
    }

    /// `mine[i]` to worker `i`; what each worker sent here.
    async fn scatter(&self, exchange: u32, mine: Vec<Vec<u64>>) -> Result<Vec<Vec<u64>>> {
        let exchange = self.first + exchange;
        scatter(
            self.qc.transport.as_ref(),
            &self.ring(exchange),
            exchange,
            mine,
        )
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    /// Domain, histogram and assignment on `sides` (every row of each input if
    /// `complete`), over the three exchanges from `at`.
    async fn decide(&self, at: u32, sides: &[Side], complete: bool) -> Result<Routing> {
        let domain = self.agree_on_domain(at, sides).await?;
        self.assignment(at, domain, sides, complete).await
    }

    /// Domain: the union of every worker's key range.
    async fn agree_on_domain(&self, at: u32, sides: &[Side]) -> Result<RadixDomain> {
        let (min, max) = sides
            .iter()
            .filter_map(|s| s.range)
            .fold((u64::MAX, 0), |(lo, hi), (min, max)| {
                (lo.min(min), hi.max(max))
            });
        let n = self.qc.workers.len();
        let words = self
            .scatter(at + DOMAIN_EXCHANGE, vec![vec![min, max]; n])
            .await?;
        let (mut lo, mut hi) = (u64::MAX, 0);
        for (i, w) in words.iter().enumerate() {
            let [min, max] = w[..] else {
                return internal_err!(
                    "{} sent a key range of {} words",
                    node_name(self.qc.workers[i]),
                    w.len()
                );
            };
            // A worker without keys sends (MAX, 0).
            if min <= max {
                lo = lo.min(min);
                hi = hi.max(max);
            }
        }
        if lo > hi {
            (lo, hi) = (0, 0);
        }
        RadixDomain::new(lo, hi, self.settings.fine_bits)
            .map_err(|e| internal_datafusion_err!("{} domain: {e}", self.what))
    }

    /// Histogram and assign: every worker's bytes per bucket (and per hash shuffle
    /// destination, and whether they are of every row) to worker 0, how to route back.
    async fn assignment(
        &self,
        at: u32,
        domain: RadixDomain,
        sides: &[Side],
        complete: bool,
    ) -> Result<Routing> {
        let n = self.qc.workers.len();
        let mut mine = vec![Vec::new(); n];
        for side in sides {
            let mut h = FineHistogram::new(domain);
            h.add_keys(side.valid_keys(), side.row_bytes);
            mine[0].extend_from_slice(h.bytes());
        }
        for side in sides {
            mine[0].extend_from_slice(&side.hash_bytes);
        }
        mine[0].push(complete as u64);
        let histograms = self.scatter(at + HISTOGRAM_EXCHANGE, mine).await?;
        let mut mine = vec![Vec::new(); n];
        let mut planned = None;
        if self.partition == 0 {
            let timer = self.metrics.plan_time.timer();
            let plan = self.plan(domain, histograms).await?;
            timer.done();
            mine = vec![plan.words(); n];
            planned = Some(plan);
        }
        let words = self.scatter(at + ASSIGNMENT_EXCHANGE, mine).await?;
        // A sample's "collect every row" has nothing to show: the next decision does.
        if let Some(plan) = planned.filter(|p| !p.collects_all()) {
            // The schedule is for EXPLAIN ANALYZE: computed once the others have
            // the assignment.
            let report = tokio::task::spawn_blocking(move || plan.report())
                .await
                .map_err(|e| internal_datafusion_err!("the {} schedule failed: {e}", self.what))?;
            self.report.lock().plan = Some(report?);
        }
        self.decode(at, domain, &words[0]).await
    }

    /// Worker 0: partitions, assignment, and whether to use it.
    async fn plan(&self, domain: RadixDomain, histograms: Vec<Vec<u64>>) -> Result<Plan> {
        let n = histograms.len();
        let inputs = self.keys.len();
        let buckets = domain.buckets();
        let mut fine: Vec<Vec<FineHistogram>> = Vec::with_capacity(n);
        let mut hash = Vec::with_capacity(n);
        let mut complete = true;
        for (i, mut words) in histograms.into_iter().enumerate() {
            let expected = inputs * (buckets + n) + 1;
            if words.len() != expected {
                return internal_err!(
                    "{} sent {} histogram words, not {expected}",
                    node_name(self.qc.workers[i]),
                    words.len()
                );
            }
            // Last: whether they count every row (else the first rows of each input).
            match words.pop() {
                Some(0) => complete = false,
                Some(1) => {}
                other => {
                    return internal_err!(
                        "{} sent {other:?} for whether its histograms are complete",
                        node_name(self.qc.workers[i])
                    );
                }
            }
            if let Some(bad) = words.iter().find(|&&b| b > MAX_BUCKET_BYTES) {
                return internal_err!(
                    "{} reported {bad} bytes in one histogram bucket",
                    node_name(self.qc.workers[i])
                );
            }
            // Each input's histogram, then each input's bytes per hash destination.
            let (histograms, to) = words.split_at(inputs * buckets);
            fine.push(
                histograms
                    .chunks(buckets)
                    .map(|b| {
                        FineHistogram::from_bytes(domain, b.to_vec())
                            .map_err(|e| internal_datafusion_err!("{e}"))
                    })
                    .collect::<Result<_>>()?,
            );
            hash.push(
                (0..n)
                    .map(|w| to.chunks(n).map(|input| input[w]).sum())
                    .collect::<Vec<u64>>(),
            );
        }
        let partitions = self.settings.partitions_for(n);
        let global: Vec<u64> = (0..buckets)
            .map(|b| fine.iter().flatten().map(|h| h.bytes()[b]).sum())
            .collect();
        let map = match self.settings.adaptive {
            true => PartitionMap::adaptive(domain, &global, partitions as usize),
            false => PartitionMap::radix(domain, partitions.next_power_of_two().ilog2()),
        }
        .map_err(|e| internal_datafusion_err!("{e}"))?;
        let mut sizes = Sizes::new(fine.len(), map.partitions())
            .map_err(|e| internal_datafusion_err!("{e}"))?;
        // One input is a build side with an empty probe side.
        let empty = vec![0; map.partitions()];
        for (i, inputs) in fine.iter().enumerate() {
            let per_input: Vec<Vec<u64>> = inputs.iter().map(|h| h.per_partition(&map)).collect();
            sizes.set(i, &per_input[0], per_input.get(1).unwrap_or(&empty));
        }
        let broadcast = match self.settings.selective_broadcast {
            true => self.broadcast,
            false => Broadcastable::NONE,
        };
        let hash_costs = Costs::of_transfers(&hash);
        // Chosen at run time: no solver when even the best assignment cannot save enough.
        let hopeless = self.settings.min_saving.is_some_and(|pct| {
            let bound = sizes.busiest_link_lower_bound(broadcast) as u128;
            bound * 100 > hash_costs.max() as u128 * (100 - pct as u128)
        });
        let options = AssignOptions {
            broadcast,
            milp: self.settings.milp && !hopeless,
            time_limit: Duration::from_millis(self.settings.solver_ms as u64),
            link_rate: Some(self.qc.transport.link_rate().unwrap_or(ASSUMED_LINK_RATE)),
        };
        // The solver runs up to its time limit: off the runtime's threads.
        let (mut solved, sizes) =
            tokio::task::spawn_blocking(move || (assign(&sizes, &options), sizes))
                .await
                .map_err(|e| {
                    internal_datafusion_err!("the {} assignment failed: {e}", self.what)
                })?;
        if hopeless && self.settings.milp {
            solved.method = Method::Greedy {
                reason: "no assignment saves enough over hash placement".into(),
            };
        }
        let saving = solved.costs.saving_over(&hash_costs);
        let side_transfers =
            (complete && self.settings.schedule == NeoSchedule::OpenShop).then(|| {
                (0..inputs)
                    .map(|s| solved.assignment.side_transfers(&sizes, s == 0))
                    .collect()
            });
        Ok(Plan {
            hash_placement: self
                .settings
                .min_saving
                .is_some_and(|pct| saving < pct as f64),
            min_saving: self.settings.min_saving,
            sampled: (!complete).then_some(Sample {
                rows: self.settings.sample_rows,
                last_only: self.whole_before,
            }),
            side_transfers,
            saving,
            map,
            solved,
            sizes,
            hash,
            hash_costs,
        })
    }

    /// The routing from worker 0's words, checked.
    async fn decode(&self, at: u32, domain: RadixDomain, words: &[u64]) -> Result<Routing> {
        let n = self.qc.workers.len() as u64;
        let bad = |why: String| internal_datafusion_err!("bad {} assignment: {why}", self.what);
        if words == [HASH_PLACEMENT] {
            return match self.settings.min_saving {
                Some(_) => Ok(Routing::Hash),
                None => Err(bad(
                    "hash placement where it is not chosen at run time".into()
                )),
            };
        }
        if words == [COLLECT_ALL] {
            return match self.settings.min_saving.is_some() && at == 0 {
                true => Ok(Routing::CollectAll),
                false => Err(bad("collect every row after the last decision".into())),
            };
        }
        let Some((&p, rest)) = words.split_first() else {
            return Err(bad("empty".into()));
        };
        // Under the open-shop schedule, each input's transfer matrix follows.
        let matrices = match self.settings.schedule {
            NeoSchedule::OpenShop => self.keys.len() as u64 * n * n,
            NeoSchedule::Free => 0,
        };
        if p == 0 || p > domain.buckets() as u64 || rest.len() as u64 != 2 * p + matrices {
            return Err(bad(format!("{p} partitions in {} words", words.len())));
        }
        let (rest, matrices) = rest.split_at(2 * p as usize);
        let (starts, codes) = rest.split_at(p as usize);
        let starts = starts
            .iter()
            .map(|&s| u32::try_from(s).map_err(|_| bad(format!("partition start {s}"))))
            .collect::<Result<Vec<u32>>>()?;
        let map = PartitionMap::from_starts(domain, starts).map_err(|e| bad(e.to_string()))?;
        let placements = codes
            .iter()
            .map(|&c| match c {
                BROADCAST_BUILD if self.broadcast.build => Ok(Placement::BroadcastBuild),
                BROADCAST_PROBE if self.broadcast.probe => Ok(Placement::BroadcastProbe),
                i if i < n => Ok(Placement::Node(i as u32)),
                other => Err(bad(format!("placement {other}"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let rounds = match matrices.is_empty() {
            true => None,
            false => Some(self.rounds(matrices).await?),
        };
        Ok(Routing::Neo(Assigned {
            map,
            placements,
            rounds,
        }))
    }

    /// This worker's part of each input's open-shop schedule, from the transfer
    /// matrices (every worker computes the same rounds from the same matrices).
    async fn rounds(&self, words: &[u64]) -> Result<Vec<Vec<NodeRound>>> {
        let n = self.qc.workers.len();
        if let Some(bad) = words.iter().find(|&&b| b > MAX_BUCKET_BYTES) {
            return internal_err!("bad {} assignment: a transfer of {bad} bytes", self.what);
        }
        // Each input's n x n words in turn (their number checked by `decode`).
        let matrices: Vec<Vec<Vec<u64>>> = words
            .chunks(n * n)
            .map(|m| m.chunks(n).map(<[u64]>::to_vec).collect())
            .collect();
        let me = self.partition as u32;
        tokio::task::spawn_blocking(move || {
            matrices
                .iter()
                .map(|m| Ok(node_rounds(&open_shop(m)?, me)))
                .collect::<std::result::Result<Vec<_>, gyre_join::error::JoinError>>()
        })
        .await
        .map_err(|e| internal_datafusion_err!("the {} schedule failed: {e}", self.what))?
        .map_err(|e| internal_datafusion_err!("{e}"))
    }

    /// One outlet per worker (this one's stays empty): each stream is one Arrow IPC
    /// stream, so broadcast rows go through every other worker's outlet too.
    fn outlets(&self, s: usize, ep: &SendEndpoint) -> Result<Vec<Outlet>> {
        self.qc
            .workers
            .iter()
            .map(|&w: &NodeId| Outlet::of_query(To::Node(w), &self.schemas[s], &self.qc, ep))
            .collect()
    }

    fn keep(&self, kept: &mpsc::UnboundedSender<RecordBatch>, part: RecordBatch) -> Result<()> {
        kept.send(part)
            .map_err(|_| internal_datafusion_err!("a {}'s local plan is gone", self.what))
    }

    /// Route where a hash shuffle sends each row: the side's collected rows, then
    /// the `rest` of its input as it arrives. The rows processed here go to `kept`,
    /// which is dropped (the local input ends) with the side.
    async fn route_by_hash(
        &self,
        s: usize,
        side: Side,
        rest: Option<SendableRecordBatchStream>,
        ep: &SendEndpoint,
        kept: mpsc::UnboundedSender<RecordBatch>,
        reservation: &MemoryReservation,
    ) -> Result<()> {
        let mut outlets = self.outlets(s, ep)?;
        let held = side.batch_bytes + side.key_bytes;
        for (batch, mut rows) in side.batches.into_iter().zip(side.hash_to) {
            self.send_by_hash(&batch, &mut rows, &mut outlets, ep, &kept)
                .await?;
        }
        reservation.shrink(held);
        if let Some(mut rest) = rest {
            let mut hashes = Vec::new();
            let mut rows = vec![Vec::new(); self.qc.workers.len()];
            while let Some(batch) = rest.next().await.transpose()? {
                self.hash_lists(&self.key_array(s, &batch)?, &mut hashes, &mut rows)?;
                self.send_by_hash(&batch, &mut rows, &mut outlets, ep, &kept)
                    .await?;
            }
        }
        for outlet in &mut outlets {
            outlet.flush(ep, &self.metrics.send).await?;
        }
        ep.finish();
        Ok(())
    }

    /// The rows of `batch` in `rows[w]` to worker `w`, this worker's to `kept`;
    /// leaves the lists empty.
    async fn send_by_hash(
        &self,
        batch: &RecordBatch,
        rows: &mut [Vec<u32>],
        outlets: &mut [Outlet],
        ep: &SendEndpoint,
        kept: &mpsc::UnboundedSender<RecordBatch>,
    ) -> Result<()> {
        for (to, list) in rows.iter_mut().enumerate() {
            if list.is_empty() {
                continue;
            }
            let part = rows_of(batch, std::mem::take(list))?;
            if to == self.partition {
                self.metrics.kept.add(part.num_rows());
                self.keep(kept, part)?;
            } else {
                self.metrics.shipped.add(part.num_rows());
                outlets[to].push(ep, part, &self.metrics.send).await?;
            }
        }
        Ok(())
    }

    /// Route by the assignment: each row of input `s` to where its partition is
    /// processed; the rows processed here go to `kept`, which is dropped (the local
    /// input ends) with the side. With a `barrier`, the rows for other workers wait
    /// for their rounds of the input's open-shop schedule.
    #[allow(clippy::too_many_arguments)]
    async fn route(
        &self,
        s: usize,
        side: Side,
        assigned: &Assigned,
        ep: &SendEndpoint,
        kept: mpsc::UnboundedSender<RecordBatch>,
        barrier: Option<&mut RoundBarrier>,
        reservation: &MemoryReservation,
    ) -> Result<()> {
        let n = self.qc.workers.len();
        let me = self.partition;
        let mine = if s == 0 {
            Placement::BroadcastBuild
        } else {
            Placement::BroadcastProbe
        };
        let scheduled = match (&assigned.rounds, barrier) {
            (Some(rounds), Some(barrier)) => Some((&rounds[s], barrier)),
            _ => None,
        };
        let mut outlets = self.outlets(s, ep)?;
        let keep = |part: RecordBatch| self.keep(&kept, part);
        // Scheduled: per other worker, its rows (batch, row indices) in batch order.
        let mut waiting: Vec<Vec<(usize, Vec<u32>)>> = vec![Vec::new(); n];
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); n + 1];
        let Assigned {
            map, placements, ..
        } = assigned;
        for (b, (batch, (keys, nulls))) in side.batches.iter().zip(side.keys).enumerate() {
            for (row, &key) in keys.iter().enumerate() {
                let valid = nulls.as_ref().is_none_or(|n| n.is_valid(row));
                let to = match valid.then(|| placements[map.partition(key)]) {
                    // Join: NULL keys match nothing, the row stays (a preserved row
                    // once). Aggregation: one group, on worker 0.
                    None => self.null_to(),
                    Some(Placement::Node(i)) => i as usize,
                    Some(p) if p == mine => n,
                    // The other side is broadcast: this one stays.
                    Some(_) => me,
                };
                rows[to].push(row as u32);
            }
            for (to, list) in rows.iter_mut().enumerate() {
                if list.is_empty() {
                    continue;
                }
                let counter = match to {
                    _ if to == n => &self.metrics.broadcast,
                    _ if to == me => &self.metrics.kept,
                    _ => &self.metrics.shipped,
                };
                counter.add(list.len());
                if scheduled.is_some() && to != me {
                    let list = std::mem::take(list);
                    let others = if to == n { n - 1 } else { 1 };
                    reservation.try_grow(list.len() * 4 * others)?;
                    if to == n {
                        keep(rows_of(batch, list.clone())?)?;
                        for (w, waiting) in waiting.iter_mut().enumerate() {
                            if w != me {
                                waiting.push((b, list.clone()));
                            }
                        }
                    } else {
                        waiting[to].push((b, list));
                    }
                    continue;
                }
                let part = rows_of(batch, std::mem::take(list))?;
                if to == n {
                    for (w, outlet) in outlets.iter_mut().enumerate() {
                        if w != me {
                            outlet.push(ep, part.clone(), &self.metrics.send).await?;
                        }
                    }
                    keep(part)?;
                } else if to == me {
                    keep(part)?;
                } else {
                    outlets[to].push(ep, part, &self.metrics.send).await?;
                }
            }
        }
        if let Some((rounds, barrier)) = scheduled {
            let mut queues: Vec<RowQueue> = waiting.into_iter().map(RowQueue::new).collect();
            for (r, round) in rounds.iter().enumerate() {
                if let Some((to, bytes)) = round.send {
                    let to = to as usize;
                    if to >= n || to == me {
                        return internal_err!("a {} round sends to worker index {to}", self.what);
                    }
                    // Up to the rows the schedule has sent by the end of this round; in
                    // the last round to this worker, all that is left.
                    let last = !rounds[r + 1..]
                        .iter()
                        .any(|later| later.send.is_some_and(|(t, _)| t as usize == to));
                    let queue = &mut queues[to];
                    queue.planned += bytes;
                    let upto = match last {
                        true => u64::MAX,
                        false => queue.planned.div_ceil(side.row_bytes),
                    };
                    while let Some(part) = queue.next_part(&side.batches, upto)? {
                        outlets[to].push(ep, part, &self.metrics.send).await?;
                    }
                    outlets[to].flush(ep, &self.metrics.send).await?;
                    barrier.sent(to).await.map_err(transport_err)?;
                }
                // The next round's receiver must be done with this one; after the side's
                // last round, everybody.
                let next = match rounds.get(r + 1).map(|next| next.send) {
                    None => Next::All,
                    Some(Some((to, _))) => Next::Node(to as usize),
                    Some(None) => Next::Nobody,
                };
                let timer = self.metrics.round_wait.timer();
                barrier
                    .end(round.receive.map(|from| from as usize), next)
                    .await
                    .map_err(transport_err)?;
                timer.done();
            }
            // Rows no round covered (none when the histograms counted every row): after
            // the schedule, so that nothing is lost.
            for (to, queue) in queues.iter_mut().enumerate() {
                while let Some(part) = queue.next_part(&side.batches, u64::MAX)? {
                    outlets[to].push(ep, part, &self.metrics.send).await?;
                }
            }
        }
        for outlet in &mut outlets {
            outlet.flush(ep, &self.metrics.send).await?;
        }
        ep.finish();
        Ok(())
    }
}

/// Whether reading `plan` to its end completes a run-time filter: its target, in
/// another input of the operator or in a stage sending one, holds those rows back
/// until then (the Neo-Join's own filter sits on its build input).
fn feeds_filters(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<FilterSourceExec>().is_some()
        || plan.children().into_iter().any(feeds_filters)
}

/// Rows `rows` (ascending, no repeats) of `batch`: the batch itself when that is all.
fn rows_of(batch: &RecordBatch, rows: Vec<u32>) -> Result<RecordBatch> {
    match rows.len() == batch.num_rows() {
        true => Ok(batch.clone()),
        false => Ok(take_record_batch(batch, &UInt32Array::from(rows))?),
    }
}

/// The rows waiting for one worker under a planned schedule, sent in order.
struct RowQueue {
    lists: Vec<(usize, Vec<u32>)>,
    /// The next list and the position in it.
    at: (usize, usize),
    sent: u64,
    /// Bytes the schedule has sent to this worker so far.
    planned: u64,
}

impl RowQueue {
    fn new(lists: Vec<(usize, Vec<u32>)>) -> Self {
        Self {
            lists,
            at: (0, 0),
            sent: 0,
            planned: 0,
        }
    }

    /// The next rows, from one batch, while fewer than `upto` were sent.
    fn next_part(&mut self, batches: &[RecordBatch], upto: u64) -> Result<Option<RecordBatch>> {
        let (list, offset) = self.at;
        let Some((b, rows)) = self.lists.get(list) else {
            return Ok(None);
        };
        if self.sent >= upto {
            return Ok(None);
        }
        let take = (rows.len() - offset).min((upto - self.sent).min(usize::MAX as u64) as usize);
        let part = rows_of(&batches[*b], rows[offset..offset + take].to_vec())?;
        self.sent += take as u64;
        self.at = match offset + take == rows.len() {
            true => (list + 1, 0),
            false => (list, offset + take),
        };
        Ok(Some(part))
    }
}

/// Where each worker sends its rows.
enum Routing {
    /// By Neo-Join's partitions and their placements.
    Neo(Assigned),
    /// Where a hash shuffle sends them.
    Hash,
    /// Decided on samples: not by hash placement; collect every row and decide again.
    CollectAll,
}

/// Neo-Join's partitions, their placements and schedule.
struct Assigned {
    map: PartitionMap,
    placements: Vec<Placement>,
    /// Under the open-shop schedule: this worker's part of each input's rounds.
    rounds: Option<Vec<Vec<NodeRound>>>,
}

/// What a decision on samples saw of each worker's inputs.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rows: u32,
    /// The inputs before the last were read whole ([`Router::whole_before`]).
    last_only: bool,
}

/// Worker 0's decision and what it is based on.
struct Plan {
    /// Chosen at run time, and the assignment saves too little.
    hash_placement: bool,
    min_saving: Option<u32>,
    /// Decided on samples on some worker, not on every row.
    sampled: Option<Sample>,
    /// Under the open-shop schedule: each input's transfers (`[from][to]` bytes).
    side_transfers: Option<Vec<Vec<Vec<u64>>>>,
    /// The assignment's saving on the busiest link over hash placement, in percent.
    saving: f64,
    map: PartitionMap,
    solved: Solved,
    sizes: Sizes,
    /// Bytes a hash shuffle would send (`hash[from][to]`), and their costs.
    hash: Vec<Vec<u64>>,
    hash_costs: Costs,
}

impl Plan {
    /// Decided on samples, and not for hash placement.
    fn collects_all(&self) -> bool {
        self.sampled.is_some() && !self.hash_placement
    }

    /// `[HASH_PLACEMENT]`, `[COLLECT_ALL]`, or `[p, starts..., placements...]`.
    fn words(&self) -> Vec<u64> {
        if self.hash_placement {
            return vec![HASH_PLACEMENT];
        }
        if self.collects_all() {
            return vec![COLLECT_ALL];
        }
        let mut words = vec![self.map.partitions() as u64];
        words.extend(self.map.starts().iter().map(|&s| s as u64));
        words.extend(self.solved.assignment.placements().iter().map(|p| match p {
            Placement::Node(i) => *i as u64,
            Placement::BroadcastBuild => BROADCAST_BUILD,
            Placement::BroadcastProbe => BROADCAST_PROBE,
        }));
        for matrix in self.side_transfers.iter().flatten() {
            words.extend(matrix.iter().flatten());
        }
        words
    }

    /// What EXPLAIN ANALYZE shows, with the rounds of the schedule of what moves: the
    /// rounds each side ran in under the open-shop schedule, else those of an
    /// open-shop schedule of all of it, for comparison.
    fn report(self) -> Result<String> {
        if let (Some(sample), Some(pct)) = (self.sampled, self.min_saving) {
            // Hash placement, decided on samples: what moved is the hash shuffle's.
            return Ok(format!(
                "placement=hash (saves {:.0}% < {pct}% on the first {} rows of {} on each \
                 worker), partitions={}, assignment={}, solver_time={:.1}ms",
                self.saving,
                sample.rows,
                match sample.last_only {
                    true => "the last input",
                    false => "each input",
                },
                self.map.partitions(),
                self.solved.method,
                self.solved.elapsed.as_secs_f64() * 1e3,
            ));
        }
        let count = |m: &[Vec<u64>]| {
            open_shop(m)
                .map(|r| r.len())
                .map_err(|e| internal_datafusion_err!("{e}"))
        };
        let rounds = match (&self.side_transfers, self.hash_placement) {
            (Some(inputs), false) => inputs
                .iter()
                .map(|m| count(m).map(|r| r.to_string()))
                .collect::<Result<Vec<_>>>()?
                .join("+"),
            (_, true) => count(&self.hash)?.to_string(),
            (None, false) => count(&self.solved.assignment.transfers(&self.sizes))?.to_string(),
        };
        let chosen = match (self.hash_placement, self.min_saving) {
            (true, Some(pct)) => format!("placement=hash (saves {:.0}% < {pct}%)", self.saving),
            (false, Some(pct)) => format!("placement=neo (saves {:.0}% >= {pct}%)", self.saving),
            (_, None) => "placement=neo".to_string(),
        };
        Ok(format!(
            "{chosen}, partitions={}, assignment={}, solver_time={:.1}ms, \
             broadcast_partitions={}, busiest_link={}B (hash {}B), moved={}B (hash {}B), \
             rounds={rounds}",
            self.map.partitions(),
            self.solved.method,
            self.solved.elapsed.as_secs_f64() * 1e3,
            self.solved.assignment.broadcasts(),
            self.solved.costs.max(),
            self.hash_costs.max(),
            self.solved.costs.moved(),
            self.hash_costs.moved(),
        ))
    }
}
