//! One automatic retry of a read that lost a worker.
//!
//! A read of tables that survive a worker (fully replicated and fragmented
//! transactional tables, files) fails when one of its workers dies mid-way: its
//! exchanges lose a peer. The coordinator then plans it again over the workers alive
//! now and runs it once more, so that the client sees an answer instead of the loss
//! (ScyPer's outlook, Rödiger's thesis section 5.3: blocks replicated on several
//! servers keep queries running through a server's failure). Only reads are retried,
//! only once, and a streamed result only before its first batch went out.

use super::*;

/// How long a failed read waits to learn whether one of its workers died (its
/// exchanges may see the broken connection before the coordinator declares the death).
const DEATH_GRACE: Duration = Duration::from_secs(2);

/// Words of the errors a lost peer causes (in the transport's and the coordinator's
/// messages): only after such an error does a read wait for a worker's death.
const LOST_PEER: [&str; 7] = [
    "died",
    "lost",
    "cannot reach",
    "reset",
    "broken pipe",
    "unavailable",
    "peer",
];

/// What planning a read again needs: its session and its logical plan.
#[derive(Clone)]
pub struct Replan {
    pub session: SessionContext,
    pub plan: LogicalPlan,
}

impl std::fmt::Debug for Replan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replan")
            .field("session", &self.session.session_id())
            .finish_non_exhaustive()
    }
}

impl Coordinator {
    /// Why one of `workers` is gone if `error`, which ended a query on them, came from
    /// losing it: a worker already declared dead, or one declared dead within
    /// [`DEATH_GRACE`] of an error that speaks of a lost peer.
    pub(crate) async fn lost_worker(
        &self,
        workers: &[NodeId],
        error: &DataFusionError,
    ) -> Option<String> {
        if workers.is_empty() {
            return None;
        }
        if let Some(why) = workers.iter().find_map(|w| self.death_now(*w)) {
            return Some(why);
        }
        let text = error.to_string().to_ascii_lowercase();
        if !LOST_PEER.iter().any(|w| text.contains(w)) {
            return None;
        }
        let deaths = workers.iter().map(|w| Box::pin(self.death_of(*w)));
        tokio::time::timeout(DEATH_GRACE, futures::future::select_all(deaths))
            .await
            .ok()
            .map(|(why, _, _)| why)
    }

    /// `replan`'s read planned for the workers alive now, after `error` ended it on
    /// `lost` workers: the plan and its workers, or the error to give the client
    /// (the first one, with why planning again failed).
    pub(crate) async fn plan_again(
        &self,
        replan: &Replan,
        error: DataFusionError,
        death: &str,
    ) -> Result<(SessionState, DistributedPlan, Vec<NodeId>)> {
        let workers = self.live_workers();
        tracing::info!("a read lost a worker ({death}): running it again on workers {workers:?}");
        let planned = async {
            let state = self.query_state(&replan.session, &workers);
            let physical = state.create_physical_plan(&replan.plan).await?;
            let dplan = self.distribute(state.config_options(), physical, workers.len())?;
            Ok::<_, DataFusionError>((state, dplan))
        };
        match planned.await {
            Ok((state, dplan)) => Ok((state, dplan, workers)),
            Err(again) => Err(DataFusionError::Execution(format!(
                "{error}; running it again on the remaining workers failed: {again}"
            ))),
        }
    }
}
