//! ScyPer's replication end to end on one host: the primary runs TPC-C and multicasts
//! its durable log; two secondaries (one losing packets) replay it into versioned
//! Arrow tables. Both end in the primary's exact state, their snapshots keep the state
//! of their LSN while replay goes on, and every state is consistent.

use gyre_replica::ship::{Group, Publisher, PublisherConfig, Receiver, ReceiverConfig};
use gyre_replica::versioned::Snapshot;
use gyre_replica::{Database, LogMode, Options, Secondary, Store, Value};
use gyre_tpcc::consistency::violations;
use gyre_tpcc::{Scale, Terminal, create_and_load, procedures};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SCALE: Scale = Scale {
    warehouses: 2,
    items: 1000,
    customers: 60,
};

fn group(n: u8) -> Group {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    Group {
        group: SocketAddrV4::new(
            Ipv4Addr::new(239, 78, (std::process::id() % 250) as u8, n),
            port,
        ),
        interface: Ipv4Addr::LOCALHOST,
    }
}

fn sorted_rows(store: &Store, table: &str) -> Vec<Vec<Value>> {
    store
        .table(store.table_id(table).unwrap())
        .unwrap()
        .to_rows()
}

fn snapshot_rows(snapshot: &Snapshot, table: &str) -> Vec<Vec<Value>> {
    snapshot.tables[table].rows().unwrap()
}

/// What a secondary thread hands back: its replica, and snapshots it cut on the way
/// with the row state they must keep showing.
struct Outcome {
    secondary: Secondary,
    kept: Vec<(Snapshot, Store)>,
}

fn run(mode: LogMode, g: Group) {
    let dir = tempfile::tempdir().unwrap();
    let primary = Database::open(
        Options {
            log_mode: mode,
            ..Options::durable(dir.path())
        },
        procedures(),
    )
    .unwrap();
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let secondaries: Vec<_> = [0u32, 10_000]
        .into_iter()
        .map(|loss| {
            let mut receiver = Receiver::join(ReceiverConfig {
                simulated_loss_ppm: loss,
                ..ReceiverConfig::new(g)
            })
            .unwrap();
            let target = Arc::clone(&target);
            std::thread::spawn(move || {
                let mut secondary = Secondary::new(procedures());
                secondary.keep_snapshots(100_000);
                let mut kept = vec![];
                // Keep a snapshot each time replay passes another 97 LSNs: a group
                // commit can carry many transactions, so an exact LSN may never show.
                let mut next_keep = 97;
                let deadline = Instant::now() + Duration::from_secs(120);
                while secondary.lsn() < target.load(Ordering::Acquire) {
                    assert!(
                        Instant::now() < deadline,
                        "stuck at LSN {}",
                        secondary.lsn()
                    );
                    if let Some(frames) = receiver.recv(Duration::from_millis(50)).unwrap() {
                        secondary.apply_frames(&frames).unwrap();
                        if secondary.lsn() >= next_keep {
                            next_keep = secondary.lsn() + 97;
                            kept.push((secondary.snapshot(), secondary.rows().unwrap().clone()));
                        }
                    }
                }
                Outcome { secondary, kept }
            })
        })
        .collect();
    let publisher = Arc::new(Publisher::new(PublisherConfig::new(g)).unwrap());
    let p = Arc::clone(&publisher);
    primary
        .ship(Box::new(move |_, frames| p.publish(frames).unwrap()))
        .unwrap();
    create_and_load(&primary, SCALE, 1_700_000_000_000_000_000).unwrap();
    let primary = Arc::new(primary);
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut marks = vec![];
    std::thread::scope(|s| {
        // The periodic snapshot transaction (every second in production).
        let marker = s.spawn(|| {
            let mut marks = vec![];
            while !done.load(Ordering::Acquire) {
                marks.push(primary.mark_snapshot_if_changed().unwrap());
                std::thread::sleep(Duration::from_millis(20));
            }
            marks
        });
        let mut terminals = vec![];
        for t in 0..4 {
            let primary = Arc::clone(&primary);
            terminals.push(s.spawn(move || {
                let mut terminal = Terminal::new(SCALE, 1 + t % 2, t as u64);
                for i in 0..250 {
                    let call = terminal.next(1_700_000_000_000_000_000 + i);
                    let _ = primary.call(call.procedure(), &call.args);
                }
            }));
        }
        for t in terminals {
            t.join().unwrap();
        }
        done.store(true, Ordering::Release);
        marks = marker.join().unwrap();
    });
    marks.push(primary.mark_snapshot().unwrap());
    marks.dedup();
    let state = primary.snapshot();
    target.store(primary.durable_lsn(), Ordering::Release);
    let tables: Vec<&str> = gyre_tpcc::schema::tables().iter().map(|t| t.name).collect();
    let outcomes: Vec<Outcome> = secondaries.into_iter().map(|h| h.join().unwrap()).collect();
    // Global snapshots: every secondary cut one at each snapshot transaction, and
    // they agree row for row.
    assert!(marks.len() > 5, "{marks:?}");
    for o in &outcomes {
        assert_eq!(o.secondary.snapshot_lsns(), marks);
    }
    for (i, &m) in marks.iter().enumerate() {
        let (a, b) = (
            outcomes[0].secondary.snapshot_for(m).unwrap(),
            outcomes[1].secondary.snapshot_for(m).unwrap(),
        );
        assert_eq!(a.lsn, m);
        let tables: &[&str] = if i % 10 == 0 {
            &["district", "orders", "order_line", "stock"]
        } else {
            &["district", "new_order"]
        };
        for t in tables {
            assert_eq!(snapshot_rows(a, t), snapshot_rows(b, t), "{t} at {m}");
        }
        // A query arriving just after the previous mark runs on this one.
        let after_previous = if i == 0 { 0 } else { marks[i - 1] + 1 };
        assert_eq!(
            outcomes[0]
                .secondary
                .snapshot_for(after_previous)
                .unwrap()
                .lsn,
            m
        );
    }
    for (k, outcome) in outcomes.into_iter().enumerate() {
        let Outcome {
            mut secondary,
            kept,
        } = outcome;
        assert_eq!(secondary.lsn(), state.lsn, "{mode:?} secondary {k}");
        let v = violations(secondary.rows().unwrap()).unwrap();
        assert!(v.is_empty(), "{v:?}");
        let last = secondary.snapshot();
        assert_eq!(last.lsn, state.lsn);
        for t in &tables {
            assert_eq!(
                sorted_rows(secondary.rows().unwrap(), t),
                sorted_rows(&state, t),
                "{t}"
            );
            assert_eq!(
                snapshot_rows(&last, t),
                sorted_rows(&state, t),
                "{t} snapshot"
            );
        }
        assert!(kept.len() > 3, "{} snapshots", kept.len());
        for (snapshot, rows) in &kept {
            for t in ["district", "orders", "new_order", "customer"] {
                assert_eq!(
                    snapshot_rows(snapshot, t),
                    sorted_rows(rows, t),
                    "{mode:?}: {t} at {}",
                    snapshot.lsn
                );
            }
        }
        let (replayed, time) = secondary.replay_stats();
        println!(
            "{mode:?} secondary {k}: {replayed} entries replayed in {:.1} ms",
            time.as_secs_f64() * 1e3
        );
    }
    let stats = publisher.stats();
    println!("{mode:?}: {stats:?}");
}

#[test]
fn secondaries_replay_the_multicast_log_logically() {
    run(LogMode::Logical, group(1));
}

#[test]
fn secondaries_replay_the_multicast_log_physically() {
    run(LogMode::Physical, group(2));
}
