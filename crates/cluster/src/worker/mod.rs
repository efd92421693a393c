//! A worker: holds its partition of every table and runs the stage plans the
//! coordinator sends it.

mod bench;
pub mod secondary;

use crate::auth::{Clients, Gate, NodeKey};
use crate::codec::GyreCodec;
use crate::files::LocalFiles;
use crate::progress::ReadCounters;
use crate::protocol::{ACTION, ControlClient, Request, Response, WorkerStats, decode, encode};
use crate::session::worker_session;
use crate::storage::WorkerStorage;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use futures::FutureExt;
use futures::stream::BoxStream;
use gyre_exchange::QueryContext;
use gyre_transport::{NodeId, TcpTransport, Transport, TransportConfig, node_name};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::{Request as TonicRequest, Response as TonicResponse, Status, Streaming};

/// How a worker is started.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The coordinator's control address, or the addresses of the coordinators that
    /// vote on the primary, comma-separated: the worker joins whichever is the primary.
    pub coordinator: String,
    /// Control (Flight) listen address.
    pub listen: SocketAddr,
    /// Data listen address; port 0 picks a free one.
    pub data_listen: SocketAddr,
    /// Host name or IP other nodes use to reach this worker.
    pub advertise_host: Option<String>,
    pub transport: TransportConfig,
    /// The CA (PEM) the coordinator's TLS certificate chains to, when it serves TLS.
    pub coordinator_ca: Option<Vec<u8>>,
    /// Bytes the worker's queries may hold in operator state (None: no limit).
    pub memory_limit: Option<usize>,
    /// The local files the worker's plans may read and write (`--data-root`).
    pub local_files: LocalFiles,
    /// The stored procedures the primary's logical log names: the worker replays
    /// them as a secondary.
    pub procedures: gyre_replica::Procedures,
    /// The multicast group the primary's log comes on (the coordinator's
    /// `PrimaryConfig::log_multicast`); without it, the log comes on a stream.
    pub log_multicast: Option<gyre_replica::ship::Group>,
    /// The shared memory of the nodes of this process (`gyre local`): queries
    /// may exchange over it (`gyre.shuffle_design`).
    pub host_shuffle: Option<Arc<crate::host_shuffle::HostShuffle>>,
}

impl WorkerConfig {
    /// The coordinators' addresses, in the order given.
    fn coordinators(&self) -> Vec<&str> {
        self.coordinator
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect()
    }

    /// A new connection to the control service of the coordinator at `addr`.
    fn dial(&self, addr: &str) -> Result<ControlClient> {
        ControlClient::connect_lazy_tls(
            addr,
            NodeKey::from_secret(&self.transport.secret),
            gyre_transport::COORDINATOR,
            self.coordinator_ca.as_deref(),
        )
    }
}

/// The text of a caught panic.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".to_string())
}

/// Serves the worker's control calls on a thread of their own, so that they are answered
/// at once while the worker's threads compute (a stage that never waits would
/// otherwise hold them back: a progress question, a query's end, a cancellation).
fn spawn_control_service(
    worker: Arc<Worker>,
    listener: std::net::TcpListener,
    key: NodeKey,
) -> Result<()> {
    let name = format!("gyre-control-{}", worker.node);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("worker control runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("worker control listener: {e}");
                        return;
                    }
                };
                let mut stop = worker.stopped.subscribe();
                // Only signed control messages pass: clients never talk to workers.
                let service = WorkerService(Arc::downgrade(&worker));
                let gate = Gate::new(service, Clients::NodesOnly, key, worker.node);
                let standings = crate::protocol::Standings::default();
                let service = gate.header_check().around(
                    FlightServiceServer::new(gate)
                        .max_decoding_message_size(crate::protocol::MAX_CONTROL_MESSAGE)
                        .max_encoding_message_size(crate::protocol::MAX_CONTROL_MESSAGE),
                    standings.clone(),
                );
                let incoming = crate::protocol::incoming_nodelay(listener, standings);
                drop(worker);
                // Ends at `Worker::shutdown`, or when the worker is dropped (the sender goes).
                let gone = async move {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                };
                if let Err(e) = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, gone)
                    .await
                {
                    tracing::error!("worker control service stopped: {e}");
                }
            });
        })
        .map_err(|e| DataFusionError::Execution(format!("cannot start the control thread: {e}")))?;
    Ok(())
}

/// Puts a yield point above every DataFusion join of a stage. A join can compute for
/// seconds per input batch (a nested-loop join's probe batch against every build row)
/// and the operators above it poll it in a loop, so the budget its scans consume is
/// not enough: without a yield on its output, a canceled query (statement timeout,
/// client gone) would keep the worker's threads until the join ran out.
fn yield_above_joins(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    use datafusion::physical_plan::coop::CooperativeExec;
    use datafusion::physical_plan::replace_children_if_necessary;
    const JOINS: [&str; 6] = [
        "NestedLoopJoinExec",
        "RadixJoinExec",
        "CrossJoinExec",
        "HashJoinExec",
        "SortMergeJoinExec",
        "SymmetricHashJoinExec",
    ];
    let is_join = |n: &Arc<dyn ExecutionPlan>| JOINS.contains(&n.name());
    let yielding = |n: &Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
        if is_join(n) {
            Arc::new(CooperativeExec::new(Arc::clone(n)))
        } else {
            Arc::clone(n)
        }
    };
    let plan = plan
        .transform_up(|node| {
            // A Flow-Join, Neo-Join or radix join drives the hash join it wraps itself.
            let wraps_join =
                ["FlowJoinExec", "NeoJoinExec", "RadixJoinExec"].contains(&node.name());
            if wraps_join || !node.children().into_iter().any(is_join) {
                return Ok(Transformed::no(node));
            }
            let children = node.children().into_iter().map(yielding).collect();
            Ok(Transformed::yes(replace_children_if_necessary(
                node, children,
            )?))
        })?
        .data;
    Ok(yielding(&plan))
}

struct RunningQuery {
    tasks: Vec<JoinHandle<()>>,
    plans: Vec<(usize, Arc<dyn ExecutionPlan>)>,
    /// What the query's scans read here.
    read: Arc<ReadCounters>,
}

/// A running worker.
pub struct Worker {
    pub node: NodeId,
    pub transport: TcpTransport,
    /// Its side of the process's shared-memory exchanges, if any.
    shuffle: Option<crate::host_shuffle::NodeShuffle>,
    pub storage: Arc<WorkerStorage>,
    /// Its replica of the transactional tables.
    pub secondary: Arc<secondary::WorkerSecondary>,
    state: SessionState,
    /// The local files its plans may touch: decoded plans are checked against it.
    local_files: LocalFiles,
    coordinator: ControlClient,
    queries: Mutex<HashMap<u64, RunningQuery>>,
    /// The runtime that runs stages and benchmarks (control calls are served apart).
    runtime: tokio::runtime::Handle,
    /// Set by [`Worker::shutdown`]: the control service stops.
    stopped: tokio::sync::watch::Sender<bool>,
    /// Why the coordinator no longer counts this worker in, once it said so.
    forgotten: tokio::sync::watch::Sender<Option<String>>,
    control_addr: SocketAddr,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("node", &self.node).finish()
    }
}

fn status(e: DataFusionError) -> Status {
    Status::internal(e.to_string())
}

impl Worker {
    /// Binds the worker's listeners, registers with the coordinator and serves until the
    /// process ends. Returns once the worker is registered.
    pub async fn start(config: WorkerConfig) -> Result<Arc<Self>> {
        let control = std::net::TcpListener::bind(config.listen)?;
        control.set_nonblocking(true)?;
        let control_addr = control.local_addr()?;
        let data = TcpListener::bind(config.data_listen).await?;
        let data_addr = data.local_addr()?;
        let host = config
            .advertise_host
            .clone()
            .unwrap_or_else(|| match control_addr.ip() {
                ip if ip.is_unspecified() => "127.0.0.1".to_string(),
                ip => ip.to_string(),
            });
        let coordinators = config
            .coordinators()
            .into_iter()
            .map(|addr| config.dial(addr))
            .collect::<Result<Vec<_>>>()?;
        if coordinators.is_empty() {
            return Err(DataFusionError::Configuration(
                "no coordinator address given".into(),
            ));
        }
        let register = Request::Register {
            control_addr: format!("{host}:{}", control_addr.port()),
            data_addr: format!("{host}:{}", data_addr.port()),
            host_shuffle: config.host_shuffle.as_ref().map(|h| h.id().to_string()),
        };
        // A worker may start before its coordinator: keep trying for a while. Of
        // several coordinators, only the primary accepts: the others answer which one
        // is, and the worker tries each in turn.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut attempt = 0;
        let (coordinator, reply) = loop {
            let coordinator = &coordinators[attempt % coordinators.len()];
            attempt += 1;
            match coordinator.call(&register).await {
                Ok(reply) => break (coordinator.clone(), reply),
                // A refusal (wrong secret) stays one: only an unreachable coordinator
                // is worth waiting for.
                Err(e)
                    if tokio::time::Instant::now() < deadline
                        && !matches!(e, DataFusionError::Configuration(_)) =>
                {
                    tracing::debug!("coordinator not reachable yet: {e}");
                    if attempt % coordinators.len() == 0 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                Err(e) => {
                    return Err(DataFusionError::Execution(format!(
                        "cannot register with the coordinator at {}: {e}",
                        config.coordinator
                    )));
                }
            }
        };
        let Response::Registered { node, incarnation } = reply else {
            return Err(DataFusionError::Execution(format!(
                "unexpected registration reply {reply:?}"
            )));
        };
        let transport = TcpTransport::from_listener(node, data, config.transport.clone())?;
        let shuffle = match &config.host_shuffle {
            Some(h) => Some(h.node(node)?),
            None => None,
        };
        let worker = Arc::new(Worker {
            node,
            shuffle,
            transport,
            storage: Arc::new(WorkerStorage::default()),
            secondary: secondary::WorkerSecondary::new(config.procedures.clone()),
            state: worker_session(config.memory_limit, &config.local_files)?,
            local_files: config.local_files.clone(),
            coordinator,
            queries: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::current(),
            stopped: tokio::sync::watch::Sender::new(false),
            forgotten: tokio::sync::watch::Sender::new(None),
            control_addr,
        });
        let key = NodeKey::from_secret(&config.transport.secret);
        spawn_control_service(Arc::clone(&worker), control, key)?;
        worker.secondary.follow(
            worker.coordinator.clone(),
            node,
            config.log_multicast.map(|g| {
                let key = crate::log_feed::LogKey::from_secret(&config.transport.secret);
                (g, key)
            }),
            worker.stopped.subscribe(),
        );
        let registered = worker.coordinator.addr().to_string();
        spawn_heartbeat(Arc::downgrade(&worker), incarnation, config, registered);
        tracing::info!(node, %control_addr, %data_addr, "worker registered");
        Ok(worker)
    }

    /// Stops serving: the control service, the data transport and the stages it runs.
    pub fn shutdown(&self) {
        self.stopped.send_replace(true);
        self.transport.shutdown();
        for (_, q) in self.queries.lock().drain() {
            for t in &q.tasks {
                t.abort();
            }
        }
    }

    /// Waits until the coordinator says it no longer counts this worker in, and says
    /// why: it restarted and forgot its workers, or it declared this one dead. The
    /// transport never takes a lost node back, so such a worker must join afresh
    /// ([`serve`]).
    pub async fn forgotten(&self) -> String {
        let mut forgotten = self.forgotten.subscribe();
        match forgotten.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            // The sender lives as long as the worker: never dropped while borrowed.
            Err(_) => std::future::pending().await,
        }
    }

    /// How many queries have stages on this worker right now.
    pub fn running_queries(&self) -> usize {
        self.queries.lock().len()
    }

    /// The address of this worker's control service.
    pub fn control_addr(&self) -> SocketAddr {
        self.control_addr
    }

    /// Registers the object store that serves `url` (its scheme and authority) for the
    /// plans this worker runs, as DataFusion's `register_object_store` does.
    pub fn register_object_store(&self, url: &url::Url, store: Arc<dyn object_store::ObjectStore>) {
        self.state.runtime_env().register_object_store(url, store);
    }

    fn task_ctx(
        &self,
        qc: QueryContext,
        read: Arc<ReadCounters>,
        execution: &[(String, String)],
    ) -> Result<Arc<TaskContext>> {
        let mut config = self
            .state
            .config()
            .clone()
            .with_extension(Arc::new(qc))
            .with_extension(read)
            .with_extension(Arc::clone(&self.storage))
            .with_extension(Arc::clone(&self.secondary));
        crate::session::apply_execution_options(config.options_mut(), execution)?;
        Ok(crate::session::task_ctx_with(&self.state, config))
    }

    async fn handle(self: &Arc<Self>, req: Request) -> Result<Response> {
        match req {
            Request::SetPeers { peers } => {
                let mut map = HashMap::new();
                for (id, addr) in peers {
                    let addr = tokio::net::lookup_host(&addr)
                        .await?
                        .next()
                        .ok_or_else(|| {
                            DataFusionError::Execution(format!("cannot resolve {addr}"))
                        })?;
                    map.insert(id, addr);
                }
                self.transport.set_peers(&map);
                Ok(Response::Ok)
            }
            Request::CreateTable { name, schema } => {
                let schema = crate::codec::schema_from_bytes(&schema)?;
                self.storage.create_table(&name, schema);
                Ok(Response::Ok)
            }
            Request::DropTable { name } => {
                self.storage.drop_table(&name);
                Ok(Response::Ok)
            }
            Request::RegisterStore { locations, options } => {
                let options = options.into_iter().collect();
                for location in &locations {
                    crate::files::stores::register_store(
                        self.state.runtime_env(),
                        location,
                        &options,
                    )?;
                }
                Ok(Response::Ok)
            }
            Request::Progress { query } => Ok(Response::Progress(
                self.queries.lock().get(&query).map(|q| q.read.snapshot()),
            )),
            Request::Stats => Ok(Response::Stats(self.stats())),
            Request::StartQuery {
                query,
                workers,
                stages,
                compression,
                shuffle_design,
                execution,
            } => {
                let design = match shuffle_design {
                    None => gyre_transport::design::Design::Tcp,
                    Some(d) => d.parse().map_err(DataFusionError::Execution)?,
                };
                self.start_query(query, workers, stages, compression, design, &execution)?;
                Ok(Response::Ok)
            }
            Request::FinishQuery {
                query,
                commit,
                metrics,
            } => Ok(self.finish_query(query, commit, metrics)),
            Request::BenchShuffle(_) | Request::BenchJoin(_) => bench::serve(self, req).await,
            other => Err(DataFusionError::Execution(format!(
                "workers do not handle {other:?}"
            ))),
        }
    }

    /// Bytes its exchanges moved to and from other nodes, over TCP and shared memory.
    pub fn traffic(&self) -> crate::host_shuffle::Traffic {
        crate::host_shuffle::Traffic::of(&self.transport, self.shuffle.as_ref())
    }

    fn stats(&self) -> WorkerStats {
        let transport = self.traffic();
        let (tables, rows, table_bytes) = self.storage.held();
        WorkerStats {
            cpu_seconds: gyre_transport::cpu::process_cpu().map(|d| d.as_secs_f64()),
            bytes_sent: transport.bytes_sent,
            bytes_received: transport.bytes_received,
            tables,
            rows,
            table_bytes,
            queries: self.queries.lock().len() as u64,
            secondary: self.secondary.figures(),
        }
    }

    fn start_query(
        self: &Arc<Self>,
        query: u64,
        workers: Vec<NodeId>,
        stages: Vec<(usize, Vec<u8>)>,
        compression: Option<String>,
        design: gyre_transport::design::Design,
        execution: &[(String, String)],
    ) -> Result<()> {
        let index = workers
            .iter()
            .position(|w| *w == self.node)
            .ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "{} is not part of query {query}",
                    node_name(self.node)
                ))
            })?;
        let qc = QueryContext {
            query_id: query,
            transport: crate::host_shuffle::transport_for(
                design,
                Arc::new(self.transport.clone()),
                self.shuffle.as_ref(),
            )?,
            workers,
            compression: crate::session::parse_compression(compression.as_deref())?,
            runtime_filters: Default::default(),
        };
        let read = Arc::new(ReadCounters::default());
        let ctx = self.task_ctx(qc, Arc::clone(&read), execution)?;
        let codec = GyreCodec;
        let mut plans = Vec::with_capacity(stages.len());
        for (id, bytes) in &stages {
            let plan = codec.decode_plan(bytes, &ctx)?;
            self.local_files.check_plan(&plan)?;
            plans.push((*id, yield_above_joins(plan)?));
        }
        let mut tasks = Vec::with_capacity(plans.len());
        for (id, plan) in &plans {
            let (id, plan, ctx, me) = (*id, Arc::clone(plan), Arc::clone(&ctx), Arc::clone(self));
            tasks.push(self.runtime.spawn(async move {
                let run = async {
                    tracing::debug!(node = me.node, query, stage = id, "stage starts");
                    let done = match plan.execute(index, ctx) {
                        Ok(stream) => datafusion::physical_plan::common::collect(stream)
                            .await
                            .map(|_| ()),
                        Err(e) => Err(e),
                    };
                    if done.is_ok() {
                        tracing::debug!(node = me.node, query, stage = id, "stage done");
                    }
                    done
                };
                // A panic in an operator (a reader's bug on a corrupt file) fails the query
                // like an error, with its message, instead of leaving peers to time out.
                let res = match std::panic::AssertUnwindSafe(run).catch_unwind().await {
                    Ok(res) => res,
                    Err(panic) => Err(DataFusionError::Execution(format!(
                        "a task panicked: {}",
                        panic_message(&panic)
                    ))),
                };
                if let Err(e) = res {
                    tracing::debug!(node = me.node, query, stage = id, "stage failed: {e}");
                    let _ = me
                        .coordinator
                        .call(&Request::QueryFailed {
                            query,
                            node: me.node,
                            error: gyre_exchange::RelayedError::at(
                                &e,
                                &format!("stage {id} on {}", node_name(me.node)),
                            )
                            .wire(),
                        })
                        .await;
                }
            }));
        }
        self.queries
            .lock()
            .insert(query, RunningQuery { tasks, plans, read });
        Ok(())
    }

    fn finish_query(&self, query: u64, commit: bool, metrics: bool) -> Response {
        let running = self.queries.lock().remove(&query);
        self.transport.release_query(query);
        if let Some(s) = &self.shuffle {
            s.release_query(query);
        }
        let mut stages = vec![];
        if let Some(q) = running {
            for t in &q.tasks {
                t.abort();
            }
            if metrics {
                for (id, plan) in &q.plans {
                    let text = DisplayableExecutionPlan::with_metrics(plan.as_ref())
                        .indent(true)
                        .to_string();
                    stages.push((*id, text));
                }
            }
        }
        let tables = self.storage.finish_query(query, commit);
        Response::Finished { stages, tables }
    }
}

/// How long a worker that joins afresh tries to bind its listen addresses again
/// (fixed ports are free once the old worker's listeners closed).
const REBIND_WAIT: Duration = Duration::from_secs(10);

/// How long the old worker's memory may take to go once it stopped: its control
/// thread and aborted stages end, and with them the last references to it.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Runs a worker for as long as the process lives. Each time the coordinator forgets
/// it (a restarted coordinator knows none of its workers; one that declared this
/// worker dead has failed its queries and given up its table parts), the worker drops
/// everything it holds, stages, table parts and replica, and joins again under a new
/// id: the transport never takes a lost node back. A restarted coordinator's
/// transactional tables come back to it through the log feed; the rest of its
/// catalog, like the worker's old memory, is gone. `started` sees each worker
/// started.
pub async fn serve(config: WorkerConfig, mut started: impl FnMut(&Worker)) -> Result<()> {
    let mut worker = Worker::start(config.clone()).await?;
    loop {
        started(&worker);
        let reason = worker.forgotten().await;
        let node = worker.node;
        worker.shutdown();
        let old = Arc::downgrade(&worker);
        drop(worker);
        tracing::info!(node, "joining the cluster afresh: {reason}");
        // The worker was part of a cluster: it waits for its coordinator for as long
        // as it takes (each attempt tries to register for 30 s), but a port someone
        // else took stays taken.
        let deadline = tokio::time::Instant::now() + REBIND_WAIT;
        worker = loop {
            match Worker::start(config.clone()).await {
                Ok(worker) => break worker,
                Err(DataFusionError::IoError(e)) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    if tokio::time::Instant::now() > deadline {
                        return Err(DataFusionError::IoError(e));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    tracing::warn!("joining the cluster again: {e}; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
            while old.strong_count() > 0 {
                if tokio::time::Instant::now() > deadline {
                    tracing::warn!(
                        node,
                        "the forgotten worker's memory is still held {RELEASE_WAIT:?} after it stopped"
                    );
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tracing::info!(node, "the forgotten worker's memory is released");
        });
    }
}

/// How long a worker given several coordinators waits for a silent primary before it
/// looks for the new one (a coordinator declares a worker dead after as long).
const PRIMARY_SILENCE: Duration = Duration::from_secs(3);

/// Heartbeats go from a thread of their own with its own connection, so a worker
/// whose threads are all busy computing is not mistaken for a dead one. They go to the
/// coordinator at `addr`, the one the worker registered with.
fn spawn_heartbeat(
    worker: std::sync::Weak<Worker>,
    incarnation: u64,
    config: WorkerConfig,
    addr: String,
) {
    std::thread::Builder::new()
        .name("gyre-heartbeat".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("heartbeat runtime");
            rt.block_on(async move {
                let Ok(client) = config.dial(&addr) else {
                    return;
                };
                // With several coordinators, a silent primary was replaced (or is
                // about to be): the worker joins the new one. The standbys name it.
                let others: Vec<ControlClient> = config
                    .coordinators()
                    .into_iter()
                    .filter(|a| *a != addr)
                    .filter_map(|a| config.dial(a).ok())
                    .collect();
                let mut answered = std::time::Instant::now();
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let Some(node) = worker.upgrade().map(|w| w.node) else {
                        return;
                    };
                    let heartbeat = Request::Heartbeat { node, incarnation };
                    let reason = match client.call(&heartbeat).await {
                        Ok(Response::Forgotten { reason }) => {
                            format!("the coordinator forgot this worker: {reason}")
                        }
                        Ok(_) => {
                            answered = std::time::Instant::now();
                            continue;
                        }
                        Err(e) if !others.is_empty() => {
                            let silent = answered.elapsed();
                            let mut moved = primary_named(&e.to_string(), &addr);
                            // After a second of silence, ask the others who leads.
                            if moved.is_none() && silent > PRIMARY_SILENCE / 3 {
                                for other in &others {
                                    if let Err(e) = other.call(&heartbeat).await {
                                        moved = primary_named(&e.to_string(), &addr);
                                    }
                                    if moved.is_some() {
                                        break;
                                    }
                                }
                            }
                            match moved {
                                Some(primary) => format!(
                                    "the primary is now the coordinator at {primary}, not {addr}"
                                ),
                                None if silent > PRIMARY_SILENCE => format!(
                                    "the primary at {addr} has not answered for {:.1} s ({e})",
                                    silent.as_secs_f64()
                                ),
                                None => {
                                    tracing::warn!(node, "heartbeat failed: {e}");
                                    continue;
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(node, "heartbeat failed: {e}");
                            continue;
                        }
                    };
                    tracing::info!(node, "{reason}");
                    if let Some(w) = worker.upgrade() {
                        w.forgotten.send_replace(Some(reason));
                    }
                    return;
                }
            });
        })
        .expect("heartbeat thread");
}

/// The primary a standby coordinator's refusal names ("... the primary is at ADDR"),
/// if it is not `current`.
fn primary_named(refusal: &str, current: &str) -> Option<String> {
    let (_, rest) = refusal.split_once("the primary is at ")?;
    let named = rest.split_whitespace().next()?;
    (named != current).then(|| named.to_string())
}

/// The control service holds the worker weakly: a dropped worker stops serving.
struct WorkerService(std::sync::Weak<Worker>);

type Stream<T> = BoxStream<'static, std::result::Result<T, Status>>;

#[tonic::async_trait]
impl FlightService for WorkerService {
    type HandshakeStream = Stream<HandshakeResponse>;
    type ListFlightsStream = Stream<FlightInfo>;
    type DoGetStream = Stream<FlightData>;
    type DoPutStream = Stream<PutResult>;
    type DoExchangeStream = Stream<FlightData>;
    type DoActionStream = Stream<arrow_flight::Result>;
    type ListActionsStream = Stream<ActionType>;

    async fn do_action(
        &self,
        request: TonicRequest<Action>,
    ) -> std::result::Result<TonicResponse<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        if action.r#type != ACTION {
            return Err(Status::invalid_argument(format!(
                "unknown action '{}'",
                action.r#type
            )));
        }
        let req: Request = decode(&action.body).map_err(status)?;
        let worker = self
            .0
            .upgrade()
            .ok_or_else(|| Status::unavailable("the worker is shutting down"))?;
        let resp = worker.handle(req).await.map_err(status)?;
        let result = arrow_flight::Result {
            body: encode(&resp).into(),
        };
        Ok(TonicResponse::new(Box::pin(futures::stream::iter([Ok(
            result,
        )]))))
    }

    async fn handshake(
        &self,
        _: TonicRequest<Streaming<HandshakeRequest>>,
    ) -> std::result::Result<TonicResponse<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn list_flights(
        &self,
        _: TonicRequest<Criteria>,
    ) -> std::result::Result<TonicResponse<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn get_flight_info(
        &self,
        _: TonicRequest<FlightDescriptor>,
    ) -> std::result::Result<TonicResponse<FlightInfo>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn poll_flight_info(
        &self,
        _: TonicRequest<FlightDescriptor>,
    ) -> std::result::Result<TonicResponse<PollInfo>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn get_schema(
        &self,
        _: TonicRequest<FlightDescriptor>,
    ) -> std::result::Result<TonicResponse<SchemaResult>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn do_get(
        &self,
        _: TonicRequest<Ticket>,
    ) -> std::result::Result<TonicResponse<Self::DoGetStream>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn do_put(
        &self,
        _: TonicRequest<Streaming<FlightData>>,
    ) -> std::result::Result<TonicResponse<Self::DoPutStream>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn do_exchange(
        &self,
        _: TonicRequest<Streaming<FlightData>>,
    ) -> std::result::Result<TonicResponse<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("workers only serve control actions"))
    }
    async fn list_actions(
        &self,
        _: TonicRequest<Empty>,
    ) -> std::result::Result<TonicResponse<Self::ListActionsStream>, Status> {
        let t = ActionType {
            r#type: ACTION.to_string(),
            description: "Gyre coordinator-to-worker control".to_string(),
        };
        Ok(TonicResponse::new(Box::pin(futures::stream::iter([Ok(t)]))))
    }
}

#[cfg(test)]
mod tests {
    use super::primary_named;

    #[test]
    fn a_standby_refusal_names_the_primary() {
        let refusal = "127.0.0.1:7: this coordinator is not the primary: the primary is at \
                       127.0.0.1:9";
        assert_eq!(
            primary_named(refusal, "127.0.0.1:8"),
            Some("127.0.0.1:9".into())
        );
        assert_eq!(primary_named(refusal, "127.0.0.1:9"), None);
        assert_eq!(
            primary_named("not the primary, and no primary is elected yet", "a"),
            None
        );
    }
}
