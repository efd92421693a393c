//! Phase 3 of Neo-Join: the transfers as rounds in which no node sends to two nodes
//! or receives from two (thesis, section 2.3.3).
//!
//! Two senders writing to one receiver share its downlink while other links idle; a
//! schedule of matchings keeps every link to one transfer. Finding the shortest one is
//! open-shop scheduling with preemption (Gonzalez and Sahni, 1976), solvable exactly:
//! with `alpha` the largest bytes any node sends or receives, pad the transfer matrix
//! to a `2n x 2n` matrix whose rows and columns all sum to `alpha`
//!
//! ```text
//!     [ T              diag(alpha - s_i) ]
//!     [ diag(alpha - r_j)   T^t          ]
//! ```
//!
//! (real senders and receivers, then virtual ones that absorb idle time). Such a
//! matrix always has a perfect matching on its positive entries (König); a round runs
//! the matched transfers for the smallest matched amount and subtracts it. Every round
//! lowers every row and column sum by the same amount, so the rounds add up to exactly
//! `alpha`, the lower bound. Matchings are chosen bottleneck-first (largest smallest
//! entry), which on the thesis' example gives its three rounds of 6, 5 and 1.

use crate::error::{JoinError, Result};

/// One transfer in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub from: u32,
    pub to: u32,
    pub bytes: u64,
}

/// Transfers that run at the same time: each node sends at most one and receives at
/// most one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// The round's length in bytes (every transfer in it moves this many, or it is
    /// the rest of a transfer that ends in it).
    pub bytes: u64,
    pub transfers: Vec<Transfer>,
}

/// The largest bytes any node sends or receives: no schedule is shorter.
/// The diagonal (a node's bytes to itself) is not sent.
pub fn lower_bound(matrix: &[Vec<u64>]) -> u64 {
    let (send, receive) = loads(matrix);
    send.into_iter().chain(receive).max().unwrap_or(0)
}

/// Bytes each node sends and receives, the diagonal left out.
fn loads(matrix: &[Vec<u64>]) -> (Vec<u64>, Vec<u64>) {
    let n = matrix.len();
    let cell = |i: usize, k: usize| if i == k { 0 } else { matrix[i][k] };
    let send = (0..n).map(|i| (0..n).map(|k| cell(i, k)).sum()).collect();
    let receive = (0..n).map(|k| (0..n).map(|i| cell(i, k)).sum()).collect();
    (send, receive)
}

/// The open-shop schedule of `matrix` (`matrix[from][to]` bytes; the diagonal is
/// ignored): rounds whose lengths add up to [`lower_bound`].
pub fn open_shop(matrix: &[Vec<u64>]) -> Result<Vec<Round>> {
    let n = matrix.len();
    if matrix.iter().any(|row| row.len() != n) {
        return Err(JoinError::InvalidConfig(
            "the transfer matrix must be square".into(),
        ));
    }
    let cells = |i: usize, k: usize| if i == k { 0 } else { matrix[i][k] };
    let (send, receive) = loads(matrix);
    let alpha = send.iter().chain(&receive).copied().max().unwrap_or(0);

    let size = 2 * n;
    let mut padded = vec![vec![0u64; size]; size];
    for i in 0..n {
        for k in 0..n {
            padded[i][k] = cells(i, k);
            padded[n + k][n + i] = cells(i, k);
        }
        padded[i][n + i] = alpha - send[i];
        padded[n + i][i] = alpha - receive[i];
    }

    let mut rounds = Vec::new();
    let mut left = alpha;
    while left > 0 {
        let matching = bottleneck_matching(&padded).ok_or_else(|| {
            JoinError::InvalidConfig("no perfect matching in a regular matrix".into())
        })?;
        let bytes = (0..size)
            .map(|row| padded[row][matching[row]])
            .min()
            .unwrap_or(0);
        debug_assert!(bytes > 0);
        let mut transfers = Vec::new();
        for (row, &column) in matching.iter().enumerate() {
            padded[row][column] -= bytes;
            if row < n && column < n {
                transfers.push(Transfer {
                    from: row as u32,
                    to: column as u32,
                    bytes,
                });
            }
        }
        left -= bytes;
        if !transfers.is_empty() {
            rounds.push(Round { bytes, transfers });
        }
    }
    Ok(rounds)
}

/// What one node does in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeRound {
    /// The node it sends to, and how many bytes.
    pub send: Option<(u32, u64)>,
    /// The node it receives from.
    pub receive: Option<u32>,
}

/// `node`'s part of every round, in order (idle rounds included: every node takes part
/// in every round's synchronisation).
pub fn node_rounds(rounds: &[Round], node: u32) -> Vec<NodeRound> {
    rounds
        .iter()
        .map(|round| NodeRound {
            send: round
                .transfers
                .iter()
                .find(|t| t.from == node)
                .map(|t| (t.to, t.bytes)),
            receive: round
                .transfers
                .iter()
                .find(|t| t.to == node)
                .map(|t| t.from),
        })
        .collect()
}

/// A perfect matching on the positive entries whose smallest entry is largest
/// (`matching[row] = column`), if any.
fn bottleneck_matching(matrix: &[Vec<u64>]) -> Option<Vec<usize>> {
    let mut values: Vec<u64> = matrix
        .iter()
        .flatten()
        .copied()
        .filter(|&v| v > 0)
        .collect();
    values.sort_unstable();
    values.dedup();
    // The largest threshold that still allows a perfect matching.
    let (mut low, mut high) = (0usize, values.len());
    let mut best = None;
    while low < high {
        let mid = (low + high) / 2;
        match perfect_matching(matrix, values[mid]) {
            Some(found) => {
                best = Some(found);
                low = mid + 1;
            }
            None => high = mid,
        }
    }
    best
}

/// A perfect matching using entries `>= threshold` (augmenting paths; the matrices
/// are `2n x 2n` for n nodes).
fn perfect_matching(matrix: &[Vec<u64>], threshold: u64) -> Option<Vec<usize>> {
    let size = matrix.len();
    let mut row_of = vec![usize::MAX; size];
    for row in 0..size {
        let mut seen = vec![false; size];
        if !augment(matrix, threshold, row, &mut seen, &mut row_of) {
            return None;
        }
    }
    let mut column_of = vec![0; size];
    for (column, &row) in row_of.iter().enumerate() {
        column_of[row] = column;
    }
    Some(column_of)
}

fn augment(
    matrix: &[Vec<u64>],
    threshold: u64,
    row: usize,
    seen: &mut [bool],
    row_of: &mut [usize],
) -> bool {
    for column in 0..matrix.len() {
        if matrix[row][column] >= threshold && !seen[column] {
            seen[column] = true;
            if row_of[column] == usize::MAX
                || augment(matrix, threshold, row_of[column], seen, row_of)
            {
                row_of[column] = row;
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Every round is a matching, the rounds move exactly the matrix, and they add up
    /// to the lower bound.
    fn check(matrix: &[Vec<u64>], rounds: &[Round]) {
        let n = matrix.len();
        let mut moved = vec![vec![0u64; n]; n];
        for round in rounds {
            let mut sends = vec![false; n];
            let mut receives = vec![false; n];
            for t in &round.transfers {
                assert!(t.from != t.to);
                assert!(!sends[t.from as usize], "{} sends twice", t.from);
                assert!(!receives[t.to as usize], "{} receives twice", t.to);
                sends[t.from as usize] = true;
                receives[t.to as usize] = true;
                assert_eq!(t.bytes, round.bytes);
                moved[t.from as usize][t.to as usize] += t.bytes;
            }
        }
        for i in 0..n {
            for k in (0..n).filter(|&k| k != i) {
                assert_eq!(moved[i][k], matrix[i][k], "transfer {i} -> {k}");
            }
        }
        let total: u64 = rounds.iter().map(|r| r.bytes).sum();
        assert_eq!(total, lower_bound(matrix));
    }

    #[test]
    fn the_thesis_example_takes_three_rounds_of_6_5_and_1() {
        let matrix = vec![vec![0, 6, 5], vec![5, 0, 6], vec![7, 5, 0]];
        let rounds = open_shop(&matrix).unwrap();
        check(&matrix, &rounds);
        let lengths: Vec<u64> = rounds.iter().map(|r| r.bytes).collect();
        assert_eq!(lengths, vec![6, 5, 1]);
        let pairs = |r: &Round| {
            let mut p: Vec<_> = r.transfers.iter().map(|t| (t.from, t.to)).collect();
            p.sort();
            p
        };
        assert_eq!(pairs(&rounds[0]), vec![(0, 1), (1, 2), (2, 0)]);
        assert_eq!(pairs(&rounds[1]), vec![(0, 2), (1, 0), (2, 1)]);
        assert_eq!(pairs(&rounds[2]), vec![(2, 0)]);
        let mine = node_rounds(&rounds, 0);
        assert_eq!(mine.len(), 3);
        assert_eq!(mine[2].send, None);
        assert_eq!(mine[2].receive, Some(2));
        let sent: u64 = mine.iter().filter_map(|r| r.send).map(|(_, b)| b).sum();
        assert_eq!(sent, 6 + 5);
        // 34 units over 3 nodes in 12: 94% of the links' capacity.
        assert_eq!(lower_bound(&matrix), 12);
    }

    #[test]
    fn random_matrices_are_scheduled_in_the_lower_bound() {
        let mut rng = StdRng::seed_from_u64(3);
        for case in 0..200 {
            let n = 1 + case % 8;
            let sparse = case % 3 == 0;
            let matrix: Vec<Vec<u64>> = (0..n)
                .map(|i| {
                    (0..n)
                        .map(|k| {
                            if i == k || (sparse && rng.random_bool(0.5)) {
                                0
                            } else {
                                rng.random_range(0..1_000_000)
                            }
                        })
                        .collect()
                })
                .collect();
            let rounds = open_shop(&matrix).unwrap();
            check(&matrix, &rounds);
            // Each round ends at least one transfer or padding entry: at most as many
            // rounds as positive entries of the padded matrix.
            let positive = matrix.iter().flatten().filter(|&&v| v > 0).count();
            assert!(
                rounds.len() <= 2 * positive + 2 * n,
                "{} rounds",
                rounds.len()
            );
        }
    }

    #[test]
    fn uniform_all_to_all_takes_n_minus_1_rounds() {
        for n in 2..=8 {
            let matrix: Vec<Vec<u64>> = (0..n)
                .map(|i| (0..n).map(|k| if i == k { 0 } else { 100 }).collect())
                .collect();
            let rounds = open_shop(&matrix).unwrap();
            check(&matrix, &rounds);
            assert_eq!(rounds.len(), n - 1, "{n} nodes");
        }
    }

    #[test]
    fn empty_and_bad_matrices() {
        assert!(open_shop(&[]).unwrap().is_empty());
        assert!(open_shop(&[vec![0, 0], vec![0, 0]]).unwrap().is_empty());
        assert!(open_shop(&[vec![0, 1], vec![0]]).is_err());
        // The diagonal is not a transfer.
        let rounds = open_shop(&[vec![9, 1], vec![0, 9]]).unwrap();
        assert_eq!(rounds.len(), 1);
        assert_eq!(
            rounds[0].transfers,
            vec![Transfer {
                from: 0,
                to: 1,
                bytes: 1
            }]
        );
    }
}
