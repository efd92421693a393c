//! Link capacity of a testbed, measured with raw TCP blasts between host
//! namespaces (each endpoint runs on its host, in its cgroup, like the engine).

use crate::blast::{BlastEvent, ReceivedStream};
use crate::error::{Error, Result};
use crate::state::Host;
use crate::testbed::Testbed;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// How to run the blast command: a program and the arguments before `serve`/`send`.
#[derive(Clone, Debug)]
pub struct BlastHelper {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl BlastHelper {
    /// `gyre cluster blast ...` through the current executable (which must be `gyre`).
    pub fn gyre() -> Result<Self> {
        let program = std::env::current_exe()
            .map_err(|e| Error::io("cannot find the current executable", e))?;
        Ok(BlastHelper {
            program,
            args: vec!["cluster".into(), "blast".into()],
        })
    }

    fn command(&self, host: &Host, mode: &str) -> Command {
        let mut cmd = host.command(&self.program);
        cmd.args(&self.args).arg(mode);
        cmd
    }
}

/// How long to blast.
#[derive(Clone, Copy, Debug)]
pub struct BlastOptions {
    /// How long each sender sends.
    pub duration: Duration,
    /// Excluded from the rate at the start of each stream (TCP ramp-up).
    pub warmup: Duration,
}

impl Default for BlastOptions {
    fn default() -> Self {
        BlastOptions {
            duration: Duration::from_secs(3),
            warmup: Duration::from_millis(500),
        }
    }
}

/// One measured stream.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamRate {
    /// Sending host's name.
    pub from: String,
    /// Receiving host's name.
    pub to: String,
    /// Received bytes per second after the warm-up.
    pub bytes_per_sec: f64,
    /// Everything the receiver got, and over how long.
    pub bytes: u64,
    pub seconds: f64,
}

impl StreamRate {
    pub fn bits_per_sec(&self) -> f64 {
        self.bytes_per_sec * 8.0
    }
}

/// Capacity of one link direction: one TCP stream from `from` to `to`.
pub fn measure_capacity(
    tb: &Testbed,
    helper: &BlastHelper,
    from: &Host,
    to: &Host,
    options: BlastOptions,
) -> Result<StreamRate> {
    let mut rates = measure_streams(tb, helper, &[(from, to)], options)?;
    Ok(rates.remove(0))
}

/// All worker hosts at once in a ring: host i sends to host i+1 and receives from
/// host i-1, so every link carries the rate in both directions (full duplex).
pub fn measure_ring(
    tb: &Testbed,
    helper: &BlastHelper,
    options: BlastOptions,
) -> Result<Vec<StreamRate>> {
    let hosts = tb.worker_hosts();
    if hosts.len() < 2 {
        return Err(Error::Invalid(
            "a ring measurement needs at least 2 worker hosts".into(),
        ));
    }
    let pairs: Vec<(&Host, &Host)> = (0..hosts.len())
        .map(|i| (&hosts[i], &hosts[(i + 1) % hosts.len()]))
        .collect();
    measure_streams(tb, helper, &pairs, options)
}

/// Runs one TCP stream per `(from, to)` pair at the same time; returns their
/// received rates in the order of `pairs`. A host may appear in several pairs,
/// but a pair's ends must be distinct hosts.
pub fn measure_streams(
    tb: &Testbed,
    helper: &BlastHelper,
    pairs: &[(&Host, &Host)],
    options: BlastOptions,
) -> Result<Vec<StreamRate>> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    for (from, to) in pairs {
        if from.name == to.name {
            return Err(Error::Invalid(format!(
                "a blast from host {} to itself measures no link",
                from.name
            )));
        }
        if tb.host(&from.name).is_none() || tb.host(&to.name).is_none() {
            return Err(Error::Invalid(format!(
                "hosts {} and {} are not both in cluster '{}'",
                from.name,
                to.name,
                tb.name()
            )));
        }
    }
    let mut incoming: BTreeMap<&str, (&Host, usize)> = BTreeMap::new();
    for (_, to) in pairs {
        incoming.entry(&to.name).or_insert((to, 0)).1 += 1;
    }
    let port = tb.blast_port();
    let mut procs = Processes::default();
    let total = options.duration + options.warmup;
    let accept_timeout = Duration::from_secs(20);

    // Receivers first; each says when it listens.
    let mut servers = Vec::new();
    for (host, connections) in incoming.values() {
        let mut cmd = helper.command(host, "serve");
        cmd.args([
            "--listen",
            &SocketAddr::new(host.addr.into(), port).to_string(),
        ])
        .args(["--connections", &connections.to_string()])
        .args(["--warmup-ms", &options.warmup.as_millis().to_string()])
        .args(["--accept-timeout-s", &accept_timeout.as_secs().to_string()]);
        let events = procs.spawn(format!("blast receiver on {}", host.name), cmd)?;
        servers.push((host.name.clone(), *connections, events));
    }
    for (name, _, events) in &servers {
        match next_event(
            events,
            Duration::from_secs(10),
            &format!("blast receiver on {name}"),
        )? {
            BlastEvent::Ready { .. } => {}
            other => {
                return Err(Error::Process(format!(
                    "blast receiver on {name}: {other:?}"
                )));
            }
        }
    }
    let mut clients = Vec::new();
    for (from, to) in pairs {
        let mut cmd = helper.command(from, "send");
        cmd.args([
            "--connect",
            &SocketAddr::new(to.addr.into(), port).to_string(),
        ])
        .args(["--seconds", &options.duration.as_secs_f64().to_string()]);
        let events = procs.spawn(format!("blast sender {} -> {}", from.name, to.name), cmd)?;
        clients.push((from.name.clone(), to.name.clone(), events));
    }

    let wait = total + Duration::from_secs(30);
    let deadline = Instant::now() + wait;
    for (from, to, events) in &clients {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_event(events, left, &format!("blast sender {from} -> {to}"))? {
            BlastEvent::Sent(_) => {}
            other => {
                return Err(Error::Process(format!(
                    "blast sender {from} -> {to}: {other:?}"
                )));
            }
        }
    }
    // (receiving host, stream) for every stream received.
    let mut received: Vec<(String, ReceivedStream)> = Vec::new();
    for (name, connections, events) in &servers {
        for _ in 0..*connections {
            let left = deadline.saturating_duration_since(Instant::now());
            match next_event(events, left, &format!("blast receiver on {name}"))? {
                BlastEvent::Received(r) => received.push((name.clone(), r)),
                other => {
                    return Err(Error::Process(format!(
                        "blast receiver on {name}: {other:?}"
                    )));
                }
            }
        }
    }
    procs.wait_all(deadline)?;

    pairs
        .iter()
        .map(|(from, to)| {
            let i = received
                .iter()
                .position(|(receiver, r)| {
                    *receiver == to.name && r.peer.ip() == std::net::IpAddr::V4(from.addr)
                })
                .ok_or_else(|| {
                    Error::Process(format!(
                        "no stream from {} ({}) was received on {}",
                        from.name, from.addr, to.name
                    ))
                })?;
            let (_, r) = received.remove(i);
            Ok(StreamRate {
                from: from.name.clone(),
                to: to.name.clone(),
                bytes_per_sec: r.bytes_per_sec,
                bytes: r.bytes,
                seconds: r.seconds,
            })
        })
        .collect()
}

type Line = std::result::Result<String, String>;

fn next_event(events: &Receiver<Line>, timeout: Duration, what: &str) -> Result<BlastEvent> {
    match events.recv_timeout(timeout) {
        Ok(Ok(line)) => match serde_json::from_str::<BlastEvent>(&line) {
            Ok(BlastEvent::Error { message }) => Err(Error::Process(format!("{what}: {message}"))),
            Ok(event) => Ok(event),
            Err(e) => Err(Error::Process(format!("{what} printed '{line}' ({e})"))),
        },
        Ok(Err(stderr)) => Err(Error::Process(format!("{what} ended early: {stderr}"))),
        Err(RecvTimeoutError::Timeout) => Err(Error::Process(format!(
            "{what} did not report within {timeout:?}"
        ))),
        Err(RecvTimeoutError::Disconnected) => {
            Err(Error::Process(format!("{what} ended without a report")))
        }
    }
}

/// The blast processes of one measurement; killed if the measurement fails.
#[derive(Default)]
struct Processes(Vec<(String, Child)>);

impl Processes {
    /// Starts a process; its stdout lines arrive on the returned channel, and when
    /// it ends without output, its stderr arrives as an `Err`.
    fn spawn(&mut self, what: String, mut cmd: Command) -> Result<Receiver<Line>> {
        let text = crate::sys::describe(&cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(format!("cannot start `{text}`"), e))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Ok(l)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
            let _ = tx.send(Err(if err.trim().is_empty() {
                "no output".to_string()
            } else {
                err.trim().to_string()
            }));
        });
        self.0.push((what, child));
        Ok(rx)
    }

    fn wait_all(&mut self, deadline: Instant) -> Result<()> {
        for (what, child) in &mut self.0 {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        return Err(Error::Process(format!("{what} failed ({status})")));
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(None) => return Err(Error::Process(format!("{what} did not exit in time"))),
                    Err(e) => return Err(Error::io(format!("cannot wait for {what}"), e)),
                }
            }
        }
        Ok(())
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}
