//! Exchanges between the nodes of one process over the shared-memory carrier
//! (`gyre local`): the RDMA-aware shuffle paper's endpoint designs at memory
//! speed, instead of TCP over loopback.
//!
//! A [`HostShuffle`] is what the nodes share: the directory of their segments
//! (on tmpfs) and the connector that brings the two sides of each stream
//! together, in memory. Each node opens its own carrier once it knows its id
//! ([`HostShuffle::node`]) and picks, per query, the transport of the design
//! the query names (`SET gyre.shuffle_design`). Nodes in other processes
//! cannot join: their streams would need a connector across processes,
//! which is not built, so such clusters exchange over TCP.

use datafusion::common::{DataFusionError, Result};
use gyre_planner::GyreOptions;
use gyre_transport::design::{Design, DesignTransport, LocalConnector};
use gyre_transport::shm::{ShmCarrier, ShmConfig, ShmParams};
use gyre_transport::{NodeId, Transport};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The shared-memory segments and stream connector of one process's nodes.
pub struct HostShuffle {
    dir: std::path::PathBuf,
    connector: Arc<LocalConnector>,
}

impl Drop for HostShuffle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl std::fmt::Debug for HostShuffle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostShuffle")
            .field("dir", &self.dir)
            .finish()
    }
}

impl HostShuffle {
    /// A directory for the segments, on /dev/shm where it has room (those of
    /// killed runs are removed).
    pub fn new() -> Result<Arc<Self>> {
        let dir = gyre_transport::shm::process_dir("gyre-local").map_err(|e| {
            DataFusionError::Execution(format!(
                "a shared-memory directory under {}: {e}",
                gyre_transport::shm::base_dir().display()
            ))
        })?;
        Ok(Arc::new(Self {
            dir,
            connector: LocalConnector::new(),
        }))
    }

    /// Opens `node`'s carrier.
    pub fn node(&self, node: NodeId) -> Result<NodeShuffle> {
        let config = ShmConfig {
            dir: self.dir.clone(),
            params: ShmParams::for_queries(),
        };
        let carrier = ShmCarrier::open(node, &config).map_err(|e| {
            DataFusionError::Execution(format!(
                "the shared-memory carrier of {}: {e}",
                gyre_transport::node_name(node)
            ))
        })?;
        Ok(NodeShuffle {
            carrier: Arc::new(carrier),
            connector: Arc::clone(&self.connector),
            transports: Mutex::new(HashMap::new()),
        })
    }
}

/// One node's side of a [`HostShuffle`]: a transport per design.
pub struct NodeShuffle {
    carrier: Arc<ShmCarrier>,
    connector: Arc<LocalConnector>,
    transports: Mutex<HashMap<Design, Arc<DesignTransport>>>,
}

impl std::fmt::Debug for NodeShuffle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeShuffle")
            .field("carrier", &self.carrier)
            .finish()
    }
}

impl NodeShuffle {
    /// The transport of `design` (not `tcp`).
    pub fn transport(&self, design: Design) -> Result<Arc<DesignTransport>> {
        if let Some(t) = self.transports.lock().get(&design) {
            return Ok(Arc::clone(t));
        }
        let t = DesignTransport::new(
            design,
            Arc::clone(&self.carrier) as _,
            Arc::clone(&self.connector) as _,
        )
        .map_err(|e| DataFusionError::Execution(e.to_string()))?;
        let t = Arc::new(t);
        self.transports.lock().insert(design, Arc::clone(&t));
        Ok(t)
    }

    /// Bytes and messages its designs moved to and from other nodes.
    pub fn traffic(&self) -> Traffic {
        let mut total = Traffic::default();
        for t in self.transports.lock().values() {
            let s = t.stats();
            total.bytes_sent += s.bytes_sent;
            total.bytes_received += s.bytes_received;
        }
        total
    }

    /// Tells every design's waiting streams of `query` that it is over.
    pub fn release_query(&self, query: u64) {
        use gyre_transport::design::Connector;
        self.connector.release(query);
    }
}

/// Bytes a node's exchanges moved to and from other nodes, over every transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl Traffic {
    /// A node's traffic: its TCP transport's and its designs'.
    pub fn of(tcp: &dyn Transport, host: Option<&NodeShuffle>) -> Self {
        let s = tcp.stats();
        let shm = host.map(NodeShuffle::traffic).unwrap_or_default();
        Self {
            bytes_sent: s.bytes_sent + shm.bytes_sent,
            bytes_received: s.bytes_received + shm.bytes_received,
        }
    }
}

/// The design a query's exchanges use: the session's `gyre.shuffle_design`
/// (`auto`: tcp), refused where this node shares no host memory with the others.
pub fn design_of(options: &GyreOptions, host: Option<&NodeShuffle>) -> Result<Design> {
    match (options.shuffle_design, host) {
        (None, _) => Ok(Design::Tcp),
        (Some(d), _) if d == Design::Tcp => Ok(d),
        (Some(d), Some(_)) => Ok(d),
        (Some(d), None) => Err(needs_host(d)),
    }
}

fn needs_host(d: Design) -> DataFusionError {
    DataFusionError::Plan(format!(
        "gyre.shuffle_design = '{d}' needs every node of the query in one process \
         sharing this host's memory (gyre local); this cluster's nodes exchange over tcp"
    ))
}

/// The transport a query of `design` uses on a node whose TCP transport is `tcp`.
pub fn transport_for(
    design: Design,
    tcp: Arc<dyn Transport>,
    host: Option<&NodeShuffle>,
) -> Result<Arc<dyn Transport>> {
    match (design, host) {
        (Design::Tcp, _) => Ok(tcp),
        (d, Some(h)) => Ok(h.transport(d)? as Arc<dyn Transport>),
        (d, None) => Err(needs_host(d)),
    }
}
