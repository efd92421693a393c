//! A [`Transport`] whose exchanges run over one of the verbs designs: the
//! query path of the shared-memory carrier (and of any other verbs carrier).
//!
//! Every node of a query opens the same streams with the same settings
//! ([`DesignConfig::for_queries`]), so both sides of each stream agree. In
//! Gyre each node runs one partition of each stage, so an exchange has one
//! sending endpoint per node: the SE and ME variants of a design coincide
//! here (they differ in `gyre bench shuffle`, which runs several sending
//! threads per node).

use super::{Connector, Design, DesignConfig, DesignReceive, DesignSend, Primitive};
use crate::endpoint::{DesignReceiving, DesignSending, Traffic};
use crate::schedule::Schedule;
use crate::stats::TransportStats;
use crate::verbs::{Carrier, QpKind};
use crate::{
    NodeId, ReceiveEndpoint, ReceiveSpec, SendEndpoint, SendSpec, Transport, TransportError,
};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of a query message over a connection (as the TCP transport's).
pub const QUERY_MESSAGE_SIZE: usize = 512 * 1024;

/// How long a query's stream waits for its peer to appear or for credit
/// before it fails. Queries end their streams themselves (a cancelled query
/// drops its endpoints and releases its handshakes); this bounds what a
/// bug leaves waiting, and must exceed any pause of a consumer that reads
/// one input to its end before the other (a hash join's build side).
pub const QUERY_STREAM_TIMEOUT: Duration = Duration::from_secs(30 * 60);

impl DesignConfig {
    /// The settings every node uses for a query's streams over `primitive`
    /// on `carrier`: as the TCP transport's, 512 KiB messages and a window of
    /// 8 per stream; datagrams carry the carrier's largest (4 KiB), 128 to a
    /// window. Operators rely on a window's worth of data going out before
    /// its consumer reads (Flow-Join's routers report on their first rows
    /// while the probe side's consumer still waits for the build side), so
    /// a smaller window can stall a query that TCP runs.
    pub fn for_queries(primitive: Primitive, carrier: &dyn Carrier) -> Self {
        let datagram = primitive == Primitive::Datagram;
        Self {
            message_size: match datagram {
                true => carrier.max_message(QpKind::Ud),
                false => QUERY_MESSAGE_SIZE.min(carrier.max_message(QpKind::Rc)),
            },
            window: if datagram { 128 } else { 8 },
            credit_every: 2,
            send_buffers: if datagram { 64 } else { 8 },
            timeout: QUERY_STREAM_TIMEOUT,
            primitive,
            adaptive: None,
        }
    }
}

/// One node's exchanges over a verbs design.
pub struct DesignTransport {
    design: Design,
    carrier: Arc<dyn Carrier>,
    connector: Arc<dyn Connector>,
    config: DesignConfig,
    traffic: Arc<Traffic>,
}

impl std::fmt::Debug for DesignTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesignTransport")
            .field("design", &self.design)
            .field("node", &self.carrier.node())
            .finish()
    }
}

impl DesignTransport {
    /// The transport of `design` (not `tcp`) for the node of `carrier`, its
    /// streams brought together by `connector`.
    pub fn new(
        design: Design,
        carrier: Arc<dyn Carrier>,
        connector: Arc<dyn Connector>,
    ) -> Result<Self, TransportError> {
        let primitive = design.primitive().ok_or_else(|| {
            TransportError::Misuse(format!("{design} is not a design over a verbs carrier"))
        })?;
        let config = DesignConfig::for_queries(primitive, &*carrier);
        Ok(Self {
            design,
            carrier,
            connector,
            config,
            traffic: Arc::default(),
        })
    }

    pub fn design(&self) -> Design {
        self.design
    }

    pub fn config(&self) -> &DesignConfig {
        &self.config
    }
}

impl Transport for DesignTransport {
    fn node_id(&self) -> NodeId {
        self.carrier.node()
    }

    fn open_send(&self, spec: SendSpec) -> Result<SendEndpoint, TransportError> {
        let ep = DesignSend::open(
            Arc::clone(&self.carrier),
            Arc::clone(&self.connector),
            self.config.clone(),
            spec,
        )?;
        Ok(DesignSending::new(ep, Arc::clone(&self.traffic)).into())
    }

    fn open_receive(&self, spec: ReceiveSpec) -> Result<ReceiveEndpoint, TransportError> {
        let sources = spec.sources.clone();
        let ep = DesignReceive::open(
            Arc::clone(&self.carrier),
            Arc::clone(&self.connector),
            self.config.clone(),
            spec,
        )?;
        let in_order = self.config.primitive != Primitive::Datagram;
        let traffic = Arc::clone(&self.traffic);
        Ok(DesignReceiving::new(ep, in_order, sources, traffic, self.carrier.node()).into())
    }

    fn release_query(&self, query: u64) {
        self.connector.release(query);
    }

    fn is_lost(&self, peer: NodeId) -> bool {
        !self.carrier.is_alive(peer)
    }

    fn message_size(&self) -> usize {
        self.config.payload()
    }

    /// Memory speed: no link worth compressing for.
    fn link_rate(&self) -> Option<f64> {
        None
    }

    /// Messages go when there is data and credit (the designs have no phased schedule).
    fn schedule(&self) -> Schedule {
        Schedule::Free
    }

    fn set_schedule(&self, _: Schedule) {}

    /// What the node's endpoints moved to and from other nodes (no per-peer
    /// figures, pools or schedule: the designs keep none of those).
    fn stats(&self) -> TransportStats {
        let l = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let t = &self.traffic;
        TransportStats {
            node: self.carrier.node(),
            bytes_sent: l(&t.bytes_sent),
            bytes_received: l(&t.bytes_received),
            messages_sent: l(&t.messages_sent),
            messages_received: l(&t.messages_received),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::design::LocalConnector;
    use crate::endpoint::To;
    use crate::shm::{ShmCarrier, ShmConfig, ShmParams};

    struct Nodes {
        _dir: tempfile::TempDir,
        transports: Vec<Arc<DesignTransport>>,
    }

    fn nodes(design: Design, n: u32) -> Nodes {
        let dir = tempfile::tempdir().unwrap();
        let config = ShmConfig {
            dir: dir.path().to_path_buf(),
            params: ShmParams {
                arena: 256 << 20,
                ..ShmParams::for_queries()
            },
        };
        let connector = LocalConnector::new();
        let transports = (1..=n)
            .map(|id| {
                let carrier = Arc::new(ShmCarrier::open(id, &config).unwrap());
                Arc::new(DesignTransport::new(design, carrier, connector.clone()).unwrap())
            })
            .collect();
        Nodes {
            _dir: dir,
            transports,
        }
    }

    /// One stream of `query`: from node 1's slot 0 to node 2.
    fn one_stream(nodes: &Nodes, query: u64) -> (ReceiveEndpoint, SendEndpoint) {
        let recv = nodes.transports[1]
            .open_receive(ReceiveSpec {
                query,
                exchange: 0,
                sources: vec![(0, 1)],
            })
            .unwrap();
        let send = nodes.transports[0]
            .open_send(SendSpec {
                query,
                exchange: 0,
                from: 0,
                destinations: vec![2],
                groups: vec![],
            })
            .unwrap();
        (recv, send)
    }

    /// Message `seq` of sender `src`: sizes from one byte to several buffers.
    fn message(src: u32, seq: usize, payload: usize) -> Vec<u8> {
        let len = [1, 1000, payload, payload + 1, 3 * payload + 17, 70_000][seq % 6];
        (0..len)
            .map(|i| (i as u32).wrapping_mul(31) as u8 ^ (src as u8) << 4 ^ seq as u8)
            .collect()
    }

    /// Who gets message `seq` of every sender: one node in turn, all, or the group {2, 3}.
    fn to_of(seq: usize) -> To {
        match seq % 3 {
            0 => To::Node(1 + (seq / 3 % 3) as u32),
            1 => To::All,
            _ => To::Group(0),
        }
    }

    fn reaches(to: To, node: NodeId) -> bool {
        match to {
            To::Node(n) => n == node,
            To::All => true,
            To::Group(_) => node != 1,
        }
    }

    const MESSAGES: usize = 18;

    /// Every node sends to every node (itself too) messages of every size, to
    /// one, all or a group; each stream must arrive whole and in order.
    async fn exchange(design: Design) {
        let nodes = nodes(design, 3);
        let payload = nodes.transports[0].message_size();
        let mut tasks = Vec::new();
        for (i, t) in nodes.transports.iter().enumerate() {
            let me = i as u32 + 1;
            let recv = t
                .open_receive(ReceiveSpec {
                    query: 7,
                    exchange: 0,
                    sources: (1..=3).map(|s| (s, s)).collect(),
                })
                .unwrap();
            let send = t
                .open_send(SendSpec {
                    query: 7,
                    exchange: 0,
                    from: me,
                    destinations: vec![1, 2, 3],
                    groups: vec![vec![2, 3]],
                })
                .unwrap();
            tasks.push(tokio::spawn(async move {
                for seq in 0..MESSAGES {
                    let mut buf = send.acquire(to_of(seq)).await.unwrap();
                    buf.extend_from_slice(&message(me, seq, payload));
                    send.put(buf, false).unwrap();
                }
                send.finish();
                send.flushed().await;
                assert_eq!(send.stats().messages, MESSAGES as u64);
                None
            }));
            tasks.push(tokio::spawn(async move {
                let mut got: Vec<Vec<Vec<u8>>> = vec![vec![]; 3];
                while let Some(m) = recv.get().await.unwrap() {
                    assert_eq!(m.node, m.slot);
                    got[m.source].push(m.data().to_vec());
                    assert_eq!(&m.bytes()[..], m.data());
                }
                Some((me, got))
            }));
        }
        let mut received = [0u64; 3];
        for task in tasks {
            let Some((me, got)) = task.await.unwrap() else {
                continue;
            };
            for (s, messages) in got.iter().enumerate() {
                let src = s as u32 + 1;
                let want: Vec<Vec<u8>> = (0..MESSAGES)
                    .filter(|&seq| reaches(to_of(seq), me))
                    .map(|seq| message(src, seq, payload))
                    .collect();
                assert_eq!(messages.len(), want.len(), "{design}: {src} to {me}");
                if src != me {
                    received[me as usize - 1] += want.iter().map(|m| m.len() as u64).sum::<u64>();
                }
                assert!(messages == &want, "{design}: {src} to {me}: bytes differ");
            }
        }
        let stats: Vec<TransportStats> = nodes.transports.iter().map(|t| t.stats()).collect();
        for (i, s) in stats.iter().enumerate() {
            assert_eq!(s.bytes_received, received[i], "{design}: node {}", i + 1);
        }
        let sent: u64 = stats.iter().map(|s| s.bytes_sent).sum();
        assert_eq!(sent, received.iter().sum::<u64>(), "{design}");
    }

    macro_rules! every_design {
        ($($name:ident: $design:expr,)*) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                exchange($design).await
            }
        )*};
    }

    every_design! {
        memq_sr: Design::MemqSr,
        semq_sr: Design::SemqSr,
        mesq_sr: Design::MesqSr,
        sesq_sr: Design::SesqSr,
        memq_rd: Design::MemqRd,
        semq_rd: Design::SemqRd,
        memq_wr: Design::MemqWr,
        semq_wr: Design::SemqWr,
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_sender_fails_its_receiver_after_its_data() {
        for design in [
            Design::MemqSr,
            Design::MesqSr,
            Design::MemqRd,
            Design::MemqWr,
        ] {
            let nodes = nodes(design, 2);
            let payload = nodes.transports[0].message_size();
            let (recv, send) = one_stream(&nodes, 1);
            let reading = tokio::spawn(async move {
                let first = recv.get().await.unwrap().unwrap();
                let data = first.data().to_vec();
                drop(first);
                (data, recv.get().await.unwrap_err())
            });
            let mut buf = send.acquire(To::All).await.unwrap();
            buf.extend_from_slice(&message(1, 4, payload));
            send.put(buf, false).unwrap();
            // (A Read sender's buffer is flushed once its receiver has read it.)
            send.flushed().await;
            drop(send);
            let (data, err) = reading.await.unwrap();
            assert_eq!(data, message(1, 4, payload), "{design}");
            assert!(err.to_string().contains("dropped"), "{design}: {err}");
        }
    }

    /// A receiver dropped after its first message: its sender still puts far
    /// more than a window (the dropped endpoint takes and discards them, as a
    /// TCP endpoint does) and its end goes through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_receiver_lets_its_sender_finish() {
        for design in Design::ALL {
            if design == Design::Tcp {
                continue;
            }
            let nodes = nodes(design, 2);
            let payload = nodes.transports[0].message_size();
            let (recv, send) = one_stream(&nodes, 4);
            let reading = tokio::spawn(async move {
                let first = recv.get().await.unwrap().unwrap();
                assert_eq!(first.data(), message(1, 0, payload), "{design}");
            });
            let sending = async {
                for seq in 0..600 {
                    // Some cut in two: the rest goes by a job.
                    let len = if seq % 7 == 3 { payload + 10 } else { payload };
                    let mut buf = send.acquire(To::All).await.unwrap();
                    buf.extend_from_slice(&message(1, seq, len));
                    send.put(buf, false).unwrap();
                }
                send.finish();
                send.flushed().await;
            };
            tokio::time::timeout(Duration::from_secs(20), sending)
                .await
                .unwrap_or_else(|_| panic!("{design}: the sender waited for credit"));
            reading.await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_released_query_stops_a_sender_waiting_for_its_receiver() {
        let nodes = nodes(Design::MemqSr, 2);
        let send = nodes.transports[0]
            .open_send(SendSpec {
                query: 3,
                exchange: 0,
                from: 0,
                destinations: vec![2],
                groups: vec![],
            })
            .unwrap();
        let t = Arc::clone(&nodes.transports[0]);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            t.release_query(3);
        });
        let began = std::time::Instant::now();
        let err = send.acquire(To::All).await.unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(5), "{err}");
        assert!(err.to_string().contains("over"), "{err}");
        // Late comers are turned away at once.
        let late = nodes.transports[1]
            .open_receive(ReceiveSpec {
                query: 3,
                exchange: 0,
                sources: vec![(0, 1)],
            })
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), late.get())
            .await
            .expect("not left waiting")
            .unwrap_err();
        assert!(err.to_string().contains("over"), "{err}");
    }

    #[test]
    fn tcp_is_not_a_design_transport() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShmConfig {
            dir: dir.path().to_path_buf(),
            params: ShmParams::default(),
        };
        let carrier = Arc::new(ShmCarrier::open(1, &config).unwrap());
        let err = DesignTransport::new(Design::Tcp, carrier, LocalConnector::new()).unwrap_err();
        assert!(err.to_string().contains("tcp"), "{err}");
    }
}
