//! The emulated cluster: network namespaces joined by shaped veth links to a
//! bridge, CPU quotas per host, and optionally a gyre coordinator and workers.
//!
//! Topology (nothing is created in the machine's own namespace):
//!
//! ```text
//!  netns gyre-NAME-c      netns gyre-NAME-h0          netns gyre-NAME-hN-1
//!   eth0 10.213.0.1        eth0 10.213.0.2              eth0 ...
//!    | tbf (send)           | tbf (send)                 | tbf (send)
//!    |                      |                            |
//!   p-c  tbf (receive)     p-h0 tbf (receive)          p-hN-1 tbf (receive)
//!    +----------------- br0 in netns gyre-NAME-br ------+
//! ```
//!
//! Each host's link is shaped in both directions: tbf on the host's `eth0`
//! limits what it sends, tbf on the bridge-side end limits what it receives, so
//! a host sends and receives at the link rate at the same time (full duplex), as
//! on a switched network. The coordinator runs on its own host `c`, with the same
//! link and CPU quota as a worker's host, so it does not take bandwidth or CPU
//! from any worker. Clients reach it from inside that namespace
//! (`ip netns exec gyre-NAME-c gyre sql --connect ...`): the machine's own
//! namespace has no route to the cluster, and none is added.

use crate::cgroup::{self, CpuController};
use crate::cpu::CpuQuota;
use crate::error::{Error, Result};
use crate::naming::{self, BRIDGE_IF, COORDINATOR_HOST, ClusterName, HOST_IF, Subnet};
use crate::rate::LinkRate;
use crate::state::{self, CgroupState, ClusterState, Host, ProcessRecord, Role};
use crate::sys;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// First port of a cluster's port range: each host's gyre process listens on
/// `base` (Flight SQL / control) and `base + 1` (data); link measurements use
/// `base + 10`. Every host has its own namespace, so all hosts use the same ports.
pub const DEFAULT_BASE_PORT: u16 = 50050;
const BLAST_PORT_OFFSET: u16 = 10;

/// What `gyre coordinator` and `gyre worker` print once ready (see src/main.rs).
const COORDINATOR_READY: &str = "gyre coordinator listening on";
const WORKER_READY: &str = "serving on";

/// What to build.
#[derive(Clone, Debug)]
pub struct TestbedSpec {
    pub name: ClusterName,
    /// Worker hosts (the coordinator's host comes in addition).
    pub hosts: usize,
    /// Rate of every host's link, each direction.
    pub link: LinkRate,
    /// CPU quota of every host; `None` leaves hosts unconstrained (no cgroups).
    pub cpus: Option<CpuQuota>,
    pub subnet: Subnet,
    pub base_port: u16,
    /// Start a gyre coordinator and workers; `None` builds the network only.
    pub gyre: Option<GyreProcesses>,
    /// Where the state file and logs go.
    pub state_dir: PathBuf,
}

impl TestbedSpec {
    /// A network-only testbed with default subnet, ports and state directory.
    pub fn new(name: ClusterName, hosts: usize, link: LinkRate) -> Self {
        TestbedSpec {
            name,
            hosts,
            link,
            cpus: None,
            subnet: Subnet::default(),
            base_port: DEFAULT_BASE_PORT,
            gyre: None,
            state_dir: PathBuf::from(state::DEFAULT_STATE_DIR),
        }
    }
}

/// The gyre processes to start on a testbed.
#[derive(Clone, Debug)]
pub struct GyreProcesses {
    /// The `gyre` executable.
    pub exe: PathBuf,
    /// Cluster secret shared by the nodes (passed as `GYRE_SECRET`).
    pub secret: String,
    /// Threads per worker; default: the CPUs of the quota rounded up, else 2.
    pub worker_threads: Option<usize>,
    /// How long to wait for the coordinator and all workers to be ready.
    pub ready_timeout: Duration,
    /// Directories the nodes may read and write local files in (`--data-root`; the
    /// hosts share this machine's file system). None: no local files.
    pub data_roots: Vec<PathBuf>,
    /// Seal the data links between the nodes (`--encrypt-links`).
    pub encrypt_links: bool,
    /// More arguments for the coordinator (its transactional tables: `--data-dir`,
    /// `--log`, ...).
    pub coordinator_args: Vec<String>,
    /// Multicast the primary's log on this group, each node on its own address
    /// (`--log-multicast`, `--log-interface`).
    pub log_multicast: Option<std::net::SocketAddrV4>,
}

impl GyreProcesses {
    /// Runs the current executable (which must be `gyre`) with a fresh random secret.
    pub fn current_exe() -> Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::io("cannot find the current executable", e))?;
        Ok(GyreProcesses {
            exe,
            secret: random_secret()?,
            worker_threads: None,
            ready_timeout: Duration::from_secs(60),
            data_roots: Vec::new(),
            encrypt_links: false,
            coordinator_args: Vec::new(),
            log_multicast: None,
        })
    }
}

fn random_secret() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom")
            .map_err(|e| Error::io("cannot open /dev/urandom", e))?,
        &mut bytes,
    )
    .map_err(|e| Error::io("cannot read /dev/urandom", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Host {
    /// A command that runs `program` on this host: inside its network namespace
    /// (`ip netns exec`) and, if the cluster has a CPU quota, inside its cgroup
    /// (the shell joins the cgroup, then execs, so every thread and child of the
    /// program is in it from the start). Add arguments to the returned command.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = match &self.cgroup {
            Some(dir) => {
                let mut cmd = Command::new("sh");
                cmd.arg("-c")
                    .arg(r#"echo $$ > "$0" && exec "$@""#)
                    .arg(cgroup::procs_file(dir))
                    .arg("ip");
                cmd
            }
            None => Command::new("ip"),
        };
        cmd.args(["netns", "exec"]).arg(&self.netns).arg(program);
        cmd
    }
}

/// A running emulated cluster.
///
/// One made by [`Testbed::up`] is torn down when dropped, unless [`Testbed::keep`]
/// is called (as `gyre cluster up` does); one attached with [`Testbed::open`] is
/// left alone when dropped.
pub struct Testbed {
    state: ClusterState,
    state_dir: PathBuf,
    /// Processes this process started (waited for on teardown, so none is left a zombie).
    children: Vec<Child>,
    owned: bool,
}

/// What a teardown removed, and what it could not.
#[derive(Debug, Default)]
pub struct DownReport {
    pub name: String,
    pub processes: Vec<String>,
    pub netns: Vec<String>,
    pub cgroups: Vec<PathBuf>,
    pub errors: Vec<String>,
}

impl std::fmt::Display for DownReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cluster '{}': stopped {} process(es), removed {} namespace(s) (with their interfaces and qdiscs) and {} cgroup(s)",
            self.name,
            self.processes.len(),
            self.netns.len(),
            self.cgroups.len()
        )?;
        for e in &self.errors {
            write!(f, "\n  error: {e}")?;
        }
        Ok(())
    }
}

impl Testbed {
    /// Builds the cluster described by `spec`. Needs root. Fails if a cluster of
    /// that name exists; on any failure removes what it had made.
    pub fn up(spec: TestbedSpec) -> Result<Testbed> {
        sys::require_root("creating an emulated cluster")?;
        sys::require_tool("ip", "-V")?;
        sys::require_tool("tc", "-V")?;
        validate(&spec)?;
        let controller = match spec.cpus {
            Some(_) => Some(CpuController::detect().ok_or_else(|| {
                Error::Invalid(
                    "--cpus needs a cgroup CPU controller (cgroup v2 with `cpu` in cgroup.controllers, or a cgroup v1 `cpu` mount); none is mounted".into(),
                )
            })?),
            None => None,
        };
        let gyre_exe = spec.gyre.as_ref().map(|g| g.exe.clone());
        let state = ClusterState {
            name: spec.name.clone(),
            link: spec.link,
            tbf: spec.link.tbf(),
            cpus: spec.cpus,
            subnet: spec.subnet,
            base_port: spec.base_port,
            hosts: Vec::new(),
            netns: Vec::new(),
            cgroup: None,
            processes: Vec::new(),
            coordinator_addr: None,
            secret: spec.gyre.as_ref().map(|g| g.secret.clone()),
            log_dir: state::log_dir(&spec.state_dir, &spec.name),
            gyre_exe,
        };
        state::claim(&spec.state_dir, &state)?;
        // The state file is ours now; refuse if leftovers with our names exist.
        if let Err(e) = check_no_leftovers(&spec.name, controller.as_ref()) {
            let _ = state::release(&spec.state_dir, &spec.name);
            return Err(e);
        }
        let mut tb = Testbed {
            state,
            state_dir: spec.state_dir.clone(),
            children: Vec::new(),
            owned: true,
        };
        if let Err(e) = tb.build(&spec, controller) {
            tb.owned = false;
            let report = tb.teardown();
            if report.errors.is_empty() {
                return Err(e);
            }
            return Err(Error::Process(format!(
                "{e}\n(cleanup after the failure was incomplete: {})",
                report.errors.join("; ")
            )));
        }
        Ok(tb)
    }

    /// Attaches to a running cluster by name; `None` if there is no state file.
    pub fn open(name: &ClusterName, state_dir: &Path) -> Result<Option<Testbed>> {
        Ok(state::load(state_dir, name)?.map(|state| Testbed {
            state,
            state_dir: state_dir.to_path_buf(),
            children: Vec::new(),
            owned: false,
        }))
    }

    /// Removes the cluster `name`, if its state file exists. Needs root.
    pub fn down_by_name(name: &ClusterName, state_dir: &Path) -> Result<Option<DownReport>> {
        sys::require_root("removing an emulated cluster")?;
        match Testbed::open(name, state_dir)? {
            Some(tb) => tb.down().map(Some),
            None => Ok(None),
        }
    }

    /// Stops the processes and removes every namespace, interface, qdisc and cgroup
    /// the cluster made, then its state file and logs. On a partial failure the
    /// state file stays, so running `down` again retries.
    pub fn down(mut self) -> Result<DownReport> {
        self.owned = false;
        let report = self.teardown();
        if report.errors.is_empty() {
            Ok(report)
        } else {
            Err(Error::Process(format!(
                "{report}\nstate kept in {}; run down again to retry",
                state::state_file(&self.state_dir, &self.state.name).display()
            )))
        }
    }

    /// Leaves the cluster running after this value is dropped.
    pub fn keep(mut self) {
        self.owned = false;
    }

    pub fn name(&self) -> &ClusterName {
        &self.state.name
    }

    pub fn link(&self) -> LinkRate {
        self.state.link
    }

    pub fn cpus(&self) -> Option<CpuQuota> {
        self.state.cpus
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// Every host: the coordinator's first, then the workers'.
    pub fn hosts(&self) -> &[Host] {
        &self.state.hosts
    }

    pub fn coordinator_host(&self) -> &Host {
        &self.state.hosts[0]
    }

    pub fn worker_hosts(&self) -> &[Host] {
        &self.state.hosts[1..]
    }

    pub fn host(&self, name: &str) -> Option<&Host> {
        self.state.hosts.iter().find(|h| h.name == name)
    }

    /// The cluster secret its Gyre processes share (drivers that send control messages,
    /// such as benchmarks, need it as `GYRE_SECRET`).
    pub fn secret(&self) -> Option<&str> {
        self.state.secret.as_deref()
    }

    /// Flight SQL address of the coordinator (reachable from the coordinator's host).
    pub fn coordinator_addr(&self) -> Option<SocketAddr> {
        self.state.coordinator_addr
    }

    /// The port capacity measurements listen on.
    pub fn blast_port(&self) -> u16 {
        self.state.base_port + BLAST_PORT_OFFSET
    }

    pub fn state_file(&self) -> PathBuf {
        state::state_file(&self.state_dir, &self.state.name)
    }

    /// Recorded processes that are no longer running, and namespaces that are gone.
    pub fn health(&self) -> Result<Vec<String>> {
        let existing = sys::list_netns()?;
        let mut problems = Vec::new();
        for p in &self.state.processes {
            if !sys::process_alive(p.pid, p.start_time) {
                problems.push(format!(
                    "{} on {} (pid {}) is not running; log: {}",
                    p.what,
                    p.host,
                    p.pid,
                    p.log.display()
                ));
            }
        }
        for ns in &self.state.netns {
            if !existing.contains(ns) {
                problems.push(format!("namespace {ns} is missing"));
            }
        }
        Ok(problems)
    }

    /// A description of the cluster and how to use it.
    pub fn describe(&self) -> String {
        let s = &self.state;
        let mut out = String::new();
        let cpus = match (&s.cpus, &s.cgroup) {
            (Some(q), Some(cg)) => format!(
                ", {q} CPU per host (cgroup {} {})",
                match cg.controller.version {
                    cgroup::CgroupVersion::V1 => "v1",
                    cgroup::CgroupVersion::V2 => "v2",
                },
                cg.group.display()
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "cluster '{}': {} worker host(s) + coordinator host, subnet {}, links {} each way (tbf burst {} B, limit {} B){cpus}",
            s.name,
            s.hosts.len().saturating_sub(1),
            s.subnet,
            s.link,
            s.tbf.burst_bytes,
            s.tbf.limit_bytes
        );
        let _ = writeln!(
            out,
            "  {:<5} {:<28} {:<15} runs",
            "host", "namespace", "address"
        );
        for h in &s.hosts {
            let runs: Vec<String> = s
                .processes
                .iter()
                .filter(|p| p.host == h.name)
                .map(|p| format!("{} (pid {})", p.what, p.pid))
                .collect();
            let _ = writeln!(
                out,
                "  {:<5} {:<28} {:<15} {}",
                h.name,
                h.netns,
                h.addr,
                if runs.is_empty() {
                    "-".to_string()
                } else {
                    runs.join(", ")
                }
            );
        }
        let c = self.coordinator_host();
        if let (Some(addr), Some(exe)) = (s.coordinator_addr, &s.gyre_exe) {
            let _ = writeln!(
                out,
                "connect (the machine's own namespace has no route to the cluster):\n  ip netns exec {} {} sql --connect {addr}",
                c.netns,
                exe.display()
            );
            let _ = writeln!(out, "logs: {}", s.log_dir.display());
        }
        let _ = writeln!(
            out,
            "run a command on a host: ip netns exec {} COMMAND",
            c.netns
        );
        let _ = write!(out, "remove: gyre cluster down --name {}", s.name);
        out
    }

    fn save(&self) -> Result<()> {
        state::save(&self.state_dir, &self.state)
    }

    fn build(&mut self, spec: &TestbedSpec, controller: Option<CpuController>) -> Result<()> {
        let name = spec.name.clone();
        let bridge = name.bridge_netns();
        self.add_netns(&bridge)?;
        sys::ip(["-n", &bridge, "link", "add", BRIDGE_IF, "type", "bridge"])?;
        sys::ip(["-n", &bridge, "link", "set", BRIDGE_IF, "up"])?;

        let mut planned = vec![(
            COORDINATOR_HOST.to_string(),
            Role::Coordinator,
            spec.subnet.coordinator()?,
        )];
        for i in 0..spec.hosts {
            planned.push((
                naming::worker_host(i),
                Role::Worker(i),
                spec.subnet.worker(i)?,
            ));
        }
        let tbf = spec.link.tbf().tc_args();
        let prefix = spec.subnet.prefix_len();
        for (host, role, addr) in planned {
            let netns = name.host_netns(&host);
            self.add_netns(&netns)?;
            let port = naming::bridge_port(&host);
            sys::ip([
                "-n", &bridge, "link", "add", &port, "type", "veth", "peer", "name", HOST_IF,
                "netns", &netns,
            ])?;
            sys::ip([
                "-n", &bridge, "link", "set", &port, "master", BRIDGE_IF, "up",
            ])?;
            sys::ip([
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{addr}/{prefix}"),
                "dev",
                HOST_IF,
            ])?;
            sys::ip(["-n", &netns, "link", "set", HOST_IF, "up"])?;
            sys::ip(["-n", &netns, "link", "set", "lo", "up"])?;
            sys::tc(
                ["-n", netns.as_str(), "qdisc", "add", "dev", HOST_IF, "root"]
                    .into_iter()
                    .map(String::from)
                    .chain(tbf.iter().cloned()),
            )?;
            sys::tc(
                [
                    "-n",
                    bridge.as_str(),
                    "qdisc",
                    "add",
                    "dev",
                    port.as_str(),
                    "root",
                ]
                .into_iter()
                .map(String::from)
                .chain(tbf.iter().cloned()),
            )?;
            self.state.hosts.push(Host {
                name: host,
                role,
                netns,
                addr,
                cgroup: None,
            });
            self.save()?;
        }

        if let (Some(controller), Some(quota)) = (controller, spec.cpus) {
            let group = controller.create_group(&name.cgroup_dir())?;
            self.state.cgroup = Some(CgroupState {
                controller: controller.clone(),
                group: group.clone(),
                hosts: Vec::new(),
            });
            self.save()?;
            for i in 0..self.state.hosts.len() {
                let dir =
                    controller.create_host(&group, &self.state.hosts[i].name.clone(), quota)?;
                self.state.hosts[i].cgroup = Some(dir.clone());
                if let Some(cg) = &mut self.state.cgroup {
                    cg.hosts.push(dir);
                }
                self.save()?;
            }
        }

        if let Some(gyre) = &spec.gyre {
            self.start_gyre(gyre)?;
        }
        Ok(())
    }

    fn add_netns(&mut self, netns: &str) -> Result<()> {
        sys::ip(["netns", "add", netns])?;
        self.state.netns.push(netns.to_string());
        self.save()
    }

    fn start_gyre(&mut self, gyre: &GyreProcesses) -> Result<()> {
        std::fs::create_dir_all(&self.state.log_dir)
            .map_err(|e| Error::io(format!("cannot create {}", self.state.log_dir.display()), e))?;
        let base = self.state.base_port;
        let deadline = Instant::now() + gyre.ready_timeout;
        let coordinator = self.coordinator_host().clone();
        let coord_addr = SocketAddr::new(coordinator.addr.into(), base);
        let mut cmd = coordinator.command(&gyre.exe);
        // Clients reach it from the hosts of this machine's own namespaces only.
        cmd.arg("coordinator")
            .arg("--insecure-no-auth")
            .arg("--listen")
            .arg(coord_addr.to_string())
            .arg("--data-listen")
            .arg(SocketAddr::new(coordinator.addr.into(), base + 1).to_string());
        for root in &gyre.data_roots {
            cmd.arg("--data-root").arg(root);
        }
        if gyre.encrypt_links {
            cmd.arg("--encrypt-links");
        }
        cmd.args(&gyre.coordinator_args);
        if let Some(group) = gyre.log_multicast {
            cmd.arg("--log-multicast")
                .arg(group.to_string())
                .arg("--log-interface")
                .arg(coordinator.addr.to_string());
        }
        let coord_index = self.spawn(&coordinator, "coordinator", cmd, &gyre.secret)?;
        self.wait_ready(coord_index, COORDINATOR_READY, deadline)?;

        let threads = gyre
            .worker_threads
            .or(self.state.cpus.map(|q| q.threads()))
            .unwrap_or(2);
        let mut workers = Vec::new();
        for host in self.worker_hosts().to_vec() {
            let mut cmd = host.command(&gyre.exe);
            cmd.arg("worker")
                .arg("--coordinator")
                .arg(coord_addr.to_string())
                .arg("--listen")
                .arg(SocketAddr::new(host.addr.into(), base).to_string())
                .arg("--data-listen")
                .arg(SocketAddr::new(host.addr.into(), base + 1).to_string())
                .arg("--threads")
                .arg(threads.to_string());
            for root in &gyre.data_roots {
                cmd.arg("--data-root").arg(root);
            }
            if gyre.encrypt_links {
                cmd.arg("--encrypt-links");
            }
            if let Some(group) = gyre.log_multicast {
                cmd.arg("--log-multicast")
                    .arg(group.to_string())
                    .arg("--log-interface")
                    .arg(host.addr.to_string());
            }
            workers.push(self.spawn(&host, "worker", cmd, &gyre.secret)?);
        }
        for index in workers {
            self.wait_ready(index, WORKER_READY, deadline)?;
        }

        // The way we tell users to connect must work: run a query from the
        // coordinator's host.
        let mut check = coordinator.command(&gyre.exe);
        check
            .arg("sql")
            .arg("--connect")
            .arg(coord_addr.to_string())
            .arg("-c")
            .arg("select 1");
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(10));
        run_with_timeout(check, left)?;
        self.state.coordinator_addr = Some(coord_addr);
        self.save()
    }

    /// Starts a long-running process with its output in a log file; returns its
    /// index in `state.processes`.
    fn spawn(&mut self, host: &Host, what: &str, mut cmd: Command, secret: &str) -> Result<usize> {
        let log = self.state.log_dir.join(format!("{what}-{}.log", host.name));
        let file = std::fs::File::create(&log)
            .map_err(|e| Error::io(format!("cannot create {}", log.display()), e))?;
        let err = file
            .try_clone()
            .map_err(|e| Error::io(format!("cannot open {}", log.display()), e))?;
        cmd.env("GYRE_SECRET", secret)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            // Its own process group: a Ctrl-C at the terminal that ran `up` does
            // not reach the cluster.
            .process_group(0);
        let text = sys::describe(&cmd);
        let child = cmd
            .spawn()
            .map_err(|e| Error::io(format!("cannot start `{text}`"), e))?;
        let pid = child.id();
        self.children.push(child);
        let start_time = sys::process_start_time(pid).ok_or_else(|| {
            Error::Process(format!(
                "{what} on {} (pid {pid}) exited at once; log: {}",
                host.name,
                sys::tail(&log, 20)
            ))
        })?;
        self.state.processes.push(ProcessRecord {
            host: host.name.clone(),
            what: what.to_string(),
            pid,
            start_time,
            log,
        });
        self.save()?;
        Ok(self.state.processes.len() - 1)
    }

    fn wait_ready(&mut self, index: usize, marker: &str, deadline: Instant) -> Result<()> {
        let record = self.state.processes[index].clone();
        let child = self
            .children
            .iter_mut()
            .find(|c| c.id() == record.pid)
            .ok_or_else(|| Error::Process(format!("no child with pid {}", record.pid)))?;
        loop {
            let text = std::fs::read_to_string(&record.log).unwrap_or_default();
            if text.contains(marker) {
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(Error::Process(format!(
                    "{} on host {} exited ({status}) before it was ready; last lines of {}:\n{}",
                    record.what,
                    record.host,
                    record.log.display(),
                    sys::tail(&record.log, 20)
                )));
            }
            if Instant::now() >= deadline {
                return Err(Error::Process(format!(
                    "{} on host {} was not ready in time (no '{marker}' in its log); last lines of {}:\n{}",
                    record.what,
                    record.host,
                    record.log.display(),
                    sys::tail(&record.log, 20)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Removes everything in the state, continuing past failures (collected in the report).
    fn teardown(&mut self) -> DownReport {
        let mut report = DownReport {
            name: self.state.name.to_string(),
            ..Default::default()
        };
        let existing = match sys::list_netns() {
            Ok(list) => list,
            Err(e) => {
                report.errors.push(e.to_string());
                return report;
            }
        };
        let ours: Vec<String> = self
            .state
            .netns
            .iter()
            .filter(|n| existing.contains(n))
            .cloned()
            .collect();

        // 1. Processes: those recorded, and anything else inside our namespaces
        //    (e.g. a measurement left over): TERM, then KILL.
        let recorded: Vec<&ProcessRecord> = self
            .state
            .processes
            .iter()
            .filter(|p| sys::process_alive(p.pid, p.start_time))
            .collect();
        for p in &recorded {
            let _ = sys::signal(p.pid, "TERM");
            report
                .processes
                .push(format!("{} on {} (pid {})", p.what, p.host, p.pid));
        }
        let in_netns = || -> Result<Vec<u32>> {
            let mut pids = Vec::new();
            for ns in &ours {
                pids.extend(sys::netns_pids(ns)?);
            }
            Ok(pids)
        };
        match in_netns() {
            Ok(pids) => {
                for pid in pids {
                    if !recorded.iter().any(|p| p.pid == pid) {
                        let _ = sys::signal(pid, "TERM");
                        report
                            .processes
                            .push(format!("process {pid} in a cluster namespace"));
                    }
                }
            }
            Err(e) => report.errors.push(e.to_string()),
        }
        let all_gone = |children: &mut Vec<Child>| {
            for c in children.iter_mut() {
                let _ = c.try_wait();
            }
            recorded
                .iter()
                .all(|p| !sys::process_alive(p.pid, p.start_time))
                && in_netns().is_ok_and(|pids| pids.is_empty())
        };
        if !sys::wait_until(Duration::from_secs(3), || all_gone(&mut self.children)) {
            for p in &recorded {
                if sys::process_alive(p.pid, p.start_time) {
                    let _ = sys::signal(p.pid, "KILL");
                }
            }
            for pid in in_netns().unwrap_or_default() {
                let _ = sys::signal(pid, "KILL");
            }
            if !sys::wait_until(Duration::from_secs(3), || all_gone(&mut self.children)) {
                report
                    .errors
                    .push("some cluster processes survived SIGKILL".to_string());
            }
        }
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }

        // 2. Namespaces: deleting a host's namespace destroys its veth pair (both
        //    ends) and their qdiscs; the bridge goes with the bridge namespace.
        for ns in ours.iter().rev() {
            match sys::ip(["netns", "del", ns.as_str()]) {
                Ok(_) => report.netns.push(ns.clone()),
                Err(e) => report.errors.push(e.to_string()),
            }
        }

        // 3. Cgroups, children first.
        if let Some(cg) = &self.state.cgroup {
            for dir in cg.hosts.iter().chain(std::iter::once(&cg.group)) {
                let existed = dir.exists();
                match cgroup::remove(dir) {
                    Ok(()) if existed => report.cgroups.push(dir.clone()),
                    Ok(()) => {}
                    Err(e) => report.errors.push(e.to_string()),
                }
            }
        }

        // 4. Logs and the state file, only when everything else is gone.
        if report.errors.is_empty() {
            if self.state.log_dir.exists()
                && let Err(e) = std::fs::remove_dir_all(&self.state.log_dir)
            {
                report.errors.push(format!(
                    "cannot remove {}: {e}",
                    self.state.log_dir.display()
                ));
            }
            if let Err(e) = state::release(&self.state_dir, &self.state.name) {
                report.errors.push(e.to_string());
            }
            // The default state directory is ours: it goes too once no cluster
            // is left in it.
            if self.state_dir == Path::new(state::DEFAULT_STATE_DIR) {
                let _ = std::fs::remove_dir(&self.state_dir);
            }
        }
        report
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.owned {
            self.owned = false;
            let report = self.teardown();
            if !report.errors.is_empty() {
                eprintln!("gyre-testbed: teardown of a dropped testbed: {report}");
            }
        }
    }
}

fn validate(spec: &TestbedSpec) -> Result<()> {
    if spec.hosts == 0 {
        return Err(Error::Invalid(
            "a cluster needs at least one worker host".into(),
        ));
    }
    // The coordinator's host takes one address too.
    if spec.hosts as u64 + 1 > spec.subnet.capacity() {
        return Err(Error::Invalid(format!(
            "subnet {} holds {} hosts; {} worker hosts and the coordinator's do not fit",
            spec.subnet,
            spec.subnet.capacity(),
            spec.hosts
        )));
    }
    if spec.base_port == 0 || spec.base_port.checked_add(BLAST_PORT_OFFSET).is_none() {
        return Err(Error::Invalid(format!(
            "base port {} leaves no room for the cluster's ports (base to base+{BLAST_PORT_OFFSET})",
            spec.base_port
        )));
    }
    Ok(())
}

/// Refuses to build over namespaces or a cgroup that carry our name but are not
/// in a state file: they are left from an earlier cluster whose state was lost.
fn check_no_leftovers(name: &ClusterName, controller: Option<&CpuController>) -> Result<()> {
    let prefix = name.prefix();
    let found: Vec<String> = sys::list_netns()?
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    if !found.is_empty() {
        return Err(Error::AlreadyExists(format!(
            "network namespaces {} exist but no state file records them (left from an earlier cluster '{name}'?); remove them with `ip netns del` first",
            found.join(", ")
        )));
    }
    if let Some(c) = controller {
        let dir = c.mount.join(name.cgroup_dir());
        if dir.exists() {
            return Err(Error::AlreadyExists(format!(
                "cgroup {} exists but no state file records it; remove it (rmdir its children, then it) first",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Runs a short command, killing it if it takes longer than `timeout`.
pub(crate) fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Result<String> {
    let text = sys::describe(&cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("cannot run `{text}`"), e))?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Process(format!(
                    "`{text}` did not finish within {timeout:?}"
                )));
            }
            Err(e) => return Err(Error::io(format!("cannot wait for `{text}`"), e)),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(format!("cannot read the output of `{text}`"), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: text,
            status: out.status.to_string(),
            stderr: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
