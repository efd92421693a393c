use super::*;
use crate::verbs::{RemoteRegion, Sge, wait_poll};

fn config(dir: &std::path::Path) -> ShmConfig {
    ShmConfig {
        dir: dir.to_path_buf(),
        params: ShmParams {
            arena: 64 << 20,
            ..Default::default()
        },
    }
}

struct Node {
    c: ShmCarrier,
    scq: Arc<dyn CompletionQueue>,
    rcq: Arc<dyn CompletionQueue>,
}

fn node(id: NodeId, dir: &std::path::Path) -> Node {
    let c = ShmCarrier::open(id, &config(dir)).unwrap();
    let scq = c.create_cq(1024).unwrap();
    let rcq = c.create_cq(1024).unwrap();
    Node { c, scq, rcq }
}

fn qp(n: &Node, kind: QpKind) -> Arc<dyn QueuePair> {
    n.c.create_qp(kind, &n.scq, &n.rcq).unwrap()
}

fn fill(r: &Region, off: usize, bytes: &[u8]) {
    unsafe { r.slice_mut(off, bytes.len()) }.copy_from_slice(bytes);
}

fn poll_one(cq: &Arc<dyn CompletionQueue>) -> Completion {
    let mut out = vec![];
    for _ in 0..1000 {
        if cq.poll(&mut out, 1) == 1 {
            return out[0];
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no completion");
}

fn send(id: u64, r: &Region, off: usize, len: usize, imm: Option<u32>) -> SendWr {
    SendWr {
        id,
        op: SendOp::Send { imm },
        local: r.sge(off, len),
        dest: None,
        signaled: true,
    }
}

#[test]
fn reliable_send_receive_write_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (node(1, dir.path()), node(2, dir.path()));
    let (qa, qb) = (qp(&a, QpKind::Rc), qp(&b, QpKind::Rc));
    qa.connect(qb.addr()).unwrap();
    qb.connect(qa.addr()).unwrap();
    let ra = a.c.register(1 << 20).unwrap();
    let rb = b.c.register(1 << 20).unwrap();

    // Two-sided: a receive posted at b takes a's send, in order, with the immediate.
    qb.post_recv(RecvWr {
        id: 7,
        local: Some(rb.sge(0, 4096)),
    })
    .unwrap();
    qb.post_recv(RecvWr {
        id: 8,
        local: Some(rb.sge(4096, 4096)),
    })
    .unwrap();
    fill(&ra, 0, b"hello");
    fill(&ra, 100, b"world!");
    qa.post_send(send(1, &ra, 0, 5, Some(42))).unwrap();
    qa.post_send(send(2, &ra, 100, 6, None)).unwrap();
    let c = poll_one(&a.scq);
    assert_eq!((c.id, c.status, c.op), (1, WcStatus::Success, WcOp::Send));
    assert_eq!(poll_one(&a.scq).id, 2);
    let r1 = poll_one(&b.rcq);
    assert_eq!(
        (r1.id, r1.status, r1.op, r1.bytes, r1.imm, r1.src),
        (
            7,
            WcStatus::Success,
            WcOp::Recv,
            5,
            Some(42),
            Some(qa.addr())
        )
    );
    assert_eq!(unsafe { rb.slice(0, 5) }, b"hello");
    let r2 = poll_one(&b.rcq);
    assert_eq!((r2.id, r2.bytes, r2.imm), (8, 6, None));
    assert_eq!(unsafe { rb.slice(4096, 6) }, b"world!");

    // One-sided write lands in b's region without a completion there; read brings it back.
    fill(&ra, 200, &[9u8; 1000]);
    qa.post_send(SendWr {
        id: 3,
        op: SendOp::Write {
            remote: rb.remote(2),
            offset: 10_000,
            imm: None,
        },
        local: ra.sge(200, 1000),
        dest: None,
        signaled: true,
    })
    .unwrap();
    assert_eq!(poll_one(&a.scq).op, WcOp::Write);
    assert_eq!(unsafe { rb.slice(10_000, 1000) }, &[9u8; 1000][..]);
    let mut none = vec![];
    assert_eq!(
        b.rcq.poll(&mut none, 8),
        0,
        "a plain write completes only at the writer"
    );
    fill(&rb, 20_000, b"from b");
    qa.post_send(SendWr {
        id: 4,
        op: SendOp::Read {
            remote: rb.remote(2),
            offset: 20_000,
        },
        local: ra.sge(300, 6),
        dest: None,
        signaled: true,
    })
    .unwrap();
    assert_eq!(poll_one(&a.scq).op, WcOp::Read);
    assert_eq!(unsafe { ra.slice(300, 6) }, b"from b");

    // Write with immediate consumes a buffer-less receive and completes at b.
    qb.post_recv(RecvWr { id: 9, local: None }).unwrap();
    qa.post_send(SendWr {
        id: 5,
        op: SendOp::Write {
            remote: rb.remote(2),
            offset: 30_000,
            imm: Some(77),
        },
        local: ra.sge(0, 5),
        dest: None,
        signaled: false,
    })
    .unwrap();
    let w = poll_one(&b.rcq);
    assert_eq!(
        (w.id, w.op, w.imm, w.bytes),
        (9, WcOp::RecvWriteImm, Some(77), 5)
    );
    assert_eq!(unsafe { rb.slice(30_000, 5) }, b"hello");
    assert_eq!(
        a.scq.poll(&mut none, 8),
        0,
        "unsignaled success leaves no completion"
    );
    let s = a.c.stats();
    assert_eq!((s.sends, s.writes, s.reads), (2, 2, 1));
    assert_eq!(s.bytes_copied, 5 + 6 + 1000 + 6 + 5);
}

#[test]
fn reliable_errors_fail_the_queue_pair() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (node(1, dir.path()), node(2, dir.path()));
    let (qa, qb) = (qp(&a, QpKind::Rc), qp(&b, QpKind::Rc));
    qa.connect(qb.addr()).unwrap();
    qb.connect(qa.addr()).unwrap();
    let ra = a.c.register(8192).unwrap();
    let rb = b.c.register(8192).unwrap();

    // Outside the peer's region: a remote access error.
    qa.post_send(SendWr {
        id: 1,
        op: SendOp::Write {
            remote: RemoteRegion {
                len: 1 << 30,
                ..rb.remote(2)
            },
            offset: 8000,
            imm: None,
        },
        local: ra.sge(0, 1000),
        dest: None,
        signaled: false,
    })
    .unwrap();
    assert_eq!(poll_one(&a.scq).status, WcStatus::RemoteAccess);
    // The queue pair is now in error: everything after is flushed.
    qa.post_send(send(2, &ra, 0, 10, None)).unwrap();
    assert_eq!(poll_one(&a.scq).status, WcStatus::Flushed);

    // A fresh pair: a send with no receive posted fails it (receiver not ready).
    let (qa, qb) = (qp(&a, QpKind::Rc), qp(&b, QpKind::Rc));
    qa.connect(qb.addr()).unwrap();
    qb.connect(qa.addr()).unwrap();
    qa.post_send(send(3, &ra, 0, 10, None)).unwrap();
    assert_eq!(poll_one(&a.scq).status, WcStatus::ReceiverNotReady);
    assert_eq!(a.c.stats().receiver_not_ready, 1);

    // A receive buffer too small: the receiver sees a length error.
    let (qa, qb) = (qp(&a, QpKind::Rc), qp(&b, QpKind::Rc));
    qa.connect(qb.addr()).unwrap();
    qb.connect(qa.addr()).unwrap();
    qb.post_recv(RecvWr {
        id: 4,
        local: Some(rb.sge(0, 8)),
    })
    .unwrap();
    qa.post_send(send(5, &ra, 0, 100, None)).unwrap();
    assert_eq!(poll_one(&b.rcq).status, WcStatus::LocalLength);
    assert_eq!(poll_one(&a.scq).status, WcStatus::RemoteAccess);

    // Bad local requests are refused when posted.
    assert!(matches!(
        qa.post_send(send(6, &ra, 8000, 1000, None)),
        Err(CarrierError::Invalid(_))
    ));
    assert!(
        qb.post_recv(RecvWr {
            id: 7,
            local: Some(Sge {
                key: 0xdead,
                offset: 0,
                len: 1
            })
        })
        .is_err()
    );

    // A deregistered region's key no longer resolves at its owner.
    let key = rb.key();
    drop(rb);
    let (qa, qb) = (qp(&a, QpKind::Rc), qp(&b, QpKind::Rc));
    qa.connect(qb.addr()).unwrap();
    qb.connect(qa.addr()).unwrap();
    qa.post_send(SendWr {
        id: 8,
        op: SendOp::Read {
            remote: RemoteRegion {
                node: 2,
                key,
                len: 8192,
            },
            offset: 0,
        },
        local: ra.sge(0, 16),
        dest: None,
        signaled: true,
    })
    .unwrap();
    assert_eq!(poll_one(&a.scq).status, WcStatus::RemoteAccess);
}

#[test]
fn datagrams_go_to_any_peer_and_drop_without_a_receive() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (node(1, dir.path()), node(2, dir.path()));
    let (qa, qb) = (qp(&a, QpKind::Ud), qp(&b, QpKind::Ud));
    let ra = a.c.register(16384).unwrap();
    let rb = b.c.register(16384).unwrap();
    fill(&ra, 0, &[5u8; 4096]);
    let dgram = |id, len| SendWr {
        id,
        op: SendOp::Send {
            imm: Some(id as u32),
        },
        local: ra.sge(0, len),
        dest: Some(qb.addr()),
        signaled: true,
    };
    // Nothing posted: the datagram vanishes, the sender still completes.
    qa.post_send(dgram(1, 100)).unwrap();
    assert_eq!(poll_one(&a.scq).status, WcStatus::Success);
    assert_eq!(a.c.stats().datagrams_dropped, 1);
    qb.post_recv(RecvWr {
        id: 10,
        local: Some(rb.sge(0, 4096)),
    })
    .unwrap();
    qa.post_send(dgram(2, 4096)).unwrap();
    let r = poll_one(&b.rcq);
    assert_eq!(
        (r.id, r.bytes, r.imm, r.src),
        (10, 4096, Some(2), Some(qa.addr()))
    );
    assert_eq!(unsafe { rb.slice(0, 4096) }, &[5u8; 4096][..]);
    // Larger than the MTU: refused.
    assert!(qa.post_send(dgram(3, 4097)).is_err());
    // To a queue pair that does not exist: dropped.
    qa.post_send(SendWr {
        dest: Some(QpAddr { node: 2, qpn: 400 }),
        ..dgram(4, 10)
    })
    .unwrap();
    assert_eq!(a.c.stats().datagrams_dropped, 2);
}

#[tokio::test]
async fn a_waiter_wakes_when_a_peer_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (node(1, dir.path()), node(2, dir.path()));
    let (qa, qb) = (qp(&a, QpKind::Rc), qp(&b, QpKind::Rc));
    qa.connect(qb.addr()).unwrap();
    qb.connect(qa.addr()).unwrap();
    let ra = a.c.register(4096).unwrap();
    let rb = b.c.register(4096).unwrap();
    qb.post_recv(RecvWr {
        id: 1,
        local: Some(rb.sge(0, 4096)),
    })
    .unwrap();
    let rcq = Arc::clone(&b.rcq);
    let waiter = tokio::spawn(async move {
        let mut out = vec![];
        let t = std::time::Instant::now();
        let n = wait_poll(&*rcq, &mut out, 4, Duration::from_secs(5)).await;
        (n, t.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    qa.post_send(send(1, &ra, 0, 64, None)).unwrap();
    let (n, waited) = waiter.await.unwrap();
    assert_eq!(n, 1);
    assert!(waited < Duration::from_secs(1), "woke after {waited:?}");
}

#[test]
fn a_segment_of_a_live_node_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let a = ShmCarrier::open(1, &config(dir.path())).unwrap();
    let err = ShmCarrier::open(1, &config(dir.path())).unwrap_err();
    assert!(err.to_string().contains("already has a live"), "{err}");
    drop(a);
    // Once closed, the id may be used again.
    ShmCarrier::open(1, &config(dir.path())).unwrap();
}

#[test]
fn a_forged_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = ShmCarrier::open(1, &config(dir.path())).unwrap();
    std::fs::write(segment::segment_path(dir.path(), 2), vec![0xabu8; 8192]).unwrap();
    let err = a.inner.segment(2).err().unwrap();
    assert!(
        err.to_string().contains("not a Gyre shared-memory segment"),
        "{err}"
    );
    assert!(!a.is_alive(2));
    assert!(!a.is_alive(3));
}

/// The other process of `between_processes`: node 2, receiving and checksumming.
const CHILD_DIR: &str = "GYRE_SHM_TEST_CHILD_DIR";
const MESSAGES: u64 = 2000;
const SIZE: usize = 64 * 1024;
const POSTED: u64 = 16;

#[test]
fn between_processes_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let credit_key: u32 = std::fs::read_to_string(dir.join("credit-key"))
        .unwrap()
        .parse()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let b = node(2, &dir);
        let qb = qp(&b, QpKind::Rc);
        let rb = b.c.register(SIZE * POSTED as usize).unwrap();
        let credit = b.c.register(8).unwrap();
        for i in 0..POSTED {
            qb.post_recv(RecvWr {
                id: i,
                local: Some(rb.sge(i as usize * SIZE, SIZE)),
            })
            .unwrap();
        }
        // The parent's queue pair is its first: number 0 of node 1.
        qb.connect(QpAddr { node: 1, qpn: 0 }).unwrap();
        // A reliable connection is usable once both sides are connected.
        std::fs::write(dir.join("child-ready"), b"").unwrap();
        for _ in 0..1000 {
            if dir.join("parent-connected").exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let parent_credit = RemoteRegion {
            node: 1,
            key: credit_key,
            len: 8,
        };
        let write_credit = |posted: u64| {
            unsafe { credit.slice_mut(0, 8) }.copy_from_slice(&posted.to_le_bytes());
            qb.post_send(SendWr {
                id: u64::MAX,
                op: SendOp::Write {
                    remote: parent_credit,
                    offset: 0,
                    imm: None,
                },
                local: credit.sge(0, 8),
                dest: None,
                signaled: false,
            })
            .unwrap();
        };
        write_credit(POSTED);
        let (mut sum, mut got) = (0u64, 0u64);
        let mut out = vec![];
        while got < MESSAGES {
            out.clear();
            let n = wait_poll(&*b.rcq, &mut out, 16, Duration::from_secs(10)).await;
            assert!(n > 0, "no message in 10 s");
            for c in &out {
                assert_eq!(c.status, WcStatus::Success);
                let data = unsafe { rb.slice(c.id as usize * SIZE, c.bytes as usize) };
                sum = data
                    .iter()
                    .fold(sum, |s, &x| s.wrapping_mul(31).wrapping_add(x as u64));
                got += 1;
                qb.post_recv(RecvWr {
                    id: c.id,
                    local: Some(rb.sge(c.id as usize * SIZE, SIZE)),
                })
                .unwrap();
            }
            // The paper's absolute credit: receives posted so far, written into the sender.
            write_credit(POSTED + got);
        }
        let reply = b.c.register(16).unwrap();
        let r = unsafe { reply.slice_mut(0, 16) };
        r[..8].copy_from_slice(&got.to_le_bytes());
        r[8..].copy_from_slice(&sum.to_le_bytes());
        qb.post_send(send(99, &reply, 0, 16, None)).unwrap();
        let mut errors = vec![];
        b.scq.poll(&mut errors, 64);
        assert!(
            errors.iter().all(|c| c.status == WcStatus::Success),
            "{errors:?}"
        );
        // Stay until the parent has read the answer.
        for _ in 0..1000 {
            if dir.join("parent-done").exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

#[tokio::test]
async fn between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(1, dir.path());
    let qa = qp(&a, QpKind::Rc);
    assert_eq!(qa.addr().qpn, 0);
    let ra = a.c.register(SIZE).unwrap();
    let answer = a.c.register(16).unwrap();
    let credit = a.c.register(8).unwrap();
    std::fs::write(dir.path().join("credit-key"), credit.key().to_string()).unwrap();
    qa.post_recv(RecvWr {
        id: 1000,
        local: Some(answer.sge(0, 16)),
    })
    .unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "shm::tests::between_processes_child",
            "--nocapture",
        ])
        .env(CHILD_DIR, dir.path())
        .spawn()
        .unwrap();
    for _ in 0..1000 {
        if dir.path().join("child-ready").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(a.c.is_alive(2), "the child did not start");
    qa.connect(QpAddr { node: 2, qpn: 0 }).unwrap();
    std::fs::write(dir.path().join("parent-connected"), b"").unwrap();
    let credit_now = || {
        let w = unsafe { credit.slice(0, 8) };
        u64::from_le_bytes(w.try_into().unwrap())
    };
    let mut expect = 0u64;
    let mut waited = std::time::Instant::now();
    for i in 0..MESSAGES {
        let bytes: Vec<u8> = (0..SIZE).map(|j| (i as usize * 7 + j) as u8).collect();
        expect = bytes
            .iter()
            .fold(expect, |s, &x| s.wrapping_mul(31).wrapping_add(x as u64));
        // Wait for credit: a send may only go where a receive is posted.
        while credit_now() <= i {
            assert!(
                waited.elapsed() < Duration::from_secs(20),
                "no credit from the child"
            );
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        waited = std::time::Instant::now();
        fill(&ra, 0, &bytes);
        qa.post_send(SendWr {
            signaled: false,
            ..send(i, &ra, 0, SIZE, None)
        })
        .unwrap();
    }
    let mut out = vec![];
    let n = wait_poll(&*a.rcq, &mut out, 1, Duration::from_secs(20)).await;
    assert_eq!(n, 1, "no answer from the child");
    let mut errors = vec![];
    a.scq.poll(&mut errors, 64);
    assert!(errors.is_empty(), "{errors:?}");
    let got = unsafe { answer.slice(0, 16) };
    assert_eq!(u64::from_le_bytes(got[..8].try_into().unwrap()), MESSAGES);
    assert_eq!(u64::from_le_bytes(got[8..].try_into().unwrap()), expect);
    std::fs::write(dir.path().join("parent-done"), b"").unwrap();
    assert!(child.wait().unwrap().success());
    // The child is gone: its node is not alive and a send fails the queue pair.
    assert!(!a.c.is_alive(2));
    qa.post_send(send(1, &ra, 0, 8, None)).unwrap();
    assert_eq!(poll_one(&a.scq).status, WcStatus::RemoteInvalid);
}

/// A directory left by a process that is gone is removed when the next one is
/// made; a live process's (this one's) stays.
#[test]
fn process_dirs_of_gone_processes_are_removed() {
    let prefix = format!("gyre-test-sweep-{:08x}", rand::random::<u32>());
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone = child.id();
    child.wait().unwrap();
    let stale = base_dir().join(format!("{prefix}-{gone}-0000000000000001"));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("segment-1"), b"left behind").unwrap();
    let live = process_dir(&prefix).unwrap();
    assert!(!stale.exists(), "{}", stale.display());
    let next = process_dir(&prefix).unwrap();
    assert!(live.is_dir() && next.is_dir() && live != next);
    std::fs::remove_dir(live).unwrap();
    std::fs::remove_dir(next).unwrap();
}

/// A receiving queue pair and its completion queue dropped while a sender of
/// the same node lands messages on them: the carrier wakes the queue's
/// waiters without holding the queue table's lock across the queue's drop
/// (it did once, and a concurrent drop deadlocked the sender's thread).
#[test]
fn a_completion_queue_dropped_while_messages_land_on_it() {
    const SENDS: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let c = ShmCarrier::open(1, &config(dir.path())).unwrap();
    let scq = c.create_cq(1024).unwrap();
    let ra = c.register(64).unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut landed = 0;
        for round in 0..2000u64 {
            let qa = c.create_qp(QpKind::Rc, &scq, &scq).unwrap();
            let cq = c.create_cq(1024).unwrap();
            let qb = c.create_qp(QpKind::Rc, &scq, &cq).unwrap();
            let rb = c.register(64 * SENDS as usize).unwrap();
            for i in 0..SENDS {
                qb.post_recv(RecvWr {
                    id: i,
                    local: Some(rb.sge(i as usize * 64, 64)),
                })
                .unwrap();
            }
            qa.connect(qb.addr()).unwrap();
            qb.connect(qa.addr()).unwrap();
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    start.wait();
                    for i in 0..SENDS {
                        let mut wr = send(i, &ra, 0, 8, None);
                        wr.signaled = false;
                        // Refused once the receiver is gone (the pair then fails).
                        qa.post_send(wr).unwrap();
                    }
                });
                start.wait();
                // Dropped at varying points of the sends, as the queue's last owner.
                for _ in 0..round % 64 * 50 {
                    std::hint::spin_loop();
                }
                drop((qb, cq));
            });
            let mut out = vec![];
            scq.poll(&mut out, 1024);
            landed += SENDS - out.len() as u64;
        }
        let _ = done_tx.send(landed);
    });
    let landed = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a sender's thread deadlocked on a dropped completion queue");
    assert!(landed > 0, "no send landed before its receiver went");
}
