//! Flow-Join micro-benchmarks over loopback.
//!
//! `cargo run --release -p gyre-join --example flow_join -- [--nodes 4] [--build 5040]
//!  [--probe 2000000] [--threads 1] [--sketch-keys 10000000] [--zipf 0,1.0,1.25]
//!  [--sample 1]` (`--sample N`: histograms count every N-th probe tuple only)
//!
//! 1. SpaceSaving (k = 128) update rate per thread, every thread with its private
//!    histogram as in Flow-Join, for uniform keys with few and many distinct values and
//!    for Zipf z = 1.25 (thesis Fig. 4.8: about 60 M keys/s per thread).
//! 2. The thesis workload (64-bit key + payload, unique build keys, Zipf probe keys) on
//!    an in-process cluster of TCP transports over loopback, plain partitioned hash join
//!    vs Flow-Join (global consensus) vs Flow-Join (fetch on demand): time, throughput,
//!    per-node join input (tuples received + kept + copies) and heavy hitters found. All
//!    nodes share this machine's cores and loopback is not a shaped link, so these
//!    figures show balance and overhead, not what an emulated cluster with fixed CPU
//!    shares would show.

use std::sync::Arc;
use std::time::Instant;

use gyre_join::flow::bench::{ClusterFigures, JoinFigures, JoinSpec, run_join};
use gyre_join::flow::{DetectionConfig, JoinType, Strategy};
use gyre_join::{SpaceSaving, Zipf};
use gyre_transport::{NodeId, TcpTransport, Transport, TransportConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

struct Args {
    nodes: usize,
    build: u64,
    probe: u64,
    threads: usize,
    sketch_keys: usize,
    zipf: Vec<f64>,
    sample: u32,
}

fn parse_args() -> Args {
    let mut a = Args {
        nodes: 4,
        build: 5040,
        probe: 2_000_000,
        threads: 1,
        sketch_keys: 10_000_000,
        zipf: vec![0.0, 1.0, 1.25],
        sample: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--nodes" => a.nodes = value().parse().expect("--nodes N"),
            "--build" => a.build = value().parse().expect("--build ROWS"),
            "--probe" => a.probe = value().parse().expect("--probe ROWS"),
            "--threads" => a.threads = value().parse().expect("--threads T"),
            "--sketch-keys" => a.sketch_keys = value().parse().expect("--sketch-keys N"),
            "--zipf" => {
                a.zipf = value()
                    .split(',')
                    .map(|z| z.parse().expect("--zipf Z[,Z...]"))
                    .collect()
            }
            "--sample" => a.sample = value().parse().expect("--sample N"),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn sketch_rate(name: &str, keys: &[u64], threads: usize) {
    let start = Instant::now();
    let totals: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut h = SpaceSaving::default();
                    for &k in keys {
                        h.update(k);
                    }
                    std::hint::black_box(h.total())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let per_thread = keys.len() as f64 / secs / 1e6;
    println!(
        "  {name:<28} {threads} thread(s): {per_thread:7.1} M keys/s per thread ({} keys each)",
        totals[0]
    );
}

async fn cluster(n: usize) -> Vec<Arc<TcpTransport>> {
    let ids: Vec<NodeId> = (1..=n as NodeId).collect();
    gyre_transport::loopback_cluster(&ids, TransportConfig::default())
        .await
        .expect("a loopback cluster")
        .into_iter()
        .map(Arc::new)
        .collect()
}

async fn run(
    nodes: &[Arc<TcpTransport>],
    a: &Args,
    z: f64,
    strategy: Strategy,
    run_id: u64,
) -> Vec<JoinFigures> {
    let ids: Vec<NodeId> = nodes.iter().map(|t| t.node_id()).collect();
    let hs: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let t = Arc::clone(t);
            let spec = JoinSpec {
                nodes: ids.clone(),
                index: i,
                build_rows: a.build,
                probe_rows: a.probe,
                zipf: z,
                seed: 1,
                strategy,
                join: JoinType::Inner,
                threads: a.threads,
                detection: DetectionConfig {
                    sample: a.sample,
                    ..DetectionConfig::default()
                },
                run_id,
            };
            tokio::spawn(async move { run_join(&spec, &*t).await.expect("join run") })
        })
        .collect();
    let mut out = vec![];
    for h in hs {
        out.push(h.await.expect("node task"));
    }
    out
}

fn main() {
    let a = parse_args();
    println!("SpaceSaving update rate (k = 128, sorted array + hash index):");
    let mut rng = SmallRng::seed_from_u64(5);
    let n = a.sketch_keys;
    let few: Vec<u64> = (0..n).map(|_| rng.random_range(0..64)).collect();
    let many: Vec<u64> = (0..n).map(|_| rng.random::<u64>()).collect();
    let z = Zipf::new(1 << 30, 1.25);
    let zipf: Vec<u64> = (0..n).map(|_| z.sample(&mut rng)).collect();
    let cores = gyre_join::default_threads();
    for threads in [1, cores]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
    {
        sketch_rate("uniform, 64 distinct", &few, threads);
        sketch_rate("uniform, 2^64 distinct", &many, threads);
        sketch_rate("zipf 1.25 over 2^30", &zipf, threads);
    }
    drop((few, many, zipf));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let nodes = cluster(a.nodes).await;
        println!(
            "\nLoopback join: {} nodes x ({} build + {} probe) tuples, {} thread(s) per node",
            a.nodes, a.build, a.probe, a.threads
        );
        println!(
            "{:>5} {:<16} {:>9} {:>11} {:>13} {:>5}  per-node join input (R+S received, kept, copies)",
            "z", "strategy", "time", "M tuples/s", "max/mean in", "HH"
        );
        let mut run_id = 1;
        for &z in &a.zipf {
            let mut checksum = None;
            for strategy in [Strategy::Plain, Strategy::Broadcast, Strategy::FetchOnDemand] {
                let figs = run(&nodes, &a, z, strategy, run_id).await;
                run_id += 1;
                let c = ClusterFigures::from_nodes(&figs);
                let ok = *checksum.get_or_insert((c.result_rows, c.checksum))
                    == (c.result_rows, c.checksum);
                assert!(ok, "strategies disagree on the result");
                let inputs: Vec<String> = figs.iter().map(|f| f.join_input().to_string()).collect();
                println!(
                    "{z:>5} {:<16} {:>7.0}ms {:>11.1} {:>13.2} {:>5}  [{}]",
                    strategy.to_string(),
                    c.elapsed.as_secs_f64() * 1e3,
                    c.throughput / 1e6,
                    c.max_input as f64 / c.mean_input.max(1.0),
                    c.heavy_hitters,
                    inputs.join(", ")
                );
                if strategy != Strategy::Plain {
                    let f = &figs[0].counters;
                    let first = f.heavy.iter().map(|h| h.after_tuples).min();
                    println!(
                        "      node 1: kept {} S local, broadcast {} S, {} R copies received, first heavy hitter after {:?} of {} probe tuples",
                        f.probe_kept, f.probe_broadcast, f.copies_received, first, f.probe_rows
                    );
                }
            }
        }
    });
}
