//! An embedded cluster: a coordinator and `n` workers in one process, each
//! worker with its own memory and thread pool. Their control messages go over
//! loopback TCP exactly as separate hosts' would, and so do their queries'
//! exchanges unless a session sets `gyre.shuffle_design` to one of the
//! shared-memory carrier's designs ([`crate::host_shuffle`]; not with
//! [`Limits::tcp_exchanges`]).

use crate::coordinator::{Coordinator, CoordinatorConfig};
use crate::files::LocalFiles;
use crate::flight_sql::{FrontDoor, serve, serve_control};
use crate::worker::{Worker, WorkerConfig};
use datafusion::common::{DataFusionError, Result};
use gyre_transport::TransportConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A running embedded cluster. Dropping it stops the workers.
pub struct LocalCluster {
    pub coordinator: Arc<Coordinator>,
    /// Where Flight SQL clients connect.
    pub addr: SocketAddr,
    /// Where its workers send their control messages (loopback, no TLS).
    control_addr: SocketAddr,
    /// The cluster secret, random for each embedded cluster.
    secret: String,
    /// Each worker's memory pool.
    worker_memory: Option<usize>,
    /// The local files every node may touch.
    local_files: LocalFiles,
    /// Whether the data links between its nodes are sealed.
    encrypt_links: bool,
    /// The stored procedures its workers replay, and the log's multicast group.
    procedures: gyre_replica::Procedures,
    log_multicast: Option<gyre_replica::ship::Group>,
    host_shuffle: Option<Arc<crate::host_shuffle::HostShuffle>>,
    workers: Vec<(Arc<Worker>, Option<tokio::runtime::Runtime>)>,
}

/// What an embedded cluster lets its queries use, and how its nodes talk.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// At most this many queries run at once; the others wait their turn.
    pub max_concurrent_queries: Option<usize>,
    /// Bytes of operator state each worker's queries may hold.
    pub worker_memory: Option<usize>,
    /// The local files statements and plans may read and write, on every node.
    pub local_files: LocalFiles,
    /// Seal the data links between the nodes (see `gyre_transport::seal`).
    pub encrypt_links: bool,
    /// The transactional tables: where they are kept (`--data-dir`), how they are
    /// logged, the stored procedures.
    pub primary: crate::coordinator::PrimaryConfig,
    /// Exchange over loopback TCP only: no shared-memory carrier to choose.
    pub tcp_exchanges: bool,
    /// The carrier of the designs sessions may choose.
    pub host_carrier: crate::host_shuffle::HostCarrier,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("addr", &self.addr)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl LocalCluster {
    /// Starts a coordinator listening on `listen` (port 0: any free port) and `workers`
    /// workers with `threads` threads each; anyone who reaches `listen` may run SQL.
    pub async fn start(workers: usize, threads: usize, listen: SocketAddr) -> Result<Self> {
        Self::start_with(workers, threads, listen, &FrontDoor::default()).await
    }

    /// As [`Self::start`], with clients admitted by `front` (users, TLS).
    pub async fn start_with(
        workers: usize,
        threads: usize,
        listen: SocketAddr,
        front: &FrontDoor,
    ) -> Result<Self> {
        Self::start_limited(workers, threads, listen, front, &Limits::default()).await
    }

    /// As [`Self::start_with`], with the queries' resources bounded by `limits`.
    pub async fn start_limited(
        workers: usize,
        threads: usize,
        listen: SocketAddr,
        front: &FrontDoor,
        limits: &Limits,
    ) -> Result<Self> {
        // Nothing outside this process needs the secret: a random one per cluster.
        let secret = format!("{:032x}", rand::random::<u128>());
        let host_shuffle = match limits.tcp_exchanges {
            true => None,
            false => Some(crate::host_shuffle::HostShuffle::over(
                limits.host_carrier.clone(),
            )?),
        };
        let config = CoordinatorConfig {
            host_shuffle: host_shuffle.clone(),
            listen,
            transport: TransportConfig {
                secret: secret.clone(),
                encrypt_links: limits.encrypt_links,
                ..Default::default()
            },
            max_concurrent_queries: limits.max_concurrent_queries,
            local_files: limits.local_files.clone(),
            primary: limits.primary.clone(),
            ..Default::default()
        };
        let coordinator = Coordinator::start(config).await?;
        // Its workers register through a control port of their own: statements wait for them.
        coordinator.expect_workers(workers);
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = serve(Arc::clone(&coordinator), listener, front)?;
        let control = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let control_addr = serve_control(Arc::clone(&coordinator), control)?;
        let mut cluster = Self {
            coordinator,
            addr,
            control_addr,
            secret,
            worker_memory: limits.worker_memory,
            local_files: limits.local_files.clone(),
            encrypt_links: limits.encrypt_links,
            procedures: limits.primary.procedures.clone(),
            log_multicast: limits.primary.log_multicast,
            host_shuffle,
            workers: Vec::with_capacity(workers),
        };
        for _ in 0..workers {
            cluster.start_worker(threads).await?;
        }
        cluster
            .coordinator
            .wait_for_workers(workers, Duration::from_secs(10))
            .await?;
        Ok(cluster)
    }

    /// Starts one more worker with `threads` threads; it registers with the
    /// coordinator as a worker on another host would.
    pub async fn start_worker(&mut self, threads: usize) -> Result<Arc<Worker>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(format!("gyre-worker-{}", self.workers.len() + 1))
            .enable_all()
            .build()?;
        let cfg = WorkerConfig {
            coordinator: self.control_addr.to_string(),
            listen: "127.0.0.1:0".parse().unwrap(),
            data_listen: "127.0.0.1:0".parse().unwrap(),
            advertise_host: None,
            transport: TransportConfig {
                secret: self.secret.clone(),
                encrypt_links: self.encrypt_links,
                ..Default::default()
            },
            coordinator_ca: None,
            memory_limit: self.worker_memory,
            local_files: self.local_files.clone(),
            procedures: self.procedures.clone(),
            log_multicast: self.log_multicast,
            host_shuffle: self.host_shuffle.clone(),
        };
        let worker = rt
            .spawn(Worker::start(cfg))
            .await
            .map_err(|e| DataFusionError::Execution(format!("worker start panicked: {e}")))??;
        self.workers.push((Arc::clone(&worker), Some(rt)));
        Ok(worker)
    }

    pub fn workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.workers.iter().map(|(w, _)| w)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // The coordinator first, so that the workers leaving is not taken for failures.
        self.coordinator.shutdown();
        for (w, rt) in &mut self.workers {
            w.shutdown();
            if let Some(rt) = rt.take() {
                rt.shutdown_background();
            }
        }
    }
}
