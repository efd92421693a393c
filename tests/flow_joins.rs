//! Flow-Join in SQL: partitioned hash joins with skew detection, on 1 to 4
//! workers, each result compared with single-node DataFusion. The probe table has keys
//! heavy from the start (7, 11, 13), keys heavy only in the last third (40000 with build
//! rows, 123456789 without), NULL keys, and a uniform rest. A second build table has
//! keys heavy on the build side: 5 (30%, rare in the probe table), 13 (2%, heavy on
//! both sides), 20001 (only in its last 30%), and NULL, joined with every join type.
//! Two small tables share a key about equally heavy in both (1: 600 rows each), which
//! Symmetric Fragment Replicate joins on a grid.

mod sql_reference;

use gyre_cluster::coordinator::Coordinator;
use sql_reference::{differs, start, text};
use std::sync::Arc;

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
         WHEN value % 100 = 6 THEN 13
         ELSE value % 60000 END,
    CAST(value % 13 AS INT)
  FROM generate_series(1, 600000) AS t(value);
CREATE TABLE many (k BIGINT, v INT) PARTITION BY v;
INSERT INTO many SELECT CASE WHEN value % 211 = 0 THEN NULL
         WHEN value % 10 < 3 THEN 5
         WHEN value % 50 = 3 THEN 13
         WHEN value > 14000 AND value % 10 = 4 THEN 20001
         ELSE value END,
    CAST(value % 17 AS INT)
  FROM generate_series(1, 20000) AS t(value);
CREATE TABLE sl (k BIGINT, v BIGINT) PARTITION BY v;
INSERT INTO sl SELECT CASE WHEN value % 5 = 0 THEN 1 WHEN value % 101 = 0 THEN NULL ELSE value END, value
  FROM generate_series(1, 3000) AS t(value);
CREATE TABLE sr (id BIGINT, k BIGINT, x INT) PARTITION BY id;
INSERT INTO sr SELECT value, CASE WHEN value % 10 = 0 THEN 1 WHEN value % 103 = 0 THEN NULL ELSE value % 3000 END,
    CAST(value % 7 AS INT)
  FROM generate_series(1, 6000) AS t(value);
";

/// What a query's plan must contain with more than one worker.
#[derive(Clone, Copy, PartialEq)]
enum Plan {
    /// A Flow-Join of a probe-preserving join.
    Flow,
    /// A Flow-Join of a build-preserving join, combining build matches across workers.
    FlowTracked,
    /// A Flow-Join that also routes its build input, detecting skew there.
    FlowBuild,
    /// A Flow-Join of a probe-preserving join that routes its build input, combining
    /// the matches of the probe rows it broadcasts for build-heavy keys.
    FlowBuildProbeTracked,
    /// A full join doing all of the above, with SFR.
    FlowBothTracked,
    /// A Flow-Join that routes its build input and joins keys heavy on both sides by
    /// Symmetric Fragment Replicate.
    FlowSfr,
    /// The same for a build-preserving join, combining build matches across workers.
    FlowTrackedSfr,
    /// No Flow-Join (the plain partitioned join is kept).
    Plain,
}

const QUERIES: &[(&str, Plan)] = &[
    (
        "SELECT count(*), sum(f.x), sum(d.w), count(DISTINCT d.name) FROM fact f JOIN dim d ON f.k = d.k",
        Plan::Flow,
    ),
    (
        "SELECT f.id, f.k, d.name FROM fact f JOIN dim d ON f.k = d.k WHERE f.id % 1000 = 7",
        Plan::Flow,
    ),
    (
        "SELECT count(*), count(d.name), sum(f.x), sum(d.w) FROM dim d RIGHT JOIN fact f ON d.k = f.k",
        Plan::Flow,
    ),
    (
        "SELECT f.id, f.k, d.name FROM dim d RIGHT JOIN fact f ON d.k = f.k WHERE f.id % 997 = 1",
        Plan::Flow,
    ),
    (
        "SELECT count(*), sum(x) FROM fact f WHERE f.k IN (SELECT k FROM dim WHERE w < 50)",
        Plan::Flow,
    ),
    (
        "SELECT count(*), sum(x) FROM fact f WHERE NOT EXISTS (SELECT 1 FROM dim d WHERE d.k = f.k)",
        Plan::Flow,
    ),
    (
        "SELECT count(*), sum(f.x) FROM fact f JOIN dim d ON f.k = d.k AND f.x < d.w % 13",
        Plan::Flow,
    ),
    (
        "SELECT count(*), sum(f.id) FROM fact f JOIN dim d ON f.k = d.k AND f.x = d.w % 13",
        Plan::Flow,
    ),
    // Build-preserving joins (dim builds, fact probes with heavy keys 7 and 11, and 40000
    // heavy late): the heavy dim rows are joined on every worker, and whether one
    // matched is decided by all of them. About 40% of the dim keys match no fact row.
    (
        "SELECT count(*), count(f.id), sum(f.x), sum(d.w), count(DISTINCT d.name) FROM dim d LEFT JOIN fact f ON d.k = f.k",
        Plan::FlowTracked,
    ),
    // No column of the join is needed (an empty projection): rows only.
    (
        "SELECT count(*) FROM dim d LEFT JOIN fact f ON d.k = f.k",
        Plan::FlowTracked,
    ),
    (
        "SELECT d.k, d.name, f.id FROM dim d LEFT JOIN fact f ON d.k = f.k AND f.x > d.w % 13 WHERE d.k % 1000 = 7 OR d.k IS NULL",
        Plan::FlowTracked,
    ),
    (
        "SELECT count(*), count(d.k), count(f.k), sum(f.x), sum(d.w) FROM dim d FULL JOIN fact f ON d.k = f.k",
        Plan::FlowTracked,
    ),
    (
        "SELECT d.name, f.id FROM dim d FULL JOIN fact f ON d.k = f.k AND f.x < d.w % 13 WHERE f.id % 2000 = 7 OR d.k % 3000 = 11 OR d.k IS NULL OR f.k IS NULL",
        Plan::FlowTracked,
    ),
    (
        "SELECT count(*), sum(d.w) FROM dim d WHERE EXISTS (SELECT 1 FROM fact f WHERE f.k = d.k AND f.x > 3)",
        Plan::FlowTracked,
    ),
    (
        "SELECT count(*), sum(d.w), count(d.k) FROM dim d WHERE NOT EXISTS (SELECT 1 FROM fact f WHERE f.k = d.k)",
        Plan::FlowTracked,
    ),
    (
        "SELECT count(*), sum(d.w) FROM dim d WHERE d.w = 5 OR EXISTS (SELECT 1 FROM fact f WHERE f.k = d.k AND f.x < 12)",
        Plan::FlowTracked,
    ),
    // Only fact rows 599990 (key 7) and 599993 (key 11), near the end of their workers'
    // input and so kept local, match dim rows 'd7' (w = 7) and 'd11' (w = 11): each
    // match happens on whichever worker holds the fact row, often not the owner of the
    // key, and must reach the owner.
    (
        "SELECT count(*), count(f.id), sum(f.id), count(DISTINCT d.name) FROM dim d LEFT JOIN fact f ON d.k = f.k AND f.id - d.w IN (599982, 599983)",
        Plan::FlowTracked,
    ),
    (
        "SELECT count(*), count(d.k), count(f.id) FROM dim d FULL JOIN fact f ON d.k = f.k AND f.id - d.w IN (599982, 599983)",
        Plan::FlowTracked,
    ),
    (
        "SELECT d.k, d.name FROM dim d WHERE EXISTS (SELECT 1 FROM fact f WHERE f.k = d.k AND f.id - d.w IN (599982, 599983))",
        Plan::FlowTracked,
    ),
    (
        "SELECT count(*), sum(d.w) FROM dim d WHERE NOT EXISTS (SELECT 1 FROM fact f WHERE f.k = d.k AND f.id - d.w IN (599982, 599983))",
        Plan::FlowTracked,
    ),
    // Skew on the build side (`many`): build rows of keys 5, 13, 20001 and NULL stay
    // where they are, and the probe rows of those keys go to every worker. Inner joins
    // decide those build rows locally; build-preserving ones, which join key 13 (heavy
    // on both sides) by SFR, number them and decide them at the end.
    (
        "SELECT count(*), sum(f.x), sum(m.v), count(DISTINCT m.k) FROM fact f JOIN many m ON f.k = m.k",
        Plan::FlowBuild,
    ),
    (
        "SELECT m.k, m.v, f.id FROM many m JOIN fact f ON m.k = f.k WHERE f.id % 20000 = 6 OR (m.k = 5 AND f.id % 7 = 0) OR m.k = 20001",
        Plan::FlowBuild,
    ),
    (
        "SELECT count(*), sum(f.x) FROM fact f JOIN many m ON f.k = m.k AND f.x < m.v",
        Plan::FlowBuild,
    ),
    (
        "SELECT count(*), count(f.id), sum(m.v), sum(f.x) FROM many m LEFT JOIN fact f ON m.k = f.k AND f.x > 10",
        Plan::FlowTrackedSfr,
    ),
    (
        "SELECT count(*), sum(m.v) FROM many m WHERE EXISTS (SELECT 1 FROM fact f WHERE f.k = m.k AND f.x > 3)",
        Plan::FlowTrackedSfr,
    ),
    (
        "SELECT count(*), sum(m.v), count(m.k) FROM many m WHERE NOT EXISTS (SELECT 1 FROM fact f WHERE f.k = m.k AND f.x > 3)",
        Plan::FlowTrackedSfr,
    ),
    (
        "SELECT count(*), sum(m.v) FROM many m WHERE m.v = 5 OR EXISTS (SELECT 1 FROM fact f WHERE f.k = m.k AND f.x < 12)",
        Plan::FlowTrackedSfr,
    ),
    // Probe-preserving and full joins: a probe row of a build-heavy key is joined on
    // every worker, and its origin decides it by all workers' matches (NULL keys are
    // heavy in `many` too, so their probe rows take that path as well).
    (
        "SELECT count(*), count(m.k), sum(f.x) FROM many m RIGHT JOIN fact f ON m.k = f.k",
        Plan::FlowBuildProbeTracked,
    ),
    (
        "SELECT f.id, f.k, m.v FROM many m RIGHT JOIN fact f ON m.k = f.k AND m.v < f.x WHERE f.id % 3001 = 5 OR f.k IS NULL OR f.k = 5",
        Plan::FlowBuildProbeTracked,
    ),
    (
        "SELECT count(*), sum(f.x) FROM fact f WHERE EXISTS (SELECT 1 FROM many m WHERE m.k = f.k AND m.v > 3)",
        Plan::FlowBuildProbeTracked,
    ),
    (
        "SELECT count(*), sum(f.x), count(f.k) FROM fact f WHERE NOT EXISTS (SELECT 1 FROM many m WHERE m.k = f.k AND m.v > 3)",
        Plan::FlowBuildProbeTracked,
    ),
    (
        "SELECT count(*), sum(f.x) FROM fact f WHERE f.x = 4 OR EXISTS (SELECT 1 FROM many m WHERE m.k = f.k AND m.v = 12)",
        Plan::FlowBuildProbeTracked,
    ),
    (
        "SELECT count(*), count(m.k), count(f.k) FROM many m FULL JOIN fact f ON m.k = f.k AND f.x = m.v",
        Plan::FlowBothTracked,
    ),
    (
        "SELECT count(*), count(m.k), count(f.k), sum(m.v), sum(f.x) FROM many m FULL JOIN fact f ON m.k = f.k AND f.x = m.v % 13",
        Plan::FlowBothTracked,
    ),
    // Key 1 (and NULL) heavy in both `sl` and `sr`: SFR. A build-preserving join's
    // build rows of key 1 are joined on several workers (SFR's grid column, and on
    // their own worker with the probe rows broadcast before key 1 was heavy on the
    // probe side too), and their owner decides them by every copy's matches; the same
    // for the probe rows in probe-preserving joins, and for both in full joins.
    (
        "SELECT count(*), sum(l.v), sum(r.x) FROM sl l JOIN sr r ON l.k = r.k",
        Plan::FlowSfr,
    ),
    (
        "SELECT count(*), count(l.v), sum(r.x) FROM sl l RIGHT JOIN sr r ON l.k = r.k AND l.v % 7 = r.x",
        Plan::FlowSfr,
    ),
    (
        "SELECT count(*), sum(r.x) FROM sr r WHERE EXISTS (SELECT 1 FROM sl l WHERE l.k = r.k AND l.v % 7 = r.x)",
        Plan::FlowSfr,
    ),
    (
        "SELECT count(*), sum(r.x), count(r.k) FROM sr r WHERE NOT EXISTS (SELECT 1 FROM sl l WHERE l.k = r.k AND l.v % 7 = r.x)",
        Plan::FlowSfr,
    ),
    (
        "SELECT count(*), sum(r.x) FROM sr r WHERE r.x = 3 OR EXISTS (SELECT 1 FROM sl l WHERE l.k = r.k AND l.v % 11 = r.x)",
        Plan::FlowSfr,
    ),
    (
        "SELECT count(*), count(l.v), count(r.x) FROM sl l FULL JOIN sr r ON l.k = r.k AND l.v % 7 = r.x",
        Plan::FlowBothTracked,
    ),
    (
        "SELECT l.v, r.id FROM sl l FULL JOIN sr r ON l.k = r.k AND r.id - l.v IN (2995, 3000) WHERE l.k = 1 OR r.k = 1 OR l.k IS NULL OR r.k IS NULL OR r.id % 1000 = 3",
        Plan::FlowBothTracked,
    ),
    (
        "SELECT count(*), count(l.v), count(r.x), sum(l.v), sum(r.x) FROM sl l FULL JOIN sr r ON l.k = r.k AND l.v % 7 < r.x - 3",
        Plan::FlowBothTracked,
    ),
    (
        "SELECT count(*), count(r.x), sum(l.v), sum(r.x) FROM sl l LEFT JOIN sr r ON l.k = r.k AND l.v % 7 = r.x",
        Plan::FlowTrackedSfr,
    ),
    (
        "SELECT l.k, l.v, r.id FROM sl l LEFT JOIN sr r ON l.k = r.k AND r.id - l.v IN (2995, 3000) WHERE l.k = 1 OR l.k IS NULL OR l.v % 500 = 7",
        Plan::FlowTrackedSfr,
    ),
    (
        "SELECT count(*), sum(l.v) FROM sl l WHERE EXISTS (SELECT 1 FROM sr r WHERE r.k = l.k AND l.v % 7 = r.x)",
        Plan::FlowTrackedSfr,
    ),
    (
        "SELECT count(*), sum(l.v), count(l.k) FROM sl l WHERE NOT EXISTS (SELECT 1 FROM sr r WHERE r.k = l.k AND r.id - l.v IN (2995, 3000))",
        Plan::FlowTrackedSfr,
    ),
    (
        "SELECT count(*), sum(l.v) FROM sl l WHERE l.v % 3 = 0 OR EXISTS (SELECT 1 FROM sr r WHERE r.k = l.k AND r.id - l.v IN (2995, 3000))",
        Plan::FlowTrackedSfr,
    ),
    // A LIMIT pushed into a build-preserving join keeps it plain (a worker that stops
    // early could not report its matches); a LIMIT above a filter lets workers stop
    // reading a Flow-Join early, and the others must still finish.
    (
        "SELECT count(*) FROM (SELECT d.k, f.id FROM dim d LEFT JOIN fact f ON d.k = f.k LIMIT 1000) t",
        Plan::Plain,
    ),
    (
        "SELECT count(*) FROM (SELECT d.k, f.id FROM dim d LEFT JOIN fact f ON d.k = f.k WHERE f.x > 2 OR f.x IS NULL LIMIT 1000) t",
        Plan::FlowTracked,
    ),
    // Grouped by the join key: the aggregation relies on the join's hash partitioning,
    // so the planner must keep the plain partitioned join (still correct).
    (
        "SELECT f.k, count(*), count(d.k) FROM dim d RIGHT JOIN fact f ON d.k = f.k GROUP BY f.k ORDER BY count(*) DESC, f.k LIMIT 20",
        Plan::Plain,
    ),
];

async fn check(workers: usize) {
    check_with(workers, false).await
}

/// Every query on `workers` workers, with the global heavy-hitter list or (`fetch`)
/// fetch on demand, where keys heavy on both sides are broadcast instead of SFR.
async fn check_with(workers: usize, fetch: bool) {
    let (cluster, reference) = start(workers, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    c.sql("SET gyre.skew_build_preserving = all").await.unwrap();
    if fetch {
        c.sql("SET gyre.skew_fetch = on").await.unwrap();
    }
    let mut failures = vec![];
    for &(q, expected) in QUERIES {
        let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
        let flow = plan.contains("FlowJoinExec");
        let tracked = plan.contains("build matches combined across workers");
        let build = plan.contains("skew detection on build and probe hashes");
        let probe_tracked = plan.contains("probe matches combined across workers");
        let sfr = plan.contains("SFR for keys heavy on both sides") || fetch;
        let planned = (!fetch || !flow || plan.contains("fetch on demand"))
            && match expected {
                Plan::Flow => flow,
                Plan::FlowTracked => flow && tracked,
                Plan::FlowBuild => flow && build,
                Plan::FlowBuildProbeTracked => flow && build && probe_tracked && !tracked,
                Plan::FlowBothTracked => flow && build && probe_tracked && tracked && sfr,
                Plan::FlowSfr => flow && build && sfr && !tracked,
                Plan::FlowTrackedSfr => flow && build && sfr && tracked,
                Plan::Plain => !flow,
            };
        let planned = planned && !(fetch && plan.contains("SFR for keys heavy on both sides"));
        if workers > 1 && !planned {
            failures.push(format!("{q}\n  not planned as expected in:\n{plan}"));
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
async fn fetch_on_demand_matches_datafusion_on_three_workers() {
    check_with(3, true).await;
}

/// Fetch on demand: each worker keeps the keys it finds heavy without waiting for
/// anyone, and receives only the build rows of those keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_on_demand_keeps_heavy_keys_where_they_are_found() {
    let (cluster, reference) = start(3, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    c.sql("SET gyre.skew_fetch = on").await.unwrap();
    let q = QUERIES[0].0;
    let analyzed = analyze(c, q).await;
    assert!(analyzed.contains("fetch on demand"), "{analyzed}");
    // Keys 7 and 11 are heavy from the start, on every worker.
    assert!(analyzed.contains("7 (~"), "{analyzed}");
    assert!(analyzed.contains("11 (~"), "{analyzed}");
    let heavy = metric(&analyzed, "heavy_hitters");
    assert_eq!(heavy.len(), 3, "{analyzed}");
    assert!(heavy.iter().all(|&h| h >= 2), "{heavy:?}");
    let kept = metric(&analyzed, "probe_rows_kept_local");
    assert!(kept.iter().sum::<u64>() > 100_000, "{kept:?}\n{analyzed}");
    // No router waited for an announcement: their timers never ran (a timer that
    // never ran shows 1ns).
    let waits = first_round_waits(&analyzed);
    assert_eq!(waits.len(), 3, "{analyzed}");
    assert!(
        waits.iter().all(|w| w.ends_with("ns")),
        "{waits:?}\n{analyzed}"
    );
    // Each heavy build row went to each worker that asked for it, and to no other:
    // every row sent arrived once (a broadcast would arrive on all 3 workers).
    let sent: u64 = metric(&analyzed, "build_rows_broadcast").iter().sum();
    let received: u64 = metric(&analyzed, "heavy_build_rows_received").iter().sum();
    assert!(sent > 0 && sent == received, "{analyzed}");
    assert_eq!(differs(c, &reference, q).await, None);
    // A key heavy only late is found in a later round, by whoever sees it.
    let late = "SELECT count(*), count(d.name) FROM dim d RIGHT JOIN fact f ON d.k = f.k";
    let analyzed = analyze(c, late).await;
    assert!(analyzed.contains("40000 (~"), "{analyzed}");
    assert_eq!(differs(c, &reference, late).await, None);
    let err = c.sql("SET gyre.skew_fetch = sometimes").await.unwrap_err();
    assert!(err.to_string().contains("on or off"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_shows_heavy_hitters_and_the_setting_switches_it_off() {
    let (cluster, reference) = start(3, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    let q = QUERIES[0].0;
    let analyzed = analyze(c, q).await;
    assert!(analyzed.contains("FlowJoinExec"), "{analyzed}");
    // Keys 7 and 11 are heavy from the start: found in round 0, named, kept local.
    assert!(analyzed.contains("7 (~"), "{analyzed}");
    assert!(analyzed.contains("11 (~"), "{analyzed}");
    assert!(analyzed.contains("round 0"), "{analyzed}");
    let kept = metric(&analyzed, "probe_rows_kept_local");
    assert_eq!(kept.len(), 3, "{analyzed}");
    // 40% of 600K rows have key 7 or 11: far more than one worker's share stays local.
    assert!(kept.iter().sum::<u64>() > 100_000, "{kept:?}\n{analyzed}");
    assert!(analyzed.contains("build_rows_broadcast="), "{analyzed}");

    // Unique probe keys: nothing is heavy, so no worker holds rows back waiting for the
    // first announcement.
    let uniform =
        "SELECT count(*), sum(d.w) FROM (SELECT id + 1 AS j FROM fact) f JOIN dim d ON f.j = d.k";
    let analyzed = analyze(c, uniform).await;
    assert!(analyzed.contains("FlowJoinExec"), "{analyzed}");
    assert_eq!(metric(&analyzed, "heavy_hitters"), [0, 0, 0], "{analyzed}");
    let waits = first_round_waits(&analyzed);
    assert_eq!(waits.len(), 3, "{analyzed}");
    // A timer that never ran shows 1ns; the wait for an answer takes microseconds at least.
    assert!(
        waits.iter().all(|w| w.ends_with("ns")),
        "{waits:?}\n{analyzed}"
    );
    assert_eq!(differs(c, &reference, uniform).await, None);

    // A key heavy only late is found in a later round.
    let late = "SELECT count(*), count(d.name) FROM dim d RIGHT JOIN fact f ON d.k = f.k";
    let analyzed = analyze(c, late).await;
    assert!(analyzed.contains("40000 (~"), "{analyzed}");
    assert!(!analyzed.contains("40000 (~0 rows, round 0)"), "{analyzed}");

    // Build-preserving joins: semi and anti joins are Flow-Joins by default, outer
    // joins only with `all`, and `off` keeps both plain.
    let semi = "SELECT count(*) FROM dim d WHERE EXISTS (SELECT 1 FROM fact f WHERE f.k = d.k)";
    let left = "SELECT count(*), count(f.id) FROM dim d LEFT JOIN fact f ON d.k = f.k";
    let flow = async |q: &str| {
        let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
        plan.contains("build matches combined across workers")
    };
    assert!(flow(semi).await && !flow(left).await);
    c.sql("SET gyre.skew_build_preserving = off").await.unwrap();
    assert!(!flow(semi).await && !flow(left).await);
    c.sql("SET gyre.skew_build_preserving = all").await.unwrap();
    assert!(flow(semi).await && flow(left).await);
    // The heavy dim rows are matched on every worker, which report those matches to
    // the rows' owners.
    let analyzed = analyze(c, left).await;
    assert!(
        analyzed.contains("build matches combined across workers"),
        "{analyzed}"
    );
    let sent = metric(&analyzed, "build_matches_sent");
    let received = metric(&analyzed, "build_matches_received");
    assert!(sent.iter().sum::<u64>() > 0, "{analyzed}");
    assert_eq!(
        sent.iter().sum::<u64>(),
        received.iter().sum::<u64>(),
        "{analyzed}"
    );

    // Skew on the build side: key 5 is in 30% of `many`'s rows. Those build rows stay
    // where they are (all but the few routed before round 0's answer), and the probe
    // rows of key 5 (and of the other build-heavy keys) go to every worker.
    let build = "SELECT count(*), sum(m.v), sum(f.x) FROM fact f JOIN many m ON f.k = m.k";
    let analyzed = analyze(c, build).await;
    assert!(
        analyzed.contains("skew detection on build and probe hashes"),
        "{analyzed}"
    );
    assert!(analyzed.contains("build_heavy_hitters="), "{analyzed}");
    assert!(analyzed.contains("[5 (~"), "{analyzed}");
    let kept = metric(&analyzed, "build_rows_kept_local");
    assert_eq!(kept.len(), 3, "{analyzed}");
    assert!(kept.iter().sum::<u64>() > 3_000, "{kept:?}\n{analyzed}");
    assert!(
        metric(&analyzed, "probe_rows_broadcast")
            .iter()
            .sum::<u64>()
            > 0,
        "{analyzed}"
    );
    assert_eq!(differs(c, &reference, build).await, None);
    // A right join: the probe rows of build-heavy keys are broadcast (keys heavy on both
    // sides too, without SFR), and the workers that matched them report to their
    // origins, which emit the unmatched ones.
    c.sql("SET gyre.skew_sfr = off").await.unwrap();
    let right = "SELECT count(*), count(m.k), sum(f.x) FROM many m RIGHT JOIN fact f ON m.k = f.k";
    let analyzed = analyze(c, right).await;
    assert!(
        analyzed.contains("probe matches combined across workers"),
        "{analyzed}"
    );
    let sent: u64 = metric(&analyzed, "probe_matches_sent").iter().sum();
    let received: u64 = metric(&analyzed, "probe_matches_received").iter().sum();
    // Equal, up to the display's rounding to three digits ("4.43 K").
    assert!(sent > 1000 && sent.abs_diff(received) < 40, "{analyzed}");
    assert_eq!(differs(c, &reference, right).await, None);
    c.sql("SET gyre.skew_sfr = on").await.unwrap();
    c.sql("SET gyre.skew_build_side = off").await.unwrap();
    let plan = text(c.sql_one(&format!("EXPLAIN {build}")).await.unwrap());
    assert!(plan.contains("skew detection on probe hashes"), "{plan}");
    assert_eq!(differs(c, &reference, build).await, None);
    c.sql("SET gyre.skew_build_side = on").await.unwrap();

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
        ("SET gyre.skew_build_preserving = sometimes", "sometimes"),
        ("SET gyre.skew_first = 1.5", "first"),
        ("SET gyre.skew_build_side = sometimes", "sometimes"),
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

/// Keys heavy on both sides: on 4 workers key 1 (600 rows in each table) gets the 2 x 2
/// grid, each worker's build rows of it go to the 2 workers of its column and its probe
/// rows to the 2 of its row, in probe-preserving, build-preserving and full joins;
/// `gyre.skew_sfr = off` broadcasts the probe rows instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sfr_joins_keys_heavy_on_both_sides_on_a_grid() {
    let (cluster, reference) = start(4, SETUP).await;
    let c = &cluster.coordinator;
    c.sql("SET gyre.join_strategy = 'shuffle'").await.unwrap();
    let q = "SELECT count(*), count(l.v), sum(r.x) FROM sl l RIGHT JOIN sr r ON l.k = r.k";
    let analyzed = analyze(c, q).await;
    assert!(
        analyzed.contains("SFR for keys heavy on both sides"),
        "{analyzed}"
    );
    assert!(analyzed.contains("1 2x2"), "{analyzed}");
    // The 601 build and 602 probe rows of key 1 are each sent to 2 workers. The NULL
    // keys' grid depends on their estimates (24 build and 53 probe rows, estimated
    // from a window), so their build rows go to 1, 2 or 4 workers and their probe
    // rows to 4, 2 or 1. Up to the display's rounding to three digits ("1.20 K").
    let build: u64 = metric(&analyzed, "sfr_build_rows_sent").iter().sum();
    let probe: u64 = metric(&analyzed, "sfr_probe_rows_sent").iter().sum();
    let within = |v: u64, lo: u64, hi: u64| lo - 10 <= v && v <= hi + 10;
    assert!(
        within(build, 1202 + 24, 1202 + 4 * 24),
        "{build}\n{analyzed}"
    );
    assert!(
        within(probe, 1204 + 53, 1204 + 4 * 53),
        "{probe}\n{analyzed}"
    );
    assert_eq!(differs(c, &reference, q).await, None);
    // Build-preserving and full joins: the same grid, and a build row of key 1 is
    // matched on the 2 workers of its column (and on its own, with probe rows broadcast
    // before key 1 was heavy on the probe side too), which report to its owner.
    c.sql("SET gyre.skew_build_preserving = all").await.unwrap();
    let left = "SELECT count(*), count(r.x), sum(l.v) FROM sl l LEFT JOIN sr r ON l.k = r.k AND l.v % 7 < r.x - 3";
    let anti = "SELECT count(*), sum(l.v) FROM sl l WHERE NOT EXISTS (SELECT 1 FROM sr r WHERE r.k = l.k AND r.id - l.v IN (2995, 3000))";
    let full = "SELECT count(*), count(l.v), count(r.x) FROM sl l FULL JOIN sr r ON l.k = r.k AND l.v % 7 < r.x - 3";
    for bp in [left, anti, full] {
        let analyzed = analyze(c, bp).await;
        assert!(
            analyzed.contains("SFR for keys heavy on both sides")
                && analyzed.contains("build matches combined across workers")
                && analyzed.contains("1 2x2"),
            "{analyzed}"
        );
        let build: u64 = metric(&analyzed, "sfr_build_rows_sent").iter().sum();
        assert!(
            within(build, 1202 + 24, 1202 + 4 * 24),
            "{build}\n{analyzed}"
        );
        let sent: u64 = metric(&analyzed, "build_matches_sent").iter().sum();
        let received: u64 = metric(&analyzed, "build_matches_received").iter().sum();
        assert!(sent > 0 && sent.abs_diff(received) < 10, "{analyzed}");
        if bp == full {
            // And the probe rows of key 1, on the 2 workers of their row.
            let sent: u64 = metric(&analyzed, "probe_matches_sent").iter().sum();
            assert!(sent > 0, "{analyzed}");
        }
        assert_eq!(differs(c, &reference, bp).await, None);
    }
    c.sql("SET gyre.skew_sfr = off").await.unwrap();
    let plan = text(c.sql_one(&format!("EXPLAIN {q}")).await.unwrap());
    assert!(!plan.contains("SFR"), "{plan}");
    assert_eq!(differs(c, &reference, q).await, None);
    for bp in [left, anti, full] {
        assert_eq!(differs(c, &reference, bp).await, None);
    }
    let err = c.sql("SET gyre.skew_sfr = sometimes").await.unwrap_err();
    assert!(err.to_string().contains("sometimes"), "{err}");
}

/// The `EXPLAIN ANALYZE` text of `q`.
async fn analyze(c: &Arc<Coordinator>, q: &str) -> String {
    text(c.sql_one(&format!("EXPLAIN ANALYZE {q}")).await.unwrap())
}

/// The per-worker values of metric `name` in an `EXPLAIN ANALYZE` text (in the
/// `metrics=[..]` lists, as a whole name: `heavy_hitters` is not `build_heavy_hitters`).
/// Each worker's `first_round_wait` timer as `EXPLAIN ANALYZE` shows it.
fn first_round_waits(analyzed: &str) -> Vec<&str> {
    analyzed
        .match_indices("first_round_wait=")
        .map(|(at, m)| {
            let v = &analyzed[at + m.len()..];
            &v[..v.find([',', ']']).unwrap()]
        })
        .collect()
}

fn metric(analyzed: &str, name: &str) -> Vec<u64> {
    let pattern = format!("{name}=");
    analyzed
        .lines()
        .filter_map(|l| l.split_once("metrics=[").map(|(_, m)| m))
        .flat_map(|m| {
            m.match_indices(pattern.as_str())
                .filter(move |(at, _)| *at == 0 || m[..*at].ends_with(' '))
                .map(move |(at, _)| &m[at..])
        })
        .map(|v| {
            let v = &v[name.len() + 1..];
            let v = &v[..v.find([',', ']']).unwrap()];
            let (num, scale) = match v.strip_suffix(" K") {
                Some(n) => (n, 1000.0),
                None => (v, 1.0),
            };
            (num.trim().parse::<f64>().unwrap() * scale) as u64
        })
        .collect()
}
