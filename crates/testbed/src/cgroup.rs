//! Per-host CPU quotas with the cgroup CPU controller, v2 (`cpu.max`) where the
//! machine offers it, else v1 (`cpu.cfs_quota_us`).
//!
//! Layout: `MOUNT/gyre-NAME/` holds one child per emulated host
//! (`MOUNT/gyre-NAME/h0`, ...), each with the quota; processes are only ever put
//! in the children (cgroup v2's "no internal processes" rule).

use crate::cpu::{CFS_PERIOD_US, CpuQuota};
use crate::error::{Error, Result};
use crate::sys;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// A mounted cgroup hierarchy with a usable CPU controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuController {
    pub version: CgroupVersion,
    pub mount: PathBuf,
}

impl CpuController {
    /// Finds the CPU controller: a cgroup2 mount whose `cgroup.controllers` lists
    /// `cpu`, else a cgroup v1 mount with the `cpu` option.
    pub fn detect() -> Option<Self> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        Self::from_mounts(&mounts, |dir| {
            std::fs::read_to_string(dir.join("cgroup.controllers")).ok()
        })
    }

    fn from_mounts(mounts: &str, controllers: impl Fn(&Path) -> Option<String>) -> Option<Self> {
        let entries: Vec<(&str, &str, &str)> = mounts
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let _source = f.next()?;
                Some((f.next()?, f.next()?, f.next()?))
            })
            .collect();
        let v2 = entries.iter().find(|(dir, fstype, _)| {
            *fstype == "cgroup2"
                && controllers(Path::new(dir))
                    .is_some_and(|c| c.split_whitespace().any(|c| c == "cpu"))
        });
        if let Some((dir, _, _)) = v2 {
            return Some(CpuController {
                version: CgroupVersion::V2,
                mount: PathBuf::from(dir),
            });
        }
        entries
            .iter()
            .find(|(_, fstype, options)| {
                *fstype == "cgroup" && options.split(',').any(|o| o == "cpu")
            })
            .map(|(dir, _, _)| CpuController {
                version: CgroupVersion::V1,
                mount: PathBuf::from(dir),
            })
    }

    /// Creates the cluster's parent group `MOUNT/DIR_NAME` (it must not exist).
    pub fn create_group(&self, dir_name: &str) -> Result<PathBuf> {
        let dir = self.mount.join(dir_name);
        if self.version == CgroupVersion::V2 {
            // The cpu controller must be enabled for the mount's children first;
            // this is left enabled afterwards (enabling it changes no limits).
            enable_cpu_for_children(&self.mount)?;
        }
        std::fs::create_dir(&dir)
            .map_err(|e| Error::io(format!("cannot create cgroup {}", dir.display()), e))?;
        if self.version == CgroupVersion::V2 {
            enable_cpu_for_children(&dir)?;
        }
        Ok(dir)
    }

    /// Creates the host's child group with the quota; returns its directory.
    pub fn create_host(&self, group: &Path, host: &str, quota: CpuQuota) -> Result<PathBuf> {
        let dir = group.join(host);
        std::fs::create_dir(&dir)
            .map_err(|e| Error::io(format!("cannot create cgroup {}", dir.display()), e))?;
        for (file, value) in self.quota_files(quota) {
            write_file(&dir.join(file), &value)?;
        }
        Ok(dir)
    }

    /// The control files and values that set `quota` in this cgroup version.
    fn quota_files(&self, quota: CpuQuota) -> Vec<(&'static str, String)> {
        match self.version {
            CgroupVersion::V1 => vec![
                ("cpu.cfs_period_us", CFS_PERIOD_US.to_string()),
                ("cpu.cfs_quota_us", quota.quota_us().to_string()),
            ],
            CgroupVersion::V2 => {
                vec![("cpu.max", format!("{} {}", quota.quota_us(), CFS_PERIOD_US))]
            }
        }
    }
}

/// The file a process's pid is written to, to move it into the group.
pub fn procs_file(dir: &Path) -> PathBuf {
    dir.join("cgroup.procs")
}

/// Pids in a cgroup (not its children).
pub fn pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(procs_file(dir))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Times the group's tasks were throttled by the quota (`nr_throttled` of `cpu.stat`).
pub fn throttled_periods(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.trim().parse().ok())
}

/// Kills whatever still runs in a group we created, then removes it.
/// Missing directories are fine (already removed).
pub fn remove(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let empty = sys::wait_until(Duration::from_secs(3), || {
        let pids = pids(dir);
        for pid in &pids {
            let _ = sys::signal(*pid, "KILL");
        }
        pids.is_empty()
    });
    if !empty {
        return Err(Error::Process(format!(
            "cgroup {} still has processes {:?} after SIGKILL",
            dir.display(),
            pids(dir)
        )));
    }
    // The kernel may need a moment after the last task exits before rmdir succeeds.
    let mut last = None;
    let removed = sys::wait_until(Duration::from_secs(2), || match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            last = Some(e);
            false
        }
    });
    match (removed, last) {
        (true, _) => Ok(()),
        (false, Some(e)) => Err(Error::io(
            format!("cannot remove cgroup {}", dir.display()),
            e,
        )),
        (false, None) => Err(Error::Process(format!(
            "cannot remove cgroup {}",
            dir.display()
        ))),
    }
}

fn enable_cpu_for_children(dir: &Path) -> Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let current = std::fs::read_to_string(&control)
        .map_err(|e| Error::io(format!("cannot read {}", control.display()), e))?;
    if current.split_whitespace().any(|c| c == "cpu") {
        return Ok(());
    }
    write_file(&control, "+cpu")
}

fn write_file(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value)
        .map_err(|e| Error::io(format!("cannot write '{value}' to {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_AND_EMPTY_V2: &str = "\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
";

    #[test]
    fn prefers_v2_only_when_it_offers_cpu() {
        let no_cpu = CpuController::from_mounts(V1_AND_EMPTY_V2, |_| Some("hugetlb\n".into()));
        assert_eq!(
            no_cpu,
            Some(CpuController {
                version: CgroupVersion::V1,
                mount: "/sys/fs/cgroup/cpu".into()
            })
        );
        let with_cpu =
            CpuController::from_mounts(V1_AND_EMPTY_V2, |_| Some("cpuset cpu io memory\n".into()));
        assert_eq!(with_cpu.unwrap().version, CgroupVersion::V2);
        let combined = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n";
        assert_eq!(
            CpuController::from_mounts(combined, |_| None)
                .unwrap()
                .mount,
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        let cpuacct_only = "cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n";
        assert_eq!(CpuController::from_mounts(cpuacct_only, |_| None), None);
    }

    #[test]
    fn quota_files_per_version() {
        let q: CpuQuota = "0.5".parse().unwrap();
        let v1 = CpuController {
            version: CgroupVersion::V1,
            mount: "/x".into(),
        };
        assert_eq!(
            v1.quota_files(q),
            [
                ("cpu.cfs_period_us", "100000".to_string()),
                ("cpu.cfs_quota_us", "50000".to_string())
            ]
        );
        let v2 = CpuController {
            version: CgroupVersion::V2,
            mount: "/x".into(),
        };
        assert_eq!(v2.quota_files(q), [("cpu.max", "50000 100000".to_string())]);
    }
}
