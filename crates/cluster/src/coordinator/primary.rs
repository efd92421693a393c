//! Transactions on the primary: tables created `WITH (replication = 'full')` or
//! `WITH (replication = 'partitioned')` live in the coordinator's row store
//! ([`gyre_replica::Database`]), which runs every transaction on them one at a time and
//! logs the committed ones (ScyPer, Rödiger's thesis, chapter 5). Every worker replays
//! the log: of a full table it keeps every row, of a partitioned one the rows whose key
//! hashes to it.
//!
//! - `BEGIN` takes the primary for the session until `COMMIT` or `ROLLBACK`; another
//!   session's transaction waits for it up to [`LOCK_WAIT`], then fails. A transaction
//!   idle for [`IDLE_IN_TRANSACTION`] is rolled back, so a client that went away
//!   cannot hold the primary.
//! - Outside `BEGIN`, each `INSERT`, `UPDATE`, `DELETE` or `CALL` is a transaction.
//! - `INSERT`, `UPDATE` and `DELETE` run their input as a query on the cluster (the
//!   new rows, the changed rows, the rows to delete), reading the transaction's own
//!   state, then change those rows in the row store.
//! - `CALL name(args)` runs a stored procedure registered in the binary.
//! - A table without a primary key numbers its rows with a hidden row id
//!   ([`gyre_replica::ROW_ID`]): `UPDATE` and `DELETE` read the rows they change with
//!   their current values, and the row store finds distinct rows holding those.
//! - A failed statement rolls its whole transaction back; until `ROLLBACK` (or
//!   `COMMIT`, which then fails) the session's statements are refused, as in
//!   PostgreSQL.
//! - Inside a transaction only reads, `CALL`, `SET` and changes to transactional tables
//!   run: distributed tables are not transactional (yet), and DDL commits on its own.
//!   `BEGIN` inside one is ignored, as in PostgreSQL.
//!
//! A session's transaction is `Open` between statements, `Running` while a statement
//! changes rows in it (the transaction is moved to a blocking thread, off the map), and
//! `Aborted` once a statement failed, was cancelled, or it idled too long.

use super::*;
use crate::primary_table::{PrimarySnapshot, PrimaryTable, replica_err};
use datafusion::common::{Constraint, Constraints};
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, FunctionArg, FunctionArgExpr, FunctionArguments, SqlOption,
    Value as SqlValue,
};
use gyre_planner::options::Replication;
use gyre_replica::{
    Database, LogMode, Placement, Procedures, TableDef, Transaction, Value, columnar,
};
use std::path::PathBuf;

/// How long a statement waits for another session's transaction to end.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A transaction idle this long is rolled back.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(60);

/// A checkpoint is written once the log has grown by this much since the last one, so
/// that a restart replays at most about this much log.
pub const CHECKPOINT_LOG_BYTES: u64 = 64 << 20;

/// How often the primary marks a global snapshot when anything changed.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(1);

/// How the coordinator keeps its transactional tables.
#[derive(Debug, Clone)]
pub struct PrimaryConfig {
    /// Where the log and checkpoints live (`--data-dir`); `None`: in memory only.
    pub data_dir: Option<PathBuf>,
    pub log_mode: LogMode,
    pub group_commit: bool,
    /// The stored procedures `CALL` can run (and the log can replay).
    pub procedures: Procedures,
    /// Multicast the log to the workers on this group (they must join it:
    /// `WorkerConfig::log_multicast`); without it, each worker's stream carries it.
    pub log_multicast: Option<gyre_replica::ship::Group>,
    /// CREATE TABLE ... AS SELECT logs more rows than this many bytes as a load in
    /// pieces of about this size.
    pub load_piece_bytes: usize,
}

impl Default for PrimaryConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            log_mode: LogMode::Logical,
            group_commit: true,
            procedures: Procedures::new(),
            log_multicast: None,
            load_piece_bytes: gyre_replica::database::LOAD_PIECE_BYTES,
        }
    }
}

impl PrimaryConfig {
    pub(super) fn open(&self) -> Result<Arc<Database>> {
        self.open_in(self.data_dir.as_ref().map(|d| d.join("primary")))
    }

    /// A row store in memory, logged as configured: a voting coordinator's, whose log
    /// is kept by the voters' Raft log instead ([`crate::failover`]).
    pub(crate) fn open_standby(&self) -> Result<Arc<Database>> {
        self.open_in(None)
    }

    fn open_in(&self, data_dir: Option<PathBuf>) -> Result<Arc<Database>> {
        let options = gyre_replica::Options {
            data_dir,
            log_mode: self.log_mode,
            group_commit: self.group_commit,
            lock_wait: LOCK_WAIT,
            load_piece_bytes: self.load_piece_bytes,
            ..Default::default()
        };
        let db = Database::open(options, self.procedures.clone()).map_err(replica_err)?;
        Ok(Arc::new(db))
    }
}

/// What the primary logged and ran since it started.
#[derive(Debug, Clone, Default)]
pub struct PrimaryFigures {
    /// The last durable commit.
    pub lsn: u64,
    pub durable_lsn: u64,
    pub log: gyre_replica::log::writer::LogStats,
    /// Stored procedures called as transactions that changed something, and the time
    /// their bodies ran: what a secondary's replay is compared with.
    pub calls: u64,
    pub call_seconds: f64,
    /// Workers following the log.
    pub secondaries: usize,
}

/// A session's transaction.
pub(super) struct SessionTxn {
    state: TxnState,
    /// Since when no statement runs in it (`None`: one runs now).
    idle_since: Option<Instant>,
}

enum TxnState {
    Open(Transaction),
    /// A statement is changing rows in it on a blocking thread.
    Running,
    /// Rolled back, for this reason: only COMMIT or ROLLBACK are accepted.
    Aborted(String),
}

/// A statement running in a session, which may hold a transaction: when it ends
/// (finished, failed, or dropped because its client went away) the transaction is idle
/// again, or aborted if the statement left it running.
pub(super) struct TxnStatement {
    coordinator: Arc<Coordinator>,
    session: String,
}

impl Drop for TxnStatement {
    fn drop(&mut self) {
        if let Some(t) = self.coordinator.transactions.lock().get_mut(&self.session) {
            t.idle_since = Some(Instant::now());
            if matches!(t.state, TxnState::Running) {
                t.state = TxnState::Aborted("its statement was cancelled".into());
            }
        }
    }
}

impl Coordinator {
    /// Registers the providers of the transactional tables the primary recovered.
    pub(super) fn register_primary_tables(&self) -> Result<()> {
        let store = self.primary.catalog();
        for table in store.tables() {
            self.register_primary(&table.def)?;
        }
        Ok(())
    }

    fn register_primary(&self, def: &TableDef) -> Result<()> {
        // A row id is no key queries can use: they do not see it.
        let constraints = if def.has_row_id() {
            Constraints::default()
        } else {
            Constraints::new_unverified(vec![Constraint::PrimaryKey(def.key.clone())])
        };
        let provider = PrimaryTable {
            name: def.name.clone(),
            schema: def.visible_schema(),
            constraints,
            db: Arc::clone(&self.primary),
        };
        let name = TableReference::bare(def.name.as_str());
        let _ = self.ctx.deregister_table(name.clone());
        self.ctx.register_table(name, Arc::new(provider))?;
        Ok(())
    }

    /// The definition of transactional table `name`, as last committed.
    fn primary_def(&self, name: &str) -> Result<Arc<TableDef>> {
        let store = self.primary.catalog();
        let id = store.table_id(name).map_err(replica_err)?;
        Ok(Arc::clone(&store.table(id).map_err(replica_err)?.def))
    }

    /// Whether `name` is a transactional table.
    pub(super) fn is_primary(&self, name: &str) -> bool {
        self.primary.catalog().table_id(name).is_ok()
    }

    /// The primary's state a statement of `session` reads: its transaction's, on the
    /// primary, else a snapshot on the workers chosen by its first scan.
    pub(super) fn primary_snapshot(&self, session: &SessionContext) -> PrimarySnapshot {
        let txns = self.transactions.lock();
        if let Some(SessionTxn {
            state: TxnState::Open(t),
            ..
        }) = txns.get(&session.session_id())
            && let Ok(store) = t.snapshot()
        {
            return PrimarySnapshot::OnPrimary(Arc::new(store));
        }
        drop(txns);
        PrimarySnapshot::on_workers()
    }

    /// What the primary logged and ran so far (`gyre_primary()`).
    pub fn primary_figures(&self) -> PrimaryFigures {
        let (calls, call_time) = self.primary.executed();
        PrimaryFigures {
            lsn: self.primary.lsn(),
            durable_lsn: self.primary.durable_lsn(),
            log: self.primary.log_stats().unwrap_or_default(),
            calls,
            call_seconds: call_time.as_secs_f64(),
            secondaries: self.log_feed.subscribers(),
        }
    }

    /// The log as the workers receive it.
    pub(crate) fn log_feed(&self) -> &Arc<crate::log_feed::LogFeed> {
        &self.log_feed
    }

    /// Marks a global snapshot every [`SNAPSHOT_INTERVAL`] if anything committed since
    /// the last one (ScyPer's periodic snapshots; queries mark their own on demand).
    pub(super) fn mark_snapshot_if_due(&self) {
        let mut last = self.last_periodic_mark.lock();
        if last.elapsed() < SNAPSHOT_INTERVAL {
            return;
        }
        *last = Instant::now();
        let db = Arc::clone(&self.primary);
        // A transaction holding the primary defers it to the next period.
        tokio::task::spawn_blocking(move || {
            if let Err(e) = db.try_mark_snapshot_if_changed() {
                tracing::error!("periodic snapshot of the transactional tables: {e}");
            }
        });
    }

    fn in_transaction(&self, session: &SessionContext) -> bool {
        self.transactions.lock().contains_key(&session.session_id())
    }

    /// Starts a statement of `session`. In a transaction it is refused if a failed
    /// statement ended the transaction or another statement runs in it, unless it
    /// `ends` the transaction (COMMIT, ROLLBACK).
    pub(super) fn transaction_statement(
        self: &Arc<Self>,
        session: &SessionContext,
        ends: bool,
    ) -> Result<TxnStatement> {
        let sid = session.session_id();
        let mut txns = self.transactions.lock();
        if let Some(t) = txns.get_mut(&sid)
            && !ends
        {
            if let TxnState::Aborted(why) = &t.state {
                return Err(exec_err(format!(
                    "the transaction was rolled back ({why}): statements are ignored until ROLLBACK"
                )));
            }
            if t.idle_since.is_none() {
                return Err(exec_err(
                    "another statement of this session is running in its transaction",
                ));
            }
            t.idle_since = None;
        }
        Ok(TxnStatement {
            coordinator: Arc::clone(self),
            session: sid,
        })
    }

    /// Rolls the session's transaction back after a failed statement.
    pub(super) fn abort_transaction(&self, session: &SessionContext, why: &DataFusionError) {
        if let Some(t) = self.transactions.lock().get_mut(&session.session_id())
            && !matches!(t.state, TxnState::Aborted(_))
        {
            t.state = TxnState::Aborted(format!("a statement failed: {why}"));
        }
    }

    /// Runs `work` on the session's open transaction on a blocking thread (it may take
    /// a while, and must not hold the map of transactions meanwhile).
    async fn with_transaction<R: Send + 'static>(
        &self,
        session: &SessionContext,
        work: impl FnOnce(&mut Transaction) -> gyre_replica::Result<R> + Send + 'static,
    ) -> Result<R> {
        let sid = session.session_id();
        let mut txn = {
            let mut txns = self.transactions.lock();
            let t = txns
                .get_mut(&sid)
                .ok_or_else(|| exec_err("the transaction has ended"))?;
            match std::mem::replace(&mut t.state, TxnState::Running) {
                TxnState::Open(txn) => txn,
                other => {
                    t.state = other;
                    return Err(exec_err("the transaction is not open"));
                }
            }
        };
        let (txn, out) = tokio::task::spawn_blocking(move || {
            let out = work(&mut txn);
            (txn, out)
        })
        .await
        .map_err(|e| exec_err(e.to_string()))?;
        if let Some(t) = self.transactions.lock().get_mut(&sid)
            && matches!(t.state, TxnState::Running)
        {
            t.state = if txn.is_open() {
                TxnState::Open(txn)
            } else {
                TxnState::Aborted("a statement failed".into())
            };
        }
        out.map_err(replica_err)
    }

    /// Writes a checkpoint in the background once the log has grown by
    /// [`CHECKPOINT_LOG_BYTES`].
    pub(super) fn checkpoint_if_due(&self) {
        if self.primary.data_dir().is_none()
            || self.primary.log_bytes_since_checkpoint() < CHECKPOINT_LOG_BYTES
        {
            return;
        }
        let db = Arc::clone(&self.primary);
        tokio::task::spawn_blocking(move || {
            if let Err(e) = db.checkpoint_if_grown(CHECKPOINT_LOG_BYTES) {
                tracing::error!("checkpoint of the transactional tables: {e}");
            }
        });
    }

    /// Rolls back transactions idle for [`IDLE_IN_TRANSACTION`].
    pub(super) fn roll_back_idle_transactions(&self) {
        for t in self.transactions.lock().values_mut() {
            if t.idle_since
                .is_some_and(|s| s.elapsed() > IDLE_IN_TRANSACTION)
                && matches!(t.state, TxnState::Open(_))
            {
                t.state = TxnState::Aborted(format!(
                    "idle for more than {} s",
                    IDLE_IN_TRANSACTION.as_secs()
                ));
            }
        }
    }

    /// Runs the statements that never reach DataFusion's planner: `BEGIN`, `COMMIT`,
    /// `ROLLBACK`, `CALL` and `CREATE TABLE ... WITH (replication = 'full')`.
    pub(super) async fn primary_statement(
        self: &Arc<Self>,
        session: &SessionContext,
        stmt: &mut DFStatement,
    ) -> Result<Option<StatementResult>> {
        let DFStatement::Statement(s) = stmt else {
            return Ok(None);
        };
        let sid = session.session_id();
        match s.as_mut() {
            SqlStatement::StartTransaction { statements, .. } => {
                if !statements.is_empty() {
                    return not_impl_err!("BEGIN ... END blocks");
                }
                if self.in_transaction(session) {
                    // As PostgreSQL: a warning there, nothing here.
                    return no_result().map(Some);
                }
                let db = Arc::clone(&self.primary);
                let txn = tokio::task::spawn_blocking(move || db.try_begin())
                    .await
                    .map_err(|e| exec_err(e.to_string()))?
                    .map_err(replica_err)?;
                self.transactions.lock().insert(
                    sid,
                    SessionTxn {
                        state: TxnState::Open(txn),
                        // The statement's end marks it idle.
                        idle_since: None,
                    },
                );
                no_result().map(Some)
            }
            SqlStatement::Commit { chain, .. } => {
                if *chain {
                    return not_impl_err!("COMMIT AND CHAIN");
                }
                let Some(t) = self.transactions.lock().remove(&sid) else {
                    return no_result().map(Some);
                };
                let txn = match t.state {
                    TxnState::Open(txn) => txn,
                    TxnState::Running => {
                        return Err(exec_err(
                            "a statement was still running in the transaction: rolled back",
                        ));
                    }
                    TxnState::Aborted(why) => {
                        return Err(exec_err(format!("the transaction was rolled back ({why})")));
                    }
                };
                tokio::task::spawn_blocking(move || txn.commit())
                    .await
                    .map_err(|e| exec_err(e.to_string()))?
                    .map_err(replica_err)?;
                no_result().map(Some)
            }
            SqlStatement::Rollback { chain, savepoint } => {
                if *chain || savepoint.is_some() {
                    return not_impl_err!("ROLLBACK AND CHAIN or TO SAVEPOINT");
                }
                self.transactions.lock().remove(&sid);
                no_result().map(Some)
            }
            SqlStatement::Call(function) => {
                let name = function.name.to_string();
                let args = match &function.args {
                    FunctionArguments::None => vec![],
                    FunctionArguments::List(list) => list
                        .args
                        .iter()
                        .map(|a| match a {
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e.clone()),
                            other => plan_err!("CALL takes positional arguments, not {other}"),
                        })
                        .collect::<Result<Vec<_>>>()?,
                    FunctionArguments::Subquery(_) => {
                        return plan_err!("CALL takes a list of arguments");
                    }
                };
                self.call(session, &name, &args).await.map(Some)
            }
            SqlStatement::CreateTable(ct) => {
                // WITH (replication = ..., replicas = ...), else the session's
                // gyre.replication and gyre.replicas.
                let mut given = None;
                let mut replicas = None;
                if let CreateTableOptions::With(options) = &mut ct.table_options {
                    if let Some(value) = take_option(options, "replication") {
                        given = Some(placement_of(&value)?);
                    }
                    if let Some(value) = take_option(options, "replicas") {
                        replicas = Some(replicas_of(&value)?);
                    }
                    if options.is_empty() {
                        ct.table_options = CreateTableOptions::None;
                    }
                }
                // A temporary table is not one to keep.
                let temporary = ct.temporary;
                let settings = GyreOptions::of(session.state().config_options());
                let default = || match settings.replication {
                    _ if temporary => None,
                    Replication::None => None,
                    Replication::Full => Some(Placement::Full),
                    Replication::Partitioned => Some(Placement::Partitioned),
                    Replication::Chunked => Some(Placement::Chunked),
                    Replication::Fragmented => Some(Placement::Fragmented {
                        replicas: settings.replicas,
                    }),
                };
                let placement = match (given, replicas) {
                    (None, None) => default(),
                    // WITH (replicas = x) alone makes a fragmented table.
                    (None, Some(replicas)) => Some(Placement::Fragmented { replicas }),
                    (Some(Some(Placement::Fragmented { .. })), _) => Some(Placement::Fragmented {
                        replicas: replicas.unwrap_or(settings.replicas),
                    }),
                    (Some(placement), None) => placement,
                    (Some(_), Some(_)) => {
                        return plan_err!(
                            "WITH (replicas = ...) is for fragmented tables, not with \
                             replication = {}",
                            given.flatten().map_or("none", Placement::name)
                        );
                    }
                };
                let Some(placement) = placement else {
                    return Ok(None);
                };
                let workers = self.live_workers();
                let state = self.query_state(session, &workers);
                let plan = state
                    .statement_to_plan(std::mem::replace(
                        stmt,
                        DFStatement::Statement(Box::new(SqlStatement::Commit {
                            chain: false,
                            end: false,
                            modifier: None,
                        })),
                    ))
                    .await?;
                let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) = plan else {
                    return plan_err!("WITH (replication = ...) is for CREATE TABLE");
                };
                self.create_primary_table(session, state, cmd, workers, placement)
                    .await
                    .map(Some)
            }
            _ => Ok(None),
        }
    }

    async fn create_primary_table(
        self: &Arc<Self>,
        session: &SessionContext,
        state: SessionState,
        cmd: CreateMemoryTable,
        workers: Vec<NodeId>,
        placement: Placement,
    ) -> Result<StatementResult> {
        if self.in_transaction(session) {
            return Err(exec_err("CREATE TABLE inside a transaction"));
        }
        if cmd.temporary {
            return not_impl_err!("a TEMPORARY table WITH (replication = ...)");
        }
        if !cmd.column_defaults.is_empty() {
            return not_impl_err!("column defaults (DEFAULT) in a transactional table");
        }
        let name = self.table_name(&cmd.name)?;
        let _reservation = self.reserve(&name)?;
        if self.exists(&name) {
            if cmd.if_not_exists {
                return no_result();
            }
            if !cmd.or_replace {
                return Err(exec_err(format!("Table '{name}' already exists")));
            }
            if !self.is_primary(&name) {
                return not_impl_err!(
                    "CREATE OR REPLACE of '{name}', a distributed table, as a transactional \
                     one: DROP it first"
                );
            }
        }
        let schema = cmd.input.schema().as_arrow().clone();
        let columns = gyre_replica::value::columns_of(&schema).map_err(replica_err)?;
        // Without a primary key the primary numbers the rows (a hidden row id).
        let key = cmd
            .constraints
            .iter()
            .find_map(|c| match c {
                Constraint::PrimaryKey(cols) => Some(cols.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let key_names: Vec<String> = key.iter().map(|&k| columns[k].name.clone()).collect();
        // The rows of CREATE TABLE ... AS SELECT, checked against the new table's rules:
        // the table appears with all of them or not at all.
        let mut stored = columns.clone();
        let names: Vec<&str> = key_names.iter().map(String::as_str).collect();
        let key = TableDef::keyed(&mut stored, &names)
            .map_err(|e| plan_datafusion_err!("table '{name}': {e}"))?;
        let def = TableDef {
            id: gyre_replica::TableId(0),
            name: name.clone(),
            columns: stored,
            key,
            placement,
        };
        def.validate().map_err(replica_err)?;
        let empty =
            matches!(cmd.input.as_ref(), LogicalPlan::EmptyRelation(e) if !e.produce_one_row);
        let batches = match empty {
            true => vec![],
            false => {
                self.run_query(state, Arc::unwrap_or_clone(cmd.input), workers)
                    .await?
                    .batches
            }
        };
        let db = Arc::clone(&self.primary);
        let table = name.clone();
        let replace = cmd.or_replace && self.is_primary(&name);
        tokio::task::spawn_blocking(move || {
            let key: Vec<&str> = key_names.iter().map(String::as_str).collect();
            // Converted to rows batch by batch as the load logs them.
            let rows = || {
                batches.iter().map(|b| {
                    rows_of(&def, b).map_err(|e| gyre_replica::Error::Constraint(e.to_string()))
                })
            };
            // OR REPLACE: two transactions. The new table is tried in memory first,
            // so that rows it refuses do not cost the old one.
            if replace {
                gyre_replica::Database::open(Default::default(), Procedures::new())?.load_table(
                    &table,
                    columns.clone(),
                    &key,
                    placement,
                    rows(),
                )?;
                db.drop_table(&table)?;
            }
            db.load_table(&table, columns, &key, placement, rows())
        })
        .await
        .map_err(|e| exec_err(e.to_string()))?
        .map_err(replica_err)?;
        self.register_primary(&*self.primary_def(&name)?)?;
        no_result()
    }

    /// Handles a planned statement that concerns transactional tables, or that may not
    /// run inside a transaction; `None` leaves it to the distributed engine.
    pub(super) async fn primary_plan(
        self: &Arc<Self>,
        session: &SessionContext,
        state: &SessionState,
        plan: &LogicalPlan,
        workers: &[NodeId],
    ) -> Result<Option<StatementResult>> {
        let in_txn = self.in_transaction(session);
        match plan {
            LogicalPlan::Dml(d) if self.is_primary(&self.table_name(&d.table_name)?) => {
                let def = self.primary_def(&self.table_name(&d.table_name)?)?;
                let input = match d.op {
                    // Rows without a key of their own are found by their old values.
                    WriteOp::Update if def.has_row_id() => {
                        with_old_values(&d.input, &d.table_name, &def)?
                    }
                    WriteOp::Update => {
                        key_untouched(&d.input, &d.table_name, &def)?;
                        d.input.as_ref().clone()
                    }
                    _ => d.input.as_ref().clone(),
                };
                self.change_rows(
                    session,
                    state.clone(),
                    &def,
                    d.op.clone(),
                    input,
                    workers.to_vec(),
                )
                .await
                .map(Some)
            }
            LogicalPlan::Ddl(DdlStatement::DropTable(cmd))
                if self.is_primary(&self.table_name(&cmd.name)?) =>
            {
                if in_txn {
                    return Err(exec_err("DROP TABLE inside a transaction"));
                }
                let name = self.table_name(&cmd.name)?;
                let db = Arc::clone(&self.primary);
                let table = name.clone();
                tokio::task::spawn_blocking(move || db.drop_table(&table))
                    .await
                    .map_err(|e| exec_err(e.to_string()))?
                    .map_err(replica_err)?;
                let _ = self
                    .ctx
                    .deregister_table(TableReference::bare(name.as_str()));
                no_result().map(Some)
            }
            LogicalPlan::Ddl(_) | LogicalPlan::Dml(_) | LogicalPlan::Copy(_) if in_txn => {
                Err(exec_err(
                    "only queries, CALL, SET and changes to tables WITH (replication = ...) \
                     run inside a transaction",
                ))
            }
            _ => Ok(None),
        }
    }

    /// Runs `input` on the cluster, reading the transaction's state, and inserts,
    /// updates (by key) or deletes (by key) the rows it returns.
    async fn change_rows(
        self: &Arc<Self>,
        session: &SessionContext,
        mut state: SessionState,
        def: &TableDef,
        op: WriteOp,
        input: LogicalPlan,
        workers: Vec<NodeId>,
    ) -> Result<StatementResult> {
        #[derive(Clone, Copy)]
        enum Change {
            Insert,
            Update,
            Delete,
        }
        let change = match &op {
            WriteOp::Insert(InsertOp::Append) => Change::Insert,
            WriteOp::Update => Change::Update,
            WriteOp::Delete => Change::Delete,
            other => return not_impl_err!("{other} on a transactional table"),
        };
        // Outside BEGIN the statement is its own transaction.
        let own = if self.in_transaction(session) {
            None
        } else {
            let db = Arc::clone(&self.primary);
            let txn = tokio::task::spawn_blocking(move || db.try_begin())
                .await
                .map_err(|e| exec_err(e.to_string()))?
                .map_err(replica_err)?;
            Some(txn)
        };
        // A change reads its input on the primary: its own transaction's state.
        let snapshot = match &own {
            Some(t) => PrimarySnapshot::OnPrimary(Arc::new(t.snapshot().map_err(replica_err)?)),
            None => PrimarySnapshot::OnPrimary(
                self.primary_snapshot(session)
                    .on_primary_store(&self.primary)
                    .await?,
            ),
        };
        state.config_mut().set_extension(Arc::new(snapshot));
        let result = self.run_query(state, input, workers).await?;
        let mut rows: Vec<Vec<Value>> = Vec::new();
        // An UPDATE of a table without a key reads each row's old values too.
        let mut old: Vec<Vec<Value>> = Vec::new();
        let width = def.visible_columns().len();
        for batch in &result.batches {
            if matches!(change, Change::Update) && def.has_row_id() {
                let split = |at: usize| batch.project(&(at..at + width).collect::<Vec<_>>());
                rows.extend(rows_of(def, &split(0)?)?);
                old.extend(rows_of(def, &split(width)?)?);
            } else {
                rows.extend(rows_of(def, batch)?);
            }
        }
        if !matches!(change, Change::Insert) && !def.has_row_id() {
            // An UPDATE ... FROM may match a row several times; a DELETE deletes once.
            let mut seen = std::collections::BTreeSet::new();
            let mut unique = Vec::with_capacity(rows.len());
            for row in rows {
                let key = def.key_of(&row);
                if seen.insert(key.clone()) {
                    unique.push(row);
                } else if matches!(change, Change::Update) {
                    return Err(exec_err(format!(
                        "UPDATE of {} changes the row with key {key:?} more than once \
                         (its FROM matches it several times)",
                        def.name
                    )));
                }
            }
            rows = unique;
        }
        let count = rows.len() as u64;
        let def = def.clone();
        let apply = move |txn: &mut Transaction| -> gyre_replica::Result<()> {
            txn.run(|txn| {
                if def.has_row_id() && !matches!(change, Change::Insert) {
                    // Each row read is a distinct row holding its values.
                    let found = match change {
                        Change::Update => &old,
                        _ => &rows,
                    };
                    let keys = txn.match_rows(def.id, found)?;
                    for (mut row, key) in rows.into_iter().zip(keys) {
                        if matches!(change, Change::Update) {
                            row.extend(key.iter().cloned());
                            txn.update(def.id, row)?;
                        } else {
                            txn.delete(def.id, &key)?;
                        }
                    }
                    return Ok(());
                }
                for row in rows {
                    match change {
                        Change::Insert => txn.insert(def.id, row)?,
                        Change::Update => txn.update(def.id, row)?,
                        Change::Delete => {
                            txn.delete(def.id, &def.key_values(&row))?;
                        }
                    }
                }
                Ok(())
            })
        };
        match own {
            Some(mut txn) => {
                tokio::task::spawn_blocking(move || {
                    apply(&mut txn)?;
                    txn.commit()
                })
                .await
                .map_err(|e| exec_err(e.to_string()))?
                .map_err(replica_err)?;
            }
            None => self.with_transaction(session, apply).await?,
        }
        count_result(count)
    }

    /// `CALL name(args)`: the arguments are SQL expressions, evaluated here and cast to
    /// the procedure's parameter types.
    async fn call(
        self: &Arc<Self>,
        session: &SessionContext,
        name: &str,
        args: &[SqlExpr],
    ) -> Result<StatementResult> {
        let procedure = self
            .primary
            .procedures()
            .get(name)
            .map_err(replica_err)?
            .clone();
        let params = procedure.params();
        if params.len() != args.len() {
            return plan_err!(
                "{name} takes {} arguments ({}), got {}",
                params.len(),
                params
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                args.len()
            );
        }
        let mut values = Vec::with_capacity(args.len());
        if !args.is_empty() {
            let arrays = match constant_arguments(&session.state(), args) {
                Some(arrays) => arrays,
                None => self.queried_arguments(session, args).await?,
            };
            let strict = arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            for (p, array) in params.iter().zip(&arrays) {
                let array =
                    arrow::compute::cast_with_options(array, &p.column_type.data_type(), &strict)
                        .map_err(|e| exec_err(format!("CALL {name}: {}: {e}", p.name)))?;
                use arrow::array::{Array, AsArray};
                if let Some(list) = array.as_list_opt::<i32>()
                    && !list.is_null(0)
                    && list.value(0).null_count() > 0
                {
                    return Err(exec_err(format!(
                        "CALL {name}: {}: a list's elements may not be NULL",
                        p.name
                    )));
                }
                values.push(columnar::value_at(p.column_type, array.as_ref(), 0));
            }
        }
        let rows = if self.in_transaction(session) {
            let name = name.to_string();
            self.with_transaction(session, move |txn| txn.call(&name, &values))
                .await?
        } else {
            let db = Arc::clone(&self.primary);
            let name = name.to_string();
            tokio::task::spawn_blocking(move || db.call(&name, &values))
                .await
                .map_err(|e| exec_err(e.to_string()))?
                .map_err(replica_err)?
        };
        let returns = procedure.returns();
        for row in &rows {
            let fits = row.len() == returns.len()
                && row.iter().zip(&returns).all(|(v, c)| c.check(v).is_ok());
            if !fits {
                return Err(exec_err(format!(
                    "procedure {name} returned a row that does not fit its result columns"
                )));
            }
        }
        let batch = columnar::to_batch(&returns, rows.iter().map(|r| &r[..]));
        Ok(StatementResult {
            schema: batch.schema(),
            batches: vec![batch],
        })
    }

    /// CALL's arguments evaluated as a query of the session (a subquery among them
    /// reads its transaction), a column each.
    async fn queried_arguments(
        self: &Arc<Self>,
        session: &SessionContext,
        args: &[SqlExpr],
    ) -> Result<Vec<ArrayRef>> {
        let workers = self.live_workers();
        let state = self.query_state(session, &workers);
        // Each argument named apart: `CALL f(1, 1)` has two equal expressions.
        let select: Vec<String> = args
            .iter()
            .enumerate()
            .map(|(i, a)| format!("({a}) AS arg{i}"))
            .collect();
        let plan = state
            .create_logical_plan(&format!("SELECT {}", select.join(", ")))
            .await?;
        let result = self.run_query(state, plan, workers).await?;
        let batch = result
            .batches
            .iter()
            .find(|b| b.num_rows() > 0)
            .ok_or_else(|| exec_err("CALL's arguments gave no values"))?;
        Ok(batch.columns().to_vec())
    }
}

/// CALL's arguments when each is an expression of constants (literals, casts,
/// functions of them: what clients send), evaluated on their own, a one-row column
/// each; `None` when one is not (a subquery, a column, an aggregate, a function that
/// must be planned), which [`Coordinator::queried_arguments`] then evaluates. A
/// transaction sent as `CALL` thus costs no query plan: planning a `SELECT` of its
/// arguments and running it took most of the coordinator's time per transaction.
fn constant_arguments(state: &SessionState, args: &[SqlExpr]) -> Option<Vec<ArrayRef>> {
    use datafusion::sql::sqlparser::ast::ExprWithAlias;
    let schema = datafusion::common::DFSchema::empty();
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .ok()?;
    args.iter()
        .map(|arg| {
            let sql = ExprWithAlias {
                expr: arg.clone(),
                alias: None,
            };
            let expr = state.create_logical_expr_from_sql_expr(sql, &schema).ok()?;
            // A subquery reads the session's transaction: only a query sees it.
            let reads = expr.exists(|e| {
                Ok(matches!(
                    e,
                    datafusion::logical_expr::Expr::ScalarSubquery(_)
                        | datafusion::logical_expr::Expr::InSubquery(_)
                        | datafusion::logical_expr::Expr::Exists(_)
                ))
            });
            if reads.unwrap_or(true) {
                return None;
            }
            let physical = state.create_physical_expr(expr, &schema).ok()?;
            physical.evaluate(&one_row).ok()?.into_array(1).ok()
        })
        .collect()
}

/// The rows of a batch of table `def`'s visible columns (all but a row id), cast to
/// the table's types.
fn rows_of(def: &TableDef, batch: &RecordBatch) -> Result<Vec<Vec<Value>>> {
    let visible = def.visible_columns();
    if batch.num_columns() != visible.len() {
        return Err(exec_err(format!(
            "{} has {} columns, the statement gave {}",
            def.name,
            visible.len(),
            batch.num_columns()
        )));
    }
    let columns = visible
        .iter()
        .zip(batch.columns())
        .map(|(c, a)| arrow::compute::cast(a, &c.column_type.data_type()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let cast = RecordBatch::try_new(def.visible_schema(), columns)?;
    columnar::from_visible_batch(def, &cast).map_err(replica_err)
}

/// An UPDATE of a table without a primary key finds each row by its values: its input
/// (the new rows) followed by the target row's current values.
fn with_old_values(
    input: &LogicalPlan,
    target: &TableReference,
    def: &TableDef,
) -> Result<LogicalPlan> {
    let LogicalPlan::Projection(p) = input else {
        return plan_err!("UPDATE of a transactional table: unexpected plan");
    };
    // The target's columns are qualified by its alias, if it has one, else by the
    // name its scan has.
    let (aliases, scans) = target_reads(&p.input, target)?;
    let qualifier = match (aliases.as_slice(), scans.as_slice()) {
        ([alias], [_]) => alias.clone(),
        ([], [scan]) => scan.clone(),
        _ => {
            return not_impl_err!(
                "UPDATE of {}, a table without a primary key, that reads it twice",
                def.name
            );
        }
    };
    let mut exprs = p.expr.clone();
    let columns = def.visible_columns();
    for (i, c) in columns.iter().enumerate() {
        // Named apart from the table's columns, which name the new values.
        let mut name = format!("__old_{i}");
        while columns.iter().any(|c| c.name == name) {
            name.push('_');
        }
        exprs.push(
            datafusion::logical_expr::Expr::Column(datafusion::common::Column::new(
                Some(qualifier.clone()),
                &c.name,
            ))
            .alias(name),
        );
    }
    Ok(LogicalPlan::Projection(
        datafusion::logical_expr::Projection::try_new(exprs, Arc::clone(&p.input))?,
    ))
}

/// How an UPDATE's input reads its target table: the aliases it gives it, and its
/// scans of it.
fn target_reads(
    input: &LogicalPlan,
    target: &TableReference,
) -> Result<(Vec<TableReference>, Vec<TableReference>)> {
    let is_target = |plan: &LogicalPlan| matches!(plan, LogicalPlan::TableScan(s) if s.table_name.table() == target.table());
    let (mut aliases, mut scans) = (vec![], vec![]);
    input.apply(|node| {
        match node {
            LogicalPlan::SubqueryAlias(a) if is_target(&a.input) => aliases.push(a.alias.clone()),
            LogicalPlan::TableScan(s) if is_target(node) => scans.push(s.table_name.clone()),
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok((aliases, scans))
}

/// An UPDATE may not change a key column: the row would need a new place in the index
/// and its old key is not in the new row. A key column must be the target table's own
/// (by its name or alias), not another table's of an `UPDATE ... FROM`.
fn key_untouched(input: &LogicalPlan, target: &TableReference, def: &TableDef) -> Result<()> {
    let LogicalPlan::Projection(p) = input else {
        return plan_err!("UPDATE of a transactional table: unexpected plan");
    };
    let mut names = vec![target.table().to_string()];
    let (aliases, _) = target_reads(input, target)?;
    names.extend(aliases.iter().map(|a| a.table().to_string()));
    for &k in &def.key {
        let name = &def.columns[k].name;
        let same = matches!(p.expr.get(k).map(|e| e.clone().unalias()),
            Some(datafusion::logical_expr::Expr::Column(c))
                if &c.name == name
                    && c.relation.as_ref().is_none_or(|r| names.iter().any(|n| n == r.table())));
        if !same {
            return plan_err!(
                "UPDATE cannot change {name}, a primary key column of {}: delete the row \
                 and insert it anew",
                def.name
            );
        }
    }
    Ok(())
}

/// The placement `WITH (replication = ...)` names (`None`: 'none', a distributed
/// table).
fn placement_of(value: &SqlExpr) -> Result<Option<Placement>> {
    if let SqlExpr::Value(v) = value
        && let SqlValue::SingleQuotedString(s) = &v.value
    {
        if s.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        if let Ok(placement) = s.parse() {
            return Ok(Some(placement));
        }
    }
    plan_err!(
        "replication takes 'none', 'full', 'partitioned', 'chunked' or 'fragmented', not \
         {value}"
    )
}

/// Removes the option `name` (in any case) from a CREATE TABLE's `WITH (...)`, giving
/// its value.
fn take_option(options: &mut Vec<SqlOption>, name: &str) -> Option<SqlExpr> {
    let at = options.iter().position(
        |o| matches!(o, SqlOption::KeyValue { key, .. } if key.value.eq_ignore_ascii_case(name)),
    )?;
    match options.remove(at) {
        SqlOption::KeyValue { value, .. } => Some(value),
        _ => None,
    }
}

/// The copies of each block `WITH (replicas = ...)` asks for.
fn replicas_of(value: &SqlExpr) -> Result<u8> {
    let max = gyre_replica::rendezvous::MAX_REPLICAS;
    let text = match value {
        SqlExpr::Value(v) => match &v.value {
            SqlValue::Number(n, _) => n.to_string(),
            SqlValue::SingleQuotedString(s) => s.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    };
    match text.trim().parse::<u8>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => plan_err!("replicas takes a whole number from 1 to {max}, not {value}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::Int64Type;

    fn args_of(sql: &str) -> Vec<SqlExpr> {
        let dialect = dialect_from_str("generic").expect("a dialect");
        let stmt = datafusion::sql::sqlparser::parser::Parser::parse_sql(dialect.as_ref(), sql)
            .expect("parses")
            .pop()
            .expect("a statement");
        let SqlStatement::Call(function) = stmt else {
            panic!("not a CALL: {sql}");
        };
        let FunctionArguments::List(list) = function.args else {
            panic!("no argument list: {sql}");
        };
        list.args
            .into_iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => e,
                other => panic!("{other}"),
            })
            .collect()
    }

    #[test]
    fn constant_arguments_are_evaluated_without_a_query() {
        let state = SessionContext::new().state();
        let arrays = constant_arguments(
            &state,
            &args_of(
                "CALL f(5 * 2, -3, 'it''s', [1, 2, 3], CAST(12.34 AS DECIMAL(6, 2)), \
                 to_timestamp_nanos(1000), abs(-7), NULL)",
            ),
        )
        .expect("every argument is constant");
        assert_eq!(arrays.len(), 8);
        assert!(arrays.iter().all(|a| a.len() == 1));
        let int = |i: usize| arrays[i].as_primitive::<Int64Type>().value(0);
        assert_eq!((int(0), int(1), int(6)), (10, -3, 7));
        assert_eq!(arrays[2].as_string::<i32>().value(0), "it's");
        let list = arrays[3].as_list::<i32>().value(0);
        assert_eq!(
            list.as_primitive::<Int64Type>(),
            &Int64Array::from(vec![1, 2, 3])
        );
        assert_eq!(
            arrays[4]
                .as_primitive::<arrow::datatypes::Decimal128Type>()
                .value(0),
            1234
        );
        assert_eq!(
            arrays[5]
                .as_primitive::<arrow::datatypes::TimestampNanosecondType>()
                .value(0),
            1000
        );
        assert_eq!(arrays[7].logical_null_count(), 1);
    }

    #[test]
    fn arguments_that_need_a_query_are_left_to_one() {
        let state = SessionContext::new().state();
        for sql in [
            "CALL f(1, (SELECT max(id) FROM accounts))",
            "CALL f(id)",
            "CALL f(count(*))",
            "CALL f($1)",
        ] {
            assert!(constant_arguments(&state, &args_of(sql)).is_none(), "{sql}");
        }
    }
}
