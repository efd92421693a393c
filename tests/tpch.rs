//! All 22 TPC-H queries at SF 0.1 on embedded clusters of 1 to 4 workers
//! return exactly what single-node DataFusion returns on the same data, with
//! their exchanges over TCP and over each primitive of the RDMA-aware shuffle
//! paper's designs on the shared-memory carrier (`gyre.shuffle_design`).

mod common;

const SF: f64 = 0.1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_one_worker() {
    common::check_cluster(1, SF, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_two_workers() {
    common::check_cluster(2, SF, false).await;
}

/// With Flow-Joins allowed around build-preserving joins too (outer, semi and anti
/// joins the planner can wrap; most TPC-H joins feed operators that need their hash
/// partitioning and stay plain). Exchanges go as 4 KiB datagrams (mesq-sr): every
/// message is cut into several and joined again, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_three_workers_over_datagrams() {
    let settings = [
        "SET gyre.skew_build_preserving = all",
        "SET gyre.shuffle_design = 'mesq-sr'",
    ];
    common::check_cluster_with(3, SF, false, &settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers() {
    common::check_cluster(4, SF, false).await;
}

/// Exchanges by two-sided send/receive on a connection per stream (memq-sr).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers_over_shared_memory() {
    common::check_cluster_with(4, SF, false, &["SET gyre.shuffle_design = 'memq-sr'"]).await;
}

/// Neo-Joins chosen at run time (`auto`, the default, on hash-placed tables) decide
/// on samples of 512 rows of each input: where an input waits for a run-time filter
/// from the one before it (Q7), that one is read whole first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers_neo_decisions_on_samples() {
    common::check_cluster_with(4, SF, false, &["SET gyre.neo_sample_rows = 512"]).await;
}

/// Exchanges by one-sided reads (memq-rd): each receiver reads the sender's
/// registered buffers, which outlive the sending operator until read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers_over_one_sided_reads() {
    common::check_cluster_with(4, SF, false, &["SET gyre.shuffle_design = 'memq-rd'"]).await;
}

/// Every partitioned join on one integer key run by the radix join kernel;
/// exchanges by one-sided writes (semq-wr).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers_radix_join_kernel() {
    let settings = [
        "SET gyre.join_kernel = radix",
        "SET gyre.shuffle_design = 'semq-wr'",
    ];
    common::check_cluster_with(4, SF, false, &settings).await;
}

/// Every eligible partitioned join run as a Neo-Join (`gyre.join_strategy = neo`),
/// each side shuffled in the rounds of its open-shop schedule, over two-sided
/// send/receive on one shared connection per node (semq-sr).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers_neo_join() {
    let settings = [
        "SET gyre.join_strategy = neo",
        "SET gyre.neo_schedule = 'open-shop'",
        "SET gyre.shuffle_design = 'semq-sr'",
    ];
    common::check_cluster_with(4, SF, false, &settings).await;
}

/// Generated TPC-H tables keep their generation order on each worker (chunked
/// placement): orders and lineitem of one order key range are on one worker, and
/// Neo-Join's assignment keeps them there, moving a fraction of what hash placement
/// moves (the thesis' time-of-creation clustering, Q12's join); so does a Neo
/// aggregation with the groups of Q18's GROUP BY l_orderkey.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neo_join_keeps_clustered_tpch_rows_in_place() {
    use gyre_cluster::LocalCluster;
    let cluster = LocalCluster::start(4, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.load_tpch_placed(0.05, true).await.unwrap();
    c.sql("SET gyre.join_strategy = neo").await.unwrap();
    let join = "SELECT l_shipmode, count(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey \
                WHERE l_shipmode IN ('MAIL', 'SHIP') GROUP BY l_shipmode ORDER BY l_shipmode";
    let aggregate = "SELECT l_orderkey, sum(l_quantity) FROM lineitem GROUP BY l_orderkey \
                     HAVING sum(l_quantity) > 250";
    let reference = gyre_cluster::reference::reference_context(c, 2)
        .await
        .unwrap();
    for (q, operator) in [(join, "NeoJoinExec"), (aggregate, "NeoAggregateExec")] {
        keeps_in_place(c, &reference, q, operator).await;
    }
    // Chosen at run time on each input's first rows: each worker's first rows are of
    // its own key range, so the sample does not settle for hash placement, and the
    // decision on every row keeps the rows in place.
    c.sql("SET gyre.join_strategy = auto").await.unwrap();
    c.sql("SET gyre.neo_sample_rows = 4096").await.unwrap();
    keeps_in_place(c, &reference, join, "NeoJoinExec").await;
}

/// `q` answers as DataFusion does and its `operator` moves under a quarter of the
/// bytes hash placement would, on the busiest link too.
async fn keeps_in_place(
    c: &std::sync::Arc<gyre_cluster::Coordinator>,
    reference: &datafusion::prelude::SessionContext,
    q: &str,
    operator: &str,
) {
    let got = c.sql_one(q).await.unwrap();
    let want = reference.sql(q).await.unwrap().collect().await.unwrap();
    assert_eq!(
        gyre_cluster::reference::canonical_rows(&got.batches).unwrap(),
        gyre_cluster::reference::canonical_rows(&want).unwrap()
    );
    let plan = c.sql_one(&format!("EXPLAIN ANALYZE {q}")).await.unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&plan.batches)
        .unwrap()
        .to_string();
    let line = text
        .lines()
        .find(|l| l.contains(operator) && l.contains("assignment="))
        .unwrap_or_else(|| panic!("no {operator} plan in:\n{text}"));
    let bytes = |key: &str| -> (u64, u64) {
        let rest = line.split(key).nth(1).unwrap();
        let moved: u64 = rest.split('B').next().unwrap().parse().unwrap();
        let hash: u64 = rest
            .split("(hash ")
            .nth(1)
            .unwrap()
            .split('B')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        (moved, hash)
    };
    let (moved, hash) = bytes("moved=");
    assert!(moved * 4 < hash, "moved {moved} of hash's {hash}:\n{line}");
    let (busiest, hash_busiest) = bytes("busiest_link=");
    assert!(busiest * 4 < hash_busiest, "{line}");
}

/// Neo-Join on 1 to 3 workers (4: above) over TPC-H in generation order: joins on the
/// order key find orders and lineitem clustered on the same worker (locality near
/// 100%), the join on the customer key finds none. Every join type answers as
/// DataFusion does, and on 2 or more workers the joins are Neo-Joins and the GROUP BY
/// on the order key a Neo aggregation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neo_join_answers_like_datafusion_on_one_to_three_workers() {
    use gyre_cluster::LocalCluster;
    use gyre_cluster::reference::{canonical_rows, reference_context};
    let queries = [
        "SELECT count(*), sum(l_quantity) FROM orders JOIN lineitem ON o_orderkey = l_orderkey \
         WHERE o_orderstatus = 'F'",
        "SELECT count(*), count(l_orderkey) FROM orders LEFT JOIN lineitem \
         ON o_orderkey = l_orderkey AND l_quantity > 45",
        "SELECT count(*), count(o_orderkey) FROM (SELECT * FROM orders WHERE o_totalprice > 200000) o \
         RIGHT JOIN lineitem ON o_orderkey = l_orderkey",
        "SELECT count(*), count(o_orderkey), count(l_orderkey) \
         FROM (SELECT * FROM orders WHERE o_orderdate < DATE '1993-01-01') o \
         FULL JOIN (SELECT * FROM lineitem WHERE l_quantity < 5) l ON o_orderkey = l_orderkey",
        "SELECT count(*) FROM orders WHERE EXISTS \
         (SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey AND l_discount > 0.09)",
        "SELECT count(*) FROM orders WHERE NOT EXISTS \
         (SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey AND l_discount > 0.09)",
        "SELECT c_mktsegment, count(*) FROM customer JOIN orders ON c_custkey = o_custkey \
         GROUP BY c_mktsegment ORDER BY c_mktsegment",
        "SELECT l_orderkey, sum(l_quantity), count(*) FROM lineitem GROUP BY l_orderkey \
         HAVING sum(l_quantity) > 250",
    ];
    for workers in 1..=3 {
        let cluster = LocalCluster::start(workers, 1, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let c = &cluster.coordinator;
        c.load_tpch_placed(0.01, true).await.unwrap();
        c.sql("SET gyre.join_strategy = neo").await.unwrap();
        c.sql("SET gyre.neo_schedule = 'open-shop'").await.unwrap();
        let reference = reference_context(c, 2).await.unwrap();
        for q in queries {
            let got = c.sql_one(q).await.unwrap();
            let want = reference.sql(q).await.unwrap().collect().await.unwrap();
            assert_eq!(
                canonical_rows(&got.batches).unwrap(),
                canonical_rows(&want).unwrap(),
                "{workers} workers: {q}"
            );
        }
        let plan = c.sql_one(&format!("EXPLAIN {}", queries[0])).await.unwrap();
        let plan = arrow::util::pretty::pretty_format_batches(&plan.batches)
            .unwrap()
            .to_string();
        assert_eq!(plan.contains("NeoJoinExec"), workers > 1, "{plan}");
        let plan = c.sql_one(&format!("EXPLAIN {}", queries[7])).await.unwrap();
        let plan = arrow::util::pretty::pretty_format_batches(&plan.batches)
            .unwrap()
            .to_string();
        assert_eq!(plan.contains("NeoAggregateExec"), workers > 1, "{plan}");
    }
}

/// A cluster whose nodes exchange over TCP only refuses a shared-memory design,
/// naming why, and keeps answering over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_design_needs_the_nodes_on_one_host() {
    use gyre_cluster::{Limits, LocalCluster};
    let limits = Limits {
        tcp_exchanges: true,
        ..Default::default()
    };
    let cluster = LocalCluster::start_limited(
        2,
        1,
        "127.0.0.1:0".parse().unwrap(),
        &Default::default(),
        &limits,
    )
    .await
    .unwrap();
    let c = &cluster.coordinator;
    c.sql("CREATE TABLE t AS SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) v(k, s)")
        .await
        .unwrap();
    let q = "SELECT s, count(*) FROM t GROUP BY s ORDER BY s";
    c.sql("SET gyre.shuffle_design = 'memq-sr'").await.unwrap();
    let err = c.sql_one(q).await.unwrap_err().to_string();
    assert!(
        err.contains("memq-sr") && err.contains("one host") && err.contains("--host-shuffle"),
        "{err}"
    );
    for design in ["tcp", "auto"] {
        c.sql(&format!("SET gyre.shuffle_design = {design}"))
            .await
            .unwrap();
        let got = c.sql_one(q).await.unwrap();
        assert_eq!(got.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    }
    let err = c
        .sql("SET gyre.shuffle_design = 'rdma'")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("memq-sr"), "{err}");
}
