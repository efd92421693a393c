//! A worker's part in the synthetic benchmarks that do not run as SQL: the transport's
//! shuffle (`gyre bench shuffle`) and the cyclo-join ring (`gyre bench join --strategy
//! cyclo-*`). Compiled only with the `bench` feature: a server built without it answers
//! these requests with an error and allocates nothing for them.

use super::Worker;
use crate::protocol::{Request, Response};
use datafusion::common::{DataFusionError, Result};
use std::sync::Arc;

/// Runs a benchmark request on the worker's runtime.
#[cfg(feature = "bench")]
pub(super) async fn serve(worker: &Arc<Worker>, req: Request) -> Result<Response> {
    let me = Arc::clone(worker);
    let what = match &req {
        Request::BenchShuffle(_) => "shuffle benchmark",
        _ => "join benchmark",
    };
    worker
        .runtime
        .spawn(async move {
            match req {
                Request::BenchShuffle(run) => me.bench_shuffle(run).await.map(Response::Shuffled),
                Request::BenchJoin(run) => me.bench_join(run).await.map(Response::Joined),
                other => Err(DataFusionError::Execution(format!(
                    "{other:?} is not a benchmark"
                ))),
            }
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("{what}: {e}")))?
}

/// Without the `bench` feature, benchmark requests are refused.
#[cfg(not(feature = "bench"))]
pub(super) async fn serve(_worker: &Arc<Worker>, req: Request) -> Result<Response> {
    Err(DataFusionError::Execution(format!(
        "this worker was built without benchmarks (cargo feature `bench`); it refuses {}",
        match req {
            Request::BenchShuffle(_) => "a shuffle benchmark",
            _ => "a join benchmark",
        }
    )))
}

#[cfg(feature = "bench")]
mod runs {
    use super::Worker;
    use crate::protocol::{JoinFigures, JoinRun, ShuffleFigures, ShuffleRun};
    use datafusion::common::{DataFusionError, Result};
    use gyre_join::cyclo;
    use gyre_transport::bench::{ShuffleSpec, run_shuffle};
    use gyre_transport::node_name;

    /// Most bytes one synthetic shuffle may move: sizes come from the network, so a
    /// forged run must not keep the cluster busy for days.
    const MAX_SHUFFLE_BYTES: u64 = 1 << 40;
    /// Most rows of either side of a synthetic join (16 bytes each, generated in memory).
    const MAX_JOIN_ROWS: u64 = 1 << 31;

    impl Worker {
        /// This worker's place among a run's nodes.
        fn index_in(&self, nodes: &[gyre_transport::NodeId]) -> Result<usize, String> {
            nodes
                .iter()
                .position(|n| *n == self.node)
                .ok_or_else(|| format!("{} is not one of its nodes", node_name(self.node)))
        }

        /// Takes part in a synthetic shuffle between the workers of `run`.
        pub(super) async fn bench_shuffle(&self, run: ShuffleRun) -> Result<ShuffleFigures> {
            let bad = |e: String| DataFusionError::Execution(format!("shuffle benchmark: {e}"));
            let message_max = gyre_transport::frame::MAX_PAYLOAD as u64 / 2;
            if run.total_bytes > MAX_SHUFFLE_BYTES {
                return Err(bad(format!(
                    "{} bytes is more than the {MAX_SHUFFLE_BYTES} a run may move",
                    run.total_bytes
                )));
            }
            if !(1..=message_max).contains(&run.message_size) {
                return Err(bad(format!(
                    "messages of {} bytes (1 to {message_max})",
                    run.message_size
                )));
            }
            let index = self.index_in(&run.nodes).map_err(bad)?;
            let spec = ShuffleSpec {
                nodes: run.nodes,
                index,
                pattern: run.pattern.parse().map_err(bad)?,
                total_bytes: run.total_bytes,
                message_size: run.message_size as usize,
                schedule: run.schedule.parse().map_err(bad)?,
                run_id: run.run_id,
            };
            let r = run_shuffle(&self.transport, &spec)
                .await
                .map_err(|e| bad(format!("{} failed: {e}", node_name(self.node))))?;
            Ok(r.into())
        }

        /// Takes part in a synthetic cyclo-join between the workers of `run`.
        pub(super) async fn bench_join(&self, run: JoinRun) -> Result<JoinFigures> {
            let bad = |e: String| DataFusionError::Execution(format!("join benchmark: {e}"));
            if run.build_rows > MAX_JOIN_ROWS || run.probe_rows > MAX_JOIN_ROWS {
                return Err(bad(format!(
                    "{} build and {} probe rows: at most {MAX_JOIN_ROWS} each",
                    run.build_rows, run.probe_rows
                )));
            }
            if !(0.0..=10.0).contains(&run.zipf) || run.threads > 1024 {
                return Err(bad(format!(
                    "Zipf {} (0 to 10) with {} threads (at most 1024)",
                    run.zipf, run.threads
                )));
            }
            let index = self.index_in(&run.nodes).map_err(bad)?;
            let Some(algorithm) = run.strategy.strip_prefix("cyclo-") else {
                return Err(bad(format!(
                    "'{}' is not a cyclo-join; the partitioned joins run as SQL",
                    run.strategy
                )));
            };
            let algorithm = cyclo::parse_algorithm(algorithm).map_err(|e| bad(e.to_string()))?;
            let mut spec = cyclo::CycloSpec::new(run.nodes, index, algorithm);
            spec.r_rows = run.probe_rows;
            spec.s_rows = run.build_rows;
            spec.zipf = run.zipf;
            spec.seed = run.seed;
            spec.options.threads = run.threads as usize;
            spec.run_id = run.run_id;
            let f = cyclo::run_cyclo(&spec, &self.transport)
                .await
                .map_err(|e| bad(format!("{} failed: {e}", node_name(self.node))))?;
            let ring = &f.ring;
            Ok(JoinFigures {
                node: f.node,
                strategy: run.strategy,
                build_rows_local: f.s_rows_local,
                probe_rows_local: f.r_rows_local,
                elapsed_s: (f.setup.total() + ring.elapsed).as_secs_f64(),
                setup_s: f.setup.total().as_secs_f64(),
                join_s: ring.join.as_secs_f64(),
                sync_s: Some(ring.sync.as_secs_f64()),
                tuples_joined: ring.rows_joined,
                bytes_sent: f.wire_bytes_sent,
                bytes_received: f.wire_bytes_received,
                results: f.results,
                checksum: f.checksum,
                details: vec![
                    (
                        "rotating_is_probe".into(),
                        f64::from(u8::from(f.rotating == cyclo::Side::Left)),
                    ),
                    (
                        "setup_stationary_s".into(),
                        f.setup.stationary.as_secs_f64(),
                    ),
                    ("setup_rotating_s".into(), f.setup.rotating.as_secs_f64()),
                    ("ring_s".into(), ring.elapsed.as_secs_f64()),
                    ("transmit_wait_s".into(), ring.transmit_wait.as_secs_f64()),
                    ("fragments_joined".into(), ring.fragments_joined as f64),
                    ("fragment_bytes_sent".into(), ring.bytes_sent as f64),
                    ("buffers_high_water".into(), ring.buffers_high_water as f64),
                    ("generate_s".into(), f.generate.as_secs_f64()),
                ],
                process_cpu_s: None,
            })
        }
    }
}
