//! SQL that single-node DataFusion runs and Gyre once did not, on 1 to 4 workers, each
//! result compared with single-node DataFusion's: typed and dictionary columns through
//! exchanges and Flight SQL, recursive CTEs, primary keys as functional dependencies,
//! window functions over constant partitions, per-partition top-k, grouping sets, column
//! defaults and NOT NULL on insert, DELETE and UPDATE, prepared statements, DDL results
//! and errors raised on workers. DataFusion's own SQL tests run in `tests/sqllogictest.rs`.

mod sql_reference;

use arrow::datatypes::{DataType, Schema};
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use sql_reference::{differs, start};
use tonic::transport::Channel;

const SETUP: &str = "
CREATE TABLE d AS SELECT arrow_cast(column1, 'Dictionary(Int32, Utf8)') AS d1 FROM (VALUES ('a'), ('b'), (NULL));
CREATE TABLE typed AS SELECT arrow_cast(column1, 'Date64') AS dt, arrow_cast(column2, 'Decimal128(5, 2)') AS dec, column3 AS v FROM (VALUES ('2024-01-01', 1.25, 1), ('2024-01-02', 2.50, 2), ('2024-01-03', 3.75, 3));
CREATE TABLE typed2 AS SELECT arrow_cast(column1, 'Date64') AS dt, arrow_cast(column2, 'Decimal128(5, 2)') AS dec FROM (VALUES ('2024-01-02', 2.50), ('2024-01-03', 9.99));
CREATE TABLE s (sn INT PRIMARY KEY, amount INT);
INSERT INTO s VALUES (1, 10), (2, 20), (3, 30);
CREATE TABLE a (a BIGINT, b BIGINT);
INSERT INTO a VALUES (1, 1), (1, 2), (2, 3);
CREATE TABLE t (pk INT, val INT);
INSERT INTO t SELECT value % 5, value FROM generate_series(1, 200) AS g(value);
CREATE TABLE n1 (name VARCHAR);
INSERT INTO n1 VALUES ('x'), ('y'), ('z');
CREATE TABLE n2 (name VARCHAR);
INSERT INTO n2 VALUES ('y'), ('w');
CREATE TABLE c (a INT, b INT NOT NULL DEFAULT 7);
INSERT INTO c(a) VALUES (1), (2);
CREATE TABLE edges (src INT, dst INT);
INSERT INTO edges VALUES (1, 2), (2, 3), (3, 4), (4, 5), (10, 11);
CREATE OR REPLACE TABLE u AS SELECT 1 AS x UNION ALL SELECT 2;
CREATE OR REPLACE TABLE u AS SELECT 3 AS x UNION ALL SELECT 4 UNION ALL SELECT 5;
";

const QUERIES: &[&str] = &[
    "SELECT d1 FROM d",
    "SELECT d1, count(*) FROM d GROUP BY d1",
    "SELECT typed.v, typed2.dec FROM typed JOIN typed2 ON typed.dt = typed2.dt",
    "SELECT typed.v FROM typed JOIN typed2 ON typed.dec = typed2.dec",
    "SELECT make_array(make_array(1)) UNION ALL SELECT make_array(arrow_cast(make_array(-1), 'LargeList(Int8)'))",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10) SELECT n FROM r",
    "WITH RECURSIVE o AS (SELECT 1 AS a UNION ALL (WITH RECURSIVE i AS (SELECT 1 AS a UNION ALL SELECT a + 2 AS a FROM i WHERE a < 3) SELECT o.a + 2 AS a FROM o JOIN i USING (a) WHERE i.a < 4)) SELECT a FROM o",
    "SELECT sn, amount FROM s GROUP BY sn",
    "SELECT sn, (SELECT amount FROM s s2 WHERE s2.sn = s1.sn) FROM s s1",
    "SELECT row_number() OVER (PARTITION BY a) FROM (SELECT * FROM a WHERE a = 1)",
    "SELECT count(*) OVER (PARTITION BY a ORDER BY a) FROM (SELECT * FROM a WHERE a = 1)",
    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY pk ORDER BY val) rn FROM t) WHERE rn <= 3",
    "SELECT * FROM (SELECT *, RANK() OVER (PARTITION BY pk ORDER BY val DESC) rk FROM t) WHERE rk <= 2",
    "SELECT COUNT(*) FROM a GROUP BY GROUPING SETS (())",
    "SELECT a, b, count(*) FROM a GROUP BY GROUPING SETS ((a, b), (a), ())",
    "SELECT a, b FROM c",
    "SELECT x FROM u",
    "(SELECT name FROM n1 EXCEPT SELECT name FROM n2) UNION ALL (SELECT name FROM n2 EXCEPT SELECT name FROM n1)",
];

/// Statements that change the tables, each followed by a check of the whole table.
const CHANGES: &[(&str, &str)] = &[
    (
        "DELETE FROM t WHERE val > 150",
        "SELECT pk, count(*), sum(val) FROM t GROUP BY pk",
    ),
    (
        "UPDATE t SET val = val * 10 WHERE pk = 2",
        "SELECT pk, count(*), sum(val) FROM t GROUP BY pk",
    ),
    ("UPDATE a SET b = NULL WHERE b = 2", "SELECT * FROM a"),
    ("DELETE FROM a WHERE b IS NULL", "SELECT * FROM a"),
    ("DELETE FROM a", "SELECT count(*) FROM a"),
];

/// Runs each of [`CHANGES`] on the cluster and the reference: the counts and the
/// tables afterwards must agree.
async fn apply_changes(
    c: &std::sync::Arc<gyre_cluster::Coordinator>,
    reference: &datafusion::prelude::SessionContext,
    failures: &mut Vec<String>,
) {
    for (change, check) in CHANGES {
        let want = reference
            .sql(change)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let want = gyre_cluster::reference::canonical_rows(&want).unwrap();
        match c.sql_one(change).await {
            Ok(got) => {
                let got = gyre_cluster::reference::canonical_rows(&got.batches).unwrap();
                if got != want {
                    failures.push(format!("{change}: counted {got:?}, want {want:?}"));
                }
            }
            Err(e) => failures.push(format!("{change}: {e}")),
        }
        if let Some(d) = differs(c, reference, check).await {
            failures.push(format!("after {change}: {d}"));
        }
    }
}

async fn check(workers: usize) {
    let (cluster, reference) = start(workers, SETUP).await;
    let c = &cluster.coordinator;
    let mut failures = vec![];
    for q in QUERIES {
        if let Some(d) = differs(c, &reference, q).await {
            failures.push(d);
        }
    }
    apply_changes(c, &reference, &mut failures).await;
    assert!(
        failures.is_empty(),
        "{workers} workers:\n{}",
        failures.join("\n")
    );
}

/// The tables of [`SETUP`] whose column types the row store keeps, created as
/// transactional tables (`gyre.replication`): `s` with its primary key, the others
/// numbered by a hidden row id, equal rows included (`t`, `a` after the UPDATE).
const TRANSACTIONAL_SETUP: &str = "
SET gyre.replication = 'partitioned';
CREATE TABLE s (sn INT PRIMARY KEY, amount INT);
INSERT INTO s VALUES (1, 10), (2, 20), (3, 30);
CREATE TABLE a (a BIGINT, b BIGINT);
INSERT INTO a VALUES (1, 1), (1, 2), (2, 3);
CREATE TABLE t (pk INT, val INT);
INSERT INTO t SELECT value % 5, value FROM generate_series(1, 200) AS g(value);
INSERT INTO t SELECT pk, val FROM t WHERE val % 7 = 0;
SET gyre.replication = 'full';
CREATE TABLE n1 (name VARCHAR);
INSERT INTO n1 VALUES ('x'), ('y'), ('z'), ('y');
CREATE TABLE n2 (name VARCHAR);
INSERT INTO n2 VALUES ('y'), ('w');
SET gyre.replication = 'none';
";

/// Transactional tables, read on the workers' snapshots and changed on the primary,
/// give DataFusion's results for the queries and changes that use them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_tables_give_datafusions_results() {
    let cluster = gyre_cluster::LocalCluster::start(3, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    c.sql(TRANSACTIONAL_SETUP).await.unwrap();
    let without_settings: String = TRANSACTIONAL_SETUP
        .split(';')
        .filter(|s| !s.trim().starts_with("SET"))
        .collect::<Vec<_>>()
        .join(";");
    let reference = sql_reference::reference(&without_settings).await;
    // The queries that read only these tables (each word after FROM or JOIN is one).
    let uses = |q: &str| {
        let words: Vec<&str> = q.split([' ', '(', ')', ',']).collect();
        let read: Vec<&str> = words
            .windows(2)
            .filter(|w| ["FROM", "JOIN"].contains(&w[0].to_ascii_uppercase().as_str()))
            .map(|w| w[1])
            .filter(|t| !t.is_empty())
            .collect();
        !read.is_empty() && read.iter().all(|t| ["s", "a", "t", "n1", "n2"].contains(t))
    };
    let mut failures = vec![];
    let queries: Vec<&str> = QUERIES.iter().copied().filter(|q| uses(q)).collect();
    assert!(queries.len() >= 9, "{queries:?}");
    for q in queries {
        if let Some(d) = differs(c, &reference, q).await {
            failures.push(d);
        }
    }
    apply_changes(c, &reference, &mut failures).await;
    let explained = sql_reference::text(c.sql_one("EXPLAIN SELECT * FROM t").await.unwrap());
    assert!(explained.contains("table=t (partitioned)"), "{explained}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_datafusion_runs_give_its_results_on_1_to_4_workers() {
    for workers in 1..=4 {
        check(workers).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_checked_and_answered_as_datafusion_does() {
    let (cluster, reference) = start(3, SETUP).await;
    let c = &cluster.coordinator;
    // DDL answers with no rows, as DataFusion.
    for ddl in ["CREATE TABLE e1 (x INT)", "DROP TABLE e1"] {
        let r = c.sql_one(ddl).await.unwrap();
        assert!(
            r.schema.fields().is_empty() && r.batches.is_empty(),
            "{ddl}"
        );
    }
    // Inserts DataFusion refuses are refused, with its words.
    for (bad, want) in [
        ("INSERT INTO c(b) VALUES (NULL)", "non-nullable"),
        ("INSERT INTO s VALUES (1, 2, 3)", ""),
        ("INSERT INTO s VALUES ('x', 1)", ""),
        ("UPDATE s SET sn = 5", "it places the rows of table 's'"),
        ("DROP TABLE nope", "Table 'nope' doesn't exist."),
        ("CREATE TABLE s (x INT)", "Table 's' already exists"),
    ] {
        let refused = reference.sql(bad).await;
        let refused = match refused {
            Ok(df) => df.collect().await.is_err(),
            Err(_) => true,
        };
        let e = c.sql_one(bad).await.expect_err(bad).to_string();
        assert!(e.contains(want), "{bad}: {e}");
        // Everything Gyre refuses here but the key update, DataFusion refuses too.
        assert!(refused || bad.starts_with("UPDATE"), "{bad}");
    }
    // Prepared statements run on the cluster.
    c.sql_one("PREPARE q(INT) AS SELECT amount FROM s WHERE sn = $1")
        .await
        .unwrap();
    let r = c.sql_one("EXECUTE q(2)").await.unwrap();
    assert_eq!(sql_reference::text(r), "20");
    // The parser follows the session's dialect.
    c.sql_one("SET datafusion.sql_parser.dialect = 'DuckDB'")
        .await
        .unwrap();
    c.sql_one("CREATE TABLE st (s STRUCT(a INT, b VARCHAR))")
        .await
        .unwrap();
    c.sql_one("SET datafusion.sql_parser.dialect = 'generic'")
        .await
        .unwrap();
    // A worker's error reaches the client in DataFusion's words, with where it happened.
    let e = c.sql_one("SELECT val / 0 FROM t").await.unwrap_err();
    assert_eq!(
        gyre_exchange::error_text(&e),
        "Arrow error: Divide by zero error"
    );
    let place = gyre_exchange::error_place(&e).unwrap();
    assert!(place.contains("on worker"), "{place}");
}

/// Column types as a Flight SQL client sees them, for a query.
async fn flight_types(addr: std::net::SocketAddr, sql: &str) -> Vec<DataType> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = FlightSqlServiceClient::new(channel);
    let info = client.execute(sql.to_string(), None).await.unwrap();
    let declared = info.clone().try_decode_schema().unwrap_or(Schema::empty());
    let mut types: Vec<DataType> = declared
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    for endpoint in info.endpoint {
        let stream = client.do_get(endpoint.ticket.unwrap()).await.unwrap();
        for b in stream.try_collect::<Vec<_>>().await.unwrap() {
            let got: Vec<DataType> = b
                .schema()
                .fields()
                .iter()
                .map(|f| f.data_type().clone())
                .collect();
            assert_eq!(got, types, "{sql}: batches differ from the declared schema");
        }
    }
    types.truncate(types.len());
    types
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dictionary_and_large_list_columns_reach_flight_sql_clients_unchanged() {
    let (cluster, reference) = start(2, SETUP).await;
    for sql in [
        "SELECT d1 FROM d",
        "SELECT arrow_cast(make_array(1, 2), 'LargeList(Int64)')",
    ] {
        let want: Vec<DataType> = reference
            .sql(sql)
            .await
            .unwrap()
            .schema()
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(flight_types(cluster.addr, sql).await, want, "{sql}");
    }
}
