//! The coordinator: cluster membership, the catalog, planning, and running
//! queries over the workers.

use crate::codec::{GyreCodec, schema_to_bytes};
use crate::execution::{DeferredQuery, QueryExecution};
use crate::files::follow::{Change, FileTable, is_not_found};
use crate::files::stores::{register_store, take_store_options};
use crate::files::{FileCopyExec, FileSplitScanExec, coordinator_must_read, schema_conflict};
use crate::modify::GyreModifyExec;
use crate::progress::{STATEMENT, StatementProgress};
use crate::protocol::{ControlClient, Request, Response};
use crate::session::{changed_execution_options, coordinator_context};
use crate::storage::PartStats;
use crate::table::{
    DistributedTable, GyreInsertExec, GyreScanExec, QueryWorkers, TableMeta, TablePlacement,
    TableRules, count_schema,
};
use crate::tpch::{self, TpchGenExec};
use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::config::{ConfigOptions, Dialect};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{
    DataFusionError, Result, SchemaError, TableReference, not_impl_err, plan_datafusion_err,
    plan_err,
};
use datafusion::datasource::provider_as_source;
use datafusion::datasource::sink::DataSinkExec;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{
    CreateExternalTable, CreateMemoryTable, DdlStatement, DmlStatement, DropTable, LogicalPlan,
    LogicalPlanBuilder, Statement as LogicalStatement, WriteOp,
};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Statement as SqlStatement};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use gyre_exchange::{Placement, QueryContext};
use gyre_planner::{DistributedPlan, GyreOptions, network_operator_rules, split_into_stages};
use gyre_transport::{COORDINATOR, NodeId, TcpTransport, Transport, TransportConfig, node_name};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How a coordinator is started.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Flight SQL (clients) and control (workers) address.
    pub listen: SocketAddr,
    /// Data listen address; port 0 picks a free one.
    pub data_listen: SocketAddr,
    pub transport: TransportConfig,
    /// A worker silent for this long is declared dead.
    pub heartbeat_timeout: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50050".parse().unwrap(),
            data_listen: "127.0.0.1:0".parse().unwrap(),
            transport: TransportConfig::default(),
            heartbeat_timeout: Duration::from_secs(3),
        }
    }
}

#[derive(Debug)]
struct Member {
    control: ControlClient,
    data_addr: SocketAddr,
    alive: bool,
    last_seen: Instant,
    death: Option<String>,
}

/// The result of one statement.
#[derive(Debug, Clone)]
pub struct StatementResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

/// A session's own `target_partitions`, which planning replaces by the number of
/// workers: the query's task context gives the session's back.
#[derive(Debug)]
struct SessionPartitions(usize);

struct RunningQuery {
    workers: Vec<NodeId>,
    fail: mpsc::UnboundedSender<String>,
}

/// The coordinator of a Gyre cluster.
pub struct Coordinator {
    pub transport: TcpTransport,
    /// The shared catalog, object stores and functions; every client session is a
    /// copy of it with its own settings ([`Coordinator::new_session`]).
    ctx: SessionContext,
    /// The session of [`Coordinator::sql`] (the embedded CLI, tests).
    default_session: SessionContext,
    members: RwLock<BTreeMap<NodeId, Member>>,
    tables: RwLock<BTreeMap<String, TableMeta>>,
    /// Per table, per worker: the sizes each worker reported.
    part_stats: Mutex<HashMap<String, BTreeMap<NodeId, PartStats>>>,
    next_node: AtomicU32,
    next_query: AtomicU64,
    /// Set by [`Coordinator::shutdown`]: connections ending now are no deaths.
    stopping: AtomicBool,
    running: Mutex<HashMap<u64, RunningQuery>>,
    /// Names of tables a statement is creating right now (two may not race).
    creating: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Held by a running DELETE or UPDATE: each replaces table parts computed from
    /// what it read, so two must not overlap (inserts may: they only append).
    modifying: tokio::sync::Mutex<()>,
    /// Tables loaded from files, which follow their files ([`crate::files::follow`]).
    file_tables: RwLock<HashMap<String, Arc<FileTable>>>,
    /// Unbounded external tables: streams the coordinator reads when queried, as
    /// DataFusion does, never loaded.
    streams: RwLock<HashSet<String>>,
    config: CoordinatorConfig,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator").finish()
    }
}

fn exec_err(msg: impl Into<String>) -> DataFusionError {
    DataFusionError::Execution(msg.into())
}

fn text_result(column: &str, rows: Vec<String>) -> Result<StatementResult> {
    let schema = Arc::new(Schema::new(vec![Field::new(column, DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(StringArray::from(rows)) as ArrayRef],
    )?;
    Ok(StatementResult {
        schema,
        batches: vec![batch],
    })
}

fn count_result(rows: u64) -> Result<StatementResult> {
    let batch = RecordBatch::try_new(
        count_schema(),
        vec![Arc::new(UInt64Array::from(vec![rows])) as ArrayRef],
    )?;
    Ok(StatementResult {
        schema: count_schema(),
        batches: vec![batch],
    })
}

/// What DDL returns, as in DataFusion: no columns, no rows.
fn no_result() -> Result<StatementResult> {
    Ok(StatementResult {
        schema: Arc::new(Schema::empty()),
        batches: vec![],
    })
}

/// How long a control call that should answer at once may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the coordinator checks its workers' heartbeats.
const MEMBER_CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// Nodes whose partition `i` must run on worker `i`: they read or write the worker's
/// own data (table partitions, file splits, files written by COPY).
fn runs_on_workers(plan: &dyn ExecutionPlan) -> bool {
    plan.is::<GyreScanExec>()
        || plan.is::<TpchGenExec>()
        || plan.is::<FileSplitScanExec>()
        || plan.is::<GyreInsertExec>()
        || plan.is::<GyreModifyExec>()
        || plan.is::<FileCopyExec>()
}

/// Where `CREATE EXTERNAL TABLE` reads its files (`gyre.read_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadOn {
    /// Every worker reads its own splits (the default).
    Workers,
    /// The coordinator reads every file and scatters the rows: for files that only
    /// the coordinator's host can read.
    Coordinator,
}

impl ReadOn {
    fn parse(value: Option<String>) -> Result<Self> {
        match value.as_deref().map(|v| v.trim().to_ascii_lowercase()) {
            None => Ok(Self::Workers),
            Some(v) if v == "workers" => Ok(Self::Workers),
            Some(v) if v == "coordinator" => Ok(Self::Coordinator),
            Some(v) => plan_err!("gyre.read_on is 'workers' or 'coordinator', not '{v}'"),
        }
    }
}

impl Coordinator {
    /// Starts the coordinator's data transport and membership monitor. The Flight SQL
    /// service is started separately with [`crate::flight_sql::serve`].
    pub async fn start(config: CoordinatorConfig) -> Result<Arc<Self>> {
        let transport =
            TcpTransport::bind(COORDINATOR, config.data_listen, config.transport.clone()).await?;
        let ctx = coordinator_context();
        let default_session = SessionContext::new_with_state(ctx.state());
        let coordinator = Arc::new(Self {
            transport,
            ctx,
            default_session,
            members: RwLock::new(BTreeMap::new()),
            tables: RwLock::new(BTreeMap::new()),
            part_stats: Mutex::new(HashMap::new()),
            next_node: AtomicU32::new(1),
            next_query: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
            creating: Arc::new(Mutex::new(std::collections::HashSet::new())),
            modifying: tokio::sync::Mutex::new(()),
            file_tables: RwLock::new(HashMap::new()),
            streams: RwLock::new(HashSet::new()),
            config,
        });
        let weak = Arc::downgrade(&coordinator);
        tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                tokio::time::sleep(MEMBER_CHECK_INTERVAL).await;
                let Some(c) = weak.upgrade() else { return };
                let now = Instant::now();
                // A late check means this process was too busy to run anything, heartbeat
                // handlers included (a final stage computing on every thread): that time
                // is not the workers' silence.
                c.check_members(
                    now.duration_since(last)
                        .saturating_sub(MEMBER_CHECK_INTERVAL),
                );
                last = now;
            }
        });
        Ok(coordinator)
    }

    /// Workers currently alive, in id order: partition `i` of a query runs on the `i`-th.
    pub fn live_workers(&self) -> Vec<NodeId> {
        self.members
            .read()
            .iter()
            .filter(|(_, m)| m.alive)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Waits until at least `n` workers are registered.
    pub async fn wait_for_workers(&self, n: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.live_workers().len() < n {
            if Instant::now() > deadline {
                return Err(exec_err(format!(
                    "only {} of {n} workers registered within {timeout:?}",
                    self.live_workers().len()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stops the coordinator's data plane; workers that disconnect afterwards are
    /// not reported as failed.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.transport.shutdown();
    }

    /// Declares dead the workers whose data connection broke or that sent no heartbeat
    /// for `heartbeat_timeout`, not counting the last `deaf` during which the
    /// coordinator could not have heard them.
    fn check_members(&self, deaf: Duration) {
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let timeout = self.config.heartbeat_timeout;
        let now = Instant::now();
        let mut died = vec![];
        {
            let mut members = self.members.write();
            for (id, m) in members.iter_mut() {
                if !m.alive {
                    continue;
                }
                m.last_seen = (m.last_seen + deaf).min(now);
                let reason = if self.transport.is_lost(*id) {
                    Some(format!(
                        "{} at {} died (data connection lost)",
                        node_name(*id),
                        m.data_addr
                    ))
                } else if now.duration_since(m.last_seen) > timeout {
                    Some(format!(
                        "{} at {} died (no heartbeat for {:?})",
                        node_name(*id),
                        m.data_addr,
                        timeout
                    ))
                } else {
                    None
                };
                if let Some(reason) = reason {
                    m.alive = false;
                    m.death = Some(reason.clone());
                    died.push((*id, reason));
                }
            }
        }
        for (id, reason) in died {
            tracing::error!("{reason}");
            self.transport.forget_peer(id, &reason);
            for q in self.running.lock().values() {
                if q.workers.contains(&id) {
                    let _ = q.fail.send(reason.clone());
                }
            }
        }
    }

    /// The workers of a benchmark run: the ones named, else all live ones; at least `min`.
    fn bench_nodes(&self, nodes: Vec<NodeId>, min: usize, what: &str) -> Result<Vec<NodeId>> {
        let nodes = if nodes.is_empty() {
            self.live_workers()
        } else {
            nodes
        };
        if nodes.len() < min {
            return plan_err!(
                "{what} needs at least {min} workers, {} are alive",
                nodes.len()
            );
        }
        Ok(nodes)
    }

    /// Handles a control message from a worker.
    pub async fn handle_control(self: &Arc<Self>, req: Request) -> Result<Response> {
        match req {
            Request::Register {
                control_addr,
                data_addr,
            } => {
                let data: SocketAddr = tokio::net::lookup_host(&data_addr)
                    .await?
                    .next()
                    .ok_or_else(|| exec_err(format!("cannot resolve {data_addr}")))?;
                let id = self.next_node.fetch_add(1, Ordering::SeqCst);
                self.members.write().insert(
                    id,
                    Member {
                        control: ControlClient::connect_lazy(&control_addr)?,
                        data_addr: data,
                        alive: true,
                        last_seen: Instant::now(),
                        death: None,
                    },
                );
                tracing::info!(node = id, %control_addr, %data_addr, "worker registered");
                // The new worker serves its control service only after this reply.
                let me = Arc::clone(self);
                tokio::spawn(async move { me.push_peers().await });
                Ok(Response::Registered { node: id })
            }
            Request::Heartbeat { node } => {
                let mut members = self.members.write();
                match members.get_mut(&node) {
                    Some(m) if m.alive => {
                        m.last_seen = Instant::now();
                        Ok(Response::Ok)
                    }
                    Some(m) => Err(exec_err(format!(
                        "{} was declared dead: {}",
                        node_name(node),
                        m.death.clone().unwrap_or_default()
                    ))),
                    None => Err(exec_err(format!("unknown worker {node}"))),
                }
            }
            Request::BenchShuffle(mut run) => {
                run.nodes = self.bench_nodes(run.nodes, 2, "a shuffle benchmark")?;
                run.run_id = self.next_query.fetch_add(1, Ordering::SeqCst);
                let nodes = run.nodes.clone();
                let replies = self.broadcast(&nodes, Request::BenchShuffle(run)).await?;
                let figures = replies
                    .into_iter()
                    .map(|r| match r {
                        Response::Shuffled(f) => Ok(f),
                        other => Err(exec_err(format!("unexpected shuffle reply {other:?}"))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Response::ShuffleResults(figures))
            }
            Request::BenchJoin(mut run) => {
                run.nodes = self.bench_nodes(run.nodes, 1, "a join benchmark")?;
                run.run_id = self.next_query.fetch_add(1, Ordering::SeqCst);
                let nodes = run.nodes.clone();
                let replies = self.broadcast(&nodes, Request::BenchJoin(run)).await?;
                let figures = replies
                    .into_iter()
                    .map(|r| match r {
                        Response::Joined(f) => Ok(f),
                        other => Err(exec_err(format!("unexpected join reply {other:?}"))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Response::JoinResults(figures))
            }
            Request::QueryFailed { query, error, .. } => {
                if let Some(q) = self.running.lock().get(&query) {
                    let _ = q.fail.send(error);
                }
                Ok(Response::Ok)
            }
            other => Err(exec_err(format!(
                "the coordinator does not handle {other:?}"
            ))),
        }
    }

    async fn push_peers(&self) {
        let (peers, clients): (Vec<(NodeId, String)>, Vec<ControlClient>) = {
            let members = self.members.read();
            let mut peers: Vec<(NodeId, String)> = members
                .iter()
                .filter(|(_, m)| m.alive)
                .map(|(id, m)| (*id, m.data_addr.to_string()))
                .collect();
            peers.push((COORDINATOR, self.transport.local_addr().to_string()));
            let clients = members
                .values()
                .filter(|m| m.alive)
                .map(|m| m.control.clone())
                .collect();
            (peers, clients)
        };
        let map: HashMap<NodeId, SocketAddr> = self
            .members
            .read()
            .iter()
            .filter(|(_, m)| m.alive)
            .map(|(id, m)| (*id, m.data_addr))
            .collect();
        self.transport.set_peers(&map);
        let req = Request::SetPeers { peers };
        for c in clients {
            if let Err(e) = c.call(&req).await {
                tracing::warn!("cannot send the peer table to {}: {e}", c.addr());
            }
        }
    }

    fn control(&self, node: NodeId) -> Result<ControlClient> {
        self.members
            .read()
            .get(&node)
            .map(|m| m.control.clone())
            .ok_or_else(|| exec_err(format!("unknown worker {node}")))
    }

    async fn broadcast(&self, workers: &[NodeId], req: Request) -> Result<Vec<Response>> {
        let calls = workers.iter().map(|w| {
            let req = req.clone();
            async move {
                let c = self.control(*w)?;
                c.call(&req)
                    .await
                    .map_err(|e| exec_err(format!("{}: {e}", node_name(*w))))
            }
        });
        futures::future::try_join_all(calls).await
    }

    /// A new client session: the shared catalog with the default settings. Its `SET`s,
    /// prepared statements and `SHOW`s are its own.
    pub fn new_session(&self) -> SessionContext {
        SessionContext::new_with_state(self.ctx.state())
    }

    /// The session [`Coordinator::sql`] runs in.
    pub fn default_session(&self) -> &SessionContext {
        &self.default_session
    }

    /// A planning state of `session` for a query over `workers`.
    fn query_state(&self, session: &SessionContext, workers: &[NodeId]) -> SessionState {
        let mut state = session.state();
        let config = state.config_mut();
        let own = config.options().execution.target_partitions;
        config.set_extension(Arc::new(SessionPartitions(own)));
        config.options_mut().execution.target_partitions = workers.len().max(1);
        config.set_extension(Arc::new(QueryWorkers(workers.to_vec())));
        state
    }

    /// The coordinator's task context for a query planned in `state`: the session's
    /// settings and runtime (its memory limit, say), as `SHOW` and
    /// `information_schema` report them.
    fn task_ctx(&self, state: &SessionState, qc: QueryContext) -> Arc<TaskContext> {
        let mut state = state.clone();
        let config = state.config_mut();
        if let Some(own) = config.get_extension::<SessionPartitions>() {
            config.options_mut().execution.target_partitions = own.0;
        }
        config.set_extension(Arc::new(qc));
        state.task_ctx()
    }

    /// Parses `sql` in the dialect the session is set to (`datafusion.sql_parser.dialect`),
    /// with its recursion limit, as DataFusion's own `SessionState::sql_to_statement`.
    fn parse(&self, session: &SessionContext, sql: &str) -> Result<VecDeque<DFStatement>> {
        let state = session.state();
        let options = &state.config().options().sql_parser;
        let dialect = dialect_from_str(options.dialect).ok_or_else(|| {
            plan_datafusion_err!(
                "Unsupported SQL dialect: {}. Available dialects: {}.",
                options.dialect,
                Dialect::available()
            )
        })?;
        DFParserBuilder::new(sql)
            .with_dialect(dialect.as_ref())
            .with_recursion_limit(options.recursion_limit.get())
            .build()?
            .parse_statements()
    }

    /// Runs every statement of `sql` in order in the default session and returns each
    /// result.
    pub async fn sql(self: &Arc<Self>, sql: &str) -> Result<Vec<StatementResult>> {
        self.sql_in(&self.default_session, sql).await
    }

    /// Runs every statement of `sql` in order in `session` and returns each result.
    pub async fn sql_in(
        self: &Arc<Self>,
        session: &SessionContext,
        sql: &str,
    ) -> Result<Vec<StatementResult>> {
        let statements = self.parse(session, sql)?;
        let mut out = Vec::with_capacity(statements.len());
        for stmt in statements {
            out.push(self.run_statement(session, stmt).await?);
        }
        Ok(out)
    }

    /// The schema a statement's result will have, found by planning it (not running it).
    pub async fn result_schema(&self, session: &SessionContext, sql: &str) -> Result<SchemaRef> {
        let workers = self.live_workers();
        let state = self.query_state(session, &workers);
        let plan = state.create_logical_plan(sql).await?;
        Ok(Arc::new(plan.schema().as_arrow().clone()))
    }

    /// Runs a single statement in the default session.
    pub async fn sql_one(self: &Arc<Self>, sql: &str) -> Result<StatementResult> {
        let mut results = self.sql(sql).await?;
        match results.len() {
            1 => Ok(results.pop().unwrap()),
            n => plan_err!("expected one statement, found {n}"),
        }
    }

    /// Runs every statement of `sql` but the last in `session`. A last statement that
    /// is a query is planned, not run, so that its result can be streamed to the client
    /// as it is produced ([`DeferredQuery::execute`]); any other last statement is run.
    pub async fn sql_deferred(
        self: &Arc<Self>,
        session: &SessionContext,
        sql: &str,
    ) -> Result<Outcome> {
        let mut statements = self.parse(session, sql)?;
        let Some(mut last) = statements.pop_back() else {
            return plan_err!("no statement to run");
        };
        for stmt in statements {
            self.run_statement(session, stmt).await?;
        }
        let placement = take_partition_by(&mut last)?;
        let workers = self.live_workers();
        let state = self.query_state(session, &workers);
        let plan = self
            .resolve_execute(session, state.statement_to_plan(last).await?)
            .await?;
        self.follow_files(&state, &plan, &workers).await?;
        let plan = self.write_to_files(plan)?;
        if !is_plain_query(&plan) {
            let result = self
                .run_logical(session, state, plan, workers, placement)
                .await?;
            return Ok(Outcome::Done(result));
        }
        let physical = state.create_physical_plan(&plan).await?;
        let dplan = self.distribute(state.config_options(), physical, workers.len())?;
        Ok(Outcome::Deferred(DeferredQuery {
            dplan,
            workers,
            state: Box::new(state),
        }))
    }

    async fn run_statement(
        self: &Arc<Self>,
        session: &SessionContext,
        mut stmt: DFStatement,
    ) -> Result<StatementResult> {
        let placement = take_partition_by(&mut stmt)?;
        let workers = self.live_workers();
        let state = self.query_state(session, &workers);
        let plan = self
            .resolve_execute(session, state.statement_to_plan(stmt).await?)
            .await?;
        self.follow_files(&state, &plan, &workers).await?;
        let plan = self.write_to_files(plan)?;
        self.run_logical(session, state, plan, workers, placement)
            .await
    }

    /// An `EXECUTE` of a prepared statement as the plan it runs, its parameters filled
    /// in by DataFusion; any other plan as it is.
    async fn resolve_execute(
        &self,
        session: &SessionContext,
        plan: LogicalPlan,
    ) -> Result<LogicalPlan> {
        match plan {
            LogicalPlan::Statement(LogicalStatement::Execute(_)) => {
                let (_, plan) = session.execute_logical_plan(plan).await?.into_parts();
                Ok(plan)
            }
            plan => Ok(plan),
        }
    }

    async fn run_logical(
        self: &Arc<Self>,
        session: &SessionContext,
        state: SessionState,
        plan: LogicalPlan,
        workers: Vec<NodeId>,
        placement: Option<TablePlacement>,
    ) -> Result<StatementResult> {
        match plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) => {
                self.create_table(state, cmd, workers, placement).await
            }
            LogicalPlan::Ddl(DdlStatement::CreateExternalTable(cmd)) => {
                self.create_external_table(state, *cmd, workers).await
            }
            LogicalPlan::Ddl(DdlStatement::DropTable(cmd)) => self.drop_table(cmd, &workers).await,
            LogicalPlan::Copy(mut copy) => {
                let store_options = take_store_options(&mut copy.options);
                register_store(state.runtime_env(), &copy.output_url, &store_options)?;
                if copy.output_url.contains("://") {
                    let req = Request::RegisterStore {
                        locations: vec![copy.output_url.clone()],
                        options: store_options.into_iter().collect(),
                    };
                    self.broadcast(&workers, req).await?;
                }
                self.run_query(state, LogicalPlan::Copy(copy), workers)
                    .await
            }
            LogicalPlan::Explain(e) => {
                let physical = state.create_physical_plan(&e.plan).await?;
                let dplan = self.distribute(state.config_options(), physical, workers.len())?;
                let mut text = format!(
                    "distributed plan over {} workers ({})\n",
                    workers.len(),
                    workers
                        .iter()
                        .map(|w| node_name(*w))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                text.push_str(&dplan.display());
                text_result("plan", text.lines().map(String::from).collect())
            }
            LogicalPlan::Analyze(a) => {
                let physical = state.create_physical_plan(&a.input).await?;
                let dplan = self.distribute(state.config_options(), physical, workers.len())?;
                let start = Instant::now();
                let run = self.execute(&state, &dplan, &workers, true).await?;
                let rows: usize = run.batches.iter().map(|b| b.num_rows()).sum();
                let mut lines = vec![format!(
                    "query returned {rows} rows in {:.3} s over {} workers",
                    start.elapsed().as_secs_f64(),
                    workers.len()
                )];
                lines.extend(run.report.lines().map(String::from));
                text_result("plan_with_metrics", lines)
            }
            LogicalPlan::Ddl(_) | LogicalPlan::Statement(_) | LogicalPlan::DescribeTable(_) => {
                // SET, SHOW, PREPARE, views and schemas: DataFusion's, in this session.
                let df = session.execute_logical_plan(plan).await?;
                let schema = Arc::new(df.schema().as_arrow().clone());
                Ok(StatementResult {
                    schema,
                    batches: df.collect().await?,
                })
            }
            LogicalPlan::Dml(ref d) if matches!(d.op, WriteOp::Delete | WriteOp::Update) => {
                let _one_at_a_time = self.modifying.lock().await;
                self.run_query(state, plan, workers).await
            }
            plan => self.run_query(state, plan, workers).await,
        }
    }

    /// Plans and runs a query or DML statement on the cluster.
    async fn run_query(
        self: &Arc<Self>,
        state: SessionState,
        plan: LogicalPlan,
        workers: Vec<NodeId>,
    ) -> Result<StatementResult> {
        let physical = state.create_physical_plan(&plan).await?;
        let dplan = self.distribute(state.config_options(), physical, workers.len())?;
        // Inserts and parallel COPYs return one count per worker.
        let counts = dplan.stages.iter().any(|s| {
            s.plan
                .exists(|n| {
                    Ok(n.is::<GyreInsertExec>()
                        || n.is::<GyreModifyExec>()
                        || n.is::<FileCopyExec>())
                })
                .unwrap_or(false)
        });
        let run = self.execute(&state, &dplan, &workers, false).await?;
        if counts {
            let rows = run
                .batches
                .iter()
                .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>())
                .flat_map(|a| a.values().iter().copied())
                .sum();
            return count_result(rows);
        }
        Ok(StatementResult {
            schema: dplan.final_stage().plan.schema(),
            batches: run.batches,
        })
    }

    /// Turns an optimised physical plan into stages.
    fn distribute(
        &self,
        config: &ConfigOptions,
        plan: Arc<dyn ExecutionPlan>,
        n: usize,
    ) -> Result<DistributedPlan> {
        if n == 0 {
            return plan_err!("no workers are alive");
        }
        // Inserts must run on every worker: give their input one partition per worker
        // (with one worker, DataFusion adds no repartition, and the input may be a
        // coordinator-side VALUES list).
        let plan = plan
            .transform_up(|node| {
                if let Some(ins) = node.downcast_ref::<GyreInsertExec>()
                    && (n == 1 || ins.input.output_partitioning().partition_count() != n)
                {
                    // A single-partition input counts as key-partitioned for DataFusion,
                    // so a hash-placed table must be hash-partitioned here explicitly.
                    let partitioning = match ins.key {
                        Some(k) => {
                            let name = ins.input.schema().field(k).name().clone();
                            Partitioning::Hash(
                                vec![Arc::new(
                                    datafusion::physical_expr::expressions::Column::new(&name, k),
                                )],
                                n,
                            )
                        }
                        None => Partitioning::RoundRobinBatch(n),
                    };
                    let input = Arc::new(RepartitionExec::try_new(
                        Arc::clone(&ins.input),
                        partitioning,
                    )?);
                    return Ok(Transformed::yes(Arc::new(GyreInsertExec::new(
                        input,
                        ins.table.clone(),
                        ins.key,
                    ))
                        as Arc<dyn ExecutionPlan>));
                }
                Ok(Transformed::no(node))
            })
            .data()?;
        let mut plan = parallel_copy(plan, n)?;
        for rule in network_operator_rules() {
            plan = rule.optimize(plan, config)?;
        }
        split_into_stages(plan, n, &runs_on_workers)
    }

    /// Allocates a query id and its failure channel, and builds the coordinator's task context.
    pub(crate) fn register_query(
        &self,
        state: &SessionState,
        workers: &[NodeId],
    ) -> Result<RegisteredQuery> {
        let query = self.next_query.fetch_add(1, Ordering::SeqCst);
        let qc = QueryContext {
            query_id: query,
            transport: Arc::new(self.transport.clone()),
            workers: workers.to_vec(),
            compression: GyreOptions::of(state.config_options()).compression,
        };
        let ctx = self.task_ctx(state, qc);
        let (fail_tx, fail_rx) = mpsc::unbounded_channel();
        self.running.lock().insert(
            query,
            RunningQuery {
                workers: workers.to_vec(),
                fail: fail_tx.clone(),
            },
        );
        Ok(RegisteredQuery {
            id: query,
            ctx,
            fail_tx,
            fail_rx,
        })
    }

    /// Sends every worker its stages of `dplan`; they start at once and stream into each other.
    pub(crate) async fn start_worker_stages(
        &self,
        state: &SessionState,
        query: u64,
        dplan: &DistributedPlan,
        workers: &[NodeId],
    ) -> Result<()> {
        let codec = GyreCodec;
        let stages = dplan
            .worker_stages()
            .map(|s| Ok((s.id, codec.encode_plan(Arc::clone(&s.plan))?)))
            .collect::<Result<Vec<_>>>()?;
        if stages.is_empty() {
            return Ok(());
        }
        let compression = GyreOptions::of(state.config_options()).compression;
        self.broadcast(
            workers,
            Request::StartQuery {
                query,
                workers: workers.to_vec(),
                stages,
                compression: Some(compression.name().to_string()),
                execution: changed_execution_options(state.config_options()),
            },
        )
        .await?;
        Ok(())
    }

    /// Ends `query` everywhere: stops its tasks, commits or discards its inserts,
    /// releases its streams, and (with `metrics`) returns the workers' reports.
    pub(crate) async fn end_query(
        &self,
        query: u64,
        workers: &[NodeId],
        commit: bool,
        metrics: bool,
    ) -> StageReports {
        self.running.lock().remove(&query);
        let reports = self.finish(query, workers, commit, metrics).await;
        self.transport.release_query(query);
        reports
    }

    /// Runs a distributed plan and collects the final stage's batches.
    pub async fn execute(
        self: &Arc<Self>,
        state: &SessionState,
        dplan: &DistributedPlan,
        workers: &[NodeId],
        analyze: bool,
    ) -> Result<QueryRun> {
        let mut run = QueryExecution::start(self, state, dplan, workers).await?;
        let mut batches = vec![];
        let mut failure = None;
        while let Some(batch) = run.next().await {
            match batch {
                Ok(b) => batches.push(b),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let reports = run.finish(failure.is_none(), analyze).await;
        if let Some(e) = failure {
            return Err(e);
        }
        let mut report = String::new();
        if analyze {
            report = self.render_report(dplan, workers, &reports);
        }
        Ok(QueryRun { batches, report })
    }

    /// Tells every worker the query is over and collects their reports.
    async fn finish(
        &self,
        query: u64,
        workers: &[NodeId],
        commit: bool,
        metrics: bool,
    ) -> StageReports {
        let req = Request::FinishQuery {
            query,
            commit,
            metrics,
        };
        let calls = workers.iter().map(|w| {
            let req = req.clone();
            async move {
                let alive = self.members.read().get(w).is_some_and(|m| m.alive);
                if !alive {
                    return (*w, None);
                }
                let Ok(c) = self.control(*w) else {
                    return (*w, None);
                };
                let r = tokio::time::timeout(Duration::from_secs(5), c.call(&req)).await;
                (*w, r.ok().and_then(|r| r.ok()))
            }
        });
        let mut out = BTreeMap::new();
        for (w, resp) in futures::future::join_all(calls).await {
            if let Some(Response::Finished { stages, tables }) = resp {
                let mut stats = self.part_stats.lock();
                for (table, s) in tables {
                    stats.entry(table.clone()).or_default().insert(w, s);
                    self.refresh_table_stats(&table, &stats);
                }
                out.insert(w, stages);
            }
        }
        out
    }

    fn refresh_table_stats(
        &self,
        table: &str,
        stats: &HashMap<String, BTreeMap<NodeId, PartStats>>,
    ) {
        let Some(per_worker) = stats.get(table) else {
            return;
        };
        let mut tables = self.tables.write();
        let Some(meta) = tables.get_mut(table) else {
            return;
        };
        meta.rows = per_worker.values().map(|s| s.rows).sum();
        meta.column_bytes = (0..meta.schema.fields().len())
            .map(|i| {
                per_worker
                    .values()
                    .map(|s| s.column_bytes.get(i).copied().unwrap_or(0))
                    .sum()
            })
            .collect();
        let provider = Arc::new(DistributedTable { meta: meta.clone() });
        drop(tables);
        let _ = self.ctx.deregister_table(TableReference::bare(table));
        let _ = self
            .ctx
            .register_table(TableReference::bare(table), provider);
    }

    fn render_report(
        &self,
        dplan: &DistributedPlan,
        workers: &[NodeId],
        reports: &StageReports,
    ) -> String {
        let mut out = String::new();
        for stage in dplan.stages.iter().rev() {
            match stage.placement {
                Placement::Coordinator => {
                    out.push_str(&format!("stage {} on coordinator:\n", stage.id));
                    let text = DisplayableExecutionPlan::with_metrics(stage.plan.as_ref())
                        .indent(true)
                        .to_string();
                    for l in text.lines() {
                        out.push_str(&format!("  {l}\n"));
                    }
                }
                Placement::Workers => {
                    out.push_str(&format!("stage {} on workers:\n", stage.id));
                    for w in workers {
                        out.push_str(&format!("  {}:\n", node_name(*w)));
                        let text = reports
                            .get(w)
                            .and_then(|r| r.iter().find(|(id, _)| *id == stage.id))
                            .map(|(_, t)| t.as_str())
                            .unwrap_or("(no report)");
                        for l in text.lines() {
                            out.push_str(&format!("    {l}\n"));
                        }
                    }
                }
            }
        }
        out
    }

    fn register(&self, meta: TableMeta) -> Result<()> {
        let name = meta.name.clone();
        let provider: Arc<dyn TableProvider> = Arc::new(DistributedTable { meta: meta.clone() });
        self.tables.write().insert(name.clone(), meta);
        let _ = self
            .ctx
            .deregister_table(TableReference::bare(name.as_str()));
        self.ctx
            .register_table(TableReference::bare(name.as_str()), provider)?;
        Ok(())
    }

    /// The name Gyre keeps table `r` under: its table part, once its catalog and schema
    /// (if given) are found to be the defaults, where Gyre keeps every table.
    fn table_name(&self, r: &TableReference) -> Result<String> {
        let options = self.ctx.state().config_options().catalog.clone();
        if let Some(catalog) = r.catalog()
            && catalog != options.default_catalog
        {
            return plan_err!("failed to resolve catalog: {catalog}");
        }
        if let Some(schema) = r.schema()
            && schema != options.default_schema
        {
            let exists = self
                .ctx
                .catalog(&options.default_catalog)
                .is_some_and(|c| c.schema(schema).is_some());
            if !exists {
                return plan_err!("failed to resolve schema: {schema}");
            }
            return not_impl_err!(
                "tables in schema '{schema}': Gyre keeps every table in schema '{}'",
                options.default_schema
            );
        }
        Ok(r.table().to_string())
    }

    /// Claims `name` for a statement that creates it, until the returned guard drops.
    fn reserve(&self, name: &str) -> Result<NameReservation> {
        if !self.creating.lock().insert(name.to_string()) {
            return plan_err!("table '{name}' is being created by another statement");
        }
        Ok(NameReservation {
            names: Arc::clone(&self.creating),
            name: name.to_string(),
        })
    }

    /// Creates an empty distributed table on `workers`.
    async fn create_empty_table(
        &self,
        name: &str,
        schema: SchemaRef,
        placement: TablePlacement,
        rules: TableRules,
        workers: &[NodeId],
    ) -> Result<()> {
        if workers.is_empty() {
            return plan_err!("cannot create table '{name}': no workers are alive");
        }
        if let TablePlacement::Hash { column } = &placement
            && schema.index_of(column).is_err()
        {
            return plan_err!("cannot partition '{name}' by '{column}': no such column");
        }
        let created = self
            .broadcast(
                workers,
                Request::CreateTable {
                    name: name.to_string(),
                    schema: schema_to_bytes(&schema)?,
                },
            )
            .await;
        if let Err(e) = created {
            // Some workers may have made their part already.
            self.drop_everywhere(name, workers).await;
            return Err(e);
        }
        self.part_stats.lock().remove(name);
        // A new table: not (yet) one that follows files, nor a stream.
        self.file_tables.write().remove(name);
        self.streams.write().remove(name);
        self.register(TableMeta {
            name: name.to_string(),
            column_bytes: vec![0; schema.fields().len()],
            schema,
            placement,
            workers: workers.to_vec(),
            rows: 0,
            rules,
        })
    }

    /// Inserts the rows of `input` (a logical plan) into table `name`.
    async fn insert(
        self: &Arc<Self>,
        state: SessionState,
        name: &str,
        input: LogicalPlan,
        workers: Vec<NodeId>,
    ) -> Result<StatementResult> {
        let provider = self.ctx.table_provider(TableReference::bare(name)).await?;
        let plan = LogicalPlanBuilder::insert_into(
            input,
            TableReference::bare(name),
            provider_as_source(provider),
            InsertOp::Append,
        )?
        .build()?;
        let plan = state.optimize(&plan)?;
        self.run_query(state, plan, workers).await
    }

    async fn create_table(
        self: &Arc<Self>,
        state: SessionState,
        cmd: CreateMemoryTable,
        workers: Vec<NodeId>,
        placement: Option<TablePlacement>,
    ) -> Result<StatementResult> {
        let name = self.table_name(&cmd.name)?;
        let reservation = self.reserve(&name)?;
        if self.exists(&name) {
            if cmd.if_not_exists && cmd.or_replace {
                return Err(exec_err("'IF NOT EXISTS' cannot coexist with 'REPLACE'"));
            }
            if cmd.if_not_exists {
                return no_result();
            }
            if !cmd.or_replace {
                return Err(exec_err(format!("Table '{name}' already exists")));
            }
        }
        // The table keeps unqualified names only: two alike would leave one unselectable.
        let mut seen = HashSet::new();
        for field in cmd.input.schema().fields() {
            if !seen.insert(field.name()) {
                return Err(DataFusionError::SchemaError(
                    Box::new(SchemaError::DuplicateUnqualifiedField {
                        name: field.name().clone(),
                    }),
                    Box::new(None),
                ));
            }
        }
        let schema: SchemaRef = Arc::new(cmd.input.schema().as_arrow().clone());
        let placement = placement.unwrap_or_else(|| {
            cmd.constraints
                .iter()
                .find_map(|c| match c {
                    datafusion::common::Constraint::PrimaryKey(cols) => cols.first().copied(),
                    _ => None,
                })
                .map(|i| TablePlacement::Hash {
                    column: schema.field(i).name().clone(),
                })
                .unwrap_or(TablePlacement::Chunked)
        });
        let rules = TableRules {
            constraints: cmd.constraints.clone(),
            column_defaults: cmd.column_defaults.iter().cloned().collect(),
        };
        self.create_empty_table(&name, Arc::clone(&schema), placement, rules, &workers)
            .await?;
        let empty =
            matches!(cmd.input.as_ref(), LogicalPlan::EmptyRelation(e) if !e.produce_one_row);
        if empty {
            return no_result();
        }
        let input = Arc::unwrap_or_clone(cmd.input);
        self.fill_or_drop(state, name, input, workers, reservation, |e| e)
            .await?;
        no_result()
    }

    /// Inserts `input` into the new table `name`, or drops it everywhere if that fails.
    /// Runs as a task of its own, so that a client that goes away midway does not stop
    /// it before the clean-up.
    async fn fill_or_drop(
        self: &Arc<Self>,
        state: SessionState,
        name: String,
        input: LogicalPlan,
        workers: Vec<NodeId>,
        reservation: NameReservation,
        explain: impl FnOnce(DataFusionError) -> DataFusionError + Send + 'static,
    ) -> Result<StatementResult> {
        let me = Arc::clone(self);
        // The statement's progress follows it into the task.
        let progress = STATEMENT.try_with(Arc::clone).ok();
        let work = async move {
            let _reservation = reservation;
            let res = me.insert(state, &name, input, workers.clone()).await;
            if res.is_err() {
                me.drop_everywhere(&name, &workers).await;
            }
            res.map_err(explain)
        };
        let task = tokio::spawn(async move {
            match progress {
                Some(p) => STATEMENT.scope(p, work).await,
                None => work.await,
            }
        });
        task.await
            .map_err(|e| exec_err(format!("the statement's task failed: {e}")))?
    }

    async fn create_external_table(
        self: &Arc<Self>,
        state: SessionState,
        mut cmd: CreateExternalTable,
        workers: Vec<NodeId>,
    ) -> Result<StatementResult> {
        if cmd.temporary {
            return not_impl_err!("Temporary tables not supported");
        }
        let name = self.table_name(&cmd.name)?;
        // Gyre's own options and the object store's; DataFusion's file formats reject
        // unknown namespaces.
        let partition_by = cmd.options.remove("gyre.partition_by");
        let read_on = ReadOn::parse(cmd.options.remove("gyre.read_on"))?;
        let store_options = take_store_options(&mut cmd.options);
        let reservation = self.reserve(&name)?;
        if self.exists(&name) {
            if cmd.if_not_exists && cmd.or_replace {
                return Err(exec_err("'IF NOT EXISTS' cannot coexist with 'REPLACE'"));
            }
            if cmd.if_not_exists {
                return no_result();
            }
            if !cmd.or_replace {
                return Err(exec_err(format!("Table '{name}' already exists")));
            }
        }
        if workers.is_empty() {
            return plan_err!("cannot create table '{name}': no workers are alive");
        }
        let locations = cmd.locations.join(", ");
        for location in &cmd.locations {
            register_store(state.runtime_env(), location, &store_options)?;
        }
        let read_on = match (read_on, coordinator_must_read(&cmd.file_type, &cmd.options)) {
            (ReadOn::Workers, Some(why)) => {
                tracing::info!("the coordinator reads '{locations}': {why}");
                ReadOn::Coordinator
            }
            (r, _) => r,
        };
        let factory = state
            .table_factories()
            .get(cmd.file_type.to_ascii_uppercase().as_str())
            .cloned()
            .ok_or_else(|| {
                exec_err(format!(
                    "Unable to find factory for {}",
                    cmd.file_type.to_ascii_uppercase()
                ))
            })?;
        let listing = match factory.create(&state, &cmd).await {
            Ok(l) => l,
            Err(e) => {
                let mut conflicts = vec![];
                for l in &cmd.locations {
                    conflicts.extend(schema_conflict(&state, l, &cmd.file_type).await);
                }
                // A fault of the statement (its options, columns, partitioning) keeps
                // DataFusion's words; one of the files' contents names the location.
                let statement_fault = match e.find_root() {
                    DataFusionError::Plan(_)
                    | DataFusionError::Configuration(_)
                    | DataFusionError::SchemaError(..)
                    | DataFusionError::NotImplemented(_) => true,
                    DataFusionError::ArrowError(a, _) => {
                        matches!(**a, datafusion::arrow::error::ArrowError::SchemaError(_))
                    }
                    _ => false,
                };
                return Err(match conflicts.first() {
                    Some(c) => exec_err(format!(
                        "cannot read '{locations}' as {}: the files' schemas do not agree: \
                         {c} ({e})",
                        cmd.file_type
                    )),
                    None if statement_fault => e,
                    None => exec_err(format!(
                        "cannot read '{locations}' as {}: {e}",
                        cmd.file_type
                    )),
                });
            }
        };
        if cmd.unbounded {
            // A stream (DataFusion reads the file as it grows, a FIFO for one): the
            // coordinator reads it whenever it is queried, as DataFusion does.
            if self.tables.read().contains_key(&name) {
                self.drop_by_name(&name, &workers).await?;
            }
            let _ = self
                .ctx
                .deregister_table(TableReference::bare(name.as_str()));
            self.ctx
                .register_table(TableReference::bare(name.as_str()), listing)?;
            self.streams.write().insert(name);
            return no_result();
        }
        let schema = listing.schema();
        if read_on == ReadOn::Workers
            && (!store_options.is_empty() || cmd.locations.iter().any(|l| l.contains("://")))
        {
            let req = Request::RegisterStore {
                locations: cmd.locations.clone(),
                options: store_options.clone().into_iter().collect(),
            };
            self.broadcast(&workers, req).await?;
        }
        let files = Arc::new(FileTable::new(listing, read_on == ReadOn::Workers));
        let placement = partition_by
            .map(|column| TablePlacement::Hash { column })
            .unwrap_or(TablePlacement::Chunked);
        let rules = TableRules {
            constraints: cmd.constraints.clone(),
            column_defaults: cmd.column_defaults.clone(),
        };
        self.create_empty_table(&name, schema, placement, rules, &workers)
            .await?;
        // A location that does not exist yet, under a declared schema, is an empty table
        // (DataFusion does not look at the files then); the first file written there is
        // loaded by the next statement that reads the table.
        let missing = !cmd.schema.fields().is_empty()
            && matches!(files.list(&state).await, Err(e) if is_not_found(&e));
        if !missing {
            let (source, input) = files.read(&name, None)?;
            let what = format!("loading '{locations}' into table '{name}' failed");
            self.fill_or_drop(state, name.clone(), input, workers, reservation, move |e| {
                exec_err(format!("{what}: {e}"))
            })
            .await?;
            files.add_loaded(source.planned());
        }
        self.file_tables.write().insert(name, files);
        no_result()
    }

    /// Whether a table (distributed or a stream) is called `name`.
    fn exists(&self, name: &str) -> bool {
        self.tables.read().contains_key(name) || self.streams.read().contains(name)
    }

    fn file_table(&self, name: &str) -> Option<Arc<FileTable>> {
        self.file_tables.read().get(name).cloned()
    }

    /// Brings every table loaded from files that `plan` reads up to date with its files
    /// ([`crate::files::follow`]): loads the files added since, or the table anew when a
    /// file it loaded changed or went away.
    async fn follow_files(
        self: &Arc<Self>,
        state: &SessionState,
        plan: &LogicalPlan,
        workers: &[NodeId],
    ) -> Result<()> {
        if self.file_tables.read().is_empty() {
            return Ok(());
        }
        let mut names = BTreeSet::new();
        scanned_tables(plan, &mut names);
        for name in names {
            let Some(files) = self.file_table(&name) else {
                continue;
            };
            let _one_at_a_time = files.following.lock().await;
            let now = files.list(state).await?;
            let only = match files.change(&now) {
                Change::None => continue,
                Change::Added(added) => Some(added),
                Change::Replaced => {
                    self.delete_all(state, &name, workers).await?;
                    files.clear_loaded();
                    None
                }
            };
            let (source, input) = files.read(&name, only)?;
            self.insert(state.clone(), &name, input, workers.to_vec())
                .await
                .map_err(|e| {
                    exec_err(format!(
                        "loading the changed files of table '{name}' failed: {e}"
                    ))
                })?;
            files.add_loaded(source.planned());
        }
        Ok(())
    }

    /// `plan` with its writes to tables loaded from files going to the files, as
    /// DataFusion's do: the next statement that reads such a table loads what was
    /// written ([`crate::files::follow`]).
    fn write_to_files(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        if self.file_tables.read().is_empty() {
            return Ok(plan);
        }
        plan.transform_down(|node| match node {
            LogicalPlan::Dml(mut d) => match self.file_table(d.table_name.table()) {
                Some(files) => {
                    d.target = provider_as_source(Arc::clone(&files.listing));
                    Ok(Transformed::yes(LogicalPlan::Dml(d)))
                }
                None => Ok(Transformed::no(LogicalPlan::Dml(d))),
            },
            other => Ok(Transformed::no(other)),
        })
        .data()
    }

    /// Deletes every row of table `name`.
    async fn delete_all(
        self: &Arc<Self>,
        state: &SessionState,
        name: &str,
        workers: &[NodeId],
    ) -> Result<()> {
        let provider = self.ctx.table_provider(TableReference::bare(name)).await?;
        let source = provider_as_source(provider);
        let scan = LogicalPlanBuilder::scan(TableReference::bare(name), Arc::clone(&source), None)?
            .build()?;
        let plan = LogicalPlan::Dml(DmlStatement::new(
            TableReference::bare(name),
            source,
            WriteOp::Delete,
            Arc::new(scan),
        ));
        let _one_at_a_time = self.modifying.lock().await;
        self.run_query(state.clone(), plan, workers.to_vec())
            .await?;
        Ok(())
    }

    /// Forgets table `name` and drops its partitions on every worker that can still be
    /// reached, whatever the others answer: a failed statement leaves nothing behind.
    async fn drop_everywhere(&self, name: &str, workers: &[NodeId]) {
        self.tables.write().remove(name);
        self.file_tables.write().remove(name);
        self.part_stats.lock().remove(name);
        let _ = self.ctx.deregister_table(TableReference::bare(name));
        let req = Request::DropTable {
            name: name.to_string(),
        };
        let calls = workers.iter().map(|w| {
            let req = req.clone();
            async move {
                let alive = self.members.read().get(w).is_some_and(|m| m.alive);
                let Ok(c) = self.control(*w) else { return };
                if !alive {
                    return;
                }
                if let Err(e) = tokio::time::timeout(CONTROL_TIMEOUT, c.call(&req)).await {
                    tracing::warn!("cannot drop '{name}' on {}: {e}", node_name(*w));
                }
            }
        });
        futures::future::join_all(calls).await;
    }

    async fn drop_by_name(&self, name: &str, workers: &[NodeId]) -> Result<()> {
        self.tables.write().remove(name);
        self.file_tables.write().remove(name);
        self.part_stats.lock().remove(name);
        let _ = self.ctx.deregister_table(TableReference::bare(name));
        self.broadcast(
            workers,
            Request::DropTable {
                name: name.to_string(),
            },
        )
        .await?;
        Ok(())
    }

    async fn drop_table(&self, cmd: DropTable, workers: &[NodeId]) -> Result<StatementResult> {
        let name = self.table_name(&cmd.name)?;
        if self.streams.write().remove(&name) {
            let _ = self
                .ctx
                .deregister_table(TableReference::bare(name.as_str()));
            return no_result();
        }
        if !self.tables.read().contains_key(&name) {
            if cmd.if_exists {
                return no_result();
            }
            return Err(exec_err(format!("Table '{name}' doesn't exist.")));
        }
        self.drop_by_name(&name, workers).await?;
        no_result()
    }

    /// Generates TPC-H at scale factor `sf` in place, each table hash-placed on
    /// its first primary-key column.
    pub async fn load_tpch(self: &Arc<Self>, sf: f64) -> Result<()> {
        for table in tpch::TABLES {
            let workers = self.live_workers();
            let state = self.query_state(&self.default_session, &workers);
            let schema = tpch::schema(table)?;
            let column = tpch::primary_key(table).expect("tpch table").to_string();
            let _ = self.drop_by_name(table, &workers).await;
            self.create_empty_table(
                table,
                Arc::clone(&schema),
                TablePlacement::Hash { column },
                TableRules::default(),
                &workers,
            )
            .await?;
            let source = Arc::new(TpchSource {
                table: table.to_string(),
                sf,
                schema,
            });
            let input = LogicalPlanBuilder::scan(
                format!("tpchgen_{table}"),
                provider_as_source(source),
                None,
            )?
            .build()?;
            self.insert(state, table, input, workers).await?;
        }
        Ok(())
    }

    /// Collects from the workers what the running queries of a statement have read
    /// (figures of queries that ended stay as last reported).
    pub async fn poll_progress(&self, progress: &StatementProgress) {
        let queries: Vec<(u64, Vec<NodeId>)> = progress
            .queries
            .lock()
            .iter()
            .filter(|q| self.running.lock().contains_key(&q.id))
            .map(|q| (q.id, q.workers.clone()))
            .collect();
        for (id, workers) in queries {
            let calls = workers.iter().map(|w| async move {
                let c = self.control(*w).ok()?;
                let reply = tokio::time::timeout(
                    Duration::from_secs(2),
                    c.call(&Request::Progress { query: id }),
                )
                .await;
                match reply {
                    Ok(Ok(Response::Progress(f))) => f,
                    _ => None,
                }
            });
            let figures = futures::future::join_all(calls).await;
            let mut tracked = progress.queries.lock();
            if let Some(q) = tracked.iter_mut().find(|q| q.id == id) {
                for (last, f) in q.last.iter_mut().zip(figures) {
                    if let Some(f) = f {
                        *last = f;
                    }
                }
            }
        }
    }

    /// Runs `sql` like [`Coordinator::sql`], recording its progress in `progress`.
    pub async fn sql_with_progress(
        self: &Arc<Self>,
        session: &SessionContext,
        sql: &str,
        progress: Arc<StatementProgress>,
    ) -> Result<Vec<StatementResult>> {
        STATEMENT.scope(progress, self.sql_in(session, sql)).await
    }

    /// Registers the object store that serves `url` for planning on the coordinator (the
    /// workers need their own: `Worker::register_object_store`).
    pub fn register_object_store(&self, url: &url::Url, store: Arc<dyn object_store::ObjectStore>) {
        self.ctx.runtime_env().register_object_store(url, store);
    }

    /// The catalog entry of a table.
    pub fn table(&self, name: &str) -> Option<TableMeta> {
        self.tables.read().get(name).cloned()
    }

    pub fn table_names(&self) -> Vec<String> {
        self.tables.read().keys().cloned().collect()
    }
}

/// A table name claimed by the statement creating it; released on drop.
struct NameReservation {
    names: Arc<Mutex<std::collections::HashSet<String>>>,
    name: String,
}

impl Drop for NameReservation {
    fn drop(&mut self) {
        self.names.lock().remove(&self.name);
    }
}

/// A query id with the coordinator's task context and the channel on which any
/// node's failure of the query is reported.
pub(crate) struct RegisteredQuery {
    pub id: u64,
    pub ctx: Arc<TaskContext>,
    pub fail_tx: mpsc::UnboundedSender<String>,
    pub fail_rx: mpsc::UnboundedReceiver<String>,
}

/// What [`Coordinator::sql_deferred`] returns.
#[derive(Debug)]
pub enum Outcome {
    /// The last statement ran (DDL, DML, `SET`, `EXPLAIN`, ...).
    Done(StatementResult),
    /// The last statement is a query, planned and ready to stream.
    Deferred(DeferredQuery),
}

/// Whether a plan only reads (its result can be produced lazily, as the client pulls).
/// The tables `plan` scans, also in its subqueries and the views it reads.
fn scanned_tables(plan: &LogicalPlan, names: &mut BTreeSet<String>) {
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            names.insert(scan.table_name.table().to_string());
            if let Some(view) = scan.source.get_logical_plan() {
                scanned_tables(&view, names);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
}

fn is_plain_query(plan: &LogicalPlan) -> bool {
    !matches!(
        plan,
        LogicalPlan::Ddl(_)
            | LogicalPlan::Dml(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::DescribeTable(_)
            | LogicalPlan::Explain(_)
            | LogicalPlan::Analyze(_)
    )
}

/// Per worker, per stage id: the stage plan rendered with that worker's metrics.
pub type StageReports = BTreeMap<NodeId, Vec<(usize, String)>>;

/// What [`Coordinator::execute`] returns.
#[derive(Debug)]
pub struct QueryRun {
    pub batches: Vec<RecordBatch>,
    /// With `analyze`: every stage with each worker's metrics.
    pub report: String,
}

/// Replaces a COPY to a directory (DataFusion's single `DataSinkExec` over the merged
/// result) by a [`FileCopyExec`] that writes from every worker; other sinks stay.
fn parallel_copy(plan: Arc<dyn ExecutionPlan>, n: usize) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(sink) = plan.downcast_ref::<DataSinkExec>() else {
        return Ok(plan);
    };
    if !FileCopyExec::parallel(sink) {
        return Ok(plan);
    }
    let input = sink.input();
    // An ordered result (a SortPreservingMergeExec) is written by one writer, in order; so
    // is a limited one (the merge carries the LIMIT).
    let input = match input.downcast_ref::<CoalescePartitionsExec>() {
        Some(merge) if merge.fetch().is_some() => return Ok(plan),
        Some(merge) => Arc::clone(merge.input()),
        None if input.output_partitioning().partition_count() == 1
            && input.output_ordering().is_none() =>
        {
            Arc::clone(input)
        }
        None => return Ok(plan),
    };
    let input: Arc<dyn ExecutionPlan> = if input.output_partitioning().partition_count() == n {
        input
    } else {
        Arc::new(RepartitionExec::try_new(
            input,
            Partitioning::RoundRobinBatch(n),
        )?)
    };
    let write_id: String = {
        use rand::Rng;
        let mut rng = rand::rng();
        (0..12)
            .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)]))
            .collect()
    };
    Ok(Arc::new(FileCopyExec::try_new(input, sink, write_id)?))
}

/// Reads `PARTITION BY col` of a `CREATE TABLE` (removing it, since DataFusion
/// does not know it) as the table's hash placement.
fn take_partition_by(stmt: &mut DFStatement) -> Result<Option<TablePlacement>> {
    let DFStatement::Statement(s) = stmt else {
        return Ok(None);
    };
    let SqlStatement::CreateTable(ct) = s.as_mut() else {
        return Ok(None);
    };
    let Some(expr) = ct.partition_by.take() else {
        return Ok(None);
    };
    match *expr {
        SqlExpr::Identifier(id) => Ok(Some(TablePlacement::Hash { column: id.value })),
        SqlExpr::Nested(inner) => match *inner {
            SqlExpr::Identifier(id) => Ok(Some(TablePlacement::Hash { column: id.value })),
            other => plan_err!("PARTITION BY takes one column name, not '{other}'"),
        },
        other => plan_err!("PARTITION BY takes one column name, not '{other}'"),
    }
}

/// A TPC-H table as a source: scanned, it generates its rows on the workers.
#[derive(Debug)]
struct TpchSource {
    table: String,
    sf: f64,
    schema: SchemaRef,
}

#[async_trait::async_trait]
impl TableProvider for TpchSource {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Temporary
    }
    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        _filters: &[datafusion::logical_expr::Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let n = state.config().target_partitions();
        let source: Arc<dyn ExecutionPlan> =
            Arc::new(TpchGenExec::try_new(&self.table, self.sf, n)?);
        match projection {
            Some(p) if p.len() != self.schema.fields().len() => {
                let exprs = p
                    .iter()
                    .map(|&i| {
                        let f = self.schema.field(i);
                        (
                            Arc::new(datafusion::physical_expr::expressions::Column::new(
                                f.name(),
                                i,
                            ))
                                as Arc<dyn datafusion::physical_expr::PhysicalExpr>,
                            f.name().clone(),
                        )
                    })
                    .collect::<Vec<_>>();
                Ok(Arc::new(
                    datafusion::physical_plan::projection::ProjectionExec::try_new(exprs, source)?,
                ))
            }
            _ => Ok(source),
        }
    }
}
