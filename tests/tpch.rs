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
