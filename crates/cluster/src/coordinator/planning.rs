//! Planning a query for the cluster: the session's planning state over the live
//! workers, and the physical plan cut into stages.

use super::*;

impl Coordinator {
    /// A planning state of `session` for a query over `workers`: one partition per
    /// worker, and the workers the query runs on.
    pub fn query_state(&self, session: &SessionContext, workers: &[NodeId]) -> SessionState {
        let mut state = session.state();
        let config = state.config_mut();
        let own = config.options().execution.target_partitions;
        config.set_extension(Arc::new(SessionPartitions(own)));
        config.options_mut().execution.target_partitions = workers.len().max(1);
        config.set_extension(Arc::new(QueryWorkers(workers.to_vec())));
        config.set_extension(Arc::new(self.primary_snapshot(session)));
        state
    }

    /// Turns an optimised physical plan into stages over `n` workers (what `EXPLAIN`
    /// shows; the workers' stage plans are what they decode).
    pub fn distribute(
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
        let mut plan = split_into_stages(plan, n, &runs_on_workers)?;
        place_runtime_filters(&mut plan, &GyreOptions::of(config))?;
        Ok(plan)
    }
}

/// Nodes whose partition `i` must run on worker `i`: they read or write the worker's
/// own data (table partitions, file splits, files written by COPY).
pub(super) fn runs_on_workers(plan: &dyn ExecutionPlan) -> bool {
    plan.is::<GyreScanExec>()
        || plan.is::<crate::snapshot_scan::SnapshotScanExec>()
        || plan.is::<TpchGenExec>()
        || plan.is::<FileSplitScanExec>()
        || plan.is::<GyreInsertExec>()
        || plan.is::<GyreModifyExec>()
        || plan.is::<FileCopyExec>()
}

/// Replaces a COPY to a directory (DataFusion's single `DataSinkExec` over the merged
/// result) by a [`FileCopyExec`] that writes from every worker; other sinks stay.
pub(super) fn parallel_copy(
    plan: Arc<dyn ExecutionPlan>,
    n: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
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
