//! Stage plans: the DataFusion protobuf plan with Gyre's extension nodes, as a worker
//! decodes it from the coordinator's `StartQuery`.

use crate::in_runtime;
use datafusion::common::ScalarValue;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_plan::ExecutionPlan;
use gyre_cluster::LocalCluster;
use gyre_cluster::codec::GyreCodec;
use gyre_cluster::files::{FileSplitScanExec, LocalFiles};
use gyre_cluster::modify::{GyreModifyExec, Modification};
use gyre_cluster::progress::ReadCounters;
use gyre_cluster::snapshot_scan::{Placement, SnapshotScanExec, SnapshotTable};
use gyre_cluster::storage::WorkerStorage;
use gyre_cluster::table::GyreInsertExec;
use gyre_cluster::tpch::TpchGenExec;
use std::sync::{Arc, LazyLock};

/// The worker's decoding context: `worker_session` (its function registries) with the
/// extensions `Worker::task_ctx` adds that can be built without a running worker.
/// The `QueryContext` (a live transport) is left out: decoding never reads it.
static PLAN_CTX: LazyLock<Arc<TaskContext>> = LazyLock::new(|| {
    let mut state = gyre_cluster::session::worker_session(None, &LocalFiles::Anywhere)
        .expect("a worker session");
    let config = state
        .config()
        .clone()
        .with_extension(Arc::new(ReadCounters::default()))
        .with_extension(Arc::new(WorkerStorage::default()));
    *state.config_mut() = config;
    state.task_ctx()
});

/// Settings (`;` between several) and statements the plan seeds are planned with:
/// every exchange mode, the join strategies (broadcast, shuffle, Flow-, cyclo-, Neo-Join),
/// run-time filters, file scans, window top-k, inserts, a parallel COPY.
const PLAN_QUERIES: &[(&str, &str)] = &[
    (
        "",
        "SELECT g, count(*), sum(f), avg(d), min(s), max(ts) FROM a GROUP BY g",
    ),
    (
        "",
        "SELECT a.s, b.name FROM a JOIN b ON a.k = b.k WHERE a.f > 10",
    ),
    (
        "",
        "SELECT * FROM a ORDER BY f DESC, s NULLS FIRST LIMIT 10",
    ),
    ("", "SELECT count(*) FROM a"),
    (
        "SET gyre.join_strategy = 'shuffle'",
        "SELECT a.g, count(*) FROM a JOIN b ON a.g = b.h GROUP BY a.g ORDER BY a.g",
    ),
    (
        "SET gyre.join_strategy = 'broadcast'",
        "SELECT * FROM a JOIN b ON a.k = b.k",
    ),
    (
        "SET gyre.join_strategy = 'cyclo'",
        "SELECT a.k, a.s, b.name FROM a JOIN b ON a.k = b.k",
    ),
    (
        "SET gyre.join_strategy = 'cyclo'",
        "SELECT a.s, b.name FROM a JOIN b ON a.k = b.k AND a.f > b.h",
    ),
    (
        "",
        "SELECT count(*) FROM a JOIN b ON a.k BETWEEN b.k AND b.k + 3",
    ),
    (
        "SET gyre.join_strategy = 'cyclo'",
        "SELECT * FROM a FULL JOIN b ON a.k = b.k",
    ),
    (
        "SET gyre.runtime_filters = true",
        "SELECT a.s, b.name FROM a JOIN b ON a.k = b.k WHERE b.h = 3",
    ),
    (
        "SET gyre.skew_detection = false",
        "SELECT a.k, b.h FROM a LEFT JOIN b ON a.g = b.h",
    ),
    (
        "",
        "SELECT * FROM (SELECT k, g, row_number() OVER (PARTITION BY g ORDER BY f DESC) AS rn \
         FROM a) WHERE rn <= 3",
    ),
    (
        "",
        "SELECT k, g, rank() OVER (PARTITION BY g ORDER BY f) AS r, \
         sum(f) OVER (ORDER BY k ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM a",
    ),
    ("", "SELECT DISTINCT g FROM a UNION ALL SELECT h FROM b"),
    (
        "",
        "SELECT * FROM a WHERE k NOT IN (SELECT k FROM b) AND EXISTS (SELECT 1 FROM b WHERE b.h = a.g)",
    ),
    (
        "",
        "SELECT CASE WHEN b THEN upper(s) ELSE lower(s) END, date_trunc('day', ts), \
         regexp_replace(s, 's(\\d)', 'x$1'), coalesce(d, 0), CAST(f AS BIGINT) % 3, \
         k IN (1, 2, 3), s LIKE 's1%', to_char(ts, '%Y') FROM a \
         WHERE ts > TIMESTAMP '1970-01-01 05:00:00' AND g <> 2",
    ),
    (
        "",
        "SELECT g, approx_percentile_cont(0.5) WITHIN GROUP (ORDER BY f), array_agg(k), \
         string_agg(s, ','), count(DISTINCT k) FROM a GROUP BY g HAVING count(*) > 1",
    ),
    (
        "",
        "SELECT name, sum(age), avg(age) FROM people GROUP BY name",
    ),
    ("", "SELECT p.name, a.s FROM people p JOIN a ON p.id = a.k"),
    ("", "INSERT INTO b SELECT k, g, s FROM a WHERE k < 10"),
    (
        "SET datafusion.optimizer.enable_window_topn = true",
        "SELECT * FROM (SELECT k, g, f, row_number() OVER (PARTITION BY g ORDER BY f DESC) AS rn \
         FROM a) WHERE rn <= 3",
    ),
    (
        "SET gyre.join_strategy = 'shuffle'",
        "SELECT a.g, b.name FROM a JOIN b ON a.k = b.k WHERE b.h = 3",
    ),
    (
        "SET gyre.runtime_filters = true; SET gyre.join_strategy = 'shuffle'; \
         SET gyre.skew_detection = false",
        "SELECT a.f, b.name FROM a JOIN b ON a.g = b.k WHERE b.h = 3",
    ),
    (
        "SET gyre.join_kernel = 'radix'; SET gyre.join_strategy = 'shuffle'",
        "SELECT a.s, b.name FROM a LEFT JOIN b ON a.k = b.k AND a.f > b.h",
    ),
    (
        "SET gyre.join_strategy = 'neo'",
        "SELECT a.s, b.name FROM a JOIN b ON a.k = b.k AND a.f > b.h",
    ),
    (
        "SET gyre.join_strategy = 'neo'",
        "SELECT g, count(*), sum(f) FROM a GROUP BY g",
    ),
    // `{dir}`: a temporary directory.
    (
        "",
        "COPY (SELECT k, s FROM a WHERE g = 1) TO '{dir}/copy' STORED AS PARQUET",
    ),
];

/// Stage plans as the coordinator sends them: every stage of every query in
/// [`PLAN_QUERIES`], planned over a two-worker `LocalCluster` and encoded by
/// `GyreCodec`, plus Gyre nodes that only DML, table loading and reads of
/// transactional tables make (modify, TPC-H generation, snapshot scans). Each seed is
/// checked to decode.
pub fn seeds() -> Vec<Vec<u8>> {
    let seeds = in_runtime(|| async {
        let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().expect("an address"))
            .await
            .expect("a local cluster");
        let c = Arc::clone(&cluster.coordinator);
        c.sql(
            "CREATE TABLE a AS SELECT value AS k, value % 7 AS g, CAST(value AS DOUBLE) * 1.5 AS f, \
             concat('s', value) AS s, CAST(value AS DECIMAL(12, 2)) AS d, \
             to_timestamp(value * 3600) AS ts, value % 2 = 0 AS b \
             FROM generate_series(1, 2000) AS t(value)",
        )
        .await
        .expect("table a");
        c.sql(
            "CREATE TABLE b AS SELECT value AS k, value % 13 AS h, concat('b', value) AS name \
             FROM generate_series(1, 500) AS t(value)",
        )
        .await
        .expect("table b");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let csv = dir.path().join("people.csv");
        let rows: String = (0..200)
            .map(|i| format!("{i},name{},{}\n", i % 17, 20 + i % 50))
            .collect();
        std::fs::write(&csv, format!("id,name,age\n{rows}")).expect("a CSV file");
        c.sql(&format!(
            "CREATE EXTERNAL TABLE people STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'true')",
            csv.display()
        ))
        .await
        .expect("a CSV table");
        let workers = c.live_workers();
        let n = workers.len();
        let codec = GyreCodec;
        let mut seeds = vec![];
        for (set, sql) in PLAN_QUERIES {
            let session = c.new_session();
            for set in set.split(';').filter(|s| !s.trim().is_empty()) {
                c.sql_in(&session, set).await.expect("a setting");
            }
            let state = c.query_state(&session, &workers);
            let sql = &sql.replace("{dir}", &dir.path().display().to_string());
            let logical = state.create_logical_plan(sql).await.expect(sql);
            let physical = state.create_physical_plan(&logical).await.expect(sql);
            let dplan = c
                .distribute(state.config_options(), physical, n)
                .expect(sql);
            for stage in &dplan.stages {
                seeds.push(codec.encode_plan(Arc::clone(&stage.plan)).expect(sql));
            }
        }
        // Nodes of DML and loading, built as the coordinator builds them: a file split
        // scan over the CSV file's scan, modifications, a generated table's insert.
        let people = {
            let ctx = datafusion::prelude::SessionContext::new();
            ctx.register_csv(
                "people",
                &csv.display().to_string(),
                datafusion::prelude::CsvReadOptions::new(),
            )
            .await
            .expect("a CSV table");
            let df = ctx.sql("SELECT * FROM people").await.expect("a scan");
            df.create_physical_plan().await.expect("a scan")
        };
        let csv_scan = find_file_scan(&people).expect("a file scan of people");
        let a = c.table("a").expect("table a").schema.clone();
        let k = || Arc::new(Column::new("k", 0));
        let gt = Arc::new(BinaryExpr::new(
            k(),
            Operator::Gt,
            Arc::new(Literal::new(ScalarValue::Int64(Some(5)))),
        ));
        let doubled = Arc::new(BinaryExpr::new(k(), Operator::Multiply, k()));
        // Scans of a transactional table at a snapshot, whole on each worker or
        // partitioned, with and without the key projected.
        let snapshot_scan = |placement: Placement, projection: Vec<usize>| {
            let table = SnapshotTable {
                name: "a".into(),
                schema: Arc::clone(&a),
                key: vec![0, 1],
                placement,
                rows: 2000,
            };
            Arc::new(SnapshotScanExec::try_new(table, Some(projection), 42, n).expect("a scan"))
        };
        let plans: Vec<Arc<dyn ExecutionPlan>> = vec![
            snapshot_scan(Placement::Full, vec![3, 1, 0]),
            snapshot_scan(Placement::Partitioned, vec![2]),
            snapshot_scan(Placement::Chunked, vec![2]),
            Arc::new(FileSplitScanExec::try_new(csv_scan).expect("a split scan")),
            Arc::new(GyreModifyExec::new(
                "a".into(),
                Arc::clone(&a),
                n,
                vec![gt.clone()],
                Modification::Delete,
            )),
            Arc::new(GyreModifyExec::new(
                "a".into(),
                a,
                n,
                vec![gt],
                Modification::Update(vec![(0, doubled)]),
            )),
            Arc::new(GyreInsertExec::new(
                Arc::new(TpchGenExec::try_new("lineitem", 0.01, n).expect("a TPC-H generator")),
                "lineitem".into(),
                Some(0),
            )),
        ];
        for p in plans {
            seeds.push(codec.encode_plan(p).expect("an encodable node"));
        }
        drop(cluster);
        seeds
    });
    for s in &seeds {
        GyreCodec.decode_plan(s, &PLAN_CTX).expect("a seed decodes");
    }
    seeds
}

/// The configuration of the first file scan in `plan`.
fn find_file_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<FileScanConfig> {
    if let Some(config) = plan
        .downcast_ref::<DataSourceExec>()
        .and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
    {
        return Some(config.clone());
    }
    plan.children().into_iter().find_map(find_file_scan)
}

/// Decodes one stage plan as `Worker::start_query` does.
pub fn run(input: &[u8]) {
    let _ = GyreCodec.decode_plan(input, &PLAN_CTX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn names(plan: &Arc<dyn ExecutionPlan>, into: &mut BTreeSet<String>) {
        into.insert(plan.name().to_string());
        for c in plan.children() {
            names(c, into);
        }
    }

    /// Every node Gyre's codec adds to DataFusion's is in some seed, so the fuzzers
    /// start from each of their decoders.
    #[test]
    fn the_seeds_hold_every_node_gyre_encodes() {
        let mut found = BTreeSet::new();
        for s in seeds() {
            names(
                &GyreCodec
                    .decode_plan(&s, &PLAN_CTX)
                    .expect("a seed decodes"),
                &mut found,
            );
        }
        for node in [
            "GyreScanExec",
            "GyreInsertExec",
            "TpchGenExec",
            "ExchangeSenderExec",
            "ExchangeReceiverExec",
            "FilterSourceExec",
            "FilterTargetExec",
            "FlowJoinExec",
            "FileSplitScanExec",
            "FileCopyExec",
            "GyreModifyExec",
            "PartitionedTopKExec",
            "CycloJoinExec",
            "RadixJoinExec",
            "NeoJoinExec",
            "NeoAggregateExec",
        ] {
            assert!(
                found.contains(node),
                "no seed has {node}; the seeds have {found:?}"
            );
        }
    }
}
