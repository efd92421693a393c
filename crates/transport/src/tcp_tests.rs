//! Tests of the TCP backend through the public API, and of every kind of bad
//! input a peer can send.

use crate::auth::{self, Challenge, Hello, Role, Transcript};
use crate::bench::{Pattern, ShuffleSpec, run_shuffle};
use crate::frame::{
    Control, FLAG_LAST, FrameHeader, FrameKind, HEADER_LEN, StreamKey, encode_frame,
};
use crate::mux::{read_handshake, write_frame};
use crate::{
    NodeId, ReceiveEndpoint, ReceiveSpec, Schedule, SendSpec, TcpTransport, To, Transport,
    TransportConfig, TransportError,
};
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Everything logged by any test of this binary (the multiplexer logs from its own
/// thread, so the subscriber must be global).
fn log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    let buffer = LOG.get_or_init(|| Mutex::new(vec![]));
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        struct W;
        impl Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                log().lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sub = tracing_subscriber::fmt()
            .with_writer(|| W)
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
    });
    buffer
}

fn logged(needle: &str) -> bool {
    String::from_utf8_lossy(&log().lock().unwrap()).contains(needle)
}

fn small_config() -> TransportConfig {
    TransportConfig {
        message_size: 64 * 1024,
        send_buffers: 8,
        recv_buffers: 8,
        window: 4,
        connect_timeout: Duration::from_secs(3),
        ..Default::default()
    }
}

/// Nodes `ids`, all connected to each other.
async fn cluster(ids: &[NodeId], config: TransportConfig) -> Vec<TcpTransport> {
    log();
    crate::loopback_cluster(ids, config).await.unwrap()
}

async fn wait_until(f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached in 5 s");
}

fn send_spec(query: u64, from: u32, dests: &[NodeId]) -> SendSpec {
    SendSpec {
        query,
        exchange: 1,
        from,
        destinations: dests.to_vec(),
        groups: vec![],
    }
}

fn recv_spec(query: u64, sources: &[(u32, NodeId)]) -> ReceiveSpec {
    ReceiveSpec {
        query,
        exchange: 1,
        sources: sources.to_vec(),
    }
}

async fn put(ep: &crate::SendEndpoint, to: To, bytes: &[u8], last: bool) {
    let mut b = ep.acquire(to).await.unwrap();
    b.write_all(bytes).unwrap();
    ep.put(b, last).unwrap();
}

/// Everything an endpoint delivers until its end: (slot, bytes) in arrival order.
async fn drain(ep: &ReceiveEndpoint) -> Result<Vec<(u32, Vec<u8>)>, TransportError> {
    let mut out = vec![];
    while let Some(r) = ep.get().await? {
        if !r.data().is_empty() {
            out.push((r.slot, r.data().to_vec()));
        }
        ep.release(r);
    }
    Ok(out)
}

#[tokio::test]
async fn messages_arrive_in_order_remote_and_local_and_termination_is_exact() {
    let n = cluster(&[1, 2], small_config()).await;
    // Node 1's slot 0 sends to node 2 and to itself; node 2's slot 1 sends to node 2.
    let a = n[0].open_send(send_spec(1, 0, &[1, 2])).unwrap();
    let b = n[1].open_send(send_spec(1, 1, &[2])).unwrap();
    let at2 = n[1].open_receive(recv_spec(1, &[(0, 1), (1, 2)])).unwrap();
    let at1 = n[0].open_receive(recv_spec(1, &[(0, 1)])).unwrap();
    let producer = async {
        for i in 0..50u32 {
            put(&a, To::Node(2), &i.to_le_bytes(), false).await;
            put(&a, To::Node(1), &i.to_le_bytes(), false).await;
        }
        a.finish();
    };
    let (_, got2, got1) = tokio::join!(producer, drain(&at2), async {
        // Node 2's own stream ends only late: the endpoint must wait for it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        put(&b, To::Node(2), b"late", true).await;
        drain(&at1).await
    });
    let got2 = got2.unwrap();
    let from1: Vec<u32> = got2
        .iter()
        .filter(|(s, _)| *s == 0)
        .map(|(_, d)| u32::from_le_bytes(d[..4].try_into().unwrap()))
        .collect();
    assert_eq!(from1, (0..50).collect::<Vec<_>>());
    assert!(got2.contains(&(1, b"late".to_vec())));
    assert_eq!(got2.len(), 51);
    assert_eq!(got1.unwrap().len(), 50);
    assert_eq!(
        at2.get().await.unwrap().map(|r| r.slot),
        None,
        "stays ended"
    );
    // Everything went back to the pools.
    a.flushed().await;
    wait_until(|| n[0].stats().send_pool.in_use == 0 && n[1].stats().recv_pool.in_use == 0).await;
}

#[tokio::test]
async fn a_broadcast_is_one_buffer_for_every_destination() {
    let n = cluster(&[1, 2, 3], small_config()).await;
    let ep = n[0].open_send(send_spec(1, 0, &[1, 2, 3])).unwrap();
    let receivers: Vec<_> = n
        .iter()
        .map(|t| t.open_receive(recv_spec(1, &[(0, 1)])).unwrap())
        .collect();
    let mut b = ep.acquire(To::All).await.unwrap();
    b.write_all(&[7u8; 40_000]).unwrap();
    let ptr = b.hub_bytes().unwrap().as_ptr();
    ep.put(b, true).unwrap();
    // The local destination gets the very buffer that was filled: no copy.
    let local = receivers[0].get().await.unwrap().unwrap();
    assert_eq!(local.data().as_ptr(), ptr);
    drop(local);
    for r in &receivers[1..] {
        let got = drain(r).await.unwrap();
        assert_eq!(got, vec![(0, vec![7u8; 40_000])]);
    }
    ep.flushed().await;
    let s = n[0].stats();
    assert_eq!(s.send_pool.high_water, 1, "one buffer, not one per peer");
    assert_eq!(ep.stats().messages, 1);
    for p in [2, 3] {
        assert_eq!(s.peer(p).unwrap().messages_sent, 1);
    }
}

#[tokio::test]
async fn transmission_groups_reach_exactly_their_members() {
    let n = cluster(&[1, 2, 3, 4], small_config()).await;
    let mut spec = send_spec(1, 0, &[2, 3, 4]);
    spec.groups = vec![vec![2, 3], vec![4]];
    let ep = n[0].open_send(spec).unwrap();
    let recv: Vec<_> = n[1..]
        .iter()
        .map(|t| t.open_receive(recv_spec(1, &[(0, 1)])).unwrap())
        .collect();
    put(&ep, To::Group(0), b"to two and three", false).await;
    put(&ep, To::Group(1), b"to four", false).await;
    ep.finish();
    let got: Vec<_> = futures_join(recv.iter().map(drain)).await;
    assert_eq!(
        got[0].as_ref().unwrap(),
        &vec![(0, b"to two and three".to_vec())]
    );
    assert_eq!(
        got[1].as_ref().unwrap(),
        &vec![(0, b"to two and three".to_vec())]
    );
    assert_eq!(got[2].as_ref().unwrap(), &vec![(0, b"to four".to_vec())]);
    assert!(matches!(
        ep.acquire(To::Group(5)).await,
        Err(TransportError::Misuse(_))
    ));
}

async fn futures_join<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = vec![];
    for f in fs.collect::<Vec<_>>() {
        out.push(f.await);
    }
    out
}

#[tokio::test]
async fn credits_bound_what_a_slow_consumer_buffers() {
    let config = small_config();
    let window = config.window as usize;
    let n = cluster(&[1, 2], config).await;
    let ep = Arc::new(n[0].open_send(send_spec(1, 0, &[2])).unwrap());
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (ep2, sent2) = (Arc::clone(&ep), Arc::clone(&sent));
    let producer = tokio::spawn(async move {
        for _ in 0..100 {
            put(&ep2, To::Node(2), &[1u8; 30_000], false).await;
            sent2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Nobody consumes: the producer is stopped by its credits, and node 2 holds at most
    // the window of messages.
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), window);
    assert!(n[1].stats().recv_pool.in_use <= window);
    let rx = n[1].open_receive(recv_spec(1, &[(0, 1)])).unwrap();
    for _ in 0..100 {
        rx.release(rx.get().await.unwrap().unwrap());
    }
    producer.await.unwrap();
    assert!(ep.stats().credit_wait > Duration::from_millis(200));
    assert!(n[0].stats().peer(2).unwrap().credit_wait > Duration::from_millis(200));
}

/// Streams to this node whose consumers read nothing yet (a hash join reading its build
/// side before its probe side) fill their windows. That must not take the node's send
/// buffers: 8 buffers, three such streams of 4 credits each, and a remote stream and a
/// local one must still send. (With local messages leased until read, the third stream
/// took the last buffers and every sender of the node waited: a Flow-Join query hang.)
#[tokio::test]
async fn unread_local_streams_do_not_take_the_nodes_send_buffers() {
    let config = small_config();
    let (window, buffers) = (config.window as usize, config.send_buffers);
    let n = cluster(&[1, 2], config).await;
    let stalled: Vec<_> = (0..3u32)
        .map(|q| n[0].open_send(send_spec(10 + q as u64, 0, &[1])).unwrap())
        .collect();
    for ep in &stalled {
        for _ in 0..window {
            tokio::time::timeout(
                Duration::from_secs(1),
                put(ep, To::Node(1), &[7u8; 1000], false),
            )
            .await
            .expect("a local stream with credits sends at once");
        }
    }
    assert!(3 * window > buffers, "the streams' windows exceed the pool");
    assert_eq!(
        n[0].stats().send_pool.in_use,
        0,
        "queued locally, not leased"
    );
    // Another exchange, remote and local, goes on.
    let ep = n[0].open_send(send_spec(20, 0, &[1, 2])).unwrap();
    let at2 = n[1].open_receive(recv_spec(20, &[(0, 1)])).unwrap();
    let at1 = n[0].open_receive(recv_spec(20, &[(0, 1)])).unwrap();
    let producer = async {
        for i in 0..20u8 {
            put(&ep, To::All, &[i; 1000], false).await;
        }
        ep.finish();
    };
    let (_, got2, got1) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(producer, drain(&at2), drain(&at1))
    })
    .await
    .expect("no sender waits for the unread streams");
    assert_eq!((got2.unwrap().len(), got1.unwrap().len()), (20, 20));
    // The unread messages arrive intact once read, each stream in order.
    for (q, _) in stalled.iter().enumerate() {
        let rx = n[0]
            .open_receive(recv_spec(10 + q as u64, &[(0, 1)]))
            .unwrap();
        for _ in 0..window {
            let r = rx.get().await.unwrap().unwrap();
            assert_eq!(r.data(), &[7u8; 1000][..]);
            rx.release(r);
        }
    }
}

#[tokio::test]
async fn consumers_may_keep_what_they_receive() {
    // Like a hash join's build side: every message's bytes are kept after release. The
    // receive pool replaces the buffers; nothing stalls.
    let n = cluster(&[1, 2], small_config()).await;
    let ep = n[0].open_send(send_spec(1, 0, &[2])).unwrap();
    let rx = n[1].open_receive(recv_spec(1, &[(0, 1)])).unwrap();
    let producer = async {
        for i in 0..40u8 {
            put(&ep, To::Node(2), &[i; 60_000], false).await;
        }
        ep.finish();
    };
    let consumer = async {
        let mut kept = vec![];
        while let Some(r) = rx.get().await.unwrap() {
            kept.push(r.bytes());
            rx.release(r);
        }
        kept
    };
    let (_, kept) = tokio::join!(producer, consumer);
    let kept: Vec<_> = kept.into_iter().filter(|b| !b.is_empty()).collect();
    assert_eq!(kept.len(), 40);
    assert!(
        kept.iter()
            .enumerate()
            .all(|(i, b)| b.iter().all(|x| *x == i as u8))
    );
    let s = n[1].stats().recv_pool;
    assert_eq!(s.in_use, 0);
    assert!(s.allocated >= 32, "detached buffers were replaced: {s:?}");
}

#[tokio::test]
async fn oversize_messages_are_delivered_and_counted() {
    let n = cluster(&[1, 2], small_config()).await;
    let ep = n[0].open_send(send_spec(1, 0, &[2])).unwrap();
    let rx = n[1].open_receive(recv_spec(1, &[(0, 1)])).unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    put(&ep, To::Node(2), &big, true).await;
    assert_eq!(drain(&rx).await.unwrap(), vec![(0, big)]);
    assert_eq!(ep.stats().oversize, 1);
    assert_eq!(n[0].stats().send_pool.oversize, 1);
    assert_eq!(n[1].stats().oversize_received, 1);
}

#[tokio::test]
async fn sender_errors_and_cancellation_reach_the_receivers() {
    let n = cluster(&[1, 2], small_config()).await;
    let ep = n[0].open_send(send_spec(1, 0, &[1, 2])).unwrap();
    let rx = n[1].open_receive(recv_spec(1, &[(0, 1)])).unwrap();
    let local = n[0].open_receive(recv_spec(1, &[(0, 1)])).unwrap();
    put(&ep, To::All, b"before", false).await;
    ep.fail("disk on fire");
    for r in [&rx, &local] {
        assert_eq!(r.get().await.unwrap().unwrap().data(), b"before");
        let e = r.get().await.unwrap_err();
        assert_eq!(
            e,
            TransportError::Remote {
                peer: 1,
                message: "disk on fire".into()
            }
        );
        assert!(r.get().await.is_err(), "the error sticks");
    }
    // A sender dropped before finishing (its task was cancelled).
    let ep = n[0].open_send(send_spec(2, 0, &[2])).unwrap();
    let rx = n[1].open_receive(recv_spec(2, &[(0, 1)])).unwrap();
    drop(ep);
    let e = rx.get().await.unwrap_err();
    assert!(e.to_string().contains("cancelled"), "{e}");
}

#[tokio::test]
async fn a_lost_peer_fails_every_endpoint_that_involves_it() {
    let n = cluster(&[1, 2, 3], small_config()).await;
    let rx = n[1].open_receive(recv_spec(1, &[(0, 1), (1, 3)])).unwrap();
    let ep = n[1].open_send(send_spec(1, 5, &[1])).unwrap();
    n[0].shutdown();
    let e = rx.get().await.unwrap_err();
    assert!(matches!(e, TransportError::PeerLost { peer: 1, .. }), "{e}");
    assert!(e.to_string().contains("worker 1"), "{e}");
    wait_until(|| n[1].is_lost(1)).await;
    // Credits of the stream to node 1 were closed: the sender fails instead of waiting.
    for _ in 0..5 {
        if let Err(e) = ep.acquire(To::Node(1)).await {
            assert!(e.to_string().contains("worker 1"), "{e}");
            return;
        }
    }
    panic!("sending to a lost peer kept working");
}

#[tokio::test]
async fn releasing_a_query_cancels_its_endpoints_and_drops_late_frames() {
    let n = cluster(&[1, 2], small_config()).await;
    let ep = n[0].open_send(send_spec(7, 0, &[2])).unwrap();
    let rx = n[1].open_receive(recv_spec(7, &[(0, 1)])).unwrap();
    n[1].release_query(7);
    assert!(matches!(rx.get().await, Err(TransportError::Cancelled(_))));
    // Late frames of the released query are dropped silently, not a protocol error.
    put(&ep, To::Node(2), b"late", true).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!n[1].is_lost(1) && !n[0].is_lost(2));
    n[0].release_query(7);
    assert!(matches!(
        ep.acquire(To::Node(2)).await,
        Err(TransportError::Misuse(_) | TransportError::Cancelled(_))
    ));
    assert!(matches!(
        n[1].open_receive(recv_spec(7, &[(0, 1)])),
        Err(TransportError::Cancelled(_))
    ));
}

#[tokio::test]
async fn an_unreachable_peer_fails_after_the_connect_timeout() {
    log();
    let config = TransportConfig {
        connect_timeout: Duration::from_millis(300),
        ..small_config()
    };
    let t = TcpTransport::bind(1, "127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap();
    // Node 9 is in the table but nothing listens there (and 9 > 1, so node 1 dials).
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    t.set_peers(&[(1, t.local_addr()), (9, addr)].into());
    let ep = t.open_send(send_spec(1, 0, &[9])).unwrap();
    let e = ep.acquire(To::Node(9)).await.unwrap_err();
    assert!(e.to_string().contains("worker 9"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Bad input. The target is node 5; the bad peer claims to be node 1 (in the target's
// table, and lower, so the target does not dial it). After each case, the endpoint
// expecting node 1 fails naming it and the cause, node 1 is marked lost, the log names
// node and address, and the target still serves other peers.

const SECRET: &str = "gyre";

async fn target() -> (TcpTransport, ReceiveEndpoint) {
    log();
    let t = TcpTransport::bind(5, "127.0.0.1:0".parse().unwrap(), small_config())
        .await
        .unwrap();
    t.set_peers(&[(1, "127.0.0.1:9".parse().unwrap()), (5, t.local_addr())].into());
    let rx = t.open_receive(recv_spec(1, &[(0, 1)])).unwrap();
    (t, rx)
}

/// A raw connection to `t` that completed the handshake as node `claimed`.
async fn raw_peer(t: &TcpTransport, claimed: NodeId, secret: &str) -> Result<TcpStream, String> {
    let mut sock = TcpStream::connect(t.local_addr()).await.unwrap();
    let hello = Hello {
        node: claimed,
        window: 4,
        nonce: auth::nonce(),
        share: crate::seal::KeyShare::new().unwrap().public(),
        seal: false,
    };
    write_frame(&mut sock, FrameKind::Hello, 0, &hello.encode())
        .await
        .unwrap();
    let (kind, _, p) = read_handshake(&mut sock).await?;
    let ch = Challenge::decode(kind, &p).map_err(|e| e.to_string())?;
    let tr = Transcript {
        dialer: hello,
        acceptor: ch.hello,
    };
    write_frame(
        &mut sock,
        FrameKind::Proof,
        0,
        &tr.prove(secret.as_bytes(), Role::Dialer),
    )
    .await
    .unwrap();
    let (kind, _, _) = read_handshake(&mut sock).await?;
    assert_eq!(kind, FrameKind::Welcome);
    Ok(sock)
}

fn key() -> StreamKey {
    StreamKey {
        query: 1,
        exchange: 1,
        from: 0,
        to: 5,
    }
}

/// Sends `bytes` as node 1 and checks the target disconnects it for `cause`.
async fn expect_disconnect(bytes: Vec<u8>, close_after: bool, cause: &str) {
    let (t, rx) = target().await;
    let mut sock = raw_peer(&t, 1, SECRET).await.unwrap();
    wait_until(|| t.is_connected(1)).await;
    sock.write_all(&bytes).await.unwrap();
    if close_after {
        sock.shutdown().await.unwrap();
    }
    let e = tokio::time::timeout(Duration::from_secs(5), async {
        // Messages that arrived before the violation are delivered first.
        loop {
            match rx.get().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended instead of failing"),
                Err(e) => break e,
            }
        }
    })
    .await
    .expect("the endpoint must fail, not hang");
    let text = e.to_string();
    assert!(
        matches!(e, TransportError::PeerLost { peer: 1, .. }),
        "{text}"
    );
    assert!(text.contains("worker 1") && text.contains(cause), "{text}");
    assert!(t.is_lost(1));
    assert!(t.stats().protocol_errors >= 1);
    let local = sock.local_addr().unwrap();
    wait_until(|| logged(&format!("disconnecting worker 1 at {local}"))).await;
    assert!(logged(cause));
    // The target is still alive for others.
    let other = cluster(&[6], small_config()).await;
    let mut peers: HashMap<NodeId, SocketAddr> = [(6, other[0].local_addr())].into();
    peers.insert(5, t.local_addr());
    t.set_peers(&peers);
    other[0].set_peers(&peers);
    wait_until(|| t.is_connected(6)).await;
}

fn data_frame(key: StreamKey, body: &[u8], flags: u8) -> Vec<u8> {
    let mut payload = key.to_bytes().to_vec();
    payload.extend_from_slice(body);
    encode_frame(FrameKind::Data, flags, &payload)
}

#[tokio::test]
async fn wrong_magic_disconnects() {
    let mut f = data_frame(key(), b"rows", 0);
    f[..4].copy_from_slice(b"HTTP");
    expect_disconnect(f, false, "bad frame magic").await;
}

#[tokio::test]
async fn wrong_version_disconnects() {
    let mut f = data_frame(key(), b"rows", 0);
    f[4] = 1;
    expect_disconnect(f, false, "unsupported frame version 1").await;
}

#[tokio::test]
async fn unknown_frame_kind_disconnects() {
    let mut f = data_frame(key(), b"rows", 0);
    f[5] = 77;
    expect_disconnect(f, false, "unknown frame kind 77").await;
}

#[tokio::test]
async fn bad_checksum_disconnects() {
    let mut f = data_frame(key(), b"rows", 0);
    f[12] ^= 0xff;
    expect_disconnect(f, false, "checksum mismatch").await;
}

#[tokio::test]
async fn truncated_payload_disconnects() {
    let f = data_frame(key(), &[0u8; 1000], 0);
    expect_disconnect(f[..600].to_vec(), true, "truncated frame").await;
}

#[tokio::test]
async fn wrong_length_for_the_frame_kind_disconnects() {
    // A credit frame must carry exactly a key and a count.
    let payload = [0u8; 7];
    let f = encode_frame(FrameKind::Credit, 0, &payload);
    expect_disconnect(f, false, "Credit frame with a payload of 7 bytes").await;
}

#[tokio::test]
async fn a_frame_larger_than_the_maximum_disconnects_before_allocating() {
    let h = FrameHeader::encode(FrameKind::Data, 0, u32::MAX as usize, 0);
    expect_disconnect(h.to_vec(), false, "exceeds the maximum").await;
}

#[tokio::test]
async fn a_handshake_frame_after_the_handshake_disconnects() {
    let f = encode_frame(FrameKind::Hello, 0, &[]);
    expect_disconnect(f, false, "unexpected Hello frame").await;
}

#[tokio::test]
async fn a_stream_addressed_to_another_node_disconnects() {
    let mut k = key();
    k.to = 6;
    expect_disconnect(data_frame(k, b"rows", 0), false, "addressed to node 6").await;
}

#[tokio::test]
async fn sending_on_a_stream_that_belongs_to_another_node_disconnects() {
    // Node 5 expects exchange 2's slot 0 from node 3; node 1 tries to inject rows there.
    let (t, _rx) = target().await;
    let rx3 = t
        .open_receive(ReceiveSpec {
            query: 1,
            exchange: 2,
            sources: vec![(0, 3)],
        })
        .unwrap();
    let mut sock = raw_peer(&t, 1, SECRET).await.unwrap();
    wait_until(|| t.is_connected(1)).await;
    let mut k = key();
    k.exchange = 2;
    sock.write_all(&data_frame(k, b"injected rows", FLAG_LAST))
        .await
        .unwrap();
    wait_until(|| t.is_lost(1)).await;
    assert!(logged("which belongs to worker 3"));
    // Node 3's endpoint got nothing injected.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rx3.get())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn credit_for_a_stream_never_opened_disconnects() {
    let (k, n) = (key(), 1);
    let (kind, flags, payload) = Control::Credit(k, n).encode();
    expect_disconnect(encode_frame(kind, flags, &payload), false, "never opened").await;
}

#[tokio::test]
async fn exceeding_the_credits_disconnects() {
    let mut bytes = vec![];
    for _ in 0..5 {
        bytes.extend(data_frame(key(), b"x", 0)); // the window is 4
    }
    expect_disconnect(bytes, false, "flow control violated").await;
}

#[tokio::test]
async fn a_stranger_with_the_wrong_secret_is_rejected_and_injects_nothing() {
    let (t, rx) = target().await;
    let err = raw_peer(&t, 1, "guessed").await.unwrap_err();
    assert!(err.contains("closed"), "{err}");
    wait_until(|| logged("failed the handshake: wrong cluster secret")).await;
    assert!(logged("worker 1 (claimed)"));
    assert!(t.stats().protocol_errors >= 1);
    // An unauthenticated stranger cannot make the real node 1 count as lost.
    assert!(!t.is_lost(1));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rx.get())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn garbage_instead_of_a_hello_is_rejected() {
    let (t, _rx) = target().await;
    let mut sock = TcpStream::connect(t.local_addr()).await.unwrap();
    sock.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::io::AsyncReadExt::read(&mut sock, &mut buf)
        .await
        .unwrap_or(0);
    assert_eq!(n, 0, "the connection is closed without an answer");
    wait_until(|| logged("rejected data connection from an unknown node")).await;
}

/// Nodes 1 (the dialer) and 2, set up as `dialer` and `acceptor` say; returns them and
/// the error node 1's receive endpoint gets from node 2.
async fn refused_pair(
    dialer: TransportConfig,
    acceptor: TransportConfig,
) -> (TcpTransport, TcpTransport, TransportError) {
    log();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = TcpTransport::bind(1, any, dialer).await.unwrap();
    let b = TcpTransport::bind(2, any, acceptor).await.unwrap();
    let peers: HashMap<NodeId, SocketAddr> = [(1, a.local_addr()), (2, b.local_addr())].into();
    let rx = a.open_receive(recv_spec(1, &[(0, 2)])).unwrap();
    a.set_peers(&peers);
    b.set_peers(&peers);
    let e = rx.get().await.unwrap_err();
    (a, b, e)
}

#[tokio::test]
async fn a_peer_with_another_secret_fails_the_dialers_endpoints() {
    let other = TransportConfig {
        secret: "another cluster".into(),
        ..small_config()
    };
    let (a, _b, e) = refused_pair(small_config(), other).await;
    assert!(e.to_string().contains("worker 2"), "{e}");
    assert!(
        e.to_string().contains("does not match the cluster secret"),
        "{e}"
    );
    let ep = a.open_send(send_spec(1, 0, &[2])).unwrap();
    assert!(ep.acquire(To::Node(2)).await.is_err());
}

// ---------------------------------------------------------------------------------------
// Scheduling.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phased_all_to_all_moves_everything_and_takes_turns() {
    let config = TransportConfig {
        schedule: Schedule::Phased { quota: 2 },
        ..small_config()
    };
    let n = cluster(&[1, 2, 3, 4], config).await;
    let runs = n.iter().enumerate().map(|(i, t)| {
        let t = t.clone();
        tokio::spawn(async move {
            let spec = ShuffleSpec {
                nodes: vec![1, 2, 3, 4],
                index: i,
                pattern: Pattern::Repartition,
                total_bytes: 24 << 20,
                message_size: 64 * 1024,
                schedule: Schedule::Phased { quota: 2 },
                run_id: 1,
            };
            run_shuffle(&t, &spec).await
        })
    });
    let joined = tokio::time::timeout(Duration::from_secs(10), futures_join(runs)).await;
    let Ok(joined) = joined else {
        for t in &n {
            eprintln!("{}", t.debug_state());
        }
        panic!("hang");
    };
    for r in joined {
        let r = r.unwrap().unwrap();
        assert_eq!(r.bytes_sent, 6 << 20);
        assert_eq!(r.bytes_received, 6 << 20);
    }
    for t in &n {
        let s = t.stats();
        assert!(s.turns_taken >= 3 && s.turns_granted >= 3, "{s:?}");
    }
    // Idle is silent: no control traffic while nothing is queued.
    let before: Vec<u64> = n.iter().map(|t| t.stats().frames_sent).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after: Vec<u64> = n.iter().map(|t| t.stats().frames_sent).collect();
    assert_eq!(before, after);
}

/// A consumer that reads one stream to its end before it reads another (a hash join's
/// build side before its probe side), with the probe stream produced first, while a
/// third node gathers from both: must finish under either schedule.
async fn join_pattern(schedule: Schedule) {
    let config = TransportConfig {
        schedule,
        window: 2,
        send_buffers: 4,
        ..small_config()
    };
    let n = cluster(&[0, 1, 2], config).await;
    let probe = n[1]
        .open_send(SendSpec {
            exchange: 1,
            ..send_spec(1, 0, &[2])
        })
        .unwrap();
    let build = n[1]
        .open_send(SendSpec {
            exchange: 2,
            ..send_spec(1, 0, &[2])
        })
        .unwrap();
    let gather1 = n[1]
        .open_send(SendSpec {
            exchange: 3,
            ..send_spec(1, 0, &[0])
        })
        .unwrap();
    let gather2 = n[2]
        .open_send(SendSpec {
            exchange: 3,
            ..send_spec(1, 1, &[0])
        })
        .unwrap();
    let probe_rx = n[2]
        .open_receive(ReceiveSpec {
            exchange: 1,
            ..recv_spec(1, &[(0, 1)])
        })
        .unwrap();
    let build_rx = n[2]
        .open_receive(ReceiveSpec {
            exchange: 2,
            ..recv_spec(1, &[(0, 1)])
        })
        .unwrap();
    let gather_rx = n[0]
        .open_receive(ReceiveSpec {
            exchange: 3,
            ..recv_spec(1, &[(0, 1), (1, 2)])
        })
        .unwrap();
    // Different exchanges are produced by different tasks, as in the engine.
    let produce_probe = async {
        for _ in 0..20 {
            put(&probe, To::Node(2), &[1u8; 50_000], false).await;
        }
        probe.finish();
    };
    let produce_build = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..20 {
            put(&build, To::Node(2), &[2u8; 50_000], false).await;
        }
        build.finish();
    };
    let produce_gather = async {
        for _ in 0..20 {
            put(&gather1, To::Node(0), &[3u8; 50_000], false).await;
        }
        gather1.finish();
    };
    let joiner = async {
        let b = drain(&build_rx).await.unwrap();
        let p = drain(&probe_rx).await.unwrap();
        for _ in 0..20 {
            put(&gather2, To::Node(0), &[4u8; 50_000], false).await;
        }
        gather2.finish();
        (b.len(), p.len())
    };
    let (_, _, _, (b, p), g) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(
            produce_probe,
            produce_build,
            produce_gather,
            joiner,
            drain(&gather_rx)
        )
    })
    .await
    .expect("deadlock");
    assert_eq!((b, p, g.unwrap().len()), (20, 20, 40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_shaped_dependency_cannot_deadlock_the_phased_schedule() {
    join_pattern(Schedule::Phased { quota: 2 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_shaped_dependency_cannot_deadlock_the_free_schedule() {
    join_pattern(Schedule::Free).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shuffle_benchmark_verifies_both_patterns_and_measures_the_link() {
    shuffle_benchmark(small_config()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shuffle_benchmark_runs_over_sealed_links() {
    shuffle_benchmark(sealed_config()).await;
}

async fn shuffle_benchmark(config: TransportConfig) {
    let n = cluster(&[1, 2, 3], config).await;
    for (run_id, pattern) in [(1, Pattern::Repartition), (2, Pattern::Broadcast)] {
        let runs = n.iter().enumerate().map(|(i, t)| {
            let t = t.clone();
            tokio::spawn(async move {
                let spec = ShuffleSpec {
                    nodes: vec![1, 2, 3],
                    index: i,
                    pattern,
                    total_bytes: 30_000_000,
                    message_size: 50_000,
                    schedule: Schedule::Free,
                    run_id,
                };
                run_shuffle(&t, &spec).await
            })
        });
        let joined = tokio::time::timeout(Duration::from_secs(20), futures_join(runs)).await;
        let Ok(joined) = joined else {
            for t in &n {
                eprintln!("{}", t.debug_state());
            }
            panic!("hang");
        };
        for r in joined {
            let r = r.unwrap().unwrap();
            let per_node = 10_000_000;
            let (sent, received) = match pattern {
                Pattern::Repartition => (per_node, per_node),
                Pattern::Broadcast => (2 * per_node, 2 * per_node),
            };
            assert_eq!((r.bytes_sent, r.bytes_received), (sent, received));
            assert!(r.wire_bytes_sent >= r.bytes_sent);
            assert_eq!(r.peers.len(), 2);
        }
    }
    assert!(n[0].stats().measured_link_rate.is_some());
    assert!(n[0].link_rate().is_some());
}

// ---------------------------------------------------------------------------------------
// Sealed links: what an observer or a meddler on the path between two nodes can do.

fn sealed_config() -> TransportConfig {
    TransportConfig {
        encrypt_links: true,
        ..small_config()
    }
}

/// Bytes node 1 sends in the handshake: its hello and its proof.
const DIALER_HANDSHAKE: usize = 2 * HEADER_LEN + Hello::LEN + auth::PROOF_LEN;

/// A TCP relay to `to` that records what its client sends and may XOR one byte of it
/// (`flip`: offset in that stream, mask).
async fn relay(to: SocketAddr, flip: Option<(usize, u8)>) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        let (inbound, _) = listener.accept().await.unwrap();
        let outbound = TcpStream::connect(to).await.unwrap();
        let (mut in_rd, mut in_wr) = inbound.into_split();
        let (mut out_rd, mut out_wr) = outbound.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut out_rd, &mut in_wr).await;
        });
        let mut buf = vec![0u8; 64 * 1024];
        let mut at = 0;
        loop {
            let n = match in_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some((offset, mask)) = flip
                && (at..at + n).contains(&offset)
            {
                buf[offset - at] ^= mask;
            }
            at += n;
            record.lock().unwrap().extend_from_slice(&buf[..n]);
            if out_wr.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    (addr, seen)
}

/// Nodes 1 and 2, node 1 (the dialer) reaching node 2 through a [`relay`].
async fn relayed_pair(
    config: TransportConfig,
    flip: Option<(usize, u8)>,
) -> (TcpTransport, TcpTransport, Arc<Mutex<Vec<u8>>>) {
    log();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = TcpTransport::bind(1, any, config.clone()).await.unwrap();
    let b = TcpTransport::bind(2, any, config).await.unwrap();
    let (via, seen) = relay(b.local_addr(), flip).await;
    a.set_peers(&[(1, a.local_addr()), (2, via)].into());
    b.set_peers(&[(1, a.local_addr()), (2, b.local_addr())].into());
    (a, b, seen)
}

const MARKER: &[u8] = b"card 4111-1111-1111-1111 ";
/// A query id whose bytes are easy to spot.
const QUERY: u64 = 0x5ea1_ed11_4c0f_fee5;

/// Node 1 sends five messages of [`MARKER`]s to node 2 through a relay; returns what
/// node 2 received and what the relay saw.
async fn send_through_relay(
    config: TransportConfig,
    flip: Option<(usize, u8)>,
) -> (Result<Vec<(u32, Vec<u8>)>, TransportError>, Vec<u8>) {
    let (a, b, seen) = relayed_pair(config, flip).await;
    let tx = a.open_send(send_spec(QUERY, 0, &[2])).unwrap();
    let rx = b.open_receive(recv_spec(QUERY, &[(0, 1)])).unwrap();
    let body = MARKER.repeat(2000);
    let (_, got) = tokio::time::timeout(
        Duration::from_secs(10),
        futures_join_2(
            async {
                for _ in 0..5 {
                    let Ok(mut buf) = tx.acquire(To::Node(2)).await else {
                        return;
                    };
                    buf.write_all(&body).unwrap();
                    if tx.put(buf, false).is_err() {
                        return;
                    }
                }
                tx.finish();
            },
            drain(&rx),
        ),
    )
    .await
    .expect("the receiver must end or fail, not hang");
    let seen = seen.lock().unwrap().clone();
    (got, seen)
}

async fn futures_join_2<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    tokio::join!(a, b)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn a_sealed_link_shows_an_observer_neither_rows_nor_stream_ids() {
    let expected = vec![(0, MARKER.repeat(2000)); 5];
    // On a clear link the observer reads both, so the check below can fail.
    let (got, seen) = send_through_relay(small_config(), None).await;
    assert_eq!(got.unwrap(), expected);
    assert!(contains(&seen, MARKER));
    assert!(contains(&seen, &QUERY.to_le_bytes()));
    let (got, seen) = send_through_relay(sealed_config(), None).await;
    assert_eq!(got.unwrap(), expected);
    assert!(
        seen.len() > 5 * MARKER.len() * 2000,
        "the data went through"
    );
    assert!(!contains(&seen, MARKER));
    assert!(!contains(&seen, &QUERY.to_le_bytes()));
}

/// Flips `mask` at `offset` of node 1's stream; node 2 must drop the link for `cause`.
async fn meddle(config: TransportConfig, offset: usize, mask: u8, cause: &str) {
    let (got, _) = send_through_relay(config, Some((DIALER_HANDSHAKE + offset, mask))).await;
    let e = got.expect_err("an altered frame must not be delivered");
    let text = e.to_string();
    assert!(
        matches!(e, TransportError::PeerLost { peer: 1, .. }),
        "{text}"
    );
    assert!(text.contains(cause), "{text}");
}

#[tokio::test]
async fn a_sealed_link_catches_any_altered_bit_that_a_checksum_lets_through() {
    // The first data frame: header, then the sealed stream key and its tag, then the body.
    let body = HEADER_LEN + StreamKey::LEN + crate::seal::TAG_LEN;
    let unauthentic = "failed authentication";
    meddle(sealed_config(), body + 1000, 0x04, unauthentic).await;
    meddle(sealed_config(), HEADER_LEN + 3, 0x01, unauthentic).await;
    // A header flag is not covered by an unsealed frame's checksum: setting the last
    // flag on a clear link silently ends the stream early. Sealed, the header is
    // authenticated.
    meddle(sealed_config(), 6, FLAG_LAST, unauthentic).await;
    let (got, _) =
        send_through_relay(small_config(), Some((DIALER_HANDSHAKE + 6, FLAG_LAST))).await;
    assert_eq!(
        got.unwrap().len(),
        1,
        "the clear link lost four messages unnoticed"
    );
}

#[tokio::test]
async fn nodes_that_disagree_about_sealing_do_not_connect() {
    for (dialer_seals, cause) in [
        (true, "this node encrypts its data links and it does not"),
        (false, "it encrypts its data links and this node does not"),
    ] {
        let config = |seal| TransportConfig {
            encrypt_links: seal,
            ..small_config()
        };
        let (_a, b, e) = refused_pair(config(dialer_seals), config(!dialer_seals)).await;
        let e = e.to_string();
        assert!(e.contains("worker 2") && e.contains(cause), "{e}");
        assert!(e.contains("--encrypt-links"), "{e}");
        assert!(!b.is_connected(1));
    }
}
