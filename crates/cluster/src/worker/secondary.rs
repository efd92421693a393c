//! The worker as a secondary: it follows the primary's log ([`crate::log_feed`]),
//! replays it into versioned Arrow tables ([`gyre_replica::Secondary`]), and serves
//! scans of the transactional tables from the global snapshots the primary marks.
//!
//! It starts from the state the coordinator sends, then applies each log group in
//! order. When the feed breaks (the coordinator restarted, the worker fell behind, an
//! entry failed to replay) it subscribes again and starts over from the new state;
//! the snapshots it had go, except those running queries hold.

use crate::log_feed::FeedMessage;
use crate::protocol::{ControlClient, Request};
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use gyre_replica::versioned::TableSnapshot;
use gyre_replica::{Procedures, Secondary};
use gyre_transport::NodeId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Snapshots a worker keeps: queries choose theirs when they are planned, and the
/// primary marks one per second and one per query that reads changed tables.
pub const KEEP_SNAPSHOTS: usize = 64;

/// How long a scan waits for its snapshot to be replayed.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(30);

/// How long the worker waits before it subscribes again after the feed broke.
const RESUBSCRIBE: Duration = Duration::from_millis(500);

/// A worker's replica of the transactional tables.
pub struct WorkerSecondary {
    procedures: Procedures,
    secondary: Arc<Mutex<Option<Secondary>>>,
    /// The last LSN replayed.
    applied: tokio::sync::watch::Sender<u64>,
    /// Why the feed is down, while it is.
    trouble: Mutex<Option<String>>,
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
            secondary: Arc::default(),
            applied: tokio::sync::watch::Sender::new(0),
            trouble: Mutex::new(None),
        })
    }

    /// The last LSN replayed (0 before the first state arrived).
    pub fn lsn(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Follows the coordinator's log as worker `node` until `stopped` turns true.
    pub fn follow(
        self: &Arc<Self>,
        coordinator: ControlClient,
        node: NodeId,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let outcome = tokio::select! {
                    outcome = me.follow_once(&coordinator, node) => outcome,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                let why = match outcome {
                    Ok(()) => "the coordinator ended the log feed".to_string(),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(node, "log feed: {why}; subscribing again");
                *me.trouble.lock() = Some(why);
                tokio::select! {
                    _ = tokio::time::sleep(RESUBSCRIBE) => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
            }
        });
    }

    /// One subscription: the state, then log groups until the feed ends.
    async fn follow_once(&self, coordinator: &ControlClient, node: NodeId) -> Result<()> {
        let mut feed = coordinator
            .subscribe(&Request::SubscribeLog { node })
            .await?;
        let mut state = Vec::new();
        while let Some(message) = feed.next().await {
            match FeedMessage::decode(&message?)? {
                FeedMessage::State { lsn, piece, done } => {
                    state.extend_from_slice(&piece);
                    if done {
                        let bytes = std::mem::take(&mut state);
                        let procedures = self.procedures.clone();
                        let mut secondary = blocking(move || {
                            let store = gyre_replica::checkpoint::from_bytes(bytes.into())?;
                            if store.lsn != lsn {
                                return Err(gyre_replica::Error::Constraint(format!(
                                    "the state is at LSN {}, announced at {lsn}",
                                    store.lsn
                                )));
                            }
                            Secondary::from_state(store, procedures)
                        })
                        .await?;
                        secondary.keep_snapshots(KEEP_SNAPSHOTS);
                        *self.secondary.lock() = Some(secondary);
                        *self.trouble.lock() = None;
                        self.applied.send_modify(|a| *a = (*a).max(lsn));
                        tracing::info!(node, lsn, "secondary started from the primary's state");
                    }
                }
                FeedMessage::Log { last, frames } => {
                    let secondary = Arc::clone(&self.secondary);
                    let lsn = blocking(move || {
                        let mut guard = secondary.lock();
                        let s = guard.as_mut().ok_or_else(|| {
                            gyre_replica::Error::Constraint("log before the state".into())
                        })?;
                        s.apply_frames(&frames)?;
                        Ok(s.lsn())
                    })
                    .await?;
                    if lsn != last {
                        return Err(DataFusionError::Execution(format!(
                            "log groups announced up to LSN {last} ended at {lsn}"
                        )));
                    }
                    self.applied.send_modify(|a| *a = (*a).max(lsn));
                }
            }
        }
        Ok(())
    }

    /// `table` as of the global snapshot at `lsn`, once this worker has replayed it.
    pub async fn read(&self, table: &str, lsn: u64) -> Result<TableSnapshot> {
        let mut applied = self.applied.subscribe();
        let waited = tokio::time::timeout(SNAPSHOT_WAIT, applied.wait_for(|&a| a >= lsn)).await;
        if waited.is_err() {
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
        let guard = self.secondary.lock();
        let Some(secondary) = guard.as_ref() else {
            return Err(DataFusionError::Execution(
                "this worker has no replica of the transactional tables".into(),
            ));
        };
        let Some(snapshot) = secondary.snapshot_at(lsn) else {
            let why = secondary
                .missing_snapshot(lsn)
                .unwrap_or_else(|| format!("no snapshot at LSN {lsn}"));
            return Err(DataFusionError::Execution(format!(
                "reading '{table}' on this worker: {why}"
            )));
        };
        snapshot.tables.get(table).cloned().ok_or_else(|| {
            DataFusionError::Execution(format!(
                "table '{table}' does not exist in the snapshot at LSN {lsn}"
            ))
        })
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
