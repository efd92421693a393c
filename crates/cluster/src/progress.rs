//! How far a running statement got: rows and bytes read, files done, time elapsed.
//!
//! On a worker, every query has [`ReadCounters`] in its task context; the scans add what
//! they read (table partitions in memory, file splits). The coordinator keeps a
//! [`StatementProgress`] for a statement whose caller asked for one (the task-local
//! [`STATEMENT`] is set around the statement), records the queries the statement starts
//! and, when asked, polls their workers and adds the figures up.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

tokio::task_local! {
    /// The progress record of the statement being run, when its caller keeps one.
    pub static STATEMENT: std::sync::Arc<StatementProgress>;
}

/// What the scans of one query read on one worker.
#[derive(Debug, Default)]
pub struct ReadCounters {
    rows: AtomicU64,
    bytes: AtomicU64,
    /// Files done, in parts: a split of `b` bytes of an `s`-byte file adds `b / s`.
    files: Mutex<f64>,
}

impl ReadCounters {
    pub fn add_rows(&self, rows: usize) {
        self.rows.fetch_add(rows as u64, Ordering::Relaxed);
    }

    pub fn add_bytes(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A split of `split_bytes` of a file of `file_bytes` bytes was read to its end.
    pub fn split_done(&self, split_bytes: u64, file_bytes: u64) {
        self.add_bytes(split_bytes);
        let part = if file_bytes == 0 {
            1.0
        } else {
            split_bytes as f64 / file_bytes as f64
        };
        *self.files.lock() += part;
    }

    pub fn snapshot(&self) -> ReadFigures {
        ReadFigures {
            rows: self.rows.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            files: *self.files.lock(),
        }
    }
}

/// A worker's [`ReadCounters`] of one query, as reported to the coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadFigures {
    pub rows: u64,
    pub bytes: u64,
    pub files: f64,
}

impl std::ops::AddAssign for ReadFigures {
    fn add_assign(&mut self, o: Self) {
        self.rows += o.rows;
        self.bytes += o.bytes;
        self.files += o.files;
    }
}

/// What a query will read, known when it is planned.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadTotals {
    /// Files its file scans read (0: it reads none).
    pub files: u64,
    /// Bytes of those files.
    pub file_bytes: u64,
}

#[derive(Debug)]
pub(crate) struct TrackedQuery {
    pub id: u64,
    pub workers: Vec<gyre_transport::NodeId>,
    pub totals: ReadTotals,
    /// The last figures its workers reported, per worker.
    pub last: Vec<ReadFigures>,
}

/// The progress of one statement: the queries it started and what they read.
#[derive(Debug)]
pub struct StatementProgress {
    started: Instant,
    pub(crate) queries: Mutex<Vec<TrackedQuery>>,
}

impl Default for StatementProgress {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            queries: Mutex::new(vec![]),
        }
    }
}

impl StatementProgress {
    pub(crate) fn add_query(
        &self,
        id: u64,
        workers: &[gyre_transport::NodeId],
        totals: ReadTotals,
    ) {
        self.queries.lock().push(TrackedQuery {
            id,
            workers: workers.to_vec(),
            totals,
            last: vec![ReadFigures::default(); workers.len()],
        });
    }

    /// The figures last collected (see `Coordinator::poll_progress`).
    pub fn report(&self) -> ProgressReport {
        let queries = self.queries.lock();
        let mut read = ReadFigures::default();
        let mut totals = ReadTotals::default();
        for q in queries.iter() {
            for f in &q.last {
                read += *f;
            }
            totals.files += q.totals.files;
            totals.file_bytes += q.totals.file_bytes;
        }
        ProgressReport {
            rows: read.rows,
            bytes: read.bytes,
            files_done: (read.files + 1e-6).floor() as u64,
            files_total: totals.files,
            file_bytes_total: totals.file_bytes,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
        }
    }
}

/// A statement's progress as a client shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressReport {
    pub rows: u64,
    pub bytes: u64,
    pub files_done: u64,
    pub files_total: u64,
    pub file_bytes_total: u64,
    pub elapsed_ms: u64,
}

impl ProgressReport {
    pub fn elapsed(&self) -> Duration {
        Duration::from_millis(self.elapsed_ms)
    }

    /// One line: `12.3 M rows, 456 MB of 1.2 GB, 12/20 files, 3.4 s`.
    pub fn line(&self) -> String {
        let mut parts = vec![format!("{} rows", human_count(self.rows))];
        if self.file_bytes_total > 0 {
            parts.push(format!(
                "{} of {}",
                human_bytes(self.bytes),
                human_bytes(self.file_bytes_total)
            ));
        } else {
            parts.push(human_bytes(self.bytes));
        }
        if self.files_total > 0 {
            parts.push(format!("{}/{} files", self.files_done, self.files_total));
        }
        parts.push(format!("{:.1} s", self.elapsed().as_secs_f64()));
        parts.join(", ")
    }
}

fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1} K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} M", n as f64 / 1e6),
        _ => format!("{:.2} G", n as f64 / 1e9),
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        0..1_000 => format!("{n} B"),
        1_000..1_000_000 => format!("{:.1} KB", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", n as f64 / 1e6),
        _ => format!("{:.2} GB", n as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_files_add_up_to_whole_files() {
        let c = ReadCounters::default();
        for _ in 0..3 {
            c.split_done(1, 3);
        }
        c.split_done(0, 0);
        c.add_rows(5);
        let p = StatementProgress::default();
        p.add_query(
            1,
            &[1],
            ReadTotals {
                files: 4,
                file_bytes: 3,
            },
        );
        p.queries.lock()[0].last[0] = c.snapshot();
        let r = p.report();
        assert_eq!((r.rows, r.bytes, r.files_done, r.files_total), (5, 3, 2, 4));
        assert!(
            r.line().starts_with("5 rows, 3 B of 3 B, 2/4 files, "),
            "{}",
            r.line()
        );
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_count(12_345_678), "12.3 M");
        assert_eq!(human_bytes(1_500_000_000), "1.50 GB");
        assert_eq!(human_bytes(999), "999 B");
    }
}
