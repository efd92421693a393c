//! `gyre bench tpcds`: the 99 TPC-DS queries on an embedded cluster, next to
//! single-node DataFusion and DuckDB on the same data, in one run.
//!
//! DuckDB's tpcds extension generates the data and the query texts at run time
//! (nothing of TPC-DS is in this repository). The 24 tables are written to Parquet and
//! loaded into Gyre, each hash-placed on its first column (the table's first key);
//! single-node DataFusion gets a copy of Gyre's in-memory tables, and DuckDB keeps the
//! database it generated, in memory. Gyre runs each query through Flight SQL, as users
//! run it; DataFusion and DuckDB in process. Each system runs a query `--iterations`
//! times in turn and the report gives the medians; Gyre's answer is checked against
//! DataFusion's (floats to 9 significant digits). DataFusion runs under a memory limit
//! and a time limit: a query that exceeds them (q72 joins 940 million rows on
//! in-memory tables, where DataFusion's dynamic filters do not prune) is stopped
//! there, and its answer is taken from DataFusion over the Parquet files instead.

use crate::bench_cluster::{BoxError, write_outputs};
use crate::client::RemoteClient;
use crate::plot::{Series, grouped_bars_with_reference};
use crate::python::{DUCKDB_BENCH, PythonProcess};
use crate::stats::median;
use clap::Args;
use datafusion::arrow::array::RecordBatch;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionConfig;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use gyre_cluster::LocalCluster;
use gyre_cluster::reference::{canonical_rows_rounded, copy_tables};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::time::timeout;

#[derive(Args)]
pub struct TpcdsArgs {
    /// Scale factor.
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Embedded workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Threads per worker (default: cores / workers, at least 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Runs of each query by each system (the median is reported).
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    /// Only these queries (e.g. 3,72).
    #[arg(long, value_delimiter = ',')]
    queries: Vec<usize>,
    /// Memory DataFusion may use (GiB): beyond it a query fails instead of taking the
    /// machine down, and its answer is checked against DataFusion over the Parquet files.
    #[arg(long, default_value_t = 8.0)]
    datafusion_memory_gib: f64,
    /// Seconds a DataFusion run may take before it is stopped (its answer then comes
    /// from DataFusion over the Parquet files, under the same limit).
    #[arg(long, default_value_t = 60.0)]
    datafusion_timeout: f64,
    /// Seconds a Gyre run may take before the benchmark gives up on the query (it
    /// then fails): a hung query fails the run instead of stopping it.
    #[arg(long, default_value_t = 300.0)]
    gyre_timeout: f64,
    /// Leave DuckDB's timings out (it still generates the data).
    #[arg(long)]
    no_duckdb: bool,
    /// Statements Gyre's session runs first (e.g. a SET), repeatable.
    #[arg(short = 'c', long = "command")]
    setup: Vec<String>,
    /// Write the results as JSON (`-`: standard output, nothing else printed there).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw each query's time relative to DataFusion's as an SVG plot.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct QueryTiming {
    query: usize,
    gyre_ms: Option<f64>,
    datafusion_ms: Option<f64>,
    duckdb_ms: Option<f64>,
    rows: usize,
    /// Gyre's answer is DataFusion's.
    same_result: bool,
    /// What Gyre's answer was checked against: DataFusion over the in-memory tables, or
    /// over the Parquet files when the in-memory run failed.
    checked_against: Option<&'static str>,
    /// Why a system has no time for this query.
    errors: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    scale_factor: f64,
    workers: usize,
    threads_per_worker: usize,
    iterations: usize,
    datafusion_target_partitions: usize,
    duckdb_threads: usize,
    queries: Vec<QueryTiming>,
    /// Sums over the queries every system answered.
    sum_gyre_ms: f64,
    sum_datafusion_ms: f64,
    sum_duckdb_ms: Option<f64>,
    gyre_to_datafusion: f64,
    gyre_to_duckdb: Option<f64>,
}

#[derive(Deserialize)]
struct Generated {
    tables: Vec<(String, u64)>,
}

#[derive(Deserialize)]
struct Timed {
    ms: Option<Vec<f64>>,
    error: Option<String>,
}

pub async fn run(args: TpcdsArgs) -> Result<(), BoxError> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = args.threads.unwrap_or((cores / args.workers.max(1)).max(1));
    let quiet = args.json.as_deref() == Some(Path::new("-"));
    let say = |s: String| {
        if quiet {
            eprintln!("{s}")
        } else {
            println!("{s}")
        }
    };
    let dir = tempfile::Builder::new().prefix("gyre-tpcds-").tempdir()?;
    eprintln!(
        "generating TPC-DS SF {} with DuckDB's tpcds extension...",
        args.sf
    );
    let start = Instant::now();
    let mut duckdb = PythonProcess::start(
        DUCKDB_BENCH,
        &[
            "tpcds".to_string(),
            args.sf.to_string(),
            dir.path().display().to_string(),
            cores.to_string(),
        ],
    )?;
    let generated: Generated = serde_json::from_str(&duckdb.read_line()?)?;
    eprintln!(
        "{} tables ({} rows) in {:.1} s; loading them into {} workers...",
        generated.tables.len(),
        generated.tables.iter().map(|t| t.1).sum::<u64>(),
        start.elapsed().as_secs_f64(),
        args.workers
    );

    let start = Instant::now();
    let cluster = LocalCluster::start(args.workers, threads, "127.0.0.1:0".parse()?).await?;
    let client = RemoteClient::connect(&cluster.addr.to_string()).await?;
    for (table, _) in &generated.tables {
        let path = dir.path().join(format!("{table}.parquet"));
        let path = path.display().to_string();
        let first = first_column(&path).await?;
        client
            .query(&format!(
                "CREATE EXTERNAL TABLE {table} STORED AS PARQUET LOCATION '{path}' \
                 OPTIONS ('gyre.partition_by' '{first}')"
            ))
            .await
            .map_err(|e| format!("loading {table}: {e}"))?;
    }
    for sql in &args.setup {
        client.query(sql).await?;
    }
    let memory = (args.datafusion_memory_gib * (1u64 << 30) as f64) as usize;
    let limited = || -> Result<SessionContext, BoxError> {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(memory, 1.0)
            .build_arc()?;
        let config = SessionConfig::new().with_target_partitions(cores);
        Ok(SessionContext::new_with_config_rt(config, runtime))
    };
    let reference = limited()?;
    copy_tables(&cluster.coordinator, &reference, cores).await?;
    let over_files = limited()?;
    for (table, _) in &generated.tables {
        let path = dir.path().join(format!("{table}.parquet"));
        over_files
            .register_parquet(table, path.display().to_string(), Default::default())
            .await?;
    }
    eprintln!(
        "loaded into Gyre and DataFusion in {:.1} s",
        start.elapsed().as_secs_f64()
    );

    let queries: Vec<usize> = if args.queries.is_empty() {
        (1..=99).collect()
    } else {
        args.queries.clone()
    };
    let iterations = args.iterations.max(1);
    let limit = Duration::from_secs_f64(args.datafusion_timeout.max(0.001));
    let gyre_limit = Duration::from_secs_f64(args.gyre_timeout.max(0.001));
    say(format!(
        "{:>5} {:>10} {:>14} {:>10} {:>7} {:>7} {:>7}",
        "query", "gyre ms", "datafusion ms", "duckdb ms", "g/df", "g/duck", "rows"
    ));
    let mut timings = vec![];
    for &q in &queries {
        let text = std::fs::read_to_string(dir.path().join("queries").join(format!("{q:02}.sql")))
            .map_err(|e| format!("no text for query {q}: {e}"))?;
        let sql = text.trim().trim_end_matches(';');
        let mut errors = vec![];

        let gyre = timed_runs(
            ("gyre", "no answer after"),
            iterations,
            gyre_limit,
            &mut errors,
            || client.query(sql),
        )
        .await?;
        let mut datafusion = timed_runs(
            ("datafusion", "stopped after"),
            iterations,
            limit,
            &mut errors,
            || async { reference.sql(sql).await?.collect().await },
        )
        .await?;
        let mut duckdb_ms = None;
        if !args.no_duckdb {
            let timed: Timed =
                serde_json::from_str(&duckdb.request(&format!("{q} {iterations}"))?)?;
            match (timed.ms, timed.error) {
                (Some(ms), _) => duckdb_ms = median(&ms),
                (None, e) => errors.push(format!("duckdb: {}", e.unwrap_or_default())),
            }
        }
        let mut checked_against = datafusion.1.is_some().then_some("in-memory tables");
        if datafusion.1.is_none() {
            // DataFusion's pruning works on files, not on in-memory tables.
            let run = async { over_files.sql(sql).await?.collect().await };
            if let Ok(Ok(batches)) = timeout(limit, run).await {
                datafusion.1 = Some(canonical_rows_rounded(&batches, 9)?);
                checked_against = Some("Parquet files");
            }
        }
        let same_result = matches!((&gyre.1, &datafusion.1), (Some(g), Some(d)) if g == d);
        let t = QueryTiming {
            query: q,
            gyre_ms: median(&gyre.0),
            datafusion_ms: median(&datafusion.0),
            duckdb_ms,
            rows: gyre
                .1
                .as_ref()
                .or(datafusion.1.as_ref())
                .map_or(0, Vec::len),
            same_result,
            checked_against,
            errors,
        };
        say(row_line(&t));
        timings.push(t);
    }

    // Sums over the queries Gyre and DataFusion both answered, and DuckDB too.
    let both = |t: &&QueryTiming| t.gyre_ms.is_some() && t.datafusion_ms.is_some();
    let answered = timings.iter().filter(both).count();
    let sum_g: f64 = timings.iter().filter(both).filter_map(|t| t.gyre_ms).sum();
    let sum_d: f64 = timings
        .iter()
        .filter(both)
        .filter_map(|t| t.datafusion_ms)
        .sum();
    let all3 = |t: &&QueryTiming| both(t) && t.duckdb_ms.is_some();
    let with_duckdb = timings.iter().filter(all3).count();
    let sum_duck = (with_duckdb > 0).then(|| {
        timings
            .iter()
            .filter(all3)
            .filter_map(|t| t.duckdb_ms)
            .sum::<f64>()
    });
    let gyre_with_duckdb: f64 = timings.iter().filter(all3).filter_map(|t| t.gyre_ms).sum();
    let report = Report {
        scale_factor: args.sf,
        workers: args.workers,
        threads_per_worker: threads,
        iterations,
        datafusion_target_partitions: cores,
        duckdb_threads: cores,
        sum_gyre_ms: sum_g,
        sum_datafusion_ms: sum_d,
        sum_duckdb_ms: sum_duck,
        gyre_to_datafusion: sum_g / sum_d,
        gyre_to_duckdb: sum_duck.map(|d| gyre_with_duckdb / d),
        queries: timings,
    };
    say(format!(
        "sum of medians over the {} queries both answered: gyre {:.0} ms ({} workers), \
         datafusion {:.0} ms; ratio {:.2}",
        answered, sum_g, args.workers, sum_d, report.gyre_to_datafusion
    ));
    if let (Some(d), Some(r)) = (report.sum_duckdb_ms, report.gyre_to_duckdb) {
        say(format!(
            "duckdb {d:.0} ms over the {} queries all three answered; gyre to duckdb {r:.2}",
            with_duckdb
        ));
    }
    write_outputs(
        args.json.as_deref(),
        args.plot.as_deref(),
        &report,
        plot_svg,
    )?;
    let failed: Vec<String> = report
        .queries
        .iter()
        .filter(|t| !t.same_result || t.gyre_ms.is_none())
        .map(|t| t.query.to_string())
        .collect();
    if !failed.is_empty() {
        return Err(format!(
            "queries {} failed on Gyre or answered differently from DataFusion",
            failed.join(",")
        )
        .into());
    }
    Ok(())
}

/// Runs `run` up to `iterations` times, each within `limit`: the times (ms) and the
/// last answer's canonical rows. The first error or timeout ends the runs and goes
/// into `errors`, prefixed with the system's name (a timeout as "`system`:
/// `timed_out` N s").
async fn timed_runs<F, Fut, E>(
    (system, timed_out): (&str, &str),
    iterations: usize,
    limit: Duration,
    errors: &mut Vec<String>,
    mut run: F,
) -> Result<(Vec<f64>, Option<Vec<String>>), BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<RecordBatch>, E>>,
    E: std::fmt::Display,
{
    let (mut times, mut rows) = (vec![], None);
    for _ in 0..iterations {
        let start = Instant::now();
        match timeout(limit, run()).await {
            Ok(Ok(batches)) => {
                times.push(start.elapsed().as_secs_f64() * 1e3);
                rows = Some(canonical_rows_rounded(&batches, 9)?);
            }
            Ok(Err(e)) => {
                errors.push(format!("{system}: {e}"));
                break;
            }
            Err(_) => {
                errors.push(format!(
                    "{system}: {timed_out} {:.0} s",
                    limit.as_secs_f64()
                ));
                break;
            }
        }
    }
    Ok((times, rows))
}

/// The first column of a Parquet file, the key a TPC-DS table is placed on.
async fn first_column(path: &str) -> Result<String, BoxError> {
    let df = SessionContext::new()
        .read_parquet(path, ParquetReadOptions::default())
        .await?;
    Ok(df
        .schema()
        .fields()
        .first()
        .ok_or_else(|| format!("{path} has no columns"))?
        .name()
        .clone())
}

fn row_line(t: &QueryTiming) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", a / b),
        _ => "-".to_string(),
    };
    let mut line = format!(
        "{:>5} {:>10} {:>14} {:>10} {:>7} {:>7} {:>7}",
        format!("Q{}", t.query),
        ms(t.gyre_ms),
        ms(t.datafusion_ms),
        ms(t.duckdb_ms),
        ratio(t.gyre_ms, t.datafusion_ms),
        ratio(t.gyre_ms, t.duckdb_ms),
        t.rows
    );
    if !t.same_result && t.gyre_ms.is_some() && t.checked_against.is_some() {
        line.push_str("  RESULT DIFFERS");
    }
    if t.checked_against == Some("Parquet files") {
        line.push_str("  (checked against DataFusion over the Parquet files)");
    }
    for e in &t.errors {
        let first = e.lines().next().unwrap_or_default();
        line.push_str(&format!("  [{first}]"));
    }
    line
}

/// Each query's median time over DataFusion's, for Gyre and DuckDB, with the parity
/// line at 1.
fn plot_svg(r: &Report) -> String {
    let gyre = format!("Gyre, {} workers", r.workers);
    let series = [
        Series {
            name: &gyre,
            color: "#3b6fd4",
        },
        Series {
            name: "DuckDB",
            color: "#e0a030",
        },
    ];
    let shown: Vec<&QueryTiming> = r
        .queries
        .iter()
        .filter(|t| t.gyre_ms.is_some() && t.datafusion_ms.is_some())
        .collect();
    let labels: Vec<String> = shown.iter().map(|t| format!("Q{}", t.query)).collect();
    let values: Vec<Vec<f64>> = shown
        .iter()
        .map(|t| {
            let d = t.datafusion_ms.unwrap_or(f64::NAN);
            vec![
                t.gyre_ms.unwrap_or(0.0) / d,
                t.duckdb_ms.map_or(0.0, |v| v / d),
            ]
        })
        .collect();
    grouped_bars_with_reference(
        &format!(
            "TPC-DS SF {}: median time relative to single-node DataFusion; \
             sums: Gyre {:.2} of DataFusion{}",
            r.scale_factor,
            r.gyre_to_datafusion,
            r.gyre_to_duckdb
                .map(|d| format!(", {d:.2} of DuckDB"))
                .unwrap_or_default()
        ),
        "x DataFusion",
        &series,
        &labels,
        &values,
        Some((1.0, "DataFusion")),
    )
}
