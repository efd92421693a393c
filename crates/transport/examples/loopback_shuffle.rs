//! Loopback micro-benchmark of the communication layer: an all-to-all
//! repartition among 2 and 4 nodes in this process (each with its own
//! multiplexer thread and TCP connections over 127.0.0.1), under both
//! schedules, next to a plain memcpy of the same bytes, to show what the layer
//! costs.
//!
//! ```text
//! cargo run --release -p gyre-transport --example loopback_shuffle [-- TOTAL_BYTES]
//! ```
//!
//! GB/s is payload bytes that crossed a socket per second of wall time; CPU
//! s/GB is the CPU time of the whole process (senders, receivers and
//! multiplexers of all nodes) per GB moved.

use gyre_transport::bench::{Pattern, ShuffleSpec, run_shuffle};
use gyre_transport::{NodeId, Schedule, TcpTransport, Transport, TransportConfig, cpu};
use std::time::{Duration, Instant};

async fn cluster(n: usize) -> Vec<TcpTransport> {
    let ids: Vec<NodeId> = (1..=n as NodeId).collect();
    gyre_transport::loopback_cluster(&ids, TransportConfig::default())
        .await
        .expect("a loopback cluster")
}

async fn shuffle(n: usize, total: u64, schedule: Schedule, run_id: u64) {
    let nodes = cluster(n).await;
    let ids: Vec<NodeId> = nodes.iter().map(|t| t.node_id()).collect();
    let cpu0 = cpu::process_cpu();
    let start = Instant::now();
    let handles: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let t = t.clone();
            let spec = ShuffleSpec {
                nodes: ids.clone(),
                index: i,
                pattern: Pattern::Repartition,
                total_bytes: total,
                message_size: t.message_size(),
                schedule,
                run_id,
            };
            tokio::spawn(async move { run_shuffle(&t, &spec).await })
        })
        .collect();
    let mut reports = vec![];
    for h in handles {
        reports.push(h.await.expect("task").expect("shuffle"));
    }
    let wall = start.elapsed();
    let cpu = cpu0.zip(cpu::process_cpu()).map(|(a, b)| b - a);
    let moved: u64 = reports.iter().map(|r| r.bytes_sent).sum();
    let elapsed = reports.iter().map(|r| r.elapsed).max().unwrap();
    let mux: Duration = reports.iter().filter_map(|r| r.mux_cpu).sum();
    let gb = moved as f64 / 1e9;
    println!(
        "repartition {n} nodes {:<18} {:6.2} GB in {:6.3} s: {:6.2} GB/s, CPU {:6.2} s/GB \
         (multiplexer threads {:5.2} s/GB; wall incl. barriers {:.3} s)",
        schedule.to_string(),
        gb,
        elapsed.as_secs_f64(),
        gb / elapsed.as_secs_f64(),
        cpu.map_or(f64::NAN, |c| c.as_secs_f64() / gb),
        mux.as_secs_f64() / gb,
        wall.as_secs_f64(),
    );
    for t in &nodes {
        t.shutdown();
    }
}

fn memcpy(total: u64, chunk: usize) {
    let src: Vec<u8> = (0..64 << 20).map(|i: u32| i as u8).collect();
    let mut dst = vec![0u8; 64 << 20];
    let chunks = (src.len() / chunk).max(1);
    let cpu0 = cpu::process_cpu();
    let start = Instant::now();
    let mut copied = 0u64;
    let mut i = 0;
    while copied < total {
        let at = (i % chunks) * chunk;
        dst[at..at + chunk].copy_from_slice(&src[at..at + chunk]);
        std::hint::black_box(&dst);
        copied += chunk as u64;
        i += 1;
    }
    let elapsed = start.elapsed();
    let cpu = cpu0.zip(cpu::process_cpu()).map(|(a, b)| b - a);
    let gb = copied as f64 / 1e9;
    println!(
        "memcpy of the same bytes     {:6.2} GB in {:6.3} s: {:6.2} GB/s, CPU {:6.2} s/GB",
        gb,
        elapsed.as_secs_f64(),
        gb / elapsed.as_secs_f64(),
        cpu.map_or(f64::NAN, |c| c.as_secs_f64() / gb),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let total: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("TOTAL_BYTES must be a number"))
        .unwrap_or(2_000_000_000);
    println!(
        "loopback shuffle of {total} bytes, messages of {} KiB, {} cores",
        TransportConfig::default().message_size / 1024,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut run_id = 0;
    for n in [2, 4] {
        for schedule in [Schedule::Free, Schedule::phased()] {
            run_id += 1;
            shuffle(n, total, schedule, run_id).await;
        }
    }
    memcpy(total, TransportConfig::default().message_size);
}
