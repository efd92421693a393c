//! Network scheduling: when each connection may write data.
//!
//! [`Schedule::Free`]: every connection writes its queued data as soon as it
//! has some; all peers share the links as TCP sees fit.
//!
//! [`Schedule::Phased`]: round-robin phases in ring order, as in the
//! communication multiplexer of Rödiger's *Scalable Distributed Query Processing in
//! Parallel Main-Memory Database Systems* and Neo-Join's round-robin schedule. The nodes
//! of the cluster, sorted by id, form a ring of n positions. In phase k node
//! i sends to node (i+k) mod n and receives from node (i-k) mod n, so no
//! receiver has two senders and no sender two receivers, and no link is
//! shared. After `quota` messages to its current target (that work uses 8
//! messages of 512 KiB), a node moves on to the next target.
//!
//! The phases are kept by a receiver-driven token, synchronised pairwise with
//! tiny control frames instead of a global barrier:
//!
//! 1. A sender with data queued for a peer and no request outstanding sends
//!    it `Ready` (once; the request stays open until the sender says it has
//!    nothing more).
//! 2. A receiver serves one sender at a time: it sends `Grant{phase}` to the
//!    ready sender that comes next in its ring order (i-1, i-2, ... from the
//!    last one it served), and waits.
//! 3. A sender holding grants serves one at a time, picking the next in its
//!    ring order (i+1, i+2, ... after its last target): it writes at most
//!    `quota` of the messages it has queued for that receiver, then
//!    `EndTurn{more}` on the same connection, after the data. `more` says
//!    whether it still has data queued for that receiver.
//! 4. On `EndTurn` the receiver drops the sender from its ready set unless
//!    `more`, and grants the next ready sender.
//!
//! With every node sending to every other one, receiver j first grants j-1
//! and sender i first gets a grant from i+1: phase 1 is the ring shift by
//! one; when turns end, receivers move to j-2 and senders to i+2, and so on.
//! A node that is slower holds its partners back for a moment, which is the
//! synchronisation. Why it cannot deadlock in a streaming engine, where a
//! consumer may wait for one stream before reading another:
//!
//! - only messages that already hold a credit (the receiver has room for
//!   them) are queued in the multiplexer, so a turn never waits for a
//!   consumer: it writes what is queued, at most `quota` messages, and ends;
//! - a node with nothing to send never says `Ready`, so it is skipped, and a
//!   sender whose queue is empty when its turn comes ends it at once;
//! - every turn ends after a bounded amount of writing, so every ready
//!   sender is granted within n-1 turns of its receiver (no starvation: the
//!   coordinator's gather streams are served like any other), and every
//!   grant a sender holds is served within n-1 of its turns;
//! - a node with nothing queued sends no frames at all: idle is silent.
//!
//! The receiving half of the protocol runs whatever this node's own setting,
//! so nodes with different settings interoperate: a free sender never asks
//! for turns and answers an unexpected grant with `EndTurn` at once.

use crate::NodeId;
use std::collections::{BTreeSet, HashMap};

/// The thesis' number of messages per target before moving on.
pub const DEFAULT_PHASE_QUOTA: u32 = 8;

/// How the multiplexer orders its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Every connection writes as data arrives.
    #[default]
    Free,
    /// Round-robin phases in ring order; `quota` messages per turn.
    Phased { quota: u32 },
}

impl Schedule {
    pub fn phased() -> Self {
        Self::Phased {
            quota: DEFAULT_PHASE_QUOTA,
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Free => write!(f, "free"),
            Self::Phased { quota } => write!(f, "phased (quota {quota})"),
        }
    }
}

impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "free" => Ok(Self::Free),
            "phased" | "round-robin" => Ok(Self::phased()),
            other => Err(format!(
                "unknown schedule '{other}' (expected free or phased)"
            )),
        }
    }
}

/// A step the multiplexer must take for the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    SendReady(NodeId),
    SendGrant(NodeId, u32),
    /// Answer to a grant this node does not want (free setting or nothing queued).
    SendEndTurn(NodeId),
    /// The writer of this peer may now write data.
    Wake(NodeId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Idle,
    Requested,
    Granted,
}

/// The state of the phased protocol on one node (see the module doc).
#[derive(Debug)]
pub(crate) struct Scheduler {
    me: NodeId,
    mode: Schedule,
    ring: Vec<NodeId>,
    out: HashMap<NodeId, Turn>,
    /// The receiver this node is sending a turn to, and messages written in the turn.
    active: Option<(NodeId, u32)>,
    last_target: NodeId,
    ready: BTreeSet<NodeId>,
    serving: Option<NodeId>,
    last_source: NodeId,
    pub turns_taken: u64,
    pub turns_granted: u64,
}

impl Scheduler {
    pub fn new(me: NodeId, mode: Schedule) -> Self {
        Self {
            me,
            mode,
            ring: vec![me],
            out: HashMap::new(),
            active: None,
            last_target: me,
            ready: BTreeSet::new(),
            serving: None,
            last_source: me,
            turns_taken: 0,
            turns_granted: 0,
        }
    }

    pub fn mode(&self) -> Schedule {
        self.mode
    }

    /// Sets the members of the ring (this node is always one).
    pub fn set_ring(&mut self, nodes: impl IntoIterator<Item = NodeId>) {
        let mut ring: Vec<NodeId> = nodes.into_iter().chain([self.me]).collect();
        ring.sort_unstable();
        ring.dedup();
        self.ring = ring;
    }

    fn pos(&self, node: NodeId) -> usize {
        self.ring
            .binary_search(&node)
            .unwrap_or_else(|insert_at| insert_at % self.ring.len().max(1))
    }

    /// The phase in which `from` sends to `to`: their distance along the ring.
    pub fn phase(&self, from: NodeId, to: NodeId) -> u32 {
        let n = self.ring.len().max(1);
        ((self.pos(to) + n - self.pos(from)) % n) as u32
    }

    /// Whether the writer of `peer` may write a data frame now.
    pub fn may_send(&self, peer: NodeId) -> bool {
        match self.mode {
            Schedule::Free => true,
            Schedule::Phased { quota } => {
                matches!(self.active, Some((p, sent)) if p == peer && sent < quota)
            }
        }
    }

    /// Whether this node is in a turn to `peer` (which must end with an `EndTurn`).
    pub fn in_turn(&self, peer: NodeId) -> bool {
        matches!(self.mode, Schedule::Phased { .. })
            && matches!(self.active, Some((p, _)) if p == peer)
    }

    pub fn sent_one(&mut self, peer: NodeId) {
        if let Some((p, sent)) = &mut self.active
            && *p == peer
        {
            *sent += 1;
        }
    }

    /// Data was queued for `peer`.
    pub fn data_queued(&mut self, peer: NodeId) -> Option<Action> {
        if peer == self.me || self.mode == Schedule::Free {
            return None;
        }
        let t = self.out.entry(peer).or_insert(Turn::Idle);
        if *t == Turn::Idle {
            *t = Turn::Requested;
            return Some(Action::SendReady(peer));
        }
        None
    }

    /// `peer` granted this node a turn.
    pub fn on_grant(&mut self, peer: NodeId) -> Vec<Action> {
        let turn = self.out.get(&peer).copied().unwrap_or(Turn::Idle);
        if self.mode == Schedule::Free || turn != Turn::Requested {
            // Not asked for (free setting, or the request's data was dropped by a query
            // release and a new request crossed): hand the turn straight back.
            if turn == Turn::Requested {
                self.out.insert(peer, Turn::Idle);
            }
            return vec![Action::SendEndTurn(peer)];
        }
        self.out.insert(peer, Turn::Granted);
        self.activate_next()
    }

    fn activate_next(&mut self) -> Vec<Action> {
        if self.active.is_some() {
            return vec![];
        }
        let n = self.ring.len();
        let start = self.pos(self.last_target);
        for step in 1..=n {
            let cand = self.ring[(start + step) % n];
            if self.out.get(&cand) == Some(&Turn::Granted) {
                self.active = Some((cand, 0));
                self.last_target = cand;
                self.turns_taken += 1;
                return vec![Action::Wake(cand)];
            }
        }
        vec![]
    }

    /// The writer of `peer` ends its turn (after writing the turn's data); it must write
    /// `EndTurn{more}` next. Returns what else to do.
    pub fn end_turn(&mut self, peer: NodeId, more: bool) -> Vec<Action> {
        if !matches!(self.active, Some((p, _)) if p == peer) {
            return vec![];
        }
        self.active = None;
        self.out
            .insert(peer, if more { Turn::Requested } else { Turn::Idle });
        self.activate_next()
    }

    /// `peer` has data for this node.
    pub fn on_ready(&mut self, peer: NodeId) -> Vec<Action> {
        self.ready.insert(peer);
        self.grant_next()
    }

    fn grant_next(&mut self) -> Vec<Action> {
        if self.serving.is_some() || self.ready.is_empty() {
            return vec![];
        }
        let n = self.ring.len();
        let start = self.pos(self.last_source);
        for step in 1..=n {
            let cand = self.ring[(start + n * 2 - step) % n];
            if self.ready.contains(&cand) {
                self.serving = Some(cand);
                self.last_source = cand;
                self.turns_granted += 1;
                return vec![Action::SendGrant(cand, self.phase(cand, self.me))];
            }
        }
        // A ready peer that is not (yet) in the ring: serve it anyway.
        let cand = *self.ready.iter().next().expect("not empty");
        self.serving = Some(cand);
        self.turns_granted += 1;
        vec![Action::SendGrant(cand, 0)]
    }

    /// `peer` ended the turn this node granted it.
    pub fn on_end_turn(&mut self, peer: NodeId, more: bool) -> Result<Vec<Action>, String> {
        if self.serving != Some(peer) {
            return Err("ended a turn it was not given".to_string());
        }
        self.serving = None;
        if !more {
            self.ready.remove(&peer);
        }
        Ok(self.grant_next())
    }

    /// `peer` is gone: forget it on both sides.
    pub fn peer_lost(&mut self, peer: NodeId) -> Vec<Action> {
        self.out.remove(&peer);
        self.ready.remove(&peer);
        let mut actions = vec![];
        if matches!(self.active, Some((p, _)) if p == peer) {
            self.active = None;
            actions.extend(self.activate_next());
        }
        if self.serving == Some(peer) {
            self.serving = None;
            actions.extend(self.grant_next());
        }
        actions
    }

    /// Changes the setting. `has_data(peer)` tells which peers have data queued.
    pub fn set_mode(&mut self, mode: Schedule, has_data: impl Fn(NodeId) -> bool) -> Vec<Action> {
        let old = self.mode;
        self.mode = mode;
        let mut actions = vec![];
        match (old, mode) {
            (Schedule::Phased { .. }, Schedule::Free) => {
                // Hand back every grant held; wake every writer.
                let peers: Vec<NodeId> = self.out.keys().copied().collect();
                for p in peers {
                    if self.out.get(&p) == Some(&Turn::Granted)
                        || matches!(self.active, Some((a, _)) if a == p)
                    {
                        actions.push(Action::SendEndTurn(p));
                    }
                    // A request still open is answered by `on_grant` when its grant comes.
                    if self.out.get(&p) != Some(&Turn::Requested) {
                        self.out.insert(p, Turn::Idle);
                    }
                    actions.push(Action::Wake(p));
                }
                self.active = None;
            }
            (Schedule::Free, Schedule::Phased { .. }) => {
                let peers: Vec<NodeId> = self
                    .ring
                    .iter()
                    .copied()
                    .filter(|p| *p != self.me)
                    .collect();
                for p in peers {
                    if has_data(p) {
                        actions.extend(self.data_queued(p));
                    }
                }
            }
            _ => {}
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Runs the protocol among `n` nodes in memory. `queued[i][j]` messages wait at i
    /// for j. Control frames are delivered in FIFO order per link; each step every
    /// active sender writes one message. Returns, per step, the (sender, receiver)
    /// pairs that wrote data.
    fn simulate(n: usize, quota: u32, mut queued: Vec<Vec<u32>>) -> Vec<Vec<(usize, usize)>> {
        let mut s: Vec<Scheduler> = (0..n)
            .map(|i| {
                let mut s = Scheduler::new(i as NodeId, Schedule::Phased { quota });
                s.set_ring(0..n as NodeId);
                s
            })
            .collect();
        // Frames in flight: (from, to, frame).
        #[derive(Debug)]
        enum F {
            Ready,
            Grant,
            EndTurn(bool),
        }
        let mut wire: VecDeque<(usize, usize, F)> = VecDeque::new();
        let apply = |from: usize, acts: Vec<Action>, wire: &mut VecDeque<(usize, usize, F)>| {
            for a in acts {
                match a {
                    Action::SendReady(p) => wire.push_back((from, p as usize, F::Ready)),
                    Action::SendGrant(p, _) => wire.push_back((from, p as usize, F::Grant)),
                    Action::SendEndTurn(p) => wire.push_back((from, p as usize, F::EndTurn(false))),
                    Action::Wake(_) => {}
                }
            }
        };
        for (i, row) in queued.iter().enumerate() {
            for (j, q) in row.iter().enumerate() {
                if *q > 0 {
                    let a = s[i].data_queued(j as NodeId);
                    apply(i, a.into_iter().collect(), &mut wire);
                }
            }
        }
        let mut steps = vec![];
        for _ in 0..10_000 {
            // Deliver all control frames in flight.
            while let Some((from, to, f)) = wire.pop_front() {
                let acts = match f {
                    F::Ready => s[to].on_ready(from as NodeId),
                    F::Grant => s[to].on_grant(from as NodeId),
                    F::EndTurn(more) => s[to].on_end_turn(from as NodeId, more).unwrap(),
                };
                apply(to, acts, &mut wire);
            }
            let mut step = vec![];
            for i in 0..n {
                let Some((p, _)) = s[i].active else { continue };
                let j = p as usize;
                if s[i].may_send(p) && queued[i][j] > 0 {
                    queued[i][j] -= 1;
                    s[i].sent_one(p);
                    step.push((i, j));
                } else {
                    let more = queued[i][j] > 0;
                    let acts = s[i].end_turn(p, more);
                    wire.push_back((i, j, F::EndTurn(more)));
                    apply(i, acts, &mut wire);
                }
            }
            if step.is_empty() && wire.is_empty() {
                break;
            }
            if !step.is_empty() {
                steps.push(step);
            }
        }
        assert!(
            queued.iter().flatten().all(|q| *q == 0),
            "all data sent: {queued:?}"
        );
        steps
    }

    #[test]
    fn uniform_all_to_all_settles_into_ring_phases_without_link_sharing() {
        let (n, quota, per_pair) = (4, 2, 16);
        let queued: Vec<Vec<u32>> = (0..n)
            .map(|i| (0..n).map(|j| if i == j { 0 } else { per_pair }).collect())
            .collect();
        let steps = simulate(n, quota, queued);
        for step in &steps {
            let senders: BTreeSet<_> = step.iter().map(|(i, _)| i).collect();
            let receivers: BTreeSet<_> = step.iter().map(|(_, j)| j).collect();
            assert_eq!(
                senders.len(),
                step.len(),
                "a sender with two targets: {step:?}"
            );
            assert_eq!(
                receivers.len(),
                step.len(),
                "a receiver with two senders: {step:?}"
            );
        }
        // Whatever order the first requests arrive in, the nodes fall into the ring
        // phases (every node sends to i+k) and stay there.
        let ring = |k: usize| (0..n).map(|i| (i, (i + k) % n)).collect::<Vec<_>>();
        let first_full = steps
            .iter()
            .position(|s| s.len() == n)
            .expect("all links busy at some point");
        let mut k = {
            let mut s = steps[first_full].clone();
            s.sort();
            (1..n)
                .find(|&k| s == ring(k))
                .expect("a full step is a ring phase")
        };
        let settled = &steps[first_full..];
        for turn in settled.chunks(quota as usize).take(12) {
            for step in turn {
                let mut s = step.clone();
                s.sort();
                assert_eq!(s, ring(k), "{steps:?}");
            }
            k = k % (n - 1) + 1;
        }
        // Little time is lost: at most 30% more steps than with every link always busy.
        let ideal = (n - 1) * per_pair as usize;
        assert!(
            steps.len() * 10 <= ideal * 13,
            "{} steps, ideal {ideal}",
            steps.len()
        );
    }

    #[test]
    fn idle_nodes_are_skipped_and_a_gather_serves_everyone() {
        // Only nodes 1..4 send, all to node 0 (a gather to the coordinator).
        let n = 4;
        let queued: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| if i != 0 && j == 0 { 5 } else { 0 })
                    .collect()
            })
            .collect();
        let steps = simulate(n, 2, queued);
        assert_eq!(steps.len(), 15, "one sender at a time into node 0");
        // Round-robin in ring order (after whoever asked first): 1, 3, 2, 1, 3, 2, ...
        let order: Vec<usize> = steps.iter().step_by(2).map(|s| s[0].0).collect();
        assert_eq!(&order[..6], &[1, 3, 2, 1, 3, 2]);
    }

    #[test]
    fn idle_is_silent_and_unrequested_grants_are_handed_back() {
        let mut s = Scheduler::new(1, Schedule::phased());
        s.set_ring([0, 1, 2]);
        assert_eq!(s.data_queued(2), Some(Action::SendReady(2)));
        assert_eq!(s.data_queued(2), None, "one request at a time");
        assert_eq!(s.on_grant(0), vec![Action::SendEndTurn(0)]);
        assert_eq!(s.on_grant(2), vec![Action::Wake(2)]);
        assert!(s.may_send(2) && !s.may_send(0));
        for _ in 0..DEFAULT_PHASE_QUOTA {
            s.sent_one(2);
        }
        assert!(!s.may_send(2), "quota reached");
        assert_eq!(s.end_turn(2, false), vec![]);
        // Receiver side: a turn can only be ended by the node that has it.
        assert!(s.on_end_turn(0, false).is_err());
        assert_eq!(s.on_ready(0), vec![Action::SendGrant(0, 1)]);
        assert_eq!(s.on_ready(2), vec![], "one sender at a time");
        assert_eq!(
            s.on_end_turn(0, false).unwrap(),
            vec![Action::SendGrant(2, 2)]
        );
        // A lost peer frees the receiver for the next one.
        s.on_ready(0);
        assert_eq!(s.peer_lost(2), vec![Action::SendGrant(0, 1)]);
    }

    #[test]
    fn switching_to_free_hands_back_turns() {
        let mut s = Scheduler::new(0, Schedule::phased());
        s.set_ring([0, 1]);
        s.data_queued(1);
        s.on_grant(1);
        assert!(s.in_turn(1));
        let acts = s.set_mode(Schedule::Free, |_| true);
        assert!(acts.contains(&Action::SendEndTurn(1)));
        assert!(s.may_send(1) && !s.in_turn(1));
        let acts = s.set_mode(Schedule::phased(), |p| p == 1);
        assert_eq!(acts, vec![Action::SendReady(1)]);
    }
}
