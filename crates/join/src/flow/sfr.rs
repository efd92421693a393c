//! Symmetric Fragment Replicate (Stamos and Young; thesis Ch. 4.4.2) for keys heavy in
//! both inputs: the n nodes form an `rows x cols` grid; every R tuple of the key picks
//! a column and is replicated to the `rows` nodes of that column, every S tuple picks a
//! row and is replicated to the `cols` nodes of that row, so each (R, S) pair meets at
//! exactly one node, the intersection.
//!
//! Cost (thesis): with the key occurring x times in R and y times in S per node, the
//! grid costs `(rows - 1) x + (cols - 1) y` time units; a broadcast of R is the grid
//! `n x 1` and of S `1 x n`. The best grid is the divisor pair that minimises the cost.

use super::mix64;

/// A grid shape: `rows * cols` = number of nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub rows: usize,
    pub cols: usize,
}

/// The grid of least cost for a key with (relative) frequencies `x` in R and `y` in S.
/// Ties go to the more square grid, then to fewer R copies.
pub fn choose_grid(nodes: usize, x: f64, y: f64) -> Grid {
    let nodes = nodes.max(1);
    let mut best: Option<(f64, usize, Grid)> = None;
    for rows in (1..=nodes).filter(|r| nodes.is_multiple_of(*r)) {
        let cols = nodes / rows;
        let cost = (rows - 1) as f64 * x + (cols - 1) as f64 * y;
        let skew = rows.abs_diff(cols);
        let better = match best {
            None => true,
            Some((c, s, g)) => {
                cost < c - 1e-12 * c.abs().max(1.0)
                    || (cost <= c + 1e-12 * c.abs().max(1.0)
                        && (skew < s || (skew == s && rows < g.rows)))
            }
        };
        if better {
            best = Some((cost, skew, Grid { rows, cols }));
        }
    }
    best.expect("at least the 1 x n grid").2
}

impl Grid {
    /// Nodes an R tuple with this id is replicated to: one column.
    pub fn build_targets(&self, id: u64) -> impl Iterator<Item = usize> + '_ {
        let col = (mix64(id ^ 0xC0C0) % self.cols as u64) as usize;
        (0..self.rows).map(move |r| r * self.cols + col)
    }

    /// Nodes an S tuple with this id is replicated to: one row.
    pub fn probe_targets(&self, id: u64) -> impl Iterator<Item = usize> + '_ {
        let row = (mix64(id ^ 0x0707) % self.rows as u64) as usize;
        (0..self.cols).map(move |c| row * self.cols + c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_follow_the_thesis_cost_formula() {
        // n = 36 (thesis Fig. 4.12): frequencies within 1.5x -> 6 x 6.
        assert_eq!(choose_grid(36, 1.0, 1.0), Grid { rows: 6, cols: 6 });
        assert_eq!(choose_grid(36, 1.0, 1.5), Grid { rows: 6, cols: 6 });
        // Slightly above 1.5x the 9 x 4 grid (fewer S copies) wins.
        assert_eq!(choose_grid(36, 1.0, 1.6), Grid { rows: 9, cols: 4 });
        // More than n/2 = 18x: a broadcast of R (n rows, S not replicated).
        assert_eq!(choose_grid(36, 1.0, 19.0), Grid { rows: 36, cols: 1 });
        assert_eq!(choose_grid(36, 19.0, 1.0), Grid { rows: 1, cols: 36 });
        // Prime n: only broadcasts are possible.
        assert_eq!(choose_grid(5, 1.0, 2.0), Grid { rows: 5, cols: 1 });
        assert_eq!(choose_grid(1, 3.0, 3.0), Grid { rows: 1, cols: 1 });
        assert_eq!(choose_grid(4, 1.0, 1.0), Grid { rows: 2, cols: 2 });
    }

    #[test]
    fn every_pair_meets_exactly_once() {
        for (n, g) in [
            (4, choose_grid(4, 1.0, 1.0)),
            (6, Grid { rows: 2, cols: 3 }),
        ] {
            for r in 0..50u64 {
                for s in 0..50u64 {
                    let a: Vec<usize> = g.build_targets(r).collect();
                    let b: Vec<usize> = g.probe_targets(s + 1000).collect();
                    let meet = a.iter().filter(|x| b.contains(x)).count();
                    assert_eq!(meet, 1, "n = {n}");
                    assert!(a.iter().all(|&x| x < n));
                }
            }
        }
    }
}
