//! Cyclo-join on in-process rings of 1 to 4 TCP transports over loopback, checked against
//! the single-node reference joins.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_buffer::NullBuffer;
use gyre_transport::{TcpTransport, Transport, TransportConfig};

use super::bench::{generate_r, generate_s, pair_checksum};
use super::*;
use crate::keys::Keys;
use crate::pairs::JoinPairs;
use crate::reference::{naive_join, range_join};
use crate::sort_merge::MergePredicate;

/// Small buffers and messages, so fragments are many and each spans several messages.
fn small_options() -> CycloOptions {
    CycloOptions {
        threads: 2,
        roundabout: RoundaboutConfig {
            buffers: 3,
            buffer_bytes: 4096,
            forward: ForwardPolicy::OnArrival,
        },
        ..CycloOptions::default()
    }
}

fn transport_config() -> TransportConfig {
    TransportConfig {
        message_size: 1024,
        window: 2,
        ..TransportConfig::default()
    }
}

async fn ring(n: usize) -> Vec<TcpTransport> {
    loopback_ring(n, transport_config()).await.unwrap()
}

/// The right-hand range of a merge predicate for the ordered-map reference.
fn window(p: MergePredicate) -> impl Fn(i128) -> (i128, i128) {
    move |l| match p {
        MergePredicate::Eq => (l, l),
        MergePredicate::Band { c1, c2 } => (l - c2 as i128, l + c1 as i128),
        MergePredicate::Lt => (l + 1, i128::MAX),
        MergePredicate::Le => (l, i128::MAX),
        MergePredicate::Gt => (i128::MIN, l - 1),
        MergePredicate::Ge => (i128::MIN, l),
    }
}

/// (count, checksum) of the whole join on one node, by the reference joins.
fn reference(spec: &CycloSpec) -> (u64, u64) {
    let (rk, _) = generate_r(spec, 0, spec.r_rows);
    let (sk, _) = generate_s(spec, 0, spec.s_rows);
    let rv: Vec<Option<i128>> = rk.iter().map(|&k| Some(k as i128)).collect();
    let sv: Vec<Option<i128>> = sk.iter().map(|&k| Some(k as i128)).collect();
    let pairs = match &spec.algorithm {
        CycloAlgorithm::Hash => range_join(&rv, &sv, window(MergePredicate::Eq)),
        CycloAlgorithm::SortMerge(p) => range_join(&rv, &sv, window(*p)),
        CycloAlgorithm::NestedLoops(t) => naive_join(&rv, &sv, |a, b| t.holds(a, b)),
        CycloAlgorithm::CrossProduct => naive_join(&rv, &sv, |_, _| true),
    };
    let sum = pairs.iter().fold(0u64, |acc, &(r, s)| {
        acc.wrapping_add(pair_checksum(u64::from(r), u64::from(s)))
    });
    (pairs.len() as u64, sum)
}

fn total(figures: &[CycloFigures]) -> (u64, u64) {
    figures.iter().fold((0, 0), |(c, s), f| {
        (c + f.results, s.wrapping_add(f.checksum))
    })
}

/// Checks the figures' internal consistency: every fragment is joined on every node,
/// and what one node sends its successor receives.
fn check_flow(figures: &[CycloFigures], buffers: usize) {
    let n = figures.len();
    let injected: u64 = figures.iter().map(|f| f.fragments_injected).sum();
    for (i, f) in figures.iter().enumerate() {
        assert_eq!(
            f.ring.fragments_joined, injected,
            "node {i} joins every fragment"
        );
        let next = &figures[(i + 1) % n];
        if n > 1 {
            assert_eq!(f.ring.bytes_sent, next.ring.bytes_received);
            assert_eq!(f.ring.fragments_sent, next.ring.fragments_received);
            // Everything but the successor's own fragments passes this node's link.
            assert_eq!(f.ring.fragments_sent, injected - next.fragments_injected);
        } else {
            assert_eq!(f.ring.fragments_sent, 0);
        }
        assert!(f.ring.buffers_high_water <= buffers);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equi_band_and_theta_joins_equal_the_reference_on_rings_of_one_to_four() {
    let mut run_id = 100;
    for n in 1..=4usize {
        let nodes = ring(n).await;
        let mut cases: Vec<(CycloAlgorithm, u64, u64, f64)> = vec![
            (CycloAlgorithm::Hash, 5000, 3000, 0.0),
            (CycloAlgorithm::Hash, 4000, 2500, 0.9),
            (
                CycloAlgorithm::SortMerge(MergePredicate::Eq),
                3000,
                4000,
                0.5,
            ),
            (
                CycloAlgorithm::SortMerge(MergePredicate::Band { c1: 3, c2: 3 }),
                3000,
                2000,
                0.0,
            ),
            (
                CycloAlgorithm::SortMerge(MergePredicate::Band { c1: 0, c2: 7 }),
                2000,
                3000,
                0.9,
            ),
            (CycloAlgorithm::SortMerge(MergePredicate::Lt), 300, 200, 0.0),
            (CycloAlgorithm::SortMerge(MergePredicate::Ge), 200, 300, 0.9),
            (
                CycloAlgorithm::NestedLoops(ThetaPredicate::DiffMod {
                    modulus: 17,
                    remainder: 5,
                }),
                700,
                500,
                0.9,
            ),
            (
                CycloAlgorithm::NestedLoops(ThetaPredicate::Merge(MergePredicate::Band {
                    c1: 2,
                    c2: 4,
                })),
                500,
                600,
                0.0,
            ),
        ];
        // Duplicate keys in the stationary side's hash table (skewed S).
        cases.push((CycloAlgorithm::Hash, 3000, 2000, -0.9));
        cases.push((
            CycloAlgorithm::SortMerge(MergePredicate::Band { c1: 1, c2: 1 }),
            1500,
            1000,
            -0.9,
        ));
        // Every pair, listed by the sink's default `consume_cross`.
        cases.push((CycloAlgorithm::CrossProduct, 90, 70, 0.9));
        // Fewer rows than nodes: some nodes have empty parts.
        cases.push((CycloAlgorithm::Hash, 2, 3, 0.0));
        cases.push((CycloAlgorithm::CrossProduct, 2, 3, 0.0));
        cases.push((CycloAlgorithm::SortMerge(MergePredicate::Eq), 0, 5, 0.0));
        for (algo, r_rows, s_rows, zipf) in cases {
            let mut spec = CycloSpec::new(vec![], 0, algo.clone());
            // A negative exponent here means: skew S's keys instead of R's.
            (spec.r_rows, spec.s_rows) = (r_rows, s_rows);
            (spec.zipf, spec.zipf_s) = if zipf < 0.0 {
                (0.0, -zipf)
            } else {
                (zipf, 0.0)
            };
            spec.options = small_options();
            let want = reference(&spec);
            for (rotate, prepare, forward) in [
                (Rotate::Smaller, true, ForwardPolicy::OnArrival),
                (Rotate::Left, false, ForwardPolicy::AfterJoin),
                (Rotate::Right, true, ForwardPolicy::AfterJoin),
            ] {
                spec.options.rotate = rotate;
                spec.options.prepare_rotating = prepare;
                spec.options.roundabout.forward = forward;
                run_id += 1;
                spec.run_id = run_id;
                let figures = run_on(&nodes, &spec).await.unwrap();
                let label =
                    format!("n={n} {algo:?} {r_rows}x{s_rows} z={zipf} {rotate:?} {prepare}");
                assert_eq!(total(&figures), want, "{label}");
                check_flow(&figures, 3);
                let rotating = figures[0].rotating;
                match rotate {
                    Rotate::Left => assert_eq!(rotating, Side::Left),
                    Rotate::Right => assert_eq!(rotating, Side::Right),
                    Rotate::Smaller => assert_eq!(
                        rotating,
                        if r_rows <= s_rows {
                            Side::Left
                        } else {
                            Side::Right
                        },
                        "{label}"
                    ),
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_data_gives_the_same_result_on_any_ring_size() {
    let mut spec = CycloSpec::new(vec![], 0, CycloAlgorithm::Hash);
    (spec.r_rows, spec.s_rows, spec.zipf) = (60_000, 40_000, 0.5);
    spec.options = CycloOptions {
        threads: 2,
        ..CycloOptions::default()
    };
    spec.options.roundabout.buffer_bytes = 64 << 10;
    let mut totals = vec![];
    for n in [1, 3] {
        let nodes = loopback_ring(n, TransportConfig::default()).await.unwrap();
        spec.run_id = 900 + n as u64;
        let figures = run_on(&nodes, &spec).await.unwrap();
        check_flow(&figures, 8);
        // A foreign-key join: every R row matches exactly one S row.
        assert_eq!(total(&figures).0, 60_000);
        totals.push(total(&figures));
    }
    assert_eq!(totals[0], totals[1]);
    assert_eq!(totals[0], reference(&spec));
}

/// Collects `(rotating payload, stationary row)` per node.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<(u64, u32)>>>);

impl ResultSink for Collect {
    fn consume(&mut self, fragment: &FragmentView<'_>, pairs: &JoinPairs) -> error::Result<()> {
        let p = fragment.payload(0);
        let mut v = self.0.lock().unwrap();
        for (&f, &s) in pairs.left.iter().zip(&pairs.right) {
            v.push((p[f as usize], s));
        }
        Ok(())
    }
}

/// One node's local parts: signed keys with validity, and global row numbers.
struct Part {
    left: Vec<i64>,
    left_valid: Vec<bool>,
    right: Vec<i64>,
    right_valid: Vec<bool>,
    left_first: usize,
    right_first: usize,
}

fn keys<'a>(v: &'a [i64], valid: &[bool]) -> Keys<'a> {
    Keys::signed(v)
        .with_nulls(Some(NullBuffer::from(valid.to_vec())))
        .unwrap()
}

/// The library API with what the generator never makes: signed keys, NULLs, many
/// duplicates, and nodes whose left or right part is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_join_handles_nulls_duplicates_and_empty_parts() {
    let n = 3;
    let nodes = ring(n).await;
    let lengths = [(400usize, 0usize), (0, 350), (250, 300)];
    let mut parts = vec![];
    let (mut lf, mut rf) = (0, 0);
    for (i, &(ll, rl)) in lengths.iter().enumerate() {
        let left: Vec<i64> = (0..ll)
            .map(|j| ((j * 7 + i * 13) % 41) as i64 - 20)
            .collect();
        let right: Vec<i64> = (0..rl).map(|j| ((j * 11 + i) % 37) as i64 - 18).collect();
        parts.push(Part {
            left_valid: (0..ll).map(|j| j % 5 != 2).collect(),
            right_valid: (0..rl).map(|j| j % 6 != 1).collect(),
            left,
            right,
            left_first: lf,
            right_first: rf,
        });
        lf += ll;
        rf += rl;
    }
    let all = |f: fn(&Part) -> (&Vec<i64>, &Vec<bool>)| -> Vec<Option<i128>> {
        parts
            .iter()
            .flat_map(|p| {
                let (v, ok) = f(p);
                v.iter()
                    .zip(ok)
                    .map(|(&k, &b)| b.then_some(k as i128))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let lv = all(|p| (&p.left, &p.left_valid));
    let rv = all(|p| (&p.right, &p.right_valid));
    let algos = [
        CycloAlgorithm::Hash,
        CycloAlgorithm::SortMerge(MergePredicate::Band { c1: 1, c2: 2 }),
        CycloAlgorithm::SortMerge(MergePredicate::Gt),
        CycloAlgorithm::NestedLoops(ThetaPredicate::Custom {
            name: "l*r < -50".into(),
            pred: Arc::new(|l, r| l * r < -50),
        }),
    ];
    let mut query = 5000;
    for algo in &algos {
        let want = naive_join(&lv, &rv, |a, b| algo.holds(a, b));
        for rotate in [Rotate::Left, Rotate::Right] {
            query += 1;
            let mut tasks = vec![];
            for (i, t) in nodes.iter().enumerate() {
                let t = t.clone();
                let algo = algo.clone();
                let p = &parts[i];
                let (left, left_valid, right, right_valid) = (
                    p.left.clone(),
                    p.left_valid.clone(),
                    p.right.clone(),
                    p.right_valid.clone(),
                );
                let (left_first, right_first) = (p.left_first as u64, p.right_first as u64);
                let ids: Vec<_> = nodes.iter().map(|t| t.node_id()).collect();
                tasks.push(tokio::spawn(async move {
                    let ring = RingSpec {
                        nodes: ids,
                        index: i,
                        query,
                        exchange: 10,
                    };
                    let left_ids: Vec<u64> =
                        (0..left.len() as u64).map(|j| left_first + j).collect();
                    let right_ids: Vec<u64> =
                        (0..right.len() as u64).map(|j| right_first + j).collect();
                    let l = Relation {
                        keys: keys(&left, &left_valid),
                        payload: vec![&left_ids],
                        bytes: vec![],
                    };
                    let r = Relation {
                        keys: keys(&right, &right_valid),
                        payload: vec![&right_ids],
                        bytes: vec![],
                    };
                    let options = CycloOptions {
                        rotate,
                        ..small_options()
                    };
                    let sink = Collect::default();
                    let (plan, figures, sink) =
                        cyclo_join(&t, &ring, &l, &r, &algo, &options, sink)
                            .await
                            .unwrap();
                    let stationary_first = match plan.rotating {
                        Side::Left => right_first,
                        Side::Right => left_first,
                    };
                    let got: Vec<(u32, u32)> = sink
                        .0
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|&(rot, st)| {
                            let st = stationary_first + u64::from(st);
                            match plan.rotating {
                                Side::Left => (rot as u32, st as u32),
                                Side::Right => (st as u32, rot as u32),
                            }
                        })
                        .collect();
                    assert_eq!(figures.results as usize, got.len());
                    t.release_query(query);
                    got
                }));
            }
            let mut got = vec![];
            for h in tasks {
                got.extend(h.await.unwrap());
            }
            got.sort_unstable();
            assert_eq!(got, want, "{algo:?} {rotate:?}");
        }
    }
}

/// A node whose join fails, or a ring that disagrees, ends with errors everywhere and
/// never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_disagreements_end_every_node_with_an_error() {
    struct Failing;
    impl ResultSink for Failing {
        fn consume(&mut self, _: &FragmentView<'_>, _: &JoinPairs) -> error::Result<()> {
            Err(CycloError::Sink("downstream closed".into()))
        }
    }
    let nodes = ring(3).await;
    let ids: Vec<_> = nodes.iter().map(|t| t.node_id()).collect();
    let keys_all: Vec<u64> = (0..3000).map(|i| i % 500).collect();
    let run = |query: u64, algos: Vec<CycloAlgorithm>, failing: Option<usize>| {
        let handles: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (t, ids, algo) = (t.clone(), ids.clone(), algos[i].clone());
                let keys_all = keys_all.clone();
                tokio::spawn(async move {
                    let ring = RingSpec {
                        nodes: ids,
                        index: i,
                        query,
                        exchange: 0,
                    };
                    let part = &keys_all[i * 1000..(i + 1) * 1000];
                    let rel = Relation {
                        keys: Keys::unsigned(part),
                        payload: vec![part],
                        bytes: vec![],
                    };
                    let options = small_options();
                    let res = if failing == Some(i) {
                        cyclo_join(&t, &ring, &rel, &rel, &algo, &options, Failing)
                            .await
                            .map(|_| ())
                    } else {
                        cyclo_join(&t, &ring, &rel, &rel, &algo, &options, Collect::default())
                            .await
                            .map(|_| ())
                    };
                    t.release_query(query);
                    res
                })
            })
            .collect();
        async move {
            let mut out = vec![];
            for h in handles {
                out.push(h.await.unwrap());
            }
            out
        }
    };
    let within = Duration::from_secs(20);
    let res = tokio::time::timeout(within, run(7001, vec![CycloAlgorithm::Hash; 3], Some(1)))
        .await
        .expect("no hang");
    assert!(
        matches!(&res[1], Err(CycloError::Sink(m)) if m.contains("downstream")),
        "{res:?}"
    );
    assert!(res.iter().all(Result::is_err), "{res:?}");

    let mixed = vec![
        CycloAlgorithm::Hash,
        CycloAlgorithm::SortMerge(MergePredicate::Eq),
        CycloAlgorithm::Hash,
    ];
    let res = tokio::time::timeout(within, run(7002, mixed, None))
        .await
        .expect("no hang");
    assert!(
        res.iter()
            .all(|r| matches!(r, Err(CycloError::Disagreement(_)))),
        "{res:?}"
    );

    // One node's bad input (a payload column too short) fails every node.
    let short = [1u64, 2];
    let handles: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (t, ids) = (t.clone(), ids.clone());
            tokio::spawn(async move {
                let ring = RingSpec {
                    nodes: ids,
                    index: i,
                    query: 7003,
                    exchange: 0,
                };
                let keys: Vec<u64> = (0..10).collect();
                let payload: &[u64] = if i == 2 { &short } else { &keys };
                let rel = Relation {
                    keys: Keys::unsigned(&keys),
                    payload: vec![payload],
                    bytes: vec![],
                };
                let algo = CycloAlgorithm::Hash;
                let res = cyclo_join(
                    &t,
                    &ring,
                    &rel,
                    &rel,
                    &algo,
                    &small_options(),
                    Collect::default(),
                )
                .await
                .map(|_| ());
                t.release_query(7003);
                res
            })
        })
        .collect();
    let mut res = vec![];
    for h in handles {
        res.push(
            tokio::time::timeout(within, h)
                .await
                .expect("no hang")
                .unwrap(),
        );
    }
    assert!(
        matches!(&res[2], Err(CycloError::Spec(m)) if m.contains("payload")),
        "{res:?}"
    );
    assert!(
        matches!(&res[0], Err(CycloError::Disagreement(m)) if m.contains("worker 3")),
        "{res:?}"
    );

    // A spec naming another node is refused before anything is sent.
    let spec = CycloSpec::new(ids.clone(), 1, CycloAlgorithm::Hash);
    let err = run_cyclo(&spec, &nodes[0]).await.unwrap_err();
    assert!(err.to_string().contains("position 1"), "{err}");
    assert!(parse_algorithm("band:x").is_err());
    assert!(parse_algorithm("theta:0:1").is_err());
    assert!(matches!(
        parse_algorithm("band:5").unwrap(),
        CycloAlgorithm::SortMerge(MergePredicate::Band { c1: 5, c2: 5 })
    ));
}

/// The smallest ring (two buffers per node, one-message credit windows, fragments of
/// a few rows over many messages) still completes: the injection rule keeps a buffer
/// for receiving, so a ring full of fragments always has room to move one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_buffers_and_windows_never_deadlock() {
    let config = TransportConfig {
        message_size: 256,
        window: 1,
        send_buffers: 2,
        recv_buffers: 2,
        ..TransportConfig::default()
    };
    let nodes = loopback_ring(4, config).await.unwrap();
    let mut spec = CycloSpec::new(vec![], 0, CycloAlgorithm::Hash);
    (spec.r_rows, spec.s_rows, spec.zipf) = (6000, 6000, 0.9);
    spec.options = CycloOptions {
        threads: 1,
        rotate: Rotate::Left,
        roundabout: RoundaboutConfig {
            buffers: 2,
            buffer_bytes: 1024,
            forward: ForwardPolicy::OnArrival,
        },
        ..CycloOptions::default()
    };
    let want = reference(&spec);
    for (k, forward) in [ForwardPolicy::OnArrival, ForwardPolicy::AfterJoin]
        .into_iter()
        .enumerate()
    {
        spec.options.roundabout.forward = forward;
        spec.run_id = 8000 + k as u64;
        let figures = tokio::time::timeout(Duration::from_secs(60), run_on(&nodes, &spec))
            .await
            .expect("no deadlock")
            .unwrap();
        check_flow(&figures, 2);
        assert!(figures[0].fragments_injected > 20);
        assert_eq!(total(&figures), want, "{forward:?}");
    }
}
