//! Symmetric Fragment Replicate for keys heavy on both sides (Rödiger, *Scalable
//! Distributed Query Processing in Parallel Main-Memory Database Systems*, 4.4.2).
//!
//! The task waits until both sides' lists are final and the probe router is done. Each
//! key heavy on both sides gets the grid of least cost for its estimated rows
//! (`gyre_join::flow::sfr::choose_grid`, the same on every worker); this worker sends
//! its kept build rows of the key to the nodes of its grid column and its set-aside
//! probe rows to the nodes of its grid row, so every build-probe pair meets once. Then
//! it ends both exchanges; on an error it fails them.

use super::lookup::HashSetU64;
use super::shared::{Hashed, Shared, name_heavy_hitter};
use crate::memory::collect_counted;
use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{Result, internal_datafusion_err};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::PhysicalExprRef;
use futures::StreamExt;
use gyre_join::flow::control::Side;
use gyre_join::flow::sfr::{Grid, choose_grid};
use gyre_transport::{SendEndpoint, To};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Symmetric Fragment Replicate (thesis 4.4.2) for the keys heavy on both sides, once
/// every list is final: each such key gets the grid of least cost for its estimated
/// build and probe rows (`gyre_join::flow::sfr::choose_grid`, the same announced
/// estimates on every worker). This worker, at (row `me / cols`, column
/// `me % cols`), sends its kept build rows of the key to every node of its column and
/// the probe rows it set aside to every node of its row, so each build-probe pair
/// meets exactly once, on one more join per worker. Build rows take part in the
/// broadcast join too, which holds the probe rows routed before their key was heavy
/// on both sides. A build-preserving join's kept build rows carry their ids here, so
/// that their owner can combine the matches of every copy. `keys`, `eps` and
/// `schemas`: build, then probe. The probe rows set aside count in `memory` until
/// they are sent.
pub(super) async fn replicate_sfr(
    sh: Arc<Shared>,
    [build_keys, probe_keys]: [Vec<PhysicalExprRef>; 2],
    kept: oneshot::Receiver<Vec<RecordBatch>>,
    set_aside: mpsc::UnboundedReceiver<RecordBatch>,
    eps: [SendEndpoint; 2],
    schemas: [SchemaRef; 2],
    memory: MemoryReservation,
) -> Result<()> {
    let result = async {
        if !sh.any_build_heavy().await {
            return Ok(());
        }
        // Complete when the probe router is done; held until they are replicated.
        let set_aside = UnboundedReceiverStream::new(set_aside).map(Ok);
        let probe = collect_counted(set_aside, &memory).await?;
        let mut rounds = sh.rounds.subscribe();
        let _ = rounds.wait_for(|r| *r >= sh.probe_iterations).await;
        let (n, me) = (sh.n(), sh.partition);
        let grids: std::collections::HashMap<u64, Grid> = {
            let mut report = sh.report.lock();
            let grids: std::collections::HashMap<u64, Grid> = report
                .build_heavy
                .iter()
                .filter_map(|(hash, b)| {
                    let p = report.heavy.get(hash)?;
                    let grid = choose_grid(n, b.estimate.max(1) as f64, p.estimate.max(1) as f64);
                    Some((*hash, grid))
                })
                .collect();
            report.sfr = grids.iter().map(|(h, g)| (*h, (g.rows, g.cols))).collect();
            grids
        };
        // Without such keys the peers' joins get only this worker's ends.
        let kept = match grids.is_empty() {
            true => Vec::new(),
            // The join of build-heavy keys sends them; it is gone only when the query's
            // output was dropped.
            false => kept.await.unwrap_or_default(),
        };
        let sides = [
            (
                &eps[0],
                &schemas[0],
                &build_keys,
                kept,
                &sh.m.sfr_build_rows_sent,
                true,
            ),
            (
                &eps[1],
                &schemas[1],
                &probe_keys,
                probe,
                &sh.m.sfr_probe_rows_sent,
                false,
            ),
        ];
        for (ep, schema, keys, batches, sent, is_build) in sides {
            let mut outlets = sh
                .qc
                .workers
                .iter()
                .map(|w| sh.outlet(To::Node(*w), schema, ep))
                .collect::<Result<Vec<_>>>()?;
            let mut by_node: Vec<Vec<u32>> = vec![Vec::new(); n];
            let mut named = HashSetU64::default();
            let side = if is_build { Side::Build } else { Side::Probe };
            for batch in batches {
                let h = Hashed::new(keys, batch)?;
                for (i, hash) in h.hashes.iter().enumerate() {
                    let Some(g) = grids.get(hash) else {
                        if is_build {
                            continue; // heavy on the build side only
                        }
                        return Err(internal_datafusion_err!(
                            "a probe row set aside for SFR whose key is not heavy on both sides"
                        ));
                    };
                    if named.insert(*hash) {
                        name_heavy_hitter(&sh, side, *hash, &h.keys, i);
                    }
                    let i = i as u32;
                    if is_build {
                        // This worker's column: one node in every row.
                        g.build_targets(me).for_each(|node| by_node[node].push(i));
                    } else {
                        // This worker's row: every node in it.
                        g.probe_targets(me).for_each(|node| by_node[node].push(i));
                    }
                }
                for (node, idx) in by_node.iter_mut().enumerate() {
                    if idx.is_empty() {
                        continue;
                    }
                    sent.add(idx.len());
                    if is_build && node != me {
                        // Its matches there come back to this worker at the end.
                        sh.build_rows_shared
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    let part =
                        take_record_batch(&h.batch, &UInt32Array::from(std::mem::take(idx)))?;
                    outlets[node].push(ep, part, &sh.send_m).await?;
                }
            }
            for o in &mut outlets {
                o.flush(ep, &sh.send_m).await?;
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            eps.iter().for_each(SendEndpoint::finish);
            Ok(())
        }
        Err(e) => {
            let e = sh.fail(&eps[0], e);
            Err(sh.fail(&eps[1], e))
        }
    }
}
