//! Python helper processes of the benchmarks: DuckDB (a reference system) and its
//! tpcds and tpch extensions (TPC-DS data and query texts, TPC-H data).
//!
//! The packages are installed with pip into a directory of their own under the user's
//! cache, pinned to the versions the published results were measured with: the tpcds
//! extension is built for one DuckDB version, and a system-wide DuckDB of another
//! version would neither load it nor be the same yardstick.

use crate::bench_cluster::BoxError;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The DuckDB helper of the TPC-H and TPC-DS benchmarks (its first argument, `tpch` or
/// `tpcds`, picks which).
pub const DUCKDB_BENCH: &str = include_str!("../scripts/duckdb_bench.py");

/// The pinned packages, DuckDB and the matching tpcds and tpch extensions.
const PACKAGES: [&str; 3] = [
    "duckdb==1.5.5",
    "duckdb-extension-tpcds==1.5.5",
    "duckdb-extension-tpch==1.5.5",
];

/// Where the packages go: `$XDG_CACHE_HOME/gyre/python-duckdb-1.5.5` (or `~/.cache`).
fn package_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("gyre").join("python-duckdb-1.5.5")
}

/// A `python3` command that imports the pinned packages, installing them first when
/// they are missing.
fn python() -> Result<Command, BoxError> {
    let dir = package_dir();
    let command = || {
        let mut c = Command::new("python3");
        c.env("PYTHONPATH", &dir);
        c
    };
    let has = command()
        .args([
            "-c",
            "import duckdb, duckdb_extension_tpcds, duckdb_extension_tpch",
        ])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("python3 is needed for DuckDB: {e}"))?;
    if !has.success() {
        eprintln!(
            "installing {} into {} ...",
            PACKAGES.join(" "),
            dir.display()
        );
        let ok = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                // A directory left half-installed is replaced rather than kept.
                "--upgrade",
            ])
            .arg("--target")
            .arg(&dir)
            .args(PACKAGES)
            .status()?;
        if !ok.success() {
            return Err(format!("cannot install {} with pip", PACKAGES.join(" ")).into());
        }
    }
    Ok(command())
}

/// A Python program that answers requests, one line each way.
pub struct PythonProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl PythonProcess {
    /// Runs `script` with `args`; its stderr is this process's.
    pub fn start(script: &str, args: &[String]) -> Result<Self, BoxError> {
        let mut child = python()?
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// The next line the program prints, without its newline; an error when it ended.
    pub fn read_line(&mut self) -> Result<String, BoxError> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            let status = self.child.wait()?;
            return Err(format!("the Python helper ended ({status})").into());
        }
        Ok(line.trim_end().to_string())
    }

    /// Sends `request` as one line and returns the answer line.
    pub fn request(&mut self, request: &str) -> Result<String, BoxError> {
        writeln!(self.stdin, "{request}")?;
        self.stdin.flush()?;
        self.read_line()
    }
}

impl Drop for PythonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
