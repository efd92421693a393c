//! `gyre bench assign`: what Neo-Join's planning costs (its phases 2 and 3) and what
//! it saves, on the thesis' synthetic inputs, without moving any data.
//!
//! Per configuration (nodes x partitions x locality x Zipf exponent): keys are drawn
//! Zipf-distributed over 2^32 values (small keys frequent, z = 0 uniform), counted in
//! fine MSB-radix histograms and cut into `p` partitions (plain radix, or adaptive
//! radix partitioning); every node holds `--tuples` tuples of 16 bytes per side, and
//! partition j's largest part, x% plus its 1/n share of the rest, is on node j mod n
//! (the thesis' locality; `--owners random` draws the owner instead, which leaves the
//! nodes unbalanced and the MILP much harder). Reported: the MILP's and the greedy
//! assignment's time and busiest-link bytes, against hash placement's; the open-shop
//! schedule's time and rounds.

use crate::stats::median;
use clap::Args;
use gyre_join::Zipf;
use gyre_join::neo::{
    AssignOptions, Broadcastable, FineHistogram, PartitionMap, RadixDomain, Sizes, assign,
    open_shop,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error>;

#[derive(Args, Clone)]
pub struct AssignArgs {
    /// Node counts (comma-separated).
    #[arg(long, default_value = "4,8,16,32")]
    nodes: String,
    /// Partition counts (comma-separated).
    #[arg(long, default_value = "64,256,512")]
    partitions: String,
    /// Locality levels, 0 to 1 (comma-separated).
    #[arg(long, default_value = "0,0.5,0.9")]
    locality: String,
    /// Zipf exponents of the keys (comma-separated; 0 is uniform).
    #[arg(long, default_value = "0,1")]
    zipf: String,
    /// Tuples per node and side.
    #[arg(long, default_value_t = 200_000_000)]
    tuples: u64,
    /// `balanced`: partition j's owner is node j mod n; `random`: a random node.
    #[arg(long, default_value = "balanced")]
    owners: String,
    /// `radix` (plain MSB radix) or `adaptive` (adaptive radix partitioning).
    #[arg(long, default_value = "radix")]
    partitioning: String,
    /// Allow selective broadcast of either side.
    #[arg(long)]
    broadcast: bool,
    /// The solver's time limit in milliseconds.
    #[arg(long, default_value_t = 100)]
    time_limit_ms: u64,
    /// Runs per configuration; medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Row {
    nodes: usize,
    partitions: usize,
    locality: f64,
    zipf: f64,
    milp_ms: f64,
    milp_method: String,
    greedy_ms: f64,
    /// Busiest link's bytes: MILP, greedy, hash placement.
    milp_max_bytes: u64,
    greedy_max_bytes: u64,
    hash_max_bytes: u64,
    broadcast_partitions: usize,
    schedule_ms: f64,
    rounds: usize,
}

fn list<T: std::str::FromStr>(text: &str, what: &str) -> Result<Vec<T>, BoxError> {
    text.split(',')
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|_| format!("--{what}: '{v}' is not a number").into())
        })
        .collect()
}

/// Share of the tuples per partition: Zipf keys through the fine histogram and the
/// chosen partitioning.
fn partition_shares(zipf: f64, partitions: usize, adaptive: bool) -> Result<Vec<f64>, BoxError> {
    let domain = RadixDomain::new(0, u32::MAX as u64, 16)?;
    let mut histogram = FineHistogram::new(domain);
    let mut rng = SmallRng::seed_from_u64(1);
    const SAMPLE: usize = 1_000_000;
    if zipf == 0.0 {
        histogram.add_keys(
            (0..SAMPLE).map(|_| rng.random_range(0..=u32::MAX as u64)),
            1,
        );
    } else {
        let keys = Zipf::new(u32::MAX as u64, zipf);
        histogram.add_keys((0..SAMPLE).map(|_| keys.sample(&mut rng) - 1), 1);
    }
    let map = if adaptive {
        PartitionMap::adaptive(domain, histogram.bytes(), partitions)?
    } else {
        let bits = partitions.next_power_of_two().trailing_zeros();
        PartitionMap::radix(domain, bits)?
    };
    let counts = histogram.per_partition(&map);
    Ok(counts.iter().map(|&c| c as f64 / SAMPLE as f64).collect())
}

fn sizes(
    nodes: usize,
    shares: &[f64],
    locality: f64,
    tuples: u64,
    random_owners: bool,
) -> Result<Sizes, BoxError> {
    let p = shares.len();
    let mut rng = SmallRng::seed_from_u64(2);
    let owners: Vec<usize> = (0..p)
        .map(|j| {
            if random_owners {
                rng.random_range(0..nodes)
            } else {
                j % nodes
            }
        })
        .collect();
    let mut sizes = Sizes::new(nodes, p)?;
    for node in 0..nodes {
        let row: Vec<u64> = (0..p)
            .map(|j| {
                // All nodes together hold n * tuples; partition j has its share.
                let bytes = shares[j] * (nodes as u64 * tuples * 16) as f64;
                let part = if owners[j] == node {
                    locality + (1.0 - locality) / nodes as f64
                } else {
                    (1.0 - locality) / nodes as f64
                };
                (bytes * part) as u64
            })
            .collect();
        sizes.set(node, &row, &row);
    }
    Ok(sizes)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub async fn run(args: AssignArgs) -> Result<(), BoxError> {
    let nodes: Vec<usize> = list(&args.nodes, "nodes")?;
    let partitions: Vec<usize> = list(&args.partitions, "partitions")?;
    let localities: Vec<f64> = list(&args.locality, "locality")?;
    let zipfs: Vec<f64> = list(&args.zipf, "zipf")?;
    let random_owners = match args.owners.as_str() {
        "balanced" => false,
        "random" => true,
        other => return Err(format!("--owners: '{other}' is not balanced or random").into()),
    };
    let adaptive = match args.partitioning.as_str() {
        "radix" => false,
        "adaptive" => true,
        other => return Err(format!("--partitioning: '{other}' is not radix or adaptive").into()),
    };
    if nodes.contains(&0) || partitions.contains(&0) || args.repeat == 0 {
        return Err("--nodes, --partitions and --repeat must be positive".into());
    }
    if localities.iter().any(|x| !(0.0..=1.0).contains(x)) {
        return Err("--locality must be between 0 and 1".into());
    }
    let broadcast = if args.broadcast {
        Broadcastable::BOTH
    } else {
        Broadcastable::NONE
    };
    let time_limit = Duration::from_millis(args.time_limit_ms);
    let mut rows = Vec::new();
    println!(
        "{:>5} {:>5} {:>5} {:>4} | {:>8} {:>26} {:>9} | {:>10} {:>10} {:>10} {:>5} | {:>8} {:>6}",
        "nodes",
        "parts",
        "loc",
        "zipf",
        "milp ms",
        "method",
        "greedy ms",
        "milp/hash",
        "greedy/h",
        "max GB",
        "bcast",
        "sched ms",
        "rounds"
    );
    for &z in &zipfs {
        for &p in &partitions {
            let shares = partition_shares(z, p, adaptive)?;
            for &n in &nodes {
                for &x in &localities {
                    let sizes = sizes(n, &shares, x, args.tuples, random_owners)?;
                    let mut milp_ms = Vec::new();
                    let mut greedy_ms = Vec::new();
                    let mut schedule_ms = Vec::new();
                    let (mut milp, mut greedy, mut rounds) = (None, None, 0);
                    for _ in 0..args.repeat {
                        let options = AssignOptions {
                            broadcast,
                            milp: true,
                            time_limit,
                            link_rate: None,
                        };
                        let solved = assign(&sizes, &options);
                        milp_ms.push(ms(solved.elapsed));
                        let quick = assign(
                            &sizes,
                            &AssignOptions {
                                milp: false,
                                ..options
                            },
                        );
                        greedy_ms.push(ms(quick.elapsed));
                        let start = Instant::now();
                        let schedule = open_shop(&solved.assignment.transfers(&sizes))?;
                        schedule_ms.push(ms(start.elapsed()));
                        rounds = schedule.len();
                        milp = Some(solved);
                        greedy = Some(quick);
                    }
                    let (milp, greedy) = (milp.unwrap(), greedy.unwrap());
                    let hash = sizes.hash_max_cost().max(1);
                    let row = Row {
                        nodes: n,
                        partitions: sizes.partitions(),
                        locality: x,
                        zipf: z,
                        milp_ms: median(&milp_ms).unwrap_or(0.0),
                        milp_method: milp.method.to_string(),
                        greedy_ms: median(&greedy_ms).unwrap_or(0.0),
                        milp_max_bytes: milp.costs.max(),
                        greedy_max_bytes: greedy.costs.max(),
                        hash_max_bytes: hash,
                        broadcast_partitions: milp.assignment.broadcasts(),
                        schedule_ms: median(&schedule_ms).unwrap_or(0.0),
                        rounds,
                    };
                    println!(
                        "{:>5} {:>5} {:>5} {:>4} | {:>8.1} {:>26} {:>9.1} | {:>10.3} {:>10.3} {:>10.2} {:>5} | {:>8.2} {:>6}",
                        row.nodes,
                        row.partitions,
                        row.locality,
                        row.zipf,
                        row.milp_ms,
                        row.milp_method,
                        row.greedy_ms,
                        row.milp_max_bytes as f64 / hash as f64,
                        row.greedy_max_bytes as f64 / hash as f64,
                        row.milp_max_bytes as f64 / 1e9,
                        row.broadcast_partitions,
                        row.schedule_ms,
                        row.rounds
                    );
                    rows.push(row);
                }
            }
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
