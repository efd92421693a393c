//! The router task: reads one side's local input and sends each row to the worker that
//! owns its hash, keeps it here, or broadcasts it.
//!
//! Every batch is hashed (DataFusion's repartition hash) and a sample of the hashes is
//! counted in the SpaceSaving histogram; at each detection point the router reports its
//! candidates to worker 0, or, with fetch on demand, takes them as heavy at once and
//! asks every owner for their build rows ([`Control::Fetch`]). Its states:
//!
//! - *Routing*: each row goes to its owner, or, when its hash is heavy, to the local
//!   join of the round that found it (probe side), to every worker (probe rows of keys
//!   heavy on the build side), aside for SFR (keys heavy on both sides), or to the
//!   local join of build-heavy keys (build side).
//! - *Holding for round 0* (global list only): after reporting round 0 with candidates
//!   of its own, the
//!   router keeps reading but holds the rows back, so that the first heavy hitters
//!   apply to nearly all of them. At `HOLD_MIN_ROWS` (or 5% of the expected input) or
//!   at the end of the input it waits at most `FIRST_ROUND_WAIT` for the answer, since a
//!   peer may depend on this worker's progress before it reports.
//! - *Holding for the build list*: the probe router of a join that routes its build
//!   input holds rows until the build side's heavy hitters are final (a probe row of
//!   such a key must reach every worker); this wait has no limit.
//! - *Finishing*: final reports, held rows released, outlets flushed, endpoints ended.
//!   On an error every endpoint it sends on is failed, so the peers learn why.

use super::lookup::{HashSetU64, Modulo};
use super::matches::RowIds;
use super::shared::{Hashed, Shared, name_heavy_hitter, send_control};
use crate::sender::Outlet;
use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{Result, internal_datafusion_err};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;
use gyre_join::flow::control::{Control, Side};
use gyre_join::flow::detect::{FIRST_ROUND_WAIT, NodeDetector, NodeReport};
use gyre_join::flow::direct_map::DirectMap;
use gyre_transport::{SendEndpoint, To};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Rows a router holds back at least while waiting for round 0 (else 5% of its input).
pub(super) const HOLD_MIN_ROWS: u64 = 65_536;

/// The detection reports' endpoint, which the build and probe routers share: finished
/// when the last of them is done.
pub(super) struct Reports {
    pub(super) ep: SendEndpoint,
    pub(super) users: std::sync::atomic::AtomicUsize,
}

impl Reports {
    pub(super) fn done(&self) {
        if self.users.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            self.ep.finish();
        }
    }
}

/// Probe side of a join that routes its build input: where the probe rows of keys heavy
/// on the build side go (every worker).
pub(super) struct ProbeBroadcast {
    pub(super) ep: SendEndpoint,
    pub(super) outlet: Outlet,
    /// Probe-preserving joins: numbers those rows (`super::matches`) and keeps them
    /// for the end, when this worker emits them by their combined matches.
    pub(super) retained: Option<(RowIds, mpsc::UnboundedSender<RecordBatch>)>,
    /// With SFR: where probe rows of keys heavy on both sides are set aside.
    pub(super) set_aside: Option<mpsc::UnboundedSender<RecordBatch>>,
}

impl ProbeBroadcast {
    /// `part` as it leaves this worker: numbered and kept for the end when the probe
    /// side is tracked (broadcast and set-aside rows share one numbering).
    pub(super) fn leaving(&mut self, part: RecordBatch) -> Result<RecordBatch> {
        let Some((ids, retained)) = &mut self.retained else {
            return Ok(part);
        };
        let part = ids.number(&part)?;
        // The receiver is gone only when the query's output was dropped.
        let _ = retained.send(part.clone());
        Ok(part)
    }
}

/// Routes one side's local input. Probe rows with a heavy hash stay (into the heavy
/// join of the round that found the hash), probe rows whose key is heavy on the build
/// side go to every worker, build rows whose key is heavy on the build side stay (into
/// the join of those keys); the rest go to their owners.
pub(super) struct Router {
    sh: Arc<Shared>,
    side: Side,
    keys: Vec<PhysicalExprRef>,
    ep: SendEndpoint,
    outlets: Vec<Outlet>,
    /// Local slots: the probe side's heavy join per detection round, or the build
    /// side's join of build-heavy keys.
    local_txs: Vec<mpsc::UnboundedSender<RecordBatch>>,
    /// Probe side of a join that routes its build input: the broadcast of probe rows
    /// whose key is heavy on the build side.
    bcast: Option<ProbeBroadcast>,
    detector: NodeDetector,
    /// Heavy hash -> its destination index in `dests`.
    heavy: DirectMap<u32>,
    /// How many of the shared heavy hashes `heavy` holds.
    heavy_seen: usize,
    named: HashSetU64,
    /// Row indices of a batch by destination: owners `0..n`, then the local slots
    /// (`n + slot`), then the broadcast, then the rows set aside for SFR.
    dests: Vec<Vec<u32>>,
    owner: Modulo,
    routed: u64,
    /// Where counting resumes in the next batch (sampling spans batches).
    next_counted: usize,
    /// Rows held back after reporting round 0, until its answer (see `run`).
    hold_limit: u64,
    /// Fetch on demand (probe side): where this worker asks every owner for the build
    /// rows of the keys it found heavy.
    fetch: Option<SendEndpoint>,
}

impl Router {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        sh: &Arc<Shared>,
        side: Side,
        schema: &SchemaRef,
        keys: Vec<PhysicalExprRef>,
        ep: SendEndpoint,
        local_txs: Vec<mpsc::UnboundedSender<RecordBatch>>,
        bcast: Option<ProbeBroadcast>,
        config: &gyre_join::flow::DetectionConfig,
        expected: u64,
        fetch: Option<SendEndpoint>,
    ) -> Result<Self> {
        let n = sh.n();
        let outlets = sh
            .qc
            .workers
            .iter()
            .map(|w| sh.outlet(To::Node(*w), schema, &ep))
            .collect::<Result<Vec<_>>>()?;
        let slots = local_txs.len();
        Ok(Self {
            sh: Arc::clone(sh),
            side,
            keys,
            ep,
            outlets,
            local_txs,
            bcast,
            detector: NodeDetector::new(config, 1, expected),
            heavy: DirectMap::default(),
            heavy_seen: 0,
            named: HashSetU64::default(),
            dests: vec![Vec::new(); n + slots + 2],
            owner: Modulo::new(n as u64),
            routed: 0,
            next_counted: 0,
            hold_limit: (expected / 20).max(HOLD_MIN_ROWS),
            fetch,
        })
    }

    /// Takes in the heavy hashes announced since the last look.
    fn refresh(&mut self) {
        let n = self.sh.n() as u32;
        let hashes = self.sh.heavy(self.side).hashes.read();
        if hashes.len() > self.heavy_seen {
            if self.heavy.is_empty() && self.side == Side::Probe {
                self.sh.m.first_heavy_after_rows.set(self.routed as usize);
            }
            let broadcast = n + self.local_txs.len() as u32;
            let sfr = self.bcast.as_ref().is_some_and(|b| b.set_aside.is_some());
            for &(hash, round) in &hashes[self.heavy_seen..] {
                // A hash announced twice keeps the round that found it first, and a
                // probe row whose key is heavy on the build side is broadcast, or with
                // SFR set aside once the key is heavy on the probe side too.
                match self.heavy.get(hash) {
                    None => {
                        let slot = match self.side {
                            Side::Probe => round,
                            Side::Build => 0,
                        };
                        self.heavy.insert(hash, n + slot);
                    }
                    Some(d) if d == broadcast && sfr => self.heavy.insert(hash, broadcast + 1),
                    Some(_) => {}
                }
            }
            self.heavy_seen = hashes.len();
        }
    }

    /// Probe side: takes in the final build-side heavy hashes, before any row is routed.
    fn take_build_list(&mut self) {
        let n = self.sh.n() as u32;
        let broadcast = n + self.local_txs.len() as u32;
        for &(hash, _) in self.sh.build_heavy.hashes.read().iter() {
            self.heavy.insert(hash, broadcast);
        }
        // Probe-side heavy hashes taken in before (none routed yet) are looked at
        // again: with SFR, those heavy on both sides are set aside.
        self.heavy_seen = 0;
    }

    /// Routes the rows held back, with what is known now.
    async fn release(&mut self, held: &mut Vec<Hashed>) -> Result<()> {
        self.refresh();
        for h in std::mem::take(held) {
            self.route(&h).await?;
        }
        Ok(())
    }

    /// Rows are held back (not routed) while the input keeps flowing:
    /// - after round 0 was reported with candidates, so that the first heavy hitters
    ///   apply to nearly all rows without idling. At `hold_limit` rows, or at the end
    ///   of the input, the router waits for the answer at most [`FIRST_ROUND_WAIT`]: a
    ///   peer whose input depends on this worker's progress (through an upstream
    ///   exchange) may not report until this one goes on;
    /// - on the probe side of a join that routes its build input, until the build
    ///   side's heavy hitters are final: a probe row of such a key must reach every
    ///   worker. That wait has no limit; the join could not probe before its build side
    ///   is complete anyway.
    pub(super) async fn run(
        mut self,
        mut input: SendableRecordBatchStream,
        reports: Arc<Reports>,
    ) -> Result<()> {
        let side = self.side;
        self.sh
            .trace("router", format_args!("{side:?} side starts"));
        let result = async {
            let mut awaiting = false;
            let mut build_pending = self.bcast.is_some();
            let mut held: Vec<Hashed> = Vec::new();
            let mut held_rows = 0u64;
            let mut read = 0usize;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let rows = batch.num_rows();
                read += rows;
                if rows == 0 {
                    continue;
                }
                let hashed = {
                    let timer = self.sh.m.routing_time.clone();
                    let _t = timer.timer();
                    let hashed = Hashed::new(&self.keys, batch)?;
                    self.count(&hashed.hashes);
                    hashed
                };
                // Reported before this batch is routed, so that a batch that reaches
                // round 0 (with the first batches, often the whole input of a small
                // table) is held for its answer too.
                // The final build list first: fetch on demand does not ask for keys
                // whose probe rows are broadcast.
                if build_pending && self.sh.build_list_is_final() {
                    self.take_build_list();
                    build_pending = false;
                }
                for r in self.detector.advance(rows as u64) {
                    // Only with candidates of its own: see `FIRST_ROUND_WAIT`.
                    awaiting |=
                        r.iteration == 0 && !r.candidates.is_empty() && self.fetch.is_none();
                    self.report(&reports.ep, r, true).await?;
                }
                if awaiting || build_pending {
                    held_rows += rows as u64;
                    held.push(hashed);
                    awaiting &= *self.sh.rounds(self.side).borrow() == 0;
                    if held_rows >= self.hold_limit {
                        if build_pending {
                            self.wait_build_list().await;
                            build_pending = false;
                        }
                        if awaiting {
                            self.wait_first_round().await;
                            awaiting = false;
                        }
                    }
                    if !awaiting && !build_pending {
                        held_rows = 0;
                        self.release(&mut held).await?;
                    }
                } else {
                    self.refresh();
                    self.route(&hashed).await?;
                }
            }
            self.sh.trace(
                "router",
                format_args!("{side:?} input ended after {read} rows"),
            );
            let rows_to_come = !held.is_empty();
            for r in self.detector.finish() {
                self.report(&reports.ep, r, rows_to_come).await?;
            }
            if build_pending {
                self.wait_build_list().await;
            }
            if awaiting {
                self.wait_first_round().await;
            }
            self.release(&mut held).await?;
            for o in &mut self.outlets {
                o.flush(&self.ep, &self.sh.send_m).await?;
            }
            if let Some(b) = &mut self.bcast {
                b.outlet.flush(&b.ep, &self.sh.send_m).await?;
            }
            Ok(())
        }
        .await;
        let others = [self.bcast.as_ref().map(|b| &b.ep), self.fetch.as_ref()];
        match result {
            Ok(()) => {
                self.sh.trace("router", format_args!("{side:?} side done"));
                self.ep.finish();
                others.into_iter().flatten().for_each(SendEndpoint::finish);
                reports.done();
                Ok(())
            }
            Err(e) => {
                self.sh
                    .trace("router", format_args!("{side:?} side failed: {e}"));
                let e = self.sh.fail(&self.ep, e);
                let e = others
                    .into_iter()
                    .flatten()
                    .fold(e, |e, ep| self.sh.fail(ep, e));
                Err(self.sh.fail(&reports.ep, e))
            }
        }
    }

    async fn wait_first_round(&self) {
        let _t = self.sh.m.first_round_wait.timer();
        let mut rounds = self.sh.rounds(self.side).subscribe();
        let answered = tokio::time::timeout(FIRST_ROUND_WAIT, rounds.wait_for(|r| *r > 0)).await;
        self.sh.trace(
            "router",
            format_args!(
                "{:?} side: round 0 {}",
                self.side,
                if answered.is_ok() {
                    "answered"
                } else {
                    "not answered in time"
                }
            ),
        );
    }

    /// Probe side of a join that routes its build input: waits for the final build-side
    /// heavy hitters and takes them in.
    async fn wait_build_list(&mut self) {
        {
            let _t = self.sh.m.build_list_wait.timer();
            self.sh.trace(
                "router",
                format_args!("probe side waits for the build list"),
            );
            self.sh.build_list_final().await;
            self.sh.trace("router", format_args!("build list final"));
        }
        self.take_build_list();
    }

    /// Counts a sample of the rows' hashes (sampling continues across batches).
    fn count(&mut self, hashes: &[u64]) {
        let Some(step) = self.detector.step() else {
            return; // detection is over
        };
        let mut h = self.detector.histogram(0).lock().expect("histogram lock");
        let mut i = self.next_counted.min(step - 1);
        while i < hashes.len() {
            h.update(hashes[i]);
            i += step;
        }
        self.next_counted = i - hashes.len();
    }

    async fn route(&mut self, hashed: &Hashed) -> Result<()> {
        let Hashed {
            batch,
            keys,
            hashes,
        } = hashed;
        let rows = batch.num_rows();
        let n = self.sh.n();
        let owner = self.owner;
        {
            let timer = self.sh.m.routing_time.clone();
            let _t = timer.timer();
            self.dests.iter_mut().for_each(Vec::clear);
            if self.heavy.is_empty() {
                for (i, &x) in hashes.iter().enumerate() {
                    self.dests[owner.of(x) as usize].push(i as u32);
                }
            } else {
                for (i, &x) in hashes.iter().enumerate() {
                    let d = match self.heavy.get(x) {
                        Some(d) => d as usize,
                        None => owner.of(x) as usize,
                    };
                    self.dests[d].push(i as u32);
                }
            }
        }
        self.routed += rows as u64;
        match self.side {
            Side::Probe => self.sh.m.probe_rows.add(rows),
            Side::Build => self.sh.m.build_rows.add(rows),
        }
        for q in 0..n {
            let len = self.dests[q].len();
            if len == 0 {
                continue;
            }
            let part = if len == rows {
                batch.clone()
            } else {
                // The index vector becomes the array's buffer, without a copy.
                let idx = UInt32Array::from(std::mem::take(&mut self.dests[q]));
                take_record_batch(batch, &idx)?
            };
            self.outlets[q]
                .push(&self.ep, part, &self.sh.send_m)
                .await?;
        }
        for slot in 0..self.local_txs.len() {
            let idx = std::mem::take(&mut self.dests[n + slot]);
            if idx.is_empty() {
                continue;
            }
            self.name(hashes, keys, &idx);
            match self.side {
                Side::Probe => self.sh.m.probe_rows_local.add(idx.len()),
                Side::Build => self.sh.m.build_rows_local.add(idx.len()),
            }
            let part = take_record_batch(batch, &UInt32Array::from(idx))?;
            // The receiver is gone only when the query's output was dropped.
            let _ = self.local_txs[slot].send(part);
        }
        let broadcast = std::mem::take(&mut self.dests[n + self.local_txs.len()]);
        if !broadcast.is_empty() {
            let Some(b) = &mut self.bcast else {
                return Err(internal_datafusion_err!(
                    "a Flow-Join router without a broadcast has rows to broadcast"
                ));
            };
            self.sh.m.probe_rows_broadcast.add(broadcast.len());
            let part = b.leaving(take_record_batch(batch, &UInt32Array::from(broadcast))?)?;
            b.outlet.push(&b.ep, part, &self.sh.send_m).await?;
        }
        let set_aside = std::mem::take(&mut self.dests[n + self.local_txs.len() + 1]);
        if !set_aside.is_empty() {
            let Some(b) = self.bcast.as_mut().filter(|b| b.set_aside.is_some()) else {
                return Err(internal_datafusion_err!(
                    "a Flow-Join router without SFR has rows to set aside for it"
                ));
            };
            let part = b.leaving(take_record_batch(batch, &UInt32Array::from(set_aside))?)?;
            if let Some(tx) = &b.set_aside {
                // The receiver is gone only when the query failed.
                let _ = tx.send(part);
            }
        }
        Ok(())
    }

    /// Until every heavy hash has a name, looks for rows of the unnamed ones.
    fn name(&mut self, hashes: &[u64], keys: &[ArrayRef], idx: &[u32]) {
        if self.named.len() >= self.heavy.len() {
            return;
        }
        for &i in idx {
            if self.named.insert(hashes[i as usize]) {
                name_heavy_hitter(&self.sh, self.side, hashes[i as usize], keys, i as usize);
            }
        }
    }
    /// Reports a detection round's candidates to worker 0, or, with fetch on demand,
    /// fetches them ([`Router::fetch`]).
    async fn report(&mut self, ep: &SendEndpoint, r: NodeReport, rows_to_come: bool) -> Result<()> {
        self.sh.trace(
            "router",
            format_args!(
                "{:?} side reports round {} ({} candidates)",
                self.side,
                r.iteration,
                r.candidates.len()
            ),
        );
        self.sh.m.quiet_windows.add(usize::from(r.quiet));
        self.sh.m.detection_rounds.add(1);
        if self.fetch.is_some() {
            return self.fetch(r, rows_to_come).await;
        }
        let msg = Control::Report {
            side: self.side,
            iteration: r.iteration,
            window: r.window,
            total: r.processed,
            candidates: r.candidates,
        };
        send_control(ep, To::Node(self.sh.detector_node), &msg).await
    }

    /// Fetch on demand: the round's candidates not known yet become this worker's heavy
    /// hitters of the round at once (its later rows of those keys stay here, in the
    /// round's heavy join), and every owner is asked for their build rows. Its own keys
    /// are asked for too: their rows then skip the exchange to itself, as the global
    /// list's do (without that, 17% more CPU at Zipf 1.25 on 4 workers). Every round sends a
    /// request, also an empty one, so that the owners can end the round; once no rows
    /// are left to route (the input's end), it asks for nothing.
    async fn fetch(&mut self, r: NodeReport, rows_to_come: bool) -> Result<()> {
        self.refresh();
        let keys: Vec<(u64, u64)> = match rows_to_come {
            true => r
                .candidates
                .into_iter()
                .filter(|&(h, _)| self.heavy.get(h).is_none())
                .collect(),
            false => Vec::new(),
        };
        self.sh.adopt_heavy(Side::Probe, r.iteration, &keys);
        let msg = Control::Fetch {
            side: Side::Probe,
            iteration: r.iteration,
            keys,
        };
        let Some(ep) = &self.fetch else {
            return Err(internal_datafusion_err!(
                "a Flow-Join router fetched without requests"
            ));
        };
        send_control(ep, To::All, &msg).await?;
        // The round is decided: its drain may answer, and `refresh` takes the keys in.
        self.sh.rounds.send_modify(|n| *n += 1);
        Ok(())
    }
}
