//! The log multicast on the loopback interface: several receivers, some losing
//! packets, each get every message once, in order, byte for byte; a gap the window no
//! longer covers fails cleanly; hostile datagrams change nothing.

use gyre_replica::ship::{Group, Publisher, PublisherConfig, Receiver, ReceiverConfig, ShipError};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

/// A group of this test alone: tests run in parallel, and so may other test binaries.
fn group(n: u8) -> Group {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    Group {
        group: SocketAddrV4::new(
            Ipv4Addr::new(239, 77, (std::process::id() % 250) as u8, n),
            port,
        ),
        interface: Ipv4Addr::LOCALHOST,
    }
}

/// Message `i`: its size varies from empty to many packets; its bytes say who it is.
fn message(i: usize) -> Vec<u8> {
    let len = match i % 7 {
        0 => 0,
        1 => 1,
        2 => 1400,
        3 => 5000,
        4 => 60_000,
        _ => i * 37 % 3000,
    };
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

fn receive_all(mut r: Receiver, n: usize) -> Result<(Vec<Vec<u8>>, Receiver), ShipError> {
    let mut got = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} messages",
            got.len()
        );
        if let Some(m) = r.recv(Duration::from_millis(100))? {
            got.push(m);
        }
    }
    Ok((got, r))
}

#[test]
fn every_receiver_gets_every_message_once_in_order_despite_loss() {
    let g = group(1);
    let n = 1500;
    let receivers: Vec<_> = [0, 20_000, 50_000]
        .into_iter()
        .map(|loss| {
            let r = Receiver::join(ReceiverConfig {
                simulated_loss_ppm: loss,
                ..ReceiverConfig::new(g)
            })
            .unwrap();
            std::thread::spawn(move || receive_all(r, n))
        })
        .collect();
    let publisher = Publisher::new(PublisherConfig {
        rate: Some(200 << 20),
        ..PublisherConfig::new(g)
    })
    .unwrap();
    for i in 0..n {
        publisher.publish(&message(i)).unwrap();
    }
    for (k, h) in receivers.into_iter().enumerate() {
        let (got, r) = h.join().unwrap().unwrap();
        for (i, m) in got.iter().enumerate() {
            assert_eq!(m, &message(i), "receiver {k}, message {i}");
        }
        let stats = r.stats();
        if k > 0 {
            assert!(
                stats.dropped > 0 && stats.naks > 0,
                "receiver {k}: {stats:?}"
            );
        }
        // Nothing more: each message came once.
        let mut r = r;
        assert_eq!(r.recv(Duration::from_millis(50)).unwrap(), None);
    }
    let stats = publisher.stats();
    assert_eq!(stats.messages, n as u64);
    assert!(stats.repairs > 0, "{stats:?}");
    // The stream crossed the wire once plus repairs, not once per receiver.
    assert!(stats.repair_bytes < stats.bytes / 5, "{stats:?}");
}

/// The last packet lost and nothing after it: the heartbeat's lead reveals it.
#[test]
fn a_lost_tail_is_found_by_the_heartbeat() {
    let g = group(2);
    let r = Receiver::join(ReceiverConfig {
        simulated_loss_ppm: 1_000_000,
        ..ReceiverConfig::new(g)
    })
    .unwrap();
    let h = std::thread::spawn(move || receive_all(r, 2));
    let publisher = Publisher::new(PublisherConfig::new(g)).unwrap();
    publisher.publish(b"first").unwrap();
    publisher.publish(&message(4)).unwrap();
    let (got, r) = h.join().unwrap().unwrap();
    assert_eq!(got, vec![b"first".to_vec(), message(4)]);
    assert_eq!(
        r.stats().packets,
        publisher.stats().packets,
        "all came as repairs"
    );
}

/// A receiver that needs packets the window dropped is told so, and fails cleanly.
#[test]
fn packets_gone_from_the_window_fail_as_lost() {
    let g = group(3);
    let publisher = Publisher::new(PublisherConfig {
        window_bytes: 20_000,
        ..PublisherConfig::new(g)
    })
    .unwrap();
    let mut r = Receiver::join(ReceiverConfig {
        simulated_loss_ppm: 1_000_000,
        ..ReceiverConfig::new(g)
    })
    .unwrap();
    for i in 0..20 {
        publisher.publish(&message(i)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        assert!(Instant::now() < deadline, "no error");
        if let Err(e) = r.recv(Duration::from_millis(100)) {
            break e;
        }
    };
    assert!(matches!(err, ShipError::Lost { needed: 0, .. }), "{err}");
    assert!(err.to_string().contains("catch up from the durable log"));
    // It stays failed.
    assert!(r.recv(Duration::from_millis(10)).is_err());
}

/// Garbage sent to the group's port is ignored; the stream goes on.
#[test]
fn hostile_datagrams_are_ignored() {
    let g = group(4);
    let r = Receiver::join(ReceiverConfig::new(g)).unwrap();
    let publisher = Publisher::new(PublisherConfig::new(g)).unwrap();
    let h = std::thread::spawn(move || receive_all(r, 3));
    let noise = UdpSocket::bind("127.0.0.1:0").unwrap();
    publisher.publish(&message(2)).unwrap();
    for junk in [
        &b""[..],
        b"GYRL",
        b"GYRL\x01\0\0\0\0\0\0\0\0",
        &[0xff; 1472],
        b"GYRL\x04xxxxxxxx\xff\xff",
    ] {
        noise.send_to(junk, g.group).unwrap();
    }
    publisher.publish(&message(3)).unwrap();
    publisher.publish(&message(4)).unwrap();
    let (got, r) = h.join().unwrap().unwrap();
    assert_eq!(got, vec![message(2), message(3), message(4)]);
    assert!(r.stats().ignored >= 4, "{:?}", r.stats());
}

/// A receiver joining mid-stream starts at the next whole message.
#[test]
fn a_late_receiver_starts_at_a_message_boundary() {
    let g = group(5);
    let publisher = Publisher::new(PublisherConfig::new(g)).unwrap();
    publisher.publish(&message(4)).unwrap();
    let r = Receiver::join(ReceiverConfig {
        from_seq: None,
        ..ReceiverConfig::new(g)
    })
    .unwrap();
    let h = std::thread::spawn(move || receive_all(r, 2));
    std::thread::sleep(Duration::from_millis(100));
    publisher.publish(&message(5)).unwrap();
    publisher.publish(&message(6)).unwrap();
    let (got, _) = h.join().unwrap().unwrap();
    assert_eq!(got, vec![message(5), message(6)]);
}

/// A publisher that stops (a primary that died, or restarted with a new stream) is
/// noticed: the receiver fails instead of waiting forever.
#[test]
fn a_silent_or_restarted_publisher_is_noticed() {
    let g = group(6);
    let mut r = Receiver::join(ReceiverConfig {
        give_up: Duration::from_millis(400),
        ..ReceiverConfig::new(g)
    })
    .unwrap();
    let first = Publisher::new(PublisherConfig::new(g)).unwrap();
    first.publish(b"one").unwrap();
    assert_eq!(
        r.recv(Duration::from_secs(5)).unwrap(),
        Some(b"one".to_vec())
    );
    drop(first);
    let _second = Publisher::new(PublisherConfig::new(g)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        assert!(Instant::now() < deadline, "no error");
        if let Err(e) = r.recv(Duration::from_millis(100)) {
            break e;
        }
    };
    assert!(
        matches!(
            err,
            ShipError::Silent {
                other_stream: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("restarted"), "{err}");
}

/// Over TCP: every subscriber gets every message in order.
#[test]
fn the_tcp_fallback_delivers_every_message_in_order() {
    use gyre_replica::ship::tcp::{TcpPublisher, TcpReceiver};
    let publisher = TcpPublisher::bind("127.0.0.1:0".parse().unwrap(), 1024).unwrap();
    let receivers: Vec<TcpReceiver> = (0..3)
        .map(|_| TcpReceiver::connect(publisher.local_addr()).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while publisher.subscribers() < 3 {
        assert!(Instant::now() < deadline, "subscribers not accepted");
        std::thread::sleep(Duration::from_millis(5));
    }
    let n = 300;
    let readers: Vec<_> = receivers
        .into_iter()
        .map(|mut r| {
            std::thread::spawn(move || {
                let mut got = vec![];
                while got.len() < n {
                    if let Some(m) = r.recv(Duration::from_millis(100)).unwrap() {
                        got.push(m);
                    }
                }
                got
            })
        })
        .collect();
    for i in 0..n {
        publisher.publish(&message(i));
    }
    for h in readers {
        let got = h.join().unwrap();
        for (i, m) in got.iter().enumerate() {
            assert_eq!(m, &message(i), "message {i}");
        }
    }
    assert!(publisher.dropped().is_empty());
}

/// A subscriber that stops reading is dropped instead of holding the log up, and its
/// receiver, reading again, gets what was sent and then an error saying so.
#[test]
fn the_tcp_fallback_drops_a_stalled_subscriber() {
    use gyre_replica::ship::tcp::{TcpPublisher, TcpReceiver};
    let publisher = TcpPublisher::bind("127.0.0.1:0".parse().unwrap(), 4).unwrap();
    let mut r = TcpReceiver::connect(publisher.local_addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while publisher.subscribers() < 1 {
        assert!(Instant::now() < deadline, "subscriber not accepted");
        std::thread::sleep(Duration::from_millis(5));
    }
    let big = vec![7u8; 1 << 20];
    let mut sent = 0;
    while publisher.dropped().is_empty() {
        assert!(sent < 500, "never dropped");
        publisher.publish(&big);
        sent += 1;
    }
    let mut got = 0;
    let err = loop {
        match r.recv(Duration::from_secs(5)) {
            Ok(Some(m)) => {
                assert_eq!(m, big);
                got += 1;
            }
            Ok(None) => panic!("neither data nor an error"),
            Err(e) => break e,
        }
    };
    assert!(got < sent, "{got} of {sent}");
    assert!(err.to_string().contains("catch up"), "{err}");
}

/// A TCP receiver refuses a frame longer than a log group before allocating it.
#[test]
fn the_tcp_receiver_refuses_oversized_frames() {
    use gyre_replica::ship::tcp::TcpReceiver;
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut r = TcpReceiver::connect(listener.local_addr().unwrap()).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    let mut frame = 0u64.to_le_bytes().to_vec();
    frame.extend_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&frame).unwrap();
    let err = loop {
        if let Err(e) = r.recv(Duration::from_millis(100)) {
            break e;
        }
    };
    assert!(err.to_string().contains("more than a log group"), "{err}");
}
