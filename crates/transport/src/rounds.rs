//! Planned schedules: an operator that knows its transfers in advance (Neo-Join's
//! open-shop schedule) runs them in rounds in which each node sends to at most one
//! node and receives from at most one, and a [`RoundBarrier`] keeps the rounds apart.
//!
//! In theory the transfers of a round end together; in practice TCP's throughput
//! varies, a sender that finishes early starts its next transfer to a receiver still
//! busy with the previous round, and the two share its link. Rödiger's thesis
//! (*Scalable Distributed Query Processing in Parallel Main-Memory Database Systems*,
//! section 2.3.3, "Partition Shuffling") therefore synchronises the nodes before each
//! round. Round `r`, on every node:
//!
//! 1. the node puts its round's data for its target on its data endpoint, then
//!    [`RoundBarrier::sent`] puts a `Sent(r)` marker to that target on the barrier's
//!    own stream. A connection writes frames in the order they were put, so the marker
//!    arrives after the data;
//! 2. [`RoundBarrier::end`] waits for its own source's `Sent(r)` (all the round's data
//!    for this node is here), tells every node `Done(r)`, and then waits for
//!    [`Next::All`], every other node's `Done(r)` (the thesis' barrier), or for
//!    [`Next::Node`], the `Done(r)` of the node it sends to in round `r + 1` only.
//!
//! Either way no node receives data of round `r + 1` before it has all of round `r`,
//! so no receiver has two senders; with [`Next::Node`] a slow transfer holds back only
//! the nodes waiting for its receiver (on 4 emulated hosts both were as fast). The
//! waits form no cycle: each waits for an event of an earlier round or the same
//! round's data. Every node calls [`RoundBarrier::end`] for every round in order, idle
//! or not. A peer's markers are checked (size, kind, order); a peer that breaks the
//! protocol or ends its stream early fails the barrier with an error naming it.

use crate::{NodeId, ReceiveEndpoint, SendEndpoint, To, Transport, open_to_others};
use crate::{TransportError, node_name};
use std::time::{Duration, Instant};

const SENT: u64 = 1;
const DONE: u64 = 2;

/// Whom [`RoundBarrier::end`] waits for before this node starts the next round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Every node: a barrier.
    All,
    /// The node (index) this one sends to next: it is free to receive once it ended
    /// the round.
    Node(usize),
    /// Nobody: this node does not send in the next round.
    Nobody,
}

/// The barrier of one planned schedule: one stream from every node to every other.
pub struct RoundBarrier {
    nodes: Vec<NodeId>,
    index: usize,
    /// Both absent when this node is alone.
    send: Option<SendEndpoint>,
    recv: Option<ReceiveEndpoint>,
    /// Per node (by index): the last round whose `Sent` marker arrived.
    sent: Vec<Option<u64>>,
    /// Per node: how many rounds it said `Done` for.
    done: Vec<u64>,
    /// Rounds this node ended.
    rounds: u64,
    waited: Duration,
}

impl RoundBarrier {
    /// Opens the barrier's streams between `nodes` (this node is `nodes[index]`) on
    /// `exchange` of `query`. Every node must open it with the same nodes.
    pub fn open(
        t: &dyn Transport,
        query: u64,
        exchange: u32,
        nodes: Vec<NodeId>,
        index: usize,
    ) -> Result<Self, TransportError> {
        let n = nodes.len();
        if index >= n {
            return Err(TransportError::Misuse(format!(
                "position {index} in a barrier of {n} nodes"
            )));
        }
        let (send, recv) = match n {
            1 => (None, None),
            _ => {
                let (send, recv) = open_to_others(t, query, exchange, &nodes, index)?;
                (Some(send), Some(recv))
            }
        };
        Ok(Self {
            nodes,
            index,
            send,
            recv,
            sent: vec![None; n],
            done: vec![0; n],
            rounds: 0,
            waited: Duration::ZERO,
        })
    }

    /// Rounds ended so far.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Time spent waiting for other nodes in [`RoundBarrier::end`].
    pub fn waited(&self) -> Duration {
        self.waited
    }

    async fn put(&self, to: To, kind: u64, round: u64) -> Result<(), TransportError> {
        let Some(send) = &self.send else {
            return Ok(());
        };
        let mut buf = send.acquire(to).await?;
        buf.extend_from_slice(&kind.to_le_bytes());
        buf.extend_from_slice(&round.to_le_bytes());
        send.put(buf, false)
    }

    /// This node put all its data of the current round for `target` (a node index):
    /// marks its end on the connection to `target`.
    pub async fn sent(&self, target: usize) -> Result<(), TransportError> {
        if target == self.index || target >= self.nodes.len() {
            return Err(TransportError::Misuse(format!(
                "round {} sends to position {target}",
                self.rounds
            )));
        }
        self.put(To::Node(self.nodes[target]), SENT, self.rounds)
            .await
    }

    /// Ends the current round: waits until `source` (the node index sending to this
    /// one in this round, if any) delivered its data, then until `next` ended the round.
    pub async fn end(&mut self, source: Option<usize>, next: Next) -> Result<(), TransportError> {
        let round = self.rounds;
        let start = Instant::now();
        if let Some(s) = source {
            if s == self.index || s >= self.nodes.len() {
                return Err(TransportError::Misuse(format!(
                    "round {round} receives from position {s}"
                )));
            }
            while self.sent[s].is_none_or(|r| r < round) {
                self.next("its data of round", round).await?;
            }
        }
        self.put(To::All, DONE, round).await?;
        self.done[self.index] = round + 1;
        match next {
            Next::All => {
                while self.done.iter().any(|&d| d <= round) {
                    self.next("the end of round", round).await?;
                }
            }
            Next::Node(k) if k < self.nodes.len() => {
                while self.done[k] <= round {
                    self.next("the end of round", round).await?;
                }
            }
            Next::Node(k) => {
                return Err(TransportError::Misuse(format!(
                    "round {round} waits for position {k}"
                )));
            }
            Next::Nobody => {}
        }
        self.rounds += 1;
        self.waited += start.elapsed();
        Ok(())
    }

    /// Reads one marker; `waiting` and `round` say what for, if the streams end first.
    async fn next(&mut self, waiting: &str, round: u64) -> Result<(), TransportError> {
        let recv = self.recv.as_ref().expect("others exist when waiting");
        let Some(m) = recv.get().await? else {
            return Err(TransportError::Misuse(format!(
                "the round barrier's streams ended while waiting for {waiting} {round}"
            )));
        };
        let from = m.slot as usize;
        let peer = m.node;
        let broke = |why: String| TransportError::PeerLost {
            peer,
            reason: format!("broke the round barrier's protocol: {why}"),
        };
        if from >= self.nodes.len() || from == self.index || self.nodes[from] != peer {
            return Err(broke(format!("sent from position {from}")));
        }
        let data = m.data();
        let last = m.last;
        if !data.is_empty() {
            let [kind, r] = match data.len() {
                16 => [0, 8].map(|o| u64::from_le_bytes(data[o..o + 8].try_into().expect("8"))),
                len => return Err(broke(format!("a marker of {len} bytes, not 16"))),
            };
            match kind {
                SENT if self.sent[from].is_none_or(|s| s < r) && r <= self.done[from] => {
                    self.sent[from] = Some(r)
                }
                DONE if r == self.done[from] => self.done[from] = r + 1,
                SENT | DONE => {
                    return Err(broke(format!(
                        "marker {kind} for round {r} out of order (it ended {} rounds)",
                        self.done[from]
                    )));
                }
                other => return Err(broke(format!("unknown marker kind {other}"))),
            }
        }
        drop(m); // its credit back
        if last && self.done[from] <= round {
            return Err(broke(format!(
                "{} ended its stream before {waiting} {round}",
                node_name(peer)
            )));
        }
        Ok(())
    }

    /// Ends the barrier after the last round: finishes this node's stream and reads the
    /// others' to their end, so nothing of it is left in flight.
    pub async fn close(mut self) -> Result<(), TransportError> {
        let Some(send) = self.send.take() else {
            return Ok(());
        };
        send.finish();
        let recv = self.recv.take().expect("opened with the send side");
        while let Some(m) = recv.get().await? {
            if !m.data().is_empty() {
                return Err(TransportError::PeerLost {
                    peer: m.node,
                    reason: "sent a round marker after the last round".into(),
                });
            }
        }
        send.flushed().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SendSpec, TcpTransport, TransportConfig, loopback_cluster};
    use std::sync::Arc;

    const DATA: u32 = 1;
    const BARRIER: u32 = 2;

    fn config() -> TransportConfig {
        TransportConfig {
            message_size: 16 * 1024,
            window: 4,
            ..Default::default()
        }
    }

    /// Per round, `(from, to)` pairs: each node sends to one and receives from one.
    const ROUNDS: [&[(usize, usize)]; 3] =
        [&[(0, 1), (1, 2), (2, 0)], &[(0, 2), (2, 1)], &[(1, 0)]];
    const MESSAGES: usize = 3;

    /// One node's part: its data for each round, then the barrier; after each round the
    /// data of that round's source must already be here.
    async fn node(t: Arc<TcpTransport>, ids: Vec<NodeId>, me: usize, pairwise: bool) -> Vec<usize> {
        let (data, recv) = open_to_others(t.as_ref(), 7, DATA, &ids, me).unwrap();
        let mut barrier = RoundBarrier::open(t.as_ref(), 7, BARRIER, ids.clone(), me).unwrap();
        let mut got = vec![];
        for (r, pairs) in ROUNDS.iter().enumerate() {
            if let Some(&(_, to)) = pairs.iter().find(|p| p.0 == me) {
                for _ in 0..MESSAGES {
                    let mut buf = data.acquire(To::Node(ids[to])).await.unwrap();
                    buf.extend_from_slice(&[r as u8; 9000]);
                    data.put(buf, false).unwrap();
                }
                barrier.sent(to).await.unwrap();
            }
            let source = pairs.iter().find(|p| p.1 == me).map(|p| p.0);
            let next = match ROUNDS.get(r + 1) {
                Some(pairs) if pairwise => pairs
                    .iter()
                    .find(|p| p.0 == me)
                    .map_or(Next::Nobody, |p| Next::Node(p.1)),
                _ => Next::All,
            };
            barrier.end(source, next).await.unwrap();
            if let Some(s) = source {
                // Already queued: polled once, no waiting.
                for _ in 0..MESSAGES {
                    let m = tokio::time::timeout(Duration::ZERO, recv.get())
                        .await
                        .expect("the round's data arrived before the round ended")
                        .unwrap()
                        .unwrap();
                    assert_eq!((m.slot as usize, m.data()[0] as usize), (s, r));
                    got.push(r);
                }
            }
        }
        assert_eq!(barrier.rounds(), ROUNDS.len() as u64);
        data.finish();
        barrier.close().await.unwrap();
        while let Some(m) = recv.get().await.unwrap() {
            assert!(
                m.data().is_empty() && m.last,
                "only end-of-stream markers are left"
            );
        }
        got
    }

    #[tokio::test]
    async fn every_round_data_arrives_before_the_round_ends() {
        let ids = vec![1, 2, 3];
        for pairwise in [false, true] {
            // Kept until every node is done: a node that closes its connections while
            // others still read them would fail them.
            let nodes: Vec<Arc<TcpTransport>> = loopback_cluster(&ids, config())
                .await
                .unwrap()
                .into_iter()
                .map(Arc::new)
                .collect();
            let tasks: Vec<_> = (0..ids.len())
                .map(|me| tokio::spawn(node(Arc::clone(&nodes[me]), ids.clone(), me, pairwise)))
                .collect();
            let mut got = vec![];
            for t in tasks {
                got.push(t.await.unwrap());
            }
            // Node 0 receives in rounds 0 and 2, node 1 in 0 and 1, node 2 in 0 and 1.
            assert_eq!(got[0], [0, 0, 0, 2, 2, 2]);
            assert_eq!(got[1], [0, 0, 0, 1, 1, 1]);
            assert_eq!(got[2], [0, 0, 0, 1, 1, 1]);
        }
    }

    #[tokio::test]
    async fn a_lone_node_ends_its_rounds_at_once() {
        let nodes = loopback_cluster(&[1], config()).await.unwrap();
        let mut b = RoundBarrier::open(&nodes[0], 1, BARRIER, vec![1], 0).unwrap();
        b.end(None, Next::All).await.unwrap();
        assert!(b.sent(0).await.is_err(), "a node cannot send to itself");
        assert_eq!(b.rounds(), 1);
        b.close().await.unwrap();
    }

    /// A barrier on node 1 of two, whose peer writes `marker` (or only ends its
    /// stream) on the barrier's stream instead of keeping the protocol; the error
    /// of ending a round that receives from `source`.
    async fn against_a_rogue(query: u64, marker: Option<&[u8]>, source: Option<usize>) -> String {
        let ids = vec![1, 2];
        let nodes = loopback_cluster(&ids, config()).await.unwrap();
        let mut b = RoundBarrier::open(&nodes[0], query, BARRIER, ids, 0).unwrap();
        let rogue = nodes[1]
            .open_send(SendSpec {
                query,
                exchange: BARRIER,
                from: 1,
                destinations: vec![1],
                groups: vec![],
            })
            .unwrap();
        match marker {
            Some(bytes) => {
                let mut buf = rogue.acquire(To::Node(1)).await.unwrap();
                buf.extend_from_slice(bytes);
                rogue.put(buf, false).unwrap();
            }
            None => rogue.finish(),
        }
        b.end(source, Next::All).await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn a_bad_marker_fails_the_barrier_naming_its_sender() {
        let e = against_a_rogue(3, Some(&[1, 2, 3]), None).await;
        assert!(
            e.contains("worker 2") && e.contains("a marker of 3 bytes"),
            "{e}"
        );
        // A marker for a round it has not reached, and a stream that ends early.
        let early = [DONE.to_le_bytes(), 5u64.to_le_bytes()].concat();
        let e = against_a_rogue(4, Some(&early), None).await;
        assert!(e.contains("out of order"), "{e}");
        let e = against_a_rogue(5, None, Some(1)).await;
        assert!(e.contains("ended its stream before"), "{e}");
    }
}
