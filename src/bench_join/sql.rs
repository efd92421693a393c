//! The partitioned joins of `gyre bench join` (`hash`, `flow`, `flow-fetch`) as SQL
//! users run them: the workload written as Parquet files, loaded with `CREATE EXTERNAL
//! TABLE`, and one join query per run through Flight SQL (or the embedded cluster's SQL
//! entry), with `SET gyre.skew_detection` choosing between DataFusion's partitioned
//! hash join and Flow-Join, and `SET gyre.skew_fetch` between Flow-Join's global
//! heavy-hitter list and fetch on demand.
//!
//! The workload is the one of *Scalable Distributed Query Processing in Parallel
//! Main-Memory Database Systems* (Rödiger), chapter 4: 64-bit keys and 64-bit
//! payloads. The build table has unique keys, hash-placed on the key, so it does not
//! move; the probe table's keys are drawn from the build keys, uniformly (`zipf` 0)
//! or Zipf-distributed (rank 1 = the first key number), and it lies where its files
//! were read, so the join shuffles it. Key numbers are spread over the 64-bit domain
//! by a bijective mix; the hash partitioning decides which worker owns a heavy key.
//!
//! Each run's figures: the query's time as the client sees it, and each worker's CPU
//! seconds and bytes on the wire over the query, from `gyre_workers()` read before and
//! after it. The result is a count and an order-independent checksum of the joined
//! payload pairs, which every strategy must agree on.

use super::{JoinResult, Processes};
use crate::bench_cluster::BoxError;
use crate::client::SqlRunner;
use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{
    DataType, Field, Float64Type, Int64Type, Schema, SchemaRef, UInt32Type, UInt64Type,
};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use gyre_cluster::protocol::{JoinFigures, JoinRun};
use gyre_join::Zipf;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// A strategy this path runs: its name and the session's settings for it.
pub struct SqlStrategy {
    pub name: &'static str,
    /// `gyre.skew_detection`.
    detection: &'static str,
    /// `gyre.skew_fetch`.
    fetch: &'static str,
    /// `gyre.join_kernel`.
    kernel: &'static str,
    /// `gyre.join_strategy`.
    join: &'static str,
    /// `gyre.neo_adaptive` and `gyre.neo_broadcast`: Neo-Join's skew handling.
    neo_skew: &'static str,
    /// `gyre.neo_schedule`.
    neo_schedule: &'static str,
}

const fn strategy(
    name: &'static str,
    [detection, fetch, kernel, join, neo_skew, neo_schedule]: [&'static str; 6],
) -> SqlStrategy {
    SqlStrategy {
        name,
        detection,
        fetch,
        kernel,
        join,
        neo_skew,
        neo_schedule,
    }
}

/// The strategies this path runs. `neo-radix` is the thesis' baseline for skew: plain
/// radix partitioning, no selective broadcast; `neo-radix-kernel` joins with the radix
/// kernel; `neo-open-shop` shuffles in the rounds of the open-shop schedule. Each
/// Neo-Join takes a partition count after a colon (`neo:256`: `gyre.neo_partitions`,
/// `auto` by default).
pub const STRATEGIES: [SqlStrategy; 9] = [
    strategy("hash", ["off", "off", "hash", "shuffle", "on", "free"]),
    strategy("auto", ["off", "off", "hash", "auto", "on", "free"]),
    strategy("flow", ["on", "off", "hash", "shuffle", "on", "free"]),
    strategy("flow-fetch", ["on", "on", "hash", "shuffle", "on", "free"]),
    strategy("radix", ["off", "off", "radix", "shuffle", "on", "free"]),
    strategy("neo", ["off", "off", "hash", "neo", "on", "free"]),
    strategy(
        "neo-open-shop",
        ["off", "off", "hash", "neo", "on", "open-shop"],
    ),
    strategy("neo-radix", ["off", "off", "hash", "neo", "off", "free"]),
    strategy(
        "neo-radix-kernel",
        ["off", "off", "radix", "neo", "on", "free"],
    ),
];

/// The strategy named `name` (`neo:P`: `neo` with P partitions), with its Neo-Join
/// partition count if it names one.
pub fn sql_strategy(name: &str) -> Result<(&'static SqlStrategy, Option<u32>), String> {
    let (base, partitions) = match name.split_once(':') {
        Some((base, p)) if base.starts_with("neo") => {
            let p = p
                .parse::<u32>()
                .ok()
                .filter(|p| (1..=1 << 16).contains(p))
                .ok_or_else(|| format!("'{name}': partitions from 1 to 65536, not '{p}'"))?;
            (base, Some(p))
        }
        _ => (name, None),
    };
    let strategy = STRATEGIES
        .iter()
        .find(|s| s.name == base)
        .ok_or_else(|| format!("'{name}' is not a SQL join strategy"))?;
    Ok((strategy, partitions))
}

/// The query every run times.
const QUERY: &str = "SELECT count(*) AS n, sum((b.pay * 1000003 + p.pay) % 1000000007) AS checksum \
     FROM bench_build b JOIN bench_probe p ON b.k = p.k";

/// Rows per record batch of the generated files.
const BATCH_ROWS: u64 = 65_536;

/// The workload of one configuration: what is loaded now.
#[derive(Debug, Clone, PartialEq)]
struct Workload {
    build_rows: u64,
    probe_rows: u64,
    zipf: f64,
    locality: Option<f64>,
    ordered_keys: bool,
    seed: u64,
}

impl Workload {
    fn of(run: &JoinRun) -> Self {
        Self {
            build_rows: run.build_rows,
            probe_rows: run.probe_rows,
            zipf: run.zipf,
            locality: run.locality,
            ordered_keys: run.ordered_keys,
            seed: run.seed,
        }
    }
}

/// Runs the SQL strategies on one cluster of `nodes` workers.
pub struct SqlJoins<'a> {
    runner: &'a dyn SqlRunner,
    nodes: usize,
    processes: Processes,
    /// Where the workload's files go: a directory every worker reads at the same path.
    dir: PathBuf,
    loaded: Option<Workload>,
    /// Per loaded workload and Flow-Join strategy: the heavy hitters it found on the
    /// first worker (from `EXPLAIN ANALYZE`).
    heavy_hitters: BTreeMap<String, String>,
    /// Per loaded workload: the strategies whose plan was checked (once each).
    plans_checked: Vec<String>,
}

impl<'a> SqlJoins<'a> {
    pub fn new(runner: &'a dyn SqlRunner, nodes: usize, processes: Processes, dir: &Path) -> Self {
        Self {
            runner,
            nodes,
            processes,
            dir: dir.to_path_buf(),
            loaded: None,
            heavy_hitters: BTreeMap::new(),
            plans_checked: vec![],
        }
    }

    /// One run of `run.strategy` (one of [`STRATEGIES`]), loading its
    /// workload first if another one is loaded.
    pub async fn run(&mut self, run: &JoinRun) -> Result<JoinResult, BoxError> {
        let (
            SqlStrategy {
                detection,
                fetch,
                kernel,
                join: strategy,
                neo_skew,
                neo_schedule,
                ..
            },
            partitions,
        ) = sql_strategy(&run.strategy)?;
        let partitions = partitions.map_or("auto".to_string(), |p| p.to_string());
        let (detection, fetch, kernel, strategy, neo_skew, neo_schedule) = (
            *detection,
            *fetch,
            *kernel,
            *strategy,
            *neo_skew,
            *neo_schedule,
        );
        let workload = Workload::of(run);
        if self.loaded.as_ref() != Some(&workload) {
            self.load(&workload).await?;
        }
        self.sql(&format!(
            "SET gyre.join_strategy = '{strategy}'; SET gyre.skew_detection = '{detection}'; \
             SET gyre.skew_fetch = '{fetch}'; SET gyre.join_kernel = '{kernel}'; \
             SET gyre.neo_adaptive = '{neo_skew}'; SET gyre.neo_broadcast = '{neo_skew}'; \
             SET gyre.neo_partitions = '{partitions}'; SET gyre.neo_schedule = '{neo_schedule}'"
        ))
        .await?;
        let flow = detection == "on";
        if !self.plans_checked.contains(&run.strategy) {
            let plan = self.plan_text(&format!("EXPLAIN {QUERY}")).await?;
            let fetches = plan.contains("fetch on demand");
            let radix = kernel == "radix";
            // Under `auto` the planner chooses: a Neo-Join that may choose hash
            // placement at run time where both inputs would be shuffled, else a
            // broadcast or placed join.
            let neo = strategy == "neo" || (strategy == "auto" && plan.contains("NeoJoinExec"));
            if plan.contains("FlowJoinExec") != flow
                || fetches != (flow && fetch == "on")
                || (plan.contains("RadixJoinExec") || plan.contains("kernel=radix")) != radix
                || plan.contains("NeoJoinExec") != neo
                || (neo && plan.contains("partitioning=radix") != (neo_skew == "off"))
                || (neo && !plan.contains(&format!("schedule={neo_schedule}")))
            {
                return Err(format!(
                    "the {} run's plan is not a {}:\n{plan}",
                    run.strategy,
                    match (flow, fetch) {
                        _ if radix && neo => "Neo-Join with the radix kernel",
                        _ if radix => "partitioned join with the radix kernel",
                        _ if neo && neo_skew == "off" => "Neo-Join with plain radix partitioning",
                        _ if neo => "Neo-Join",
                        (false, _) => "plain partitioned hash join",
                        (true, "on") => "Flow-Join fetching on demand",
                        _ => "Flow-Join with a global heavy-hitter list",
                    }
                )
                .into());
            }
            self.plans_checked.push(run.strategy.clone());
        }
        if flow && !self.heavy_hitters.contains_key(&run.strategy) {
            let analyzed = self.plan_text(&format!("EXPLAIN ANALYZE {QUERY}")).await?;
            self.heavy_hitters
                .insert(run.strategy.clone(), heavy_hitters_of(&analyzed));
        }
        let before = self.counters().await?;
        let start = Instant::now();
        let result = self.sql(QUERY).await?;
        let elapsed_s = start.elapsed().as_secs_f64();
        let after = self.counters().await?;
        let (results, checksum) = count_and_checksum(&result)?;
        let workers: Vec<JoinFigures> = after
            .iter()
            .map(|(node, a)| {
                let b = before.get(node).copied().unwrap_or_default();
                JoinFigures {
                    node: *node,
                    strategy: run.strategy.clone(),
                    build_rows_local: 0,
                    probe_rows_local: 0,
                    elapsed_s,
                    setup_s: 0.0,
                    join_s: elapsed_s,
                    sync_s: None,
                    tuples_joined: 0,
                    bytes_sent: a.bytes_sent.saturating_sub(b.bytes_sent),
                    bytes_received: a.bytes_received.saturating_sub(b.bytes_received),
                    results: 0,
                    checksum: 0,
                    details: vec![],
                    process_cpu_s: a.cpu.zip(b.cpu).map(|(a, b)| (a - b).max(0.0)),
                }
            })
            .collect();
        if workers.len() != self.nodes {
            return Err(format!(
                "{} workers answered, the cluster has {}",
                workers.len(),
                self.nodes
            )
            .into());
        }
        let cpus: Option<Vec<f64>> = workers.iter().map(|w| w.process_cpu_s).collect();
        let (cpu_s, imbalance) = match (cpus, self.processes) {
            (Some(c), Processes::OnePerWorker) => {
                let mean = c.iter().sum::<f64>() / c.len().max(1) as f64;
                let max = c.iter().copied().fold(0.0, f64::max);
                (Some(c.iter().sum()), Some(max / mean.max(1e-9)))
            }
            (Some(c), Processes::Shared) => (c.into_iter().reduce(f64::max), None),
            (None, _) => (None, None),
        };
        Ok(JoinResult {
            strategy: run.strategy.clone(),
            nodes: self.nodes,
            build_rows: workload.build_rows,
            probe_rows: workload.probe_rows,
            zipf: workload.zipf,
            locality: workload.locality,
            elapsed_s,
            tuples_per_sec: (workload.build_rows + workload.probe_rows) as f64
                / elapsed_s.max(1e-9),
            setup_s: None,
            join_s: None,
            sync_s: None,
            imbalance,
            cpu_s,
            results,
            checksum,
            heavy_hitters: self.heavy_hitters.get(&run.strategy).cloned(),
            workers,
        })
    }

    /// Writes `w` as Parquet (one file per worker and table) and loads it.
    async fn load(&mut self, w: &Workload) -> Result<(), BoxError> {
        self.loaded = None;
        self.heavy_hitters.clear();
        self.plans_checked.clear();
        self.sql("DROP TABLE IF EXISTS bench_build; DROP TABLE IF EXISTS bench_probe")
            .await?;
        let locality = w.locality.map(|x| format!("-l{x}")).unwrap_or_default();
        let dir = self.dir.join(format!(
            "z{}-b{}-p{}-s{}{locality}",
            w.zipf, w.build_rows, w.probe_rows, w.seed
        ));
        let started = Instant::now();
        eprintln!(
            "writing {} build and {} probe rows (Zipf {}{}) to {}...",
            w.build_rows,
            w.probe_rows,
            w.zipf,
            w.locality
                .map(|x| format!(", locality {x}"))
                .unwrap_or_default(),
            dir.display()
        );
        let (nodes, w2, d2) = (self.nodes, w.clone(), dir.clone());
        tokio::task::spawn_blocking(move || {
            write_workload(&d2, nodes, &w2).map_err(|e| e.to_string())
        })
        .await??;
        eprintln!("loading them into the cluster...");
        // With locality both tables stay where their files were read; without, the
        // build table is placed by the hash of its key, so only the probe side moves.
        let build_placement = match w.locality {
            Some(_) => "",
            None => " OPTIONS ('gyre.partition_by' 'k')",
        };
        self.sql(&format!(
            "CREATE EXTERNAL TABLE bench_build STORED AS PARQUET LOCATION '{}/build/'{build_placement}; \
             CREATE EXTERNAL TABLE bench_probe STORED AS PARQUET LOCATION '{}/probe/'",
            dir.display(),
            dir.display()
        ))
        .await?;
        eprintln!("  ready in {:.1} s", started.elapsed().as_secs_f64());
        self.loaded = Some(w.clone());
        Ok(())
    }

    async fn sql(&self, script: &str) -> Result<Vec<RecordBatch>, BoxError> {
        let mut last = vec![];
        for statement in crate::client::split_statements(script)? {
            let results = self.runner.run(&statement).await?;
            last = results.into_iter().flat_map(|r| r.batches).collect();
        }
        Ok(last)
    }

    /// The text of an `EXPLAIN` or `EXPLAIN ANALYZE`, all its rows and columns.
    async fn plan_text(&self, sql: &str) -> Result<String, BoxError> {
        let mut text = String::new();
        for b in self.sql(sql).await? {
            for column in b.columns() {
                let Some(strings) = column.as_any().downcast_ref::<StringArray>() else {
                    continue;
                };
                for s in strings.iter().flatten() {
                    text.push_str(s);
                    text.push('\n');
                }
            }
        }
        Ok(text)
    }

    /// Each worker's counters now.
    async fn counters(&self) -> Result<BTreeMap<u32, Counters>, BoxError> {
        let batches = self
            .sql("SELECT worker, cpu_seconds, bytes_sent, bytes_received FROM gyre_workers()")
            .await?;
        let mut out = BTreeMap::new();
        for b in batches {
            let (node, cpu, sent, received) = (
                b.column(0).as_primitive::<UInt32Type>(),
                b.column(1).as_primitive::<Float64Type>(),
                b.column(2).as_primitive::<UInt64Type>(),
                b.column(3).as_primitive::<UInt64Type>(),
            );
            for i in 0..b.num_rows() {
                out.insert(
                    node.value(i),
                    Counters {
                        cpu: cpu.is_valid(i).then(|| cpu.value(i)),
                        bytes_sent: sent.value(i),
                        bytes_received: received.value(i),
                    },
                );
            }
        }
        Ok(out)
    }
}

/// A worker's counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    cpu: Option<f64>,
    bytes_sent: u64,
    bytes_received: u64,
}

fn count_and_checksum(batches: &[RecordBatch]) -> Result<(u64, u64), BoxError> {
    let b = batches
        .iter()
        .find(|b| b.num_rows() == 1)
        .ok_or("the join query returned no row")?;
    let n = b.column(0).as_primitive::<Int64Type>().value(0);
    let sum = b.column(1).as_primitive::<Int64Type>();
    let checksum = if sum.is_null(0) { 0 } else { sum.value(0) };
    Ok((n as u64, checksum as u64))
}

/// The heavy hitters a Flow-Join's `EXPLAIN ANALYZE` names (the same on every worker).
fn heavy_hitters_of(plan: &str) -> String {
    plan.lines()
        .filter(|l| l.contains("FlowJoinExec"))
        .map(|l| {
            // The operator's own figures, before its metrics (which name more).
            let head = &l[..l.find(", metrics=").unwrap_or(l.len())];
            match head.find(" heavy_hitters=") {
                Some(from) => head[from + 1..].to_string(),
                None => "heavy_hitters=0".into(),
            }
        })
        .next()
        .unwrap_or_else(|| "no Flow-Join in the plan".into())
}

/// The splitmix64 finaliser: a bijection of 64-bit values.
fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The key of build key number `i` (unique, spread over the 64-bit domain).
fn key_of(i: u64) -> i64 {
    mix64(i ^ 0x5EED_0000_0000_0000) as i64
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("pay", DataType::Int64, false),
    ]))
}

/// Writes `dir/build/part-i.parquet` and `dir/probe/part-i.parquet` for each of the
/// `nodes` slices. Without locality, slice `i` of the build side holds key numbers
/// `i * b ..` (`b` the rows per slice, the payload is the key number) and slice `i` of
/// the probe side draws its key numbers from a generator seeded by `(seed, i)`, its
/// payload its global row number. With locality `x`, see [`build_slices`] and
/// [`ProbeDraw`].
fn write_workload(dir: &Path, nodes: usize, w: &Workload) -> Result<(), BoxError> {
    let share = |total: u64, i: usize| {
        let (q, r) = (total / nodes as u64, total % nodes as u64);
        let start = q * i as u64 + r.min(i as u64);
        start..start + q + u64::from((i as u64) < r)
    };
    let zipf = (w.zipf > 0.0 && w.build_rows > 0).then(|| Zipf::new(w.build_rows, w.zipf));
    let key = |number: u64| match w.ordered_keys {
        true => number as i64,
        false => key_of(number),
    };
    for side in ["build", "probe"] {
        std::fs::create_dir_all(dir.join(side))?;
    }
    let homes = w.locality.map(|_| homes(w.build_rows, nodes));
    let slices = match (&homes, w.locality) {
        (Some(h), Some(x)) => Some(build_slices(h, x, w.seed, |i| {
            let r = share(w.build_rows, i);
            (r.end - r.start) as usize
        })),
        _ => None,
    };
    for i in 0..nodes {
        let build = dir.join(format!("build/part-{i}.parquet"));
        match &slices {
            Some(slices) => {
                let slice = &slices[i];
                write_file(&build, 0..slice.len() as u64, |j| {
                    let number = slice[j as usize];
                    (key_of(number), number as i64)
                })?
            }
            None => write_file(&build, share(w.build_rows, i), |n| (key(n), n as i64))?,
        }
        let draw = ProbeDraw {
            zipf: zipf.as_ref(),
            build_rows: w.build_rows,
            local: homes
                .as_ref()
                .zip(w.locality)
                .map(|(h, x)| (x, h[i].as_slice(), i, nodes)),
        };
        let mut rng = SmallRng::seed_from_u64(mix64(w.seed ^ mix64(i as u64 + 1)));
        write_file(
            &dir.join(format!("probe/part-{i}.parquet")),
            share(w.probe_rows, i),
            |n| (key(draw.number(&mut rng)), n as i64),
        )?;
    }
    Ok(())
}

/// The worker whose range of the key domain holds `key`: the signed domain cut into
/// `nodes` equal ranges in key order, so that Neo-Join's order-preserving radix
/// partitions each fall into one range.
fn home(key: i64, nodes: usize) -> usize {
    let ordered = (key as u64) ^ (1 << 63);
    ((ordered as u128 * nodes as u128) >> 64) as usize
}

/// The build key numbers by the worker whose range holds their key, in number order.
fn homes(build_rows: u64, nodes: usize) -> Vec<Vec<u64>> {
    let mut homes = vec![vec![]; nodes];
    for number in 0..build_rows {
        homes[home(key_of(number), nodes)].push(number);
    }
    homes
}

/// The build side with locality `x`: slice `i` takes `x` of its `rows(i)` from the
/// numbers whose key lies in its range (all of them if there are fewer), and the rest
/// from the numbers left over by every slice, dealt out at random. Every number is in
/// exactly one slice.
fn build_slices(
    homes: &[Vec<u64>],
    x: f64,
    seed: u64,
    rows: impl Fn(usize) -> usize,
) -> Vec<Vec<u64>> {
    use rand::seq::SliceRandom;
    let mut rng = SmallRng::seed_from_u64(mix64(seed ^ 0xB0_11D));
    let mut slices = vec![];
    let mut pool = vec![];
    for (i, home) in homes.iter().enumerate() {
        let mut home = home.clone();
        home.shuffle(&mut rng);
        let local = ((x * rows(i) as f64).round() as usize).min(home.len());
        pool.extend(home.drain(local..));
        slices.push(home);
    }
    pool.shuffle(&mut rng);
    let mut pool = pool.into_iter();
    for (i, slice) in slices.iter_mut().enumerate() {
        let missing = rows(i).saturating_sub(slice.len());
        slice.extend(pool.by_ref().take(missing));
    }
    slices
}

/// How one probe slice draws its key numbers: from the build keys, uniformly or by
/// Zipf; with locality `(x, numbers, i, nodes)`, a share `x` of the draws is taken
/// from the same distribution restricted to the keys of slice `i`'s range (`numbers`).
struct ProbeDraw<'a> {
    zipf: Option<&'a Zipf>,
    build_rows: u64,
    local: Option<(f64, &'a [u64], usize, usize)>,
}

impl ProbeDraw<'_> {
    fn any(&self, rng: &mut SmallRng) -> u64 {
        match self.zipf {
            Some(z) => z.sample(rng) - 1,
            None => rng.random_range(0..self.build_rows.max(1)),
        }
    }

    fn number(&self, rng: &mut SmallRng) -> u64 {
        let Some((x, numbers, i, nodes)) = self.local else {
            return self.any(rng);
        };
        if numbers.is_empty() || rng.random::<f64>() >= x {
            return self.any(rng);
        }
        if self.zipf.is_some() {
            // Rejection: each range holds about 1/nodes of the mass, so this ends fast.
            for _ in 0..256 {
                let number = self.any(rng);
                if home(key_of(number), nodes) == i {
                    return number;
                }
            }
        }
        numbers[rng.random_range(0..numbers.len())]
    }
}

/// One Parquet file of the rows `rows`, each `(key, payload)` from `row`.
fn write_file(
    path: &Path,
    rows: std::ops::Range<u64>,
    mut row: impl FnMut(u64) -> (i64, i64),
) -> Result<(), BoxError> {
    let file = std::fs::File::create(path)?;
    // Row groups of one batch: the loader cuts files into splits at row-group bounds,
    // so the workers' shares line up with the files to within one small group.
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(BATCH_ROWS as usize))
        .build();
    let mut writer = ArrowWriter::try_new(file, schema(), Some(properties))?;
    let mut at = rows.start;
    while at < rows.end {
        let end = (at + BATCH_ROWS).min(rows.end);
        let (keys, pays): (Vec<i64>, Vec<i64>) = (at..end).map(&mut row).unzip();
        writer.write(&RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int64Array::from(pays)),
            ],
        )?)?;
        at = end;
    }
    writer.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of `side`'s files, file by file.
    fn read(dir: &Path, side: &str, files: usize) -> Vec<Vec<(i64, i64)>> {
        (0..files)
            .map(|i| {
                let file =
                    std::fs::File::open(dir.join(format!("{side}/part-{i}.parquet"))).unwrap();
                let reader =
                    datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(
                        file, 1024,
                    )
                    .unwrap();
                let mut rows = vec![];
                for b in reader {
                    let b = b.unwrap();
                    let (k, p) = (
                        b.column(0).as_primitive::<Int64Type>(),
                        b.column(1).as_primitive::<Int64Type>(),
                    );
                    rows.extend((0..b.num_rows()).map(|r| (k.value(r), p.value(r))));
                }
                rows
            })
            .collect()
    }

    /// With locality x on n workers, each file has exactly its share of rows, every
    /// build key once, and about x + (1-x)/n of a file's rows have keys in its range.
    #[test]
    fn locality_puts_that_share_of_each_files_keys_in_its_own_range() {
        let dir = tempfile::tempdir().unwrap();
        for (zipf, x) in [(0.0, 0.75), (1.0, 0.5), (0.0, 0.0), (0.0, 1.0)] {
            let w = Workload {
                build_rows: 40_000,
                probe_rows: 120_001,
                zipf,
                locality: Some(x),
                ordered_keys: false,
                seed: 3,
            };
            let sub = dir.path().join(format!("{zipf}-{x}"));
            write_workload(&sub, 4, &w).unwrap();
            let build = read(&sub, "build", 4);
            let probe = read(&sub, "probe", 4);
            assert_eq!(build.iter().map(Vec::len).collect::<Vec<_>>(), [10_000; 4]);
            assert_eq!(
                probe.iter().map(Vec::len).collect::<Vec<_>>(),
                [30_001, 30_000, 30_000, 30_000]
            );
            let mut numbers: Vec<i64> = build.iter().flatten().map(|r| r.1).collect();
            numbers.sort_unstable();
            assert!(
                numbers.iter().copied().eq(0..40_000),
                "every build key once"
            );
            assert!(build.iter().flatten().all(|r| r.0 == key_of(r.1 as u64)));
            let keys: std::collections::HashSet<i64> =
                build.iter().flatten().map(|r| r.0).collect();
            assert!(probe.iter().flatten().all(|r| keys.contains(&r.0)));
            for (side, files) in [("build", &build), ("probe", &probe)] {
                for (i, rows) in files.iter().enumerate() {
                    let own = rows.iter().filter(|r| home(r.0, 4) == i).count() as f64
                        / rows.len() as f64;
                    // Skewed probe keys: the rest is drawn from all keys, whose ranges
                    // do not hold a quarter each.
                    let (want, slack) = match (side, zipf > 0.0) {
                        ("probe", true) => (x, 0.25),
                        _ => (x + (1.0 - x) / 4.0, 0.02),
                    };
                    // A range holds 10,000 +- ~100 build keys: at locality 1 a file
                    // whose range holds fewer takes the rest from others.
                    assert!(
                        own >= want - 0.04 && own <= want + slack,
                        "{side} file {i}, Zipf {zipf}, locality {x}: {own} of its rows are its own"
                    );
                }
            }
        }
    }

    /// The slices cover every row once; build keys are unique; probe keys are build
    /// keys, and with skew the first key number is the most frequent. Ordered keys are
    /// the key numbers themselves.
    #[test]
    fn the_workload_covers_every_row_and_draws_probe_keys_from_the_build_keys() {
        for ordered_keys in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let w = Workload {
                build_rows: 1_000,
                probe_rows: 20_003,
                zipf: 1.25,
                locality: None,
                ordered_keys,
                seed: 7,
            };
            write_workload(dir.path(), 3, &w).unwrap();
            let read = |side: &str| read(dir.path(), side, 3).concat();
            let build = read("build");
            let probe = read("probe");
            assert_eq!((build.len(), probe.len()), (1_000, 20_003));
            let keys: std::collections::HashSet<i64> = build.iter().map(|r| r.0).collect();
            assert_eq!(keys.len(), 1_000);
            assert_eq!(keys == (0..1_000).collect(), ordered_keys);
            let mut payloads: Vec<i64> = probe.iter().map(|r| r.1).collect();
            payloads.sort_unstable();
            assert!(payloads.iter().copied().eq(0..20_003));
            assert!(probe.iter().all(|r| keys.contains(&r.0)));
            let key = |n: u64| if ordered_keys { n as i64 } else { key_of(n) };
            let first = probe.iter().filter(|r| r.0 == key(0)).count();
            let second = probe.iter().filter(|r| r.0 == key(1)).count();
            assert!(first > second && first > 20_003 / 10, "{first} {second}");
        }
    }

    #[test]
    fn heavy_hitters_are_read_from_the_flow_join_line() {
        let plan = "x\n  FlowJoinExec: skew detection, heavy_hitters=1 [7 (~49159 rows, round 0)], metrics=[a=1]\n";
        assert_eq!(
            heavy_hitters_of(plan),
            "heavy_hitters=1 [7 (~49159 rows, round 0)]"
        );
    }
}
