//! Three voters in one process, joined by a router that can stop a voter or cut it
//! off: a committed group is never lost, whichever voter dies, and every voter applies
//! the same groups in the same order.

use gyre_consensus::{Applier, Carrier, NodeId, ProposeError, Timing, Voter};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Keeps the applied groups; its snapshot is their list.
#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, Vec<u8>)>>, AtomicUsize);

impl Applier for Recorder {
    fn apply(&self, index: u64, group: &[u8]) -> Result<(), String> {
        let mut groups = self.0.lock();
        if let Some((last, _)) = groups.last() {
            assert!(index > *last, "index {index} applied after {last}");
        }
        groups.push((index, group.to_vec()));
        Ok(())
    }
    fn snapshot(&self) -> Result<Vec<u8>, String> {
        postcard::to_allocvec(&*self.0.lock()).map_err(|e| e.to_string())
    }
    fn restore(&self, snapshot: &[u8]) -> Result<(), String> {
        *self.0.lock() = postcard::from_bytes(snapshot).map_err(|e| e.to_string())?;
        self.1.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Recorder {
    fn payloads(&self) -> Vec<Vec<u8>> {
        self.0.lock().iter().map(|(_, g)| g.clone()).collect()
    }
}

/// Delivers requests between the voters of one process.
#[derive(Default)]
struct Router {
    voters: Mutex<HashMap<NodeId, Arc<Voter>>>,
    /// Voters whose links are all cut.
    cut: Mutex<HashSet<NodeId>>,
}

/// One voter's way out through the router.
struct Link {
    from: NodeId,
    router: Arc<Router>,
}

#[async_trait::async_trait]
impl Carrier for Link {
    async fn call(
        &self,
        to: NodeId,
        _addr: &str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        {
            let cut = self.router.cut.lock();
            if cut.contains(&self.from) || cut.contains(&to) {
                return Err("the link is cut".into());
            }
        }
        let voter = self.router.voters.lock().get(&to).cloned();
        let voter = voter.ok_or("nobody listens")?;
        tokio::time::timeout(timeout, voter.answer(&request))
            .await
            .map_err(|_| "timed out".to_string())?
    }
}

struct Cluster {
    router: Arc<Router>,
    dirs: Vec<tempfile::TempDir>,
    recorders: HashMap<NodeId, Arc<Recorder>>,
    timing: Timing,
}

const VOTERS: [NodeId; 3] = [1, 2, 3];

fn members() -> Vec<(NodeId, String)> {
    VOTERS
        .iter()
        .map(|id| (*id, format!("voter-{id}")))
        .collect()
}

impl Cluster {
    async fn start(timing: Timing) -> Self {
        let mut cluster = Cluster {
            router: Arc::default(),
            dirs: VOTERS
                .iter()
                .map(|_| tempfile::tempdir().unwrap())
                .collect(),
            recorders: HashMap::new(),
            timing,
        };
        for id in VOTERS {
            cluster.start_voter(id).await;
        }
        cluster
    }

    fn dir(&self, id: NodeId) -> PathBuf {
        self.dirs[id as usize - 1].path().to_path_buf()
    }

    /// Starts voter `id` on its directory with a fresh applier, as a restarted process
    /// would.
    async fn start_voter(&mut self, id: NodeId) -> Arc<Voter> {
        let recorder = Arc::new(Recorder::default());
        let link = Arc::new(Link {
            from: id,
            router: self.router.clone(),
        });
        let voter = Voter::start(
            id,
            &self.dir(id),
            recorder.clone(),
            link,
            self.timing.clone(),
        )
        .await
        .unwrap();
        voter.bootstrap(&members()).await.unwrap();
        let voter = Arc::new(voter);
        self.router.voters.lock().insert(id, voter.clone());
        self.recorders.insert(id, recorder);
        voter
    }

    /// Stops voter `id` as kill -9 would, as far as its peers can tell.
    async fn kill(&self, id: NodeId) {
        let voter = self.router.voters.lock().remove(&id).unwrap();
        voter.shutdown().await;
    }

    fn voter(&self, id: NodeId) -> Arc<Voter> {
        self.router.voters.lock()[&id].clone()
    }

    /// The voter that leads, once the live voters agree on one.
    async fn leader(&self, within: Duration) -> Arc<Voter> {
        let deadline = Instant::now() + within;
        loop {
            let voters: Vec<Arc<Voter>> = self.router.voters.lock().values().cloned().collect();
            let cut = self.router.cut.lock().clone();
            if let Some(leader) = voters
                .iter()
                .find(|v| v.is_leader() && !cut.contains(&v.id()))
            {
                return leader.clone();
            }
            assert!(Instant::now() < deadline, "no leader within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until voter `id` applied `count` groups, and returns them.
    async fn applied(&self, id: NodeId, count: usize) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let groups = self.recorders[&id].payloads();
            if groups.len() >= count {
                return groups;
            }
            assert!(
                Instant::now() < deadline,
                "voter {id} applied {} of {count} groups",
                groups.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Cluster {
    /// Commits `group` through whichever voter leads now. A refusal (`NotLeader`) never
    /// reached a log, so it is tried again; a leader lost after it took the group
    /// fails the test, since the group may still commit.
    async fn propose(&self, group: Vec<u8>) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let leader = self.leader(Duration::from_secs(10)).await;
            match leader.propose(group.clone()).await {
                Ok(_) => return,
                Err(ProposeError::NotLeader { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}

/// Held by each test: three clusters of three voters at once on two cores make
/// elections flip for want of CPU.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn group(n: usize) -> Vec<u8> {
    format!("group {n}").into_bytes()
}

fn fast() -> Timing {
    Timing {
        heartbeat: Duration::from_millis(50),
        election: (Duration::from_millis(300), Duration::from_millis(600)),
        ..Timing::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_kill_loses_no_committed_group() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start(fast()).await;
    for n in 0..50 {
        cluster.propose(group(n)).await;
    }
    // A follower refuses, naming a leader.
    let leader = cluster.leader(Duration::from_secs(10)).await;
    let follower = VOTERS.iter().find(|id| **id != leader.id()).unwrap();
    let refused = cluster.voter(*follower).propose(group(999)).await;
    assert!(
        matches!(&refused, Err(ProposeError::NotLeader { leader: Some((id, addr)) })
            if *addr == format!("voter-{id}")),
        "{refused:?}"
    );

    let dead = leader.id();
    drop(leader);
    let killed = Instant::now();
    cluster.kill(dead).await;
    let leader = cluster.leader(Duration::from_secs(10)).await;
    assert_ne!(leader.id(), dead);
    let elected = killed.elapsed();
    drop(leader);
    for n in 50..100 {
        cluster.propose(group(n)).await;
    }
    eprintln!("a new leader in {elected:?}");

    // The killed voter comes back on its disk and catches up.
    cluster.start_voter(dead).await;
    let expected: Vec<Vec<u8>> = (0..100).map(group).collect();
    for id in VOTERS {
        assert_eq!(cluster.applied(id, 100).await, expected, "voter {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_voter_restarted_keeps_the_log() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start(fast()).await;
    for n in 0..20 {
        cluster.propose(group(n)).await;
    }
    for id in VOTERS {
        cluster.kill(id).await;
    }
    for id in VOTERS {
        cluster.start_voter(id).await;
    }
    cluster.propose(group(20)).await;
    let expected: Vec<Vec<u8>> = (0..21).map(group).collect();
    for id in VOTERS {
        assert_eq!(cluster.applied(id, 21).await, expected, "voter {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_cut_off_long_catches_up_from_a_snapshot_and_a_minority_commits_nothing() {
    let timing = Timing {
        snapshot_every: 10,
        keep_after_snapshot: 0,
        ..fast()
    };
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start(timing).await;
    let leader = cluster.leader(Duration::from_secs(10)).await;
    let lagging = VOTERS
        .iter()
        .copied()
        .find(|id| *id != leader.id())
        .unwrap();
    cluster.router.cut.lock().insert(lagging);
    for n in 0..40 {
        cluster.propose(group(n)).await;
    }
    let leader = cluster.leader(Duration::from_secs(10)).await;
    // The log before the snapshot is gone from the others' disks: the lagging voter
    // can only catch up by a snapshot.
    cluster.router.cut.lock().remove(&lagging);
    let expected: Vec<Vec<u8>> = (0..40).map(group).collect();
    assert_eq!(cluster.applied(lagging, 40).await, expected);
    assert_eq!(cluster.recorders[&lagging].1.load(Ordering::Relaxed), 1);

    // A leader cut off from both others commits nothing; the majority elects another
    // leader and goes on.
    let isolated = leader.id();
    cluster.router.cut.lock().insert(isolated);
    let stuck = tokio::time::timeout(Duration::from_secs(2), leader.propose(group(1000))).await;
    assert!(
        !matches!(stuck, Ok(Ok(_))),
        "an isolated leader committed: {stuck:?}"
    );
    let majority = cluster.leader(Duration::from_secs(10)).await;
    assert_ne!(majority.id(), isolated);
    cluster.propose(group(40)).await;
    cluster.router.cut.lock().remove(&isolated);
    // Whatever the isolated voter held uncommitted is replaced by the majority's log.
    let mut expected = expected;
    expected.push(group(40));
    drop((leader, majority));
    // A restarted voter rebuilds its state from the snapshot and the log after it.
    cluster.kill(isolated).await;
    cluster.start_voter(isolated).await;
    for id in VOTERS {
        assert_eq!(cluster.applied(id, 41).await, expected, "voter {id}");
    }
    assert_eq!(cluster.recorders[&isolated].1.load(Ordering::Relaxed), 1);
}
