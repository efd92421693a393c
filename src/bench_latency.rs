//! `gyre bench latency`: what a small query costs, end to end. Each query runs in turn
//! through Flight SQL (as clients run it), on the coordinator in process (the same
//! query without the client protocol) and on single-node DataFusion in process over the
//! same in-memory rows. The difference between the first two is the protocol's share;
//! between the second and DataFusion, the distributed engine's per-query fixed cost
//! (planning the stages, starting them on the workers, exchanges, ending the query).
//!
//! The three systems alternate within each iteration, so machine noise falls on all
//! of them alike; every answer is checked against DataFusion's.

use crate::bench_cluster::{BoxError, write_outputs};
use crate::client::RemoteClient;
use crate::plot::{Series, grouped_bars};
use crate::stats::median;
use clap::Args;
use datafusion::arrow::array::RecordBatch;
use datafusion::prelude::{SessionConfig, SessionContext};
use gyre_cluster::LocalCluster;
use gyre_cluster::reference::{canonical_rows, copy_tables};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct LatencyArgs {
    /// Embedded workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Threads per worker (default: cores / workers, at least 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Rows of the fact table (hash-placed on its key).
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Timed runs of each query by each system (after a tenth as many untimed).
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Only these queries, by number: 1 SELECT 1, 2 point lookup, 3 count(*), 4 small
    /// star join.
    #[arg(long, value_delimiter = ',')]
    queries: Vec<usize>,
    /// Write the results as JSON (`-`: standard output, nothing else printed there).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the medians as an SVG bar chart.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// The queries: `{key}` is a different key of the fact table in each run.
const QUERIES: &[(&str, &str)] = &[
    ("SELECT 1", "SELECT 1"),
    ("point lookup", "SELECT * FROM facts WHERE id = {key}"),
    ("count(*)", "SELECT count(*) FROM facts"),
    (
        "small star join",
        "SELECT d.name, count(*), sum(f.v) FROM facts f JOIN dims d ON f.g = d.g \
         WHERE f.id < 5000 GROUP BY d.name",
    ),
];

#[derive(Serialize)]
struct Timing {
    query: &'static str,
    /// Medians and 90th percentiles (ms).
    flight_sql_ms: f64,
    flight_sql_p90_ms: f64,
    in_process_ms: f64,
    in_process_p90_ms: f64,
    datafusion_ms: f64,
    datafusion_p90_ms: f64,
    /// Median Flight SQL time over median DataFusion time.
    flight_sql_to_datafusion: f64,
}

#[derive(Serialize)]
struct Report {
    workers: usize,
    threads_per_worker: usize,
    rows: u64,
    iterations: usize,
    datafusion_target_partitions: usize,
    queries: Vec<Timing>,
}

/// The value below which `p` of `v` lie (nearest rank); 0 for no values.
fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

async fn timed<F, E>(times: &mut Vec<f64>, run: F) -> Result<Vec<RecordBatch>, BoxError>
where
    F: std::future::Future<Output = Result<Vec<RecordBatch>, E>>,
    E: Into<BoxError>,
{
    let start = Instant::now();
    let batches = run.await.map_err(Into::into)?;
    times.push(start.elapsed().as_secs_f64() * 1e3);
    Ok(batches)
}

pub async fn run(args: LatencyArgs) -> Result<(), BoxError> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = args.threads.unwrap_or((cores / args.workers.max(1)).max(1));
    let quiet = args.json.as_deref() == Some(std::path::Path::new("-"));
    let say = |s: String| {
        if quiet {
            eprintln!("{s}")
        } else {
            println!("{s}")
        }
    };
    let rows = args.rows.max(1);
    let cluster = LocalCluster::start(args.workers, threads, "127.0.0.1:0".parse()?).await?;
    let c = &cluster.coordinator;
    c.sql(&format!(
        "CREATE TABLE facts (id BIGINT, g BIGINT, v BIGINT) PARTITION BY id; \
         INSERT INTO facts SELECT value, value % 100, value * 7 % 1000 \
         FROM generate_series(0, {}) AS t(value); \
         CREATE TABLE dims AS SELECT value AS g, concat('name', value % 10) AS name \
         FROM generate_series(0, 99) AS t(value)",
        rows - 1
    ))
    .await?;
    let client = RemoteClient::connect(&cluster.addr.to_string()).await?;
    let reference =
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(cores));
    copy_tables(c, &reference, cores).await?;
    eprintln!(
        "{rows} rows on {} workers; {} runs of each query by each system",
        args.workers, args.iterations
    );

    say(format!(
        "{:<16} {:>12} {:>12} {:>14} {:>9}",
        "query", "flight ms", "in-proc ms", "datafusion ms", "flt/df"
    ));
    let warm = (args.iterations / 10).max(1);
    let mut timings = vec![];
    for (number, (name, text)) in QUERIES.iter().enumerate() {
        if !args.queries.is_empty() && !args.queries.contains(&(number + 1)) {
            continue;
        }
        let (mut flight, mut local, mut df) = (vec![], vec![], vec![]);
        for i in 0..warm + args.iterations {
            let key = (i as u64).wrapping_mul(7919).wrapping_add(13) % rows;
            let sql = text.replace("{key}", &key.to_string());
            let (mut f, mut l, mut d) = (vec![], vec![], vec![]);
            let via_flight = timed(&mut f, client.query(&sql)).await?;
            let in_process =
                timed(&mut l, async { c.sql_one(&sql).await.map(|r| r.batches) }).await?;
            let expected =
                timed(&mut d, async { reference.sql(&sql).await?.collect().await }).await?;
            let expected = canonical_rows(&expected)?;
            for (system, got) in [("Flight SQL", via_flight), ("in process", in_process)] {
                if canonical_rows(&got)? != expected {
                    return Err(
                        format!("{name} ({sql}): Gyre {system} differs from DataFusion").into(),
                    );
                }
            }
            if i >= warm {
                flight.extend(f);
                local.extend(l);
                df.extend(d);
            }
        }
        let m = |v: &[f64]| median(v).unwrap_or(0.0);
        let t = Timing {
            query: name,
            flight_sql_ms: m(&flight),
            flight_sql_p90_ms: percentile(&flight, 0.9),
            in_process_ms: m(&local),
            in_process_p90_ms: percentile(&local, 0.9),
            datafusion_ms: m(&df),
            datafusion_p90_ms: percentile(&df, 0.9),
            flight_sql_to_datafusion: m(&flight) / m(&df),
        };
        say(format!(
            "{:<16} {:>12.3} {:>12.3} {:>14.3} {:>9.2}",
            t.query, t.flight_sql_ms, t.in_process_ms, t.datafusion_ms, t.flight_sql_to_datafusion
        ));
        timings.push(t);
    }
    let report = Report {
        workers: args.workers,
        threads_per_worker: threads,
        rows,
        iterations: args.iterations,
        datafusion_target_partitions: cores,
        queries: timings,
    };
    write_outputs(
        args.json.as_deref(),
        args.plot.as_deref(),
        &report,
        plot_svg,
    )?;
    Ok(())
}

fn plot_svg(r: &Report) -> String {
    let series = [
        Series {
            name: "Gyre through Flight SQL",
            color: "#4c72b0",
        },
        Series {
            name: "Gyre's coordinator in process",
            color: "#8fb0dd",
        },
        Series {
            name: "single-node DataFusion in process",
            color: "#dd8452",
        },
    ];
    let labels: Vec<String> = r.queries.iter().map(|q| q.query.to_string()).collect();
    let values: Vec<Vec<f64>> = r
        .queries
        .iter()
        .map(|q| vec![q.flight_sql_ms, q.in_process_ms, q.datafusion_ms])
        .collect();
    grouped_bars(
        &format!(
            "Median time of a small query ({} workers, {} fact rows)",
            r.workers, r.rows
        ),
        "ms",
        &series,
        &labels,
        &values,
    )
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.9), 9.0);
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 1.0), 10.0);
        assert_eq!(percentile(&[3.0], 0.9), 3.0);
        assert_eq!(percentile(&[], 0.9), 0.0);
    }
}
