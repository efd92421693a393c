//! The primary's redo log as the workers receive it: each worker is a secondary that
//! replays the log of the transactional tables (ScyPer, Rödiger's thesis, chapter 5).
//!
//! A worker subscribes with a signed control call whose reply is a stream: first the
//! primary's state at some LSN ([`gyre_replica::checkpoint::to_bytes`], in pieces),
//! then every log group made durable after that LSN, in order. The coordinator keeps
//! no per-worker backlog beyond [`BACKLOG_GROUPS`] groups: a worker that falls further
//! behind is cut off and subscribes again from the then current state.
//!
//! The state cannot miss a group: a subscriber listens for groups before it reads the
//! state, and reads it only once every group shipped before it began listening is
//! visible in it.

use crate::primary_table::replica_err;
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use futures::stream::BoxStream;
use gyre_replica::Database;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Log groups a subscriber may lag behind before it is cut off.
pub const BACKLOG_GROUPS: usize = 4096;

/// Bytes of state per message.
const STATE_PIECE: usize = 4 << 20;

/// How long a subscription waits for the state to show what was already shipped.
const STATE_WAIT: Duration = Duration::from_secs(10);

/// One message of a subscription.
#[derive(Debug, Serialize, Deserialize)]
pub enum FeedMessage {
    /// A piece of the primary's state at LSN `lsn`; the last piece has `done`.
    State {
        lsn: u64,
        piece: Vec<u8>,
        done: bool,
    },
    /// Log groups (the log's frames) whose last entry has LSN `last`.
    Log { last: u64, frames: Vec<u8> },
}

impl FeedMessage {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("feed messages serialize")
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        postcard::from_bytes(bytes)
            .map_err(|e| DataFusionError::Execution(format!("malformed log feed message: {e}")))
    }
}

/// A group as shipped: the LSN of its last entry and its frames.
#[derive(Debug)]
struct Shipped {
    last: u64,
    frames: Vec<u8>,
}

/// The coordinator's end: takes every durable group from the primary's log and hands
/// it to the subscribed workers.
#[derive(Debug)]
pub struct LogFeed {
    db: Arc<Database>,
    groups: broadcast::Sender<Arc<Shipped>>,
    /// The last LSN shipped.
    shipped: Arc<AtomicU64>,
}

impl LogFeed {
    /// Ships `db`'s log from now on.
    pub fn attach(db: Arc<Database>) -> Result<Arc<Self>> {
        let (groups, _) = broadcast::channel(BACKLOG_GROUPS);
        let shipped = Arc::new(AtomicU64::new(db.lsn()));
        let (tx, last) = (groups.clone(), Arc::clone(&shipped));
        db.ship(Box::new(move |lsn, frames| {
            last.fetch_max(lsn, Ordering::SeqCst);
            // No subscriber is fine: workers that come later start from the state.
            let _ = tx.send(Arc::new(Shipped {
                last: lsn,
                frames: frames.to_vec(),
            }));
        }))
        .map_err(replica_err)?;
        Ok(Arc::new(Self {
            db,
            groups,
            shipped,
        }))
    }

    /// How many workers follow the log now.
    pub fn subscribers(&self) -> usize {
        self.groups.receiver_count()
    }

    /// A subscription of worker `node`: encoded [`FeedMessage`]s, the state first. It
    /// ends with an error when the worker falls too far behind, and stops when the
    /// worker goes away.
    pub fn subscribe(self: &Arc<Self>, node: u32) -> BoxStream<'static, Result<Vec<u8>>> {
        let groups = self.groups.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let result = me.feed(node, groups, &tx).await;
            if let Err(e) = result {
                tracing::warn!(node, "log feed: {e}");
                let _ = tx.send(Err(e)).await;
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
    }

    /// Sends the state, then the groups after it, until the subscriber is gone.
    async fn feed(
        &self,
        node: u32,
        mut groups: broadcast::Receiver<Arc<Shipped>>,
        tx: &tokio::sync::mpsc::Sender<Result<Vec<u8>>>,
    ) -> Result<()> {
        let store = self
            .state_after(self.shipped.load(Ordering::SeqCst))
            .await?;
        let lsn = store.lsn;
        let bytes = tokio::task::spawn_blocking(move || gyre_replica::checkpoint::to_bytes(&store))
            .await
            .map_err(|e| DataFusionError::Execution(format!("encoding the state: {e}")))?
            .map_err(replica_err)?;
        tracing::info!(
            node,
            lsn,
            bytes = bytes.len(),
            "a secondary subscribed to the log"
        );
        let mut pieces = bytes.chunks(STATE_PIECE).peekable();
        while let Some(piece) = pieces.next() {
            let message = FeedMessage::State {
                lsn,
                piece: piece.to_vec(),
                done: pieces.peek().is_none(),
            };
            if tx.send(Ok(message.encode())).await.is_err() {
                return Ok(());
            }
        }
        drop(bytes);
        loop {
            let message = match groups.recv().await {
                Ok(group) if group.last <= lsn => continue,
                Ok(group) => FeedMessage::Log {
                    last: group.last,
                    frames: group.frames.clone(),
                },
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return Err(DataFusionError::Execution(format!(
                        "worker {node} fell {n} log groups behind the primary: it starts over \
                         from the current state"
                    )));
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            };
            if tx.send(Ok(message.encode())).await.is_err() {
                return Ok(());
            }
        }
    }

    /// The primary's committed state, once it shows every group up to `shipped`
    /// (a group is shipped as soon as it is durable, the state a moment later).
    async fn state_after(&self, shipped: u64) -> Result<Arc<gyre_replica::Store>> {
        let started = Instant::now();
        loop {
            let store = self.db.snapshot();
            if store.lsn >= shipped {
                return Ok(store);
            }
            if started.elapsed() > STATE_WAIT {
                return Err(DataFusionError::Execution(format!(
                    "the primary's state stayed at LSN {} while LSN {shipped} was shipped",
                    store.lsn
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
