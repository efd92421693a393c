//! Coordinators that vote on the primary (`gyre coordinator --voters`): kill -9 of the
//! primary, then of the next one, with a restarted voter in between; every
//! acknowledged commit survives, the workers follow each new primary, and the standbys
//! refuse clients with the primary's address; and a Jepsen-style bank through killed
//! voters and, with each voter on a host of its own (network namespaces, as root), cut
//! links.

mod procs;

use arrow_flight::sql::client::FlightSqlServiceClient;
use gyre_testbed::sys;
use procs::{Proc, batches, free_port, gyre_binary};
use std::process::Command;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const SECRET: &str = "failover tests' cluster secret";

/// Held by each test for its whole run: two clusters of five processes at once on a
/// two-core machine would turn the timing checks into races.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn gyre(args: &[&str]) -> Proc {
    gyre_on(None, args)
}

/// `gyre ARGS` in the network namespace `netns` (`ip netns exec` execs it, so the
/// child is gyre itself and kill -9 reaches it).
fn gyre_on(netns: Option<&str>, args: &[&str]) -> Proc {
    let command = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, gyre_binary()]);
            c
        }
        None => Command::new(gyre_binary()),
    };
    procs::spawn(command, SECRET, args)
}

/// The rows of a query's result as text lines (`a|b`), or the error.
async fn rows(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<String, String> {
    let batches = batches(client, sql).await?;
    let mut out = vec![];
    for b in &batches {
        for r in 0..b.num_rows() {
            let cells: Vec<String> = b
                .columns()
                .iter()
                .map(|c| arrow::util::display::array_value_to_string(c, r).unwrap())
                .collect();
            out.push(cells.join("|"));
        }
    }
    Ok(out.join("\n"))
}

/// Three voting coordinators and their data directories, on loopback or each on a
/// host of its own ([`Hosts`]).
struct Voters {
    clients: Vec<String>,
    list: String,
    dirs: Vec<tempfile::TempDir>,
    procs: Vec<Option<Proc>>,
    hosts: Option<std::sync::Arc<Hosts>>,
}

impl Voters {
    fn new(hosts: Option<std::sync::Arc<Hosts>>) -> Self {
        // On hosts of their own, every voter listens on the same ports.
        let (client_port, raft_port) = (free_port(), free_port());
        let addr = |i: usize, port: u16| match &hosts {
            Some(h) => format!("{}:{port}", h.voter(i)),
            None => format!("127.0.0.1:{}", free_port()),
        };
        let clients: Vec<String> = (0..3).map(|i| addr(i, client_port)).collect();
        let list = clients
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c}/{}", addr(i, raft_port)))
            .collect::<Vec<_>>()
            .join(",");
        let mut voters = Self {
            clients,
            list,
            dirs: (0..3).map(|_| tempfile::tempdir().unwrap()).collect(),
            procs: vec![],
            hosts,
        };
        voters.procs = (0..3).map(|i| Some(voters.start(i))).collect();
        voters
    }

    fn start(&self, i: usize) -> Proc {
        let data_listen = match &self.hosts {
            Some(h) => format!("{}:0", h.voter(i)),
            None => "127.0.0.1:0".to_string(),
        };
        let mut args = vec![
            "coordinator",
            "--listen",
            &self.clients[i],
            "--data-listen",
            &data_listen,
            "--data-dir",
            self.dirs[i].path().to_str().unwrap(),
            "--voters",
            &self.list,
        ];
        // Beyond loopback a coordinator wants logins; the test's clients have none.
        if self.hosts.is_some() {
            args.push("--insecure-no-auth");
        }
        gyre_on(self.hosts.as_ref().map(|h| h.netns(i)).as_deref(), &args)
    }

    /// Three voters and two workers given every voter; returns once the primary counts
    /// both workers, with its index, a client of it and the worker processes.
    async fn with_workers(
        hosts: Option<std::sync::Arc<Hosts>>,
    ) -> (Self, usize, FlightSqlServiceClient<Channel>, Vec<Proc>) {
        let voters = Self::new(hosts);
        let (first, mut client) = voters.primary(Duration::from_secs(30)).await;
        let workers = (0..2).map(|_| voters.worker()).collect();
        eventually(&mut client, WORKERS, "2").await;
        (voters, first, client, workers)
    }

    /// A worker given every voter, with one thread. With hosts, it runs in this
    /// process's namespace and listens on its address on the hosts' bridge.
    fn worker(&self) -> Proc {
        let listen = match &self.hosts {
            Some(h) => format!("{}:0", h.local()),
            None => "127.0.0.1:0".to_string(),
        };
        gyre(&[
            "worker",
            "--coordinator",
            &self.all(),
            "--threads",
            "1",
            "--listen",
            &listen,
            "--data-listen",
            &listen,
        ])
    }

    fn all(&self) -> String {
        self.clients.join(",")
    }

    /// The voter that serves SQL (waits up to `within`), and a client of it.
    async fn primary(&self, within: Duration) -> (usize, FlightSqlServiceClient<Channel>) {
        let deadline = Instant::now() + within;
        loop {
            // A killed voter's port refuses at once.
            if let Some(primary) = connect_primary(&self.clients).await {
                return primary;
            }
            assert!(Instant::now() < deadline, "no primary within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill(&mut self, i: usize) {
        self.procs[i] = None;
    }
}

/// Three hosts for the voters: network namespaces on one bridge, as `gyre cluster`
/// builds them, and a veth from this process's namespace onto the bridge for the
/// clients and workers. A link between two voters is cut with blackhole routes on
/// both sides: they no longer reach each other, while clients and workers reach both.
/// Needs root and iproute2.
struct Hosts {
    tag: String,
    subnet: String,
}

impl Hosts {
    fn up() -> Result<Self, String> {
        if !sys::is_root() {
            return Err("not running as root".into());
        }
        let pid = std::process::id();
        let hosts = Self {
            tag: format!("gyj{pid}"),
            subnet: format!("10.232.{}", pid % 250),
        };
        // On a failed step `hosts` is dropped, and what was made goes.
        let ip = |args: &[&str]| sys::ip(args).map(|_| ()).map_err(|e| e.to_string());
        let bridge = hosts.bridge();
        ip(&["netns", "add", &bridge])?;
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &bridge, "link", "set", "br0", "up"])?;
        for i in 0..3 {
            let (ns, port) = (hosts.netns(i), format!("v{i}"));
            let addr = format!("{}/24", hosts.voter(i));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "-n", &bridge, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            ip(&["-n", &bridge, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let local = format!("{}/24", hosts.local());
        ip(&[
            "link", "add", &hosts.tag, "type", "veth", "peer", "name", "local", "netns", &bridge,
        ])?;
        ip(&["-n", &bridge, "link", "set", "local", "master", "br0", "up"])?;
        ip(&["addr", "add", &local, "dev", &hosts.tag])?;
        ip(&["link", "set", &hosts.tag, "up"])?;
        Ok(hosts)
    }

    fn bridge(&self) -> String {
        format!("{}-br", self.tag)
    }

    fn netns(&self, voter: usize) -> String {
        format!("{}-v{voter}", self.tag)
    }

    fn voter(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, i + 1)
    }

    /// This process's address on the bridge.
    fn local(&self) -> String {
        format!("{}.254", self.subnet)
    }

    /// Cuts (or, with `heal`, mends) the link between voters `a` and `b`.
    fn link(&self, a: usize, b: usize, heal: bool) {
        for (from, to) in [(a, b), (b, a)] {
            let to = format!("{}/32", self.voter(to));
            let verb = if heal { "del" } else { "add" };
            sys::ip(["-n", &self.netns(from), "route", verb, "blackhole", &to]).unwrap();
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth pairs, this process's end too.
        for ns in (0..3).map(|i| self.netns(i)).chain([self.bridge()]) {
            let _ = sys::ip(["netns", "del", &ns]);
        }
    }
}

/// Waits until `sql` answers `want` (the workers catch up through the log feed).
async fn eventually(client: &mut FlightSqlServiceClient<Channel>, sql: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = rows(client, sql).await;
        if got.as_deref() == Ok(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{sql}: {got:?}, not {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Commits rows `keys` one by one through whichever voter is the primary, retrying a
/// row until a primary acknowledges it (a new primary may wait for its workers, which
/// join it within seconds); a retried row found already there was committed by the
/// attempt whose answer was lost.
async fn insert(voters: &Voters, keys: std::ops::RangeInclusive<u32>) {
    let mut client = None;
    for k in keys {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = match client.as_mut() {
                Some(c) => c,
                None => client.insert(voters.primary(Duration::from_secs(30)).await.1),
            };
            match rows(c, &format!("INSERT INTO ledger VALUES ({k}, {k})")).await {
                Ok(_) => break,
                Err(e) if e.contains("duplicate key") => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "insert {k}: {e}");
                    client = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

const TOTALS: &str = "SELECT count(*), sum(amount) FROM ledger";
const WORKERS: &str = "SELECT count(*) FROM gyre_workers()";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_primaries_are_replaced_and_lose_no_acknowledged_commit() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (mut voters, first, mut client, _workers) = Voters::with_workers(None).await;

    // A standby refuses and names the primary.
    let standby = (first + 1) % 3;
    // The primary is elected by a majority: the standby's port may not listen yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ch = loop {
        match Channel::from_shared(format!("http://{}", voters.clients[standby]))
            .unwrap()
            .connect()
            .await
        {
            Ok(ch) => break ch,
            Err(e) => assert!(Instant::now() < deadline, "the standby: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut standby = FlightSqlServiceClient::new(ch);
    let named = format!("the primary is at {}", voters.clients[first]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // A standby learns who leads from the leader's first heartbeat to it.
        let refused = standby
            .execute("SELECT 1".into(), None)
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("not the primary"), "{refused}");
        if refused.contains(&named) {
            break;
        }
        assert!(Instant::now() < deadline, "{refused}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    rows(
        &mut client,
        "CREATE TABLE ledger (k INT PRIMARY KEY, amount BIGINT NOT NULL) \
         WITH (replication = 'full')",
    )
    .await
    .unwrap();
    insert(&voters, 1..=50).await;
    eventually(&mut client, TOTALS, "50|1275").await;

    // kill -9 of the primary: another voter commits within seconds, with every
    // acknowledged row, and the workers follow it.
    voters.kill(first);
    let killed = Instant::now();
    insert(&voters, 51..=51).await;
    let failover = killed.elapsed();
    let (second, mut client) = voters.primary(Duration::from_secs(30)).await;
    assert_ne!(second, first);
    assert!(
        failover < Duration::from_secs(10),
        "failover took {failover:?}"
    );
    eprintln!("first commit on the new primary {failover:?} after the kill");
    insert(&voters, 52..=100).await;
    eventually(&mut client, WORKERS, "2").await;
    eventually(&mut client, TOTALS, "100|5050").await;

    // The killed voter comes back on its disk and catches up; then the second primary
    // dies too, and the third takes over with the restarted one as its majority.
    voters.procs[first] = Some(voters.start(first));
    tokio::time::sleep(Duration::from_secs(2)).await;
    voters.kill(second);
    let (third, mut client) = voters.primary(Duration::from_secs(30)).await;
    assert!(third != second);
    insert(&voters, 101..=150).await;
    eventually(&mut client, WORKERS, "2").await;
    eventually(&mut client, TOTALS, "150|11325").await;

    // `gyre sql --connect` with every voter finds the primary.
    let out = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["sql", "--connect", &voters.all(), "-c", TOTALS])
        .args(["--format", "csv"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("150,11325"), "{stdout}");
}

/// One transfer a client asked for: `amount` from account `from` to `to`.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    from: usize,
    to: usize,
    amount: i64,
}

const ACCOUNTS: usize = 8;
const START: i64 = 1_000;

/// Moves money until `stop`; returns the transfers acknowledged and those whose outcome
/// is unknown (the call failed: it may or may not have committed).
async fn transfers(
    voters: std::sync::Arc<Vec<String>>,
    seed: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<Transfer>, Vec<Transfer>) {
    let (mut acked, mut unknown) = (vec![], vec![]);
    let mut client: Option<FlightSqlServiceClient<Channel>> = None;
    let mut n = seed;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(c) = client.as_mut() else {
            // A new primary runs statements once its workers joined it: until then
            // every transfer would fail, each one more of unknown outcome.
            client = match connect_primary(&voters).await {
                Some((_, mut c)) => {
                    (rows(&mut c, WORKERS).await.as_deref() == Ok("2")).then_some(c)
                }
                None => None,
            };
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        };
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let from = (n >> 33) as usize % ACCOUNTS;
        let to = (from + 1 + (n >> 40) as usize % (ACCOUNTS - 1)) % ACCOUNTS;
        let t = Transfer {
            from,
            to,
            amount: 1 + (n >> 50) as i64 % 50,
        };
        let sql = format!(
            "UPDATE accounts SET balance = balance + CASE WHEN id = {from} THEN -{a} ELSE {a} END, \
             ops = ops + 1 WHERE id IN ({from}, {to})",
            a = t.amount
        );
        match rows(c, &sql).await {
            Ok(_) => acked.push(t),
            Err(e) => {
                // Refused by a standby: never ran. Anything else may have committed.
                if !e.contains("not the primary") {
                    unknown.push(t);
                }
                client = None;
            }
        }
    }
    (acked, unknown)
}

/// A client of whichever of `addrs` is the primary now, if one answers.
async fn connect_primary(addrs: &[String]) -> Option<(usize, FlightSqlServiceClient<Channel>)> {
    for (i, addr) in addrs.iter().enumerate() {
        let Ok(ch) = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
        else {
            continue;
        };
        let mut client = FlightSqlServiceClient::new(ch);
        if client.get_sql_info(vec![]).await.is_ok() {
            return Some((i, client));
        }
    }
    None
}

/// A Jepsen-style bank: two clients transfer money between accounts, in one statement
/// each, while a third reads the total; the primary is killed (-9) and restarted, then
/// a standby, then a worker; then, with each voter on a host of its own (network namespaces, as
/// root), the link between the primary and one standby is cut and mended, and then the
/// primary is cut off from both standbys while clients and workers still reach it. The
/// total never changes in any read, no client reads an older state than one it saw
/// (the count of operations never goes down), and the final balances are the start
/// plus every acknowledged transfer plus some of those whose outcome the clients could
/// not know, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_transfers_survive_killed_voters_and_cut_links() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = ONE_AT_A_TIME.lock().await;
    let hosts = match Hosts::up() {
        Ok(hosts) => Some(Arc::new(hosts)),
        Err(why) => {
            eprintln!("SKIPPED the cut links (voters on loopback): {why}");
            None
        }
    };
    let (mut voters, _, mut client, mut workers) = Voters::with_workers(hosts.clone()).await;
    for sql in [
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, \
         ops BIGINT NOT NULL) WITH (replication = 'full')",
        &format!(
            "INSERT INTO accounts SELECT value, {START}, 0 FROM generate_series(0, {})",
            ACCOUNTS - 1
        ),
    ] {
        rows(&mut client, sql).await.unwrap();
    }
    let total = format!("{}", START * ACCOUNTS as i64);
    eventually(&mut client, "SELECT sum(balance) FROM accounts", &total).await;

    let addrs = Arc::new(voters.clients.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (1..=2)
        .map(|seed| tokio::spawn(transfers(addrs.clone(), seed, stop.clone())))
        .collect();
    let reader = {
        let (addrs, stop, total) = (addrs.clone(), stop.clone(), total.clone());
        tokio::spawn(async move {
            let (mut reads, mut seen) = (0, 0i64);
            let mut client = None;
            while !stop.load(Ordering::Relaxed) {
                let Some(c) = client.as_mut() else {
                    client = connect_primary(&addrs).await.map(|(_, c)| c);
                    continue;
                };
                match rows(c, "SELECT sum(balance), sum(ops) FROM accounts").await {
                    Ok(row) => {
                        let (sum, ops) = row.split_once('|').unwrap();
                        assert_eq!(sum, total, "a read saw money made or lost");
                        let ops: i64 = ops.parse().unwrap();
                        assert!(ops >= seen, "a read went back in time: {ops} after {seen}");
                        seen = ops;
                        reads += 1;
                    }
                    Err(_) => client = None,
                }
            }
            reads
        })
    };

    let pause = |s| tokio::time::sleep(Duration::from_secs(s));
    pause(2).await;
    let (primary, _) = voters.primary(Duration::from_secs(30)).await;
    voters.kill(primary);
    pause(5).await;
    voters.procs[primary] = Some(voters.start(primary));
    pause(3).await;
    let (now, _) = voters.primary(Duration::from_secs(30)).await;
    let standby = (0..3).find(|i| *i != now).unwrap();
    voters.kill(standby);
    pause(3).await;
    voters.procs[standby] = Some(voters.start(standby));
    pause(2).await;
    // A secondary (a worker, which replays the log and serves the reads): the reads
    // it was in fail or are retried on the other; it comes back from the state.
    eprintln!("killing a worker");
    drop(workers.swap_remove(0));
    workers.push(voters.worker());
    pause(3).await;
    if let Some(hosts) = &hosts {
        let (primary, _) = voters.primary(Duration::from_secs(30)).await;
        let a = (primary + 1) % 3;
        eprintln!("cutting the link between voters {primary} (the primary) and {a}");
        hosts.link(primary, a, false);
        pause(4).await;
        hosts.link(primary, a, true);
        pause(3).await;
        let (primary, _) = voters.primary(Duration::from_secs(30)).await;
        let (a, b) = ((primary + 1) % 3, (primary + 2) % 3);
        eprintln!("cutting the primary {primary} off from voters {a} and {b}");
        hosts.link(primary, a, false);
        hosts.link(primary, b, false);
        pause(10).await;
        hosts.link(primary, a, true);
        hosts.link(primary, b, true);
        pause(4).await;
    }
    stop.store(true, Ordering::Relaxed);

    let (mut acked, mut unknown) = (vec![], vec![]);
    for w in writers {
        let (a, u) = w.await.unwrap();
        acked.extend(a);
        unknown.extend(u);
    }
    let reads = reader.await.unwrap();
    eprintln!(
        "{} transfers acknowledged, {} unknown, {reads} reads",
        acked.len(),
        unknown.len()
    );
    assert!(
        acked.len() > 50,
        "only {} transfers went through",
        acked.len()
    );
    assert!(
        unknown.len() <= 16,
        "{} transfers of unknown outcome",
        unknown.len()
    );

    let (_, mut client) = voters.primary(Duration::from_secs(30)).await;
    let balances: Vec<i64> = rows(&mut client, "SELECT balance FROM accounts ORDER BY id")
        .await
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let apply = |balances: &mut [i64], t: &Transfer| {
        balances[t.from] -= t.amount;
        balances[t.to] += t.amount;
    };
    let mut expected = vec![START; ACCOUNTS];
    for t in &acked {
        apply(&mut expected, t);
    }
    let explained = (0..1u32 << unknown.len()).any(|subset| {
        let mut with = expected.clone();
        for (i, t) in unknown.iter().enumerate() {
            if subset & (1 << i) != 0 {
                apply(&mut with, t);
            }
        }
        with == balances
    });
    assert!(
        explained,
        "the balances {balances:?} are not the start plus the acknowledged transfers plus \
         some of the {} unknown ones",
        unknown.len()
    );
}
