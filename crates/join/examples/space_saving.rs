//! The update rate of the SpaceSaving sketch Flow-Join's heavy-hitter detection counts
//! with, one private histogram per thread as in Flow-Join.
//!
//! `cargo run --release -p gyre-join --example space_saving -- [--keys 10000000]`
//!
//! Uniform keys with few and with many distinct values, and Zipf z = 1.25 (Rödiger,
//! *Scalable Distributed Query Processing in Parallel Main-Memory Database Systems*,
//! Fig. 4.8: about 60 M keys/s per thread). The distributed join is measured through
//! SQL by `gyre bench join`.

use std::time::Instant;

use gyre_join::{SpaceSaving, Zipf};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn keys_arg() -> usize {
    let mut keys = 10_000_000;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--keys" => {
                keys = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("--keys N"))
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    keys
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

fn main() {
    let n = keys_arg();
    println!("SpaceSaving update rate (k = 128, sorted array + hash index):");
    let mut rng = SmallRng::seed_from_u64(5);
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
}
