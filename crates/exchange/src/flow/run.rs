//! One worker's part of a Flow-Join: the tasks behind [`super::FlowJoinExec::execute`].
//!
//! - *router*: reads the local probe input, counts hashes, reports to worker 0 at the
//!   detection points, sends rows to their owners or keeps heavy ones local;
//! - *owner*: collects the local build partition for the usual join and broadcasts the
//!   build rows of every announced heavy hash;
//! - *listener*: applies worker 0's announcements (router's heavy set, owner's work);
//! - *drain*: collects the heavy build rows broadcast by all owners;
//! - *detector* (worker 0 only): sums reports, announces the global heavy hitters.
//!
//! Nothing waits in a cycle: the router never waits for the heavy path (heavy probe
//! rows are kept in memory until the heavy build side is complete), the drain reads
//! broadcasts as they come, and the usual join consumes the probe shuffle as any
//! partitioned hash join does.

use super::source::PreparedInputExec;
use super::{DEFAULT_PROBE_ROWS_PER_WORKER, FlowJoinExec, FlowReport, HeavyHitter};
use crate::codec::BatchEncoder;
use crate::context::{Placement, QueryContext};
use crate::receiver::{ExchangeReceiverExec, ReceiveMode};
use crate::sender::{Outlet, SendMetrics, transport_err};
use crate::task::AbortOnDrop;
use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::hash_utils::create_hashes;
use datafusion::common::{DataFusionError, Result, ScalarValue, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};
use gyre_join::flow::detect::{Coordinator, NodeDetector, NodeReport};
use gyre_join::flow::wire::{Control, Side};
use gyre_transport::{NodeId, ReceiveEndpoint, ReceiveSpec, SendEndpoint, SendSpec, To, node_name};
use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};

/// Hashes are already well mixed: a set of them needs no second hash.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type HashSetU64 = HashSet<u64, BuildHasherDefault<PreHashed>>;

/// The heavy hashes announced so far, shared by the listener (writer) and router.
#[derive(Default)]
struct HeavySet {
    hashes: RwLock<Vec<u64>>,
    version: AtomicU64,
}

impl HeavySet {
    fn extend(&self, new: &[u64]) {
        self.hashes.write().extend_from_slice(new);
        self.version.fetch_add(1, Ordering::Release);
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
        }
    }
}

/// How long a router waits, once, for the first round's heavy hitters after reporting
/// it (see [`route`]).
const FIRST_ROUND_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

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
}

impl Shared {
    fn n(&self) -> usize {
        self.qc.workers.len()
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

fn hashes_of(
    keys: &[PhysicalExprRef],
    batch: &RecordBatch,
    out: &mut Vec<u64>,
) -> Result<Vec<ArrayRef>> {
    let arrays = keys
        .iter()
        .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
        .collect::<Result<Vec<_>>>()?;
    out.clear();
    out.resize(batch.num_rows(), 0);
    create_hashes(&arrays, REPARTITION_RANDOM_STATE.random_state(), out)?;
    Ok(arrays)
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
    let expected = exec
        .probe_rows_per_worker
        .unwrap_or(DEFAULT_PROBE_ROWS_PER_WORKER);
    let (build_keys, probe_keys): (Vec<PhysicalExprRef>, Vec<PhysicalExprRef>) =
        hj.on().iter().cloned().unzip();
    let build_schema = hj.left().schema();
    let probe_schema = hj.right().schema();
    let build_input = hj.left().execute(partition, Arc::clone(&ctx))?;
    let probe_input = hj.right().execute(partition, Arc::clone(&ctx))?;

    let shared = Arc::new(Shared {
        detector_node: qc.workers[0],
        qc: Arc::clone(&qc),
        partition,
        heavy: HeavySet::default(),
        report: Arc::clone(&exec.report),
        m: FlowMetrics::new(&exec.metrics, partition),
        send_m: SendMetrics::new(&exec.metrics, partition),
        rounds: tokio::sync::watch::channel(0).0,
    });
    let all: Vec<(u32, NodeId)> = qc
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| (i as u32, *w))
        .collect();
    let probe_ep = shared.open_send(ex, qc.workers.clone())?;
    let bcast_ep = shared.open_send(ex + 1, qc.workers.clone())?;
    let report_ep = shared.open_send(ex + 2, vec![shared.detector_node])?;
    let announce_rx = shared.open_receive(ex + 3, vec![(0, shared.detector_node)])?;
    let detector_eps = if partition == 0 {
        Some((
            shared.open_receive(ex + 2, all.clone())?,
            shared.open_send(ex + 3, qc.workers.clone())?,
        ))
    } else {
        None
    };

    // The usual join: this worker's build partition with the probe rows routed here.
    let (build_tx, build_rx) = oneshot::channel();
    let probe_recv: Arc<dyn ExecutionPlan> = Arc::new(ExchangeReceiverExec::new(
        ex,
        Arc::clone(&probe_schema),
        Placement::Workers,
        n,
        ReceiveMode::Shuffle,
        Partitioning::UnknownPartitioning(n),
        None,
    ));
    let build_src = PreparedInputExec::new(
        "build partition",
        delivered(Arc::clone(&build_schema), build_rx, "build partition"),
        n,
    );
    let usual = Arc::clone(&exec.join)
        .replace_children(vec![build_src, probe_recv], recompute())?
        .execute(partition, Arc::clone(&ctx))?;

    // The heavy join: every owner's broadcast build rows with the probe rows kept here.
    let heavy_build_recv = ExchangeReceiverExec::new(
        ex + 1,
        Arc::clone(&build_schema),
        Placement::Workers,
        n,
        ReceiveMode::Shuffle,
        Partitioning::UnknownPartitioning(n),
        None,
    )
    .execute(partition, Arc::clone(&ctx))?;
    let (heavy_build_tx, heavy_build_rx) = oneshot::channel();
    let (local_tx, local_rx) = mpsc::unbounded_channel::<RecordBatch>();
    let local = futures::stream::unfold(local_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok(b), rx))
    });
    let heavy = Arc::clone(&exec.join)
        .replace_children(
            vec![
                PreparedInputExec::new(
                    "heavy build rows",
                    delivered(
                        Arc::clone(&build_schema),
                        heavy_build_rx,
                        "heavy build broadcast",
                    ),
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
            ],
            recompute(),
        )?
        .execute(partition, ctx)?;

    let (err_tx, err_rx) = mpsc::unbounded_channel::<DataFusionError>();
    let (owner_tx, owner_rx) = mpsc::unbounded_channel::<Vec<u64>>();
    let mut tasks = Vec::new();
    let mut spawn = |fut: futures::future::BoxFuture<'static, Result<()>>| {
        let err_tx = err_tx.clone();
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = fut.await {
                let _ = err_tx.send(e);
            }
        })));
    };
    let detector = NodeDetector::new(&config, 1, expected);
    spawn(Box::pin(route(
        Arc::clone(&shared),
        probe_input,
        probe_keys,
        probe_ep,
        report_ep,
        local_tx,
        detector,
        config.sample,
    )));
    spawn(Box::pin(own(
        Arc::clone(&shared),
        build_input,
        build_keys,
        build_tx,
        bcast_ep,
        owner_rx,
    )));
    spawn(Box::pin(listen(Arc::clone(&shared), announce_rx, owner_tx)));
    spawn(Box::pin(drain(
        Arc::clone(&shared),
        heavy_build_recv,
        heavy_build_tx,
    )));
    if let Some((reports, announce_ep)) = detector_eps {
        let iterations = config.iterations();
        spawn(Box::pin(detect(
            Arc::clone(&shared),
            reports,
            announce_ep,
            iterations,
            config.threshold,
        )));
    }
    drop(err_tx);

    let errors = futures::stream::unfold(err_rx, |mut rx| async move {
        rx.recv().await.map(|e| (Err(e), rx))
    });
    let output_rows = shared.m.output_rows.clone();
    let merged = Box::pin(
        futures::stream::select(usual, futures::stream::select(heavy, errors)).inspect(move |b| {
            if let Ok(b) = b {
                output_rows.add(b.num_rows());
            }
        }),
    );
    let guarded = futures::stream::unfold((merged, tasks), |(mut s, tasks)| async move {
        s.next().await.map(|b| (b, (s, tasks)))
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        exec.join.schema(),
        guarded,
    )))
}

/// Routes the local probe input: heavy hashes stay, the rest go to their owners.
#[allow(clippy::too_many_arguments)]
async fn route(
    sh: Arc<Shared>,
    mut input: SendableRecordBatchStream,
    keys: Vec<PhysicalExprRef>,
    ep: SendEndpoint,
    report_ep: SendEndpoint,
    local_tx: mpsc::UnboundedSender<RecordBatch>,
    detector: NodeDetector,
    sample: u32,
) -> Result<()> {
    let schema = input.schema();
    let n = sh.n();
    let mut outlets = sh
        .qc
        .workers
        .iter()
        .map(|w| sh.outlet(To::Node(*w), &schema, &ep))
        .collect::<Result<Vec<_>>>()?;
    let result = async {
        let mut hashes = Vec::new();
        let mut by_owner: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut kept: Vec<u32> = Vec::new();
        let mut heavy = HashSetU64::default();
        let mut heavy_version = 0;
        let mut named = HashSetU64::default();
        let mut routed: u64 = 0;
        let step = sample.max(1) as usize;
        while let Some(batch) = input.next().await {
            let batch = batch?;
            let rows = batch.num_rows();
            if rows == 0 {
                continue;
            }
            let timer = sh.m.routing_time.timer();
            let arrays = hashes_of(&keys, &batch, &mut hashes)?;
            {
                let mut h = detector.histogram(0).lock().expect("histogram lock");
                for &x in hashes.iter().step_by(step) {
                    h.update(x);
                }
            }
            let v = sh.heavy.version.load(Ordering::Acquire);
            if v != heavy_version {
                heavy_version = v;
                let was_empty = heavy.is_empty();
                heavy.extend(sh.heavy.hashes.read().iter().copied());
                if was_empty && !heavy.is_empty() {
                    sh.m.first_heavy_after_rows.set(routed as usize);
                }
            }
            by_owner.iter_mut().for_each(Vec::clear);
            kept.clear();
            if heavy.is_empty() {
                for (i, &x) in hashes.iter().enumerate() {
                    by_owner[(x % n as u64) as usize].push(i as u32);
                }
            } else {
                for (i, &x) in hashes.iter().enumerate() {
                    if heavy.contains(&x) {
                        kept.push(i as u32);
                    } else {
                        by_owner[(x % n as u64) as usize].push(i as u32);
                    }
                }
            }
            timer.done();
            routed += rows as u64;
            sh.m.probe_rows.add(rows);
            for (q, idx) in by_owner.iter().enumerate() {
                if idx.is_empty() {
                    continue;
                }
                let part = if idx.len() == rows {
                    batch.clone()
                } else {
                    take_record_batch(&batch, &UInt32Array::from(idx.clone()))?
                };
                outlets[q].push(&ep, part, &sh.send_m).await?;
            }
            if !kept.is_empty() {
                for &i in &kept {
                    if named.insert(hashes[i as usize]) {
                        name_heavy_hitter(&sh, hashes[i as usize], &arrays, i as usize);
                    }
                }
                sh.m.probe_rows_local.add(kept.len());
                let part = take_record_batch(&batch, &UInt32Array::from(kept.clone()))?;
                // The receiver is gone only when the query's output was dropped.
                let _ = local_tx.send(part);
            }
            for r in detector.advance(rows as u64) {
                let first = r.iteration == 0;
                report(&sh, &report_ep, r).await?;
                if first {
                    // A fast local input is routed long before the first round's
                    // answer could arrive, so the router waits for it once. Bounded: a
                    // peer whose input depends on this worker's progress (through an
                    // upstream exchange) may not report round 0 until this one goes on.
                    let mut rounds = sh.rounds.subscribe();
                    let _ =
                        tokio::time::timeout(FIRST_ROUND_WAIT, rounds.wait_for(|r| *r > 0)).await;
                }
            }
        }
        for r in detector.finish() {
            report(&sh, &report_ep, r).await?;
        }
        for o in &mut outlets {
            o.flush(&ep, &sh.send_m).await?;
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            ep.finish();
            report_ep.finish();
            Ok(())
        }
        Err(e) => {
            let e = sh.fail(&ep, e);
            Err(sh.fail(&report_ep, e))
        }
    }
}

/// Remembers the key value of a heavy hash (for `EXPLAIN ANALYZE`).
fn name_heavy_hitter(sh: &Shared, hash: u64, arrays: &[ArrayRef], row: usize) {
    let mut report = sh.report.lock();
    let Some(h) = report.heavy.get_mut(&hash) else {
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

async fn report(sh: &Shared, ep: &SendEndpoint, r: NodeReport) -> Result<()> {
    sh.m.detection_rounds.add(1);
    let msg = Control::Report {
        side: Side::Probe,
        iteration: r.iteration,
        window: r.window,
        total: r.processed,
        candidates: r.candidates,
    };
    send_control(ep, To::Node(sh.detector_node), &msg).await
}

/// Collects the build partition for the usual join, then broadcasts the rows of every
/// heavy hash it is told about.
async fn own(
    sh: Arc<Shared>,
    input: SendableRecordBatchStream,
    keys: Vec<PhysicalExprRef>,
    build_tx: oneshot::Sender<Result<Vec<RecordBatch>>>,
    ep: SendEndpoint,
    mut heavy_rx: mpsc::UnboundedReceiver<Vec<u64>>,
) -> Result<()> {
    let schema = input.schema();
    let batches: Vec<RecordBatch> = match input.try_collect().await {
        Ok(b) => b,
        Err(e) => {
            let text = e.to_string();
            let _ = build_tx.send(Err(e));
            return Err(sh.fail(&ep, DataFusionError::Execution(text)));
        }
    };
    let _ = build_tx.send(Ok(batches.clone()));
    let result = async {
        let mut outlet = sh.outlet(To::All, &schema, &ep)?;
        let mut hashes: Option<Vec<Vec<u64>>> = None;
        let metrics = SendMetrics::new(&ExecutionPlanMetricsSet::new(), sh.partition);
        while let Some(new) = heavy_rx.recv().await {
            let new: HashSetU64 = new.into_iter().collect();
            if new.is_empty() {
                continue;
            }
            // Hashed once, on the first announcement that names any key.
            let hashes = match &mut hashes {
                Some(h) => h,
                None => {
                    let mut all = Vec::with_capacity(batches.len());
                    for b in &batches {
                        let mut h = Vec::new();
                        hashes_of(&keys, b, &mut h)?;
                        all.push(h);
                    }
                    hashes.insert(all)
                }
            };
            for (b, hs) in batches.iter().zip(hashes.iter()) {
                let idx: Vec<u32> = hs
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| new.contains(h))
                    .map(|(i, _)| i as u32)
                    .collect();
                if !idx.is_empty() {
                    let arrays = keys
                        .iter()
                        .map(|e| e.evaluate(b)?.into_array(b.num_rows()))
                        .collect::<Result<Vec<_>>>()?;
                    for &i in &idx {
                        name_heavy_hitter(&sh, hs[i as usize], &arrays, i as usize);
                    }
                    sh.m.build_rows_broadcast.add(idx.len());
                    let part = take_record_batch(b, &UInt32Array::from(idx))?;
                    outlet.push(&ep, part, &metrics).await?;
                }
            }
        }
        outlet.flush(&ep, &metrics).await
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

/// Applies worker 0's announcements in order.
async fn listen(
    sh: Arc<Shared>,
    ep: ReceiveEndpoint,
    owner_tx: mpsc::UnboundedSender<Vec<u64>>,
) -> Result<()> {
    while let Some(msg) = ep.get().await.map_err(transport_err)? {
        if msg.data().is_empty() {
            ep.release(msg);
            continue;
        }
        let control = control_of(&msg)?;
        ep.release(msg);
        let Control::Announce {
            iteration, keys, ..
        } = control
        else {
            return Err(internal_datafusion_err!(
                "Flow-Join expected a heavy-hitter announcement, got {control:?}"
            ));
        };
        if keys.is_empty() {
            sh.rounds.send_modify(|r| *r += 1);
            continue;
        }
        {
            let mut report = sh.report.lock();
            for &(hash, estimate) in &keys {
                report.heavy.entry(hash).or_insert(HeavyHitter {
                    iteration,
                    estimate,
                    key: None,
                });
            }
        }
        sh.m.heavy_hitters.add(keys.len());
        let hashes: Vec<u64> = keys.iter().map(|k| k.0).collect();
        sh.heavy.extend(&hashes);
        let _ = owner_tx.send(hashes);
        sh.rounds.send_modify(|r| *r += 1);
    }
    Ok(())
}

/// Collects the heavy build rows every owner broadcasts.
async fn drain(
    sh: Arc<Shared>,
    input: SendableRecordBatchStream,
    tx: oneshot::Sender<Result<Vec<RecordBatch>>>,
) -> Result<()> {
    match input.try_collect::<Vec<RecordBatch>>().await {
        Ok(batches) => {
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            sh.m.heavy_build_rows_received.add(rows);
            let _ = tx.send(Ok(batches));
            Ok(())
        }
        Err(e) => {
            let text = e.to_string();
            let _ = tx.send(Err(e));
            Err(DataFusionError::Execution(text))
        }
    }
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
        while let Some(msg) = reports.get().await.map_err(transport_err)? {
            if msg.data().is_empty() {
                reports.release(msg);
                continue;
            }
            let control = control_of(&msg)?;
            let from = msg.node;
            reports.release(msg);
            let Control::Report {
                iteration,
                window,
                total,
                candidates,
                ..
            } = control
            else {
                return Err(internal_datafusion_err!(
                    "Flow-Join expected a detection report from {}, got {control:?}",
                    node_name(from)
                ));
            };
            let announcements = coordinator
                .add(iteration, window, total, &candidates)
                .map_err(|e| {
                    internal_datafusion_err!("{} sent a bad report: {e}", node_name(from))
                })?;
            for (iteration, keys) in announcements {
                let msg = Control::Announce {
                    side: Side::Probe,
                    iteration,
                    keys,
                };
                send_control(&ep, To::All, &msg).await?;
            }
        }
        if !coordinator.complete() {
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
