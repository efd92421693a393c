//! What readers see of the primary: the store as of a durable commit, copied only when
//! a reader asks for a newer one.
//!
//! The store's maps are persistent, so a copy is O(1), but it shares every tree node
//! with the live store: while a copy lives, each write copies the path it touches.
//! Copying at every commit made every transaction pay for that. Instead a reader that
//! finds the last copy older than the last commit takes the primary's lock for a
//! moment, copies, waits until that state is durable (a group commit at most) and
//! hands it to later readers too.
//!
//! A reader must not wait for a transaction that holds the primary for long (an
//! interactive one, a load). Such holders copy the state when they take the lock
//! ([`Published::acquired`]); so do short holders while a reader waits, so that a
//! reader queued behind a stream of transactions finds a state at least as new as the
//! last commit it could have heard of. A reader thus never sees less than every
//! transaction acknowledged before it asked, and never a commit that could still be
//! lost.

use crate::error::Result;
use crate::store::Store;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How long a snapshot for a reader waits for the transaction holding the primary:
/// a single-statement one ends within it, an interactive one may not.
pub const READER_LOCK_WAIT: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub(crate) struct Published {
    /// The last state handed to readers (durable).
    current: Mutex<Arc<Store>>,
    /// `current`'s LSN, read without its lock.
    current_lsn: AtomicU64,
    /// A copy a holder of the primary took when it took the lock; not yet known to be
    /// durable.
    pending: Mutex<Option<Arc<Store>>>,
    /// Readers waiting for the primary's lock.
    waiting: AtomicUsize,
    /// The LSN of the last commit applied to the store.
    last_commit: AtomicU64,
}

impl Published {
    pub(crate) fn new(store: &Store) -> Self {
        Self {
            current: Mutex::new(Arc::new(store.clone())),
            current_lsn: AtomicU64::new(store.lsn),
            pending: Mutex::new(None),
            waiting: AtomicUsize::new(0),
            last_commit: AtomicU64::new(store.lsn),
        }
    }

    /// Notes a commit applied to the store (called under the primary's lock).
    pub(crate) fn committed(&self, lsn: u64) {
        self.last_commit.store(lsn, Ordering::Release);
    }

    pub(crate) fn last_commit(&self) -> u64 {
        self.last_commit.load(Ordering::Acquire)
    }

    /// Called by whoever takes the primary's lock, with the store it holds: one that
    /// may hold it `long`, or any while a reader waits, leaves a copy for readers.
    pub(crate) fn acquired(&self, store: &Store, long: bool) {
        if (long || self.waiting.load(Ordering::SeqCst) > 0)
            && store.lsn > self.current_lsn.load(Ordering::Acquire)
        {
            *self.pending.lock() = Some(Arc::new(store.clone()));
        }
    }

    /// The last state handed to readers, without asking for a newer one. Table
    /// definitions in it are current: creating, loading and dropping a table
    /// publishes.
    pub(crate) fn current(&self) -> Arc<Store> {
        self.current.lock().clone()
    }

    /// Makes `state` (durable) what readers see, unless they see a later one already.
    /// Returns what they see now.
    pub(crate) fn publish(&self, state: Arc<Store>) -> Arc<Store> {
        let mut current = self.current.lock();
        if state.lsn > current.lsn {
            self.current_lsn.store(state.lsn, Ordering::Release);
            *current = state;
            let mut pending = self.pending.lock();
            if pending.as_ref().is_some_and(|p| p.lsn <= current.lsn) {
                *pending = None;
            }
        }
        current.clone()
    }

    /// The state as of the last commit when asked (durable by the time it returns),
    /// taken from `store`, the primary, without waiting for a long transaction.
    /// `wait_durable` waits for an LSN to be on disk; if it fails (the log is
    /// broken), the last published state is returned.
    pub(crate) fn snapshot(
        &self,
        store: &Mutex<Store>,
        wait_durable: impl Fn(u64) -> Result<()>,
    ) -> Arc<Store> {
        let target = self.last_commit();
        if self.current_lsn.load(Ordering::Acquire) >= target {
            return self.current();
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let state = loop {
            if let Some(store) = store.try_lock_for(READER_LOCK_WAIT) {
                break Arc::new(store.clone());
            }
            let pending = self.pending.lock().clone();
            if let Some(p) = pending.filter(|p| p.lsn >= target) {
                break p;
            }
            if self.current_lsn.load(Ordering::Acquire) >= target {
                break self.current();
            }
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match wait_durable(state.lsn) {
            Ok(()) => self.publish(state),
            Err(_) => self.current(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::store::{RowOp, TableDef, TableId};
    use crate::value::{Column, ColumnType};

    /// A store with one empty table of integer keys.
    fn one_table() -> Store {
        let mut s = Store::default();
        s.create_table(TableDef {
            id: TableId(0),
            name: "t".into(),
            columns: vec![Column::new("k", ColumnType::Int64, false)],
            key: vec![0],
            placement: Default::default(),
        })
        .unwrap();
        s
    }

    fn rows(s: &Store) -> usize {
        s.table(TableId(0)).unwrap().rows.len()
    }

    /// Commits are seen once a reader asks, not copied before; a reader behind a
    /// long holder gets the copy it left; a failed durability wait gives the last
    /// published state.
    #[test]
    fn readers_copy_on_demand_and_never_wait_for_a_long_holder() {
        let primary = Mutex::new(one_table());
        let published = Published::new(&primary.lock());
        let commit = |k: i64| {
            let mut s = primary.lock();
            s.apply(RowOp::Insert {
                table: TableId(0),
                row: vec![Value::Int(k)].into(),
            })
            .unwrap();
            s.lsn += 1;
            published.committed(s.lsn);
        };
        commit(1);
        commit(2);
        assert_eq!(rows(&published.current()), 0, "nothing copied at commit");
        let seen = published.snapshot(&primary, |_| Ok(()));
        assert_eq!((seen.lsn, rows(&seen)), (2, 2));
        // Nothing committed since: the same copy.
        assert!(Arc::ptr_eq(
            &seen,
            &published.snapshot(&primary, |_| Ok(()))
        ));
        commit(3);
        // The log is broken: the reader gets the last durable state.
        let stale = published.snapshot(&primary, |_| Err(crate::Error::Aborted("x".into())));
        assert_eq!(stale.lsn, 2);
        // A long holder leaves a copy; the reader takes it instead of the lock.
        let held = primary.lock();
        published.acquired(&held, true);
        let started = std::time::Instant::now();
        let seen = published.snapshot(&primary, |_| Ok(()));
        assert_eq!((seen.lsn, rows(&seen)), (3, 3));
        assert!(started.elapsed() < READER_LOCK_WAIT * 4);
        drop(held);
        assert!(published.pending.lock().is_none(), "the copy was published");
    }
}
