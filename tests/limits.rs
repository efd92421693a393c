//! Resource limits: a statement timeout cancels a query on every worker, a coordinator
//! that runs at most N queries queues the rest, and a worker's memory limit makes a
//! sort spill and a hash join's oversized build fail cleanly, with the cluster usable
//! afterwards; under a cgroup memory limit that kills the process without it, a worker
//! memory limit makes the same sort spill and the process live.

use arrow::array::{Array, Int64Array, StringArray};
use arrow_flight::sql::client::FlightSqlServiceClient;
use gyre_cluster::coordinator::StatementResult;
use gyre_cluster::{Limits, LocalCluster};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

async fn cluster(limits: Limits) -> LocalCluster {
    LocalCluster::start_limited(
        2,
        1,
        "127.0.0.1:0".parse().unwrap(),
        &Default::default(),
        &limits,
    )
    .await
    .unwrap()
}

fn int(r: &StatementResult, col: usize) -> i64 {
    r.batches[0]
        .column(col)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0)
}

/// Waits until no worker runs a stage of any query (at most `within`).
async fn workers_idle(cluster: &LocalCluster, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if cluster.workers().all(|w| w.running_queries() == 0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A join with no equal keys over 200K x 200K rows: minutes of work on any worker.
const ENDLESS: &str = "SELECT count(*) FROM t a JOIN t b ON a.k < b.k + a.k % 3";

async fn with_table(cluster: &LocalCluster) {
    cluster
        .coordinator
        .sql("CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 200000) AS s(value)")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_cancels_the_query_on_every_worker() {
    let cluster = cluster(Limits::default()).await;
    with_table(&cluster).await;
    let c = &cluster.coordinator;
    let session = c.new_session();
    c.sql_in(&session, "SET gyre.statement_timeout = '500ms'")
        .await
        .unwrap();
    let shown = c
        .sql_in(&session, "SHOW gyre.statement_timeout")
        .await
        .unwrap();
    let shown = arrow::util::pretty::pretty_format_batches(&shown[0].batches)
        .unwrap()
        .to_string();
    assert!(shown.contains("500ms"), "{shown}");
    let start = Instant::now();
    let err = c.sql_in(&session, ENDLESS).await.unwrap_err().to_string();
    assert!(err.contains("gyre.statement_timeout"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(
        workers_idle(&cluster, Duration::from_secs(3)).await,
        "a worker still runs the canceled query"
    );
    // Other sessions keep no limit, and the cluster answers.
    let r = c.sql_one("SELECT count(*) AS n FROM t").await.unwrap();
    assert_eq!(int(&r, 0), 200_000);

    // Through Flight SQL, the client learns the deadline passed.
    let channel = Channel::from_shared(format!("http://{}", cluster.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = FlightSqlServiceClient::new(channel);
    let set = client
        .execute("SET gyre.statement_timeout = '300ms'".into(), None)
        .await
        .unwrap();
    for ep in set.endpoint {
        let _ = client.do_get(ep.ticket.unwrap()).await.unwrap();
    }
    let started = client.execute(ENDLESS.into(), None).await.unwrap();
    let ticket = started.endpoint[0].ticket.clone().unwrap();
    let err = match client.do_get(ticket).await {
        Ok(stream) => {
            use futures::TryStreamExt;
            stream.try_collect::<Vec<_>>().await.unwrap_err()
        }
        Err(e) => e,
    };
    assert!(err.to_string().contains("statement_timeout"), "{err}");
    assert!(err.to_string().contains("Deadline expired"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_beyond_the_limit_wait_their_turn() {
    let cluster = cluster(Limits {
        max_concurrent_queries: Some(1),
        ..Default::default()
    })
    .await;
    with_table(&cluster).await;
    let c = Arc::clone(&cluster.coordinator);
    let slow = c.new_session();
    c.sql_in(&slow, "SET gyre.statement_timeout = '1500ms'")
        .await
        .unwrap();
    let start = Instant::now();
    let first = {
        let c = Arc::clone(&c);
        tokio::spawn(async move { c.sql_in(&slow, ENDLESS).await.map(|_| Instant::now()) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = c.sql_one("SELECT count(*) AS n FROM t").await.unwrap();
    let second_done = Instant::now();
    assert_eq!(int(&r, 0), 200_000);
    let first = first.await.unwrap();
    assert!(first.is_err(), "the endless query timed out");
    // The second query ran only after the first one's turn ended.
    assert!(
        second_done.duration_since(start) >= Duration::from_millis(1400),
        "the second query ran beside the first: done after {:?}",
        second_done.duration_since(start)
    );
    // A queued query's wait counts against its own statement timeout.
    let busy = {
        let c = Arc::clone(&c);
        let s = c.new_session();
        c.sql_in(&s, "SET gyre.statement_timeout = '1s'")
            .await
            .unwrap();
        tokio::spawn(async move { c.sql_in(&s, ENDLESS).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let impatient = c.new_session();
    c.sql_in(&impatient, "SET gyre.statement_timeout = '200ms'")
        .await
        .unwrap();
    let err = c
        .sql_in(&impatient, "SELECT count(*) FROM t")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("gyre.statement_timeout"), "{err}");
    assert!(busy.await.unwrap().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_memory_limit_spills_sorts_and_fails_oversized_builds_cleanly() {
    let cluster = cluster(Limits {
        worker_memory: Some(32 << 20),
        ..Default::default()
    })
    .await;
    let c = &cluster.coordinator;
    // About 60 MB of strings, half on each worker: more than the sort's share of a
    // worker's 32 MiB (what the sort's merge reserves is not its to use).
    c.sql(
        "CREATE TABLE w AS SELECT value AS k, \
         concat('row-', CAST((value * 7919) % 1000003 AS VARCHAR), repeat('x', 40)) AS s \
         FROM generate_series(1, 1000000) AS s(value)",
    )
    .await
    .unwrap();
    // A sort larger than the limit spills and stays right.
    let plan = c
        .sql_one("EXPLAIN ANALYZE SELECT s FROM w ORDER BY s")
        .await
        .unwrap();
    let plan = arrow::util::pretty::pretty_format_batches(&plan.batches)
        .unwrap()
        .to_string();
    let spilled = plan
        .split("spill_count=")
        .skip(1)
        .any(|rest| !rest.starts_with('0'));
    assert!(spilled, "no sort spilled:\n{plan}");
    let sorted = strings(&c.sql_one("SELECT s FROM w ORDER BY s").await.unwrap());
    assert_eq!(sorted.len(), 1_000_000);
    assert!(sorted.windows(2).all(|p| p[0] <= p[1]), "not in order");
    // A hash join whose build side cannot fit fails naming what ran out, nothing dies.
    exhausts(
        &cluster,
        "SET gyre.join_strategy = 'shuffle'; SET gyre.skew_detection = off",
        "SELECT count(*) FROM (SELECT s FROM w UNION ALL SELECT s FROM w) a \
         JOIN (SELECT s FROM w UNION ALL SELECT s FROM w) b ON a.s = b.s",
    )
    .await;
    // A cyclo-join holds its inputs whole: beyond the pool it fails naming itself.
    let err = exhausts(
        &cluster,
        "SET gyre.join_strategy = 'cyclo'",
        "SELECT max(length(a.s) + length(b.s)) \
         FROM (SELECT k, s FROM w UNION ALL SELECT k, s FROM w) a JOIN w b ON a.k = b.k",
    )
    .await;
    assert!(err.contains("CycloJoinExec"), "{err}");
    // So does Flow-Join's build partition, held for broadcasting heavy keys.
    let err = exhausts(
        &cluster,
        "SET gyre.join_strategy = 'shuffle'; SET gyre.skew_detection = on",
        "SELECT count(*) FROM w a JOIN w b ON a.s = b.s",
    )
    .await;
    assert!(err.contains("for FlowJoinExec"), "{err}");
    c.sql("SET gyre.join_strategy = 'auto'").await.unwrap();
    // The next query runs.
    let r = c.sql_one("SELECT count(*) AS n FROM w").await.unwrap();
    assert_eq!(int(&r, 0), 1_000_000);
}

/// Runs `settings`, then `sql`, which must fail with "Resources exhausted"; the
/// workers must then be idle. Returns the error.
async fn exhausts(cluster: &LocalCluster, settings: &str, sql: &str) -> String {
    let c = &cluster.coordinator;
    c.sql(settings).await.unwrap();
    let err = c.sql_one(sql).await.unwrap_err().to_string();
    assert!(err.contains("Resources exhausted"), "{err}");
    assert!(workers_idle(cluster, Duration::from_secs(3)).await);
    err
}

fn strings(r: &StatementResult) -> Vec<String> {
    r.batches
        .iter()
        .flat_map(|b| {
            let column =
                arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
            let a = column.as_any().downcast_ref::<StringArray>().unwrap();
            (0..a.len())
                .map(|i| a.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A memory cgroup (v1) of `limit` bytes under this process's own, removed on drop.
struct MemoryCgroup(std::path::PathBuf);

impl MemoryCgroup {
    /// None where memory cgroups cannot be made here (not root, no v1 memory controller).
    fn new(name: &str, limit: u64) -> Option<Self> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))?;
        let dir = std::path::Path::new("/sys/fs/cgroup/memory")
            .join(path.trim_start_matches('/'))
            .join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let group = Self(dir);
        std::fs::write(group.0.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(group)
    }

    /// Runs `gyre ARGS` inside the group; its exit status and output.
    fn run(&self, args: &[&str]) -> (std::process::ExitStatus, String) {
        let procs = self.0.join("cgroup.procs");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > '{}' && exec \"$@\"", procs.display()))
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_gyre"))
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status, text)
    }

    /// Processes of the group the kernel killed for memory so far.
    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.oom_control"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn under_a_cgroup_memory_limit_a_worker_memory_limit_spills_instead_of_being_killed() {
    // 3 million rows of about 110 bytes (some 450 MB for the process with its table),
    // then a sort of all of them on the workers (a window partitioned across them), then
    // another query. Unbounded, the sort takes the process to some 1.4 GB.
    let statements = "CREATE TABLE w AS SELECT value AS k, \
         concat('row-', CAST((value * 7919) % 1000003 AS VARCHAR), repeat('x', 100)) AS s \
         FROM generate_series(1, 3000000) AS s(value); \
         EXPLAIN ANALYZE SELECT max(rn) FROM \
         (SELECT row_number() OVER (PARTITION BY k % 64 ORDER BY s) AS rn FROM w); \
         SELECT count(*) AS n FROM w";
    const LIMIT: u64 = 900 << 20;
    let local = [
        "local",
        "--workers",
        "2",
        "--format",
        "csv",
        "-c",
        statements,
    ];
    let Some(unbounded) = MemoryCgroup::new("gyre-unbounded", LIMIT) else {
        eprintln!("skipped: cannot make a memory cgroup here (needs root and cgroup v1)");
        return;
    };
    // Without a memory pool the kernel kills the process: the query needs more than
    // the cgroup holds.
    let (status, out) = unbounded.run(&local);
    assert!(
        !status.success() && unbounded.oom_kills() >= 1,
        "the sort fit in {LIMIT} bytes without a pool ({status}): the test no longer \
         needs more memory than its cgroup\n{out}"
    );
    drop(unbounded);
    // With 64 MiB per worker it spills, nothing is killed, and the next query runs.
    let bounded = MemoryCgroup::new("gyre-bounded", LIMIT).unwrap();
    let mut args = local.to_vec();
    args.extend(["--memory-limit", "64M"]);
    let (status, out) = bounded.run(&args);
    assert!(status.success(), "{status}\n{out}");
    assert_eq!(bounded.oom_kills(), 0, "{out}");
    let spilled = out
        .split("spill_count=")
        .skip(1)
        .any(|rest| !rest.starts_with('0'));
    assert!(spilled, "nothing spilled:\n{out}");
    assert!(out.lines().any(|l| l.trim() == "3000000"), "{out}");
}
