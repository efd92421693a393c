//! Micro-benchmark of the local join kernels and the SpaceSaving sketch.
//!
//! `cargo run --release -p gyre-join --example kernels -- --tuples 16000000`
//!
//! Workload (the radix-join literature's standard case): a build relation of N
//! (key, payload) tuples with unique keys 1..=N in random order, and a probe relation of
//! N tuples whose keys are drawn uniformly from the build keys (foreign-key join, every
//! probe tuple matches exactly once). Reported rate: (|build| + |probe|) / seconds / threads.

use std::time::Instant;

use gyre_join::{
    JoinPairs, Keys, MergePredicate, PartitionedProbe, ProbeMode, RadixConfig, RadixHashTable,
    RadixLayout, SortedKeys, SpaceSaving, Zipf, merge_join,
};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

struct Args {
    tuples: usize,
    threads: usize,
    cache_bytes: Option<usize>,
    max_bits_per_pass: Option<u32>,
    sketch_keys: usize,
    reps: usize,
    skip: Vec<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        tuples: 16_000_000,
        threads: gyre_join::default_threads(),
        cache_bytes: None,
        max_bits_per_pass: None,
        sketch_keys: 20_000_000,
        reps: 3,
        skip: vec![],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--tuples" => a.tuples = value().parse().expect("--tuples N"),
            "--threads" => a.threads = value().parse().expect("--threads T"),
            "--cache-bytes" => a.cache_bytes = Some(value().parse().expect("--cache-bytes B")),
            "--max-bits-per-pass" => {
                a.max_bits_per_pass = Some(value().parse().expect("--max-bits-per-pass B"))
            }
            "--sketch-keys" => a.sketch_keys = value().parse().expect("--sketch-keys N"),
            "--reps" => a.reps = value().parse().expect("--reps R"),
            "--skip" => a.skip.push(value()),
            other => panic!(
                "unknown flag {other}; flags: --tuples N --threads T --cache-bytes B \
                 --max-bits-per-pass B --sketch-keys N --reps R --skip radix|direct|sort|sketch"
            ),
        }
    }
    a
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Runs `f` `reps` times and returns the fastest time with the last result: the
/// machine is shared, and the minimum is the least disturbed run.
fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..reps.max(1) {
        drop(out.take()); // free the previous result before the next run allocates
        let t = Instant::now();
        let r = f();
        best = best.min(secs(t));
        out = Some(r);
    }
    (best, out.unwrap())
}

/// Gathers both payloads of every pair (what a join operator's output step does) and
/// folds them into a checksum so the work cannot be optimised away.
fn gather(pairs: &JoinPairs, build_payload: &[u64], probe_payload: &[u64]) -> u64 {
    pairs
        .left
        .iter()
        .zip(&pairs.right)
        .fold(0u64, |acc, (&b, &p)| {
            acc.wrapping_add(build_payload[b as usize] ^ probe_payload[p as usize])
        })
}

fn report(name: &str, setup: f64, join: f64, n: usize, threads: usize, matches: usize) {
    let total = setup + join;
    println!(
        "{name:<28} setup {setup:7.3} s  join {join:7.3} s  total {total:7.3} s  \
         {:7.2} M tuples/s/core  ({matches} matches)",
        2.0 * n as f64 / total / threads as f64 / 1e6
    );
}

fn main() {
    let args = parse_args();
    let n = args.tuples;
    let threads = args.threads;
    let mut config = RadixConfig {
        threads,
        ..RadixConfig::default()
    };
    if let Some(c) = args.cache_bytes {
        config.cache_bytes = c;
    }
    if let Some(b) = args.max_bits_per_pass {
        config.max_bits_per_pass = b;
    }
    println!(
        "gyre-join kernels: 2 x {n} (u64 key, u64 payload) tuples, {threads} threads, \
         L2 {} KiB detected, radix cache budget {} KiB",
        gyre_join::l2_cache_bytes() / 1024,
        config.cache_bytes / 1024
    );

    let t = Instant::now();
    let mut rng = SmallRng::seed_from_u64(0x5EED);
    let mut build_keys: Vec<u64> = (1..=n as u64).collect();
    build_keys.shuffle(&mut rng);
    let build_payload: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    let probe_keys: Vec<u64> = (0..n).map(|_| build_keys[rng.random_range(0..n)]).collect();
    let probe_payload: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    println!("(data generated in {:.2} s, not counted)", secs(t));
    let (bk, pk) = (Keys::unsigned(&build_keys), Keys::unsigned(&probe_keys));
    let skip = |s: &str| args.skip.iter().any(|x| x == s);

    if !skip("radix") {
        let layout = RadixLayout::plan(n, &config).expect("layout");
        println!(
            "radix layout: partition passes {:?} bits, {} bucket bits",
            layout.pass_bits(),
            layout.bucket_bits()
        );
        let (setup, table) = best(args.reps, || {
            RadixHashTable::build(&bk, &config).expect("build")
        });
        config.probe_mode = ProbeMode::Partitioned;
        let (join, pairs) = best(args.reps, || table.probe(&pk, &config).expect("probe"));
        assert_eq!(pairs.len(), n, "every probe tuple matches exactly once");
        report("radix hash join", setup, join, n, threads, pairs.len());
        let (part, probe) = best(args.reps, || {
            PartitionedProbe::new(&pk, table.layout(), threads).expect("partition")
        });
        let (probe_only, _) = best(args.reps, || {
            table.join_partitioned(&probe, threads).expect("join")
        });
        println!("  join = partition probe side {part:.3} s + probe partitions {probe_only:.3} s");
        drop(probe);
        let t = Instant::now();
        let sum = gather(&pairs, &build_payload, &probe_payload);
        println!(
            "  + gathering both payloads: {:.3} s (checksum {sum:x})",
            secs(t)
        );
        drop(pairs);
        if !skip("direct") {
            config.probe_mode = ProbeMode::Direct;
            let (join, pairs) = best(args.reps, || table.probe(&pk, &config).expect("probe"));
            assert_eq!(pairs.len(), n);
            report(
                "  same, unpartitioned probe",
                setup,
                join,
                n,
                threads,
                pairs.len(),
            );
        }
        println!("  prepared build side: {} MiB", table.memory_bytes() >> 20);
    }

    if !skip("sort") {
        let (setup, (sb, sp)) = best(args.reps, || {
            (
                SortedKeys::sort(&bk, threads).expect("sort"),
                SortedKeys::sort(&pk, threads).expect("sort"),
            )
        });
        let (join, pairs) = best(args.reps, || {
            merge_join(&sp, &sb, MergePredicate::Eq, threads).expect("merge")
        });
        assert_eq!(pairs.len(), n);
        report("sort-merge join", setup, join, n, threads, pairs.len());
        let t = Instant::now();
        let band =
            merge_join(&sp, &sb, MergePredicate::Band { c1: 1, c2: 1 }, threads).expect("band");
        println!(
            "  band join |p - b| <= 1 on the sorted inputs: {:.3} s ({} matches)",
            secs(t),
            band.len()
        );
    }

    if !skip("sketch") {
        let m = args.sketch_keys;
        let mut rng = SmallRng::seed_from_u64(99);
        let zipf = Zipf::new(n.max(1) as u64, 1.25);
        let zipf_keys: Vec<u64> = (0..m)
            .map(|_| build_keys[zipf.sample(&mut rng) as usize - 1])
            .collect();
        let uniform_keys: Vec<u64> = (0..m).map(|_| build_keys[rng.random_range(0..n)]).collect();
        let few_keys: Vec<u64> = (0..m).map(|_| rng.random_range(0..100u64)).collect();
        for (name, keys) in [
            ("Zipf(1.25)", &zipf_keys),
            (&*format!("uniform over {n} keys"), &uniform_keys),
            ("uniform over 100 keys", &few_keys),
        ] {
            // One private histogram per thread over its share, merged afterwards, as
            // Flow-Join's worker threads do.
            let t = Instant::now();
            let chunk = keys.len().div_ceil(threads);
            let hists: Vec<SpaceSaving> = std::thread::scope(|s| {
                let hs: Vec<_> = keys
                    .chunks(chunk)
                    .map(|c| {
                        s.spawn(move || {
                            let mut h = SpaceSaving::default();
                            for &k in c {
                                h.update(k);
                            }
                            h
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let update = secs(t);
            let t = Instant::now();
            let mut merged = SpaceSaving::default();
            for h in &hists {
                merged.merge(h);
            }
            let merge = secs(t);
            let top = merged.candidates(0.01);
            println!(
                "SpaceSaving k=128, {name:<24} {:6.1} M updates/s/thread ({} threads, {m} keys), \
                 merge {:.1} us, {} keys over 1%",
                m as f64 / update / threads as f64 / 1e6,
                hists.len(),
                merge * 1e6,
                top.len()
            );
        }
    }
}
