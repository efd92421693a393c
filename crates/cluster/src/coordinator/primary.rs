//! Transactions on the primary: tables created `WITH (replication = 'full')` live in
//! the coordinator's row store ([`gyre_replica::Database`]), which runs every
//! transaction on them one at a time and logs the committed ones (ScyPer, Rödiger's
//! thesis, chapter 5).
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
//! - A failed statement rolls its whole transaction back; until `ROLLBACK` (or
//!   `COMMIT`, which then fails) the session's statements are refused, as in
//!   PostgreSQL.
//! - Inside a transaction only reads, `CALL`, `SET` and changes to transactional tables
//!   run: distributed tables are not transactional (yet), and DDL commits on its own.

use super::*;
use crate::primary_table::{PrimarySnapshot, PrimaryTable, replica_err};
use datafusion::common::{Constraint, Constraints};
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, FunctionArg, FunctionArgExpr, FunctionArguments, SqlOption,
    Value as SqlValue,
};
use gyre_replica::{
    Database, LogMode, Procedures, Store, TableDef, Transaction, Txn, Value, columnar,
};
use std::path::PathBuf;

/// How long a statement waits for another session's transaction to end.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A transaction idle this long is rolled back.
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(60);

/// A checkpoint is written once the log has grown by this much since the last one, so
/// that a restart replays at most about this much log.
pub const CHECKPOINT_LOG_BYTES: u64 = 64 << 20;

/// How the coordinator keeps its transactional tables.
#[derive(Clone)]
pub struct PrimaryConfig {
    /// Where the log and checkpoints live (`--data-dir`); `None`: in memory only.
    pub data_dir: Option<PathBuf>,
    pub log_mode: LogMode,
    pub group_commit: bool,
    /// The stored procedures `CALL` can run (and the log can replay).
    pub procedures: Procedures,
}

impl Default for PrimaryConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            log_mode: LogMode::Logical,
            group_commit: true,
            procedures: Procedures::new(),
        }
    }
}

impl std::fmt::Debug for PrimaryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrimaryConfig")
            .field("data_dir", &self.data_dir)
            .field("log_mode", &self.log_mode)
            .field("group_commit", &self.group_commit)
            .field("procedures", &self.procedures.names().collect::<Vec<_>>())
            .finish()
    }
}

impl PrimaryConfig {
    pub(super) fn open(&self) -> Result<Arc<Database>> {
        let options = gyre_replica::Options {
            data_dir: self.data_dir.as_ref().map(|d| d.join("primary")),
            log_mode: self.log_mode,
            group_commit: self.group_commit,
            ..Default::default()
        };
        let db = Database::open(options, self.procedures.clone()).map_err(replica_err)?;
        Ok(Arc::new(db))
    }
}

/// A session's transaction.
pub(super) struct SessionTxn {
    /// `None` once a statement failed and rolled it back: only its end is accepted.
    txn: Option<Transaction>,
    /// Why it was rolled back.
    aborted: String,
    /// Since when no statement runs in it (`None`: one runs now).
    idle_since: Option<Instant>,
}

impl Coordinator {
    /// Registers the providers of the transactional tables the primary recovered.
    pub(super) fn register_primary_tables(&self) -> Result<()> {
        let store = self.primary.snapshot();
        for table in store.tables() {
            self.register_primary(&table.def)?;
        }
        Ok(())
    }

    fn register_primary(&self, def: &TableDef) -> Result<()> {
        let provider = PrimaryTable {
            name: def.name.clone(),
            schema: def.schema(),
            constraints: Constraints::new_unverified(vec![Constraint::PrimaryKey(def.key.clone())]),
            db: Arc::clone(&self.primary),
        };
        let name = TableReference::bare(def.name.as_str());
        let _ = self.ctx.deregister_table(name.clone());
        self.ctx.register_table(name, Arc::new(provider))?;
        Ok(())
    }

    /// Whether `name` is a transactional table.
    pub(super) fn is_primary(&self, name: &str) -> bool {
        self.primary.snapshot().table_id(name).is_ok()
    }

    /// The primary's state a statement of `session` reads: its transaction's, else the
    /// last durable commit.
    pub(super) fn primary_snapshot(&self, session: &SessionContext) -> Arc<Store> {
        let txns = self.transactions.lock();
        if let Some(SessionTxn { txn: Some(t), .. }) = txns.get(&session.session_id())
            && let Ok(store) = t.snapshot()
        {
            return Arc::new(store);
        }
        drop(txns);
        self.primary.snapshot()
    }

    fn in_transaction(&self, session: &SessionContext) -> bool {
        self.transactions.lock().contains_key(&session.session_id())
    }

    /// Marks the session's transaction busy (a statement runs in it) or idle; refuses
    /// statements in a transaction a failed statement ended.
    pub(super) fn transaction_busy(&self, session: &SessionContext, busy: bool) -> Result<()> {
        let mut txns = self.transactions.lock();
        let Some(t) = txns.get_mut(&session.session_id()) else {
            return Ok(());
        };
        t.idle_since = (!busy).then(Instant::now);
        if busy && t.txn.is_none() {
            return Err(exec_err(format!(
                "the transaction was rolled back ({}): statements are ignored until ROLLBACK",
                t.aborted
            )));
        }
        Ok(())
    }

    /// Rolls the session's transaction back after a failed statement.
    pub(super) fn abort_transaction(&self, session: &SessionContext, why: &DataFusionError) {
        if let Some(t) = self.transactions.lock().get_mut(&session.session_id())
            && t.txn.take().is_some()
        {
            t.aborted = format!("a statement failed: {why}");
        }
    }

    /// Writes a checkpoint in the background once the log has grown by
    /// [`CHECKPOINT_LOG_BYTES`].
    pub(super) fn checkpoint_if_due(&self) {
        if self.primary.log_bytes_since_checkpoint() < CHECKPOINT_LOG_BYTES {
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
                && t.txn.take().is_some()
            {
                t.aborted = format!("idle for more than {} s", IDLE_IN_TRANSACTION.as_secs());
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
                    return Err(exec_err("a transaction is already open in this session"));
                }
                let db = Arc::clone(&self.primary);
                let txn = tokio::task::spawn_blocking(move || db.try_begin(LOCK_WAIT))
                    .await
                    .map_err(|e| exec_err(e.to_string()))?
                    .map_err(replica_err)?;
                self.transactions.lock().insert(
                    sid,
                    SessionTxn {
                        txn: Some(txn),
                        aborted: String::new(),
                        idle_since: Some(Instant::now()),
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
                let Some(txn) = t.txn else {
                    return Err(exec_err(format!(
                        "the transaction was rolled back ({})",
                        t.aborted
                    )));
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
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e.to_string()),
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
                let CreateTableOptions::With(options) = &mut ct.table_options else {
                    return Ok(None);
                };
                let Some(at) = options.iter().position(
                    |o| matches!(o, SqlOption::KeyValue { key, .. } if key.value.eq_ignore_ascii_case("replication")),
                ) else {
                    return Ok(None);
                };
                let SqlOption::KeyValue { value, .. } = options.remove(at) else {
                    unreachable!()
                };
                let full = matches!(
                    &value,
                    SqlExpr::Value(v) if matches!(&v.value, SqlValue::SingleQuotedString(s) if s.eq_ignore_ascii_case("full"))
                );
                if !full {
                    return plan_err!("replication takes 'full', not {value}");
                }
                if options.is_empty() {
                    ct.table_options = CreateTableOptions::None;
                }
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
                    return plan_err!("WITH (replication = 'full') is for CREATE TABLE");
                };
                self.create_primary_table(session, state, cmd, workers)
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
    ) -> Result<StatementResult> {
        if self.in_transaction(session) {
            return Err(exec_err("CREATE TABLE inside a transaction"));
        }
        let name = self.table_name(&cmd.name)?;
        let _reservation = self.reserve(&name)?;
        if self.exists(&name) {
            if cmd.if_not_exists {
                return no_result();
            }
            return Err(exec_err(format!("Table '{name}' already exists")));
        }
        let schema = cmd.input.schema().as_arrow().clone();
        let columns = gyre_replica::value::columns_of(&schema).map_err(replica_err)?;
        let Some(key) = cmd.constraints.iter().find_map(|c| match c {
            Constraint::PrimaryKey(cols) => Some(cols.clone()),
            _ => None,
        }) else {
            return plan_err!("a table WITH (replication = 'full') needs a PRIMARY KEY");
        };
        let key_names: Vec<String> = key.iter().map(|&k| columns[k].name.clone()).collect();
        let db = Arc::clone(&self.primary);
        let table = name.clone();
        tokio::task::spawn_blocking(move || {
            let key: Vec<&str> = key_names.iter().map(String::as_str).collect();
            db.create_table(&table, columns, &key)
        })
        .await
        .map_err(|e| exec_err(e.to_string()))?
        .map_err(replica_err)?;
        let def = self
            .primary
            .snapshot()
            .table_id(&name)
            .and_then(|id| Ok(self.primary.snapshot().table(id)?.def.as_ref().clone()))
            .map_err(replica_err)?;
        self.register_primary(&def)?;
        let empty =
            matches!(cmd.input.as_ref(), LogicalPlan::EmptyRelation(e) if !e.produce_one_row);
        if !empty {
            let input = Arc::unwrap_or_clone(cmd.input);
            let filled = self
                .change_rows(
                    session,
                    state,
                    &def,
                    WriteOp::Insert(InsertOp::Append),
                    input,
                    workers,
                )
                .await;
            if let Err(e) = filled {
                let db = Arc::clone(&self.primary);
                let _ = tokio::task::spawn_blocking(move || db.drop_table(&name)).await;
                let _ = self
                    .ctx
                    .deregister_table(TableReference::bare(def.name.as_str()));
                return Err(e);
            }
        }
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
                let name = self.table_name(&d.table_name)?;
                let store = self.primary.snapshot();
                let def = store
                    .table(store.table_id(&name).map_err(replica_err)?)
                    .map_err(replica_err)?
                    .def
                    .clone();
                if d.op == WriteOp::Update {
                    key_untouched(&d.input, &def)?;
                }
                let input = d.input.as_ref().clone();
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
                    "only queries, CALL, SET and changes to tables WITH (replication = 'full') \
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
        let sid = session.session_id();
        // Outside BEGIN the statement is its own transaction.
        let own = if self.in_transaction(session) {
            None
        } else {
            let db = Arc::clone(&self.primary);
            let txn = tokio::task::spawn_blocking(move || db.try_begin(LOCK_WAIT))
                .await
                .map_err(|e| exec_err(e.to_string()))?
                .map_err(replica_err)?;
            Some(txn)
        };
        let snapshot = match &own {
            Some(t) => Arc::new(t.snapshot().map_err(replica_err)?),
            None => self.primary_snapshot(session),
        };
        state
            .config_mut()
            .set_extension(Arc::new(PrimarySnapshot(snapshot)));
        let result = self.run_query(state, input, workers).await?;
        let mut rows = Vec::new();
        for batch in &result.batches {
            rows.extend(rows_of(def, batch)?);
        }
        let count = rows.len() as u64;
        let table = def.id;
        let apply = |txn: &mut Txn<'_>| -> gyre_replica::Result<()> {
            for row in rows {
                match change {
                    Change::Insert => txn.insert(table, row)?,
                    Change::Update => txn.update(table, row)?,
                    Change::Delete => {
                        let key = def.key_of(&row);
                        txn.delete(table, &key)?;
                    }
                }
            }
            Ok(())
        };
        match own {
            Some(mut txn) => {
                txn.run(apply).map_err(replica_err)?;
                tokio::task::spawn_blocking(move || txn.commit())
                    .await
                    .map_err(|e| exec_err(e.to_string()))?
                    .map_err(replica_err)?;
            }
            None => {
                let mut txns = self.transactions.lock();
                let txn = txns
                    .get_mut(&sid)
                    .and_then(|t| t.txn.as_mut())
                    .ok_or_else(|| exec_err("the transaction has ended"))?;
                txn.run(apply).map_err(replica_err)?;
            }
        }
        count_result(count)
    }

    /// `CALL name(args)`: the arguments are SQL expressions, evaluated here and cast to
    /// the procedure's parameter types.
    async fn call(
        self: &Arc<Self>,
        session: &SessionContext,
        name: &str,
        args: &[String],
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
            let batches = session
                .sql(&format!("SELECT {}", args.join(", ")))
                .await?
                .collect()
                .await?;
            let batch = batches
                .iter()
                .find(|b| b.num_rows() > 0)
                .ok_or_else(|| exec_err("CALL's arguments gave no values"))?;
            for (p, array) in params.iter().zip(batch.columns()) {
                let array = arrow::compute::cast(array, &p.column_type.data_type())?;
                values.push(columnar::value_at(p.column_type, array.as_ref(), 0));
            }
        }
        let rows = if self.in_transaction(session) {
            let mut txns = self.transactions.lock();
            let txn = txns
                .get_mut(&session.session_id())
                .and_then(|t| t.txn.as_mut())
                .ok_or_else(|| exec_err("the transaction has ended"))?;
            txn.call(name, &values).map_err(replica_err)?
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
                && row.iter().zip(&returns).all(|(v, c)| {
                    if v.is_null() {
                        c.nullable
                    } else {
                        c.column_type.check(v).is_ok()
                    }
                });
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
}

/// The rows of a batch for table `def`, its columns cast to the table's types.
fn rows_of(def: &TableDef, batch: &RecordBatch) -> Result<Vec<Vec<Value>>> {
    if batch.num_columns() != def.columns.len() {
        return Err(exec_err(format!(
            "{} has {} columns, the statement gave {}",
            def.name,
            def.columns.len(),
            batch.num_columns()
        )));
    }
    let columns = def
        .columns
        .iter()
        .zip(batch.columns())
        .map(|(c, a)| arrow::compute::cast(a, &c.column_type.data_type()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let cast = RecordBatch::try_new(def.schema(), columns)?;
    columnar::from_batch(def, &cast).map_err(replica_err)
}

/// An UPDATE may not change a key column: the row would need a new place in the index
/// and its old key is not in the new row.
fn key_untouched(input: &LogicalPlan, def: &TableDef) -> Result<()> {
    let LogicalPlan::Projection(p) = input else {
        return plan_err!("UPDATE of a transactional table: unexpected plan");
    };
    for &k in &def.key {
        let name = &def.columns[k].name;
        let same = matches!(p.expr.get(k).map(|e| e.clone().unalias()),
            Some(datafusion::logical_expr::Expr::Column(c)) if &c.name == name);
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
