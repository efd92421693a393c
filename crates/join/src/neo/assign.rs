//! Phase 2 of Neo-Join: which node joins each partition, or which side of it is
//! broadcast (thesis, section 2.3 and 2.4.2).
//!
//! With a star network whose links are full duplex, the shuffle takes as long as the
//! busiest link: the largest bytes any node sends or receives. OPT-ASSIGN chooses for
//! every partition the node that joins it so that this maximum is smallest; bytes a
//! node already holds of a partition assigned to it cost nothing. Selective broadcast
//! (SEL-BCAST) adds two choices per partition: broadcast its build fragments (every
//! node keeps its probe fragment and receives the whole build side of the partition)
//! or its probe fragments. Heavily skewed partitions then stay where they are and only
//! their small other side moves.
//!
//! The problem is NP-hard (PARTITION reduces to it). [`assign`] solves the thesis'
//! mixed-integer program with HiGHS under a time limit, started from the greedy
//! assignment, and keeps whichever is better; without the solver (the `milp` feature
//! off) or when it fails, the greedy assignment alone: each partition to its largest
//! owner, then moves off the busiest node while they lower the maximum (the thesis'
//! suggested heuristic, as a steepest descent).

use std::time::{Duration, Instant};

use crate::error::{JoinError, Result};

/// Bytes of each partition on each node, per side of the join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes {
    nodes: usize,
    partitions: usize,
    /// `build[node * partitions + j]`.
    build: Vec<u64>,
    probe: Vec<u64>,
}

impl Sizes {
    pub fn new(nodes: usize, partitions: usize) -> Result<Self> {
        if nodes == 0 || partitions == 0 {
            return Err(JoinError::InvalidConfig(format!(
                "an assignment needs nodes and partitions, not {nodes} x {partitions}"
            )));
        }
        Ok(Self {
            nodes,
            partitions,
            build: vec![0; nodes * partitions],
            probe: vec![0; nodes * partitions],
        })
    }

    /// From per-node rows of per-partition bytes (`build[node][j]`).
    pub fn from_rows(build: &[Vec<u64>], probe: &[Vec<u64>]) -> Result<Self> {
        let partitions = build.first().map_or(0, Vec::len);
        let mut sizes = Self::new(build.len(), partitions)?;
        if probe.len() != build.len()
            || build.iter().chain(probe).any(|row| row.len() != partitions)
        {
            return Err(JoinError::InvalidConfig(
                "every node needs both sides' bytes for every partition".into(),
            ));
        }
        for node in 0..sizes.nodes {
            sizes.set(node, &build[node], &probe[node]);
        }
        Ok(sizes)
    }

    /// Sets one node's bytes per partition of both sides.
    pub fn set(&mut self, node: usize, build: &[u64], probe: &[u64]) {
        let row = node * self.partitions..(node + 1) * self.partitions;
        self.build[row.clone()].copy_from_slice(build);
        self.probe[row].copy_from_slice(probe);
    }

    pub fn nodes(&self) -> usize {
        self.nodes
    }

    pub fn partitions(&self) -> usize {
        self.partitions
    }

    pub fn build(&self, node: usize, j: usize) -> u64 {
        self.build[node * self.partitions + j]
    }

    pub fn probe(&self, node: usize, j: usize) -> u64 {
        self.probe[node * self.partitions + j]
    }

    /// Both sides' bytes of partition `j` on `node` (the thesis' h_ij).
    pub fn both(&self, node: usize, j: usize) -> u64 {
        self.build(node, j) + self.probe(node, j)
    }

    /// The bytes of partition `j` on `node` that a broadcast placement sends to every
    /// other node (its side's; none for a placement on a node).
    pub fn broadcast(&self, placement: Placement, node: usize, j: usize) -> u64 {
        match placement {
            Placement::BroadcastBuild => self.build(node, j),
            Placement::BroadcastProbe => self.probe(node, j),
            Placement::Node(_) => 0,
        }
    }

    /// Bytes on all nodes.
    pub fn total(&self) -> u64 {
        self.build.iter().chain(&self.probe).sum()
    }

    /// What hash placement moves: each node keeps `1/n` of what it holds and sends the
    /// rest (the thesis' comparison; the hash join sends exactly this in expectation).
    pub fn hash_moved(&self) -> u64 {
        let n = self.nodes as u64;
        self.total() * (n - 1) / n
    }

    /// A lower bound on the busiest link of any assignment: each partition moves at
    /// least what its largest holder lacks, or one side to every other node if that
    /// side may be broadcast, and `n` nodes share the sending.
    pub fn busiest_link_lower_bound(&self, broadcast: Broadcastable) -> u64 {
        let n = self.nodes as u64;
        let moved: u64 = (0..self.partitions)
            .map(|j| {
                let (mut all, mut most, mut build, mut probe) = (0, 0, 0, 0);
                for i in 0..self.nodes {
                    all += self.both(i, j);
                    most = most.max(self.both(i, j));
                    build += self.build(i, j);
                    probe += self.probe(i, j);
                }
                let mut least = all - most;
                if broadcast.build {
                    least = least.min((n - 1) * build);
                }
                if broadcast.probe {
                    least = least.min((n - 1) * probe);
                }
                least
            })
            .sum();
        moved.div_ceil(n)
    }

    /// The largest bytes one node sends or receives under hash placement.
    pub fn hash_max_cost(&self) -> u64 {
        let n = self.nodes as u64;
        let total = self.total();
        (0..self.nodes)
            .map(|i| {
                let held: u64 = (0..self.partitions).map(|j| self.both(i, j)).sum();
                // Sends (n-1)/n of its own, receives 1/n of everyone else's.
                let send = held * (n - 1) / n;
                let receive = (total - held) / n;
                send.max(receive)
            })
            .max()
            .unwrap_or(0)
    }
}

/// Where a partition is joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Both sides' fragments go to this node.
    Node(u32),
    /// The build fragments go to every node; the probe fragments stay.
    BroadcastBuild,
    /// The probe fragments go to every node; the build fragments stay.
    BroadcastProbe,
}

/// Which sides a join may broadcast and still answer correctly: a replicated build
/// row must not be emitted unmatched more than once (left outer, semi and anti
/// joins keep build rows), a replicated probe row likewise (right outer, semi, anti).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Broadcastable {
    pub build: bool,
    pub probe: bool,
}

impl Broadcastable {
    pub const NONE: Self = Self {
        build: false,
        probe: false,
    };
    pub const BOTH: Self = Self {
        build: true,
        probe: true,
    };

    fn allows(self, placement: Placement) -> bool {
        match placement {
            Placement::Node(_) => true,
            Placement::BroadcastBuild => self.build,
            Placement::BroadcastProbe => self.probe,
        }
    }
}

impl Placement {
    pub fn is_broadcast(self) -> bool {
        !matches!(self, Placement::Node(_))
    }
}

/// One placement per partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    placements: Vec<Placement>,
}

impl Assignment {
    pub fn new(placements: Vec<Placement>) -> Self {
        Self { placements }
    }

    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    pub fn placement(&self, j: usize) -> Placement {
        self.placements[j]
    }

    /// Partitions broadcast by one side or the other.
    pub fn broadcasts(&self) -> usize {
        self.placements.iter().filter(|p| p.is_broadcast()).count()
    }

    /// Bytes each node sends and receives (the thesis' s_i and r_i).
    pub fn costs(&self, sizes: &Sizes) -> Costs {
        let mut costs = CostSums::zero(sizes.nodes);
        for (j, &placement) in self.placements.iter().enumerate() {
            costs.apply(sizes, j, placement, 1);
        }
        costs.into_costs()
    }

    /// Bytes from each node to each other node (`matrix[from][to]`, zero diagonal).
    pub fn transfers(&self, sizes: &Sizes) -> Vec<Vec<u64>> {
        let mut matrix = self.side_transfers(sizes, true);
        let probe = self.side_transfers(sizes, false);
        for (row, other) in matrix.iter_mut().zip(probe) {
            for (cell, bytes) in row.iter_mut().zip(other) {
                *cell += bytes;
            }
        }
        matrix
    }

    /// The build side's (`build`) or the probe side's part of [`Assignment::transfers`]:
    /// each side is shuffled on its own, the build side first.
    pub fn side_transfers(&self, sizes: &Sizes, build: bool) -> Vec<Vec<u64>> {
        let n = sizes.nodes;
        let mut matrix = vec![vec![0u64; n]; n];
        let bytes = |from: usize, j: usize| match build {
            true => sizes.build(from, j),
            false => sizes.probe(from, j),
        };
        for (j, &placement) in self.placements.iter().enumerate() {
            for (from, row) in matrix.iter_mut().enumerate() {
                match placement {
                    Placement::Node(to) if to as usize != from => {
                        row[to as usize] += bytes(from, j)
                    }
                    Placement::Node(_) => {}
                    Placement::BroadcastBuild | Placement::BroadcastProbe => {
                        if (placement == Placement::BroadcastBuild) != build {
                            continue; // the other side stays
                        }
                        for (to, cell) in row.iter_mut().enumerate() {
                            if to != from {
                                *cell += bytes(from, j);
                            }
                        }
                    }
                }
            }
        }
        matrix
    }
}

/// Bytes each node sends and receives under an assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Costs {
    pub send: Vec<u64>,
    pub receive: Vec<u64>,
}

impl Costs {
    /// The shuffle's duration in bytes of the busiest link.
    pub fn max(&self) -> u64 {
        self.send
            .iter()
            .chain(&self.receive)
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// All bytes that cross the network.
    pub fn moved(&self) -> u64 {
        self.send.iter().sum()
    }

    /// The costs of a transfer matrix (`matrix[from][to]`; the diagonal stays on its
    /// node), such as the bytes a hash shuffle would send, as the workers measured them.
    pub fn of_transfers(matrix: &[Vec<u64>]) -> Costs {
        let n = matrix.len();
        let mut costs = Costs {
            send: vec![0; n],
            receive: vec![0; n],
        };
        for (from, row) in matrix.iter().enumerate() {
            for (to, &bytes) in row.iter().enumerate().take(n) {
                if to != from {
                    costs.send[from] += bytes;
                    costs.receive[to] += bytes;
                }
            }
        }
        costs
    }

    /// The share of `other`'s busiest link these costs save, in percent (negative when
    /// they cost more; 0 when neither moves anything).
    pub fn saving_over(&self, other: &Costs) -> f64 {
        match other.max() {
            0 if self.max() == 0 => 0.0,
            0 => f64::NEG_INFINITY,
            base => 100.0 * (1.0 - self.max() as f64 / base as f64),
        }
    }
}

/// Costs as signed sums, so that a placement's share can be taken out again.
#[derive(Debug, Clone)]
struct CostSums {
    send: Vec<i128>,
    receive: Vec<i128>,
}

impl CostSums {
    fn zero(nodes: usize) -> Self {
        Self {
            send: vec![0; nodes],
            receive: vec![0; nodes],
        }
    }

    /// Adds (`sign` 1) or removes (-1) partition `j`'s share under `placement`.
    fn apply(&mut self, sizes: &Sizes, j: usize, placement: Placement, sign: i128) {
        let n = sizes.nodes;
        match placement {
            Placement::Node(to) => {
                let to = to as usize;
                for i in (0..n).filter(|&i| i != to) {
                    let bytes = sizes.both(i, j) as i128 * sign;
                    self.send[i] += bytes;
                    self.receive[to] += bytes;
                }
            }
            Placement::BroadcastBuild | Placement::BroadcastProbe => {
                let all: i128 = (0..n)
                    .map(|i| sizes.broadcast(placement, i, j) as i128)
                    .sum();
                for i in 0..n {
                    let own = sizes.broadcast(placement, i, j) as i128;
                    self.send[i] += (n as i128 - 1) * own * sign;
                    self.receive[i] += (all - own) * sign;
                }
            }
        }
    }

    fn max(&self) -> i128 {
        self.send
            .iter()
            .chain(&self.receive)
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// The local search's order: the maximum first, then how many links carry it,
    /// then all bytes moved.
    fn rank(&self) -> (i128, usize, i128) {
        let max = self.max();
        let at_max = self
            .send
            .iter()
            .chain(&self.receive)
            .filter(|&&c| c == max)
            .count();
        (max, at_max, self.send.iter().sum())
    }

    fn into_costs(self) -> Costs {
        let unsigned = |v: Vec<i128>| v.into_iter().map(|c| c.max(0) as u64).collect();
        Costs {
            send: unsigned(self.send),
            receive: unsigned(self.receive),
        }
    }
}

/// The solver gets at most this fraction of the time the greedy assignment's shuffle
/// would take: deciding must not cost more than the better decision saves.
const SOLVER_SHARE: f64 = 0.1;
/// A shorter time limit does not start the solver (building the model alone takes
/// milliseconds).
const MIN_SOLVER_TIME: Duration = Duration::from_millis(5);

/// How to choose the assignment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AssignOptions {
    /// Which sides may be broadcast (selective broadcast); `NONE` is OPT-ASSIGN.
    pub broadcast: Broadcastable,
    /// Solve the MILP (if built with it); otherwise only the greedy assignment.
    pub milp: bool,
    /// The solver's time limit; the best solution found by then is used.
    pub time_limit: Duration,
    /// Bytes per second of each node's link, if known: the solver's time limit is cut
    /// to a tenth of the time the greedy assignment's busiest link takes at this rate,
    /// and the solver does not run when that leaves under 5 ms (on kilobytes the
    /// solver may use its whole limit without proving an optimum, for nothing).
    pub link_rate: Option<f64>,
}

impl Default for AssignOptions {
    fn default() -> Self {
        Self {
            broadcast: Broadcastable::NONE,
            milp: true,
            time_limit: Duration::from_millis(100),
            link_rate: None,
        }
    }
}

/// How an assignment was found.
#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    /// The MILP solver: `optimal` when proven (within HiGHS' default relative gap of
    /// 0.01%), else the best solution by the time limit with its remaining `gap`.
    Milp { optimal: bool, gap: f64 },
    /// The greedy assignment, and why the solver's was not used.
    Greedy { reason: String },
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Method::Milp { optimal: true, .. } => write!(f, "milp (optimal)"),
            Method::Milp { gap, .. } if gap.is_finite() && *gap >= 0.0 => {
                write!(f, "milp (time limit, gap {:.2}%)", gap * 100.0)
            }
            Method::Milp { .. } => write!(f, "milp (time limit)"),
            Method::Greedy { reason } => write!(f, "greedy ({reason})"),
        }
    }
}

/// An assignment, its costs and how it was found.
#[derive(Debug, Clone)]
pub struct Solved {
    pub assignment: Assignment,
    pub costs: Costs,
    pub method: Method,
    pub elapsed: Duration,
}

/// Phase 2: the assignment for `sizes` (see the module doc).
pub fn assign(sizes: &Sizes, options: &AssignOptions) -> Solved {
    let start = Instant::now();
    // The greedy assignment may take half the time; the solver starts from it.
    let greedy = greedy(sizes, options.broadcast, start + options.time_limit / 2);
    let greedy_costs = greedy.costs(sizes);
    let mut time_limit = options.time_limit;
    let mut shuffle_ms = None;
    if let Some(rate) = options.link_rate.filter(|r| *r > 0.0) {
        let shuffle = greedy_costs.max() as f64 / rate;
        shuffle_ms = Some(shuffle * 1e3);
        time_limit = time_limit.min(Duration::from_secs_f64(shuffle * SOLVER_SHARE));
    }
    let (assignment, costs, method) = if !options.milp {
        let reason = "the solver is off".to_string();
        (greedy, greedy_costs, Method::Greedy { reason })
    } else if let Some(ms) = shuffle_ms.filter(|_| time_limit < MIN_SOLVER_TIME) {
        let reason = format!("its shuffle takes {ms:.1} ms, too short to solve for");
        (greedy, greedy_costs, Method::Greedy { reason })
    } else {
        let remaining = time_limit.saturating_sub(start.elapsed());
        // A panic inside the binding is the solver failing, not the query.
        let solved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            milp::solve(sizes, options.broadcast, &greedy, remaining)
        }))
        .unwrap_or_else(|_| Err("the solver panicked".into()));
        match solved {
            Ok((found, optimal, gap)) => {
                // The MILP minimises the busiest link only; the local search then
                // moves no partition whose place does not matter to it.
                let polish = start + time_limit;
                let found = improve(sizes, options.broadcast, found.placements, polish);
                let costs = found.costs(sizes);
                if costs.max() <= greedy_costs.max() {
                    (found, costs, Method::Milp { optimal, gap })
                } else {
                    let reason = "the solver's best was worse".to_string();
                    (greedy, greedy_costs, Method::Greedy { reason })
                }
            }
            Err(reason) => (greedy, greedy_costs, Method::Greedy { reason }),
        }
    };
    Solved {
        assignment,
        costs,
        method,
        elapsed: start.elapsed(),
    }
}

/// The greedy assignment: every partition to the node holding most of it (or
/// broadcast by a side when that moves fewer bytes), then single moves off the busiest
/// link while they improve it, until `deadline`.
pub fn greedy(sizes: &Sizes, broadcast: Broadcastable, deadline: Instant) -> Assignment {
    let n = sizes.nodes;
    let placements: Vec<Placement> = (0..sizes.partitions)
        .map(|j| {
            // Ties (no locality) go round the nodes from j mod n, not all to node 0.
            let owner = (0..n)
                .max_by_key(|&i| (sizes.both(i, j), std::cmp::Reverse((i + n - j % n) % n)))
                .unwrap_or(0);
            let total: u64 = (0..n).map(|i| sizes.both(i, j)).sum();
            let mut best = (total - sizes.both(owner, j), Placement::Node(owner as u32));
            for placement in [Placement::BroadcastBuild, Placement::BroadcastProbe] {
                if broadcast.allows(placement) {
                    let side: u64 = (0..n).map(|i| sizes.broadcast(placement, i, j)).sum();
                    let moved = side * (n as u64 - 1);
                    if moved < best.0 {
                        best = (moved, placement);
                    }
                }
            }
            best.1
        })
        .collect();
    improve(sizes, broadcast, placements, deadline)
}

/// Steepest descent on [`CostSums::rank`]: the single move of one partition that
/// lowers it most, repeated.
fn improve(
    sizes: &Sizes,
    broadcast: Broadcastable,
    mut placements: Vec<Placement>,
    deadline: Instant,
) -> Assignment {
    let n = sizes.nodes;
    let mut sums = CostSums::zero(n);
    for (j, &placement) in placements.iter().enumerate() {
        sums.apply(sizes, j, placement, 1);
    }
    let candidates: Vec<Placement> = (0..n as u32)
        .map(Placement::Node)
        .chain([Placement::BroadcastBuild, Placement::BroadcastProbe])
        .filter(|&p| broadcast.allows(p))
        .collect();
    // Each accepted move lowers the rank, so this ends; the bound keeps it short.
    for _ in 0..sizes.partitions * n * 4 {
        if Instant::now() >= deadline {
            break;
        }
        let current = sums.rank();
        // Only a partition that touches a node on a busiest link can lower the rank.
        let busiest: Vec<usize> = (0..n)
            .filter(|&i| sums.send[i] == current.0 || sums.receive[i] == current.0)
            .collect();
        let mut best: Option<((i128, usize, i128), usize, Placement)> = None;
        for (j, &from) in placements.iter().enumerate() {
            let touches = busiest.iter().any(|&i| {
                sizes.both(i, j) > 0 || from == Placement::Node(i as u32) || from.is_broadcast()
            });
            if !touches {
                continue;
            }
            sums.apply(sizes, j, from, -1);
            for &to in candidates.iter().filter(|&&to| to != from) {
                sums.apply(sizes, j, to, 1);
                let rank = sums.rank();
                sums.apply(sizes, j, to, -1);
                if rank < current && best.as_ref().is_none_or(|(b, ..)| rank < *b) {
                    best = Some((rank, j, to));
                }
            }
            sums.apply(sizes, j, from, 1);
        }
        let Some((_, j, to)) = best else { break };
        sums.apply(sizes, j, placements[j], -1);
        sums.apply(sizes, j, to, 1);
        placements[j] = to;
    }
    Assignment::new(placements)
}

#[cfg(feature = "milp")]
mod milp {
    //! OPT-ASSIGN / SEL-BCAST as a mixed-integer program for HiGHS.

    use super::{Assignment, Broadcastable, Placement, Sizes};
    use highs::{Col, HighsModelStatus, HighsSolutionStatus, RowProblem, Sense};
    use std::time::Duration;

    /// The solver's assignment, whether it is proven optimal, and its gap.
    pub(super) fn solve(
        sizes: &Sizes,
        broadcast: Broadcastable,
        start: &Assignment,
        time_limit: Duration,
    ) -> Result<(Assignment, bool, f64), String> {
        let (n, p) = (sizes.nodes, sizes.partitions);
        // Bytes scaled so that coefficients stay near 1 whatever the input size.
        let scale = (sizes.total() as f64 / n as f64).max(1.0);
        let h = |i: usize, j: usize| sizes.both(i, j) as f64 / scale;
        let side = |p: Placement, i: usize, j: usize| sizes.broadcast(p, i, j) as f64 / scale;

        let mut problem = RowProblem::default();
        let w = problem.add_column(1.0, 0.0..);
        let x: Vec<Vec<_>> = (0..n)
            .map(|_| {
                (0..p)
                    .map(|_| problem.add_integer_column(0.0, 0..=1))
                    .collect()
            })
            .collect();
        // Per partition, the broadcast columns the join type allows: y_j (build side)
        // and z_j (probe side).
        let broadcasts: Vec<Vec<(Col, Placement)>> = (0..p)
            .map(|_| {
                [
                    (broadcast.build, Placement::BroadcastBuild),
                    (broadcast.probe, Placement::BroadcastProbe),
                ]
                .into_iter()
                .filter(|(allowed, _)| *allowed)
                .map(|(_, placement)| (problem.add_integer_column(0.0, 0..=1), placement))
                .collect()
            })
            .collect();

        for (i, x_i) in x.iter().enumerate() {
            // Send: w >= sum_j h_ij (1 - x_ij) + y_j ((n-1) hR_ij - h_ij) + z_j (...),
            // i.e. w + sum_j h_ij x_ij - y_j (...) - z_j (...) >= sum_j h_ij.
            let mut row = vec![(w, 1.0)];
            let mut held = 0.0;
            for j in 0..p {
                held += h(i, j);
                row.push((x_i[j], h(i, j)));
                for &(col, placement) in &broadcasts[j] {
                    row.push((col, -((n as f64 - 1.0) * side(placement, i, j) - h(i, j))));
                }
            }
            problem.add_row(held.., &row);
            // Receive: w >= sum_j x_ij sum_{k != i} h_kj + y_j sum_{k != i} hR_kj + ...
            let mut row = vec![(w, 1.0)];
            for j in 0..p {
                let others =
                    |f: &dyn Fn(usize) -> f64| -> f64 { (0..n).filter(|&k| k != i).map(f).sum() };
                row.push((x_i[j], -others(&|k| h(k, j))));
                for &(col, placement) in &broadcasts[j] {
                    row.push((col, -others(&|k| side(placement, k, j))));
                }
            }
            problem.add_row(0.0.., &row);
        }
        for j in 0..p {
            let mut row: Vec<_> = (0..n).map(|i| (x[i][j], 1.0)).collect();
            row.extend(broadcasts[j].iter().map(|&(col, _)| (col, 1.0)));
            problem.add_row(1.0..=1.0, &row);
        }

        let problem_columns = problem.num_cols();
        let mut model = problem
            .try_optimise(Sense::Minimise)
            .map_err(|e| format!("the solver refused the model: {e:?}"))?;
        let set = |model: &mut highs::Model, name: &str, value: f64| {
            model
                .try_set_option(name, value)
                .map_err(|e| format!("solver option {name}: {e:?}"))
        };
        set(
            &mut model,
            "time_limit",
            time_limit.as_secs_f64().max(0.001),
        )?;
        model
            .try_set_option("output_flag", false)
            .map_err(|e| format!("solver option output_flag: {e:?}"))?;
        model
            .try_set_option("threads", 1)
            .map_err(|e| format!("solver option threads: {e:?}"))?;
        // The greedy assignment as the first incumbent: whatever the time limit, the
        // solver's answer is at least as good.
        let column_of = |j: usize, placement: Placement| match placement {
            Placement::Node(i) => Some(x[i as usize][j]),
            _ => broadcasts[j]
                .iter()
                .find(|(_, p)| *p == placement)
                .map(|&(col, _)| col),
        };
        let mut columns = vec![0.0; problem_columns];
        columns[w.index()] = start.costs(sizes).max() as f64 / scale;
        for (j, &placement) in start.placements().iter().enumerate() {
            let col = column_of(j, placement).ok_or("the start broadcasts a side it may not")?;
            columns[col.index()] = 1.0;
        }
        model
            .try_set_solution(Some(&columns), None, None, None)
            .map_err(|e| format!("the solver refused the start: {e:?}"))?;

        let solved = model
            .try_solve()
            .map_err(|e| format!("the solver failed: {e:?}"))?;
        let optimal = match solved.status() {
            HighsModelStatus::Optimal => true,
            HighsModelStatus::ReachedTimeLimit => false,
            other => return Err(format!("the solver stopped: {other:?}")),
        };
        if !optimal && solved.primal_solution_status() != HighsSolutionStatus::Feasible {
            return Err("the solver found no solution in time".into());
        }
        let gap = if optimal { 0.0 } else { solved.mip_gap() };
        let values = solved.get_solution();
        let values = values.columns();
        let chosen = |col: Col| values[col.index()] > 0.5;
        let placements = (0..p)
            .map(|j| {
                let on_node = (0..n).find(|&i| chosen(x[i][j]));
                let broadcast = broadcasts[j].iter().find(|&&(col, _)| chosen(col));
                match (broadcast, on_node) {
                    (Some(&(_, placement)), _) => Ok(placement),
                    (None, Some(i)) => Ok(Placement::Node(i as u32)),
                    (None, None) => Err(format!("the solver placed partition {j} nowhere")),
                }
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok((Assignment::new(placements), optimal, gap))
    }
}

#[cfg(not(feature = "milp"))]
mod milp {
    use super::{Assignment, Broadcastable, Sizes};
    use std::time::Duration;

    pub(super) fn solve(
        _: &Sizes,
        _: Broadcastable,
        _: &Assignment,
        _: Duration,
    ) -> Result<(Assignment, bool, f64), String> {
        Err("built without the MILP solver".into())
    }
}
