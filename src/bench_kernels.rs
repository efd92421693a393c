//! `gyre bench kernels`: the local join kernels of crates/join next to
//! DataFusion's own hash join, on the same in-memory data, in one run.
//!
//! Workload: a build relation of N (key, payload) tuples with unique keys
//! 1..=N in random order, and a probe relation of N tuples whose keys are drawn
//! uniformly from the build keys (a foreign-key join: every probe tuple matches
//! once). Each engine runs the join twice: producing only the matches
//! (`count(*)`), and reading both payloads of every match (`sum(b.v + p.v)`).
//! The rate is (|build| + |probe|) / seconds / threads, best of `--reps` runs.

use arrow::array::{RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use clap::Args;
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use gyre_join::{Keys, MergePredicate, RadixConfig, RadixHashTable, SortedKeys, merge_join};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

type BoxError = Box<dyn std::error::Error>;

#[derive(Args, Clone)]
pub struct KernelArgs {
    /// Tuples per relation.
    #[arg(long, default_value_t = 16_000_000)]
    tuples: usize,
    /// Threads for every engine (DataFusion: target partitions).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Runs per measurement; the fastest is reported (the machine is shared).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Measurement {
    engine: &'static str,
    variant: &'static str,
    seconds: f64,
    /// Of which the setup phase (hash table or sort of the build side), where separate.
    setup_seconds: Option<f64>,
    tuples_per_sec_per_core: f64,
    result: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    tuples: usize,
    threads: usize,
    reps: usize,
    measurements: Vec<Measurement>,
}

struct Data {
    build_k: Vec<u64>,
    build_v: Vec<u64>,
    probe_k: Vec<u64>,
    probe_v: Vec<u64>,
}

fn generate(n: usize) -> Data {
    let mut rng = SmallRng::seed_from_u64(42);
    let mut build_k: Vec<u64> = (1..=n as u64).collect();
    build_k.shuffle(&mut rng);
    let build_v = (0..n as u64).map(|i| i * 3).collect();
    let probe_k = (0..n).map(|_| rng.random_range(1..=n as u64)).collect();
    let probe_v = (0..n as u64).map(|i| i * 5).collect();
    Data {
        build_k,
        build_v,
        probe_k,
        probe_v,
    }
}

/// Fastest of `reps` runs of `f`, with its result.
fn best<T>(reps: usize, mut f: impl FnMut() -> Result<T, BoxError>) -> Result<(f64, T), BoxError> {
    let mut best = (f64::INFINITY, None);
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        let r = f()?;
        let t = start.elapsed().as_secs_f64();
        if t < best.0 {
            best = (t, Some(r));
        }
    }
    Ok((best.0, best.1.expect("at least one run")))
}

/// The payload sum of the matches, read through the index pairs (as a gather would).
fn payload_sum(pairs: &gyre_join::JoinPairs, d: &Data) -> u64 {
    pairs
        .left
        .iter()
        .zip(&pairs.right)
        .map(|(&l, &r)| d.build_v[l as usize].wrapping_add(d.probe_v[r as usize]))
        .fold(0u64, u64::wrapping_add)
}

pub async fn run(args: KernelArgs) -> Result<(), BoxError> {
    let (n, t) = (args.tuples, args.threads.max(1));
    eprintln!("generating 2 x {n} (key, payload) tuples...");
    let d = generate(n);
    let rate = |secs: f64| 2.0 * n as f64 / secs / t as f64;
    let mut out = vec![];

    let build_keys = Keys::unsigned(&d.build_k);
    let probe_keys = Keys::unsigned(&d.probe_k);
    let config = RadixConfig {
        threads: t,
        ..RadixConfig::default()
    };
    for (variant, gather) in [("matches", false), ("payload sum", true)] {
        eprintln!("radix hash join ({variant})...");
        let (secs, (setup, result)) = best(args.reps, || {
            let start = Instant::now();
            let table = RadixHashTable::build(&build_keys, &config)?;
            let setup = start.elapsed().as_secs_f64();
            let pairs = table.probe(&probe_keys, &config)?;
            let result = if gather {
                payload_sum(&pairs, &d)
            } else {
                pairs.len() as u64
            };
            Ok((setup, result))
        })?;
        out.push(Measurement {
            engine: "gyre radix hash join",
            variant,
            seconds: secs,
            setup_seconds: Some(setup),
            tuples_per_sec_per_core: rate(secs),
            result,
        });
        eprintln!("sort-merge join ({variant})...");
        let (secs, (setup, result)) = best(args.reps, || {
            let start = Instant::now();
            let left = SortedKeys::sort(&build_keys, t)?;
            let right = SortedKeys::sort(&probe_keys, t)?;
            let setup = start.elapsed().as_secs_f64();
            let pairs = merge_join(&left, &right, MergePredicate::Eq, t)?;
            let result = if gather {
                payload_sum(&pairs, &d)
            } else {
                pairs.len() as u64
            };
            Ok((setup, result))
        })?;
        out.push(Measurement {
            engine: "gyre sort-merge join",
            variant,
            seconds: secs,
            setup_seconds: Some(setup),
            tuples_per_sec_per_core: rate(secs),
            result,
        });
    }

    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(t));
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::UInt64, false),
        Field::new("v", DataType::UInt64, false),
    ]));
    let table = |k: &[u64], v: &[u64]| -> Result<Arc<MemTable>, BoxError> {
        let rows = k.len().div_ceil(t);
        let mut parts = vec![];
        for (kc, vc) in k.chunks(rows.max(1)).zip(v.chunks(rows.max(1))) {
            let mut batches = vec![];
            for (kb, vb) in kc.chunks(8192).zip(vc.chunks(8192)) {
                batches.push(RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(UInt64Array::from(kb.to_vec())),
                        Arc::new(UInt64Array::from(vb.to_vec())),
                    ],
                )?);
            }
            parts.push(batches);
        }
        Ok(Arc::new(MemTable::try_new(Arc::clone(&schema), parts)?))
    };
    ctx.register_table("build", table(&d.build_k, &d.build_v)?)?;
    ctx.register_table("probe", table(&d.probe_k, &d.probe_v)?)?;
    for (variant, sql) in [
        (
            "matches",
            "SELECT count(*) FROM probe p JOIN build b ON p.k = b.k",
        ),
        (
            "payload sum",
            "SELECT sum(b.v + p.v) FROM probe p JOIN build b ON p.k = b.k",
        ),
    ] {
        eprintln!("DataFusion hash join ({variant})...");
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        let mut secs = f64::INFINITY;
        let mut result = 0;
        for _ in 0..args.reps.max(1) {
            let start = Instant::now();
            let batches =
                datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;
            secs = secs.min(start.elapsed().as_secs_f64());
            let col = batches[0].column(0);
            result = match col.as_any().downcast_ref::<UInt64Array>() {
                Some(a) => a.value(0),
                None => arrow::compute::cast(col, &DataType::UInt64)?
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .map_or(0, |a| a.value(0)),
            };
        }
        out.push(Measurement {
            engine: "DataFusion hash join",
            variant,
            seconds: secs,
            setup_seconds: None,
            tuples_per_sec_per_core: rate(secs),
            result,
        });
    }

    println!(
        "{:<24} {:<12} {:>9} {:>9} {:>16} {:>22}",
        "engine", "variant", "seconds", "setup s", "M tuples/s/core", "result"
    );
    for m in &out {
        println!(
            "{:<24} {:<12} {:>9.3} {:>9} {:>16.1} {:>22}",
            m.engine,
            m.variant,
            m.seconds,
            m.setup_seconds
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "-".into()),
            m.tuples_per_sec_per_core / 1e6,
            m.result
        );
    }
    // Every engine must agree, or the figures mean nothing.
    for variant in ["matches", "payload sum"] {
        let results: Vec<u64> = out
            .iter()
            .filter(|m| m.variant == variant)
            .map(|m| m.result)
            .collect();
        if results.windows(2).any(|w| w[0] != w[1]) {
            return Err(format!("the engines disagree on '{variant}': {results:?}").into());
        }
    }
    if let Some(path) = &args.json {
        let report = Report {
            tuples: n,
            threads: t,
            reps: args.reps,
            measurements: out,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}
