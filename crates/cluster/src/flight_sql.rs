//! The coordinator's front door: Arrow Flight SQL for clients (ADBC, JDBC,
//! `gyre sql`), and the control actions workers use to join and report.

use crate::auth::{Clients, Gate, TlsIdentity, Users};
use crate::client_sessions::{CallSession, ClientSessions};
use crate::coordinator::{Coordinator, Outcome, StatementResult};
use crate::progress::{ProgressReport, STATEMENT, StatementProgress};
use crate::protocol::{ACTION, Request, decode, encode};
use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, CommandGetSqlInfo, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementQuery, CommandStatementUpdate, ProstMessageExt,
    SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc,
    Ticket,
};
use datafusion::common::DataFusionError;
use futures::StreamExt;
use parking_lot::Mutex;
use prost::Message;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tonic::{Request as TonicRequest, Response as TonicResponse, Status};

/// Flight SQL service of a coordinator.
pub struct GyreFlightSql {
    coordinator: Arc<Coordinator>,
    /// Results waiting for their `DoGet`: finished ones, and queries planned to stream.
    results: Mutex<HashMap<String, (Instant, Outcome)>>,
    prepared: Mutex<HashMap<String, String>>,
    /// Each client's settings and prepared statements.
    sessions: ClientSessions,
    /// Progress of statements whose client sent a [`PROGRESS_HEADER`], by its value.
    progress: Mutex<HashMap<String, Weak<StatementProgress>>>,
    sql_info: SqlInfoData,
}

/// A client that wants to follow a statement's progress sends this header (a random
/// tag of its choosing) with the statement's calls, and asks [`PROGRESS_ACTION`] with
/// the tag as body while they run.
pub const PROGRESS_HEADER: &str = "x-gyre-progress";

/// Where a failed statement's error happened ("stage 0 on worker 1"), sent beside the
/// error's own text.
pub const ERROR_PLACE_HEADER: &str = "x-gyre-error-at";

/// The Flight action that answers a statement's progress (a JSON `ProgressReport`).
pub const PROGRESS_ACTION: &str = "gyre.progress";

/// Flight's action that ends the caller's session (its `CloseSessionRequest` is empty).
pub const CLOSE_SESSION_ACTION: &str = "CloseSession";

/// `response`, telling a client that just started a session its cookie.
fn with_cookie<T>(mut response: TonicResponse<T>, session: &CallSession) -> TonicResponse<T> {
    if let Some(cookie) = &session.new_cookie
        && let Ok(value) = cookie.parse()
    {
        response.metadata_mut().insert("set-cookie", value);
    }
    response
}

fn status(e: DataFusionError) -> Status {
    match e {
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::Configuration(_) => Status::invalid_argument(e.to_string()),
        DataFusionError::External(ref inner)
            if inner.is::<crate::execution::StatementTimedOut>() =>
        {
            Status::deadline_exceeded(inner.to_string())
        }
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(e.to_string()),
        e => {
            let mut status = Status::internal(gyre_exchange::error_text(&e));
            if let Some(place) = gyre_exchange::error_place(&e)
                && let Ok(value) = place.parse()
            {
                status.metadata_mut().insert(ERROR_PLACE_HEADER, value);
            }
            status
        }
    }
}

/// A Flight data message holds at most about this many bytes of a batch.
const FLIGHT_MESSAGE_BYTES: usize = 2 << 20;

/// A result as Flight data: the schema, then each batch (in slices of at most about
/// [`FLIGHT_MESSAGE_BYTES`]) after the dictionaries it uses. Every type travels as it
/// is: arrow-flight's own encoder sends dictionaries as their values and a LargeList
/// as a List in the schema, so a client would get other types than the schema
/// `GetFlightInfo` announced (or misread 64-bit list offsets).
fn flight_data(
    schema: SchemaRef,
    batches: futures::stream::BoxStream<'static, datafusion::common::Result<RecordBatch>>,
) -> <GyreFlightSql as FlightService>::DoGetStream {
    struct State {
        batches: futures::stream::BoxStream<'static, datafusion::common::Result<RecordBatch>>,
        tracker: DictionaryTracker,
        compression: IpcWriteContext,
        pending: std::collections::VecDeque<FlightData>,
        done: bool,
    }
    let options = IpcWriteOptions::default();
    let mut tracker = DictionaryTracker::new(false);
    let schema_message: FlightData = IpcDataGenerator::default()
        .schema_to_bytes_with_dictionary_tracker(&schema, &mut tracker, &options)
        .into();
    let state = State {
        batches,
        tracker,
        compression: IpcWriteContext::default(),
        pending: std::iter::once(schema_message).collect(),
        done: false,
    };
    let stream = futures::stream::unfold(state, move |mut st| {
        let options = options.clone();
        async move {
            loop {
                if let Some(m) = st.pending.pop_front() {
                    return Some((Ok(m), st));
                }
                if st.done {
                    return None;
                }
                match st.batches.next().await {
                    None => return None,
                    Some(Err(e)) => {
                        st.done = true;
                        return Some((Err(status(e)), st));
                    }
                    Some(Ok(batch)) => {
                        let rows = batch.num_rows();
                        let bytes = batch.get_array_memory_size().max(1);
                        let per_slice = (rows * FLIGHT_MESSAGE_BYTES / bytes).clamp(1, rows.max(1));
                        let mut at = 0;
                        while at < rows || (rows == 0 && at == 0) {
                            let len = per_slice.min(rows - at);
                            let slice = batch.slice(at, len);
                            match IpcDataGenerator::default().encode(
                                &slice,
                                &mut st.tracker,
                                &options,
                                &mut st.compression,
                            ) {
                                Ok((dictionaries, data)) => {
                                    st.pending.extend(dictionaries.into_iter().map(Into::into));
                                    st.pending.push_back(data.into());
                                }
                                Err(e) => {
                                    st.done = true;
                                    st.pending.clear();
                                    return Some((Err(Status::internal(e.to_string())), st));
                                }
                            }
                            if rows == 0 {
                                break;
                            }
                            at += len;
                        }
                    }
                }
            }
        }
    });
    Box::pin(stream)
}

/// How long a result waits for its `DoGet` before it is dropped.
const UNFETCHED_RESULT_TTL: Duration = Duration::from_secs(600);

fn new_handle() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl GyreFlightSql {
    pub fn new(coordinator: Arc<Coordinator>) -> Self {
        let mut info = SqlInfoDataBuilder::new();
        info.append(SqlInfo::FlightSqlServerName, "Gyre");
        info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        info.append(SqlInfo::FlightSqlServerArrowVersion, "59");
        info.append(SqlInfo::FlightSqlServerReadOnly, false);
        Self {
            coordinator,
            results: Mutex::new(HashMap::new()),
            prepared: Mutex::new(HashMap::new()),
            sessions: ClientSessions::default(),
            progress: Mutex::new(HashMap::new()),
            sql_info: info.build().expect("valid sql info"),
        }
    }

    /// The session a call belongs to ([`crate::client_sessions`]).
    fn session_of<T>(&self, request: &TonicRequest<T>) -> CallSession {
        self.sessions
            .of(request.metadata(), request.remote_addr(), || {
                self.coordinator.new_session()
            })
    }

    /// The progress record of the statement a call belongs to, if its client follows it.
    fn progress_of(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Option<Arc<StatementProgress>> {
        let tag = metadata.get(PROGRESS_HEADER)?.to_str().ok()?.to_string();
        let mut all = self.progress.lock();
        all.retain(|_, p| p.strong_count() > 0);
        if let Some(p) = all.get(&tag).and_then(Weak::upgrade) {
            return Some(p);
        }
        let p = Arc::new(StatementProgress::default());
        all.insert(tag, Arc::downgrade(&p));
        Some(p)
    }

    /// Runs `sql` and keeps the last statement's outcome for a following `DoGet`. A query is
    /// only planned here; it runs while the client reads it, so its rows stream through.
    async fn run_and_store(
        &self,
        descriptor: FlightDescriptor,
        session: &CallSession,
        sql: &str,
        progress: Option<Arc<StatementProgress>>,
    ) -> Result<TonicResponse<FlightInfo>, Status> {
        let run = self.coordinator.sql_deferred(&session.session, sql);
        let outcome = match progress {
            Some(p) => STATEMENT.scope(p, run).await,
            None => run.await,
        }
        .map_err(status)?;
        let (schema, rows) = match &outcome {
            Outcome::Done(r) => (
                Arc::clone(&r.schema),
                r.batches.iter().map(|b| b.num_rows() as i64).sum(),
            ),
            Outcome::Deferred(q) => (q.schema(), -1),
        };
        let handle = new_handle();
        let ticket = TicketStatementQuery {
            statement_handle: handle.clone().into(),
        };
        // The call's own descriptor goes back in the answer: the Flight SQL JDBC driver
        // cannot read a FlightInfo without one.
        let info = FlightInfo::new()
            .with_descriptor(descriptor)
            .try_with_schema(&schema)
            .map_err(|e| Status::internal(e.to_string()))?
            .with_endpoint(
                FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec())),
            )
            .with_total_records(rows);
        let mut results = self.results.lock();
        // A client that never fetched its result must not hold it forever.
        results.retain(|_, (at, _)| at.elapsed() < UNFETCHED_RESULT_TTL);
        results.insert(handle, (Instant::now(), outcome));
        Ok(with_cookie(TonicResponse::new(info), session))
    }

    async fn run_update(
        &self,
        session: &CallSession,
        sql: &str,
        progress: Option<Arc<StatementProgress>>,
    ) -> Result<i64, Status> {
        let session = &session.session;
        let results = match progress {
            Some(p) => self.coordinator.sql_with_progress(session, sql, p).await,
            None => self.coordinator.sql_in(session, sql).await,
        }
        .map_err(status)?;
        let count = results
            .last()
            .and_then(|r| r.batches.first())
            .filter(|b| b.schema().field(0).name() == "count")
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::UInt64Array>()
                    .map(|a| a.value(0) as i64)
            })
            .unwrap_or(0);
        Ok(count)
    }

    fn stream_batches(&self, result: StatementResult) -> <Self as FlightService>::DoGetStream {
        flight_data(
            result.schema,
            futures::stream::iter(result.batches.into_iter().map(Ok)).boxed(),
        )
    }
}

#[tonic::async_trait]
impl FlightSqlService for GyreFlightSql {
    type FlightService = GyreFlightSql;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: TonicRequest<FlightDescriptor>,
    ) -> Result<TonicResponse<FlightInfo>, Status> {
        let progress = self.progress_of(request.metadata());
        let session = self.session_of(&request);
        let descriptor = request.get_ref().clone();
        self.run_and_store(descriptor, &session, &query.query, progress)
            .await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: TonicRequest<Ticket>,
    ) -> Result<TonicResponse<<Self as FlightService>::DoGetStream>, Status> {
        let progress = self.progress_of(request.metadata());
        let handle = String::from_utf8_lossy(&ticket.statement_handle).into_owned();
        let (_, outcome) = self
            .results
            .lock()
            .remove(&handle)
            .ok_or_else(|| Status::not_found(format!("no result for statement {handle}")))?;
        match outcome {
            Outcome::Done(result) => Ok(TonicResponse::new(self.stream_batches(result))),
            Outcome::Deferred(query) => {
                let schema = query.schema();
                let start = query.execute(&self.coordinator);
                let batches = match &progress {
                    Some(p) => STATEMENT.scope(Arc::clone(p), start).await,
                    None => start.await,
                }
                .map_err(status)?;
                // The record lives as long as the result streams.
                let batches = batches.map(move |b| {
                    let _ = &progress;
                    b
                });
                Ok(TonicResponse::new(flight_data(schema, batches.boxed())))
            }
        }
    }

    async fn do_put_statement_update(
        &self,
        ticket: CommandStatementUpdate,
        request: TonicRequest<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let progress = self.progress_of(request.metadata());
        let session = self.session_of(&request);
        self.run_update(&session, &ticket.query, progress).await
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: TonicRequest<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let handle = new_handle();
        let session = self.session_of(&request);
        // Report the result schema where planning can tell it without running anything.
        let schema = match self
            .coordinator
            .result_schema(&session.session, &query.query)
            .await
        {
            Ok(s) => s,
            Err(_) => Arc::new(Schema::empty()),
        };
        let options = IpcWriteOptions::default();
        let message = SchemaAsIpc::new(&schema, &options);
        let IpcMessage(schema_bytes) = message
            .try_into()
            .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
        self.prepared.lock().insert(handle.clone(), query.query);
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema: schema_bytes,
            parameter_schema: Default::default(),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        _request: TonicRequest<Action>,
    ) -> Result<(), Status> {
        let handle = String::from_utf8_lossy(&query.prepared_statement_handle).into_owned();
        self.prepared.lock().remove(&handle);
        Ok(())
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: TonicRequest<FlightDescriptor>,
    ) -> Result<TonicResponse<FlightInfo>, Status> {
        let progress = self.progress_of(request.metadata());
        let handle = String::from_utf8_lossy(&cmd.prepared_statement_handle).into_owned();
        let sql = self
            .prepared
            .lock()
            .get(&handle)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no prepared statement {handle}")))?;
        let session = self.session_of(&request);
        let descriptor = request.get_ref().clone();
        self.run_and_store(descriptor, &session, &sql, progress)
            .await
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: TonicRequest<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let progress = self.progress_of(request.metadata());
        let handle = String::from_utf8_lossy(&query.prepared_statement_handle).into_owned();
        let sql = self
            .prepared
            .lock()
            .get(&handle)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no prepared statement {handle}")))?;
        let session = self.session_of(&request);
        self.run_update(&session, &sql, progress).await
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: TonicRequest<FlightDescriptor>,
    ) -> Result<TonicResponse<FlightInfo>, Status> {
        let info = FlightInfo::new()
            .with_descriptor(request.into_inner())
            .try_with_schema(&self.sql_info.schema())
            .map_err(|e| Status::internal(e.to_string()))?
            .with_endpoint(
                FlightEndpoint::new().with_ticket(Ticket::new(query.as_any().encode_to_vec())),
            );
        Ok(TonicResponse::new(info))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: TonicRequest<Ticket>,
    ) -> Result<TonicResponse<<Self as FlightService>::DoGetStream>, Status> {
        let batch = self
            .sql_info
            .record_batch(query.info)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(TonicResponse::new(self.stream_batches(StatementResult {
            schema: batch.schema(),
            batches: vec![batch],
        })))
    }

    async fn do_action_fallback(
        &self,
        request: TonicRequest<Action>,
    ) -> Result<TonicResponse<<Self as FlightService>::DoActionStream>, Status> {
        if request.get_ref().r#type == CLOSE_SESSION_ACTION {
            let closed = self
                .sessions
                .close(request.metadata(), request.remote_addr());
            // CloseSessionResult { status }: CLOSED (1), or NOT_CLOSEABLE (3) without one.
            let status: u8 = if closed { 1 } else { 3 };
            let result = arrow_flight::Result {
                body: vec![0x08, status].into(),
            };
            return Ok(TonicResponse::new(
                futures::stream::iter([Ok(result)]).boxed(),
            ));
        }
        let action = request.into_inner();
        if action.r#type == PROGRESS_ACTION {
            let tag = String::from_utf8_lossy(&action.body).into_owned();
            let progress = self.progress.lock().get(&tag).and_then(Weak::upgrade);
            let report = match progress {
                Some(p) => {
                    self.coordinator.poll_progress(&p).await;
                    p.report()
                }
                None => ProgressReport::default(),
            };
            let body = serde_json::to_vec(&report).map_err(|e| Status::internal(e.to_string()))?;
            let result = arrow_flight::Result { body: body.into() };
            return Ok(TonicResponse::new(
                futures::stream::iter([Ok(result)]).boxed(),
            ));
        }
        if action.r#type != ACTION {
            return Err(Status::invalid_argument(format!(
                "unknown action '{}'",
                action.r#type
            )));
        }
        let req: Request = decode(&action.body).map_err(status)?;
        if let Request::SubscribeLog { node, multicast } = req {
            let coordinator = Arc::downgrade(&self.coordinator);
            let workers = Box::new(move || coordinator.upgrade().and_then(|c| c.settled_workers()));
            let feed = self
                .coordinator
                .log_feed()
                .subscribe(node, multicast, workers)
                .map(|m| {
                    m.map(|body| arrow_flight::Result { body: body.into() })
                        .map_err(status)
                });
            return Ok(TonicResponse::new(feed.boxed()));
        }
        let resp = self.coordinator.handle_control(req).await.map_err(status)?;
        let result = arrow_flight::Result {
            body: encode(&resp).into(),
        };
        Ok(TonicResponse::new(
            futures::stream::iter([Ok(result)]).boxed(),
        ))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// How the coordinator's Flight SQL port admits clients ([`crate::auth`]).
#[derive(Debug, Clone, Default)]
pub struct FrontDoor {
    /// Users who may log in; without them, anyone who reaches the port may run SQL.
    pub users: Option<Arc<Users>>,
    /// The certificate and key to serve TLS with; without them, plain gRPC.
    pub tls: Option<TlsIdentity>,
}

/// Serves Flight SQL and worker control on `listener` until the process ends. Control
/// messages must be signed with the cluster secret; clients must log in when
/// `front.users` is set.
pub fn serve(
    coordinator: Arc<Coordinator>,
    listener: tokio::net::TcpListener,
    front: &FrontDoor,
) -> Result<SocketAddr, DataFusionError> {
    serve_until(coordinator, listener, front, std::future::pending())
}

/// [`serve`] until `stop` completes: the listener closes, and connections end once
/// their calls have (a coordinator that stops being the primary).
pub fn serve_until(
    coordinator: Arc<Coordinator>,
    listener: tokio::net::TcpListener,
    front: &FrontDoor,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, DataFusionError> {
    let clients = match &front.users {
        Some(users) => Clients::Users(Arc::clone(users)),
        None => Clients::Open,
    };
    serve_gated(coordinator, listener, clients, front.tls.as_ref(), stop)
}

/// Serves only the control messages of workers on `listener` (an embedded cluster's
/// workers register there when its client port speaks TLS).
pub fn serve_control(
    coordinator: Arc<Coordinator>,
    listener: tokio::net::TcpListener,
) -> Result<SocketAddr, DataFusionError> {
    serve_gated(
        coordinator,
        listener,
        Clients::NodesOnly,
        None,
        std::future::pending(),
    )
}

use crate::protocol::MAX_CLIENT_MESSAGE;

fn serve_gated(
    coordinator: Arc<Coordinator>,
    listener: tokio::net::TcpListener,
    clients: Clients,
    tls: Option<&TlsIdentity>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, DataFusionError> {
    let addr = listener.local_addr()?;
    let key = coordinator.node_key();
    let gate = Gate::new(
        GyreFlightSql::new(coordinator),
        clients,
        key,
        gyre_transport::COORDINATOR,
    );
    let standings = crate::protocol::Standings::default();
    let service = gate.header_check().around(
        FlightServiceServer::new(gate)
            .max_decoding_message_size(MAX_CLIENT_MESSAGE)
            .max_encoding_message_size(MAX_CLIENT_MESSAGE),
        standings.clone(),
    );
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls.server_config()).map_err(|e| {
            DataFusionError::Configuration(format!("bad TLS certificate or key: {e}"))
        })?;
    }
    let incoming = crate::protocol::incoming_nodelay(listener, standings);
    tokio::spawn(async move {
        if let Err(e) = server
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stop)
            .await
        {
            tracing::error!("Flight SQL service stopped: {e}");
        }
    });
    Ok(addr)
}
