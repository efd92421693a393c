//! The `gyre` command: coordinator, worker, embedded cluster, SQL client, benchmarks.

mod bench;
mod bench_assign;
mod bench_chbench;
mod bench_cluster;
mod bench_failover;
mod bench_fragments;
mod bench_join;
mod bench_kernels;
mod bench_latency;
mod bench_load;
mod bench_replay;
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
use gyre_cluster::{Coordinator, CoordinatorConfig, LocalCluster, WorkerConfig};
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
        #[command(flatten)]
        secret: SecretArgs,
        #[command(flatten)]
        links: LinkArgs,
        #[command(flatten)]
        front: FrontDoorArgs,
        /// Run at most N queries at once; later ones wait their turn.
        #[arg(long, value_name = "N")]
        max_concurrent_queries: Option<usize>,
        #[command(flatten)]
        files: DataRootArgs,
        #[command(flatten)]
        primary: PrimaryArgs,
        /// Vote on the primary with other coordinators (three or five): each voter's
        /// client address (its --listen) and Raft address, CLIENT/RAFT, comma-separated,
        /// in the same order on every voter. The elected one is the primary; a commit is
        /// acknowledged once a majority has it on disk. Needs --data-dir.
        #[arg(long, value_name = "LIST", requires = "data_dir")]
        voters: Option<String>,
        #[command(flatten)]
        host: HostShuffleArgs,
    },
    /// Run a worker that joins a coordinator.
    Worker {
        /// The coordinator's address, or the voting coordinators' client addresses,
        /// comma-separated: the worker joins the primary, and the next one elected.
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
        #[command(flatten)]
        secret: SecretArgs,
        #[command(flatten)]
        links: LinkArgs,
        /// Threads of this worker's pool.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// The CA certificate (PEM) of a coordinator that serves TLS.
        #[arg(long)]
        tls_ca: Option<PathBuf>,
        /// Memory the worker's queries may hold in operator state (e.g. 4G, 512M):
        /// sorts and aggregations spill beyond it, other operators fail.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        memory_limit: Option<usize>,
        #[command(flatten)]
        files: DataRootArgs,
        #[command(flatten)]
        multicast: LogMulticastArgs,
        #[command(flatten)]
        host: HostShuffleArgs,
    },
    /// Run a coordinator and N workers in this process (over loopback TCP).
    Local(Box<LocalArgs>),
    /// Connect to a coordinator with Flight SQL and run SQL.
    Sql {
        #[command(flatten)]
        connect: ConnectArgs,
        #[command(flatten)]
        input: SqlInput,
    },
    /// Load Parquet, CSV, JSON or Arrow files (a file or a directory) into a distributed table.
    Load {
        #[command(flatten)]
        connect: ConnectArgs,
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
    /// Print the users-file line (name:argon2 hash) for NAME with a password read from
    /// stdin (asked for on a terminal).
    Passwd { name: String },
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
    /// Neo-Join's planning: MILP and greedy partition assignment and the open-shop
    /// schedule on synthetic histograms (time, busiest link against hash placement).
    Assign(Box<bench_assign::AssignArgs>),
    /// Loading TPC-H Parquet files: workers reading their own splits, the coordinator
    /// reading every file, single-node DataFusion and DuckDB.
    Load(Box<bench_load::LoadArgs>),
    /// The 99 TPC-DS queries (data and texts from DuckDB's tpcds extension) on an
    /// embedded cluster, next to single-node DataFusion and DuckDB.
    Tpcds(Box<bench_tpcds::TpcdsArgs>),
    /// What a small query costs end to end (SELECT 1, a point lookup, a count, a small
    /// join): through Flight SQL, on the coordinator in process, and on single-node
    /// DataFusion.
    Latency(Box<bench_latency::LatencyArgs>),
    /// ScyPer's redo log on TPC-C: bytes per transaction (logical and physical, LZ4),
    /// and a secondary's replay time against the original execution.
    Replay(Box<bench_replay::ReplayArgs>),
    /// ScyPer's mixed workload (CH-benCHmark): TPC-C terminals on the primary while
    /// analytical streams run CH queries on the secondaries' snapshots.
    Chbench(Box<bench_chbench::ChbenchArgs>),
    /// Failover of voting coordinators: kill -9 of the primary to the first commit on
    /// the next, round after round, every acknowledged row checked at the end.
    Failover(Box<bench_failover::FailoverArgs>),
    /// A table fragmented by rendezvous hashing (WITH (replicas = x)): a worker killed
    /// during a join (which runs again on the others), then a new one joining.
    Fragments(Box<bench_fragments::FragmentsArgs>),
}

/// How the nodes of a cluster talk to each other.
#[derive(Args, Clone, Copy)]
struct LinkArgs {
    /// Encrypt and authenticate everything sent between nodes on data links (AES-256-GCM
    /// under keys agreed per connection); every node of the cluster needs the same setting.
    #[arg(
        long,
        env = "GYRE_ENCRYPT_LINKS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    encrypt_links: bool,
}

/// The cluster secret every node shares: from a file, or from GYRE_SECRET. Never an
/// argument (other users see command lines in /proc), and no default.
#[derive(Args, Clone)]
struct SecretArgs {
    /// A file holding the cluster secret (else GYRE_SECRET).
    #[arg(long)]
    secret_file: Option<PathBuf>,
}

/// A secret shorter than this is refused: it could be guessed.
const MIN_SECRET_LEN: usize = 16;

impl SecretArgs {
    fn secret(&self) -> Result<String, Box<dyn std::error::Error>> {
        let (secret, origin) = match &self.secret_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?;
                (
                    text.trim_end_matches(['\n', '\r']).to_string(),
                    path.display().to_string(),
                )
            }
            None => match std::env::var("GYRE_SECRET") {
                Ok(s) => (s, "GYRE_SECRET".to_string()),
                Err(_) => {
                    return Err(
                        "no cluster secret: give --secret-file FILE or set GYRE_SECRET \
                                (the same on every node)"
                            .into(),
                    );
                }
            },
        };
        if secret.len() < MIN_SECRET_LEN {
            return Err(format!(
                "the cluster secret in {origin} is shorter than {MIN_SECRET_LEN} characters"
            )
            .into());
        }
        Ok(secret)
    }
}

/// Who may use a coordinator's Flight SQL port (`gyre coordinator`, `gyre local`).
#[derive(Args, Clone, Default)]
struct FrontDoorArgs {
    /// Users who may log in: one `name:hash` line each (`gyre passwd NAME` prints one).
    #[arg(long)]
    users: Option<PathBuf>,
    /// Serve clients without logins on an address other hosts can reach.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Serve TLS with this certificate chain (PEM).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl FrontDoorArgs {
    /// The front door for a listener on `listen`. A listener other hosts can reach
    /// needs users, unless the operator says otherwise.
    fn front_door(
        &self,
        listen: SocketAddr,
    ) -> Result<gyre_cluster::flight_sql::FrontDoor, Box<dyn std::error::Error>> {
        let users = match &self.users {
            Some(path) => Some(Arc::new(gyre_cluster::auth::Users::load(path)?)),
            None => None,
        };
        if users.is_none() && !listen.ip().is_loopback() && !self.insecure_no_auth {
            return Err(format!(
                "refusing to serve {listen} without logins: anyone who reaches it could run any \
                 SQL. Give --users FILE (lines from `gyre passwd NAME`), listen on a loopback \
                 address, or pass --insecure-no-auth"
            )
            .into());
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(gyre_cluster::auth::TlsIdentity::load(cert, key)?),
            _ => None,
        };
        if users.is_some() && tls.is_none() && !listen.ip().is_loopback() {
            eprintln!(
                "warning: {listen} serves logins without TLS: passwords and tokens cross the \
                 network in clear text (add --tls-cert FILE --tls-key FILE)"
            );
        }
        Ok(gyre_cluster::flight_sql::FrontDoor { users, tls })
    }
}

/// Where a node may read and write local files.
#[derive(Args, Clone, Default)]
struct DataRootArgs {
    /// Read and write local files (LOCATION, COPY TO, gyre load) only inside this
    /// directory (repeatable). Without it, a node other hosts can reach reads and writes
    /// no local files; one on a loopback address reads and writes any.
    #[arg(long = "data-root", value_name = "DIR")]
    data_roots: Vec<PathBuf>,
}

impl DataRootArgs {
    fn local_files(
        &self,
        listen: SocketAddr,
    ) -> Result<gyre_cluster::files::LocalFiles, Box<dyn std::error::Error>> {
        Ok(gyre_cluster::files::LocalFiles::for_listener(
            listen.ip(),
            &self.data_roots,
        )?)
    }
}

/// Where the coordinator keeps its transactional tables and how it logs them.
#[derive(Args, Clone, Default)]
struct PrimaryArgs {
    /// Keep the transactional tables (`WITH (replication = 'full')`) under this
    /// directory: a redo log and checkpoints, recovered on start. Without it they live
    /// in memory only.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Log stored procedures by name and arguments (`logical`) or every transaction by
    /// its row changes (`physical`).
    #[arg(long = "log", default_value = "logical", value_parser = ["logical", "physical"])]
    log_mode: String,
    /// fsync each transaction before the next runs, instead of sharing fsyncs.
    #[arg(long)]
    no_group_commit: bool,
    #[command(flatten)]
    multicast: LogMulticastArgs,
}

/// Where the primary's log is multicast to the workers (each log group crosses the
/// network once); without it, each worker receives the log on a stream of its own.
#[derive(Args, Clone)]
struct LogMulticastArgs {
    /// The IPv4 multicast group and port of the log, e.g. 239.255.7.1:7400 (the
    /// coordinator and every worker must be given the same).
    #[arg(long, value_name = "GROUP:PORT")]
    log_multicast: Option<std::net::SocketAddrV4>,
    /// The local interface address to send and receive the multicast on.
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    log_interface: std::net::Ipv4Addr,
}

impl Default for LogMulticastArgs {
    fn default() -> Self {
        Self {
            log_multicast: None,
            log_interface: std::net::Ipv4Addr::LOCALHOST,
        }
    }
}

impl LogMulticastArgs {
    fn group(&self) -> Option<gyre_replica::ship::Group> {
        self.log_multicast.map(|group| gyre_replica::ship::Group {
            group,
            interface: self.log_interface,
        })
    }
}

impl PrimaryArgs {
    fn config(&self) -> gyre_cluster::PrimaryConfig {
        gyre_cluster::PrimaryConfig {
            data_dir: self.data_dir.clone(),
            log_mode: self.log_mode.parse().expect("checked by clap"),
            group_commit: !self.no_group_commit,
            // TPC-C's loaders and transactions (`CALL tpcc_new_order(...)`); a program
            // embedding the cluster registers its own.
            procedures: gyre_tpcc::procedures(),
            log_multicast: self.multicast.group(),
            ..Default::default()
        }
    }
}

/// How `gyre sql` and `gyre load` reach a coordinator.
#[derive(Args, Clone)]
struct ConnectArgs {
    /// The coordinator's Flight SQL address (host:port, grpc://host:port or
    /// grpc+tls://host:port); several, separated by commas, are tried in order until
    /// one answers.
    #[arg(long, default_value = "127.0.0.1:50050")]
    connect: String,
    /// Log in as this user; the password comes from GYRE_PASSWORD or a prompt.
    #[arg(long)]
    user: Option<String>,
    /// Speak TLS, trusting the CA certificate (PEM) in this file.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

impl ConnectArgs {
    async fn connect(&self) -> Result<client::RemoteClient, Box<dyn std::error::Error>> {
        let password = match &self.user {
            None => None,
            Some(user) => Some(match std::env::var("GYRE_PASSWORD") {
                Ok(p) => p,
                Err(_) => rpassword::prompt_password(format!("Password for {user}: "))
                    .map_err(|e| format!("cannot read the password: {e}"))?,
            }),
        };
        let tls_ca = match &self.tls_ca {
            Some(p) => Some(
                std::fs::read(p)
                    .map_err(|e| format!("cannot read the CA certificate {}: {e}", p.display()))?,
            ),
            None => None,
        };
        let login = client::Login {
            user: self.user.clone(),
            password,
            tls_ca,
        };
        let addrs: Vec<&str> = self
            .connect
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        let mut failures = vec![];
        for addr in &addrs {
            let connected = client::RemoteClient::connect_with(addr, &login).await;
            // Of several coordinators, only the primary answers; the others name it.
            let connected = match connected {
                Ok(client) if addrs.len() > 1 => match client.probe().await {
                    Ok(()) => Ok(client),
                    Err(e) => Err(format!("{addr}: {e}").into()),
                },
                connected => connected,
            };
            match connected {
                Ok(client) => return Ok(client),
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(match failures.len() {
            0 => "--connect names no address".into(),
            1 => failures.remove(0).into(),
            _ => format!("no coordinator answered: {}", failures.join("; ")).into(),
        })
    }
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
    /// After each statement of -c and -f, print how long it took, results fetched
    /// (`Time: 12.345 ms`, as psql's \timing).
    #[arg(long)]
    timing: bool,
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

/// Nodes of one host in processes of their own that exchange over shared memory.
#[derive(Args, Debug, Clone)]
struct HostShuffleArgs {
    /// Let sessions exchange over the shared-memory carrier (`SET gyre.shuffle_design`)
    /// with the other nodes started with the same directory on this host (on tmpfs,
    /// e.g. /dev/shm/gyre): the coordinator and every worker of such a query need it.
    #[arg(long, value_name = "DIR")]
    host_shuffle: Option<PathBuf>,
}

impl HostShuffleArgs {
    /// The node's host shuffle (the coordinator's starts `fresh`).
    fn shuffle(
        &self,
        fresh: bool,
    ) -> Result<Option<Arc<gyre_cluster::host_shuffle::HostShuffle>>, Box<dyn std::error::Error>>
    {
        Ok(match &self.host_shuffle {
            Some(dir) => Some(gyre_cluster::host_shuffle::HostShuffle::shared(dir, fresh)?),
            None => None,
        })
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
    /// Where the generated TPC-H rows live: `hash` on each table's first key column,
    /// or `chunked`: worker i keeps the i-th of the generator's parts (generation
    /// order, each worker a range of order keys).
    #[arg(long, default_value = "hash", value_parser = ["hash", "chunked"])]
    tpch_placement: String,
    /// Also serve Flight SQL on this address.
    #[arg(long)]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    front: FrontDoorArgs,
    /// Run at most N queries at once; later ones wait their turn.
    #[arg(long, value_name = "N")]
    max_concurrent_queries: Option<usize>,
    /// Memory each worker's queries may hold in operator state (e.g. 1G, 512M): sorts
    /// and aggregations spill beyond it, other operators fail.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory_limit: Option<usize>,
    #[command(flatten)]
    files: DataRootArgs,
    #[command(flatten)]
    primary: PrimaryArgs,
    #[command(flatten)]
    links: LinkArgs,
    /// Open no shared-memory carrier: sessions cannot choose a design for their
    /// exchanges (`SET gyre.shuffle_design`), which go over loopback TCP.
    #[arg(long)]
    tcp_exchanges: bool,
    /// Carry the designs' exchanges over an RDMA device instead of shared memory:
    /// an IPv4 address of the device's port per node, the coordinator's first
    /// (e.g. 10.0.2.15,10.0.2.16,10.0.2.17 for two workers).
    #[cfg(feature = "verbs")]
    #[arg(
        long,
        value_name = "ADDRESSES",
        value_delimiter = ',',
        conflicts_with = "tcp_exchanges"
    )]
    verbs: Option<Vec<std::net::Ipv4Addr>>,
    /// The RDMA device of --verbs (default: the first one).
    #[cfg(feature = "verbs")]
    #[arg(long, value_name = "NAME", requires = "verbs")]
    verbs_device: Option<String>,
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
    /// Benchmark: time Gyre with each of these `gyre.shuffle_design` values (e.g.
    /// tcp,memq-sr), taking turns within each iteration; the first is `gyre ms`.
    #[arg(long, value_delimiter = ',')]
    shuffle_designs: Vec<String>,
    /// Benchmark: write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Benchmark: draw the results as an SVG plot.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Benchmark: leave DuckDB out (otherwise its Python package is installed when
    /// missing and it runs the queries on the same data, generated by its tpch extension).
    #[arg(long)]
    no_duckdb: bool,
}

/// A size in bytes: a number with an optional K, M, G or T suffix (powers of 1024).
fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (number, shift) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a size such as 512M or 4G"))?;
    let bytes = n * (1u64 << shift) as f64;
    if !(1.0..=usize::MAX as f64).contains(&bytes) {
        return Err(format!("'{text}' is not a size such as 512M or 4G"));
    }
    Ok(bytes as usize)
}

/// The cluster secret's control key for drivers that send control messages to a running
/// cluster (benchmarks): GYRE_SECRET, as the cluster's nodes take it.
pub(crate) fn cluster_key() -> Result<gyre_cluster::auth::NodeKey, Box<dyn std::error::Error>> {
    let secret = SecretArgs { secret_file: None }.secret()?;
    Ok(gyre_cluster::auth::NodeKey::from_secret(&secret))
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GYRE_LOG")
                // HiGHS warns whenever Neo-Join's solver reaches its time limit, which
                // EXPLAIN ANALYZE reports; openraft warns of the votes and messages an
                // election makes stale, which is how Raft works, and its core logs an
                // error per read whose lead check a down voter missed (its replication
                // still says, twice a second, which voter is unreachable).
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(
                        "warn,highs=error,openraft=error,openraft::core::raft_core=off",
                    )
                }),
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
            links,
            front,
            max_concurrent_queries,
            files,
            primary,
            voters,
            host,
        } => {
            let secret = secret.secret()?;
            let front = front.front_door(listen)?;
            let local_files = files.local_files(listen)?;
            let config = CoordinatorConfig {
                listen,
                data_listen,
                transport: TransportConfig {
                    secret,
                    encrypt_links: links.encrypt_links,
                    ..Default::default()
                },
                max_concurrent_queries,
                local_files,
                primary: primary.config(),
                host_shuffle: host.shuffle(true)?,
                ..Default::default()
            };
            let scheme = if front.tls.is_some() {
                "grpc+tls"
            } else {
                "grpc"
            };
            if let Some(voters) = voters {
                let dir = primary.data_dir.as_deref().expect("checked by clap");
                let voters = gyre_cluster::failover::Voters::parse(&voters, listen, dir)?;
                let me = voters.me;
                let serving = gyre_cluster::failover::run(config, front, voters, |role| {
                    use gyre_cluster::failover::Role;
                    match role {
                        Role::Standby => println!("gyre coordinator voter {me} standing by"),
                        Role::Primary(_) => println!(
                            "gyre coordinator listening on {listen} (Flight SQL: {scheme}://{listen}), \
                             voter {me}, primary"
                        ),
                    }
                });
                tokio::select! {
                    served = serving => served?,
                    stopped = tokio::signal::ctrl_c() => stopped?,
                }
                return Ok(());
            }
            let coordinator = Coordinator::start(config).await?;
            let listener = tokio::net::TcpListener::bind(listen).await?;
            let addr = gyre_cluster::flight_sql::serve(coordinator, listener, &front)?;
            println!("gyre coordinator listening on {addr} (Flight SQL: {scheme}://{addr})");
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
        Command::Worker {
            coordinator,
            listen,
            data_listen,
            advertise_host,
            secret,
            links,
            tls_ca,
            memory_limit,
            files,
            multicast,
            host,
            ..
        } => {
            let secret = secret.secret()?;
            let local_files = files.local_files(listen)?;
            let coordinator_ca =
                match tls_ca {
                    Some(p) => Some(std::fs::read(&p).map_err(|e| {
                        format!("cannot read the CA certificate {}: {e}", p.display())
                    })?),
                    None => None,
                };
            let config = WorkerConfig {
                coordinator,
                listen,
                data_listen,
                advertise_host,
                transport: TransportConfig {
                    secret,
                    encrypt_links: links.encrypt_links,
                    ..Default::default()
                },
                coordinator_ca,
                memory_limit,
                local_files,
                procedures: gyre_tpcc::procedures(),
                log_multicast: multicast.group(),
                host_shuffle: host.shuffle(false)?,
            };
            // A worker the coordinator forgot (it restarted, or declared this one
            // dead) joins again under a new id, with nothing of what it held.
            let serving = gyre_cluster::worker::serve(config, |worker| {
                println!(
                    "gyre worker {} serving on {}",
                    worker.node,
                    worker.control_addr()
                );
            });
            tokio::select! {
                served = serving => served?,
                stopped = tokio::signal::ctrl_c() => stopped?,
            }
            Ok(())
        }
        Command::Local(args) => run_local(*args).await,
        Command::Cluster(command) => cluster::run(command),
        Command::Bench(BenchCommand::Shuffle(args)) => bench_shuffle::run(*args).await,
        Command::Bench(BenchCommand::Join(args)) => bench_join::run(*args).await,
        Command::Bench(BenchCommand::Kernels(args)) => bench_kernels::run(args).await,
        Command::Bench(BenchCommand::Assign(args)) => bench_assign::run(*args).await,
        Command::Bench(BenchCommand::Load(args)) => bench_load::run(*args).await,
        Command::Bench(BenchCommand::Tpcds(args)) => bench_tpcds::run(*args).await,
        Command::Bench(BenchCommand::Latency(args)) => bench_latency::run(*args).await,
        Command::Bench(BenchCommand::Replay(args)) => bench_replay::run(*args).await,
        Command::Bench(BenchCommand::Chbench(args)) => bench_chbench::run(*args).await,
        Command::Bench(BenchCommand::Failover(args)) => bench_failover::run(*args).await,
        Command::Bench(BenchCommand::Fragments(args)) => bench_fragments::run(*args).await,
        Command::Passwd { name } => {
            let password = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                let first = rpassword::prompt_password(format!("Password for {name}: "))?;
                let again = rpassword::prompt_password("Again: ")?;
                if first != again {
                    return Err("the passwords differ".into());
                }
                first
            } else {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line)?;
                line.trim_end_matches(['\n', '\r']).to_string()
            };
            println!(
                "{}",
                gyre_cluster::auth::users::user_line(&name, &password)?
            );
            Ok(())
        }
        Command::Sql { connect, input } => {
            let client = connect.connect().await?;
            run_input(&client, &input).await
        }
        Command::Load {
            connect,
            table,
            file_format,
            partition_by,
            path,
        } => {
            let client = connect.connect().await?;
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
    let front = args.front.front_door(listen)?;
    let limits = gyre_cluster::Limits {
        max_concurrent_queries: args.max_concurrent_queries,
        worker_memory: args.memory_limit,
        local_files: args.files.local_files(listen)?,
        encrypt_links: args.links.encrypt_links,
        primary: args.primary.config(),
        tcp_exchanges: args.tcp_exchanges,
        host_carrier: host_carrier(&args),
    };
    let cluster =
        LocalCluster::start_limited(args.workers, threads, listen, &front, &limits).await?;
    if args.listen.is_some() {
        let scheme = if front.tls.is_some() {
            "grpc+tls"
        } else {
            "grpc"
        };
        println!("Flight SQL: {scheme}://{}", cluster.addr);
    }
    if let Some(sf) = args.tpch {
        let start = std::time::Instant::now();
        eprintln!("generating TPC-H SF {sf} on {} workers...", args.workers);
        let chunked = args.tpch_placement == "chunked";
        cluster.coordinator.load_tpch_placed(sf, chunked).await?;
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
            duckdb: !args.no_duckdb,
            designs: args.shuffle_designs.clone(),
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
            let start = std::time::Instant::now();
            let results = runner.run(&stmt).await?;
            let elapsed = start.elapsed();
            output::print_results(&results, input.format)?;
            if input.timing {
                println!("Time: {:.3} ms", elapsed.as_secs_f64() * 1e3);
            }
        }
    }
    Ok(())
}

/// The carrier `gyre local`'s designs exchange over.
fn host_carrier(args: &LocalArgs) -> gyre_cluster::host_shuffle::HostCarrier {
    #[cfg(feature = "verbs")]
    if let Some(addresses) = &args.verbs {
        return gyre_cluster::host_shuffle::HostCarrier::Verbs {
            device: args.verbs_device.clone(),
            addresses: addresses.clone(),
        };
    }
    let _ = args;
    gyre_cluster::host_shuffle::HostCarrier::Shm
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command, parse_size};
    use clap::Parser;

    #[test]
    fn sealing_is_off_unless_asked_for_by_flag_or_environment() {
        let sealed = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Local(l) => l.links.encrypt_links,
            _ => unreachable!(),
        };
        // The environment is shared by the tests of this binary: only this one sets it.
        unsafe { std::env::remove_var("GYRE_ENCRYPT_LINKS") };
        assert!(!sealed(&["gyre", "local"]));
        assert!(sealed(&["gyre", "local", "--encrypt-links"]));
        for (value, expected) in [("1", true), ("on", true), ("true", true), ("0", false)] {
            unsafe { std::env::set_var("GYRE_ENCRYPT_LINKS", value) };
            assert_eq!(sealed(&["gyre", "local"]), expected, "{value}");
        }
        unsafe { std::env::remove_var("GYRE_ENCRYPT_LINKS") };
    }

    #[test]
    fn sizes_read_with_binary_suffixes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("100000"), Ok(100_000));
        for bad in ["", "lots", "-1G", "0", "1P"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
