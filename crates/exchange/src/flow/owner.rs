//! The owner task and the drains: the build side of the usual join and of the heavy
//! joins.
//!
//! The owner's states:
//! - *Collecting*: reads this worker's build partition; a join that routes its build
//!   input then waits for the final build-side list and moves the rows of build-heavy
//!   keys (received before a key was found heavy) to the join of those keys; a
//!   build-preserving join numbers the rows. The partition goes to the usual join.
//! - *Broadcasting*: for each announced round, in order, sends the partition's rows of
//!   that round's heavy hashes to every worker and ends the round's exchange (also when
//!   the round named none). With fetch on demand, each worker's request of a round is
//!   answered to that worker alone, with the rows of the keys it named, and its stream
//!   to that worker ends there, so the worker's heavy join of the round waits for no
//!   other worker's progress (rounds may interleave).
//! - *Done* once every round was announced (or requested by every worker); a stream
//!   of them that ends earlier is an error.
//!
//! The build partition counts against the worker's memory pool (as `FlowJoinExec[p]
//! build partition`) from its first row until the usual join has it: from then on the
//! join's hash table holds the same batches and its own reservation counts them.
//!
//! A drain (one per round) collects the heavy build rows all owners broadcast for its
//! round. It answers as soon as the round is announced without heavy hitters, or
//! otherwise when every owner ended the round's broadcast.

use super::announcements::announced_empty;
use super::lookup::{HashSetU64, Modulo};
use super::matches::number_rows;
use super::shared::{Hashed, Shared, name_heavy_hitter};
use crate::memory::collect_counted;
use crate::sender::{SendMetrics, transport_err};
use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, internal_datafusion_err};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::StreamExt;
use gyre_join::flow::control::Side;
use gyre_transport::{SendEndpoint, To};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// What an owner is asked to send in one detection round: the rows of `hashes`, to
/// every worker (an announcement of the global list) or to one (a fetch request).
pub(super) struct Wanted {
    pub(super) round: u32,
    pub(super) hashes: Vec<u64>,
    pub(super) to: To,
}

/// Collects the build partition for the usual join, then sends, for every detection
/// round, the rows of the hashes wanted in it, and ends that round's exchange after
/// `askers` requests of the round (1: the announcement of the global list; every
/// worker with fetch on demand), also when they name none. With `numbered`
/// (build-preserving joins), the rows get their ids first, and the numbered partition
/// also goes to the end phase.
/// With `kept` (joins that route their build input), the rows of build-heavy keys go
/// there instead, once the build side's heavy hitters are final.
#[allow(clippy::too_many_arguments)]
pub(super) async fn own(
    sh: Arc<Shared>,
    input: SendableRecordBatchStream,
    keys: Vec<PhysicalExprRef>,
    build_tx: oneshot::Sender<Result<Vec<RecordBatch>>>,
    numbered: Option<(SchemaRef, oneshot::Sender<Result<Vec<RecordBatch>>>)>,
    kept: Option<mpsc::UnboundedSender<RecordBatch>>,
    eps: Vec<SendEndpoint>,
    mut wanted_rx: mpsc::UnboundedReceiver<Wanted>,
    askers: usize,
    memory: MemoryReservation,
) -> Result<()> {
    let fail_all = |e: DataFusionError| {
        let text = e.to_string();
        for ep in &eps {
            sh.fail(ep, DataFusionError::Execution(text.clone()));
        }
        e
    };
    let mut schema = input.schema();
    let collected = async {
        let b = collect_counted(input, &memory).await?;
        let b = match kept {
            Some(kept) => split_build_heavy(&sh, &keys, b, kept).await?,
            None => b,
        };
        match &numbered {
            Some((numbered_schema, _)) => number_rows(sh.partition, &b, numbered_schema),
            None => Ok(b),
        }
    }
    .await;
    let batches = match collected {
        Ok(b) => b,
        Err(e) => {
            let text = e.to_string();
            let _ = build_tx.send(Err(e));
            if let Some((_, tx)) = numbered {
                let _ = tx.send(Err(DataFusionError::Execution(text.clone())));
            }
            return Err(fail_all(DataFusionError::Execution(text)));
        }
    };
    sh.trace(
        "owner",
        format_args!(
            "build partition collected ({} rows)",
            batches.iter().map(RecordBatch::num_rows).sum::<usize>()
        ),
    );
    let _ = build_tx.send(Ok(batches.clone()));
    // The usual join's reservation counts these batches once it has collected them.
    memory.free();
    if let Some((numbered_schema, tx)) = numbered {
        schema = numbered_schema;
        let _ = tx.send(Ok(batches.clone()));
    }
    let result = async {
        let mut index: Option<ByHash> = None;
        let metrics = SendMetrics::new(&ExecutionPlanMetricsSet::new(), sh.partition);
        let mut asked = vec![0usize; eps.len()];
        let mine = Modulo::new(sh.n() as u64);
        while let Some(Wanted { round, hashes, to }) = wanted_rx.recv().await {
            let Some(ep) = eps.get(round as usize) else {
                return Err(internal_datafusion_err!(
                    "heavy hitters wanted for round {round} of {}",
                    eps.len()
                ));
            };
            if asked[round as usize] == askers {
                return Err(internal_datafusion_err!(
                    "more than {askers} requests for the heavy build rows of round {round}"
                ));
            }
            // Only the keys this worker owns have rows here.
            let mut wanted: Vec<u64> = hashes
                .into_iter()
                .filter(|&h| mine.of(h) == sh.partition as u64)
                .collect();
            if !wanted.is_empty() {
                // Indexed once, on the first request that names any key.
                let index = match &mut index {
                    Some(i) => i,
                    None => index.insert(ByHash::new(&keys, &batches, askers > 1)?),
                };
                wanted.sort_unstable();
                wanted.dedup();
                let mut outlet = sh.outlet(to, &schema, ep)?;
                for (h, idx) in index.rows_of(&wanted) {
                    for &i in &idx {
                        name_heavy_hitter(
                            &sh,
                            Side::Probe,
                            h.hashes[i as usize],
                            &h.keys,
                            i as usize,
                        );
                    }
                    sh.m.build_rows_broadcast.add(idx.len());
                    sh.build_rows_shared
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    let part = take_record_batch(&h.batch, &UInt32Array::from(idx))?;
                    outlet.push(ep, part, &metrics).await?;
                }
                outlet.flush(ep, &metrics).await?;
            }
            // A fetch request's answer is complete: that worker's heavy join of the
            // round need not wait for the others' requests.
            if let To::Node(_) = to {
                let end = ep.acquire(to).await.map_err(transport_err)?;
                ep.put(end, true).map_err(transport_err)?;
            }
            asked[round as usize] += 1;
            if asked[round as usize] == askers {
                sh.trace("owner", format_args!("round {round} broadcast ends"));
                ep.finish();
            }
        }
        if let Some(r) = asked.iter().position(|&a| a < askers) {
            return Err(internal_datafusion_err!(
                "Flow-Join detection ended before round {r} was {}",
                match askers {
                    1 => "announced".to_string(),
                    n => format!("asked for by all {n} workers (only {} did)", asked[r]),
                }
            ));
        }
        Ok(())
    }
    .await;
    result.map_err(fail_all)
}

/// The build partition's rows with their partitioning hashes, computed once. With
/// fetch on demand every worker asks in every round, and a scan of the partition per
/// request would read it `workers x rounds` times: there the rows are also sorted by
/// hash once (16 bytes per row), and each request finds its rows by binary search.
/// The global list's few announcements scan.
struct ByHash {
    batches: Vec<Hashed>,
    /// (hash, batch, row), sorted; empty when not indexed.
    rows: Vec<(u64, u32, u32)>,
}

impl ByHash {
    fn new(keys: &[PhysicalExprRef], batches: &[RecordBatch], indexed: bool) -> Result<Self> {
        let batches: Vec<Hashed> = batches
            .iter()
            .map(|b| Hashed::new(keys, b.clone()))
            .collect::<Result<_>>()?;
        let mut rows = Vec::new();
        if indexed {
            rows.reserve(batches.iter().map(|h| h.hashes.len()).sum());
            for (b, h) in batches.iter().enumerate() {
                rows.extend(
                    h.hashes
                        .iter()
                        .enumerate()
                        .map(|(r, &x)| (x, b as u32, r as u32)),
                );
            }
            rows.sort_unstable();
        }
        Ok(Self { batches, rows })
    }

    /// The rows of `wanted` (sorted hashes), by batch, in row order.
    fn rows_of(&self, wanted: &[u64]) -> Vec<(&Hashed, Vec<u32>)> {
        if self.rows.is_empty() {
            let wanted: HashSetU64 = wanted.iter().copied().collect();
            return self
                .batches
                .iter()
                .map(|h| {
                    let idx: Vec<u32> = (0..h.hashes.len() as u32)
                        .filter(|&i| wanted.contains(&h.hashes[i as usize]))
                        .collect();
                    (h, idx)
                })
                .filter(|(_, idx)| !idx.is_empty())
                .collect();
        }
        let mut by_batch: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &x in wanted {
            let from = self.rows.partition_point(|r| r.0 < x);
            for &(_, b, r) in self.rows[from..].iter().take_while(|r| r.0 == x) {
                by_batch.entry(b).or_default().push(r);
            }
        }
        by_batch
            .into_iter()
            .map(|(b, mut idx)| {
                idx.sort_unstable();
                (&self.batches[b as usize], idx)
            })
            .collect()
    }
}

/// The owner's part in a join that routes its build input: once the build side's heavy
/// hitters are final, moves the received rows of those keys (sent before a key was
/// found heavy) to the join of build-heavy keys, and returns the rest.
pub(super) async fn split_build_heavy(
    sh: &Shared,
    keys: &[PhysicalExprRef],
    batches: Vec<RecordBatch>,
    kept: mpsc::UnboundedSender<RecordBatch>,
) -> Result<Vec<RecordBatch>> {
    sh.build_list_final().await;
    let heavy: HashSetU64 = sh.build_heavy.hashes.read().iter().map(|h| h.0).collect();
    if heavy.is_empty() {
        return Ok(batches);
    }
    let mut rest = Vec::with_capacity(batches.len());
    for b in batches {
        let h = Hashed::new(keys, b)?;
        let (go, stay): (Vec<u32>, Vec<u32>) =
            (0..h.hashes.len() as u32).partition(|&i| heavy.contains(&h.hashes[i as usize]));
        if go.is_empty() {
            rest.push(h.batch);
            continue;
        }
        // The receiver is gone only when the query's output was dropped.
        let _ = kept.send(take_record_batch(&h.batch, &UInt32Array::from(go))?);
        if !stay.is_empty() {
            rest.push(take_record_batch(&h.batch, &UInt32Array::from(stay))?);
        }
    }
    Ok(rest)
}

/// Collects the heavy build rows every owner broadcasts for `round`. A round announced
/// without heavy hitters has none, so its join gets its (empty) build side at the
/// announcement, not after every owner's end of stream; the stream is still read to
/// its end, and a row on it is an error.
pub(super) async fn drain(
    sh: Arc<Shared>,
    round: u32,
    mut input: SendableRecordBatchStream,
    tx: oneshot::Sender<Result<Vec<RecordBatch>>>,
) -> Result<()> {
    let mut tx = Some(tx);
    let mut batches = Vec::new();
    let quiet = announced_empty(&sh.rounds, &sh.heavy, round);
    tokio::pin!(quiet);
    loop {
        tokio::select! {
            next = input.next() => match next {
                Some(Ok(b)) => batches.push(b),
                Some(Err(e)) => {
                    let text = e.to_string();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(Err(e));
                    }
                    return Err(DataFusionError::Execution(text));
                }
                None => break,
            },
            // Once `tx` is used, the round's answer is given.
            () = &mut quiet, if tx.is_some() => {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Ok(Vec::new()));
                }
            }
        }
    }
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    sh.trace(
        "drain",
        format_args!("round {round} complete ({rows} heavy build rows)"),
    );
    sh.m.heavy_build_rows_received.add(rows);
    match tx {
        Some(tx) => {
            let _ = tx.send(Ok(batches));
            Ok(())
        }
        None if rows > 0 => Err(internal_datafusion_err!(
            "{rows} heavy build rows arrived for detection round {round}, announced without heavy hitters"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    /// The index finds exactly the rows a scan of every batch finds, in row order, and
    /// so does the unindexed scan.
    #[test]
    fn rows_by_hash_are_the_rows_a_scan_finds() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let batches: Vec<RecordBatch> = (0..3)
            .map(|b| {
                let keys: Int64Array = (0..1000)
                    .map(|i| match i % 7 {
                        0 => None,
                        _ => Some((i * (b + 1)) % 50),
                    })
                    .collect();
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys)]).unwrap()
            })
            .collect();
        let keys: Vec<PhysicalExprRef> = vec![Arc::new(Column::new("k", 0))];
        let index = ByHash::new(&keys, &batches, true).unwrap();
        let scan = ByHash::new(&keys, &batches, false).unwrap();
        let all: Vec<u64> = {
            let mut h: Vec<u64> = index.rows.iter().map(|r| r.0).collect();
            h.dedup();
            h
        };
        // Every third hash, plus one no row has.
        let mut wanted: Vec<u64> = all.iter().step_by(3).copied().collect();
        wanted.push(all.iter().max().unwrap().wrapping_add(1));
        wanted.sort_unstable();
        let found = index.rows_of(&wanted);
        let scanned_rows = scan.rows_of(&wanted);
        assert_eq!(found.len(), scanned_rows.len());
        for ((_, a), (_, b)) in found.iter().zip(&scanned_rows) {
            assert_eq!(a, b);
        }
        let mut scanned = 0;
        for (b, h) in index.batches.iter().enumerate() {
            let expected: Vec<u32> = (0..h.hashes.len() as u32)
                .filter(|&i| wanted.binary_search(&h.hashes[i as usize]).is_ok())
                .collect();
            scanned += expected.len();
            let got = found
                .iter()
                .find(|(f, _)| std::ptr::eq(*f, h))
                .map(|(_, idx)| idx.clone())
                .unwrap_or_default();
            assert_eq!(got, expected, "batch {b}");
        }
        assert!(scanned > 100);
    }
}
