//! The Data Roundabout (paper Sec. II-C and III-D): the nodes form a logical ring, each
//! sends only to its successor, and fragments of the rotating relation travel around it.
//!
//! Per node, three entities work concurrently on a fixed ring of buffers ([`ring`]):
//! - the **receiver** reassembles fragments arriving from the predecessor into free
//!   buffers (a fragment is one buffer; on the wire it is a run of transport messages);
//! - the **join entity** (an OS thread of its own) takes complete buffers in arrival
//!   order and joins them; the time it waits for one is the paper's *sync* time;
//! - the **transmitter** streams complete buffers to the successor.
//!
//! The node's own fragments enter the ring through the same buffers (the *loader*). A
//! fragment is forwarded unless the successor is its origin, so it visits every node
//! exactly once. With [`ForwardPolicy::OnArrival`] a buffer is forwarded as soon as it is
//! complete, while it is being joined; with [`ForwardPolicy::AfterJoin`] the join entity
//! hands it to the transmitter when done (the paper's order). Either way a buffer is free
//! again once it was both joined and sent.
//!
//! Termination is exact without any extra round: every origin marks its last fragment,
//! and a node's receiver is done once it has seen the last fragment of every other
//! origin, in sequence; the node then ends its stream to the successor, whose receiver
//! checks that nothing follows.
//!
//! The ring rides on the transport's endpoints (one stream per node to its successor), so
//! it works across real hosts; the transport's credits give the backpressure, and the
//! injection rule of [`BufferRing::take`] keeps a ring of full buffers from deadlocking.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gyre_transport::{NodeId, ReceiveSpec, SendSpec, To, Transport, node_name};
use tokio::sync::mpsc;

use super::error::{CycloError, Result};
use super::fragment::{
    self, FragmentForm, FragmentView, HEADER_BYTES, HEADER_WORDS, as_bytes, as_bytes_mut,
};
use super::ring::{BufferRing, FilledBuffer};
use crate::KeyDomain;

/// The ring: its members in ring order (the same list on every node) and this node's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingSpec {
    /// Ring members; node `i` sends to node `i + 1` (mod n).
    pub nodes: Vec<NodeId>,
    /// This node's position in `nodes`.
    pub index: usize,
    /// Query id of the transport streams (released by the caller when all are done).
    pub query: u64,
    /// First exchange id the cyclo-join uses: this one for the ring, the next for the
    /// agreement on sizes and the one after for abort notices.
    pub exchange: u32,
}

impl RingSpec {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn successor(&self) -> usize {
        (self.index + 1) % self.nodes.len()
    }

    pub fn predecessor(&self) -> usize {
        (self.index + self.nodes.len() - 1) % self.nodes.len()
    }

    /// Whether this node passes on a fragment of `origin` (not back to its origin).
    pub fn forwards(&self, origin: usize) -> bool {
        self.nodes.len() > 1 && self.successor() != origin
    }

    /// Checks the spec against the transport it runs on.
    pub fn check(&self, t: &dyn Transport) -> Result<()> {
        if self.nodes.is_empty() {
            return Err(CycloError::Spec("the ring has no nodes".into()));
        }
        if self.index >= self.nodes.len() || self.nodes[self.index] != t.node_id() {
            return Err(CycloError::Spec(format!(
                "ring position {} does not name this node ({})",
                self.index,
                node_name(t.node_id())
            )));
        }
        let mut sorted = self.nodes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.nodes.len() {
            return Err(CycloError::Spec("a node appears twice in the ring".into()));
        }
        if self.exchange > u32::MAX - 4 {
            return Err(CycloError::Spec("exchange id too large".into()));
        }
        Ok(())
    }
}

/// When a received buffer is passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardPolicy {
    /// As soon as it is complete, concurrently with joining it.
    OnArrival,
    /// When the join entity is done with it (the paper's order).
    AfterJoin,
}

/// Size of a node's buffer ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundaboutConfig {
    /// Buffers per node (at least 2: one is always kept for receiving).
    pub buffers: usize,
    /// Bytes per buffer: the most a fragment may occupy. All nodes must agree.
    pub buffer_bytes: usize,
    pub forward: ForwardPolicy,
}

impl Default for RoundaboutConfig {
    /// 8 buffers of 4 MiB: fragments of 256 Ki (key, payload) rows, large enough that a
    /// transfer is many transport messages (the paper saturates links at 1 MB units) and
    /// a hash probe fragment fills the partitions of a cache-sized build side.
    fn default() -> Self {
        RoundaboutConfig {
            buffers: 8,
            buffer_bytes: 4 << 20,
            forward: ForwardPolicy::OnArrival,
        }
    }
}

impl RoundaboutConfig {
    pub fn check(&self) -> Result<()> {
        if self.buffers < 2 {
            return Err(CycloError::Spec(format!(
                "the buffer ring needs at least 2 buffers, got {}",
                self.buffers
            )));
        }
        if self.buffer_bytes < HEADER_BYTES + 16 {
            return Err(CycloError::Spec(format!(
                "buffers of {} bytes cannot hold a fragment header and a row",
                self.buffer_bytes
            )));
        }
        Ok(())
    }
}

/// What one node's roundabout measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundaboutFigures {
    /// Wall time of this node's ring phase.
    pub elapsed: Duration,
    /// Time the join entity spent joining (kernels and result sink).
    pub join: Duration,
    /// Time the join entity waited for a fragment (the paper's sync time).
    pub sync: Duration,
    /// Time the transmitter waited for credits or send buffers (backpressure).
    pub transmit_wait: Duration,
    pub fragments_joined: u64,
    pub rows_joined: u64,
    pub fragments_sent: u64,
    pub fragments_received: u64,
    /// Fragment bytes sent to the successor and received from the predecessor.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Most ring buffers in use at once.
    pub buffers_high_water: usize,
}

/// What the join entity does with each fragment passing this node (empty fragments,
/// which only mark an origin's end, are not handed over).
pub trait JoinEntity: Send + 'static {
    fn join(&mut self, fragment: &FragmentView<'_>) -> Result<()>;
}

impl<F> JoinEntity for F
where
    F: FnMut(&FragmentView<'_>) -> Result<()> + Send + 'static,
{
    fn join(&mut self, fragment: &FragmentView<'_>) -> Result<()> {
        self(fragment)
    }
}

#[derive(Default)]
struct EntityFigures {
    join: Duration,
    sync: Duration,
    fragments: u64,
    rows: u64,
}

/// Sent by a sender whose join entity went away; replaced by the entity's own error.
fn entity_gone() -> CycloError {
    CycloError::Internal("the join entity stopped".into())
}

/// Runs this node's part of one revolution: injects `own` (fragments encoded by
/// [`fragment::encode`]; origin, sequence and last flag are stamped here), joins every
/// fragment passing by with `entity`, and returns once every fragment of every origin
/// was joined here and everything this node must forward was written. Every ring member
/// must call it with the same `ring` (but `index`) and `config`.
pub async fn run_roundabout<J: JoinEntity>(
    t: &dyn Transport,
    ring: &RingSpec,
    config: &RoundaboutConfig,
    own: Vec<Vec<u64>>,
    entity: J,
) -> Result<(RoundaboutFigures, J)> {
    ring.check(t)?;
    config.check()?;
    let n = ring.len();
    let me = ring.index;
    if n > 1 && t.message_size() < HEADER_BYTES {
        return Err(CycloError::Spec(format!(
            "transport messages of {} bytes cannot carry a fragment header",
            t.message_size()
        )));
    }
    let mut own = own;
    if own.is_empty() {
        // An origin without rows still marks its end.
        own.push(fragment::encode(
            FragmentForm::Raw,
            KeyDomain::Unsigned,
            &[],
            &[],
            &[],
            &[],
        ));
    }
    let too_big = own.iter().map(Vec::len).max().unwrap_or(0) * 8;
    if too_big > config.buffer_bytes {
        return Err(CycloError::Spec(format!(
            "a fragment of {too_big} bytes does not fit buffers of {} bytes",
            config.buffer_bytes
        )));
    }
    let buffers = BufferRing::new(config.buffers, config.buffer_bytes);
    let (send, recv) = if n > 1 {
        let send = t.open_send(SendSpec {
            query: ring.query,
            exchange: ring.exchange,
            from: me as u32,
            destinations: vec![ring.nodes[ring.successor()]],
            groups: vec![],
        })?;
        let pred = ring.predecessor();
        let recv = t.open_receive(ReceiveSpec {
            query: ring.query,
            exchange: ring.exchange,
            sources: vec![(pred as u32, ring.nodes[pred])],
        })?;
        (Some(send), Some(recv))
    } else {
        (None, None)
    };
    let abort = if n > 1 {
        let others: Vec<usize> = (0..n).filter(|&i| i != me).collect();
        let send = t.open_send(SendSpec {
            query: ring.query,
            exchange: ring.exchange + 2,
            from: me as u32,
            destinations: others.iter().map(|&i| ring.nodes[i]).collect(),
            groups: vec![],
        })?;
        let recv = t.open_receive(ReceiveSpec {
            query: ring.query,
            exchange: ring.exchange + 2,
            sources: others.iter().map(|&i| (i as u32, ring.nodes[i])).collect(),
        })?;
        Some((send, recv))
    } else {
        None
    };
    let start = Instant::now();
    let (join_tx, mut join_rx) = mpsc::unbounded_channel::<Arc<FilledBuffer>>();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Arc<FilledBuffer>>();
    let on_arrival = config.forward == ForwardPolicy::OnArrival;

    // The join entity: an OS thread, so joining never stalls the transport's tasks.
    let failure: Arc<Mutex<Option<CycloError>>> = Arc::default();
    let entity_ring = ring.clone();
    let after_join_tx = (!on_arrival).then(|| out_tx.clone());
    let entity_failure = Arc::clone(&failure);
    let mut entity = entity;
    let handle = tokio::task::spawn_blocking(move || {
        let mut figs = EntityFigures::default();
        let res: Result<()> = (|| {
            loop {
                let waited = Instant::now();
                let Some(filled) = join_rx.blocking_recv() else {
                    return Ok(());
                };
                figs.sync += waited.elapsed();
                let view = FragmentView::parse(filled.words())?;
                let busy = Instant::now();
                if !view.is_empty() {
                    entity.join(&view)?;
                }
                figs.join += busy.elapsed();
                figs.fragments += 1;
                figs.rows += view.rows() as u64;
                if let Some(tx) = &after_join_tx
                    && entity_ring.forwards(view.origin() as usize)
                {
                    tx.send(Arc::clone(&filled)).map_err(|_| entity_gone())?;
                }
            }
        })();
        match res {
            Ok(()) => Ok((entity, figs)),
            Err(e) => {
                // The entity's own failure explains the others' "entity stopped"; a
                // transmitter that went away has its own error to report.
                if e != entity_gone() {
                    *entity_failure.lock().expect("failure slot") = Some(e.clone());
                }
                Err(e)
            }
        }
    });

    let loader = {
        let (buffers, join_tx, out_tx) = (&buffers, join_tx.clone(), out_tx.clone());
        async move {
            let count = own.len();
            // Keep one buffer for receiving (see BufferRing::take); alone, no need.
            let min_free = if n > 1 { 2 } else { 1 };
            for (seq, mut words) in own.into_iter().enumerate() {
                fragment::stamp(&mut words, me as u32, seq as u64, seq + 1 == count);
                let mut buf = buffers.take(min_free).await;
                buf[..words.len()].copy_from_slice(&words);
                let filled = buffers.filled(buf, words.len());
                drop(words);
                if on_arrival && ring.forwards(me) {
                    out_tx
                        .send(Arc::clone(&filled))
                        .map_err(|_| entity_gone())?;
                }
                join_tx.send(filled).map_err(|_| entity_gone())?;
            }
            Ok::<_, CycloError>(())
        }
    };

    let receiver = {
        let (buffers, join_tx, out_tx, recv) = (&buffers, join_tx, out_tx, recv.as_ref());
        async move {
            let Some(recv) = recv else {
                return Ok((0u64, 0u64));
            };
            let pred = node_name(ring.nodes[ring.predecessor()]);
            let mut next_seq = vec![0u64; n];
            let mut ended = vec![false; n];
            ended[me] = true;
            let mut remaining = n - 1;
            let (mut fragments, mut bytes) = (0u64, 0u64);
            // The buffer being filled: (buffer, bytes so far, bytes in all).
            let mut current: Option<(Box<[u64]>, usize, usize)> = None;
            while remaining > 0 {
                let Some(msg) = recv.get().await? else {
                    return Err(CycloError::Protocol(format!(
                        "{pred} ended its stream before the last fragment of every origin"
                    )));
                };
                let data = msg.data();
                if data.is_empty() {
                    continue;
                }
                if current.is_none() {
                    if data.len() < HEADER_BYTES {
                        return Err(CycloError::Protocol(format!(
                            "{pred} sent a fragment start of {} bytes, shorter than a header",
                            data.len()
                        )));
                    }
                    let header: Vec<u64> = data[..HEADER_BYTES]
                        .chunks_exact(8)
                        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                        .collect();
                    let words = fragment::announced_words(&header)?;
                    if words < HEADER_WORDS || words * 8 > buffers.buffer_bytes() {
                        return Err(CycloError::Protocol(format!(
                            "{pred} announced a fragment of {} bytes; buffers hold {} \
                             (all ring members must use the same buffer size)",
                            words.saturating_mul(8),
                            buffers.buffer_bytes()
                        )));
                    }
                    // Waiting here holds the message, so its credit is not returned: the
                    // predecessor is slowed down instead of this node buffering more.
                    current = Some((buffers.take(1).await, 0, words * 8));
                }
                let (buf, filled, total) = current.as_mut().expect("set above");
                if *filled + data.len() > *total {
                    return Err(CycloError::Protocol(format!(
                        "{pred} sent more bytes than its fragment announced"
                    )));
                }
                as_bytes_mut(buf)[*filled..*filled + data.len()].copy_from_slice(data);
                *filled += data.len();
                let complete = *filled == *total;
                bytes += data.len() as u64;
                drop(msg);
                if !complete {
                    continue;
                }
                let (buf, _, total) = current.take().expect("set above");
                let filled = buffers.filled(buf, total / 8);
                let view = FragmentView::parse(filled.words())?;
                let origin = view.origin() as usize;
                if origin >= n || origin == me {
                    return Err(CycloError::Protocol(format!(
                        "{pred} forwarded a fragment of origin {origin} to ring position {me}"
                    )));
                }
                if ended[origin] || view.seq() != next_seq[origin] {
                    return Err(CycloError::Protocol(format!(
                        "fragment {} of origin {origin} arrived out of order (expected {})",
                        view.seq(),
                        next_seq[origin]
                    )));
                }
                next_seq[origin] += 1;
                if view.is_last() {
                    ended[origin] = true;
                    remaining -= 1;
                }
                fragments += 1;
                if on_arrival && ring.forwards(origin) {
                    out_tx
                        .send(Arc::clone(&filled))
                        .map_err(|_| entity_gone())?;
                }
                join_tx.send(filled).map_err(|_| entity_gone())?;
            }
            drop((join_tx, out_tx));
            // The predecessor ends its stream once it passed everything on.
            while let Some(msg) = recv.get().await? {
                if !msg.data().is_empty() {
                    return Err(CycloError::Protocol(format!(
                        "{pred} sent data after the last fragment of every origin"
                    )));
                }
            }
            Ok((fragments, bytes))
        }
    };

    let transmitter = {
        let send = send.as_ref();
        let succ = ring.nodes[ring.successor()];
        let chunk = t.message_size();
        async move {
            let (mut fragments, mut bytes, mut wait) = (0u64, 0u64, Duration::ZERO);
            let Some(send) = send else {
                while out_rx.recv().await.is_some() {}
                return Ok((fragments, bytes, wait));
            };
            while let Some(filled) = out_rx.recv().await {
                let data = as_bytes(filled.words());
                for piece in data.chunks(chunk) {
                    let waited = Instant::now();
                    let mut buf = send.acquire(To::Node(succ)).await?;
                    wait += waited.elapsed();
                    buf.extend_from_slice(piece);
                    send.put(buf, false)?;
                }
                fragments += 1;
                bytes += data.len() as u64;
            }
            send.finish();
            send.flushed().await;
            Ok::<_, CycloError>((fragments, bytes, wait))
        }
    };

    let entity_done = async {
        handle
            .await
            .map_err(|e| CycloError::Internal(format!("the join entity panicked: {e}")))?
    };
    let work = async {
        let joined = tokio::try_join!(loader, receiver, transmitter, entity_done);
        joined.map_err(|err| {
            let own_error = failure.lock().expect("failure slot").take();
            own_error.unwrap_or(err)
        })
    };
    // A peer that fails tells every ring member at once (the ring itself may be full and
    // stalled behind the failed node); its notice ends this node's run too.
    let watch = async {
        let Some((_, recv)) = &abort else {
            return std::future::pending::<CycloError>().await;
        };
        loop {
            match recv.get().await {
                Ok(Some(_)) => continue, // a peer finished its run
                Ok(None) => return std::future::pending::<CycloError>().await,
                Err(e) => return CycloError::Transport(e),
            }
        }
    };
    let result = tokio::select! {
        r = work => r,
        e = watch => Err(e),
    };
    if let Some((send, _)) = &abort {
        match &result {
            Ok(_) => send.finish(),
            Err(e) => {
                send.fail(&e.to_string());
                // Written before the caller may release the query (which drops it).
                let _ = tokio::time::timeout(Duration::from_secs(5), send.flushed()).await;
            }
        }
    }
    let ((), (fragments_received, bytes_received), (fragments_sent, bytes_sent, wait), (entity, e)) =
        result?;
    Ok((
        RoundaboutFigures {
            elapsed: start.elapsed(),
            join: e.join,
            sync: e.sync,
            transmit_wait: wait,
            fragments_joined: e.fragments,
            rows_joined: e.rows,
            fragments_sent,
            fragments_received,
            bytes_sent,
            bytes_received,
            buffers_high_water: buffers.high_water(),
        },
        entity,
    ))
}
