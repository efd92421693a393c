//! `gyre bench join`: distributed join strategies on the papers' synthetic workload.
//!
//! Build relation: unique 64-bit keys with 64-bit payloads; probe relation:
//! keys drawn from the build keys, uniformly or Zipf-distributed (`--zipf`).
//! Every worker generates its own slice of both, then all run the join
//! together through their multiplexers; each reports its times (setup, join,
//! sync: waiting for data), the tuples it joined (its share of the work), its
//! bytes on the wire and an order-independent checksum of its results. Runs
//! of the same predicate on the same data must agree on the result count and
//! checksum, whatever the strategy and the number of workers; the command
//! fails if they do not.
//!
//! Where it runs: an emulated cluster built for the run (`--link RATE`,
//! `--cpus C` per host), embedded workers over loopback (`--link loopback`),
//! or an existing cluster (`--connect ADDR`). `--nodes 1,2,4` runs the same
//! configurations on clusters of each size (with `--per-node`, the data grows
//! with the cluster).

use crate::bench_cluster::{BoxError, EmulatedCluster, list, with_progress, write_outputs};
use clap::Args;
use gyre_cluster::LocalCluster;
use gyre_cluster::protocol::{ControlClient, JoinFigures, JoinRun, Request, Response};
use gyre_testbed::{ClusterName, CpuQuota, LinkRate};
use serde::{Deserialize, Serialize};
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
    /// Strategies separated by commas: hash (plain partitioned hash join), flow
    /// (Flow-Join: heavy hitters detected on the fly, selective broadcast), flow-fetch
    /// (Flow-Join fetching heavy build tuples on demand), cyclo-hash, cyclo-sort-merge,
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
    /// Slowest worker's elapsed time.
    pub elapsed_s: f64,
    /// (build + probe) tuples per second of `elapsed_s`.
    pub tuples_per_sec: f64,
    /// Largest setup (build), join (probe) and sync times over the workers (see
    /// `JoinFigures`); sync only for cyclo-join.
    pub setup_s: f64,
    pub join_s: f64,
    pub sync_s: Option<f64>,
    /// Largest per-worker share of joined tuples over the mean (1 = balanced).
    pub imbalance: f64,
    /// Partitioned joins: CPU seconds the workers' processes spent in the join, summed
    /// over the workers (embedded workers share one process: its CPU is counted once).
    /// Steadier than `elapsed_s` on a shared machine, so small overheads show here.
    #[serde(default)]
    pub cpu_s: Option<f64>,
    pub results: u64,
    pub checksum: u64,
    pub workers: Vec<JoinFigures>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinBenchReport {
    pub link: String,
    pub cpus: Option<f64>,
    pub runs: Vec<JoinResult>,
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
        let mut runs = vec![];
        for z in list(&self.zipf) {
            let zipf: f64 = z
                .parse()
                .ok()
                .filter(|z: &f64| z.is_finite() && *z >= 0.0)
                .ok_or_else(|| format!("--zipf: '{z}' is not an exponent"))?;
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
                        seed: self.seed,
                        threads: self.threads,
                    });
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
        None => {
            strategy
                .parse::<gyre_join::flow::Strategy>()
                .map_err(|e| format!("--strategy: {e} (or cyclo-ALGORITHM)"))?;
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
        return emit(&JoinArgs { json: None, ..args }, &report);
    }
    let mut results = vec![];
    for nodes in args.node_counts()? {
        let (warmup, runs) = args.runs(nodes)?;
        let measured = if let Some(addr) = &args.connect {
            let client = ControlClient::connect_lazy(addr)?;
            let mut out = vec![];
            for run in runs {
                let request = Request::BenchJoin(run.clone());
                out.push(figures(
                    &run,
                    with_progress(&label(&run), client.call(&request)).await?,
                    Processes::OnePerWorker,
                )?);
            }
            out.split_off(warmup)
        } else if args.link.eq_ignore_ascii_case("loopback") {
            loopback(nodes, runs).await?.split_off(warmup)
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
        runs: results,
    };
    emit(&args, &report)
}

fn label(run: &JoinRun) -> String {
    format!(
        "joining: {} of {} build and {} probe tuples, Zipf {}",
        run.strategy, run.build_rows, run.probe_rows, run.zipf
    )
}

/// Whether each worker runs in a process of its own (emulated hosts, `--connect`) or
/// all share one (embedded workers), for summing their CPU times.
#[derive(Clone, Copy, PartialEq)]
enum Processes {
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
        elapsed_s,
        tuples_per_sec: (build_rows + probe_rows) as f64 / elapsed_s.max(1e-9),
        setup_s: max(|w| w.setup_s),
        join_s: max(|w| w.join_s),
        sync_s: workers
            .iter()
            .map(|w| w.sync_s)
            .collect::<Option<Vec<f64>>>()
            .map(|v| v.into_iter().fold(0.0, f64::max)),
        imbalance: joined.iter().copied().fold(0.0, f64::max) / mean.max(1e-9),
        cpu_s: workers
            .iter()
            .map(|w| w.process_cpu_s)
            .collect::<Option<Vec<f64>>>()
            .map(|v| match processes {
                Processes::OnePerWorker => v.iter().sum(),
                Processes::Shared => v.into_iter().fold(0.0, f64::max),
            }),
        results: workers.iter().map(|w| w.results).sum(),
        checksum: workers.iter().fold(0u64, |a, w| a.wrapping_add(w.checksum)),
        workers,
    })
}

/// Embedded workers over loopback TCP.
async fn loopback(nodes: usize, runs: Vec<JoinRun>) -> Result<Vec<JoinResult>, BoxError> {
    let cluster = LocalCluster::start(nodes, 1, "127.0.0.1:0".parse()?).await?;
    let mut out = vec![];
    for run in runs {
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

async fn emulated(args: &JoinArgs, nodes: usize) -> Result<Vec<JoinResult>, BoxError> {
    let cluster = EmulatedCluster {
        name: args.name.clone(),
        nodes,
        link: args.link.parse::<LinkRate>()?,
        cpus: args.cpus,
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
    (predicate, r.build_rows, r.probe_rows, format!("{}", r.zipf))
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

fn emit(args: &JoinArgs, r: &JoinBenchReport) -> Result<(), BoxError> {
    let to_stdout = write_outputs(args.json.as_deref(), args.plot.as_deref(), r, plot_svg)?;
    if to_stdout {
        return Ok(());
    }
    println!(
        "{:<18} {:>5} {:>5} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>11} {:>7}",
        "strategy",
        "nodes",
        "zipf",
        "build",
        "probe",
        "time s",
        "setup s",
        "join s",
        "sync s",
        "imbalance",
        "M tuples/s",
        "CPU s"
    );
    for run in &r.runs {
        println!(
            "{:<18} {:>5} {:>5} {:>9} {:>9} {:>8.3} {:>8.3} {:>8.3} {:>8} {:>9.2} {:>11.1} {:>7}",
            run.strategy,
            run.nodes,
            run.zipf,
            run.build_rows,
            run.probe_rows,
            run.elapsed_s,
            run.setup_s,
            run.join_s,
            run.sync_s
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "-".into()),
            run.imbalance,
            run.tuples_per_sec / 1e6,
            run.cpu_s
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    println!("\nper worker (tuples joined: its share of the work / results):");
    for run in &r.runs {
        let shares: Vec<String> = run
            .workers
            .iter()
            .map(|w| format!("w{} {}/{}", w.node, w.tuples_joined, w.results))
            .collect();
        println!(
            "  {} on {}, Zipf {}: {}",
            run.strategy,
            run.nodes,
            run.zipf,
            shares.join(", ")
        );
    }
    let rows = paired_summary(&r.runs);
    if rows.iter().any(|row| row.runs > 1) {
        println!(
            "\nmedians over the repetitions; time and CPU over the first strategy's in the \
             same repetition: median (its 95% bootstrap interval, from 5 runs) [min-max]:"
        );
        println!(
            "{:<18} {:>5} {:>5} {:>4} {:>8} {:>7} {:>9} {:>34} {:>34}",
            "strategy",
            "nodes",
            "zipf",
            "runs",
            "time s",
            "CPU s",
            "imbalance",
            "time ratio",
            "CPU ratio"
        );
        let ratio = |v: &[f64]| match (spread(v), median_interval(v)) {
            (Some((med, lo, hi)), Some((a, b))) => {
                format!("{med:.3} ({a:.3}-{b:.3}) [{lo:.2}-{hi:.2}]")
            }
            (Some((med, lo, hi)), None) => format!("{med:.3} [{lo:.2}-{hi:.2}]"),
            _ => "-".into(),
        };
        for row in &rows {
            println!(
                "{:<18} {:>5} {:>5} {:>4} {:>8.3} {:>7} {:>9.2} {:>34} {:>34}",
                row.strategy,
                row.nodes,
                row.zipf,
                row.runs,
                row.time_s,
                row.cpu_s
                    .map(|c| format!("{c:.3}"))
                    .unwrap_or_else(|| "-".into()),
                row.imbalance,
                ratio(&row.time_ratios),
                ratio(&row.cpu_ratios)
            );
        }
    }
    let busy = busy_summary(r);
    if !busy.is_empty() {
        println!(
            "\nhow busy the hosts were over the join (median over the runs): the share of \
             each host's CPU quota its process used, and of its link's rate in the busier \
             direction; least busy host - busiest"
        );
        println!(
            "{:<18} {:>5} {:>5} {:>13} {:>13}",
            "strategy", "nodes", "zipf", "CPU busy", "link busy"
        );
        let range = |(lo, hi): (f64, f64)| format!("{:.0}-{:.0}%", lo * 100.0, hi * 100.0);
        for b in &busy {
            println!(
                "{:<18} {:>5} {:>5} {:>13} {:>13}",
                b.strategy,
                b.nodes,
                b.zipf,
                b.cpu.map(range).unwrap_or_else(|| "-".into()),
                range(b.link)
            );
        }
    }
    Ok(())
}

/// How busy one strategy's hosts were, on one cluster size and skew.
#[derive(Debug, PartialEq)]
struct Busy {
    strategy: String,
    nodes: usize,
    zipf: f64,
    /// Medians over the runs of the least and the busiest host's share of its CPU
    /// quota (`None` without a quota or CPU figures) and of its link rate.
    cpu: Option<(f64, f64)>,
    link: (f64, f64),
}

/// Busy shares on an emulated cluster (known link rate) over the whole join: the
/// slowest host's elapsed time, so a host that finished early counts as idle for the
/// rest. The link share takes the busier direction: bytes sent or received.
fn busy_summary(r: &JoinBenchReport) -> Vec<Busy> {
    let Ok(rate) = r.link.parse::<LinkRate>() else {
        return vec![];
    };
    let seconds = |run: &JoinResult| run.elapsed_s.max(1e-9);
    let lo_hi = |v: Vec<f64>| {
        v.iter().fold((f64::INFINITY, 0.0_f64), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
    };
    // Per run: (least, most) busy host's CPU share (if known) and link share.
    let shares = |run: &JoinResult| {
        let cpu: Option<Vec<f64>> = r.cpus.and_then(|quota| {
            run.workers
                .iter()
                .map(|w| Some(w.process_cpu_s? / (seconds(run) * quota)))
                .collect()
        });
        let link: Vec<f64> = run
            .workers
            .iter()
            .map(|w| {
                w.bytes_sent.max(w.bytes_received) as f64 / (seconds(run) * rate.bytes_per_sec())
            })
            .collect();
        (cpu.map(lo_hi), lo_hi(link))
    };
    let groups = by_configuration(r.runs.iter().filter(|run| !run.workers.is_empty()));
    let med = |v: Vec<f64>| median(&v).unwrap_or(0.0);
    groups
        .into_iter()
        .flat_map(|(_, strategies)| strategies)
        .map(|(_, runs)| {
            let run = runs[0];
            let shares: Vec<_> = runs.into_iter().map(&shares).collect();
            let cpu: Option<Vec<(f64, f64)>> = shares.iter().map(|s| s.0).collect();
            Busy {
                strategy: run.strategy.clone(),
                nodes: run.nodes,
                zipf: run.zipf,
                cpu: cpu.map(|c| {
                    (
                        med(c.iter().map(|x| x.0).collect()),
                        med(c.iter().map(|x| x.1).collect()),
                    )
                }),
                link: (
                    med(shares.iter().map(|s| s.1.0).collect()),
                    med(shares.iter().map(|s| s.1.1).collect()),
                ),
            }
        })
        .collect()
}

/// One strategy on one cluster size and skew, over its repetitions.
#[derive(Debug, PartialEq)]
struct SummaryRow {
    strategy: String,
    nodes: usize,
    zipf: f64,
    runs: usize,
    /// Medians.
    time_s: f64,
    cpu_s: Option<f64>,
    imbalance: f64,
    /// Per repetition: this strategy's time (CPU) over the first strategy's. The
    /// strategies of one repetition run back to back, so each pair shares the
    /// machine's conditions; on a noisy machine these ratios are much steadier than
    /// ratios of medians.
    time_ratios: Vec<f64>,
    cpu_ratios: Vec<f64>,
}

fn median(v: &[f64]) -> Option<f64> {
    spread(v).map(|s| s.0)
}

/// Median, minimum and maximum.
fn spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = match n {
        0 => return None,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    Some((med, v[0], v[n - 1]))
}

/// 95% percentile-bootstrap interval of the median of `v` (2,000 resamples, a fixed
/// seed so a report prints the same every time), from 5 values on: how precisely the
/// runs pin a paired ratio down, where [min-max] shows how far single runs stray.
fn median_interval(v: &[f64]) -> Option<(f64, f64)> {
    use rand::{Rng, SeedableRng};
    const RESAMPLES: usize = 2000;
    if v.len() < 5 {
        return None;
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5EED);
    let mut sample = vec![0.0; v.len()];
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in sample.iter_mut() {
                *x = v[rng.random_range(0..v.len())];
            }
            median(&sample).unwrap_or(f64::NAN)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    Some((
        medians[RESAMPLES / 40],
        medians[RESAMPLES - 1 - RESAMPLES / 40],
    ))
}

/// A strategy's runs on one configuration, in the order they ran.
type StrategyRuns<'a> = (&'a str, Vec<&'a JoinResult>);

/// Runs grouped by configuration (workers, Zipf bits), then by strategy, each in the
/// order it first ran.
fn by_configuration<'a>(
    runs: impl Iterator<Item = &'a JoinResult>,
) -> Vec<((usize, u64), Vec<StrategyRuns<'a>>)> {
    let mut groups: Vec<((usize, u64), Vec<StrategyRuns>)> = vec![];
    for run in runs {
        let key = (run.nodes, run.zipf.to_bits());
        let at = match groups.iter().position(|g| g.0 == key) {
            Some(i) => i,
            None => {
                groups.push((key, vec![]));
                groups.len() - 1
            }
        };
        let strategies = &mut groups[at].1;
        match strategies.iter_mut().find(|s| s.0 == run.strategy) {
            Some(s) => s.1.push(run),
            None => strategies.push((&run.strategy, vec![run])),
        }
    }
    groups
}

/// Groups runs by (workers, Zipf) and strategy, in the order they ran; the k-th run of
/// a strategy is paired with the k-th run of the group's first strategy.
fn paired_summary(runs: &[JoinResult]) -> Vec<SummaryRow> {
    let groups = by_configuration(runs.iter());
    let mut out = vec![];
    for (_, strategies) in &groups {
        let base = &strategies[0].1;
        for (strategy, list) in strategies {
            let pairs = || list.iter().zip(base.iter());
            let cpus: Option<Vec<f64>> = list.iter().map(|r| r.cpu_s).collect();
            out.push(SummaryRow {
                strategy: strategy.to_string(),
                nodes: list[0].nodes,
                zipf: list[0].zipf,
                runs: list.len(),
                time_s: median(&list.iter().map(|r| r.elapsed_s).collect::<Vec<_>>())
                    .unwrap_or(0.0),
                cpu_s: cpus.as_deref().and_then(median),
                imbalance: median(&list.iter().map(|r| r.imbalance).collect::<Vec<_>>())
                    .unwrap_or(0.0),
                time_ratios: pairs()
                    .map(|(r, b)| r.elapsed_s / b.elapsed_s.max(1e-9))
                    .collect(),
                cpu_ratios: pairs()
                    .filter_map(|(r, b)| Some(r.cpu_s? / b.cpu_s?.max(1e-9)))
                    .collect(),
            });
        }
    }
    out
}

/// Time per strategy over the Zipf exponent, or over the workers when several
/// cluster sizes ran; one polyline (through the medians of repeated runs) per
/// strategy, setup/join/sync in the JSON.
fn plot_svg(r: &JoinBenchReport) -> String {
    let by_nodes = r
        .runs
        .iter()
        .map(|x| x.nodes)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1;
    let x_of = |x: &JoinResult| if by_nodes { x.nodes as f64 } else { x.zipf };
    let mut series: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for run in &r.runs {
        series
            .entry(run.strategy.as_str())
            .or_default()
            .push((x_of(run), run.elapsed_s));
    }
    let xs: Vec<f64> = r.runs.iter().map(x_of).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    let y1 = r.runs.iter().map(|x| x.elapsed_s).fold(1e-9, f64::max) * 1.1;
    let (w, h, left, right, top, bottom) = (640.0, 400.0, 70.0, 160.0, 40.0, 50.0);
    let px = |x: f64| {
        if x1 > x0 {
            left + (x - x0) / (x1 - x0) * (w - left - right)
        } else {
            left + (w - left - right) / 2.0
        }
    };
    let py = |y: f64| h - bottom - y / y1 * (h - top - bottom);
    let colours = ["#3b6fd4", "#d33", "#3a9d5d", "#b8860b", "#8a2be2", "#555"];
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='11'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='{left}' y='20' font-size='13'>gyre bench join ({} links): time over {}</text>\n",
        r.link,
        if by_nodes { "workers" } else { "Zipf exponent" }
    );
    for i in 0..=4 {
        let v = y1 * i as f64 / 4.0;
        s += &format!(
            "<line x1='{left}' x2='{:.0}' y1='{:.1}' y2='{:.1}' stroke='#ddd'/><text x='5' y='{:.1}'>{v:.2} s</text>\n",
            w - right,
            py(v),
            py(v),
            py(v) + 4.0
        );
    }
    let mut ticks: Vec<f64> = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for t in ticks {
        s += &format!(
            "<text x='{:.1}' y='{:.0}' text-anchor='middle'>{t}</text>\n",
            px(t),
            h - bottom + 16.0
        );
    }
    for (i, (name, mut points)) in series.into_iter().enumerate() {
        let c = colours[i % colours.len()];
        points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        // Repeated runs: the line joins the medians, every run is a dot.
        let path: Vec<String> = points
            .chunk_by(|a, b| a.0 == b.0)
            .map(|runs| {
                let (x, y) = runs[runs.len() / 2];
                format!("{:.1},{:.1}", px(x), py(y))
            })
            .collect();
        s += &format!(
            "<polyline fill='none' stroke='{c}' stroke-width='2' points='{}'/>\n",
            path.join(" ")
        );
        for (x, y) in &points {
            s += &format!(
                "<circle cx='{:.1}' cy='{:.1}' r='3' fill='{c}'/>\n",
                px(*x),
                py(*y)
            );
        }
        s += &format!(
            "<text x='{:.0}' y='{:.0}' fill='{c}'>{name}</text>\n",
            w - right + 10.0,
            top + 16.0 * (i as f64 + 1.0)
        );
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strategy: &str, zipf: f64, elapsed_s: f64, cpu_s: Option<f64>) -> JoinResult {
        JoinResult {
            strategy: strategy.into(),
            nodes: 4,
            build_rows: 10,
            probe_rows: 100,
            zipf,
            elapsed_s,
            tuples_per_sec: 110.0 / elapsed_s,
            setup_s: 0.0,
            join_s: elapsed_s,
            sync_s: None,
            imbalance: 1.0,
            cpu_s,
            results: 100,
            checksum: 7,
            workers: vec![],
        }
    }

    /// Ratios pair the runs of one repetition, so a slow repetition (the machine
    /// busy) moves both strategies and not the ratio.
    #[test]
    fn ratios_pair_each_repetition_with_the_first_strategy() {
        let runs = vec![
            run("hash", 0.0, 1.0, Some(2.0)),
            run("flow", 0.0, 1.1, Some(2.2)),
            // Rotated order: the repetition's runs still pair up.
            run("flow", 0.0, 2.2, Some(4.4)),
            run("hash", 0.0, 2.0, Some(4.0)),
            run("hash", 0.0, 1.5, None),
            run("flow", 0.0, 1.65, Some(3.0)),
            run("hash", 1.25, 3.0, Some(1.0)),
            run("flow", 1.25, 1.0, Some(1.0)),
        ];
        let rows = paired_summary(&runs);
        assert_eq!(rows.len(), 4);
        let flow = &rows[1];
        assert_eq!(
            (flow.strategy.as_str(), flow.zipf, flow.runs),
            ("flow", 0.0, 3)
        );
        assert_eq!(flow.time_s, 1.65);
        // One run without a CPU figure: no median CPU, and only two CPU pairs.
        assert_eq!(flow.cpu_s, Some(3.0));
        assert_eq!(rows[0].cpu_s, None);
        assert!(flow.time_ratios.iter().all(|r| (r - 1.1).abs() < 1e-9));
        assert_eq!(flow.cpu_ratios.len(), 2);
        assert_eq!(
            spread(&flow.time_ratios).map(|s| (s.0 * 10.0).round()),
            Some(11.0)
        );
        let skewed = &rows[3];
        assert_eq!(
            (skewed.zipf, skewed.time_ratios.clone()),
            (1.25, vec![1.0 / 3.0])
        );
        assert_eq!(spread(&[3.0, 1.0, 2.0, 4.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(spread(&[]), None);
        // The bootstrap interval: none from fewer than 5 runs; it holds the median, lies
        // within [min, max], and narrows with more runs of the same spread.
        assert_eq!(median_interval(&[1.0, 1.1, 0.9, 1.0]), None);
        let few = [0.9, 1.2, 1.0, 1.1, 0.95, 1.05, 1.0];
        let many: Vec<f64> = few.iter().cycle().take(70).copied().collect();
        let (a, b) = median_interval(&few).unwrap();
        let (c, d) = median_interval(&many).unwrap();
        assert!(
            (0.9..=1.0).contains(&a) && (1.0..=1.2).contains(&b),
            "{a} {b}"
        );
        assert!(
            c <= 1.0 && 1.0 <= d && d - c < b - a,
            "{c} {d} against {a} {b}"
        );
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

    /// Busy shares: CPU over the quota and bytes over the link rate, both over the
    /// slowest host's time, as the least and the busiest host's median over the runs.
    #[test]
    fn busy_shares_are_taken_over_the_whole_join() {
        let worker = |node: u32, cpu_s: f64, sent: u64, received: u64| JoinFigures {
            node,
            strategy: "hash".into(),
            build_rows_local: 0,
            probe_rows_local: 0,
            elapsed_s: 0.5,
            setup_s: 0.0,
            join_s: 0.5,
            sync_s: None,
            tuples_joined: 0,
            bytes_sent: sent,
            bytes_received: received,
            results: 0,
            checksum: 0,
            details: vec![],
            process_cpu_s: Some(cpu_s),
        };
        // 1 Gbit/s = 125 MB/s; a 0.5-CPU quota over 2 s is 1 CPU second.
        let mut a = run("hash", 0.0, 2.0, Some(1.0));
        a.workers = vec![
            worker(1, 1.0, 250_000_000, 0),
            worker(2, 0.5, 0, 125_000_000),
        ];
        let mut b = run("hash", 0.0, 2.0, Some(1.0));
        b.workers = vec![worker(1, 0.8, 50_000_000, 50_000_000), worker(2, 0.2, 0, 0)];
        let report = |link: &str, cpus| JoinBenchReport {
            link: link.into(),
            cpus,
            runs: vec![a.clone(), b.clone()],
        };
        let busy = busy_summary(&report("1gbit", Some(0.5)));
        assert_eq!(busy.len(), 1);
        let (cpu, link) = (busy[0].cpu.unwrap(), busy[0].link);
        // Least busy: 0.5 and 0.2 -> 0.35; busiest: 1.0 and 0.8 -> 0.9.
        assert!(
            (cpu.0 - 0.35).abs() < 1e-9 && (cpu.1 - 0.9).abs() < 1e-9,
            "{cpu:?}"
        );
        // Links: run a 1.0 and 0.5 (the received side), run b 0.2 and 0.
        assert!(
            (link.0 - 0.25).abs() < 1e-9 && (link.1 - 0.6).abs() < 1e-9,
            "{link:?}"
        );
        assert_eq!(busy_summary(&report("1gbit", None))[0].cpu, None);
        assert!(busy_summary(&report("loopback", None)).is_empty());
    }
}
