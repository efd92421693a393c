use super::message::{FLAG_LAST, HEADER, header};
use super::*;
use crate::TransportError;
use crate::endpoint::To;
use crate::verbs::UD_MTU;
use crate::verbs::{Carrier, QpKind, SendOp, SendWr};
use crate::{NodeId, ReceiveSpec, SendSpec};
use std::sync::Arc;
use std::time::Duration;

struct Cluster {
    _dir: tempfile::TempDir,
    carriers: Vec<Arc<dyn Carrier>>,
    connector: Arc<LocalConnector>,
}

/// Nodes 1..=n on the shared-memory carrier, or on the ibverbs one when
/// `GYRE_VERBS_GIDS` names their addresses (`scripts/rdma/test.sh`).
fn cluster(n: u32) -> Cluster {
    #[cfg(feature = "verbs")]
    if let Ok(book) = std::env::var("GYRE_VERBS_GIDS") {
        use crate::rdma::{RdmaCarrier, RdmaConfig, parse_gids};
        let mut config = RdmaConfig::new(parse_gids(&book).expect("an address book"));
        config.device = std::env::var("GYRE_VERBS_DEVICE").ok();
        return Cluster {
            _dir: tempfile::tempdir().expect("a temporary directory"),
            carriers: (1..=n)
                .map(|id| Arc::new(RdmaCarrier::open(id, &config).expect("a carrier")) as _)
                .collect(),
            connector: LocalConnector::new(),
        };
    }
    let (dir, carriers) = crate::shm::test_nodes(n, 64 << 20);
    let carriers = carriers
        .into_iter()
        .map(|c| c as Arc<dyn Carrier>)
        .collect();
    Cluster {
        _dir: dir,
        carriers,
        connector: LocalConnector::new(),
    }
}

fn small() -> DesignConfig {
    DesignConfig {
        message_size: 4096,
        window: 4,
        credit_every: 2,
        send_buffers: 4,
        timeout: Duration::from_secs(5),
        primitive: Primitive::Send,
        adaptive: None,
    }
}

/// Runs a test over each primitive.
macro_rules! every_primitive {
    ($name:ident) => {
        mod $name {
            use super::Primitive;

            async fn over(primitive: Primitive) {
                super::$name(super::DesignConfig {
                    primitive,
                    ..super::small()
                })
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn send() {
                over(Primitive::Send).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn datagram() {
                over(Primitive::Datagram).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn read() {
                over(Primitive::Read).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn write() {
                over(Primitive::Write).await
            }
        }
    };
}

fn body(src: u32, dst: u32, seq: usize) -> Vec<u8> {
    let len = 1 + (seq * 977 + src as usize * 31) % (small().payload() - 1);
    (0..len)
        .map(|i| (i as u32 ^ src << 3 ^ dst << 5 ^ seq as u32) as u8)
        .collect()
}

impl Cluster {
    fn send(
        &self,
        node: u32,
        dests: Vec<NodeId>,
        groups: Vec<Vec<NodeId>>,
        c: DesignConfig,
    ) -> DesignSend {
        self.try_send(node, dests, groups, c).unwrap()
    }

    fn try_send(
        &self,
        node: u32,
        dests: Vec<NodeId>,
        groups: Vec<Vec<NodeId>>,
        c: DesignConfig,
    ) -> Result<DesignSend, TransportError> {
        DesignSend::open(
            Arc::clone(&self.carriers[node as usize - 1]),
            self.connector.clone(),
            c,
            SendSpec {
                query: 1,
                exchange: 1,
                from: node,
                destinations: dests,
                groups,
            },
        )
    }

    fn recv(&self, node: u32, sources: Vec<NodeId>, c: DesignConfig) -> DesignReceive {
        DesignReceive::open(
            Arc::clone(&self.carriers[node as usize - 1]),
            self.connector.clone(),
            c,
            ReceiveSpec {
                query: 1,
                exchange: 1,
                sources: sources.into_iter().map(|s| (s, s)).collect(),
            },
        )
        .unwrap()
    }
}

async fn every_node_repartitions_to_every_other_in_order(cfg: DesignConfig) {
    const N: u32 = 3;
    const MESSAGES: usize = 300;
    let c = Arc::new(cluster(N));
    let mut tasks = vec![];
    for me in 1..=N {
        let others: Vec<NodeId> = (1..=N).filter(|o| *o != me).collect();
        let send = c.send(me, others.clone(), vec![], cfg.clone());
        let recv = c.recv(me, others.clone(), cfg.clone());
        tasks.push(tokio::spawn(async move {
            let sending = async {
                for seq in 0..MESSAGES {
                    for &d in &others {
                        let mut b = send.acquire(To::Node(d)).await?;
                        assert!(b.extend_from_slice(&body(me, d, seq)));
                        send.put(b, seq + 1 == MESSAGES && d % 2 == 0)?;
                    }
                }
                send.finish().await?;
                send.flushed().await
            };
            let receiving = async {
                let mut next = [0usize; N as usize + 1];
                while let Some(r) = recv.get().await? {
                    let s = r.node;
                    assert_eq!(recv.data(&r), &body(s, me, next[s as usize])[..]);
                    next[s as usize] += 1;
                    recv.release(r)?;
                }
                Ok::<_, TransportError>(next)
            };
            let (s, r) = tokio::join!(sending, receiving);
            s?;
            let next = r?;
            for &o in &others {
                assert_eq!(next[o as usize], MESSAGES, "from node {o}");
            }
            Ok::<_, TransportError>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}
every_primitive!(every_node_repartitions_to_every_other_in_order);

async fn broadcast_and_groups_reach_their_members_once(cfg: DesignConfig) {
    let c = cluster(4);
    let send = c.send(1, vec![2, 3, 4], vec![vec![2, 4]], cfg.clone());
    let recvs: Vec<DesignReceive> = (2..=4).map(|n| c.recv(n, vec![1], cfg.clone())).collect();
    let sending = async {
        for i in 0..50u8 {
            let mut b = send
                .acquire(if i % 2 == 0 { To::All } else { To::Group(0) })
                .await?;
            b.extend_from_slice(&[i; 100]);
            send.put(b, false)?;
        }
        send.finish().await
    };
    let receiving = futures::future::join_all(recvs.iter().map(|r| async move {
        let mut got = vec![];
        while let Some(m) = r.get().await? {
            got.push(r.data(&m)[0]);
            r.release(m)?;
        }
        Ok::<_, TransportError>(got)
    }));
    let (s, got) = tokio::join!(sending, receiving);
    s.unwrap();
    let got: Vec<Vec<u8>> = got.into_iter().map(Result::unwrap).collect();
    let all: Vec<u8> = (0..50).collect();
    let even: Vec<u8> = (0..50).step_by(2).collect();
    assert_eq!(got[0], all, "node 2 is in the group");
    assert_eq!(got[1], even, "node 3 gets the broadcasts only");
    assert_eq!(got[2], all, "node 4 is in the group");
}
every_primitive!(broadcast_and_groups_reach_their_members_once);

async fn a_slow_consumer_holds_the_sender_to_its_window(cfg: DesignConfig) {
    let c = cluster(2);
    let send = c.send(1, vec![2], vec![], cfg.clone());
    let recv = c.recv(2, vec![1], cfg.clone());
    // A reservation dropped unsent gives its credit and buffer back (the
    // receiver sees nothing of it)...
    drop(send.acquire(To::Node(2)).await.unwrap());
    // ...so the window's worth still goes at once...
    for i in 0..cfg.window {
        let mut b = tokio::time::timeout(Duration::from_secs(2), send.acquire(To::Node(2)))
            .await
            .expect("a credit within the window")
            .unwrap();
        assert!(b.extend_from_slice(&[i as u8]));
        send.put(b, false).unwrap();
    }
    // ...then the sender waits for credit.
    let blocked = tokio::time::timeout(Duration::from_millis(200), send.acquire(To::Node(2))).await;
    assert!(blocked.is_err(), "acquired beyond the window");
    // Consuming two returns credit (every second release writes it back).
    for _ in 0..2 {
        let m = recv.get().await.unwrap().unwrap();
        recv.release(m).unwrap();
    }
    let b = tokio::time::timeout(Duration::from_secs(2), send.acquire(To::Node(2)))
        .await
        .expect("credit came back")
        .unwrap();
    let mut b = b;
    assert!(b.extend_from_slice(b"last"));
    send.put(b, true).unwrap();
    let mut n = 0;
    while let Some(m) = recv.get().await.unwrap() {
        n += 1;
        recv.release(m).unwrap();
    }
    assert_eq!(n, cfg.window as usize + 1 - 2);
}
every_primitive!(a_slow_consumer_holds_the_sender_to_its_window);

/// A consumer may hold several messages and give them back in any order: no
/// buffer it holds is written again before it is given back (Write's free
/// queue names buffers in the order they were released, Read's own buffers
/// return to a free list).
async fn buffers_given_back_out_of_order_are_not_overwritten(cfg: DesignConfig) {
    const MESSAGES: usize = 200;
    let c = cluster(2);
    let send = c.send(1, vec![2], vec![], cfg.clone());
    let recv = c.recv(2, vec![1], cfg.clone());
    let sending = async {
        for seq in 0..MESSAGES {
            let mut b = send.acquire(To::Node(2)).await?;
            assert!(b.extend_from_slice(&body(1, 2, seq)));
            send.put(b, false)?;
        }
        send.finish().await?;
        send.flushed().await
    };
    let receiving = async {
        // Hold one message while the next ten come and go, then re-check and
        // give it back; then hold the next.
        let mut next = 0;
        let mut held = None;
        while let Some(m) = recv.get().await? {
            assert_eq!(recv.data(&m), &body(1, 2, next)[..], "message {next}");
            match held.take() {
                None => held = Some((next, m)),
                Some((seq, h)) if next - seq < 10 => {
                    recv.release(m)?;
                    held = Some((seq, h));
                }
                Some((seq, h)) => {
                    assert_eq!(recv.data(&h), &body(1, 2, seq)[..], "held message {seq}");
                    recv.release(h)?;
                    recv.release(m)?;
                }
            }
            next += 1;
        }
        if let Some((_, h)) = held {
            recv.release(h)?;
        }
        Ok::<_, TransportError>(next)
    };
    let (s, r) = tokio::join!(sending, receiving);
    s.unwrap();
    assert_eq!(r.unwrap(), MESSAGES);
}
every_primitive!(buffers_given_back_out_of_order_are_not_overwritten);

async fn a_late_receiver_is_waited_for_and_a_failure_reaches_it(cfg: DesignConfig) {
    let c = Arc::new(cluster(2));
    let send = c.send(1, vec![2], vec![], cfg.clone());
    let c2 = Arc::clone(&c);
    let receiver = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let recv = c2.recv(2, vec![1], cfg.clone());
        let m = recv.get().await.unwrap().unwrap();
        assert_eq!(recv.data(&m), b"before");
        recv.release(m).unwrap();
        recv.get().await.unwrap_err()
    });
    let mut b = send.acquire(To::Node(2)).await.unwrap();
    b.extend_from_slice(b"before");
    send.put(b, false).unwrap();
    send.fail("the producer broke").await.unwrap();
    let err = receiver.await.unwrap();
    assert!(
        matches!(&err, TransportError::Remote { peer: 1, message } if message == "the producer broke"),
        "{err}"
    );
    // The stream is over: nothing more may be sent on it.
    assert!(send.acquire(To::Node(2)).await.is_err());
}
every_primitive!(a_late_receiver_is_waited_for_and_a_failure_reaches_it);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_comes_fails_the_sender_in_time() {
    let c = cluster(2);
    let send = c.send(
        1,
        vec![2],
        vec![],
        DesignConfig {
            timeout: Duration::from_millis(300),
            ..small()
        },
    );
    let err = send.acquire(To::Node(2)).await.unwrap_err();
    assert!(
        matches!(err, TransportError::Unreachable { peer: 2, .. }),
        "{err}"
    );
}

#[test]
fn bad_settings_are_refused() {
    let c = cluster(2);
    for bad in [
        DesignConfig {
            message_size: HEADER,
            ..small()
        },
        DesignConfig {
            credit_every: 5,
            ..small()
        },
        DesignConfig {
            send_buffers: 0,
            ..small()
        },
    ] {
        let r = DesignSend::open(
            Arc::clone(&c.carriers[0]),
            c.connector.clone(),
            bad,
            SendSpec {
                query: 1,
                exchange: 1,
                from: 1,
                destinations: vec![2],
                groups: vec![],
            },
        );
        assert!(matches!(r, Err(TransportError::Misuse(_))));
    }
}

async fn a_sender_dropped_before_finishing_fails_its_receivers(cfg: DesignConfig) {
    let c = cluster(3);
    let recv2 = c.recv(2, vec![1], cfg.clone());
    let recv3 = c.recv(3, vec![1], cfg.clone());
    let send = c.send(1, vec![2, 3], vec![], cfg.clone());
    let mut b = send.acquire(To::Node(2)).await.unwrap();
    assert!(b.extend_from_slice(b"data"));
    send.put(b, false).unwrap();
    // Node 3's stream ends properly; node 2's is cut off by the drop.
    let mut b = send.acquire(To::Node(3)).await.unwrap();
    assert!(b.extend_from_slice(b"all"));
    send.put(b, true).unwrap();
    drop(send);
    if cfg.primitive == Primitive::Read && c.carriers[0].name() == "shm" {
        // Nothing was read yet, and on shared memory a sender's buffers go
        // with it at once: both streams fail (a Read sender must be flushed
        // before it goes). A device's regions linger (`rdma::LINGER`), so
        // there the announced buffers are read as on the other primitives.
        for recv in [recv2, recv3] {
            let err = tokio::time::timeout(Duration::from_secs(2), recv.get())
                .await
                .expect("the drop is seen at once")
                .unwrap_err();
            assert!(err.to_string().contains("dropped"), "{err}");
        }
        return;
    }
    // A Read receiver reads announced buffers as they come, so over a device
    // the error marker may overtake the message before it: the stream fails
    // either way.
    let overtaken = cfg.primitive == Primitive::Read;
    match recv2.get().await {
        Ok(Some(m)) => {
            assert_eq!(recv2.data(&m), b"data");
            recv2.release(m).unwrap();
        }
        Err(e) if overtaken => {
            assert!(e.to_string().contains("dropped before it finished"), "{e}")
        }
        other => panic!("expected the message before the drop, got {other:?}"),
    }
    let err = tokio::time::timeout(Duration::from_secs(2), recv2.get())
        .await
        .expect("the drop is seen at once")
        .unwrap_err();
    assert!(
        err.to_string().contains("dropped before it finished"),
        "{err}"
    );
    let m = recv3.get().await.unwrap().unwrap();
    assert!(m.last);
    assert_eq!(recv3.data(&m), b"all");
    recv3.release(m).unwrap();
    assert!(recv3.get().await.unwrap().is_none());
}
every_primitive!(a_sender_dropped_before_finishing_fails_its_receivers);

/// Datagrams are counted: a stream whose last message says it sent more than
/// arrive fails once the timeout passes, and a datagram naming no stream is
/// dropped without harm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_that_never_arrive_fail_the_stream_in_time() {
    let c = cluster(2);
    let cfg = DesignConfig {
        primitive: Primitive::Datagram,
        timeout: Duration::from_secs(1),
        ..small()
    };
    let recv = c.recv(2, vec![1], cfg.clone());
    let send = c.send(1, vec![2], vec![], cfg);
    send.connect().await.unwrap();
    let mut b = send.acquire(To::Node(2)).await.unwrap();
    assert!(b.extend_from_slice(b"one"));
    send.put(b, false).unwrap();
    // Forged bare datagrams to the receiver's queue pair: from another queue
    // pair of node 1, a last message of the stream (ignored: not from its
    // sender's queue pair); from the sender's, one for a slot that is not a
    // source, then a last message claiming the stream sent 5.
    let forger = &c.carriers[0];
    let cq = forger.create_cq(16).unwrap();
    let other = forger.create_qp(QpKind::Ud, &cq, &cq).unwrap();
    let own = send.datagrams.as_ref().unwrap();
    let region = forger.register(96).unwrap();
    let to = recv.datagrams.as_ref().unwrap().addr();
    for (qp, at, slot, seq) in [(&other, 0, 1, 1), (own, 32, 99, 0), (own, 64, 1, 4)] {
        // SAFETY: a fresh region nothing else uses.
        unsafe { region.slice_mut(at, HEADER) }.copy_from_slice(&header(FLAG_LAST, 0, slot));
        qp.post_send(SendWr {
            id: 0,
            op: SendOp::Send { imm: Some(seq) },
            local: region.sge(at, HEADER),
            dest: Some(to),
            signaled: false,
        })
        .unwrap();
    }
    let m = recv.get().await.unwrap().unwrap();
    assert_eq!(recv.data(&m), b"one");
    assert!(!m.last);
    recv.release(m).unwrap();
    let start = std::time::Instant::now();
    let err = recv.get().await.unwrap_err();
    assert!(
        err.to_string().contains("2 of its 5 messages arrived"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn datagram_designs_refuse_messages_larger_than_a_datagram() {
    let c = cluster(2);
    let cfg = DesignConfig {
        primitive: Primitive::Datagram,
        message_size: UD_MTU + 1,
        ..small()
    };
    let err = c.try_send(1, vec![2], vec![], cfg).err().expect("refused");
    assert!(
        err.to_string().contains("datagrams of at most 4096"),
        "{err}"
    );
}

#[test]
fn destinations_resolve_as_for_tcp_endpoints() {
    let c = cluster(3);
    let open = |destinations, groups| c.try_send(1, destinations, groups, small());
    let err = |r: Result<DesignSend, TransportError>| r.err().expect("refused").to_string();
    assert!(err(open(vec![2, 2], vec![])).contains("twice"));
    assert!(err(open(vec![2, 3, 2], vec![])).contains("twice"));
    assert!(err(open(vec![2], vec![vec![3]])).contains("member 3 is not a destination"));
    assert_eq!(open(vec![2, 3], vec![]).unwrap().destinations(), &[2, 3]);
}

/// Write-backs only once a whole window is released, and a reservation
/// dropped unsent: its credit is taken again (it is not waited for from the
/// receiver, who has not released enough to write one back), and a wide
/// window's free queue (Write) names every buffer right.
async fn write_backs_at_the_window_and_dropped_reservations(cfg: DesignConfig) {
    let cfg = DesignConfig {
        window: 48,
        credit_every: 48,
        send_buffers: 8,
        timeout: Duration::from_secs(2),
        ..cfg
    };
    let c = cluster(2);
    let send = c.send(1, vec![2], vec![], cfg.clone());
    let recv = c.recv(2, vec![1], cfg.clone());
    const MESSAGES: usize = 500;
    let sending = async {
        for seq in 0..MESSAGES {
            if seq % 7 == 3 {
                drop(send.acquire(To::Node(2)).await?);
            }
            let mut b = send.acquire(To::Node(2)).await?;
            assert!(b.extend_from_slice(&body(1, 2, seq)));
            send.put(b, seq + 1 == MESSAGES)?;
        }
        send.flushed().await
    };
    let receiving = async {
        let mut next = 0;
        while let Some(m) = recv.get().await? {
            assert_eq!(recv.data(&m), &body(1, 2, next)[..], "message {next}");
            recv.release(m)?;
            next += 1;
        }
        Ok::<_, TransportError>(next)
    };
    let (s, r) = tokio::join!(sending, receiving);
    s.unwrap();
    assert_eq!(r.unwrap(), MESSAGES);
}
every_primitive!(write_backs_at_the_window_and_dropped_reservations);

/// Several tasks share one sending endpoint (SE) and two consume one
/// receiving endpoint: every message arrives once and each stream is checked
/// in the order its messages completed.
async fn tasks_share_one_endpoint_on_each_side(cfg: DesignConfig) {
    const TASKS: usize = 3;
    const EACH: usize = 150;
    let c = cluster(3);
    let send = Arc::new(c.send(1, vec![2, 3], vec![], cfg.clone()));
    let recv: Vec<Arc<DesignReceive>> = [2, 3]
        .into_iter()
        .map(|n| Arc::new(c.recv(n, vec![1], cfg.clone())))
        .collect();
    let senders: Vec<_> = (0..TASKS)
        .map(|k| {
            let send = Arc::clone(&send);
            tokio::spawn(async move {
                for i in 0..EACH {
                    let to = if i % 2 == 0 { To::Node(2) } else { To::All };
                    let mut b = send.acquire(to).await?;
                    let tag = ((k * EACH + i) as u32).to_le_bytes();
                    assert!(b.extend_from_slice(&tag));
                    send.put(b, false)?;
                }
                Ok::<_, TransportError>(())
            })
        })
        .collect();
    let consumers: Vec<_> = recv
        .iter()
        .flat_map(|r| [Arc::clone(r), Arc::clone(r)])
        .map(|r| {
            tokio::spawn(async move {
                let mut seen = vec![];
                while let Some(m) = r.get().await? {
                    let d = r.data(&m);
                    seen.push(u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as usize);
                    r.release(m)?;
                }
                Ok::<_, TransportError>(seen)
            })
        })
        .collect();
    for s in senders {
        s.await.unwrap().unwrap();
    }
    send.finish().await.unwrap();
    send.flushed().await.unwrap();
    let mut got: Vec<Vec<usize>> = vec![vec![], vec![]];
    for (i, t) in consumers.into_iter().enumerate() {
        got[i / 2].extend(t.await.unwrap().unwrap());
    }
    for g in &mut got {
        g.sort_unstable();
    }
    let all: Vec<usize> = (0..TASKS * EACH).collect();
    let odd: Vec<usize> = all.iter().copied().filter(|m| m % EACH % 2 == 1).collect();
    assert_eq!(got[0], all, "node 2 gets every message once");
    assert_eq!(got[1], odd, "node 3 gets the broadcasts once");
}
every_primitive!(tasks_share_one_endpoint_on_each_side);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_that_disagree_on_their_settings_do_not_connect() {
    let c = cluster(2);
    let send = c.send(1, vec![2], vec![], small());
    let _recv = c.recv(
        2,
        vec![1],
        DesignConfig {
            window: 6,
            ..small()
        },
    );
    let err = send.acquire(To::Node(2)).await.unwrap_err();
    assert!(err.to_string().contains("settings"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_groups_and_empty_messages_are_refused() {
    let c = cluster(2);
    let send = c.send(1, vec![2], vec![vec![]], small());
    let _recv = c.recv(2, vec![1], small());
    let err = send.acquire(To::Group(0)).await.unwrap_err();
    assert!(err.to_string().contains("no destination"), "{err}");
    let b = send.acquire(To::Node(2)).await.unwrap();
    assert!(send.put(b, false).is_err(), "an empty message");
    // The refused reservation gave its buffer and credit back: the window's
    // worth still goes.
    for _ in 0..small().window {
        let mut b = tokio::time::timeout(Duration::from_secs(2), send.acquire(To::Node(2)))
            .await
            .expect("credit within the window")
            .unwrap();
        assert!(b.extend_from_slice(b"x"));
        send.put(b, false).unwrap();
    }
}

/// A receiving endpoint that goes mid-stream fails its sender in time, and
/// the error names the receiver's node.
async fn a_receiver_dropped_mid_stream_fails_its_sender_naming_it(cfg: DesignConfig) {
    let cfg = DesignConfig {
        timeout: Duration::from_secs(1),
        ..cfg
    };
    let c = cluster(2);
    let send = c.send(1, vec![2], vec![], cfg.clone());
    let recv = c.recv(2, vec![1], cfg.clone());
    let mut b = send.acquire(To::Node(2)).await.unwrap();
    assert!(b.extend_from_slice(b"first"));
    send.put(b, false).unwrap();
    let m = recv.get().await.unwrap().unwrap();
    recv.release(m).unwrap();
    drop(recv);
    let start = std::time::Instant::now();
    let err = loop {
        let step = async {
            let mut b = send.acquire(To::Node(2)).await?;
            assert!(b.extend_from_slice(b"more"));
            send.put(b, false)
        };
        if let Err(e) = step.await {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the sender never noticed"
        );
    };
    assert!(
        matches!(
            err,
            TransportError::PeerLost { peer: 2, .. } | TransportError::Unreachable { peer: 2, .. }
        ),
        "{err:?}"
    );
}
every_primitive!(a_receiver_dropped_mid_stream_fails_its_sender_naming_it);

/// The repartition above with adaptive windows and each endpoint's own pool
/// (nothing to lend beyond it: windows only shrink and regrow).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_endpoints_with_their_own_pools_repartition_in_order() {
    for primitive in [Primitive::Send, Primitive::Datagram] {
        every_node_repartitions_to_every_other_in_order(DesignConfig {
            primitive,
            adaptive: Some(8),
            ..small()
        })
        .await;
    }
}

fn pooled_recv(
    c: &Cluster,
    node: u32,
    exchange: u32,
    sources: Vec<NodeId>,
    cfg: DesignConfig,
    pool: &Arc<BufferPool>,
) -> Result<DesignReceive, TransportError> {
    DesignReceive::open_pooled(
        Arc::clone(&c.carriers[node as usize - 1]),
        c.connector.clone(),
        cfg,
        ReceiveSpec {
            query: 1,
            exchange,
            sources: sources.into_iter().map(|s| (s, s)).collect(),
        },
        Arc::clone(pool),
    )
}

/// Adaptive buffers (the paper's section 6.2): two senders with a window of
/// two wait for credit, so the receiver lends their streams buffers from the
/// node's pool; then a slow consumer finds messages piling up and takes
/// buffers out of circulation. Every message arrives once, in order, and the
/// pool has every buffer back once the endpoint is gone.
async fn adaptive_windows_grow_for_starved_senders_and_shrink_for_a_slow_consumer(
    primitive: Primitive,
) {
    const PHASE: usize = 150;
    let c = cluster(3);
    let cfg = DesignConfig {
        primitive,
        window: 2,
        credit_every: 1,
        adaptive: Some(12),
        ..small()
    };
    let pool = BufferPool::register(&*c.carriers[2], 40, cfg.message_size).unwrap();
    let recv = pooled_recv(&c, 3, 1, vec![1, 2], cfg.clone(), &pool).unwrap();
    assert_eq!(pool.in_use(), 6, "a window and a reserve per stream");
    let sends: Vec<DesignSend> = (1..=2)
        .map(|n| c.send(n, vec![3], vec![], cfg.clone()))
        .collect();
    let sending = futures::future::join_all(sends.iter().enumerate().map(|(k, send)| {
        let me = k as u32 + 1;
        async move {
            for seq in 0..2 * PHASE {
                let mut b = send.acquire(To::Node(3)).await?;
                assert!(b.extend_from_slice(&body(me, 3, seq)));
                send.put(b, seq + 1 == 2 * PHASE)?;
            }
            send.flushed().await
        }
    }));
    let receiving = async {
        let mut next = [0usize; 3];
        let mut after_fast = None;
        while let Some(r) = recv.get().await? {
            let s = r.node as usize;
            assert_eq!(recv.data(&r), &body(r.node, 3, next[s])[..]);
            next[s] += 1;
            recv.release(r)?;
            if next[1] + next[2] == 2 * PHASE && after_fast.is_none() {
                after_fast = Some((recv.lent(), pool.peak()));
            }
            if next[1] + next[2] > 2 * PHASE {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        Ok::<_, TransportError>((next, after_fast.expect("both phases ran")))
    };
    let (sent, received) = tokio::join!(sending, receiving);
    for s in sent {
        s.unwrap();
    }
    let (next, (lent, peak)) = received.unwrap();
    assert_eq!(next[1..], [2 * PHASE, 2 * PHASE]);
    assert!(lent > 0, "no buffer lent to senders waiting for credit");
    assert!(peak > 6, "the windows never grew (peak {peak})");
    assert!(recv.retired() > 0, "a slow consumer kept every buffer");
    assert!(recv.lent() >= lent);
    drop(recv);
    assert_eq!(pool.in_use(), 0, "buffers not given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_windows_move_over_send() {
    adaptive_windows_grow_for_starved_senders_and_shrink_for_a_slow_consumer(Primitive::Send).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_windows_move_over_datagrams() {
    adaptive_windows_grow_for_starved_senders_and_shrink_for_a_slow_consumer(Primitive::Datagram)
        .await
}

/// Endpoints of one node share its pool: one that does not fit is refused
/// naming what is free, and fits once an endpoint whose streams ended is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_share_their_nodes_pool_and_give_it_back() {
    let c = cluster(3);
    let cfg = DesignConfig {
        window: 2,
        ..small()
    };
    let pool = BufferPool::register(&*c.carriers[1], 6, cfg.message_size).unwrap();
    let first = pooled_recv(&c, 2, 1, vec![1], cfg.clone(), &pool).unwrap();
    let _second = pooled_recv(&c, 2, 2, vec![3], cfg.clone(), &pool).unwrap();
    assert_eq!(pool.in_use(), 6);
    let err = pooled_recv(&c, 2, 3, vec![1], cfg.clone(), &pool)
        .err()
        .expect("no buffers left");
    assert!(err.to_string().contains("0 of its 6 buffers free"), "{err}");
    let send = c.send(1, vec![2], vec![], cfg.clone());
    let mut b = send.acquire(To::Node(2)).await.unwrap();
    assert!(b.extend_from_slice(b"only"));
    send.put(b, true).unwrap();
    let m = first.get().await.unwrap().unwrap();
    assert!(m.last);
    assert_eq!(first.data(&m), b"only");
    first.release(m).unwrap();
    assert!(first.get().await.unwrap().is_none());
    drop(first);
    assert_eq!(pool.in_use(), 3);
    pooled_recv(&c, 2, 3, vec![1], cfg, &pool).expect("fits again");
    // Pools serve the send/receive designs of their own node and size.
    for (primitive, node) in [(Primitive::Read, 2), (Primitive::Send, 1)] {
        let cfg = DesignConfig {
            primitive,
            window: 2,
            ..small()
        };
        let err = pooled_recv(&c, node, 4, vec![3], cfg, &pool)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("shared buffer pool"), "{err}");
    }
    let err = DesignReceive::open(
        Arc::clone(&c.carriers[1]),
        c.connector.clone(),
        DesignConfig {
            primitive: Primitive::Write,
            adaptive: Some(8),
            ..small()
        },
        ReceiveSpec {
            query: 1,
            exchange: 5,
            sources: vec![(1, 1)],
        },
    )
    .err()
    .expect("refused");
    assert!(err.to_string().contains("send/receive designs"), "{err}");
}

/// An adaptive window whose credit writes would overflow the sender's
/// notification receives is refused when the sender opens, naming the depth.
#[test]
fn an_adaptive_limit_beyond_the_notification_receives_is_refused() {
    let c = cluster(2);
    let depth = c.carriers[0].recv_depth();
    let cfg = DesignConfig {
        credit_every: 1,
        adaptive: Some(depth as u32 - 1),
        ..small()
    };
    let err = c.try_send(1, vec![2], vec![], cfg).err().expect("refused");
    assert!(
        err.to_string()
            .contains(&format!("receive depth of {depth}")),
        "{err}"
    );
}
