//! `gyre bench join`: distributed join strategies on the papers' synthetic workload.
//!
//! Build relation: unique 64-bit keys with 64-bit payloads; probe relation: keys drawn
//! from the build keys, uniformly or Zipf-distributed (`--zipf`).
//!
//! - `hash`, `radix` and `flow` run as SQL ([`sql`]): the workload is loaded from
//!   Parquet files and each run is one join query through Flight SQL, with skew
//!   detection off (DataFusion's partitioned hash join, or with `radix` the same join
//!   run by Gyre's radix join kernel) or on (Flow-Join). Each run reports the
//!   query's time and every worker's CPU seconds and bytes on the wire.
//! - `cyclo-*` runs the cyclo-join of the Data Roundabout: every worker generates its
//!   slice and the joins run between their multiplexers, each worker reporting its
//!   setup, join and sync (waiting for data) times and its share of the tuples.
//!
//! Runs of the same predicate on the same data must agree on the result count and
//! checksum; the command fails if they do not.
//!
//! Where it runs: an emulated cluster built for the run (`--link RATE`, `--cpus C`
//! per host), embedded workers over loopback (`--link loopback`), or an existing
//! cluster (`--connect ADDR`, whose workers must read `--data` at the same path).
//! `--nodes 1,2,4` runs the same configurations on clusters of each size (with
//! `--per-node`, the data grows with the cluster).

mod report;
mod sql;

use crate::bench_cluster::{BoxError, EmulatedCluster, list, with_progress};
use crate::client::{LocalRunner, RemoteClient};
use clap::Args;
use gyre_cluster::LocalCluster;
use gyre_cluster::protocol::{ControlClient, JoinFigures, JoinRun, Request, Response};
use gyre_testbed::{ClusterName, CpuQuota, LinkRate};
use report::emit;
use serde::{Deserialize, Serialize};
use sql::SqlJoins;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Clone)]
pub struct JoinArgs {
    /// Workers (emulated hosts or embedded workers); several separated by commas.
    #[arg(long, default_value = "4")]
    nodes: String,
    /// Link rate of every emulated host (1gbit, 10gbit, ...), or `loopback`.
    #[arg(long, default_value = "10gbit")]
    link: String,
    /// CPU quota of every emulated host (e.g. 0.5).
    #[arg(long)]
    cpus: Option<CpuQuota>,
    /// Build tuples (unique keys): 4M, 16000000, ...
    #[arg(long, default_value = "4M")]
    build: String,
    /// Probe tuples (keys drawn from the build keys).
    #[arg(long, default_value = "4M")]
    probe: String,
    /// `--build` and `--probe` are per worker: the data grows with the cluster.
    #[arg(long)]
    per_node: bool,
    /// Zipf exponents of the probe keys, separated by commas (0: uniform).
    #[arg(long, default_value = "0")]
    zipf: String,
    /// Locality of both tables, several separated by commas (0 to 1). Each worker's
    /// file holds this share of rows whose keys lie in the worker's own range of the
    /// key domain (the domain cut into as many ranges as workers), the rest drawn from
    /// all keys, and both tables stay where their files were read: the worker with a
    /// partition's largest part has x + (1-x)/n of it, the thesis' definition. Without
    /// it, the build table is hash-placed on the key and the probe keys lie anywhere.
    #[arg(long)]
    locality: Option<String>,
    /// Strategies separated by commas: hash (SQL with DataFusion's partitioned hash
    /// join), auto (the default `gyre.join_strategy`: a Neo-Join that falls back to
    /// hash placement at run time when its assignment saves too little), radix (the
    /// same join run by Gyre's radix join kernel), flow (SQL with
    /// Flow-Join: heavy hitters detected on the fly, one global list, selective
    /// broadcast), flow-fetch (Flow-Join fetching on demand: each
    /// worker's own heavy hitters, their build rows fetched), neo (Neo-Join: both inputs
    /// placed by a locality-aware assignment), neo-radix (Neo-Join with plain radix
    /// partitioning and no selective broadcast, the thesis' baseline for skew),
    /// neo-radix-kernel (Neo-Join joining with the radix kernel), neo-open-shop
    /// (Neo-Join shuffling in synchronised open-shop rounds); each Neo-Join as
    /// neo...:P with gyre.neo_partitions = P, cyclo-hash, cyclo-sort-merge,
    /// cyclo-band:C, cyclo-lt|le|gt|ge, cyclo-nl-band:C, cyclo-theta:M:K (cyclo-join on
    /// the Data Roundabout with that local algorithm).
    #[arg(long, default_value = "hash,flow")]
    strategy: String,
    /// Join threads per worker (0: all cores of the host).
    #[arg(long, default_value_t = 1)]
    threads: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Runs of each configuration.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Unreported runs first: each strategy this many times at the first Zipf exponent.
    /// A cluster's first joins touch fresh memory (page faults, allocator growth) and
    /// ran up to 2x slower, which skewed the first repetition's ratios.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Use the running cluster whose coordinator is at ADDR.
    #[arg(long)]
    connect: Option<String>,
    /// Name of the emulated cluster (namespaces gyre-NAME-*).
    #[arg(long, default_value = "bench")]
    name: ClusterName,
    /// Write the results as JSON (`-`: standard output, nothing else printed there).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the results as an SVG plot (time over Zipf exponent, or over workers).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Where the SQL strategies' workload files go (default: a temporary directory,
    /// removed afterwards). With --connect, every worker must read it at this path.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Key number i is key i, so that the heaviest Zipf keys are the smallest and
    /// share a key range (the ordered keys of the thesis' skew experiment; SQL
    /// strategies, without --locality). By default keys are spread over the domain.
    #[arg(long)]
    ordered_keys: bool,
    /// Run nothing: print the tables (and write --plot) of a report saved with --json.
    #[arg(long, value_name = "JSON")]
    from: Option<PathBuf>,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinResult {
    pub strategy: String,
    pub nodes: usize,
    pub build_rows: u64,
    pub probe_rows: u64,
    pub zipf: f64,
    /// `--locality` of the run's data (`None`: build hash-placed, probe anywhere).
    #[serde(default)]
    pub locality: Option<f64>,
    /// The join query's time as its client saw it (hash, flow), or the slowest
    /// worker's elapsed time (cyclo-join).
    pub elapsed_s: f64,
    /// (build + probe) tuples per second of `elapsed_s`.
    pub tuples_per_sec: f64,
    /// Cyclo-join: the largest setup (build), join (probe) and sync times over the
    /// workers (see `JoinFigures`).
    pub setup_s: Option<f64>,
    pub join_s: Option<f64>,
    pub sync_s: Option<f64>,
    /// The largest worker's share of the work over the mean (1 = balanced): joined
    /// tuples (cyclo-join), or CPU seconds where each worker has its own process.
    pub imbalance: Option<f64>,
    /// Partitioned joins: CPU seconds the workers' processes spent in the join, summed
    /// over the workers (embedded workers share one process: its CPU is counted once).
    /// Steadier than `elapsed_s` on a shared machine, so small overheads show here.
    #[serde(default)]
    pub cpu_s: Option<f64>,
    pub results: u64,
    pub checksum: u64,
    /// Flow-Join: the heavy hitters it found (from `EXPLAIN ANALYZE`).
    #[serde(default)]
    pub heavy_hitters: Option<String>,
    pub workers: Vec<JoinFigures>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinBenchReport {
    pub link: String,
    pub cpus: Option<f64>,
    pub runs: Vec<JoinResult>,
    /// Per configuration and strategy: median time and the paired ratios over the
    /// configuration's first strategy.
    #[serde(default)]
    pub summary: Vec<report::SummaryRow>,
}

/// Parses `4M`, `16000000`, `1.5G`, `64K` (decimal multipliers).
fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_lowercase()) {
        Some('k') => (&t[..t.len() - 1], 1e3),
        Some('m') => (&t[..t.len() - 1], 1e6),
        Some('g') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a tuple count (e.g. 4M, 16000000)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("'{s}' is not a tuple count"));
    }
    Ok((v * mult).round() as u64)
}

impl JoinArgs {
    fn node_counts(&self) -> Result<Vec<usize>, BoxError> {
        let counts = list(&self.nodes)
            .iter()
            .map(|n| match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!("--nodes: '{n}' is not a worker count")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if counts.is_empty() {
            return Err("--nodes: no worker count".into());
        }
        Ok(counts)
    }

    /// The runs on a cluster of `nodes` workers: the warm-up runs (to be dropped), then
    /// the measured ones.
    fn runs(&self, nodes: usize) -> Result<(usize, Vec<JoinRun>), BoxError> {
        let scale = if self.per_node { nodes as u64 } else { 1 };
        let build_rows = parse_count(&self.build).map_err(|e| format!("--build: {e}"))? * scale;
        let probe_rows = parse_count(&self.probe).map_err(|e| format!("--probe: {e}"))? * scale;
        let strategies = list(&self.strategy);
        for strategy in &strategies {
            check_strategy(strategy)?;
        }
        // Strategies alternate within each repetition, so that they are compared side
        // by side under the same (noisy) conditions, and their order rotates from one
        // repetition to the next: on 8 embedded workers the third of three runs of the
        // same strategy took a median 2.5% more CPU than the first (20 repetitions), a
        // bias a fixed order would give the last strategy.
        let localities: Vec<Option<f64>> = match &self.locality {
            None => vec![None],
            Some(l) => {
                if let Some(cyclo) = strategies.iter().find(|s| !is_sql_strategy(s)) {
                    return Err(format!(
                        "--locality: {cyclo} generates its own data on every worker;                          locality applies to the SQL strategies"
                    )
                    .into());
                }
                list(l)
                    .iter()
                    .map(|x| {
                        x.parse()
                            .ok()
                            .filter(|x: &f64| (0.0..=1.0).contains(x))
                            .map(Some)
                            .ok_or_else(|| format!("--locality: '{x}' is not a share from 0 to 1"))
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        if self.ordered_keys {
            if self.locality.is_some() {
                return Err("--ordered-keys: key ranges are then not the workers' own: \
                            leave out --locality"
                    .into());
            }
            if let Some(cyclo) = strategies.iter().find(|s| !is_sql_strategy(s)) {
                return Err(format!(
                    "--ordered-keys: {cyclo} generates its own data on every worker; \
                     ordered keys apply to the SQL strategies"
                )
                .into());
            }
        }
        let mut runs = vec![];
        for z in list(&self.zipf) {
            let zipf: f64 = z
                .parse()
                .ok()
                .filter(|z: &f64| z.is_finite() && *z >= 0.0)
                .ok_or_else(|| format!("--zipf: '{z}' is not an exponent"))?;
            for &locality in &localities {
                for rep in 0..self.repeat.max(1) {
                    for i in 0..strategies.len() {
                        let strategy = &strategies[(i + rep) % strategies.len()];
                        runs.push(JoinRun {
                            run_id: 0,
                            nodes: vec![],
                            strategy: strategy.clone(),
                            build_rows,
                            probe_rows,
                            zipf,
                            locality,
                            ordered_keys: self.ordered_keys,
                            seed: self.seed,
                            threads: self.threads,
                        });
                    }
                }
            }
        }
        if runs.is_empty() {
            return Err("no strategy or Zipf exponent to run".into());
        }
        let warmup: Vec<JoinRun> = runs
            .iter()
            .take(strategies.len())
            .cycle()
            .take(strategies.len() * self.warmup)
            .cloned()
            .collect();
        Ok((warmup.len(), warmup.into_iter().chain(runs).collect()))
    }
}

fn check_strategy(strategy: &str) -> Result<(), BoxError> {
    match strategy.strip_prefix("cyclo-") {
        Some(algorithm) => {
            gyre_join::cyclo::parse_algorithm(algorithm).map_err(|e| format!("--strategy: {e}"))?;
        }
        None if sql::sql_strategy(strategy).is_ok() => {}
        None => {
            let why = match strategy.split_once(':') {
                Some(_) => sql::sql_strategy(strategy).err().unwrap_or_default(),
                None => format!(
                    "'{strategy}' is not hash, radix, flow, flow-fetch, neo[-radix|-radix-kernel][:P] or cyclo-ALGORITHM"
                ),
            };
            return Err(format!("--strategy: {why}").into());
        }
    }
    Ok(())
}

pub async fn run(args: JoinArgs) -> Result<(), BoxError> {
    if let Some(path) = &args.from {
        let text = std::fs::read(path).map_err(|e| format!("--from {}: {e}", path.display()))?;
        let report: JoinBenchReport = serde_json::from_slice(&text).map_err(|e| {
            format!(
                "--from {}: not a join benchmark report: {e}",
                path.display()
            )
        })?;
        let report = JoinBenchReport {
            summary: report::paired_summary(&report.runs),
            ..report
        };
        return emit(&JoinArgs { json: None, ..args }, &report);
    }
    let mut results = vec![];
    for nodes in args.node_counts()? {
        let (warmup, runs) = args.runs(nodes)?;
        let measured = if let Some(addr) = &args.connect {
            let data = DataDir::new(args.data.as_deref())?;
            let control = ControlClient::connect_lazy(
                addr,
                crate::cluster_key()?,
                gyre_transport::COORDINATOR,
            )?;
            let sql = RemoteClient::connect(addr).await?;
            let mut sql = SqlJoins::new(&sql, nodes, Processes::OnePerWorker, data.path());
            let mut out = vec![];
            for run in runs {
                out.push(if is_sql(&run) {
                    sql.run(&run).await?
                } else {
                    let request = Request::BenchJoin(run.clone());
                    let reply = with_progress(&label(&run), control.call(&request)).await?;
                    figures(&run, reply, Processes::OnePerWorker)?
                });
            }
            out.split_off(warmup)
        } else if args.link.eq_ignore_ascii_case("loopback") {
            loopback(nodes, runs, args.data.as_deref())
                .await?
                .split_off(warmup)
        } else {
            // The bench inside the emulated cluster drops its own warm-up runs.
            emulated(&args, nodes).await?
        };
        results.extend(measured);
    }
    check_agreement(&results)?;
    let report = JoinBenchReport {
        link: if args.connect.is_some() {
            "existing cluster".into()
        } else {
            args.link.clone()
        },
        cpus: args.cpus.map(|c| c.cpus()),
        summary: report::paired_summary(&results),
        runs: results,
    };
    emit(&args, &report)
}

fn label(run: &JoinRun) -> String {
    let locality = run
        .locality
        .map(|x| format!(", locality {x}"))
        .unwrap_or_default();
    format!(
        "joining: {} of {} build and {} probe tuples, Zipf {}{locality}",
        run.strategy, run.build_rows, run.probe_rows, run.zipf
    )
}

/// Whether each worker runs in a process of its own (emulated hosts, `--connect`) or
/// all share one (embedded workers), for summing their CPU times.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Processes {
    OnePerWorker,
    Shared,
}

fn figures(run: &JoinRun, reply: Response, processes: Processes) -> Result<JoinResult, BoxError> {
    let Response::JoinResults(workers) = reply else {
        return Err(format!("unexpected reply {reply:?}").into());
    };
    let max = |f: fn(&JoinFigures) -> f64| workers.iter().map(f).fold(0.0, f64::max);
    // What the workers really generated (partitioned joins split the sizes evenly).
    let build_rows: u64 = workers.iter().map(|w| w.build_rows_local).sum();
    let probe_rows: u64 = workers.iter().map(|w| w.probe_rows_local).sum();
    let elapsed_s = max(|w| w.elapsed_s);
    let joined: Vec<f64> = workers.iter().map(|w| w.tuples_joined as f64).collect();
    let mean = joined.iter().sum::<f64>() / joined.len().max(1) as f64;
    Ok(JoinResult {
        strategy: run.strategy.clone(),
        nodes: workers.len(),
        build_rows,
        probe_rows,
        zipf: run.zipf,
        locality: None,
        elapsed_s,
        tuples_per_sec: (build_rows + probe_rows) as f64 / elapsed_s.max(1e-9),
        setup_s: Some(max(|w| w.setup_s)),
        join_s: Some(max(|w| w.join_s)),
        sync_s: workers
            .iter()
            .map(|w| w.sync_s)
            .collect::<Option<Vec<f64>>>()
            .map(|v| v.into_iter().fold(0.0, f64::max)),
        imbalance: Some(joined.iter().copied().fold(0.0, f64::max) / mean.max(1e-9)),
        cpu_s: workers
            .iter()
            .map(|w| w.process_cpu_s)
            .collect::<Option<Vec<f64>>>()
            .map(|v| match processes {
                Processes::OnePerWorker => v.iter().sum(),
                Processes::Shared => v.into_iter().fold(0.0, f64::max),
            }),
        results: workers.iter().map(|w| w.results).sum(),
        heavy_hitters: None,
        checksum: workers.iter().fold(0u64, |a, w| a.wrapping_add(w.checksum)),
        workers,
    })
}

/// Embedded workers over loopback TCP.
async fn loopback(
    nodes: usize,
    runs: Vec<JoinRun>,
    data: Option<&std::path::Path>,
) -> Result<Vec<JoinResult>, BoxError> {
    let cluster = LocalCluster::start(nodes, 1, "127.0.0.1:0".parse()?).await?;
    let data = DataDir::new(data)?;
    let runner = LocalRunner(std::sync::Arc::clone(&cluster.coordinator));
    let mut sql = SqlJoins::new(&runner, nodes, Processes::Shared, data.path());
    let mut out = vec![];
    for run in runs {
        if is_sql(&run) {
            out.push(sql.run(&run).await?);
            continue;
        }
        let reply = with_progress(
            &label(&run),
            cluster
                .coordinator
                .handle_control(Request::BenchJoin(run.clone())),
        )
        .await?;
        out.push(figures(&run, reply, Processes::Shared)?);
    }
    Ok(out)
}

fn is_sql(run: &JoinRun) -> bool {
    is_sql_strategy(&run.strategy)
}

fn is_sql_strategy(strategy: &str) -> bool {
    !strategy.starts_with("cyclo-")
}

/// The directory of the SQL strategies' files: the one given, or a temporary one
/// removed when this is dropped.
enum DataDir {
    Given(PathBuf),
    Temporary(tempfile::TempDir),
}

impl DataDir {
    fn new(given: Option<&std::path::Path>) -> Result<Self, BoxError> {
        Ok(match given {
            Some(p) => Self::Given(p.to_path_buf()),
            None => Self::Temporary(
                tempfile::Builder::new()
                    .prefix("gyre-bench-join-")
                    .tempdir()?,
            ),
        })
    }

    fn path(&self) -> &std::path::Path {
        match self {
            Self::Given(p) => p,
            Self::Temporary(t) => t.path(),
        }
    }
}

async fn emulated(args: &JoinArgs, nodes: usize) -> Result<Vec<JoinResult>, BoxError> {
    // The workload files go to --data or a temporary directory of the run on the
    // coordinator's host; the hosts share this machine's file system.
    let data_root = match &args.data {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            std::fs::canonicalize(d)?
        }
        None => std::fs::canonicalize(std::env::temp_dir())?,
    };
    let cluster = EmulatedCluster {
        name: args.name.clone(),
        nodes,
        link: args.link.parse::<LinkRate>()?,
        cpus: args.cpus,
        data_roots: vec![data_root],
        encrypt_links: false,
        coordinator_args: vec![],
        log_multicast: None,
    };
    let mut inner: Vec<String> = [
        "bench",
        "join",
        "--nodes",
        &nodes.to_string(),
        "--build",
        &args.build,
        "--probe",
        &args.probe,
        "--zipf",
        &args.zipf,
        "--strategy",
        &args.strategy,
        "--threads",
        &args.threads.to_string(),
        "--seed",
        &args.seed.to_string(),
        "--repeat",
        &args.repeat.to_string(),
        "--warmup",
        &args.warmup.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if args.per_node {
        inner.push("--per-node".into());
    }
    if args.ordered_keys {
        inner.push("--ordered-keys".into());
    }
    if let Some(l) = &args.locality {
        inner.push("--locality".into());
        inner.push(l.clone());
    }
    if let Some(d) = &args.data {
        inner.push("--data".into());
        inner.push(d.display().to_string());
    }
    let (_, stdout) = cluster.run("gyre bench join", false, inner).await?;
    let report: JoinBenchReport = serde_json::from_slice(&stdout)?;
    Ok(report.runs)
}

/// Which runs must return the same rows: the same predicate on the same data (sizes,
/// skew, seed). Cyclo-join's data set is the same on any number of workers, and its
/// equality algorithms are one predicate; the partitioned joins generate each worker's
/// slice from its position, so they agree among themselves on the same cluster size.
fn result_class(r: &JoinResult) -> (String, u64, u64, String) {
    let predicate = match r.strategy.as_str() {
        "cyclo-hash" | "cyclo-sort-merge" => "cyclo-equi".to_string(),
        s if s.starts_with("cyclo-") => s.to_string(),
        _ => format!("partitioned on {} workers", r.nodes),
    };
    let data = match r.locality {
        Some(x) => format!("{} locality {x}", r.zipf),
        None => format!("{}", r.zipf),
    };
    (predicate, r.build_rows, r.probe_rows, data)
}

fn check_agreement(runs: &[JoinResult]) -> Result<(), BoxError> {
    let mut seen: BTreeMap<(String, u64, u64, String), &JoinResult> = BTreeMap::new();
    for r in runs {
        match seen.get(&result_class(r)) {
            Some(first) if (first.results, first.checksum) != (r.results, r.checksum) => {
                return Err(format!(
                    "results disagree on the same data: {} on {} workers returned {} rows \
                     (checksum {:#x}), {} on {} workers {} rows (checksum {:#x})",
                    first.strategy,
                    first.nodes,
                    first.results,
                    first.checksum,
                    r.strategy,
                    r.nodes,
                    r.results,
                    r.checksum
                )
                .into());
            }
            Some(_) => {}
            None => {
                seen.insert(result_class(r), r);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neo_strategies_take_a_partition_count() {
        assert_eq!(sql::sql_strategy("neo:256").unwrap().1, Some(256));
        assert_eq!(
            sql::sql_strategy("neo-radix:8").unwrap().0.name,
            "neo-radix"
        );
        assert_eq!(sql::sql_strategy("neo").unwrap().1, None);
        assert_eq!(
            sql::sql_strategy("neo-open-shop:16").unwrap().0.name,
            "neo-open-shop"
        );
        for bad in ["neo:0", "neo:x", "hash:4", "nope"] {
            assert!(check_strategy(bad).is_err(), "{bad}");
        }
        assert!(check_strategy("neo:1024").is_ok());
    }

    /// Warm-up runs come first, one round of the strategies at the first exponent per
    /// `--warmup`, and are the ones dropped.
    #[test]
    fn warm_up_runs_precede_the_measured_ones() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            join: JoinArgs,
        }
        let args = |extra: &[&str]| {
            let base = [
                "bench",
                "--strategy",
                "hash,flow",
                "--zipf",
                "1.25,0",
                "--repeat",
                "2",
            ];
            <Cli as clap::Parser>::parse_from(base.iter().chain(extra)).join
        };
        let names = |runs: &[JoinRun]| {
            runs.iter()
                .map(|r| format!("{}@{}", r.strategy, r.zipf))
                .collect::<Vec<_>>()
        };
        let (warmup, runs) = args(&["--warmup", "2"]).runs(4).unwrap();
        assert_eq!(warmup, 4);
        assert_eq!(runs.len(), 4 + 8);
        assert_eq!(
            names(&runs[..4]),
            ["hash@1.25", "flow@1.25", "hash@1.25", "flow@1.25"]
        );
        assert_eq!(
            names(&runs[4..]),
            names(&args(&["--warmup", "0"]).runs(4).unwrap().1)
        );
        assert_eq!(
            args(&[]).runs(4).unwrap().0,
            2,
            "one warm-up round by default"
        );
        // The order rotates between repetitions (no strategy always runs last).
        assert_eq!(
            names(&runs[4..]),
            [
                "hash@1.25",
                "flow@1.25",
                "flow@1.25",
                "hash@1.25",
                "hash@0",
                "flow@0",
                "flow@0",
                "hash@0"
            ]
        );
    }
}
