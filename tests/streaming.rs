//! Results stream to the client as it reads them: a client that stops reading
//! stops the workers (memory stays bounded by the transport's credits), and a
//! client that goes away ends the query on every worker.

use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::StreamExt;
use gyre_cluster::LocalCluster;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const ROWS: usize = 2_000_000;

async fn cluster_with_big_table() -> (LocalCluster, FlightSqlServiceClient<Channel>) {
    let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    cluster
        .coordinator
        .sql(&format!(
            "CREATE TABLE big AS SELECT value AS k, value * 7 AS v, \
             concat('some padding text for row ', value) AS s FROM generate_series(1, {ROWS})"
        ))
        .await
        .unwrap();
    let channel = Channel::from_shared(format!("http://{}", cluster.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (cluster, FlightSqlServiceClient::new(channel))
}

/// Bytes the workers have sent to other nodes so far.
fn worker_bytes_sent(cluster: &LocalCluster) -> u64 {
    cluster.workers().map(|w| w.traffic().bytes_sent).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_stops_the_workers() {
    let (cluster, mut client) = cluster_with_big_table().await;
    let base = worker_bytes_sent(&cluster);
    let info = client
        .execute("SELECT k, v, s FROM big".to_string(), None)
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut stream = client.do_get(ticket).await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    let mut rows = first.num_rows();

    // The client pauses. The workers must come to a stop well before they have sent
    // everything: wait until their byte count stops moving.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = worker_bytes_sent(&cluster);
    let paused_at = loop {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let now = worker_bytes_sent(&cluster);
        if now == last {
            break now - base;
        }
        assert!(Instant::now() < deadline, "workers never stopped sending");
        last = now;
    };

    while let Some(batch) = stream.next().await {
        rows += batch.unwrap().num_rows();
    }
    assert_eq!(rows, ROWS);
    let total = worker_bytes_sent(&cluster) - base;
    eprintln!("workers sent {paused_at} bytes while the client paused, {total} in all");
    assert!(
        paused_at * 3 < total,
        "while the client paused the workers sent {paused_at} of {total} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_ends_the_query_everywhere() {
    let (cluster, mut client) = cluster_with_big_table().await;
    let info = client
        .execute("SELECT k, v, s FROM big ORDER BY v DESC".to_string(), None)
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut stream = client.do_get(ticket).await.unwrap();
    stream.next().await.unwrap().unwrap();
    assert!(cluster.workers().any(|w| w.running_queries() > 0));
    drop(stream);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.workers().any(|w| w.running_queries() > 0) {
        assert!(
            Instant::now() < deadline,
            "the abandoned query still runs on the workers"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The cluster stays usable.
    let r = cluster
        .coordinator
        .sql_one("SELECT count(*) FROM big")
        .await
        .unwrap();
    assert_eq!(r.batches[0].num_rows(), 1);
}
