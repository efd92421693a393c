//! A real multi-process cluster: killing a worker mid-query (a plain join, or a
//! Flow-Join with skew detection on both inputs and SFR) fails that query
//! quickly with an error naming the worker; later queries that need the dead
//! worker's partitions fail naming them; the cluster stays usable. A coordinator too
//! busy to hear heartbeats does not take its workers for dead.

use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use gyre_cluster::LocalCluster;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gyre(args: &[&str]) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_gyre"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start gyre"),
    )
}

/// The query's result as text (for plans).
async fn text(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> String {
    let info = client.execute(sql.to_string(), None).await.unwrap();
    let mut batches = vec![];
    for ep in info.endpoint {
        let stream = client.do_get(ep.ticket.unwrap()).await.unwrap();
        batches.extend(stream.try_collect::<Vec<_>>().await.unwrap());
    }
    arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string()
}

async fn run(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<usize, String> {
    let info = client
        .execute(sql.to_string(), None)
        .await
        .map_err(|e| e.to_string())?;
    let mut rows = 0;
    for ep in info.endpoint {
        let stream = client
            .do_get(ep.ticket.unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let batches: Vec<_> = stream.try_collect().await.map_err(|e| e.to_string())?;
        rows += batches.iter().map(|b| b.num_rows()).sum::<usize>();
    }
    Ok(rows)
}

/// Starts a coordinator and two worker processes (ids 1 and 2), runs `setup`, starts
/// `query`, kills worker 2 while it runs, and checks that the query fails (or finished)
/// within seconds naming the worker, that a later query needing the lost partition
/// names it, and that the cluster stays usable. `port_offset` keeps tests apart; the
/// query's plan must contain every one of `planned`. Returns the query's result.
async fn kill_worker_during(
    port_offset: u16,
    setup: &[&str],
    query: &'static str,
    planned: &[&str],
    lost: &str,
) -> Result<usize, String> {
    let port = 50000 + ((std::process::id() % 5000) as u16) * 2 + port_offset;
    let addr = format!("127.0.0.1:{port}");
    let _coordinator = gyre(&["coordinator", "--listen", &addr]);
    let mut client = None;
    for _ in 0..100 {
        if let Ok(ch) = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            client = Some(FlightSqlServiceClient::new(ch));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = client.expect("coordinator up");
    // Start the workers one after the other so they get ids 1 and 2.
    let _w1 = gyre(&["worker", "--coordinator", &addr, "--threads", "1"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut w2 = gyre(&["worker", "--coordinator", &addr, "--threads", "1"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for sql in setup {
        run(&mut client, sql).await.unwrap();
    }
    let plan = text(&mut client, &format!("EXPLAIN {query}")).await;
    for p in planned {
        assert!(plan.contains(p), "{p} not in\n{plan}");
    }
    let mut slow = client.clone();
    let query = tokio::spawn(async move { run(&mut slow, query).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    let _ = w2.0.kill();
    let _ = w2.0.wait();
    let result = tokio::time::timeout(Duration::from_secs(15), query)
        .await
        .expect("the query must not hang")
        .unwrap();
    if let Err(e) = &result {
        assert!(e.contains("worker 2"), "error should name the worker: {e}");
        assert!(killed_at.elapsed() < Duration::from_secs(10));
    }
    // Later: the table lost a partition, and the error says which.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let err = run(&mut client, lost).await.unwrap_err();
    assert!(
        err.contains("partition 1") && err.contains("worker 2"),
        "{err}"
    );
    // The cluster stays usable.
    assert_eq!(run(&mut client, "SELECT 1").await.unwrap(), 1);
    drop(w2);
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_fails_the_query_and_names_itself() {
    kill_worker_during(
        0,
        &["CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 3000000) AS s(value)"],
        "SELECT a.k % 1000, count(*) FROM t a JOIN t b ON a.k = b.k GROUP BY 1 ORDER BY 1",
        &[],
        "SELECT count(*) FROM t",
    )
    .await
    .ok();
}

/// The same during a Flow-Join that routes both inputs, with a key heavy on the probe
/// side (7) and one on both sides (3: 10K x 30K rows, joined by SFR for seconds): its
/// detection rounds, broadcasts, held rows and SFR must not wait for the dead worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_fails_a_flow_join_too() {
    let result = kill_worker_during(
        1,
        &[
            "CREATE TABLE d (k BIGINT, w BIGINT) PARTITION BY w",
            "INSERT INTO d SELECT CASE WHEN value % 100 = 0 THEN 3 ELSE value END, value % 1000 \
             FROM generate_series(1, 1000000) AS s(value)",
            "CREATE TABLE s (id BIGINT, k BIGINT) PARTITION BY id",
            "INSERT INTO s SELECT value, CASE WHEN value % 3 = 0 THEN 7 \
             WHEN value % 100 = 1 THEN 3 ELSE value % 1000000 END \
             FROM generate_series(1, 3000000) AS s(value)",
            "SET gyre.join_strategy = 'shuffle'",
        ],
        "SELECT d.w % 10, count(*) FROM s JOIN d ON s.k = d.k GROUP BY 1 ORDER BY 1",
        &[
            "FlowJoinExec",
            "skew detection on build and probe hashes",
            "SFR",
        ],
        "SELECT count(*) FROM s",
    )
    .await;
    // Key 3's 300M output rows take seconds: the kill came in the middle.
    assert!(result.is_err(), "{result:?}");
}

/// A final stage that keeps every coordinator thread busy for longer than the heartbeat
/// timeout (a nested-loop join on the coordinator did) used to get every worker
/// declared dead and every table lost: the silence was the coordinator's, not theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_too_busy_to_hear_heartbeats_keeps_its_workers() {
    let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.sql("CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 1000)")
        .await
        .unwrap();
    // Both runtime threads (heartbeat handlers and the monitor run there) block for
    // longer than the 3 s heartbeat timeout; the barrier makes sure both are taken.
    let started = Arc::new(Barrier::new(3));
    let blockers: Vec<_> = (0..2)
        .map(|_| {
            let started = Arc::clone(&started);
            tokio::spawn(async move {
                started.wait();
                std::thread::sleep(Duration::from_millis(4500));
            })
        })
        .collect();
    started.wait();
    for b in blockers {
        b.await.unwrap();
    }
    // Give the monitor a few checks, then the workers must still be members.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(c.live_workers().len(), 2);
    let r = c.sql_one("SELECT count(*) FROM t").await.unwrap();
    let n = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(
        r.batches[0].column(0).as_ref(),
    )
    .value(0);
    assert_eq!(n, 1000);
}
