//! The worker as a secondary: it follows the primary's log ([`crate::log_feed`]),
//! replays it into versioned Arrow tables ([`gyre_replica::Secondary`]), and serves
//! scans of the transactional tables from the global snapshots the primary marks.
//!
//! It starts from the state the coordinator sends, then applies each log group in
//! order, as its stream brings them or, with a multicast group, as the group does
//! (joined before it subscribes; messages are checked against the cluster secret).
//! When the feed breaks (the coordinator restarted, the worker fell behind, a
//! multicast packet left the publisher's window, an entry failed to replay) it
//! subscribes again and starts over from the new state. The old replica's snapshots
//! stay readable for [`RETIRED_FOR`], so that queries planned before go on.
//!
//! Of partitioned tables it keeps only the rows of its [`KeyShare`], which the
//! coordinator names with the state: its place among the live workers. When that
//! place changes (a worker joined or left), the coordinator ends the feed and the
//! worker starts over with its new share. A worker that only gives blocks of
//! fragmented tables away (another joined) narrows its replica in place instead.

use crate::log_feed::{FeedMessage, LogKey};
use crate::protocol::{ControlClient, Request};
use crate::snapshot_scan::{KeyShare, Need};
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use gyre_replica::ship::{Group, Receiver, ReceiverConfig};
use gyre_replica::versioned::TableSnapshot;
use gyre_replica::{Procedures, Secondary};
use gyre_transport::NodeId;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Snapshots a worker keeps: queries choose theirs when they are planned, and the
/// primary marks one per second and one per query that reads changed tables.
pub const KEEP_SNAPSHOTS: usize = 64;

/// How long a scan waits for its snapshot to be replayed.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(30);

/// How long the snapshots of a replica that started over stay readable: queries
/// planned before it did still read them.
pub const RETIRED_FOR: Duration = Duration::from_secs(60);

/// How long the worker waits before it subscribes again after the feed broke.
const RESUBSCRIBE: Duration = Duration::from_millis(500);

/// How many recent log groups and scans the lag and wait figures describe.
const WINDOW: usize = 4096;

/// What a worker's replica did, as `gyre_workers()` shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondaryFigures {
    /// The last LSN replayed.
    pub lsn: u64,
    /// The rows it holds: every row of fully replicated tables, its share of
    /// partitioned ones.
    pub rows: u64,
    /// Bytes of the primary's state received since the worker started (each start
    /// brings the worker's share of the split tables and every fully replicated row).
    #[serde(default)]
    pub state_bytes: u64,
    /// Log entries replayed since the worker started, and the time that took.
    pub entries: u64,
    pub replay_seconds: f64,
    /// Of the last log groups, the 99th percentile of the time from shipping on the
    /// primary (once durable) to replayed here.
    pub lag_ms_p99: Option<f64>,
    /// Of the last scans, the median time a scan waited for its snapshot to be
    /// replayed here.
    pub snapshot_wait_ms_p50: Option<f64>,
}

/// Recent lags and waits, and the replay totals.
#[derive(Debug, Default)]
struct Figures {
    entries: u64,
    state_bytes: u64,
    replay: Duration,
    lags_ms: std::collections::VecDeque<f64>,
    waits_ms: std::collections::VecDeque<f64>,
}

fn push_window(window: &mut std::collections::VecDeque<f64>, value: f64) {
    if window.len() == WINDOW {
        window.pop_front();
    }
    window.push_back(value);
}

/// The `q` quantile (nearest rank) of `values`, if any.
fn quantile(values: &std::collections::VecDeque<f64>, q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[((last as f64) * q).round() as usize])
}

/// The snapshots of a replica the worker replaced, still readable for a while.
struct Retired {
    share: Option<KeyShare>,
    snapshots: std::collections::BTreeMap<u64, gyre_replica::versioned::Snapshot>,
    until: std::time::Instant,
}

/// The replica, and the share of the partitioned tables it holds (`None`: every row).
struct Replica {
    secondary: Secondary,
    share: Option<KeyShare>,
}

/// A worker's replica of the transactional tables.
pub struct WorkerSecondary {
    procedures: Procedures,
    replica: Arc<Mutex<Option<Replica>>>,
    /// The snapshots of the replica before this one, with its share.
    retired: Mutex<Option<Retired>>,
    /// States started from so far.
    states: std::sync::atomic::AtomicU64,
    /// The last LSN replayed.
    applied: tokio::sync::watch::Sender<u64>,
    /// Why the feed is down, while it is.
    trouble: Mutex<Option<String>>,
    figures: Mutex<Figures>,
}

impl std::fmt::Debug for WorkerSecondary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerSecondary")
            .field("applied", &*self.applied.borrow())
            .finish()
    }
}

impl WorkerSecondary {
    /// A secondary that replays with `procedures` (those of the primary's logical log).
    pub fn new(procedures: Procedures) -> Arc<Self> {
        Arc::new(Self {
            procedures,
            replica: Arc::default(),
            retired: Mutex::new(None),
            states: Default::default(),
            applied: tokio::sync::watch::Sender::new(0),
            trouble: Mutex::new(None),
            figures: Mutex::default(),
        })
    }

    /// What the replica did so far.
    pub fn figures(&self) -> SecondaryFigures {
        let rows = self
            .replica
            .lock()
            .as_ref()
            .map_or(0, |r| r.secondary.live_rows());
        let f = self.figures.lock();
        SecondaryFigures {
            lsn: self.lsn(),
            rows,
            state_bytes: f.state_bytes,
            entries: f.entries,
            replay_seconds: f.replay.as_secs_f64(),
            lag_ms_p99: quantile(&f.lags_ms, 0.99),
            snapshot_wait_ms_p50: quantile(&f.waits_ms, 0.5),
        }
    }

    /// The last LSN replayed (0 before the first state arrived).
    pub fn lsn(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Follows the coordinator's log as worker `node` until `stopped` turns true, by
    /// `multicast` (messages sealed with `key`) if given.
    pub fn follow(
        self: &Arc<Self>,
        coordinator: ControlClient,
        node: NodeId,
        multicast: Option<(Group, LogKey)>,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let states = me.states.load(Ordering::Relaxed);
                let outcome = tokio::select! {
                    outcome = me.follow_once(&coordinator, node, multicast.as_ref()) => outcome,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                let why = match outcome {
                    // Its place among the workers changed: the new share, at once.
                    Ok(true) => continue,
                    Ok(false) => "the coordinator ended the log feed".to_string(),
                    Err(e) => e.to_string(),
                };
                // One break is routine (a coordinator that stops or restarts); a feed
                // that keeps breaking is not.
                failures = if me.states.load(Ordering::Relaxed) > states {
                    1
                } else {
                    failures + 1
                };
                if failures >= 3 {
                    tracing::warn!(node, "log feed: {why}; subscribing again");
                } else {
                    tracing::info!(node, "log feed: {why}; subscribing again");
                }
                *me.trouble.lock() = Some(why);
                tokio::select! {
                    _ = tokio::time::sleep(RESUBSCRIBE) => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
            }
        });
    }

    /// One subscription: the state, then log groups until the feed ends; true if it
    /// ended because the worker's share changed.
    async fn follow_once(
        &self,
        coordinator: &ControlClient,
        node: NodeId,
        multicast: Option<&(Group, LogKey)>,
    ) -> Result<bool> {
        // Joined first: what is multicast from now on waits in its queue.
        let mut joined = match multicast {
            Some((group, _)) => Some(MulticastLog::join(*group)?),
            None => None,
        };
        let mut feed = coordinator
            .subscribe(&Request::SubscribeLog {
                node,
                multicast: joined.is_some(),
            })
            .await?;
        let mut state = Vec::new();
        let mut group = Vec::new();
        let mut started = false;
        loop {
            tokio::select! {
                message = feed.next() => {
                    let Some(message) = message else { return Ok(false) };
                    match FeedMessage::decode(&message?)? {
                        FeedMessage::State { lsn, piece, done, share } => {
                            if !group.is_empty() {
                                return Err(DataFusionError::Execution(
                                    "the log feed sent a state in the middle of a log group"
                                        .into(),
                                ));
                            }
                            state.extend_from_slice(&piece);
                            if done {
                                self.start(node, lsn, std::mem::take(&mut state), share).await?;
                                started = true;
                            }
                        }
                        FeedMessage::LogPiece { piece } => {
                            if group.len() + piece.len() > crate::log_feed::MAX_SHIPMENT_BYTES {
                                return Err(DataFusionError::Execution(format!(
                                    "a log group larger than {} bytes",
                                    crate::log_feed::MAX_SHIPMENT_BYTES
                                )));
                            }
                            group.extend_from_slice(&piece);
                        }
                        FeedMessage::Log { last, mut frames, shipped_us } => {
                            if !group.is_empty() {
                                group.append(&mut frames);
                                frames = std::mem::take(&mut group);
                            }
                            self.apply_log(last, frames, shipped_us).await?;
                        }
                        FeedMessage::Narrowed { share } => {
                            if !started {
                                return Err(DataFusionError::Execution(
                                    "the log feed narrowed a share before its state".into(),
                                ));
                            }
                            self.narrow(node, share).await?;
                        }
                        FeedMessage::Moved { share } => {
                            tracing::info!(node, ?share, "the workers changed: taking the new share");
                            return Ok(true);
                        }
                    }
                }
                message = async { joined.as_mut().expect("guarded").next().await }, if started && joined.is_some() => {
                    let (_, key) = multicast.expect("joined a group");
                    let message = message?;
                    let (last, shipped_us, frames) = key.open(&message)?;
                    self.apply_log(last, frames.to_vec(), shipped_us).await?;
                }
            }
        }
    }

    /// Starts over from the primary's state at `lsn`, keeping `share` of its
    /// partitioned tables.
    async fn start(
        &self,
        node: NodeId,
        lsn: u64,
        bytes: Vec<u8>,
        share: Option<KeyShare>,
    ) -> Result<()> {
        let procedures = self.procedures.clone();
        self.figures.lock().state_bytes += bytes.len() as u64;
        let kept = share.clone();
        let secondary = blocking(move || {
            let store = gyre_replica::checkpoint::from_bytes(bytes.into())?;
            if store.lsn != lsn {
                return Err(gyre_replica::Error::Constraint(format!(
                    "the state is at LSN {}, announced at {lsn}",
                    store.lsn
                )));
            }
            match kept {
                Some(share) => Secondary::from_state_shared(store, procedures, Arc::new(share)),
                None => Secondary::from_state(store, procedures),
            }
        })
        .await?;
        self.install(secondary, share.clone());
        self.states.fetch_add(1, Ordering::Relaxed);
        *self.trouble.lock() = None;
        // Not the larger of the two: a primary that restarted without its data
        // directory counts from 0 again.
        self.applied.send_replace(lsn);
        tracing::info!(
            node,
            lsn,
            ?share,
            "secondary started from the primary's state"
        );
        Ok(())
    }

    /// Makes `secondary`, which holds `share`, the replica; the one it replaces stays
    /// readable for [`RETIRED_FOR`].
    fn install(&self, mut secondary: Secondary, share: Option<KeyShare>) {
        secondary.keep_snapshots(KEEP_SNAPSHOTS);
        let old = self.replica.lock().replace(Replica { secondary, share });
        if let Some(old) = old {
            let snapshots = old
                .secondary
                .snapshot_lsns()
                .into_iter()
                .filter_map(|l| Some((l, old.secondary.snapshot_at(l)?.clone())))
                .collect();
            *self.retired.lock() = Some(Retired {
                share: old.share,
                snapshots,
                until: std::time::Instant::now() + RETIRED_FOR,
            });
        }
    }

    /// Keeps only `share` (less than the replica holds: rendezvous hashing gave
    /// blocks to a worker that joined) by building the replica again from its own
    /// rows, at the LSN it reached: the memory of the blocks given away is freed and
    /// nothing crosses the network.
    async fn narrow(&self, node: NodeId, share: KeyShare) -> Result<()> {
        let Some(rows) = self
            .replica
            .lock()
            .as_mut()
            .map(|r| r.secondary.rows().cloned())
            .transpose()
            .map_err(|e| DataFusionError::Execution(format!("narrowing a replica: {e}")))?
        else {
            return Err(DataFusionError::Execution(
                "the log feed narrowed a replica before its state".into(),
            ));
        };
        let (procedures, kept) = (self.procedures.clone(), share.clone());
        let lsn = rows.lsn;
        let secondary =
            blocking(move || Secondary::from_state_shared(rows, procedures, Arc::new(kept)))
                .await?;
        self.install(secondary, Some(share.clone()));
        tracing::info!(node, lsn, ?share, "secondary narrowed to its new share");
        Ok(())
    }

    /// Replays log groups that end at LSN `last`, shipped at `shipped_us`.
    async fn apply_log(&self, last: u64, frames: Vec<u8>, shipped_us: u64) -> Result<()> {
        if last <= self.lsn() {
            // Shipped before the state was taken: the state holds it.
            return Ok(());
        }
        let replica = Arc::clone(&self.replica);
        let (lsn, entries, spent) = blocking(move || {
            let mut guard = replica.lock();
            let s = guard
                .as_mut()
                .map(|r| &mut r.secondary)
                .ok_or_else(|| gyre_replica::Error::Constraint("log before the state".into()))?;
            let before = s.replay_stats().1;
            let entries = s.apply_frames(&frames)?;
            Ok((s.lsn(), entries, s.replay_stats().1 - before))
        })
        .await?;
        if lsn != last {
            return Err(DataFusionError::Execution(format!(
                "log groups announced up to LSN {last} ended at {lsn}"
            )));
        }
        let mut f = self.figures.lock();
        f.entries += entries;
        f.replay += spent;
        let lag = crate::log_feed::unix_micros().saturating_sub(shipped_us);
        push_window(&mut f.lags_ms, lag as f64 / 1e3);
        drop(f);
        let mut retired = self.retired.lock();
        if retired
            .as_ref()
            .is_some_and(|r| r.until <= std::time::Instant::now())
        {
            *retired = None;
        }
        drop(retired);
        self.applied.send_modify(|a| *a = (*a).max(lsn));
        Ok(())
    }

    /// `table` as of the global snapshot at `lsn`, once this worker has replayed it,
    /// holding at least what the scan `need`s; and whether it holds more than a
    /// partitioned table's share (every row), so that the scan has to pick its share
    /// out.
    ///
    /// The snapshot comes from the replica, or from the one before it if the worker
    /// started over since the query was planned (within [`RETIRED_FOR`]). A replica
    /// that holds another share of the partitioned tables (the workers changed) is
    /// waited on until it has its new share.
    pub async fn read(&self, table: &str, lsn: u64, need: &Need) -> Result<(TableSnapshot, bool)> {
        let started = std::time::Instant::now();
        let result = self.find(table, lsn, need).await;
        push_window(
            &mut self.figures.lock().waits_ms,
            started.elapsed().as_secs_f64() * 1e3,
        );
        result
    }

    async fn find(&self, table: &str, lsn: u64, need: &Need) -> Result<(TableSnapshot, bool)> {
        let covers = |held: Option<&KeyShare>| need.covered_by(held);
        let found = |snapshot: &gyre_replica::versioned::Snapshot, held: Option<&KeyShare>| {
            let t = snapshot.tables.get(table).cloned().ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "table '{table}' does not exist in the snapshot at LSN {lsn}"
                ))
            })?;
            let more = match (need, held) {
                (Need::Share { .. }, None) => true,
                (Need::Share { index, count }, Some(h)) => (h.index, h.count) != (*index, *count),
                _ => false,
            };
            Ok((t, more))
        };
        let mut applied = self.applied.subscribe();
        let deadline = tokio::time::Instant::now() + SNAPSHOT_WAIT;
        loop {
            let late = tokio::time::timeout_at(deadline, applied.wait_for(|&a| a >= lsn))
                .await
                .is_err();
            if late {
                let trouble = self.trouble.lock().clone();
                return Err(DataFusionError::Execution(format!(
                    "this worker has replayed the log up to LSN {}, and the query's snapshot at \
                     LSN {lsn} did not arrive within {} s{}",
                    self.lsn(),
                    SNAPSHOT_WAIT.as_secs(),
                    trouble
                        .map(|t| format!(" (log feed: {t})"))
                        .unwrap_or_default()
                )));
            }
            let held = {
                let guard = self.replica.lock();
                let Some(Replica {
                    secondary,
                    share: held,
                }) = guard.as_ref()
                else {
                    return Err(DataFusionError::Execution(
                        "this worker has no replica of the transactional tables".into(),
                    ));
                };
                let held = held.clone();
                if covers(held.as_ref())
                    && let Some(snapshot) = secondary.snapshot_at(lsn)
                {
                    return found(snapshot, held.as_ref());
                }
                if let Some(retired) = self.retired.lock().as_ref()
                    && retired.until > std::time::Instant::now()
                    && covers(retired.share.as_ref())
                    && let Some(snapshot) = retired.snapshots.get(&lsn)
                {
                    return found(snapshot, retired.share.as_ref());
                }
                if covers(held.as_ref()) {
                    let why = secondary
                        .missing_snapshot(lsn)
                        .unwrap_or_else(|| format!("no snapshot at LSN {lsn}"));
                    return Err(DataFusionError::Execution(format!(
                        "reading '{table}' on this worker: {why}"
                    )));
                }
                held
            };
            // The replica holds another share: its next state brings the new one.
            if tokio::time::timeout_at(deadline, applied.changed())
                .await
                .is_err()
            {
                return Err(DataFusionError::Execution(format!(
                    "reading '{table}' on this worker: it holds {} of the partitioned tables, \
                     the query reads {need} (the workers changed; a retry reads the new shares)",
                    held.map_or("every row".to_string(), |s| s.to_string()),
                )));
            }
        }
    }
}

/// The log's multicast group, joined: a thread receives its messages (the receiver
/// blocks) and queues them until the secondary takes them.
struct MulticastLog {
    messages: tokio::sync::mpsc::UnboundedReceiver<Result<Vec<u8>>>,
    stop: Arc<AtomicBool>,
}

impl MulticastLog {
    fn join(group: Group) -> Result<Self> {
        let config = ReceiverConfig {
            // From the first message that begins after joining: the state holds
            // what came before.
            from_seq: None,
            ..ReceiverConfig::new(group)
        };
        let mut receiver = Receiver::join(config).map_err(|e| {
            DataFusionError::Execution(format!(
                "cannot join the log's multicast group {} on {}: {e}",
                group.group, group.interface
            ))
        })?;
        let (tx, messages) = tokio::sync::mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("gyre-log-multicast".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    match receiver.recv(Duration::from_millis(100)) {
                        Ok(Some(m)) => {
                            if tx.send(Ok(m)).is_err() {
                                return;
                            }
                        }
                        Ok(None) => {}
                        Err(e) => {
                            let _ = tx.send(Err(DataFusionError::Execution(format!(
                                "log multicast: {e}"
                            ))));
                            return;
                        }
                    }
                }
            })
            .map_err(|e| DataFusionError::Execution(format!("log multicast thread: {e}")))?;
        Ok(Self { messages, stop })
    }

    async fn next(&mut self) -> Result<Vec<u8>> {
        self.messages.recv().await.unwrap_or_else(|| {
            Err(DataFusionError::Execution(
                "the log multicast receiver stopped".into(),
            ))
        })
    }
}

impl Drop for MulticastLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Runs replica work (decoding, replaying) off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> gyre_replica::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| DataFusionError::Execution(format!("replaying the log: {e}")))?
        .map_err(|e| DataFusionError::Execution(format!("replaying the log: {e}")))
}
