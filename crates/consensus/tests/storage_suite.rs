//! openraft's own conformance suite for storage, run on the voter's log store and
//! state machine (each test on a fresh directory).

use gyre_consensus::log_store::LogStore;
use gyre_consensus::state_machine::StateMachine;
use gyre_consensus::{Applier, GroupLog, NodeId};
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use parking_lot::Mutex;
use std::sync::Arc;

/// Keeps the applied groups; its snapshot is their list.
#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, Vec<u8>)>>);

impl Applier for Recorder {
    fn apply(&self, index: u64, group: &[u8]) -> Result<(), String> {
        self.0.lock().push((index, group.to_vec()));
        Ok(())
    }
    fn snapshot(&self) -> Result<Vec<u8>, String> {
        postcard::to_allocvec(&*self.0.lock()).map_err(|e| e.to_string())
    }
    fn restore(&self, snapshot: &[u8]) -> Result<(), String> {
        *self.0.lock() = postcard::from_bytes(snapshot).map_err(|e| e.to_string())?;
        Ok(())
    }
}

struct OnDisk;

impl StoreBuilder<GroupLog, LogStore, StateMachine<Recorder>, tempfile::TempDir> for OnDisk {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine<Recorder>), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = LogStore::open(dir.path()).expect("a new log");
        let machine =
            StateMachine::open(dir.path(), Arc::new(Recorder::default())).expect("a new machine");
        Ok((dir, log, machine))
    }
}

#[test]
fn the_voter_storage_passes_openrafts_suite() {
    Suite::test_all(OnDisk).unwrap();
}
