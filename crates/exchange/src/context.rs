//! Per-query state that exchange operators find in the task context.

use crate::codec::Compression;
use crate::sender::transport_err;
use datafusion::common::{Result, internal_datafusion_err};
use datafusion::execution::TaskContext;
use gyre_transport::{COORDINATOR, NodeId, SendEndpoint, SendSpec, Transport};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Numbers the exchanges of one query.
pub type ExchangeId = u32;

/// Where the partitions of a stage run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Placement {
    /// Partition `i` runs on the `i`-th worker of the query.
    Workers,
    /// Every partition runs on the coordinator.
    Coordinator,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Workers => write!(f, "workers"),
            Self::Coordinator => write!(f, "coordinator"),
        }
    }
}

/// What an exchange operator needs at run time, attached to the session config
/// of the task that executes a fragment.
#[derive(Debug)]
pub struct QueryContext {
    pub query_id: u64,
    pub transport: Arc<dyn Transport>,
    /// The node that runs partition `i` of a worker stage.
    pub workers: Vec<NodeId>,
    /// Arrow IPC buffer compression for data sent by this query (`auto` is resolved by
    /// each sender from its node's link rate).
    pub compression: Compression,
    /// The run-time filters of this query's stages on this node.
    pub runtime_filters: crate::runtime_filter::FilterSlots,
}

impl QueryContext {
    /// Finds the query context of a task.
    pub fn of(ctx: &TaskContext) -> Result<Arc<Self>> {
        ctx.session_config()
            .get_extension::<QueryContext>()
            .ok_or_else(|| internal_datafusion_err!("exchange executed outside of a Gyre query"))
    }

    /// The node that runs `partition` of a stage with the given placement.
    pub fn node_of(&self, placement: Placement, partition: usize) -> Result<NodeId> {
        match placement {
            Placement::Coordinator => Ok(COORDINATOR),
            Placement::Workers => self.workers.get(partition).copied().ok_or_else(|| {
                internal_datafusion_err!(
                    "partition {partition} has no worker ({} workers)",
                    self.workers.len()
                )
            }),
        }
    }

    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.transport.node_id()
    }

    /// The send endpoint of this query's `exchange` from sender slot `from` (the
    /// partition) to `destinations`.
    pub fn open_send(
        &self,
        exchange: ExchangeId,
        from: usize,
        destinations: Vec<NodeId>,
    ) -> Result<SendEndpoint> {
        self.transport
            .open_send(SendSpec {
                query: self.query_id,
                exchange,
                from: from as u32,
                destinations,
                groups: vec![],
            })
            .map_err(transport_err)
    }
}
