//! What one worker's Flow-Join tasks share: the heavy-hitter lists as announced so
//! far, the announcement counters the tasks wait on, the query's endpoints, and rows
//! with their partitioning hashes.
//!
//! The lists only grow: the listener appends each announcement's hashes and then bumps
//! that side's counter, so a task that sees counter `r` sees every hash of rounds
//! `0..r`.

use super::metrics::FlowMetrics;
use super::{FlowReport, HeavyHitter};
use crate::context::QueryContext;
use crate::key_hash::hash_keys;
use crate::sender::{Outlet, SendMetrics, transport_err};
use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, ScalarValue, internal_datafusion_err};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use gyre_join::flow::control::{Control, Side};
use gyre_transport::{NodeId, ReceiveEndpoint, ReceiveSpec, SendEndpoint, To, node_name};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

/// The heavy hashes announced so far, shared by the listener (writer) and router.
/// Only ever appended to, so a reader knows what is new by the length it last saw.
#[derive(Default)]
pub(super) struct HeavySet {
    /// (hash, round that found it).
    pub(super) hashes: RwLock<Vec<(u64, u32)>>,
}

impl HeavySet {
    pub(super) fn extend(&self, new: &[u64], round: u32) {
        self.hashes.write().extend(new.iter().map(|&h| (h, round)));
    }
}

/// Everything a worker's tasks share.
pub(super) struct Shared {
    pub(super) qc: Arc<QueryContext>,
    pub(super) partition: usize,
    pub(super) heavy: HeavySet,
    pub(super) report: Arc<Mutex<FlowReport>>,
    pub(super) m: FlowMetrics,
    pub(super) send_m: SendMetrics,
    /// Worker 0: the node that forms the global heavy-hitter list.
    pub(super) detector_node: NodeId,
    /// Announcements applied so far (the listener counts, the router waits for round 0).
    pub(super) rounds: tokio::sync::watch::Sender<u32>,
    /// The same for the build side, whose list is final after `build_iterations`
    /// announcements (0 when the join does not route its build input).
    pub(super) build_heavy: HeavySet,
    pub(super) build_rounds: tokio::sync::watch::Sender<u32>,
    pub(super) build_iterations: u32,
    /// Probe-side detection rounds: the probe list is final after as many announcements.
    pub(super) probe_iterations: u32,
    /// Whether this worker sent any of its build rows to other workers (the owner
    /// task's heavy broadcasts, SFR's replicas): only then can peers match them.
    pub(super) build_rows_shared: std::sync::atomic::AtomicBool,
    /// The join's first exchange id, naming it in debug events.
    pub(super) exchange: u32,
}

impl Shared {
    /// A debug event of one of this worker's Flow-Join tasks (`GYRE_LOG=gyre_exchange=debug`):
    /// the tasks' state changes, which tell where a query that does not end waits.
    pub(super) fn trace(&self, task: &str, what: std::fmt::Arguments) {
        tracing::debug!(
            query = self.qc.query_id,
            exchange = self.exchange,
            worker = self.partition,
            "Flow-Join {task}: {what}"
        );
    }

    pub(super) fn n(&self) -> usize {
        self.qc.workers.len()
    }

    pub(super) fn heavy(&self, side: Side) -> &HeavySet {
        match side {
            Side::Build => &self.build_heavy,
            Side::Probe => &self.heavy,
        }
    }

    /// Announcements applied so far for `side`.
    pub(super) fn rounds(&self, side: Side) -> &tokio::sync::watch::Sender<u32> {
        match side {
            Side::Build => &self.build_rounds,
            Side::Probe => &self.rounds,
        }
    }

    /// Takes `keys` (hash, estimated rows) as `side`'s heavy hitters of round
    /// `iteration`, whether announced by worker 0 or found here (fetch on demand):
    /// recorded for `EXPLAIN ANALYZE`, appended to the side's list, counted. Returns
    /// their hashes; the caller counts the round as applied once it acted on them.
    pub(super) fn adopt_heavy(&self, side: Side, iteration: u32, keys: &[(u64, u64)]) -> Vec<u64> {
        {
            let mut report = self.report.lock();
            let heavy = report.heavy_of(side);
            for &(hash, estimate) in keys {
                heavy.entry(hash).or_insert(HeavyHitter {
                    iteration,
                    estimate,
                    key: None,
                });
            }
        }
        let hashes: Vec<u64> = keys.iter().map(|k| k.0).collect();
        self.heavy(side).extend(&hashes, iteration);
        match side {
            Side::Build => self.m.build_heavy_hitters.add(keys.len()),
            Side::Probe => self.m.heavy_hitters.add(keys.len()),
        }
        hashes
    }

    /// Waits until the build-side heavy hitters are final (every round announced).
    pub(super) async fn build_list_final(&self) {
        let mut rounds = self.build_rounds.subscribe();
        let _ = rounds.wait_for(|r| *r >= self.build_iterations).await;
    }

    /// Waits until the build-side heavy hitters are final, then says whether there are
    /// any. Without them no build row is kept, no probe row is broadcast or set aside
    /// for SFR, and every worker knows it: the joins of those rows need not wait for
    /// the peers' ends (which come only after their routing).
    pub(super) async fn any_build_heavy(&self) -> bool {
        self.build_list_final().await;
        !self.build_heavy.hashes.read().is_empty()
    }

    pub(super) fn build_list_is_final(&self) -> bool {
        *self.build_rounds.borrow() >= self.build_iterations
    }

    pub(super) fn open_send(
        &self,
        exchange: u32,
        destinations: Vec<NodeId>,
    ) -> Result<SendEndpoint> {
        self.qc.open_send(exchange, self.partition, destinations)
    }

    pub(super) fn open_receive(
        &self,
        exchange: u32,
        sources: Vec<(u32, NodeId)>,
    ) -> Result<ReceiveEndpoint> {
        self.qc
            .transport
            .open_receive(ReceiveSpec {
                query: self.qc.query_id,
                exchange,
                sources,
            })
            .map_err(transport_err)
    }

    pub(super) fn outlet(&self, to: To, schema: &SchemaRef, ep: &SendEndpoint) -> Result<Outlet> {
        Outlet::of_query(to, schema, &self.qc, ep)
    }

    /// Fails `ep` (its receivers learn why) and passes the error on.
    pub(super) fn fail(&self, ep: &SendEndpoint, e: DataFusionError) -> DataFusionError {
        ep.fail(&format!(
            "{} failed in a Flow-Join: {e}",
            node_name(self.qc.me())
        ));
        e
    }
}

/// A batch with its join key columns and their partitioning hashes (DataFusion's
/// repartition hash, so `hash % n` is the row's owner).
pub(super) struct Hashed {
    pub(super) batch: RecordBatch,
    pub(super) keys: Vec<ArrayRef>,
    pub(super) hashes: Vec<u64>,
}

impl Hashed {
    pub(super) fn new(keys: &[PhysicalExprRef], batch: RecordBatch) -> Result<Self> {
        let arrays = keys
            .iter()
            .map(|e| e.evaluate(&batch)?.into_array(batch.num_rows()))
            .collect::<Result<Vec<_>>>()?;
        let mut hashes = Vec::new();
        hash_keys(&arrays, batch.num_rows(), &mut hashes)?;
        Ok(Self {
            batch,
            keys: arrays,
            hashes,
        })
    }
}

pub(super) async fn send_control(ep: &SendEndpoint, to: To, msg: &Control) -> Result<()> {
    let mut buf = ep.acquire(to).await.map_err(transport_err)?;
    buf.extend_from_slice(&msg.encode());
    ep.put(buf, false).map_err(transport_err)
}

/// The next control message on `ep` and its sender, skipping empty messages (the
/// ends of streams); `None` once every source has ended.
pub(super) async fn next_control(ep: &ReceiveEndpoint) -> Result<Option<(Control, NodeId)>> {
    while let Some(msg) = ep.get().await.map_err(transport_err)? {
        if msg.data().is_empty() {
            ep.release(msg);
            continue;
        }
        let (control, from) = (Control::decode(msg.data()), msg.node);
        ep.release(msg);
        let control = control.map_err(|e| {
            internal_datafusion_err!(
                "bad Flow-Join control message from {}: {e}",
                node_name(from)
            )
        })?;
        return Ok(Some((control, from)));
    }
    Ok(None)
}

pub(super) fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

/// Remembers the key value of a heavy hash (for `EXPLAIN ANALYZE`).
pub(super) fn name_heavy_hitter(
    sh: &Shared,
    side: Side,
    hash: u64,
    arrays: &[ArrayRef],
    row: usize,
) {
    let mut report = sh.report.lock();
    let Some(h) = report.heavy_of(side).get_mut(&hash) else {
        return;
    };
    if h.key.is_some() {
        return;
    }
    let text: Vec<String> = arrays
        .iter()
        .map(|a| {
            ScalarValue::try_from_array(a, row)
                .map(|v| v.to_string())
                .unwrap_or_else(|_| "?".into())
        })
        .collect();
    h.key = Some(if text.len() == 1 {
        text.into_iter().next().unwrap_or_default()
    } else {
        format!("({})", text.join(", "))
    });
}
