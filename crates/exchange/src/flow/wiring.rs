//! One worker's part of a Flow-Join: [`execute`] opens the join's endpoints, builds
//! its local joins and starts the tasks behind [`super::FlowJoinExec::execute`].
//!
//! The tasks, each in its own module:
//! - *router* ([`super::router`]): reads the local probe input (and the build input when
//!   the join routes it), counts hashes, reports to worker 0, routes the rows;
//! - *owner* ([`super::owner`]): collects the local build partition for the usual join
//!   and broadcasts the build rows of every announced heavy hash, one broadcast per
//!   round; *drain* (one per round) collects those broadcasts;
//! - *listener* and *detector* ([`super::announcements`]): worker 0 sums the reports
//!   and announces the global heavy hitters; every worker applies them in order; with
//!   fetch on demand the *request listener* passes each worker's requests to the owner
//!   instead;
//! - *SFR* ([`super::sfr`]): replicates the rows of keys heavy on both sides on a grid;
//! - *match combination* ([`super::combine`]): build- or probe-preserving joins
//!   exchange the matches of rows that were joined on several workers, then emit the
//!   rows the join preserves.
//!
//! The worker's output is the union of its joins: the usual one (its build partition
//! with the probe rows routed to it), one per detection round (the heavy build rows
//! broadcast for that round with the probe rows of those keys kept here), and for joins
//! that route their build input, the join of build-heavy keys and SFR's join; the
//! match combination's rows follow at the end.
//!
//! Nothing waits in a cycle: the router never waits for the heavy path (heavy probe
//! rows are kept in memory until the heavy build side is complete), the drains read
//! broadcasts as they come, and the usual join consumes the probe shuffle as any
//! partitioned hash join does.

use super::announcements::{detect, listen, requests};
use super::combine::{Tracker, combine_matches, track, tracked_join};
use super::matches::{Matches, RowIds, Shape, Tracked, row_id_schema, with_row_id};
use super::metrics::FlowMetrics;
use super::owner::{Wanted, drain, own};
use super::router::{ProbeBroadcast, Reports, Router};
use super::sfr::replicate_sfr;
use super::shared::{HeavySet, Shared, recompute};
use super::{DEFAULT_PROBE_ROWS_PER_WORKER, FlowJoinExec, HEAVY_EXCHANGES_FROM};
use crate::context::QueryContext;
use crate::prepared::PreparedInputExec;
use crate::receiver::ExchangeReceiverExec;
use crate::sender::SendMetrics;
use crate::task::{AbortOnDrop, run_detached};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream,
};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use gyre_join::flow::DetectionConfig;
use gyre_join::flow::control::Side;
use gyre_transport::{NodeId, SendEndpoint, To};
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// A stream of the batches a task will deliver through `rx`.
pub(super) fn delivered(
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

/// A join's output stream on this worker.
type Output = BoxStream<'static, Result<RecordBatch>>;

/// A task's rows, ready when it is done.
type Rows = BoxFuture<'static, Result<Vec<RecordBatch>>>;

/// One worker's Flow-Join, wired: the joins whose union is its output, the match
/// combinations that follow them, and the tasks that feed both.
pub(super) fn execute(
    exec: &FlowJoinExec,
    partition: usize,
    ctx: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let mut w = Wiring::new(exec, partition, ctx)?;
    let build_input = w.hj.left().execute(partition, Arc::clone(&w.ctx))?;
    let probe_input = w.hj.right().execute(partition, Arc::clone(&w.ctx))?;
    // Joins that route their build input: this worker's build partition is what the
    // build shuffle brings, and a second router sends the local build rows.
    let (build_partition, build_router) = if w.routes_build() {
        let ep = w.sh.open_send(w.build_ex, w.workers())?;
        let received = ExchangeReceiverExec::shuffled(w.build_ex, w.hj.left().schema(), w.n)
            .execute(partition, Arc::clone(&w.ctx))?;
        (received, Some((build_input, ep)))
    } else {
        (build_input, None)
    };
    let build_tx = w.usual_join()?;
    let (local_txs, drains) = w.heavy_joins()?;
    let build_heavy = match w.routes_build() {
        true => Some(w.build_heavy_joins()?),
        false => None,
    };
    let mut build_heavy = build_heavy;
    let (numbered_tx, combines) = w.match_combination(build_heavy.as_mut())?;
    let tasks = w.start_tasks(
        (probe_input, build_router, build_partition),
        build_tx,
        numbered_tx,
        local_txs,
        drains,
        build_heavy,
    )?;
    Ok(w.output(tasks, combines))
}

/// What the steps of wiring one worker's Flow-Join share.
struct Wiring<'a> {
    exec: &'a FlowJoinExec,
    hj: &'a HashJoinExec,
    partition: usize,
    n: usize,
    ctx: Arc<TaskContext>,
    sh: Arc<Shared>,
    config: DetectionConfig,
    /// The join's first exchange id, and the first of its build-side exchanges.
    ex: u32,
    build_ex: u32,
    build_keys: Vec<PhysicalExprRef>,
    probe_keys: Vec<PhysicalExprRef>,
    /// Build-preserving joins number their build rows and run a counterpart join that
    /// records their matches (see `super::matches`).
    build_tracker: Option<Tracker>,
    /// Probe-preserving joins that route their build input do the same with the probe
    /// rows they broadcast for build-heavy keys.
    probe_tracker: Option<Tracker>,
    /// The build rows of the usual and heavy joins (with row ids when tracked).
    build_schema: SchemaRef,
    probe_schema: SchemaRef,
    /// Probe rows broadcast for build-heavy keys (with row ids when tracked).
    bcast_schema: SchemaRef,
    outputs: Vec<Output>,
}

/// The joins of build-heavy keys, as [`Wiring::build_heavy_joins`] set them up for the
/// tasks that feed them.
struct BuildHeavy {
    /// Where the build router and the owner put build rows of build-heavy keys.
    kept_tx: mpsc::UnboundedSender<RecordBatch>,
    /// Where the probe router sends probe rows of build-heavy keys.
    probe_bcast: ProbeBroadcast,
    /// Probe-preserving joins: the broadcast probe rows, kept for the end.
    retained_rx: Option<mpsc::UnboundedReceiver<RecordBatch>>,
    /// Build-preserving joins with SFR: the numbered kept build rows, for the end.
    kept_rows_rx: Option<oneshot::Receiver<Vec<RecordBatch>>>,
    sfr_task: Option<BoxFuture<'static, Result<()>>>,
}

impl<'a> Wiring<'a> {
    fn new(exec: &'a FlowJoinExec, partition: usize, ctx: Arc<TaskContext>) -> Result<Self> {
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
        let rounds = config.iterations() as u32;
        let (build_keys, probe_keys) = hj.on().iter().cloned().unzip();
        let tracker = |shape: Shape| {
            (
                Arc::new(shape),
                Arc::new(Mutex::new(Matches::new(partition, n))),
            )
        };
        let build_tracker = Shape::of(hj, Tracked::Build).map(tracker);
        let probe_tracker = exec
            .probe_tracking()
            .and_then(|_| Shape::of(hj, Tracked::Probe))
            .map(tracker);
        let with_ids = |schema: SchemaRef, tracked: bool| match tracked {
            true => with_row_id(&schema),
            false => schema,
        };
        let build_schema = with_ids(hj.left().schema(), build_tracker.is_some());
        let probe_schema = hj.right().schema();
        let bcast_schema = with_ids(Arc::clone(&probe_schema), probe_tracker.is_some());
        let sh = Arc::new(Shared {
            detector_node: qc.workers[0],
            qc,
            partition,
            heavy: HeavySet::default(),
            report: Arc::clone(&exec.report),
            m: FlowMetrics::new(&exec.metrics, partition),
            send_m: SendMetrics::new(&exec.metrics, partition),
            rounds: tokio::sync::watch::channel(0).0,
            build_heavy: HeavySet::default(),
            build_rounds: tokio::sync::watch::channel(0).0,
            build_iterations: if exec.inputs.routes_build { rounds } else { 0 },
            probe_iterations: rounds,
            build_rows_shared: Default::default(),
            exchange: ex,
        });
        Ok(Self {
            exec,
            hj,
            partition,
            n,
            ctx,
            sh,
            config,
            ex,
            build_ex: ex + exec.build_exchanges_from(),
            build_keys,
            probe_keys,
            build_tracker,
            probe_tracker,
            build_schema,
            probe_schema,
            bcast_schema,
            outputs: Vec::new(),
        })
    }

    fn routes_build(&self) -> bool {
        self.exec.inputs.routes_build
    }

    fn rounds(&self) -> u32 {
        self.sh.probe_iterations
    }

    fn workers(&self) -> Vec<NodeId> {
        self.sh.qc.workers.clone()
    }

    /// The usual join, or its counterpart when the build side is tracked.
    fn join(
        &self,
        build: Arc<dyn ExecutionPlan>,
        probe: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match &self.build_tracker {
            Some((shape, _)) => shape.join(self.hj, build, probe),
            None => Arc::clone(&self.exec.join).replace_children(vec![build, probe], recompute()),
        }
    }

    /// A join's output, recording the build matches when the build side is tracked.
    fn tracked(&self, s: SendableRecordBatchStream) -> Output {
        match &self.build_tracker {
            Some((shape, matches)) => track(s, Arc::clone(shape), Arc::clone(matches), None),
            None => s.boxed(),
        }
    }

    fn execute(&self, plan: Arc<dyn ExecutionPlan>) -> Result<SendableRecordBatchStream> {
        plan.execute(self.partition, Arc::clone(&self.ctx))
    }

    fn receive(&self, exchange: u32, schema: &SchemaRef) -> Result<SendableRecordBatchStream> {
        self.execute(Arc::new(ExchangeReceiverExec::shuffled(
            exchange,
            Arc::clone(schema),
            self.n,
        )))
    }

    /// The usual join: this worker's build partition (which the owner delivers through
    /// the returned sender) with the probe rows routed here.
    fn usual_join(&mut self) -> Result<oneshot::Sender<Result<Vec<RecordBatch>>>> {
        let (build_tx, build_rx) = oneshot::channel();
        let probe: Arc<dyn ExecutionPlan> = Arc::new(ExchangeReceiverExec::shuffled(
            self.ex,
            Arc::clone(&self.probe_schema),
            self.n,
        ));
        let build = PreparedInputExec::new(
            "build partition",
            delivered(Arc::clone(&self.build_schema), build_rx, "build partition"),
            self.n,
        );
        let usual = self.execute(self.join(build, probe)?)?;
        self.outputs.push(self.tracked(usual));
        Ok(build_tx)
    }

    /// One heavy join per detection round: the build rows every owner broadcast for the
    /// keys announced in that round, with the probe rows of those keys kept here. A
    /// round's join starts as soon as its broadcast is complete, while routing goes on.
    /// Returns where the router puts each round's kept probe rows, and each round's
    /// broadcast receiver with the sender its drain delivers the rows through.
    #[allow(clippy::type_complexity)]
    fn heavy_joins(
        &mut self,
    ) -> Result<(
        Vec<mpsc::UnboundedSender<RecordBatch>>,
        Vec<(
            SendableRecordBatchStream,
            oneshot::Sender<Result<Vec<RecordBatch>>>,
        )>,
    )> {
        let rounds = self.rounds();
        let mut local_txs = Vec::with_capacity(rounds as usize);
        let mut drains = Vec::with_capacity(rounds as usize);
        for r in 0..rounds {
            let recv = self.receive(self.ex + HEAVY_EXCHANGES_FROM + r, &self.build_schema)?;
            let (build_tx, build_rx) = oneshot::channel();
            drains.push((recv, build_tx));
            let (local_tx, local_rx) = mpsc::unbounded_channel::<RecordBatch>();
            local_txs.push(local_tx);
            let local = UnboundedReceiverStream::new(local_rx).map(Ok);
            let build = delivered(
                Arc::clone(&self.build_schema),
                build_rx,
                "heavy build broadcast",
            );
            let probe = RecordBatchStreamAdapter::new(Arc::clone(&self.probe_schema), local);
            let heavy = self.execute(self.join(
                PreparedInputExec::new("heavy build rows", build, self.n),
                PreparedInputExec::new("probe rows kept local", Box::pin(probe), self.n),
            )?)?;
            self.outputs.push(self.tracked(heavy));
        }
        Ok((local_txs, drains))
    }

    /// Joins that route their build input: the join of the build rows of build-heavy
    /// keys on this worker (kept here by the build router, or received before the key
    /// was found heavy and split off by the owner) with the probe rows of those keys
    /// every worker broadcasts. Each such build row is on one worker and meets every
    /// probe row of its key there, so the original join type decides it. A
    /// probe-preserving join runs it as a counterpart, and the origin of each broadcast
    /// probe row keeps it for the end.
    ///
    /// With SFR (`FlowJoinExec::sfr`), probe rows of keys heavy on both sides are set
    /// aside instead of broadcast; once every list is final, each worker sends them to
    /// the nodes of its row in the key's grid, and its kept build rows of those keys to
    /// the nodes of its column, into one more join ([`Wiring::sfr_join`]). A
    /// build-preserving join then numbers its kept build rows too (`RowIds::kept`),
    /// since their matches come from several workers, and both joins run as its
    /// counterpart; the kept rows are decided at the end with the build partition's.
    fn build_heavy_joins(&mut self) -> Result<BuildHeavy> {
        let (n, partition) = (self.n, self.partition);
        let kept_tracker = self.build_tracker.clone().filter(|_| self.exec.sfr());
        let kept_schema = match kept_tracker {
            Some(_) => Arc::clone(&self.build_schema),
            None => self.hj.left().schema(),
        };
        // The trackers of these joins: build, probe (both in full joins with SFR).
        let trackers = (kept_tracker.clone(), self.probe_tracker.clone());
        let (kept_tx, kept_rx) = mpsc::unbounded_channel::<RecordBatch>();
        let ep = self.sh.open_send(self.build_ex + 1, self.workers())?;
        let mut retained_rx = None;
        let retained = self.probe_tracker.as_ref().map(|_| {
            let (tx, rx) = mpsc::unbounded_channel::<RecordBatch>();
            retained_rx = Some(rx);
            (RowIds::new(partition, Arc::clone(&self.bcast_schema)), tx)
        });
        let (sfr_task, set_aside, kept_copy) = match self.exec.sfr() {
            true => {
                let (task, set_aside, kept_copy) = self.sfr_join(&kept_schema, &trackers)?;
                (Some(task), Some(set_aside), Some(kept_copy))
            }
            false => (None, None, None),
        };
        let probe_bcast = ProbeBroadcast {
            outlet: self.sh.outlet(To::All, &self.bcast_schema, &ep)?,
            ep,
            retained,
            set_aside,
        };
        let recv = self.receive(self.build_ex + 1, &self.bcast_schema)?;
        // Kept build rows numbered for the end (build-preserving joins with SFR).
        let mut kept_ids = kept_tracker
            .as_ref()
            .map(|_| RowIds::kept(partition, Arc::clone(&kept_schema)));
        let mut kept_rows_rx = None;
        let kept_rows_tx = kept_ids.as_ref().map(|_| {
            let (tx, rx) = oneshot::channel::<Vec<RecordBatch>>();
            kept_rows_rx = Some(rx);
            tx
        });
        let (sh, join, ctx) = (
            Arc::clone(&self.sh),
            Arc::clone(&self.exec.join),
            Arc::clone(&self.ctx),
        );
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
                Box::pin(RecordBatchStreamAdapter::new(kept_schema, kept)),
                n,
            );
            let probe = PreparedInputExec::new("probe rows broadcast", recv, n);
            let trackers = (trackers.0.as_ref(), trackers.1.as_ref());
            tracked_join(&join, trackers, build, probe, partition, ctx)
        })
        .try_flatten();
        self.outputs.push(heavy.boxed());
        Ok(BuildHeavy {
            kept_tx,
            probe_bcast,
            retained_rx,
            kept_rows_rx,
            sfr_task,
        })
    }

    /// SFR's join of the rows replicated on the grids of keys heavy on both sides.
    /// Returns the replicating task, where the probe router sets rows aside for it, and
    /// where the join of build-heavy keys hands it the kept build rows.
    #[allow(clippy::type_complexity)]
    fn sfr_join(
        &mut self,
        kept_schema: &SchemaRef,
        trackers: &(Option<Tracker>, Option<Tracker>),
    ) -> Result<(
        BoxFuture<'static, Result<()>>,
        mpsc::UnboundedSender<RecordBatch>,
        oneshot::Sender<Vec<RecordBatch>>,
    )> {
        let n = self.n;
        let (kept_copy_tx, kept_copy_rx) = oneshot::channel::<Vec<RecordBatch>>();
        let sfr_ex = self.ex + self.exec.sfr_exchanges_from();
        let (set_aside_tx, set_aside_rx) = mpsc::unbounded_channel::<RecordBatch>();
        let task = replicate_sfr(
            Arc::clone(&self.sh),
            [self.build_keys.clone(), self.probe_keys.clone()],
            kept_copy_rx,
            set_aside_rx,
            [
                self.sh.open_send(sfr_ex, self.workers())?,
                self.sh.open_send(sfr_ex + 1, self.workers())?,
            ],
            [Arc::clone(kept_schema), Arc::clone(&self.bcast_schema)],
            MemoryConsumer::new(format!(
                "FlowJoinExec[{}] set-aside probe rows",
                self.partition
            ))
            .register(self.ctx.memory_pool()),
        );
        let build = self.receive(sfr_ex, kept_schema)?;
        let probe = self.receive(sfr_ex + 1, &self.bcast_schema)?;
        let (sh, join, ctx, trackers, partition) = (
            Arc::clone(&self.sh),
            Arc::clone(&self.exec.join),
            Arc::clone(&self.ctx),
            trackers.clone(),
            self.partition,
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
        self.outputs.push(sfr.boxed());
        Ok((Box::pin(task), set_aside_tx, kept_copy_tx))
    }

    /// Build-preserving joins: the exchange of matches, and this worker's build rows
    /// for the end (delivered by the owner through the returned sender); probe-preserving
    /// joins that route their build input: the same for the probe rows this worker
    /// broadcast.
    #[allow(clippy::type_complexity)]
    fn match_combination(
        &mut self,
        build_heavy: Option<&mut BuildHeavy>,
    ) -> Result<(Option<oneshot::Sender<Result<Vec<RecordBatch>>>>, Vec<Rows>)> {
        let (kept_rows_rx, retained_rx) = match build_heavy {
            Some(b) => (b.kept_rows_rx.take(), b.retained_rx.take()),
            None => (None, None),
        };
        let mut combines = Vec::new();
        let mut numbered_tx = None;
        if let Some(tracker) = &self.build_tracker {
            let (tx, rx) = oneshot::channel::<Result<Vec<RecordBatch>>>();
            numbered_tx = Some(tx);
            let rows = async move {
                let mut rows = rx.await.map_err(|_| {
                    internal_datafusion_err!("the build partition of a Flow-Join ended early")
                })??;
                // None sent: the build side had no heavy hitters, so nothing was kept.
                if let Some(kept) = kept_rows_rx {
                    rows.extend(kept.await.unwrap_or_default());
                }
                Ok(rows)
            };
            let match_ex = self.ex + HEAVY_EXCHANGES_FROM + self.rounds();
            combines.push(self.combine(Side::Build, match_ex, tracker, Box::pin(rows))?);
        }
        if let (Some(tracker), Some(rx)) = (&self.probe_tracker, retained_rx) {
            // Complete when the probe router is done.
            let rows = UnboundedReceiverStream::new(rx).map(Ok).try_collect();
            let match_ex = self.ex + self.exec.probe_matches_exchange();
            combines.push(self.combine(Side::Probe, match_ex, tracker, Box::pin(rows))?);
        }
        Ok((numbered_tx, combines))
    }

    /// One side's match combination over exchange `match_ex`; `rows` are this
    /// worker's tracked rows of that side.
    fn combine(
        &self,
        side: Side,
        match_ex: u32,
        (shape, matches): &Tracker,
        rows: Rows,
    ) -> Result<Rows> {
        let ep = self.sh.open_send(match_ex, self.workers())?;
        let reports = self.receive(match_ex, &row_id_schema())?;
        Ok(Box::pin(combine_matches(
            Arc::clone(&self.sh),
            side,
            Arc::clone(shape),
            Arc::clone(matches),
            ep,
            reports,
            rows,
        )))
    }

    /// Starts the tasks that feed the joins: the routers, the owner, the listener, SFR's
    /// replication, the drains and, on worker 0, the detector. Their errors join the
    /// output.
    #[allow(clippy::type_complexity)]
    fn start_tasks(
        &mut self,
        (probe_input, build_router, build_partition): (
            SendableRecordBatchStream,
            Option<(SendableRecordBatchStream, SendEndpoint)>,
            SendableRecordBatchStream,
        ),
        build_tx: oneshot::Sender<Result<Vec<RecordBatch>>>,
        numbered_tx: Option<oneshot::Sender<Result<Vec<RecordBatch>>>>,
        local_txs: Vec<mpsc::UnboundedSender<RecordBatch>>,
        drains: Vec<(
            SendableRecordBatchStream,
            oneshot::Sender<Result<Vec<RecordBatch>>>,
        )>,
        build_heavy: Option<BuildHeavy>,
    ) -> Result<Tasks> {
        let sh = &self.sh;
        let ex = self.ex;
        let all: Vec<(u32, NodeId)> = (0..self.n as u32).zip(self.workers()).collect();
        let probe_ep = sh.open_send(ex, self.workers())?;
        let report_ep = sh.open_send(ex + 1, vec![sh.detector_node])?;
        let announce_rx = sh.open_receive(ex + 2, vec![(0, sh.detector_node)])?;
        let detector_eps = match self.partition {
            0 => Some((
                sh.open_receive(ex + 1, all.clone())?,
                sh.open_send(ex + 2, self.workers())?,
            )),
            _ => None,
        };
        // Fetch on demand: every worker's requests to every owner.
        let fetch_eps = match self.exec.fetch() {
            true => {
                let fetch_ex = ex + self.exec.fetch_exchange();
                Some((
                    sh.open_send(fetch_ex, self.workers())?,
                    sh.open_receive(fetch_ex, all.clone())?,
                ))
            }
            false => None,
        };
        let bcast_eps = (0..self.rounds())
            .map(|r| sh.open_send(ex + HEAVY_EXCHANGES_FROM + r, self.workers()))
            .collect::<Result<Vec<_>>>()?;
        let (kept_tx, probe_bcast, sfr_task) = match build_heavy {
            Some(b) => (Some(b.kept_tx), Some(b.probe_bcast), b.sfr_task),
            None => (None, None, None),
        };
        let mut tasks = Tasks::default();
        // The listener (or, with fetch on demand, the request listener) tells the owner
        // which build rows each round wants.
        let (owner_tx, owner_rx) = mpsc::unbounded_channel::<Wanted>();
        let (fetch_ep, fetch_rx) = fetch_eps.unzip();
        let reports = Arc::new(Reports {
            ep: report_ep,
            users: std::sync::atomic::AtomicUsize::new(1 + usize::from(build_router.is_some())),
        });
        let expected = self.exec.inputs.probe_rows_per_worker;
        let router = Router::new(
            sh,
            Side::Probe,
            &self.probe_schema,
            self.probe_keys.clone(),
            probe_ep,
            local_txs,
            probe_bcast,
            &self.config,
            expected.unwrap_or(DEFAULT_PROBE_ROWS_PER_WORKER),
            fetch_ep,
        )?;
        tasks.spawn(Box::pin(router.run(probe_input, Arc::clone(&reports))));
        if let Some((input, ep)) = build_router {
            let expected = self.exec.inputs.build_rows_per_worker;
            let router = Router::new(
                sh,
                Side::Build,
                &input.schema(),
                self.build_keys.clone(),
                ep,
                kept_tx.iter().cloned().collect(),
                None,
                &self.config,
                expected.unwrap_or(DEFAULT_PROBE_ROWS_PER_WORKER),
                None,
            )?;
            tasks.spawn(Box::pin(router.run(input, reports)));
        }
        tasks.spawn(Box::pin(own(
            Arc::clone(sh),
            build_partition,
            self.build_keys.clone(),
            build_tx,
            numbered_tx.map(|tx| (Arc::clone(&self.build_schema), tx)),
            kept_tx,
            bcast_eps,
            owner_rx,
            if fetch_rx.is_some() { self.n } else { 1 },
            MemoryConsumer::new(format!("FlowJoinExec[{}] build partition", self.partition))
                .register(self.ctx.memory_pool()),
        )));
        if let Some(rx) = fetch_rx {
            tasks.spawn(Box::pin(requests(self.rounds(), rx, owner_tx.clone())));
        }
        tasks.spawn(Box::pin(listen(Arc::clone(sh), announce_rx, owner_tx)));
        if let Some(task) = sfr_task {
            tasks.spawn(task);
        }
        for (round, (recv, tx)) in drains.into_iter().enumerate() {
            tasks.spawn(Box::pin(drain(Arc::clone(sh), round as u32, recv, tx)));
        }
        if let Some((reports, announce_ep)) = detector_eps {
            tasks.spawn(Box::pin(detect(
                Arc::clone(sh),
                reports,
                announce_ep,
                // With fetch on demand no probe-side round is reported here.
                if self.exec.fetch() {
                    0
                } else {
                    self.rounds() as usize
                },
                self.config.threshold,
            )));
        }
        Ok(tasks)
    }

    /// The union of the joins' outputs and the tasks' errors, then the match
    /// combinations' rows. The tasks run on if the consumer stops reading early: the
    /// peers need this worker's routing, broadcasts and match reports.
    fn output(self, tasks: Tasks, combines: Vec<Rows>) -> SendableRecordBatchStream {
        let Tasks {
            handles,
            err_tx,
            err_rx,
        } = tasks;
        // The tasks hold clones: the error stream ends when every task has.
        drop(err_tx);
        let mut outputs = self.outputs;
        outputs.push(UnboundedReceiverStream::new(err_rx).map(Err).boxed());
        let output_rows = self.sh.m.output_rows.clone();
        let mut merged = futures::stream::select_all(outputs).boxed();
        for combine in combines {
            // Once every join here is done: exchange matches, then emit the tracked rows.
            let tail = futures::stream::once(combine)
                .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
                .try_flatten();
            merged = merged.chain(tail).boxed();
        }
        let sh = Arc::clone(&self.sh);
        let merged = merged
            .inspect(move |b| {
                if let Ok(b) = b {
                    output_rows.add(b.num_rows());
                }
            })
            .chain(futures::stream::poll_fn(move |_| {
                sh.trace("output", format_args!("ends"));
                std::task::Poll::Ready(None)
            }));
        let guarded = futures::stream::unfold((merged, handles), |(mut s, handles)| async move {
            s.next().await.map(|b| (b, (s, handles)))
        });
        run_detached(self.exec.join.schema(), guarded.boxed())
    }
}

/// The tasks of one worker's Flow-Join: aborted when the output they feed is dropped;
/// their errors become items of that output.
struct Tasks {
    handles: Vec<AbortOnDrop>,
    err_tx: mpsc::UnboundedSender<DataFusionError>,
    err_rx: mpsc::UnboundedReceiver<DataFusionError>,
}

impl Default for Tasks {
    fn default() -> Self {
        let (err_tx, err_rx) = mpsc::unbounded_channel();
        Self {
            handles: Vec::new(),
            err_tx,
            err_rx,
        }
    }
}

impl Tasks {
    fn spawn(&mut self, task: BoxFuture<'static, Result<()>>) {
        let err_tx = self.err_tx.clone();
        self.handles.push(AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = task.await {
                let _ = err_tx.send(e);
            }
        })));
    }
}
