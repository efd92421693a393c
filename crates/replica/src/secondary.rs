//! A secondary: replays the primary's log in LSN order and answers reads from
//! snapshots at exact LSNs.
//!
//! ScyPer's secondaries (Rödiger's thesis, section 5.2) replay the redo log they receive
//! by multicast. A logical entry is replayed by running its stored procedure again,
//! which needs the row store's key indexes, so a secondary keeps the row store as its
//! replay engine and applies the row operations each entry makes (a physical entry's
//! as logged, a logical entry's as its procedure makes them again) to versioned Arrow
//! tables ([`crate::versioned`]), from which snapshots are cut without copying.

use crate::database::{apply_create, replay};
use crate::error::{Error, Result};
use crate::log::Entry;
use crate::log::segment;
use crate::procedure::Procedures;
use crate::store::Store;
use crate::versioned::{Snapshot, VersionedStore};
use std::time::{Duration, Instant};

pub struct Secondary {
    rows: Store,
    versions: VersionedStore,
    procedures: Procedures,
    /// Time spent replaying, for the replay speed against the primary's execution.
    replay_time: Duration,
    replayed: u64,
}

impl Secondary {
    /// A secondary of a primary that has logged nothing yet.
    pub fn new(procedures: Procedures) -> Self {
        Self {
            rows: Store::default(),
            versions: VersionedStore::default(),
            procedures,
            replay_time: Duration::ZERO,
            replayed: 0,
        }
    }

    /// The LSN of the last entry applied.
    pub fn lsn(&self) -> u64 {
        self.rows.lsn
    }

    /// The row store replay runs on (the state at [`Secondary::lsn`]).
    pub fn rows(&self) -> &Store {
        &self.rows
    }

    /// Entries replayed so far, and the time their replay took.
    pub fn replay_stats(&self) -> (u64, Duration) {
        (self.replayed, self.replay_time)
    }

    /// Applies the log groups in `frames` (as the primary's log writes and ships them),
    /// which must continue this secondary's LSNs; returns how many entries they held.
    /// Every frame is checked (sizes, checksum) before anything in it is applied.
    pub fn apply_frames(&mut self, frames: &[u8]) -> Result<u64> {
        let mut at = 0;
        let mut n = 0;
        while at < frames.len() {
            let (first, entries, len) = segment::frame(&frames[at..])
                .map_err(|e| Error::Constraint(format!("shipped log group: {e}")))?;
            at += len;
            for (i, entry) in entries.into_iter().enumerate() {
                self.apply(first + i as u64, entry)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Applies the entry with LSN `lsn`, the next one.
    pub fn apply(&mut self, lsn: u64, entry: Entry) -> Result<()> {
        let expected = self.rows.lsn + 1;
        if lsn < expected {
            // A repeat of what is applied already (a resent group): nothing to do.
            return Ok(());
        }
        if lsn > expected {
            return Err(Error::Constraint(format!(
                "log entries {expected} to {} are missing",
                lsn - 1
            )));
        }
        let started = Instant::now();
        let diverged =
            |e: Error| Error::Constraint(format!("replaying LSN {lsn} on a secondary: {e}"));
        match entry {
            Entry::CreateTable { def, rows } => {
                let entry = Entry::CreateTable {
                    def: def.clone(),
                    rows: rows.clone(),
                };
                apply_create(&mut self.rows, &entry).map_err(diverged)?;
                self.rows.lsn = lsn;
                self.versions
                    .create_table(lsn, def, rows)
                    .map_err(diverged)?;
            }
            Entry::DropTable(id) => {
                replay(&mut self.rows, &self.procedures, lsn, Entry::DropTable(id))
                    .map_err(diverged)?;
                self.versions.drop_table(id).map_err(diverged)?;
            }
            entry => {
                let ops = replay(&mut self.rows, &self.procedures, lsn, entry).map_err(diverged)?;
                for op in &ops {
                    self.versions.apply(lsn, op).map_err(diverged)?;
                }
            }
        }
        self.versions.advance(lsn).map_err(diverged)?;
        self.replay_time += started.elapsed();
        self.replayed += 1;
        Ok(())
    }

    /// Every table at the last applied LSN.
    pub fn snapshot(&mut self) -> Snapshot {
        self.versions.snapshot()
    }
}
