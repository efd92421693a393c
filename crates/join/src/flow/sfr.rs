//! Symmetric Fragment Replicate (Stamos and Young; Rödiger, *Scalable Distributed Query
//! Processing in Parallel Main-Memory Database Systems*, 4.4.2) for keys heavy in both
//! inputs: the n nodes form a `rows x cols` grid; every build row of the key is
//! replicated to the `rows` nodes of one column, every probe row to the `cols` nodes of
//! one row, so each (build, probe) pair meets at exactly one node, the intersection.
//! A node's rows take the column and the row the node itself is in.
//!
//! Cost: with the key occurring x times on the build side and y times on the probe
//! side per node, the grid costs `(rows - 1) x + (cols - 1) y` time units; a broadcast
//! of the build rows is the grid `n x 1`, of the probe rows `1 x n`. The best grid is
//! the divisor pair that minimises the cost.

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
    /// Nodes the build rows of node `origin` are replicated to: its column.
    pub fn build_targets(&self, origin: usize) -> impl Iterator<Item = usize> + '_ {
        let col = origin % self.cols;
        (0..self.rows).map(move |r| r * self.cols + col)
    }

    /// Nodes the probe rows of node `origin` are replicated to: its row.
    pub fn probe_targets(&self, origin: usize) -> impl Iterator<Item = usize> + '_ {
        let row = origin / self.cols;
        (0..self.cols).map(move |c| row * self.cols + c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_follow_the_cost_formula() {
        // n = 36 (Rödiger, Fig. 4.12): frequencies within 1.5x -> 6 x 6.
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
            (8, choose_grid(8, 1.0, 30.0)),
        ] {
            for a in 0..n {
                for b in 0..n {
                    let build: Vec<usize> = g.build_targets(a).collect();
                    let probe: Vec<usize> = g.probe_targets(b).collect();
                    let meet = build.iter().filter(|x| probe.contains(x)).count();
                    assert_eq!(meet, 1, "n = {n}, {g:?}");
                    assert!(build.iter().chain(&probe).all(|&x| x < n));
                }
            }
        }
    }
}
