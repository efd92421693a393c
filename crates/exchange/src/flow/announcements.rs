//! Heavy-hitter announcements: the detector on worker 0 and the listener on every
//! worker.
//!
//! The detector reads every worker's reports (per side and round) and, once all
//! workers reported a round, announces the round's global heavy hitters
//! (`gyre_join::flow::detect::Coordinator`) to every worker; after the last round of
//! both sides it ends the announcement stream. Reports missing at the end are an error.
//!
//! The listener applies the announcements in order: records the keys for `EXPLAIN
//! ANALYZE`, appends the hashes to the side's list, tells the owner which build rows to
//! broadcast (probe-side rounds, empty ones included), and then counts the round as
//! applied, which releases a router waiting for round 0 or for the final build list.
//!
//! With fetch on demand, probe-side rounds are not announced: the *request listener*
//! hands every worker's fetch requests to the owner, which answers each to its sender.

use super::owner::Wanted;
use super::shared::{HeavySet, Shared, next_control, send_control};
use datafusion::common::{Result, internal_datafusion_err};
use gyre_join::flow::control::{Control, Side};
use gyre_join::flow::detect::Coordinator;
use gyre_transport::{NodeId, ReceiveEndpoint, SendEndpoint, To, node_name};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Applies worker 0's announcements in order.
pub(super) async fn listen(
    sh: Arc<Shared>,
    ep: ReceiveEndpoint,
    owner_tx: mpsc::UnboundedSender<Wanted>,
) -> Result<()> {
    while let Some((control, _)) = next_control(&ep).await? {
        let Control::Announce {
            side,
            iteration,
            keys,
        } = control
        else {
            return Err(internal_datafusion_err!(
                "Flow-Join expected a heavy-hitter announcement, got {control:?}"
            ));
        };
        if side == Side::Build && sh.build_iterations == 0 {
            return Err(internal_datafusion_err!(
                "build-side heavy hitters announced to a Flow-Join that does not route its build input"
            ));
        }
        sh.trace(
            "listener",
            format_args!(
                "{side:?} round {iteration} announced ({} heavy)",
                keys.len()
            ),
        );
        let hashes = sh.adopt_heavy(side, iteration, &keys);
        if side == Side::Probe {
            // An empty round still counts: the owner ends that round's broadcast.
            let _ = owner_tx.send(Wanted {
                round: iteration,
                hashes,
                to: To::All,
            });
        }
        // A router waiting for round 0, or for the final build-side list, goes on.
        sh.rounds(side).send_modify(|r| *r += 1);
    }
    Ok(())
}

/// Fetch on demand: hands every worker's requests to the owner, each to be answered to
/// its sender. A request for a round that does not run, or a second one from the same
/// worker for a round, is an error naming the sender: the owner ends a round's answers
/// once every worker asked, so a repeat would end them before another worker's turn.
pub(super) async fn requests(
    rounds: u32,
    ep: ReceiveEndpoint,
    owner_tx: mpsc::UnboundedSender<Wanted>,
) -> Result<()> {
    let mut asked: Vec<HashSet<NodeId>> = vec![HashSet::new(); rounds as usize];
    while let Some((control, from)) = next_control(&ep).await? {
        let Control::Fetch {
            side: Side::Probe,
            iteration,
            keys,
        } = control
        else {
            return Err(internal_datafusion_err!(
                "Flow-Join expected a fetch request from {}, got {control:?}",
                node_name(from)
            ));
        };
        let Some(senders) = asked.get_mut(iteration as usize) else {
            return Err(internal_datafusion_err!(
                "{} asked for heavy build rows of detection round {iteration}, but only {rounds} run",
                node_name(from)
            ));
        };
        if !senders.insert(from) {
            return Err(internal_datafusion_err!(
                "{} asked twice for the heavy build rows of detection round {iteration}",
                node_name(from)
            ));
        }
        let _ = owner_tx.send(Wanted {
            round: iteration,
            hashes: keys.into_iter().map(|k| k.0).collect(),
            to: To::Node(from),
        });
    }
    Ok(())
}

/// Resolves once round `round` was announced without heavy hitters (never otherwise).
/// `applied` counts the announcements applied, in order, each after its hashes joined
/// `heavy`.
pub(super) async fn announced_empty(
    applied: &tokio::sync::watch::Sender<u32>,
    heavy: &HeavySet,
    round: u32,
) {
    let mut applied = applied.subscribe();
    if applied.wait_for(|n| *n > round).await.is_ok()
        && !heavy.hashes.read().iter().any(|&(_, r)| r == round)
    {
        return;
    }
    std::future::pending::<()>().await
}

/// Worker 0: forms the global heavy-hitter list of each detection round.
pub(super) async fn detect(
    sh: Arc<Shared>,
    reports: ReceiveEndpoint,
    ep: SendEndpoint,
    iterations: usize,
    threshold: f64,
) -> Result<()> {
    let result = async {
        let mut coordinator = Coordinator::new(sh.n(), iterations, threshold);
        let mut build = Coordinator::new(sh.n(), sh.build_iterations as usize, threshold);
        while let Some((control, from)) = next_control(&reports).await? {
            let Control::Report {
                side,
                iteration,
                window,
                total,
                candidates,
            } = control
            else {
                return Err(internal_datafusion_err!(
                    "Flow-Join expected a detection report from {}, got {control:?}",
                    node_name(from)
                ));
            };
            sh.trace(
                "detector",
                format_args!("{side:?} round {iteration} report from {}", node_name(from)),
            );
            let announcements = match side {
                Side::Probe => &mut coordinator,
                Side::Build => &mut build,
            }
            .add(iteration, window, total, &candidates)
            .map_err(|e| internal_datafusion_err!("{} sent a bad report: {e}", node_name(from)))?;
            for (iteration, keys) in announcements {
                let msg = Control::Announce {
                    side,
                    iteration,
                    keys,
                };
                send_control(&ep, To::All, &msg).await?;
            }
        }
        if !coordinator.complete() || !build.complete() {
            return Err(internal_datafusion_err!(
                "Flow-Join detection ended before every worker reported every round"
            ));
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            sh.trace("detector", format_args!("every round announced"));
            ep.finish();
            Ok(())
        }
        Err(e) => Err(sh.fail(&ep, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{lone_node, stream_to_self};
    use std::time::Duration;

    /// A worker's fetch requests, as a peer would send them, through the request
    /// listener: a repeat for a round and a round that does not run are refused, naming
    /// the sender, before the owner could end a round early.
    #[tokio::test]
    async fn a_repeated_or_unknown_fetch_request_is_refused() {
        let t = lone_node().await;
        for (query, rounds_sent, named) in [
            (1, [0, 0], "asked twice"),
            (2, [1, 5], "round 5, but only 3 run"),
        ] {
            let (send, recv) = stream_to_self(&t, query);
            for iteration in rounds_sent {
                let msg = Control::Fetch {
                    side: Side::Probe,
                    iteration,
                    keys: vec![(42, 1000)],
                };
                send_control(&send, To::Node(1), &msg).await.unwrap();
            }
            send.finish();
            let (tx, mut rx) = mpsc::unbounded_channel();
            let err = requests(3, recv, tx).await.unwrap_err().to_string();
            assert!(err.contains(named) && err.contains("worker"), "{err}");
            // The first request went to the owner, to its sender alone.
            let first = rx.recv().await.unwrap();
            assert_eq!(
                (first.round, first.hashes, first.to),
                (rounds_sent[0], vec![42], To::Node(1))
            );
        }
    }

    /// A drain learns that a round is empty from the announcements alone.
    #[tokio::test]
    async fn only_a_round_announced_without_heavy_hitters_counts_as_empty() {
        let applied = tokio::sync::watch::channel(0u32).0;
        let heavy = HeavySet::default();
        let resolves = |round: u32| {
            let (applied, heavy) = (&applied, &heavy);
            async move {
                tokio::time::timeout(
                    Duration::from_millis(20),
                    announced_empty(applied, heavy, round),
                )
                .await
                .is_ok()
            }
        };
        assert!(!resolves(0).await, "not announced yet");
        heavy.extend(&[42], 0);
        applied.send_replace(1);
        assert!(!resolves(0).await, "round 0 found a heavy hitter");
        assert!(!resolves(1).await, "round 1 not announced yet");
        applied.send_replace(2);
        assert!(resolves(1).await, "round 1 was announced empty");
    }
}
