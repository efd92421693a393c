//! All 22 TPC-H queries at SF 0.1 on embedded clusters of 1 to 4 workers
//! return exactly what single-node DataFusion returns on the same data.

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
/// partitioning and stay plain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_three_workers() {
    common::check_cluster_with(3, SF, false, &["SET gyre.skew_build_preserving = all"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers() {
    common::check_cluster(4, SF, false).await;
}

/// Every partitioned join on one integer key run by the radix join kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers_radix_join_kernel() {
    common::check_cluster_with(4, SF, false, &["SET gyre.join_kernel = radix"]).await;
}

/// Every eligible partitioned join run as a Neo-Join (`gyre.join_strategy = neo`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_four_workers_neo_join() {
    common::check_cluster_with(4, SF, false, &["SET gyre.join_strategy = neo"]).await;
}

/// Generated TPC-H tables keep their generation order on each worker (chunked
/// placement): orders and lineitem of one order key range are on one worker, and
/// Neo-Join's assignment keeps them there, moving a fraction of what hash placement
/// moves (the thesis' time-of-creation clustering, Q12's join).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neo_join_keeps_clustered_tpch_rows_in_place() {
    use gyre_cluster::LocalCluster;
    let cluster = LocalCluster::start(4, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.load_tpch_placed(0.05, true).await.unwrap();
    c.sql("SET gyre.join_strategy = neo").await.unwrap();
    let q = "SELECT l_shipmode, count(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey \
             WHERE l_shipmode IN ('MAIL', 'SHIP') GROUP BY l_shipmode ORDER BY l_shipmode";
    let got = c.sql_one(q).await.unwrap();
    let reference = gyre_cluster::reference::reference_context(c, 2)
        .await
        .unwrap();
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
        .find(|l| l.contains("NeoJoinExec") && l.contains("assignment="))
        .unwrap_or_else(|| panic!("no Neo-Join plan in:\n{text}"));
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
