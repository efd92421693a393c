//! Tables loaded from and written to an S3-compatible object store, end to end.
//!
//! These tests need a server: `scripts/test.sh` starts moto's S3 server, creates the
//! bucket and runs them with `GYRE_TEST_S3` set to its address (`cargo test --test
//! object_store -- --ignored`).

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use gyre_cluster::LocalCluster;
use gyre_cluster::reference::canonical_rows;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;

const BUCKET: &str = "gyre-test";

fn endpoint() -> String {
    std::env::var("GYRE_TEST_S3").expect("GYRE_TEST_S3: the address of an S3-compatible server")
}

/// The options that reach the test server, as a statement's OPTIONS entries.
fn options() -> String {
    format!(
        "'aws.endpoint' '{}', 'aws.access_key_id' 'test', 'aws.secret_access_key' 'test', \
         'aws.region' 'us-east-1', 'aws.allow_http' 'true'",
        endpoint()
    )
}

fn store() -> Arc<dyn ObjectStore> {
    Arc::new(
        AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_endpoint(endpoint())
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_region("us-east-1")
            .with_allow_http(true)
            .build()
            .unwrap(),
    )
}

/// Four Parquet files of 50,000 rows each under `prefix`.
async fn upload(prefix: &str) {
    let store = store();
    for f in 0..4i64 {
        let ids: Vec<i64> = (f * 50_000..(f + 1) * 50_000).collect();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("s", DataType::Utf8, false),
            ])),
            vec![
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| format!("r{}", i % 10)),
                )),
            ],
        )
        .unwrap();
        let mut buf = vec![];
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(10_000))
            .build();
        let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        store
            .put(
                &Path::from(format!("{prefix}/part-{f}.parquet")),
                PutPayload::from(buf),
            )
            .await
            .unwrap();
    }
}

const CHECK: &str = "SELECT count(*), count(DISTINCT id), sum(id), sum(length(s)) FROM t";
const WANT: &str = "200000|200000|19999900000|400000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an S3-compatible server (scripts/test.sh starts one)"]
async fn s3_tables_load_on_the_workers_and_copy_writes_back() {
    upload("data").await;
    let cluster = LocalCluster::start(3, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    for placement in ["", ", 'gyre.partition_by' 'id'"] {
        c.sql(&format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://{BUCKET}/data/' \
             OPTIONS ({}{placement})",
            options()
        ))
        .await
        .unwrap();
        let got = c.sql_one(CHECK).await.unwrap();
        assert_eq!(
            canonical_rows(&got.batches).unwrap(),
            vec![WANT.to_string()]
        );
        c.sql("DROP TABLE t").await.unwrap();
    }

    // COPY TO the bucket: one file per worker, read back whole.
    c.sql(&format!(
        "CREATE EXTERNAL TABLE src STORED AS PARQUET LOCATION 's3://{BUCKET}/data/' \
         OPTIONS ({})",
        options()
    ))
    .await
    .unwrap();
    let copied = c
        .sql_one(&format!(
            "COPY (SELECT * FROM src) TO 's3://{BUCKET}/out/' STORED AS PARQUET OPTIONS ({})",
            options()
        ))
        .await
        .unwrap();
    assert_eq!(
        canonical_rows(&copied.batches).unwrap(),
        vec!["200000".to_string()]
    );
    let written: Vec<_> =
        futures::TryStreamExt::try_collect::<Vec<_>>(store().list(Some(&Path::from("out"))))
            .await
            .unwrap();
    assert_eq!(written.len(), 3, "{written:?}");
    c.sql(&format!(
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://{BUCKET}/out/' OPTIONS ({})",
        options()
    ))
    .await
    .unwrap();
    let got = c.sql_one(CHECK).await.unwrap();
    assert_eq!(
        canonical_rows(&got.batches).unwrap(),
        vec![WANT.to_string()]
    );
    c.sql("DROP TABLE t").await.unwrap();

    // A bucket that does not exist, and an option that is no option, are named.
    let e = c
        .sql(&format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://no-such-bucket/x/' \
             OPTIONS ({})",
            options()
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no-such-bucket"), "{e}");
    let e = c
        .sql(&format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://{BUCKET}/data/' \
             OPTIONS ('aws.endpoint_colour' 'blue')"
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("aws.endpoint_colour"), "{e}");
    assert!(c.table("t").is_none());
}

/// Credentials and endpoint from the environment of every process (here the `gyre`
/// binary's embedded cluster), no options in the statement.
#[test]
#[ignore = "needs an S3-compatible server (scripts/test.sh starts one)"]
fn s3_credentials_come_from_the_environment() {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(upload("env"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["local", "--workers", "2", "--format", "csv", "-c"])
        .arg(format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://{BUCKET}/env/'; {CHECK}"
        ))
        .env("AWS_ENDPOINT", endpoint())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ALLOW_HTTP", "true")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&WANT.replace('|', ",")), "{stdout}");
}
