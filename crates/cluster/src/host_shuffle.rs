//! Exchanges between the nodes of one process over a verbs carrier
//! (`gyre local`): the RDMA-aware shuffle paper's endpoint designs at memory
//! speed over the shared-memory carrier, instead of TCP over loopback, or
//! over an RDMA device (`gyre local --verbs`, built with the `verbs` feature).
//!
//! A [`HostShuffle`] is what the nodes share: the carrier they open (for
//! shared memory, the directory of their segments, on tmpfs) and the
//! connector that brings the two sides of each stream together, in memory.
//! Each node opens its own carrier once it knows its id
//! ([`HostShuffle::node`]) and picks, per query, the transport of the design
//! the query names (`SET gyre.shuffle_design`).
//!
//! Nodes in processes of their own on one host (`gyre coordinator` and
//! `gyre worker` with `--host-shuffle DIR`) share the directory instead: their
//! segments lie in it and their streams meet through files in it
//! (`DirConnector`). Each node tells the coordinator which host shuffle it
//! has ([`HostShuffle::id`]); a query may use a design only if all its nodes
//! have the coordinator's, and otherwise exchanges over TCP.

use datafusion::common::{DataFusionError, Result};
use gyre_planner::GyreOptions;
use gyre_transport::design::{Connector, Design, DesignTransport, DirConnector, LocalConnector};
use gyre_transport::shm::{ShmCarrier, ShmConfig, ShmParams};
use gyre_transport::verbs::Carrier;
use gyre_transport::{NodeId, Transport};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The carrier a process's nodes exchange over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HostCarrier {
    /// Segments in a directory on tmpfs.
    #[default]
    Shm,
    /// An RDMA device (`None`: the first); node `i` (0: the coordinator)
    /// uses `addresses[i]`, which must be one of the port's addresses.
    #[cfg(feature = "verbs")]
    Verbs {
        device: Option<String>,
        addresses: Vec<std::net::Ipv4Addr>,
    },
}

/// The carrier and stream connector of one process's nodes.
pub struct HostShuffle {
    carrier: HostCarrier,
    /// The shared-memory segments' directory.
    dir: Option<std::path::PathBuf>,
    /// Whether the directory is this process's alone (removed when it goes).
    owned: bool,
    connector: Arc<dyn Connector>,
    id: String,
}

impl Drop for HostShuffle {
    fn drop(&mut self) {
        if let (Some(dir), true) = (&self.dir, self.owned) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl std::fmt::Debug for HostShuffle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostShuffle")
            .field("carrier", &self.carrier)
            .field("dir", &self.dir)
            .finish()
    }
}

impl HostShuffle {
    /// The shared-memory carrier, its segments in a directory on /dev/shm
    /// where it has room (those of killed runs are removed).
    pub fn new() -> Result<Arc<Self>> {
        Self::over(HostCarrier::Shm)
    }

    /// The nodes' exchanges over `carrier`.
    pub fn over(carrier: HostCarrier) -> Result<Arc<Self>> {
        let dir = match carrier {
            HostCarrier::Shm => {
                Some(gyre_transport::shm::process_dir("gyre-local").map_err(|e| {
                    DataFusionError::Execution(format!(
                        "a shared-memory directory under {}: {e}",
                        gyre_transport::shm::base_dir().display()
                    ))
                })?)
            }
            #[cfg(feature = "verbs")]
            HostCarrier::Verbs { .. } => None,
        };
        let id = match &dir {
            Some(d) => d.display().to_string(),
            None => format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
        };
        Ok(Arc::new(Self {
            carrier,
            dir,
            owned: true,
            connector: LocalConnector::new(),
            id,
        }))
    }

    /// The shared-memory carrier of nodes in several processes of this host,
    /// which all name `dir`. The coordinator starts it `fresh`: offers and
    /// released queries of an earlier cluster go (query ids start again).
    pub fn shared(dir: &std::path::Path, fresh: bool) -> Result<Arc<Self>> {
        let failed = |e: std::io::Error| {
            DataFusionError::Execution(format!("the host shuffle directory {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(failed)?;
        let dir = dir.canonicalize().map_err(failed)?;
        let connector = DirConnector::new(dir.join("meet")).map_err(failed)?;
        if fresh {
            connector.clear().map_err(failed)?;
        }
        Ok(Arc::new(Self {
            carrier: HostCarrier::Shm,
            id: dir.display().to_string(),
            dir: Some(dir),
            owned: false,
            connector,
        }))
    }

    /// What nodes that share this host shuffle have in common: its directory,
    /// or an id of the process.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Opens `node`'s carrier.
    pub fn node(&self, node: NodeId) -> Result<NodeShuffle> {
        let failed = |e: &dyn std::fmt::Display| {
            DataFusionError::Execution(format!(
                "the {} carrier of {}: {e}",
                match self.carrier {
                    HostCarrier::Shm => "shared-memory",
                    #[cfg(feature = "verbs")]
                    HostCarrier::Verbs { .. } => "RDMA",
                },
                gyre_transport::node_name(node)
            ))
        };
        let carrier: Arc<dyn Carrier> = match &self.carrier {
            HostCarrier::Shm => {
                let config = ShmConfig {
                    dir: self.dir.clone().unwrap_or_default(),
                    params: ShmParams::for_queries(),
                };
                Arc::new(ShmCarrier::open(node, &config).map_err(|e| failed(&e))?)
            }
            #[cfg(feature = "verbs")]
            HostCarrier::Verbs { device, addresses } => {
                use gyre_transport::rdma::{RdmaCarrier, RdmaConfig, gid_of_ipv4};
                let gids = addresses
                    .iter()
                    .enumerate()
                    .map(|(i, ip)| (i as NodeId, gid_of_ipv4(*ip)))
                    .collect();
                if node as usize >= addresses.len() {
                    return Err(failed(&format!(
                        "{} addresses name the coordinator and {} workers",
                        addresses.len(),
                        addresses.len().saturating_sub(1)
                    )));
                }
                let mut config = RdmaConfig::new(gids);
                config.device = device.clone();
                Arc::new(RdmaCarrier::open(node, &config).map_err(|e| failed(&e))?)
            }
        };
        Ok(NodeShuffle {
            carrier,
            connector: Arc::clone(&self.connector),
            host: self.id.clone(),
            transports: Mutex::new(HashMap::new()),
        })
    }
}

/// One node's side of a [`HostShuffle`]: a transport per design.
pub struct NodeShuffle {
    carrier: Arc<dyn Carrier>,
    connector: Arc<dyn Connector>,
    /// The id of the host shuffle it belongs to.
    host: String,
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
            Arc::clone(&self.carrier),
            Arc::clone(&self.connector),
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
        self.connector.release(query);
    }

    /// The id of the host shuffle it belongs to ([`HostShuffle::id`]).
    pub fn host(&self) -> &str {
        &self.host
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
        "gyre.shuffle_design = '{d}' needs every node of the query on one host sharing its \
         memory (gyre local, or gyre coordinator and gyre worker with --host-shuffle DIR); \
         this node has no host shuffle, so this cluster's nodes exchange over tcp"
    ))
}

/// Refuses `design` (not tcp) for a query of `workers` unless each has the
/// coordinator's host shuffle `host` (`hosts`: what each worker registered with).
pub fn check_workers(
    design: Design,
    host: Option<&NodeShuffle>,
    workers: impl IntoIterator<Item = (NodeId, Option<String>)>,
) -> Result<()> {
    if design == Design::Tcp {
        return Ok(());
    }
    let host = host.ok_or_else(|| needs_host(design))?;
    for (node, theirs) in workers {
        if theirs.as_deref() != Some(host.host()) {
            return Err(DataFusionError::Plan(format!(
                "gyre.shuffle_design = '{design}' needs every node of the query on one host \
                 sharing its memory: {} {}, not the coordinator's ({}; start workers on its \
                 host with --host-shuffle naming its directory, or use tcp)",
                gyre_transport::node_name(node),
                match theirs {
                    Some(h) => format!("has host shuffle {h}"),
                    None => "has no host shuffle".to_string(),
                },
                host.host()
            )));
        }
    }
    Ok(())
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
