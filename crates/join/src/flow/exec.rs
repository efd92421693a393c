//! The distributed join on one node: every node of the cluster calls [`flow_join`] with
//! the same configuration (except `index`) and its own rows.
//!
//! Phases (thesis Ch. 4.4.1, the generalized Flow-Join):
//! 1. **Exchange R.** Routing threads count R keys (detection on R) and send each tuple
//!    to the owner of its key, except keys already announced heavy in R, which stay
//!    local. When every node has routed its R the coordinator declares the R list final.
//!    Each R tuple thus lives on exactly one node.
//! 2. **Exchange S.** Routing threads count S keys; an S tuple whose key is heavy in S
//!    stays local (probed against broadcast R copies when they are there, kept until
//!    then); heavy in R only: broadcast to every node (probes every node's R tuples of
//!    the key, each once); heavy in both: kept for SFR; otherwise sent to its owner.
//!    Detection iterations run at fixed shares of each node's input; the coordinator
//!    announces new heavy hitters; the owners of their R tuples then broadcast those
//!    R tuples (kept apart from the partitioned table, which already holds them) and
//!    an end marker per iteration that named any key. S tuples sent to the owner
//!    before the announcement were probed there against the partitioned table, those
//!    kept after it only against the copies: no pair is produced twice or lost. In
//!    fetch-on-demand mode nodes decide on their own S heavy hitters and request the R
//!    tuples from the owners instead.
//! 3. **Handle skew.** Keys heavy in both inputs are redistributed with Symmetric
//!    Fragment Replicate on the grid the cost formula picks; then, for outer, semi and
//!    anti joins, every replicated copy (broadcast S tuples, broadcast or fetched R
//!    tuples and the original they were copied from, SFR copies) is sent with its
//!    matched flag to one node chosen by its id, which keeps a tuple as dangling only if
//!    no copy found a partner and emits a semi-join row once.
//!
//! NULL keys never travel: they match nothing, so their outer/anti rows are emitted
//! where they are.
//!
//! Each receive endpoint has exactly one reading task (`ReceiveEndpoint::get` wakes one
//! waiter per event, so a second concurrent reader could sleep through the end of the
//! streams); the S exchange's reader hands decoded batches to `threads` probing tasks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use gyre_transport::{NodeId, ReceiveEndpoint, ReceiveSpec, SendEndpoint, SendSpec, To, Transport};
use tokio::sync::watch;

use super::detect::{Coordinator, DetectionConfig, FIRST_ROUND_WAIT, NodeDetector, NodeReport};
use super::direct_map::DirectMap;
use super::heavy::{HeavyProbe, KeyMap, ReadyView, Segment};
use super::result::{JoinOutput, ResultRow};
use super::sfr::choose_grid;
use super::wire::{self, Control, Side, Tup, kind};
use super::{FlowError, JoinType, ROW_BITS, Rows, Strategy, mix64, owner};
use crate::keys::Keys;
use crate::radix::{RadixConfig, RadixHashTable};

/// Exchange ids of one join (query); the benchmark's barriers use 1 and 2.
const X_UP: u32 = 10;
const X_DOWN: u32 = 11;
const X_R: u32 = 12;
const X_S: u32 = 13;
const X_RB: u32 = 14;
const X_SFR: u32 = 15;
const X_DANGLE: u32 = 16;
const X_FREQ: u32 = 17;
const X_FRESP: u32 = 18;

/// Most tuples routed per morsel (between snapshot refreshes and detection checks);
/// small inputs use smaller morsels so detection still runs at its points.
const MORSEL: usize = 16 * 1024;
const MIN_MORSEL: usize = 1024;

const R_HEAVY: u8 = 1;
const S_HEAVY: u8 = 2;

/// What one node runs; the same on every node except `index`.
#[derive(Debug, Clone)]
pub struct FlowJoinConfig {
    /// The participating nodes, in the same order everywhere; the first coordinates.
    pub nodes: Vec<NodeId>,
    /// This node's position in `nodes`.
    pub index: usize,
    /// Query id of the join's streams (unique per run on the cluster).
    pub query: u64,
    pub strategy: Strategy,
    pub join: JoinType,
    /// Routing and probing threads (tasks) per node.
    pub threads: usize,
    pub detection: DetectionConfig,
    /// Keep the result rows (tests); otherwise only count and checksum.
    pub collect: bool,
}

/// A heavy hitter this node learned of.
#[derive(Debug, Clone, PartialEq)]
pub struct HeavyFound {
    pub side: Side,
    pub key: u64,
    pub iteration: u32,
    /// Estimated frequency in the whole input.
    pub estimate: u64,
    /// Tuples of that input this node had routed when it started treating the key as
    /// heavy.
    pub after_tuples: u64,
}

/// What one node did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeCounters {
    pub build_rows: u64,
    pub probe_rows: u64,
    /// R tuples sent to their key's owner (this node included) / kept local (heavy in R).
    pub build_sent: u64,
    pub build_kept: u64,
    /// S tuples sent to their owner / broadcast (counted once) / kept local.
    pub probe_sent: u64,
    pub probe_broadcast: u64,
    pub probe_kept: u64,
    /// Kept S tuples that had to wait for their R tuples.
    pub probe_materialized: u64,
    /// R tuples this node broadcast (consensus) or sent on request (fetch on demand).
    pub build_replicated: u64,
    /// Tuples that arrived: R partitioned, S partitioned + broadcast copies, R copies.
    pub build_received: u64,
    pub probe_received: u64,
    pub copies_received: u64,
    /// SFR tuples sent and received.
    pub sfr_sent: u64,
    pub sfr_received: u64,
    /// Replicated copies reported for outer/semi/anti joins.
    pub dangling_sent: u64,
    pub heavy: Vec<HeavyFound>,
    /// Global list: time the routers waited for the first announcement.
    pub first_round_wait: Duration,
    /// Until the R table was built / until every S tuple was probed / until the end.
    pub build_phase: Duration,
    pub probe_phase: Duration,
    pub total: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    build_sent: AtomicU64,
    build_kept: AtomicU64,
    probe_sent: AtomicU64,
    probe_broadcast: AtomicU64,
    probe_kept: AtomicU64,
    build_replicated: AtomicU64,
    build_received: AtomicU64,
    probe_received: AtomicU64,
    copies_received: AtomicU64,
    first_round_wait_ns: AtomicU64,
}

/// Heavy-hitter classes by key, as routing threads see them.
#[derive(Debug, Default)]
struct Routes {
    class: DirectMap<u8>,
}

impl Routes {
    #[inline(always)]
    fn get(&self, key: u64) -> u8 {
        if self.class.is_empty() {
            0
        } else {
            self.class.get(key).unwrap_or(0)
        }
    }
}

/// The R tuples on this node (partitioned plus kept local) as a radix hash table.
struct BuildTable {
    tuples: Vec<Tup>,
    table: RadixHashTable,
    matched: Vec<AtomicBool>,
}

impl BuildTable {
    fn new(tuples: Vec<Tup>, threads: usize, track: bool) -> Result<Self, FlowError> {
        let keys: Vec<u64> = tuples.iter().map(|t| t.key).collect();
        let config = RadixConfig {
            threads,
            ..RadixConfig::default()
        };
        let table = RadixHashTable::build(&Keys::unsigned(&keys), &config)?;
        let matched = if track {
            tuples.iter().map(|_| AtomicBool::new(false)).collect()
        } else {
            vec![]
        };
        Ok(BuildTable {
            tuples,
            table,
            matched,
        })
    }

    /// Rows of the table holding any of `keys`.
    fn rows_of(&self, keys: &[u64]) -> Vec<u32> {
        if keys.is_empty() {
            return vec![];
        }
        self.table.probe_direct(&Keys::unsigned(keys), 1).left
    }
}

/// Activation of broadcast groups (consensus mode): iteration -> keys, copies, markers.
#[derive(Debug, Default)]
struct Activation {
    keys: std::collections::HashMap<u32, Vec<u64>>,
    copies: std::collections::HashMap<u32, Vec<Tup>>,
    markers: std::collections::HashMap<u32, usize>,
}

/// Fetch on demand: outstanding requests and the answers arriving.
#[derive(Debug, Default)]
struct Fetches {
    next_batch: u32,
    /// (owner position, batch) -> keys asked for.
    asked: std::collections::HashMap<(usize, u32), Vec<u64>>,
    copies: std::collections::HashMap<(usize, u32), Vec<Tup>>,
}

struct Node {
    cfg: FlowJoinConfig,
    n: usize,
    me: usize,
    ids: bool,
    cap: usize,
    routes: RwLock<Arc<Routes>>,
    epoch: AtomicU64,
    heavy: HeavyProbe,
    table: OnceLock<Arc<BuildTable>>,
    table_ready: watch::Sender<bool>,
    build_final: watch::Sender<bool>,
    /// Probe-side announcements applied so far (routers wait once for the first).
    probe_rounds: watch::Sender<u32>,
    found: Mutex<Vec<HeavyFound>>,
    estimates: Mutex<KeyMap<(u64, u64)>>,
    activation: Mutex<Activation>,
    fetches: Mutex<Fetches>,
    served: Mutex<KeyMap<()>>,
    sfr_probe: Mutex<Vec<Tup>>,
    extra: Mutex<JoinOutput>,
    build_det: Option<NodeDetector>,
    probe_det: Option<NodeDetector>,
    build_rows: u64,
    probe_rows: u64,
    c: Counters,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("flow-join state lock")
}

impl Node {
    fn routes(&self) -> Arc<Routes> {
        Arc::clone(&self.routes.read().expect("routes lock"))
    }

    /// Adds heavy-hitter classes; routing threads pick them up at their next morsel.
    fn mark(&self, keys: &[u64], bit: u8) {
        let mut w = self.routes.write().expect("routes lock");
        let mut class = w.class.clone();
        for &k in keys {
            class.insert(k, class.get(k).unwrap_or(0) | bit);
        }
        *w = Arc::new(Routes { class });
        self.epoch.fetch_add(1, Ordering::Release);
    }

    fn record(&self, side: Side, iteration: u32, keys: &[(u64, u64)]) {
        let det = match side {
            Side::Build => &self.build_det,
            Side::Probe => &self.probe_det,
        };
        let after = det.as_ref().map_or(0, NodeDetector::processed);
        let mut f = lock(&self.found);
        let mut est = lock(&self.estimates);
        for &(key, estimate) in keys {
            f.push(HeavyFound {
                side,
                key,
                iteration,
                estimate,
                after_tuples: after,
            });
            let e = est.entry(key).or_default();
            match side {
                Side::Build => e.0 = estimate,
                Side::Probe => e.1 = estimate,
            }
        }
    }

    fn table(&self) -> &Arc<BuildTable> {
        self.table.get().expect("table built before use")
    }

    /// The build tuples of `keys`, counted as replicated (they are about to be sent to
    /// nodes other than their owner).
    fn replicated_tuples(&self, keys: &[u64]) -> Vec<Tup> {
        let table = self.table();
        let tuples: Vec<Tup> = table
            .rows_of(keys)
            .into_iter()
            .map(|r| table.tuples[r as usize])
            .collect();
        self.c
            .build_replicated
            .fetch_add(tuples.len() as u64, Ordering::Relaxed);
        tuples
    }

    async fn wait_table(&self) {
        let mut rx = self.table_ready.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|r| *r).await;
    }

    async fn wait_build_final(&self) {
        let mut rx = self.build_final.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Global list: after reporting the first detection iteration a router waits for
    /// its announcement (at most [`FIRST_ROUND_WAIT`]) instead of routing on by hash.
    /// On hosts with a small CPU share the announcement crosses hosts that run only
    /// part of each scheduling period, and routing on meanwhile sent 0.1-2M of a
    /// node's 2M tuples to their owners before the heavy hitters were known (8
    /// emulated hosts at 0.22 CPU, Zipf 1.25). Only a node that found candidates
    /// waits: a key heavy overall has at least the threshold's share on some node, which
    /// waits for it, and each other node has too few of its tuples to matter, so
    /// without skew nobody waits. The SQL operator holds rows back the same way; fetch
    /// on demand decides locally and never waits.
    async fn wait_first_round(&self) {
        let started = Instant::now();
        let mut rx = self.probe_rounds.subscribe();
        let _ = tokio::time::timeout(FIRST_ROUND_WAIT, rx.wait_for(|r| *r > 0)).await;
        self.c
            .first_round_wait_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn id(&self, row: usize) -> u64 {
        ((self.me as u64) << ROW_BITS) | row as u64
    }

    fn to(&self, pos: usize) -> To {
        To::Node(self.cfg.nodes[pos])
    }

    /// Result rows of a probe tuple probed at a single site.
    #[inline]
    fn probe_decided(&self, key: Option<u64>, payload: u64, matched: bool, out: &mut JoinOutput) {
        let emit = match self.cfg.join {
            JoinType::Right | JoinType::Full | JoinType::RightAnti => !matched,
            JoinType::RightSemi => matched,
            _ => false,
        };
        if emit {
            out.push(ResultRow {
                build: None,
                probe: Some((key, payload)),
            });
        }
    }

    /// Result rows of a build tuple whose every copy is known here.
    #[inline]
    fn build_decided(&self, key: Option<u64>, payload: u64, matched: bool, out: &mut JoinOutput) {
        let emit = match self.cfg.join {
            JoinType::Left | JoinType::Full | JoinType::LeftAnti => !matched,
            JoinType::LeftSemi => matched,
            _ => false,
        };
        if emit {
            out.push(ResultRow {
                build: Some((key, payload)),
                probe: None,
            });
        }
    }

    /// Probes S tuples against ready broadcast/fetched R copies (single probe site).
    fn probe_view(&self, view: &ReadyView, tuples: &[Tup], out: &mut JoinOutput) {
        for t in tuples {
            let (seg, rows) = view.lookup(t.key).expect("offered tuples are ready");
            self.probe_copies(t, seg, rows, out);
        }
    }

    /// Probes one S tuple against the build copies of its (heavy, ready) key.
    #[inline]
    fn probe_copies(
        &self,
        t: &Tup,
        seg: &Segment,
        rows: std::ops::Range<usize>,
        out: &mut JoinOutput,
    ) {
        let join = self.cfg.join;
        for r in rows.clone() {
            let b = &seg.tuples[r];
            if join.emits_pairs() {
                out.pair(t.key, b.payload, t.payload);
            }
            if join.tracks_build() {
                seg.matched[r].store(true, Ordering::Relaxed);
            }
        }
        if join.tracks_probe() {
            self.probe_decided(Some(t.key), t.payload, !rows.is_empty(), out);
        }
    }

    /// Probes S tuples against the partitioned table. `replicated`: the tuples are
    /// broadcast copies, whose matched flags go to `copies` instead of a decision here.
    fn probe_table(
        &self,
        tuples: &[Tup],
        replicated: bool,
        keys: &mut Vec<u64>,
        out: &mut JoinOutput,
        copies: &mut Vec<(Tup, bool)>,
    ) {
        let table = self.table();
        let join = self.cfg.join;
        keys.clear();
        keys.extend(tuples.iter().map(|t| t.key));
        let pairs = table.table.probe_direct(&Keys::unsigned(keys), 1);
        if join.emits_pairs() {
            for (&b, &p) in pairs.left.iter().zip(&pairs.right) {
                let s = &tuples[p as usize];
                out.pair(s.key, table.tuples[b as usize].payload, s.payload);
            }
        }
        if join.tracks_build() {
            for &b in &pairs.left {
                table.matched[b as usize].store(true, Ordering::Relaxed);
            }
        }
        if join.tracks_probe() {
            let mut m = vec![false; tuples.len()];
            for &p in &pairs.right {
                m[p as usize] = true;
            }
            for (t, matched) in tuples.iter().zip(m) {
                if replicated {
                    copies.push((*t, matched));
                } else {
                    self.probe_decided(Some(t.key), t.payload, matched, out);
                }
            }
        }
    }

    /// Makes a group of heavy keys ready and probes the S tuples that waited for it.
    fn activate(&self, keys: &[u64], copies: Vec<Tup>) {
        let (view, ready) = self.heavy.activate(keys, copies);
        if !ready.is_empty() {
            let mut out = JoinOutput::new(self.cfg.collect);
            self.probe_view(&view, &ready, &mut out);
            lock(&self.extra).absorb(out);
        }
    }

    /// Activates iteration `it` once its keys are known here and every owner ended its
    /// broadcast.
    fn try_activate(&self, it: u32) {
        let group = {
            let mut a = lock(&self.activation);
            if a.markers.get(&it).copied().unwrap_or(0) == self.n && a.keys.contains_key(&it) {
                a.markers.remove(&it);
                let keys = a.keys.remove(&it).expect("checked");
                Some((keys, a.copies.remove(&it).unwrap_or_default()))
            } else {
                None
            }
        };
        if let Some((keys, copies)) = group {
            self.activate(&keys, copies);
        }
    }
}

/// Sends `tuples` in messages of at most `cap` tuples.
async fn send_tuples(
    ep: &SendEndpoint,
    to: To,
    kind: u8,
    aux: u32,
    tuples: &[Tup],
    ids: bool,
    cap: usize,
) -> Result<(), FlowError> {
    for chunk in tuples.chunks(cap.max(1)) {
        let mut buf = ep.acquire(to).await?;
        wire::encode(buf.vec_mut(), kind, aux, chunk, ids);
        ep.put(buf, false)?;
    }
    Ok(())
}

async fn send_marker(ep: &SendEndpoint, to: To, kind: u8, aux: u32) -> Result<(), FlowError> {
    let mut buf = ep.acquire(to).await?;
    wire::encode(buf.vec_mut(), kind, aux, &[], false);
    ep.put(buf, false)?;
    Ok(())
}

async fn send_control(ep: &SendEndpoint, to: To, msg: &Control) -> Result<(), FlowError> {
    let mut buf = ep.acquire(to).await?;
    buf.vec_mut().extend_from_slice(&msg.encode());
    ep.put(buf, false)?;
    Ok(())
}

/// One node's endpoints of one join (the optional ones depend on the strategy).
struct Endpoints {
    up: Option<Arc<SendEndpoint>>,
    up_recv: Option<ReceiveEndpoint>,
    down: Option<Arc<SendEndpoint>>,
    down_recv: Option<ReceiveEndpoint>,
    r: Arc<SendEndpoint>,
    r_recv: ReceiveEndpoint,
    s: Arc<SendEndpoint>,
    s_recv: Arc<ReceiveEndpoint>,
    rb: Option<Arc<SendEndpoint>>,
    rb_recv: Option<ReceiveEndpoint>,
    sfr: Option<Arc<SendEndpoint>>,
    sfr_recv: Option<ReceiveEndpoint>,
    dangle: Option<Arc<SendEndpoint>>,
    dangle_recv: Option<ReceiveEndpoint>,
    freq: Option<Arc<SendEndpoint>>,
    freq_recv: Option<ReceiveEndpoint>,
    fresp: Option<Arc<SendEndpoint>>,
    fresp_recv: Option<ReceiveEndpoint>,
}

fn open(t: &dyn Transport, cfg: &FlowJoinConfig) -> Result<Endpoints, FlowError> {
    let all: Vec<NodeId> = cfg.nodes.clone();
    let sources: Vec<(u32, NodeId)> = all
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u32, *n))
        .collect();
    let coord = all[0];
    let send = |x: u32, dests: Vec<NodeId>| {
        t.open_send(SendSpec {
            query: cfg.query,
            exchange: x,
            from: cfg.index as u32,
            destinations: dests,
            groups: vec![],
        })
        .map(Arc::new)
    };
    let recv = |x: u32, sources: Vec<(u32, NodeId)>| {
        t.open_receive(ReceiveSpec {
            query: cfg.query,
            exchange: x,
            sources,
        })
    };
    let flow = cfg.strategy != Strategy::Plain;
    let consensus = cfg.strategy == Strategy::Broadcast;
    let fetch = cfg.strategy == Strategy::FetchOnDemand;
    let tracked = flow && cfg.join.needs_ids();
    let coordinator = cfg.index == 0;
    Ok(Endpoints {
        up: flow.then(|| send(X_UP, vec![coord])).transpose()?,
        up_recv: (flow && coordinator)
            .then(|| recv(X_UP, sources.clone()))
            .transpose()?,
        down: (flow && coordinator)
            .then(|| send(X_DOWN, all.clone()))
            .transpose()?,
        down_recv: flow.then(|| recv(X_DOWN, vec![(0, coord)])).transpose()?,
        r: send(X_R, all.clone())?,
        r_recv: recv(X_R, sources.clone())?,
        s: send(X_S, all.clone())?,
        s_recv: Arc::new(recv(X_S, sources.clone())?),
        rb: consensus.then(|| send(X_RB, all.clone())).transpose()?,
        rb_recv: consensus.then(|| recv(X_RB, sources.clone())).transpose()?,
        sfr: consensus.then(|| send(X_SFR, all.clone())).transpose()?,
        sfr_recv: consensus
            .then(|| recv(X_SFR, sources.clone()))
            .transpose()?,
        dangle: tracked.then(|| send(X_DANGLE, all.clone())).transpose()?,
        dangle_recv: tracked
            .then(|| recv(X_DANGLE, sources.clone()))
            .transpose()?,
        freq: fetch.then(|| send(X_FREQ, all.clone())).transpose()?,
        freq_recv: fetch.then(|| recv(X_FREQ, sources.clone())).transpose()?,
        fresp: fetch.then(|| send(X_FRESP, all.clone())).transpose()?,
        fresp_recv: fetch.then(|| recv(X_FRESP, sources)).transpose()?,
    })
}

fn validate(t: &dyn Transport, cfg: &FlowJoinConfig, r: &Rows, s: &Rows) -> Result<(), FlowError> {
    if cfg.nodes.is_empty() || cfg.index >= cfg.nodes.len() {
        return Err(FlowError::Input(format!(
            "position {} is not among {} nodes",
            cfg.index,
            cfg.nodes.len()
        )));
    }
    if cfg.nodes[cfg.index] != t.node_id() {
        return Err(FlowError::Input(format!(
            "position {} names node {}, but this transport is node {}",
            cfg.index,
            cfg.nodes[cfg.index],
            t.node_id()
        )));
    }
    if cfg.nodes.len() >= 1 << (64 - ROW_BITS) {
        return Err(FlowError::Input("too many nodes".into()));
    }
    if cfg.threads == 0 {
        return Err(FlowError::Input("threads must be at least 1".into()));
    }
    cfg.detection.validate().map_err(FlowError::Input)?;
    r.check("build side")?;
    s.check("probe side")?;
    if t.message_size() < wire::HEADER + 64 {
        return Err(FlowError::Input(format!(
            "message size {} is too small",
            t.message_size()
        )));
    }
    Ok(())
}

/// Runs this node's part of the distributed join (see the module doc) and returns its
/// part of the result and what it did. Every node of `cfg.nodes` must call it.
pub async fn flow_join(
    t: &dyn Transport,
    cfg: &FlowJoinConfig,
    build: Arc<Rows>,
    probe: Arc<Rows>,
) -> Result<(JoinOutput, NodeCounters), FlowError> {
    validate(t, cfg, &build, &probe)?;
    let start = Instant::now();
    let n = cfg.nodes.len();
    let flow = cfg.strategy != Strategy::Plain;
    let consensus = cfg.strategy == Strategy::Broadcast;
    let ids = cfg.join.needs_ids();
    let cap = (t.message_size() - wire::HEADER) / wire::tuple_width(ids);
    let ep = open(t, cfg)?;
    let (table_ready, _) = watch::channel(false);
    let (build_final, _) = watch::channel(!flow);
    let node = Arc::new(Node {
        cfg: cfg.clone(),
        n,
        me: cfg.index,
        ids,
        cap,
        routes: RwLock::new(Arc::new(Routes::default())),
        epoch: AtomicU64::new(0),
        heavy: HeavyProbe::default(),
        table: OnceLock::new(),
        table_ready,
        build_final,
        probe_rounds: watch::channel(0).0,
        found: Mutex::new(vec![]),
        estimates: Mutex::new(KeyMap::default()),
        activation: Mutex::new(Activation::default()),
        fetches: Mutex::new(Fetches::default()),
        served: Mutex::new(KeyMap::default()),
        sfr_probe: Mutex::new(vec![]),
        extra: Mutex::new(JoinOutput::new(cfg.collect)),
        build_det: flow.then(|| NodeDetector::new(&cfg.detection, cfg.threads, build.len() as u64)),
        probe_det: flow.then(|| NodeDetector::new(&cfg.detection, cfg.threads, probe.len() as u64)),
        build_rows: build.len() as u64,
        probe_rows: probe.len() as u64,
        c: Counters::default(),
    });

    // Coordinator and control tasks (global consensus on heavy hitters).
    let coordinator = match (ep.up_recv, &ep.down) {
        (Some(up_recv), Some(down)) => {
            let iters_s = if consensus {
                cfg.detection.iterations()
            } else {
                0
            };
            Some(tokio::spawn(coordinate(
                up_recv,
                Arc::clone(down),
                n,
                cfg.detection.iterations(),
                iters_s,
                cfg.detection.threshold,
            )))
        }
        _ => None,
    };
    let control = ep
        .down_recv
        .map(|down_recv| tokio::spawn(control(Arc::clone(&node), down_recv, ep.rb.clone())));
    let rb_task = ep
        .rb_recv
        .map(|rb_recv| tokio::spawn(receive_broadcast_copies(Arc::clone(&node), rb_recv)));
    let fetch_serve = match (ep.freq_recv, &ep.fresp) {
        (Some(freq_recv), Some(fresp)) => Some(tokio::spawn(serve_fetches(
            Arc::clone(&node),
            freq_recv,
            Arc::clone(fresp),
        ))),
        _ => None,
    };
    let fetch_answers = ep
        .fresp_recv
        .map(|fresp_recv| tokio::spawn(receive_fetched(Arc::clone(&node), fresp_recv)));

    // Phase 1: exchange R.
    let r_recv = ep.r_recv;
    let r_receiver = tokio::spawn({
        let node = Arc::clone(&node);
        async move {
            let mut got = Vec::new();
            let mut batch = Vec::new();
            while let Some(m) = r_recv.get().await? {
                if !m.data().is_empty() {
                    let (k, _) = wire::header(m.data())?;
                    if k != kind::R_PART {
                        return Err(FlowError::Protocol(format!(
                            "message kind {k} on the R exchange"
                        )));
                    }
                    wire::decode_into(m.data(), node.ids, &mut batch)?;
                    got.extend_from_slice(&batch);
                }
                r_recv.release(m);
            }
            node.c
                .build_received
                .fetch_add(got.len() as u64, Ordering::Relaxed);
            Ok::<_, FlowError>(got)
        }
    });
    let routed = route_all(&node, Side::Build, &build, &ep.r, ep.up.as_ref(), None).await?;
    ep.r.finish();
    if let Some(up) = &ep.up {
        send_control(up, To::Node(cfg.nodes[0]), &Control::BuildDone).await?;
    }
    let mut out = routed.out;
    let mut r_tuples = join_task(r_receiver).await?;
    r_tuples.extend(routed.kept);
    let table = BuildTable::new(r_tuples, cfg.threads, cfg.join.tracks_build())?;
    let _ = node.table.set(Arc::new(table));
    node.table_ready.send_replace(true);
    let build_phase = start.elapsed();

    // Phase 2: exchange S (after the R heavy-hitter list is final).
    // One task reads the S exchange (a receive endpoint has one reader: `get` wakes one
    // waiter per message) and hands decoded batches to `threads` probing tasks.
    let (batches_tx, batches_rx) = tokio::sync::mpsc::channel::<(bool, Vec<Tup>)>(2 * cfg.threads);
    let batches_rx = Arc::new(tokio::sync::Mutex::new(batches_rx));
    let s_reader = tokio::spawn({
        let node = Arc::clone(&node);
        let s_recv = Arc::clone(&ep.s_recv);
        async move {
            while let Some(m) = s_recv.get().await? {
                if m.data().is_empty() {
                    s_recv.release(m);
                    continue;
                }
                let (k, _) = wire::header(m.data())?;
                let replicated = match k {
                    kind::S_PART => false,
                    kind::S_BCAST => true,
                    _ => {
                        return Err(FlowError::Protocol(format!(
                            "message kind {k} on the S exchange"
                        )));
                    }
                };
                let mut batch = Vec::new();
                wire::decode_into(m.data(), node.ids, &mut batch)?;
                s_recv.release(m);
                node.c
                    .probe_received
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                if batches_tx.send((replicated, batch)).await.is_err() {
                    return Err(FlowError::Protocol("the probing tasks ended early".into()));
                }
            }
            Ok::<_, FlowError>(())
        }
    });
    let s_receivers: Vec<_> = (0..cfg.threads)
        .map(|_| {
            let node = Arc::clone(&node);
            let rx = Arc::clone(&batches_rx);
            tokio::spawn(async move {
                let mut out = JoinOutput::new(node.cfg.collect);
                let mut copies = Vec::new();
                let mut keys = Vec::new();
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some((replicated, batch)) = next else {
                        break;
                    };
                    node.probe_table(&batch, replicated, &mut keys, &mut out, &mut copies);
                }
                Ok::<_, FlowError>((out, copies))
            })
        })
        .collect();
    node.wait_build_final().await;
    let routed = route_all(
        &node,
        Side::Probe,
        &probe,
        &ep.s,
        ep.up.as_ref(),
        ep.freq.as_ref(),
    )
    .await?;
    ep.s.finish();
    if let Some(f) = &ep.freq {
        f.finish();
    }
    if let Some(up) = &ep.up {
        up.finish();
    }
    out.absorb(routed.out);
    lock(&node.sfr_probe).extend(routed.sfr);
    join_task(s_reader).await?;
    let mut probe_copies = Vec::new();
    for h in s_receivers {
        let (o, c) = join_task(h).await?;
        out.absorb(o);
        probe_copies.extend(c);
    }
    if let Some(h) = coordinator {
        join_task(h).await?;
    }
    if let Some(h) = control {
        join_task(h).await?;
    }
    if let Some(h) = rb_task {
        join_task(h).await?;
    }
    if let Some(h) = fetch_serve {
        join_task(h).await?;
    }
    if let Some(h) = fetch_answers {
        join_task(h).await?;
    }
    if node.heavy.pending() > 0 {
        return Err(FlowError::Protocol(format!(
            "{} kept probe tuples never got their build tuples",
            node.heavy.pending()
        )));
    }
    let probe_phase = start.elapsed();

    // Phase 3: SFR for keys heavy on both sides, then replicated copies' verdicts.
    let mut build_copies: Vec<(Tup, bool)> = Vec::new();
    let mut sfr_counts = (0u64, 0u64);
    if let (Some(sfr), Some(sfr_recv)) = (&ep.sfr, ep.sfr_recv) {
        sfr_counts = symmetric_fragment_replicate(
            &node,
            sfr,
            sfr_recv,
            &mut out,
            &mut build_copies,
            &mut probe_copies,
        )
        .await?;
    }
    let join = cfg.join;
    if join.tracks_build() {
        let table = node.table();
        let replicated: KeyMap<()> = match cfg.strategy {
            Strategy::Plain => KeyMap::default(),
            Strategy::Broadcast => node
                .routes()
                .class
                .iter()
                .filter(|(_, c)| c & S_HEAVY != 0)
                .map(|(k, _)| (k, ()))
                .collect(),
            Strategy::FetchOnDemand => lock(&node.served).clone(),
        };
        for (i, tup) in table.tuples.iter().enumerate() {
            let matched = table.matched[i].load(Ordering::Relaxed);
            if replicated.contains_key(&tup.key) {
                build_copies.push((*tup, matched));
            } else {
                node.build_decided(Some(tup.key), tup.payload, matched, &mut out);
            }
        }
        for seg in node.heavy.view().segments() {
            for (i, tup) in seg.tuples.iter().enumerate() {
                build_copies.push((*tup, seg.matched[i].load(Ordering::Relaxed)));
            }
        }
    }
    let mut dangling_sent = 0;
    if let (Some(d), Some(d_recv)) = (&ep.dangle, ep.dangle_recv) {
        dangling_sent = (build_copies.len() + probe_copies.len()) as u64;
        resolve_copies(&node, d, d_recv, build_copies, probe_copies, &mut out).await?;
    } else if !build_copies.is_empty() || !probe_copies.is_empty() {
        return Err(FlowError::Protocol(
            "replicated copies without a verdict exchange".into(),
        ));
    }
    out.absorb(std::mem::replace(
        &mut *lock(&node.extra),
        JoinOutput::new(false),
    ));
    // Everything sent is written before the caller may release the query (which drops
    // queued frames).
    for e in [
        &ep.up, &ep.down, &ep.rb, &ep.sfr, &ep.dangle, &ep.freq, &ep.fresp,
    ]
    .into_iter()
    .flatten()
    .chain([&ep.r, &ep.s])
    {
        e.flushed().await;
    }

    let c = &node.c;
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counters = NodeCounters {
        build_rows: build.len() as u64,
        probe_rows: probe.len() as u64,
        build_sent: l(&c.build_sent),
        build_kept: l(&c.build_kept),
        probe_sent: l(&c.probe_sent),
        probe_broadcast: l(&c.probe_broadcast),
        probe_kept: l(&c.probe_kept),
        probe_materialized: node.heavy.kept(),
        build_replicated: l(&c.build_replicated),
        build_received: l(&c.build_received),
        probe_received: l(&c.probe_received),
        copies_received: l(&c.copies_received),
        sfr_sent: sfr_counts.0,
        sfr_received: sfr_counts.1,
        dangling_sent,
        heavy: lock(&node.found).clone(),
        first_round_wait: Duration::from_nanos(l(&c.first_round_wait_ns)),
        build_phase,
        probe_phase,
        total: start.elapsed(),
    };
    Ok((out, counters))
}

async fn join_task<T>(h: tokio::task::JoinHandle<Result<T, FlowError>>) -> Result<T, FlowError> {
    match h.await {
        Ok(r) => r,
        Err(e) => Err(FlowError::Protocol(format!("a flow-join task failed: {e}"))),
    }
}

/// What the routing threads of one side produced.
#[derive(Default)]
struct Routed {
    out: JoinOutput,
    /// R tuples kept local (heavy in R).
    kept: Vec<Tup>,
    /// S tuples kept for SFR.
    sfr: Vec<Tup>,
}

/// Routes one side with `threads` tasks taking morsels.
async fn route_all(
    node: &Arc<Node>,
    side: Side,
    rows: &Arc<Rows>,
    ep: &Arc<SendEndpoint>,
    up: Option<&Arc<SendEndpoint>>,
    freq: Option<&Arc<SendEndpoint>>,
) -> Result<Routed, FlowError> {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..node.cfg.threads)
        .map(|t| {
            let (node, rows, ep, next) = (
                Arc::clone(node),
                Arc::clone(rows),
                Arc::clone(ep),
                Arc::clone(&next),
            );
            let up = up.cloned();
            let freq = freq.cloned();
            tokio::spawn(async move {
                route(
                    &node,
                    side,
                    &rows,
                    &ep,
                    up.as_deref(),
                    freq.as_deref(),
                    t,
                    &next,
                )
                .await
            })
        })
        .collect();
    let mut all = Routed {
        out: JoinOutput::new(node.cfg.collect),
        ..Routed::default()
    };
    for h in tasks {
        let r = join_task(h).await?;
        all.out.absorb(r.out);
        all.kept.extend(r.kept);
        all.sfr.extend(r.sfr);
    }
    // Iterations not run yet run now (an input shorter than a morsel, or empty).
    let det = match side {
        Side::Build => &node.build_det,
        Side::Probe => &node.probe_det,
    };
    if let Some(det) = det {
        let reports = det.finish();
        handle_reports(node, side, reports, up.map(|a| &**a), freq.map(|a| &**a)).await?;
    }
    Ok(all)
}

/// A full buffer to send: destination position (`None` = all) and tuples.
type Outgoing = (Option<usize>, u8, Vec<Tup>);

#[allow(clippy::too_many_arguments)]
async fn route(
    node: &Node,
    side: Side,
    rows: &Rows,
    ep: &SendEndpoint,
    up: Option<&SendEndpoint>,
    freq: Option<&SendEndpoint>,
    thread: usize,
    next: &AtomicUsize,
) -> Result<Routed, FlowError> {
    let n = node.n;
    let cap = node.cap;
    let det = match side {
        Side::Build => node.build_det.as_ref(),
        Side::Probe => node.probe_det.as_ref(),
    };
    let part_kind = match side {
        Side::Build => kind::R_PART,
        Side::Probe => kind::S_PART,
    };
    let mut part: Vec<Vec<Tup>> = (0..n).map(|_| Vec::with_capacity(cap)).collect();
    let mut bcast: Vec<Tup> = Vec::new();
    let mut heavy: Vec<Tup> = Vec::new();
    let mut res = Routed {
        out: JoinOutput::new(node.cfg.collect),
        ..Routed::default()
    };
    let mut routes = node.routes();
    let mut epoch = node.epoch.load(Ordering::Acquire);
    let morsel = (rows.len() / (64 * node.cfg.threads)).clamp(MIN_MORSEL, MORSEL);
    let mut sample_left = 1;
    let (mut sent, mut kept, mut broadcast) = (0u64, 0u64, 0u64);
    loop {
        let m = next.fetch_add(1, Ordering::Relaxed);
        let lo = m.saturating_mul(morsel);
        if lo >= rows.len() {
            break;
        }
        let hi = (lo + morsel).min(rows.len());
        let e = node.epoch.load(Ordering::Acquire);
        if e != epoch {
            epoch = e;
            routes = node.routes();
        }
        let mut outgoing: Vec<Outgoing> = Vec::new();
        {
            // No histogram once detection is over.
            let counting = det.and_then(|d| Some((d, d.step()?)));
            let step = counting.map_or(1, |(_, s)| s);
            sample_left = sample_left.min(step);
            let mut hist =
                counting.map(|(d, _)| d.histogram(thread).lock().expect("histogram lock"));
            // Heavy S tuples whose build copies are here are probed at once; the others
            // wait in `heavy` (`offer` decides again under its lock: keys only ever
            // become ready, so a key ready in this older view is ready for good).
            let ready =
                (side == Side::Probe && !routes.class.is_empty()).then(|| node.heavy.view());
            for row in lo..hi {
                let Some(key) = rows.key(row) else {
                    // NULL keys match nothing and never travel.
                    match side {
                        Side::Build => {
                            node.build_decided(None, rows.payloads[row], false, &mut res.out)
                        }
                        Side::Probe => {
                            node.probe_decided(None, rows.payloads[row], false, &mut res.out)
                        }
                    }
                    continue;
                };
                if let Some(h) = hist.as_mut() {
                    sample_left -= 1;
                    if sample_left == 0 {
                        sample_left = step;
                        h.update(key);
                    }
                }
                let t = Tup {
                    key,
                    payload: rows.payloads[row],
                    id: node.id(row),
                };
                let class = routes.get(key);
                match (side, class) {
                    (_, 0) => {
                        let o = owner(key, n);
                        part[o].push(t);
                        sent += 1;
                        if part[o].len() >= cap {
                            outgoing.push((
                                Some(o),
                                part_kind,
                                std::mem::replace(&mut part[o], Vec::with_capacity(cap)),
                            ));
                        }
                    }
                    (Side::Build, _) => {
                        res.kept.push(t);
                        kept += 1;
                    }
                    (Side::Probe, R_HEAVY) => {
                        bcast.push(t);
                        broadcast += 1;
                        if bcast.len() >= cap {
                            outgoing.push((None, kind::S_BCAST, std::mem::take(&mut bcast)));
                        }
                    }
                    (Side::Probe, S_HEAVY) => {
                        kept += 1;
                        match ready.as_ref().and_then(|v| v.lookup(key)) {
                            Some((seg, rows)) => node.probe_copies(&t, seg, rows, &mut res.out),
                            None => heavy.push(t),
                        }
                    }
                    (Side::Probe, _) => {
                        res.sfr.push(t);
                        kept += 1;
                    }
                }
            }
        }
        if !heavy.is_empty() {
            let (view, ready) = node.heavy.offer(&mut heavy);
            node.probe_view(&view, &ready, &mut res.out);
        }
        for (to, k, tuples) in outgoing {
            let to = to.map_or(To::All, |p| node.to(p));
            send_tuples(ep, to, k, 0, &tuples, node.ids, cap).await?;
        }
        if let Some(det) = det {
            let reports = det.advance((hi - lo) as u64);
            let found_first = reports
                .iter()
                .any(|r| r.iteration == 0 && !r.candidates.is_empty());
            handle_reports(node, side, reports, up, freq).await?;
            if found_first && side == Side::Probe && up.is_some() && freq.is_none() {
                node.wait_first_round().await;
            }
        }
        // Routing rarely waits; give the control tasks (announcements, broadcasts) a turn
        // so routing changes arrive early.
        tokio::task::yield_now().await;
    }
    for (o, tuples) in part.into_iter().enumerate() {
        if !tuples.is_empty() {
            send_tuples(ep, node.to(o), part_kind, 0, &tuples, node.ids, cap).await?;
        }
    }
    if !bcast.is_empty() {
        send_tuples(ep, To::All, kind::S_BCAST, 0, &bcast, node.ids, cap).await?;
    }
    let c = &node.c;
    match side {
        Side::Build => {
            c.build_sent.fetch_add(sent, Ordering::Relaxed);
            c.build_kept.fetch_add(kept, Ordering::Relaxed);
        }
        Side::Probe => {
            c.probe_sent.fetch_add(sent, Ordering::Relaxed);
            c.probe_kept.fetch_add(kept, Ordering::Relaxed);
            c.probe_broadcast.fetch_add(broadcast, Ordering::Relaxed);
        }
    }
    Ok(res)
}

/// Sends detection reports to the coordinator (consensus) or, for S in fetch-on-demand
/// mode, decides locally and requests the R tuples of new heavy keys from their owners.
async fn handle_reports(
    node: &Node,
    side: Side,
    reports: Vec<NodeReport>,
    up: Option<&SendEndpoint>,
    freq: Option<&SendEndpoint>,
) -> Result<(), FlowError> {
    for r in reports {
        if let (Side::Probe, Some(freq)) = (side, freq) {
            fetch_on_demand(node, &r, freq).await?;
        } else if let Some(up) = up {
            let msg = Control::Report {
                side,
                iteration: r.iteration,
                window: r.window,
                total: match side {
                    Side::Build => node.build_rows,
                    Side::Probe => node.probe_rows,
                },
                candidates: r.candidates,
            };
            send_control(up, To::Node(node.cfg.nodes[0]), &msg).await?;
        }
    }
    Ok(())
}

/// Fetch on demand: keys this node's own detection found heavy (and not heavy in R)
/// are kept local from now on, and their R tuples are requested from their owners.
async fn fetch_on_demand(
    node: &Node,
    report: &NodeReport,
    freq: &SendEndpoint,
) -> Result<(), FlowError> {
    let routes = node.routes();
    let new: Vec<(u64, u64)> = report
        .candidates
        .iter()
        .filter(|(k, _)| routes.get(*k) == 0)
        .map(|&(k, c)| {
            let est = c as f64 / report.window.max(1) as f64 * node.probe_rows as f64;
            (k, (est as u64).max(c))
        })
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let keys: Vec<u64> = new.iter().map(|k| k.0).collect();
    node.record(Side::Probe, report.iteration, &new);
    let mut by_owner: Vec<Vec<Tup>> = vec![Vec::new(); node.n];
    for &key in &keys {
        by_owner[owner(key, node.n)].push(Tup {
            key,
            payload: 0,
            id: 0,
        });
    }
    let batch = {
        let mut f = lock(&node.fetches);
        let b = f.next_batch;
        f.next_batch += 1;
        for (o, ks) in by_owner.iter().enumerate() {
            if !ks.is_empty() {
                f.asked.insert((o, b), ks.iter().map(|t| t.key).collect());
            }
        }
        b
    };
    // Registered before routing changes, so every kept tuple has an answer coming.
    node.mark(&keys, S_HEAVY);
    for (o, ks) in by_owner.iter().enumerate() {
        if !ks.is_empty() {
            send_tuples(
                freq,
                node.to(o),
                kind::FETCH_REQ,
                batch,
                ks,
                false,
                node.cap,
            )
            .await?;
        }
    }
    Ok(())
}

/// The coordinator: sums reports per iteration and announces new heavy hitters; the R
/// list becomes final once every node routed its R.
async fn coordinate(
    up_recv: ReceiveEndpoint,
    down: Arc<SendEndpoint>,
    n: usize,
    iters_build: usize,
    iters_probe: usize,
    threshold: f64,
) -> Result<(), FlowError> {
    let mut cb = Coordinator::new(n, iters_build, threshold);
    let mut cp = Coordinator::new(n, iters_probe, threshold);
    let (mut done, mut final_sent, mut finished) = (0, false, false);
    while let Some(m) = up_recv.get().await? {
        let from = m.node;
        if !m.data().is_empty() {
            let msg = Control::decode(m.data())?;
            match msg {
                Control::Report {
                    side,
                    iteration,
                    window,
                    total,
                    candidates,
                } => {
                    let c = match side {
                        Side::Build => &mut cb,
                        Side::Probe => &mut cp,
                    };
                    let announced = c
                        .add(iteration, window, total, &candidates)
                        .map_err(|e| FlowError::Protocol(format!("node {from}: {e}")))?;
                    for (iteration, keys) in announced {
                        let a = Control::Announce {
                            side,
                            iteration,
                            keys,
                        };
                        send_control(&down, To::All, &a).await?;
                    }
                }
                Control::BuildDone => done += 1,
                other => {
                    return Err(FlowError::Protocol(format!(
                        "node {from} sent {other:?} to the coordinator"
                    )));
                }
            }
        }
        up_recv.release(m);
        if !final_sent && done == n && cb.complete() {
            send_control(&down, To::All, &Control::BuildFinal).await?;
            final_sent = true;
        }
        if final_sent && cp.complete() && !finished {
            down.finish();
            finished = true;
        }
    }
    if !finished {
        return Err(FlowError::Protocol(
            "the nodes ended before every detection iteration was reported".into(),
        ));
    }
    down.flushed().await;
    Ok(())
}

/// A node's control task: applies announcements to its routing; for S heavy hitters
/// whose R tuples it owns, broadcasts them (then an end marker for the iteration).
async fn control(
    node: Arc<Node>,
    down_recv: ReceiveEndpoint,
    rb: Option<Arc<SendEndpoint>>,
) -> Result<(), FlowError> {
    while let Some(m) = down_recv.get().await? {
        if m.data().is_empty() {
            down_recv.release(m);
            continue;
        }
        let msg = Control::decode(m.data())?;
        down_recv.release(m);
        match msg {
            Control::Announce {
                side: Side::Build,
                iteration,
                keys,
            } => {
                node.record(Side::Build, iteration, &keys);
                let k: Vec<u64> = keys.iter().map(|k| k.0).collect();
                node.mark(&k, R_HEAVY);
            }
            Control::BuildFinal => {
                node.build_final.send_replace(true);
            }
            Control::Announce {
                side: Side::Probe,
                iteration,
                keys,
            } => {
                let Some(rb) = &rb else {
                    return Err(FlowError::Protocol(
                        "probe-side announcement without global consensus".into(),
                    ));
                };
                node.record(Side::Probe, iteration, &keys);
                if keys.is_empty() {
                    // A quiet iteration: every node got the same empty list, so no
                    // owner has rows to broadcast and nobody waits for its end marker.
                    // Skipping the markers saves n^2 messages (and wake-ups) a round.
                    node.probe_rounds.send_modify(|r| *r += 1);
                    continue;
                }
                let k: Vec<u64> = keys.iter().map(|k| k.0).collect();
                let routes = node.routes();
                // Keys heavy in R as well go to SFR at the end, not to a broadcast.
                let single: Vec<u64> = k
                    .iter()
                    .copied()
                    .filter(|&k| routes.get(k) & R_HEAVY == 0)
                    .collect();
                lock(&node.activation)
                    .keys
                    .insert(iteration, single.clone());
                node.mark(&k, S_HEAVY);
                node.probe_rounds.send_modify(|r| *r += 1);
                node.try_activate(iteration);
                node.wait_table().await;
                let mine: Vec<u64> = single
                    .into_iter()
                    .filter(|&k| owner(k, node.n) == node.me)
                    .collect();
                let tuples = node.replicated_tuples(&mine);
                send_tuples(
                    rb,
                    To::All,
                    kind::R_BCAST,
                    iteration,
                    &tuples,
                    node.ids,
                    node.cap,
                )
                .await?;
                send_marker(rb, To::All, kind::R_BCAST_END, iteration).await?;
            }
            other => {
                return Err(FlowError::Protocol(format!(
                    "unexpected {other:?} from the coordinator"
                )));
            }
        }
    }
    if !*node.build_final.borrow() {
        return Err(FlowError::Protocol(
            "the coordinator ended without a final build-side list".into(),
        ));
    }
    if let Some(rb) = &rb {
        rb.finish();
    }
    Ok(())
}

/// Collects the R copies owners broadcast and activates each iteration when complete.
async fn receive_broadcast_copies(
    node: Arc<Node>,
    rb_recv: ReceiveEndpoint,
) -> Result<(), FlowError> {
    let mut batch = Vec::new();
    while let Some(m) = rb_recv.get().await? {
        if m.data().is_empty() {
            rb_recv.release(m);
            continue;
        }
        let (k, it) = wire::header(m.data())?;
        match k {
            kind::R_BCAST => {
                wire::decode_into(m.data(), node.ids, &mut batch)?;
                rb_recv.release(m);
                node.c
                    .copies_received
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                lock(&node.activation)
                    .copies
                    .entry(it)
                    .or_default()
                    .extend_from_slice(&batch);
            }
            kind::R_BCAST_END => {
                rb_recv.release(m);
                *lock(&node.activation).markers.entry(it).or_default() += 1;
                node.try_activate(it);
            }
            other => {
                return Err(FlowError::Protocol(format!(
                    "message kind {other} on the broadcast exchange"
                )));
            }
        }
    }
    Ok(())
}

/// Owner side of fetch on demand: answers each request with the R tuples of its keys.
async fn serve_fetches(
    node: Arc<Node>,
    freq_recv: ReceiveEndpoint,
    fresp: Arc<SendEndpoint>,
) -> Result<(), FlowError> {
    node.wait_table().await;
    let mut batch = Vec::new();
    while let Some(m) = freq_recv.get().await? {
        if m.data().is_empty() {
            freq_recv.release(m);
            continue;
        }
        let from = m.slot as usize;
        let (k, b) = wire::header(m.data())?;
        if k != kind::FETCH_REQ || from >= node.n {
            return Err(FlowError::Protocol(format!(
                "message kind {k} from position {from} on the fetch request exchange"
            )));
        }
        wire::decode_into(m.data(), false, &mut batch)?;
        freq_recv.release(m);
        let keys: Vec<u64> = batch.iter().map(|t| t.key).collect();
        if let Some(&k) = keys.iter().find(|&&k| owner(k, node.n) != node.me) {
            return Err(FlowError::Protocol(format!(
                "position {from} asked for key {k}, which this node does not own"
            )));
        }
        {
            let mut s = lock(&node.served);
            for &k in &keys {
                s.insert(k, ());
            }
        }
        let tuples = node.replicated_tuples(&keys);
        send_tuples(
            &fresp,
            node.to(from),
            kind::FETCH_DATA,
            b,
            &tuples,
            node.ids,
            node.cap,
        )
        .await?;
        send_marker(&fresp, node.to(from), kind::FETCH_END, b).await?;
    }
    fresp.finish();
    fresp.flushed().await;
    Ok(())
}

/// Requester side of fetch on demand: activates each answered batch.
async fn receive_fetched(node: Arc<Node>, fresp_recv: ReceiveEndpoint) -> Result<(), FlowError> {
    let mut batch = Vec::new();
    while let Some(m) = fresp_recv.get().await? {
        if m.data().is_empty() {
            fresp_recv.release(m);
            continue;
        }
        let from = m.slot as usize;
        let (k, b) = wire::header(m.data())?;
        match k {
            kind::FETCH_DATA => {
                wire::decode_into(m.data(), node.ids, &mut batch)?;
                fresp_recv.release(m);
                node.c
                    .copies_received
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                lock(&node.fetches)
                    .copies
                    .entry((from, b))
                    .or_default()
                    .extend_from_slice(&batch);
            }
            kind::FETCH_END => {
                fresp_recv.release(m);
                let (keys, copies) = {
                    let mut f = lock(&node.fetches);
                    let Some(keys) = f.asked.remove(&(from, b)) else {
                        return Err(FlowError::Protocol(format!(
                            "position {from} answered batch {b}, which was not asked"
                        )));
                    };
                    (keys, f.copies.remove(&(from, b)).unwrap_or_default())
                };
                node.activate(&keys, copies);
            }
            other => {
                return Err(FlowError::Protocol(format!(
                    "message kind {other} on the fetch answer exchange"
                )));
            }
        }
    }
    Ok(())
}

/// Redistributes keys heavy in both inputs on their SFR grids and joins them; returns
/// the SFR tuples sent and received.
async fn symmetric_fragment_replicate(
    node: &Node,
    sfr: &SendEndpoint,
    sfr_recv: ReceiveEndpoint,
    out: &mut JoinOutput,
    build_copies: &mut Vec<(Tup, bool)>,
    probe_copies: &mut Vec<(Tup, bool)>,
) -> Result<(u64, u64), FlowError> {
    let n = node.n;
    let routes = node.routes();
    let mut both: Vec<u64> = routes
        .class
        .iter()
        .filter(|&(_, c)| c == R_HEAVY | S_HEAVY)
        .map(|(k, _)| k)
        .collect();
    both.sort_unstable();
    let est = lock(&node.estimates).clone();
    let grids: KeyMap<super::sfr::Grid> = both
        .iter()
        .map(|&k| {
            let (x, y) = est.get(&k).copied().unwrap_or((1, 1));
            (k, choose_grid(n, x.max(1) as f64, y.max(1) as f64))
        })
        .collect();
    let mut r_out: Vec<Vec<Tup>> = vec![Vec::new(); n];
    let mut s_out: Vec<Vec<Tup>> = vec![Vec::new(); n];
    let table = node.table();
    for r in table.rows_of(&both) {
        let t = table.tuples[r as usize];
        for d in grids[&t.key].build_targets(t.id) {
            r_out[d].push(t);
        }
    }
    for t in std::mem::take(&mut *lock(&node.sfr_probe)) {
        let Some(g) = grids.get(&t.key) else {
            return Err(FlowError::Protocol(format!(
                "probe tuple kept for SFR with key {} not heavy on both sides",
                t.key
            )));
        };
        for d in g.probe_targets(t.id) {
            s_out[d].push(t);
        }
    }
    let sent = r_out.iter().chain(&s_out).map(Vec::len).sum::<usize>() as u64;
    // Received while sending: copies to this node need its consumer to return credits.
    let sending = async {
        for d in 0..n {
            send_tuples(
                sfr,
                node.to(d),
                kind::SFR_R,
                0,
                &r_out[d],
                node.ids,
                node.cap,
            )
            .await?;
            send_tuples(
                sfr,
                node.to(d),
                kind::SFR_S,
                0,
                &s_out[d],
                node.ids,
                node.cap,
            )
            .await?;
        }
        sfr.finish();
        Ok::<_, FlowError>(())
    };
    let receiving = async {
        let (mut r_in, mut s_in, mut batch) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(m) = sfr_recv.get().await? {
            if m.data().is_empty() {
                sfr_recv.release(m);
                continue;
            }
            let (k, _) = wire::header(m.data())?;
            wire::decode_into(m.data(), node.ids, &mut batch)?;
            sfr_recv.release(m);
            match k {
                kind::SFR_R => r_in.extend_from_slice(&batch),
                kind::SFR_S => s_in.extend_from_slice(&batch),
                other => {
                    return Err(FlowError::Protocol(format!(
                        "message kind {other} on the SFR exchange"
                    )));
                }
            }
        }
        Ok((r_in, s_in))
    };
    let (sent_ok, received) = tokio::join!(sending, receiving);
    sent_ok?;
    let (r_in, s_in) = received?;
    let received = (r_in.len() + s_in.len()) as u64;
    let seg = Segment::new(r_in);
    let join = node.cfg.join;
    for s in &s_in {
        let rows = seg.rows(s.key);
        for r in rows.clone() {
            if join.emits_pairs() {
                out.pair(s.key, seg.tuples[r].payload, s.payload);
            }
            seg.matched[r].store(true, Ordering::Relaxed);
        }
        if join.tracks_probe() {
            probe_copies.push((*s, !rows.is_empty()));
        }
    }
    if join.tracks_build() {
        for (i, t) in seg.tuples.iter().enumerate() {
            build_copies.push((*t, seg.matched[i].load(Ordering::Relaxed)));
        }
    }
    sfr.flushed().await;
    Ok((sent, received))
}

/// Sends every replicated copy with its matched flag to the node its id maps to; that
/// node decides each tuple once (dangling only if no copy matched; semi once).
async fn resolve_copies(
    node: &Node,
    ep: &SendEndpoint,
    recv: ReceiveEndpoint,
    build_copies: Vec<(Tup, bool)>,
    probe_copies: Vec<(Tup, bool)>,
    out: &mut JoinOutput,
) -> Result<(), FlowError> {
    let n = node.n;
    // [dest][side][matched]
    let mut bufs: Vec<[[Vec<Tup>; 2]; 2]> = (0..n).map(|_| Default::default()).collect();
    for (side, copies) in [(0usize, build_copies), (1, probe_copies)] {
        for (t, m) in copies {
            let d = (mix64(t.id ^ (side as u64 + 1).wrapping_mul(0xA5A5)) % n as u64) as usize;
            bufs[d][side][m as usize].push(t);
        }
    }
    let sending = async {
        for (d, b) in bufs.iter().enumerate() {
            for (side, k) in [(0, kind::DANGLE_R), (1, kind::DANGLE_S)] {
                for (m, tuples) in b[side].iter().enumerate() {
                    send_tuples(ep, node.to(d), k, m as u32, tuples, true, node.cap).await?;
                }
            }
        }
        ep.finish();
        Ok::<_, FlowError>(())
    };
    let receiving = async {
        let mut verdict: [KeyMap<(Tup, bool)>; 2] = Default::default();
        let mut batch = Vec::new();
        while let Some(msg) = recv.get().await? {
            if msg.data().is_empty() {
                recv.release(msg);
                continue;
            }
            let (k, matched) = wire::header(msg.data())?;
            let side = match k {
                kind::DANGLE_R => 0,
                kind::DANGLE_S => 1,
                other => {
                    return Err(FlowError::Protocol(format!(
                        "message kind {other} on the verdict exchange"
                    )));
                }
            };
            wire::decode_into(msg.data(), true, &mut batch)?;
            recv.release(msg);
            for t in &batch {
                let e = verdict[side].entry(t.id).or_insert((*t, false));
                e.1 |= matched != 0;
            }
        }
        Ok(verdict)
    };
    let (sent_ok, verdict) = tokio::join!(sending, receiving);
    sent_ok?;
    let verdict = verdict?;
    for (t, m) in verdict[0].values() {
        node.build_decided(Some(t.key), t.payload, *m, out);
    }
    for (t, m) in verdict[1].values() {
        node.probe_decided(Some(t.key), t.payload, *m, out);
    }
    ep.flushed().await;
    Ok(())
}
