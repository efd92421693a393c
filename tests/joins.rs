//! Joins beyond TPC-H on 1 to 4 workers, each result compared with single-node
//! DataFusion: outer, semi, anti, non-equi, NULL keys, empty inputs, a worker
//! holding no rows, and input errors.

mod sql_reference;

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use gyre_cluster::LocalCluster;
use gyre_cluster::reference::canonical_rows;
use sql_reference::{differs, start, text};

const SETUP: &str = "
CREATE TABLE l (k INT, v VARCHAR) PARTITION BY k;
INSERT INTO l VALUES (1, 'a'), (2, 'b'), (2, 'bb'), (3, 'c'), (NULL, 'n1'), (5, 'e'), (8, 'h');
CREATE TABLE r (k INT PRIMARY KEY, w INT);
INSERT INTO r VALUES (2, 20), (3, 30), (4, 40), (6, 60), (8, 80);
CREATE TABLE rn (k INT, w INT);
INSERT INTO rn VALUES (NULL, 1), (2, 2), (NULL, 3), (9, 9);
CREATE TABLE e (k INT, x INT);
CREATE TABLE one (k INT) PARTITION BY k;
INSERT INTO one VALUES (7);
CREATE TABLE big AS SELECT value AS k, value % 7 AS g FROM generate_series(1, 5000) AS t(value);
";

const QUERIES: &[&str] = &[
    "SELECT l.k, v, w FROM l JOIN r ON l.k = r.k",
    "SELECT l.k, v, w FROM l LEFT JOIN r ON l.k = r.k",
    "SELECT r.k, v, w FROM l RIGHT JOIN r ON l.k = r.k",
    "SELECT l.k, r.k, v, w FROM l FULL JOIN r ON l.k = r.k",
    "SELECT * FROM l WHERE k IN (SELECT k FROM r)",
    "SELECT * FROM l WHERE k NOT IN (SELECT k FROM r)",
    "SELECT * FROM l WHERE k NOT IN (SELECT k FROM rn)",
    "SELECT * FROM l WHERE EXISTS (SELECT 1 FROM r WHERE r.k = l.k)",
    "SELECT * FROM l WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.k = l.k)",
    "SELECT l.k, rn.w FROM l JOIN rn ON l.k = rn.k",
    "SELECT l.k, rn.w FROM l LEFT JOIN rn ON l.k = rn.k",
    "SELECT l.k, rn.w FROM l FULL JOIN rn ON l.k = rn.k",
    "SELECT l.k, r.k FROM l JOIN r ON l.k < r.k",
    "SELECT l.k, r.k FROM l LEFT JOIN r ON l.k + 1 = r.k OR l.k > 7",
    "SELECT l.k, r.k FROM l FULL JOIN r ON l.k BETWEEN r.k - 1 AND r.k + 1",
    "SELECT l.k, r.w FROM l, r WHERE l.k > 2 AND r.w < 50",
    "SELECT * FROM l JOIN e ON l.k = e.k",
    "SELECT * FROM l LEFT JOIN e ON l.k = e.k",
    "SELECT * FROM e RIGHT JOIN l ON l.k = e.k",
    "SELECT * FROM l WHERE k NOT IN (SELECT k FROM e)",
    "SELECT one.k, l.v FROM one LEFT JOIN l ON one.k = l.k",
    "SELECT count(*), sum(b.k) FROM big a JOIN big b ON a.k = b.k WHERE a.g = 3",
    "SELECT a.g, count(*) FROM big a JOIN big b ON a.g = b.g AND a.k < b.k GROUP BY a.g ORDER BY a.g",
    "SELECT g, count(*), min(k), max(k) FROM big GROUP BY g ORDER BY g",
    "SELECT k FROM big ORDER BY k DESC LIMIT 5",
    "SELECT count(*) FROM e",
    // Rows without columns cross the exchanges (a count over a LIMIT pushed into the join).
    "SELECT count(*) FROM (SELECT a.k FROM big a JOIN big b ON a.k = b.k LIMIT 7) t",
    "SELECT count(*) FROM (SELECT a.k FROM big a JOIN big b ON a.g = b.g WHERE a.k < 10) t",
    "SELECT * FROM (VALUES (1), (2), (9)) AS t(k) JOIN r ON t.k = r.k",
];

async fn check(workers: usize) {
    let (cluster, reference) = start(workers, SETUP).await;
    let c = &cluster.coordinator;
    let mut failures = vec![];
    // `shuffle` makes every equi-join partitioned, which runs the supported join types
    // as Flow-Joins (skew detection is on by default), or with the radix kernel; `neo`
    // runs them as Neo-Joins where the key allows.
    let settings = [
        ("auto", "auto"),
        ("shuffle", "hash"),
        ("shuffle", "radix"),
        ("neo", "hash"),
    ];
    for (strategy, kernel) in settings {
        c.sql(&format!("SET gyre.join_strategy = '{strategy}'"))
            .await
            .unwrap();
        c.sql(&format!("SET gyre.join_kernel = '{kernel}'"))
            .await
            .unwrap();
        for q in QUERIES {
            if let Some(d) = differs(c, &reference, q).await {
                failures.push(format!("[{strategy}, {kernel}] {d}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{workers} workers:\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_on_one_to_four_workers() {
    for workers in 1..=4 {
        check(workers).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_the_cluster_stays_usable() {
    let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.sql("CREATE TABLE t (a INT, b VARCHAR); INSERT INTO t VALUES (1, 'x')")
        .await
        .unwrap();
    let err = c.sql("SELEC 1").await.unwrap_err().to_string();
    assert!(err.contains("SELEC"), "{err}");
    let err = c.sql("SELECT nope FROM t").await.unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
    let err = c.sql("SELECT a + b FROM t").await.unwrap_err().to_string();
    assert!(
        err.to_lowercase().contains("utf8") || err.contains("Cannot"),
        "{err}"
    );
    let err = c
        .sql("SELECT * FROM missing")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing"), "{err}");
    let err = c
        .sql("CREATE TABLE p (a INT) PARTITION BY zzz")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("zzz"), "{err}");
    let err = c
        .sql("CREATE EXTERNAL TABLE f STORED AS CSV LOCATION '/nonexistent/gyre.csv'")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/gyre.csv"), "{err}");
    let ok = c.sql_one("SELECT count(*) FROM t").await.unwrap();
    assert_eq!(canonical_rows(&ok.batches).unwrap(), vec!["1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_fragments_exchanges_and_join_strategies() {
    let cluster = LocalCluster::start(3, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.load_tpch(0.01).await.unwrap();
    // orders and lineitem are both hash-placed on the order key: co-located, no shuffle.
    let plan = text(
        c.sql_one("EXPLAIN SELECT count(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey")
            .await
            .unwrap(),
    );
    assert!(plan.contains("partitioned join"), "{plan}");
    assert!(!plan.contains("shuffle hash"), "{plan}");
    // nation is tiny next to supplier: broadcast.
    let plan = text(
        c.sql_one("EXPLAIN SELECT count(*) FROM supplier JOIN nation ON s_nationkey = n_nationkey")
            .await
            .unwrap(),
    );
    assert!(plan.contains("broadcast"), "{plan}");
    let plan = text(
        c.sql_one(
            "EXPLAIN ANALYZE SELECT l_returnflag, count(*) FROM lineitem GROUP BY l_returnflag",
        )
        .await
        .unwrap(),
    );
    for needle in [
        "worker 1",
        "worker 3",
        "bytes_sent",
        "rows_received",
        "network_wait",
        "coordinator: planned in",
        "ended on the workers in",
    ] {
        assert!(plan.contains(needle), "missing {needle}:\n{plan}");
    }
}

/// Column statistics (ranges, null and distinct counts) follow every insert and
/// delete, EXPLAIN shows them with `datafusion.explain.show_statistics`, and they let
/// the planner see that a join of two large tables is large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_statistics_follow_changes_and_orient_joins() {
    let cluster = LocalCluster::start(3, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.sql("SET datafusion.explain.show_statistics = true")
        .await
        .unwrap();
    let estimates = |sql: &'static str| async move {
        let plan = text(c.sql_one(&format!("EXPLAIN {sql}")).await.unwrap());
        plan.lines()
            .rev()
            .find(|l| l.contains("GyreScanExec") && l.contains("statistics="))
            .unwrap_or_else(|| panic!("no estimates:\n{plan}"))
            .to_string()
    };
    c.sql("CREATE TABLE t (a BIGINT, b VARCHAR) PARTITION BY a; \
           INSERT INTO t SELECT value, CASE WHEN value % 10 = 0 THEN NULL ELSE 'x' || (value % 7) END \
           FROM generate_series(1, 2000) AS s(value)")
        .await
        .unwrap();
    let scan = estimates("SELECT a, b FROM t").await;
    assert!(
        scan.contains("Min=Inexact(Int64(1)) Max=Inexact(Int64(2000))"),
        "{scan}"
    );
    assert!(scan.contains("Null=Inexact(200)"), "{scan}");
    assert!(scan.contains("Distinct=Inexact(7)"), "{scan}");
    c.sql("INSERT INTO t VALUES (5000, 'y')").await.unwrap();
    let scan = estimates("SELECT a FROM t").await;
    assert!(scan.contains("Max=Inexact(Int64(5000))"), "{scan}");
    c.sql("DELETE FROM t WHERE a > 100").await.unwrap();
    let scan = estimates("SELECT a FROM t").await;
    assert!(scan.contains("Max=Inexact(Int64(100))"), "{scan}");
    // Estimates never stand in for the rows: the answer comes from the table.
    c.sql("INSERT INTO t VALUES (7000, NULL)").await.unwrap();
    let max = c.sql_one("SELECT max(a), count(b) FROM t").await.unwrap();
    assert_eq!(canonical_rows(&max.batches).unwrap(), vec!["7000|90"]);

    // TPC-H Q18's shape: the orders-lineitem join is far larger than the orders
    // whose quantities pass the HAVING, so the subquery's side builds the hash table.
    c.load_tpch(0.01).await.unwrap();
    let plan = text(
        c.sql_one(
            "EXPLAIN SELECT o_orderkey, sum(l_quantity) FROM orders JOIN lineitem \
             ON o_orderkey = l_orderkey WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem \
             GROUP BY l_orderkey HAVING sum(l_quantity) > 300) GROUP BY o_orderkey",
        )
        .await
        .unwrap(),
    );
    assert!(plan.contains("join_type=RightSemi"), "{plan}");
}

/// TPC-DS q72's shape: the query joins sales with a larger stock table on the item
/// before the selective dimensions. Reordered by the tables' statistics, the
/// dimensions come first and stock joins the few rows left; the answer is the
/// written order's and DataFusion's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inner_joins_run_in_the_order_that_keeps_intermediates_small() {
    let setup = "
        CREATE TABLE sales AS SELECT value AS s_id, value % 500 AS s_item, value % 360 AS s_day,
            value % 2000 AS s_cust, value % 50 AS s_qty FROM generate_series(1, 20000) AS t(value);
        CREATE TABLE stock AS SELECT value % 500 AS st_item, value % 37 AS st_qty
            FROM generate_series(1, 40000) AS t(value);
        CREATE TABLE day AS SELECT value AS d_day, value / 30 AS d_month
            FROM generate_series(0, 359) AS t(value);
        CREATE TABLE cust AS SELECT value AS c_id, CASE WHEN value % 10 = 0 THEN 'D' ELSE 'M' END AS c_flag
            FROM generate_series(0, 1999) AS t(value)";
    let (cluster, reference) = start(3, setup).await;
    let c = &cluster.coordinator;
    let query = "SELECT d_month, count(*) AS n, sum(st_qty) AS q FROM sales \
                 JOIN stock ON s_item = st_item \
                 JOIN day ON s_day = d_day \
                 JOIN cust ON s_cust = c_id \
                 WHERE d_month = 3 AND c_flag = 'D' AND st_qty < s_qty GROUP BY d_month";
    // Plan lines in their order (deeper operators further down).
    let plan = |r: gyre_cluster::coordinator::StatementResult| -> Vec<String> {
        r.batches
            .iter()
            .flat_map(|b| {
                (0..b.num_rows())
                    .map(|i| arrow::util::display::array_value_to_string(b.column(0), i).unwrap())
            })
            .collect()
    };
    let depth = |lines: &[String], key: &str| {
        lines
            .iter()
            .position(|l| l.contains("HashJoinExec") && l.contains(key))
            .unwrap_or_else(|| panic!("no join on {key}:\n{}", lines.join("\n")))
    };
    let reordered = plan(c.sql_one(&format!("EXPLAIN {query}")).await.unwrap());
    assert!(
        depth(&reordered, "st_item") < depth(&reordered, "d_day")
            && depth(&reordered, "st_item") < depth(&reordered, "c_id"),
        "stock joins after the dimensions:\n{}",
        reordered.join("\n")
    );
    let answer = text(c.sql_one(query).await.unwrap());
    assert_ne!(answer, "", "the query finds rows");
    assert_eq!(differs(c, &reference, query).await, None);

    c.sql("SET gyre.join_reorder = off").await.unwrap();
    let written = plan(c.sql_one(&format!("EXPLAIN {query}")).await.unwrap());
    assert!(
        depth(&written, "st_item") > depth(&written, "d_day"),
        "as written, stock joins first:\n{}",
        written.join("\n")
    );
    assert_eq!(text(c.sql_one(query).await.unwrap()), answer);
}

/// partsupp is placed on ps_partkey alone; a join on (partkey, suppkey) with a
/// small input moves only that input, by part key, instead of broadcasting it or
/// shuffling partsupp, and finds the same rows as the join on both keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_on_more_keys_than_the_placement_moves_only_the_other_input() {
    let cluster = LocalCluster::start(3, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.load_tpch(0.01).await.unwrap();
    // A plain shuffle (a Flow-Join would route the same rows itself).
    c.sql("SET gyre.skew_detection = off").await.unwrap();
    let query = "SELECT count(*), sum(ps_supplycost * l_quantity) \
                 FROM (SELECT * FROM lineitem WHERE l_quantity < 3) l \
                 JOIN partsupp ON l_partkey = ps_partkey AND l_suppkey = ps_suppkey";
    let plan = text(c.sql_one(&format!("EXPLAIN {query}")).await.unwrap());
    assert_eq!(plan.matches("shuffle hash").count(), 1, "{plan}");
    assert!(plan.contains("shuffle hash([l_partkey"), "{plan}");
    assert!(!plan.contains("broadcast"), "{plan}");
    assert!(plan.contains("filter=l_suppkey@"), "{plan}");
    let narrowed = c.sql_one(query).await.unwrap();
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    let plan = text(c.sql_one(&format!("EXPLAIN {query}")).await.unwrap());
    assert_eq!(plan.matches("shuffle hash").count(), 2, "{plan}");
    let both_keys = c.sql_one(query).await.unwrap();
    let rows = canonical_rows(&narrowed.batches).unwrap();
    assert_eq!(rows, canonical_rows(&both_keys.batches).unwrap());
    assert_ne!(rows, vec!["0|NULL"], "the join finds rows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_csv_and_parquet_files_load_and_bad_files_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("people.csv");
    std::fs::write(&csv, "id,name\n1,ann\n2,bob\n3,cy\n4,di\n").unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "id,name\n1,ann\nnot-a-number,bob,extra\n").unwrap();
    let cluster = LocalCluster::start(3, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.sql(&format!(
        "CREATE EXTERNAL TABLE people STORED AS CSV LOCATION '{}' \
         OPTIONS ('format.has_header' 'true', 'gyre.partition_by' 'id')",
        csv.display()
    ))
    .await
    .unwrap();
    let r = c.sql_one("SELECT id, name FROM people").await.unwrap();
    assert_eq!(
        canonical_rows(&r.batches).unwrap(),
        vec!["1|ann", "2|bob", "3|cy", "4|di"]
    );
    let parquet = dir.path().join("people.parquet");
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.sql("SELECT 1 AS id, 'x' AS v UNION ALL SELECT 2, 'y'")
        .await
        .unwrap()
        .write_parquet(
            parquet.to_str().unwrap(),
            datafusion::dataframe::DataFrameWriteOptions::new(),
            None,
        )
        .await
        .unwrap();
    c.sql(&format!(
        "CREATE EXTERNAL TABLE pq STORED AS PARQUET LOCATION '{}'",
        parquet.display()
    ))
    .await
    .unwrap();
    let r = c.sql_one("SELECT sum(id) FROM pq").await.unwrap();
    assert_eq!(canonical_rows(&r.batches).unwrap(), vec!["3"]);
    let err = c
        .sql(&format!(
            "CREATE EXTERNAL TABLE b STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
            bad.display()
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad.csv"), "{err}");
    assert!(c.sql_one("SELECT count(*) FROM people").await.is_ok());
}

/// Run-time filters in the join's own stage: a join's build keys prune its probe input
/// where the worker reads it, below a filter in between, but not below another join
/// (whose probe costs what the check saves), and a build side that reads a whole table
/// gets no filter (it would prune nothing). Star joins (a dimension broadcast, another
/// placed with the fact table), a semi join and a left join find DataFusion's rows with
/// the filters on and off, and EXPLAIN ANALYZE shows the rows the filters dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_filters_prune_probe_rows_and_keep_the_answers() {
    let setup = "
        CREATE TABLE fact (f_day INT, f_item INT, f_qty INT) PARTITION BY f_day;
        INSERT INTO fact SELECT value % 360, value % 500, value % 50 FROM generate_series(1, 30000) AS t(value);
        INSERT INTO fact VALUES (NULL, 1, 1), (1, NULL, 2);
        CREATE TABLE day (d_day INT, d_month INT) PARTITION BY d_day;
        INSERT INTO day SELECT value, value / 30 FROM generate_series(0, 359) AS t(value);
        CREATE TABLE item (i_item INT, i_cat VARCHAR);
        INSERT INTO item SELECT value, CASE WHEN value % 10 = 0 THEN 'Books' ELSE 'Music' END
            FROM generate_series(0, 499) AS t(value)";
    let (cluster, reference) = start(4, setup).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.runtime_filters = on").await.unwrap();
    let queries = [
        "SELECT d_month, count(*), sum(f_qty) FROM fact JOIN day ON f_day = d_day \
         JOIN item ON f_item = i_item WHERE d_month = 3 AND i_cat = 'Books' GROUP BY d_month",
        "SELECT count(*), sum(f_qty) FROM fact WHERE f_day IN \
         (SELECT d_day FROM day WHERE d_month = 5) AND f_item IN (SELECT i_item FROM item WHERE i_cat = 'Books')",
        "SELECT d_month, count(f_qty) FROM day LEFT JOIN \
         (SELECT f_day, f_qty FROM fact JOIN item ON f_item = i_item WHERE i_cat = 'Books') x \
         ON d_day = f_day WHERE d_month < 2 GROUP BY d_month ORDER BY d_month",
        "SELECT count(*), sum(f_qty) FROM (SELECT * FROM fact WHERE f_qty < 40) x \
         JOIN item ON f_item = i_item WHERE i_cat = 'Books'",
        "SELECT count(*), sum(f_qty) FROM fact JOIN item ON f_item = i_item",
    ];
    for q in queries {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    let explain = |q: &str| format!("EXPLAIN {q}");
    let star = text(c.sql_one(&explain(queries[0])).await.unwrap());
    assert!(!star.contains("FilterTargetExec"), "{star}");
    let whole = text(c.sql_one(&explain(queries[4])).await.unwrap());
    assert!(!whole.contains("FilterSourceExec"), "{whole}");
    let analyzed = text(
        c.sql_one(&format!("EXPLAIN ANALYZE {}", queries[3]))
            .await
            .unwrap(),
    );
    let pruned: Vec<&str> = analyzed
        .lines()
        .filter(|l| l.contains("FilterTargetExec") && !l.contains("rows_pruned=0,"))
        .collect();
    assert!(!pruned.is_empty(), "no probe rows pruned:\n{analyzed}");
    c.sql("SET gyre.runtime_filters = off").await.unwrap();
    let plain = text(c.sql_one(&explain(queries[3])).await.unwrap());
    assert!(!plain.contains("FilterTargetExec"), "{plain}");
    for q in queries {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
}

/// Run-time filters through aggregations: a join on an aggregation's group keys drops
/// whole groups, so the rows of keys the build side lacks are dropped before they are
/// aggregated, in the stage below the partial aggregation (TPC-H Q17's shape). Grouping
/// sets and joins on aggregated values stay above the aggregation; every answer is
/// DataFusion's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_filters_reach_below_aggregations_on_their_group_keys() {
    let setup = "
        CREATE TABLE fact (f_item INT, f_qty INT) PARTITION BY f_qty;
        INSERT INTO fact SELECT value % 5000, value % 50 FROM generate_series(1, 200000) AS t(value);
        INSERT INTO fact VALUES (NULL, 1), (3, NULL);
        CREATE TABLE item (i_item INT, i_cat VARCHAR) PARTITION BY i_item;
        INSERT INTO item SELECT value, CASE WHEN value % 500 = 0 THEN 'Books' ELSE 'Music' END
            FROM generate_series(0, 4999) AS t(value)";
    let (cluster, reference) = start(4, setup).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.runtime_filters = on").await.unwrap();
    let queries = [
        "SELECT sum(f_qty) FROM fact JOIN item ON f_item = i_item WHERE i_cat = 'Books' \
         AND f_qty < (SELECT 0.5 * avg(f_qty) FROM fact f2 WHERE f2.f_item = i_item)",
        "SELECT i_item, s, n FROM item JOIN (SELECT f_item, sum(f_qty) s, count(*) n \
         FROM fact GROUP BY f_item) x ON i_item = f_item WHERE i_cat = 'Books'",
        "SELECT count(*), sum(n) FROM item JOIN (SELECT f_item, f_qty, count(*) n \
         FROM fact GROUP BY ROLLUP (f_item, f_qty)) x ON i_item = f_item WHERE i_cat = 'Books'",
        "SELECT count(*), sum(n) FROM item JOIN (SELECT f_item, f_qty, count(*) n \
         FROM fact GROUP BY ROLLUP (f_qty, f_item)) x ON i_item = f_item WHERE i_cat = 'Books'",
        "SELECT count(*) FROM item JOIN (SELECT f_item, count(*) n FROM fact GROUP BY f_item) x \
         ON i_item = n WHERE i_cat = 'Books'",
    ];
    for q in queries {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    // A target that pruned, right below the partial aggregation and right above the
    // scan of `fact`.
    let lines = explain_analyze_lines(c, queries[1]).await;
    let below = lines.windows(3).any(|w| {
        w[0].starts_with("AggregateExec: mode=Partial")
            && w[1].starts_with("FilterTargetExec")
            && !w[1].contains("rows_pruned=0,")
            && w[2].starts_with("GyreScanExec: table=fact")
    });
    assert!(
        below,
        "no target pruned below the partial aggregation:\n{}",
        lines.join("\n")
    );
}

/// The lines of `EXPLAIN ANALYZE q`, in order, trimmed.
async fn explain_analyze_lines(
    c: &std::sync::Arc<gyre_cluster::Coordinator>,
    q: &str,
) -> Vec<String> {
    let r = c.sql_one(&format!("EXPLAIN ANALYZE {q}")).await.unwrap();
    let mut lines = Vec::new();
    for b in &r.batches {
        let column = arrow::compute::cast(b.column(b.num_columns() - 1), &DataType::Utf8).unwrap();
        let column = column.as_string::<i32>();
        lines.extend((0..column.len()).map(|i| column.value(i).trim().to_string()));
    }
    lines
}

/// Run-time filters across the network: with every join shuffled, a join's build keys
/// (each worker's part of them) go to the stage that sends the join its probe rows,
/// which drops the rows no worker's build side matches before they are shuffled. The
/// answers stay DataFusion's; EXPLAIN ANALYZE shows the targets that pruned there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_filters_prune_probe_rows_before_they_cross_the_network() {
    let setup = "
        CREATE TABLE fact (f_day INT, f_item INT, f_qty INT) PARTITION BY f_day;
        INSERT INTO fact SELECT value % 360, value % 5000, value % 50 FROM generate_series(1, 200000) AS t(value);
        INSERT INTO fact VALUES (NULL, 1, 1), (1, NULL, 2);
        CREATE TABLE day (d_day INT, d_month INT) PARTITION BY d_month;
        INSERT INTO day SELECT value, value / 30 FROM generate_series(0, 359) AS t(value);
        CREATE TABLE item (i_item INT, i_cat VARCHAR) PARTITION BY i_cat;
        INSERT INTO item SELECT value, CASE WHEN value % 10 = 0 THEN 'Books' ELSE 'Music' END
            FROM generate_series(0, 4999) AS t(value)";
    let (cluster, reference) = start(4, setup).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.runtime_filters = on").await.unwrap();
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    c.sql("SET gyre.skew_detection = off").await.unwrap();
    let queries = [
        "SELECT count(*), sum(f_qty) FROM fact JOIN item ON f_item = i_item WHERE i_cat = 'Books'",
        "SELECT d_month, count(*), sum(f_qty) FROM fact JOIN day ON f_day = d_day \
         JOIN item ON f_item = i_item WHERE d_month = 3 AND i_cat = 'Books' GROUP BY d_month",
        "SELECT count(*) FROM fact WHERE f_item IN (SELECT i_item FROM item WHERE i_cat = 'Books')",
        "SELECT count(*) FROM fact JOIN item ON f_item = i_item WHERE i_cat = 'None'",
    ];
    for q in queries {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    for q in &queries[..2] {
        let analyzed = text(c.sql_one(&format!("EXPLAIN ANALYZE {q}")).await.unwrap());
        let pruned: Vec<&str> = analyzed
            .lines()
            .filter(|l| l.contains("from every worker") && !l.contains("rows_pruned=0,"))
            .collect();
        assert!(
            !pruned.is_empty(),
            "no probe rows pruned before a shuffle:\n{analyzed}"
        );
    }
}

/// Every join type over `f` (fk, fi, fq, fs) and `d` (dk, di, dc, dn), with filters, a
/// grouping above the join, date keys and an ordered result: the radix kernel's and
/// Neo-Join's tests run them at sizes where those operators have work to do.
const EVERY_JOIN_TYPE: [&str; 10] = [
    "SELECT count(*), sum(fq), sum(dn), count(fs), count(dc) FROM f JOIN d ON fk = dk",
    "SELECT count(*), sum(fq), count(dn) FROM f LEFT JOIN d ON fk = dk",
    "SELECT count(*), count(fq), sum(dn) FROM f RIGHT JOIN d ON fk = dk",
    "SELECT count(*), count(fq), count(dn) FROM f FULL JOIN d ON fk = dk AND fq < dn",
    "SELECT count(*), sum(fq) FROM f WHERE fk IN (SELECT dk FROM d WHERE dc = 'Books')",
    "SELECT count(*), sum(fq) FROM f WHERE NOT EXISTS (SELECT 1 FROM d WHERE dk = fk AND dn > 3)",
    "SELECT count(*), sum(dn) FROM d WHERE EXISTS (SELECT 1 FROM f WHERE fk = dk AND fq = 7)",
    "SELECT fq, count(*), sum(dn) FROM f JOIN d ON fk = dk WHERE fq < dn GROUP BY fq ORDER BY fq",
    "SELECT count(*), sum(fq) FROM f JOIN d ON arrow_cast(fi, 'Date32') = arrow_cast(di, 'Date32') \
     WHERE dn = 5",
    "SELECT fk, fq, dn, dc FROM f JOIN d ON fk = dk WHERE fk < 40 ORDER BY fk, fq, dn",
];

/// `SET gyre.join_kernel = radix` at sizes where each worker's build side spans several
/// cache-sized radix partitions: every join type, with filters, NULL and duplicate
/// keys, keys of 32 and 64 bits and joins on computed keys, each answer DataFusion's.
/// The plan shows the radix joins, with run-time filters still placed on their probe
/// inputs; joins the kernel cannot run (two keys, string keys) stay hash joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn radix_join_kernel_answers_every_join_type_like_datafusion() {
    // The kernel sizes partitions by this machine's L2 (2 MiB on some x86 cores): `d`
    // gets about 2.5 partitions' worth of build rows per worker, 200,000 rows at least.
    let per_partition = gyre_join::radix::RadixConfig::default().build_rows_per_partition();
    let d_rows = (per_partition * 4 * 5 / 2).max(200_000);
    let setup = format!(
        "
        CREATE TABLE f (fk BIGINT, fi INT, fq INT, fs VARCHAR) PARTITION BY fq;
        INSERT INTO f SELECT CASE WHEN value % 31 = 0 THEN NULL ELSE value % 90000 END,
            value % 5000, value % 50, concat('s', value % 977) FROM generate_series(1, 240000) AS t(value);
        CREATE TABLE d (dk BIGINT, di INT, dc VARCHAR, dn INT) PARTITION BY dn;
        INSERT INTO d SELECT CASE WHEN value % 17 = 0 THEN NULL ELSE value * 2 END, value % 5000,
            CASE WHEN value % 10 = 0 THEN 'Books' ELSE 'Music' END, value % 13
            FROM generate_series(1, {d_rows}) AS t(value)"
    );
    let (cluster, reference) = start(4, &setup).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    c.sql("SET gyre.join_kernel = 'radix'").await.unwrap();
    let extra = [
        "SELECT dc, count(*) FROM f JOIN d ON fk + 1 = dk + 1 WHERE fs LIKE 's1%' GROUP BY dc ORDER BY dc",
        "SELECT count(*), sum(fq) FROM f JOIN d ON fi = di AND fq = dn",
        "SELECT count(*) FROM f JOIN d ON fs = dc",
        "SELECT count(*), sum(fq) FROM f JOIN d ON fi = di WHERE dc = 'Books' AND dn = 3",
    ];
    let queries = EVERY_JOIN_TYPE.iter().chain(&extra);
    for q in queries {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    let explain = |q: &str| {
        let sql = format!("EXPLAIN ANALYZE {q}");
        async move { text(c.sql_one(&sql).await.unwrap()) }
    };
    let inner = explain(EVERY_JOIN_TYPE[0]).await;
    let partitions: Vec<u64> = inner
        .lines()
        .filter_map(|l| l.split("radix_partitions=").nth(1))
        .map(|v| v.split([',', ']']).next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(partitions.len(), 4, "a radix join per worker:\n{inner}");
    assert!(
        partitions.iter().all(|&p| p >= 2),
        "build sides of several radix partitions of {per_partition} rows:\n{inner}"
    );
    // Date keys join as the days' integers.
    let dates = explain(EVERY_JOIN_TYPE[8]).await;
    assert!(dates.contains("RadixJoinExec"), "{dates}");
    // Two keys: DataFusion's hash join (a Flow-Join by default).
    let two_keys = explain(extra[1]).await;
    assert!(!two_keys.contains("RadixJoinExec"), "{two_keys}");
    // A filtered build side still prunes the radix join's probe input.
    let filtered = explain(extra[3]).await;
    assert!(filtered.contains("RadixJoinExec"), "{filtered}");
    assert!(
        filtered
            .lines()
            .any(|l| l.contains("FilterTargetExec") && !l.contains("rows_pruned=0,")),
        "no probe rows pruned:\n{filtered}"
    );
}

/// `SET gyre.join_strategy = neo` at sizes where the assignment has work to do: every
/// join type, filters, NULL keys, a heavy key (a fifth of one input) and date keys,
/// each answer DataFusion's. The plan shows the assignment; the heavy key's partition
/// is broadcast by its small side where the join type allows it; each side moves in
/// the rounds of its open-shop schedule. Plain radix partitioning without broadcast,
/// greedily assigned, all transfers at once, answers the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neo_join_answers_every_join_type_like_datafusion() {
    let setup = "
        CREATE TABLE f (fk BIGINT, fi INT, fq INT, fs VARCHAR) PARTITION BY fq;
        INSERT INTO f SELECT CASE WHEN value % 31 = 0 THEN NULL WHEN value % 5 = 0 THEN 7
            ELSE value % 90000 END, value % 5000, value % 50, concat('s', value % 977)
            FROM generate_series(1, 240000) AS t(value);
        CREATE TABLE d (dk BIGINT, di INT, dc VARCHAR, dn INT) PARTITION BY dn;
        INSERT INTO d SELECT CASE WHEN value % 17 = 0 THEN NULL ELSE value * 2 END, value % 5000,
            CASE WHEN value % 10 = 0 THEN 'Books' ELSE 'Music' END, value % 13
            FROM generate_series(1, 60000) AS t(value)";
    let (cluster, reference) = start(4, setup).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'neo'").await.unwrap();
    // Scheduled however short the shuffle.
    c.sql("SET gyre.neo_schedule = 'open-shop'").await.unwrap();
    // A right anti join too: its build side may be broadcast.
    let right_anti =
        "SELECT count(*), sum(dn) FROM d WHERE NOT EXISTS (SELECT 1 FROM f WHERE fk = dk)";
    let queries = EVERY_JOIN_TYPE.iter().chain([&right_anti]);
    for q in queries {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    let explain = |q: &str| {
        let sql = format!("EXPLAIN ANALYZE {q}");
        async move { text(c.sql_one(&sql).await.unwrap()) }
    };
    let plan = explain(EVERY_JOIN_TYPE[0]).await;
    let line = plan
        .lines()
        .find(|l| l.contains("NeoJoinExec") && l.contains("assignment="))
        .unwrap_or_else(|| panic!("no Neo-Join assignment in:\n{plan}"));
    let broadcast: u64 = line
        .split("broadcast_partitions=")
        .nth(1)
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        broadcast >= 1,
        "the heavy key's partition is not broadcast: {line}"
    );
    // Each side moved in the rounds of its open-shop schedule, the barrier timed.
    let rounds: Vec<u64> = line
        .split("rounds=")
        .nth(1)
        .and_then(|v| v.split([',', ' ', ']']).next())
        .map(|v| v.split('+').map(|r| r.parse().unwrap()).collect())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        line.contains("schedule=open-shop") && rounds.len() == 2 && rounds[0] + rounds[1] >= 3,
        "{line}"
    );
    assert!(line.contains("round_wait="), "{line}");
    // A filtered build side prunes the probe rows before they are histogrammed and
    // routed, by every worker's build keys.
    let semi = explain(EVERY_JOIN_TYPE[4]).await;
    assert!(
        semi.lines().any(|l| l.contains("FilterTargetExec")
            && l.contains("from every worker on exchange")
            && !l.contains("rows_pruned=0,")),
        "no probe rows pruned:\n{semi}"
    );
    // A full join may broadcast neither side.
    let full = explain(EVERY_JOIN_TYPE[3]).await;
    assert!(
        full.contains("NeoJoinExec: target_partitions=16, partitioning=adaptive, broadcast=none"),
        "{full}"
    );
    // The radix join kernel joins the rows the assignment brings.
    c.sql("SET gyre.join_kernel = 'radix'").await.unwrap();
    for q in EVERY_JOIN_TYPE.iter().chain([&right_anti]) {
        assert_eq!(differs(c, &reference, q).await, None, "[radix] {q}");
    }
    let radix = explain(EVERY_JOIN_TYPE[0]).await;
    assert!(
        radix.lines().any(|l| l.contains("NeoJoinExec")
            && l.contains("kernel=radix")
            && l.contains("radix_partitions=")),
        "{radix}"
    );
    c.sql("SET gyre.join_kernel = 'auto'").await.unwrap();
    // The session's settings reach the workers' Neo-Joins; all transfers at once.
    c.sql("SET gyre.neo_schedule = free").await.unwrap();
    c.sql("SET gyre.neo_partitions = 16").await.unwrap();
    c.sql("SET gyre.neo_solver_ms = 0").await.unwrap();
    c.sql("SET gyre.neo_broadcast = off").await.unwrap();
    c.sql("SET gyre.neo_adaptive = off").await.unwrap();
    for q in EVERY_JOIN_TYPE {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    let greedy = explain(EVERY_JOIN_TYPE[0]).await;
    assert!(
        greedy.contains("target_partitions=16, partitioning=radix, broadcast=none")
            && greedy.contains("partitions=16, assignment=")
            && greedy.contains("assignment=greedy (the solver is off)")
            && greedy.contains("broadcast_partitions=0")
            && greedy.contains("schedule=free"),
        "{greedy}"
    );
}

/// `auto` plans Neo-Joins that choose at run time: where each worker holds whole key
/// ranges of both inputs (tables created from range-placed ones keep their rows),
/// the assignment moves almost nothing and is used, and with one such input it still
/// saves moving that one; where both inputs are spread without regard to the key, it
/// saves too little and the rows go where a hash shuffle sends them, decided on every
/// row or, for inputs larger than `gyre.neo_sample_rows`, on the first ones. All answer
/// as DataFusion does; `gyre.neo_min_saving = off` plans no Neo-Joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_chooses_neo_join_at_run_time_by_measured_locality() {
    let setup = "
        CREATE TABLE lb (k BIGINT, p INT, v INT) PARTITION BY p;
        INSERT INTO lb SELECT CASE WHEN value % 97 = 0 THEN NULL ELSE value END,
            value / 25000, value % 100 FROM generate_series(0, 99999) AS t(value);
        CREATE TABLE rb (k BIGINT, p INT, w INT) PARTITION BY p;
        INSERT INTO rb SELECT value % 100000, (value % 100000) / 25000, value % 7
            FROM generate_series(0, 149999) AS t(value);
        CREATE TABLE l AS SELECT k, v FROM lb;
        CREATE TABLE r AS SELECT k, w FROM rb;
        CREATE TABLE s (k BIGINT, w INT) PARTITION BY w;
        INSERT INTO s SELECT (value * 7919) % 100000, value % 1000
            FROM generate_series(0, 149999) AS t(value);
        CREATE TABLE u (k BIGINT, v INT) PARTITION BY v;
        INSERT INTO u SELECT CASE WHEN value % 97 = 0 THEN NULL ELSE value END, value % 100
            FROM generate_series(0, 99999) AS t(value);
        CREATE TABLE x (k BIGINT, v INT) PARTITION BY v;
        INSERT INTO x SELECT CASE WHEN value % 89 = 0 THEN NULL ELSE (value * 104729) % 100000 END,
            value % 100 FROM generate_series(0, 99999) AS t(value)";
    let (cluster, reference) = start(4, setup).await;
    let c = &cluster.coordinator;
    let local = [
        "SELECT count(*), sum(v), sum(w) FROM l JOIN r ON l.k = r.k",
        "SELECT count(*), count(w) FROM l LEFT JOIN r ON l.k = r.k",
        "SELECT count(*), sum(v) FROM l WHERE k NOT IN (SELECT k FROM r WHERE w = 3)",
    ];
    let spread = [
        "SELECT count(*), sum(v), sum(w) FROM u JOIN s ON u.k = s.k",
        "SELECT count(*), count(v) FROM s FULL JOIN u ON u.k = s.k AND s.w < 500",
        // One side range-placed, the other spread: the range-placed side stays.
        "SELECT count(*), sum(v), sum(w) FROM l JOIN s ON l.k = s.k",
    ];
    for q in local.iter().chain(&spread) {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    let placement = |plan: &str| -> String {
        let line = plan
            .lines()
            .find(|l| l.contains("NeoJoinExec") && l.contains("placement="))
            .unwrap_or_else(|| panic!("no run-time Neo-Join in:\n{plan}"));
        line.split("placement=").nth(1).unwrap()[..3].to_string()
    };
    let explain = |q: &str| {
        let sql = format!("EXPLAIN ANALYZE {q}");
        async move { text(c.sql_one(&sql).await.unwrap()) }
    };
    let used = explain(local[0]).await;
    assert_eq!(placement(&used), "neo", "{used}");
    assert!(used.contains("min_saving=25%"), "{used}");
    let hashed = explain(spread[0]).await;
    assert_eq!(placement(&hashed), "has", "{hashed}");
    let half = explain(spread[2]).await;
    assert_eq!(placement(&half), "neo", "{half}");
    for plan in [&used, &hashed, &half] {
        assert!(!plan.contains("on the first"), "{plan}");
    }
    // Decided on each input's first rows (of each worker's 25,000 to 37,500): inputs
    // whose first rows are spread like the rest stream where a hash shuffle sends
    // them at once; clustered ones are collected and decided again on every row.
    // (`u`'s first rows hold its smallest keys on every worker: a sample of them
    // looks placed, and the decision on every row falls back to hash placement.)
    c.sql("SET gyre.neo_sample_rows = 8192").await.unwrap();
    let spread_sample = [
        "SELECT count(*), sum(v), sum(w) FROM x JOIN s ON x.k = s.k",
        "SELECT count(*), count(v), count(w) FROM s RIGHT JOIN x ON x.k = s.k AND s.w < 500",
    ];
    let sampled = explain(spread_sample[0]).await;
    assert_eq!(placement(&sampled), "has", "{sampled}");
    // Neither side is filtered (the build side is a whole table): both are sampled.
    assert!(
        sampled.contains("on the first 8192 rows of each input on each worker"),
        "{sampled}"
    );
    let collected = explain(local[0]).await;
    assert_eq!(placement(&collected), "neo", "{collected}");
    assert!(!collected.contains("on the first"), "{collected}");
    // A filtered build side feeds a run-time filter whose target holds back the probe
    // side in the stage sending it (a GROUP BY on more than the key): the build side
    // is read whole before the probe side is sampled, or no worker would get on.
    let filtered = "SELECT count(*), sum(y.c) FROM (SELECT * FROM s WHERE w < 900) ss \
                    JOIN (SELECT k, v % 3 AS g, count(*) AS c FROM x GROUP BY k, v % 3) y \
                    ON ss.k = y.k";
    let waits = explain(filtered).await;
    assert_eq!(placement(&waits), "has", "{waits}");
    assert!(
        waits.contains("on the first 8192 rows of the last input on each worker"),
        "{waits}"
    );
    let plan = c.sql_one(&format!("EXPLAIN {filtered}")).await.unwrap();
    let plan = arrow::util::pretty::pretty_format_batches(&plan.batches)
        .unwrap()
        .to_string();
    let at = |what: &str| plan.lines().position(|l| l.contains(what));
    let (neo, target) = (at("NeoJoinExec").unwrap(), at("FilterTargetExec").unwrap());
    assert!(
        neo < target
            && plan
                .lines()
                .take(target)
                .skip(neo)
                .any(|l| l.contains("stage ")),
        "the filter's target is not in a stage sending to the Neo-Join:\n{plan}"
    );
    assert_eq!(differs(c, &reference, filtered).await, None);
    for q in local.iter().chain(&spread).chain(&spread_sample) {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    c.sql("SET gyre.neo_sample_rows = 131072").await.unwrap();
    // Demanding more than the assignment can save falls back to hash placement.
    c.sql("SET gyre.neo_min_saving = 100").await.unwrap();
    let strict = explain(local[0]).await;
    assert_eq!(placement(&strict), "has", "{strict}");
    for q in local.iter().chain(&spread) {
        assert_eq!(differs(c, &reference, q).await, None, "{q}");
    }
    c.sql("SET gyre.neo_min_saving = off").await.unwrap();
    let off = explain(local[0]).await;
    assert!(!off.contains("NeoJoinExec"), "{off}");
}

/// Neo-Joins over the thesis' two dimensions on 4 workers, each answer DataFusion's:
/// locality (the share of each input's rows on the worker that holds its key's range)
/// 0, 0.5 and 1, times probe keys Zipf-distributed over the build keys with exponent
/// 0, 1 and 1.25, some of them NULL; every join type, and a probe side from another
/// stage; forced (`neo`) and chosen at run time (`auto`) on samples of 1024 rows, so
/// that hash placement streams and Neo-Join's assignment is decided again on every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neo_join_answers_like_datafusion_over_locality_and_skew() {
    const KEYS: u32 = 4000;
    let mut setup = vec![];
    let mut tables = vec![];
    for locality in [0, 50, 100] {
        for (z, exponent) in [("0", 0.0f64), ("1", 1.0), ("125", 1.25)] {
            let (b, p) = (format!("b{locality}_{z}"), format!("p{locality}_{z}"));
            // A low-discrepancy u in [0, 1) per row, through the inverse of the
            // continuous power law's distribution function (log-uniform at 1).
            let u = "((value * 0.6180339887498949) % 1.0)";
            let zipf = if exponent == 1.0 {
                format!("CAST(floor(exp({u} * ln({KEYS}.0))) AS BIGINT) - 1")
            } else {
                let e = 1.0 - exponent;
                format!(
                    "CAST(floor(power((power({KEYS}.0, {e}) - 1.0) * {u} + 1.0, 1.0 / {e})) \
                     AS BIGINT) - 1"
                )
            };
            // Rows with the locality flag are placed by their key's quarter; the
            // others by their row number.
            let place = |key: &str| {
                format!(
                    "CASE WHEN (value * 37) % 100 < {locality} THEN ({key}) * 4 / {KEYS} \
                     ELSE value % 4 END"
                )
            };
            setup.push(format!(
                "CREATE TABLE {b}_placed (k BIGINT, v INT, p BIGINT) PARTITION BY p;
                 INSERT INTO {b}_placed SELECT value % {KEYS}, value % 1000, {}
                     FROM generate_series(0, 7999) AS t(value);
                 CREATE TABLE {b} AS SELECT k, v FROM {b}_placed;
                 CREATE TABLE {p}_placed (k BIGINT, w INT, p BIGINT) PARTITION BY p;
                 INSERT INTO {p}_placed SELECT CASE WHEN value % 53 = 0 THEN NULL ELSE {zipf} END,
                     value % 997, {} FROM generate_series(0, 19999) AS t(value);
                 CREATE TABLE {p} AS SELECT k, w FROM {p}_placed",
                place(&format!("value % {KEYS}")),
                place(&zipf),
            ));
            tables.push((b, p));
        }
    }
    let (cluster, reference) = start(4, &setup.join(";\n")).await;
    let c = &cluster.coordinator;
    let mut failures = vec![];
    for settings in [
        "SET gyre.join_strategy = 'neo'",
        "SET gyre.join_strategy = 'auto'; SET gyre.neo_sample_rows = 1024",
    ] {
        c.sql(settings).await.unwrap();
        for (b, p) in &tables {
            let queries = [
                format!("SELECT count(*), sum(b.v), sum(p.w) FROM {b} b JOIN {p} p ON b.k = p.k"),
                format!(
                    "SELECT count(*), count(b.v), sum(p.w) FROM {p} p LEFT JOIN {b} b ON b.k = p.k"
                ),
                format!("SELECT count(*), count(p.w) FROM {p} p RIGHT JOIN {b} b ON b.k = p.k"),
                format!(
                    "SELECT count(*), count(b.v), count(p.w) FROM {b} b FULL JOIN {p} p \
                     ON b.k = p.k AND p.w < 700"
                ),
                format!(
                    "SELECT count(*), sum(w) FROM {p} WHERE k IN (SELECT k FROM {b} WHERE v < 500)"
                ),
                format!(
                    "SELECT count(*), sum(v) FROM {b} b WHERE NOT EXISTS \
                     (SELECT 1 FROM {p} p WHERE p.k = b.k AND p.w < 100)"
                ),
                // The probe side from another stage (a GROUP BY on more than the key).
                format!(
                    "SELECT count(*), sum(x.c) FROM {b} b JOIN \
                     (SELECT k, w % 3 AS g, count(*) AS c FROM {p} GROUP BY k, w % 3) x \
                     ON b.k = x.k"
                ),
            ];
            for q in &queries {
                if let Some(d) = differs(c, &reference, q).await {
                    failures.push(format!("[{settings}] {d}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The forced Neo-Joins ran as such: the plan of a clustered pair shows the assignment.
    c.sql("SET gyre.join_strategy = 'neo'").await.unwrap();
    let (b, p) = &tables[6];
    let plan = text(
        c.sql_one(&format!(
            "EXPLAIN ANALYZE SELECT count(*) FROM {b} b JOIN {p} p ON b.k = p.k"
        ))
        .await
        .unwrap(),
    );
    assert!(
        plan.contains("NeoJoinExec") && plan.contains("assignment="),
        "{plan}"
    );
}

/// Neo aggregations (`gyre.join_strategy = neo`): a GROUP BY whose partial aggregates
/// are placed by one integer or date group key. Rows range-placed by their key keep
/// their groups where they are (the assignment moves a fraction of what a hash shuffle
/// moves); spread ones are assigned like any partition. Every aggregate function,
/// several group keys, NULL keys (one group), date keys, HAVING and DISTINCT answer as
/// DataFusion does, in free and open-shop rounds; a string key stays a hash shuffle.
/// `auto` keeps GROUP BYs hash-shuffled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neo_aggregation_answers_like_datafusion() {
    let setup = "
        CREATE TABLE gb (k BIGINT, p INT, v INT, d DATE, s VARCHAR) PARTITION BY p;
        INSERT INTO gb SELECT CASE WHEN value % 101 = 0 THEN NULL ELSE value / 3 END,
            value / 60000, value % 1000, arrow_cast(CAST(value % 3000 AS INT), 'Date32'),
            concat('s', value % 97) FROM generate_series(0, 239999) AS t(value);
        CREATE TABLE g AS SELECT k, v, d, s FROM gb;
        CREATE TABLE h (k BIGINT, w INT) PARTITION BY w;
        INSERT INTO h SELECT value % 80000, value % 1000 FROM generate_series(0, 119999) AS t(value)";
    let (cluster, reference) = start(4, setup).await;
    let c = &cluster.coordinator;
    let clustered = "SELECT k, count(*), sum(v), avg(v), min(d), max(s), count(DISTINCT s) \
                     FROM g GROUP BY k";
    let queries = [
        clustered,
        "SELECT k, d, count(*) FROM g GROUP BY k, d HAVING count(*) > 1",
        "SELECT d, count(*), sum(v) FROM g GROUP BY d",
        "SELECT v, count(DISTINCT k), max(k) FROM g GROUP BY v",
        "SELECT s, count(*) FROM g GROUP BY s",
        "SELECT g.k, count(*), sum(w) FROM g JOIN h ON g.k = h.k GROUP BY g.k",
        "SELECT v, count(*), sum(k) FROM g GROUP BY v HAVING sum(k) > 10",
        // A Neo-Join's run-time filter of every worker's build keys reaches below
        // the Neo aggregation feeding its probe side.
        "SELECT count(*), sum(n) FROM h JOIN (SELECT k, count(*) AS n FROM g GROUP BY k) x \
         ON h.k = x.k WHERE h.w < 10",
        // A sort above makes its own order: the aggregation below it moves freely.
        "SELECT k, sum(v) FROM g GROUP BY k ORDER BY k DESC LIMIT 50",
    ];
    let explain = |q: &str| {
        let sql = format!("EXPLAIN ANALYZE {q}");
        async move { text(c.sql_one(&sql).await.unwrap()) }
    };
    let neo_line = |plan: &str| -> String {
        plan.lines()
            .find(|l| l.contains("NeoAggregateExec") && l.contains("placement="))
            .unwrap_or_else(|| panic!("no Neo aggregation in:\n{plan}"))
            .to_string()
    };
    let bytes = |line: &str, key: &str| -> (u64, u64) {
        let rest = line.split(key).nth(1).unwrap();
        let number = |s: &str| s.split('B').next().unwrap().parse::<u64>().unwrap();
        (number(rest), number(rest.split("(hash ").nth(1).unwrap()))
    };
    c.sql("SET gyre.join_strategy = 'neo'").await.unwrap();
    for schedule in ["open-shop", "free"] {
        c.sql(&format!("SET gyre.neo_schedule = '{schedule}'"))
            .await
            .unwrap();
        for q in queries {
            assert_eq!(differs(c, &reference, q).await, None, "[{schedule}] {q}");
        }
        let line = neo_line(&explain(clustered).await);
        let (moved, hash) = bytes(&line, "moved=");
        assert!(moved * 4 < hash, "moved {moved} of hash's {hash}: {line}");
        assert!(line.contains(&format!("schedule={schedule}")), "{line}");
    }
    let filtered = explain_analyze_lines(c, queries[7]).await;
    assert!(
        filtered
            .windows(2)
            .any(|w| w[0].starts_with("FilterTargetExec")
                && w[0].contains("from every worker")
                && !w[0].contains("rows_pruned=0,")
                && w[1].starts_with("GyreScanExec: table=g")),
        "{}",
        filtered.join("\n")
    );
    let sorted = explain(queries[8]).await;
    assert!(sorted.contains("NeoAggregateExec"), "{sorted}");
    let string_key = explain(queries[4]).await;
    assert!(!string_key.contains("NeoAggregateExec"), "{string_key}");
    // Placed by the date key, the one integer or date key there is.
    let dates = explain(queries[2]).await;
    assert!(dates.contains("NeoAggregateExec: key=d@0"), "{dates}");

    c.sql("SET gyre.join_strategy = 'auto'").await.unwrap();
    let auto = explain(clustered).await;
    assert!(!auto.contains("NeoAggregateExec"), "{auto}");
}
