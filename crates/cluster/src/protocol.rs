//! Control messages between the coordinator and the workers.
//!
//! They travel as Arrow Flight `DoAction` calls of type [`ACTION`] whose body
//! is a postcard-encoded [`Request`] and whose single result is a [`Response`].
//! Data never goes this way; it moves through the transport.

use crate::storage::PartStats;
use arrow_flight::Action;
use arrow_flight::flight_service_client::FlightServiceClient;
use datafusion::common::{DataFusionError, Result};
use futures::StreamExt;
use gyre_transport::NodeId;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tonic::transport::Channel;

/// The Flight action type of Gyre's control messages.
pub const ACTION: &str = "gyre.control";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Worker to coordinator: join the cluster.
    Register {
        control_addr: String,
        data_addr: String,
    },
    /// Worker to coordinator: still alive.
    Heartbeat {
        node: NodeId,
    },
    /// Worker to coordinator: a stage of a query failed.
    QueryFailed {
        query: u64,
        node: NodeId,
        error: String,
    },
    /// Coordinator to worker: the data addresses of every node.
    SetPeers {
        peers: Vec<(NodeId, String)>,
    },
    /// Coordinator to worker: run these stage plans of a query.
    StartQuery {
        query: u64,
        workers: Vec<NodeId>,
        stages: Vec<(usize, Vec<u8>)>,
        compression: Option<String>,
    },
    /// Coordinator to worker: the query is over; stop its tasks and commit or discard its inserts.
    FinishQuery {
        query: u64,
        commit: bool,
        metrics: bool,
    },
    CreateTable {
        name: String,
        schema: Vec<u8>,
    },
    DropTable {
        name: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    Ok,
    Registered {
        node: NodeId,
    },
    Finished {
        /// Per stage: the stage's plan rendered with this worker's metrics.
        stages: Vec<(usize, String)>,
        /// New sizes of the tables this query inserted into.
        tables: Vec<(String, PartStats)>,
    },
}

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("control messages serialise")
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    postcard::from_bytes(bytes)
        .map_err(|e| DataFusionError::Execution(format!("malformed control message: {e}")))
}

/// A connection to a node's control service.
#[derive(Debug, Clone)]
pub struct ControlClient {
    addr: String,
    client: FlightServiceClient<Channel>,
}

impl ControlClient {
    pub fn connect_lazy(addr: &str) -> Result<Self> {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .map_err(|e| DataFusionError::Configuration(format!("bad address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self {
            addr: addr.to_string(),
            client: FlightServiceClient::new(channel)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends one request and waits for its response.
    pub async fn call(&self, req: &Request) -> Result<Response> {
        let action = Action {
            r#type: ACTION.to_string(),
            body: encode(req).into(),
        };
        let mut client = self.client.clone();
        let mut stream = client
            .do_action(action)
            .await
            .map_err(|s| status_error(&self.addr, s))?
            .into_inner();
        let first = stream
            .next()
            .await
            .ok_or_else(|| DataFusionError::Execution(format!("{}: empty reply", self.addr)))?
            .map_err(|s| status_error(&self.addr, s))?;
        decode(&first.body)
    }
}

fn status_error(addr: &str, s: tonic::Status) -> DataFusionError {
    DataFusionError::Execution(format!("{addr}: {}", s.message()))
}
