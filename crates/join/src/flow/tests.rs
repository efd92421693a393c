//! Distributed Flow-Join on in-process clusters over loopback TCP, compared row by row
//! with the single-node reference join.

use std::sync::Arc;
use std::time::Duration;

use gyre_transport::{NodeId, TcpTransport, Transport, TransportConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::bench::{ClusterFigures, JoinSpec, build_slice, probe_slice, run_join};
use super::detect::DetectionConfig;
use super::exec::{FlowJoinConfig, NodeCounters, flow_join};
use super::reference::reference_join;
use super::result::JoinOutput;
use super::wire::Side;
use super::{JoinType, Rows, Strategy};
use crate::zipf::Zipf;

async fn cluster(n: usize) -> Vec<Arc<TcpTransport>> {
    let config = TransportConfig {
        message_size: 16 * 1024,
        send_buffers: 16,
        recv_buffers: 16,
        window: 4,
        connect_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let ids: Vec<NodeId> = (1..=n as NodeId).collect();
    gyre_transport::loopback_cluster(&ids, config)
        .await
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect()
}

fn detection() -> DetectionConfig {
    DetectionConfig {
        threshold: 0.01,
        first: 0.05,
        every: 0.15,
        ..DetectionConfig::default()
    }
}

/// Runs the join on every node of `nodes` at once; returns the merged output and each
/// node's counters.
async fn run(
    nodes: &[Arc<TcpTransport>],
    query: u64,
    strategy: Strategy,
    join: JoinType,
    r: &[Rows],
    s: &[Rows],
    threads: usize,
) -> (JoinOutput, Vec<NodeCounters>) {
    let ids: Vec<NodeId> = nodes.iter().map(|t| t.node_id()).collect();
    let handles: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let t = Arc::clone(t);
            let cfg = FlowJoinConfig {
                nodes: ids.clone(),
                index: i,
                query,
                strategy,
                join,
                threads,
                detection: detection(),
                collect: true,
            };
            let (r, s) = (Arc::new(r[i].clone()), Arc::new(s[i].clone()));
            tokio::spawn(async move {
                // One bound for the join and the barrier after it: a node that hangs
                // fails this node's task (and with it the test) instead of leaving
                // its peers waiting at the barrier forever.
                let body = async {
                    let res = flow_join(&*t, &cfg, r, s).await;
                    // Released once every node is done, as a query's end does.
                    super::bench::barrier(&*t, &cfg.nodes, cfg.index, query, 2)
                        .await
                        .unwrap();
                    res
                };
                let res = tokio::time::timeout(Duration::from_secs(30), body)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("query {query} ({strategy} {join}): node {i} did not finish in 30 s")
                    });
                t.release_query(query);
                res
            })
        })
        .collect();
    let mut out = JoinOutput::new(true);
    let mut counters = vec![];
    for h in handles {
        let (o, c) = h.await.unwrap().unwrap();
        out.absorb(o);
        counters.push(c);
    }
    (out, counters)
}

fn check(name: &str, got: &JoinOutput, r: &[Rows], s: &[Rows], join: JoinType) {
    let want = reference_join(r, s, join);
    let mut g = got.collected.clone().unwrap();
    let mut w = want.collected.clone().unwrap();
    g.sort_unstable();
    w.sort_unstable();
    assert_eq!(g.len(), w.len(), "{name} {join}: row count");
    assert!(g == w, "{name} {join}: rows differ");
    assert_eq!(got.checksum, want.checksum, "{name} {join}: checksum");
    assert_eq!(got.rows, want.rows);
}

fn rows(keys: Vec<Option<u64>>, node: usize) -> Rows {
    let payloads = (0..keys.len() as u64)
        .map(|j| ((node as u64) << 40) | j)
        .collect();
    Rows::from_options(&keys, payloads)
}

/// Build side: unique keys 0..n*per plus `heavy_build` extra copies of key 7 on each node
/// (skew in R) and a few NULL keys.
fn build_parts(n: usize, per: u64, heavy_build: usize, nulls: bool) -> Vec<Rows> {
    (0..n)
        .map(|i| {
            let mut k: Vec<Option<u64>> = (0..per).map(|j| Some(i as u64 * per + j)).collect();
            k.extend(std::iter::repeat_n(Some(7), heavy_build));
            if nulls {
                k.extend([None, None]);
            }
            rows(k, i)
        })
        .collect()
}

/// Probe side: Zipf (z) over the build keys plus keys without partner; optional NULLs;
/// `late`: the last third of every node's rows is key 11 (heavy only late).
fn probe_parts(
    n: usize,
    per: usize,
    keys: u64,
    z: f64,
    nulls: bool,
    late: bool,
    seed: u64,
) -> Vec<Rows> {
    (0..n)
        .map(|i| {
            let mut rng = SmallRng::seed_from_u64(seed + i as u64);
            let zipf = Zipf::new(keys, z.max(0.01));
            let mut k: Vec<Option<u64>> = (0..per)
                .map(|j| {
                    if late && j >= per * 2 / 3 {
                        Some(11)
                    } else if nulls && rng.random_bool(0.02) {
                        None
                    } else if rng.random_bool(0.05) {
                        Some(1_000_000 + rng.random_range(0..1000))
                    } else if z == 0.0 {
                        Some(rng.random_range(0..keys))
                    } else {
                        Some(zipf.sample(&mut rng) - 1)
                    }
                })
                .collect();
            if i == 0 && per > 0 {
                k[0] = Some(7);
            }
            rows(k, i)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_join_type_matches_the_reference_under_every_skew() {
    let n = 4;
    let nodes = cluster(n).await;
    let mut query = 100;
    // (name, R, S)
    let cases: Vec<(&str, Vec<Rows>, Vec<Rows>)> = vec![
        (
            "no skew",
            build_parts(n, 500, 0, false),
            probe_parts(n, 6000, 2000, 0.0, false, false, 1),
        ),
        (
            "skew in S",
            build_parts(n, 500, 0, false),
            probe_parts(n, 6000, 2000, 1.25, false, false, 2),
        ),
        (
            "skew in R",
            build_parts(n, 500, 300, false),
            probe_parts(n, 3000, 2000, 0.0, false, false, 3),
        ),
        (
            "skew in both, NULLs",
            build_parts(n, 500, 300, true),
            probe_parts(n, 6000, 2000, 1.25, true, false, 4),
        ),
        (
            "late heavy key",
            build_parts(n, 500, 0, true),
            probe_parts(n, 9000, 2000, 0.0, true, true, 5),
        ),
    ];
    for (name, r, s) in &cases {
        for strategy in [
            Strategy::Plain,
            Strategy::Broadcast,
            Strategy::FetchOnDemand,
        ] {
            for join in JoinType::ALL {
                query += 1;
                let (out, counters) = run(&nodes, query, strategy, join, r, s, 2).await;
                check(&format!("{name} / {strategy}"), &out, r, s, join);
                if strategy == Strategy::Plain {
                    assert!(counters.iter().all(|c| c.heavy.is_empty()));
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_hitters_are_found_and_kept_local() {
    let n = 3;
    let nodes = cluster(n).await;
    let r = build_parts(n, 500, 0, false);
    let s = probe_parts(n, 200_000, 1500, 1.25, false, false, 9);
    let (out, counters) = run(&nodes, 500, Strategy::Broadcast, JoinType::Inner, &r, &s, 1).await;
    check("heavy", &out, &r, &s, JoinType::Inner);
    for c in &counters {
        // Key 0 (rank 1) is announced in the first iteration. (How many tuples a node
        // routed until the announcement arrived depends on the slowest node's progress.)
        let h = c
            .heavy
            .iter()
            .find(|h| h.key == 0 && h.side == Side::Probe)
            .expect("rank 1 found");
        assert_eq!(h.iteration, 0);
        assert!(c.build_kept == 0 && c.probe_broadcast == 0);
    }
    let replicated: u64 = counters.iter().map(|c| c.build_replicated).sum();
    assert!(replicated > 0);

    // Late heavy key 11: not in the first iteration, but found before the end.
    let s = probe_parts(n, 200_000, 1500, 0.0, false, true, 10);
    let (out, counters) = run(&nodes, 501, Strategy::Broadcast, JoinType::Inner, &r, &s, 2).await;
    check("late", &out, &r, &s, JoinType::Inner);
    let mut learned_after_its_tuples = 0;
    for c in &counters {
        // Key 11 fills the last third; the window of 65-80% is the first where it is
        // heavy. (Whether the announcement still arrives before a node's input ends
        // depends on how far apart the nodes are; on this shared machine it may not.)
        let h = c
            .heavy
            .iter()
            .find(|h| h.key == 11)
            .expect("late key found");
        assert!(h.iteration >= 5, "{h:?}");
        learned_after_its_tuples += usize::from(h.after_tuples >= 200_000 * 2 / 3);
        assert!(!c.heavy.iter().any(|h| h.key != 11), "{:?}", c.heavy);
    }
    // A majority reported that iteration (after 80% of their input) before it was
    // announced, so they learned of key 11 after routing its first tuples; a node that
    // fell behind may learn of it earlier in its own input.
    assert!(learned_after_its_tuples > n / 2, "{counters:?}");

    // Fetch on demand: each node decides alone, at the end of the morsel (3125 tuples
    // each) that passes its first detection point (5% = 10 000 tuples here), and keeps
    // key 0's tuples from then on.
    let s = probe_parts(n, 200_000, 1500, 1.25, false, false, 9);
    let (out, counters) = run(
        &nodes,
        502,
        Strategy::FetchOnDemand,
        JoinType::Inner,
        &r,
        &s,
        1,
    )
    .await;
    check("fetch", &out, &r, &s, JoinType::Inner);
    for c in &counters {
        let h = c.heavy.iter().find(|h| h.key == 0).expect("rank 1 found");
        assert_eq!(h.after_tuples, 12_500, "{h:?}");
        assert!(c.probe_kept > 200_000 / 10, "{c:?}");
        assert!(c.copies_received > 0);
    }
}

/// Without skew no node found candidates in the first window, so none waits for the
/// first announcement (a wait that only costs time when nothing is heavy).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_candidates_no_node_waits_for_the_first_announcement() {
    let n = 3;
    let nodes = cluster(n).await;
    let r = build_parts(n, 500, 0, false);
    let s = probe_parts(n, 100_000, 1500, 0.0, false, false, 12);
    let (out, counters) = run(&nodes, 600, Strategy::Broadcast, JoinType::Inner, &r, &s, 2).await;
    check("uniform", &out, &r, &s, JoinType::Inner);
    for c in &counters {
        assert!(c.heavy.is_empty(), "{:?}", c.heavy);
        assert_eq!(c.first_round_wait, Duration::ZERO, "{c:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_heavy_on_both_sides_use_sfr() {
    let n = 4;
    let nodes = cluster(n).await;
    let r = build_parts(n, 200, 100, false);
    let mut s = probe_parts(n, 4000, 800, 0.0, false, false, 12);
    for p in &mut s {
        for k in p.keys.iter_mut().step_by(8) {
            *k = 7;
        }
    }
    for join in [
        JoinType::Inner,
        JoinType::Full,
        JoinType::LeftSemi,
        JoinType::RightAnti,
    ] {
        let (out, counters) = run(
            &nodes,
            600 + join as u64,
            Strategy::Broadcast,
            join,
            &r,
            &s,
            2,
        )
        .await;
        check("sfr", &out, &r, &s, join);
        let sent: u64 = counters.iter().map(|c| c.sfr_sent).sum();
        assert!(sent > 0, "no SFR traffic");
        // On a 2 x 2 grid each copy goes to 2 nodes, never to all 4.
        let received: u64 = counters.iter().map(|c| c.sfr_received).sum();
        assert_eq!(sent, received);
        assert!(
            counters
                .iter()
                .all(|c| c.heavy.iter().any(|h| h.key == 7 && h.side == Side::Build))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn empty_inputs_and_a_node_without_rows() {
    let n = 3;
    let nodes = cluster(n).await;
    let empty: Vec<Rows> = vec![Rows::default(); n];
    let mut q = 700;
    let r = build_parts(n, 300, 0, true);
    let mut s = probe_parts(n, 5000, 900, 1.25, true, false, 13);
    s[1] = Rows::default();
    let mut r_hole = r.clone();
    r_hole[2] = Rows::default();
    for strategy in [
        Strategy::Plain,
        Strategy::Broadcast,
        Strategy::FetchOnDemand,
    ] {
        for join in JoinType::ALL {
            for (name, rr, ss) in [
                ("all empty", &empty, &empty),
                ("empty build", &empty, &s),
                ("empty probe", &r, &empty),
                ("node without rows", &r_hole, &s),
            ] {
                q += 1;
                let (out, _) = run(&nodes, q, strategy, join, rr, ss, 1).await;
                check(name, &out, rr, ss, join);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_refused_with_its_cause() {
    let nodes = cluster(2).await;
    let ids: Vec<NodeId> = nodes.iter().map(|t| t.node_id()).collect();
    let cfg = FlowJoinConfig {
        nodes: ids,
        index: 1,
        query: 900,
        strategy: Strategy::Broadcast,
        join: JoinType::Inner,
        threads: 1,
        detection: DetectionConfig::default(),
        collect: false,
    };
    let bad = Rows {
        keys: vec![1, 2],
        valid: None,
        payloads: vec![1],
    };
    let e = flow_join(&*nodes[1], &cfg, Arc::new(bad), Arc::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("2 keys but 1 payloads"), "{e}");
    let e = flow_join(&*nodes[0], &cfg, Arc::default(), Arc::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("position 1"), "{e}");
    let mut c = cfg.clone();
    c.detection.threshold = 2.0;
    let e = flow_join(&*nodes[1], &c, Arc::default(), Arc::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("threshold"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn benchmark_driver_agrees_across_strategies() {
    let n = 3;
    let nodes = cluster(n).await;
    let ids: Vec<NodeId> = nodes.iter().map(|t| t.node_id()).collect();
    let mut summaries = vec![];
    for (run_id, strategy) in [
        Strategy::Plain,
        Strategy::Broadcast,
        Strategy::FetchOnDemand,
    ]
    .into_iter()
    .enumerate()
    {
        let handles: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let t = Arc::clone(t);
                let spec = JoinSpec {
                    nodes: ids.clone(),
                    index: i,
                    build_rows: 1000,
                    probe_rows: 30_000,
                    zipf: 1.25,
                    seed: 42,
                    strategy,
                    join: JoinType::Inner,
                    threads: 2,
                    detection: DetectionConfig::default(),
                    run_id: run_id as u64 + 1,
                };
                tokio::spawn(async move { run_join(&spec, &*t).await.unwrap() })
            })
            .collect();
        let mut figs = vec![];
        for h in handles {
            figs.push(h.await.unwrap());
        }
        summaries.push(ClusterFigures::from_nodes(&figs));
    }
    // Every probe key has exactly one build partner: as many result rows as probe rows.
    for s in &summaries {
        assert_eq!(s.result_rows, 3 * 30_000);
        assert_eq!(s.checksum, summaries[0].checksum);
    }
    assert_eq!(summaries[0].heavy_hitters, 0);
    assert!(summaries[1].heavy_hitters > 0);

    // The generated slices are what the reference sees.
    let spec = |i| JoinSpec {
        nodes: ids.clone(),
        index: i,
        build_rows: 1000,
        probe_rows: 30_000,
        zipf: 1.25,
        seed: 42,
        strategy: Strategy::Plain,
        join: JoinType::Inner,
        threads: 1,
        detection: DetectionConfig::default(),
        run_id: 0,
    };
    let r: Vec<Rows> = (0..n).map(|i| build_slice(&spec(i))).collect();
    let s: Vec<Rows> = (0..n).map(|i| probe_slice(&spec(i))).collect();
    let want = reference_join(&r, &s, JoinType::Inner);
    assert_eq!(want.checksum, summaries[0].checksum);
}
