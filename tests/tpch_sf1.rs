//! TPC-H at SF 1 on 1 to 4 workers: every query matches single-node DataFusion
//! and the official answers. Heavy: run by `scripts/test.sh` with `--ignored`.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "SF 1: run with --ignored (CI does)"]
async fn tpch_sf1_one_to_four_workers() {
    for workers in 1..=4 {
        common::check_cluster(workers, 1.0, true).await;
    }
}
