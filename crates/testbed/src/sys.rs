//! Thin wrappers over the system: running `ip`/`tc`, the root check, processes by pid.

use crate::error::{Error, Result};
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether this process runs with effective uid 0 (read from /proc, no libc needed).
pub fn is_root() -> bool {
    effective_uid() == Some(0)
}

fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Fails with [`Error::NotRoot`] unless running as root.
pub fn require_root(what: &str) -> Result<()> {
    if is_root() {
        Ok(())
    } else {
        Err(Error::NotRoot(what.to_string()))
    }
}

/// Fails naming the tool unless `program` runs (e.g. `ip -V`).
pub fn require_tool(program: &str, version_arg: &str) -> Result<()> {
    match Command::new(program)
        .arg(version_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(Error::Process(format!(
            "`{program} {version_arg}` failed ({s}); iproute2 is needed"
        ))),
        Err(e) => Err(Error::io(
            format!("cannot run `{program}` (install iproute2)"),
            e,
        )),
    }
}

/// Describes a command for error messages.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a command to completion; returns its stdout, or an error with its stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
    let text = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("cannot run `{text}`"), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: text,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip ARGS...`
pub fn ip<I, S>(args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(Command::new("ip").args(args))
}

/// `tc ARGS...`
pub fn tc<I, S>(args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(Command::new("tc").args(args))
}

/// Names of the existing network namespaces (`ip netns list`).
pub fn list_netns() -> Result<Vec<String>> {
    Ok(ip(["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Pids of the processes in a network namespace (`ip netns pids NS`).
pub fn netns_pids(netns: &str) -> Result<Vec<u32>> {
    Ok(ip(["netns", "pids", netns])?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

/// Interface names of the namespace this process is in (`ip -o link show`).
pub fn root_interfaces() -> Result<Vec<String>> {
    Ok(ip(["-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        .collect())
}

/// The kernel's start time of a process (field 22 of /proc/PID/stat, in clock ticks
/// since boot): with the pid it identifies a process even after pid reuse.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 is the state, so field 22 is the 20th of the rest.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process `pid` with this start time still exists (and is not a zombie).
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    parse_start_time(&stat) == Some(start_time) && state != Some("Z")
}

/// Sends a signal (`TERM`, `KILL`) with kill(1).
pub fn signal(pid: u32, sig: &str) -> Result<()> {
    run(Command::new("kill")
        .arg("-s")
        .arg(sig)
        .arg(pid.to_string())
        .stderr(Stdio::piped()))
    .map(|_| ())
}

/// Polls `done` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `lines` lines of a log file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_survives_spaces_and_parens_in_the_name() {
        let stat = "1234 (gyre (a) b) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 3 0 987654 1000 200";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_not() {
        let pid = std::process::id();
        let start = process_start_time(pid).unwrap();
        assert!(process_alive(pid, start));
        assert!(!process_alive(pid, start + 1));
    }
}
