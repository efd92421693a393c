//! DataFusion session setup shared by the coordinator and the workers.

use crate::files::LocalFiles;
use crate::table::DistributedTable;
use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::Result;
use datafusion::common::Statistics;
use datafusion::common::config::ConfigOptions;
use datafusion::execution::cache::cache_manager::CacheManagerConfig;
use datafusion::execution::context::SessionState;
use datafusion::execution::memory_pool::{GreedyMemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::TableScan;
use datafusion::optimizer::{Optimizer, OptimizerRule};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};
use gyre_exchange::Compression;
use gyre_planner::{DistributedJoinSelection, GyreOptions, JoinReorder};
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, LazyLock};

/// A task context of `state` with `config` in place of its own. Built from the state's
/// parts, as DataFusion's `SessionState::task_ctx` does, without first cloning the whole
/// state (its function registries, rules and catalogs) to change the configuration:
/// both the coordinator and every worker make one per query.
pub fn task_ctx_with(state: &SessionState, config: SessionConfig) -> Arc<TaskContext> {
    Arc::new(TaskContext::new(
        None,
        state.session_id().to_string(),
        config,
        state.scalar_functions().clone(),
        state.higher_order_functions().clone(),
        state.aggregate_functions().clone(),
        state.window_functions().clone(),
        Arc::clone(state.runtime_env()),
    ))
}

/// The configuration every distributed plan is made with, Gyre's settings included.
fn distributed_config() -> SessionConfig {
    let mut config = SessionConfig::new()
        .with_information_schema(true)
        .with_default_catalog_and_schema("datafusion", "public");
    let opts = config.options_mut();
    opts.extensions.insert(GyreOptions::default());
    // Uncorrelated scalar subqueries become joins, which distribute; the physical
    // scalar-subquery operator shares its results through process memory.
    opts.optimizer.enable_physical_uncorrelated_scalar_subquery = false;
    // Dynamic filters connect operators through shared memory, which stages on
    // different workers do not have.
    opts.optimizer.enable_dynamic_filter_pushdown = false;
    opts.optimizer.enable_join_dynamic_filter_pushdown = false;
    opts.optimizer.enable_topk_dynamic_filter_pushdown = false;
    opts.optimizer.enable_aggregate_dynamic_filter_pushdown = false;
    config
}

/// The coordinator's planning context: DataFusion's optimiser with Gyre's join
/// distribution rule placed before DataFusion's own join selection.
pub fn coordinator_context() -> SessionContext {
    let mut rules: Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> =
        PhysicalOptimizer::new().rules;
    let at = rules
        .iter()
        .position(|r| r.name() == "join_selection")
        .unwrap_or(0);
    rules.insert(at, Arc::new(DistributedJoinSelection));
    // No cache of file listings: a table loaded from files follows them, so it must
    // see each listing as it is (DataFusion's cache would hide files written since).
    let runtime = RuntimeEnvBuilder::new()
        .with_cache_manager(CacheManagerConfig::default().with_list_files_cache_limit(0))
        .build_arc()
        .expect("a runtime without a listing cache");
    // Inner joins are reordered before projections are pruned, so that each pass of
    // the logical optimiser prunes the columns of the order it chose.
    let mut logical: Vec<Arc<dyn OptimizerRule + Send + Sync>> = Optimizer::new().rules;
    let at = logical
        .iter()
        .position(|r| r.name() == "optimize_projections")
        .unwrap_or(logical.len());
    logical.insert(at, Arc::new(JoinReorder::new(Arc::new(table_statistics))));
    let state = SessionStateBuilder::new()
        .with_config(distributed_config())
        .with_runtime_env(runtime)
        .with_default_features()
        .with_optimizer_rules(logical)
        .with_physical_optimizer_rules(rules)
        .build();
    SessionContext::new_with_state(state)
}

/// The statistics of a scanned Gyre table, for the join order: rows and the columns'
/// figures as the workers last reported them.
fn table_statistics(scan: &TableScan) -> Option<Statistics> {
    let provider = source_as_provider(&scan.source).ok()?;
    let table = provider.downcast_ref::<DistributedTable>()?;
    Some(table.statistics())
}

/// A worker's session: function registries for decoding plans and, with
/// `memory_limit`, a memory pool of that many bytes shared by every query it runs.
/// Operators that can spill (sorts, aggregations, sort-merge joins) spill to the
/// system's temporary directory when their share runs out; the others fail with
/// "Resources exhausted", naming the largest consumers. Local files are read and
/// written only as `local_files` allows.
pub fn worker_session(
    memory_limit: Option<usize>,
    local_files: &LocalFiles,
) -> Result<SessionState> {
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(limit) = memory_limit {
        let pool = TrackConsumersPool::new(
            GreedyMemoryPool::new(limit),
            NonZeroUsize::new(5).expect("five is not zero"),
        );
        runtime = runtime.with_memory_pool(Arc::new(pool));
    }
    let runtime = runtime.build_arc()?;
    local_files.confine(&runtime);
    Ok(SessionStateBuilder::new()
        .with_config(distributed_config())
        .with_runtime_env(runtime)
        .with_default_features()
        .build())
}

/// Parses a compression setting: `none`, `lz4`, `zstd` or `auto`.
pub fn parse_compression(s: Option<&str>) -> Result<Compression> {
    Compression::parse(s)
}

/// Execution settings (`datafusion.execution.*`) that a session changed: they travel
/// with its queries so that the workers run their stages as the session asked (batch
/// size, spilling, file reading). The partition count is the planner's, not the
/// workers'.
pub fn changed_execution_options(options: &ConfigOptions) -> Vec<(String, String)> {
    options
        .entries()
        .into_iter()
        .filter(|e| is_shipped_execution_option(&e.key))
        .filter(|e| EXECUTION_DEFAULTS.get(&e.key) != Some(&e.value))
        .filter_map(|e| Some((e.key, e.value?)))
        .collect()
}

fn is_shipped_execution_option(key: &str) -> bool {
    key.starts_with("datafusion.execution.") && key != "datafusion.execution.target_partitions"
}

/// The execution settings' defaults, computed once: every query compares with them.
static EXECUTION_DEFAULTS: LazyLock<HashMap<String, Option<String>>> = LazyLock::new(|| {
    distributed_config()
        .options()
        .entries()
        .into_iter()
        .filter(|e| is_shipped_execution_option(&e.key))
        .map(|e| (e.key, e.value))
        .collect()
});

/// Applies the execution settings a query brought ([`changed_execution_options`]) to
/// a worker's configuration; an unknown key or a wrong value is an error naming it.
pub fn apply_execution_options(
    config: &mut ConfigOptions,
    options: &[(String, String)],
) -> Result<()> {
    for (key, value) in options {
        if !key.starts_with("datafusion.execution.") {
            return datafusion::common::plan_err!(
                "a query may only bring execution settings, not '{key}'"
            );
        }
        config.set(key, value)?;
    }
    Ok(())
}
