//! ScyPer's replication end to end on one host: the primary runs TPC-C and multicasts
//! its durable log; two secondaries (one losing packets) replay it into versioned
//! Arrow tables. Both end in the primary's exact state, their snapshots keep the state
//! of their LSN while replay goes on, and every state is consistent.

use gyre_replica::columnar::from_batch;
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
    let id = store.table_id(table).unwrap();
    store
        .table(id)
        .unwrap()
        .rows
        .values()
        .map(|r| r.to_vec())
        .collect()
}

fn snapshot_rows(snapshot: &Snapshot, table: &str) -> Vec<Vec<Value>> {
    let t = &snapshot.tables[table];
    let mut rows: Vec<Vec<Value>> = t
        .batches()
        .iter()
        .flat_map(|b| from_batch(t.def(), b).unwrap())
        .collect();
    rows.sort_by_key(|r| t.def().key_of(r));
    rows
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
                let mut kept = vec![];
                let deadline = Instant::now() + Duration::from_secs(120);
                while secondary.lsn() < target.load(Ordering::Acquire) {
                    assert!(
                        Instant::now() < deadline,
                        "stuck at LSN {}",
                        secondary.lsn()
                    );
                    if let Some(frames) = receiver.recv(Duration::from_millis(50)).unwrap() {
                        secondary.apply_frames(&frames).unwrap();
                        if secondary.lsn().is_multiple_of(97) {
                            kept.push((secondary.snapshot(), secondary.rows().clone()));
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
        .ship(Box::new(move |frames| p.publish(frames).unwrap()))
        .unwrap();
    create_and_load(&primary, SCALE, 1_700_000_000_000_000_000).unwrap();
    let primary = Arc::new(primary);
    std::thread::scope(|s| {
        for t in 0..4 {
            let primary = Arc::clone(&primary);
            s.spawn(move || {
                let mut terminal = Terminal::new(SCALE, 1 + t % 2, t as u64);
                for i in 0..250 {
                    let call = terminal.next(1_700_000_000_000_000_000 + i);
                    let _ = primary.call(call.procedure(), &call.args);
                }
            });
        }
    });
    let state = primary.snapshot();
    target.store(primary.durable_lsn(), Ordering::Release);
    let tables: Vec<&str> = gyre_tpcc::schema::tables().iter().map(|t| t.name).collect();
    for (k, h) in secondaries.into_iter().enumerate() {
        let Outcome {
            mut secondary,
            kept,
        } = h.join().unwrap();
        assert_eq!(secondary.lsn(), state.lsn, "{mode:?} secondary {k}");
        let v = violations(secondary.rows()).unwrap();
        assert!(v.is_empty(), "{v:?}");
        let last = secondary.snapshot();
        assert_eq!(last.lsn, state.lsn);
        for t in &tables {
            assert_eq!(
                sorted_rows(secondary.rows(), t),
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
