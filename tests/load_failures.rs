//! Bad input to a load gets an error naming the file (and the row or offset where
//! known), leaves no table or part of one behind, and the cluster keeps serving:
//! a missing path, a truncated and a corrupt Parquet file, CSV rows with the wrong
//! number of fields or an unparsable value, files of one directory with
//! incompatible schemas, and a file deleted while the workers read.

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use async_trait::async_trait;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use futures::stream::BoxStream;
use gyre_cluster::LocalCluster;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn write_parquet(path: &Path, ids: Vec<i64>, s: Option<Vec<String>>) {
    let mut fields = vec![Field::new("id", DataType::Int64, false)];
    let mut cols: Vec<Arc<dyn arrow::array::Array>> = vec![Arc::new(Int64Array::from(ids))];
    if let Some(s) = s {
        fields.push(Field::new("s", DataType::Utf8, false));
        cols.push(Arc::new(StringArray::from(s)));
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(10_000))
        .build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Runs `sql`, which must fail naming every one of `names`, and checks that table `t`
/// exists nowhere afterwards and that the cluster still loads and answers.
async fn fails_cleanly(cluster: &LocalCluster, sql: &str, names: &[&str], good: &str) {
    let c = &cluster.coordinator;
    let err = c.sql(sql).await.expect_err(sql).to_string();
    for n in names {
        assert!(err.contains(n), "'{n}' not named in: {err}\n({sql})");
    }
    assert!(c.table("t").is_none(), "{sql} left table t in the catalog");
    for w in cluster.workers() {
        assert!(
            !w.storage.table_names().contains(&"t".to_string()),
            "{sql} left a part of t on worker {}",
            w.node
        );
    }
    let e = c.sql("SELECT * FROM t").await.unwrap_err().to_string();
    assert!(e.contains("t"), "{e}");
    // The same name loads good data, and the cluster answers.
    c.sql(good).await.unwrap();
    let n = c.sql_one("SELECT count(*) FROM t").await.unwrap();
    assert_eq!(
        gyre_cluster::reference::canonical_rows(&n.batches).unwrap(),
        vec!["3".to_string()]
    );
    c.sql("DROP TABLE t").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_fail_naming_the_file_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let good_csv = d.join("good.csv");
    std::fs::write(&good_csv, "id,s\n1,a\n2,b\n3,c\n").unwrap();
    let good = format!(
        "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
        good_csv.display()
    );

    // A missing path.
    let missing = d.join("no/such/file.parquet");
    fails_cleanly(
        &cluster,
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
            missing.display()
        ),
        &["no/such/file.parquet"],
        &good,
    )
    .await;

    // A truncated Parquet file: its footer is gone.
    let whole = d.join("whole.parquet");
    write_parquet(&whole, (0..50_000).collect(), None);
    let bytes = std::fs::read(&whole).unwrap();
    let truncated = d.join("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    fails_cleanly(
        &cluster,
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
            truncated.display()
        ),
        &["truncated.parquet"],
        &good,
    )
    .await;

    // A corrupt Parquet file: its footer is fine, the pages of a later row group are not.
    let mut corrupt_bytes = bytes.clone();
    let at = bytes.len() / 2;
    corrupt_bytes[at..at + 256].fill(0xA5);
    let corrupt = d.join("corrupt.parquet");
    std::fs::write(&corrupt, &corrupt_bytes).unwrap();
    fails_cleanly(
        &cluster,
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
            corrupt.display()
        ),
        &["corrupt.parquet", "worker"],
        &good,
    )
    .await;

    // CSV: a row with a field too many, and a value that is not a number.
    let mut text = String::from("id,s\n");
    for i in 0..5000 {
        text.push_str(&format!("{i},x{i}\n"));
    }
    let mut extra = text.clone();
    extra.push_str("5000,x,too many\n");
    let extra_path = d.join("extra_field.csv");
    std::fs::write(&extra_path, &extra).unwrap();
    fails_cleanly(
        &cluster,
        &format!(
            "CREATE EXTERNAL TABLE t (id BIGINT, s VARCHAR) STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'true')",
            extra_path.display()
        ),
        &["extra_field.csv", "5002"],
        &good,
    )
    .await;
    let mut bad_value = text.clone();
    bad_value.push_str("twelve,x\n");
    let bad_value_path = d.join("bad_value.csv");
    std::fs::write(&bad_value_path, &bad_value).unwrap();
    fails_cleanly(
        &cluster,
        &format!(
            "CREATE EXTERNAL TABLE t (id BIGINT, s VARCHAR) STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'true')",
            bad_value_path.display()
        ),
        &["bad_value.csv", "twelve"],
        &good,
    )
    .await;

    // Two Parquet files of one directory whose column `id` has different types.
    let mixed = d.join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    write_parquet(&mixed.join("a.parquet"), vec![1, 2], None);
    let strings = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(vec!["x", "y"]))],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(mixed.join("b.parquet")).unwrap(),
        strings.schema(),
        None,
    )
    .unwrap();
    w.write(&strings).unwrap();
    w.close().unwrap();
    fails_cleanly(
        &cluster,
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}/'",
            mixed.display()
        ),
        &["b.parquet", "id"],
        &good,
    )
    .await;
}

/// The local file system, except that the first read of any file deletes `victim`
/// first: a file deleted after the coordinator listed it and before a worker read it.
#[derive(Debug)]
struct DeletesOnFirstRead {
    inner: LocalFileSystem,
    victim: PathBuf,
    done: AtomicBool,
}

impl std::fmt::Display for DeletesOnFirstRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeletesOnFirstRead({})", self.victim.display())
    }
}

#[async_trait]
impl ObjectStore for DeletesOnFirstRead {
    async fn put_opts(
        &self,
        location: &StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &StorePath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &StorePath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if !self.done.swap(true, Ordering::SeqCst) {
            let _ = std::fs::remove_file(&self.victim);
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&StorePath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&StorePath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &StorePath,
        to: &StorePath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_deleted_during_the_load_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("parts");
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..6 {
        let mut text = String::from("id,s\n");
        for r in 0..1000 {
            text.push_str(&format!("{},x\n", i * 1000 + r));
        }
        std::fs::write(d.join(format!("part-{i}.csv")), text).unwrap();
    }
    let victim = d.join("part-4.csv");
    let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // Only the workers read through the deleting store; the coordinator lists all six.
    let url = url::Url::parse("file:///").unwrap();
    let store = Arc::new(DeletesOnFirstRead {
        inner: LocalFileSystem::new(),
        victim: victim.clone(),
        done: AtomicBool::new(false),
    });
    for w in cluster.workers() {
        w.register_object_store(&url, Arc::clone(&store) as Arc<dyn ObjectStore>);
    }
    let sql = format!(
        "CREATE EXTERNAL TABLE t (id BIGINT, s VARCHAR) STORED AS CSV LOCATION '{}/' \
         OPTIONS ('format.has_header' 'true')",
        d.display()
    );
    let err = cluster.coordinator.sql(&sql).await.unwrap_err().to_string();
    assert!(err.contains("part-4.csv"), "{err}");
    assert!(!victim.exists());
    assert!(cluster.coordinator.table("t").is_none());
    for w in cluster.workers() {
        assert!(w.storage.table_names().is_empty());
        w.register_object_store(&url, Arc::new(LocalFileSystem::new()));
    }
    // The five files left load.
    cluster.coordinator.sql(&sql).await.unwrap();
    let n = cluster
        .coordinator
        .sql_one("SELECT count(*) FROM t")
        .await
        .unwrap();
    assert_eq!(
        gyre_cluster::reference::canonical_rows(&n.batches).unwrap(),
        vec!["5000".to_string()]
    );
}
