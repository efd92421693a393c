//! The primary's redo log as the workers receive it: each worker is a secondary that
//! replays the log of the transactional tables (ScyPer, Rödiger's thesis, chapter 5).
//!
//! A worker subscribes with a signed control call whose reply is a stream: first the
//! primary's state at some LSN ([`gyre_replica::checkpoint::to_bytes`], in pieces),
//! then every log group made durable after that LSN, in order. The coordinator keeps
//! no per-worker backlog beyond [`BACKLOG_GROUPS`] groups: a worker that falls further
//! behind is cut off and subscribes again from the then current state.
//!
//! With a multicast group (`--log-multicast`) each group crosses the network once,
//! however many workers follow (ScyPer multicasts its log with PGM; [`gyre_replica::ship`]
//! is a PGM-like protocol): a worker joins the group, then subscribes, and the stream
//! carries only the state. Multicast messages carry an HMAC keyed with the cluster
//! secret ([`LogKey`]), so a datagram from anyone else never reaches a secondary.
//!
//! The state cannot miss a group: a subscriber listens for groups (joins the group)
//! before it asks for the state, which is read only once every entry durable at the
//! request (so every group shipped before it) is visible in it.
//!
//! The state names the subscriber's [`KeyShare`] of the partitioned tables: its place
//! among the live workers, as queries number them (named once a starting cluster's
//! workers are all in). The feed checks that place every [`SHARE_CHECK`] and ends with
//! [`FeedMessage::Moved`] when it changed: the worker subscribes again at once and
//! starts over with its new share.

use crate::primary_table::replica_err;
use crate::snapshot_scan::KeyShare;
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use futures::stream::BoxStream;
use gyre_replica::secondary::keep_share;
use gyre_replica::ship::{Group, Publisher, PublisherConfig};
use gyre_replica::{Database, Placement, Store, rendezvous};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Log groups a subscriber may lag behind before it is cut off.
pub const BACKLOG_GROUPS: usize = 4096;

/// Bytes of state, or of a large log group, per message.
const PIECE: usize = 4 << 20;

/// The most log bytes a secondary puts together from pieces: groups hold at most
/// [`gyre_replica::log::segment::MAX_GROUP_BYTES`] each, a shipment a few groups.
pub const MAX_SHIPMENT_BYTES: usize = 1 << 30;

/// How often a subscription checks the subscriber's place among the live workers.
pub const SHARE_CHECK: Duration = Duration::from_secs(1);

/// The live workers, in the order queries number them; `None` while the cluster is
/// starting (fewer workers registered than it expects), when shares would change at
/// once.
pub type LiveWorkers = Box<dyn Fn() -> Option<Vec<u32>> + Send + Sync>;

/// Worker `node`'s share of the partitioned tables among `workers` (`None`: it is not
/// one of them, and keeps every row until it is).
pub fn share_of(node: u32, workers: &[u32]) -> Option<KeyShare> {
    let index = workers.iter().position(|&w| w == node)?;
    Some(KeyShare {
        index: index as u32,
        count: workers.len() as u32,
        node,
        workers: workers.to_vec(),
    })
}

/// Whether a replica that holds `held` must start over to hold `now` of the tables of
/// `store`: the share of partitioned and chunked tables changed, or rendezvous hashing
/// gives it blocks of fragmented tables that it does not hold. Blocks it no longer
/// holds need no new state (queries do not read them there), so a worker joining the
/// cluster moves no data but its own share.
pub fn must_move(held: Option<&KeyShare>, now: Option<&KeyShare>, store: &Store) -> bool {
    let (Some(held), Some(now)) = (held, now) else {
        return held != now;
    };
    let split_by_place = store
        .tables()
        .any(|t| matches!(t.def.placement, Placement::Partitioned | Placement::Chunked));
    (split_by_place && (held.index, held.count) != (now.index, now.count))
        || holds_blocks_beyond(now, held, store)
}

/// Whether `now` holds fewer blocks of the fragmented tables of `store` than `held`
/// (and no others): the replica can drop those it no longer holds.
pub fn narrows(held: &KeyShare, now: &KeyShare, store: &Store) -> bool {
    holds_blocks_beyond(held, now, store)
}

/// Whether share `a` holds a block of a fragmented table of `store` that share `b`
/// does not.
fn holds_blocks_beyond(a: &KeyShare, b: &KeyShare, store: &Store) -> bool {
    let copies: std::collections::BTreeSet<u8> = store
        .tables()
        .filter_map(|t| match t.def.placement {
            Placement::Fragmented { replicas } => Some(replicas),
            _ => None,
        })
        .collect();
    copies.into_iter().any(|replicas| {
        (0..rendezvous::BLOCKS).any(|block| {
            rendezvous::holds(block, a.node, &a.workers, replicas)
                && !rendezvous::holds(block, b.node, &b.workers, replicas)
        })
    })
}

/// How long a subscription waits for a starting cluster's workers to register.
const STARTING_WAIT: Duration = Duration::from_secs(30);

/// How long a subscription waits for the state to show what was already shipped,
/// while the log does not grow.
const STATE_WAIT: Duration = Duration::from_secs(10);

/// One message of a subscription.
#[derive(Debug, Serialize, Deserialize)]
pub enum FeedMessage {
    /// A piece of the primary's state at LSN `lsn`; the last piece has `done` and
    /// the subscriber's share of the partitioned tables.
    State {
        lsn: u64,
        piece: Vec<u8>,
        done: bool,
        share: Option<KeyShare>,
    },
    /// The subscriber's share changed to this: it subscribes again at once, for the
    /// state with its new share.
    Moved { share: Option<KeyShare> },
    /// The subscriber's share shrank to this (it holds blocks of fragmented tables
    /// that rendezvous hashing gave a worker that joined): it drops the others from
    /// its replica, and the feed goes on.
    Narrowed { share: KeyShare },
    /// Log groups (the log's frames) whose last entry has LSN `last`, shipped when
    /// the coordinator's clock read `shipped_us` (µs since the Unix epoch), to measure
    /// how far the secondaries lag behind.
    Log {
        last: u64,
        frames: Vec<u8>,
        shipped_us: u64,
    },
    /// The first bytes of a log group's frames too large for one message: the
    /// [`FeedMessage::Log`] that follows carries the rest.
    LogPiece { piece: Vec<u8> },
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

/// A group as shipped: the LSN of its last entry, its frames and when it was shipped.
#[derive(Debug)]
struct Shipped {
    last: u64,
    frames: Vec<u8>,
    shipped_us: u64,
}

/// Microseconds since the Unix epoch.
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Seals and opens multicast log messages: `last`, `shipped_us`, the frames, and an
/// HMAC-SHA256 over them keyed with the cluster secret.
#[derive(Clone)]
pub struct LogKey(Hmac<Sha256>);

impl std::fmt::Debug for LogKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogKey")
    }
}

/// What a multicast log message's MAC covers first, so that no other message signed
/// with the secret passes for one.
const LOG_LABEL: &[u8] = b"gyre/log-multicast/1";
const TAG_BYTES: usize = 32;

impl LogKey {
    pub fn from_secret(secret: &str) -> Self {
        Self(Hmac::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length"))
    }

    fn mac(&self, head: &[u8], frames: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(LOG_LABEL);
        mac.update(head);
        mac.update(frames);
        mac
    }

    /// The message for log groups ending at LSN `last`, shipped at `shipped_us`.
    pub fn seal(&self, last: u64, shipped_us: u64, frames: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + frames.len() + TAG_BYTES);
        out.extend_from_slice(&last.to_le_bytes());
        out.extend_from_slice(&shipped_us.to_le_bytes());
        let tag = self.mac(&out, frames).finalize().into_bytes();
        out.extend_from_slice(frames);
        out.extend_from_slice(&tag);
        out
    }

    /// `last`, `shipped_us` and the frames of a message, if its MAC holds.
    pub fn open<'a>(&self, message: &'a [u8]) -> Result<(u64, u64, &'a [u8])> {
        let bad = |why: &str| {
            DataFusionError::Execution(format!("a multicast log message was refused: {why}"))
        };
        if message.len() < 16 + TAG_BYTES {
            return Err(bad("too short"));
        }
        let (head, rest) = message.split_at(16);
        let (frames, tag) = rest.split_at(rest.len() - TAG_BYTES);
        self.mac(head, frames)
            .verify_slice(tag)
            .map_err(|_| bad("its MAC does not match the cluster secret"))?;
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        Ok((word(0), word(8), frames))
    }
}

/// The coordinator's end: takes every durable group from the primary's log and hands
/// it to the subscribed workers (over their streams, or by multicast).
#[derive(Debug)]
pub struct LogFeed {
    db: Arc<Database>,
    groups: broadcast::Sender<Arc<Shipped>>,
    /// Where the log is multicast, if it is.
    multicast: Option<Group>,
    /// Workers subscribed now.
    subscribers: AtomicUsize,
}

impl LogFeed {
    /// Ships `db`'s log from now on: to subscribed streams, and to `multicast` (with
    /// messages sealed by its key) if given.
    pub fn attach(db: Arc<Database>, multicast: Option<(Group, LogKey)>) -> Result<Arc<Self>> {
        let (groups, _) = broadcast::channel(BACKLOG_GROUPS);
        let group = multicast.as_ref().map(|(g, _)| *g);
        let publisher = match multicast {
            Some((g, key)) => {
                let publisher = Publisher::new(PublisherConfig::new(g)).map_err(|e| {
                    DataFusionError::Configuration(format!(
                        "cannot multicast the log to {} on {}: {e}",
                        g.group, g.interface
                    ))
                })?;
                Some((publisher, key))
            }
            None => None,
        };
        let tx = groups.clone();
        db.ship(Box::new(move |lsn, frames| {
            let shipped_us = unix_micros();
            if let Some((publisher, key)) = &publisher
                && let Err(e) = publisher.publish(&key.seal(lsn, shipped_us, frames))
            {
                tracing::warn!("multicasting log group up to LSN {lsn}: {e}");
            }
            // No stream subscriber is fine: workers that come later start from the state.
            if tx.receiver_count() > 0 {
                let _ = tx.send(Arc::new(Shipped {
                    last: lsn,
                    frames: frames.to_vec(),
                    shipped_us,
                }));
            }
        }))
        .map_err(replica_err)?;
        Ok(Arc::new(Self {
            db,
            groups,
            multicast: group,
            subscribers: AtomicUsize::new(0),
        }))
    }

    /// How many workers follow the log now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// A subscription of worker `node`: encoded [`FeedMessage`]s, the state first,
    /// then the log groups, unless the worker has `joined` the multicast group the log
    /// goes to. It ends with an error when the worker falls too far behind, and stops
    /// when the worker goes away.
    pub fn subscribe(
        self: &Arc<Self>,
        node: u32,
        joined: bool,
        workers: LiveWorkers,
    ) -> BoxStream<'static, Result<Vec<u8>>> {
        let groups = (!joined || self.multicast.is_none()).then(|| self.groups.subscribe());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            me.subscribers.fetch_add(1, Ordering::Relaxed);
            let result = me.feed(node, groups, &workers, &tx).await;
            me.subscribers.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = result {
                tracing::info!(node, "log feed: {e}");
                let _ = tx.send(Err(e)).await;
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
    }

    /// Sends the state, then the groups after it (unless they go by multicast), until
    /// the subscriber is gone.
    async fn feed(
        &self,
        node: u32,
        mut groups: Option<broadcast::Receiver<Arc<Shipped>>>,
        workers: &LiveWorkers,
        tx: &tokio::sync::mpsc::Sender<Result<Vec<u8>>>,
    ) -> Result<()> {
        let started = Instant::now();
        let live = loop {
            match workers() {
                Some(live) => break live,
                None if started.elapsed() < STARTING_WAIT => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                None => break vec![],
            }
        };
        let mut share = share_of(node, &live);
        // The log makes a group durable before it ships it: every group shipped
        // before this request (which came after the subscriber began to listen) is at
        // or below the durable LSN now.
        let store = self.state_after(self.db.durable_lsn()).await?;
        let lsn = store.lsn;
        // Only the rows the subscriber keeps cross the network.
        let kept = share.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            let mut store = Store::clone(&store);
            if let Some(share) = &kept {
                keep_share(&mut store, share)?;
            }
            gyre_replica::checkpoint::to_bytes(&store)
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("encoding the state: {e}")))?
        .map_err(replica_err)?;
        tracing::info!(
            node,
            lsn,
            bytes = bytes.len(),
            ?share,
            "a secondary subscribed to the log"
        );
        let mut pieces = bytes.chunks(PIECE).peekable();
        while let Some(piece) = pieces.next() {
            let message = FeedMessage::State {
                lsn,
                piece: piece.to_vec(),
                done: pieces.peek().is_none(),
                share: share.clone(),
            };
            if tx.send(Ok(message.encode())).await.is_err() {
                return Ok(());
            }
        }
        drop(bytes);
        let mut check =
            tokio::time::interval_at(tokio::time::Instant::now() + SHARE_CHECK, SHARE_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let received = tokio::select! {
                // The groups go by multicast: the stream stays open until the worker
                // leaves or its share changes.
                _ = tx.closed(), if groups.is_none() => return Ok(()),
                received = async { groups.as_mut().expect("guarded").recv().await },
                    if groups.is_some() => received,
                _ = check.tick() => {
                    let Some(now) = workers().map(|live| share_of(node, &live)) else {
                        continue;
                    };
                    // The tables' placements only: the last published state, with no
                    // wait for a commit to be durable on an async thread.
                    let store = self.db.catalog();
                    if !must_move(share.as_ref(), now.as_ref(), &store) {
                        if let (Some(held), Some(now)) = (&share, &now)
                            && narrows(held, now, &store)
                        {
                            tracing::info!(node, "the workers changed: worker {node} narrows to {now}");
                            let message = FeedMessage::Narrowed { share: now.clone() };
                            if tx.send(Ok(message.encode())).await.is_err() {
                                return Ok(());
                            }
                            share = Some(now.clone());
                        }
                        continue;
                    }
                    tracing::info!(
                        node,
                        "the workers changed: worker {node} now holds {} of the partitioned \
                         tables (it held {}) and starts over from the current state",
                        now.as_ref().map_or("every row".into(), |s| s.to_string()),
                        share.as_ref().map_or("every row".into(), |s| s.to_string()),
                    );
                    let _ = tx.send(Ok(FeedMessage::Moved { share: now }.encode())).await;
                    return Ok(());
                }
            };
            let group = match received {
                Ok(group) if group.last <= lsn => continue,
                Ok(group) => group,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return Err(DataFusionError::Execution(format!(
                        "worker {node} fell {n} log groups behind the primary: it starts over \
                         from the current state"
                    )));
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            };
            let mut pieces = group.frames.chunks(PIECE).peekable();
            while let Some(piece) = pieces.next() {
                let message = if pieces.peek().is_some() {
                    FeedMessage::LogPiece {
                        piece: piece.to_vec(),
                    }
                } else {
                    FeedMessage::Log {
                        last: group.last,
                        frames: piece.to_vec(),
                        shipped_us: group.shipped_us,
                    }
                };
                if tx.send(Ok(message.encode())).await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// The primary's committed state, once it shows every entry up to `durable` (the
    /// state shows a commit a moment after it is durable, a load in pieces only once
    /// its last piece is: the wait goes on while the log grows).
    async fn state_after(&self, durable: u64) -> Result<Arc<gyre_replica::Store>> {
        let mut progress = (Instant::now(), self.db.durable_lsn());
        loop {
            // It may wait for a commit to be durable: not on an async thread, which the
            // commit may need (a replicated log's proposal runs on them).
            let db = Arc::clone(&self.db);
            let store = tokio::task::spawn_blocking(move || db.snapshot())
                .await
                .map_err(|e| DataFusionError::Execution(format!("reading the state: {e}")))?;
            if store.lsn >= durable {
                return Ok(store);
            }
            let now = self.db.durable_lsn();
            if now != progress.1 {
                progress = (Instant::now(), now);
            } else if progress.0.elapsed() > STATE_WAIT {
                return Err(DataFusionError::Execution(format!(
                    "the primary's state stayed at LSN {} while LSN {durable} was durable",
                    store.lsn
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LogKey, must_move, narrows, share_of};
    use crate::snapshot_scan::KeyShare;
    use gyre_replica::{Column, ColumnType, Placement, Store, TableDef, TableId};

    #[test]
    fn a_workers_share_is_its_place_among_the_live_workers() {
        assert_eq!(
            share_of(7, &[2, 7, 9]),
            Some(KeyShare {
                index: 1,
                count: 3,
                node: 7,
                workers: vec![2, 7, 9]
            })
        );
        assert_eq!(share_of(4, &[2, 7, 9]), None);
        assert_eq!(share_of(4, &[]), None);
    }

    fn store_with(placements: &[Placement]) -> Store {
        let mut store = Store::default();
        for (i, &placement) in placements.iter().enumerate() {
            store
                .create_table(TableDef {
                    id: TableId(i as u32),
                    name: format!("t{i}"),
                    columns: vec![Column::new("k", ColumnType::Int64, false)],
                    key: vec![0],
                    placement,
                })
                .unwrap();
        }
        store
    }

    #[test]
    fn only_a_worker_given_blocks_it_lacks_starts_over() {
        let fragmented = store_with(&[Placement::Full, Placement::Fragmented { replicas: 2 }]);
        let partitioned = store_with(&[Placement::Partitioned]);
        let before = [1, 2, 3, 4];
        let joined = [1, 2, 3, 4, 5];
        let left = [1, 2, 4];
        for node in before {
            let held = share_of(node, &before);
            // A worker joining takes blocks from the others; none of them gains any.
            assert!(!must_move(
                held.as_ref(),
                share_of(node, &joined).as_ref(),
                &fragmented
            ));
            // The shares of a partitioned table are places among the workers: they
            // change for every worker whose place or count changes.
            assert!(must_move(
                held.as_ref(),
                share_of(node, &joined).as_ref(),
                &partitioned
            ));
            // A worker leaving hands its blocks to the others.
            if node != 3 {
                assert!(must_move(
                    held.as_ref(),
                    share_of(node, &left).as_ref(),
                    &fragmented
                ));
            }
        }
        // Each worker gives the newcomer blocks of the fragmented table: it narrows.
        for node in before {
            let (held, now) = (share_of(node, &before), share_of(node, &joined));
            let (held, now) = (held.unwrap(), now.unwrap());
            assert!(narrows(&held, &now, &fragmented));
            assert!(!narrows(&held, &now, &partitioned));
            assert!(!narrows(&held, &held, &fragmented));
        }
        // Not among the workers any more, or not yet: every row.
        assert!(must_move(share_of(1, &before).as_ref(), None, &fragmented));
        assert!(!must_move(None, None, &fragmented));
    }

    #[test]
    fn multicast_messages_open_only_with_the_secret_and_intact() {
        let key = LogKey::from_secret("s3cret");
        let sealed = key.seal(42, 7, b"frames");
        let (last, shipped, frames) = key.open(&sealed).unwrap();
        assert_eq!((last, shipped, frames), (42, 7, &b"frames"[..]));
        let other = LogKey::from_secret("other");
        assert!(other.open(&sealed).is_err());
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(key.open(&bad).is_err(), "byte {i} changed unnoticed");
        }
        for cut in [0, 10, 47, sealed.len() - 1] {
            assert!(key.open(&sealed[..cut]).is_err());
        }
    }
}
