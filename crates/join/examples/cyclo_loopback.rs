//! Cyclo-join on in-process Data Roundabout rings over loopback TCP: prints every node's
//! figures (setup, join and sync time, bytes, results) for each ring size, and checks
//! that every ring size returns the same result (count and checksum).
//!
//! ```text
//! cargo run --release -p gyre-join --example cyclo_loopback -- \
//!     --rings 1,2,4 --r-rows 4000000 --s-rows 4000000 --algorithm hash --zipf 0
//! ```
//!
//! Algorithms: hash, sort-merge, band:C, lt, le, gt, ge, nl-band:C, theta:M:K (see
//! `gyre_join::cyclo::parse_algorithm`). All nodes share this machine's cores, so with
//! more nodes than cores the figures show contention, not scaling; the emulated cluster
//! (`gyre bench join --strategy cyclo`) gives every node its own share.

use std::time::Instant;

use gyre_join::cyclo::{
    CycloSpec, ForwardPolicy, Rotate, format_table, loopback_ring, parse_algorithm, run_on,
};
use gyre_transport::TransportConfig;

fn usage() -> ! {
    eprintln!(
        "flags: --rings 1,2,4 --r-rows N --s-rows N --zipf Z --zipf-s Z --algorithm A --threads T \
         --buffers B --buffer-bytes BYTES --forward arrival|after-join --no-prepare \
         --rotate smaller|left|right --seed S"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let mut rings = vec![1usize, 2, 4];
    let mut spec = CycloSpec::new(vec![], 0, parse_algorithm("hash").unwrap());
    spec.r_rows = 2_000_000;
    spec.s_rows = 2_000_000;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--rings" => {
                rings = value()
                    .split(',')
                    .map(|s| s.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--r-rows" => spec.r_rows = value().parse().unwrap_or_else(|_| usage()),
            "--s-rows" => spec.s_rows = value().parse().unwrap_or_else(|_| usage()),
            "--zipf" => spec.zipf = value().parse().unwrap_or_else(|_| usage()),
            "--zipf-s" => spec.zipf_s = value().parse().unwrap_or_else(|_| usage()),
            "--seed" => spec.seed = value().parse().unwrap_or_else(|_| usage()),
            "--threads" => spec.options.threads = value().parse().unwrap_or_else(|_| usage()),
            "--buffers" => {
                spec.options.roundabout.buffers = value().parse().unwrap_or_else(|_| usage())
            }
            "--buffer-bytes" => {
                spec.options.roundabout.buffer_bytes = value().parse().unwrap_or_else(|_| usage())
            }
            "--forward" => {
                spec.options.roundabout.forward = match value().as_str() {
                    "arrival" => ForwardPolicy::OnArrival,
                    "after-join" => ForwardPolicy::AfterJoin,
                    _ => usage(),
                }
            }
            "--no-prepare" => spec.options.prepare_rotating = false,
            "--rotate" => {
                spec.options.rotate = match value().as_str() {
                    "smaller" => Rotate::Smaller,
                    "left" => Rotate::Left,
                    "right" => Rotate::Right,
                    _ => usage(),
                }
            }
            "--algorithm" => {
                spec.algorithm = parse_algorithm(&value()).unwrap_or_else(|e| {
                    eprintln!("{e}");
                    usage()
                })
            }
            _ => usage(),
        }
    }
    println!(
        "cyclo-join {}: |R| = {}, |S| = {}, zipf R {} S {}, threads {} per node, {} buffers of {} KiB, \
         forward {:?}, prepare rotating {}",
        spec.algorithm.describe(),
        spec.r_rows,
        spec.s_rows,
        spec.zipf,
        spec.zipf_s,
        spec.options.threads,
        spec.options.roundabout.buffers,
        spec.options.roundabout.buffer_bytes >> 10,
        spec.options.roundabout.forward,
        spec.options.prepare_rotating
    );
    let mut totals = vec![];
    for (k, &n) in rings.iter().enumerate() {
        let ring = loopback_ring(n, TransportConfig::default())
            .await
            .expect("loopback ring");
        spec.run_id = k as u64 + 1;
        let start = Instant::now();
        let figures = match run_on(&ring, &spec).await {
            Ok(f) => f,
            Err(e) => {
                eprintln!("ring of {n} failed: {e}");
                std::process::exit(1);
            }
        };
        print!("{}", format_table(&figures));
        println!(
            "wall time of the ring {:.1} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
        totals.push((
            figures.iter().map(|f| f.results).sum::<u64>(),
            figures.iter().fold(0u64, |a, f| a.wrapping_add(f.checksum)),
        ));
        for t in &ring {
            t.shutdown();
        }
    }
    if totals.windows(2).all(|w| w[0] == w[1]) {
        println!("all ring sizes returned the same result");
    } else {
        eprintln!("ring sizes disagree: {totals:?}");
        std::process::exit(1);
    }
}
