//! Neo-Join's phases together: the thesis' running example, the MILP against brute
//! force, the greedy assignment's bounds, and locality.

use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// The thesis' running example (figure 2.4): 3 nodes, 8 MSB-radix partitions of
/// 5-bit keys, tuples per node and partition.
fn thesis_example() -> Sizes {
    let h = [
        vec![7, 1, 7, 7, 1, 4, 1, 4],
        vec![1, 3, 2, 2, 10, 3, 10, 1],
        vec![2, 11, 2, 3, 3, 9, 2, 0],
    ];
    // One side only: the example counts tuples of both relations together.
    let none = vec![vec![0; 8]; 3];
    Sizes::from_rows(&none, &h).unwrap()
}

/// The cheapest assignment by trying all of them.
fn brute_force(sizes: &Sizes, broadcast: Broadcastable) -> u64 {
    let n = sizes.nodes();
    let mut choices: Vec<Placement> = (0..n as u32).map(Placement::Node).collect();
    if broadcast.build {
        choices.push(Placement::BroadcastBuild);
    }
    if broadcast.probe {
        choices.push(Placement::BroadcastProbe);
    }
    let p = sizes.partitions();
    let mut index = vec![0usize; p];
    let mut best = u64::MAX;
    loop {
        let assignment = Assignment::new(index.iter().map(|&c| choices[c]).collect());
        best = best.min(assignment.costs(sizes).max());
        let mut digit = 0;
        loop {
            if digit == p {
                return best;
            }
            index[digit] += 1;
            if index[digit] < choices.len() {
                break;
            }
            index[digit] = 0;
            digit += 1;
        }
    }
}

fn random_sizes(rng: &mut StdRng, nodes: usize, partitions: usize, skewed: bool) -> Sizes {
    let mut sizes = Sizes::new(nodes, partitions).unwrap();
    for node in 0..nodes {
        let row = |rng: &mut StdRng| -> Vec<u64> {
            (0..partitions)
                .map(|j| {
                    let heavy = skewed && j == 0;
                    rng.random_range(0..if heavy { 5_000 } else { 100 })
                })
                .collect()
        };
        let (build, probe) = (row(rng), row(rng));
        sizes.set(node, &build, &probe);
    }
    sizes
}

#[test]
fn the_thesis_example_is_solved_to_its_unique_optimum() {
    let sizes = thesis_example();
    let solved = assign(&sizes, &AssignOptions::default());
    let nodes: Vec<u32> = solved
        .assignment
        .placements()
        .iter()
        .map(|p| match p {
            Placement::Node(i) => *i,
            other => panic!("{other:?} without selective broadcast"),
        })
        .collect();
    if cfg!(feature = "milp") {
        assert_eq!(
            solved.method,
            Method::Milp {
                optimal: true,
                gap: 0.0
            }
        );
    }
    assert_eq!(solved.costs.max(), 12);
    assert_eq!(nodes, vec![0, 2, 0, 0, 1, 2, 1, 1]);
    assert_eq!(solved.costs.send, vec![11, 11, 12]);
    assert_eq!(solved.costs.receive, vec![12, 11, 11]);
    assert_eq!(
        solved.assignment.transfers(&sizes),
        vec![vec![0, 6, 5], vec![5, 0, 6], vec![7, 5, 0]]
    );
    assert_eq!(brute_force(&sizes, Broadcastable::NONE), 12);
    // Largest owner alone costs 13 (P7 to node 0); hash placement about 21.
    let owners = Assignment::new(
        [0, 2, 0, 0, 1, 2, 1, 0]
            .into_iter()
            .map(Placement::Node)
            .collect(),
    );
    assert_eq!(owners.costs(&sizes).max(), 13);
    assert_eq!(sizes.hash_max_cost(), 21);
    // Its schedule: 3 rounds of 6, 5 and 1.
    let rounds = open_shop(&solved.assignment.transfers(&sizes)).unwrap();
    let lengths: Vec<u64> = rounds.iter().map(|r| r.bytes).collect();
    assert_eq!(lengths, vec![6, 5, 1]);
    // The same costs from the transfer matrix, as measured transfers are costed.
    let matrix = solved.assignment.transfers(&sizes);
    assert_eq!(Costs::of_transfers(&matrix), solved.costs);
    // The two sides' transfers add up to it.
    let [build, probe] = [true, false].map(|b| solved.assignment.side_transfers(&sizes, b));
    for i in 0..3 {
        for k in 0..3 {
            assert_eq!(build[i][k] + probe[i][k], matrix[i][k]);
        }
    }
    assert_ne!(build, matrix);
}

#[test]
fn costs_of_measured_transfers_and_savings() {
    // Node 0 keeps 9 and sends 4 to node 1 and 2 to node 2; node 2 sends 6 to node 0.
    let matrix = vec![vec![9, 4, 2], vec![0, 5, 0], vec![6, 0, 1]];
    let hash = Costs::of_transfers(&matrix);
    assert_eq!(hash.send, vec![6, 0, 6]);
    assert_eq!(hash.receive, vec![6, 4, 2]);
    assert_eq!((hash.max(), hash.moved()), (6, 12));
    let costs = |max: u64| Costs {
        send: vec![max, 0, 0],
        receive: vec![0, max, 0],
    };
    assert_eq!(costs(3).saving_over(&hash), 50.0);
    assert_eq!(costs(6).saving_over(&hash), 0.0);
    assert_eq!(costs(9).saving_over(&hash), -50.0);
    // Nothing to save on a placement that moves nothing.
    assert_eq!(costs(0).saving_over(&costs(0)), 0.0);
    assert_eq!(costs(1).saving_over(&costs(0)), f64::NEG_INFINITY);
}

#[test]
fn the_greedy_assignment_finds_the_example_optimum_too() {
    let sizes = thesis_example();
    let options = AssignOptions {
        milp: false,
        ..AssignOptions::default()
    };
    let solved = assign(&sizes, &options);
    assert!(matches!(solved.method, Method::Greedy { .. }));
    assert_eq!(solved.method.to_string(), "greedy (the solver is off)");
    assert_eq!(solved.costs.max(), 12);
}

#[cfg(feature = "milp")]
#[test]
fn the_milp_matches_brute_force_on_small_instances() {
    let mut rng = StdRng::seed_from_u64(11);
    for case in 0..60 {
        let nodes = 2 + case % 2;
        let partitions = 2 + case % 5;
        let skewed = case % 3 == 0;
        let broadcast = match case % 4 {
            0 => Broadcastable::NONE,
            1 => Broadcastable::BOTH,
            2 => Broadcastable {
                build: true,
                probe: false,
            },
            _ => Broadcastable {
                build: false,
                probe: true,
            },
        };
        let sizes = random_sizes(&mut rng, nodes, partitions, skewed);
        let options = AssignOptions {
            broadcast,
            milp: true,
            time_limit: Duration::from_secs(10),
            link_rate: None,
        };
        let solved = assign(&sizes, &options);
        let optimum = brute_force(&sizes, broadcast);
        assert!(
            matches!(solved.method, Method::Milp { optimal: true, .. }),
            "case {case}: {}",
            solved.method
        );
        assert_eq!(solved.costs.max(), optimum, "case {case}: {sizes:?}");
        for placement in solved.assignment.placements() {
            match placement {
                Placement::BroadcastBuild => assert!(broadcast.build),
                Placement::BroadcastProbe => assert!(broadcast.probe),
                Placement::Node(i) => assert!((*i as usize) < nodes),
            }
        }
    }
}

#[test]
fn the_greedy_assignment_is_never_below_the_optimum_nor_above_largest_owner() {
    let mut rng = StdRng::seed_from_u64(5);
    for case in 0..60 {
        let sizes = random_sizes(&mut rng, 2 + case % 3, 2 + case % 4, case % 2 == 0);
        let broadcast = if case % 3 == 0 {
            Broadcastable::BOTH
        } else {
            Broadcastable::NONE
        };
        let far = Instant::now() + Duration::from_secs(10);
        let greedy = assign::greedy(&sizes, broadcast, far).costs(&sizes).max();
        let optimum = brute_force(&sizes, broadcast);
        let owner = assign::greedy(&sizes, Broadcastable::NONE, Instant::now())
            .costs(&sizes)
            .max();
        assert!(greedy >= optimum);
        if !broadcast.build {
            assert!(greedy <= owner, "case {case}: {greedy} > {owner}");
        }
    }
}

/// The thesis' locality: node `j mod n` holds x% of partition j plus its 1/n share of
/// the rest. The optimum keeps every partition at its owner and moves (1 - x) (n-1)/n
/// of each node's data.
#[test]
fn locality_is_exploited_in_proportion() {
    let (nodes, partitions, per_node) = (4usize, 64usize, 1_000_000u64);
    for locality in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let per_partition = per_node * nodes as u64 / partitions as u64;
        let mut sizes = Sizes::new(nodes, partitions).unwrap();
        for node in 0..nodes {
            let row: Vec<u64> = (0..partitions)
                .map(|j| {
                    let spread = ((1.0 - locality) * per_partition as f64) as u64 / nodes as u64;
                    if j % nodes == node {
                        per_partition - spread * (nodes as u64 - 1)
                    } else {
                        spread
                    }
                })
                .collect();
            // Half the bytes on each side.
            let half: Vec<u64> = row.iter().map(|b| b / 2).collect();
            sizes.set(node, &half, &half);
        }
        let solved = assign(&sizes, &AssignOptions::default());
        let ideal = ((1.0 - locality) * (nodes as f64 - 1.0) / nodes as f64 * per_node as f64)
            .round() as u64;
        let max = solved.costs.max();
        assert!(
            max.abs_diff(ideal) <= ideal / 100 + 64,
            "locality {locality}: {max} vs {ideal} ({})",
            solved.method
        );
        assert!(max <= sizes.hash_max_cost());
    }
}

/// A partition with a heavy probe side and a small build side: broadcasting the build
/// side beats any node, as in the thesis' city/person example.
#[test]
fn selective_broadcast_keeps_a_skewed_partition_in_place() {
    let nodes = 4;
    let mut sizes = Sizes::new(nodes, 4).unwrap();
    for node in 0..nodes {
        // Partition 0: 1,000 build bytes and 100,000 probe bytes on every node.
        sizes.set(node, &[1_000, 500, 500, 500], &[100_000, 500, 500, 500]);
    }
    let plain = assign(&sizes, &AssignOptions::default());
    let options = AssignOptions {
        broadcast: Broadcastable::BOTH,
        ..AssignOptions::default()
    };
    let selective = assign(&sizes, &options);
    assert_eq!(
        selective.assignment.placement(0),
        Placement::BroadcastBuild,
        "{:?}",
        selective.assignment
    );
    assert!(selective.costs.max() * 10 < plain.costs.max());
    // Only the probe side may be broadcast: no help for partition 0.
    let probe_only = AssignOptions {
        broadcast: Broadcastable {
            build: false,
            probe: true,
        },
        ..AssignOptions::default()
    };
    let solved = assign(&sizes, &probe_only);
    assert_ne!(solved.assignment.placement(0), Placement::BroadcastBuild);
    // Transfers of a broadcast partition: every node sends its build bytes to all.
    let broadcast_all = Assignment::new(vec![Placement::BroadcastBuild; 4]);
    let matrix = broadcast_all.transfers(&sizes);
    assert_eq!(matrix[0][1], 1_000 + 500 * 3);
    assert_eq!(matrix[2][2], 0);
    // Shuffled side by side: all of it is the build side's, the probe side stays.
    assert_eq!(broadcast_all.side_transfers(&sizes, true), matrix);
    assert!(
        broadcast_all
            .side_transfers(&sizes, false)
            .iter()
            .flatten()
            .all(|&b| b == 0)
    );
    let costs = broadcast_all.costs(&sizes);
    assert_eq!(costs.send[0], 3 * 2_500);
    assert_eq!(costs.receive[0], 3 * 2_500);
    assert_eq!(costs.moved(), 4 * 3 * 2_500);
}

/// A hard instance (unbalanced nodes, random owners): the time limit holds and the
/// answer is at least as good as the greedy one.
#[test]
fn the_time_limit_returns_the_best_solution_found() {
    let mut rng = StdRng::seed_from_u64(17);
    let (nodes, partitions) = (16, 256);
    let mut sizes = Sizes::new(nodes, partitions).unwrap();
    for node in 0..nodes {
        let row: Vec<u64> = (0..partitions)
            .map(|_| rng.random_range(0..1_000_000))
            .collect();
        sizes.set(node, &row, &row);
    }
    let options = AssignOptions {
        time_limit: Duration::from_millis(200),
        ..AssignOptions::default()
    };
    let solved = assign(&sizes, &options);
    let greedy = assign(
        &sizes,
        &AssignOptions {
            milp: false,
            ..options
        },
    );
    assert!(solved.costs.max() <= greedy.costs.max());
    // Generous: the limit plus model building, on a loaded machine.
    assert!(
        solved.elapsed < Duration::from_secs(10),
        "{:?}",
        solved.elapsed
    );
}

/// The solver gets a tenth of the time the greedy assignment's shuffle takes at the
/// link rate: when that is under 5 ms it does not run and the method says why; on a
/// slow enough link it does.
#[test]
fn short_shuffles_skip_the_solver() {
    let sizes = thesis_example();
    let greedy = assign(
        &sizes,
        &AssignOptions {
            milp: false,
            ..AssignOptions::default()
        },
    );
    // The busiest link of 13 bytes takes 13 ms at 1000 B/s: 1.3 ms to solve.
    let at = |link_rate: f64| {
        assign(
            &sizes,
            &AssignOptions {
                link_rate: Some(link_rate),
                ..AssignOptions::default()
            },
        )
    };
    let skipped = at(1000.0);
    assert!(
        matches!(&skipped.method, Method::Greedy { reason } if reason.contains("too short")),
        "{:?}",
        skipped.method
    );
    assert_eq!(skipped.assignment, greedy.assignment);
    // 13 bytes at 10 B/s take 1.3 s: the solver gets its whole 100 ms.
    if cfg!(feature = "milp") {
        assert!(matches!(at(10.0).method, Method::Milp { .. }));
    }
}

/// No assignment's busiest link is below the lower bound, and on the thesis example
/// the optimum is close to it.
#[test]
fn the_lower_bound_holds() {
    let mut rng = StdRng::seed_from_u64(5);
    for skewed in [false, true] {
        for _ in 0..20 {
            let sizes = random_sizes(&mut rng, 3, 5, skewed);
            for broadcast in [
                Broadcastable::NONE,
                Broadcastable {
                    build: true,
                    probe: true,
                },
            ] {
                let bound = sizes.busiest_link_lower_bound(broadcast);
                assert!(bound <= brute_force(&sizes, broadcast), "{sizes:?}");
            }
        }
    }
    let example = thesis_example();
    // 96 tuples, 65 at most kept where they are: 31 move, over 3 senders; the optimum
    // is 12.
    assert_eq!(example.busiest_link_lower_bound(Broadcastable::NONE), 11);
}

#[test]
fn sizes_refuse_bad_shapes() {
    assert!(Sizes::new(0, 4).is_err());
    assert!(Sizes::new(4, 0).is_err());
    assert!(Sizes::from_rows(&[vec![1, 2]], &[vec![1]]).is_err());
    assert!(Sizes::from_rows(&[vec![1, 2]], &[]).is_err());
}

/// Phase 1 to phase 3 on keys clustered by node (time-of-creation order): fine
/// histograms, adaptive partitions, the assignment keeps each range at home, and
/// nothing needs scheduling.
#[test]
fn clustered_keys_stay_home() {
    let nodes = 4usize;
    let rows_per_node = 50_000u64;
    let domain = RadixDomain::new(0, nodes as u64 * rows_per_node - 1, 12).unwrap();
    let mut fine = Vec::new();
    for node in 0..nodes as u64 {
        let mut build = FineHistogram::new(domain);
        let mut probe = FineHistogram::new(domain);
        let keys = node * rows_per_node..(node + 1) * rows_per_node;
        build.add_keys(keys.clone(), 16);
        probe.add_keys(keys.flat_map(|k| [k, k]), 24);
        fine.push((build, probe));
    }
    let global: Vec<u64> = (0..domain.buckets())
        .map(|b| fine.iter().map(|(r, s)| r.bytes()[b] + s.bytes()[b]).sum())
        .collect();
    let map = PartitionMap::adaptive(domain, &global, 32).unwrap();
    let mut sizes = Sizes::new(nodes, map.partitions()).unwrap();
    for (node, (build, probe)) in fine.iter().enumerate() {
        sizes.set(node, &build.per_partition(&map), &probe.per_partition(&map));
    }
    let solved = assign(&sizes, &AssignOptions::default());
    // Only the partitions straddling two nodes' ranges move anything.
    assert!(
        solved.costs.moved() * 10 < sizes.hash_moved(),
        "{} of {}",
        solved.costs.moved(),
        sizes.hash_moved()
    );
    let rounds = open_shop(&solved.assignment.transfers(&sizes)).unwrap();
    assert_eq!(
        rounds.iter().map(|r| r.bytes).sum::<u64>(),
        solved.costs.max()
    );
}

/// Without locality every node holds as much of each partition: the largest-owner
/// start must spread the partitions over the nodes (all to node 0 would make it
/// receive everything), so that even without time for the local search the
/// assignment is as good as hash placement.
#[test]
fn without_locality_the_greedy_start_spreads_partitions() {
    let (nodes, partitions) = (16, 256);
    let mut sizes = Sizes::new(nodes, partitions).unwrap();
    for node in 0..nodes {
        sizes.set(node, &[1_000; 256], &[1_000; 256]);
    }
    let start = assign::greedy(&sizes, Broadcastable::NONE, Instant::now());
    assert_eq!(start.costs(&sizes).max(), sizes.hash_max_cost());
}
