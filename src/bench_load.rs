//! `gyre bench load`: TPC-H Parquet files loaded into memory, in one run, by
//! - Gyre with every worker reading its own splits (the default),
//! - Gyre with the coordinator reading every file and sending the rows
//!   (`'gyre.read_on' 'coordinator'`, the path the workers' reads replaced),
//! - single-node DataFusion (`CREATE TABLE AS` over the files, all cores),
//! - DuckDB (`CREATE TABLE AS SELECT * FROM read_parquet(...)`, its Python package),
//! - with `--transactional`, Gyre into a durable transactional table: the workers
//!   read the files, `CREATE TABLE ... WITH (replication = 'partitioned' or
//!   'chunked', as --placement) AS SELECT` copies the rows into the primary's row
//!   store in one transaction logged in pieces and fsynced, and the time ends when
//!   the workers have replayed it and answer a count.
//!
//! Every system loads every table `--repeat` times, the systems taking turns table by
//! table (the one that starts rotates), and the report gives per table the median
//! time. Gyre is driven through Flight SQL, as users drive it. On `--link loopback`
//! the cluster is embedded in this process; with a link rate it is an emulated
//! cluster built for the run (root), where only Gyre's two paths are measured (the
//! others would run outside the hosts' CPU quotas).

use crate::bench_cluster::{BoxError, EmulatedCluster, human_bytes, list, write_outputs};
use crate::client::{RemoteClient, SqlRunner};
use crate::plot::{Series, grouped_bars};
use crate::python::PythonProcess;
use clap::Args;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::{SessionConfig, SessionContext};
use gyre_cluster::{LocalCluster, tpch};
use gyre_testbed::{ClusterName, CpuQuota, LinkRate};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct LoadArgs {
    /// Directory of the TPC-H Parquet files, one directory per table; written first
    /// (at --sf, --files per table) when it holds none.
    #[arg(long, required_unless_present = "from")]
    tpch_parquet: Option<PathBuf>,
    /// Scale factor of the files written.
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Files per table written (region and nation: one each).
    #[arg(long, default_value_t = 4)]
    files: usize,
    /// Workers (embedded, or emulated hosts).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// `loopback` (an embedded cluster in this process) or the link rate of an emulated
    /// cluster (1gbit, 10gbit, ...; root).
    #[arg(long, default_value = "loopback")]
    link: String,
    /// CPU quota of every emulated host (e.g. 0.5).
    #[arg(long)]
    cpus: Option<CpuQuota>,
    /// Placement of the loaded tables: hash (on the first key column, as TPC-H tables
    /// are placed) or chunked; both separated by a comma.
    #[arg(long, default_value = "hash")]
    placement: String,
    /// Loads of each table by each system.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Leave DuckDB out (otherwise its Python package is installed when missing).
    #[arg(long)]
    no_duckdb: bool,
    /// Also load every table into a durable transactional table, logged under a
    /// temporary data directory (loopback only): replicas partitioned by hash with
    /// `--placement hash`, chunked with `chunked`.
    #[arg(long)]
    transactional: bool,
    /// Use the running cluster whose coordinator is at ADDR (Gyre's paths only).
    #[arg(long)]
    connect: Option<String>,
    /// Name of the emulated cluster (namespaces gyre-NAME-*).
    #[arg(long, default_value = "bench")]
    name: ClusterName,
    /// Write the results as JSON (`-`: standard output, nothing else printed there).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the total load time of each system as an SVG bar chart.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Run nothing: print the tables (and write --plot) of a report saved with --json.
    #[arg(long, value_name = "JSON")]
    from: Option<PathBuf>,
}

/// The systems, in the report's order.
const WORKERS: &str = "gyre (workers read)";
const COORDINATOR: &str = "gyre (coordinator reads)";
const DATAFUSION: &str = "datafusion";
const DUCKDB: &str = "duckdb";
const TRANSACTIONAL: &str = "gyre (transactional)";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TableLoad {
    table: String,
    placement: String,
    rows: u64,
    files: usize,
    file_bytes: u64,
    /// Median seconds per system.
    seconds: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LoadReport {
    scale_factor: f64,
    workers: usize,
    link: String,
    cpus: Option<f64>,
    cores: usize,
    repeat: usize,
    loads: Vec<TableLoad>,
}

/// One table's files.
struct TableFiles {
    table: &'static str,
    dir: PathBuf,
    files: usize,
    bytes: u64,
}

pub async fn run(args: LoadArgs) -> Result<(), BoxError> {
    if let Some(path) = &args.from {
        let text = std::fs::read(path).map_err(|e| format!("--from {}: {e}", path.display()))?;
        let report: LoadReport = serde_json::from_slice(&text).map_err(|e| {
            format!(
                "--from {}: not a load benchmark report: {e}",
                path.display()
            )
        })?;
        write_outputs(None, args.plot.as_deref(), &report, plot_svg)?;
        print_report(&report);
        return Ok(());
    }
    let dir = args
        .tpch_parquet
        .as_deref()
        .ok_or("--tpch-parquet DIR is needed")?;
    let tables = ensure_files(dir, args.sf, args.files)?;
    let placements = list(&args.placement);
    if let Some(bad) = placements.iter().find(|p| *p != "hash" && *p != "chunked") {
        return Err(format!("--placement is hash or chunked, not '{bad}'").into());
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let loopback = args.link.eq_ignore_ascii_case("loopback");
    if args.transactional && !loopback {
        return Err("--transactional runs on --link loopback".into());
    }
    let loads = if let Some(addr) = &args.connect {
        let client = RemoteClient::connect(addr).await?;
        measure(&args, &tables, &placements, Some(&client), None, None).await?
    } else if loopback {
        let threads = (cores / args.workers.max(1)).max(1);
        // Transactional tables are logged and fsynced, as under `--data-dir`.
        let data_dir = tempfile::tempdir()?;
        let limits = gyre_cluster::Limits {
            primary: gyre_cluster::PrimaryConfig {
                data_dir: args.transactional.then(|| data_dir.path().to_path_buf()),
                ..Default::default()
            },
            ..Default::default()
        };
        let cluster = LocalCluster::start_limited(
            args.workers,
            threads,
            "127.0.0.1:0".parse().unwrap(),
            &Default::default(),
            &limits,
        )
        .await?;
        let client = RemoteClient::connect(&cluster.addr.to_string()).await?;
        let mut duckdb = if args.no_duckdb {
            None
        } else {
            Some(DuckDb::start(cores)?)
        };
        measure(
            &args,
            &tables,
            &placements,
            Some(&client),
            Some(cores),
            duckdb.as_mut(),
        )
        .await?
    } else {
        emulated(&args).await?
    };
    let report = LoadReport {
        scale_factor: args.sf,
        workers: args.workers,
        link: if args.connect.is_some() {
            "existing cluster".into()
        } else {
            args.link.clone()
        },
        cpus: args.cpus.map(|c| c.cpus()),
        cores,
        repeat: args.repeat,
        loads,
    };
    if !write_outputs(
        args.json.as_deref(),
        args.plot.as_deref(),
        &report,
        plot_svg,
    )? {
        print_report(&report);
    }
    Ok(())
}

/// Runs the Gyre part inside an emulated cluster and returns its measurements.
async fn emulated(args: &LoadArgs) -> Result<Vec<TableLoad>, BoxError> {
    let dir = std::fs::canonicalize(args.tpch_parquet.as_deref().ok_or("no --tpch-parquet")?)?;
    let cluster = EmulatedCluster {
        name: args.name.clone(),
        nodes: args.workers,
        link: args.link.parse::<LinkRate>()?,
        cpus: args.cpus,
        data_roots: vec![dir.clone()],
        encrypt_links: false,
        coordinator_args: vec![],
        log_multicast: None,
    };
    let inner = vec![
        "bench".to_string(),
        "load".into(),
        "--tpch-parquet".into(),
        dir.display().to_string(),
        "--workers".into(),
        args.workers.to_string(),
        "--placement".into(),
        args.placement.clone(),
        "--repeat".into(),
        args.repeat.to_string(),
    ];
    let (_, stdout) = cluster.run("gyre bench load", false, inner).await?;
    let report: LoadReport = serde_json::from_slice(&stdout)?;
    Ok(report.loads)
}

/// Loads every table with every system `--repeat` times.
async fn measure(
    args: &LoadArgs,
    tables: &[TableFiles],
    placements: &[String],
    gyre: Option<&RemoteClient>,
    datafusion_partitions: Option<usize>,
    mut duckdb: Option<&mut DuckDb>,
) -> Result<Vec<TableLoad>, BoxError> {
    let mut systems = vec![];
    if gyre.is_some() {
        systems.extend([WORKERS, COORDINATOR]);
        if args.transactional {
            systems.push(TRANSACTIONAL);
        }
    }
    if datafusion_partitions.is_some() {
        systems.push(DATAFUSION);
    }
    if duckdb.is_some() {
        systems.push(DUCKDB);
    }
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut out = vec![];
    for placement in placements {
        for t in tables {
            let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
            let mut rows: BTreeMap<&str, u64> = BTreeMap::new();
            for r in 0..args.repeat.max(1) {
                for k in 0..systems.len() {
                    let system = systems[(k + r) % systems.len()];
                    if terminal {
                        eprint!(
                            "\r\x1b[2K{} ({placement}), run {} of {}: {system}",
                            t.table,
                            r + 1,
                            args.repeat
                        );
                    }
                    let (seconds, n) = match system {
                        WORKERS | COORDINATOR => {
                            let client = gyre.ok_or("no cluster")?;
                            load_gyre(client, t, placement, system == COORDINATOR).await?
                        }
                        TRANSACTIONAL => {
                            load_transactional(gyre.ok_or("no cluster")?, t, placement).await?
                        }
                        DATAFUSION => {
                            load_datafusion(t, datafusion_partitions.unwrap_or(1)).await?
                        }
                        _ => duckdb.as_deref_mut().ok_or("no DuckDB")?.load(t)?,
                    };
                    times.entry(system).or_default().push(seconds);
                    if let Some(prev) = rows.insert(system, n)
                        && prev != n
                    {
                        return Err(format!(
                            "{system} loaded {n} rows of {}, then {prev}",
                            t.table
                        )
                        .into());
                    }
                }
            }
            let counts: Vec<u64> = rows.values().copied().collect();
            if counts.windows(2).any(|w| w[0] != w[1]) {
                return Err(format!(
                    "the systems loaded different row counts of {}: {rows:?}",
                    t.table
                )
                .into());
            }
            out.push(TableLoad {
                table: t.table.to_string(),
                placement: placement.clone(),
                rows: counts.first().copied().unwrap_or(0),
                files: t.files,
                file_bytes: t.bytes,
                seconds: times
                    .into_iter()
                    .map(|(s, v)| (s.to_string(), crate::stats::median(&v).unwrap_or(f64::NAN)))
                    .collect(),
            });
        }
    }
    if terminal {
        eprint!("\r\x1b[2K");
    }
    Ok(out)
}

/// The first number of a one-row result.
fn first_number(results: &[gyre_cluster::coordinator::StatementResult]) -> Option<u64> {
    let batch = results.last()?.batches.first()?;
    let col = batch.column(0);
    let text = arrow::util::display::array_value_to_string(col, 0).ok()?;
    text.parse().ok()
}

async fn load_gyre(
    client: &RemoteClient,
    t: &TableFiles,
    placement: &str,
    on_coordinator: bool,
) -> Result<(f64, u64), BoxError> {
    client
        .run(&format!("DROP TABLE IF EXISTS {}", t.table))
        .await?;
    let start = Instant::now();
    load_into(client, t, placement, on_coordinator).await?;
    let seconds = start.elapsed().as_secs_f64();
    let counted = client
        .run(&format!("SELECT count(*) FROM {}", t.table))
        .await?;
    let rows = first_number(&counted).ok_or("the count returned no number")?;
    client.run(&format!("DROP TABLE {}", t.table)).await?;
    Ok((seconds, rows))
}

/// `CREATE EXTERNAL TABLE` of the table's files, placed so and read so.
async fn load_into(
    client: &RemoteClient,
    t: &TableFiles,
    placement: &str,
    on_coordinator: bool,
) -> Result<(), BoxError> {
    let mut options = vec![];
    if placement == "hash" {
        let key = tpch::primary_key(t.table).ok_or("not a TPC-H table")?;
        options.push(format!("'gyre.partition_by' '{key}'"));
    }
    if on_coordinator {
        options.push("'gyre.read_on' 'coordinator'".into());
    }
    let options = if options.is_empty() {
        String::new()
    } else {
        format!(" OPTIONS ({})", options.join(", "))
    };
    let sql = format!(
        "CREATE EXTERNAL TABLE {} STORED AS PARQUET LOCATION '{}/'{options}",
        t.table,
        t.dir.display()
    );
    client.run(&sql).await?;
    Ok(())
}

/// The files into the workers, then into a transactional table on the primary, until
/// the workers have replayed it: the seconds and the rows the replicas hold.
async fn load_transactional(
    client: &RemoteClient,
    t: &TableFiles,
    placement: &str,
) -> Result<(f64, u64), BoxError> {
    let durable = format!("{}_durable", t.table);
    client
        .run(&format!("DROP TABLE IF EXISTS {durable}"))
        .await?;
    let start = Instant::now();
    load_into(client, t, placement, false).await?;
    let replication = match placement {
        "chunked" => "chunked",
        _ => "partitioned",
    };
    client
        .run(&format!(
            "CREATE TABLE {durable} WITH (replication = '{replication}') AS SELECT * FROM {}",
            t.table
        ))
        .await?;
    let counted = client
        .run(&format!("SELECT count(*) FROM {durable}"))
        .await?;
    let seconds = start.elapsed().as_secs_f64();
    let rows = first_number(&counted).ok_or("the count returned no number")?;
    client.run(&format!("DROP TABLE {}", t.table)).await?;
    client.run(&format!("DROP TABLE {durable}")).await?;
    Ok((seconds, rows))
}

async fn load_datafusion(t: &TableFiles, partitions: usize) -> Result<(f64, u64), BoxError> {
    let ctx = SessionContext::new_with_config(
        SessionConfig::new().with_target_partitions(partitions.max(1)),
    );
    let start = Instant::now();
    ctx.sql(&format!(
        "CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION '{}/'",
        t.dir.display()
    ))
    .await?;
    ctx.sql("CREATE TABLE mem AS SELECT * FROM src")
        .await?
        .collect()
        .await?;
    let seconds = start.elapsed().as_secs_f64();
    let n = ctx.sql("SELECT count(*) FROM mem").await?.collect().await?;
    let rows = arrow::util::display::array_value_to_string(n[0].column(0), 0)?.parse()?;
    Ok((seconds, rows))
}

/// A Python process with DuckDB that loads tables on request and answers with the time.
struct DuckDb(PythonProcess);

const DUCKDB_LOADER: &str = r#"
import sys, time, duckdb
con = duckdb.connect()
con.execute(f"SET threads = {int(sys.argv[1])}")
for line in sys.stdin:
    table, path = line.rstrip("\n").split("\t")
    start = time.perf_counter()
    con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM read_parquet('{path}/*.parquet')")
    seconds = time.perf_counter() - start
    rows = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    con.execute(f"DROP TABLE {table}")
    print(f"{seconds}\t{rows}", flush=True)
"#;

impl DuckDb {
    fn start(threads: usize) -> Result<Self, BoxError> {
        PythonProcess::start(DUCKDB_LOADER, &[threads.to_string()])
            .map(Self)
            .map_err(|e| format!("{e} (or pass --no-duckdb)").into())
    }

    fn load(&mut self, t: &TableFiles) -> Result<(f64, u64), BoxError> {
        let line = self
            .0
            .request(&format!("{}\t{}", t.table, t.dir.display()))?;
        let (seconds, rows) = line
            .trim()
            .split_once('\t')
            .ok_or_else(|| format!("DuckDB failed to load {} ({line:?})", t.table))?;
        Ok((seconds.parse()?, rows.parse()?))
    }
}

/// The tables' files in `dir`, written first if there are none.
fn ensure_files(dir: &Path, sf: f64, files: usize) -> Result<Vec<TableFiles>, BoxError> {
    let mut out = vec![];
    for table in tpch::TABLES {
        let tdir = dir.join(table);
        let existing = parquet_files(&tdir);
        if existing.is_empty() {
            write_table(&tdir, table, sf, files)?;
        }
        let found = parquet_files(&tdir);
        let bytes = found
            .iter()
            .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        out.push(TableFiles {
            table,
            dir: std::fs::canonicalize(&tdir)?,
            files: found.len(),
            bytes,
        });
    }
    Ok(out)
}

fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    files
}

/// Writes `table` at scale factor `sf` as `parts` Parquet files (Snappy, row groups of
/// 122,880 rows, as DuckDB writes them).
fn write_table(dir: &Path, table: &str, sf: f64, parts: usize) -> Result<(), BoxError> {
    std::fs::create_dir_all(dir)?;
    let parts = if matches!(table, "region" | "nation") {
        1
    } else {
        parts.max(1)
    };
    eprintln!(
        "writing TPC-H SF {sf} {table} as {parts} Parquet files in {}...",
        dir.display()
    );
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(122_880))
        .build();
    for part in 0..parts {
        let path = dir.join(format!("part-{part}.parquet"));
        let tmp = dir.join(format!(".part-{part}.parquet.tmp"));
        let schema = tpch::schema(table)?;
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&tmp)?, schema, Some(props.clone()))?;
        for batch in tpch::generate(table, sf, part, parts)? {
            w.write(&batch?)?;
        }
        w.close()?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

/// Seconds of every system over all tables of a placement (NaN where it did not run).
fn totals(r: &LoadReport, placement: &str) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for l in r.loads.iter().filter(|l| l.placement == placement) {
        for (s, v) in &l.seconds {
            *sums.entry(s.clone()).or_default() += v;
        }
    }
    sums
}

fn placements(r: &LoadReport) -> Vec<String> {
    let mut p: Vec<String> = r.loads.iter().map(|l| l.placement.clone()).collect();
    p.dedup();
    p
}

fn print_report(r: &LoadReport) {
    let systems = [WORKERS, COORDINATOR, TRANSACTIONAL, DATAFUSION, DUCKDB];
    println!(
        "TPC-H SF {} Parquet into memory: {} workers, link {}{}, {} cores; median of {} loads",
        r.scale_factor,
        r.workers,
        r.link,
        r.cpus
            .map(|c| format!(", {c} CPU per host"))
            .unwrap_or_default(),
        r.cores,
        r.repeat
    );
    for placement in placements(r) {
        println!("\nplacement: {placement}");
        print!(
            "{:<10} {:>10} {:>6} {:>10}",
            "table", "rows", "files", "size"
        );
        for s in systems {
            print!(" {:>24}", format!("{s} s"));
        }
        println!();
        let loads: Vec<&TableLoad> = r
            .loads
            .iter()
            .filter(|l| l.placement == placement)
            .collect();
        for l in &loads {
            print!(
                "{:<10} {:>10} {:>6} {:>10}",
                l.table,
                l.rows,
                l.files,
                human_bytes(l.file_bytes as f64)
            );
            for s in systems {
                match l.seconds.get(s) {
                    Some(v) => print!(" {v:>24.3}"),
                    None => print!(" {:>24}", "-"),
                }
            }
            println!();
        }
        let sums = totals(r, &placement);
        let rows: u64 = loads.iter().map(|l| l.rows).sum();
        let bytes: u64 = loads.iter().map(|l| l.file_bytes).sum();
        print!(
            "{:<10} {:>10} {:>6} {:>10}",
            "total",
            rows,
            "",
            human_bytes(bytes as f64)
        );
        for s in systems {
            match sums.get(s) {
                Some(v) => print!(" {v:>24.3}"),
                None => print!(" {:>24}", "-"),
            }
        }
        println!();
        for s in systems {
            if let Some(v) = sums.get(s) {
                println!(
                    "  {s:<26} {:>8.2} M rows/s {:>8.1} MB/s of Parquet",
                    rows as f64 / v / 1e6,
                    bytes as f64 / v / 1e6
                );
            }
        }
        let ratio = |a: &str, b: &str| Some(sums.get(a)? / sums.get(b)?);
        if let Some(x) = ratio(COORDINATOR, WORKERS) {
            println!("  coordinator reads / workers read: {x:.2}x the time");
        }
        if let Some(x) = ratio(WORKERS, DUCKDB) {
            println!("  workers read / DuckDB: {x:.2}x the time");
        }
        if let Some(x) = ratio(WORKERS, DATAFUSION) {
            println!("  workers read / single-node DataFusion: {x:.2}x the time");
        }
        if let Some(x) = ratio(TRANSACTIONAL, WORKERS) {
            println!("  transactional / workers read: {x:.2}x the time");
        }
    }
}

fn plot_svg(r: &LoadReport) -> String {
    let all = [
        (WORKERS, "#3b6fd4"),
        (COORDINATOR, "#9ab3e8"),
        (TRANSACTIONAL, "#2a9d8f"),
        (DATAFUSION, "#999"),
        (DUCKDB, "#e0a030"),
    ];
    let ran: Vec<(&str, &str)> = all
        .into_iter()
        .filter(|(s, _)| r.loads.iter().any(|l| l.seconds.contains_key(*s)))
        .collect();
    let series: Vec<Series> = ran
        .iter()
        .map(|(name, color)| Series { name, color })
        .collect();
    let mut labels = vec![];
    let mut values = vec![];
    for placement in placements(r) {
        let sums = totals(r, &placement);
        labels.push(format!("all tables, {placement}"));
        values.push(
            ran.iter()
                .map(|(s, _)| sums.get(*s).copied().unwrap_or(f64::NAN))
                .collect(),
        );
        for l in r
            .loads
            .iter()
            .filter(|l| l.placement == placement && l.table == "lineitem")
        {
            labels.push(format!("lineitem, {placement}"));
            values.push(
                ran.iter()
                    .map(|(s, _)| l.seconds.get(*s).copied().unwrap_or(f64::NAN))
                    .collect(),
            );
        }
    }
    grouped_bars(
        &format!(
            "Loading TPC-H SF {} Parquet into memory: {} workers, link {} (median of {})",
            r.scale_factor, r.workers, r.link, r.repeat
        ),
        "seconds",
        &series,
        &labels,
        &values,
    )
}
