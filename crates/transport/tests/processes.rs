//! Every verbs design between processes: each node of a small cluster is a
//! process of its own (this program, started again as a child), with its
//! own carrier, and the nodes find each other through a [`DirConnector`].
//! Each node runs a repartition, a broadcast and a multicast-group exchange
//! and checks that every stream arrived whole, in order and ended exactly.
//!
//! Carriers: the shared-memory one always; the ibverbs one when the crate
//! is built with the `verbs` feature and `GYRE_VERBS_GIDS` names the
//! nodes' addresses (`1=10.0.2.15,2=10.0.2.16,...`; `GYRE_VERBS_DEVICE`
//! picks the device). `scripts/rdma/test.sh` runs it in a soft-RoCE guest.
//!
//! Settings: `GYRE_PROC_CARRIERS` (`shm,verbs`), `GYRE_PROC_DESIGNS`,
//! `GYRE_PROC_NODES` (default 3, or one per address), `GYRE_PROC_MESSAGES`
//! (per pattern and sender, default 24).

use gyre_transport::design::{Design, DesignTransport, DirConnector};
use gyre_transport::shm::{ShmCarrier, ShmConfig, ShmParams};
use gyre_transport::verbs::Carrier;
use gyre_transport::{NodeId, ReceiveSpec, SendSpec, To, Transport};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD: &str = "GYRE_PROC_CHILD";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pattern {
    Repartition,
    Broadcast,
    Group,
}

const PATTERNS: [Pattern; 3] = [Pattern::Repartition, Pattern::Broadcast, Pattern::Group];

/// Message `seq` of sender `src` in exchange `x`: sizes from one byte to
/// several buffers.
fn message(x: u32, src: u32, seq: usize, payload: usize) -> Vec<u8> {
    let len = [1, 1000, payload, payload + 1, 2 * payload + 17, 70_000][seq % 6];
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31) as u8 ^ (src as u8) << 4 ^ seq as u8 ^ (x as u8) << 2)
        .collect()
}

/// Where message `seq` of `src` goes, and whether `node` gets it.
fn to(p: Pattern, src: u32, seq: usize, n: u32) -> To {
    match p {
        Pattern::Repartition => To::Node(1 + (src + seq as u32) % n),
        Pattern::Broadcast => To::All,
        Pattern::Group => To::Group(0),
    }
}

fn reaches(t: To, node: NodeId) -> bool {
    match t {
        To::Node(d) => d == node,
        To::All => true,
        // The group: every node but the first.
        To::Group(_) => node != 1,
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn carrier(kind: &str, node: NodeId, dir: &std::path::Path) -> Result<Arc<dyn Carrier>, String> {
    match kind {
        "shm" => {
            let config = ShmConfig {
                dir: dir.join("shm"),
                params: ShmParams {
                    arena: 512 << 20,
                    ..ShmParams::for_queries()
                },
            };
            std::fs::create_dir_all(&config.dir).map_err(|e| e.to_string())?;
            Ok(Arc::new(
                ShmCarrier::open(node, &config).map_err(|e| e.to_string())?,
            ))
        }
        #[cfg(feature = "verbs")]
        "verbs" => {
            use gyre_transport::rdma::{RdmaCarrier, RdmaConfig, parse_gids};
            let mut config = RdmaConfig::new(parse_gids(&env_or("GYRE_VERBS_GIDS", ""))?);
            config.device = std::env::var("GYRE_VERBS_DEVICE").ok();
            Ok(Arc::new(
                RdmaCarrier::open(node, &config).map_err(|e| e.to_string())?,
            ))
        }
        other => Err(format!("no carrier '{other}' in this build")),
    }
}

/// One node: every pattern as an exchange of its own, all at once.
async fn child(
    node: NodeId,
    n: u32,
    design: Design,
    kind: &str,
    dir: &std::path::Path,
) -> Result<String, String> {
    let messages: usize = env_or("GYRE_PROC_MESSAGES", "24")
        .parse()
        .map_err(|_| "GYRE_PROC_MESSAGES")?;
    let carrier = carrier(kind, node, dir)?;
    let connector = DirConnector::new(dir.join("meet")).map_err(|e| e.to_string())?;
    let t = Arc::new(DesignTransport::new(design, carrier, connector).map_err(|e| e.to_string())?);
    let payload = t.message_size();
    let nodes: Vec<NodeId> = (1..=n).collect();
    let mut tasks = Vec::new();
    for (x, p) in PATTERNS.into_iter().enumerate() {
        let x = x as u32;
        let recv = t
            .open_receive(ReceiveSpec {
                query: 1,
                exchange: x,
                sources: nodes.iter().map(|&s| (s, s)).collect(),
            })
            .map_err(|e| e.to_string())?;
        let send = t
            .open_send(SendSpec {
                query: 1,
                exchange: x,
                from: node,
                destinations: nodes.clone(),
                groups: vec![nodes[1..].to_vec()],
            })
            .map_err(|e| e.to_string())?;
        tasks.push(tokio::spawn(async move {
            for seq in 0..messages {
                let mut buf = send
                    .acquire(to(p, node, seq, n))
                    .await
                    .map_err(|e| e.to_string())?;
                buf.extend_from_slice(&message(x, node, seq, payload));
                send.put(buf, false).map_err(|e| e.to_string())?;
            }
            send.finish();
            send.flushed().await;
            Ok::<String, String>(String::new())
        }));
        tasks.push(tokio::spawn(async move {
            // Per source: the next expected message and the bytes that came.
            let mut next = vec![0usize; n as usize];
            let mut bytes = 0u64;
            let mut count = 0u64;
            let expected = |src: u32, from: usize| {
                (from..messages).find(|&seq| reaches(to(p, src, seq, n), node))
            };
            while let Some(m) = recv.get().await.map_err(|e| format!("{p:?}: {e}"))? {
                let src = m.node;
                let i = (src - 1) as usize;
                let Some(seq) = expected(src, next[i]) else {
                    return Err(format!("{p:?}: an extra message from node {src}"));
                };
                if m.data() != &message(x, src, seq, payload)[..] {
                    return Err(format!(
                        "{p:?}: message {seq} from node {src} differs ({} bytes came)",
                        m.data().len()
                    ));
                }
                next[i] = seq + 1;
                bytes += m.data().len() as u64;
                count += 1;
            }
            for src in 1..=n {
                if let Some(seq) = expected(src, next[src as usize - 1]) {
                    return Err(format!(
                        "{p:?}: the stream from node {src} ended before message {seq}"
                    ));
                }
            }
            Ok(format!("{p:?} {count} messages {bytes} bytes"))
        }));
    }
    let mut report = Vec::new();
    for task in tasks {
        let line = task.await.map_err(|e| e.to_string())??;
        if !line.is_empty() {
            report.push(line);
        }
    }
    Ok(report.join(", "))
}

fn run_child(spec: &str) -> i32 {
    let field = |k: &str| {
        spec.split(';')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_string()
    };
    let node: NodeId = field("node").parse().unwrap_or(0);
    let n: u32 = field("n").parse().unwrap_or(0);
    let design: Design = match field("design").parse() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let dir = std::path::PathBuf::from(field("dir"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    match rt.block_on(child(node, n, design, &field("carrier"), &dir)) {
        Ok(report) => {
            println!("node {node}: {report}");
            0
        }
        Err(e) => {
            println!("node {node}: FAILED: {e}");
            1
        }
    }
}

/// Runs one design on `n` processes; the children's reports, or why it failed.
fn run_design(
    kind: &str,
    design: Design,
    n: u32,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for node in 1..=n {
        let spec = format!(
            "node={node};n={n};design={design};carrier={kind};dir={}",
            dir.path().display()
        );
        let child = Command::new(&exe)
            .env(CHILD, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| e.to_string())?;
        children.push(child);
    }
    let deadline = Instant::now() + timeout;
    let mut reports = Vec::new();
    let mut failed = None;
    for mut c in children {
        loop {
            match c.try_wait().map_err(|e| e.to_string())? {
                Some(status) => {
                    let mut out = String::new();
                    if let Some(mut o) = c.stdout.take() {
                        use std::io::Read;
                        let _ = o.read_to_string(&mut out);
                    }
                    let out = out.trim().to_string();
                    if !status.success() {
                        failed.get_or_insert(format!("{out} ({status})"));
                    }
                    reports.push(out);
                    break;
                }
                None if Instant::now() > deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    failed.get_or_insert(format!("a node did not finish within {timeout:?}"));
                    break;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    match failed {
        Some(f) => Err(f),
        None => Ok(reports),
    }
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        std::process::exit(run_child(&spec));
    }
    // `cargo test` passes harness flags; `--list` must list nothing.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let verbs = cfg!(feature = "verbs") && std::env::var("GYRE_VERBS_GIDS").is_ok();
    let carriers = env_or(
        "GYRE_PROC_CARRIERS",
        if verbs { "shm,verbs" } else { "shm" },
    );
    let designs: Vec<Design> = match std::env::var("GYRE_PROC_DESIGNS") {
        Ok(s) => s.split(',').map(|d| d.parse().expect("a design")).collect(),
        Err(_) => Design::ALL
            .into_iter()
            .filter(|d| *d != Design::Tcp)
            .collect(),
    };
    let timeout = Duration::from_secs(env_or("GYRE_PROC_TIMEOUT", "180").parse().unwrap_or(180));
    let mut failures = 0;
    for kind in carriers.split(',') {
        let n: u32 = match std::env::var("GYRE_PROC_NODES") {
            Ok(v) => v.parse().expect("GYRE_PROC_NODES"),
            Err(_) if kind == "verbs" => env_or("GYRE_VERBS_GIDS", "").split(',').count() as u32,
            Err(_) => 3,
        };
        for &design in &designs {
            let started = Instant::now();
            match run_design(kind, design, n, timeout) {
                Ok(reports) => {
                    println!(
                        "{kind} {design} on {n} processes: ok in {:.2} s",
                        started.elapsed().as_secs_f64()
                    );
                    for r in reports {
                        println!("  {r}");
                    }
                }
                Err(e) => {
                    failures += 1;
                    println!("{kind} {design} on {n} processes: FAILED: {e}");
                }
            }
        }
    }
    if failures > 0 {
        println!("{failures} design runs failed");
        std::process::exit(1);
    }
}
