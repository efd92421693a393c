//! The state file of a cluster: what `up` created, written as it is created, so
//! that `down` (another process, later) removes exactly that and nothing else.

use crate::cgroup::CpuController;
use crate::cpu::CpuQuota;
use crate::error::{Error, Result};
use crate::naming::{ClusterName, Subnet};
use crate::rate::{LinkRate, TbfParams};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where state files live by default (`/run` is cleared at boot, as namespaces are).
pub const DEFAULT_STATE_DIR: &str = "/run/gyre-cluster";

/// What an emulated host runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The coordinator's own host (also the place to run clients from).
    Coordinator,
    /// Worker host `i`.
    Worker(usize),
}

/// One emulated host: a network namespace with one shaped link to the bridge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Short name: `c` or `h0`, `h1`, ...
    pub name: String,
    pub role: Role,
    /// Network namespace (`gyre-NAME-h0`).
    pub netns: String,
    /// Its address on the cluster subnet.
    pub addr: Ipv4Addr,
    /// Its cgroup directory, when the cluster has a CPU quota.
    pub cgroup: Option<PathBuf>,
}

/// The CPU cgroups a cluster created.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CgroupState {
    pub controller: CpuController,
    /// The cluster's parent group.
    pub group: PathBuf,
    /// Host groups created so far (children of `group`).
    pub hosts: Vec<PathBuf>,
}

/// A process `up` started; the start time guards against pid reuse.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub host: String,
    pub what: String,
    pub pid: u32,
    pub start_time: u64,
    pub log: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterState {
    pub name: ClusterName,
    pub link: LinkRate,
    pub tbf: TbfParams,
    pub cpus: Option<CpuQuota>,
    pub subnet: Subnet,
    pub base_port: u16,
    /// Coordinator host first, then the workers' hosts.
    pub hosts: Vec<Host>,
    /// Network namespaces created, in creation order.
    pub netns: Vec<String>,
    pub cgroup: Option<CgroupState>,
    pub processes: Vec<ProcessRecord>,
    /// Flight SQL address of the coordinator, when one was started.
    pub coordinator_addr: Option<SocketAddr>,
    /// The cluster secret the gyre processes share, when they were started.
    pub secret: Option<String>,
    pub log_dir: PathBuf,
    /// The executable the gyre processes run.
    pub gyre_exe: Option<PathBuf>,
}

pub fn state_file(state_dir: &Path, name: &ClusterName) -> PathBuf {
    state_dir.join(format!("{name}.json"))
}

pub fn log_dir(state_dir: &Path, name: &ClusterName) -> PathBuf {
    state_dir.join(name.as_str())
}

/// Claims the name: creates the state file, failing if it exists (the cluster is up).
pub fn claim(state_dir: &Path, state: &ClusterState) -> Result<()> {
    std::fs::create_dir_all(state_dir)
        .map_err(|e| Error::io(format!("cannot create {}", state_dir.display()), e))?;
    let path = state_file(state_dir, &state.name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::AlreadyExists(format!(
                "cluster '{}' already exists (state file {}); `gyre cluster down --name {}` removes it",
                state.name,
                path.display(),
                state.name
            )),
            _ => Error::io(format!("cannot create {}", path.display()), e),
        })?;
    file.write_all(&to_json(state)?)
        .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
}

/// Rewrites the state file atomically (write a temporary file, rename).
pub fn save(state_dir: &Path, state: &ClusterState) -> Result<()> {
    let path = state_file(state_dir, &state.name);
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io(format!("cannot write {}", tmp.display()), e))?;
    file.write_all(&to_json(state)?)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(format!("cannot write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| Error::io(format!("cannot replace {}", path.display()), e))
}

/// Reads a cluster's state file; `None` if there is none.
pub fn load(state_dir: &Path, name: &ClusterName) -> Result<Option<ClusterState>> {
    let path = state_file(state_dir, name);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::Invalid(format!("state file {} is unreadable: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("cannot read {}", path.display()), e)),
    }
}

/// Names of the clusters with a state file in `state_dir`.
pub fn list(state_dir: &Path) -> Result<Vec<ClusterName>> {
    let entries = match std::fs::read_dir(state_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("cannot read {}", state_dir.display()), e)),
    };
    let mut names: Vec<ClusterName> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            file.strip_suffix(".json")?.parse().ok()
        })
        .collect();
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Ok(names)
}

/// Removes the state file (the cluster is gone).
pub fn release(state_dir: &Path, name: &ClusterName) -> Result<()> {
    let path = state_file(state_dir, name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("cannot remove {}", path.display()), e)),
    }
}

fn to_json(state: &ClusterState) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(state)
        .map_err(|e| Error::Invalid(format!("cannot encode the state of '{}': {e}", state.name)))
}
