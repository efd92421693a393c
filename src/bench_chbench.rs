//! `gyre bench chbench`: ScyPer's mixed workload (Rödiger's thesis, chapter 5, after
//! the CH-benCHmark): TPC-C terminals commit on the primary while analytical streams
//! run CH queries on the workers, each a secondary that replays the primary's log,
//! on global snapshots. Everything goes through Flight SQL, as users run it.
//!
//! The cluster is embedded (`--nodes` workers on this machine, the primary's log in a
//! data directory, fsynced), emulated (`--link RATE`: a host per node, links shaped;
//! the run goes again from the coordinator's host), or an existing one (`--connect`).
//! The run loads the TPC-C
//! database, then for `--duration` seconds every terminal and every stream runs on a
//! connection of its own; the figures the cluster keeps (`gyre_primary()`,
//! `gyre_workers()`) are read before and after.

use crate::bench_cluster::{BoxError, EmulatedCluster, write_outputs};
use crate::client::RemoteClient;
use crate::stats::median;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, UInt64Type};
use clap::Args;
use gyre_cluster::{Limits, LocalCluster, PrimaryConfig};
use gyre_replica::Placement;
use gyre_testbed::LinkRate;
use gyre_tpcc::{Kind, Scale, Terminal, call_sql, ch, load_calls, schema};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Args, Clone)]
pub struct ChbenchArgs {
    /// TPC-C warehouses.
    #[arg(long, default_value_t = 1)]
    warehouses: i64,
    /// Items and customers per district scaled down (quick runs): 0 keeps the
    /// specification's 100,000 items and 3,000 customers.
    #[arg(long, default_value_t = 0)]
    customers: i64,
    /// TPC-C terminals, each on a connection of its own.
    #[arg(long, default_value_t = 4)]
    terminals: usize,
    /// Analytical streams, each running CH Q1, Q6, Q12 and Q14 in turn.
    #[arg(long, default_value_t = 1)]
    olap_streams: usize,
    /// Workers (embedded, or emulated hosts).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// `loopback` (an embedded cluster in this process) or the link rate of an
    /// emulated cluster (1gbit, 10gbit, ...; root).
    #[arg(long, default_value = "loopback")]
    link: String,
    /// CPU quota of every emulated host (e.g. 0.5).
    #[arg(long)]
    cpus: Option<gyre_testbed::CpuQuota>,
    /// Name of the emulated cluster (namespaces gyre-NAME-*).
    #[arg(long, default_value = "chbench")]
    name: gyre_testbed::ClusterName,
    /// How the primary logs: `logical` (procedure and arguments) or `physical`.
    #[arg(long, default_value = "logical")]
    log: String,
    /// Sync the log for each transaction before the next runs.
    #[arg(long)]
    no_group_commit: bool,
    /// How the workers receive the log: `stream` (one each) or `multicast` (each
    /// group sent once).
    #[arg(long, default_value = "stream", value_parser = ["stream", "multicast"])]
    log_ship: String,
    /// `full`: every worker replicates every table; `partitioned`: the tables that
    /// grow with the warehouses are shared out over the workers (item, warehouse and
    /// district stay whole on each).
    #[arg(long, default_value = "full", value_parser = ["full", "partitioned"])]
    placement: String,
    /// Seconds of the mixed workload.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Where the embedded primary keeps its log (default: a temporary directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Run on the cluster whose coordinator serves Flight SQL here instead.
    #[arg(long)]
    connect: Option<String>,
    /// Write the results as JSON (`-`: standard output).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the committed transactions per second over the run as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
struct Report {
    warehouses: i64,
    items: i64,
    customers_per_district: i64,
    terminals: usize,
    olap_streams: usize,
    nodes: usize,
    /// `loopback`, or the emulated links' rate.
    #[serde(default)]
    link: String,
    log: String,
    group_commit: bool,
    log_ship: String,
    /// `full` or `partitioned` (the growing tables).
    #[serde(default)]
    placement: String,
    /// Rows each worker's replica holds at the end, on average.
    #[serde(default)]
    replica_rows_per_worker: f64,
    seconds: f64,
    /// Committed TPC-C transactions (all five kinds) per second.
    tx_per_s: f64,
    /// Committed New-Order transactions per minute (tpmC).
    new_orders_per_min: f64,
    /// New-Orders rolled back as the specification asks (an unused item, 1 %).
    rolled_back: u64,
    /// Statements that failed otherwise.
    errors: u64,
    first_error: Option<String>,
    /// Analytical queries completed per hour.
    olap_queries_per_h: f64,
    /// Median time of each CH query.
    olap_query_ms_p50: BTreeMap<String, f64>,
    /// Of the workers' last log groups, the largest 99th percentile of the time from
    /// shipping (once durable on the primary) to replayed.
    replay_lag_ms_p99: Option<f64>,
    /// The median, over the workers, of the median time a scan waited on a worker for
    /// its snapshot to be replayed there.
    snapshot_ms_p50: Option<f64>,
    /// Log bytes (LZ4-compressed frames) per transaction that changed something.
    log_bytes_per_tx: f64,
    /// The primary's time per procedure body over a secondary's replay time per log
    /// entry.
    replay_speedup: Option<f64>,
    /// Committed transactions in each second of the run.
    tx_per_second: Vec<u64>,
}

/// What the cluster's figures say at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    log_written_bytes: u64,
    calls: u64,
    call_seconds: f64,
    replayed_entries: u64,
    replay_seconds: f64,
}

/// What the terminals and streams count while they run.
#[derive(Default)]
struct Counters {
    committed: AtomicU64,
    new_orders: AtomicU64,
    rolled_back: AtomicU64,
    errors: AtomicU64,
    queries: AtomicU64,
}

const LOAD_TIME: i64 = 1_750_000_000_000_000_000;

pub async fn run(args: ChbenchArgs) -> Result<(), BoxError> {
    let log_mode: gyre_replica::LogMode = args
        .log
        .parse()
        .map_err(|e| format!("--log is logical or physical: {e}"))?;
    let scale = Scale::with_customers(args.warehouses, args.customers);
    if args.connect.is_none() && !args.link.eq_ignore_ascii_case("loopback") {
        let mut report = emulated(&args).await?;
        report.link = args.link.clone();
        report.log_ship = args.log_ship.clone();
        return finish(&args, report);
    }
    let temp;
    let mut embedded = None;
    let addr = match &args.connect {
        Some(addr) => addr.clone(),
        None => {
            let dir = match &args.data_dir {
                Some(d) => d.clone(),
                None => {
                    temp = tempfile::tempdir()?;
                    temp.path().to_path_buf()
                }
            };
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            let limits = Limits {
                primary: PrimaryConfig {
                    data_dir: Some(dir),
                    log_mode,
                    group_commit: !args.no_group_commit,
                    procedures: gyre_tpcc::procedures(),
                    log_multicast: (args.log_ship == "multicast").then(|| {
                        gyre_replica::ship::Group {
                            group: std::net::SocketAddrV4::new(
                                std::net::Ipv4Addr::new(239, 255, 71, 1),
                                20_000 + rand::random::<u16>() % 20_000,
                            ),
                            interface: std::net::Ipv4Addr::LOCALHOST,
                        }
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let cluster = LocalCluster::start_limited(
                args.nodes,
                (cores / args.nodes.max(1)).max(1),
                "127.0.0.1:0".parse()?,
                &Default::default(),
                &limits,
            )
            .await?;
            let addr = cluster.addr.to_string();
            embedded = Some(cluster);
            addr
        }
    };
    let client = RemoteClient::connect(&addr).await?;
    load(&client, scale, args.placement.parse()?).await?;
    caught_up(&client).await?;
    let before = figures(&client).await?;
    let counters = Arc::new(Counters::default());
    let first_error = Arc::new(parking_lot::Mutex::new(None::<String>));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.duration);
    let mut terminals = tokio::task::JoinSet::new();
    for t in 0..args.terminals {
        let client = RemoteClient::connect(&addr).await?;
        let (counters, first_error) = (Arc::clone(&counters), Arc::clone(&first_error));
        let home = 1 + t as i64 % scale.warehouses;
        terminals.spawn(async move {
            let mut terminal = Terminal::new(scale, home, 1_000 + t as u64);
            while Instant::now() < deadline {
                let now = LOAD_TIME + started.elapsed().as_nanos() as i64;
                let call = terminal.next(now);
                match client.query(&call.sql()).await {
                    Ok(_) => {
                        counters.committed.fetch_add(1, Ordering::Relaxed);
                        if call.kind == Kind::NewOrder {
                            counters.new_orders.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // The specification's 1 % of New-Orders that name an unused item.
                    Err(e)
                        if call.kind == Kind::NewOrder
                            && e.to_string().contains("Item number is not valid") =>
                    {
                        counters.rolled_back.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        first_error
                            .lock()
                            .get_or_insert_with(|| format!("{}: {e}", call.sql()));
                    }
                }
            }
        });
    }
    let mut streams = tokio::task::JoinSet::new();
    for k in 0..args.olap_streams {
        let client = RemoteClient::connect(&addr).await?;
        let (counters, first_error) = (Arc::clone(&counters), Arc::clone(&first_error));
        streams.spawn(async move {
            let mut times: Vec<(&'static str, f64)> = vec![];
            let mut i = k;
            while Instant::now() < deadline {
                let (name, sql) = ch::QUERIES[i % ch::QUERIES.len()];
                i += 1;
                let began = Instant::now();
                match client.query(sql).await {
                    Ok(_) => {
                        counters.queries.fetch_add(1, Ordering::Relaxed);
                        times.push((name, began.elapsed().as_secs_f64() * 1e3));
                    }
                    Err(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        first_error
                            .lock()
                            .get_or_insert_with(|| format!("CH {name}: {e}"));
                    }
                }
            }
            times
        });
    }
    // One line per second: what committed and completed in it.
    let mut tx_per_second = vec![];
    let mut last = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while Instant::now() < deadline {
        tick.tick().await;
        let committed = counters.committed.load(Ordering::Relaxed);
        tx_per_second.push(committed - last);
        last = committed;
        eprintln!(
            "  {:>3.0} s: {} tx/s, {} analytical queries so far, {} errors",
            started.elapsed().as_secs_f64(),
            tx_per_second.last().unwrap_or(&0),
            counters.queries.load(Ordering::Relaxed),
            counters.errors.load(Ordering::Relaxed)
        );
    }
    while let Some(done) = terminals.join_next().await {
        done?;
    }
    let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    while let Some(done) = streams.join_next().await {
        for (name, ms) in done? {
            times.entry(name.to_string()).or_default().push(ms);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = figures(&client).await?;
    let (lag, wait) = freshness(&client).await?;
    let held = first_row(
        &client,
        "SELECT CAST(avg(replica_rows) AS DOUBLE) FROM gyre_workers()",
    )
    .await?
    .column(0)
    .as_primitive::<Float64Type>()
    .value(0);
    drop(embedded);
    let committed = counters.committed.load(Ordering::Relaxed);
    let logged = after.calls.saturating_sub(before.calls);
    let call_time = (after.call_seconds - before.call_seconds) / logged.max(1) as f64;
    let replayed = after
        .replayed_entries
        .saturating_sub(before.replayed_entries);
    let replay_time = (after.replay_seconds - before.replay_seconds) / replayed.max(1) as f64;
    let report = Report {
        warehouses: scale.warehouses,
        items: scale.items,
        customers_per_district: scale.customers,
        terminals: args.terminals,
        olap_streams: args.olap_streams,
        nodes: args.nodes,
        link: if args.connect.is_some() {
            String::new()
        } else {
            args.link.clone()
        },
        log: args.log.clone(),
        group_commit: !args.no_group_commit,
        log_ship: if args.connect.is_some() {
            "existing cluster".into()
        } else {
            args.log_ship.clone()
        },
        placement: args.placement.clone(),
        replica_rows_per_worker: held,
        seconds,
        tx_per_s: committed as f64 / seconds,
        new_orders_per_min: counters.new_orders.load(Ordering::Relaxed) as f64 * 60.0 / seconds,
        rolled_back: counters.rolled_back.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        first_error: first_error.lock().clone(),
        olap_queries_per_h: counters.queries.load(Ordering::Relaxed) as f64 * 3600.0 / seconds,
        olap_query_ms_p50: times
            .iter()
            .filter_map(|(q, t)| Some((q.clone(), median(t)?)))
            .collect(),
        replay_lag_ms_p99: lag,
        snapshot_ms_p50: wait,
        log_bytes_per_tx: (after.log_written_bytes - before.log_written_bytes) as f64
            / logged.max(1) as f64,
        replay_speedup: (logged > 0 && replayed > 0 && replay_time > 0.0)
            .then(|| call_time / replay_time),
        tx_per_second,
    };
    finish(&args, report)
}

/// Writes or prints the report; fails if any statement did.
fn finish(args: &ChbenchArgs, report: Report) -> Result<(), BoxError> {
    if !write_outputs(
        args.json.as_deref(),
        args.plot.as_deref(),
        &report,
        plot_svg,
    )? {
        print_report(&report);
    }
    if report.errors > 0 {
        return Err(format!(
            "{} statements failed; the first: {}",
            report.errors,
            report.first_error.as_deref().unwrap_or("?")
        )
        .into());
    }
    Ok(())
}

/// Runs the benchmark from the coordinator's host of an emulated cluster whose
/// primary logs into a fresh directory (the hosts share this machine's files).
async fn emulated(args: &ChbenchArgs) -> Result<Report, BoxError> {
    let dir = tempfile::Builder::new().prefix("gyre-chbench-").tempdir()?;
    let mut coordinator_args = vec![
        "--data-dir".to_string(),
        dir.path().display().to_string(),
        "--log".into(),
        args.log.clone(),
    ];
    if args.no_group_commit {
        coordinator_args.push("--no-group-commit".into());
    }
    let cluster = EmulatedCluster {
        name: args.name.clone(),
        nodes: args.nodes,
        link: args.link.parse::<LinkRate>()?,
        cpus: args.cpus,
        data_roots: vec![],
        encrypt_links: false,
        coordinator_args,
        log_multicast: (args.log_ship == "multicast")
            .then(|| std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(239, 255, 71, 1), 7400)),
    };
    let inner = vec![
        "bench".to_string(),
        "chbench".into(),
        "--warehouses".into(),
        args.warehouses.to_string(),
        "--customers".into(),
        args.customers.to_string(),
        "--terminals".into(),
        args.terminals.to_string(),
        "--olap-streams".into(),
        args.olap_streams.to_string(),
        "--nodes".into(),
        args.nodes.to_string(),
        "--log".into(),
        args.log.clone(),
        "--placement".into(),
        args.placement.clone(),
        "--duration".into(),
        args.duration.to_string(),
    ];
    let (_, stdout) = cluster.run("gyre bench chbench", false, inner).await?;
    Ok(serde_json::from_slice(&stdout)?)
}

/// Creates the TPC-C tables and loads them, a district per call.
async fn load(client: &RemoteClient, scale: Scale, placement: Placement) -> Result<(), BoxError> {
    for ddl in schema::ddl(placement) {
        client.query(&ddl).await?;
    }
    let calls = load_calls(scale, LOAD_TIME);
    let started = Instant::now();
    eprintln!(
        "loading {} warehouses ({} items, {} customers per district)...",
        scale.warehouses, scale.items, scale.customers
    );
    for (i, (procedure, args)) in calls.iter().enumerate() {
        client.query(&call_sql(procedure, args)).await?;
        if (i + 1) % 10 == 0 || i + 1 == calls.len() {
            eprintln!(
                "  {}/{} load calls, {:.1} s",
                i + 1,
                calls.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// How long the workers may take to replay the load's log.
const CATCH_UP: Duration = Duration::from_secs(600);

/// Waits until every worker has replayed the primary's log (the load's large groups
/// take a while over slow links), so that the mix starts with secondaries in step.
async fn caught_up(client: &RemoteClient) -> Result<(), BoxError> {
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        let lsn = first_row(client, "SELECT lsn FROM gyre_primary()").await?;
        let lsn = lsn.column(0).as_primitive::<UInt64Type>().value(0);
        let behind = first_row(client, "SELECT min(replayed_lsn) FROM gyre_workers()").await?;
        let replayed = behind.column(0).as_primitive::<UInt64Type>();
        let replayed = (!replayed.is_null(0)).then(|| replayed.value(0));
        if replayed.is_some_and(|r| r >= lsn) {
            return Ok(());
        }
        if started.elapsed() > CATCH_UP {
            return Err(format!(
                "the workers replayed the log up to LSN {replayed:?} of {lsn} in {CATCH_UP:?}"
            )
            .into());
        }
        if said.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "  waiting for the workers to replay the load: LSN {} of {lsn}, {:.0} s",
                replayed.unwrap_or(0),
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first row of a query's result.
async fn first_row(client: &RemoteClient, sql: &str) -> Result<RecordBatch, BoxError> {
    client
        .query(sql)
        .await?
        .into_iter()
        .find(|b| b.num_rows() > 0)
        .ok_or_else(|| format!("{sql}: no rows").into())
}

/// The primary's and the workers' totals.
async fn figures(client: &RemoteClient) -> Result<Figures, BoxError> {
    let p = first_row(
        client,
        "SELECT log_written_bytes, calls_committed, call_seconds FROM gyre_primary()",
    )
    .await?;
    let w = first_row(
        client,
        "SELECT sum(replayed_entries)::BIGINT UNSIGNED, sum(replay_seconds) FROM gyre_workers()",
    )
    .await?;
    let u = |b: &RecordBatch, i: usize| b.column(i).as_primitive::<UInt64Type>().value(0);
    let f = |b: &RecordBatch, i: usize| b.column(i).as_primitive::<Float64Type>().value(0);
    Ok(Figures {
        log_written_bytes: u(&p, 0),
        calls: u(&p, 1),
        call_seconds: f(&p, 2),
        replayed_entries: u(&w, 0),
        replay_seconds: f(&w, 1),
    })
}

/// The workers' largest replay lag (p99) and their median snapshot wait (p50).
async fn freshness(client: &RemoteClient) -> Result<(Option<f64>, Option<f64>), BoxError> {
    let b = first_row(
        client,
        "SELECT max(replay_lag_ms_p99), median(snapshot_wait_ms_p50) FROM gyre_workers()",
    )
    .await?;
    let f = |i: usize| {
        let c = b.column(i).as_primitive::<Float64Type>();
        (!c.is_null(0)).then(|| c.value(0))
    };
    Ok((f(0), f(1)))
}

fn print_report(r: &Report) {
    println!(
        "CH-benCHmark: {} warehouses, {} terminals, {} analytical streams, {} workers ({}), {} \
         tables, {} log by {}{}",
        r.warehouses,
        r.terminals,
        r.olap_streams,
        r.nodes,
        if r.link.is_empty() {
            "existing cluster"
        } else {
            &r.link
        },
        if r.placement.is_empty() {
            "full"
        } else {
            &r.placement
        },
        r.log,
        r.log_ship,
        if r.group_commit {
            ""
        } else {
            ", no group commit"
        }
    );
    println!(
        "  {:.0} tx/s ({:.0} New-Orders per minute, {} rolled back), {} errors",
        r.tx_per_s, r.new_orders_per_min, r.rolled_back, r.errors
    );
    println!("  {:.0} analytical queries per hour", r.olap_queries_per_h);
    for (q, ms) in &r.olap_query_ms_p50 {
        println!("    {q}: {ms:.1} ms (median)");
    }
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    println!(
        "  replay lag p99 {} ms, snapshot wait p50 {} ms, {:.0} log bytes per tx, replay speedup {}",
        opt(r.replay_lag_ms_p99),
        opt(r.snapshot_ms_p50),
        r.log_bytes_per_tx,
        opt(r.replay_speedup)
    );
    println!(
        "  {:.0} rows in each worker's replica",
        r.replica_rows_per_worker
    );
}

fn plot_svg(r: &Report) -> String {
    let points: Vec<(f64, f64)> = r
        .tx_per_second
        .iter()
        .enumerate()
        .map(|(i, &n)| ((i + 1) as f64, n as f64))
        .collect();
    crate::plot::lines(
        &format!(
            "CH-benCHmark: TPC-C on the primary, {} analytical streams on {} secondaries \
             ({:.0} queries/h)",
            r.olap_streams, r.nodes, r.olap_queries_per_h
        ),
        "second of the run",
        "committed transactions per second",
        &[(r.log.as_str(), points)],
    )
}
