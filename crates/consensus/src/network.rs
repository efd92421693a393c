//! Raft's requests between voters, as bytes over a [`Carrier`].
//!
//! A request is a [`RaftRpc`] and its answer a [`RaftReply`], both postcard-encoded;
//! the carrier only moves bytes (in the cluster, over the signed control channel, which
//! also bounds their size). A voter that cannot be reached is `Unreachable` to Raft,
//! which backs off and tries again; an answer that does not decode is a network error.

use crate::{GroupLog, NodeId};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use serde::{Deserialize, Serialize};
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// How one voter's request reaches another.
#[async_trait::async_trait]
pub trait Carrier: Send + Sync + 'static {
    /// Sends `request` to voter `to` at `addr` and returns its answer, within
    /// `timeout`; the error says why there is none.
    async fn call(
        &self,
        to: NodeId,
        addr: &str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String>;
}

/// A request from one voter to another.
#[derive(Serialize, Deserialize)]
pub enum RaftRpc {
    Append(AppendEntriesRequest<GroupLog>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<GroupLog>),
}

/// The answer to a [`RaftRpc`].
#[derive(Serialize, Deserialize)]
pub enum RaftReply {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
}

/// Answers a request from another voter: decodes it (hostile bytes: an error, never a
/// panic), hands it to `raft`, encodes the answer.
pub async fn answer(raft: &Raft<GroupLog>, request: &[u8]) -> Result<Vec<u8>, String> {
    let request: RaftRpc = postcard::from_bytes(request)
        .map_err(|e| format!("a Raft request does not decode: {e}"))?;
    let reply = match request {
        RaftRpc::Append(rpc) => RaftReply::Append(raft.append_entries(rpc).await),
        RaftRpc::Vote(rpc) => RaftReply::Vote(raft.vote(rpc).await),
        RaftRpc::Snapshot(rpc) => RaftReply::Snapshot(raft.install_snapshot(rpc).await),
    };
    postcard::to_allocvec(&reply).map_err(|e| format!("a Raft answer does not encode: {e}"))
}

/// Raft's network: a [`Connection`] per peer over one carrier.
pub struct Network<Ca: Carrier> {
    carrier: Arc<Ca>,
}

impl<Ca: Carrier> Network<Ca> {
    pub fn new(carrier: Arc<Ca>) -> Self {
        Self { carrier }
    }
}

impl<Ca: Carrier> RaftNetworkFactory<GroupLog> for Network<Ca> {
    type Network = Connection<Ca>;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        Connection {
            carrier: self.carrier.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

/// The way to one peer.
pub struct Connection<Ca: Carrier> {
    carrier: Arc<Ca>,
    target: NodeId,
    addr: String,
}

/// Why a request got no usable answer, as Raft's error.
fn network_error<E: std::error::Error>(message: String) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&io::Error::other(message)))
}

impl<Ca: Carrier> Connection<Ca> {
    async fn call<E: std::error::Error>(
        &self,
        rpc: RaftRpc,
        option: &RPCOption,
    ) -> Result<RaftReply, RPCError<NodeId, BasicNode, E>> {
        let request = postcard::to_allocvec(&rpc)
            .map_err(|e| network_error(format!("a Raft request does not encode: {e}")))?;
        let answer = self
            .carrier
            .call(self.target, &self.addr, request, option.hard_ttl())
            .await
            .map_err(|e| {
                RPCError::Unreachable(Unreachable::new(&io::Error::other(format!(
                    "voter {} at {}: {e}",
                    self.target, self.addr
                ))))
            })?;
        postcard::from_bytes(&answer).map_err(|e| {
            network_error(format!(
                "voter {} at {}: its answer does not decode: {e}",
                self.target, self.addr
            ))
        })
    }

    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<NodeId, BasicNode, E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

fn mismatch<E: std::error::Error>(what: &str) -> RPCError<NodeId, BasicNode, E> {
    network_error(format!("a {what} request was answered with another kind"))
}

impl<Ca: Carrier> RaftNetwork<GroupLog> for Connection<Ca> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<GroupLog>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(RaftRpc::Append(rpc), &option).await? {
            RaftReply::Append(answer) => answer.map_err(|e| self.remote(e)),
            _ => Err(mismatch("append")),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<GroupLog>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self.call(RaftRpc::Snapshot(rpc), &option).await? {
            RaftReply::Snapshot(answer) => answer.map_err(|e| self.remote(e)),
            _ => Err(mismatch("snapshot")),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(RaftRpc::Vote(rpc), &option).await? {
            RaftReply::Vote(answer) => answer.map_err(|e| self.remote(e)),
            _ => Err(mismatch("vote")),
        }
    }
}
