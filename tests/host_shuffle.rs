//! Nodes in processes of their own on one host exchange over shared memory: a
//! coordinator and three workers started with `--host-shuffle DIR` run a
//! shuffled join and an aggregation in every design, with the same answers as
//! over TCP and as computed here. A worker started without the flag cannot
//! take part in such a query: the design is refused, naming it, and TCP
//! still serves the query.

mod procs;

use arrow_flight::sql::client::FlightSqlServiceClient;
use procs::{Proc, batches, free_port};
use std::time::Duration;
use tonic::transport::Channel;

fn gyre(args: &[&str]) -> Proc {
    procs::gyre("host shuffle tests' cluster secret", args)
}

/// The statements' last result, one line per row, or the error.
async fn rows(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
) -> Result<Vec<String>, String> {
    let batches = batches(client, sql).await?;
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .map_err(|e| e.to_string())?
        .to_string();
    Ok(text
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(str::to_string)
        .collect())
}

async fn client_of(addr: &str) -> FlightSqlServiceClient<Channel> {
    for _ in 0..100 {
        if let Ok(ch) = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            return FlightSqlServiceClient::new(ch);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the coordinator at {addr} did not come up in 10 s");
}

async fn registered(client: &mut FlightSqlServiceClient<Channel>, n: usize) {
    let mut last = Ok(vec![]);
    for _ in 0..600 {
        last = rows(client, "SELECT worker FROM gyre_workers()").await;
        if last.as_ref().is_ok_and(|r| r.len() == n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{n} workers did not register within 60 s: {last:?}");
}

const JOIN: &str = "SELECT count(*) AS n, sum(a.v) AS s FROM a JOIN b ON a.k = b.k";
const GROUPS: &str =
    "SELECT k % 7 AS g, count(*) AS n, sum(v) AS s FROM a GROUP BY k % 7 ORDER BY g";
const DESIGNS: [&str; 8] = [
    "memq-sr", "semq-sr", "mesq-sr", "sesq-sr", "memq-rd", "semq-rd", "memq-wr", "semq-wr",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_of_one_host_exchange_over_shared_memory_in_every_design() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().to_str().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _coordinator = gyre(&["coordinator", "--listen", &addr, "--host-shuffle", shared]);
    let mut client = client_of(&addr).await;
    let mut workers = vec![];
    for n in 1..=3 {
        workers.push(gyre(&[
            "worker",
            "--coordinator",
            &addr,
            "--threads",
            "1",
            "--host-shuffle",
            shared,
        ]));
        registered(&mut client, n).await;
    }
    // a: v in 1..=60000, k = v % 1000; b: k in 0..1000, twice each.
    rows(
        &mut client,
        "CREATE TABLE a AS SELECT value AS v, value % 1000 AS k FROM generate_series(1, 60000); \
         CREATE TABLE b AS SELECT value % 1000 AS k FROM generate_series(1, 2000); SELECT 1",
    )
    .await
    .unwrap();
    let n = 60_000u64 * 2;
    let s = 2 * (60_000u64 * 60_001 / 2);
    let tcp_join = rows(&mut client, JOIN).await.unwrap();
    assert_eq!(tcp_join.len(), 1);
    assert!(
        tcp_join[0].replace(' ', "") == format!("|{n}|{s}|"),
        "over TCP: {tcp_join:?}, expected count {n} and sum {s}"
    );
    let tcp_groups = rows(&mut client, GROUPS).await.unwrap();
    assert_eq!(tcp_groups.len(), 7, "{tcp_groups:?}");
    for design in DESIGNS {
        let set = format!("SET gyre.shuffle_design = '{design}'; ");
        let got = rows(&mut client, &format!("{set}{JOIN}")).await;
        assert_eq!(got.as_ref(), Ok(&tcp_join), "{design}: the join");
        let got = rows(&mut client, &format!("{set}{GROUPS}")).await;
        assert_eq!(got.as_ref(), Ok(&tcp_groups), "{design}: the aggregation");
    }
    // Every node opened its segment in the shared directory.
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_file()))
        .count();
    assert!(segments >= 4, "{segments} segments in {shared}");

    // A worker of another host (no flag) joins: designs are refused, naming it.
    rows(&mut client, "SET gyre.shuffle_design = 'tcp'; SELECT 1")
        .await
        .unwrap();
    workers.push(gyre(&["worker", "--coordinator", &addr, "--threads", "1"]));
    registered(&mut client, 4).await;
    let err = rows(
        &mut client,
        &format!("SET gyre.shuffle_design = 'memq-sr'; {JOIN}"),
    )
    .await
    .unwrap_err();
    assert!(err.contains("worker 4"), "{err}");
    assert!(err.contains("--host-shuffle"), "{err}");
    let tcp = format!("SET gyre.shuffle_design = 'tcp'; {JOIN}");
    assert!(
        rows(&mut client, &tcp).await.is_ok(),
        "TCP still serves the query"
    );
}
