//! `gyre local --bench tpch`: the 22 TPC-H queries on the embedded cluster
//! next to single-node DataFusion on the same in-memory data, in one run.

use crate::plot::{Series, grouped_bars};
use gyre_cluster::Coordinator;
use gyre_cluster::reference::{canonical_rows, reference_context};
use gyre_cluster::tpch;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

pub struct TpchBenchOptions {
    pub iterations: usize,
    pub queries: Vec<usize>,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub workers: usize,
    pub scale_factor: f64,
}

#[derive(Serialize)]
struct QueryTiming {
    query: usize,
    gyre_ms: f64,
    datafusion_ms: f64,
    ratio: f64,
    rows: usize,
    same_result: bool,
}

#[derive(Serialize)]
struct Report {
    workers: usize,
    scale_factor: f64,
    iterations: usize,
    datafusion_target_partitions: usize,
    queries: Vec<QueryTiming>,
    sum_gyre_ms: f64,
    sum_datafusion_ms: f64,
    ratio_of_sums: f64,
}

pub async fn run_tpch(
    coordinator: &Arc<Coordinator>,
    opts: &TpchBenchOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    if coordinator.table("lineitem").is_none() {
        return Err("no TPC-H data: add --tpch SF".into());
    }
    let partitions = std::thread::available_parallelism().map_or(2, |n| n.get());
    eprintln!("copying the tables into single-node DataFusion ({partitions} partitions)...");
    let reference = reference_context(coordinator, partitions).await?;
    println!(
        "{:>5} {:>12} {:>15} {:>7} {:>8}",
        "query", "gyre ms", "datafusion ms", "ratio", "rows"
    );
    let mut timings = vec![];
    for &q in &opts.queries {
        let statements = tpch::query(q)?;
        let (setup, rest) = statements.split_at(if q == 15 { 1 } else { 0 });
        let (main, teardown) = rest.split_at(1);
        let main = &main[0];
        for s in setup {
            coordinator.sql(s).await?;
            reference.sql(s).await?.collect().await?;
        }
        let mut gyre_times = vec![];
        let mut gyre_rows = vec![];
        for _ in 0..opts.iterations {
            let start = Instant::now();
            let r = coordinator.sql_one(main).await?;
            gyre_times.push(start.elapsed().as_secs_f64() * 1e3);
            gyre_rows = canonical_rows(&r.batches)?;
        }
        let mut df_times = vec![];
        let mut df_rows = vec![];
        for _ in 0..opts.iterations {
            let start = Instant::now();
            let batches = reference.sql(main).await?.collect().await?;
            df_times.push(start.elapsed().as_secs_f64() * 1e3);
            df_rows = canonical_rows(&batches)?;
        }
        for s in teardown {
            coordinator.sql(s).await?;
            reference.sql(s).await?.collect().await?;
        }
        let (g, d) = (median_of(&gyre_times), median_of(&df_times));
        let t = QueryTiming {
            query: q,
            gyre_ms: g,
            datafusion_ms: d,
            ratio: g / d,
            rows: gyre_rows.len(),
            same_result: gyre_rows == df_rows,
        };
        println!(
            "{:>5} {:>12.1} {:>15.1} {:>7.2} {:>8}{}",
            format!("Q{q}"),
            t.gyre_ms,
            t.datafusion_ms,
            t.ratio,
            t.rows,
            if t.same_result {
                ""
            } else {
                "  RESULT DIFFERS"
            }
        );
        timings.push(t);
    }
    let sum_g: f64 = timings.iter().map(|t| t.gyre_ms).sum();
    let sum_d: f64 = timings.iter().map(|t| t.datafusion_ms).sum();
    let report = Report {
        workers: opts.workers,
        scale_factor: opts.scale_factor,
        iterations: opts.iterations,
        datafusion_target_partitions: partitions,
        queries: timings,
        sum_gyre_ms: sum_g,
        sum_datafusion_ms: sum_d,
        ratio_of_sums: sum_g / sum_d,
    };
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(path) = &opts.plot {
        std::fs::write(path, plot_svg(&report))?;
    }
    println!(
        "sum of medians: gyre {:.1} ms ({} workers), datafusion {:.1} ms; ratio {:.2}",
        sum_g, opts.workers, sum_d, report.ratio_of_sums
    );
    if report.queries.iter().any(|t| !t.same_result) {
        return Err("some queries returned different results than DataFusion".into());
    }
    Ok(())
}

/// A grouped bar chart of per-query medians, as SVG.
fn plot_svg(r: &Report) -> String {
    let series = [
        Series {
            name: &format!("Gyre, {} workers", r.workers),
            color: "#3b6fd4",
        },
        Series {
            name: "single-node DataFusion",
            color: "#999",
        },
    ];
    let labels: Vec<String> = r.queries.iter().map(|t| format!("Q{}", t.query)).collect();
    let values: Vec<Vec<f64>> = r
        .queries
        .iter()
        .map(|t| vec![t.gyre_ms, t.datafusion_ms])
        .collect();
    grouped_bars(
        &format!(
            "TPC-H SF {} median times; ratio of the sums {:.2}",
            r.scale_factor, r.ratio_of_sums
        ),
        "ms",
        &series,
        &labels,
        &values,
    )
}

fn median_of(v: &[f64]) -> f64 {
    crate::stats::median(v).unwrap_or(f64::NAN)
}
