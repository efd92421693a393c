//! `gyre bench shuffle`: the communication layer against the physical limit.
//!
//! Every worker sends synthetic messages to the others through its
//! multiplexer (`gyre_transport::bench`), all at once, and reports what it
//! sent and received and how long it took. Three ways to run it:
//!
//! - `--link RATE` (default): builds an emulated cluster of `--nodes` hosts
//!   (crates/testbed), measures one host's link capacity with a raw TCP stream
//!   in the same run, runs the shuffles from inside the coordinator's host,
//!   and tears the cluster down;
//! - `--link loopback`: an embedded cluster in this process over loopback TCP,
//!   next to a plain memcpy of the same bytes; `--carrier tcp,shm` adds the
//!   RDMA-aware shuffle's `--design`s (`gyre_transport::design`) over the
//!   shared-memory carrier, as many nodes in this process, each run
//!   alternating between all, with `--threads` sending tasks per node
//!   (through one endpoint per node for the SE designs, one per task for ME);
//! - `--connect ADDR`: an existing cluster (`--capacity RATE` for utilisation).
//!
//! Utilisation is payload bytes per second over the measured capacity (TCP
//! payload bytes per second of one raw stream on the same links).
//!
//! `--encrypt-links off,on` runs every configuration on clear and on sealed
//! links (`gyre_transport::seal`): on loopback both clusters run side by side,
//! each run alternating between them; emulated clusters are built one after
//! the other.

use crate::bench_cluster::{
    BoxError, EmulatedCluster, human_bytes, list, with_progress, write_outputs,
};
use clap::Args;
use gyre_cluster::protocol::{ControlClient, Request, Response, ShuffleFigures, ShuffleRun};
use gyre_cluster::{Coordinator, LocalCluster};
use gyre_testbed::{ClusterName, CpuQuota, LinkRate};
use gyre_transport::bench::Senders;
use gyre_transport::design::Design;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Clone)]
pub struct ShuffleArgs {
    /// Workers (emulated hosts, or embedded workers with `--link loopback`).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Link rate of every emulated host (1gbit, 10gbit, 500mbit, ...), or `loopback`.
    #[arg(long, default_value = "1gbit")]
    link: String,
    /// repartition, broadcast, or both separated by a comma.
    #[arg(long, default_value = "repartition")]
    pattern: String,
    /// Bytes all workers send together: 4GB, 512MiB, ...
    #[arg(long, default_value = "1GB")]
    bytes: String,
    /// free, phased, or both separated by a comma.
    #[arg(long, default_value = "free")]
    schedule: String,
    /// Bytes per message (at most the transport's 512 KiB buffers).
    #[arg(long, default_value = "512KiB")]
    message_size: String,
    /// CPU quota of every emulated host (e.g. 0.5).
    #[arg(long)]
    cpus: Option<CpuQuota>,
    /// Data links clear (off), sealed (on), or both separated by a comma.
    #[arg(long, default_value = "off")]
    encrypt_links: String,
    /// Carriers, separated by commas: tcp (the multiplexed TCP transport) and,
    /// with `--link loopback`, shm (the shared-memory carrier, with `--design`).
    #[arg(long, default_value = "tcp")]
    carrier: String,
    /// Endpoint designs of the shm carrier, separated by commas: the RDMA-aware
    /// shuffle's eight, {me,se}{mq,sq}-{sr,rd,wr}: one endpoint per sending
    /// thread (me) or one per node (se); send/receive on connections (mq-sr) or
    /// over datagrams (sq-sr: messages of at most 4 KiB, so `--message-size` is
    /// capped for it), RDMA Read (mq-rd) or RDMA Write (mq-wr).
    #[arg(long, default_value = "memq-sr")]
    design: String,
    /// Sending threads per shared-memory node, separated by commas (each run
    /// with each).
    #[arg(long, default_value = "1")]
    threads: String,
    /// Receive buffers per stream of the shm designs, separated by commas (each
    /// run with each): `default` (the design's window), a count, `bdp` (the
    /// bandwidth-delay product of the memcpy rate and a round trip measured
    /// over the design), or `adaptive` (send/receive designs: windows from 2
    /// up, lent from a pool per node; the RDMA-aware shuffle's section 6).
    #[arg(long, default_value = "default")]
    buffers: String,
    /// Busy nanoseconds per KiB a shm receiver spends on each message while it
    /// holds it (a compute-intensive receiving fragment), separated by commas.
    #[arg(long, default_value = "0")]
    consume: String,
    /// Runs of each configuration.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Use the running cluster whose coordinator is at ADDR instead of building one.
    #[arg(long)]
    connect: Option<String>,
    /// With `--connect`: the link capacity to compute utilisation against (e.g. 955mbit).
    #[arg(long)]
    capacity: Option<LinkRate>,
    /// Name of the emulated cluster (namespaces gyre-NAME-*).
    #[arg(long, default_value = "bench")]
    name: ClusterName,
    /// Write the results as JSON (`-`: standard output, nothing else printed there).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the results as an SVG plot.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// One configuration's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShuffleResult {
    /// The carrier and endpoint design: `tcp` (the TCP carrier), or `shm/`
    /// and one of the RDMA-aware shuffle's designs.
    #[serde(default = "tcp")]
    pub design: String,
    pub pattern: String,
    pub schedule: String,
    /// Whether the data links were sealed.
    #[serde(default)]
    pub encrypted: bool,
    pub total_bytes: u64,
    pub message_size: u64,
    /// Sending threads per node.
    #[serde(default = "one")]
    pub threads: usize,
    /// Receive buffers per stream (`default`, a count, `bdp=N`, `adaptive`).
    #[serde(default = "default_buffers")]
    pub buffers: String,
    /// Busy nanoseconds per KiB received that each receiver spent.
    #[serde(default)]
    pub consume_ns_per_kib: u64,
    pub workers: Vec<ShuffleFigures>,
    /// Slowest worker, from start to its last byte sent and received.
    pub elapsed_s: f64,
    /// Payload bytes all workers sent, per second of `elapsed_s`.
    pub aggregate_bytes_per_sec: f64,
    /// CPU seconds of the worker processes (all of them, or the one shared process of
    /// an embedded cluster) per GB (1e9 bytes) of payload sent.
    pub cpu_s_per_gb: Option<f64>,
    /// Smallest per-worker send or receive rate over the capacity.
    pub min_utilisation: Option<f64>,
}

fn tcp() -> String {
    Design::Tcp.to_string()
}

fn one() -> usize {
    1
}

fn default_buffers() -> String {
    "default".into()
}

/// How many receive buffers a shm design's streams get (`--buffers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Buffers {
    Default,
    Fixed(u32),
    /// The bandwidth-delay product, computed per design before the runs.
    Bdp,
    Adaptive,
}

impl std::str::FromStr for Buffers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "default" => Ok(Self::Default),
            "bdp" => Ok(Self::Bdp),
            "adaptive" => Ok(Self::Adaptive),
            n => match n.parse::<u32>() {
                Ok(n) if (1..=4096).contains(&n) => Ok(Self::Fixed(n)),
                _ => Err(format!(
                    "--buffers: '{s}' is not default, bdp, adaptive or a count from 1 to 4096"
                )),
            },
        }
    }
}

/// What `gyre bench shuffle` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShuffleBenchReport {
    pub nodes: usize,
    pub link: String,
    pub cpus: Option<f64>,
    /// Payload bytes per second one raw TCP stream carried between two hosts.
    pub capacity_bytes_per_sec: Option<f64>,
    /// With `--link loopback`: a memcpy of the same bytes in this process.
    pub memcpy: Option<Memcpy>,
    pub runs: Vec<ShuffleResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Memcpy {
    pub bytes_per_sec: f64,
    pub cpu_s_per_gb: f64,
}

/// Parses `4GB`, `512MiB`, `1000` (decimal units are powers of 1000, binary of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 4GB, 512MiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit '{other}' in '{s}'")),
    };
    let v = n * mult;
    if !(v.is_finite() && v >= 1.0) {
        return Err(format!("'{s}' is not a positive size"));
    }
    Ok(v as u64)
}

impl ShuffleArgs {
    /// The `--encrypt-links` settings to run, in order.
    fn sealing(&self) -> Result<Vec<bool>, BoxError> {
        let settings = list(&self.encrypt_links)
            .into_iter()
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "off" | "false" | "no" => Ok(false),
                "on" | "true" | "yes" => Ok(true),
                _ => Err(format!("--encrypt-links: '{v}' is not off or on")),
            })
            .collect::<Result<Vec<bool>, String>>()?;
        if settings.is_empty() {
            return Err("--encrypt-links: give off, on, or both".into());
        }
        Ok(settings)
    }

    /// What to run, in order: `tcp` for the TCP carrier, then the `--design`s of
    /// the shm carrier.
    fn designs(&self) -> Result<Vec<Design>, BoxError> {
        let mut designs = vec![];
        for carrier in list(&self.carrier) {
            match carrier.as_str() {
                "tcp" => designs.push(Design::Tcp),
                "shm" => {
                    for d in list(&self.design) {
                        let d = d.parse::<Design>().map_err(|e| format!("--design: {e}"))?;
                        if d == Design::Tcp {
                            return Err("--design: tcp is the tcp carrier's (--carrier tcp)".into());
                        }
                        designs.push(d);
                    }
                }
                other => {
                    return Err(format!(
                        "--carrier: unknown carrier '{other}' (expected tcp or shm; verbs \
                         is not built yet)"
                    )
                    .into());
                }
            }
        }
        if designs.is_empty() {
            return Err("--carrier: give tcp, shm, or both".into());
        }
        let loopback = self.link.eq_ignore_ascii_case("loopback");
        if designs.iter().any(|d| *d != Design::Tcp) && (!loopback || self.connect.is_some()) {
            return Err("--carrier shm: its nodes run in this process; use --link loopback".into());
        }
        Ok(designs)
    }

    /// The `--buffers` settings of the shared-memory designs, checked against them.
    fn buffers(&self, designs: &[Design]) -> Result<Vec<Buffers>, BoxError> {
        use gyre_transport::design::Primitive;
        let settings = list(&self.buffers)
            .iter()
            .map(|b| b.parse::<Buffers>())
            .collect::<Result<Vec<_>, _>>()?;
        if settings.is_empty() {
            return Err("--buffers: give at least one setting".into());
        }
        let one_sided = designs
            .iter()
            .any(|d| matches!(d.primitive(), Some(Primitive::Read | Primitive::Write)));
        if settings.contains(&Buffers::Adaptive) && one_sided {
            return Err(
                "--buffers adaptive: adaptive buffers serve the send/receive designs \
                        (*-sr)"
                    .into(),
            );
        }
        Ok(settings)
    }

    /// The `--consume` costs, in nanoseconds per KiB.
    fn consume(&self) -> Result<Vec<u64>, BoxError> {
        let costs = list(&self.consume)
            .iter()
            .map(|c| match c.parse::<u64>() {
                Ok(n) if n <= 10_000_000 => Ok(n),
                _ => Err(format!(
                    "--consume: '{c}' is not nanoseconds per KiB (0 to 10000000)"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if costs.is_empty() {
            return Err("--consume: give at least one cost".into());
        }
        Ok(costs)
    }

    /// The `--threads` to run the shared-memory designs with.
    fn threads(&self) -> Result<Vec<usize>, BoxError> {
        let threads = list(&self.threads)
            .iter()
            .map(|t| match t.parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => Ok(n),
                _ => Err(format!(
                    "--threads: '{t}' is not a count of threads from 1 to 64"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if threads.is_empty() {
            return Err("--threads: give at least one count".into());
        }
        Ok(threads)
    }

    fn runs(&self) -> Result<Vec<ShuffleRun>, BoxError> {
        let total_bytes = parse_size(&self.bytes)?;
        let message_size = parse_size(&self.message_size)?;
        let mut runs = vec![];
        for pattern in list(&self.pattern) {
            pattern
                .parse::<gyre_transport::bench::Pattern>()
                .map_err(|e| format!("--pattern: {e}"))?;
            for schedule in list(&self.schedule) {
                schedule
                    .parse::<gyre_transport::Schedule>()
                    .map_err(|e| format!("--schedule: {e}"))?;
                for _ in 0..self.repeat.max(1) {
                    runs.push(ShuffleRun {
                        run_id: 0,
                        nodes: vec![],
                        pattern: pattern.clone(),
                        total_bytes,
                        message_size,
                        schedule: schedule.clone(),
                    });
                }
            }
        }
        if runs.is_empty() {
            return Err("no pattern or schedule to run".into());
        }
        Ok(runs)
    }
}

pub async fn run(args: ShuffleArgs) -> Result<(), BoxError> {
    if args.nodes < 2 {
        return Err("--nodes: a shuffle needs at least two workers".into());
    }
    let runs = args.runs()?;
    let sealing = args.sealing()?;
    let designs = args.designs()?;
    args.threads()?;
    args.buffers(&designs)?;
    args.consume()?;
    let report = if let Some(addr) = &args.connect {
        let [encrypted] = sealing[..] else {
            return Err(
                "with --connect, give the one --encrypt-links setting the cluster runs \
                        with"
                    .into(),
            );
        };
        let client =
            ControlClient::connect_lazy(addr, crate::cluster_key()?, gyre_transport::COORDINATOR)?;
        let mut results = vec![];
        for run in runs {
            let mut r = remote_run(&client, run).await?;
            r.encrypted = encrypted;
            results.push(r);
        }
        let capacity = args.capacity.map(|c| c.bits_per_sec() as f64 / 8.0);
        report(&args, capacity, None, results)
    } else if args.link.eq_ignore_ascii_case("loopback") {
        loopback(&args, runs, &sealing, &designs).await?
    } else {
        emulated(&args, &sealing).await?
    };
    emit(&args, &report)
}

/// Runs one configuration on the cluster behind `client`, showing progress meanwhile.
async fn remote_run(client: &ControlClient, run: ShuffleRun) -> Result<ShuffleResult, BoxError> {
    let label = format!(
        "shuffling: {} of {} with the {} schedule",
        run.pattern,
        human_bytes(run.total_bytes as f64),
        run.schedule
    );
    let request = Request::BenchShuffle(run.clone());
    let figures = with_progress(&label, client.call(&request)).await?;
    match figures {
        Response::ShuffleResults(workers) => Ok(result(&run, workers, false)),
        other => Err(format!("unexpected reply {other:?}").into()),
    }
}

/// `shared_process`: the workers run in one process (each reports that process's CPU).
fn result(run: &ShuffleRun, workers: Vec<ShuffleFigures>, shared_process: bool) -> ShuffleResult {
    let elapsed_s = workers.iter().map(|w| w.elapsed_s).fold(0.0, f64::max);
    let sent: u64 = workers.iter().map(|w| w.bytes_sent).sum();
    let cpu: Option<f64> = if shared_process {
        workers
            .iter()
            .map(|w| w.process_cpu_s)
            .collect::<Option<Vec<f64>>>()
            .and_then(|v| v.into_iter().reduce(f64::max))
    } else {
        workers.iter().map(|w| w.process_cpu_s).sum()
    };
    ShuffleResult {
        design: tcp(),
        pattern: run.pattern.clone(),
        schedule: run.schedule.clone(),
        encrypted: false,
        total_bytes: run.total_bytes,
        message_size: run.message_size,
        threads: 1,
        buffers: default_buffers(),
        consume_ns_per_kib: 0,
        elapsed_s,
        aggregate_bytes_per_sec: sent as f64 / elapsed_s.max(1e-9),
        cpu_s_per_gb: cpu.map(|c| c / (sent as f64 / 1e9).max(1e-9)),
        min_utilisation: None,
        workers,
    }
}

fn report(
    args: &ShuffleArgs,
    capacity: Option<f64>,
    memcpy: Option<Memcpy>,
    mut runs: Vec<ShuffleResult>,
) -> ShuffleBenchReport {
    if let Some(cap) = capacity {
        for r in &mut runs {
            r.min_utilisation = r
                .workers
                .iter()
                .flat_map(|w| [w.send_rate(), w.recv_rate()])
                .map(|rate| rate / cap)
                .reduce(f64::min);
        }
    }
    ShuffleBenchReport {
        nodes: args.nodes,
        link: args.link.clone(),
        cpus: args.cpus.map(|c| c.cpus()),
        capacity_bytes_per_sec: capacity,
        memcpy,
        runs,
    }
}

/// An embedded cluster over loopback per sealing setting (with the tcp design) and
/// shared-memory nodes in this process per other design, each run alternating
/// between them, next to a memcpy of the same bytes.
async fn loopback(
    args: &ShuffleArgs,
    runs: Vec<ShuffleRun>,
    sealing: &[bool],
    designs: &[Design],
) -> Result<ShuffleBenchReport, BoxError> {
    let mut clusters = vec![];
    if designs.contains(&Design::Tcp) {
        for &encrypt_links in sealing {
            let limits = gyre_cluster::Limits {
                encrypt_links,
                ..Default::default()
            };
            let cluster = LocalCluster::start_limited(
                args.nodes,
                1,
                "127.0.0.1:0".parse()?,
                &Default::default(),
                &limits,
            )
            .await?;
            clusters.push((encrypt_links, cluster));
        }
    }
    let shm = if designs.iter().any(|d| *d != Design::Tcp) {
        Some(ShmNodes::start(args.nodes)?)
    } else {
        None
    };
    let threads = args.threads()?;
    let buffers = args.buffers(designs)?;
    let consume = args.consume()?;
    let memcpy = measure_memcpy(runs[0].total_bytes, runs[0].message_size as usize);
    // The bandwidth-delay product per design: the memcpy rate (the carrier's
    // link) over the round trip of a small message and its answer.
    let mut bdp = std::collections::HashMap::new();
    if let (Some(shm), true) = (&shm, buffers.contains(&Buffers::Bdp)) {
        for &design in designs.iter().filter(|d| **d != Design::Tcp) {
            let run = shm.fit(design, &runs[0]);
            let window = shm.bdp(design, &run, memcpy.bytes_per_sec).await?;
            bdp.insert(design, window);
        }
    }
    let mut results = vec![];
    for (i, run) in runs.iter().enumerate() {
        for (encrypted, cluster) in &clusters {
            let coordinator: &Arc<Coordinator> = &cluster.coordinator;
            let label = format!(
                "shuffling: {} of {} over {} embedded workers ({}{})",
                run.pattern,
                human_bytes(run.total_bytes as f64),
                args.nodes,
                run.schedule,
                if *encrypted { ", sealed links" } else { "" }
            );
            let reply = with_progress(
                &label,
                coordinator.handle_control(Request::BenchShuffle(run.clone())),
            )
            .await?;
            match reply {
                Response::ShuffleResults(workers) => results.push(ShuffleResult {
                    encrypted: *encrypted,
                    ..result(run, workers, true)
                }),
                other => return Err(format!("unexpected reply {other:?}").into()),
            }
        }
        let Some(shm) = &shm else { continue };
        for &design in designs.iter().filter(|d| **d != Design::Tcp) {
            for (&threads, &setting, &ns_per_kib) in combinations(&threads, &buffers, &consume) {
                let window = match setting {
                    Buffers::Default => Window::Default,
                    Buffers::Fixed(n) => Window::Fixed(n),
                    Buffers::Bdp => Window::Fixed(bdp[&design]),
                    Buffers::Adaptive => Window::Adaptive,
                };
                let named = match setting {
                    Buffers::Default => "default".to_string(),
                    Buffers::Fixed(n) => n.to_string(),
                    Buffers::Bdp => format!("bdp={}", bdp[&design]),
                    Buffers::Adaptive => "adaptive".into(),
                };
                let label = format!(
                    "shuffling: {} of {} over {} shared-memory nodes ({design}, {threads} \
                     sending thread{}, {named} buffers, {ns_per_kib} ns/KiB)",
                    run.pattern,
                    human_bytes(run.total_bytes as f64),
                    args.nodes,
                    if threads == 1 { "" } else { "s" }
                );
                let run = shm.fit(design, run);
                let senders = Senders {
                    threads,
                    shared: !design.per_thread(),
                };
                let how = ShmRun {
                    design,
                    senders,
                    window,
                    ns_per_kib,
                };
                let workers = with_progress(&label, shm.run(how, &run, i as u64 + 1)).await?;
                results.push(ShuffleResult {
                    design: format!("shm/{design}"),
                    threads,
                    buffers: named,
                    consume_ns_per_kib: ns_per_kib,
                    ..result(&run, workers, true)
                });
            }
        }
    }
    Ok(report(args, None, Some(memcpy), results))
}

/// Every combination of threads, buffers and consumer cost, in that order.
fn combinations<'a>(
    threads: &'a [usize],
    buffers: &'a [Buffers],
    consume: &'a [u64],
) -> impl Iterator<Item = (&'a usize, &'a Buffers, &'a u64)> {
    threads.iter().flat_map(move |t| {
        buffers
            .iter()
            .flat_map(move |b| consume.iter().map(move |c| (t, b, c)))
    })
}

/// A stream's receive window in a shm run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Window {
    Default,
    Fixed(u32),
    Adaptive,
}

/// How the shm nodes run one configuration.
struct ShmRun {
    design: Design,
    senders: Senders,
    window: Window,
    ns_per_kib: u64,
}

/// Nodes of the shared-memory carrier in this process, their segments in a
/// directory of their own (on /dev/shm where there is one).
struct ShmNodes {
    _dir: tempfile::TempDir,
    carriers: Vec<Arc<dyn gyre_transport::verbs::Carrier>>,
}

impl ShmNodes {
    fn start(nodes: usize) -> Result<Self, BoxError> {
        let base = std::path::Path::new("/dev/shm");
        let dir = if base.is_dir() {
            tempfile::Builder::new()
                .prefix("gyre-bench-")
                .tempdir_in(base)?
        } else {
            tempfile::Builder::new().prefix("gyre-bench-").tempdir()?
        };
        let config = gyre_transport::shm::ShmConfig {
            dir: dir.path().to_path_buf(),
            params: Default::default(),
        };
        let carriers = (1..=nodes as u32)
            .map(|id| {
                gyre_transport::shm::ShmCarrier::open(id, &config)
                    .map(|c| Arc::new(c) as Arc<dyn gyre_transport::verbs::Carrier>)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            _dir: dir,
            carriers,
        })
    }

    /// `run` with its messages cut to what `design` carries (datagrams: 4 KiB).
    fn fit(&self, design: Design, run: &ShuffleRun) -> ShuffleRun {
        use gyre_transport::design::{HEADER, Primitive};
        use gyre_transport::verbs::QpKind;
        let mut run = run.clone();
        if design.primitive() == Some(Primitive::Datagram) {
            let most = self.carriers[0].max_message(QpKind::Ud) - HEADER;
            run.message_size = run.message_size.min(most as u64);
        }
        run
    }

    /// The settings of `design`'s endpoints for `run` with `window`, and the
    /// largest window its streams' receives fit.
    fn config(
        &self,
        design: Design,
        run: &ShuffleRun,
        window: Window,
        senders: Senders,
    ) -> Result<(gyre_transport::design::DesignConfig, u32), BoxError> {
        use gyre_transport::design::{DesignConfig, HEADER, Primitive};
        let primitive = design
            .primitive()
            .ok_or_else(|| format!("{design} is not a design of the shm carrier"))?;
        let others = self.carriers.len() - 1;
        let depth = self.carriers[0].recv_depth();
        // Datagram endpoints post every stream's receives on one queue pair.
        let mut most = match primitive {
            Primitive::Datagram => (depth / (others * senders.streams())).saturating_sub(1),
            Primitive::Send => depth - 1,
            _ => 256,
        }
        .clamp(1, 256) as u32;
        let mut config = if primitive == Primitive::Datagram {
            // Small messages need a deeper window to keep the pipe full, as the
            // paper's datagram receivers post many more buffers; every stream's
            // receives share the one queue pair's depth.
            let window = (depth / others).saturating_sub(1).clamp(1, 32) as u32;
            DesignConfig {
                message_size: run.message_size as usize + HEADER,
                primitive,
                window,
                credit_every: (window / 4).max(1),
                send_buffers: 64,
                ..Default::default()
            }
        } else {
            DesignConfig {
                message_size: run.message_size as usize + HEADER,
                primitive,
                ..Default::default()
            }
        };
        match window {
            Window::Default => {}
            Window::Fixed(n) => {
                config.window = n.min(most);
                config.credit_every = config.credit_every.min(config.window);
            }
            Window::Adaptive => {
                // A sender keeps two receives per buffer a stream may be lent
                // for the receiver's credit writes, on a queue of `depth`.
                most = most.min(((depth - 8) / 2) as u32);
                config.window = 2.min(most);
                config.credit_every = 1;
                config.adaptive = Some(most.max(config.window));
            }
        }
        Ok((config, most))
    }

    /// The bandwidth-delay product of `design` in buffers: `bytes_per_sec`
    /// over the median round trip of a small message and its answer.
    async fn bdp(
        &self,
        design: Design,
        run: &ShuffleRun,
        bytes_per_sec: f64,
    ) -> Result<u32, BoxError> {
        use gyre_transport::bench::{bdp_window, design_round_trip};
        let (config, most) = self.config(design, run, Window::Default, Senders::ONE)?;
        let carriers = [Arc::clone(&self.carriers[0]), Arc::clone(&self.carriers[1])];
        let connector = gyre_transport::design::LocalConnector::new();
        let rtt = design_round_trip(carriers, connector, config.clone(), 200, 1 << 20).await?;
        let window = bdp_window(bytes_per_sec, rtt, config.message_size);
        eprintln!(
            "{design}: round trip {:.1} us at {:.2} GB/s: a bandwidth-delay product of {window} \
             buffers of {}{}",
            rtt.as_secs_f64() * 1e6,
            bytes_per_sec / 1e9,
            human_bytes(config.message_size as f64),
            if window > most {
                format!(" (capped at {most})")
            } else {
                String::new()
            }
        );
        Ok(window.min(most))
    }

    /// Runs `run` on every node at once as `how` says.
    async fn run(
        &self,
        how: ShmRun,
        run: &ShuffleRun,
        run_id: u64,
    ) -> Result<Vec<ShuffleFigures>, BoxError> {
        use gyre_transport::bench::{Receiving, ShuffleSpec, run_design_shuffle};
        use gyre_transport::design::{BufferPool, LocalConnector};
        let connector = LocalConnector::new();
        let nodes: Vec<u32> = self.carriers.iter().map(|c| c.node()).collect();
        let (config, most) = self.config(how.design, run, how.window, how.senders)?;
        let streams_in = (nodes.len() - 1) * how.senders.streams();
        let mut tasks = vec![];
        for (index, carrier) in self.carriers.iter().enumerate() {
            let spec = ShuffleSpec {
                nodes: nodes.clone(),
                index,
                pattern: run.pattern.parse()?,
                total_bytes: run.total_bytes,
                message_size: run.message_size as usize,
                schedule: run.schedule.parse()?,
                run_id,
            };
            // Adaptive: a pool per node, as many buffers as its streams could
            // take at their largest windows.
            let pool = match how.window {
                Window::Adaptive => Some(BufferPool::register(
                    &**carrier,
                    streams_in * (most as usize + 1),
                    config.message_size,
                )?),
                _ => None,
            };
            let receiving = Receiving {
                pool,
                ns_per_kib: how.ns_per_kib,
            };
            let (carrier, connector, config) =
                (Arc::clone(carrier), connector.clone(), config.clone());
            let senders = how.senders;
            tasks.push(tokio::spawn(async move {
                run_design_shuffle(carrier, connector, config, &spec, senders, receiving).await
            }));
        }
        let mut workers = vec![];
        for t in tasks {
            workers.push(t.await??.into());
        }
        Ok(workers)
    }
}

/// Copies `total` bytes in `chunk`-sized pieces between two buffers far larger than
/// the caches (as message payloads would come from memory), as a floor for what
/// moving the bytes costs without any network layer.
fn measure_memcpy(total: u64, chunk: usize) -> Memcpy {
    const SPAN: usize = 256 << 20;
    let chunk = chunk.clamp(1, SPAN);
    let src = vec![0x5au8; SPAN];
    let mut dst = vec![0u8; SPAN];
    let cpu0 = gyre_transport::cpu::process_cpu();
    let start = Instant::now();
    let mut copied = 0u64;
    let mut at = 0;
    while copied < total {
        if at + chunk > SPAN {
            at = 0;
        }
        dst[at..at + chunk].copy_from_slice(&src[at..at + chunk]);
        std::hint::black_box(&mut dst);
        at += chunk;
        copied += chunk as u64;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let cpu = gyre_transport::cpu::process_cpu()
        .zip(cpu0)
        .map(|(b, a)| b.saturating_sub(a).as_secs_f64())
        .unwrap_or(secs);
    Memcpy {
        bytes_per_sec: copied as f64 / secs,
        cpu_s_per_gb: cpu / (copied as f64 / 1e9),
    }
}

/// Builds an emulated cluster per sealing setting, measures its links, runs the
/// shuffles from the coordinator's host, and removes the cluster.
async fn emulated(args: &ShuffleArgs, sealing: &[bool]) -> Result<ShuffleBenchReport, BoxError> {
    let mut capacity = None;
    let mut runs = vec![];
    for &encrypt_links in sealing {
        let (measured, inner) = emulated_runs(args, encrypt_links).await?;
        capacity = capacity.or(measured);
        runs.extend(inner.into_iter().map(|r| ShuffleResult {
            encrypted: encrypt_links,
            ..r
        }));
    }
    Ok(report(args, capacity, None, runs))
}

async fn emulated_runs(
    args: &ShuffleArgs,
    encrypt_links: bool,
) -> Result<(Option<f64>, Vec<ShuffleResult>), BoxError> {
    let cluster = EmulatedCluster {
        name: args.name.clone(),
        nodes: args.nodes,
        link: args.link.parse()?,
        cpus: args.cpus,
        data_roots: Vec::new(),
        encrypt_links,
        coordinator_args: vec![],
        log_multicast: None,
    };
    let inner: Vec<String> = [
        "bench",
        "shuffle",
        "--nodes",
        &args.nodes.to_string(),
        "--pattern",
        &args.pattern,
        "--schedule",
        &args.schedule,
        "--bytes",
        &args.bytes,
        "--message-size",
        &args.message_size,
        "--repeat",
        &args.repeat.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (capacity, stdout) = cluster.run("gyre bench shuffle", true, inner).await?;
    let inner: ShuffleBenchReport = serde_json::from_slice(&stdout)?;
    Ok((capacity, inner.runs))
}

fn emit(args: &ShuffleArgs, r: &ShuffleBenchReport) -> Result<(), BoxError> {
    let to_stdout = write_outputs(args.json.as_deref(), args.plot.as_deref(), r, plot_svg)?;
    if to_stdout {
        return Ok(());
    }
    if let Some(cap) = r.capacity_bytes_per_sec {
        println!(
            "link capacity (one raw TCP stream): {:.1} MB/s = {:.1} Mbit/s",
            cap / 1e6,
            cap * 8.0 / 1e6
        );
    }
    for run in &r.runs {
        println!(
            "\n{}{}{}: {} of {} over {} workers, {} schedule, {} links, {} messages: {:.2} s, \
             {:.1} MB/s in all{}{}",
            run.design,
            if run.threads > 1 {
                format!(" ({} sending threads per worker)", run.threads)
            } else {
                String::new()
            },
            match (run.buffers.as_str(), run.consume_ns_per_kib) {
                ("default", 0) => String::new(),
                (b, c) => format!(" ({b} buffers, receivers busy {c} ns per KiB)"),
            },
            run.pattern,
            human_bytes(run.total_bytes as f64),
            run.workers.len(),
            run.schedule,
            if run.encrypted { "sealed" } else { "clear" },
            human_bytes(run.message_size as f64),
            run.elapsed_s,
            run.aggregate_bytes_per_sec / 1e6,
            run.cpu_s_per_gb
                .map(|c| format!(", {c:.2} CPU s per GB sent"))
                .unwrap_or_default(),
            run.min_utilisation
                .map(|u| format!(", min utilisation {:.1}%", 100.0 * u))
                .unwrap_or_default(),
        );
        println!(
            "{:>10} {:>12} {:>12} {:>10} {:>10} {:>9}",
            "worker", "send MB/s", "recv MB/s", "send util", "recv util", "mux CPU s"
        );
        for w in &run.workers {
            let util = |rate: f64| {
                r.capacity_bytes_per_sec
                    .map(|c| format!("{:.1}%", 100.0 * rate / c))
                    .unwrap_or_else(|| "-".into())
            };
            println!(
                "{:>10} {:>12.1} {:>12.1} {:>10} {:>10} {:>9}",
                w.node,
                w.send_rate() / 1e6,
                w.recv_rate() / 1e6,
                util(w.send_rate()),
                util(w.recv_rate()),
                w.mux_cpu_s
                    .map(|c| format!("{c:.2}"))
                    .unwrap_or_else(|| "-".into())
            );
        }
        for w in &run.workers {
            let Some(d) = &w.design else { continue };
            println!(
                "{:>10} setup {:.1} ms, {} queue pairs, {} registered, credit wait {:.3} s, \
                 {} credit updates, receive buffers {:.1} on average, {} at most{}",
                w.node,
                d.setup_s * 1e3,
                d.queue_pairs,
                human_bytes(d.registered_bytes as f64),
                d.credit_wait_s,
                d.credit_updates,
                d.buffers_mean,
                d.buffers_peak,
                if d.buffers_lent + d.buffers_retired > 0 {
                    format!(" ({} lent, {} retired)", d.buffers_lent, d.buffers_retired)
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(m) = &r.memcpy {
        println!(
            "\nmemcpy of the same bytes: {:.2} GB/s, {:.3} CPU s per GB",
            m.bytes_per_sec / 1e9,
            m.cpu_s_per_gb
        );
    }
    Ok(())
}

/// Runs comparing carriers or designs: per configuration (design, sending
/// threads) and pattern, the median aggregate rate of its runs, next to a
/// memcpy's. Otherwise per run, per worker: send and receive rates as bars,
/// the capacity as a line.
fn plot_svg(r: &ShuffleBenchReport) -> String {
    if r.runs.iter().any(|run| run.design != Design::Tcp.name()) {
        return designs_svg(r);
    }
    let mut labels = vec![];
    let mut values = vec![];
    for run in &r.runs {
        for wk in &run.workers {
            let sealed = if run.encrypted { "/sealed" } else { "" };
            let threads = match run.threads {
                1 => String::new(),
                t => format!(" x{t}"),
            };
            labels.push(format!(
                "{}{threads} {}/{}{sealed} w{}",
                run.design, run.pattern, run.schedule, wk.node
            ));
            values.push(vec![wk.send_rate() / 1e6, wk.recv_rate() / 1e6]);
        }
    }
    let capacity = r
        .capacity_bytes_per_sec
        .map(|c| (c / 1e6, format!("link capacity {:.0} MB/s", c / 1e6)));
    crate::plot::grouped_bars_with_reference(
        &format!(
            "gyre bench shuffle: {} workers, {} links; MB/s per worker",
            r.nodes, r.link
        ),
        "MB/s",
        &[
            crate::plot::Series {
                name: "send",
                color: "#3b6fd4",
            },
            crate::plot::Series {
                name: "receive",
                color: "#3a9d5d",
            },
        ],
        &labels,
        &values,
        capacity.as_ref().map(|(v, l)| (*v, l.as_str())),
    )
}

fn designs_svg(r: &ShuffleBenchReport) -> String {
    const COLORS: [&str; 4] = ["#3b6fd4", "#3a9d5d", "#d4853b", "#8a5cc2"];
    let mut patterns: Vec<&str> = vec![];
    let mut labels: Vec<String> = vec![];
    let label = |run: &ShuffleResult| {
        let mut l = run.design.clone();
        if run.encrypted {
            l.push_str(" sealed");
        }
        if run.threads > 1 {
            l.push_str(&format!(" x{}", run.threads));
        }
        if run.buffers != "default" {
            l.push_str(&format!(" {}", run.buffers));
        }
        if run.consume_ns_per_kib > 0 {
            l.push_str(&format!(" {}ns/KiB", run.consume_ns_per_kib));
        }
        l
    };
    for run in &r.runs {
        if !patterns.contains(&run.pattern.as_str()) {
            patterns.push(&run.pattern);
        }
        let l = label(run);
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    let values: Vec<Vec<f64>> = labels
        .iter()
        .map(|l| {
            patterns
                .iter()
                .map(|p| {
                    let mut rates: Vec<f64> = r
                        .runs
                        .iter()
                        .filter(|run| run.pattern == *p && label(run) == *l)
                        .map(|run| run.aggregate_bytes_per_sec / 1e9)
                        .collect();
                    rates.sort_by(f64::total_cmp);
                    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
                })
                .collect()
        })
        .collect();
    let series: Vec<crate::plot::Series> = patterns
        .iter()
        .enumerate()
        .map(|(i, p)| crate::plot::Series {
            name: p,
            color: COLORS[i % COLORS.len()],
        })
        .collect();
    let memcpy = r.memcpy.as_ref().map(|m| {
        (
            m.bytes_per_sec / 1e9,
            format!("memcpy {:.2} GB/s", m.bytes_per_sec / 1e9),
        )
    });
    let rates = crate::plot::grouped_bars_with_reference(
        &format!(
            "gyre bench shuffle: {} nodes, {} links; aggregate GB/s (median of runs)",
            r.nodes, r.link
        ),
        "GB/s",
        &series,
        &labels,
        &values,
        memcpy.as_ref().map(|(v, l)| (*v, l.as_str())),
    );
    match buffers_svg(r, &labels, label) {
        Some(buffers) => crate::plot::stacked(&[rates, buffers]),
        None => rates,
    }
}

/// Where runs compare receive-buffer policies (`--buffers`): each
/// configuration's receive buffers in use over its run (the mean of its
/// workers and runs, at tenths of the run), the RDMA-aware shuffle's
/// figure of adaptive buffers against fixed queue depths.
fn buffers_svg(
    r: &ShuffleBenchReport,
    labels: &[String],
    label: impl Fn(&ShuffleResult) -> String,
) -> Option<String> {
    let mut policies: Vec<&str> = r.runs.iter().map(|run| run.buffers.as_str()).collect();
    policies.sort();
    policies.dedup();
    if policies.len() < 2 {
        return None;
    }
    const POINTS: usize = 11;
    let series: Vec<(&str, Vec<(f64, f64)>)> = labels
        .iter()
        .filter_map(|l| {
            let timelines: Vec<&Vec<u32>> = r
                .runs
                .iter()
                .filter(|run| label(run) == *l)
                .flat_map(|run| &run.workers)
                .filter_map(|w| w.design.as_ref().map(|d| &d.buffers_over_time))
                .filter(|t| !t.is_empty())
                .collect();
            if timelines.is_empty() {
                return None;
            }
            let points = (0..POINTS)
                .map(|i| {
                    let at = i as f64 / (POINTS - 1) as f64;
                    let mean = timelines
                        .iter()
                        .map(|t| t[(at * (t.len() - 1) as f64).round() as usize] as f64)
                        .sum::<f64>()
                        / timelines.len() as f64;
                    (at * 100.0, mean)
                })
                .collect();
            Some((l.as_str(), points))
        })
        .collect();
    (!series.is_empty()).then(|| {
        crate::plot::lines(
            "receive buffers in use per node over each run (mean of workers and runs)",
            "% of the run",
            "",
            &series,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_size("4GB").unwrap(), 4_000_000_000);
        assert_eq!(parse_size("512KiB").unwrap(), 524_288);
        assert_eq!(parse_size("1.5 MB").unwrap(), 1_500_000);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("GB").is_err());
        assert!(parse_size("4 parsecs").is_err());
        assert!(parse_size("0").is_err());
    }
}
