//! Transactional tables on the primary through SQL: `WITH (replication = 'full')`
//! tables, INSERT, UPDATE, DELETE, BEGIN/COMMIT/ROLLBACK per session, CALL of stored
//! procedures, durability across restarts under `--data-dir`, and kill -9 of a served
//! `gyre local` while clients commit.

use arrow::array::{Array, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use gyre_cluster::coordinator::StatementResult;
use gyre_cluster::{Coordinator, Limits, LocalCluster, PrimaryConfig};
use gyre_replica::{Column, ColumnType, Procedure, Procedures, Txn, Value};
use rand::Rng;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `transfer(from, to, amount)`: moves money between two accounts, refusing to
/// overdraw, and returns the new balances.
struct Transfer;

impl Procedure for Transfer {
    fn name(&self) -> &str {
        "transfer"
    }

    fn params(&self) -> Vec<Column> {
        ["src", "dst", "amount"]
            .iter()
            .map(|n| Column::new(*n, ColumnType::Int64, false))
            .collect()
    }

    fn returns(&self) -> Vec<Column> {
        vec![
            Column::new("src_balance", ColumnType::Int64, false),
            Column::new("dst_balance", ColumnType::Int64, false),
        ]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> gyre_replica::Result<Vec<Vec<Value>>> {
        let t = txn.table("accounts")?;
        let amount = args[2].as_int().unwrap();
        let mut balances = vec![];
        for (account, delta) in [(&args[0], -amount), (&args[1], amount)] {
            let row = txn
                .get(t, std::slice::from_ref(account))?
                .ok_or_else(|| Txn::abort(format!("no account {account:?}")))?;
            let balance = row[1].as_int().unwrap() + delta;
            if balance < 0 {
                return Err(Txn::abort("insufficient funds"));
            }
            txn.update(t, vec![account.clone(), Value::Int(balance)])?;
            balances.push(Value::Int(balance));
        }
        Ok(vec![balances])
    }
}

fn primary(data_dir: Option<&Path>) -> PrimaryConfig {
    PrimaryConfig {
        data_dir: data_dir.map(Path::to_path_buf),
        procedures: Procedures::new().with(Transfer),
        ..Default::default()
    }
}

async fn cluster(workers: usize, data_dir: Option<&Path>) -> LocalCluster {
    cluster_with(workers, primary(data_dir)).await
}

/// An embedded cluster of `workers` workers whose primary is configured so.
async fn cluster_with(workers: usize, primary: PrimaryConfig) -> LocalCluster {
    let limits = Limits {
        primary,
        ..Default::default()
    };
    LocalCluster::start_limited(
        workers,
        1,
        "127.0.0.1:0".parse().unwrap(),
        &Default::default(),
        &limits,
    )
    .await
    .unwrap()
}

/// Every value of a result as i64, row by row.
fn ints(results: &[StatementResult]) -> Vec<Vec<i64>> {
    let mut rows = vec![];
    for r in results {
        for b in &r.batches {
            let cols: Vec<Int64Array> = b
                .columns()
                .iter()
                .map(|c| {
                    let c = cast(c, &DataType::Int64).unwrap();
                    c.as_any().downcast_ref::<Int64Array>().unwrap().clone()
                })
                .collect();
            for i in 0..b.num_rows() {
                rows.push(
                    cols.iter()
                        .map(|c| if c.is_null(i) { i64::MIN } else { c.value(i) })
                        .collect(),
                );
            }
        }
    }
    rows
}

async fn sql(
    c: &Arc<Coordinator>,
    s: &datafusion::prelude::SessionContext,
    q: &str,
) -> Vec<Vec<i64>> {
    ints(&c.sql_in(s, q).await.unwrap_or_else(|e| panic!("{q}: {e}")))
}

async fn fails(c: &Arc<Coordinator>, s: &datafusion::prelude::SessionContext, q: &str) -> String {
    match c.sql_in(s, q).await {
        Ok(_) => panic!("{q} succeeded"),
        Err(e) => e.to_string(),
    }
}

const ACCOUNTS: i64 = 1000;

async fn create_accounts(c: &Arc<Coordinator>, s: &datafusion::prelude::SessionContext) {
    sql(
        c,
        s,
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL) \
         WITH (replication = 'full')",
    )
    .await;
    let n = sql(
        c,
        s,
        &format!(
            "INSERT INTO accounts SELECT value, 100 FROM generate_series(0, {}) ",
            ACCOUNTS - 1
        ),
    )
    .await;
    assert_eq!(n, vec![vec![ACCOUNTS]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dml_and_transactions_on_a_replicated_table() {
    let cluster = cluster(2, None).await;
    let c = &cluster.coordinator;
    let a = c.new_session();
    let b = c.new_session();
    create_accounts(c, &a).await;
    let total = "SELECT count(*), sum(balance) FROM accounts";
    assert_eq!(
        sql(c, &b, total).await,
        vec![vec![ACCOUNTS, 100 * ACCOUNTS]]
    );

    // Statements outside BEGIN commit on their own.
    assert_eq!(
        sql(
            c,
            &a,
            "UPDATE accounts SET balance = balance + 5 WHERE id % 10 = 0"
        )
        .await,
        vec![vec![ACCOUNTS / 10]]
    );
    assert_eq!(
        sql(c, &b, "DELETE FROM accounts WHERE id >= 990").await,
        vec![vec![10]]
    );
    assert_eq!(sql(c, &b, total).await, vec![vec![990, 100 * 990 + 5 * 99]]);

    // A duplicate key fails the whole statement: none of its rows go in.
    let err = fails(c, &a, "INSERT INTO accounts VALUES (2000, 1), (3, 1)").await;
    assert!(err.contains("duplicate key"), "{err}");
    assert_eq!(
        sql(c, &a, "SELECT count(*) FROM accounts WHERE id = 2000").await,
        vec![vec![0]]
    );
    // Keys cannot change, nor can NOT NULL columns be NULL.
    let err = fails(c, &a, "UPDATE accounts SET id = id + 1 WHERE id = 5").await;
    assert!(err.contains("primary key"), "{err}");
    let err = fails(c, &a, "UPDATE accounts SET balance = NULL WHERE id = 5").await;
    assert!(err.to_lowercase().contains("null"), "{err}");

    // A transaction sees its own writes; others see them once it commits.
    sql(c, &a, "BEGIN").await;
    sql(
        c,
        &a,
        "UPDATE accounts SET balance = balance - 30 WHERE id = 1",
    )
    .await;
    sql(
        c,
        &a,
        "UPDATE accounts SET balance = balance + 30 WHERE id = 2",
    )
    .await;
    sql(c, &a, "INSERT INTO accounts VALUES (5000, 0)").await;
    let mine = "SELECT id, balance FROM accounts WHERE id IN (1, 2, 5000) ORDER BY id";
    assert_eq!(
        sql(c, &a, mine).await,
        vec![vec![1, 70], vec![2, 130], vec![5000, 0]]
    );
    assert_eq!(sql(c, &b, mine).await, vec![vec![1, 100], vec![2, 100]]);
    // The other session's writes wait for the transaction, then fail after the wait
    // (here: the transaction commits first, so it goes through).
    let b2 = b.clone();
    let c2 = Arc::clone(c);
    let waiting = tokio::spawn(async move {
        c2.sql_in(
            &b2,
            "UPDATE accounts SET balance = balance + 1 WHERE id = 3",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a second writer ran during a transaction"
    );
    sql(c, &a, "COMMIT").await;
    waiting.await.unwrap().unwrap();
    assert_eq!(
        sql(c, &b, mine).await,
        vec![vec![1, 70], vec![2, 130], vec![5000, 0]]
    );

    // ROLLBACK takes everything back.
    sql(c, &a, "BEGIN").await;
    sql(c, &a, "DELETE FROM accounts").await;
    assert_eq!(
        sql(c, &a, "SELECT count(*) FROM accounts").await,
        vec![vec![0]]
    );
    sql(c, &a, "ROLLBACK").await;
    assert_eq!(
        sql(c, &b, "SELECT count(*) FROM accounts").await,
        vec![vec![991]]
    );

    // A failed statement rolls the transaction back; the session must end it.
    sql(c, &a, "BEGIN").await;
    sql(c, &a, "UPDATE accounts SET balance = 0 WHERE id = 4").await;
    fails(c, &a, "INSERT INTO accounts VALUES (4, 1)").await;
    let err = fails(c, &a, "SELECT 1").await;
    assert!(err.contains("ROLLBACK"), "{err}");
    let err = fails(c, &a, "COMMIT").await;
    assert!(err.contains("rolled back"), "{err}");
    assert_eq!(
        sql(c, &b, "SELECT balance FROM accounts WHERE id = 4").await,
        vec![vec![100]]
    );
    // Distributed tables are not transactional: refused inside a transaction.
    sql(c, &a, "CREATE TABLE plain (x BIGINT)").await;
    sql(c, &a, "BEGIN").await;
    let err = fails(c, &a, "INSERT INTO plain VALUES (1)").await;
    assert!(err.contains("inside a transaction"), "{err}");
    sql(c, &a, "ROLLBACK").await;

    // BEGIN inside a transaction is ignored (as in PostgreSQL): the transaction goes on.
    sql(c, &a, "BEGIN").await;
    sql(
        c,
        &a,
        "UPDATE accounts SET balance = balance + 0 WHERE id = 6",
    )
    .await;
    sql(c, &a, "BEGIN").await;
    sql(c, &a, "COMMIT").await;
    // DataFusion plans no UPDATE ... FROM (so no key can come from another table).
    sql(c, &a, "CREATE TABLE moves (old BIGINT, new BIGINT)").await;
    let err = fails(
        c,
        &a,
        "UPDATE accounts SET balance = moves.new FROM moves WHERE accounts.id = moves.old",
    )
    .await;
    assert!(err.contains("not supported"), "{err}");

    // Stored procedures, alone and inside a transaction.
    assert_eq!(
        sql(c, &a, "CALL transfer(10, 11, 5 * 2)").await,
        vec![vec![95, 110]]
    );
    // Arguments computed from constants, evaluated without a query.
    assert_eq!(
        sql(
            c,
            &a,
            "CALL transfer(16, 17, CAST('3' AS BIGINT) + abs(-2))"
        )
        .await,
        vec![vec![95, 105]]
    );
    // An argument that reads a table is evaluated as a query: 110 - 100.
    assert_eq!(
        sql(
            c,
            &a,
            "CALL transfer(14, 15, (SELECT balance FROM accounts WHERE id = 11) - 100)"
        )
        .await,
        vec![vec![90, 110]]
    );
    let err = fails(c, &a, "CALL transfer(12, 13, 1000)").await;
    assert!(err.contains("insufficient funds"), "{err}");
    let err = fails(c, &a, "CALL transfer(1, 2)").await;
    assert!(err.contains("takes 3 arguments"), "{err}");
    let err = fails(c, &a, "CALL transfer(1, 2, 'ten')").await;
    assert!(err.contains("amount"), "{err}");
    sql(c, &a, "BEGIN").await;
    sql(c, &a, "CALL transfer(20, 21, 7)").await;
    sql(
        c,
        &a,
        "UPDATE accounts SET balance = balance + 1 WHERE id = 21",
    )
    .await;
    sql(c, &a, "COMMIT").await;
    assert_eq!(
        sql(
            c,
            &b,
            "SELECT balance FROM accounts WHERE id IN (20, 21) ORDER BY id"
        )
        .await,
        vec![vec![98], vec![108]]
    );

    // Transactional tables join distributed ones.
    sql(
        c,
        &a,
        "INSERT INTO plain SELECT value FROM generate_series(0, 99)",
    )
    .await;
    assert_eq!(
        sql(
            c,
            &a,
            "SELECT count(*), sum(balance) FROM accounts JOIN plain ON id = x"
        )
        .await,
        // 100 each, +5 on ten of them, +1 on account 3 and +1 on account 21; the
        // transfers among them add nothing.
        vec![vec![100, 100 * 100 + 5 * 10 + 1 + 1]]
    );
    sql(c, &a, "DROP TABLE accounts").await;
    assert!(
        fails(c, &a, "SELECT * FROM accounts")
            .await
            .contains("accounts")
    );
}

/// The LSN of the snapshot `EXPLAIN ANALYZE` says a query read, and its workers.
async fn snapshot_of(
    c: &Arc<Coordinator>,
    s: &datafusion::prelude::SessionContext,
    q: &str,
) -> (u64, usize) {
    let results = c.sql_in(s, &format!("EXPLAIN ANALYZE {q}")).await.unwrap();
    let text = format!(
        "{}",
        arrow::util::pretty::pretty_format_batches(&results[0].batches).unwrap()
    );
    let field = |name: &str| -> u64 {
        let at = text
            .find(name)
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        text[at + name.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    (field("snapshot_lsn="), field("workers=") as usize)
}

/// Reads outside a transaction run on the workers, each a secondary that replays the
/// primary's log, on one global snapshot: concurrent transfers never show a changed
/// total however the table is split over the workers, a session reads its own commits,
/// a worker that joins later starts from the primary's state, and the primary marks a
/// snapshot each second when something changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_run_on_the_secondaries_at_global_snapshots() {
    let mut cluster = cluster(2, None).await;
    let c = Arc::clone(&cluster.coordinator);
    let s = c.new_session();
    create_accounts(&c, &s).await;
    let total = "SELECT sum(balance), count(*) FROM accounts";
    let (first, workers) = snapshot_of(&c, &s, total).await;
    assert_eq!(workers, 2);
    // Nothing changed: the next query reads the same snapshot.
    assert_eq!(snapshot_of(&c, &s, total).await.0, first);

    // Transfers run while another session sums: every snapshot has the same total.
    let writer = {
        let c = Arc::clone(&c);
        tokio::spawn(async move {
            let s = c.new_session();
            let calls: Vec<String> = {
                let mut rng = rand::rng();
                (0..300)
                    .map(|_| {
                        // Accounts below 100 only receive: the reads below draw on
                        // accounts 0 to 19, which must keep their funds.
                        let (from, to) = (
                            rng.random_range(100..ACCOUNTS),
                            rng.random_range(0..ACCOUNTS),
                        );
                        format!("CALL transfer({from}, {to}, {})", rng.random_range(1..50))
                    })
                    .collect()
            };
            for call in calls {
                let _ = c.sql_in(&s, &call).await;
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() {
        assert_eq!(
            sql(&c, &s, total).await,
            vec![vec![100 * ACCOUNTS, ACCOUNTS]]
        );
        reads += 1;
    }
    writer.await.unwrap();
    assert!(reads > 3, "{reads} reads only");

    // A session reads its own commits, and snapshots never go back.
    let mut last = snapshot_of(&c, &s, total).await.0;
    for i in 0..20 {
        let balances = sql(&c, &s, &format!("CALL transfer({i}, {}, 1)", i + 500)).await;
        let read = sql(
            &c,
            &s,
            &format!(
                "SELECT balance FROM accounts WHERE id IN ({i}, {}) ORDER BY id",
                i + 500
            ),
        )
        .await;
        assert_eq!(read, vec![vec![balances[0][0]], vec![balances[0][1]]]);
        let (lsn, _) = snapshot_of(&c, &s, total).await;
        assert!(lsn > last, "snapshot {lsn} after {last}");
        last = lsn;
    }

    // A worker that joins later starts from the primary's state, and reads its part.
    cluster.start_worker(1).await.unwrap();
    c.wait_for_workers(3, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        sql(&c, &s, total).await,
        vec![vec![100 * ACCOUNTS, ACCOUNTS]]
    );
    assert_eq!(snapshot_of(&c, &s, total).await.1, 3);
    assert_eq!(
        sql(
            &c,
            &s,
            "SELECT count(*) FROM accounts a JOIN accounts b USING (id)"
        )
        .await,
        vec![vec![ACCOUNTS]]
    );

    // One more commit, then no query: the primary marks a snapshot within a second,
    // and every worker replays it.
    sql(&c, &s, "CALL transfer(1, 2, 1)").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lsns: Vec<u64> = cluster.workers().map(|w| w.secondary.lsn()).collect();
        if lsns.iter().all(|&l| l >= last + 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no periodic snapshot: {lsns:?} after {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The query reads that periodic snapshot: nothing changed since.
    assert_eq!(snapshot_of(&c, &s, total).await.0, last + 2);

    // A reader does not wait for another session's open transaction: with a commit
    // since the last snapshot, it reads the primary's last commit instead.
    let before = sql(&c, &s, "SELECT balance FROM accounts WHERE id = 4").await[0][0];
    sql(&c, &s, "CALL transfer(4, 5, 1)").await;
    let holder = c.new_session();
    sql(&c, &holder, "BEGIN").await;
    sql(&c, &holder, "UPDATE accounts SET balance = 0 WHERE id = 3").await;
    let started = Instant::now();
    assert_eq!(
        sql(
            &c,
            &s,
            "SELECT balance FROM accounts WHERE id IN (3, 4) ORDER BY id"
        )
        .await[1],
        vec![before - 1]
    );
    assert_eq!(
        sql(&c, &s, total).await,
        vec![vec![100 * ACCOUNTS, ACCOUNTS]]
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    sql(&c, &holder, "ROLLBACK").await;
}

/// The log multicast to the workers (each group sent once, checked against the
/// cluster secret): transfers and reads agree as with a stream per worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_log_reaches_the_workers_by_multicast() {
    let port = 20_000 + rand::random::<u16>() % 20_000;
    let cluster = cluster_with(
        2,
        PrimaryConfig {
            log_multicast: Some(gyre_replica::ship::Group {
                group: std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(239, 255, 71, 2), port),
                interface: std::net::Ipv4Addr::LOCALHOST,
            }),
            ..primary(None)
        },
    )
    .await;
    let c = &cluster.coordinator;
    let s = c.new_session();
    create_accounts(c, &s).await;
    for i in 0..50 {
        let balances = sql(c, &s, &format!("CALL transfer({i}, {}, 7)", i + 100)).await;
        let read = sql(
            c,
            &s,
            &format!(
                "SELECT balance FROM accounts WHERE id IN ({i}, {}) ORDER BY id",
                i + 100
            ),
        )
        .await;
        assert_eq!(read, vec![vec![balances[0][0]], vec![balances[0][1]]]);
    }
    assert_eq!(
        sql(c, &s, "SELECT sum(balance), count(*) FROM accounts").await,
        vec![vec![100 * ACCOUNTS, ACCOUNTS]]
    );
    // Both workers subscribed, and both replayed everything the primary logged.
    let primary = sql(c, &s, "SELECT lsn, secondaries FROM gyre_primary()").await;
    assert_eq!(primary[0][1], 2);
    let replayed = sql(c, &s, "SELECT min(replayed_lsn) FROM gyre_workers()").await;
    assert!(replayed[0][0] >= primary[0][0], "{replayed:?} {primary:?}");
}

/// A distributed table of 100,000 rows to check transactional ones against.
const SRC: &str = "CREATE TABLE src AS SELECT value AS k, value * 7 % 1000 AS v, \
                   'row ' || CAST(value AS VARCHAR) AS label FROM generate_series(1, 100000)";

/// 100,000 rows from a distributed table into a transactional one and back out,
/// checked against the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_thousand_rows_round_trip() {
    let cluster = cluster(3, None).await;
    let c = &cluster.coordinator;
    let s = c.new_session();
    sql(c, &s, SRC).await;
    sql(
        c,
        &s,
        "CREATE TABLE tx (k BIGINT PRIMARY KEY, v BIGINT, label VARCHAR) \
         WITH (replication = 'full')",
    )
    .await;
    assert_eq!(
        sql(c, &s, "INSERT INTO tx SELECT * FROM src").await,
        vec![vec![100_000]]
    );
    let check = "SELECT count(*), sum(v), sum(length(label)) FROM ";
    let expected = sql(c, &s, &format!("{check} src")).await;
    assert_eq!(sql(c, &s, &format!("{check} tx")).await, expected);
    assert_eq!(
        sql(
            c,
            &s,
            "SELECT count(*) FROM tx JOIN src USING (k) WHERE tx.v = src.v AND tx.label = src.label"
        )
        .await,
        vec![vec![100_000]]
    );
    assert_eq!(
        sql(c, &s, "UPDATE tx SET v = v + 1 WHERE k % 2 = 0").await,
        vec![vec![50_000]]
    );
    assert_eq!(
        sql(
            c,
            &s,
            "SELECT sum(tx.v) - sum(src.v) FROM tx JOIN src USING (k)"
        )
        .await,
        vec![vec![50_000]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tables_come_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let expected = {
        let cluster = cluster(2, Some(dir.path())).await;
        let c = &cluster.coordinator;
        let s = c.new_session();
        create_accounts(c, &s).await;
        sql(c, &s, "CALL transfer(1, 2, 50)").await;
        sql(c, &s, "BEGIN").await;
        sql(c, &s, "DELETE FROM accounts WHERE id > 500").await;
        sql(c, &s, "COMMIT").await;
        sql(c, &s, "BEGIN").await;
        sql(c, &s, "DELETE FROM accounts").await;
        // Never committed: gone with the process.
        let rows = sql(c, &s, "SELECT id, balance FROM accounts ORDER BY id").await;
        assert!(rows.is_empty());
        sql(c, &s, "ROLLBACK").await;
        sql(c, &s, "SELECT id, balance FROM accounts ORDER BY id").await
    };
    assert_eq!(expected.len(), 501);
    let cluster = cluster(2, Some(dir.path())).await;
    let c = &cluster.coordinator;
    let s = c.new_session();
    assert_eq!(
        sql(c, &s, "SELECT id, balance FROM accounts ORDER BY id").await,
        expected
    );
    assert_eq!(expected[1], vec![1, 50]);
    assert_eq!(expected[2], vec![2, 150]);
}

/// A port the kernel had free.
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn gyre() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gyre"))
}

/// Starts `gyre local --data-dir dir` serving Flight SQL on `addr`, and waits until it
/// answers.
fn serve(dir: &Path, addr: SocketAddr) -> std::process::Child {
    let child = gyre()
        .args(["local", "--workers", "1", "--listen", &addr.to_string()])
        .arg("--data-dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while gyre_sql(addr, "SELECT 1").is_err() {
        assert!(Instant::now() < deadline, "gyre local never came up");
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

fn gyre_sql(addr: SocketAddr, sql: &str) -> Result<String, String> {
    let out = gyre()
        .args([
            "sql",
            "--connect",
            &addr.to_string(),
            "--format",
            "csv",
            "-c",
            sql,
        ])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// kill -9 of a served `gyre local --data-dir` while clients commit transfers (each
/// `BEGIN; UPDATE; UPDATE; INSERT; COMMIT` in one session), then a restart: every
/// acknowledged transfer is there, and the balances add up (none applied partly).
#[test]
fn kill_9_of_gyre_local_loses_no_acknowledged_transaction() {
    let rounds = std::env::var("GYRE_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let mut server = serve(dir.path(), addr);
    gyre_sql(
        addr,
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL) \
         WITH (replication = 'full'); \
         CREATE TABLE transfers (id BIGINT PRIMARY KEY, src BIGINT, dst BIGINT, amount BIGINT) \
         WITH (replication = 'full'); \
         INSERT INTO accounts SELECT value, 1000 FROM generate_series(0, 9)",
    )
    .unwrap();
    let mut acknowledged = BTreeSet::new();
    let mut rng = rand::rng();
    for round in 0..rounds {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..3)
            .map(|t| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut acks = vec![];
                    let mut rng = rand::rng();
                    for i in 0.. {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let id = round * 1_000_000 + t * 100_000 + i;
                        let src = rng.random_range(0..10);
                        let dst = (src + rng.random_range(1..10)) % 10;
                        let amount = rng.random_range(1..50);
                        let txn = format!(
                            "BEGIN; \
                             UPDATE accounts SET balance = balance - {amount} WHERE id = {src}; \
                             UPDATE accounts SET balance = balance + {amount} WHERE id = {dst}; \
                             INSERT INTO transfers VALUES ({id}, {src}, {dst}, {amount}); \
                             COMMIT"
                        );
                        if gyre_sql(addr, &txn).is_ok() {
                            acks.push(id);
                        }
                    }
                    acks
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(1500..3000)));
        server.kill().unwrap(); // SIGKILL
        server.wait().unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for c in clients {
            acknowledged.extend(c.join().unwrap());
        }
        server = serve(dir.path(), addr);
        let present: BTreeSet<i64> = gyre_sql(addr, "SELECT id FROM transfers")
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.parse().unwrap())
            .collect();
        let lost: Vec<_> = acknowledged.difference(&present).collect();
        assert!(lost.is_empty(), "round {round}: lost {lost:?}");
        // Each account's balance is its start plus what the recorded transfers moved.
        let check = gyre_sql(
            addr,
            "SELECT count(*) FROM accounts a WHERE balance <> 1000 \
               - coalesce((SELECT sum(amount) FROM transfers WHERE src = a.id), 0) \
               + coalesce((SELECT sum(amount) FROM transfers WHERE dst = a.id), 0)",
        )
        .unwrap();
        assert_eq!(check, "count(*)\n0\n", "round {round}");
        eprintln!(
            "round {round}: {} acknowledged so far, {} present",
            acknowledged.len(),
            present.len()
        );
    }
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(!acknowledged.is_empty());
}

/// TPC-C through SQL: the schema's DDL, the loader and the terminals' mix as `CALL`s
/// (lists and timestamps as SQL literals), then CH-benCHmark's queries on the cluster
/// against single-node DataFusion on the same rows, read on the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tpcc_and_ch_queries_through_sql() {
    tpcc_and_ch_queries(gyre_replica::Placement::Full).await;
}

/// The same with the growing tables partitioned over the workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tpcc_and_ch_queries_on_partitioned_tables() {
    tpcc_and_ch_queries(gyre_replica::Placement::Partitioned).await;
}

async fn tpcc_and_ch_queries(placement: gyre_replica::Placement) {
    use gyre_tpcc::{Kind, Scale, Terminal, call_sql, ch, load_calls, schema};
    let cluster = cluster_with(
        2,
        PrimaryConfig {
            procedures: gyre_tpcc::procedures(),
            ..Default::default()
        },
    )
    .await;
    let c = &cluster.coordinator;
    let s = c.new_session();
    let scale = Scale {
        warehouses: 2,
        items: 500,
        customers: 30,
    };
    let start = 1_750_000_000_000_000_000;
    for ddl in schema::ddl(placement) {
        sql(c, &s, &ddl).await;
    }
    for (procedure, args) in load_calls(scale, start) {
        sql(c, &s, &call_sql(procedure, &args)).await;
    }
    let mut terminal = Terminal::new(scale, 1, 7);
    let mut new_orders = 0;
    for i in 0..300 {
        let call = terminal.next(start + 1_000_000 * i);
        match c.sql_in(&s, &call.sql()).await {
            Ok(r) if call.kind == Kind::NewOrder => {
                new_orders += 1;
                // The new order's number comes back, and a query sees the order.
                let o_id = ints(&r)[0][0];
                let w_d = [
                    call.args[0].as_int().unwrap(),
                    call.args[1].as_int().unwrap(),
                ];
                let seen = sql(
                    c,
                    &s,
                    &format!(
                        "SELECT COUNT(*) FROM order_line WHERE ol_w_id = {} AND ol_d_id = {} \
                         AND ol_o_id = {o_id}",
                        w_d[0], w_d[1]
                    ),
                )
                .await;
                assert_eq!(seen[0][0], call.args[3].as_int_list().unwrap().len() as i64);
            }
            Ok(_) => {}
            Err(e) => assert!(
                call.kind == Kind::NewOrder && e.to_string().contains("Item number is not valid"),
                "{}: {e}",
                call.sql()
            ),
        }
    }
    assert!(new_orders > 100, "{new_orders}");
    // A list with a NULL element is refused with a reason.
    let err = fails(
        c,
        &s,
        "CALL tpcc_new_order(1, 1, 1, [1, NULL], [1, 1], [1, 1], now())",
    )
    .await;
    assert!(err.contains("may not be NULL"), "{err}");

    // The reference: single-node DataFusion over the same rows, as the primary has
    // them (a transaction reads there).
    let reference = datafusion::prelude::SessionContext::new();
    sql(c, &s, "BEGIN").await;
    for t in ["order_line", "orders", "item"] {
        let r = c.sql_in(&s, &format!("SELECT * FROM {t}")).await.unwrap();
        let table = datafusion::datasource::MemTable::try_new(
            r[0].schema.clone(),
            vec![r.iter().flat_map(|r| r.batches.clone()).collect()],
        )
        .unwrap();
        reference.register_table(t, Arc::new(table)).unwrap();
    }
    sql(c, &s, "ROLLBACK").await;
    for (name, q) in ch::QUERIES {
        let got = c.sql_in(&s, q).await.unwrap();
        let got = arrow::util::pretty::pretty_format_batches(
            &got.iter()
                .flat_map(|r| r.batches.clone())
                .collect::<Vec<_>>(),
        )
        .unwrap()
        .to_string();
        let want = reference.sql(q).await.unwrap().collect().await.unwrap();
        let want = arrow::util::pretty::pretty_format_batches(&want)
            .unwrap()
            .to_string();
        assert_eq!(got, want, "{name}");
        assert!(want.lines().count() > 4, "{name} returned nothing: {want}");
    }
}

/// The rows each worker's replica holds, by `gyre_workers()`.
async fn replica_rows(c: &Arc<Coordinator>, s: &datafusion::prelude::SessionContext) -> Vec<i64> {
    sql(
        c,
        s,
        "SELECT replica_rows FROM gyre_workers() ORDER BY worker",
    )
    .await
    .into_iter()
    .map(|r| r[0])
    .collect()
}

/// `q`'s result once it succeeds: right after the workers changed, a read may fail
/// while they take their new shares of the partitioned tables.
async fn settled(
    c: &Arc<Coordinator>,
    s: &datafusion::prelude::SessionContext,
    q: &str,
) -> Vec<Vec<i64>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.sql_in(s, q).await {
            Ok(r) => return ints(&r),
            Err(e)
                if Instant::now() < deadline
                    && ["share", "no longer kept"]
                        .iter()
                        .any(|m| e.to_string().contains(m)) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{q}: {e}"),
        }
    }
}

/// A table `WITH (replication = 'partitioned')` is transactional and durable like a
/// full one, but each worker's replica holds only the rows whose key hashes to it:
/// together they hold it once. Reads give what the same rows in a distributed table
/// give, and when a worker joins or leaves, the workers take their new shares from the
/// primary, so nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_tables_are_dealt_out_to_the_workers() {
    let mut cluster = cluster(2, None).await;
    let c = Arc::clone(&cluster.coordinator);
    let s = c.new_session();
    sql(&c, &s, SRC).await;
    sql(
        &c,
        &s,
        "CREATE TABLE ptx (k BIGINT PRIMARY KEY, v BIGINT, label VARCHAR) \
         WITH (replication = 'partitioned')",
    )
    .await;
    assert!(
        fails(
            &c,
            &s,
            "CREATE TABLE bad (k BIGINT PRIMARY KEY) WITH (replication = 'sideways')"
        )
        .await
        .contains("'chunked' or 'fragmented'")
    );
    assert_eq!(
        sql(&c, &s, "INSERT INTO ptx SELECT * FROM src").await,
        vec![vec![100_000]]
    );
    sql(&c, &s, "BEGIN").await;
    assert_eq!(
        sql(&c, &s, "UPDATE ptx SET v = v + 1 WHERE k % 2 = 0").await,
        vec![vec![50_000]]
    );
    assert_eq!(
        sql(&c, &s, "DELETE FROM ptx WHERE k % 10 = 5").await,
        vec![vec![10_000]]
    );
    sql(&c, &s, "COMMIT").await;
    sql(&c, &s, "BEGIN").await;
    sql(&c, &s, "DELETE FROM ptx").await;
    sql(&c, &s, "ROLLBACK").await;
    // The same rows, computed from the distributed table.
    let check = "SELECT count(*), sum(v), sum(length(label)), min(k), max(k) FROM ";
    let expected = sql(
        &c,
        &s,
        &format!(
            "{check} (SELECT k, CASE WHEN k % 2 = 0 THEN v + 1 ELSE v END AS v, label \
             FROM src WHERE k % 10 <> 5)"
        ),
    )
    .await;
    assert_eq!(expected[0][0], 90_000);
    assert_eq!(sql(&c, &s, &format!("{check} ptx")).await, expected);
    let plan = c
        .sql_in(&s, &format!("EXPLAIN ANALYZE {check} ptx"))
        .await
        .unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&plan[0].batches)
        .unwrap()
        .to_string();
    assert!(text.contains("table=ptx (partitioned)"), "{text}");
    // A join on the key, and one with the distributed table.
    assert_eq!(
        sql(
            &c,
            &s,
            "SELECT count(*), sum(a.v - b.v) FROM ptx a JOIN ptx b USING (k)"
        )
        .await,
        vec![vec![90_000, 0]]
    );
    assert_eq!(
        sql(
            &c,
            &s,
            "SELECT count(*), sum(p.v - s.v) FROM ptx p JOIN src s USING (k)"
        )
        .await,
        vec![vec![90_000, 50_000]]
    );
    // Each worker holds about half, the two together every row once.
    let held = replica_rows(&c, &s).await;
    assert_eq!(held.iter().sum::<i64>(), 90_000, "{held:?}");
    assert!(held.iter().all(|&h| h > 40_000), "{held:?}");

    // A third worker: the shares change, and the three hold the table once.
    cluster.start_worker(1).await.unwrap();
    c.wait_for_workers(3, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(settled(&c, &s, &format!("{check} ptx")).await, expected);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = replica_rows(&c, &s).await;
        if held.len() == 3 && held.iter().sum::<i64>() == 90_000 {
            assert!(held.iter().all(|&h| h > 25_000), "{held:?}");
            break;
        }
        assert!(Instant::now() < deadline, "{held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sql(&c, &s, "UPDATE ptx SET v = 0 WHERE k <= 100").await;
    let rest = "SELECT count(*), sum(v) FROM ptx WHERE k > 100";
    let before = sql(&c, &s, rest).await;
    assert_eq!(before[0][0], 90_000 - 90);

    // A worker leaves (with its part of the distributed table): the other two take
    // their new shares of the partitioned one from the primary, which holds every row.
    let leaving = cluster.workers().next().unwrap();
    leaving.shutdown();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.live_workers().len() > 2 {
        assert!(Instant::now() < deadline, "the worker did not leave");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(settled(&c, &s, rest).await, before);
    assert_eq!(
        settled(&c, &s, "SELECT count(*), sum(v) FROM ptx WHERE k <= 100").await,
        vec![vec![90, 0]]
    );
}

/// A table fragmented by rendezvous hashing (`gyre.replication = 'fragmented'` and
/// `gyre.replicas`, or `WITH (replicas = ...)`): each block of rows on that many
/// workers. Reads give what the same rows in a distributed table give, on every
/// worker set: when a worker leaves, the others already hold every block, and they
/// take their new copies from the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fragmented_tables_keep_copies_of_each_block() {
    let cluster = cluster(4, None).await;
    let c = Arc::clone(&cluster.coordinator);
    let s = c.new_session();
    sql(&c, &s, SRC).await;
    for (bad, named) in [
        ("WITH (replicas = 0)", "from 1 to 16"),
        ("WITH (replicas = 'many')", "from 1 to 16"),
        (
            "WITH (replication = 'full', replicas = 2)",
            "for fragmented tables",
        ),
    ] {
        let e = fails(
            &c,
            &s,
            &format!("CREATE TABLE bad (k BIGINT PRIMARY KEY) {bad}"),
        )
        .await;
        assert!(e.contains(named), "{bad}: {e}");
    }
    for statement in [
        "SET gyre.replication = 'fragmented'",
        "SET gyre.replicas = 3",
        "CREATE TABLE ftx (k BIGINT PRIMARY KEY, v BIGINT, label VARCHAR)",
        "SET gyre.replication = 'none'",
        "CREATE TABLE f2 (k BIGINT PRIMARY KEY, v BIGINT) WITH (replicas = 2)",
        "INSERT INTO ftx SELECT * FROM src",
        "INSERT INTO f2 SELECT k, v FROM src WHERE k % 3 = 0",
        "UPDATE ftx SET v = v + 1 WHERE k % 2 = 0",
        "DELETE FROM ftx WHERE k % 10 = 5",
    ] {
        sql(&c, &s, statement).await;
    }
    let check = "SELECT count(*), sum(v), sum(length(label)), min(k), max(k) FROM ";
    let expected = sql(
        &c,
        &s,
        &format!(
            "{check} (SELECT k, CASE WHEN k % 2 = 0 THEN v + 1 ELSE v END AS v, label \
             FROM src WHERE k % 10 <> 5)"
        ),
    )
    .await;
    let joined = "SELECT count(*), sum(a.v - b.v) FROM ftx a JOIN f2 b USING (k)";
    let expected_join = sql(
        &c,
        &s,
        "SELECT count(*), sum(CASE WHEN k % 2 = 0 THEN 1 ELSE 0 END) FROM src \
         WHERE k % 3 = 0 AND k % 10 <> 5",
    )
    .await;
    assert_eq!(sql(&c, &s, &format!("{check} ftx")).await, expected);
    assert_eq!(sql(&c, &s, joined).await, expected_join);
    let plan = c
        .sql_in(&s, &format!("EXPLAIN ANALYZE {check} ftx"))
        .await
        .unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&plan[0].batches)
        .unwrap()
        .to_string();
    assert!(text.contains("table=ftx (fragmented, 3 copies)"), "{text}");
    // Three copies of every row among the four workers, about 3/4 of them on each,
    // once every replica has narrowed to its share.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (ftx, f2) = (90_000, 100_000 / 3);
    let rows = ftx + f2;
    loop {
        let held = replica_rows(&c, &s).await;
        if held.iter().sum::<i64>() == 3 * ftx + 2 * f2 {
            assert!(held.iter().all(|&h| h > rows / 2 && h < rows), "{held:?}");
            break;
        }
        assert!(Instant::now() < deadline, "{held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A worker leaves: the reads go on at once on the others.
    let leaving = cluster.workers().next().unwrap();
    leaving.shutdown();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.live_workers().len() > 3 {
        assert!(Instant::now() < deadline, "the worker did not leave");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sql(&c, &s, &format!("{check} ftx")).await, expected);
    assert_eq!(sql(&c, &s, joined).await, expected_join);
    sql(&c, &s, "UPDATE ftx SET v = 0 WHERE k <= 100").await;
    assert_eq!(
        sql(&c, &s, "SELECT count(*), sum(v) FROM ftx WHERE k <= 100").await,
        vec![vec![90, 0]]
    );
}

/// Tables `WITH (replication = ...)` and no primary key, one loaded from a directory
/// of Parquet files by CREATE TABLE ... AS SELECT: the primary numbers their rows (a
/// hidden row id), so equal rows are told apart and UPDATE and DELETE find rows by
/// their values. Every statement runs on a distributed table with the same rows too,
/// which is the reference, and the tables come back after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tables_without_a_primary_key_are_transactional_and_durable() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    let data = dir.path().join("data");
    let check = "SELECT count(*), sum(g), sum(length(label)), count(DISTINCT label) FROM";
    let tables = ["gen", "nk", "fk", "ck"];
    let expected = {
        // Loads of more than 64 KiB are logged in pieces.
        let pieces = PrimaryConfig {
            load_piece_bytes: 64 << 10,
            ..primary(Some(&data))
        };
        let cluster = cluster_with(2, pieces).await;
        let c = &cluster.coordinator;
        let s = c.new_session();
        // 120,000 rows, each value twice.
        sql(
            c,
            &s,
            "CREATE TABLE gen AS SELECT value % 997 AS g, \
             'label ' || CAST(value % 60000 AS VARCHAR) AS label \
             FROM generate_series(1, 120000)",
        )
        .await;
        sql(
            c,
            &s,
            &format!("COPY gen TO '{}/' STORED AS PARQUET", files.display()),
        )
        .await;
        assert!(std::fs::read_dir(&files).unwrap().count() >= 2);
        sql(
            c,
            &s,
            &format!(
                "CREATE EXTERNAL TABLE f STORED AS PARQUET LOCATION '{}/'",
                files.display()
            ),
        )
        .await;
        sql(
            c,
            &s,
            "CREATE TABLE nk WITH (replication = 'partitioned') AS SELECT * FROM f",
        )
        .await;
        sql(
            c,
            &s,
            "CREATE TABLE ck WITH (replication = 'chunked') AS SELECT * FROM f",
        )
        .await;
        sql(
            c,
            &s,
            "CREATE TABLE fk (g BIGINT, label VARCHAR) WITH (replication = 'full')",
        )
        .await;
        assert_eq!(
            sql(c, &s, "INSERT INTO fk SELECT * FROM f").await,
            vec![vec![120_000]]
        );
        let same = |q: String| same_on(c, &s, &tables, q);
        assert_eq!(same(format!("{check} {{t}}")).await[0][0], 120_000);
        // Each of a pair of equal rows is a row of its own.
        assert_eq!(
            same("DELETE FROM {t} WHERE label = 'label 5'".into()).await,
            vec![vec![2]]
        );
        assert_eq!(
            same("UPDATE {t} SET g = g + 1000 WHERE g % 10 = 3".into()).await[0][0],
            12_036
        );
        same("UPDATE {t} SET label = label || '!' WHERE g < 50 AND label < 'label 3'".into()).await;
        same("DELETE FROM {t} WHERE g % 10 = 5".into()).await;
        let before = same(format!("{check} {{t}}")).await;
        // A transaction rolled back changes nothing.
        for t in ["nk", "fk", "ck"] {
            sql(c, &s, "BEGIN").await;
            sql(c, &s, &format!("DELETE FROM {t} WHERE g > 100")).await;
            sql(c, &s, &format!("INSERT INTO {t} VALUES (1, 'x'), (1, 'x')")).await;
            sql(c, &s, &format!("UPDATE {t} AS a SET g = a.g + 1")).await;
            sql(c, &s, "ROLLBACK").await;
        }
        assert_eq!(same(format!("{check} {{t}}")).await, before);
        // An alias, and equal rows inserted together.
        sql(c, &s, "INSERT INTO nk VALUES (7, 'twin'), (7, 'twin')").await;
        assert_eq!(
            sql(
                c,
                &s,
                "UPDATE nk AS n SET g = n.g + 1 WHERE n.label = 'twin'"
            )
            .await,
            vec![vec![2]]
        );
        assert_eq!(
            sql(
                c,
                &s,
                "SELECT g, count(*) FROM nk WHERE label = 'twin' GROUP BY g"
            )
            .await,
            vec![vec![8, 2]]
        );
        sql(c, &s, "DELETE FROM nk WHERE label = 'twin'").await;
        // The row id is never seen.
        let star = c.sql_in(&s, "SELECT * FROM nk LIMIT 1").await.unwrap();
        assert_eq!(star[0].schema.fields().len(), 2);
        let plan = c.sql_in(&s, &format!("EXPLAIN {check} nk")).await.unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&plan[0].batches)
            .unwrap()
            .to_string();
        assert!(text.contains("table=nk (partitioned)"), "{text}");
        let plan = c.sql_in(&s, &format!("EXPLAIN {check} ck")).await.unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&plan[0].batches)
            .unwrap()
            .to_string();
        assert!(text.contains("table=ck (chunked)"), "{text}");
        // Chunked placement is for tables the primary numbers.
        let keyed = fails(
            c,
            &s,
            "CREATE TABLE kc (k BIGINT PRIMARY KEY) WITH (replication = 'chunked')",
        )
        .await;
        assert!(keyed.contains("chunked placement"), "{keyed}");
        assert!(!text.contains(gyre_replica::ROW_ID), "{text}");
        // The row id's name is reserved; other names, such as the ones UPDATE gives
        // the old values it reads, are the user's.
        let reserved = fails(
            c,
            &s,
            "CREATE TABLE r (a INT, _gyre_row_id BIGINT NOT NULL PRIMARY KEY) \
             WITH (replication = 'full')",
        )
        .await;
        assert!(reserved.contains("reserved"), "{reserved}");
        sql(
            c,
            &s,
            "CREATE TABLE o (__old_0 INT) WITH (replication = 'full') AS VALUES (1), (1)",
        )
        .await;
        assert_eq!(sql(c, &s, "UPDATE o SET __old_0 = 2").await, vec![vec![2]]);
        assert_eq!(
            sql(c, &s, "SELECT __old_0 FROM o").await,
            vec![vec![2], vec![2]]
        );
        // OR REPLACE; a replacement whose rows break the key keeps the old table.
        sql(
            c,
            &s,
            "CREATE OR REPLACE TABLE o (k BIGINT PRIMARY KEY) WITH (replication = 'full') \
             AS VALUES (1), (2)",
        )
        .await;
        assert!(
            fails(
                c,
                &s,
                "CREATE OR REPLACE TABLE o (k BIGINT PRIMARY KEY) WITH (replication = 'full') \
                 AS VALUES (3), (3)",
            )
            .await
            .contains("duplicate key")
        );
        assert_eq!(
            sql(c, &s, "SELECT k FROM o ORDER BY k").await,
            vec![vec![1], vec![2]]
        );
        let defaults = fails(
            c,
            &s,
            "CREATE TABLE d (a INT DEFAULT 1) WITH (replication = 'full')",
        )
        .await;
        assert!(defaults.contains("DEFAULT"), "{defaults}");
        // gyre.replication makes tables transactional without WITH (replication).
        sql(c, &s, "SET gyre.replication = 'partitioned'").await;
        sql(c, &s, "CREATE TABLE dflt AS SELECT * FROM f WHERE g < 10").await;
        sql(
            c,
            &s,
            "CREATE TABLE plain WITH (replication = 'none') AS SELECT * FROM f WHERE g < 10",
        )
        .await;
        sql(c, &s, "SET gyre.replication = 'none'").await;
        let explain = |t: &'static str| {
            let s = &s;
            async move {
                let plan = c
                    .sql_in(s, &format!("EXPLAIN SELECT * FROM {t}"))
                    .await
                    .unwrap();
                arrow::util::pretty::pretty_format_batches(&plan[0].batches)
                    .unwrap()
                    .to_string()
            }
        };
        assert!(explain("dflt").await.contains("table=dflt (partitioned)"));
        assert!(!explain("plain").await.contains("SnapshotScanExec"));
        assert_eq!(
            sql(c, &s, "SELECT count(*) FROM dflt").await,
            vec![vec![1209]]
        );
        // The partitioned tables' replicas hold them once between them; fk and the
        // two rows of o are whole on both workers.
        let held = replica_rows(c, &s).await;
        let fk_rows = sql(c, &s, "SELECT count(*) FROM fk").await[0][0];
        let nk_rows = sql(c, &s, "SELECT count(*) FROM nk").await[0][0];
        let ck_rows = sql(c, &s, "SELECT count(*) FROM ck").await[0][0];
        assert_eq!(
            held.iter().sum::<i64>(),
            2 * (fk_rows + 2) + nk_rows + ck_rows + 1209,
            "{held:?}"
        );
        before
    };
    let cluster = cluster(2, Some(&data)).await;
    let c = &cluster.coordinator;
    let s = c.new_session();
    for t in ["nk", "fk", "ck"] {
        assert_eq!(sql(c, &s, &format!("{check} {t}")).await, expected, "{t}");
    }
    assert_eq!(
        sql(c, &s, "SELECT count(*) FROM dflt").await,
        vec![vec![1209]]
    );
    assert!(
        fails(c, &s, "SELECT count(*) FROM plain")
            .await
            .contains("plain")
    );
    // Numbering goes on after the greatest row id.
    sql(c, &s, "INSERT INTO nk VALUES (1, 'after')").await;
    assert_eq!(
        sql(c, &s, &format!("{check} nk")).await[0][0],
        expected[0][0] + 1
    );
}

/// `q` with `{t}` replaced by each of `tables`: the results, which must be equal.
async fn same_on(
    c: &Arc<Coordinator>,
    s: &datafusion::prelude::SessionContext,
    tables: &[&str],
    q: String,
) -> Vec<Vec<i64>> {
    let mut results = vec![];
    for t in tables {
        results.push(sql(c, s, &q.replace("{t}", t)).await);
    }
    assert!(results.iter().all(|r| *r == results[0]), "{q}: {results:?}");
    results.remove(0)
}
