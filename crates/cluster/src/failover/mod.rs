//! Coordinators that vote on the primary (ScyPer's high availability, Rödiger's
//! thesis, chapter 5: secondaries notice a failed primary and elect a new one, which
//! goes on from the durable log).
//!
//! Each of the voters (`gyre coordinator --voters ...`, three or five) runs a Raft
//! voter ([`gyre_consensus`]) whose log is the primary's redo log, one entry per
//! write of the log (a group commit), and keeps a *committed store*: a row store that
//! replays every committed entry, exactly what a majority has on disk. A voter is
//!
//! - **standby** while another voter leads: its client port refuses every call with
//!   the primary's address ([`redirect`]), and its committed store follows the log;
//! - **primary** once elected: it waits until every entry of earlier terms is applied
//!   (a group of its own committed), copies its committed store into a new row store,
//!   and starts the coordinator on it. A commit is acknowledged once Raft has its
//!   group on a majority ([`gyre_replica::Database::replicate`]); the workers, told by
//!   the others where the primary is, register with it and receive the transactional
//!   tables through the log feed.
//!
//! Before a read takes its snapshot, the primary confirms that a majority still
//! follows it (Raft's read index, [`gyre_replica::Database::confirm_reads`]): a
//! primary cut off from the other voters serves no stale state while another one,
//! elected without it, commits.
//!
//! A primary that loses the lead (a higher term, or no majority within
//! [`REPLICATION_WAIT`] for a commit or a read's confirmation) stops its coordinator
//! and starts over as a standby with a fresh committed store, rebuilt from its Raft
//! snapshot and log: what it executed but never got committed is gone with the old
//! store.
//!
//! Raft snapshots are taken of the committed store, never of the primary's own, which
//! holds transactions not yet committed.

pub mod carrier;
pub mod redirect;

use crate::coordinator::{Coordinator, CoordinatorConfig};
use crate::flight_sql::FrontDoor;
use carrier::{TcpCarrier, VoterSlot};
use datafusion::error::{DataFusionError, Result};
use gyre_consensus::{Applier, NodeId, Timing, Voter};
use gyre_replica::Database;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long a commit waits for a majority before the primary gives up the lead.
pub const REPLICATION_WAIT: Duration = Duration::from_secs(5);

/// One voting coordinator's addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoterAddrs {
    /// Where clients and workers reach it (its `--listen`).
    pub client: String,
    /// Where the other voters send it Raft's requests.
    pub raft: SocketAddr,
}

/// The voting coordinators, as every one of them is told.
#[derive(Debug, Clone)]
pub struct Voters {
    /// This coordinator: its place in `members`, from 1.
    pub me: NodeId,
    /// In the same order on every voter.
    pub members: Vec<VoterAddrs>,
    /// Raft's log and snapshots.
    pub dir: PathBuf,
    pub timing: Timing,
}

impl Voters {
    /// Parses `--voters` (`CLIENT/RAFT,...`: each voter's client and Raft addresses)
    /// and finds this coordinator in it by its client address `listen`.
    pub fn parse(list: &str, listen: SocketAddr, data_dir: &Path) -> Result<Self, String> {
        let mut members = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (client, raft) = item.split_once('/').ok_or_else(|| {
                format!("voter {item}: expected CLIENT_ADDR/RAFT_ADDR (host:port/host:port)")
            })?;
            let raft = raft
                .parse()
                .map_err(|e| format!("voter {item}: the Raft address {raft}: {e}"))?;
            members.push(VoterAddrs {
                client: client.to_string(),
                raft,
            });
        }
        if members.len() < 3 || members.len() % 2 == 0 {
            return Err(format!(
                "{} voters: give an odd number, at least 3 (a majority must survive a loss)",
                members.len()
            ));
        }
        let me = members
            .iter()
            .position(|m| {
                m.client.parse::<SocketAddr>().is_ok_and(|a| a == listen)
                    || (listen.ip().is_unspecified()
                        && m.client.rsplit(':').next() == Some(&listen.port().to_string()))
            })
            .ok_or_else(|| format!("--listen {listen} is none of the voters' client addresses"))?;
        Ok(Self {
            me: me as NodeId + 1,
            members,
            dir: data_dir.join("raft"),
            timing: Timing::default(),
        })
    }

    fn client_addrs(&self) -> Vec<(NodeId, String)> {
        (1..)
            .zip(&self.members)
            .map(|(id, m)| (id, m.client.clone()))
            .collect()
    }

    fn raft_addrs(&self) -> HashMap<NodeId, SocketAddr> {
        (1..)
            .zip(&self.members)
            .map(|(id, m)| (id, m.raft))
            .collect()
    }
}

/// What a voter is now, for whoever watches (`gyre coordinator` prints it).
#[derive(Debug, Clone)]
pub enum Role {
    Standby,
    Primary(Arc<Coordinator>),
}

/// The committed store as Raft's state machine sees it.
struct Committed(Arc<Database>);

impl Applier for Committed {
    fn apply(&self, _index: u64, group: &[u8]) -> Result<(), String> {
        self.0
            .apply_replicated(group)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        self.0.state_bytes().map_err(|e| e.to_string())
    }

    fn restore(&self, snapshot: &[u8]) -> Result<(), String> {
        self.0
            .restore(bytes::Bytes::copy_from_slice(snapshot))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Binds `addr`, waiting a little if the port is still held (by this process's
/// server that is closing, when the role changes).
async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            bound => return bound,
        }
    }
}

fn internal(what: &str, e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("{what}: {e}"))
}

/// Runs `work`, a Raft call the primary needs to stay primary (a commit, a read's lead
/// check), on `runtime` and waits for it on this thread's own clock: the log thread
/// and the readers' blocking threads call this, and a runtime whose threads are all
/// busy (waiting for this very commit, say) then fails the call after
/// [`REPLICATION_WAIT`] instead of hanging it. A failure tells `lost` why the lead is
/// lost.
fn lead_call(
    runtime: &tokio::runtime::Handle,
    lost: &tokio::sync::watch::Sender<Option<String>>,
    work: impl std::future::Future<Output = std::result::Result<(), String>> + Send + 'static,
) -> std::result::Result<(), String> {
    let (done, finished) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = done.send(work.await);
    });
    let result = match finished.recv_timeout(REPLICATION_WAIT) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "no majority of the voters answered within {REPLICATION_WAIT:?}"
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err("the coordinator stopped while the call ran".to_string())
        }
    };
    result.inspect_err(|why| {
        lost.send_replace(Some(why.clone()));
    })
}

/// Runs a voting coordinator for as long as the process lives: standby or primary, as
/// the voters decide. `changed` sees each role taken.
pub async fn run(
    config: CoordinatorConfig,
    front: FrontDoor,
    voters: Voters,
    mut changed: impl FnMut(&Role),
) -> Result<()> {
    let key = crate::auth::NodeKey::from_secret(&config.transport.secret);
    let me = voters.me;
    let slot = VoterSlot::default();
    let raft_addr = voters.members[me as usize - 1].raft;
    carrier::serve(bind(raft_addr).await?, slot.clone(), key.clone(), me);
    let carrier = Arc::new(TcpCarrier::new(me, key, voters.raft_addrs()));
    loop {
        let committed = config.primary.open_standby()?;
        let voter = Arc::new(
            Voter::start(
                me,
                &voters.dir,
                Arc::new(Committed(committed.clone())),
                carrier.clone(),
                voters.timing.clone(),
            )
            .await
            .map_err(|e| internal("consensus", e))?,
        );
        *slot.write() = Some(voter.clone());
        voter
            .bootstrap(&voters.client_addrs())
            .await
            .map_err(|e| internal("consensus", e))?;
        let named = voter.clone();
        let primary: redirect::PrimaryName = Arc::new(move || named.leader().map(|(_, a)| a));
        let standby = redirect::serve(config.listen, front.tls.as_ref(), primary).await?;
        changed(&Role::Standby);
        tracing::info!(voter = me, "standing by");

        let led = lead(&config, &front, &voter, &committed, standby, &mut changed).await;
        if let Err(e) = led {
            tracing::warn!(voter = me, "{e}");
        }
        *slot.write() = None;
        voter.shutdown().await;
        tracing::info!(
            voter = me,
            "standing by again, on a store rebuilt from the log"
        );
    }
}

/// Waits until this voter leads, then serves as the primary until it no longer does.
/// Returns why it stopped.
async fn lead(
    config: &CoordinatorConfig,
    front: &FrontDoor,
    voter: &Arc<Voter>,
    committed: &Arc<Database>,
    standby: redirect::Serving,
    changed: &mut impl FnMut(&Role),
) -> Result<()> {
    let mut metrics = voter.metrics();
    let elected = metrics
        .wait_for(|m| m.state == gyre_consensus::ServerState::Leader)
        .await
        .map(|_| ())
        .map_err(|_| internal("consensus", "the voter stopped"));
    // Entries of earlier terms are applied once one of this term commits.
    let caught_up = match elected {
        Ok(()) => voter
            .propose(Vec::new())
            .await
            .map(|_| ())
            .map_err(|e| internal("elected, but the first commit failed", e)),
        Err(e) => Err(e),
    };
    // The client port is closed until the coordinator serves it (clients retry).
    standby.stop().await;
    caught_up?;
    let primary = config.primary.open_standby()?;
    let state = committed
        .state_bytes()
        .map_err(|e| internal("copying the committed store", e))?;
    primary
        .restore(state.into())
        .map_err(|e| internal("copying the committed store", e))?;
    let (lost, mut lost_rx) = tokio::sync::watch::channel(None::<String>);
    let lost = Arc::new(lost);
    let runtime = tokio::runtime::Handle::current();
    let (replicating, on_runtime, losing) = (voter.clone(), runtime.clone(), lost.clone());
    primary
        .replicate(Box::new(move |frames| {
            let (voter, frames) = (replicating.clone(), frames.to_vec());
            lead_call(&on_runtime, &losing, async move {
                voter
                    .propose(frames)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        }))
        .map_err(|e| internal("replication", e))?;
    let checking = voter.clone();
    primary.confirm_reads(Box::new(move || {
        let voter = checking.clone();
        lead_call(&runtime, &lost, async move { voter.confirm_lead().await })
    }));
    let coordinator = Coordinator::start_with(config.clone(), primary).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    crate::flight_sql::serve_until(
        coordinator.clone(),
        bind(config.listen).await?,
        front,
        async {
            let _ = stopped.await;
        },
    )?;
    changed(&Role::Primary(coordinator.clone()));
    tracing::info!(voter = voter.id(), "primary");
    let why = tokio::select! {
        _ = metrics.wait_for(|m| m.state != gyre_consensus::ServerState::Leader) => {
            "another voter leads now".to_string()
        }
        lost = lost_rx.wait_for(Option::is_some) => {
            lost.map(|l| l.clone().unwrap_or_default()).unwrap_or_default()
        }
    };
    let _ = stop.send(());
    coordinator.shutdown();
    Err(internal("no longer the primary", why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voters_are_parsed_and_this_one_found() {
        let list = "127.0.0.1:50050/127.0.0.1:50060, 127.0.0.1:50051/127.0.0.1:50061,\
                    127.0.0.1:50052/127.0.0.1:50062";
        let dir = Path::new("/data");
        let v = Voters::parse(list, "127.0.0.1:50051".parse().unwrap(), dir).unwrap();
        assert_eq!(v.me, 2);
        assert_eq!(v.members[2].raft, "127.0.0.1:50062".parse().unwrap());
        assert_eq!(v.dir, dir.join("raft"));
        assert_eq!(v.client_addrs()[0], (1, "127.0.0.1:50050".to_string()));
        // Listening on every interface: found by its port.
        let v = Voters::parse(list, "0.0.0.0:50052".parse().unwrap(), dir).unwrap();
        assert_eq!(v.me, 3);
        for (list, listen, why) in [
            (list, "127.0.0.1:1", "none of the voters"),
            (
                "a:1/127.0.0.1:2,b:1/127.0.0.1:3",
                "127.0.0.1:1",
                "odd number",
            ),
            ("a:1,b:1,c:1", "127.0.0.1:1", "CLIENT_ADDR/RAFT_ADDR"),
            ("a:1/x,b:1/y,c:1/z", "127.0.0.1:1", "the Raft address"),
        ] {
            let e = Voters::parse(list, listen.parse().unwrap(), dir).unwrap_err();
            assert!(e.contains(why), "{list}: {e}");
        }
    }
}
