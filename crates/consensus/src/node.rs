//! One voter: its Raft, its log and state machine on disk, and the calls a coordinator
//! makes (bootstrap, propose a group, who leads, answer a peer).

use crate::log_store::LogStore;
use crate::network::{self, Network};
use crate::state_machine::StateMachine;
use crate::{Applier, Carrier, Group, GroupLog, NodeId};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How quickly voters notice a silent leader, and how often they take snapshots.
#[derive(Debug, Clone)]
pub struct Timing {
    /// The leader's heartbeat to every follower.
    pub heartbeat: Duration,
    /// A follower that hears nothing for a random time in this range stands for
    /// election.
    pub election: (Duration, Duration),
    /// A snapshot is taken after this many entries since the last one, and the log
    /// before it is purged...
    pub snapshot_every: u64,
    /// ... except for this many entries, so that a follower briefly behind catches up
    /// from the log rather than from a snapshot.
    pub keep_after_snapshot: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(100),
            election: (Duration::from_millis(500), Duration::from_millis(1000)),
            snapshot_every: 10_000,
            keep_after_snapshot: 1_000,
        }
    }
}

/// Why a group was not committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposeError {
    /// This voter does not lead; `leader` is the one it knows of, by id and address.
    NotLeader { leader: Option<(NodeId, String)> },
    /// The leader could not commit it (it stopped, or lost its leadership before a
    /// majority had the group: the group may still commit under the next leader).
    Failed(String),
}

impl std::fmt::Display for ProposeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposeError::NotLeader {
                leader: Some((id, addr)),
            } => write!(f, "not the primary: voter {id} at {addr} is"),
            ProposeError::NotLeader { leader: None } => {
                write!(f, "not the primary, and no primary is elected yet")
            }
            ProposeError::Failed(why) => write!(f, "not committed: {why}"),
        }
    }
}

impl std::error::Error for ProposeError {}

/// One voter of the replicated log.
pub struct Voter {
    id: NodeId,
    raft: Raft<GroupLog>,
    log: LogStore,
}

impl Voter {
    /// Starts voter `id` on the log and snapshot in `dir`, applying committed groups to
    /// `applier` and reaching its peers through `carrier`.
    pub async fn start<A: Applier, Ca: Carrier>(
        id: NodeId,
        dir: &Path,
        applier: Arc<A>,
        carrier: Arc<Ca>,
        timing: Timing,
    ) -> Result<Self, String> {
        let config = Config {
            cluster_name: "gyre".into(),
            heartbeat_interval: timing.heartbeat.as_millis() as u64,
            election_timeout_min: timing.election.0.as_millis() as u64,
            election_timeout_max: timing.election.1.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(timing.snapshot_every),
            max_in_snapshot_log_to_keep: timing.keep_after_snapshot,
            ..Default::default()
        }
        .validate()
        .map_err(|e| format!("consensus timing: {e}"))?;
        let log = LogStore::open(dir)?;
        let machine = StateMachine::open(dir, applier)?;
        let raft = Raft::new(
            id,
            Arc::new(config),
            Network::new(carrier),
            log.clone(),
            machine,
        )
        .await
        .map_err(|e| format!("voter {id}: {e}"))?;
        Ok(Self { id, raft, log })
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Makes `voters` (id and address each) the voting members, if no voter has been
    /// told yet; every voter may be given the same list at its first start.
    pub async fn bootstrap(&self, voters: &[(NodeId, String)]) -> Result<(), String> {
        if self
            .raft
            .is_initialized()
            .await
            .map_err(|e| e.to_string())?
        {
            return Ok(());
        }
        let members: BTreeMap<NodeId, BasicNode> = voters
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(format!("voter {}: bootstrap: {e}", self.id)),
        }
    }

    /// Commits `group`: returns its log index once a majority of the voters has it on
    /// disk and this voter applied it.
    pub async fn propose(&self, group: Vec<u8>) -> Result<u64, ProposeError> {
        match self.raft.client_write(Group(group)).await {
            Ok(written) => Ok(written.log_id.index),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(ProposeError::NotLeader {
                    leader: forward
                        .leader_id
                        .zip(forward.leader_node.map(|node| node.addr)),
                })
            }
            Err(e) => Err(ProposeError::Failed(e.to_string())),
        }
    }

    /// Confirms that this voter still leads: a majority answered its heartbeat after
    /// the call began, and its state machine applied every entry committed before
    /// (Raft's read index, section 8 of the Raft paper). A leader cut off from the
    /// others fails here instead of serving a stale read.
    pub async fn confirm_lead(&self) -> Result<(), String> {
        self.raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(|e| format!("voter {}: {e}", self.id))
    }

    /// The leader this voter knows of, by id and address.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let id = metrics.current_leader?;
        let node = metrics.membership_config.membership().get_node(&id)?;
        Some((id, node.addr.clone()))
    }

    /// Whether this voter leads now.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Changes of this voter's view: its state, the leader, the log indexes.
    pub fn metrics(&self) -> watch::Receiver<RaftMetrics<NodeId, BasicNode>> {
        self.raft.metrics()
    }

    /// Waits until some voter leads, as far as this one knows, and returns it.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<(NodeId, String), String> {
        let mut metrics = self.raft.metrics();
        let wait = async {
            loop {
                if let Some(leader) = self.leader() {
                    return Ok(leader);
                }
                if metrics.changed().await.is_err() {
                    return Err(format!("voter {} stopped", self.id));
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| format!("no primary was elected within {timeout:?}"))?
    }

    /// Answers a request another voter sent through its carrier.
    pub async fn answer(&self, request: &[u8]) -> Result<Vec<u8>, String> {
        network::answer(&self.raft, request).await
    }

    /// The size of the log file on disk.
    pub fn log_bytes(&self) -> u64 {
        self.log.file_bytes()
    }

    /// The Raft node itself, for what the calls above do not cover.
    pub fn raft(&self) -> &Raft<GroupLog> {
        &self.raft
    }

    /// Stops this voter; its log stays on disk.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("voter {}: shutdown: {e}", self.id);
        }
    }
}
