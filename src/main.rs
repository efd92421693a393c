//! The `gyre` command: coordinator, worker, embedded cluster, SQL client, benchmarks.

mod bench;
mod bench_cluster;
mod bench_join;
mod bench_kernels;
mod bench_load;
mod bench_shuffle;
mod bench_tpcds;
mod client;
mod cluster;
mod output;
mod plot;
mod progress_line;
mod python;
mod repl;
mod stats;

use clap::{Args, Parser, Subcommand};
use gyre_cluster::{Coordinator, CoordinatorConfig, LocalCluster, Worker, WorkerConfig};
use gyre_transport::TransportConfig;
use output::Format;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "gyre",
    version,
    about = "Gyre: a distributed in-memory SQL engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a coordinator: plans queries, serves Arrow Flight SQL, keeps the catalog.
    Coordinator {
        /// Flight SQL and worker-control address.
        #[arg(long, default_value = "127.0.0.1:50050")]
        listen: SocketAddr,
        /// Data (exchange) address; port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:0")]
        data_listen: SocketAddr,
        /// Cluster secret every node must share.
        #[arg(long, env = "GYRE_SECRET", default_value = "gyre")]
        secret: String,
    },
    /// Run a worker that joins a coordinator.
    Worker {
        #[arg(long)]
        coordinator: String,
        /// Control address of this worker.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Data (exchange) address; port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:0")]
        data_listen: SocketAddr,
        /// Host name or IP other nodes reach this worker at (default: the listen IP).
        #[arg(long)]
        advertise_host: Option<String>,
        #[arg(long, env = "GYRE_SECRET", default_value = "gyre")]
        secret: String,
        /// Threads of this worker's pool.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
    /// Run a coordinator and N workers in this process (over loopback TCP).
    Local(LocalArgs),
    /// Connect to a coordinator with Flight SQL and run SQL.
    Sql {
        #[arg(long, default_value = "127.0.0.1:50050")]
        connect: String,
        #[command(flatten)]
        input: SqlInput,
    },
    /// Load Parquet, CSV, JSON or Arrow files (a file or a directory) into a distributed table.
    Load {
        #[arg(long, default_value = "127.0.0.1:50050")]
        connect: String,
        /// Name of the new table.
        #[arg(long)]
        table: String,
        /// parquet, csv (with a header), json (one value per line) or arrow.
        #[arg(long, default_value = "parquet")]
        file_format: String,
        /// Hash-place rows on this column (default: as read, in chunks).
        #[arg(long)]
        partition_by: Option<String>,
        /// File or directory (or s3://..., gs://...), readable on every worker.
        path: String,
    },
    /// Emulated cluster on this machine: namespaces, shaped links, CPU quotas (root).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Benchmarks of the communication layer (TPC-H: `gyre local --bench tpch`).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// All-to-all repartition or broadcast between the workers, against the link rate.
    Shuffle(Box<bench_shuffle::ShuffleArgs>),
    /// Distributed join strategies on synthetic (optionally Zipf-skewed) data.
    Join(Box<bench_join::JoinArgs>),
    /// Local join kernels (radix hash, sort-merge) next to DataFusion's hash join.
    Kernels(bench_kernels::KernelArgs),
    /// Loading TPC-H Parquet files: workers reading their own splits, the coordinator
    /// reading every file, single-node DataFusion and DuckDB.
    Load(Box<bench_load::LoadArgs>),
    /// The 99 TPC-DS queries (data and texts from DuckDB's tpcds extension) on an
    /// embedded cluster, next to single-node DataFusion and DuckDB.
    Tpcds(Box<bench_tpcds::TpcdsArgs>),
}

#[derive(Args, Clone)]
struct SqlInput {
    /// SQL to run (several statements separated by semicolons).
    #[arg(short = 'c', long = "command")]
    command: Vec<String>,
    /// File of SQL statements to run.
    #[arg(short = 'f', long = "file")]
    file: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

impl SqlInput {
    /// The `-c` texts, then the contents of the `-f` files, in order.
    fn scripts(&self) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let mut scripts = self.command.clone();
        for f in &self.file {
            scripts.push(
                std::fs::read_to_string(f)
                    .map_err(|e| format!("cannot read {}: {e}", f.display()))?,
            );
        }
        Ok(scripts)
    }
}

#[derive(Args)]
struct LocalArgs {
    /// Number of workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Threads per worker (default: cores / workers, at least 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Generate TPC-H at this scale factor on the workers.
    #[arg(long)]
    tpch: Option<f64>,
    /// Also serve Flight SQL on this address.
    #[arg(long)]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    input: SqlInput,
    /// Run a benchmark instead of SQL: `tpch` (after the -c/-f statements, e.g. settings).
    #[arg(long)]
    bench: Option<String>,
    /// Benchmark: runs per query (the median is reported).
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    /// Benchmark: only these queries (e.g. 1,3,18).
    #[arg(long, value_delimiter = ',')]
    queries: Vec<usize>,
    /// Benchmark: write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Benchmark: draw the results as an SVG plot.
    #[arg(long)]
    plot: Option<PathBuf>,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GYRE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Worker { threads, .. } => *threads,
        _ => std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(cli)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Coordinator {
            listen,
            data_listen,
            secret,
        } => {
            let config = CoordinatorConfig {
                listen,
                data_listen,
                transport: TransportConfig {
                    secret,
                    ..Default::default()
                },
                ..Default::default()
            };
            let coordinator = Coordinator::start(config).await?;
            let listener = tokio::net::TcpListener::bind(listen).await?;
            let addr = gyre_cluster::flight_sql::serve(coordinator, listener);
            println!("gyre coordinator listening on {addr} (Flight SQL: grpc://{addr})");
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
        Command::Worker {
            coordinator,
            listen,
            data_listen,
            advertise_host,
            secret,
            ..
        } => {
            let worker = Worker::start(WorkerConfig {
                coordinator,
                listen,
                data_listen,
                advertise_host,
                transport: TransportConfig {
                    secret,
                    ..Default::default()
                },
            })
            .await?;
            println!(
                "gyre worker {} serving on {}",
                worker.node,
                worker.control_addr()
            );
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
        Command::Local(args) => run_local(args).await,
        Command::Cluster(command) => cluster::run(command),
        Command::Bench(BenchCommand::Shuffle(args)) => bench_shuffle::run(*args).await,
        Command::Bench(BenchCommand::Join(args)) => bench_join::run(*args).await,
        Command::Bench(BenchCommand::Kernels(args)) => bench_kernels::run(args).await,
        Command::Bench(BenchCommand::Load(args)) => bench_load::run(*args).await,
        Command::Bench(BenchCommand::Tpcds(args)) => bench_tpcds::run(*args).await,
        Command::Sql { connect, input } => {
            let client = client::RemoteClient::connect(&connect).await?;
            run_input(&client, &input).await
        }
        Command::Load {
            connect,
            table,
            file_format,
            partition_by,
            path,
        } => {
            let client = client::RemoteClient::connect(&connect).await?;
            let format = file_format.to_ascii_uppercase();
            let mut options = vec![];
            if format == "CSV" {
                options.push("'format.has_header' 'true'".to_string());
            }
            if let Some(c) = partition_by {
                options.push(format!("'gyre.partition_by' '{}'", c.replace('\'', "''")));
            }
            let options = if options.is_empty() {
                String::new()
            } else {
                format!(" OPTIONS ({})", options.join(", "))
            };
            // A local path that exists here is made absolute: the coordinator and the
            // workers resolve relative paths against their own directories.
            let path = match std::fs::canonicalize(&path) {
                Ok(p) if !path.contains("://") => {
                    let dir = p.is_dir();
                    let mut p = p.display().to_string();
                    if dir && !p.ends_with('/') {
                        p.push('/');
                    }
                    p
                }
                _ => path,
            };
            let sql = format!(
                "CREATE EXTERNAL TABLE {table} STORED AS {format} LOCATION '{}'{options}",
                path.replace('\'', "''")
            );
            let results = client::SqlRunner::run(&client, &sql).await?;
            output::print_results(&results, Format::Table)?;
            Ok(())
        }
    }
}

async fn run_local(args: LocalArgs) -> Result<(), Box<dyn std::error::Error>> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = args.threads.unwrap_or((cores / args.workers.max(1)).max(1));
    let listen = args
        .listen
        .unwrap_or_else(|| "127.0.0.1:0".parse().unwrap());
    let cluster = LocalCluster::start(args.workers, threads, listen).await?;
    if args.listen.is_some() {
        println!("Flight SQL: grpc://{}", cluster.addr);
    }
    if let Some(sf) = args.tpch {
        let start = std::time::Instant::now();
        eprintln!("generating TPC-H SF {sf} on {} workers...", args.workers);
        cluster.coordinator.load_tpch(sf).await?;
        eprintln!(
            "TPC-H SF {sf} ready in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
    if let Some(bench) = &args.bench {
        if bench != "tpch" {
            return Err(format!("unknown benchmark '{bench}' (known: tpch)").into());
        }
        // With a benchmark, -c/-f statements (e.g. SET ...) run first, quietly.
        for sql in args.input.scripts()? {
            cluster.coordinator.sql(&sql).await?;
        }
        let options = bench::TpchBenchOptions {
            iterations: args.iterations.max(1),
            queries: if args.queries.is_empty() {
                (1..=22).collect()
            } else {
                args.queries.clone()
            },
            json: args.json.clone(),
            plot: args.plot.clone(),
            workers: args.workers,
            scale_factor: args.tpch.unwrap_or(0.0),
        };
        return bench::run_tpch(&cluster.coordinator, &options).await;
    }
    let runner = client::LocalRunner(Arc::clone(&cluster.coordinator));
    if args.input.command.is_empty() && args.input.file.is_empty() {
        if args.listen.is_some() && !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            // Serving only: keep the cluster up until interrupted.
            tokio::signal::ctrl_c().await?;
            return Ok(());
        }
        return repl::run(&runner, args.input.format).await;
    }
    run_input(&runner, &args.input).await
}

async fn run_input(
    runner: &dyn client::SqlRunner,
    input: &SqlInput,
) -> Result<(), Box<dyn std::error::Error>> {
    if input.command.is_empty() && input.file.is_empty() {
        return repl::run(runner, input.format).await;
    }
    for script in input.scripts()? {
        for stmt in client::split_statements(&script)? {
            let results = runner.run(&stmt).await?;
            output::print_results(&results, input.format)?;
        }
    }
    Ok(())
}
