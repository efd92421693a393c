//! The primary's durability: recovery from the log and checkpoints, rollback, group
//! commit, and kill -9 at random moments while transactions commit.
//!
//! The workload is a bank: `transfer(id, from, to, amount)` moves money between
//! accounts and records the transfer; the total never changes, and each account's
//! balance equals its start plus what the recorded transfers moved. A transaction
//! applied partly, twice, or lost after it was acknowledged breaks one of these.

use gyre_replica::{
    Column, ColumnType, Database, Error, LogMode, Options, Placement, Procedure, Procedures,
    Result, Secondary, Txn, Value,
};
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ACCOUNTS: i64 = 50;
const START: i64 = 1_000;

struct Transfer;

impl Procedure for Transfer {
    fn name(&self) -> &str {
        "transfer"
    }

    fn params(&self) -> Vec<Column> {
        ["id", "from", "to", "amount"]
            .iter()
            .map(|n| Column::new(*n, ColumnType::Int64, false))
            .collect()
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [id, from, to, amount] = args else {
            unreachable!("checked against params")
        };
        let accounts = txn.table("accounts")?;
        let transfers = txn.table("transfers")?;
        let amount = amount.as_int().unwrap();
        let balance = |txn: &mut Txn<'_>, account: &Value, delta: i64| -> Result<()> {
            let row = txn
                .get(accounts, std::slice::from_ref(account))?
                .ok_or_else(|| Txn::abort(format!("no account {account:?}")))?;
            let new = row[1].as_int().unwrap() + delta;
            if new < 0 {
                return Err(Txn::abort("insufficient funds"));
            }
            txn.update(accounts, vec![account.clone(), Value::Int(new)])
        };
        // Credit first, so that a failed debit has something to undo.
        balance(txn, to, amount)?;
        balance(txn, from, -amount)?;
        txn.insert(
            transfers,
            vec![id.clone(), from.clone(), to.clone(), Value::Int(amount)],
        )?;
        Ok(vec![])
    }
}

/// A procedure whose outcome depends on the clock: always logged physically.
struct Stamp;

impl Procedure for Stamp {
    fn name(&self) -> &str {
        "stamp"
    }

    fn params(&self) -> Vec<Column> {
        vec![Column::new("id", ColumnType::Int64, false)]
    }

    fn deterministic(&self) -> bool {
        false
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let stamps = txn.table("stamps")?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        txn.insert(stamps, vec![args[0].clone(), Value::Int(now)])?;
        Ok(vec![])
    }
}

/// Changes an account, then panics (a bug in a procedure).
struct Boom;

impl Procedure for Boom {
    fn name(&self) -> &str {
        "boom"
    }

    fn params(&self) -> Vec<Column> {
        vec![]
    }

    fn run(&self, txn: &mut Txn<'_>, _args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let t = txn.table("accounts")?;
        txn.update(t, vec![Value::Int(0), Value::Int(-5)])?;
        panic!("a bug");
    }
}

/// `note(text)`: appends a row to `notes`, a table without a primary key, and deletes
/// the oldest row holding the same text once there are three: deterministic, so it
/// logs logically, and replay must number the rows as the primary did.
struct Note;

impl Procedure for Note {
    fn name(&self) -> &str {
        "note"
    }

    fn params(&self) -> Vec<Column> {
        vec![Column::new("text", ColumnType::Text, false)]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let notes = txn.table("notes")?;
        txn.insert(notes, vec![args[0].clone()])?;
        let same: Vec<Vec<Value>> = txn
            .scan(notes)?
            .filter(|(_, r)| r[0] == args[0])
            .map(|(k, _)| k.values())
            .collect();
        if same.len() >= 3 {
            txn.delete(notes, &same[0])?;
        }
        Ok(vec![])
    }
}

fn procedures() -> Procedures {
    Procedures::new()
        .with(Transfer)
        .with(Stamp)
        .with(Boom)
        .with(Note)
}

fn int(name: &str) -> Column {
    Column::new(name, ColumnType::Int64, false)
}

/// Opens the bank, creating its tables and accounts if the database is new.
fn open_bank(options: Options) -> Database {
    let db = Database::open(options, procedures()).unwrap();
    if db.read(|s| s.table_id("accounts").is_err()) {
        create_bank(&db, Placement::Full);
    }
    db
}

/// The bank's tables, the accounts placed so, and its accounts.
fn create_bank(db: &Database, accounts: Placement) {
    db.create_table_with_rows(
        "accounts",
        vec![int("id"), int("balance")],
        &["id"],
        accounts,
        vec![],
    )
    .unwrap();
    db.create_table(
        "transfers",
        vec![int("id"), int("src"), int("dst"), int("amount")],
        &["id"],
    )
    .unwrap();
    db.create_table("stamps", vec![int("id"), int("at")], &["id"])
        .unwrap();
    db.transaction(|txn| {
        let t = txn.table("accounts")?;
        for a in 0..ACCOUNTS {
            txn.insert(t, vec![Value::Int(a), Value::Int(START)])?;
        }
        Ok(())
    })
    .unwrap();
}

fn transfer(db: &Database, id: i64, rng: &mut impl Rng) -> Result<Vec<Vec<Value>>> {
    let from = rng.random_range(0..ACCOUNTS);
    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
    let amount = rng.random_range(1..300);
    db.call(
        "transfer",
        &[id.into(), from.into(), to.into(), amount.into()],
    )
}

/// The rows of a secondary's row store table `name`, in key order.
fn stored(secondary: &mut Secondary, name: &str) -> Vec<Vec<Value>> {
    let store = secondary.rows().unwrap();
    store
        .table(store.table_id(name).unwrap())
        .unwrap()
        .to_rows()
}

/// Every table's rows, to compare two states.
fn contents(db: &Database) -> BTreeMap<String, Vec<Vec<Value>>> {
    db.read(|s| {
        s.tables()
            .map(|t| {
                (
                    t.def.name.clone(),
                    t.rows.values().map(|r| r.to_vec()).collect(),
                )
            })
            .collect()
    })
}

/// Checks the bank's invariants and returns the recorded transfer ids.
fn check_bank(db: &Database) -> BTreeSet<i64> {
    let c = contents(db);
    let mut expected = vec![START; ACCOUNTS as usize];
    let mut ids = BTreeSet::new();
    for t in &c["transfers"] {
        let [id, src, dst, amount] = [0, 1, 2, 3].map(|i| t[i].as_int().unwrap());
        expected[src as usize] -= amount;
        expected[dst as usize] += amount;
        ids.insert(id);
    }
    let balances: Vec<i64> = c["accounts"]
        .iter()
        .map(|r| r[1].as_int().unwrap())
        .collect();
    assert_eq!(
        balances, expected,
        "balances do not match the recorded transfers"
    );
    assert_eq!(balances.iter().sum::<i64>(), START * ACCOUNTS);
    ids
}

#[test]
fn memory_only_without_a_data_dir() {
    let db = open_bank(Options::default());
    let mut rng = rand::rng();
    for id in 0..50 {
        let _ = transfer(&db, id, &mut rng);
    }
    // A secondary joins with the state so far, then replays the shipped log.
    let state = gyre_replica::checkpoint::to_bytes(&db.snapshot()).unwrap();
    let shipped = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sink = Arc::clone(&shipped);
    db.ship(Box::new(move |last, frames| {
        sink.lock().push((last, frames.to_vec()))
    }))
    .unwrap();
    for id in 50..100 {
        let _ = transfer(&db, id, &mut rng);
    }
    assert!(!check_bank(&db).is_empty());
    assert_eq!(db.checkpoint().unwrap(), None);
    let store = gyre_replica::checkpoint::from_bytes(state.into()).unwrap();
    let mut secondary = Secondary::from_state(store, procedures()).unwrap();
    wait_shipped(&shipped, db.lsn());
    let shipped = shipped.lock();
    assert!(!shipped.is_empty());
    for (last, frames) in shipped.iter() {
        secondary.apply_frames(frames).unwrap();
        assert_eq!(secondary.lsn(), *last);
    }
    assert_eq!(secondary.lsn(), db.lsn());
    let replicated: BTreeMap<String, Vec<Vec<Value>>> = secondary
        .rows()
        .unwrap()
        .tables()
        .map(|t| (t.def.name.clone(), t.to_rows()))
        .collect();
    assert_eq!(replicated, contents(&db));
}

#[test]
fn state_buffers_round_trip_and_refuse_damage() {
    use gyre_replica::checkpoint::{from_bytes, to_bytes};
    let db = open_bank(Options::default());
    let mut rng = rand::rng();
    for id in 0..30 {
        let _ = transfer(&db, id, &mut rng);
    }
    let bytes = to_bytes(&db.snapshot()).unwrap();
    let store = from_bytes(bytes.clone().into()).unwrap();
    assert_eq!(store.lsn, db.lsn());
    let names: Vec<String> = store.tables().map(|t| t.def.name.clone()).collect();
    assert_eq!(names.len(), 3);
    for cut in [0, 5, 12, bytes.len() / 2, bytes.len() - 1] {
        let err = from_bytes(bytes[..cut].to_vec().into()).unwrap_err();
        assert!(err.to_string().contains("(state)"), "cut at {cut}: {err}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(from_bytes(longer.into()).is_err());
    let mut huge = bytes.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(from_bytes(huge.into()).is_err());
}

/// The definitions of tables on files are logged: they come back by replay, from a
/// checkpoint, and in the state a secondary or a new primary starts from; a dropped
/// one stays dropped.
#[test]
fn definitions_of_tables_on_files_are_durable() {
    use gyre_replica::checkpoint::{from_bytes, to_bytes};
    let dir = tempfile::tempdir().unwrap();
    let options = Options::durable(dir.path());
    let listed = |db: &Database| -> Vec<(String, Vec<u8>)> {
        db.snapshot()
            .file_tables()
            .map(|(n, d)| (n.clone(), d.to_vec()))
            .collect()
    };
    {
        let db = open_bank(options.clone());
        db.set_file_table("a", Some(b"first".to_vec())).unwrap();
        db.set_file_table("b", Some(b"second".to_vec())).unwrap();
        db.set_file_table("a", Some(b"replaced".to_vec())).unwrap();
        db.set_file_table("gone", Some(b"x".to_vec())).unwrap();
        db.set_file_table("gone", None).unwrap();
    }
    let want = vec![
        ("a".to_string(), b"replaced".to_vec()),
        ("b".to_string(), b"second".to_vec()),
    ];
    let db = open_bank(options.clone());
    assert_eq!(listed(&db), want, "after replay");
    db.checkpoint().unwrap().unwrap();
    drop(db);
    let db = open_bank(options);
    assert_eq!(db.recovery().replayed, 0);
    assert_eq!(listed(&db), want, "from the checkpoint");
    let state = from_bytes(to_bytes(&db.snapshot()).unwrap().into()).unwrap();
    let from_state: Vec<(String, Vec<u8>)> = state
        .file_tables()
        .map(|(n, d)| (n.clone(), d.to_vec()))
        .collect();
    assert_eq!(from_state, want, "in a state buffer");
}

#[test]
fn reopening_replays_logical_and_physical_entries() {
    for mode in [LogMode::Logical, LogMode::Physical] {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            log_mode: mode,
            ..Options::durable(dir.path())
        };
        let before = {
            let db = open_bank(options.clone());
            let mut rng = rand::rng();
            for id in 0..300 {
                let _ = transfer(&db, id, &mut rng);
            }
            for id in 0..5 {
                db.call("stamp", &[id.into()]).unwrap();
            }
            check_bank(&db);
            let stats = db.log_stats().unwrap();
            assert!(stats.entries >= 300 - 50, "{stats:?}");
            (contents(&db), db.lsn())
        };
        let db = open_bank(options);
        assert_eq!(contents(&db), before.0, "{mode:?}");
        assert_eq!(db.lsn(), before.1);
        assert_eq!(db.recovery().replayed, before.1);
        check_bank(&db);
    }
}

#[test]
fn rollbacks_change_nothing_and_are_not_logged() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(open_bank(Options::durable(dir.path())));
    let lsn = db.lsn();
    let before = contents(&db);
    // More than the balance: the credit is undone.
    let err = db
        .call(
            "transfer",
            &[1.into(), 0.into(), 1.into(), (START + 1).into()],
        )
        .unwrap_err();
    assert!(matches!(err, Error::Aborted(_)), "{err}");
    // A duplicate id: the insert fails after both balances changed.
    db.call("transfer", &[2.into(), 0.into(), 1.into(), 5.into()])
        .unwrap();
    let err = db
        .call("transfer", &[2.into(), 3.into(), 4.into(), 5.into()])
        .unwrap_err();
    assert!(matches!(err, Error::Constraint(_)), "{err}");
    // Wrong arguments never run.
    assert!(matches!(
        db.call("transfer", &[2.into(), 3.into()]),
        Err(Error::Arguments(_))
    ));
    assert!(matches!(
        db.call("transfer", &["x".into(), 3.into(), 4.into(), 5.into()]),
        Err(Error::Arguments(_))
    ));
    assert!(matches!(
        db.call("nope", &[]),
        Err(Error::NoSuchProcedure(_))
    ));
    assert_eq!(db.lsn(), lsn + 1);
    // An interactive transaction dropped (or failed) rolls back.
    {
        let mut t = db.begin();
        t.run(|txn| {
            let a = txn.table("accounts")?;
            txn.update(a, vec![0.into(), 0.into()])
        })
        .unwrap();
    }
    let mut t = db.begin();
    let failed = t.run(|txn| {
        let a = txn.table("accounts")?;
        txn.update(a, vec![0.into(), 0.into()])?;
        txn.insert(a, vec![1.into(), 0.into()])
    });
    assert!(failed.is_err());
    assert!(
        t.commit().is_err(),
        "a failed statement ends the transaction"
    );
    assert_eq!(db.lsn(), lsn + 1);
    let after = contents(&db);
    assert_eq!(after["accounts"][0][1], Value::Int(START - 5));
    assert_eq!(after["accounts"][1][1], Value::Int(START + 5));
    assert_eq!(before["transfers"].len() + 1, after["transfers"].len());
    // An interactive transaction that commits is durable.
    let mut t = db.begin();
    let lsn_committed = {
        t.run(|txn| {
            let a = txn.table("accounts")?;
            txn.update(a, vec![10.into(), (START - 7).into()])?;
            txn.update(a, vec![11.into(), (START + 7).into()])?;
            let tr = txn.table("transfers")?;
            txn.insert(tr, vec![99.into(), 10.into(), 11.into(), 7.into()])
        })
        .unwrap();
        t.commit().unwrap().unwrap()
    };
    drop(db);
    let db = open_bank(Options::durable(dir.path()));
    assert_eq!(db.lsn(), lsn_committed);
    assert!(check_bank(&db).contains(&99));
}

#[test]
fn checkpoints_bound_replay_and_drop_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        segment_bytes: 4096,
        ..Options::durable(dir.path())
    };
    let (before, checkpoint_lsn, lsn) = {
        let db = open_bank(options.clone());
        let mut rng = rand::rng();
        for id in 0..400 {
            let _ = transfer(&db, id, &mut rng);
        }
        let segments_before = std::fs::read_dir(dir.path().join("log")).unwrap().count();
        assert!(segments_before > 3, "{segments_before} segments");
        let c = db.checkpoint().unwrap().unwrap();
        for id in 400..500 {
            let _ = transfer(&db, id, &mut rng);
        }
        // The second checkpoint drops the first and every segment before it.
        let c2 = db.checkpoint().unwrap().unwrap();
        assert!(c2 > c);
        for id in 500..550 {
            let _ = transfer(&db, id, &mut rng);
        }
        let segments = std::fs::read_dir(dir.path().join("log")).unwrap().count();
        assert!(
            segments < segments_before,
            "{segments} of {segments_before}"
        );
        let checkpoints = std::fs::read_dir(dir.path().join("checkpoints"))
            .unwrap()
            .count();
        assert_eq!(checkpoints, 1);
        (contents(&db), c2, db.lsn())
    };
    let db = open_bank(options);
    assert_eq!(contents(&db), before);
    let r = db.recovery();
    assert_eq!(r.checkpoint_lsn, checkpoint_lsn);
    assert_eq!(r.replayed, lsn - checkpoint_lsn);
    check_bank(&db);
}

#[test]
fn a_panicking_procedure_rolls_back_and_the_primary_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(open_bank(Options::durable(dir.path())));
    let lsn = db.lsn();
    let err = db.call("boom", &[]).unwrap_err();
    assert!(err.to_string().contains("panicked: a bug"), "{err}");
    check_bank(&db);
    assert_eq!(db.lsn(), lsn);
    // Inside an interactive transaction too: its earlier writes go with it.
    let mut t = db.begin();
    t.call("transfer", &[1.into(), 0.into(), 1.into(), 5.into()])
        .unwrap();
    assert!(t.call("boom", &[]).is_err());
    assert!(t.commit().is_err());
    check_bank(&db);
    db.call("transfer", &[2.into(), 0.into(), 1.into(), 5.into()])
        .unwrap();
    assert_eq!(db.lsn(), lsn + 1);
    drop(db);
    let db = open_bank(Options::durable(dir.path()));
    assert_eq!(db.lsn(), lsn + 1);
    assert_eq!(check_bank(&db), BTreeSet::from([2]));
}

#[test]
fn a_waiting_transaction_gives_up_as_busy() {
    let db = Arc::new(open_bank(Options {
        lock_wait: Duration::from_millis(200),
        ..Options::default()
    }));
    let held = db.begin();
    let started = Instant::now();
    let err = db
        .call("transfer", &[1.into(), 0.into(), 1.into(), 5.into()])
        .unwrap_err();
    assert!(matches!(err, Error::Busy(_)), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(matches!(db.try_begin(), Err(Error::Busy(_))));
    drop(held);
    db.call("transfer", &[1.into(), 0.into(), 1.into(), 5.into()])
        .unwrap();
}

/// A primary that votes with others confirms its lead before each read's snapshot: when
/// it cannot, the read fails naming why, and nothing is marked.
#[test]
fn reads_wait_for_the_lead_to_be_confirmed() {
    let db = open_bank(Options::default());
    db.call("transfer", &[1.into(), 0.into(), 1.into(), 5.into()])
        .unwrap();
    let marked = db.try_mark_snapshot_if_changed().unwrap().unwrap();
    let leading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let checks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (l, c) = (leading.clone(), checks.clone());
    db.confirm_reads(Box::new(move || {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if l.load(std::sync::atomic::Ordering::Relaxed) {
            Ok(())
        } else {
            Err("a higher term".into())
        }
    }));
    // Nothing changed: the last mark, once confirmed.
    assert_eq!(db.try_mark_snapshot_if_changed().unwrap(), Some(marked));
    assert_eq!(checks.load(std::sync::atomic::Ordering::Relaxed), 1);
    leading.store(false, std::sync::atomic::Ordering::Relaxed);
    let err = db.try_mark_snapshot_if_changed().unwrap_err();
    assert!(matches!(err, Error::NotLeading(_)), "{err}");
    assert!(err.to_string().contains("a higher term"), "{err}");
    assert!(db.confirm_lead().is_err());
    db.call("transfer", &[2.into(), 0.into(), 1.into(), 5.into()])
        .unwrap();
    let lsn = db.lsn();
    assert!(db.try_mark_snapshot_if_changed().is_err());
    assert_eq!(
        db.lsn(),
        lsn,
        "a read that could not confirm marked a snapshot"
    );
    leading.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(db.try_mark_snapshot_if_changed().unwrap(), Some(lsn + 1));
}

#[test]
fn a_table_created_with_rows_is_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<Vec<Value>> = (0..1000)
        .map(|i| vec![Value::Int(i), Value::Int(i * i)])
        .collect();
    {
        let db = Database::open(Options::durable(dir.path()), procedures()).unwrap();
        db.create_table_with_rows(
            "squares",
            vec![int("n"), int("sq")],
            &["n"],
            Placement::Full,
            rows.clone(),
        )
        .unwrap();
        assert_eq!(db.lsn(), 1);
        // A duplicate key fails the whole statement: no table, nothing logged.
        let mut dup = rows.clone();
        dup.push(vec![Value::Int(5), Value::Int(0)]);
        assert!(
            db.create_table_with_rows(
                "bad",
                vec![int("n"), int("sq")],
                &["n"],
                Placement::Full,
                dup
            )
            .is_err()
        );
        assert!(db.read(|s| s.table_id("bad").is_err()));
        assert_eq!(db.lsn(), 1);
    }
    let db = Database::open(Options::durable(dir.path()), procedures()).unwrap();
    assert_eq!(contents(&db)["squares"], rows);
    assert!(db.read(|s| s.table_id("bad").is_err()));
}

#[test]
fn checkpoints_follow_the_log_growth() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_bank(Options::durable(dir.path()));
    assert_eq!(db.checkpoint_if_grown(1 << 20).unwrap(), None);
    let mut rng = rand::rng();
    let mut id = 0;
    while db.log_bytes_since_checkpoint() < 8 << 10 {
        let _ = transfer(&db, id, &mut rng);
        id += 1;
    }
    let lsn = db.checkpoint_if_grown(8 << 10).unwrap().unwrap();
    assert_eq!(lsn, db.lsn());
    assert!(db.log_bytes_since_checkpoint() < 8 << 10);
    assert_eq!(db.checkpoint_if_grown(8 << 10).unwrap(), None);
    drop(db);
    let db = open_bank(Options::durable(dir.path()));
    assert_eq!(db.recovery().checkpoint_lsn, lsn);
    check_bank(&db);
}

#[test]
fn group_commit_shares_fsyncs() {
    for group_commit in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(open_bank(Options {
            group_commit,
            ..Options::durable(dir.path())
        }));
        let start = db.log_stats().unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let db = db.clone();
                std::thread::spawn(move || {
                    let mut rng = rand::rng();
                    for i in 0..100 {
                        let _ = transfer(&db, t * 1000 + i, &mut rng);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = db.log_stats().unwrap();
        let (groups, entries) = (s.groups - start.groups, s.entries - start.entries);
        if group_commit {
            assert!(groups < entries, "{groups} groups for {entries} entries");
        } else {
            assert_eq!(groups, entries);
        }
        check_bank(&db);
    }
}

#[test]
fn a_corrupt_segment_that_is_not_the_last_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        segment_bytes: 2048,
        ..Options::durable(dir.path())
    };
    {
        let db = open_bank(options.clone());
        let mut rng = rand::rng();
        for id in 0..200 {
            let _ = transfer(&db, id, &mut rng);
        }
    }
    let mut segments: Vec<_> = std::fs::read_dir(dir.path().join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segments.sort();
    assert!(segments.len() > 2);
    let victim = &segments[1];
    let mut bytes = std::fs::read(victim).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    std::fs::write(victim, bytes).unwrap();
    let err = Database::open(options, procedures()).err().unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains(&victim.file_name().unwrap().to_string_lossy().to_string()),
        "{msg}"
    );
}

/// A power loss can tear the group being written (kill -9 cannot: the kernel finishes
/// the write). Cut the log anywhere in its last segment: recovery keeps a prefix of
/// whole transactions and the database takes new ones.
#[test]
fn a_torn_tail_recovers_a_prefix_of_whole_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        segment_bytes: 1 << 20,
        ..Options::durable(dir.path())
    };
    let log = dir.path().join("log");
    let segment_len = || {
        let mut segments: Vec<_> = std::fs::read_dir(&log)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        segments.sort();
        assert_eq!(segments.len(), 1);
        let last = segments.pop().unwrap();
        (std::fs::metadata(&last).unwrap().len(), last)
    };
    // After each commit (one at a time), how long the log was: the end of the group
    // holding that commit.
    let mut ends = vec![];
    {
        let db = open_bank(options.clone());
        ends.push((segment_len().0, db.lsn()));
        let mut rng = rand::rng();
        for id in 0..300 {
            if transfer(&db, id, &mut rng).is_ok() {
                ends.push((segment_len().0, db.lsn()));
            }
        }
    }
    let (_, last) = segment_len();
    let bytes = std::fs::read(&last).unwrap();
    let mut rng = rand::rng();
    for _ in 0..12 {
        let cut = rng.random_range(bytes.len() / 2..bytes.len() - 1);
        // Every group wholly before the cut survives; nothing after it.
        let expected = ends
            .iter()
            .filter(|(len, _)| *len as usize <= cut)
            .map(|(_, lsn)| *lsn)
            .max()
            .unwrap();
        let copy = cut_copy(&last, &bytes[..cut]);
        let db = open_bank(Options::durable(copy.path()));
        assert_eq!(db.lsn(), expected, "cut at {cut}: {:?}", db.recovery());
        check_bank(&db);
        let mut rng = rand::rng();
        transfer(&db, 1_000_000, &mut rng)
            .or_else(|_| transfer(&db, 1_000_001, &mut rng))
            .ok();
        let lsn = db.lsn();
        drop(db);
        let db = open_bank(Options::durable(copy.path()));
        assert_eq!(db.lsn(), lsn, "appending after the cut tail");
        check_bank(&db);
    }
}

/// A data directory whose log is the one segment `segment` holding only `bytes` (its
/// start, as a crash may leave it).
fn cut_copy(segment: &std::path::Path, bytes: &[u8]) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir(copy.path().join("log")).unwrap();
    std::fs::write(
        copy.path().join("log").join(segment.file_name().unwrap()),
        bytes,
    )
    .unwrap();
    copy
}

/// The environment variable that makes `crash_child` run: the data directory.
const CHILD_DIR: &str = "GYRE_REPLICA_CRASH_DIR";

/// Run by `kill_9_loses_nothing_acknowledged` in a child process: transfers from four
/// threads, a checkpoint now and then, printing each transfer id once acknowledged,
/// until killed.
#[test]
#[ignore = "run as a child process by kill_9_loses_nothing_acknowledged"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let round: i64 = std::env::var("GYRE_REPLICA_CRASH_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let options = Options {
        log_mode: if round % 2 == 0 {
            LogMode::Logical
        } else {
            LogMode::Physical
        },
        group_commit: round % 3 != 2,
        segment_bytes: 16 << 10,
        ..Options::durable(&dir)
    };
    let db = Arc::new(open_bank(options));
    println!("ready");
    let checkpointer = {
        let db = db.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(30));
                db.checkpoint().unwrap();
            }
        })
    };
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rng();
                for i in 0.. {
                    let id = round * 1_000_000_000 + t * 100_000_000 + i;
                    if transfer(&db, id, &mut rng).is_ok() {
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ack {id}").unwrap();
                        out.flush().unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    checkpointer.join().unwrap();
}

/// kill -9 at a random moment, then recovery, in a loop: every acknowledged transfer is
/// there, no transfer is there partly. `GYRE_CRASH_ROUNDS` sets the number of rounds.
#[test]
fn kill_9_loses_nothing_acknowledged() {
    let rounds: i64 = std::env::var("GYRE_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(6);
    let dir = tempfile::tempdir().unwrap();
    let mut acknowledged = BTreeSet::new();
    let mut rng = rand::rng();
    let started = Instant::now();
    for round in 0..rounds {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_DIR, dir.path())
            .env("GYRE_REPLICA_CRASH_ROUND", round.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            let mut ready = false;
            for line in std::io::BufReader::new(stdout).split(b'\n') {
                let Ok(line) = line else { break };
                let line = String::from_utf8_lossy(&line);
                if line.trim_end().ends_with("ready") {
                    ready = true;
                }
                if let Some(id) = line.strip_prefix("ack ")
                    && let Ok(id) = id.trim().parse::<i64>()
                {
                    acks.push(id);
                }
            }
            (ready, acks)
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(100..600)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let (ready, acks) = reader.join().unwrap();
        assert!(ready, "round {round}: the child never opened the database");
        let db = open_bank(Options::durable(dir.path()));
        let present = check_bank(&db);
        let missing: Vec<_> = acks.iter().filter(|id| !present.contains(id)).collect();
        assert!(
            missing.is_empty(),
            "round {round}: {} acknowledged transfers lost, e.g. {:?} (recovery {:?})",
            missing.len(),
            &missing[..missing.len().min(5)],
            db.recovery()
        );
        acknowledged.extend(acks.iter().copied());
        eprintln!(
            "round {round}: {} acknowledged, {} present, recovery {:?}",
            acks.len(),
            present.len(),
            db.recovery()
        );
        assert!(acknowledged.is_subset(&present));
    }
    assert!(
        acknowledged.len() as i64 > rounds,
        "only {} transfers acknowledged in {rounds} rounds",
        acknowledged.len()
    );
    eprintln!(
        "{rounds} rounds, {} transfers acknowledged, {:.1} s",
        acknowledged.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Waits until the shipper has been handed the group ending at `lsn`: a group is
/// shipped just after it is durable, so a moment after its commit returned.
fn wait_shipped(shipped: &parking_lot::Mutex<Vec<(u64, Vec<u8>)>>, lsn: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while shipped.lock().last().is_none_or(|(last, _)| *last < lsn) {
        assert!(Instant::now() < deadline, "LSN {lsn} was never shipped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Keeps the rows whose first key column is `index` modulo `count`.
struct ModShare {
    index: i64,
    count: i64,
}

impl gyre_replica::secondary::Share for ModShare {
    fn owns(&self, _table: &gyre_replica::TableDef, keys: &[Vec<Value>]) -> Result<Vec<bool>> {
        Ok(keys
            .iter()
            .map(|k| k[0].as_int().unwrap().rem_euclid(self.count) == self.index)
            .collect())
    }
}

#[test]
fn partitioned_tables_are_logged_physically_and_dealt_out_to_secondaries() {
    let db = Database::open(Options::default(), procedures()).unwrap();
    let shipped = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sink = Arc::clone(&shipped);
    db.ship(Box::new(move |last, frames| {
        sink.lock().push((last, frames.to_vec()))
    }))
    .unwrap();
    create_bank(&db, Placement::Partitioned);
    let count = 3;
    let share = |index| Arc::new(ModShare { index, count });
    let mut secondaries: Vec<Secondary> = (0..count)
        .map(|i| {
            Secondary::from_state_shared(gyre_replica::Store::default(), procedures(), share(i))
                .unwrap()
        })
        .collect();
    let mut rng = rand::rng();
    let mut late = None;
    for id in 0..200 {
        let _ = transfer(&db, id, &mut rng);
        if id == 100 {
            // A secondary that joins halfway keeps its share of the state it is sent.
            late = Some(
                Secondary::from_state_shared((*db.snapshot()).clone(), procedures(), share(1))
                    .unwrap(),
            );
        }
    }
    db.transaction(|txn| {
        let t = txn.table("accounts")?;
        txn.delete(t, &[Value::Int(4)])?;
        txn.insert(t, vec![Value::Int(ACCOUNTS), Value::Int(0)])
    })
    .unwrap();
    let mut late = late.unwrap();
    let mut logical = 0;
    wait_shipped(&shipped, db.lsn());
    for (_, frames) in shipped.lock().iter() {
        let (_, entries, _) = gyre_replica::log::segment::frame(frames).unwrap();
        logical += entries
            .iter()
            .filter(|e| matches!(e, gyre_replica::log::Entry::Logical { .. }))
            .count();
        for s in &mut secondaries {
            s.apply_frames(frames).unwrap();
        }
        late.apply_frames(frames).unwrap();
    }
    // Transfers read the partitioned accounts: no secondary could run them again.
    assert_eq!(logical, 0);
    let primary = contents(&db);
    let mut dealt = Vec::new();
    for (i, s) in secondaries.iter_mut().enumerate() {
        assert_eq!(s.lsn(), db.lsn());
        let mine = stored(s, "accounts");
        assert!(
            mine.iter()
                .all(|r| r[0].as_int().unwrap() % count == i as i64),
            "secondary {i} holds another's rows"
        );
        assert_eq!(
            stored(s, "transfers"),
            primary["transfers"],
            "a full table is whole"
        );
        assert_eq!(s.snapshot().tables["accounts"].rows().unwrap(), mine);
        dealt.extend(mine);
    }
    dealt.sort_by_key(|r| r[0].as_int());
    assert_eq!(dealt, primary["accounts"], "the shares make the table once");
    assert_eq!(
        stored(&mut late, "accounts"),
        stored(&mut secondaries[1], "accounts")
    );
    // A logical entry that touches a partitioned table is refused, not replayed on
    // a part of it.
    let err = secondaries[0]
        .apply(
            db.lsn() + 1,
            gyre_replica::log::Entry::Logical {
                procedure: "transfer".into(),
                args: vec![
                    Value::Int(9_999),
                    Value::Int(0),
                    Value::Int(3),
                    Value::Int(0),
                ],
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("partitioned"), "{err}");
}

/// A table created without a primary key numbers its rows: the number is its hidden
/// last column and its key, assigned on insert (the greatest plus one), carried by the
/// log, kept by checkpoints, and the same after replay of logical entries. Equal rows
/// are told apart by it, so a statement that read rows by value finds distinct ones.
#[test]
fn tables_without_a_key_number_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let text = |s: &str| Value::Text(s.into());
    let options = || Options {
        log_mode: LogMode::Logical,
        ..Options::durable(dir.path())
    };
    let shipped = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let expected = {
        let db = Database::open(options(), procedures()).unwrap();
        let sink = Arc::clone(&shipped);
        db.ship(Box::new(move |last, frames| {
            sink.lock().push((last, frames.to_vec()))
        }))
        .unwrap();
        // The name is reserved.
        let reserved = db
            .create_table_with_rows(
                "bad",
                vec![int(gyre_replica::ROW_ID)],
                &[],
                Placement::Full,
                vec![],
            )
            .unwrap_err();
        assert!(reserved.to_string().contains("reserved"), "{reserved}");
        let rows = vec![vec![text("a")], vec![text("b")], vec![text("a")]];
        let id = db
            .create_table_with_rows(
                "notes",
                vec![Column::new("text", ColumnType::Text, false)],
                &[],
                Placement::Full,
                rows,
            )
            .unwrap();
        let def = db.read(|s| s.table(id).unwrap().def.clone());
        assert!(def.has_row_id());
        assert_eq!(def.visible_columns().len(), 1);
        assert_eq!(def.visible_schema().fields().len(), 1);
        // Logical: the row numbers come from the state, so replay gives the same.
        for t in ["a", "c", "a", "c", "c"] {
            db.call("note", &[text(t)]).unwrap();
        }
        db.checkpoint().unwrap();
        db.transaction(|txn| {
            // Two of the three "c" rows, by value: two distinct rows.
            let keys = txn.match_rows(id, &[vec![text("c")], vec![text("c")]])?;
            assert_eq!(keys.len(), 2);
            assert_ne!(keys[0], keys[1]);
            for k in &keys {
                txn.delete(id, k)?;
            }
            // More than the table holds: an error, not a row changed twice.
            let err = txn
                .match_rows(id, &[vec![text("c")], vec![text("c")]])
                .unwrap_err();
            assert!(err.to_string().contains("more often"), "{err}");
            let b = txn.match_rows(id, &[vec![text("b")]])?;
            txn.update(id, vec![text("B"), b[0][0].clone()])?;
            txn.insert(id, vec![text("d")])
        })
        .unwrap();
        let rows = contents(&db)["notes"].clone();
        let numbers: Vec<i64> = rows.iter().map(|r| r[1].as_int().unwrap()).collect();
        // 1-3 created; notes 4-8 (the second and third "a" dropped rows 1 and 3, the
        // third "c" row 5); the "c" rows 7 and 8 deleted by value; "d" numbered after
        // the greatest left.
        assert_eq!(numbers, [2, 4, 6, 7], "{rows:?}");
        assert_eq!(rows[0], vec![text("B"), Value::Int(2)]);
        wait_shipped(&shipped, db.lsn());
        rows
    };
    let db = Database::open(options(), procedures()).unwrap();
    assert_eq!(contents(&db)["notes"], expected);
    let mut secondary = Secondary::new(procedures());
    for (_, frames) in shipped.lock().iter() {
        secondary.apply_frames(frames).unwrap();
    }
    assert_eq!(stored(&mut secondary, "notes"), expected);
    db.call("note", &[text("e")]).unwrap();
    let last = contents(&db)["notes"].last().unwrap().clone();
    assert_eq!(last, vec![text("e"), Value::Int(8)]);
}

/// The length of the log's one segment under `dir`, and its path.
fn only_segment(dir: &std::path::Path) -> (u64, std::path::PathBuf) {
    let segments = gyre_replica::log::segment::list(&dir.join("log")).unwrap();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let path = segments[0].1.clone();
    (std::fs::metadata(&path).unwrap().len(), path)
}

#[test]
fn a_load_in_several_entries_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        load_piece_bytes: 4 << 10,
        ..Options::durable(dir.path())
    };
    let text = |i: i64| Value::Text(format!("row {i}").into());
    let keyed = || vec![int("k"), Column::new("v", ColumnType::Text, false)];
    let rows = |from: i64, to: i64| -> Vec<Vec<Value>> {
        (from..to).map(|i| vec![Value::Int(i), text(i)]).collect()
    };
    // In batches of 1000 rows, as a query gives them.
    let batches = move |n: i64| {
        (0..n)
            .step_by(1000)
            .map(move |at| Ok(rows(at, (at + 1000).min(n))))
    };
    let texts = |n: i64| {
        (0..n)
            .step_by(700)
            .map(move |at| Ok((at..(at + 700).min(n)).map(|i| vec![text(i)]).collect()))
    };
    let shipped = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (before_last, after_last) = {
        let db = Database::open(options.clone(), procedures()).unwrap();
        let sink = Arc::clone(&shipped);
        db.ship(Box::new(move |last, frames| {
            sink.lock().push((last, frames.to_vec()))
        }))
        .unwrap();
        let entries = db.log_stats().unwrap().entries;
        db.load_table(
            "keyed",
            keyed(),
            &["k"],
            Placement::Partitioned,
            batches(20_000),
        )
        .unwrap();
        let entries = db.log_stats().unwrap().entries - entries;
        assert!(entries > 20, "a load of 20,000 rows in {entries} entries");
        // Without a key, the rows are numbered across the pieces.
        let columns = vec![Column::new("v", ColumnType::Text, false)];
        db.load_table("numbered", columns, &[], Placement::Chunked, texts(9_000))
            .unwrap();
        // A duplicate key in a later batch fails the load after pieces were logged:
        // no table, and the load's end is logged as discarded.
        let lsn = db.lsn();
        let dup = batches(10_000).chain([Ok(rows(5, 6))]);
        let err = db
            .load_table("dup", keyed(), &["k"], Placement::Full, dup)
            .unwrap_err();
        assert!(err.to_string().contains("duplicate key"), "{err}");
        assert!(db.read(|s| s.table_id("dup").is_err()));
        assert!(db.lsn() > lsn + 3, "its entries and its end are logged");
        // So does a batch that fails to convert.
        let bad = batches(10_000).chain([Err(Error::Constraint("a bad batch".into()))]);
        let err = db
            .load_table("dup", keyed(), &["k"], Placement::Full, bad)
            .unwrap_err();
        assert!(err.to_string().contains("a bad batch"), "{err}");
        // The name is free again.
        db.load_table("dup", keyed(), &["k"], Placement::Full, batches(3_000))
            .unwrap();
        let before_last = only_segment(dir.path()).0;
        db.load_table("last", keyed(), &["k"], Placement::Full, batches(8_000))
            .unwrap();
        wait_shipped(&shipped, db.lsn());
        (before_last, only_segment(dir.path()).0)
    };
    let check = |db: &Database| {
        let c = contents(db);
        assert_eq!(c["keyed"], rows(0, 20_000));
        let numbered = &c["numbered"];
        assert_eq!(numbered.len(), 9_000);
        for (i, row) in numbered.iter().enumerate() {
            assert_eq!(row, &vec![text(i as i64), Value::Int(i as i64 + 1)]);
        }
        assert_eq!(c["dup"], rows(0, 3_000));
    };
    let db = Database::open(options.clone(), procedures()).unwrap();
    check(&db);
    assert_eq!(contents(&db)["last"].len(), 8_000);
    assert_eq!(db.recovery().dropped_load, None);
    drop(db);
    // Secondaries replaying the log keep their shares of the split tables, and
    // together hold every row once; the failed loads left nothing behind.
    let mut held = BTreeMap::<String, usize>::new();
    for index in 0..2 {
        let share = Arc::new(ModShare { index, count: 2 });
        let mut secondary =
            Secondary::from_state_shared(gyre_replica::Store::default(), procedures(), share)
                .unwrap();
        for (_, frames) in shipped.lock().iter() {
            secondary.apply_frames(frames).unwrap();
        }
        let snapshot = secondary.snapshot();
        for (name, table) in &snapshot.tables {
            let rows: usize = table.batches().iter().map(|b| b.num_rows()).sum();
            assert_eq!(stored(&mut secondary, name).len(), rows);
            *held.entry(name.clone()).or_default() += rows;
        }
    }
    let expected = [("dup", 6_000), ("keyed", 20_000), ("last", 16_000)];
    let expected = expected.map(|(n, r)| (n.to_string(), r));
    let mut expected = BTreeMap::from(expected);
    expected.insert("numbered".into(), 9_000);
    assert_eq!(held, expected);
    // A crash inside a load: the log cut anywhere in its entries recovers without the
    // table, logs the load's end, and goes on.
    let (_, path) = only_segment(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len() as u64, after_last);
    let mut rng = rand::rng();
    for _ in 0..6 {
        let cut = rng.random_range(before_last as usize..bytes.len() - 1);
        let copy = cut_copy(&path, &bytes[..cut]);
        let options = Options {
            load_piece_bytes: 4 << 10,
            ..Options::durable(copy.path())
        };
        let db = Database::open(options.clone(), procedures()).unwrap();
        let recovery = db.recovery();
        check(&db);
        assert!(db.read(|s| s.table_id("last").is_err()), "cut at {cut}");
        let lsn = db.lsn();
        drop(db);
        let db = Database::open(options.clone(), procedures()).unwrap();
        assert_eq!(db.lsn(), lsn, "cut at {cut}: {recovery:?}");
        assert_eq!(db.recovery().dropped_load, None, "the end was logged");
        db.load_table("last", keyed(), &["k"], Placement::Full, batches(2_000))
            .unwrap();
        drop(db);
        let db = Database::open(options, procedures()).unwrap();
        check(&db);
        assert_eq!(contents(&db)["last"], rows(0, 2_000));
    }
}

/// A physical entry carries an update as the columns it changed: the secondaries and
/// recovery rebuild the whole row from the one they hold, and a change they cannot
/// apply (a key column, a row that is not there) is refused and changes nothing.
#[test]
fn updates_are_logged_as_their_changed_columns_and_replayed_whole() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        log_mode: LogMode::Physical,
        ..Options::durable(dir.path())
    };
    let text = |name: &str| Column::new(name, ColumnType::Text, true);
    let row = |id: i64, n: i64| {
        vec![
            Value::Int(id),
            Value::Int(n),
            Value::Text(format!("{id:0>40}").into()),
            Value::Text("unchanged".into()),
        ]
    };
    let before = {
        let db = Database::open(options.clone(), procedures()).unwrap();
        let shipped = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = Arc::clone(&shipped);
        db.ship(Box::new(move |last, frames| {
            sink.lock().push((last, frames.to_vec()))
        }))
        .unwrap();
        let mut secondary =
            Secondary::from_state(gyre_replica::Store::default(), procedures()).unwrap();
        db.create_table(
            "wide",
            vec![int("id"), int("n"), text("a"), text("b")],
            &["id"],
        )
        .unwrap();
        db.transaction(|txn| {
            let t = txn.table("wide")?;
            (0..100).try_for_each(|id| txn.insert(t, row(id, 0)))
        })
        .unwrap();
        db.transaction(|txn| {
            let t = txn.table("wide")?;
            for id in 0..100 {
                let mut r = txn.get(t, &[Value::Int(id)])?.unwrap().to_vec();
                r[1] = Value::Int(id * 2);
                txn.update(t, r)?;
            }
            // Every non-key column changes: the whole row is shorter.
            txn.update(
                t,
                vec![Value::Int(7), Value::Int(1), Value::Null, Value::Null],
            )
        })
        .unwrap();
        wait_shipped(&shipped, db.lsn());
        let mut ops = Vec::new();
        for (_, frames) in shipped.lock().iter() {
            let (_, entries, _) = gyre_replica::log::segment::frame(frames).unwrap();
            ops.extend(entries.into_iter().flat_map(|e| match e {
                gyre_replica::log::Entry::Physical { ops } => ops,
                _ => vec![],
            }));
            secondary.apply_frames(frames).unwrap();
        }
        let patches: Vec<_> = ops
            .iter()
            .filter_map(|op| match op {
                gyre_replica::RowOp::Patch { key, columns, .. } => Some((key, columns)),
                _ => None,
            })
            .collect();
        assert_eq!(patches.len(), 100, "{ops:?}");
        assert_eq!(
            patches[3],
            (&vec![Value::Int(3)], &vec![(1, Value::Int(6))])
        );
        assert!(matches!(
            ops.last(),
            Some(gyre_replica::RowOp::Update { .. })
        ));
        let primary = contents(&db)["wide"].clone();
        assert_eq!(primary[3], row(3, 6));
        let replica = secondary.snapshot().tables["wide"].rows().unwrap();
        assert_eq!(replica, primary, "the secondary rebuilt the whole rows");
        // A patch of a key column is refused, with the update before it in its entry
        // (the store's tests refuse the other bad patches).
        let wide = db.read(|s| s.table_id("wide")).unwrap();
        let err = secondary
            .apply(
                db.lsn() + 1,
                gyre_replica::log::Entry::Physical {
                    ops: vec![
                        gyre_replica::RowOp::Update {
                            table: wide,
                            row: row(4, 9).into(),
                        },
                        gyre_replica::RowOp::Patch {
                            table: wide,
                            key: vec![Value::Int(3)],
                            columns: vec![(0, Value::Int(1))],
                        },
                    ],
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("names column 0"), "{err}");
        assert_eq!(secondary.lsn(), db.lsn());
        assert_eq!(
            secondary.snapshot().tables["wide"].rows().unwrap(),
            primary,
            "a refused entry changed nothing"
        );
        primary
    };
    let db = Database::open(options, procedures()).unwrap();
    assert_eq!(contents(&db)["wide"], before, "recovery rebuilt the rows");
}

/// A standby follows the primary's replicated log: every write's frames reach it
/// through the replicator before the commit is acknowledged, the primary skips its own
/// frames coming back, and a third database restored from the standby's state buffer
/// goes on from there. A replicator that fails stops the log: nothing after it is
/// acknowledged.
#[test]
fn a_standby_follows_the_replicated_log_and_a_failed_replication_stops_the_primary() {
    let primary = Arc::new(open_bank(Options::default()));
    let standby = Arc::new(Database::open(Options::default(), procedures()).unwrap());
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (primary, standby, fail) = (primary.clone(), standby.clone(), fail.clone());
        // The bank's tables were created before the replicator: the standby starts
        // from the primary's state, as a Raft snapshot would give it.
        standby
            .restore(primary.state_bytes().unwrap().into())
            .unwrap();
        let weak = Arc::downgrade(&primary);
        primary
            .replicate(Box::new(move |frames| {
                if fail.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err("not the primary: voter 2 is".into());
                }
                standby
                    .apply_replicated(frames)
                    .map_err(|e| e.to_string())?;
                // The primary's own frames come back to it as well: skipped.
                if let Some(primary) = weak.upgrade() {
                    primary
                        .apply_replicated(frames)
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            }))
            .unwrap();
    }
    let mut rng = rand::rng();
    for id in 0..100 {
        let _ = transfer(&primary, id, &mut rng);
    }
    assert_eq!(standby.lsn(), primary.lsn());
    assert_eq!(contents(&standby), contents(&primary));
    let ids = check_bank(&standby);
    assert!(!ids.is_empty());

    let third = Database::open(Options::default(), procedures()).unwrap();
    third
        .restore(standby.state_bytes().unwrap().into())
        .unwrap();
    assert_eq!(contents(&third), contents(&primary));
    // A state older than the one held is refused.
    let older = Database::open(Options::default(), procedures()).unwrap();
    let err = third
        .restore(older.state_bytes().unwrap().into())
        .unwrap_err();
    assert!(err.to_string().contains("restored over"), "{err}");

    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = transfer(&primary, 1000, &mut rng).unwrap_err();
    assert!(err.to_string().contains("not the primary"), "{err}");
    let err = transfer(&primary, 1001, &mut rng).unwrap_err();
    assert!(err.to_string().contains("not the primary"), "{err}");
    assert_eq!(check_bank(&standby), ids);
    // Damaged frames are refused whole.
    let err = standby.apply_replicated(&[1, 2, 3]).unwrap_err();
    assert!(err.to_string().contains("replicated log"), "{err}");
    assert_eq!(check_bank(&standby), ids);
}
