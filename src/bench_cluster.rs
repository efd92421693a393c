//! What the cluster benchmarks (`gyre bench shuffle`, `gyre bench join`) share:
//! running on an emulated cluster built for the run, and showing progress.
//!
//! On an emulated cluster the coordinator is reachable only inside the
//! cluster's namespaces, so the benchmark command runs again from the
//! coordinator's host with `--connect ADDR --json -`, and its JSON comes back
//! on standard output.

use gyre_testbed::{
    BlastHelper, BlastOptions, ClusterName, CpuQuota, GyreProcesses, LinkRate, Testbed,
    TestbedSpec, sys,
};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

pub type BoxError = Box<dyn std::error::Error>;

/// An emulated cluster to build for one benchmark run.
pub struct EmulatedCluster {
    pub name: ClusterName,
    pub nodes: usize,
    pub link: LinkRate,
    pub cpus: Option<CpuQuota>,
    /// Directories the benchmark's nodes read and write files in.
    pub data_roots: Vec<std::path::PathBuf>,
    /// Seal the data links between its nodes.
    pub encrypt_links: bool,
    /// More arguments for its coordinator.
    pub coordinator_args: Vec<String>,
    /// Multicast the primary's log on this group.
    pub log_multicast: Option<std::net::SocketAddrV4>,
}

impl EmulatedCluster {
    /// Builds the cluster, measures one host's link capacity with a raw TCP
    /// stream if `measure` (payload bytes per second), runs `gyre INNER
    /// --connect ADDR --json -` on the coordinator's host, removes the cluster
    /// (also on failure), and returns the capacity and the command's output.
    pub async fn run(
        &self,
        what: &str,
        measure: bool,
        inner: Vec<String>,
    ) -> Result<(Option<f64>, Vec<u8>), BoxError> {
        sys::require_root(&format!("{what} on an emulated cluster"))?;
        let link = self.link;
        let mut spec = TestbedSpec::new(self.name.clone(), self.nodes, link);
        spec.cpus = self.cpus;
        let mut gyre = GyreProcesses::current_exe()?;
        gyre.data_roots = self.data_roots.clone();
        gyre.encrypt_links = self.encrypt_links;
        gyre.coordinator_args = self.coordinator_args.clone();
        gyre.log_multicast = self.log_multicast;
        spec.gyre = Some(gyre);
        eprintln!(
            "building an emulated cluster of {} hosts with {link} links{}...",
            self.nodes,
            self.cpus
                .map(|c| format!(" and {c} CPU each"))
                .unwrap_or_default()
        );
        let tb = tokio::task::spawn_blocking(move || Testbed::up(spec)).await??;
        let outcome = async {
            let capacity = if measure {
                Some(measure_capacity(&tb, link)?)
            } else {
                None
            };
            let addr = tb
                .coordinator_addr()
                .ok_or("the emulated cluster has no coordinator")?;
            let exe = std::env::current_exe()?;
            let mut cmd = tb.coordinator_host().command(&exe);
            if let Some(secret) = tb.secret() {
                cmd.env("GYRE_SECRET", secret);
            }
            cmd.args(&inner)
                .args(["--connect", &addr.to_string(), "--json", "-"])
                .stderr(std::process::Stdio::inherit());
            let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
            if !out.status.success() {
                return Err::<_, BoxError>(
                    format!("{what} on the emulated cluster failed ({})", out.status).into(),
                );
            }
            Ok((capacity, out.stdout))
        }
        .await;
        eprintln!("removing the emulated cluster...");
        let down = tokio::task::spawn_blocking(move || tb.down()).await?;
        let outcome = outcome?;
        down?;
        Ok(outcome)
    }
}

/// One raw TCP stream between the first two worker hosts for 3 s.
fn measure_capacity(tb: &Testbed, link: LinkRate) -> Result<f64, BoxError> {
    eprintln!("measuring the link capacity (one raw TCP stream h0 -> h1, 3 s)...");
    let (hosts, helper) = (tb.worker_hosts().to_vec(), BlastHelper::gyre()?);
    let options = BlastOptions {
        duration: Duration::from_secs(3),
        ..Default::default()
    };
    let capacity = tokio::task::block_in_place(|| {
        gyre_testbed::measure_capacity(tb, &helper, &hosts[0], &hosts[1], options)
    })?;
    eprintln!(
        "  {:.1} Mbit/s ({:.1}% of {link})",
        capacity.bits_per_sec() / 1e6,
        100.0 * capacity.bits_per_sec() / link.bits_per_sec() as f64
    );
    Ok(capacity.bytes_per_sec)
}

/// Awaits `fut`, printing `label` and then the elapsed time on standard error every second.
pub async fn with_progress<T>(label: &str, fut: impl std::future::Future<Output = T>) -> T {
    let start = Instant::now();
    eprintln!("{label}...");
    let mut fut = std::pin::pin!(fut);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tokio::select! {
            out = &mut fut => {
                eprintln!("  done in {:.1} s", start.elapsed().as_secs_f64());
                return out;
            }
            _ = tick.tick() => eprintln!("  {:.0} s...", start.elapsed().as_secs_f64()),
        }
    }
}

pub fn human_bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.0} KB", b / 1e3)
    }
}

/// Splits a comma-separated option into its lower-case items.
pub fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|p| p.trim().to_ascii_lowercase())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Writes a benchmark's report as JSON (`-`: to standard output) and its plot, if
/// asked. Returns whether the JSON went to standard output (then nothing else may).
pub fn write_outputs<R: Serialize>(
    json: Option<&Path>,
    plot: Option<&Path>,
    report: &R,
    draw: impl Fn(&R) -> String,
) -> Result<bool, BoxError> {
    let to_stdout = json == Some(Path::new("-"));
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(report)?;
        if to_stdout {
            println!("{text}");
        } else {
            std::fs::write(path, text)?;
        }
    }
    if let Some(path) = plot {
        std::fs::write(path, draw(report))?;
    }
    Ok(to_stdout)
}
