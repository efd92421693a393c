//! A real multi-process cluster: killing a worker mid-query (a plain join, or a
//! Flow-Join with skew detection on both inputs and SFR) fails that query
//! quickly with an error naming the worker; later queries that need the dead
//! worker's partitions fail naming them; the cluster stays usable. Killing a worker
//! while it loads a file fails the load and leaves no table behind. A coordinator too
//! busy to hear heartbeats does not take its workers for dead. A worker that joins
//! after a table was loaded reads none of it, and the table's answers stay right.
//! Workers that outlive their coordinator join it again once it restarts, and a
//! worker declared dead joins again once it runs, each afresh under a new id. A
//! table fragmented with two copies of each block loses nothing to a killed worker:
//! the read running then is retried on the others, and a worker that joins later
//! receives only its rendezvous share.

mod procs;

use arrow_flight::sql::client::FlightSqlServiceClient;
use gyre_cluster::LocalCluster;
use gyre_cluster::flight_sql::{PROGRESS_ACTION, PROGRESS_HEADER};
use gyre_cluster::progress::ProgressReport;
use procs::{Proc, batches, free_port};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

fn gyre(args: &[&str]) -> Proc {
    procs::gyre("failure tests' cluster secret", args)
}

/// The query's result as text (for plans).
async fn text(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> String {
    let batches = batches(client, sql).await.unwrap();
    arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string()
}

async fn run(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<usize, String> {
    Ok(batches(client, sql)
        .await?
        .iter()
        .map(|b| b.num_rows())
        .sum())
}

/// Held by each test for its whole run: seven clusters of three processes at once on a
/// two-core machine starve the processes long enough to turn the timing checks (a
/// stopped worker declared dead within 5 s) into races with the heartbeat timeout.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// `free_port`: another process may take the port before the coordinator binds it;
// `two_worker_cluster` then tries another.

/// A coordinator process and two worker processes (ids 1 and 2), of one thread each,
/// and a Flight SQL client of the coordinator.
async fn two_worker_cluster() -> (Proc, Proc, Proc, FlightSqlServiceClient<Channel>) {
    'attempt: for _ in 0..5 {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut coordinator = gyre(&["coordinator", "--listen", &addr]);
        let mut client = None;
        for _ in 0..100 {
            if coordinator.0.try_wait().unwrap().is_some() {
                // It could not bind the port: someone took it meanwhile.
                continue 'attempt;
            }
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
        let Some(mut client) = client else {
            panic!("the coordinator at {addr} neither came up nor exited in 10 s");
        };
        // Another test's coordinator may hold the port (ours then exits, perhaps after
        // the client connected): each worker must get the id a fresh coordinator
        // gives, and start only once the one before registered.
        let (w1, id1) = worker_of(&addr).await;
        if id1 != Some(1) || coordinator.0.try_wait().unwrap().is_some() {
            continue 'attempt;
        }
        registered(&mut client, 1).await;
        let (w2, id2) = worker_of(&addr).await;
        if id2 != Some(2) {
            continue 'attempt;
        }
        registered(&mut client, 2).await;
        return (coordinator, w1, w2, client);
    }
    panic!("no cluster of a fresh coordinator and two workers in 5 attempts");
}

/// A worker process of the coordinator at `addr`, and the id it was given (from the
/// line it prints once registered; `None` if none came within 30 s).
async fn worker_of(addr: &str) -> (Proc, Option<u32>) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["worker", "--coordinator", addr, "--threads", "1"])
        .env("GYRE_SECRET", "failure tests' cluster secret")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start gyre");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = tokio::sync::oneshot::channel();
    // The first line says the id; the rest is read (and dropped) until the end, so
    // the worker never writes to a closed pipe.
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().and_then(|l| l.ok()).unwrap_or_default());
        for _ in lines {}
    });
    let line = tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .ok()
        .and_then(|l| l.ok())
        .unwrap_or_default();
    let id = line
        .strip_prefix("gyre worker ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|id| id.parse().ok());
    (Proc(child), id)
}

/// Waits (at most 60 s) until the coordinator counts `n` live workers.
async fn registered(client: &mut FlightSqlServiceClient<Channel>, n: usize) {
    for _ in 0..600 {
        // A coordinator without workers may refuse the query: that is "not yet" too.
        if run(client, "SELECT worker FROM gyre_workers()").await == Ok(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{n} workers did not register within 60 s");
}

/// Sends `sig` (`-STOP`, `-CONT`) to the process.
fn signal(p: &Proc, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &p.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig}");
}

/// Starts a self-join of `table` on its column `k` that runs for a while, and lets it
/// get going (300 ms).
async fn start_self_join(
    client: &FlightSqlServiceClient<Channel>,
    table: &str,
) -> tokio::task::JoinHandle<Result<usize, String>> {
    let mut slow = client.clone();
    let sql = format!(
        "SELECT a.k % 1000, count(*) FROM {table} a JOIN {table} b ON a.k = b.k \
         GROUP BY 1 ORDER BY 1"
    );
    let query = tokio::spawn(async move { run(&mut slow, &sql).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    query
}

/// Starts a coordinator and two worker processes (ids 1 and 2), runs `setup`, starts
/// `query`, kills worker 2 while it runs, and checks that the query fails (or finished)
/// within seconds naming the worker, that a later query needing the lost partition
/// names it, and that the cluster stays usable. The query's plan must contain every one
/// of `planned`. Returns the query's result.
async fn kill_worker_during(
    setup: &[&str],
    query: &'static str,
    planned: &[&str],
    lost: &str,
) -> Result<usize, String> {
    let (_coordinator, _w1, mut w2, mut client) = two_worker_cluster().await;
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
    let _serial = ONE_AT_A_TIME.lock().await;
    kill_worker_during(
        &["CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 3000000) AS s(value)"],
        "SELECT a.k % 1000, count(*) FROM t a JOIN t b ON a.k = b.k GROUP BY 1 ORDER BY 1",
        &[],
        "SELECT count(*) FROM t",
    )
    .await
    .ok();
}

/// Key 7 heavy on the probe side, key 3 on both (20K x 30K rows: 600M joined rows, about
/// 1.7 s here; with 300M the joins took 0.7-0.9 s, close to the kill at 0.3 s).
const HEAVY_KEYS: [&str; 4] = [
    "CREATE TABLE d (k BIGINT, w BIGINT) PARTITION BY w",
    "INSERT INTO d SELECT CASE WHEN value % 50 = 0 THEN 3 ELSE value END, value % 1000 \
     FROM generate_series(1, 1000000) AS s(value)",
    "CREATE TABLE s (id BIGINT, k BIGINT) PARTITION BY id",
    "INSERT INTO s SELECT value, CASE WHEN value % 3 = 0 THEN 7 \
     WHEN value % 100 = 1 THEN 3 ELSE value % 1000000 END \
     FROM generate_series(1, 3000000) AS s(value)",
];
const HEAVY_KEYS_JOIN: &str =
    "SELECT d.w % 10, count(*) FROM s JOIN d ON s.k = d.k GROUP BY 1 ORDER BY 1";

/// The same during a Flow-Join that routes both inputs, with a key heavy on the probe
/// side (7) and one on both sides (3: 20K x 30K rows, joined by SFR for seconds): its
/// detection rounds, broadcasts, held rows and SFR must not wait for the dead worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_fails_a_flow_join_too() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let result = kill_worker_during(
        &[&HEAVY_KEYS[..], &["SET gyre.join_strategy = 'shuffle'"]].concat(),
        HEAVY_KEYS_JOIN,
        &[
            "FlowJoinExec",
            "skew detection on build and probe hashes",
            "SFR",
        ],
        "SELECT count(*) FROM s",
    )
    .await;
    // Key 3's 600M output rows take seconds: the kill came in the middle.
    assert!(result.is_err(), "{result:?}");
}

/// The same during a Neo-Join shuffling in open-shop rounds (the keys heavy on both
/// sides joined for seconds): neither its exchanges of key ranges, histograms and
/// assignment nor its round barrier waits for the dead worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_fails_a_neo_join_too() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let neo = [
        "SET gyre.join_strategy = 'neo'",
        "SET gyre.neo_schedule = 'open-shop'",
    ];
    let result = kill_worker_during(
        &[&HEAVY_KEYS[..], &neo].concat(),
        HEAVY_KEYS_JOIN,
        &["NeoJoinExec", "schedule=open-shop"],
        "SELECT count(*) FROM s",
    )
    .await;
    assert!(result.is_err(), "{result:?}");
}

/// A stopped worker (SIGSTOP: its sockets stay open, nothing answers) fails the query
/// it was running and a DDL statement sent to it within 5 s, each naming it, since its
/// heartbeats stop too; the cluster stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_worker_fails_queries_and_ddl_within_seconds() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (_coordinator, _w1, w2, mut client) = two_worker_cluster().await;
    run(
        &mut client,
        "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 3000000) AS s(value)",
    )
    .await
    .unwrap();
    let query = start_self_join(&client, "t").await;
    signal(&w2, "-STOP");
    let stopped_at = Instant::now();
    let mut ddl = client.clone();
    let ddl = tokio::spawn(async move { run(&mut ddl, "CREATE TABLE u (a BIGINT)").await });
    let ddl = tokio::time::timeout(Duration::from_secs(10), ddl)
        .await
        .expect("DDL must not hang on a stopped worker")
        .unwrap();
    let ddl_done = stopped_at.elapsed();
    let query = tokio::time::timeout(Duration::from_secs(10), query)
        .await
        .expect("the query must not hang on a stopped worker")
        .unwrap();
    let query_done = stopped_at.elapsed();
    match ddl {
        Err(e) => {
            assert!(e.contains("worker 2"), "{e}");
            assert!(
                ddl_done < Duration::from_secs(5),
                "DDL failed after {ddl_done:?}"
            );
        }
        // A coordinator slow to reach the DDL (the machine is busy with the join) may
        // first declare worker 2 dead, after the 3 s heartbeat timeout: the DDL then
        // rightly creates the table on worker 1 alone. It must never succeed sooner,
        // on a worker that answers nothing.
        Ok(_) => {
            assert!(
                ddl_done >= Duration::from_secs(3),
                "the DDL succeeded after {ddl_done:?}, before the stopped worker was declared dead"
            );
            let live = run(
                &mut client,
                "SELECT worker FROM gyre_workers() WHERE worker = 2",
            );
            assert_eq!(live.await, Ok(0), "worker 2 is still a member");
        }
    }
    if let Err(e) = &query {
        assert!(e.contains("worker 2"), "{e}");
        assert!(
            query_done < Duration::from_secs(5),
            "query failed after {query_done:?}"
        );
    }
    // The cluster answers without the stopped worker.
    assert_eq!(run(&mut client, "SELECT 1").await.unwrap(), 1);
    run(&mut client, "CREATE TABLE v (a BIGINT)").await.unwrap();
    signal(&w2, "-CONT");
}

/// A final stage that keeps every coordinator thread busy for longer than the heartbeat
/// timeout (a nested-loop join on the coordinator did) used to get every worker
/// declared dead and every table lost: the silence was the coordinator's, not theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_too_busy_to_hear_heartbeats_keeps_its_workers() {
    let _serial = ONE_AT_A_TIME.lock().await;
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

fn int(r: &gyre_cluster::coordinator::StatementResult, row: usize, col: usize) -> i64 {
    let c = r.batches[0].column(col);
    arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(c.as_ref()).value(row)
}

/// A cluster that starts its own workers serves its port before they register
/// (through it): a statement that comes first waits for all of them, so a table it
/// loads spans every worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_wait_for_a_starting_clusters_workers() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = LocalCluster::start(0, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = std::sync::Arc::clone(&cluster.coordinator);
    c.expect_workers(3);
    let load = tokio::spawn({
        let c = std::sync::Arc::clone(&c);
        async move {
            c.sql("CREATE TABLE early AS SELECT value AS k FROM generate_series(1, 100000)")
                .await
        }
    });
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            !load.is_finished(),
            "a statement ran before every worker registered"
        );
        cluster.start_worker(1).await.unwrap();
    }
    load.await.unwrap().unwrap();
    let r = c
        .sql_one("SELECT count(*) FROM gyre_workers() WHERE tables > 0")
        .await
        .unwrap();
    assert_eq!(int(&r, 0, 0), 3, "the table spans every worker");
    let r = c
        .sql_one("SELECT count(*), sum(k) FROM early")
        .await
        .unwrap();
    assert_eq!((int(&r, 0, 0), int(&r, 0, 1)), (100_000, 5_000_050_000));
}

/// A worker can join a running cluster (a standalone coordinator's workers come and
/// go) after a table was loaded on the others: a query then runs on it too, and the
/// newcomer used to fail the scan ("no partition on this worker").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_joins_after_a_load_holds_none_of_the_old_tables() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = std::sync::Arc::clone(&cluster.coordinator);
    c.sql(
        "CREATE TABLE h (k BIGINT, g BIGINT) PARTITION BY k; \
         INSERT INTO h SELECT value, value % 97 FROM generate_series(1, 100000)",
    )
    .await
    .unwrap();
    c.sql("CREATE TABLE r AS SELECT value AS k FROM generate_series(1, 100000, 3)")
        .await
        .unwrap();
    let queries = [
        "SELECT count(*), sum(k) FROM h",
        "SELECT count(*), sum(h.g) FROM h JOIN r ON h.k = r.k",
        "SELECT count(*), sum(n) FROM (SELECT g, count(*) AS n FROM h GROUP BY g)",
    ];
    let mut before = vec![];
    for q in queries {
        let r = c.sql_one(q).await.unwrap();
        before.push((int(&r, 0, 0), int(&r, 0, 1)));
    }
    cluster.start_worker(1).await.unwrap();
    c.wait_for_workers(3, Duration::from_secs(10))
        .await
        .unwrap();
    for (q, want) in queries.iter().zip(&before) {
        let r = c.sql_one(q).await.unwrap();
        assert_eq!((int(&r, 0, 0), int(&r, 0, 1)), *want, "{q}");
    }
    // Writing would spread the table over workers it was not placed on: refused,
    // with the way out named.
    for write in ["INSERT INTO h VALUES (0, 0)", "DELETE FROM h WHERE k = 1"] {
        let e = c.sql(write).await.unwrap_err().to_string();
        assert!(e.contains("reload the table"), "{write}: {e}");
    }
    // Reloaded, the table spans all three workers.
    c.sql("CREATE TABLE h3 (k BIGINT, g BIGINT) PARTITION BY k; INSERT INTO h3 SELECT * FROM h")
        .await
        .unwrap();
    let r = c.sql_one("SELECT count(*), sum(k) FROM h3").await.unwrap();
    assert_eq!((int(&r, 0, 0), int(&r, 0, 1)), before[0]);
    c.sql("INSERT INTO h3 VALUES (0, 0)").await.unwrap();
}

/// A worker killed while the workers read a large CSV file: the load fails within
/// seconds naming the worker, no part of the table remains, and the surviving worker
/// loads the file alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_fails_a_load_and_leaves_no_table() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("big.csv");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&csv).unwrap());
        writeln!(f, "id,k,s").unwrap();
        for i in 0..12_000_000u64 {
            writeln!(f, "{i},{},row-{}", i % 1000, i % 7).unwrap();
        }
    }
    let (_coordinator, _w1, mut w2, mut client) = two_worker_cluster().await;
    let load = format!(
        "CREATE EXTERNAL TABLE big STORED AS CSV LOCATION '{}' \
         OPTIONS ('format.has_header' 'true', 'gyre.partition_by' 'k')",
        csv.display()
    );
    // The load's progress (as `gyre sql` follows it) tells when the workers are reading.
    let mut loader = client.clone();
    loader.set_header(PROGRESS_HEADER, "kill-during-load");
    let sql = load.clone();
    let running = tokio::spawn(async move { run(&mut loader, &sql).await });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let action = arrow_flight::Action {
            r#type: PROGRESS_ACTION.to_string(),
            body: "kill-during-load".as_bytes().to_vec().into(),
        };
        let mut replies = client
            .inner()
            .clone()
            .do_action(action)
            .await
            .unwrap()
            .into_inner();
        let reply = replies.message().await.unwrap().unwrap();
        let report: ProgressReport = serde_json::from_slice(&reply.body).unwrap();
        if report.rows > 0 {
            assert_eq!(report.files_total, 1, "{report:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the load never started reading");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed_at = Instant::now();
    let _ = w2.0.kill();
    let _ = w2.0.wait();
    let result = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the load must not hang")
        .unwrap();
    let e = result.expect_err("the load lost a worker midway");
    assert!(e.contains("worker 2"), "{e}");
    assert!(killed_at.elapsed() < Duration::from_secs(15));
    let e = run(&mut client, "SELECT count(*) FROM big")
        .await
        .unwrap_err();
    assert!(e.contains("big"), "{e}");
    // Once the coordinator has noticed, the survivor loads the whole file alone.
    tokio::time::sleep(Duration::from_secs(4)).await;
    run(&mut client, &load).await.unwrap();
    let counted = text(&mut client, "SELECT count(*), sum(id) FROM big").await;
    assert!(
        counted.contains("12000000") && counted.contains("71999994000000"),
        "{counted}"
    );
    drop(w2);
}

/// A worker process of the coordinator at `addr` whose standard output (a line per
/// start: it joins again under a new id each time the coordinator forgets it) and
/// info log lines are kept.
fn logged_worker(addr: &str) -> (Proc, Arc<parking_lot::Mutex<Vec<String>>>) {
    logged_gyre(
        &["worker", "--coordinator", addr, "--threads", "1"],
        "warn,gyre_cluster::worker=info",
    )
}

/// A gyre process run with `args` whose standard output and log lines (by the
/// `GYRE_LOG` filter `log`) are kept.
fn logged_gyre(args: &[&str], log: &str) -> (Proc, Arc<parking_lot::Mutex<Vec<String>>>) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(args)
        .env("GYRE_SECRET", "failure tests' cluster secret")
        .env("GYRE_LOG", log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gyre");
    let lines = Arc::new(parking_lot::Mutex::new(vec![]));
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    for pipe in [
        Box::new(out) as Box<dyn std::io::Read + Send>,
        Box::new(err) as Box<dyn std::io::Read + Send>,
    ] {
        let lines = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                lines.lock().push(line);
            }
        });
    }
    (Proc(child), lines)
}

/// Waits (at most `within`) until one of `lines` contains `text`.
async fn logged(lines: &parking_lot::Mutex<Vec<String>>, text: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !lines.lock().iter().any(|l| l.contains(text)) {
        assert!(
            Instant::now() < deadline,
            "no line with {text:?} within {within:?}:\n{}",
            lines.lock().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Flight SQL client of the coordinator at `addr`, once it answers (at most 30 s).
async fn client_of(addr: &str) -> FlightSqlServiceClient<Channel> {
    for _ in 0..300 {
        if let Ok(ch) = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            return FlightSqlServiceClient::new(ch);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the coordinator at {addr} did not come up in 30 s");
}

/// kill -9 of a coordinator with `--data-dir` while a query runs, then a restart on
/// the same port: its workers, which outlived it, join it again within 5 s under new
/// ids; its transactional tables are back, read on the workers, and its table on files
/// is loaded again; the plain table (kept
/// only in the workers' memory) is gone from the catalog, and the workers gave up
/// everything the old coordinator had them hold: its table parts, the running query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_gets_its_workers_back() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap().to_string();
    let addr = format!("127.0.0.1:{}", free_port());
    let coordinator = || gyre(&["coordinator", "--listen", &addr, "--data-dir", &data_dir]);
    let mut first = coordinator();
    let mut client = client_of(&addr).await;
    let (_w1, log1) = logged_worker(&addr);
    let (_w2, log2) = logged_worker(&addr);
    registered(&mut client, 2).await;
    let csv = dir.path().join("ext.csv");
    let lines: Vec<String> = (1..=3000).map(|i| format!("{i},name {i}")).collect();
    std::fs::write(&csv, format!("a,b\n{}\n", lines.join("\n"))).unwrap();
    let ext = format!(
        "CREATE EXTERNAL TABLE ext (a BIGINT, b VARCHAR) STORED AS CSV LOCATION '{}' \
         OPTIONS ('format.has_header' 'true')",
        csv.display()
    );
    run(&mut client, &ext).await.unwrap();
    let ext_answer = "SELECT count(*) AS n, sum(a) AS s FROM ext";
    let ext_before = text(&mut client, ext_answer).await;
    assert!(ext_before.contains("| 3000 | 4501500 |"), "{ext_before}");
    // The parts the workers hold of it (a small file may be one split).
    let parts = "SELECT CAST(sum(tables) AS BIGINT) AS t FROM gyre_workers()";
    let ext_parts = text(&mut client, parts).await;
    for sql in [
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL) \
         WITH (replication = 'full')",
        "INSERT INTO accounts SELECT value, 100 FROM generate_series(1, 1000)",
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, account BIGINT NOT NULL) \
         WITH (replication = 'partitioned')",
        "INSERT INTO orders SELECT value, value % 1000 FROM generate_series(1, 5000)",
        "CREATE TABLE scratch AS SELECT value AS k FROM generate_series(1, 2000000) AS s(value)",
    ] {
        run(&mut client, sql).await.unwrap();
    }
    let answer = "SELECT count(*) AS n, sum(balance) AS total, \
                  (SELECT count(*) FROM orders) AS orders FROM accounts";
    let before = text(&mut client, answer).await;
    let query = start_self_join(&client, "scratch").await;
    let _ = first.0.kill();
    let _ = first.0.wait();
    let _ = tokio::time::timeout(Duration::from_secs(10), query).await;
    let _second = coordinator();
    let mut client = client_of(&addr).await;
    let up = Instant::now();
    registered(&mut client, 2).await;
    let back = up.elapsed();
    assert!(
        back < Duration::from_secs(5),
        "the workers came back after {back:?}"
    );
    for log in [&log1, &log2] {
        logged(log, "joining the cluster afresh", Duration::from_secs(1)).await;
        // What the old worker held (its part of `scratch`, the query's state) goes.
        logged(log, "memory is released", Duration::from_secs(10)).await;
    }
    assert_eq!(text(&mut client, answer).await, before);
    assert!(before.contains("| 1000 | 100000 | 5000   |"), "{before}");
    let e = run(&mut client, "SELECT count(*) FROM scratch")
        .await
        .unwrap_err();
    assert!(e.contains("scratch"), "{e}");
    // The table on files is loaded again from the durable catalog.
    let deadline = Instant::now() + Duration::from_secs(20);
    while run(&mut client, ext_answer).await.is_err() {
        assert!(Instant::now() < deadline, "ext was not loaded again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text(&mut client, ext_answer).await, ext_before);
    // The workers hold no table part but those of the table on files and run nothing;
    // each has every account and, once the shares settled (each worker's depends on
    // how many have joined), its share of the orders.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = text(
            &mut client,
            "SELECT sum(tables) AS t, sum(queries) AS q, sum(replica_rows) AS r \
             FROM gyre_workers()",
        )
        .await;
        if held.contains("| 0 | 7000 |") && text(&mut client, parts).await == ext_parts {
            break;
        }
        assert!(Instant::now() < deadline, "{held}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A worker stopped for longer than the heartbeat timeout is declared dead; once it
/// runs again, the coordinator tells it so, and it joins again under a new id with
/// none of what it held: new tables span it, the old one stays short of its part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_declared_dead_joins_again_under_a_new_id() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let _coordinator = gyre(&["coordinator", "--listen", &addr]);
    let mut client = client_of(&addr).await;
    let (_w1, _) = logged_worker(&addr);
    registered(&mut client, 1).await;
    let (w2, log2) = logged_worker(&addr);
    registered(&mut client, 2).await;
    logged(&log2, "gyre worker 2 serving", Duration::from_secs(5)).await;
    run(
        &mut client,
        "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 100000) AS s(value)",
    )
    .await
    .unwrap();
    signal(&w2, "-STOP");
    tokio::time::sleep(Duration::from_secs(5)).await;
    signal(&w2, "-CONT");
    logged(&log2, "gyre worker 3 serving", Duration::from_secs(5)).await;
    logged(&log2, "memory is released", Duration::from_secs(10)).await;
    registered(&mut client, 2).await;
    let workers = text(
        &mut client,
        "SELECT worker, tables FROM gyre_workers() ORDER BY worker",
    )
    .await;
    assert!(workers.contains("| 3      | 0      |"), "{workers}");
    let e = run(&mut client, "SELECT count(*) FROM t")
        .await
        .unwrap_err();
    assert!(e.contains("worker 2"), "{e}");
    run(
        &mut client,
        "CREATE TABLE u AS SELECT value AS k FROM generate_series(1, 100000) AS s(value)",
    )
    .await
    .unwrap();
    let counted = text(&mut client, "SELECT count(*), sum(k) FROM u").await;
    assert!(
        counted.contains("100000") && counted.contains("5000050000"),
        "{counted}"
    );
    let spread = text(
        &mut client,
        "SELECT worker, tables FROM gyre_workers() ORDER BY worker",
    )
    .await;
    assert!(spread.contains("| 3      | 1      |"), "{spread}");
}

/// Each worker's replica rows and the bytes of state it received, by worker id.
async fn replicas(client: &mut FlightSqlServiceClient<Channel>) -> Vec<(i64, i64, i64)> {
    let sql = "SELECT CAST(worker AS BIGINT) AS w, CAST(replica_rows AS BIGINT) AS r, \
               CAST(replica_state_bytes AS BIGINT) AS b FROM gyre_workers() ORDER BY w";
    let mut out = vec![];
    for b in batches(client, sql).await.unwrap() {
        let col = |i: usize| {
            b.column(i)
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .unwrap()
                .clone()
        };
        let (w, r, s) = (col(0), col(1), col(2));
        out.extend((0..b.num_rows()).map(|i| (w.value(i), r.value(i), s.value(i))));
    }
    out
}

/// A table `WITH (replicas = 2)` on three worker processes: kill -9 of one while a
/// long join reads the table makes the join run again on the other two, which hold
/// every block between them, and it returns the right answer; later reads need no
/// reload. A fourth worker that joins then receives only the blocks rendezvous
/// hashing gives it (about 2/3 of the rows among three); the others receive nothing
/// and drop those blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragmented_table_survives_a_killed_worker_and_its_read_is_retried() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let (_coordinator, log) = logged_gyre(
        &["coordinator", "--listen", &addr],
        "warn,gyre_cluster::coordinator=info",
    );
    let mut client = client_of(&addr).await;
    let mut workers = vec![];
    for n in 1..=3 {
        workers.push(worker_of(&addr).await.0);
        registered(&mut client, n).await;
    }
    const ROWS: i64 = 300_000;
    run(
        &mut client,
        "CREATE TABLE f (k BIGINT PRIMARY KEY, v BIGINT) WITH (replicas = 2)",
    )
    .await
    .unwrap();
    run(
        &mut client,
        &format!(
            "INSERT INTO f SELECT value, value % 1000 FROM generate_series(1, {ROWS}) AS s(value)"
        ),
    )
    .await
    .unwrap();
    let totals = "SELECT count(*), sum(v) FROM f";
    let right = |got: &str| got.contains(&format!("| {ROWS}   | {} |", 300 * 499_500));
    let got = text(&mut client, totals).await;
    assert!(right(&got), "{got}");
    let plan = text(&mut client, &format!("EXPLAIN ANALYZE {totals}")).await;
    assert!(plan.contains("(fragmented, 2 copies)"), "{plan}");
    // Each class of v % 100 3000 times: 100 * 3000 * 3000 joined rows, seconds of
    // work (90M rows took under half a second, too short to kill in the middle).
    let join = "SELECT count(*), sum(a.k * b.k % 11) FROM f a JOIN f b ON a.v % 100 = b.v % 100";
    let mut sum = 0i64;
    for v in 0..100 {
        let class: Vec<i64> = (1..=ROWS).filter(|k| k % 100 == v).collect();
        for a in &class {
            sum += class.iter().map(|b| a * b % 11).sum::<i64>();
        }
    }
    let pairs = format!("| 900000000 | {sum} ");
    let mut slow = client.clone();
    let query = tokio::spawn(async move { text(&mut slow, join).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    if query.is_finished() {
        panic!("the join ended before the kill: {:?}", query.await);
    }
    let killed = workers.pop().unwrap();
    drop(killed);
    let got = tokio::time::timeout(Duration::from_secs(60), query)
        .await
        .expect("the retried join must not hang")
        .unwrap();
    assert!(got.contains(&pairs), "{got}");
    logged(&log, "a read lost a worker", Duration::from_secs(1)).await;
    // Later reads on the two that are left, at once.
    let got = text(&mut client, totals).await;
    assert!(right(&got), "{got}");

    // Both survivors hold every block (with two copies among two workers); a
    // newcomer takes its share, and the others receive nothing but drop what they
    // gave it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let before = loop {
        let held = replicas(&mut client).await;
        if held.len() == 2 && held.iter().all(|h| h.1 == ROWS) {
            break held;
        }
        assert!(Instant::now() < deadline, "{held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    workers.push(worker_of(&addr).await.0);
    registered(&mut client, 3).await;
    // The old workers narrow their replicas to their new shares in place.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let held = replicas(&mut client).await;
        if held.len() == 3 && held.iter().all(|h| h.1 > 0 && h.1 < ROWS) {
            break held;
        }
        assert!(Instant::now() < deadline, "{held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(old.2, new.2, "worker {} received state: {after:?}", old.0);
    }
    assert_eq!(
        after.iter().map(|h| h.1).sum::<i64>(),
        2 * ROWS,
        "{after:?}"
    );
    // Its state is its share of the rows (a few bytes each as compressed Parquet).
    let (rows, bytes) = (after[2].1, after[2].2);
    assert!(rows > ROWS / 2 && rows < ROWS * 5 / 6, "{after:?}");
    assert!(bytes > 0 && bytes < 16 * rows, "{after:?}");
    let got = text(&mut client, totals).await;
    assert!(right(&got), "{got}");
    let got = text(&mut client, join).await;
    assert!(got.contains(&pairs), "{got}");
}
