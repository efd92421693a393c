//! The ibverbs carrier: the [`crate::verbs`] seam over a real RDMA device
//! through rdma-core's libibverbs (cargo feature `verbs`), so the RDMA-aware
//! shuffle paper's eight designs run over reliable connected and unreliable
//! datagram queue pairs of an InfiniBand or RoCE NIC, or of soft-RoCE
//! (`rdma_rxe`), as the paper's do.
//!
//! What verbs leave to the application, and how this carrier fills it in:
//!
//! - Addresses are exchanged out of band. [`RdmaConfig::gids`] is the
//!   address book: every node's GID (on RoCE, its IP address as an IPv4-mapped
//!   GID). A queue pair connects to `(GID of node, queue pair number)` with a
//!   fixed starting packet sequence number; a datagram goes through an
//!   address handle made once per destination node.
//! - Regions are registered with an I/O virtual address of 0, so a peer
//!   addresses a region by its remote key and an offset, as the seam does
//!   (local scatter-gather entries name offsets too).
//! - A datagram receive gets 40 bytes in front of its buffer for the global
//!   route header, where the sender's address arrives (a GID, or on RoCE v2
//!   over IPv4 the IPv4 header); receives of a queue pair complete in the
//!   order posted, so a ring of such headers per queue pair serves them.
//!   The sender's node is looked up by its GID, so nodes sharing one device
//!   need one address (and GID) each.
//! - Completion events: one completion channel per carrier, watched by a
//!   thread that re-arms each queue and then wakes its waiters, so a waiter
//!   that polled nothing after enabling its wake-up never misses one.
//!
//! Semantics the designs rely on, as the shared-memory carrier's: a send
//! that finds no posted receive fails its queue pair (`rnr_retry` 0), and an
//! unsignaled request completes only if it fails. Small sends and writes go
//! inline, copied at the post, as the designs' staging slots expect.
//!
//! Tested on soft-RoCE only. Hardware providers differ in two ways the designs
//! would meet: mlx5 frees an unsignaled request's send-queue slot only when a
//! later completion is polled (rxe at once), so the receivers' credit writes
//! and the Read senders' notices, unsignaled on queues nobody polls, would
//! fill their send queues after `send_depth` posts; and its error completions
//! carry no opcode, which this carrier takes from the provider.

use crate::NodeId;
use crate::verbs::{
    Carrier, CarrierError, Completion, CompletionQueue, QpAddr, QpKind, QueuePair, RecvWr, Region,
    RegionOwner, SendOp, SendWr, Sge, WcOp, WcStatus,
};
use ibverbs_sys as ffi;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CStr;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::Notify;

/// A 16-byte global identifier: a node's address on the fabric.
pub type Gid = [u8; 16];

/// The IPv4-mapped GID of `ip` (RoCE v2).
pub fn gid_of_ipv4(ip: Ipv4Addr) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g
}

/// Parses an address book `1=10.0.2.15,2=10.0.2.16` (node ids and IPv4
/// addresses) into node GIDs.
pub fn parse_gids(s: &str) -> Result<HashMap<NodeId, Gid>, String> {
    let mut out = HashMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (node, ip) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' is not node=address"))?;
        let node: NodeId = node
            .trim()
            .parse()
            .map_err(|_| format!("'{node}' is not a node id"))?;
        let ip: Ipv4Addr = ip
            .trim()
            .parse()
            .map_err(|_| format!("'{ip}' is not an IPv4 address"))?;
        if out.insert(node, gid_of_ipv4(ip)).is_some() {
            return Err(format!("node {node} is named twice"));
        }
    }
    Ok(out)
}

/// Where the carrier runs and how peers are found.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// The device (`rxe0`, `mlx5_0`); the first one when `None`.
    pub device: Option<String>,
    /// The device's port (counted from 1).
    pub port: u8,
    /// Every node's GID, this node's included.
    pub gids: HashMap<NodeId, Gid>,
    /// Receives a queue pair holds posted at most.
    pub recv_depth: usize,
    /// Requests a queue pair's send queue holds at most.
    pub send_depth: usize,
}

impl RdmaConfig {
    pub fn new(gids: HashMap<NodeId, Gid>) -> Self {
        Self {
            device: None,
            port: 1,
            gids,
            recv_depth: 2048,
            send_depth: 4096,
        }
    }
}

/// Bytes of the global route header in front of a datagram.
const GRH: usize = 40;
/// The queue key every datagram queue pair of Gyre uses.
const QKEY: u32 = 0x4759_5245;
/// The starting packet sequence number of every reliable connection.
const PSN: u32 = 0x1000;
/// Bytes a send or write carries inline at most (asked of the device).
const INLINE: u32 = 256;

fn sys(what: &str) -> CarrierError {
    CarrierError::System(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// A registered region's local side.
struct Mr {
    mr: *mut ffi::ibv_mr,
    lkey: u32,
    addr: *mut u8,
    len: usize,
    mapped: usize,
}

/// What a completion needs of its queue pair.
struct QpMeta {
    kind: QpKind,
    send_cq: usize,
    recv_cq: usize,
    /// The connected peer (reliable queue pairs).
    remote: Mutex<Option<QpAddr>>,
    /// Datagram receives: a ring of route headers, one per posted receive.
    grh: Option<GrhRing>,
}

struct GrhRing {
    /// Choosing a slot, posting into it and counting it happen together.
    post: Mutex<()>,
    lkey: u32,
    base: *mut u8,
    depth: u64,
    posted: AtomicU64,
    completed: AtomicU64,
}

struct Device {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    channel: *mut ffi::ibv_comp_channel,
}

// SAFETY: libibverbs objects may be used from any thread.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}
unsafe impl Send for Mr {}
unsafe impl Sync for Mr {}
unsafe impl Send for GrhRing {}
unsafe impl Sync for GrhRing {}

struct Inner {
    dev: Device,
    node: NodeId,
    name: String,
    port: u8,
    sgid_index: u8,
    path_mtu: ffi::ibv_mtu,
    ud_mtu: usize,
    max_msg: usize,
    max_rd_atomic: u8,
    recv_depth: usize,
    send_depth: usize,
    gids: HashMap<NodeId, Gid>,
    nodes: HashMap<Gid, NodeId>,
    /// Addresses are IPv4-mapped GIDs (RoCE v2 over IPv4): datagrams come
    /// with an IPv4 header where a route header would be.
    ipv4: bool,
    regions: Mutex<HashMap<u32, Mr>>,
    qps: Mutex<HashMap<u32, Arc<QpMeta>>>,
    ahs: Mutex<HashMap<NodeId, usize>>,
    cqs: Arc<Mutex<HashMap<usize, Weak<RdmaCq>>>>,
    /// Dropped queue pairs and regions, destroyed once they have lingered.
    doomed: Arc<Mutex<Vec<(std::time::Instant, Doomed)>>>,
    stop: Arc<AtomicBool>,
    events: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How long a dropped queue pair or region outlives its owner: a device
/// carries posted requests after the post returns, so an endpoint's last
/// messages (its end-of-stream or error markers) would otherwise be lost
/// with it, as a socket's linger keeps a closed socket's last bytes going.
const LINGER: std::time::Duration = std::time::Duration::from_millis(1000);

/// Something dropped that the device may still be using.
enum Doomed {
    /// A queue pair, with the queues it completes to (which must outlive it).
    Qp {
        qp: usize,
        _cqs: [Arc<dyn CompletionQueue>; 2],
    },
    Mr(Mr),
}

impl Doomed {
    /// Destroys it now; returns the queues a queue pair kept (to be dropped
    /// after everything else: the last may take the carrier with it).
    fn destroy(self) -> Option<[Arc<dyn CompletionQueue>; 2]> {
        match self {
            Doomed::Qp { qp, _cqs } => {
                // SAFETY: created by `create_qp`; nothing posts to it any more.
                unsafe { ffi::ibv_destroy_qp(qp as *mut ffi::ibv_qp) };
                Some(_cqs)
            }
            Doomed::Mr(mr) => {
                // SAFETY: registered and mapped by `register`; nothing uses it any more.
                unsafe {
                    ffi::ibv_dereg_mr(mr.mr);
                    libc::munmap(mr.addr.cast(), mr.mapped);
                }
                None
            }
        }
    }
}

/// Destroys what has lingered long enough (everything with `all`).
fn reap(doomed: &Mutex<Vec<(std::time::Instant, Doomed)>>, all: bool) {
    let now = std::time::Instant::now();
    let due: Vec<Doomed> = {
        let mut d = doomed.lock();
        let (due, keep) = std::mem::take(&mut *d)
            .into_iter()
            .partition::<Vec<_>, _>(|(at, _)| all || *at <= now);
        *d = keep;
        due.into_iter().map(|(_, x)| x).collect()
    };
    // Queue pairs before regions and queues (which go with the queue pairs).
    let (qps, rest): (Vec<_>, Vec<_>) = due
        .into_iter()
        .partition(|d| matches!(d, Doomed::Qp { .. }));
    let queues: Vec<_> = qps
        .into_iter()
        .chain(rest)
        .filter_map(Doomed::destroy)
        .collect();
    drop(queues);
}

/// An RDMA device as a [`Carrier`].
#[derive(Clone)]
pub struct RdmaCarrier {
    inner: Arc<Inner>,
}

impl fmt::Debug for RdmaCarrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaCarrier")
            .field("node", &self.inner.node)
            .field("device", &self.inner.name)
            .field("gid_index", &self.inner.sgid_index)
            .finish()
    }
}

/// The device names libibverbs sees.
pub fn devices() -> Result<Vec<String>, CarrierError> {
    let mut n = 0;
    // SAFETY: the list is freed below; names are copied first.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(sys("listing RDMA devices"));
    }
    let names = (0..n.max(0) as usize)
        .map(|i| {
            // SAFETY: `n` entries.
            let name = unsafe { ffi::ibv_get_device_name(*list.add(i)) };
            // SAFETY: a NUL-terminated name owned by the list.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    // SAFETY: from ibv_get_device_list.
    unsafe { ffi::ibv_free_device_list(list) };
    Ok(names)
}

impl RdmaCarrier {
    /// Opens the device for `node`, whose GID must be in `config.gids` and on
    /// the device's port.
    pub fn open(node: NodeId, config: &RdmaConfig) -> Result<Self, CarrierError> {
        let own = *config.gids.get(&node).ok_or_else(|| {
            CarrierError::Invalid(format!(
                "the address book names no GID for {}",
                crate::node_name(node)
            ))
        })?;
        let mut nodes = HashMap::new();
        for (&n, &g) in &config.gids {
            if let Some(other) = nodes.insert(g, n) {
                return Err(CarrierError::Invalid(format!(
                    "nodes {other} and {n} have one GID: each node needs an address of its own"
                )));
            }
        }
        let mut n = 0;
        // SAFETY: freed before returning.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: from ibv_get_device_list.
                unsafe { ffi::ibv_free_device_list(list) };
            }
            return Err(CarrierError::System(format!(
                "no RDMA device ({})",
                std::io::Error::last_os_error()
            )));
        }
        let mut chosen = None;
        for i in 0..n as usize {
            // SAFETY: `n` entries, names NUL-terminated.
            let dev = unsafe { *list.add(i) };
            let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if config.device.as_ref().is_none_or(|d| *d == name) {
                chosen = Some((dev, name));
                break;
            }
        }
        let Some((dev, name)) = chosen else {
            // SAFETY: from ibv_get_device_list.
            unsafe { ffi::ibv_free_device_list(list) };
            return Err(CarrierError::Invalid(format!(
                "no RDMA device named {}",
                config.device.as_deref().unwrap_or("")
            )));
        };
        // SAFETY: a device of the list; the list may go once it is open.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        unsafe { ffi::ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(sys(&format!("opening {name}")));
        }
        let close = |ctx| {
            // SAFETY: opened above, nothing else made on it yet.
            unsafe { ffi::ibv_close_device(ctx) };
        };
        // SAFETY: plain queries into zeroed structs of the right type.
        let mut port: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        if unsafe { ffi::ibv_query_port(ctx, config.port, &mut port as *mut _ as *mut _) } != 0 {
            close(ctx);
            return Err(sys(&format!("querying port {} of {name}", config.port)));
        }
        let mut dattr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        if unsafe { ffi::ibv_query_device(ctx, &mut dattr) } != 0 {
            close(ctx);
            return Err(sys(&format!("querying {name}")));
        }
        if port.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
            close(ctx);
            return Err(CarrierError::System(format!(
                "port {} of {name} is not active (state {})",
                config.port, port.state
            )));
        }
        let sgid_index = match find_gid(ctx, &name, config.port, port.gid_tbl_len, &own) {
            Some(i) => i,
            None => {
                close(ctx);
                return Err(CarrierError::Invalid(format!(
                    "port {} of {name} has no GID {} (the address of {})",
                    config.port,
                    show_gid(&own),
                    crate::node_name(node)
                )));
            }
        };
        // SAFETY: the context is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            close(ctx);
            return Err(sys("allocating a protection domain"));
        }
        let channel = unsafe { ffi::ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            unsafe { ffi::ibv_dealloc_pd(pd) };
            close(ctx);
            return Err(sys("creating a completion channel"));
        }
        // SAFETY: the channel's descriptor; the event thread polls it.
        unsafe {
            let fd = (*channel).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let max_wr = dattr.max_qp_wr.max(1) as usize;
        let inner = Arc::new(Inner {
            dev: Device { ctx, pd, channel },
            node,
            name,
            port: config.port,
            sgid_index,
            path_mtu: port.active_mtu,
            ud_mtu: 128usize << port.active_mtu.clamp(1, 5),
            max_msg: (port.max_msg_sz as usize).max(1),
            max_rd_atomic: dattr.max_qp_rd_atom.clamp(1, 16) as u8,
            recv_depth: config.recv_depth.min(max_wr.saturating_sub(1)).max(1),
            send_depth: config.send_depth.min(max_wr).max(1),
            gids: config.gids.clone(),
            nodes,
            ipv4: own[..10].iter().all(|&b| b == 0) && own[10] == 0xff && own[11] == 0xff,
            regions: Mutex::default(),
            qps: Mutex::default(),
            ahs: Mutex::default(),
            cqs: Arc::default(),
            doomed: Arc::default(),
            stop: Arc::default(),
            events: Mutex::new(None),
        });
        let thread = {
            let cqs = Arc::clone(&inner.cqs);
            let doomed = Arc::clone(&inner.doomed);
            let stop = Arc::clone(&inner.stop);
            let channel = ChannelPtr(channel);
            std::thread::Builder::new()
                .name(format!("rdma-events-{node}"))
                .spawn(move || event_loop(channel, cqs, doomed, stop))
                .map_err(|e| CarrierError::System(format!("an event thread: {e}")))?
        };
        *inner.events.lock() = Some(thread);
        Ok(Self { inner })
    }

    /// The index of this node's GID in the port's table.
    pub fn gid_index(&self) -> u8 {
        self.inner.sgid_index
    }

    /// The device's entry for `sge`; with `cpu`, addressed as the CPU sees
    /// it (inline data is copied by the provider, not the device).
    fn lookup(&self, sge: &Sge, cpu: bool) -> Result<ffi::ibv_sge, CarrierError> {
        let regions = self.inner.regions.lock();
        let mr = regions.get(&sge.key).ok_or_else(|| {
            CarrierError::Invalid(format!("no local region with key {}", sge.key))
        })?;
        if sge.offset > mr.len || sge.len > mr.len - sge.offset || sge.len > u32::MAX as usize {
            return Err(CarrierError::Invalid(format!(
                "bytes {}..{} are outside local region {} of {} bytes",
                sge.offset,
                sge.offset + sge.len,
                sge.key,
                mr.len
            )));
        }
        Ok(ffi::ibv_sge {
            // Local addresses are in the region's I/O space too, which starts at 0.
            addr: match cpu {
                // SAFETY: within the mapping (checked above).
                true => (unsafe { mr.addr.add(sge.offset) }) as u64,
                false => sge.offset as u64,
            },
            length: sge.len as u32,
            lkey: mr.lkey,
        })
    }

    fn address_handle(&self, node: NodeId) -> Result<*mut ffi::ibv_ah, CarrierError> {
        let mut ahs = self.inner.ahs.lock();
        if let Some(&ah) = ahs.get(&node) {
            return Ok(ah as *mut ffi::ibv_ah);
        }
        let mut attr = self.inner.route(node)?;
        // SAFETY: the protection domain lives as long as the carrier.
        let ah = unsafe { ffi::ibv_create_ah(self.inner.dev.pd, &mut attr) };
        if ah.is_null() {
            return Err(sys(&format!(
                "an address handle for {}",
                crate::node_name(node)
            )));
        }
        ahs.insert(node, ah as usize);
        Ok(ah)
    }
}

/// Index of `gid` in the port's table, the RoCE v2 entry where the device
/// lists one GID under several types. Reads the table in one request (entry
/// by entry, through sysfs, where the kernel cannot).
fn find_gid(ctx: *mut ffi::ibv_context, dev: &str, port: u8, len: i32, gid: &Gid) -> Option<u8> {
    let len = len.clamp(0, 1024) as usize;
    // SAFETY: zeroed entries are valid; the call fills at most `len`.
    let mut entries: Vec<ffi::ibv_gid_entry> = vec![unsafe { std::mem::zeroed() }; len.max(1)];
    let n = unsafe {
        ffi::_ibv_query_gid_table(
            ctx,
            entries.as_mut_ptr(),
            entries.len(),
            0,
            std::mem::size_of::<ffi::ibv_gid_entry>(),
        )
    };
    if n >= 0 {
        let matching = || {
            entries[..(n as usize).min(entries.len())]
                .iter()
                // SAFETY: every bit pattern is a valid raw GID.
                .filter(|e| e.port_num == port as u32 && unsafe { e.gid.raw } == *gid)
        };
        return matching()
            .find(|e| e.gid_type == ffi::IBV_GID_TYPE_ROCE_V2)
            .or_else(|| matching().next())
            .and_then(|e| u8::try_from(e.gid_index).ok());
    }
    let mut found = None;
    for i in 0..len.min(256) as i32 {
        // SAFETY: an index below the table's length.
        let mut g: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        if unsafe { ffi::ibv_query_gid(ctx, port, i, &mut g) } != 0 {
            continue;
        }
        // SAFETY: every bit pattern is a valid raw GID.
        if unsafe { g.raw } != *gid {
            continue;
        }
        let kind = std::fs::read_to_string(format!(
            "/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{i}"
        ))
        .unwrap_or_default();
        if kind.trim() == "RoCE v2" {
            return Some(i as u8);
        }
        found.get_or_insert(i as u8);
    }
    found
}

fn show_gid(g: &Gid) -> String {
    if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
        return Ipv4Addr::new(g[12], g[13], g[14], g[15]).to_string();
    }
    std::net::Ipv6Addr::from(*g).to_string()
}

impl Inner {
    /// The address vector towards `node`.
    fn route(&self, node: NodeId) -> Result<ffi::ibv_ah_attr, CarrierError> {
        let gid = self.gids.get(&node).ok_or_else(|| CarrierError::Peer {
            node,
            reason: "the address book has no GID for it".into(),
        })?;
        // SAFETY: zeroed is a valid address vector; the fields follow.
        let mut attr: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        attr.is_global = 1;
        attr.port_num = self.port;
        attr.grh.dgid.raw = *gid;
        attr.grh.sgid_index = self.sgid_index;
        attr.grh.hop_limit = 64;
        Ok(attr)
    }
}

/// The node whose address a datagram's 40-byte route header carries.
/// On RoCE v2 over IPv4 (`ipv4`) the header's last 20 bytes are the IPv4 header.
fn sender_of(nodes: &HashMap<Gid, NodeId>, ipv4: bool, grh: &[u8]) -> Option<NodeId> {
    if grh.len() < GRH {
        return None;
    }
    let gid = if ipv4 {
        gid_of_ipv4(Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]))
    } else {
        grh[8..24].try_into().ok()?
    };
    nodes.get(&gid).copied()
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.events.lock().take() {
            // The event thread itself may drop the last reference (with the
            // last queue it woke or reaped); it stops at its next step.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        reap(&self.doomed, true);
        // SAFETY: every queue pair, queue and region holds the carrier, so
        // all are gone; address handles and the rest go in reverse order.
        unsafe {
            for (_, ah) in self.ahs.lock().drain() {
                ffi::ibv_destroy_ah(ah as *mut ffi::ibv_ah);
            }
            ffi::ibv_destroy_comp_channel(self.dev.channel);
            ffi::ibv_dealloc_pd(self.dev.pd);
            ffi::ibv_close_device(self.dev.ctx);
        }
    }
}

impl RegionOwner for Inner {
    fn deregister(&self, key: u32) {
        if let Some(mr) = self.regions.lock().remove(&key) {
            let at = std::time::Instant::now() + LINGER;
            self.doomed.lock().push((at, Doomed::Mr(mr)));
        }
    }
}

struct ChannelPtr(*mut ffi::ibv_comp_channel);
// SAFETY: the channel outlives the thread (joined before it is destroyed).
unsafe impl Send for ChannelPtr {}

/// Waits for completion events, re-arms each queue, then wakes its waiters.
fn event_loop(
    channel: ChannelPtr,
    cqs: Arc<Mutex<HashMap<usize, Weak<RdmaCq>>>>,
    doomed: Arc<Mutex<Vec<(std::time::Instant, Doomed)>>>,
    stop: Arc<AtomicBool>,
) {
    let channel = channel.0;
    // SAFETY: the channel lives until this thread is joined.
    let fd = unsafe { (*channel).fd };
    let mut next_reap = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        // Whether or not events keep coming, what lingered long enough goes.
        if std::time::Instant::now() >= next_reap {
            reap(&doomed, false);
            next_reap = std::time::Instant::now() + std::time::Duration::from_millis(50);
            continue;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        while !stop.load(Ordering::Acquire) {
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: non-blocking; fails when no event is pending.
            if unsafe { ffi::ibv_get_cq_event(channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            // Upgrade outside the table's lock: dropping the last reference
            // destroys the queue, which takes that lock.
            let weak = cqs.lock().get(&(cq as usize)).cloned();
            let queue = weak.and_then(|w| w.upgrade());
            if queue.is_some() {
                // SAFETY: the queue is alive (held above).
                unsafe { req_notify(cq) };
            }
            // Acknowledge before the queue can be dropped: destroying a queue
            // waits for its events to be acknowledged.
            unsafe { ffi::ibv_ack_cq_events(cq, 1) };
            if let Some(q) = queue {
                q.notify.notify_waiters();
            }
        }
    }
}

/// Arms `cq` for its next completion event.
unsafe fn req_notify(cq: *mut ffi::ibv_cq) {
    // SAFETY: the caller's `cq` is alive; the provider's entry point.
    unsafe {
        if let Some(f) = (*(*cq).context).ops.req_notify_cq {
            f(cq, 0);
        }
    }
}

/// A completion queue of the device.
pub struct RdmaCq {
    cq: *mut ffi::ibv_cq,
    carrier: Arc<Inner>,
    notify: Notify,
    poll_lock: Mutex<()>,
}

// SAFETY: libibverbs queues may be polled from any thread (serialised here).
unsafe impl Send for RdmaCq {}
unsafe impl Sync for RdmaCq {}

impl Drop for RdmaCq {
    fn drop(&mut self) {
        self.carrier.cqs.lock().remove(&(self.cq as usize));
        // SAFETY: every queue pair using it holds it, so all are gone.
        unsafe { ffi::ibv_destroy_cq(self.cq) };
    }
}

fn status_of(s: ffi::ibv_wc_status::Type) -> WcStatus {
    use ffi::ibv_wc_status::*;
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::ReceiverNotReady,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
        IBV_WC_REM_ACCESS_ERR | IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => {
            WcStatus::RemoteAccess
        }
        IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        _ => WcStatus::RemoteInvalid,
    }
}

impl RdmaCq {
    /// Turns a work completion into the seam's; `None` for one of a queue
    /// pair that is gone.
    fn translate(&self, wc: &ffi::ibv_wc) -> Option<Completion> {
        use ffi::ibv_wc_opcode::*;
        let meta = self.carrier.qps.lock().get(&wc.qp_num).cloned()?;
        let status = wc.error().map_or(WcStatus::Success, |(s, _)| status_of(s));
        let me = self.cq as usize;
        let recv_side = match (meta.send_cq == me, meta.recv_cq == me) {
            (false, true) => true,
            (true, false) => false,
            _ => wc.opcode() & IBV_WC_RECV != 0,
        };
        let op = match (recv_side, wc.opcode()) {
            (true, IBV_WC_RECV_RDMA_WITH_IMM) => WcOp::RecvWriteImm,
            (true, _) => WcOp::Recv,
            (false, IBV_WC_RDMA_WRITE) => WcOp::Write,
            (false, IBV_WC_RDMA_READ) => WcOp::Read,
            (false, _) => WcOp::Send,
        };
        let mut bytes = wc.len() as u32;
        let mut src = None;
        if recv_side {
            match &meta.grh {
                Some(ring) => {
                    // Polls of one queue are serialised, and a queue pair's
                    // receives complete to one queue, in the order posted.
                    let i = ring.completed.load(Ordering::Acquire) % ring.depth;
                    bytes = bytes.saturating_sub(GRH as u32);
                    if status == WcStatus::Success {
                        // SAFETY: the ring's slot of this receive, written by the
                        // device; not posted again before `completed` moves on.
                        let h = unsafe {
                            std::slice::from_raw_parts(ring.base.add(i as usize * GRH), GRH)
                        };
                        src = sender_of(&self.carrier.nodes, self.carrier.ipv4, h).map(|node| {
                            QpAddr {
                                node,
                                qpn: wc.src_qp,
                            }
                        });
                    }
                    ring.completed.fetch_add(1, Ordering::AcqRel);
                }
                None => src = *meta.remote.lock(),
            }
        } else if meta.kind == QpKind::Rc {
            src = *meta.remote.lock();
        }
        Some(Completion {
            id: wc.wr_id(),
            status,
            op,
            bytes,
            // Providers may flag an immediate on the sender's completion too.
            imm: wc.imm_data().filter(|_| recv_side).map(u32::from_be),
            src,
        })
    }
}

impl CompletionQueue for RdmaCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let _serial = self.poll_lock.lock();
        let mut moved = 0;
        let mut wcs = [ffi::ibv_wc::default(); 32];
        while moved < max {
            let want = (max - moved).min(wcs.len());
            // SAFETY: the queue is alive; `want` entries fit.
            let n = unsafe {
                match (*(*self.cq).context).ops.poll_cq {
                    Some(f) => f(self.cq, want as i32, wcs.as_mut_ptr()),
                    None => -1,
                }
            };
            if n <= 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                if let Some(c) = self.translate(wc) {
                    out.push(c);
                    moved += 1;
                }
            }
            if (n as usize) < want {
                break;
            }
        }
        moved
    }

    fn events(&self) -> &Notify {
        &self.notify
    }
}

/// A queue pair of the device.
pub struct RdmaQp {
    qp: *mut ffi::ibv_qp,
    addr: QpAddr,
    meta: Arc<QpMeta>,
    carrier: RdmaCarrier,
    /// Keeps the datagram route-header ring registered (it lingers too).
    _grh_ring: Option<Region>,
    /// Bytes a send or write may carry inline (copied at the post).
    inline: u32,
    _cqs: [Arc<dyn CompletionQueue>; 2],
}

// SAFETY: libibverbs queue pairs may be posted to from any thread.
unsafe impl Send for RdmaQp {}
unsafe impl Sync for RdmaQp {}

impl Drop for RdmaQp {
    /// The queue pair lingers (with its queues) so that what was posted still goes.
    fn drop(&mut self) {
        let inner = &self.carrier.inner;
        inner.qps.lock().remove(&self.addr.qpn);
        let doomed = Doomed::Qp {
            qp: self.qp as usize,
            _cqs: [Arc::clone(&self._cqs[0]), Arc::clone(&self._cqs[1])],
        };
        inner
            .doomed
            .lock()
            .push((std::time::Instant::now() + LINGER, doomed));
    }
}

impl RdmaQp {
    /// What a provider's post returned, for the `queue` ("send", "receive").
    fn posted(&self, rc: i32, queue: &str) -> Result<(), CarrierError> {
        match rc {
            0 => Ok(()),
            libc::ENOMEM => Err(CarrierError::Exhausted(format!(
                "the {queue} queue of {} is full",
                self.addr
            ))),
            e => Err(CarrierError::System(format!(
                "posting a {queue} on {}: {}",
                self.addr,
                std::io::Error::from_raw_os_error(e)
            ))),
        }
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> Result<(), CarrierError> {
        // SAFETY: a live queue pair and a filled attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(CarrierError::System(format!(
                "moving {} to state {}: {}",
                self.addr,
                attr.qp_state,
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }
}

impl QueuePair for RdmaQp {
    fn addr(&self) -> QpAddr {
        self.addr
    }

    fn kind(&self) -> QpKind {
        self.meta.kind
    }

    fn connect(&self, remote: QpAddr) -> Result<(), CarrierError> {
        use ffi::ibv_qp_attr_mask as M;
        if self.meta.kind != QpKind::Rc {
            return Err(CarrierError::Invalid(
                "a datagram queue pair does not connect".into(),
            ));
        }
        let c = &self.carrier.inner;
        // SAFETY: zeroed attributes, the fields used follow.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = c.path_mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = PSN;
        a.max_dest_rd_atomic = c.max_rd_atomic;
        a.min_rnr_timer = 1;
        a.ah_attr = c.route(remote.node)?;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
        )?;
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = PSN;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 0;
        a.max_rd_atomic = c.max_rd_atomic;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
        )?;
        *self.meta.remote.lock() = Some(remote);
        Ok(())
    }

    fn post_send(&self, wr: SendWr) -> Result<(), CarrierError> {
        use ffi::ibv_wr_opcode::*;
        let inline = wr.local.len > 0
            && wr.local.len <= self.inline as usize
            && !matches!(wr.op, SendOp::Read { .. });
        let mut sge = self.carrier.lookup(&wr.local, inline)?;
        // SAFETY: zeroed is an empty request; the fields used follow.
        let mut w: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.id;
        if sge.length > 0 {
            w.sg_list = &mut sge;
            w.num_sge = 1;
        }
        if wr.signaled {
            w.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline {
            w.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let imm = |w: &mut ffi::ibv_send_wr, imm: Option<u32>, with, without| match imm {
            Some(v) => {
                w.__bindgen_anon_1.imm_data = v.to_be();
                w.opcode = with;
            }
            None => w.opcode = without,
        };
        match (self.meta.kind, wr.op) {
            (_, SendOp::Send { imm: i }) => imm(&mut w, i, IBV_WR_SEND_WITH_IMM, IBV_WR_SEND),
            (
                QpKind::Rc,
                SendOp::Write {
                    remote,
                    offset,
                    imm: i,
                },
            ) => {
                imm(&mut w, i, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE);
                w.wr.rdma.remote_addr = offset;
                w.wr.rdma.rkey = remote.key;
            }
            (QpKind::Rc, SendOp::Read { remote, offset }) => {
                w.opcode = IBV_WR_RDMA_READ;
                w.wr.rdma.remote_addr = offset;
                w.wr.rdma.rkey = remote.key;
            }
            (QpKind::Ud, _) => {
                return Err(CarrierError::Invalid(
                    "a datagram queue pair only sends".into(),
                ));
            }
        }
        if self.meta.kind == QpKind::Ud {
            let dest = wr
                .dest
                .ok_or_else(|| CarrierError::Invalid("a datagram needs a destination".into()))?;
            if wr.local.len > self.carrier.inner.ud_mtu {
                return Err(CarrierError::Invalid(format!(
                    "a datagram of {} bytes exceeds the path's {} bytes",
                    wr.local.len, self.carrier.inner.ud_mtu
                )));
            }
            w.wr.ud.ah = self.carrier.address_handle(dest.node)?;
            w.wr.ud.remote_qpn = dest.qpn;
            w.wr.ud.remote_qkey = QKEY;
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a live queue pair; the request and its entry live across the call.
        let rc = unsafe {
            match (*(*self.qp).context).ops.post_send {
                Some(f) => f(self.qp, &mut w, &mut bad),
                None => libc::ENOSYS,
            }
        };
        self.posted(rc, "send")
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), CarrierError> {
        let mut sges = [ffi::ibv_sge::default(); 2];
        let mut n = 0;
        let _serial = self.meta.grh.as_ref().map(|r| r.post.lock());
        if let Some(ring) = &self.meta.grh {
            let posted = ring.posted.load(Ordering::Acquire);
            if posted - ring.completed.load(Ordering::Acquire) >= ring.depth {
                return Err(CarrierError::Exhausted(format!(
                    "{} holds {} receives",
                    self.addr, ring.depth
                )));
            }
            sges[0] = ffi::ibv_sge {
                // Slot `posted % depth` of the ring (its region's I/O space starts at 0).
                addr: (posted % ring.depth) * GRH as u64,
                length: GRH as u32,
                lkey: ring.lkey,
            };
            n = 1;
        }
        if let Some(local) = &wr.local {
            sges[n] = self.carrier.lookup(local, false)?;
            n += 1;
        }
        // SAFETY: zeroed is an empty request.
        let mut w: ffi::ibv_recv_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.id;
        w.sg_list = sges.as_mut_ptr();
        w.num_sge = n as i32;
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: a live queue pair; the request lives across the call.
        let rc = unsafe {
            match (*(*self.qp).context).ops.post_recv {
                Some(f) => f(self.qp, &mut w, &mut bad),
                None => libc::ENOSYS,
            }
        };
        self.posted(rc, "receive")?;
        if let Some(ring) = &self.meta.grh {
            ring.posted.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }
}

impl Carrier for RdmaCarrier {
    fn node(&self) -> NodeId {
        self.inner.node
    }

    fn name(&self) -> &'static str {
        "verbs"
    }

    fn register(&self, len: usize) -> Result<Region, CarrierError> {
        use ffi::ibv_access_flags as A;
        let page = 4096;
        let mapped = len.max(1).div_ceil(page) * page;
        // SAFETY: a fresh anonymous mapping, unmapped on deregistration.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(sys(&format!("mapping {len} bytes to register")));
        }
        let access =
            A::IBV_ACCESS_LOCAL_WRITE | A::IBV_ACCESS_REMOTE_WRITE | A::IBV_ACCESS_REMOTE_READ;
        // SAFETY: the mapping above, registered with offsets as addresses.
        let mr = unsafe { ffi::ibv_reg_mr_iova2(self.inner.dev.pd, addr, mapped, 0, access.0) };
        if mr.is_null() {
            let e = sys(&format!(
                "registering {len} bytes (is the locked-memory limit, ulimit -l, high enough?)"
            ));
            unsafe { libc::munmap(addr, mapped) };
            return Err(e);
        }
        // SAFETY: a registered region.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        self.inner.regions.lock().insert(
            rkey,
            Mr {
                mr,
                lkey,
                addr: addr.cast(),
                len,
                mapped,
            },
        );
        // SAFETY: mapped until `deregister(rkey)`.
        Ok(unsafe { Region::new(rkey, addr.cast(), len, Arc::clone(&self.inner) as _) })
    }

    fn create_cq(&self, depth: usize) -> Result<Arc<dyn CompletionQueue>, CarrierError> {
        let depth = depth.clamp(16, 1 << 20) as i32;
        // SAFETY: the context and channel live as long as the carrier (held).
        let cq = unsafe {
            ffi::ibv_create_cq(
                self.inner.dev.ctx,
                depth,
                std::ptr::null_mut(),
                self.inner.dev.channel,
                0,
            )
        };
        if cq.is_null() {
            return Err(sys(&format!("a completion queue of {depth} entries")));
        }
        let q = Arc::new(RdmaCq {
            cq,
            carrier: Arc::clone(&self.inner),
            notify: Notify::new(),
            poll_lock: Mutex::new(()),
        });
        self.inner
            .cqs
            .lock()
            .insert(cq as usize, Arc::downgrade(&q));
        // SAFETY: alive (held).
        unsafe { req_notify(cq) };
        Ok(q)
    }

    fn create_qp(
        &self,
        kind: QpKind,
        send_cq: &Arc<dyn CompletionQueue>,
        recv_cq: &Arc<dyn CompletionQueue>,
    ) -> Result<Arc<dyn QueuePair>, CarrierError> {
        use ffi::ibv_qp_attr_mask as M;
        let ours = |q: &Arc<dyn CompletionQueue>| {
            q.as_any()
                .downcast_ref::<RdmaCq>()
                .filter(|q| Arc::ptr_eq(&q.carrier, &self.inner))
                .map(|q| q.cq)
                .ok_or_else(|| {
                    CarrierError::Invalid("a completion queue of another carrier".into())
                })
        };
        let (scq, rcq) = (ours(send_cq)?, ours(recv_cq)?);
        let c = &self.inner;
        // SAFETY: zeroed is an empty set of attributes; the fields used follow.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = scq;
        init.recv_cq = rcq;
        init.cap.max_send_wr = c.send_depth as u32;
        init.cap.max_recv_wr = c.recv_depth as u32;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 2;
        // Small writes (credits, free queues, notices) go inline: the designs
        // reuse their staging slot as soon as the post returns.
        init.cap.max_inline_data = INLINE;
        init.qp_type = match kind {
            QpKind::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
            QpKind::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
        };
        // SAFETY: the protection domain and queues are alive (held).
        let mut qp = unsafe { ffi::ibv_create_qp(c.dev.pd, &mut init) };
        if qp.is_null() {
            // A device without inline data: the writes then read their slots late.
            init.cap.max_inline_data = 0;
            qp = unsafe { ffi::ibv_create_qp(c.dev.pd, &mut init) };
        }
        if qp.is_null() {
            return Err(sys(&format!("a {kind:?} queue pair")));
        }
        // SAFETY: created above.
        let qpn = unsafe { (*qp).qp_num };
        let (grh_mr, grh) = match kind {
            QpKind::Ud => {
                let depth = c.recv_depth;
                let region = match self.register(depth * GRH) {
                    Ok(r) => r,
                    Err(e) => {
                        unsafe { ffi::ibv_destroy_qp(qp) };
                        return Err(e);
                    }
                };
                let (lkey, base) = {
                    let regions = c.regions.lock();
                    let mr = &regions[&region.key()];
                    (mr.lkey, mr.addr)
                };
                let ring = GrhRing {
                    post: Mutex::new(()),
                    lkey,
                    base,
                    depth: depth as u64,
                    posted: AtomicU64::new(0),
                    completed: AtomicU64::new(0),
                };
                (Some(region), Some(ring))
            }
            QpKind::Rc => (None, None),
        };
        let meta = Arc::new(QpMeta {
            kind,
            send_cq: scq as usize,
            recv_cq: rcq as usize,
            remote: Mutex::new(None),
            grh,
        });
        c.qps.lock().insert(qpn, Arc::clone(&meta));
        let q = RdmaQp {
            qp,
            addr: QpAddr { node: c.node, qpn },
            meta,
            carrier: self.clone(),
            _grh_ring: grh_mr,
            inline: init.cap.max_inline_data,
            _cqs: [Arc::clone(send_cq), Arc::clone(recv_cq)],
        };
        // Reset to init: receives may be posted before the peer connects.
        // SAFETY: zeroed attributes, the fields used follow.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = c.port;
        match kind {
            QpKind::Rc => {
                a.qp_access_flags = (ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                    | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                    | ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)
                    .0;
                q.modify(
                    &mut a,
                    M::IBV_QP_STATE
                        | M::IBV_QP_PKEY_INDEX
                        | M::IBV_QP_PORT
                        | M::IBV_QP_ACCESS_FLAGS,
                )?;
            }
            QpKind::Ud => {
                a.qkey = QKEY;
                q.modify(
                    &mut a,
                    M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_QKEY,
                )?;
                let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
                a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
                q.modify(&mut a, M::IBV_QP_STATE)?;
                let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
                a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
                a.sq_psn = PSN;
                q.modify(&mut a, M::IBV_QP_STATE | M::IBV_QP_SQ_PSN)?;
            }
        }
        Ok(Arc::new(q))
    }

    fn max_message(&self, kind: QpKind) -> usize {
        match kind {
            QpKind::Rc => self.inner.max_msg,
            QpKind::Ud => self.inner.ud_mtu,
        }
    }

    fn recv_depth(&self) -> usize {
        self.inner.recv_depth
    }

    /// Verbs cannot tell: a lost peer shows as failed requests (retries
    /// exhausted) or, for datagrams, as the stream's timeout.
    fn is_alive(&self, _node: NodeId) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_books_parse_and_refuse_bad_entries() {
        let g = parse_gids("1=10.0.2.15, 2=10.0.2.16").unwrap();
        assert_eq!(g[&1], gid_of_ipv4(Ipv4Addr::new(10, 0, 2, 15)));
        assert_eq!(show_gid(&g[&2]), "10.0.2.16");
        assert!(
            parse_gids("1=10.0.2.15,1=10.0.2.16")
                .unwrap_err()
                .contains("twice")
        );
        assert!(parse_gids("x=10.0.2.15").unwrap_err().contains("node id"));
        assert!(parse_gids("1=10.0.2").unwrap_err().contains("IPv4"));
        assert!(parse_gids("1").unwrap_err().contains("node=address"));
    }

    #[test]
    fn a_route_header_names_its_sender() {
        let gids = parse_gids("1=10.0.2.15,2=10.0.2.16").unwrap();
        let nodes: HashMap<Gid, NodeId> = gids.iter().map(|(&n, &g)| (g, n)).collect();
        // RoCE v2 over IPv4: an IPv4 header in bytes 20..40, its source at 32.
        let mut h = [0u8; GRH];
        h[20] = 0x45;
        h[32..36].copy_from_slice(&[10, 0, 2, 16]);
        assert_eq!(sender_of(&nodes, true, &h), Some(2));
        h[32..36].copy_from_slice(&[10, 0, 2, 99]);
        assert_eq!(sender_of(&nodes, true, &h), None);
        // InfiniBand or RoCE v1: the source GID in bytes 8..24.
        let mut h = [0u8; GRH];
        h[0] = 0x60;
        h[8..24].copy_from_slice(&gids[&1]);
        assert_eq!(sender_of(&nodes, false, &h), Some(1));
        assert_eq!(sender_of(&nodes, false, &h[..20]), None);
    }

    /// Nodes 1 and 2 on the device of `GYRE_VERBS_GIDS` (scripts/rdma/test.sh).
    fn two_nodes() -> (RdmaCarrier, RdmaCarrier) {
        let book = std::env::var("GYRE_VERBS_GIDS")
            .expect("GYRE_VERBS_GIDS names the nodes' addresses (scripts/rdma/test.sh)");
        let mut config = RdmaConfig::new(parse_gids(&book).unwrap());
        config.device = std::env::var("GYRE_VERBS_DEVICE").ok();
        (
            RdmaCarrier::open(1, &config).unwrap(),
            RdmaCarrier::open(2, &config).unwrap(),
        )
    }

    fn one(cq: &Arc<dyn CompletionQueue>) -> Completion {
        let mut out = vec![];
        for _ in 0..5000 {
            if cq.poll(&mut out, 1) == 1 {
                return out[0];
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("no completion within 5 s");
    }

    #[test]
    #[ignore = "needs an RDMA device: scripts/rdma/test.sh"]
    fn every_primitive_over_the_device() {
        let (a, b) = two_nodes();
        let cq = |c: &RdmaCarrier| c.create_cq(256).unwrap();
        let (sa, ra_cq, sb, rb_cq) = (cq(&a), cq(&a), cq(&b), cq(&b));
        let qa = a.create_qp(QpKind::Rc, &sa, &ra_cq).unwrap();
        let qb = b.create_qp(QpKind::Rc, &sb, &rb_cq).unwrap();
        let ra = a.register(1 << 20).unwrap();
        let rb = b.register(1 << 20).unwrap();
        qb.post_recv(RecvWr {
            id: 7,
            local: Some(rb.sge(4096, 4096)),
        })
        .unwrap();
        qa.connect(qb.addr()).unwrap();
        qb.connect(qa.addr()).unwrap();
        unsafe { ra.slice_mut(100, 5) }.copy_from_slice(b"hello");
        let wr = |id, op, local| SendWr {
            id,
            op,
            local,
            dest: None,
            signaled: true,
        };
        // Send with immediate into a receive posted before the connection.
        qa.post_send(wr(1, SendOp::Send { imm: Some(42) }, ra.sge(100, 5)))
            .unwrap();
        let c = one(&sa);
        assert_eq!((c.id, c.status, c.op), (1, WcStatus::Success, WcOp::Send));
        let r = one(&rb_cq);
        assert_eq!(
            (r.id, r.status, r.op, r.bytes, r.imm, r.src),
            (
                7,
                WcStatus::Success,
                WcOp::Recv,
                5,
                Some(42),
                Some(qa.addr())
            )
        );
        assert_eq!(unsafe { rb.slice(4096, 5) }, b"hello");
        // Write, then read it back.
        let remote = rb.remote(2);
        qa.post_send(wr(
            2,
            SendOp::Write {
                remote,
                offset: 10_000,
                imm: None,
            },
            ra.sge(100, 5),
        ))
        .unwrap();
        assert_eq!(one(&sa).op, WcOp::Write);
        assert_eq!(unsafe { rb.slice(10_000, 5) }, b"hello");
        unsafe { rb.slice_mut(20_000, 6) }.copy_from_slice(b"from b");
        qa.post_send(wr(
            3,
            SendOp::Read {
                remote,
                offset: 20_000,
            },
            ra.sge(300, 6),
        ))
        .unwrap();
        let c = one(&sa);
        assert_eq!((c.id, c.status, c.op), (3, WcStatus::Success, WcOp::Read));
        assert_eq!(unsafe { ra.slice(300, 6) }, b"from b");
        // Write with immediate into a buffer-less receive; zero bytes too.
        qb.post_recv(RecvWr { id: 9, local: None }).unwrap();
        qb.post_recv(RecvWr {
            id: 10,
            local: None,
        })
        .unwrap();
        let mut w = wr(
            4,
            SendOp::Write {
                remote,
                offset: 30_000,
                imm: Some(77),
            },
            ra.sge(100, 5),
        );
        w.signaled = false;
        qa.post_send(w).unwrap();
        qa.post_send(wr(
            5,
            SendOp::Write {
                remote,
                offset: 0,
                imm: Some(78),
            },
            ra.sge(0, 0),
        ))
        .unwrap();
        let r = one(&rb_cq);
        assert_eq!(
            (r.id, r.op, r.imm, r.bytes),
            (9, WcOp::RecvWriteImm, Some(77), 5)
        );
        assert_eq!(unsafe { rb.slice(30_000, 5) }, b"hello");
        let r = one(&rb_cq);
        assert_eq!((r.id, r.imm, r.bytes), (10, Some(78), 0));
        assert_eq!(one(&sa).id, 5, "the unsignaled write left no completion");
        // Datagrams name their sender.
        let ua = a.create_qp(QpKind::Ud, &sa, &ra_cq).unwrap();
        let ub = b.create_qp(QpKind::Ud, &sb, &rb_cq).unwrap();
        ub.post_recv(RecvWr {
            id: 11,
            local: Some(rb.sge(40_000, 4096)),
        })
        .unwrap();
        unsafe { ra.slice_mut(50_000, 4096) }.fill(5);
        ua.post_send(SendWr {
            id: 6,
            op: SendOp::Send { imm: Some(3) },
            local: ra.sge(50_000, a.max_message(QpKind::Ud)),
            dest: Some(ub.addr()),
            signaled: true,
        })
        .unwrap();
        assert_eq!(one(&sa).status, WcStatus::Success);
        let r = one(&rb_cq);
        assert_eq!(
            (r.id, r.status, r.bytes as usize, r.imm, r.src),
            (
                11,
                WcStatus::Success,
                a.max_message(QpKind::Ud),
                Some(3),
                Some(ua.addr())
            )
        );
        // A send with no receive posted fails the connection; so does a bad key.
        qa.post_send(wr(8, SendOp::Send { imm: None }, ra.sge(100, 5)))
            .unwrap();
        assert_eq!(one(&sa).status, WcStatus::ReceiverNotReady);
        let qc = a.create_qp(QpKind::Rc, &sa, &ra_cq).unwrap();
        let qd = b.create_qp(QpKind::Rc, &sb, &rb_cq).unwrap();
        qc.connect(qd.addr()).unwrap();
        qd.connect(qc.addr()).unwrap();
        qc.post_send(wr(
            9,
            SendOp::Write {
                remote,
                offset: (2 << 20) as u64,
                imm: None,
            },
            ra.sge(100, 5),
        ))
        .unwrap();
        assert_eq!(one(&sa).status, WcStatus::RemoteAccess);
    }
}
