//! One worker's part of a Flow-Join: the tasks behind [`super::FlowJoinExec::execute`].
//!
//! - *router*: reads the local probe input, counts hashes, reports to worker 0 at the
//!   detection points, sends rows to their owners or keeps heavy ones local;
//! - *owner*: collects the local build partition for the usual join and broadcasts the
//!   build rows of every announced heavy hash, one broadcast per round;
//! - *listener*: applies worker 0's announcements (router's heavy set, owner's work);
//! - *drain* (one per detection round): collects the heavy build rows all owners
//!   broadcast for that round;
//! - *detector* (worker 0 only): sums reports, announces the global heavy hitters.
//!
//! Nothing waits in a cycle: the router never waits for the heavy path (heavy probe
//! rows are kept in memory until the heavy build side is complete), the drain reads
//! broadcasts as they come, and the usual join consumes the probe shuffle as any
//! partitioned hash join does.

use super::lookup::{HashSetU64, Modulo};
use super::matches::{Matches, RowIds, Shape, Tracked, number_rows, row_id_schema, with_row_id};
use super::source::PreparedInputExec;
use super::{
    DEFAULT_PROBE_ROWS_PER_WORKER, FlowJoinExec, FlowReport, HEAVY_EXCHANGES_FROM, HeavyHitter,
};
use crate::codec::BatchEncoder;
use crate::context::{Placement, QueryContext};
use crate::receiver::{ExchangeReceiverExec, ReceiveMode};
use crate::sender::{Outlet, SendMetrics, transport_err};
use crate::task::{AbortOnDrop, run_detached};
use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::hash_utils::create_hashes;
use datafusion::common::{DataFusionError, Result, ScalarValue, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use gyre_join::flow::detect::{Coordinator, FIRST_ROUND_WAIT, NodeDetector, NodeReport};
use gyre_join::flow::direct_map::DirectMap;
use gyre_join::flow::sfr::{Grid, choose_grid};
use gyre_join::flow::wire::{Control, Side};
use gyre_transport::{NodeId, ReceiveEndpoint, ReceiveSpec, SendEndpoint, SendSpec, To, node_name};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The heavy hashes announced so far, shared by the listener (writer) and router.
/// Only ever appended to, so a reader knows what is new by the length it last saw.
#[derive(Default)]
struct HeavySet {
    /// (hash, round that found it).
    hashes: RwLock<Vec<(u64, u32)>>,
}

impl HeavySet {
    fn extend(&self, new: &[u64], round: u32) {
        self.hashes.write().extend(new.iter().map(|&h| (h, round)));
    }
}

/// Per-worker figures of a Flow-Join, shown by `EXPLAIN ANALYZE`.
#[derive(Clone)]
struct FlowMetrics {
    output_rows: Count,
    probe_rows: Count,
    /// Probe rows with a heavy hash, kept on this worker.
    probe_rows_local: Count,
    heavy_hitters: Count,
    /// Probe rows this worker had routed when its first heavy hitter took effect.
    first_heavy_after_rows: Gauge,
    detection_rounds: Count,
    build_rows_broadcast: Count,
    heavy_build_rows_received: Count,
    routing_time: Time,
    /// Detection windows after which this worker counted only a sample of rows.
    quiet_windows: Count,
    /// Time the router waited for the first round's heavy hitters.
    first_round_wait: Time,
    /// Build-preserving joins: other owners' build rows this worker matched (sent to
    /// them), and own build rows peers reported matched.
    build_matches_sent: Count,
    build_matches_received: Count,
    /// Probe-preserving joins that route their build input: the same for the probe
    /// rows broadcast for build-heavy keys.
    probe_matches_sent: Count,
    probe_matches_received: Count,
    /// Joins that route their build input: build rows routed, those kept on this worker
    /// (their key heavy on the build side), the build-side heavy hitters, the probe
    /// rows broadcast because their key is one, and the time the probe router waited
    /// for the final build-side list.
    build_rows: Count,
    build_rows_local: Count,
    build_heavy_hitters: Count,
    probe_rows_broadcast: Count,
    build_list_wait: Time,
    /// Keys heavy on both sides (SFR): build and probe rows this worker sent to the
    /// nodes of its grid column and row (itself included).
    sfr_build_rows_sent: Count,
    sfr_probe_rows_sent: Count,
}

impl FlowMetrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let m = || MetricBuilder::new(set);
        Self {
            output_rows: m().output_rows(partition),
            probe_rows: m().counter("probe_rows", partition),
            probe_rows_local: m().counter("probe_rows_kept_local", partition),
            heavy_hitters: m().counter("heavy_hitters", partition),
            first_heavy_after_rows: m().gauge("first_heavy_after_rows", partition),
            detection_rounds: m().counter("detection_rounds", partition),
            build_rows_broadcast: m().counter("build_rows_broadcast", partition),
            heavy_build_rows_received: m().counter("heavy_build_rows_received", partition),
            routing_time: m().subset_time("routing_time", partition),
            quiet_windows: m().counter("quiet_windows", partition),
            first_round_wait: m().subset_time("first_round_wait", partition),
            build_matches_sent: m().counter("build_matches_sent", partition),
            build_matches_received: m().counter("build_matches_received", partition),
            probe_matches_sent: m().counter("probe_matches_sent", partition),
            probe_matches_received: m().counter("probe_matches_received", partition),
            build_rows: m().counter("build_rows", partition),
            build_rows_local: m().counter("build_rows_kept_local", partition),
            build_heavy_hitters: m().counter("build_heavy_hitters", partition),
            probe_rows_broadcast: m().counter("probe_rows_broadcast", partition),
            build_list_wait: m().subset_time("build_list_wait", partition),
            sfr_build_rows_sent: m().counter("sfr_build_rows_sent", partition),
            sfr_probe_rows_sent: m().counter("sfr_probe_rows_sent", partition),
        }
    }
}

/// Rows a router holds back at least while waiting for round 0 (else 5% of its input).
const HOLD_MIN_ROWS: u64 = 65_536;

/// Everything a worker's tasks share.
struct Shared {
    qc: Arc<QueryContext>,
    partition: usize,
    heavy: HeavySet,
    report: Arc<Mutex<FlowReport>>,
    m: FlowMetrics,
    send_m: SendMetrics,
    /// Worker 0: the node that forms the global heavy-hitter list.
    detector_node: NodeId,
    /// Announcements applied so far (the listener counts, the router waits for round 0).
    rounds: tokio::sync::watch::Sender<u32>,
    /// The same for the build side, whose list is final after `build_iterations`
    /// announcements (0 when the join does not route its build input).
    build_heavy: HeavySet,
    build_rounds: tokio::sync::watch::Sender<u32>,
    build_iterations: u32,
    /// Probe-side detection rounds: the probe list is final after as many announcements.
    probe_iterations: u32,
    /// Whether this worker sent any of its build rows to other workers (the owner
    /// task's heavy broadcasts, SFR's replicas): only then can peers match them.
    build_rows_shared: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn n(&self) -> usize {
        self.qc.workers.len()
    }

    fn heavy(&self, side: Side) -> &HeavySet {
        match side {
            Side::Build => &self.build_heavy,
            Side::Probe => &self.heavy,
        }
    }

    /// Announcements applied so far for `side`.
    fn rounds(&self, side: Side) -> &tokio::sync::watch::Sender<u32> {
        match side {
            Side::Build => &self.build_rounds,
            Side::Probe => &self.rounds,
        }
    }

    /// Waits until the build-side heavy hitters are final (every round announced).
    async fn build_list_final(&self) {
        let mut rounds = self.build_rounds.subscribe();
        let _ = rounds.wait_for(|r| *r >= self.build_iterations).await;
    }

    /// Waits until the build-side heavy hitters are final, then says whether there are
    /// any. Without them no build row is kept, no probe row is broadcast or set aside
    /// for SFR, and every worker knows it: the joins of those rows need not wait for
    /// the peers' ends (which come only after their routing).
    async fn any_build_heavy(&self) -> bool {
        self.build_list_final().await;
        !self.build_heavy.hashes.read().is_empty()
    }

    fn build_list_is_final(&self) -> bool {
        *self.build_rounds.borrow() >= self.build_iterations
    }

    fn open_send(&self, exchange: u32, destinations: Vec<NodeId>) -> Result<SendEndpoint> {
        self.qc
            .transport
            .open_send(SendSpec {
                query: self.qc.query_id,
                exchange,
                from: self.partition as u32,
                destinations,
                groups: vec![],
            })
            .map_err(transport_err)
    }

    fn open_receive(&self, exchange: u32, sources: Vec<(u32, NodeId)>) -> Result<ReceiveEndpoint> {
        self.qc
            .transport
            .open_receive(ReceiveSpec {
                query: self.qc.query_id,
                exchange,
                sources,
            })
            .map_err(transport_err)
    }

    fn outlet(&self, to: To, schema: &SchemaRef, ep: &SendEndpoint) -> Result<Outlet> {
        let compression = self.qc.compression.resolve(self.qc.transport.link_rate());
        Ok(Outlet::new(
            to,
            Arc::clone(schema),
            BatchEncoder::try_new(schema, compression)?,
            ep.message_size(),
        ))
    }

    /// Fails `ep` (its receivers learn why) and passes the error on.
    fn fail(&self, ep: &SendEndpoint, e: DataFusionError) -> DataFusionError {
        ep.fail(&format!(
            "{} failed in a Flow-Join: {e}",
            node_name(self.qc.me())
        ));
        e
    }
}

/// A batch with its join key columns and their partitioning hashes (DataFusion's
/// repartition hash, so `hash % n` is the row's owner).
struct Hashed {
    batch: RecordBatch,
    keys: Vec<ArrayRef>,
    hashes: Vec<u64>,
}

impl Hashed {
    fn new(keys: &[PhysicalExprRef], batch: RecordBatch) -> Result<Self> {
        let arrays = keys
            .iter()
            .map(|e| e.evaluate(&batch)?.into_array(batch.num_rows()))
            .collect::<Result<Vec<_>>>()?;
        let mut hashes = vec![0; batch.num_rows()];
        create_hashes(
            &arrays,
            REPARTITION_RANDOM_STATE.random_state(),
            &mut hashes,
        )?;
        Ok(Self {
            batch,
            keys: arrays,
            hashes,
        })
    }
}

async fn send_control(ep: &SendEndpoint, to: To, msg: &Control) -> Result<()> {
    let mut buf = ep.acquire(to).await.map_err(transport_err)?;
    buf.vec_mut().extend_from_slice(&msg.encode());
    ep.put(buf, false).map_err(transport_err)
}

fn control_of(r: &gyre_transport::Received) -> Result<Control> {
    Control::decode(r.data()).map_err(|e| {
        internal_datafusion_err!(
            "bad Flow-Join control message from {}: {e}",
            node_name(r.node)
        )
    })
}

/// A stream of the batches a task will deliver through `rx`.
fn delivered(
    schema: SchemaRef,
    rx: oneshot::Receiver<Result<Vec<RecordBatch>>>,
    what: &'static str,
) -> SendableRecordBatchStream {
    let s = futures::stream::once(async move {
        match rx.await {
            Ok(Ok(batches)) => Ok(futures::stream::iter(batches.into_iter().map(Ok))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(internal_datafusion_err!(
                "the {what} of a Flow-Join ended early"
            )),
        }
    })
    .try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, s))
}

/// A receiver of an exchange every worker sends to, as the Flow-Join's own joins read it.
fn shuffle_receiver(exchange: u32, schema: SchemaRef, n: usize) -> ExchangeReceiverExec {
    ExchangeReceiverExec::new(
        exchange,
        schema,
        Placement::Workers,
        n,
        ReceiveMode::Shuffle,
        Partitioning::UnknownPartitioning(n),
        None,
    )
}

fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

pub(super) fn execute(
    exec: &FlowJoinExec,
    partition: usize,
    ctx: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let qc = QueryContext::of(&ctx)?;
    let Some(ex) = exec.exchange else {
        return Err(internal_datafusion_err!(
            "a Flow-Join ran without exchange ids"
        ));
    };
    let n = qc.workers.len();
    let hj = exec.hash_join();
    if hj.left().output_partitioning().partition_count() != n || partition >= n {
        return Err(internal_datafusion_err!(
            "Flow-Join partition {partition} of {} on {n} workers",
            hj.left().output_partitioning().partition_count()
        ));
    }
    let config = exec.settings.detection()?;
    let rounds = config.iterations();
    let inputs = exec.inputs;
    let expected = inputs
        .probe_rows_per_worker
        .unwrap_or(DEFAULT_PROBE_ROWS_PER_WORKER);
    let routes_build = inputs.routes_build;
    let (build_keys, probe_keys): (Vec<PhysicalExprRef>, Vec<PhysicalExprRef>) =
        hj.on().iter().cloned().unzip();
    // Build-preserving joins number their build rows and run a counterpart join that
    // reports matches (see `super::matches`); probe-preserving joins that route their
    // build input do the same with the probe rows they broadcast for build-heavy keys.
    let shape = Shape::of(hj, Tracked::Build).map(Arc::new);
    let probe_tracker = exec
        .probe_tracking()
        .and_then(|_| Shape::of(hj, Tracked::Probe))
        .map(|shape| {
            (
                Arc::new(shape),
                Arc::new(Mutex::new(Matches::new(partition, n))),
            )
        });
    let build_schema = match shape {
        Some(_) => with_row_id(&hj.left().schema()),
        None => hj.left().schema(),
    };
    let join = |build: Arc<dyn ExecutionPlan>, probe: Arc<dyn ExecutionPlan>| match &shape {
        Some(shape) => shape.join(hj, build, probe),
        None => Arc::clone(&exec.join).replace_children(vec![build, probe], recompute()),
    };
    let probe_schema = hj.right().schema();
    let bcast_schema = match probe_tracker {
        Some(_) => with_row_id(&probe_schema),
        None => Arc::clone(&probe_schema),
    };
    let build_input = hj.left().execute(partition, Arc::clone(&ctx))?;
    let probe_input = hj.right().execute(partition, Arc::clone(&ctx))?;
    let build_ex = ex + exec.build_exchanges_from();

    let shared = Arc::new(Shared {
        detector_node: qc.workers[0],
        qc: Arc::clone(&qc),
        partition,
        heavy: HeavySet::default(),
        report: Arc::clone(&exec.report),
        m: FlowMetrics::new(&exec.metrics, partition),
        send_m: SendMetrics::new(&exec.metrics, partition),
        rounds: tokio::sync::watch::channel(0).0,
        build_heavy: HeavySet::default(),
        build_rounds: tokio::sync::watch::channel(0).0,
        build_iterations: if routes_build { rounds as u32 } else { 0 },
        probe_iterations: rounds as u32,
        build_rows_shared: Default::default(),
    });
    let all: Vec<(u32, NodeId)> = qc
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| (i as u32, *w))
        .collect();
    let probe_ep = shared.open_send(ex, qc.workers.clone())?;
    let report_ep = shared.open_send(ex + 1, vec![shared.detector_node])?;
    let announce_rx = shared.open_receive(ex + 2, vec![(0, shared.detector_node)])?;
    let detector_eps = if partition == 0 {
        Some((
            shared.open_receive(ex + 1, all.clone())?,
            shared.open_send(ex + 2, qc.workers.clone())?,
        ))
    } else {
        None
    };
    let bcast_eps = (0..rounds as u32)
        .map(|r| shared.open_send(ex + HEAVY_EXCHANGES_FROM + r, qc.workers.clone()))
        .collect::<Result<Vec<_>>>()?;
    // Joins that route their build input: the build shuffle, whose rows this worker
    // owns make its build partition, and the broadcast of probe rows whose key is heavy
    // on the build side.
    let (build_input, build_router) = if routes_build {
        let shuffle_ep = shared.open_send(build_ex, qc.workers.clone())?;
        let received = shuffle_receiver(build_ex, hj.left().schema(), n)
            .execute(partition, Arc::clone(&ctx))?;
        (received, Some((build_input, shuffle_ep)))
    } else {
        (build_input, None)
    };

    // The usual join: this worker's build partition with the probe rows routed here.
    let (build_tx, build_rx) = oneshot::channel();
    let probe_recv: Arc<dyn ExecutionPlan> =
        Arc::new(shuffle_receiver(ex, Arc::clone(&probe_schema), n));
    let build_src = PreparedInputExec::new(
        "build partition",
        delivered(Arc::clone(&build_schema), build_rx, "build partition"),
        n,
    );
    let usual = join(build_src, probe_recv)?.execute(partition, Arc::clone(&ctx))?;
    let tracker = shape.as_ref().map(|shape| {
        (
            Arc::clone(shape),
            Arc::new(Mutex::new(Matches::new(partition, n))),
        )
    });
    let tracked = |s: SendableRecordBatchStream| match &tracker {
        Some((shape, matches)) => track(s, Arc::clone(shape), Arc::clone(matches), None),
        None => s.boxed(),
    };
    let mut outputs: Vec<BoxStream<'static, Result<RecordBatch>>> = vec![tracked(usual)];

    // One heavy join per detection round: the build rows every owner broadcast for the
    // keys announced in that round, with the probe rows of those keys kept here. A
    // round's join starts as soon as its broadcast is complete, while routing goes on.
    let mut local_txs = Vec::with_capacity(rounds);
    let mut drains = Vec::with_capacity(rounds);
    for r in 0..rounds as u32 {
        let recv = shuffle_receiver(ex + HEAVY_EXCHANGES_FROM + r, Arc::clone(&build_schema), n)
            .execute(partition, Arc::clone(&ctx))?;
        let (build_tx, build_rx) = oneshot::channel();
        drains.push((recv, build_tx));
        let (local_tx, local_rx) = mpsc::unbounded_channel::<RecordBatch>();
        local_txs.push(local_tx);
        let local = UnboundedReceiverStream::new(local_rx).map(Ok);
        let heavy = join(
            PreparedInputExec::new(
                "heavy build rows",
                delivered(Arc::clone(&build_schema), build_rx, "heavy build broadcast"),
                n,
            ),
            PreparedInputExec::new(
                "probe rows kept local",
                Box::pin(RecordBatchStreamAdapter::new(
                    Arc::clone(&probe_schema),
                    local,
                )),
                n,
            ),
        )?
        .execute(partition, Arc::clone(&ctx))?;
        outputs.push(tracked(heavy));
    }

    // Joins that route their build input: the join of the build rows of build-heavy
    // keys on this worker (kept here by the build router, or received before the key
    // was found heavy and split off by the owner task) with the probe rows of those keys
    // every worker broadcasts. Each such build row is on one worker and meets every
    // probe row of its key there, so the original join type decides it.
    // A probe-preserving join runs it as a counterpart, and the origin of each
    // broadcast probe row keeps it for the end.
    //
    // With SFR (`FlowJoinExec::sfr`), probe rows of keys heavy on both sides are set
    // aside instead of broadcast; once every list is final, each worker sends them to
    // the nodes of its row in the key's grid, and its kept build rows of those keys to
    // the nodes of its column, into one more join (`replicate_sfr`). A build-preserving
    // join then numbers its kept build rows too (`RowIds::kept`), since their matches
    // come from several workers, and both joins run as its counterpart; the kept rows
    // are decided at the end with the build partition's.
    let mut kept_txs = None;
    let mut probe_bcast = None;
    let mut retained_rx = None;
    let mut sfr_task = None;
    let kept_tracker = tracker.clone().filter(|_| exec.sfr());
    let kept_schema = match kept_tracker {
        Some(_) => Arc::clone(&build_schema),
        None => hj.left().schema(),
    };
    // The trackers of the joins of build-heavy keys: build, probe (both in full joins
    // with SFR).
    let heavy_trackers = (kept_tracker.clone(), probe_tracker.clone());
    let mut kept_rows_rx = None;
    if routes_build {
        let (kept_tx, kept_rx) = mpsc::unbounded_channel::<RecordBatch>();
        kept_txs = Some(kept_tx);
        let ep = shared.open_send(build_ex + 1, qc.workers.clone())?;
        let retained = match &probe_tracker {
            Some(_) => {
                let (tx, rx) = mpsc::unbounded_channel::<RecordBatch>();
                retained_rx = Some(rx);
                Some((RowIds::new(partition, Arc::clone(&bcast_schema)), tx))
            }
            None => None,
        };
        let mut kept_copy = None;
        let mut set_aside = None;
        if exec.sfr() {
            let (kept_copy_tx, kept_copy_rx) = oneshot::channel::<Vec<RecordBatch>>();
            kept_copy = Some(kept_copy_tx);
            let sfr_ex = ex + exec.sfr_exchanges_from();
            let (tx, rx) = mpsc::unbounded_channel::<RecordBatch>();
            set_aside = Some(tx);
            sfr_task = Some(replicate_sfr(
                Arc::clone(&shared),
                build_keys.clone(),
                probe_keys.clone(),
                kept_copy_rx,
                rx,
                [
                    shared.open_send(sfr_ex, qc.workers.clone())?,
                    shared.open_send(sfr_ex + 1, qc.workers.clone())?,
                ],
                [Arc::clone(&kept_schema), Arc::clone(&bcast_schema)],
            ));
            let build = shuffle_receiver(sfr_ex, Arc::clone(&kept_schema), n)
                .execute(partition, Arc::clone(&ctx))?;
            let probe = shuffle_receiver(sfr_ex + 1, Arc::clone(&bcast_schema), n)
                .execute(partition, Arc::clone(&ctx))?;
            let (sh, join, ctx, trackers) = (
                Arc::clone(&shared),
                Arc::clone(&exec.join),
                Arc::clone(&ctx),
                heavy_trackers.clone(),
            );
            let sfr = futures::stream::once(async move {
                if !sh.any_build_heavy().await {
                    return Ok::<_, DataFusionError>(futures::stream::empty().boxed());
                }
                tracked_join(
                    &join,
                    (trackers.0.as_ref(), trackers.1.as_ref()),
                    PreparedInputExec::new("build rows replicated by SFR", build, n),
                    PreparedInputExec::new("probe rows replicated by SFR", probe, n),
                    partition,
                    ctx,
                )
            })
            .try_flatten();
            outputs.push(sfr.boxed());
        }
        probe_bcast = Some(ProbeBroadcast {
            outlet: shared.outlet(To::All, &bcast_schema, &ep)?,
            ep,
            retained,
            set_aside,
        });
        let recv = shuffle_receiver(build_ex + 1, Arc::clone(&bcast_schema), n)
            .execute(partition, Arc::clone(&ctx))?;
        let (sh, join, ctx, trackers) = (
            Arc::clone(&shared),
            Arc::clone(&exec.join),
            Arc::clone(&ctx),
            heavy_trackers.clone(),
        );
        // Kept build rows numbered for the end (build-preserving joins with SFR).
        let mut kept_ids = kept_tracker
            .as_ref()
            .map(|_| RowIds::kept(partition, Arc::clone(&kept_schema)));
        let kept_rows_tx = kept_ids.as_ref().map(|_| {
            let (tx, rx) = oneshot::channel::<Vec<RecordBatch>>();
            kept_rows_rx = Some(rx);
            tx
        });
        let build_schema = Arc::clone(&kept_schema);
        let heavy = futures::stream::once(async move {
            if !sh.any_build_heavy().await {
                return Ok::<_, DataFusionError>(futures::stream::empty().boxed());
            }
            // Collected first (the join's hash table needs all of them anyway), so
            // that SFR can replicate those of keys heavy on both sides as well.
            let kept: Vec<RecordBatch> = UnboundedReceiverStream::new(kept_rx).collect().await;
            let kept = match &mut kept_ids {
                Some(ids) => kept.iter().map(|b| ids.number(b)).collect::<Result<_>>()?,
                None => kept,
            };
            if let Some(tx) = kept_rows_tx {
                let _ = tx.send(kept.clone());
            }
            if let Some(tx) = kept_copy {
                let _ = tx.send(kept.clone());
            }
            let kept = futures::stream::iter(kept.into_iter().map(Ok));
            let build = PreparedInputExec::new(
                "build rows of build-heavy keys",
                Box::pin(RecordBatchStreamAdapter::new(build_schema, kept)),
                n,
            );
            let probe = PreparedInputExec::new("probe rows broadcast", recv, n);
            let trackers = (trackers.0.as_ref(), trackers.1.as_ref());
            tracked_join(&join, trackers, build, probe, partition, ctx)
        })
        .try_flatten();
        outputs.push(heavy.boxed());
    }

    // Build-preserving joins: the exchange of matches, and this worker's build rows
    // for the end; probe-preserving joins that route their build input: the same for
    // the probe rows this worker broadcast.
    let mut combines: Vec<BoxFuture<'static, Result<Vec<RecordBatch>>>> = Vec::new();
    let combine = |side: Side,
                   match_ex: u32,
                   (shape, matches): &(Arc<Shape>, Arc<Mutex<Matches>>),
                   rows: BoxFuture<'static, Result<Vec<RecordBatch>>>|
     -> Result<BoxFuture<'static, Result<Vec<RecordBatch>>>> {
        let ep = shared.open_send(match_ex, qc.workers.clone())?;
        let reports =
            shuffle_receiver(match_ex, row_id_schema(), n).execute(partition, Arc::clone(&ctx))?;
        Ok(Box::pin(combine_matches(
            Arc::clone(&shared),
            side,
            Arc::clone(shape),
            Arc::clone(matches),
            ep,
            reports,
            rows,
        )))
    };
    let mut numbered_tx = None;
    if let Some(tracker) = &tracker {
        let (tx, rx) = oneshot::channel::<Result<Vec<RecordBatch>>>();
        numbered_tx = Some(tx);
        let kept = kept_rows_rx.take();
        let rows = async move {
            let mut rows = rx.await.map_err(|_| {
                internal_datafusion_err!("the build partition of a Flow-Join ended early")
            })??;
            // None sent: the build side had no heavy hitters, so nothing was kept.
            if let Some(kept) = kept {
                rows.extend(kept.await.unwrap_or_default());
            }
            Ok(rows)
        };
        let match_ex = ex + HEAVY_EXCHANGES_FROM + rounds as u32;
        combines.push(combine(Side::Build, match_ex, tracker, Box::pin(rows))?);
    }
    if let (Some(tracker), Some(rx)) = (&probe_tracker, retained_rx) {
        // Complete when the probe router is done.
        let rows = UnboundedReceiverStream::new(rx).map(Ok).try_collect();
        let match_ex = ex + exec.probe_matches_exchange();
        combines.push(combine(Side::Probe, match_ex, tracker, Box::pin(rows))?);
    }

    let (err_tx, err_rx) = mpsc::unbounded_channel::<DataFusionError>();
    let (owner_tx, owner_rx) = mpsc::unbounded_channel::<(u32, Vec<u64>)>();
    let mut tasks = Vec::new();
    let mut spawn = |fut: futures::future::BoxFuture<'static, Result<()>>| {
        let err_tx = err_tx.clone();
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = fut.await {
                let _ = err_tx.send(e);
            }
        })));
    };
    let reports = Arc::new(Reports {
        ep: report_ep,
        users: std::sync::atomic::AtomicUsize::new(1 + usize::from(build_router.is_some())),
    });
    let router = Router::new(
        &shared,
        Side::Probe,
        &probe_schema,
        probe_keys,
        probe_ep,
        local_txs,
        probe_bcast,
        &config,
        expected,
    )?;
    spawn(Box::pin(router.run(probe_input, Arc::clone(&reports))));
    if let Some((input, ep)) = build_router {
        let router = Router::new(
            &shared,
            Side::Build,
            &input.schema(),
            build_keys.clone(),
            ep,
            kept_txs.iter().cloned().collect(),
            None,
            &config,
            inputs
                .build_rows_per_worker
                .unwrap_or(DEFAULT_PROBE_ROWS_PER_WORKER),
        )?;
        spawn(Box::pin(router.run(input, reports)));
    }
    spawn(Box::pin(own(
        Arc::clone(&shared),
        build_input,
        build_keys,
        build_tx,
        numbered_tx.map(|tx| (Arc::clone(&build_schema), tx)),
        kept_txs,
        bcast_eps,
        owner_rx,
    )));
    spawn(Box::pin(listen(Arc::clone(&shared), announce_rx, owner_tx)));
    if let Some(task) = sfr_task {
        spawn(Box::pin(task));
    }
    for (round, (recv, tx)) in drains.into_iter().enumerate() {
        spawn(Box::pin(drain(Arc::clone(&shared), round as u32, recv, tx)));
    }
    if let Some((reports, announce_ep)) = detector_eps {
        spawn(Box::pin(detect(
            Arc::clone(&shared),
            reports,
            announce_ep,
            rounds,
            config.threshold,
        )));
    }
    drop(err_tx);

    outputs.push(UnboundedReceiverStream::new(err_rx).map(Err).boxed());
    let output_rows = shared.m.output_rows.clone();
    let mut merged = futures::stream::select_all(outputs).boxed();
    for combine in combines {
        // Once every join here is done: exchange matches, then emit the tracked rows.
        let tail = futures::stream::once(combine)
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
        merged = merged.chain(tail).boxed();
    }
    let merged = merged.inspect(move |b| {
        if let Ok(b) = b {
            output_rows.add(b.num_rows());
        }
    });
    let guarded = futures::stream::unfold((merged, tasks), |(mut s, tasks)| async move {
        s.next().await.map(|b| (b, (s, tasks)))
    });
    // The peers need this worker's routing, broadcasts and match reports even if its
    // consumer stops reading early.
    Ok(run_detached(exec.join.schema(), guarded.boxed()))
}

/// The detection reports' endpoint, which the build and probe routers share: finished
/// when the last of them is done.
struct Reports {
    ep: SendEndpoint,
    users: std::sync::atomic::AtomicUsize,
}

impl Reports {
    fn done(&self) {
        if self.users.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            self.ep.finish();
        }
    }
}

/// Probe side of a join that routes its build input: where the probe rows of keys heavy
/// on the build side go (every worker).
struct ProbeBroadcast {
    ep: SendEndpoint,
    outlet: Outlet,
    /// Probe-preserving joins: numbers those rows (`super::matches`) and keeps them
    /// for the end, when this worker emits them by their combined matches.
    retained: Option<(RowIds, mpsc::UnboundedSender<RecordBatch>)>,
    /// With SFR: where probe rows of keys heavy on both sides are set aside.
    set_aside: Option<mpsc::UnboundedSender<RecordBatch>>,
}

impl ProbeBroadcast {
    /// `part` as it leaves this worker: numbered and kept for the end when the probe
    /// side is tracked (broadcast and set-aside rows share one numbering).
    fn leaving(&mut self, part: RecordBatch) -> Result<RecordBatch> {
        let Some((ids, retained)) = &mut self.retained else {
            return Ok(part);
        };
        let part = ids.number(&part)?;
        // The receiver is gone only when the query's output was dropped.
        let _ = retained.send(part.clone());
        Ok(part)
    }
}

/// Routes one side's local input. Probe rows with a heavy hash stay (into the heavy
/// join of the round that found the hash), probe rows whose key is heavy on the build
/// side go to every worker, build rows whose key is heavy on the build side stay (into
/// the join of those keys); the rest go to their owners.
struct Router {
    sh: Arc<Shared>,
    side: Side,
    keys: Vec<PhysicalExprRef>,
    ep: SendEndpoint,
    outlets: Vec<Outlet>,
    /// Local slots: the probe side's heavy join per detection round, or the build
    /// side's join of build-heavy keys.
    local_txs: Vec<mpsc::UnboundedSender<RecordBatch>>,
    /// Probe side of a join that routes its build input: the broadcast of probe rows
    /// whose key is heavy on the build side.
    bcast: Option<ProbeBroadcast>,
    detector: NodeDetector,
    /// Heavy hash -> its destination index in `dests`.
    heavy: DirectMap<u32>,
    /// How many of the shared heavy hashes `heavy` holds.
    heavy_seen: usize,
    named: HashSetU64,
    /// Row indices of a batch by destination: owners `0..n`, then the local slots
    /// (`n + slot`), then the broadcast, then the rows set aside for SFR.
    dests: Vec<Vec<u32>>,
    owner: Modulo,
    routed: u64,
    /// Where counting resumes in the next batch (sampling spans batches).
    next_counted: usize,
    /// Rows held back after reporting round 0, until its answer (see `run`).
    hold_limit: u64,
}

impl Router {
    #[allow(clippy::too_many_arguments)]
    fn new(
        sh: &Arc<Shared>,
        side: Side,
        schema: &SchemaRef,
        keys: Vec<PhysicalExprRef>,
        ep: SendEndpoint,
        local_txs: Vec<mpsc::UnboundedSender<RecordBatch>>,
        bcast: Option<ProbeBroadcast>,
        config: &gyre_join::flow::DetectionConfig,
        expected: u64,
    ) -> Result<Self> {
        let n = sh.n();
        let outlets = sh
            .qc
            .workers
            .iter()
            .map(|w| sh.outlet(To::Node(*w), schema, &ep))
            .collect::<Result<Vec<_>>>()?;
        let slots = local_txs.len();
        Ok(Self {
            sh: Arc::clone(sh),
            side,
            keys,
            ep,
            outlets,
            local_txs,
            bcast,
            detector: NodeDetector::new(config, 1, expected),
            heavy: DirectMap::default(),
            heavy_seen: 0,
            named: HashSetU64::default(),
            dests: vec![Vec::new(); n + slots + 2],
            owner: Modulo::new(n as u64),
            routed: 0,
            next_counted: 0,
            hold_limit: (expected / 20).max(HOLD_MIN_ROWS),
        })
    }

    /// Takes in the heavy hashes announced since the last look.
    fn refresh(&mut self) {
        let n = self.sh.n() as u32;
        let hashes = self.sh.heavy(self.side).hashes.read();
        if hashes.len() > self.heavy_seen {
            if self.heavy.is_empty() && self.side == Side::Probe {
                self.sh.m.first_heavy_after_rows.set(self.routed as usize);
            }
            let broadcast = n + self.local_txs.len() as u32;
            let sfr = self.bcast.as_ref().is_some_and(|b| b.set_aside.is_some());
            for &(hash, round) in &hashes[self.heavy_seen..] {
                // A hash announced twice keeps the round that found it first, and a
                // probe row whose key is heavy on the build side is broadcast, or with
                // SFR set aside once the key is heavy on the probe side too.
                match self.heavy.get(hash) {
                    None => {
                        let slot = match self.side {
                            Side::Probe => round,
                            Side::Build => 0,
                        };
                        self.heavy.insert(hash, n + slot);
                    }
                    Some(d) if d == broadcast && sfr => self.heavy.insert(hash, broadcast + 1),
                    Some(_) => {}
                }
            }
            self.heavy_seen = hashes.len();
        }
    }

    /// Probe side: takes in the final build-side heavy hashes, before any row is routed.
    fn take_build_list(&mut self) {
        let n = self.sh.n() as u32;
        let broadcast = n + self.local_txs.len() as u32;
        for &(hash, _) in self.sh.build_heavy.hashes.read().iter() {
            self.heavy.insert(hash, broadcast);
        }
        // Probe-side heavy hashes taken in before (none routed yet) are looked at
        // again: with SFR, those heavy on both sides are set aside.
        self.heavy_seen = 0;
    }

    /// Routes the rows held back, with what is known now.
    async fn release(&mut self, held: &mut Vec<Hashed>) -> Result<()> {
        self.refresh();
        for h in std::mem::take(held) {
            self.route(&h).await?;
        }
        Ok(())
    }

    /// Rows are held back (not routed) while the input keeps flowing:
    /// - after round 0 was reported with candidates, so that the first heavy hitters
    ///   apply to nearly all rows without idling. At `hold_limit` rows, or at the end
    ///   of the input, the router waits for the answer at most [`FIRST_ROUND_WAIT`]: a
    ///   peer whose input depends on this worker's progress (through an upstream
    ///   exchange) may not report until this one goes on;
    /// - on the probe side of a join that routes its build input, until the build
    ///   side's heavy hitters are final: a probe row of such a key must reach every
    ///   worker. That wait has no limit; the join could not probe before its build side
    ///   is complete anyway.
    async fn run(
        mut self,
        mut input: SendableRecordBatchStream,
        reports: Arc<Reports>,
    ) -> Result<()> {
        let result = async {
            let mut awaiting = false;
            let mut build_pending = self.bcast.is_some();
            let mut held: Vec<Hashed> = Vec::new();
            let mut held_rows = 0u64;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let rows = batch.num_rows();
                if rows == 0 {
                    continue;
                }
                let hashed = {
                    let timer = self.sh.m.routing_time.clone();
                    let _t = timer.timer();
                    let hashed = Hashed::new(&self.keys, batch)?;
                    self.count(&hashed.hashes);
                    hashed
                };
                // Reported before this batch is routed, so that a batch that reaches
                // round 0 (with the first batches, often the whole input of a small
                // table) is held for its answer too.
                for r in self.detector.advance(rows as u64) {
                    // Only with candidates of its own: see `FIRST_ROUND_WAIT`.
                    awaiting |= r.iteration == 0 && !r.candidates.is_empty();
                    self.report(&reports.ep, r).await?;
                }
                if build_pending && self.sh.build_list_is_final() {
                    self.take_build_list();
                    build_pending = false;
                }
                if awaiting || build_pending {
                    held_rows += rows as u64;
                    held.push(hashed);
                    awaiting &= *self.sh.rounds(self.side).borrow() == 0;
                    if held_rows >= self.hold_limit {
                        if build_pending {
                            self.wait_build_list().await;
                            build_pending = false;
                        }
                        if awaiting {
                            self.wait_first_round().await;
                            awaiting = false;
                        }
                    }
                    if !awaiting && !build_pending {
                        held_rows = 0;
                        self.release(&mut held).await?;
                    }
                } else {
                    self.refresh();
                    self.route(&hashed).await?;
                }
            }
            for r in self.detector.finish() {
                self.report(&reports.ep, r).await?;
            }
            if build_pending {
                self.wait_build_list().await;
            }
            if awaiting {
                self.wait_first_round().await;
            }
            self.release(&mut held).await?;
            for o in &mut self.outlets {
                o.flush(&self.ep, &self.sh.send_m).await?;
            }
            if let Some(b) = &mut self.bcast {
                b.outlet.flush(&b.ep, &self.sh.send_m).await?;
            }
            Ok(())
        }
        .await;
        let bcast_ep = self.bcast.as_ref().map(|b| &b.ep);
        match result {
            Ok(()) => {
                self.ep.finish();
                if let Some(ep) = bcast_ep {
                    ep.finish();
                }
                reports.done();
                Ok(())
            }
            Err(e) => {
                let e = self.sh.fail(&self.ep, e);
                let e = match bcast_ep {
                    Some(ep) => self.sh.fail(ep, e),
                    None => e,
                };
                Err(self.sh.fail(&reports.ep, e))
            }
        }
    }

    async fn wait_first_round(&self) {
        let _t = self.sh.m.first_round_wait.timer();
        let mut rounds = self.sh.rounds(self.side).subscribe();
        let _ = tokio::time::timeout(FIRST_ROUND_WAIT, rounds.wait_for(|r| *r > 0)).await;
    }

    /// Probe side of a join that routes its build input: waits for the final build-side
    /// heavy hitters and takes them in.
    async fn wait_build_list(&mut self) {
        {
            let _t = self.sh.m.build_list_wait.timer();
            self.sh.build_list_final().await;
        }
        self.take_build_list();
    }

    /// Counts a sample of the rows' hashes (sampling continues across batches).
    fn count(&mut self, hashes: &[u64]) {
        let Some(step) = self.detector.step() else {
            return; // detection is over
        };
        let mut h = self.detector.histogram(0).lock().expect("histogram lock");
        let mut i = self.next_counted.min(step - 1);
        while i < hashes.len() {
            h.update(hashes[i]);
            i += step;
        }
        self.next_counted = i - hashes.len();
    }

    async fn route(&mut self, hashed: &Hashed) -> Result<()> {
        let Hashed {
            batch,
            keys,
            hashes,
        } = hashed;
        let rows = batch.num_rows();
        let n = self.sh.n();
        let owner = self.owner;
        {
            let timer = self.sh.m.routing_time.clone();
            let _t = timer.timer();
            self.dests.iter_mut().for_each(Vec::clear);
            if self.heavy.is_empty() {
                for (i, &x) in hashes.iter().enumerate() {
                    self.dests[owner.of(x) as usize].push(i as u32);
                }
            } else {
                for (i, &x) in hashes.iter().enumerate() {
                    let d = match self.heavy.get(x) {
                        Some(d) => d as usize,
                        None => owner.of(x) as usize,
                    };
                    self.dests[d].push(i as u32);
                }
            }
        }
        self.routed += rows as u64;
        match self.side {
            Side::Probe => self.sh.m.probe_rows.add(rows),
            Side::Build => self.sh.m.build_rows.add(rows),
        }
        for q in 0..n {
            let len = self.dests[q].len();
            if len == 0 {
                continue;
            }
            let part = if len == rows {
                batch.clone()
            } else {
                // The index vector becomes the array's buffer, without a copy.
                let idx = UInt32Array::from(std::mem::take(&mut self.dests[q]));
                take_record_batch(batch, &idx)?
            };
            self.outlets[q]
                .push(&self.ep, part, &self.sh.send_m)
                .await?;
        }
        for slot in 0..self.local_txs.len() {
            let idx = std::mem::take(&mut self.dests[n + slot]);
            if idx.is_empty() {
                continue;
            }
            self.name(hashes, keys, &idx);
            match self.side {
                Side::Probe => self.sh.m.probe_rows_local.add(idx.len()),
                Side::Build => self.sh.m.build_rows_local.add(idx.len()),
            }
            let part = take_record_batch(batch, &UInt32Array::from(idx))?;
            // The receiver is gone only when the query's output was dropped.
            let _ = self.local_txs[slot].send(part);
        }
        let broadcast = std::mem::take(&mut self.dests[n + self.local_txs.len()]);
        if !broadcast.is_empty() {
            let Some(b) = &mut self.bcast else {
                return Err(internal_datafusion_err!(
                    "a Flow-Join router without a broadcast has rows to broadcast"
                ));
            };
            self.sh.m.probe_rows_broadcast.add(broadcast.len());
            let part = b.leaving(take_record_batch(batch, &UInt32Array::from(broadcast))?)?;
            b.outlet.push(&b.ep, part, &self.sh.send_m).await?;
        }
        let set_aside = std::mem::take(&mut self.dests[n + self.local_txs.len() + 1]);
        if !set_aside.is_empty() {
            let Some(b) = self.bcast.as_mut().filter(|b| b.set_aside.is_some()) else {
                return Err(internal_datafusion_err!(
                    "a Flow-Join router without SFR has rows to set aside for it"
                ));
            };
            let part = b.leaving(take_record_batch(batch, &UInt32Array::from(set_aside))?)?;
            if let Some(tx) = &b.set_aside {
                // The receiver is gone only when the query failed.
                let _ = tx.send(part);
            }
        }
        Ok(())
    }

    /// Until every heavy hash has a name, looks for rows of the unnamed ones.
    fn name(&mut self, hashes: &[u64], keys: &[ArrayRef], idx: &[u32]) {
        if self.named.len() >= self.heavy.len() {
            return;
        }
        for &i in idx {
            if self.named.insert(hashes[i as usize]) {
                name_heavy_hitter(&self.sh, self.side, hashes[i as usize], keys, i as usize);
            }
        }
    }
    async fn report(&mut self, ep: &SendEndpoint, r: NodeReport) -> Result<()> {
        self.sh.m.quiet_windows.add(usize::from(r.quiet));
        self.sh.m.detection_rounds.add(1);
        let msg = Control::Report {
            side: self.side,
            iteration: r.iteration,
            window: r.window,
            total: r.processed,
            candidates: r.candidates,
        };
        send_control(ep, To::Node(self.sh.detector_node), &msg).await
    }
}

/// Remembers the key value of a heavy hash (for `EXPLAIN ANALYZE`).
fn name_heavy_hitter(sh: &Shared, side: Side, hash: u64, arrays: &[ArrayRef], row: usize) {
    let mut report = sh.report.lock();
    let Some(h) = report.heavy_of(side).get_mut(&hash) else {
        return;
    };
    if h.key.is_some() {
        return;
    }
    let text: Vec<String> = arrays
        .iter()
        .map(|a| {
            ScalarValue::try_from_array(a, row)
                .map(|v| v.to_string())
                .unwrap_or_else(|_| "?".into())
        })
        .collect();
    h.key = Some(if text.len() == 1 {
        text.into_iter().next().unwrap_or_default()
    } else {
        format!("({})", text.join(", "))
    });
}

/// Collects the build partition for the usual join, then broadcasts, for every
/// detection round, the rows of the hashes announced in it (and ends that round's
/// broadcast, also when it names none). With `numbered` (build-preserving joins), the
/// rows get their ids first, and the numbered partition also goes to the end phase.
/// With `kept` (joins that route their build input), the rows of build-heavy keys go
/// there instead, once the build side's heavy hitters are final.
#[allow(clippy::too_many_arguments)]
async fn own(
    sh: Arc<Shared>,
    input: SendableRecordBatchStream,
    keys: Vec<PhysicalExprRef>,
    build_tx: oneshot::Sender<Result<Vec<RecordBatch>>>,
    numbered: Option<(SchemaRef, oneshot::Sender<Result<Vec<RecordBatch>>>)>,
    kept: Option<mpsc::UnboundedSender<RecordBatch>>,
    eps: Vec<SendEndpoint>,
    mut heavy_rx: mpsc::UnboundedReceiver<(u32, Vec<u64>)>,
) -> Result<()> {
    let fail_all = |e: DataFusionError| {
        let text = e.to_string();
        for ep in &eps {
            sh.fail(ep, DataFusionError::Execution(text.clone()));
        }
        e
    };
    let mut schema = input.schema();
    let collected = async {
        let b = input.try_collect::<Vec<RecordBatch>>().await?;
        let b = match kept {
            Some(kept) => split_build_heavy(&sh, &keys, b, kept).await?,
            None => b,
        };
        match &numbered {
            Some((numbered_schema, _)) => number_rows(sh.partition, &b, numbered_schema),
            None => Ok(b),
        }
    }
    .await;
    let batches = match collected {
        Ok(b) => b,
        Err(e) => {
            let text = e.to_string();
            let _ = build_tx.send(Err(e));
            if let Some((_, tx)) = numbered {
                let _ = tx.send(Err(DataFusionError::Execution(text.clone())));
            }
            return Err(fail_all(DataFusionError::Execution(text)));
        }
    };
    let _ = build_tx.send(Ok(batches.clone()));
    if let Some((numbered_schema, tx)) = numbered {
        schema = numbered_schema;
        let _ = tx.send(Ok(batches.clone()));
    }
    let result = async {
        let mut hashed: Option<Vec<Hashed>> = None;
        let metrics = SendMetrics::new(&ExecutionPlanMetricsSet::new(), sh.partition);
        let mut done = vec![false; eps.len()];
        while let Some((round, new)) = heavy_rx.recv().await {
            let Some(ep) = eps.get(round as usize) else {
                return Err(internal_datafusion_err!(
                    "heavy hitters announced for round {round} of {}",
                    eps.len()
                ));
            };
            let new: HashSetU64 = new.into_iter().collect();
            if !new.is_empty() {
                // Hashed once, on the first announcement that names any key.
                let hashed = match &mut hashed {
                    Some(h) => h,
                    None => hashed.insert(
                        batches
                            .iter()
                            .map(|b| Hashed::new(&keys, b.clone()))
                            .collect::<Result<_>>()?,
                    ),
                };
                let mut outlet = sh.outlet(To::All, &schema, ep)?;
                for h in hashed.iter() {
                    let idx: Vec<u32> = h
                        .hashes
                        .iter()
                        .enumerate()
                        .filter(|(_, x)| new.contains(x))
                        .map(|(i, _)| i as u32)
                        .collect();
                    if !idx.is_empty() {
                        for &i in &idx {
                            name_heavy_hitter(
                                &sh,
                                Side::Probe,
                                h.hashes[i as usize],
                                &h.keys,
                                i as usize,
                            );
                        }
                        sh.m.build_rows_broadcast.add(idx.len());
                        sh.build_rows_shared
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        let part = take_record_batch(&h.batch, &UInt32Array::from(idx))?;
                        outlet.push(ep, part, &metrics).await?;
                    }
                }
                outlet.flush(ep, &metrics).await?;
            }
            ep.finish();
            done[round as usize] = true;
        }
        if let Some(r) = done.iter().position(|d| !d) {
            return Err(internal_datafusion_err!(
                "Flow-Join detection ended before round {r} was announced"
            ));
        }
        Ok(())
    }
    .await;
    result.map_err(fail_all)
}

/// The owner's part in a join that routes its build input: once the build side's heavy
/// hitters are final, moves the received rows of those keys (sent before a key was
/// found heavy) to the join of build-heavy keys, and returns the rest.
async fn split_build_heavy(
    sh: &Shared,
    keys: &[PhysicalExprRef],
    batches: Vec<RecordBatch>,
    kept: mpsc::UnboundedSender<RecordBatch>,
) -> Result<Vec<RecordBatch>> {
    sh.build_list_final().await;
    let heavy: HashSetU64 = sh.build_heavy.hashes.read().iter().map(|h| h.0).collect();
    if heavy.is_empty() {
        return Ok(batches);
    }
    let mut rest = Vec::with_capacity(batches.len());
    for b in batches {
        let h = Hashed::new(keys, b)?;
        let (go, stay): (Vec<u32>, Vec<u32>) =
            (0..h.hashes.len() as u32).partition(|&i| heavy.contains(&h.hashes[i as usize]));
        if go.is_empty() {
            rest.push(h.batch);
            continue;
        }
        // The receiver is gone only when the query's output was dropped.
        let _ = kept.send(take_record_batch(&h.batch, &UInt32Array::from(go))?);
        if !stay.is_empty() {
            rest.push(take_record_batch(&h.batch, &UInt32Array::from(stay))?);
        }
    }
    Ok(rest)
}

/// Applies worker 0's announcements in order.
async fn listen(
    sh: Arc<Shared>,
    ep: ReceiveEndpoint,
    owner_tx: mpsc::UnboundedSender<(u32, Vec<u64>)>,
) -> Result<()> {
    while let Some(msg) = ep.get().await.map_err(transport_err)? {
        if msg.data().is_empty() {
            ep.release(msg);
            continue;
        }
        let control = control_of(&msg)?;
        ep.release(msg);
        let Control::Announce {
            side,
            iteration,
            keys,
        } = control
        else {
            return Err(internal_datafusion_err!(
                "Flow-Join expected a heavy-hitter announcement, got {control:?}"
            ));
        };
        {
            let mut report = sh.report.lock();
            let heavy = report.heavy_of(side);
            for &(hash, estimate) in &keys {
                heavy.entry(hash).or_insert(HeavyHitter {
                    iteration,
                    estimate,
                    key: None,
                });
            }
        }
        let hashes: Vec<u64> = keys.iter().map(|k| k.0).collect();
        sh.heavy(side).extend(&hashes, iteration);
        match side {
            Side::Build => {
                if sh.build_iterations == 0 {
                    return Err(internal_datafusion_err!(
                        "build-side heavy hitters announced to a Flow-Join that does not route its build input"
                    ));
                }
                sh.m.build_heavy_hitters.add(keys.len());
            }
            Side::Probe => {
                sh.m.heavy_hitters.add(keys.len());
                // An empty round still counts: the owner ends that round's broadcast.
                let _ = owner_tx.send((iteration, hashes));
            }
        }
        // A router waiting for round 0, or for the final build-side list, goes on.
        sh.rounds(side).send_modify(|r| *r += 1);
    }
    Ok(())
}

/// Collects the heavy build rows every owner broadcasts for `round`. A round announced
/// without heavy hitters has none, so its join gets its (empty) build side at the
/// announcement, not after every owner's end of stream; the stream is still read to
/// its end, and a row on it is an error.
async fn drain(
    sh: Arc<Shared>,
    round: u32,
    mut input: SendableRecordBatchStream,
    tx: oneshot::Sender<Result<Vec<RecordBatch>>>,
) -> Result<()> {
    let mut tx = Some(tx);
    let mut batches = Vec::new();
    let quiet = announced_empty(&sh.rounds, &sh.heavy, round);
    tokio::pin!(quiet);
    loop {
        tokio::select! {
            next = input.next() => match next {
                Some(Ok(b)) => batches.push(b),
                Some(Err(e)) => {
                    let text = e.to_string();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(Err(e));
                    }
                    return Err(DataFusionError::Execution(text));
                }
                None => break,
            },
            // Once `tx` is used, the round's answer is given.
            () = &mut quiet, if tx.is_some() => {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Ok(Vec::new()));
                }
            }
        }
    }
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    sh.m.heavy_build_rows_received.add(rows);
    match tx {
        Some(tx) => {
            let _ = tx.send(Ok(batches));
            Ok(())
        }
        None if rows > 0 => Err(internal_datafusion_err!(
            "{rows} heavy build rows arrived for detection round {round}, announced without heavy hitters"
        )),
        None => Ok(()),
    }
}

/// Resolves once round `round` was announced without heavy hitters (never otherwise).
/// `applied` counts the announcements applied, in order, each after its hashes joined
/// `heavy`.
async fn announced_empty(applied: &tokio::sync::watch::Sender<u32>, heavy: &HeavySet, round: u32) {
    let mut applied = applied.subscribe();
    if applied.wait_for(|n| *n > round).await.is_ok()
        && !heavy.hashes.read().iter().any(|&(_, r)| r == round)
    {
        return;
    }
    std::future::pending::<()>().await
}

/// Worker 0: forms the global heavy-hitter list of each detection round.
async fn detect(
    sh: Arc<Shared>,
    reports: ReceiveEndpoint,
    ep: SendEndpoint,
    iterations: usize,
    threshold: f64,
) -> Result<()> {
    let result = async {
        let mut coordinator = Coordinator::new(sh.n(), iterations, threshold);
        let mut build = Coordinator::new(sh.n(), sh.build_iterations as usize, threshold);
        while let Some(msg) = reports.get().await.map_err(transport_err)? {
            if msg.data().is_empty() {
                reports.release(msg);
                continue;
            }
            let control = control_of(&msg)?;
            let from = msg.node;
            reports.release(msg);
            let Control::Report {
                side,
                iteration,
                window,
                total,
                candidates,
            } = control
            else {
                return Err(internal_datafusion_err!(
                    "Flow-Join expected a detection report from {}, got {control:?}",
                    node_name(from)
                ));
            };
            let announcements = match side {
                Side::Probe => &mut coordinator,
                Side::Build => &mut build,
            }
            .add(iteration, window, total, &candidates)
            .map_err(|e| internal_datafusion_err!("{} sent a bad report: {e}", node_name(from)))?;
            for (iteration, keys) in announcements {
                let msg = Control::Announce {
                    side,
                    iteration,
                    keys,
                };
                send_control(&ep, To::All, &msg).await?;
            }
        }
        if !coordinator.complete() || !build.complete() {
            return Err(internal_datafusion_err!(
                "Flow-Join detection ended before every worker reported every round"
            ));
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            ep.finish();
            Ok(())
        }
        Err(e) => Err(sh.fail(&ep, e)),
    }
}

/// A counterpart join's output: records the tracked rows it matched (ids in the shape's
/// row id column, and with `also` the other side's in the next), passes on what the
/// original join emits now.
fn track(
    s: SendableRecordBatchStream,
    shape: Arc<Shape>,
    matches: Arc<Mutex<Matches>>,
    also: Option<Arc<Mutex<Matches>>>,
) -> BoxStream<'static, Result<RecordBatch>> {
    let column = shape.row_id_column();
    s.filter_map(move |b| {
        let out = b.and_then(|b| {
            matches.lock().record(b.column(column).as_ref())?;
            if let Some(also) = &also {
                also.lock().record(b.column(column + 1).as_ref())?;
            }
            shape.streamed(&b)
        });
        futures::future::ready(out.transpose())
    })
    .boxed()
}

/// A tracked side's shape and the matches this worker's joins found for it.
type Tracker = (Arc<Shape>, Arc<Mutex<Matches>>);

/// `join` over `build` and `probe`: the original join, or, with trackers (build,
/// probe), its counterpart recording the tracked sides' matches. These are the joins of
/// build-heavy keys: probe-preserving joins track the probe rows broadcast or
/// replicated there, build-preserving joins with SFR their kept build rows, full joins
/// with SFR both.
fn tracked_join(
    join: &Arc<dyn ExecutionPlan>,
    trackers: (Option<&Tracker>, Option<&Tracker>),
    build: Arc<dyn ExecutionPlan>,
    probe: Arc<dyn ExecutionPlan>,
    partition: usize,
    ctx: Arc<TaskContext>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let hj = || {
        join.downcast_ref::<HashJoinExec>()
            .ok_or_else(|| internal_datafusion_err!("a Flow-Join without a hash join"))
    };
    Ok(match trackers {
        (None, None) => Arc::clone(join)
            .replace_children(vec![build, probe], recompute())?
            .execute(partition, ctx)?
            .boxed(),
        (Some((shape, matches)), None) | (None, Some((shape, matches))) => {
            let s = shape.join(hj()?, build, probe)?.execute(partition, ctx)?;
            track(s, Arc::clone(shape), Arc::clone(matches), None)
        }
        (Some((shape, build_matches)), Some((_, probe_matches))) => {
            let s = shape
                .join_both_tracked(hj()?, build, probe)?
                .execute(partition, ctx)?;
            let also = Some(Arc::clone(probe_matches));
            track(s, Arc::clone(shape), Arc::clone(build_matches), also)
        }
    })
}

/// Symmetric Fragment Replicate (thesis 4.4.2) for the keys heavy on both sides, once
/// every list is final: each such key gets the grid of least cost for its estimated
/// build and probe rows (`gyre_join::flow::sfr::choose_grid`, the same announced
/// estimates on every worker). This worker, at (row `me / cols`, column
/// `me % cols`), sends its kept build rows of the key to every node of its column and
/// the probe rows it set aside to every node of its row, so each build-probe pair
/// meets exactly once, on one more join per worker. Build rows take part in the
/// broadcast join too, which holds the probe rows routed before their key was heavy
/// on both sides. A build-preserving join's kept build rows carry their ids here, so
/// that their owner can combine the matches of every copy. `eps` and `schemas`: build,
/// then probe.
async fn replicate_sfr(
    sh: Arc<Shared>,
    build_keys: Vec<PhysicalExprRef>,
    probe_keys: Vec<PhysicalExprRef>,
    kept: oneshot::Receiver<Vec<RecordBatch>>,
    set_aside: mpsc::UnboundedReceiver<RecordBatch>,
    eps: [SendEndpoint; 2],
    schemas: [SchemaRef; 2],
) -> Result<()> {
    let result = async {
        if !sh.any_build_heavy().await {
            return Ok(());
        }
        // Complete when the probe router is done.
        let probe: Vec<RecordBatch> = UnboundedReceiverStream::new(set_aside).collect().await;
        let mut rounds = sh.rounds.subscribe();
        let _ = rounds.wait_for(|r| *r >= sh.probe_iterations).await;
        let (n, me) = (sh.n(), sh.partition);
        let grids: std::collections::HashMap<u64, Grid> = {
            let mut report = sh.report.lock();
            let grids: std::collections::HashMap<u64, Grid> = report
                .build_heavy
                .iter()
                .filter_map(|(hash, b)| {
                    let p = report.heavy.get(hash)?;
                    let grid = choose_grid(n, b.estimate.max(1) as f64, p.estimate.max(1) as f64);
                    Some((*hash, grid))
                })
                .collect();
            report.sfr = grids.iter().map(|(h, g)| (*h, (g.rows, g.cols))).collect();
            grids
        };
        // Without such keys the peers' joins get only this worker's ends.
        let kept = match grids.is_empty() {
            true => Vec::new(),
            // The join of build-heavy keys sends them; it is gone only when the query's
            // output was dropped.
            false => kept.await.unwrap_or_default(),
        };
        let sides = [
            (
                &eps[0],
                &schemas[0],
                &build_keys,
                kept,
                &sh.m.sfr_build_rows_sent,
                true,
            ),
            (
                &eps[1],
                &schemas[1],
                &probe_keys,
                probe,
                &sh.m.sfr_probe_rows_sent,
                false,
            ),
        ];
        for (ep, schema, keys, batches, sent, is_build) in sides {
            let mut outlets = sh
                .qc
                .workers
                .iter()
                .map(|w| sh.outlet(To::Node(*w), schema, ep))
                .collect::<Result<Vec<_>>>()?;
            let mut by_node: Vec<Vec<u32>> = vec![Vec::new(); n];
            let mut named = HashSetU64::default();
            let side = if is_build { Side::Build } else { Side::Probe };
            for batch in batches {
                let h = Hashed::new(keys, batch)?;
                for (i, hash) in h.hashes.iter().enumerate() {
                    let Some(g) = grids.get(hash) else {
                        if is_build {
                            continue; // heavy on the build side only
                        }
                        return Err(internal_datafusion_err!(
                            "a probe row set aside for SFR whose key is not heavy on both sides"
                        ));
                    };
                    if named.insert(*hash) {
                        name_heavy_hitter(&sh, side, *hash, &h.keys, i);
                    }
                    let (cols, i) = (g.cols, i as u32);
                    if is_build {
                        // This worker's column: one node in every row.
                        (0..g.rows).for_each(|r| by_node[r * cols + me % cols].push(i));
                    } else {
                        // This worker's row: every node in it.
                        (0..cols).for_each(|c| by_node[(me / cols) * cols + c].push(i));
                    }
                }
                for (node, idx) in by_node.iter_mut().enumerate() {
                    if idx.is_empty() {
                        continue;
                    }
                    sent.add(idx.len());
                    if is_build && node != me {
                        // Its matches there come back to this worker at the end.
                        sh.build_rows_shared
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    let part =
                        take_record_batch(&h.batch, &UInt32Array::from(std::mem::take(idx)))?;
                    outlets[node].push(ep, part, &sh.send_m).await?;
                }
            }
            for o in &mut outlets {
                o.flush(ep, &sh.send_m).await?;
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            eps.iter().for_each(SendEndpoint::finish);
            Ok(())
        }
        Err(e) => {
            let e = sh.fail(&eps[0], e);
            Err(sh.fail(&eps[1], e))
        }
    }
}

/// The end of a join that tracks one side's rows (`super::matches`) on one worker, once
/// its joins are done: sends the other workers' matched rows to them, takes in the
/// matches peers report for this worker's rows, and returns the rows the original join
/// emits at the end. `rows` are this worker's tracked rows with their ids: its build
/// partition (and with SFR its kept build rows), or the probe rows it broadcast
/// (complete when its router is done).
async fn combine_matches(
    sh: Arc<Shared>,
    side: Side,
    shape: Arc<Shape>,
    matches: Arc<Mutex<Matches>>,
    ep: SendEndpoint,
    mut reports: SendableRecordBatchStream,
    rows: BoxFuture<'static, Result<Vec<RecordBatch>>>,
) -> Result<Vec<RecordBatch>> {
    let (sent_metric, received_metric) = match side {
        Side::Build => (&sh.m.build_matches_sent, &sh.m.build_matches_received),
        Side::Probe => (&sh.m.probe_matches_sent, &sh.m.probe_matches_received),
    };
    let schema = reports.schema();
    let sent = async {
        let by_owner = matches.lock().take_remote();
        for (owner, ids) in by_owner.into_iter().enumerate() {
            if ids.is_empty() {
                continue;
            }
            sent_metric.add(ids.len());
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(arrow::array::UInt64Array::from(ids))],
            )?;
            let mut outlet = sh.outlet(To::Node(sh.qc.workers[owner]), &schema, &ep)?;
            outlet.push(&ep, batch, &sh.send_m).await?;
            outlet.flush(&ep, &sh.send_m).await?;
        }
        Ok(())
    }
    .await;
    match sent {
        Ok(()) => ep.finish(),
        Err(e) => return Err(sh.fail(&ep, e)),
    }
    let rows = rows.await?;
    // Only rows this worker broadcast can have been matched elsewhere. Build side: the
    // owner task is done (every round was announced), so the flag is final. Without
    // such rows nothing needs to wait for the slowest peer: dropping the receiver
    // discards the peers' (empty) ends.
    let waited = match side {
        Side::Build => sh
            .build_rows_shared
            .load(std::sync::atomic::Ordering::Relaxed),
        Side::Probe => !rows.is_empty(),
    };
    while waited && let Some(batch) = reports.next().await {
        let batch = batch?;
        received_metric.add(batch.num_rows());
        matches
            .lock()
            .merge_reported(batch.column(0).as_ref(), "a peer")?;
    }
    drop(reports);
    let matches = matches.lock();
    let mut out = Vec::new();
    for b in &rows {
        let matched = matches.of_rows(b)?;
        if let Some(rows) = shape.finished(b, |r| matched[r])? {
            out.push(rows);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A drain learns that a round is empty from the announcements alone.
    #[tokio::test]
    async fn only_a_round_announced_without_heavy_hitters_counts_as_empty() {
        let applied = tokio::sync::watch::channel(0u32).0;
        let heavy = HeavySet::default();
        let resolves = |round: u32| {
            let (applied, heavy) = (&applied, &heavy);
            async move {
                tokio::time::timeout(
                    Duration::from_millis(20),
                    announced_empty(applied, heavy, round),
                )
                .await
                .is_ok()
            }
        };
        assert!(!resolves(0).await, "not announced yet");
        heavy.extend(&[42], 0);
        applied.send_replace(1);
        assert!(!resolves(0).await, "round 0 found a heavy hitter");
        assert!(!resolves(1).await, "round 1 not announced yet");
        applied.send_replace(2);
        assert!(resolves(1).await, "round 1 was announced empty");
    }
}
