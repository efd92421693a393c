//! Settings belong to the client that sets them: two Flight SQL connections to one
//! coordinator each plan and run with their own `SET gyre.*` and `SET datafusion.*`.

use arrow::array::RecordBatch;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandStatementQuery, ProstMessageExt};
use arrow_flight::{Action, FlightDescriptor};
use futures::TryStreamExt;
use gyre_cluster::LocalCluster;
use prost::Message;
use std::net::SocketAddr;
use tonic::transport::Channel;

/// A client on a connection of its own.
async fn connect(addr: SocketAddr) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightSqlServiceClient::new(channel)
}

async fn batches(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Vec<RecordBatch> {
    let info = client
        .execute(sql.to_string(), None)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out = vec![];
    for ep in info.endpoint {
        let stream = client.do_get(ep.ticket.unwrap()).await.unwrap();
        out.extend(stream.try_collect::<Vec<_>>().await.unwrap());
    }
    out
}

async fn text(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> String {
    arrow::util::pretty::pretty_format_batches(&batches(client, sql).await)
        .unwrap()
        .to_string()
}

async fn run(client: &mut FlightSqlServiceClient<Channel>, sql: &str) {
    batches(client, sql).await;
}

/// The session cookie the coordinator sends a connection's first statement.
async fn session_cookie(client: &mut FlightSqlServiceClient<Channel>) -> String {
    let cmd = CommandStatementQuery {
        query: "SELECT 1".into(),
        transaction_id: None,
    };
    let response = client
        .inner()
        .clone()
        .get_flight_info(FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec()))
        .await
        .unwrap();
    response
        .metadata()
        .get("set-cookie")
        .expect("a new session sends its cookie")
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_connection_plans_and_runs_with_its_own_settings() {
    let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.sql(
        "CREATE TABLE s AS SELECT value AS id, value % 5000 AS k FROM generate_series(1, 20000) \
         AS t(value)",
    )
    .await
    .unwrap();
    c.sql("CREATE TABLE d AS SELECT value AS k FROM generate_series(0, 4999) AS t(value)")
        .await
        .unwrap();
    let join = "SELECT s.id, d.k FROM s JOIN d ON s.k = d.k";
    let mut a = connect(cluster.addr).await;
    let cookie = session_cookie(&mut a).await;
    let mut b = connect(cluster.addr).await;
    run(&mut a, "SET gyre.skew_detection = off").await;
    run(&mut a, "SET gyre.join_strategy = 'shuffle'").await;
    run(&mut a, "SET datafusion.execution.batch_size = 100").await;
    run(&mut b, "SET gyre.join_strategy = 'shuffle'").await;

    // Each connection's plan follows its own settings.
    let plan_a = text(&mut a, &format!("EXPLAIN {join}")).await;
    let plan_b = text(&mut b, &format!("EXPLAIN {join}")).await;
    assert!(!plan_a.contains("FlowJoinExec"), "{plan_a}");
    assert!(plan_b.contains("FlowJoinExec"), "{plan_b}");
    let shown = |t: &str, v: &str| t.lines().any(|l| l.contains(v));
    let batch_a = text(&mut a, "SHOW datafusion.execution.batch_size").await;
    let batch_b = text(&mut b, "SHOW datafusion.execution.batch_size").await;
    assert!(shown(&batch_a, "| 100 "), "{batch_a}");
    assert!(shown(&batch_b, "| 8192 "), "{batch_b}");
    let all_a = text(&mut a, "SHOW ALL").await;
    assert!(
        shown(&all_a, "gyre.skew_detection") && shown(&all_a, "| off"),
        "{all_a}"
    );

    // The workers run a's stages with a's batch size: each worker's join emits its
    // 10,000 rows in batches of 100, b's in a batch or two (the exchanges then send
    // whole buffers, so the client cannot see this; the workers' metrics can).
    let join_batches = |report: &str| -> Vec<usize> {
        report
            .lines()
            .filter(|l| l.contains("HashJoinExec"))
            .filter_map(|l| l.split("output_batches=").nth(1))
            .map(|v| v.split([',', ']']).next().unwrap().trim().parse().unwrap())
            .collect()
    };
    let analyzed_a = join_batches(&text(&mut a, &format!("EXPLAIN ANALYZE {join}")).await);
    let analyzed_b = join_batches(&text(&mut b, &format!("EXPLAIN ANALYZE {join}")).await);
    assert_eq!(analyzed_a.len(), 2, "{analyzed_a:?}");
    assert!(analyzed_a.iter().all(|n| *n >= 100), "{analyzed_a:?}");
    assert!(
        !analyzed_b.is_empty() && analyzed_b.iter().all(|n| *n <= 10),
        "{analyzed_b:?}"
    );
    let rows = |bs: &[RecordBatch]| bs.iter().map(|b| b.num_rows()).sum::<usize>();
    assert_eq!(rows(&batches(&mut a, join).await), 20000);
    assert_eq!(rows(&batches(&mut b, join).await), 20000);

    // The coordinator's own session (the embedded CLI's) kept the defaults.
    let own = c.sql_one("SHOW gyre.skew_detection").await.unwrap();
    let own = arrow::util::pretty::pretty_format_batches(&own.batches)
        .unwrap()
        .to_string();
    assert!(own.contains("| on "), "{own}");

    // A wrong value names the setting's values and leaves the setting as it was.
    let err = a
        .execute("SET gyre.join_strategy = 'fast'".into(), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("auto, shuffle, broadcast, cyclo or neo"),
        "{err}"
    );
    let strategy = text(&mut a, "SHOW gyre.join_strategy").await;
    assert!(shown(&strategy, "| shuffle "), "{strategy}");

    // Another connection that presents a's cookie is in a's session.
    let mut again = connect(cluster.addr).await;
    again.set_header("cookie", &cookie);
    let plan = text(&mut again, &format!("EXPLAIN {join}")).await;
    assert!(!plan.contains("FlowJoinExec"), "{plan}");

    // CloseSession ends a's session: its next statement starts with the defaults.
    let action = Action {
        r#type: "CloseSession".into(),
        body: Default::default(),
    };
    let mut replies = a
        .inner()
        .clone()
        .do_action(action)
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    assert_eq!(&reply.body[..], &[0x08, 1], "CloseSessionResult CLOSED");
    let detection = text(&mut a, "SHOW gyre.skew_detection").await;
    assert!(shown(&detection, "| on "), "{detection}");
}
