//! One running query: its stages started on the workers and the coordinator,
//! the final stage's output as a stream, and the clean-up when it ends.
//!
//! The final stage is pulled, not collected: a client that reads slowly stops
//! the coordinator's final stage, whose exchange receivers stop returning
//! credits, which stops the workers' senders. Memory stays bounded by the
//! transport's credit window whatever the client's speed. Dropping an
//! execution before its end (a client that went away) stops every stage.
//!
//! A query waits for a turn when the coordinator limits how many run at once, and
//! the session's `gyre.statement_timeout` bounds the whole of it (waiting, starting
//! and streaming): when it passes, the query fails and every node stops it.

use crate::coordinator::{Coordinator, RegisteredQuery, Replan, StageReports};
use crate::files::{FileCopyExec, FileSplitScanExec};
use crate::modify::GyreModifyExec;
use crate::progress::{ReadTotals, STATEMENT};
use crate::table::GyreInsertExec;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::execution::context::SessionState;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;
use gyre_exchange::{Placement, RelayedError};
use gyre_planner::{DistributedPlan, GyreOptions};
use gyre_transport::NodeId;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What the file scans of a plan read.
fn read_totals(dplan: &DistributedPlan) -> ReadTotals {
    let mut totals = ReadTotals::default();
    for stage in &dplan.stages {
        let _ = stage.plan.apply(|n| {
            if let Some(scan) = n.downcast_ref::<FileSplitScanExec>() {
                totals.files += scan.files();
                totals.file_bytes += scan.file_bytes();
            }
            Ok(TreeNodeRecursion::Continue)
        });
    }
    totals
}

/// A query whose stages are running.
pub struct QueryExecution {
    coordinator: Arc<Coordinator>,
    query: u64,
    /// The workers that run stages of the query, told when it ends (none for a plan
    /// that runs on the coordinator alone, such as `SELECT 1`).
    workers: Vec<NodeId>,
    /// The plan only reads: nothing commits when it ends.
    reads_only: bool,
    schema: SchemaRef,
    local_tasks: Vec<JoinHandle<()>>,
    fail_rx: mpsc::UnboundedReceiver<String>,
    root: SendableRecordBatchStream,
    finished: bool,
    /// When the statement timeout cancels the query, and the timeout itself.
    deadline: Option<(tokio::time::Instant, std::time::Duration)>,
    /// The query's turn, when their number is limited: given back when it ends.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl std::fmt::Debug for QueryExecution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryExecution")
            .field("query", &self.query)
            .field("workers", &self.workers)
            .finish()
    }
}

impl QueryExecution {
    /// Starts every stage of `dplan`: worker stages on `workers`, coordinator stages here.
    pub(crate) async fn start(
        coordinator: &Arc<Coordinator>,
        state: &SessionState,
        dplan: &DistributedPlan,
        workers: &[NodeId],
    ) -> Result<Self> {
        let timeout = GyreOptions::of(state.config_options()).statement_timeout;
        let deadline =
            (!timeout.is_zero()).then(|| (tokio::time::Instant::now() + timeout, timeout));
        let slot = match coordinator.query_slots() {
            Some(slots) => Some(
                within(deadline, None, slots.acquire_owned())
                    .await?
                    .map_err(|_| DataFusionError::Execution("the coordinator stopped".into()))?,
            ),
            None => None,
        };
        let RegisteredQuery {
            id: query,
            design,
            ctx,
            fail_tx,
            fail_rx,
        } = coordinator.register_query(state, workers)?;
        let _ = STATEMENT.try_with(|p| p.add_query(query, workers, read_totals(dplan)));
        let cleanup = |e: DataFusionError| async {
            coordinator.end_query(query, workers, false, false).await;
            e
        };
        let started = within(
            deadline,
            Some(query),
            coordinator.start_worker_stages(state, query, design, dplan, workers),
        )
        .await;
        if let Err(e) = started.and_then(|r| r) {
            return Err(cleanup(e).await);
        }
        let mut local_tasks = vec![];
        let last = dplan.stages.len() - 1;
        for stage in &dplan.stages[..last] {
            if stage.placement != Placement::Coordinator {
                continue;
            }
            for p in 0..stage.plan.output_partitioning().partition_count() {
                let (plan, ctx, fail, id) = (
                    Arc::clone(&stage.plan),
                    Arc::clone(&ctx),
                    fail_tx.clone(),
                    stage.id,
                );
                local_tasks.push(tokio::spawn(async move {
                    let res = match plan.execute(p, ctx) {
                        Ok(s) => datafusion::physical_plan::common::collect(s)
                            .await
                            .map(|_| ()),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = res {
                        let place = format!("stage {id} on the coordinator");
                        let _ = fail.send(RelayedError::at(&e, &place).wire());
                    }
                }));
            }
        }
        let root_plan = &dplan.final_stage().plan;
        let root = match root_plan.execute(0, ctx) {
            Ok(r) => r,
            Err(e) => {
                for t in &local_tasks {
                    t.abort();
                }
                return Err(cleanup(e).await);
            }
        };
        let on_workers = dplan.worker_stages().next().is_some();
        Ok(Self {
            coordinator: Arc::clone(coordinator),
            query,
            workers: if on_workers { workers.to_vec() } else { vec![] },
            reads_only: !writes(dplan),
            schema: root_plan.schema(),
            local_tasks,
            fail_rx,
            root,
            finished: false,
            deadline,
            _slot: slot,
        })
    }

    /// The next batch of the result, or the error that ended the query.
    pub async fn next(&mut self) -> Option<Result<RecordBatch>> {
        let query = self.query;
        let timeout = self.deadline;
        let batch = async {
            tokio::select! {
                b = self.root.next() => b,
                Some(msg) = self.fail_rx.recv() => Some(Err(RelayedError::from_wire(&msg).into_datafusion())),
            }
        };
        match within(timeout, Some(query), batch).await {
            Ok(b) => b,
            Err(e) => Some(Err(e)),
        }
    }

    /// Ends the query on every node: commits (or discards) its inserts and, with
    /// `metrics`, returns each worker's stage reports.
    pub async fn finish(mut self, commit: bool, metrics: bool) -> StageReports {
        self.finished = true;
        for t in &self.local_tasks {
            t.abort();
        }
        self.coordinator
            .end_query(self.query, &self.workers, commit, metrics)
            .await
    }

    /// Whether the query only reads (nothing commits when it ends).
    pub fn reads_only(&self) -> bool {
        self.reads_only
    }

    /// Ends a query that only reads without waiting for the workers' answers: its
    /// result is complete, and what remains (stopping tasks, releasing streams) needs
    /// no one to wait. A plan that writes must be ended with [`Self::finish`].
    pub fn finish_in_background(mut self) {
        debug_assert!(self.reads_only);
        self.end_in_background(true);
    }

    /// Stops the coordinator's stages and ends the query on the workers from a task of
    /// its own (committing its inserts with `commit`).
    fn end_in_background(&mut self, commit: bool) {
        self.finished = true;
        for t in &self.local_tasks {
            t.abort();
        }
        let (coordinator, query, workers) = (
            Arc::clone(&self.coordinator),
            self.query,
            std::mem::take(&mut self.workers),
        );
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                coordinator.end_query(query, &workers, commit, false).await;
            });
        }
    }

    /// The result as a stream; the query ends (and commits) when the stream is
    /// exhausted, fails, or is dropped. A query that only reads ends on the workers
    /// after its last batch went out, not before. With `replan`, a read that lost a
    /// worker before its first batch went out runs once more on the remaining workers
    /// ([`Coordinator::lost_worker`]).
    pub fn into_stream(self, replan: Option<Replan>) -> SendableRecordBatchStream {
        let schema = Arc::clone(&self.schema);
        let state = Streaming {
            replan: replan.filter(|_| self.reads_only),
            execution: self,
            sent: false,
        };
        let stream = futures::stream::unfold(Some(state), |state| async move {
            let Streaming {
                mut execution,
                sent,
                mut replan,
            } = state?;
            loop {
                match execution.next().await {
                    Some(Ok(batch)) => {
                        let state = Streaming {
                            execution,
                            sent: true,
                            replan,
                        };
                        return Some((Ok(batch), Some(state)));
                    }
                    Some(Err(e)) => {
                        let workers = execution.workers.clone();
                        let coordinator = Arc::clone(&execution.coordinator);
                        let schema = Arc::clone(&execution.schema);
                        execution.finish(false, false).await;
                        let again = match replan.take() {
                            Some(replan) if !sent => replan,
                            _ => return Some((Err(e), None)),
                        };
                        let Some(death) = coordinator.lost_worker(&workers, &e).await else {
                            return Some((Err(e), None));
                        };
                        let (state, dplan, workers) =
                            match coordinator.plan_again(&again, e, &death).await {
                                Ok(planned) => planned,
                                Err(e) => return Some((Err(e), None)),
                            };
                        if dplan.final_stage().plan.schema() != schema {
                            let e = DataFusionError::Execution(
                                "the read planned again has another schema".into(),
                            );
                            return Some((Err(e), None));
                        }
                        execution =
                            match QueryExecution::start(&coordinator, &state, &dplan, &workers)
                                .await
                            {
                                Ok(execution) => execution,
                                Err(e) => return Some((Err(e), None)),
                            };
                    }
                    None if execution.reads_only => {
                        execution.finish_in_background();
                        return None;
                    }
                    None => {
                        execution.finish(true, false).await;
                        return None;
                    }
                }
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

/// A result being streamed: the query, whether a batch went out, and what a retry
/// needs while one may still run.
struct Streaming {
    execution: QueryExecution,
    sent: bool,
    replan: Option<Replan>,
}

/// Runs `work` until the statement's deadline, if it has one; past it, the error
/// says the statement timed out (and which query, once it has an id).
async fn within<T>(
    deadline: Option<(tokio::time::Instant, std::time::Duration)>,
    query: Option<u64>,
    work: impl std::future::Future<Output = T>,
) -> Result<T> {
    let Some((at, timeout)) = deadline else {
        return Ok(work.await);
    };
    tokio::time::timeout_at(at, work)
        .await
        .map_err(|_| DataFusionError::External(Box::new(StatementTimedOut { query, timeout })))
}

/// Whether any stage of a plan holds a node `pick` chooses.
fn holds(dplan: &DistributedPlan, pick: impl Fn(&dyn ExecutionPlan) -> bool) -> bool {
    dplan
        .stages
        .iter()
        .any(|s| s.plan.exists(|n| Ok(pick(n.as_ref()))).unwrap_or(true))
}

/// Whether a plan's result is a count per worker: inserts, updates and deletes, and
/// parallel COPYs.
pub(crate) fn counts_rows(dplan: &DistributedPlan) -> bool {
    holds(dplan, |n| {
        n.is::<GyreInsertExec>() || n.is::<GyreModifyExec>() || n.is::<FileCopyExec>()
    })
}

/// Whether a plan writes: inserts, updates and deletes (which commit when the query
/// ends on the workers) and file sinks.
pub(crate) fn writes(dplan: &DistributedPlan) -> bool {
    counts_rows(dplan) || holds(dplan, |n| n.is::<DataSinkExec>())
}

/// A query canceled by its session's `gyre.statement_timeout` (Flight SQL answers
/// `DEADLINE_EXCEEDED`).
#[derive(Debug)]
pub struct StatementTimedOut {
    pub query: Option<u64>,
    pub timeout: std::time::Duration,
}

impl std::fmt::Display for StatementTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let which = match self.query {
            Some(q) => format!("query {q}"),
            None => "the query".to_string(),
        };
        write!(
            f,
            "canceling {which}: it ran longer than gyre.statement_timeout ({:?})",
            self.timeout
        )
    }
}

impl std::error::Error for StatementTimedOut {}

impl Drop for QueryExecution {
    fn drop(&mut self) {
        // Abandoned mid-way (the client went away): stop the query everywhere.
        if !self.finished {
            self.end_in_background(false);
        }
    }
}

/// A query planned over a set of workers, not yet started.
#[derive(Debug)]
pub struct DeferredQuery {
    pub(crate) dplan: DistributedPlan,
    pub(crate) workers: Vec<NodeId>,
    /// The state of the session that planned it (its settings and runtime).
    pub(crate) state: Box<SessionState>,
    /// What planning it again needs, should it lose a worker.
    pub(crate) replan: Box<Replan>,
}

impl DeferredQuery {
    /// The schema of the result.
    pub fn schema(&self) -> SchemaRef {
        self.dplan.final_stage().plan.schema()
    }

    /// Starts the query; its result streams as it is read.
    pub async fn execute(
        self,
        coordinator: &Arc<Coordinator>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(
            QueryExecution::start(coordinator, &self.state, &self.dplan, &self.workers)
                .await?
                .into_stream(Some(*self.replan)),
        )
    }
}
