//! The catalog: tables in worker memory (created, filled, dropped), tables that
//! follow their files, and the TPC-H generator's tables.

use super::*;

impl Coordinator {
    pub(super) fn register(&self, meta: TableMeta) -> Result<()> {
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
    pub(super) fn table_name(&self, r: &TableReference) -> Result<String> {
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

    /// What a CREATE does when `name` is taken, as in DataFusion: `Some` ends the
    /// statement (IF NOT EXISTS); `None` goes on (a free name, or OR REPLACE).
    fn name_taken(
        &self,
        name: &str,
        if_not_exists: bool,
        or_replace: bool,
    ) -> Result<Option<StatementResult>> {
        if !self.exists(name) {
            return Ok(None);
        }
        if if_not_exists && or_replace {
            return Err(exec_err("'IF NOT EXISTS' cannot coexist with 'REPLACE'"));
        }
        if if_not_exists {
            return no_result().map(Some);
        }
        if !or_replace {
            return Err(exec_err(format!("Table '{name}' already exists")));
        }
        Ok(None)
    }

    /// Claims `name` for a statement that creates it, until the returned guard drops.
    pub(super) fn reserve(&self, name: &str) -> Result<NameReservation> {
        if !self.creating.lock().insert(name.to_string()) {
            return plan_err!("table '{name}' is being created by another statement");
        }
        Ok(NameReservation {
            names: Arc::clone(&self.creating),
            name: name.to_string(),
        })
    }

    /// Creates an empty distributed table on `workers`.
    pub(super) async fn create_empty_table(
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
        self.forget_file_table(name).await;
        self.streams.write().remove(name);
        self.register(TableMeta {
            name: name.to_string(),
            column_bytes: vec![0; schema.fields().len()],
            columns: vec![],
            schema,
            placement,
            workers: workers.to_vec(),
            rows: 0,
            rules,
        })
    }

    /// Inserts the rows of `input` (a logical plan) into table `name`.
    pub(super) async fn insert(
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

    pub(super) async fn create_table(
        self: &Arc<Self>,
        state: SessionState,
        cmd: CreateMemoryTable,
        workers: Vec<NodeId>,
        placement: Option<TablePlacement>,
    ) -> Result<StatementResult> {
        let name = self.table_name(&cmd.name)?;
        let reservation = self.reserve(&name)?;
        if let Some(done) = self.name_taken(&name, cmd.if_not_exists, cmd.or_replace)? {
            return Ok(done);
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
    pub(super) async fn fill_or_drop(
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

    pub(super) async fn create_external_table(
        self: &Arc<Self>,
        state: SessionState,
        mut cmd: CreateExternalTable,
        workers: Vec<NodeId>,
    ) -> Result<StatementResult> {
        if cmd.temporary {
            return not_impl_err!("Temporary tables not supported");
        }
        let name = self.table_name(&cmd.name)?;
        // The statement as given, Gyre's options in it, for the durable catalog.
        let definition = (!cmd.unbounded)
            .then(|| file_table_definition(&cmd))
            .flatten();
        // Gyre's own options and the object store's; DataFusion's file formats reject
        // unknown namespaces.
        let partition_by = cmd.options.remove("gyre.partition_by");
        let read_on = ReadOn::parse(cmd.options.remove("gyre.read_on"))?;
        let store_options = take_store_options(&mut cmd.options);
        let reservation = self.reserve(&name)?;
        if let Some(done) = self.name_taken(&name, cmd.if_not_exists, cmd.or_replace)? {
            return Ok(done);
        }
        if workers.is_empty() {
            return plan_err!("cannot create table '{name}': no workers are alive");
        }
        let locations = cmd.locations.join(", ");
        for location in &cmd.locations {
            self.config.local_files.check_location(location)?;
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
        if let Some(definition) = definition {
            self.log_file_table(&name, Some(definition)).await;
        }
        self.file_tables.write().insert(name, files);
        no_result()
    }

    /// Records in the primary's log that table `name` follows its files as
    /// `definition` says (`None`: no longer), so that a coordinator that restarts or is
    /// elected loads it again. A log that cannot take it (the primary lost its lead, a
    /// disk failed) leaves the table in memory for now, and says so.
    async fn log_file_table(&self, name: &str, definition: Option<Vec<u8>>) {
        let db = Arc::clone(&self.primary);
        let table = name.to_string();
        let logged = tokio::task::spawn_blocking(move || db.set_file_table(&table, definition))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(e) = logged {
            tracing::warn!("the catalog of tables on files could not record '{name}': {e}");
        }
    }

    /// Forgets that table `name` follows files, in the durable catalog too.
    async fn forget_file_table(&self, name: &str) {
        let followed = self.file_tables.write().remove(name).is_some();
        if followed {
            self.log_file_table(name, None).await;
        }
    }

    /// Loads again every table of the durable catalog that follows its files, once
    /// workers are in: a coordinator that restarted on its data directory, or was
    /// elected, knows them as the one before did.
    pub(super) async fn reload_file_tables(self: Arc<Self>) {
        let tables: Vec<(String, Arc<[u8]>)> = self
            .primary
            .catalog()
            .file_tables()
            .map(|(n, d)| (n.clone(), Arc::clone(d)))
            .collect();
        if tables.is_empty() {
            return;
        }
        if let Err(e) = self.wait_for_workers(1, FILE_TABLES_WAIT).await {
            tracing::warn!("tables on files not loaded again: {e}");
            return;
        }
        let _ = self.started().await;
        // The workers of a cluster whose coordinator restarted come back within a
        // second or so: load over all of them, once their number stays put.
        let mut seen = self.live_workers().len();
        let mut steady = 0;
        while steady < FILE_TABLES_STEADY {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.live_workers().len();
            steady = if now == seen { steady + 1 } else { 0 };
            seen = now;
        }
        for (name, definition) in tables {
            if self.exists(&name) {
                continue;
            }
            match self.load_file_table(&definition).await {
                Ok(()) => tracing::info!("table '{name}' loaded again from its files"),
                Err(e) => tracing::warn!("table '{name}' could not be loaded again: {e}"),
            }
        }
    }

    async fn load_file_table(self: &Arc<Self>, definition: &[u8]) -> Result<()> {
        let plan =
            datafusion_proto::bytes::logical_plan_from_bytes(definition, &self.ctx.task_ctx())?;
        let LogicalPlan::Ddl(DdlStatement::CreateExternalTable(cmd)) = plan else {
            return plan_err!("the catalog holds something else than CREATE EXTERNAL TABLE");
        };
        let workers = self.live_workers();
        let state = self.query_state(&self.default_session, &workers);
        self.create_external_table(state, *cmd, workers)
            .await
            .map(|_| ())
    }

    /// Whether a table (distributed, transactional or a stream) is called `name`.
    pub(super) fn exists(&self, name: &str) -> bool {
        self.tables.read().contains_key(name)
            || self.streams.read().contains(name)
            || self.is_primary(name)
    }

    pub(super) fn file_table(&self, name: &str) -> Option<Arc<FileTable>> {
        self.file_tables.read().get(name).cloned()
    }

    /// Brings every table loaded from files that `plan` reads up to date with its files
    /// ([`crate::files::follow`]): loads the files added since, or the table anew when a
    /// file it loaded changed or went away.
    pub(super) async fn follow_files(
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
    pub(super) fn write_to_files(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
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
    pub(super) async fn delete_all(
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
    pub(super) async fn drop_everywhere(&self, name: &str, workers: &[NodeId]) {
        self.tables.write().remove(name);
        self.forget_file_table(name).await;
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

    pub(super) async fn drop_by_name(&self, name: &str, workers: &[NodeId]) -> Result<()> {
        self.tables.write().remove(name);
        self.forget_file_table(name).await;
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

    pub(super) async fn drop_table(
        &self,
        cmd: DropTable,
        workers: &[NodeId],
    ) -> Result<StatementResult> {
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
        self.load_tpch_placed(sf, false).await
    }

    /// Generates TPC-H at scale factor `sf` in place: hash-placed as
    /// [`Self::load_tpch`], or `chunked`: worker `i` keeps the `i`-th of the generator's
    /// parts (dbgen's `-C n -S i+1`), so each holds a contiguous range of order keys
    /// and the other clustering of generation order.
    pub async fn load_tpch_placed(self: &Arc<Self>, sf: f64, chunked: bool) -> Result<()> {
        for table in tpch::TABLES {
            let workers = self.live_workers();
            let state = self.query_state(&self.default_session, &workers);
            let schema = tpch::schema(table)?;
            let column = tpch::primary_key(table).expect("tpch table").to_string();
            let _ = self.drop_by_name(table, &workers).await;
            self.create_empty_table(
                table,
                Arc::clone(&schema),
                match chunked {
                    true => TablePlacement::Chunked,
                    false => TablePlacement::Hash { column },
                },
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

    /// The catalog entry of a table.
    pub fn table(&self, name: &str) -> Option<TableMeta> {
        self.tables.read().get(name).cloned()
    }

    pub fn table_names(&self) -> Vec<String> {
        self.tables.read().keys().cloned().collect()
    }
}

/// Where `CREATE EXTERNAL TABLE` reads its files (`gyre.read_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadOn {
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

/// A TPC-H table as a source: scanned, it generates its rows on the workers.
#[derive(Debug)]
pub(super) struct TpchSource {
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

/// A table name claimed by the statement creating it; released on drop.
pub(super) struct NameReservation {
    names: Arc<Mutex<std::collections::HashSet<String>>>,
    name: String,
}

impl Drop for NameReservation {
    fn drop(&mut self) {
        self.names.lock().remove(&self.name);
    }
}

/// The tables `plan` scans, also in its subqueries and the views it reads.
pub(super) fn scanned_tables(plan: &LogicalPlan, names: &mut BTreeSet<String>) {
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

/// How long a coordinator that starts waits for a worker to load its tables on files
/// into.
const FILE_TABLES_WAIT: Duration = Duration::from_secs(300);

/// Half-seconds the number of workers must stay put before the tables on files are
/// loaded again.
const FILE_TABLES_STEADY: u32 = 4;

/// `cmd` encoded for the durable catalog (DataFusion's logical plan protobuf); `None`
/// (with a warning) if it cannot be.
fn file_table_definition(cmd: &CreateExternalTable) -> Option<Vec<u8>> {
    let plan = LogicalPlan::Ddl(DdlStatement::CreateExternalTable(Box::new(cmd.clone())));
    match datafusion_proto::bytes::logical_plan_to_bytes(&plan) {
        Ok(bytes) => Some(bytes.to_vec()),
        Err(e) => {
            tracing::warn!(
                "table {} will not be loaded again after a restart: {e}",
                cmd.name
            );
            None
        }
    }
}
