//! Match combination for the joins that preserve rows joined on several workers.
//!
//! A build row broadcast to every worker (or replicated by SFR) meets probe rows on
//! several workers, so no single worker can tell whether it matched. Those joins run a
//! counterpart that records the ids of the tracked rows it matched ([`track`]). At the
//! end, [`combine_matches`]: sends each owner the ids of its rows matched here, reads
//! the ids peers matched of this worker's rows (only when it shared any), and emits the
//! rows the original join emits at the end (unmatched rows of a left or full join,
//! matched rows of a semi join, ...).

use super::matches::{Matches, Shape};
use super::shared::{Shared, recompute};
use arrow::array::RecordBatch;
use datafusion::common::{Result, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use gyre_join::flow::control::Side;
use gyre_transport::{SendEndpoint, To};
use parking_lot::Mutex;
use std::sync::Arc;

/// A counterpart join's output: records the tracked rows it matched (ids in the shape's
/// row id column, and with `also` the other side's in the next), passes on what the
/// original join emits now.
pub(super) fn track(
    s: SendableRecordBatchStream,
    shape: Arc<Shape>,
    matches: Arc<Mutex<Matches>>,
    also: Option<Arc<Mutex<Matches>>>,
) -> BoxStream<'static, Result<RecordBatch>> {
    let column = shape.row_id_column();
    s.filter_map(move |b| {
        let out = b.and_then(|b| {
            matches.lock().record(b.column(column).as_ref())?;
            if let Some(also) = &also {
                also.lock().record(b.column(column + 1).as_ref())?;
            }
            shape.streamed(&b)
        });
        futures::future::ready(out.transpose())
    })
    .boxed()
}

/// A tracked side's shape and the matches this worker's joins found for it.
pub(super) type Tracker = (Arc<Shape>, Arc<Mutex<Matches>>);

/// `join` over `build` and `probe`: the original join, or, with trackers (build,
/// probe), its counterpart recording the tracked sides' matches. These are the joins of
/// build-heavy keys: probe-preserving joins track the probe rows broadcast or
/// replicated there, build-preserving joins with SFR their kept build rows, full joins
/// with SFR both.
pub(super) fn tracked_join(
    join: &Arc<dyn ExecutionPlan>,
    trackers: (Option<&Tracker>, Option<&Tracker>),
    build: Arc<dyn ExecutionPlan>,
    probe: Arc<dyn ExecutionPlan>,
    partition: usize,
    ctx: Arc<TaskContext>,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let hj = || {
        join.downcast_ref::<HashJoinExec>()
            .ok_or_else(|| internal_datafusion_err!("a Flow-Join without a hash join"))
    };
    Ok(match trackers {
        (None, None) => Arc::clone(join)
            .replace_children(vec![build, probe], recompute())?
            .execute(partition, ctx)?
            .boxed(),
        (Some((shape, matches)), None) | (None, Some((shape, matches))) => {
            let s = shape.join(hj()?, build, probe)?.execute(partition, ctx)?;
            track(s, Arc::clone(shape), Arc::clone(matches), None)
        }
        (Some((shape, build_matches)), Some((_, probe_matches))) => {
            let s = shape
                .join_both_tracked(hj()?, build, probe)?
                .execute(partition, ctx)?;
            let also = Some(Arc::clone(probe_matches));
            track(s, Arc::clone(shape), Arc::clone(build_matches), also)
        }
    })
}

/// The end of a join that tracks one side's rows (`super::matches`) on one worker, once
/// its joins are done: sends the other workers' matched rows to them, takes in the
/// matches peers report for this worker's rows, and returns the rows the original join
/// emits at the end. `rows` are this worker's tracked rows with their ids: its build
/// partition (and with SFR its kept build rows), or the probe rows it broadcast
/// (complete when its router is done).
pub(super) async fn combine_matches(
    sh: Arc<Shared>,
    side: Side,
    shape: Arc<Shape>,
    matches: Arc<Mutex<Matches>>,
    ep: SendEndpoint,
    mut reports: SendableRecordBatchStream,
    rows: BoxFuture<'static, Result<Vec<RecordBatch>>>,
) -> Result<Vec<RecordBatch>> {
    let (sent_metric, received_metric) = match side {
        Side::Build => (&sh.m.build_matches_sent, &sh.m.build_matches_received),
        Side::Probe => (&sh.m.probe_matches_sent, &sh.m.probe_matches_received),
    };
    let schema = reports.schema();
    sh.trace("match combination", format_args!("{side:?} side starts"));
    let sent = async {
        let by_owner = matches.lock().take_remote();
        for (owner, ids) in by_owner.into_iter().enumerate() {
            if ids.is_empty() {
                continue;
            }
            sent_metric.add(ids.len());
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(arrow::array::UInt64Array::from(ids))],
            )?;
            let mut outlet = sh.outlet(To::Node(sh.qc.workers[owner]), &schema, &ep)?;
            outlet.push(&ep, batch, &sh.send_m).await?;
            outlet.flush(&ep, &sh.send_m).await?;
        }
        Ok(())
    }
    .await;
    match sent {
        Ok(()) => ep.finish(),
        Err(e) => return Err(sh.fail(&ep, e)),
    }
    let rows = rows.await?;
    // Only rows this worker broadcast can have been matched elsewhere. Build side: the
    // owner task is done (every round was announced), so the flag is final. Without
    // such rows nothing needs to wait for the slowest peer: dropping the receiver
    // discards the peers' (empty) ends.
    let waited = match side {
        Side::Build => sh
            .build_rows_shared
            .load(std::sync::atomic::Ordering::Relaxed),
        Side::Probe => !rows.is_empty(),
    };
    while waited && let Some(batch) = reports.next().await {
        let batch = batch?;
        received_metric.add(batch.num_rows());
        matches
            .lock()
            .merge_reported(batch.column(0).as_ref(), "a peer")?;
    }
    drop(reports);
    let matches = matches.lock();
    let mut out = Vec::new();
    for b in &rows {
        let matched = matches.of_rows(b)?;
        if let Some(rows) = shape.finished(b, |r| matched[r])? {
            out.push(rows);
        }
    }
    Ok(out)
}
