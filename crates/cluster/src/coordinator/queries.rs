//! The query lifecycle: registering a query, starting its stages on the workers,
//! collecting its result, ending it everywhere, and its metrics.

use super::*;
use crate::column_stats;
use gyre_transport::design::Design;

impl Coordinator {
    /// The coordinator's task context for a query planned in `state`: the session's
    /// settings and runtime (its memory limit, say), as `SHOW` and
    /// `information_schema` report them.
    pub(super) fn task_ctx(&self, state: &SessionState, qc: QueryContext) -> Arc<TaskContext> {
        let mut config = state.config().clone();
        if let Some(own) = config.get_extension::<SessionPartitions>() {
            config.options_mut().execution.target_partitions = own.0;
        }
        config.set_extension(Arc::new(qc));
        crate::session::task_ctx_with(state, config)
    }

    /// Allocates a query id and its failure channel, and builds the coordinator's task context.
    pub(crate) fn register_query(
        &self,
        state: &SessionState,
        workers: &[NodeId],
    ) -> Result<RegisteredQuery> {
        let design = self.shuffle_design(state)?;
        let hosts: Vec<(NodeId, Option<String>)> = {
            let members = self.members.read();
            workers
                .iter()
                .map(|&w| (w, members.get(&w).and_then(|m| m.host_shuffle.clone())))
                .collect()
        };
        crate::host_shuffle::check_workers(design, self.shuffle.as_ref(), hosts)?;
        let query = self.next_query.fetch_add(1, Ordering::SeqCst);
        let qc = QueryContext {
            query_id: query,
            transport: crate::host_shuffle::transport_for(
                design,
                Arc::new(self.transport.clone()),
                self.shuffle.as_ref(),
            )?,
            workers: workers.to_vec(),
            compression: GyreOptions::of(state.config_options()).compression,
            runtime_filters: Default::default(),
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
            design,
            ctx,
            fail_tx,
            fail_rx,
        })
    }

    /// Sends every worker its stages of `dplan`; they start at once and stream into each
    /// other. (Starting the coordinator's own stages while the answers come back
    /// measured no faster in `gyre bench latency`: the answers are not on the path of
    /// the first rows.)
    pub(crate) async fn start_worker_stages(
        &self,
        state: &SessionState,
        query: u64,
        design: Design,
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
                shuffle_design: Some(design.name().to_string()),
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
        if let Some(s) = &self.shuffle {
            s.release_query(query);
        }
        reports
    }

    /// Bytes its exchanges moved to and from workers, over TCP and shared memory.
    pub fn traffic(&self) -> crate::host_shuffle::Traffic {
        crate::host_shuffle::Traffic::of(&self.transport, self.shuffle.as_ref())
    }

    /// The design the session's queries exchange by (`gyre.shuffle_design`).
    pub(crate) fn shuffle_design(&self, state: &SessionState) -> Result<Design> {
        crate::host_shuffle::design_of(
            &GyreOptions::of(state.config_options()),
            self.shuffle.as_ref(),
        )
    }

    /// Runs a distributed plan and collects the final stage's batches.
    pub async fn execute(
        self: &Arc<Self>,
        state: &SessionState,
        dplan: &DistributedPlan,
        workers: &[NodeId],
        analyze: bool,
    ) -> Result<QueryRun> {
        let began = Instant::now();
        let mut run = QueryExecution::start(self, state, dplan, workers).await?;
        let started = Instant::now();
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
        let ran = Instant::now();
        // A query that only reads, whose figures nobody asked for, ends on the workers
        // while its result goes back: the caller does not wait for that round trip.
        let reports = if failure.is_none() && !analyze && run.reads_only() {
            run.finish_in_background();
            StageReports::default()
        } else {
            run.finish(failure.is_none(), analyze).await
        };
        let phases = QueryPhases {
            start: started - began,
            run: ran - started,
            finish: ran.elapsed(),
        };
        tracing::debug!(?phases, "query phases");
        if let Some(e) = failure {
            return Err(e);
        }
        let mut report = String::new();
        if analyze {
            report = self.render_report(dplan, workers, &reports);
        }
        Ok(QueryRun {
            batches,
            report,
            phases,
        })
    }

    /// Tells every worker the query is over and collects their reports.
    pub(super) async fn finish(
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
        let mut changed = BTreeSet::new();
        for (w, resp) in futures::future::join_all(calls).await {
            if let Some(Response::Finished { stages, tables }) = resp {
                let mut stats = self.part_stats.lock();
                for (table, s) in tables {
                    stats.entry(table.clone()).or_default().insert(w, s);
                    changed.insert(table);
                }
                out.insert(w, stages);
            }
        }
        // Once per table, after every worker's figures are in: merging the
        // parts' column sketches is the costly part.
        let stats = self.part_stats.lock();
        for table in changed {
            self.refresh_table_stats(&table, &stats);
        }
        out
    }

    pub(super) fn refresh_table_stats(
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
        meta.columns = column_stats::merge_parts(
            per_worker.values().map(|s| s.columns.as_slice()),
            &meta.schema,
        );
        let provider = Arc::new(DistributedTable { meta: meta.clone() });
        drop(tables);
        let _ = self.ctx.deregister_table(TableReference::bare(table));
        let _ = self
            .ctx
            .register_table(TableReference::bare(table), provider);
    }

    pub(super) fn render_report(
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
}
