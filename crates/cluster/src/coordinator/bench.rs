//! The coordinator's relay of the synthetic benchmarks that do not run as SQL (the
//! transport's shuffle and the cyclo-join ring): it picks the workers, numbers the run
//! and gathers every worker's figures. Compiled only with the `bench` feature.

use super::Coordinator;
use crate::protocol::{Request, Response};
use datafusion::common::Result;
use std::sync::Arc;

/// Runs a benchmark request on its workers and gathers their figures.
#[cfg(feature = "bench")]
pub(super) async fn relay(coordinator: &Arc<Coordinator>, req: Request) -> Result<Response> {
    use std::sync::atomic::Ordering;
    let next_run = || coordinator.next_query.fetch_add(1, Ordering::SeqCst);
    match req {
        Request::BenchShuffle(mut run) => {
            run.nodes = coordinator.bench_nodes(run.nodes, 2, "a shuffle benchmark")?;
            run.run_id = next_run();
            let nodes = run.nodes.clone();
            let figures = coordinator
                .gather(
                    &nodes,
                    Request::BenchShuffle(run),
                    "shuffle",
                    None,
                    |r| match r {
                        Response::Shuffled(f) => Ok(f),
                        other => Err(Box::new(other)),
                    },
                )
                .await?;
            Ok(Response::ShuffleResults(figures))
        }
        Request::BenchJoin(mut run) => {
            run.nodes = coordinator.bench_nodes(run.nodes, 1, "a join benchmark")?;
            run.run_id = next_run();
            let nodes = run.nodes.clone();
            let figures = coordinator
                .gather(&nodes, Request::BenchJoin(run), "join", None, |r| match r {
                    Response::Joined(f) => Ok(f),
                    other => Err(Box::new(other)),
                })
                .await?;
            Ok(Response::JoinResults(figures))
        }
        other => datafusion::common::plan_err!("{other:?} is not a benchmark"),
    }
}

#[cfg(feature = "bench")]
impl Coordinator {
    /// The workers of a benchmark run: the ones named, else all live ones; at least `min`.
    fn bench_nodes(
        &self,
        nodes: Vec<gyre_transport::NodeId>,
        min: usize,
        what: &str,
    ) -> Result<Vec<gyre_transport::NodeId>> {
        let nodes = if nodes.is_empty() {
            self.live_workers()
        } else {
            nodes
        };
        if nodes.len() < min {
            return datafusion::common::plan_err!(
                "{what} needs at least {min} workers, {} are alive",
                nodes.len()
            );
        }
        Ok(nodes)
    }
}

/// Without the `bench` feature, benchmark requests are refused.
#[cfg(not(feature = "bench"))]
pub(super) async fn relay(_coordinator: &Arc<Coordinator>, _req: Request) -> Result<Response> {
    datafusion::common::plan_err!(
        "this coordinator was built without benchmarks (cargo feature `bench`)"
    )
}
