//! Group commit: one thread writes the log, a group of entries per write and fsync.
//!
//! Committing transactions append their entries to a queue in LSN order and wait until
//! the durable LSN reaches theirs. The committer thread takes everything queued,
//! compresses it as one group (LZ4: single entries are too small to compress, groups
//! are not), writes it, fsyncs, and then announces the new durable LSN. While one group
//! is being synced the next one fills, so under load many transactions share an fsync.
//! Without group commit the primary waits for each transaction's own fsync before
//! running the next, which makes every group one transaction.
//!
//! A failed write or fsync stops the log for good: whether that group reached the disk
//! is unknown, so no later transaction may be acknowledged on top of it.
//!
//! A log without a directory ([`LogWriter::in_memory`]) writes nothing: an entry counts
//! as durable once it is queued (unless a replicator must confirm it), so a committing
//! transaction neither wakes nor waits for the committer, which frames and ships the
//! groups behind it (at once when there is a shipper; else in batches).

use super::Entry;
use super::segment::{self, HEADER, MAX_GROUP_BYTES};
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

/// How much the log has written since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Groups written (and shipped).
    pub groups: u64,
    /// Entries appended (durable or, in a log on disk, about to be).
    pub entries: u64,
    /// Appended entry bytes before compression.
    pub raw_bytes: u64,
    /// Bytes written to segments (frames, compressed).
    pub written_bytes: u64,
}

struct Group {
    first_lsn: u64,
    count: u32,
    raw: Vec<u8>,
}

#[derive(Default)]
struct Queue {
    groups: Vec<Group>,
    /// The bytes of `groups`.
    bytes: usize,
    next_lsn: u64,
    roll: bool,
    closing: bool,
}

struct Durability {
    lsn: u64,
    failed: Option<String>,
    /// Callers parked until an LSN is durable. Each is woken alone when its LSN is:
    /// waking every waiter for every group (a shared condition variable) cost a
    /// context switch per waiter per group.
    waiters: Vec<(u64, std::thread::Thread)>,
}

impl Durability {
    /// Moves the durable LSN on to `lsn` (never back) and wakes whoever waits for it.
    fn advance(&mut self, lsn: u64) {
        self.lsn = self.lsn.max(lsn);
        let durable = self.lsn;
        self.waiters.retain(|(wanted, caller)| {
            let done = *wanted <= durable;
            if done {
                caller.unpark();
            }
            !done
        });
    }

    /// Stops the log and wakes every waiter to hear of it.
    fn fail(&mut self, reason: String) {
        self.failed = Some(reason);
        for (_, caller) in self.waiters.drain(..) {
            caller.unpark();
        }
    }
}

/// Where durable log bytes go besides the disk (the multicast to secondaries): called
/// with the LSN of the last entry the frames hold, and the frames. It runs on the log's
/// thread: it should hand the bytes on, not wait.
pub type Shipper = Box<dyn Fn(u64, &[u8]) + Send + Sync>;

/// Where a write must also be before it counts as durable: a majority of the
/// coordinators that vote on the primary (failover by consensus). Called on the log's
/// thread with each write's frames, after the local fsync; it returns once they are
/// replicated. An error stops the log as a failed fsync does.
pub type Replicator = Box<dyn Fn(&[u8]) -> std::result::Result<(), String> + Send + Sync>;

/// Queued bytes at which a log in memory without a shipper wakes its committer.
const IN_MEMORY_BATCH: usize = 256 * 1024;

struct Shared {
    /// `None`: the log is kept nowhere (a database in memory).
    dir: Option<PathBuf>,
    replicator: Mutex<Option<Replicator>>,
    /// Whether `replicator` is set (read at every append).
    replicated: AtomicBool,
    /// Called with each write's frames once they are durable, in LSN order.
    shipper: Mutex<Option<Shipper>>,
    /// Whether `shipper` is set (read at every append).
    shipping: AtomicBool,
    segment_bytes: u64,
    queue: Mutex<Queue>,
    wake: Condvar,
    durable: Mutex<Durability>,
    groups: AtomicU64,
    entries: AtomicU64,
    raw_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

/// The open log: appends entries and tells when they are durable.
pub struct LogWriter {
    shared: Arc<Shared>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

/// The segment being appended to.
struct Segment {
    file: File,
    path: PathBuf,
    len: u64,
}

impl LogWriter {
    /// Opens the log in `dir` for appending entries from `next_lsn` on. `tail` is the
    /// last segment and the length of its valid part, as recovery found them: it is cut
    /// to that length and appended to; without one a new segment starts.
    pub fn open(
        dir: &Path,
        next_lsn: u64,
        tail: Option<(PathBuf, u64)>,
        segment_bytes: u64,
    ) -> Result<Self> {
        let segment = match tail {
            Some((path, valid_len)) if valid_len >= HEADER.len() as u64 => {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| Error::io(&path, "open", e))?;
                file.set_len(valid_len)
                    .map_err(|e| Error::io(&path, "cut the torn tail of", e))?;
                file.sync_all().map_err(|e| Error::io(&path, "fsync", e))?;
                let mut file = file;
                use std::io::Seek;
                file.seek(std::io::SeekFrom::End(0))
                    .map_err(|e| Error::io(&path, "seek in", e))?;
                Segment {
                    file,
                    path,
                    len: valid_len,
                }
            }
            Some((path, _)) => {
                // A segment whose header never made it: start it over.
                std::fs::remove_file(&path).map_err(|e| Error::io(&path, "remove", e))?;
                create_segment(dir, next_lsn)?
            }
            None => create_segment(dir, next_lsn)?,
        };
        Self::start(
            Some(dir.to_path_buf()),
            next_lsn,
            Some(segment),
            segment_bytes,
        )
    }

    /// A log that writes nothing, for a database kept in memory: its groups go only to
    /// the shipper.
    pub fn in_memory(next_lsn: u64) -> Result<Self> {
        Self::start(None, next_lsn, None, u64::MAX)
    }

    fn start(
        dir: Option<PathBuf>,
        next_lsn: u64,
        segment: Option<Segment>,
        segment_bytes: u64,
    ) -> Result<Self> {
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            replicator: Mutex::new(None),
            replicated: AtomicBool::new(false),
            shipper: Mutex::new(None),
            shipping: AtomicBool::new(false),
            segment_bytes,
            queue: Mutex::new(Queue {
                next_lsn,
                ..Queue::default()
            }),
            wake: Condvar::new(),
            durable: Mutex::new(Durability {
                lsn: next_lsn - 1,
                failed: None,
                waiters: Vec::new(),
            }),
            groups: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            raw_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        });
        let thread_shared = shared.clone();
        let committer = std::thread::Builder::new()
            .name("gyre-redo-log".into())
            .spawn(move || commit_loop(&thread_shared, segment))
            .map_err(|e| {
                let dir = dir.unwrap_or_else(|| PathBuf::from("(memory)"));
                Error::io(&dir, "start the log thread for", e)
            })?;
        Ok(Self {
            shared,
            committer: Mutex::new(Some(committer)),
        })
    }

    /// Hands every group written from now on, once durable, to `shipper` (ScyPer sends
    /// the log of committed transactions only, so a secondary never applies what a
    /// crash of the primary could take back).
    pub fn ship(&self, shipper: Shipper) {
        *self.shared.shipper.lock() = Some(shipper);
        self.shared.shipping.store(true, Ordering::Release);
    }

    /// Counts every write from now on as durable only once `replicator` returned.
    pub fn replicate(&self, replicator: Replicator) {
        // Set under the queue's lock, so no append in flight takes its entry for
        // durable without it.
        let q = self.shared.queue.lock();
        *self.shared.replicator.lock() = Some(replicator);
        self.shared.replicated.store(true, Ordering::Release);
        drop(q);
    }

    /// The LSN of the last entry appended, durable or not.
    pub fn appended_lsn(&self) -> u64 {
        self.shared.queue.lock().next_lsn - 1
    }

    /// Moves an idle log on to `lsn`, durable: the entries up to it were written by
    /// another primary and arrived replicated. Refused while entries are queued.
    pub fn advance_to(&self, lsn: u64) -> Result<()> {
        let mut q = self.shared.queue.lock();
        if !q.groups.is_empty() {
            return Err(Error::LogFailed(format!(
                "replicated entries up to {lsn} arrived while this log has its own queued"
            )));
        }
        q.next_lsn = q.next_lsn.max(lsn + 1);
        drop(q);
        self.shared.durable.lock().advance(lsn);
        Ok(())
    }

    /// Queues the entry of the transaction with LSN `lsn` (the next one, as the caller
    /// holds the primary's lock). It is durable once [`LogWriter::wait_durable`] says so.
    pub fn append(&self, lsn: u64, entry: &Entry) -> Result<()> {
        let mut raw = Vec::new();
        segment::encode_entry(&mut raw, entry);
        self.append_encoded(lsn, raw)
    }

    /// [`LogWriter::append`] of an entry already encoded by [`segment::encode_entry`]
    /// (so that its caller can give the entry's values away first).
    pub fn append_encoded(&self, lsn: u64, raw: Vec<u8>) -> Result<()> {
        if let Some(failed) = &self.shared.durable.lock().failed {
            return Err(Error::LogFailed(failed.clone()));
        }
        if raw.len() > MAX_GROUP_BYTES {
            return Err(Error::Unsupported(format!(
                "a transaction whose log entry has {} bytes (at most {MAX_GROUP_BYTES})",
                raw.len()
            )));
        }
        let mut q = self.shared.queue.lock();
        if lsn != q.next_lsn {
            return Err(Error::LogFailed(format!(
                "entry {lsn} appended where {} was next",
                q.next_lsn
            )));
        }
        q.next_lsn += 1;
        self.shared.entries.fetch_add(1, Ordering::Relaxed);
        self.shared
            .raw_bytes
            .fetch_add(raw.len() as u64, Ordering::Relaxed);
        q.bytes += raw.len();
        let queued = q.bytes;
        match q.groups.last_mut() {
            Some(g) if g.raw.len() + raw.len() <= MAX_GROUP_BYTES => {
                g.raw.extend_from_slice(&raw);
                g.count += 1;
            }
            _ => q.groups.push(Group {
                first_lsn: lsn,
                count: 1,
                raw,
            }),
        }
        let immediate =
            self.shared.dir.is_none() && !self.shared.replicated.load(Ordering::Acquire);
        if immediate {
            // Nothing to write: durable now, in LSN order as the queue's lock keeps it.
            self.shared.durable.lock().advance(lsn);
        }
        drop(q);
        if !immediate || self.shared.shipping.load(Ordering::Acquire) || queued >= IN_MEMORY_BATCH {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Blocks until every entry up to `lsn` is on disk, or the log failed.
    pub fn wait_durable(&self, lsn: u64) -> Result<()> {
        let mut d = self.shared.durable.lock();
        loop {
            if d.lsn >= lsn {
                return Ok(());
            }
            if let Some(failed) = &d.failed {
                return Err(Error::LogFailed(failed.clone()));
            }
            let me = std::thread::current();
            if !d.waiters.iter().any(|(_, t)| t.id() == me.id()) {
                d.waiters.push((lsn, me));
            }
            drop(d);
            // An unpark between the push and here makes this return at once; any
            // other return finds the LSN not yet durable and parks again.
            std::thread::park();
            d = self.shared.durable.lock();
        }
    }

    /// Unparks `caller` once `lsn` is durable (at once if it is, or the log failed).
    pub fn unpark_when_durable(&self, lsn: u64, caller: std::thread::Thread) {
        let mut d = self.shared.durable.lock();
        if d.lsn >= lsn || d.failed.is_some() {
            drop(d);
            caller.unpark();
        } else {
            d.waiters.push((lsn, caller));
        }
    }

    pub fn durable_lsn(&self) -> u64 {
        self.shared.durable.lock().lsn
    }

    /// Starts a new segment with the next group, so that a checkpoint can drop the
    /// segments before it.
    pub fn roll(&self) {
        self.shared.queue.lock().roll = true;
        self.shared.wake.notify_one();
    }

    pub fn stats(&self) -> LogStats {
        let s = &self.shared;
        LogStats {
            groups: s.groups.load(Ordering::Relaxed),
            entries: s.entries.load(Ordering::Relaxed),
            raw_bytes: s.raw_bytes.load(Ordering::Relaxed),
            written_bytes: s.written_bytes.load(Ordering::Relaxed),
        }
    }

    /// Where the segments are (`None` for a log in memory).
    pub fn dir(&self) -> Option<&Path> {
        self.shared.dir.as_deref()
    }
}

impl Drop for LogWriter {
    /// Writes what is queued, then stops the committer.
    fn drop(&mut self) {
        self.shared.queue.lock().closing = true;
        self.shared.wake.notify_one();
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
    }
}

fn create_segment(dir: &Path, first_lsn: u64) -> Result<Segment> {
    let path = dir.join(segment::file_name(first_lsn));
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(&path, "create", e))?;
    file.write_all(HEADER)
        .map_err(|e| Error::io(&path, "write", e))?;
    file.sync_all().map_err(|e| Error::io(&path, "fsync", e))?;
    sync_dir(dir)?;
    Ok(Segment {
        file,
        path,
        len: HEADER.len() as u64,
    })
}

/// Makes a directory's entries (files created, renamed, removed) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, "fsync the directory", e))
}

fn commit_loop(shared: &Shared, mut segment: Option<Segment>) {
    loop {
        let (groups, roll) = {
            let mut q = shared.queue.lock();
            while q.groups.is_empty() && !q.closing {
                shared.wake.wait(&mut q);
            }
            if q.groups.is_empty() {
                return;
            }
            q.bytes = 0;
            (std::mem::take(&mut q.groups), std::mem::take(&mut q.roll))
        };
        let written = write_groups(shared, &mut segment, &groups, roll).and_then(|frames| {
            if let Some(replicate) = &*shared.replicator.lock() {
                // A panic is a failure like any other: the log stops, and every
                // waiter hears of it (a dead log thread would leave them waiting).
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replicate(&frames)))
                    .unwrap_or_else(|_| Err("replicating the group panicked".into()))
                    .map_err(Error::LogFailed)?;
            }
            Ok(frames)
        });
        match written {
            Ok(frames) => {
                let last = groups.last().map(|g| g.first_lsn + u64::from(g.count) - 1);
                let last = last.unwrap_or_default();
                shared.durable.lock().advance(last);
                // Shipping is best effort (a secondary that misses groups catches up
                // from the durable log); a failing shipper must not stop the log.
                if let Some(ship) = &*shared.shipper.lock()
                    && std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        ship(last, &frames)
                    }))
                    .is_err()
                {
                    tracing::error!("redo log: shipping a group to the secondaries panicked");
                }
            }
            Err(e) => {
                tracing::error!("redo log: {e}");
                shared.durable.lock().fail(e.to_string());
                // Waiters learn of the failure; later appends are refused. Drain the
                // queue until closing so nothing waits on this thread.
                let mut q = shared.queue.lock();
                while !q.closing {
                    q.groups.clear();
                    q.bytes = 0;
                    shared.wake.wait(&mut q);
                }
                return;
            }
        }
    }
}

fn write_groups(
    shared: &Shared,
    segment: &mut Option<Segment>,
    groups: &[Group],
    roll: bool,
) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    for g in groups {
        bytes.extend_from_slice(&segment::encode_frame(g.first_lsn, g.count, &g.raw));
    }
    if let (Some(segment), Some(dir)) = (segment.as_mut(), &shared.dir) {
        if (roll || segment.len >= shared.segment_bytes) && segment.len > HEADER.len() as u64 {
            *segment = create_segment(dir, groups[0].first_lsn)?;
        }
        segment
            .file
            .write_all(&bytes)
            .map_err(|e| Error::io(&segment.path, "write", e))?;
        segment
            .file
            .sync_data()
            .map_err(|e| Error::io(&segment.path, "fsync", e))?;
        segment.len += bytes.len() as u64;
    }
    shared
        .groups
        .fetch_add(groups.len() as u64, Ordering::Relaxed);
    shared
        .written_bytes
        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(bytes)
}
