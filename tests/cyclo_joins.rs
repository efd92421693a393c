//! Cyclo-joins through SQL on 1, 2 and 3 workers: band, inequality, theta and equi-joins
//! (the last under `SET gyre.join_strategy = 'cyclo'`), inner, left/right/full outer,
//! semi and anti,
//! over random and skewed data with
//! duplicate keys, NULL keys, nested columns, an empty table and a table on one worker
//! only, each result
//! compared with single-node DataFusion; `EXPLAIN` must show the cyclo-join (so a
//! fallback to another join cannot pass unnoticed) and `EXPLAIN ANALYZE` its timings.

mod sql_reference;

use gyre_cluster::reference::canonical_rows;
use sql_reference::{differs, start, text};

/// `n`: the smallest table, with nested columns (lists with NULLs, structs, maps and
/// lists of structs), so they must travel the ring in Arrow's row format.
/// `a`: strings, random `x`, skewed `k` with NULLs. `b`: smaller, only fixed-width
/// columns: random `y` with NULLs, floats, dates, booleans. `w`: smaller than `a`, with
/// strings (NULL, empty, multi-byte, up to 6000 bytes long) and decimals, so strings
/// and decimals must travel the ring.
const SETUP: &str = "
CREATE TABLE a AS SELECT
    CASE WHEN value % 13 = 0 THEN NULL WHEN value % 3 = 0 THEN 7 ELSE CAST(value % 40 AS INT) END AS k,
    (value * 7919) % 1000 AS x,
    'a' || CAST(value AS VARCHAR) AS s,
    CAST(value % 5 AS SMALLINT) AS g
  FROM generate_series(1, 3000) AS t(value);
CREATE TABLE b AS SELECT
    CASE WHEN value % 11 = 0 THEN NULL WHEN value % 2 = 0 THEN 7 ELSE CAST(value % 60 AS INT) END AS k,
    CASE WHEN value % 17 = 0 THEN NULL ELSE (value * 104729) % 1000 END AS y,
    CASE WHEN value % 7 = 0 THEN NULL ELSE CAST(value AS DOUBLE) / 8 END AS f,
    CAST(CAST(19000 + value % 30 AS INT) AS DATE) AS d,
    value % 4 = 1 AS flag,
    CAST(value % 200 AS TINYINT UNSIGNED) AS u
  FROM generate_series(1, 2000) AS t(value);
CREATE TABLE c AS SELECT CAST(value % 9 AS INT) AS k, CAST(19000 + value % 30 AS INT) AS di,
    CAST(CAST(19000 + value % 30 AS INT) AS DATE) AS dd
  FROM generate_series(1, 40) AS t(value);
CREATE TABLE w AS SELECT
    CAST(value % 50 AS INT) AS k,
    (value * 613) % 1000 AS z,
    CASE WHEN value % 9 = 0 THEN NULL ELSE 'w' || repeat('-', CAST(value % 23 AS INT)) || CAST(value AS VARCHAR) END AS name,
    CAST(value AS DECIMAL(15, 2)) / 7 AS price,
    CASE WHEN value % 5 = 0 THEN '' ELSE 'é' || CAST(value % 3 AS VARCHAR) END AS u,
    repeat('x', CAST((value * 37) % 6000 AS INT)) AS long
  FROM generate_series(1, 1500) AS t(value);
CREATE TABLE n AS SELECT
    (value * 389) % 1000 AS nx,
    CASE WHEN value % 10 = 0 THEN NULL ELSE make_array(value, NULL, value * 2) END AS xs,
    named_struct('id', value, 'tag', CASE WHEN value % 4 = 0 THEN NULL ELSE 'n' || CAST(value AS VARCHAR) END) AS st,
    MAP {'k': value % 3, 'z': value} AS m,
    make_array(named_struct('p', CAST(value AS DOUBLE) / 4, 'q', 'é' || CAST(value % 7 AS VARCHAR))) AS ps
  FROM generate_series(1, 300) AS t(value);
CREATE TABLE e (k INT, x BIGINT);
CREATE TABLE one (k INT, w BIGINT) PARTITION BY k;
INSERT INTO one VALUES (20, 5);
";

/// Each query with the kernel `EXPLAIN` must name.
const QUERIES: &[(&str, &str)] = &[
    // Band joins (random keys, NULLs on the rotating side).
    (
        "SELECT a.k, a.x, a.s, b.k, b.y, b.f, b.d, b.flag, b.u FROM a JOIN b ON a.x BETWEEN b.y - 3 AND b.y + 3",
        "sort-merge band",
    ),
    (
        "SELECT a.s, b.y FROM a JOIN b ON b.y BETWEEN a.x AND a.x + 2 WHERE a.g = 1",
        "sort-merge band",
    ),
    // Band on skewed keys with duplicates and NULLs on both sides, plus a residual.
    (
        "SELECT a.k, b.k, a.s, b.f FROM a JOIN b ON a.k BETWEEN b.k - 1 AND b.k + 1 AND a.x < b.y",
        "sort-merge band",
    ),
    // Inequalities.
    (
        "SELECT count(*), sum(a.x), sum(b.y) FROM a JOIN b ON a.x < b.y",
        "sort-merge (l ",
    ),
    (
        "SELECT a.s, c.k FROM a JOIN c ON a.k >= c.k WHERE a.g = 2",
        "sort-merge (l ",
    ),
    (
        "SELECT count(*), sum(a.x) FROM a JOIN b ON b.k > a.k",
        "sort-merge (l ",
    ),
    // Theta joins: any other predicate, all pairs and the filter.
    (
        "SELECT count(*), sum(a.x), sum(b.y) FROM a JOIN b ON (a.x + b.y) % 7 = 3",
        "nested loops",
    ),
    (
        "SELECT a.s, c.k, c.di FROM a JOIN c ON a.x * c.k < 40 OR a.k = c.k + 30",
        "nested loops",
    ),
    (
        "SELECT a.k, b.k, b.flag FROM a JOIN b ON a.k <> b.k AND b.f < 2 AND a.x < 30",
        "nested loops",
    ),
    // All pairs for semi and anti joins (a NULL condition is no match) and under a
    // LIMIT that stops the consumer early; the small `c` rotates, and the condition
    // is evaluated one fragment row against all stationary rows.
    (
        "SELECT a.k, a.s FROM a WHERE EXISTS (SELECT 1 FROM c WHERE (a.x + c.k) % 11 = 4)",
        "nested loops",
    ),
    (
        "SELECT count(*), sum(b.k) FROM b WHERE NOT EXISTS (SELECT 1 FROM c WHERE b.y * c.k % 13 = 2)",
        "nested loops",
    ),
    (
        "SELECT count(*) FROM (SELECT a.s, b.y FROM a JOIN b ON (a.x + b.y) % 7 = 3 LIMIT 11) t",
        "nested loops",
    ),
    // The preserved `c` stays and the larger `a` rotates: the condition is evaluated
    // one stationary row against a whole fragment (the other way round above).
    (
        "SELECT c.k, c.dd, a.s FROM c LEFT JOIN a ON (a.x + c.k) % 97 = 3 AND a.s > 'a2'",
        "nested loops",
    ),
    // Equi-joins, under SET gyre.join_strategy = 'cyclo'.
    (
        "SELECT a.k, a.s, b.y, b.f, b.d FROM a JOIN b ON a.k = b.k WHERE a.x < 100",
        "radix hash",
    ),
    (
        "SELECT count(*), sum(a.x), sum(b.y) FROM a JOIN b ON a.k = b.k",
        "radix hash",
    ),
    (
        "SELECT a.k, b.y FROM a JOIN b ON a.k = b.k AND a.x > b.y + 900",
        "radix hash",
    ),
    (
        "SELECT c.k, c.dd, b.y, b.u FROM c JOIN b ON c.dd = b.d WHERE b.y < 50",
        "radix hash",
    ),
    // Outer, semi and anti joins: the preserved (or filtered) input stays, the other
    // rotates; unmatched rows include NULL keys.
    (
        "SELECT a.k, a.x, a.s, b.y, b.f FROM a LEFT JOIN b ON a.x BETWEEN b.y - 3 AND b.y + 3",
        "sort-merge band",
    ),
    (
        "SELECT a.s, b.k, b.f FROM a LEFT JOIN b ON a.k = b.k AND b.f > a.x",
        "radix hash",
    ),
    (
        "SELECT b.k, b.y, a.x FROM a RIGHT JOIN b ON a.x < b.y - 990",
        "sort-merge (l ",
    ),
    (
        "SELECT a.k, a.s FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.y BETWEEN a.x - 1 AND a.x + 1)",
        "sort-merge band",
    ),
    (
        "SELECT a.k, a.s FROM a WHERE a.k IN (SELECT k FROM b WHERE y < 100)",
        "radix hash",
    ),
    (
        "SELECT count(*), sum(a.x) FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.y BETWEEN a.x - 2 AND a.x + 2)",
        "sort-merge band",
    ),
    (
        "SELECT a.s FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.y > a.x)",
        "radix hash",
    ),
    (
        "SELECT a.s, e.x FROM a LEFT JOIN e ON a.x < e.x",
        "sort-merge (l ",
    ),
    // Full outer joins: unmatched rotating rows (NULL keys among them) come back to
    // their origin, unmatched stationary rows stay where they are.
    (
        "SELECT a.s, b.k, b.y, b.f FROM a FULL JOIN b ON a.x BETWEEN b.y - 1 AND b.y + 1",
        "sort-merge band",
    ),
    (
        "SELECT a.k, a.s, b.k, b.y FROM a FULL JOIN b ON a.k = b.k AND b.y > a.x + 500",
        "radix hash",
    ),
    (
        "SELECT c.k, c.di, a.x FROM c FULL JOIN a ON (a.x + c.k) % 97 = 3",
        "nested loops",
    ),
    (
        "SELECT a.s, e.x FROM a FULL JOIN e ON a.x < e.x",
        "sort-merge (l ",
    ),
    // Strings and decimals on the rotating side. With strings on both sides a
    // cyclo-join means one of them travelled; the LEFT join forces `w` to rotate, the
    // anti join `a` (its strings are in the condition).
    (
        "SELECT w.name, w.price, w.u, a.s, a.x FROM w JOIN a ON a.x BETWEEN w.z - 2 AND w.z + 2",
        "sort-merge band",
    ),
    (
        "SELECT a.s, a.k, w.name, w.u, w.price FROM a LEFT JOIN w ON a.k = w.k AND w.z < a.x",
        "radix hash",
    ),
    (
        "SELECT w.name, length(w.long), a.s FROM w FULL JOIN a ON (a.x + w.z) % 101 = 7",
        "nested loops",
    ),
    (
        "SELECT w.k, w.name FROM w WHERE NOT EXISTS (SELECT 1 FROM a WHERE a.x BETWEEN w.z AND w.z + 1 AND a.s > 'a2')",
        "sort-merge band",
    ),
    (
        "SELECT a.s, w.u, sum(length(w.long)) FROM a JOIN w ON a.k = w.k GROUP BY a.s, w.u",
        "radix hash",
    ),
    // A LIMIT that DataFusion pushed into the join (its `fetch`) stays a limit.
    (
        "SELECT count(*) FROM (SELECT a.s, w.name FROM a JOIN w ON a.k = w.k LIMIT 7) t",
        "radix hash",
    ),
    // Empty inputs and a table whose rows are all on one worker.
    ("SELECT * FROM a JOIN e ON a.x < e.x", "sort-merge (l "),
    ("SELECT * FROM e JOIN b ON e.k = b.k", "radix hash"),
    (
        "SELECT one.k, one.w, a.s FROM one JOIN a ON a.x BETWEEN one.w AND one.w + 10",
        "sort-merge band",
    ),
    (
        "SELECT one.k, b.y FROM one JOIN b ON one.k = b.k",
        "radix hash",
    ),
];

async fn check(workers: usize) {
    let (cluster, reference) = start(workers, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'cyclo'").await.unwrap();
    let mut failures = vec![];
    for (q, kernel) in QUERIES {
        let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
        if !plan.contains("CycloJoinExec") || !plan.contains(kernel) {
            failures.push(format!("{q}\n  not a {kernel} cyclo-join:\n{plan}"));
            continue;
        }
        if let Some(d) = differs(c, &reference, q).await {
            failures.push(d);
        }
    }
    assert!(
        failures.is_empty(),
        "{workers} workers:\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cyclo_joins_match_datafusion_on_one_worker() {
    check(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cyclo_joins_match_datafusion_on_two_workers() {
    check(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cyclo_joins_match_datafusion_on_three_workers() {
    check(3).await;
}

/// Nested columns travel the ring: the smallest input, `n`, rotates although it carries
/// lists, structs and maps, and its nested values come back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_columns_rotate() {
    let (cluster, reference) = start(3, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'cyclo'").await.unwrap();
    let mut failures = vec![];
    for q in [
        "SELECT n.nx, n.xs, n.st, n.m, n.ps, b.y FROM n JOIN b ON n.nx BETWEEN b.y - 2 AND b.y + 2",
        "SELECT a.s, a.x, n.st, n.xs FROM a JOIN n ON a.x < n.nx AND n.nx < 40",
        "SELECT n.m, n.ps, a.s FROM n JOIN a ON n.nx = a.x WHERE a.g < 4",
        // Nested functions above the join run on the workers.
        "SELECT array_length(n.xs), n.st['tag'], n.m['z'], b.y FROM n JOIN b ON n.nx BETWEEN b.y AND b.y + 3 WHERE array_length(n.ps) = 1",
        "SELECT a.s, n.st, n.m FROM a LEFT JOIN n ON a.x BETWEEN n.nx AND n.nx + 1",
    ] {
        let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
        let n_rotates = (plan.contains("on=(nx, ") && plan.contains("rotating=left input"))
            || (plan.contains(", nx)") && plan.contains("rotating=right input"));
        if !plan.contains("CycloJoinExec") || !n_rotates {
            failures.push(format!("{q}\n  n does not rotate:\n{plan}"));
            continue;
        }
        if let Some(d) = differs(c, &reference, q).await {
            failures.push(d);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategies_are_chosen_by_setting_and_analyze_shows_ring_times() {
    let (cluster, reference) = start(3, SETUP).await;
    let c = &cluster.coordinator;
    let equi = "SELECT a.k, a.s, b.y FROM a JOIN b ON a.k = b.k";
    let band = "SELECT a.s, b.y FROM a JOIN b ON a.x BETWEEN b.y - 1 AND b.y + 1";
    let want_equi =
        canonical_rows(&reference.sql(equi).await.unwrap().collect().await.unwrap()).unwrap();
    for (strategy, equi_note, band_note) in [
        ("auto", "join", "broadcast nested-loop join"),
        ("shuffle", "partitioned join", "broadcast nested-loop join"),
        ("broadcast", "broadcast join", "broadcast nested-loop join"),
        ("cyclo", "cyclo-join", "cyclo-join"),
    ] {
        c.sql(&format!("SET gyre.join_strategy = '{strategy}'"))
            .await
            .unwrap();
        let plan = text(c.sql_one(&format!("EXPLAIN {equi}")).await.unwrap());
        assert!(plan.contains(equi_note), "{strategy}: {plan}");
        let plan = text(c.sql_one(&format!("EXPLAIN {band}")).await.unwrap());
        assert!(plan.contains(band_note), "{strategy}: {plan}");
        let got = canonical_rows(&c.sql_one(equi).await.unwrap().batches).unwrap();
        assert_eq!(got, want_equi, "{strategy}");
    }
    // The rotating side is the smaller input, b, whichever side DataFusion put it on.
    let plan = text(c.sql_one(&format!("EXPLAIN {band}")).await.unwrap());
    assert!(
        (plan.contains("on=(x, y)") && plan.contains("rotating=right input"))
            || (plan.contains("on=(y, x)") && plan.contains("rotating=left input")),
        "{plan}"
    );
    // The band's bounds (`b.y - 1`, `b.y + 1`) are computed in the filter, on candidate
    // pairs, not as columns of the rotating input that would travel the ring.
    assert!(plan.contains("filter=x >= y - 1 AND x <= y + 1"), "{plan}");
    assert!(!plan.contains("join_proj_push_down"), "{plan}");
    let plan = text(c.sql_one(&format!("EXPLAIN ANALYZE {band}")).await.unwrap());
    for needle in [
        "CycloJoinExec",
        "setup_time",
        "join_time",
        "sync_time",
        "worker 1",
        "worker 3",
    ] {
        assert!(plan.contains(needle), "missing {needle}:\n{plan}");
    }
    // Null-aware anti joins (NOT IN) need to know whether the other input has a NULL
    // anywhere: they stay DataFusion's join (and correct).
    for q in ["SELECT a.s FROM a WHERE a.k NOT IN (SELECT k FROM b WHERE y < 500)"] {
        let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
        assert!(!plan.contains("CycloJoinExec"), "{q}\n{plan}");
        assert_eq!(differs(c, &reference, q).await, None);
    }
    let err = c
        .sql("SET gyre.join_strategy = 'spin'")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("spin") && err.contains("cyclo"), "{err}");
}
