//! Flow-Join in SQL (issue 4): partitioned hash joins with skew detection, on 1 to 4
//! workers, each result compared with single-node DataFusion. The probe table has keys
//! heavy from the start (7, 11), keys heavy only in the last third (40000 with build
//! rows, 123456789 without), NULL keys, and a uniform rest.

mod sql_reference;

use sql_reference::{differs, start, text};

const SETUP: &str = "
CREATE TABLE dim (k BIGINT, name VARCHAR, w INT) PARTITION BY k;
INSERT INTO dim SELECT value, 'd' || CAST(value AS VARCHAR), CAST(value % 100 AS INT) FROM generate_series(0, 49999) AS t(value);
INSERT INTO dim VALUES (NULL, 'null key', 1), (7, 'second 7', 2);
CREATE TABLE fact (id BIGINT, k BIGINT, x INT) PARTITION BY id;
INSERT INTO fact SELECT value,
    CASE WHEN value % 97 = 0 THEN NULL
         WHEN value % 10 < 3 THEN 7
         WHEN value % 10 = 3 THEN 11
         WHEN value > 400000 AND value % 10 = 4 THEN 123456789
         WHEN value > 400000 AND value % 10 = 5 THEN 40000
         ELSE value % 60000 END,
    CAST(value % 13 AS INT)
  FROM generate_series(1, 600000) AS t(value);
";

/// Queries and whether their plan must contain a Flow-Join (with more than one worker).
const QUERIES: &[(&str, bool)] = &[
    (
        "SELECT count(*), sum(f.x), sum(d.w), count(DISTINCT d.name) FROM fact f JOIN dim d ON f.k = d.k",
        true,
    ),
    (
        "SELECT f.id, f.k, d.name FROM fact f JOIN dim d ON f.k = d.k WHERE f.id % 1000 = 7",
        true,
    ),
    (
        "SELECT count(*), count(d.name), sum(f.x), sum(d.w) FROM dim d RIGHT JOIN fact f ON d.k = f.k",
        true,
    ),
    (
        "SELECT f.id, f.k, d.name FROM dim d RIGHT JOIN fact f ON d.k = f.k WHERE f.id % 997 = 1",
        true,
    ),
    (
        "SELECT count(*), sum(x) FROM fact f WHERE f.k IN (SELECT k FROM dim WHERE w < 50)",
        true,
    ),
    (
        "SELECT count(*), sum(x) FROM fact f WHERE NOT EXISTS (SELECT 1 FROM dim d WHERE d.k = f.k)",
        true,
    ),
    (
        "SELECT count(*), sum(f.x) FROM fact f JOIN dim d ON f.k = d.k AND f.x < d.w % 13",
        true,
    ),
    (
        "SELECT count(*), sum(f.id) FROM fact f JOIN dim d ON f.k = d.k AND f.x = d.w % 13",
        true,
    ),
    // Grouped by the join key: the aggregation relies on the join's hash partitioning,
    // so the planner must keep the plain partitioned join (still correct).
    (
        "SELECT f.k, count(*), count(d.k) FROM dim d RIGHT JOIN fact f ON d.k = f.k GROUP BY f.k ORDER BY count(*) DESC, f.k LIMIT 20",
        false,
    ),
];

async fn check(workers: usize) {
    let (cluster, reference) = start(workers, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    let mut failures = vec![];
    for (q, flow) in QUERIES {
        let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
        if *flow && workers > 1 && !plan.contains("FlowJoinExec") {
            failures.push(format!("{q}\n  no Flow-Join in:\n{plan}"));
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
async fn flow_joins_match_datafusion_on_one_and_two_workers() {
    check(1).await;
    check(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_joins_match_datafusion_on_three_workers() {
    check(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_joins_match_datafusion_on_four_workers() {
    check(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_shows_heavy_hitters_and_the_setting_switches_it_off() {
    let (cluster, reference) = start(3, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    let q = QUERIES[0].0;
    let analyzed = text(c.sql_one(&format!("EXPLAIN ANALYZE {q}")).await.unwrap());
    assert!(analyzed.contains("FlowJoinExec"), "{analyzed}");
    // Keys 7 and 11 are heavy from the start: found in round 0, named, kept local.
    assert!(analyzed.contains("7 (~"), "{analyzed}");
    assert!(analyzed.contains("11 (~"), "{analyzed}");
    assert!(analyzed.contains("round 0"), "{analyzed}");
    let kept: Vec<u64> = analyzed
        .match_indices("probe_rows_kept_local=")
        .map(|(at, m)| {
            let v = &analyzed[at + m.len()..];
            let v = &v[..v.find([',', ']']).unwrap()];
            let (num, scale) = match v.strip_suffix(" K") {
                Some(n) => (n, 1000.0),
                None => (v, 1.0),
            };
            (num.trim().parse::<f64>().unwrap() * scale) as u64
        })
        .collect();
    assert_eq!(kept.len(), 3, "{analyzed}");
    // 40% of 600K rows have key 7 or 11: far more than one worker's share stays local.
    assert!(kept.iter().sum::<u64>() > 100_000, "{kept:?}\n{analyzed}");
    assert!(analyzed.contains("build_rows_broadcast="), "{analyzed}");

    // A key heavy only late is found in a later round.
    let late = "SELECT count(*), count(d.name) FROM dim d RIGHT JOIN fact f ON d.k = f.k";
    let analyzed = text(c.sql_one(&format!("EXPLAIN ANALYZE {late}")).await.unwrap());
    assert!(analyzed.contains("40000 (~"), "{analyzed}");
    assert!(!analyzed.contains("40000 (~0 rows, round 0)"), "{analyzed}");

    // Stricter threshold and sampling are accepted and shown; bad values are refused.
    c.sql("SET gyre.skew_threshold = '0.5%'").await.unwrap();
    c.sql("SET gyre.skew_sample = 4").await.unwrap();
    let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
    assert!(
        plan.contains("threshold=0.5%") && plan.contains("sample 1/4"),
        "{plan}"
    );
    assert_eq!(differs(c, &reference, q).await, None);
    for (bad, named) in [
        ("SET gyre.skew_detection = maybe", "maybe"),
        ("SET gyre.skew_threshold = 2", "threshold"),
        ("SET gyre.skew_threshold = lots", "lots"),
        ("SET gyre.skew_sample = 0", "sample"),
        ("SET gyre.skew_first = 1.5", "first"),
    ] {
        let err = c.sql(bad).await.unwrap_err().to_string();
        assert!(err.contains(named), "{bad}: {err}");
    }
    c.sql("SET gyre.skew_detection = off").await.unwrap();
    let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
    assert!(!plan.contains("FlowJoinExec"), "{plan}");
    assert!(plan.contains("partitioned join"), "{plan}");
    assert_eq!(differs(c, &reference, q).await, None);
    c.sql("SET gyre.skew_detection = on").await.unwrap();
    let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
    assert!(plan.contains("FlowJoinExec"), "{plan}");
}
