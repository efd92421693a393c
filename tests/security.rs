//! Attacks on a cluster's ports, each of which must fail and leave the cluster as it was:
//! SQL without a login or with a wrong password, forged control messages on the
//! coordinator's and the workers' ports, and TLS with a CA of the test's own.

mod procs;

use arrow::array::{Array, Int64Array, RecordBatch};
use arrow_flight::Action;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use gyre_cluster::LocalCluster;
use gyre_cluster::auth::users::user_line;
use gyre_cluster::auth::{NodeKey, TlsIdentity, Users};
use gyre_cluster::flight_sql::FrontDoor;
use gyre_cluster::protocol::{ACTION, ControlClient, Request};
use procs::{batches as query, free_port};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

fn users() -> Arc<Users> {
    let text = format!(
        "{}\n{}\n",
        user_line("alice", "correct horse").unwrap(),
        user_line("bob", "battery staple").unwrap()
    );
    Arc::new(Users::parse(&text).unwrap())
}

async fn client(addr: SocketAddr) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightSqlServiceClient::new(channel)
}

fn single_i64(batches: &[RecordBatch]) -> i64 {
    let b = batches.iter().find(|b| b.num_rows() > 0).unwrap();
    let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!(a.len(), 1);
    a.value(0)
}

/// How a client's error shows the code `Unauthenticated`.
const UNAUTHENTICATED: &str = "does not have valid authentication credentials";

fn assert_refused(result: Result<Vec<RecordBatch>, String>, why: &str) {
    let e = result.expect_err("an unauthenticated call must fail");
    assert!(e.contains(UNAUTHENTICATED) && e.contains(why), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_runs_without_a_login_and_logins_need_the_right_password() {
    let cluster = cluster_with_users(2).await;
    cluster
        .coordinator
        .sql("CREATE TABLE t AS SELECT * FROM (VALUES (1), (2), (3)) AS v(x)")
        .await
        .unwrap();

    // No login: neither queries nor statements nor other actions run.
    let mut anonymous = client(cluster.addr).await;
    assert_refused(
        query(&mut anonymous, "SELECT count(*) FROM t").await,
        "log in",
    );
    let drop = anonymous.execute_update("DROP TABLE t".into(), None).await;
    let e = drop.expect_err("DROP without a login").to_string();
    assert!(e.contains(UNAUTHENTICATED), "{e}");
    let progress = anonymous
        .do_action(Action {
            r#type: "gyre.progress".into(),
            body: "x".into(),
        })
        .await;
    assert!(progress.is_err());

    // Wrong password, unknown user, made-up token.
    let mut wrong = client(cluster.addr).await;
    let e = wrong
        .handshake("alice", "battery staple")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("wrong user name or password"), "{e}");
    let e = wrong
        .handshake("mallory", "correct horse")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("wrong user name or password"), "{e}");
    wrong.set_token(format!("{:032x}", 1u128));
    assert_refused(query(&mut wrong, "SELECT 1").await, "unknown or expired");

    // The right password: a token, and everything works with it.
    let mut alice = client(cluster.addr).await;
    alice.handshake("alice", "correct horse").await.unwrap();
    assert!(alice.token().is_some());
    let rows = query(&mut alice, "SELECT count(*) FROM t").await.unwrap();
    assert_eq!(single_i64(&rows), 3, "the table is untouched");
    let mut bob = client(cluster.addr).await;
    bob.handshake("bob", "battery staple").await.unwrap();
    bob.execute_update("INSERT INTO t VALUES (4)".into(), None)
        .await
        .unwrap();
    let rows = query(&mut alice, "SELECT sum(x) FROM t").await.unwrap();
    assert_eq!(single_i64(&rows), 10);
}

/// Oversized messages are refused before they are read whole, a connection that says
/// nothing is closed, and the port keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_and_silent_connections_are_turned_away() {
    let cluster = LocalCluster::start(1, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // A socket that never speaks: closed when its time to be admitted is up.
    let mut silent = tokio::net::TcpStream::connect(cluster.addr).await.unwrap();
    let opened = Instant::now();
    // One action body larger than any client message may be.
    let mut big = client(cluster.addr).await;
    let body = vec![7u8; gyre_cluster::protocol::MAX_CLIENT_MESSAGE + 1024];
    let e = big
        .do_action(Action {
            r#type: "gyre.progress".into(),
            body: body.into(),
        })
        .await
        .expect_err("an oversized message")
        .to_string();
    assert!(e.contains("too large") || e.contains("OutOfRange"), "{e}");
    let mut ok = client(cluster.addr).await;
    assert_eq!(
        single_i64(&query(&mut ok, "SELECT 41 + 1").await.unwrap()),
        42
    );
    use tokio::io::AsyncReadExt;
    // The server speaks first (HTTP/2 settings); then, hearing nothing, it hangs up.
    let mut heard = vec![];
    let _ = tokio::time::timeout(Duration::from_secs(20), silent.read_to_end(&mut heard))
        .await
        .expect("a silent connection must be closed");
    let waited = opened.elapsed();
    assert!(
        waited >= gyre_cluster::protocol::ADMITTED_WITHIN - Duration::from_secs(1),
        "{waited:?}"
    );
}

/// Connections that never log in have slots of their own, which they cannot keep: a
/// client that logged in keeps working while strangers fill them, and strangers who
/// keep talking without credentials are cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_cannot_take_the_port_from_clients_who_logged_in() {
    use gyre_cluster::protocol::{ADMITTED_WITHIN, MAX_STRANGERS};
    let cluster = cluster_with_users(1).await;
    let opened = Instant::now();
    let cluster_addr = cluster.addr;
    let mut alice = client(cluster.addr).await;
    alice.handshake("alice", "correct horse").await.unwrap();
    assert_eq!(single_i64(&query(&mut alice, "SELECT 1").await.unwrap()), 1);
    // A stranger who keeps talking HTTP/2 (pings) but never sends credentials.
    let chatty = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(cluster_addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        let (mut rd, mut wr) = s.into_split();
        let pings = tokio::spawn(async move {
            loop {
                let ping = b"\0\0\x08\x06\0\0\0\0\0pingpong";
                if wr.write_all(ping).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let mut buf = [0u8; 4096];
        let mut answered = 0;
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answered += n;
        }
        pings.abort();
        (opened.elapsed(), answered)
    });
    // Strangers take every slot left for connections that have not logged in.
    let mut strangers = vec![];
    for _ in 0..MAX_STRANGERS {
        strangers.push(tokio::net::TcpStream::connect(cluster.addr).await.unwrap());
    }
    // Accepted and closed at once: a newcomer cannot even start a login now.
    let newcomer = async move {
        let mut c = client(cluster_addr).await;
        c.handshake("bob", "battery staple").await
    };
    let refused = tokio::time::timeout(Duration::from_secs(10), tokio::spawn(newcomer))
        .await
        .expect("refused, not left hanging");
    assert!(
        refused.is_err() || refused.unwrap().is_err(),
        "a newcomer got in"
    );
    // Alice's connection holds a slot of its own.
    assert_eq!(single_i64(&query(&mut alice, "SELECT 2").await.unwrap()), 2);
    // Once their time is up, the strangers (the chatty one too) are cut off ...
    let (cut_after, answered) = tokio::time::timeout(ADMITTED_WITHIN * 2, chatty)
        .await
        .expect("a stranger that keeps talking must be cut off")
        .unwrap();
    assert!(answered > 0, "the server spoke HTTP/2 with it");
    assert!(
        cut_after >= ADMITTED_WITHIN - Duration::from_secs(1),
        "{cut_after:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // ... and newcomers get in again, while Alice's connection lives on.
    let mut bob = client(cluster.addr).await;
    bob.handshake("bob", "battery staple").await.unwrap();
    assert_eq!(single_i64(&query(&mut bob, "SELECT 3").await.unwrap()), 3);
    assert_eq!(single_i64(&query(&mut alice, "SELECT 4").await.unwrap()), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_messages_need_the_cluster_secret() {
    let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    cluster
        .coordinator
        .sql("CREATE TABLE t AS SELECT * FROM (VALUES (1), (2), (3)) AS v(x)")
        .await
        .unwrap();
    let coordinator = cluster.addr.to_string();
    let guessed = NodeKey::from_secret("gyre");
    let forged = ControlClient::connect_lazy(&coordinator, guessed.clone(), 0).unwrap();

    // On the coordinator: a fake worker, a cancelled query, a benchmark that allocates.
    let attacks = [
        Request::Register {
            control_addr: "127.0.0.1:9".into(),
            data_addr: "127.0.0.1:9".into(),
            host_shuffle: None,
        },
        Request::QueryFailed {
            query: 1,
            node: 1,
            error: "forged".into(),
        },
        Request::Heartbeat {
            node: 1,
            incarnation: 0,
        },
    ];
    for attack in &attacks {
        let e = forged.call(attack).await.unwrap_err().to_string();
        assert!(
            e.contains("does not match the cluster secret"),
            "{attack:?}: {e}"
        );
    }
    // Unsigned, through a raw Flight client (what an attacker's own program sends).
    let channel = Channel::from_shared(format!("http://{coordinator}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = FlightServiceClient::new(channel);
    let body = gyre_cluster::protocol::encode(&attacks[0]);
    let e = raw
        .do_action(Action {
            r#type: ACTION.into(),
            body: body.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    assert!(e.message().contains("not signed"), "{e}");

    // On each worker: plans, peers and table drops from anyone but the coordinator.
    for worker in cluster.workers() {
        let addr = worker.control_addr().to_string();
        let port = ControlClient::connect_lazy(&addr, guessed.clone(), worker.node).unwrap();
        for attack in [
            Request::StartQuery {
                query: 99,
                workers: vec![1, 2],
                stages: vec![],
                compression: None,
                shuffle_design: None,
                execution: vec![],
            },
            Request::SetPeers {
                peers: vec![(1, "127.0.0.1:9".into())],
            },
            Request::DropTable { name: "t".into() },
            Request::Stats,
        ] {
            let e = port.call(&attack).await.unwrap_err().to_string();
            assert!(
                e.contains("does not match the cluster secret"),
                "{attack:?}: {e}"
            );
        }
        let channel = Channel::from_shared(format!("http://{}", worker.control_addr()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut sql = FlightSqlServiceClient::new(channel);
        let e = sql.execute("SELECT 1".into(), None).await.unwrap_err();
        assert!(e.to_string().contains("cluster nodes only"), "{e}");
    }

    // A message signed with the real secret for one worker is refused by another:
    // what an eavesdropper could replay within the clock window.
    let ids: Vec<_> = cluster.workers().map(|w| w.node).collect();
    let other = cluster.workers().nth(1).unwrap();
    let misdirected = ControlClient::connect_lazy(
        &other.control_addr().to_string(),
        cluster.coordinator.node_key(),
        ids[0],
    )
    .unwrap();
    let e = misdirected
        .call(&Request::DropTable { name: "t".into() })
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match"), "{e}");

    // A TLS address without a CA to check it against is refused, not dialled in clear.
    let e = ControlClient::connect_lazy("grpc+tls://localhost:1", guessed.clone(), 0).unwrap_err();
    assert!(e.to_string().contains("--tls-ca"), "{e}");

    // The cluster is as it was: two workers, the table whole.
    let workers = cluster
        .coordinator
        .sql("SELECT count(*) FROM gyre_workers()")
        .await
        .unwrap();
    assert_eq!(single_i64(&workers.last().unwrap().batches), 2);
    let rows = cluster
        .coordinator
        .sql("SELECT count(*) FROM t")
        .await
        .unwrap();
    assert_eq!(single_i64(&rows.last().unwrap().batches), 3);
}

/// A CA and a certificate it signs for `localhost` and 127.0.0.1, as PEM: (CA, cert, key).
fn test_ca() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_its_ca_only() {
    let (ca, cert, key) = test_ca();
    let front = FrontDoor {
        users: Some(users()),
        tls: Some(TlsIdentity::from_pem(cert, key)),
    };
    let cluster = LocalCluster::start_with(2, 1, "127.0.0.1:0".parse().unwrap(), &front)
        .await
        .unwrap();
    let port = cluster.addr.port();
    let tls = |ca: &str| ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls(&ca))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut alice = FlightSqlServiceClient::new(channel);
    alice.handshake("alice", "correct horse").await.unwrap();
    let rows = query(&mut alice, "SELECT count(*) FROM gyre_workers()")
        .await
        .unwrap();
    assert_eq!(single_i64(&rows), 2);

    // Another CA's client does not get in, nor does plain gRPC.
    let (other_ca, _, _) = test_ca();
    let refused = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls(&other_ca))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = refused {
        let mut c = FlightSqlServiceClient::new(channel);
        assert!(c.handshake("alice", "correct horse").await.is_err());
    }
    let plain = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut c = FlightSqlServiceClient::new(channel);
        assert!(c.handshake("alice", "correct horse").await.is_err());
    }
}

fn gyre() -> Command {
    Command::new(procs::gyre_binary())
}

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_command_line_logs_in_over_tls_and_refuses_open_public_ports() {
    // A public address without users does not start.
    let out = gyre()
        .args(["local", "--workers", "1", "--listen"])
        .arg(format!("0.0.0.0:{}", free_port()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--users") && err.contains("--insecure-no-auth"),
        "{err}"
    );

    // `gyre passwd` makes the users file from a password on stdin.
    let dir = tempfile::tempdir().unwrap();
    let mut passwd = gyre()
        .args(["passwd", "alice"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    passwd
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse\n")
        .unwrap();
    let line = passwd.wait_with_output().unwrap();
    assert!(line.status.success());
    let users = dir.path().join("users");
    std::fs::write(&users, &line.stdout).unwrap();
    assert!(
        Users::load(&users)
            .unwrap()
            .verify("alice", "correct horse")
    );

    let (ca, cert, key) = test_ca();
    for (name, pem) in [("ca.pem", &ca), ("cert.pem", &cert), ("key.pem", &key)] {
        std::fs::write(dir.path().join(name), pem).unwrap();
    }
    let port = free_port();
    let _server = Server(
        gyre()
            .args(["local", "--workers", "2", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--users")
            .arg(&users)
            .arg("--tls-cert")
            .arg(dir.path().join("cert.pem"))
            .arg("--tls-key")
            .arg(dir.path().join("key.pem"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("grpc+tls://localhost:{port}");
    let sql = |user: Option<&str>, password: &str| {
        let mut c = gyre();
        c.args(["sql", "--connect", &url, "--format", "csv", "--tls-ca"])
            .arg(dir.path().join("ca.pem"))
            .env("GYRE_PASSWORD", password)
            .stdin(Stdio::null());
        if let Some(u) = user {
            c.args(["--user", u]);
        }
        c.args(["-c", "SELECT count(*) AS n FROM gyre_workers()"]);
        c.output().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = sql(Some("alice"), "correct horse");
        if out.status.success() {
            assert_eq!(String::from_utf8_lossy(&out.stdout), "n\n2\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never served: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = sql(Some("alice"), "wrong");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong user name or password"), "{err}");
    let out = sql(None, "");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--user"), "{err}");
}

/// The first column of the first row of a statement's last result.
/// An embedded cluster of `workers` workers whose clients must log in as [`users`].
async fn cluster_with_users(workers: usize) -> LocalCluster {
    let front = FrontDoor {
        users: Some(users()),
        tls: None,
    };
    LocalCluster::start_with(workers, 1, "127.0.0.1:0".parse().unwrap(), &front)
        .await
        .unwrap()
}

/// An embedded cluster of `workers` workers set up as `limits` says, open to anyone.
async fn limited_cluster(workers: usize, limits: &gyre_cluster::Limits) -> LocalCluster {
    LocalCluster::start_limited(
        workers,
        1,
        "127.0.0.1:0".parse().unwrap(),
        &FrontDoor::default(),
        limits,
    )
    .await
    .unwrap()
}

async fn sql_count(cluster: &LocalCluster, sql: &str) -> Result<u64, String> {
    let results = cluster
        .coordinator
        .sql(sql)
        .await
        .map_err(|e| e.to_string())?;
    let last = results.last().ok_or("no result")?;
    let b = last
        .batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .ok_or("no rows")?;
    let c = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::UInt64).unwrap();
    Ok(c.as_any()
        .downcast_ref::<arrow::array::UInt64Array>()
        .unwrap()
        .value(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_read_and_written_only_inside_the_data_roots() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("t")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let rows: String = (0..1000).map(|i| format!("{i},{}\n", i % 7)).collect();
    std::fs::write(root.join("t/a.csv"), format!("k,v\n{rows}")).unwrap();
    std::fs::write(outside.join("secret.csv"), "k,v\n1,2\n").unwrap();
    let limits = gyre_cluster::Limits {
        local_files: gyre_cluster::files::LocalFiles::within(std::slice::from_ref(&root)).unwrap(),
        ..Default::default()
    };
    let cluster = limited_cluster(2, &limits).await;
    let csv = |name: &str, location: &std::path::Path| {
        format!(
            "CREATE EXTERNAL TABLE {name} STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'true')",
            location.display()
        )
    };

    // Inside: loaded by the workers, written back by them.
    cluster
        .coordinator
        .sql(&csv("t", &root.join("t/")))
        .await
        .unwrap();
    assert_eq!(
        sql_count(&cluster, "SELECT count(*) FROM t").await,
        Ok(1000)
    );
    let out = root.join("out");
    let copied = sql_count(
        &cluster,
        &format!("COPY t TO '{}/' STORED AS PARQUET", out.display()),
    )
    .await;
    assert_eq!(copied, Ok(1000));
    assert!(std::fs::read_dir(&out).unwrap().count() >= 1);

    // Outside, directly, through `..`, or through a symlink: refused, naming the path.
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    for (name, location) in [
        ("a", outside.join("secret.csv")),
        ("b", root.join("../outside/secret.csv")),
        ("c", root.join("link/secret.csv")),
        ("d", std::path::PathBuf::from("/etc/hostname")),
    ] {
        let e = sql_count(&cluster, &csv(name, &location))
            .await
            .unwrap_err();
        assert!(e.contains("outside the data roots"), "{location:?}: {e}");
    }
    // A directory inside that holds a symlink out: its listing is refused.
    std::fs::create_dir_all(root.join("mixed")).unwrap();
    std::fs::copy(root.join("t/a.csv"), root.join("mixed/a.csv")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.csv"), root.join("mixed/b.csv")).unwrap();
    let e = sql_count(&cluster, &csv("m", &root.join("mixed/")))
        .await
        .unwrap_err();
    assert!(e.contains("outside the data roots"), "{e}");
    let e = sql_count(
        &cluster,
        &format!(
            "COPY t TO '{}/' STORED AS CSV",
            outside.join("stolen").display()
        ),
    )
    .await
    .unwrap_err();
    assert!(e.contains("outside the data roots"), "{e}");
    assert!(!outside.join("stolen").exists());
    // Nothing was created; the cluster still answers.
    assert_eq!(
        sql_count(&cluster, "SELECT count(*) FROM t").await,
        Ok(1000)
    );
}

#[test]
fn a_public_coordinator_without_data_roots_touches_no_local_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.csv"), "k\n1\n").unwrap();
    let create = format!(
        "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{}/a.csv' \
         OPTIONS ('format.has_header' 'true'); SELECT count(*) FROM t",
        dir.path().display()
    );
    let run = |args: &[&str]| {
        let out = gyre()
            .args(["local", "--workers", "1", "--format", "csv"])
            .args(args)
            .args(["-c", &create])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let public = format!("0.0.0.0:{}", free_port());
    let (ok, _, err) = run(&["--listen", &public, "--insecure-no-auth"]);
    assert!(!ok && err.contains("without --data-root"), "{err}");
    let root = dir.path().to_str().unwrap();
    let public = format!("0.0.0.0:{}", free_port());
    let (ok, out, err) = run(&[
        "--listen",
        &public,
        "--insecure-no-auth",
        "--data-root",
        root,
    ]);
    assert!(ok && out.contains('1'), "{out}{err}");
    // A data root elsewhere: the file is outside it.
    let other = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(&["--data-root", other.path().to_str().unwrap()]);
    assert!(!ok && err.contains("outside the data roots"), "{err}");
}

/// A unary call whose message never comes: answered only by a server that judges the
/// call by its headers.
async fn call_without_message(
    addr: SocketAddr,
    path: &'static str,
    headers: &[(&'static str, String)],
) -> Result<tonic::Status, tokio::time::error::Elapsed> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(futures::stream::pending::<Action>());
    for (name, value) in headers {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    let codec = tonic_prost::ProstCodec::<Action, arrow_flight::Result>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    let call = grpc.streaming(request, path, codec);
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .map(|r| r.expect_err("a call without credentials must fail"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_are_turned_away_before_their_messages_are_read() {
    let cluster = cluster_with_users(1).await;
    const DO_ACTION: &str = "/arrow.flight.protocol.FlightService/DoAction";
    const GET_INFO: &str = "/arrow.flight.protocol.FlightService/GetFlightInfo";
    let (worker, node) = cluster
        .workers()
        .next()
        .map(|w| (w.control_addr(), w.node))
        .unwrap();
    let key = cluster.coordinator.node_key();
    type Case = (
        SocketAddr,
        &'static str,
        Vec<(&'static str, String)>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (cluster.addr, GET_INFO, vec![], "log in first"),
        (
            cluster.addr,
            GET_INFO,
            vec![("authorization", "Bearer 0123".into())],
            "unknown or expired",
        ),
        (
            cluster.addr,
            "/arrow.flight.protocol.FlightService/Handshake",
            vec![("authorization", "Basic !!".into())],
            "Basic",
        ),
        (cluster.addr, DO_ACTION, vec![], "log in first"),
        (worker, DO_ACTION, vec![], "cluster nodes only"),
        (worker, GET_INFO, vec![], "cluster nodes only"),
        (
            worker,
            DO_ACTION,
            vec![(
                "x-gyre-node-auth",
                NodeKey::from_secret("guessed secret").sign(node, ACTION, b""),
            )],
            "does not match the cluster secret",
        ),
        (
            worker,
            GET_INFO,
            vec![("x-gyre-node-auth", key.sign(node, ACTION, b""))],
            "DoAction only",
        ),
    ];
    for (addr, path, headers, why) in cases {
        let status = call_without_message(addr, path, &headers)
            .await
            .unwrap_or_else(|_| panic!("{path} {headers:?} waited for its message"));
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status}");
        assert!(
            status.message().contains(why),
            "{path} {headers:?}: {status}"
        );
    }
    // A signature that passes the header check is read on: its message never comes.
    let signed = vec![("x-gyre-node-auth", key.sign(node, ACTION, b""))];
    assert!(
        call_without_message(worker, DO_ACTION, &signed)
            .await
            .is_err()
    );
}

/// Runs `sql` and returns its one row of Int64-castable columns.
async fn sql_row(cluster: &LocalCluster, sql: &str) -> Vec<i64> {
    let results = cluster.coordinator.sql(sql).await.unwrap();
    let b = results
        .last()
        .and_then(|r| r.batches.iter().find(|b| b.num_rows() > 0))
        .expect("one row");
    b.columns()
        .iter()
        .map(|c| {
            let c = arrow::compute::cast(c, &arrow::datatypes::DataType::Int64).unwrap();
            c.as_any().downcast_ref::<Int64Array>().unwrap().value(0)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_data_links_give_the_same_answers_as_clear_ones() {
    let setup = "CREATE TABLE a AS SELECT value AS k, value % 97 AS g \
                 FROM generate_series(1, 200000) AS s(value); \
                 CREATE TABLE b AS SELECT value * 2 AS k, value % 13 AS h \
                 FROM generate_series(1, 100000) AS s(value);";
    // A join and a grouping on keys the tables are not placed on: rows cross the links.
    let join = "SELECT count(*), sum(a.g), sum(b.h) FROM a JOIN b ON a.k = b.k";
    let groups = "SELECT count(*), sum(n) FROM \
                  (SELECT g, h, count(*) AS n FROM a JOIN b ON a.k = b.k GROUP BY g, h)";
    let moved = "SELECT sum(bytes_sent) FROM gyre_workers()";
    let expected_join = vec![
        100_000,
        (1..=100_000i64).map(|i| (2 * i) % 97).sum(),
        (1..=100_000i64).map(|i| i % 13).sum(),
    ];
    let mut answers = vec![];
    for encrypt_links in [false, true] {
        let limits = gyre_cluster::Limits {
            encrypt_links,
            ..Default::default()
        };
        let cluster = limited_cluster(3, &limits).await;
        cluster.coordinator.sql(setup).await.unwrap();
        let before = sql_row(&cluster, moved).await[0];
        let j = sql_row(&cluster, join).await;
        assert_eq!(j, expected_join, "sealed: {encrypt_links}");
        let after = sql_row(&cluster, moved).await[0];
        assert!(
            after - before > 1_000_000,
            "the join moved only {} bytes between nodes",
            after - before
        );
        answers.push((j, sql_row(&cluster, groups).await));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[1].1, vec![97 * 13, 100_000]);
}
