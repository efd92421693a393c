//! The coordinator: cluster membership, the catalog, planning, and running
//! queries over the workers, one concern per module:
//!
//! - [`membership`]: workers joining and leaving, heartbeats, control calls;
//! - [`statements`]: parsing and running each statement of a session;
//! - [`planning`]: a query's planning state and its stages;
//! - [`queries`]: a query's lifecycle on the workers;
//! - [`catalog`]: tables, in memory and following their files (these in a durable
//!   catalog);
//! - [`primary`]: transactional tables and transactions on the primary;
//! - [`retry`]: a read that lost a worker, run again on the others.

mod bench;
mod catalog;
mod membership;
mod planning;
mod primary;
mod queries;
mod retry;
mod statements;

pub use primary::{PrimaryConfig, PrimaryFigures};
pub use retry::Replan;

use crate::codec::{GyreCodec, schema_to_bytes};
use crate::execution::{DeferredQuery, QueryExecution};
use crate::files::LocalFiles;
use crate::files::follow::{Change, FileTable, is_not_found};
use crate::files::stores::{register_store, take_store_options};
use crate::files::{FileCopyExec, FileSplitScanExec, coordinator_must_read, schema_conflict};
use crate::modify::GyreModifyExec;
use crate::progress::{STATEMENT, StatementProgress};
use crate::protocol::{ControlClient, Request, Response, WorkerStats};
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
use gyre_planner::{
    DistributedPlan, GyreOptions, network_operator_rules, place_runtime_filters, split_into_stages,
};
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
    /// At most this many queries run at once; later ones wait their turn (None: no limit).
    pub max_concurrent_queries: Option<usize>,
    /// The local files statements may read and write (`--data-root`).
    pub local_files: LocalFiles,
    /// The transactional tables: where they are kept, how they are logged.
    pub primary: PrimaryConfig,
    /// The shared memory of the nodes of this process (`gyre local`): queries
    /// may exchange over it (`gyre.shuffle_design`).
    pub host_shuffle: Option<Arc<crate::host_shuffle::HostShuffle>>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50050".parse().unwrap(),
            data_listen: "127.0.0.1:0".parse().unwrap(),
            transport: TransportConfig::default(),
            heartbeat_timeout: Duration::from_secs(3),
            max_concurrent_queries: None,
            local_files: LocalFiles::Anywhere,
            primary: PrimaryConfig::default(),
            host_shuffle: None,
        }
    }
}

#[derive(Debug)]
struct Member {
    control: ControlClient,
    data_addr: SocketAddr,
    /// Drawn at registration: a heartbeat that does not carry it comes from a worker
    /// registered with an earlier coordinator under the same id.
    incarnation: u64,
    alive: bool,
    last_seen: Instant,
    death: Option<String>,
    /// The host shuffle it registered with.
    host_shuffle: Option<String>,
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
    /// Its side of the process's shared-memory exchanges, if any.
    pub(crate) shuffle: Option<crate::host_shuffle::NodeShuffle>,
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
    /// Workers a starting cluster waits for before it runs statements (0: none, or
    /// started): see [`Coordinator::expect_workers`].
    expected_workers: std::sync::atomic::AtomicUsize,
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
    /// Turns to run a query when `max_concurrent_queries` is set.
    query_slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Counts worker deaths, so that calls waiting on a worker learn of its death.
    deaths: tokio::sync::watch::Sender<u64>,
    /// The row store of the transactional tables, with its log.
    primary: Arc<gyre_replica::Database>,
    /// The log as the workers (the secondaries) receive it.
    log_feed: Arc<crate::log_feed::LogFeed>,
    /// When the last periodic snapshot was considered.
    last_periodic_mark: Mutex<Instant>,
    /// Open transactions, by session id.
    transactions: Mutex<HashMap<String, primary::SessionTxn>>,
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

impl Coordinator {
    /// Turns to run a query, when their number is limited.
    pub(crate) fn query_slots(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        self.query_slots.clone()
    }

    /// The key control messages to and from the workers are signed with.
    pub fn node_key(&self) -> crate::auth::NodeKey {
        crate::auth::NodeKey::from_secret(&self.config.transport.secret)
    }

    /// Starts the coordinator's data transport and membership monitor. The Flight SQL
    /// service is started separately with [`crate::flight_sql::serve`].
    pub async fn start(config: CoordinatorConfig) -> Result<Arc<Self>> {
        let primary = config.primary.open()?;
        Self::start_with(config, primary).await
    }

    /// [`Coordinator::start`] on a row store already open: a standby coordinator that
    /// was elected primary brings the one it kept up to date ([`crate::failover`]).
    pub async fn start_with(
        config: CoordinatorConfig,
        primary: Arc<gyre_replica::Database>,
    ) -> Result<Arc<Self>> {
        let transport =
            TcpTransport::bind(COORDINATOR, config.data_listen, config.transport.clone()).await?;
        let multicast = config.primary.log_multicast.map(|g| {
            let key = crate::log_feed::LogKey::from_secret(&config.transport.secret);
            (g, key)
        });
        let log_feed = crate::log_feed::LogFeed::attach(Arc::clone(&primary), multicast)?;
        let ctx = coordinator_context();
        config.local_files.confine(&ctx.runtime_env());
        let default_session = session_of(&ctx);
        let shuffle = match &config.host_shuffle {
            Some(h) => Some(h.node(COORDINATOR)?),
            None => None,
        };
        let coordinator = Arc::new(Self {
            transport,
            shuffle,
            ctx,
            default_session,
            members: RwLock::new(BTreeMap::new()),
            tables: RwLock::new(BTreeMap::new()),
            part_stats: Mutex::new(HashMap::new()),
            next_node: AtomicU32::new(1),
            next_query: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            expected_workers: std::sync::atomic::AtomicUsize::new(0),
            running: Mutex::new(HashMap::new()),
            creating: Arc::new(Mutex::new(std::collections::HashSet::new())),
            modifying: tokio::sync::Mutex::new(()),
            file_tables: RwLock::new(HashMap::new()),
            streams: RwLock::new(HashSet::new()),
            query_slots: config
                .max_concurrent_queries
                .map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1)))),
            deaths: tokio::sync::watch::Sender::new(0),
            primary,
            log_feed,
            last_periodic_mark: Mutex::new(Instant::now()),
            transactions: Mutex::new(HashMap::new()),
            config,
        });
        coordinator.register_primary_tables()?;
        let weak = Arc::downgrade(&coordinator);
        for table in crate::system_tables::all(&weak) {
            for ctx in [&coordinator.ctx, &coordinator.default_session] {
                ctx.register_udtf(table.name, Arc::clone(&table) as _);
            }
        }
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
                c.roll_back_idle_transactions();
                c.checkpoint_if_due();
                c.mark_snapshot_if_due();
                last = now;
            }
        });
        tokio::spawn(Arc::clone(&coordinator).reload_file_tables());
        Ok(coordinator)
    }

    /// Stops the coordinator's data plane; workers that disconnect afterwards are
    /// not reported as failed.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.transport.shutdown();
    }

    /// A new client session: the shared catalog with the default settings. Its `SET`s,
    /// prepared statements and `SHOW`s are its own.
    pub fn new_session(&self) -> SessionContext {
        session_of(&self.ctx)
    }

    /// The session [`Coordinator::sql`] runs in.
    pub fn default_session(&self) -> &SessionContext {
        &self.default_session
    }

    /// Registers the object store that serves `url` for planning on the coordinator (the
    /// workers need their own: `Worker::register_object_store`).
    pub fn register_object_store(&self, url: &url::Url, store: Arc<dyn object_store::ObjectStore>) {
        self.ctx.runtime_env().register_object_store(url, store);
    }
}

/// A session over `ctx`'s catalog with `ctx`'s settings, and an id of its own (its
/// transaction, if it opens one, is found by it).
fn session_of(ctx: &SessionContext) -> SessionContext {
    let state = datafusion::execution::SessionStateBuilder::new_from_existing(ctx.state())
        .with_session_id(format!("{:032x}", rand::random::<u128>()))
        .build();
    SessionContext::new_with_state(state)
}

/// A query id with the coordinator's task context and the channel on which any
/// node's failure of the query is reported.
pub(crate) struct RegisteredQuery {
    pub id: u64,
    /// How its exchanges move data (`gyre.shuffle_design`, resolved).
    pub design: gyre_transport::design::Design,
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

/// Per worker, per stage id: the stage plan rendered with that worker's metrics.
pub type StageReports = BTreeMap<NodeId, Vec<(usize, String)>>;

/// What [`Coordinator::execute`] returns.
#[derive(Debug)]
pub struct QueryRun {
    pub batches: Vec<RecordBatch>,
    /// With `analyze`: every stage with each worker's metrics.
    pub report: String,
    /// Where the query's time went on the coordinator.
    pub phases: QueryPhases,
}

/// The wall-clock phases of a distributed query as the coordinator sees them: what a
/// small query pays that single-node DataFusion does not (starting stages on the
/// workers, ending them) next to the running itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryPhases {
    /// Registering the query, encoding the workers' stages and their `StartQuery`
    /// round trip, starting the coordinator's stages.
    pub start: Duration,
    /// From the start until the final stage's last batch.
    pub run: Duration,
    /// Ending the query on the workers (`FinishQuery` round trip), when waited for.
    pub finish: Duration,
}

impl QueryPhases {
    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    /// One line for `EXPLAIN ANALYZE`: `planned` is the time from SQL to the
    /// distributed plan.
    pub fn describe(&self, planned: Duration) -> String {
        format!(
            "coordinator: planned in {:.3} ms, started stages in {:.3} ms, ran {:.3} ms, \
             ended on the workers in {:.3} ms",
            Self::ms(planned),
            Self::ms(self.start),
            Self::ms(self.run),
            Self::ms(self.finish)
        )
    }
}
