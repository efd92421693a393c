//! Statements: parsing in the session's dialect, and each statement's way from its
//! logical plan to a result (DDL, DML, queries, EXPLAIN, DataFusion's own statements).

use super::*;

impl Coordinator {
    /// Parses `sql` in the dialect the session is set to (`datafusion.sql_parser.dialect`),
    /// with its recursion limit, as DataFusion's own `SessionState::sql_to_statement`.
    pub(super) fn parse(
        &self,
        session: &SessionContext,
        sql: &str,
    ) -> Result<VecDeque<DFStatement>> {
        // Only the parser's settings: not a copy of the whole session state.
        let options = session
            .state_ref()
            .read()
            .config()
            .options()
            .sql_parser
            .clone();
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
        self.started().await?;
        let statements = self.parse(session, sql)?;
        let mut out = Vec::with_capacity(statements.len());
        for stmt in statements {
            out.push(self.run_statement(session, stmt).await?);
        }
        Ok(out)
    }

    /// The schema a statement's result will have, found by planning it (not running it).
    pub async fn result_schema(&self, session: &SessionContext, sql: &str) -> Result<SchemaRef> {
        self.started().await?;
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
        self.started().await?;
        let mut statements = self.parse(session, sql)?;
        let Some(last) = statements.pop_back() else {
            return plan_err!("no statement to run");
        };
        for stmt in statements {
            self.run_statement(session, stmt).await?;
        }
        let ends = ends_transaction(&last);
        self.in_session_transaction(session, ends, self.deferred_last(session, last))
            .await
    }

    /// Runs one statement of `session` (`ends`: COMMIT or ROLLBACK); inside a
    /// transaction, a failed one rolls it back.
    async fn in_session_transaction<T>(
        self: &Arc<Self>,
        session: &SessionContext,
        ends: bool,
        statement: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let _statement = self.transaction_statement(session, ends)?;
        let outcome = statement.await;
        if let Err(e) = &outcome
            && !ends
        {
            self.abort_transaction(session, e);
        }
        outcome
    }

    async fn deferred_last(
        self: &Arc<Self>,
        session: &SessionContext,
        mut last: DFStatement,
    ) -> Result<Outcome> {
        if let Some(done) = self.primary_statement(session, &mut last).await? {
            return Ok(Outcome::Done(done));
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
            replan: Box::new(Replan {
                session: session.clone(),
                plan,
            }),
        }))
    }

    /// Runs one statement; inside a transaction, a failed one rolls it back.
    pub(super) async fn run_statement(
        self: &Arc<Self>,
        session: &SessionContext,
        stmt: DFStatement,
    ) -> Result<StatementResult> {
        let ends = ends_transaction(&stmt);
        self.in_session_transaction(session, ends, self.run_one(session, stmt))
            .await
    }

    async fn run_one(
        self: &Arc<Self>,
        session: &SessionContext,
        mut stmt: DFStatement,
    ) -> Result<StatementResult> {
        if let Some(done) = self.primary_statement(session, &mut stmt).await? {
            return Ok(done);
        }
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
    pub(super) async fn resolve_execute(
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

    pub(super) async fn run_logical(
        self: &Arc<Self>,
        session: &SessionContext,
        state: SessionState,
        plan: LogicalPlan,
        workers: Vec<NodeId>,
        placement: Option<TablePlacement>,
    ) -> Result<StatementResult> {
        if let Some(done) = self.primary_plan(session, &state, &plan, &workers).await? {
            return Ok(done);
        }
        match plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) => {
                self.create_table(state, cmd, workers, placement).await
            }
            LogicalPlan::Ddl(DdlStatement::CreateExternalTable(cmd)) => {
                self.create_external_table(state, *cmd, workers).await
            }
            LogicalPlan::Ddl(DdlStatement::DropTable(cmd)) => self.drop_table(cmd, &workers).await,
            LogicalPlan::Copy(mut copy) => {
                self.config.local_files.check_location(&copy.output_url)?;
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
                // The estimates the planner chose by, before the plan is cut into
                // stages (an exchange's receiver knows nothing of its sender's input).
                let estimates = state.config_options().explain.show_statistics.then(|| {
                    DisplayableExecutionPlan::new(physical.as_ref())
                        .set_show_statistics(true)
                        .indent(true)
                        .to_string()
                });
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
                if let Some(estimates) = estimates {
                    text.push_str(
                        "estimated statistics of the plan before it is cut into stages:\n",
                    );
                    text.push_str(&estimates);
                }
                text_result("plan", text.lines().map(String::from).collect())
            }
            LogicalPlan::Analyze(a) => {
                let planning = Instant::now();
                let physical = state.create_physical_plan(&a.input).await?;
                let dplan = self.distribute(state.config_options(), physical, workers.len())?;
                let planned = planning.elapsed();
                let start = Instant::now();
                let run = self.execute(&state, &dplan, &workers, true).await?;
                let rows: usize = run.batches.iter().map(|b| b.num_rows()).sum();
                let mut lines = vec![
                    format!(
                        "query returned {rows} rows in {:.3} s over {} workers",
                        start.elapsed().as_secs_f64(),
                        workers.len()
                    ),
                    run.phases.describe(planned),
                ];
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
            plan if is_plain_query(&plan) => self.run_read(session, state, plan, workers).await,
            plan => self.run_query(state, plan, workers).await,
        }
    }

    /// Plans and runs a query that only reads, once more on the remaining workers if
    /// it lost one of its workers ([`super::retry`]).
    async fn run_read(
        self: &Arc<Self>,
        session: &SessionContext,
        state: SessionState,
        plan: LogicalPlan,
        workers: Vec<NodeId>,
    ) -> Result<StatementResult> {
        let replan = Replan {
            session: session.clone(),
            plan,
        };
        let physical = state.create_physical_plan(&replan.plan).await?;
        let dplan = self.distribute(state.config_options(), physical, workers.len())?;
        let mut attempt = (state, dplan, workers);
        let mut retried = false;
        loop {
            let (state, dplan, workers) = &attempt;
            let error = match self.execute(state, dplan, workers, false).await {
                Ok(run) => {
                    return Ok(StatementResult {
                        schema: dplan.final_stage().plan.schema(),
                        batches: run.batches,
                    });
                }
                Err(e) if retried || crate::execution::writes(dplan) => return Err(e),
                Err(e) => e,
            };
            let Some(death) = self.lost_worker(workers, &error).await else {
                return Err(error);
            };
            attempt = self.plan_again(&replan, error, &death).await?;
            retried = true;
        }
    }

    /// Plans and runs a query or DML statement on the cluster.
    pub(super) async fn run_query(
        self: &Arc<Self>,
        state: SessionState,
        plan: LogicalPlan,
        workers: Vec<NodeId>,
    ) -> Result<StatementResult> {
        let physical = state.create_physical_plan(&plan).await?;
        let dplan = self.distribute(state.config_options(), physical, workers.len())?;
        // Inserts and parallel COPYs return one count per worker.
        let counts = crate::execution::counts_rows(&dplan);
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

    /// Runs `sql` like [`Coordinator::sql`], recording its progress in `progress`.
    pub async fn sql_with_progress(
        self: &Arc<Self>,
        session: &SessionContext,
        sql: &str,
        progress: Arc<StatementProgress>,
    ) -> Result<Vec<StatementResult>> {
        STATEMENT.scope(progress, self.sql_in(session, sql)).await
    }
}

/// Reads `PARTITION BY col` of a `CREATE TABLE` (removing it, since DataFusion
/// does not know it) as the table's hash placement.
pub(super) fn take_partition_by(stmt: &mut DFStatement) -> Result<Option<TablePlacement>> {
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

/// Whether a statement ends a transaction (it runs even after a failed statement).
fn ends_transaction(stmt: &DFStatement) -> bool {
    matches!(stmt, DFStatement::Statement(s)
        if matches!(s.as_ref(), SqlStatement::Commit { .. } | SqlStatement::Rollback { .. }))
}

/// Whether a plan only reads (its result can be produced lazily, as the client pulls).
pub(super) fn is_plain_query(plan: &LogicalPlan) -> bool {
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
