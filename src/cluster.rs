//! `gyre cluster`: an emulated cluster of network namespaces on this machine
//! (crates/testbed), with shaped links and CPU quotas per host.

use clap::{Args, Subcommand};
use gyre_testbed::{
    BlastHelper, BlastOptions, ClusterName, CpuQuota, GyreProcesses, LinkRate, Subnet, Testbed,
    TestbedSpec, sys,
};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Create N hosts (network namespaces) on a bridge, with shaped links and CPU
    /// quotas, and start a coordinator and a worker on each. Needs root.
    Up(UpArgs),
    /// Stop the cluster's processes and remove everything it created. Needs root.
    Down {
        #[arg(long, default_value = "default")]
        name: ClusterName,
        #[arg(long, hide = true, default_value = gyre_testbed::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// List the emulated clusters and what they run. Needs root.
    Status {
        #[arg(long, hide = true, default_value = gyre_testbed::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Measure link capacity with raw TCP streams between hosts. Needs root.
    Measure {
        #[arg(long, default_value = "default")]
        name: ClusterName,
        /// Sending host (e.g. h0).
        #[arg(long, default_value = "h0")]
        from: String,
        /// Receiving host (e.g. h1).
        #[arg(long, default_value = "h1")]
        to: String,
        /// Also all worker hosts at once in a ring (each sends and receives).
        #[arg(long)]
        ring: bool,
        /// Seconds each stream sends.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        #[arg(long, hide = true, default_value = gyre_testbed::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Internal: the TCP blast endpoints `measure` runs inside the hosts.
    #[command(hide = true)]
    Blast {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Args)]
pub struct UpArgs {
    /// Worker hosts (the coordinator gets a host of its own in addition).
    #[arg(long)]
    nodes: usize,
    /// Link rate of every host, each direction: 1gbit, 10gbit, 500mbit, 100mbps (bytes/s), ...
    #[arg(long)]
    link: LinkRate,
    /// CPU quota of every host, in CPUs (0.5) or percent of one CPU (50%).
    #[arg(long)]
    cpus: Option<CpuQuota>,
    /// Cluster name (namespaces are gyre-NAME-*).
    #[arg(long, default_value = "default")]
    name: ClusterName,
    /// Private subnet of the hosts (assigned only inside the cluster's namespaces).
    #[arg(long, default_value = "10.213.0.0/24")]
    subnet: Subnet,
    /// Ports used on every host: BASE (Flight SQL / control), BASE+1 (data), BASE+10 (measurements).
    #[arg(long, default_value_t = gyre_testbed::DEFAULT_BASE_PORT)]
    base_port: u16,
    /// Threads per worker (default: the CPU quota rounded up, else 2).
    #[arg(long)]
    threads: Option<usize>,
    /// A directory the nodes may read and write local files in (repeatable; the hosts
    /// share this machine's file system). Without one, no local files.
    #[arg(long = "data-root")]
    data_roots: Vec<PathBuf>,
    /// Build the network and cgroups only; start no gyre processes.
    #[arg(long)]
    network_only: bool,
    #[arg(long, hide = true, default_value = gyre_testbed::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
}

pub fn run(command: ClusterCommand) -> Result<(), Box<dyn std::error::Error>> {
    let what = match &command {
        ClusterCommand::Blast { args } => return Ok(gyre_testbed::blast::run_cli(args)?),
        ClusterCommand::Up(_) => "gyre cluster up",
        ClusterCommand::Down { .. } => "gyre cluster down",
        ClusterCommand::Status { .. } => "gyre cluster status",
        ClusterCommand::Measure { .. } => "gyre cluster measure",
    };
    sys::require_root(what)?;
    match command {
        ClusterCommand::Up(args) => up(args),
        ClusterCommand::Down { name, state_dir } => {
            match Testbed::down_by_name(&name, &state_dir)? {
                Some(report) => println!("{report}"),
                None => println!(
                    "no cluster '{name}' (no state file in {}); nothing to do",
                    state_dir.display()
                ),
            }
            Ok(())
        }
        ClusterCommand::Status { state_dir } => status(&state_dir),
        ClusterCommand::Measure {
            name,
            from,
            to,
            ring,
            seconds,
            state_dir,
        } => measure(&name, &from, &to, ring, seconds, &state_dir),
        ClusterCommand::Blast { .. } => unreachable!("handled above"),
    }
}

fn up(args: UpArgs) -> Result<(), Box<dyn std::error::Error>> {
    let gyre = if args.network_only {
        None
    } else {
        let mut g = GyreProcesses::current_exe()?;
        g.worker_threads = args.threads;
        g.data_roots = args
            .data_roots
            .iter()
            .map(|d| {
                std::fs::canonicalize(d).map_err(|e| format!("--data-root {}: {e}", d.display()))
            })
            .collect::<Result<_, _>>()?;
        Some(g)
    };
    let spec = TestbedSpec {
        name: args.name,
        hosts: args.nodes,
        link: args.link,
        cpus: args.cpus,
        subnet: args.subnet,
        base_port: args.base_port,
        gyre,
        state_dir: args.state_dir,
    };
    eprintln!(
        "creating cluster '{}': {} worker host(s), {} links{}...",
        spec.name,
        spec.hosts,
        spec.link,
        spec.cpus
            .map(|c| format!(", {c} CPU per host"))
            .unwrap_or_default()
    );
    let tb = Testbed::up(spec)?;
    println!("{}", tb.describe());
    tb.keep();
    Ok(())
}

fn status(state_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let names = gyre_testbed::state::list(state_dir)?;
    let mut known = Vec::new();
    for name in &names {
        if let Some(tb) = Testbed::open(name, state_dir)? {
            println!("{}", tb.describe());
            for problem in tb.health()? {
                println!("  problem: {problem}");
            }
            println!();
            known.extend(tb.state().netns.clone());
        }
    }
    let strays: Vec<String> = sys::list_netns()?
        .into_iter()
        .filter(|n| n.starts_with(gyre_testbed::naming::PREFIX) && !known.contains(n))
        .collect();
    if names.is_empty() {
        println!(
            "no emulated clusters (no state files in {})",
            state_dir.display()
        );
    }
    if !strays.is_empty() {
        println!(
            "namespaces named like a cluster's but in no state file (not removed by `down`): {}",
            strays.join(", ")
        );
    }
    Ok(())
}

fn measure(
    name: &ClusterName,
    from: &str,
    to: &str,
    ring: bool,
    seconds: f64,
    state_dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 600.0) {
        return Err(format!("--seconds {seconds}: must be in (0, 600]").into());
    }
    let tb = Testbed::open(name, state_dir)?.ok_or_else(|| {
        format!(
            "no cluster '{name}' (no state file in {})",
            state_dir.display()
        )
    })?;
    let host = |h: &str| {
        tb.host(h)
            .ok_or_else(|| format!("cluster '{name}' has no host '{h}'"))
    };
    let helper = BlastHelper::gyre()?;
    let options = BlastOptions {
        duration: Duration::from_secs_f64(seconds),
        ..Default::default()
    };
    let link = tb.link();
    let show = |s: &gyre_testbed::StreamRate| {
        println!(
            "{} -> {}: {:.1} Mbit/s ({:.1} MB/s, {:.1}% of the {link} link rate)",
            s.from,
            s.to,
            s.bits_per_sec() / 1e6,
            s.bytes_per_sec / 1e6,
            100.0 * s.bits_per_sec() / link.bits_per_sec() as f64
        )
    };
    let one = gyre_testbed::measure_capacity(&tb, &helper, host(from)?, host(to)?, options)?;
    println!("one stream:");
    show(&one);
    if ring {
        println!("ring (every worker host sends and receives at once):");
        for s in gyre_testbed::measure_ring(&tb, &helper, options)? {
            show(&s);
        }
    }
    Ok(())
}
