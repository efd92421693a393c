//! Loading files into the cluster, every format and layout, on 1 to 4 workers, in chunked
//! and hash placement, against single-node DataFusion reading the same files; and
//! `COPY ... TO` written by every worker and read back.
//!
//! The files are written once per test run into a temporary directory: Parquet with many
//! row groups (1M and 10M rows) and with one (the size that used to fail), a directory
//! of 20 Parquet files, a Hive-style partitioned directory, CSV with and without a
//! header, gzip-compressed CSV, newline-delimited JSON and Arrow IPC files.

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::SessionContext;
use gyre_cluster::LocalCluster;
use gyre_cluster::reference::canonical_rows;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Float64, false),
        Field::new("s", DataType::Utf8, false),
    ]))
}

/// Rows `from..to`: a unique id, a key spread over 100,003 values, an exactly
/// representable double and a short string.
fn rows(from: i64, to: i64) -> RecordBatch {
    let ids: Vec<i64> = (from..to).collect();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(Int64Array::from_iter_values(
            ids.iter().map(|i| (i * 7919) % 100_003),
        )),
        Arc::new(Float64Array::from_iter_values(
            ids.iter().map(|i| (i % 1000) as f64 * 0.25),
        )),
        Arc::new(StringArray::from_iter_values(
            ids.iter().map(|i| format!("s{}", i % 997)),
        )),
    ];
    RecordBatch::try_new(schema(), cols).unwrap()
}

/// Calls `write` for each batch of at most 100K rows of `from..to`.
fn batches(from: i64, to: i64, mut write: impl FnMut(&RecordBatch)) {
    let mut at = from;
    while at < to {
        let end = (at + 100_000).min(to);
        write(&rows(at, end));
        at = end;
    }
}

fn write_parquet(path: &Path, from: i64, to: i64, row_group: usize) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group))
        .build();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema(), Some(props)).unwrap();
    batches(from, to, |b| w.write(b).unwrap());
    w.close().unwrap();
}

fn write_csv(path: &Path, from: i64, to: i64, header: bool, gzip: bool) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let out: Box<dyn std::io::Write> = if gzip {
        Box::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::fast(),
        ))
    } else {
        Box::new(file)
    };
    // The writer puts the header before the first batch only.
    let mut w = arrow::csv::WriterBuilder::new()
        .with_header(header)
        .build(out);
    batches(from, to, |b| w.write(b).unwrap());
}

fn write_json(path: &Path, from: i64, to: i64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut w = arrow::json::LineDelimitedWriter::new(std::fs::File::create(path).unwrap());
    batches(from, to, |b| w.write(b).unwrap());
    w.finish().unwrap();
}

fn write_arrow(path: &Path, from: i64, to: i64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut w =
        arrow::ipc::writer::FileWriter::try_new(std::fs::File::create(path).unwrap(), &schema())
            .unwrap();
    batches(from, to, |b| w.write(b).unwrap());
    w.finish().unwrap();
}

/// One way of storing the test rows.
struct Dataset {
    name: &'static str,
    /// `CREATE EXTERNAL TABLE {t} {this} LOCATION '{location}'`.
    stored: &'static str,
    location: PathBuf,
    options: &'static str,
    /// Rows, for the expensive checks.
    rows: i64,
    /// Has Hive partition columns `year` and `month`.
    hive: bool,
}

struct Data {
    sets: Vec<Dataset>,
}

/// Writes every dataset once per test binary, into one fixed directory under
/// the target directory: a static is never dropped, so a temporary directory
/// here would leak its 230 MB on every run.
fn data() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("loading-data");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.as_path();
        let mut sets = vec![];
        let mut add = |name, stored, location: PathBuf, options, rows, hive| {
            sets.push(Dataset {
                name,
                stored,
                location,
                options,
                rows,
                hive,
            })
        };
        write_parquet(&d.join("one_group.parquet"), 0, 200_000, 1 << 20);
        add("one row group", "STORED AS PARQUET", d.join("one_group.parquet"), "", 200_000, false);
        write_parquet(&d.join("p1m.parquet"), 0, 1_000_000, 50_000);
        add("1M rows, 20 row groups", "STORED AS PARQUET", d.join("p1m.parquet"), "", 1_000_000, false);
        write_parquet(&d.join("p10m.parquet"), 0, 10_000_000, 400_000);
        add("10M rows, 25 row groups", "STORED AS PARQUET", d.join("p10m.parquet"), "", 10_000_000, false);
        for i in 0..20 {
            write_parquet(&d.join(format!("dir20/part-{i:02}.parquet")), i * 25_000, (i + 1) * 25_000, 10_000);
        }
        add("20 Parquet files", "STORED AS PARQUET", d.join("dir20/"), "", 500_000, false);
        let mut at = 0;
        for year in [2024, 2025] {
            for month in 1..=6 {
                let n = 10_000 + 1_000 * month;
                write_parquet(
                    &d.join(format!("hive/year={year}/month={month}/data.parquet")),
                    at,
                    at + n,
                    5_000,
                );
                at += n;
            }
        }
        add("Hive-partitioned Parquet", "STORED AS PARQUET", d.join("hive/"), "", at, true);
        for i in 0..3 {
            write_csv(&d.join(format!("csv/part-{i}.csv")), i * 150_000, (i + 1) * 150_000, true, false);
        }
        add("CSV with a header", "STORED AS CSV", d.join("csv/"), "OPTIONS ('format.has_header' 'true')", 450_000, false);
        for i in 0..2 {
            write_csv(&d.join(format!("csv_bare/part-{i}.csv")), i * 200_000, (i + 1) * 200_000, false, false);
        }
        add(
            "CSV without a header",
            "(id BIGINT NOT NULL, k BIGINT NOT NULL, v DOUBLE NOT NULL, s VARCHAR NOT NULL) STORED AS CSV",
            d.join("csv_bare/"),
            "OPTIONS ('format.has_header' 'false')",
            400_000,
            false,
        );
        for i in 0..3 {
            write_csv(&d.join(format!("csv_gz/part-{i}.csv.gz")), i * 100_000, (i + 1) * 100_000, true, true);
        }
        add(
            "gzip-compressed CSV",
            "STORED AS CSV",
            d.join("csv_gz/"),
            "OPTIONS ('format.has_header' 'true', 'format.compression' 'gzip')",
            300_000,
            false,
        );
        for i in 0..2 {
            write_json(&d.join(format!("json/part-{i}.json")), i * 100_000, (i + 1) * 100_000);
        }
        add("newline-delimited JSON", "STORED AS JSON", d.join("json/"), "", 200_000, false);
        for i in 0..3 {
            write_arrow(&d.join(format!("arrow/part-{i}.arrow")), i * 100_000, (i + 1) * 100_000);
        }
        add("Arrow IPC files", "STORED AS ARROW", d.join("arrow/"), "", 300_000, false);
        Data { sets }
    })
}

fn create_sql(table: &str, set: &Dataset, gyre_options: &[(&str, &str)]) -> String {
    let mut options: Vec<String> = vec![];
    if let Some(inner) = set
        .options
        .strip_prefix("OPTIONS (")
        .and_then(|o| o.strip_suffix(')'))
    {
        options.push(inner.to_string());
    }
    options.extend(gyre_options.iter().map(|(k, v)| format!("'{k}' '{v}'")));
    let options = if options.is_empty() {
        String::new()
    } else {
        format!(" OPTIONS ({})", options.join(", "))
    };
    let mut location = set.location.display().to_string();
    if set.location.extension().is_none() && !location.ends_with('/') {
        location.push('/');
    }
    format!(
        "CREATE EXTERNAL TABLE {table} {} LOCATION '{location}'{options}",
        set.stored
    )
}

/// Row count and checksums of table `t` (whole-table aggregates; distinct ids only
/// where that is cheap), and the number of distinct keys (through a GROUP BY that a
/// table hash-placed on `k` answers without a shuffle).
fn checks(t: &str, set: &Dataset) -> Vec<String> {
    let distinct = if set.rows <= 1_000_000 {
        "count(DISTINCT id)"
    } else {
        "count(id)"
    };
    let hive = if set.hive {
        ", sum(CAST(year AS BIGINT) * 100 + CAST(month AS BIGINT)), count(DISTINCT year)"
    } else {
        ""
    };
    vec![
        format!(
            "SELECT count(*), {distinct}, sum(id), min(id), max(id), sum(k), sum(v), \
             sum(length(s)), min(s), max(s){hive} FROM {t}"
        ),
        format!("SELECT count(*), sum(n) FROM (SELECT k, count(*) AS n FROM {t} GROUP BY k)"),
    ]
}

async fn reference(set: &Dataset) -> Vec<Vec<String>> {
    let ctx = SessionContext::new();
    ctx.sql(&create_sql("t", set, &[])).await.unwrap();
    let mut out = vec![];
    for q in checks("t", set) {
        let batches = ctx.sql(&q).await.unwrap().collect().await.unwrap();
        out.push(canonical_rows(&batches).unwrap());
    }
    out
}

async fn check_loads(workers: usize) {
    let cluster = LocalCluster::start(workers, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = &cluster.coordinator;
    let mut failures = vec![];
    for set in &data().sets {
        let want = reference(set).await;
        for (placement, options) in [
            ("chunked", vec![]),
            ("hash(k)", vec![("gyre.partition_by", "k")]),
        ] {
            let what = format!("{} ({placement}, {workers} workers)", set.name);
            let received = c.traffic().bytes_received;
            if let Err(e) = c.sql(&create_sql("t", set, &options)).await {
                failures.push(format!("{what}: {e}"));
                continue;
            }
            // Workers read the files: the coordinator only hears each worker's row count.
            let through_coordinator = c.traffic().bytes_received - received;
            if through_coordinator > 64 * 1024 {
                failures.push(format!(
                    "{what}: {through_coordinator} bytes reached the coordinator"
                ));
            }
            let meta = c.table("t").unwrap();
            if set.hive && meta.schema.index_of("month").is_err() {
                failures.push(format!("{what}: no partition columns in {:?}", meta.schema));
            }
            if meta.rows != set.rows as u64 {
                failures.push(format!("{what}: {} rows in the catalog", meta.rows));
            }
            for (q, want) in checks("t", set).iter().zip(&want) {
                match c.sql_one(q).await {
                    Ok(got) => {
                        let got = canonical_rows(&got.batches).unwrap();
                        if &got != want {
                            failures.push(format!("{what}: {q}\n  got  {got:?}\n  want {want:?}"));
                        }
                    }
                    Err(e) => failures.push(format!("{what}: {q}: {e}")),
                }
            }
            c.sql("DROP TABLE t").await.unwrap();
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_loads_on_one_worker() {
    check_loads(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_loads_on_two_workers() {
    check_loads(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_loads_on_three_workers() {
    check_loads(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_loads_on_four_workers() {
    check_loads(4).await;
}

/// `COPY ... TO 'dir/'` in each format, with and without `PARTITIONED BY`: every worker
/// writes its own files, and reading the directory back gives the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_to_writes_from_every_worker_and_reads_back() {
    let out = tempfile::tempdir().unwrap();
    for workers in [1, 3] {
        let cluster = LocalCluster::start(workers, 1, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let c = &cluster.coordinator;
        let set = &data().sets[1]; // 1M rows
        c.sql(&create_sql("src", set, &[("gyre.partition_by", "k")]))
            .await
            .unwrap();
        let want = c
            .sql_one("SELECT count(*), sum(id), sum(k), sum(v), sum(length(s)) FROM src")
            .await
            .unwrap();
        let plan = c
            .sql_one("EXPLAIN COPY (SELECT * FROM src) TO '/tmp/never/' STORED AS PARQUET")
            .await
            .unwrap();
        let plan = arrow::util::pretty::pretty_format_batches(&plan.batches)
            .unwrap()
            .to_string();
        assert!(
            plan.contains("FileCopyExec") && plan.contains("on workers"),
            "{plan}"
        );
        for (format, ext, options) in [
            ("PARQUET", "parquet", ""),
            ("CSV", "csv", " OPTIONS ('format.has_header' 'true')"),
            ("JSON", "json", ""),
        ] {
            for partitioned in [false, true] {
                let dir = out
                    .path()
                    .join(format!("{workers}-{ext}-{partitioned}"))
                    .display()
                    .to_string()
                    + "/";
                let (select, by) = if partitioned {
                    (
                        "SELECT id, k, v, s, id % 4 AS bucket FROM src",
                        " PARTITIONED BY (bucket)",
                    )
                } else {
                    ("SELECT * FROM src", "")
                };
                let copied = c
                    .sql_one(&format!(
                        "COPY ({select}) TO '{dir}' STORED AS {format}{by}{options}"
                    ))
                    .await
                    .unwrap_or_else(|e| panic!("{format} {partitioned}: {e}"));
                let count = canonical_rows(&copied.batches).unwrap();
                assert_eq!(count, vec!["1000000".to_string()], "{format} {partitioned}");
                if !partitioned {
                    let files: Vec<String> = std::fs::read_dir(&dir)
                        .unwrap()
                        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .collect();
                    assert_eq!(files.len(), workers, "{files:?}");
                    for w in 0..workers {
                        assert!(
                            files.iter().any(|f| f.ends_with(&format!("-{w:04}.{ext}"))),
                            "no file of worker {w} in {files:?}"
                        );
                    }
                } else {
                    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 4);
                }
                c.sql(&format!(
                    "CREATE EXTERNAL TABLE back STORED AS {format} LOCATION '{dir}'{options}"
                ))
                .await
                .unwrap();
                let got = c
                    .sql_one("SELECT count(*), sum(id), sum(k), sum(v), sum(length(s)) FROM back")
                    .await
                    .unwrap();
                assert_eq!(
                    canonical_rows(&got.batches).unwrap(),
                    canonical_rows(&want.batches).unwrap(),
                    "{format} partitioned={partitioned} on {workers} workers"
                );
                if partitioned {
                    let buckets = c
                        .sql_one(
                            "SELECT count(DISTINCT bucket), sum(CAST(bucket AS BIGINT)) FROM back",
                        )
                        .await
                        .unwrap();
                    assert_eq!(
                        canonical_rows(&buckets.batches).unwrap(),
                        vec!["4|1500000".to_string()]
                    );
                }
                c.sql("DROP TABLE back").await.unwrap();
            }
        }
    }
}

/// One system's view of a directory of files: Gyre's and DataFusion's each get their
/// own directory, changed alike, because an INSERT into an external table adds a file.
struct FollowSide {
    dir: PathBuf,
}

impl FollowSide {
    fn sql(&self, template: &str) -> String {
        template.replace("{dir}", self.dir.to_str().unwrap())
    }
}

/// A change made to the files of both sides alike.
type FileChange = Box<dyn Fn(&FollowSide)>;

/// Runs `sql` on Gyre and DataFusion; their results, or their errors, as text.
async fn on_both(
    c: &Arc<gyre_cluster::coordinator::Coordinator>,
    ctx: &SessionContext,
    gyre: &FollowSide,
    df: &FollowSide,
    sql: &str,
) -> (Result<Vec<String>, String>, Result<Vec<String>, String>) {
    let got = match c.sql_one(&gyre.sql(sql)).await {
        Ok(r) => Ok(canonical_rows(&r.batches).unwrap()),
        Err(e) => Err(e.to_string()),
    };
    let want = match ctx.sql(&df.sql(sql)).await {
        Ok(d) => match d.collect().await {
            Ok(b) => Ok(canonical_rows(&b).unwrap()),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    (got, want)
}

/// A table created from files follows them as DataFusion's does: files added later
/// are loaded by the next query, a file rewritten or removed reloads the table, an
/// INSERT writes a file, and a location that does not exist yet is an empty table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_tables_follow_their_files() {
    for workers in [1, 4] {
        let tmp = tempfile::tempdir().unwrap();
        let gyre = FollowSide {
            dir: tmp.path().join("gyre"),
        };
        let df = FollowSide {
            dir: tmp.path().join("df"),
        };
        let cluster = LocalCluster::start(workers, 1, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let c = &cluster.coordinator;
        // DataFusion, like Gyre, without its cache of listings, which hides files
        // written after a table's first scan.
        let ctx = SessionContext::new();
        ctx.sql("SET datafusion.runtime.list_files_cache_limit = '0'")
            .await
            .unwrap();
        let sides = [&gyre, &df];
        for side in sides {
            write_csv(&side.dir.join("t/a.csv"), 0, 150_000, true, false);
        }
        let create = [
            (
                "t",
                "CREATE EXTERNAL TABLE t (id BIGINT, k BIGINT, v DOUBLE, s VARCHAR) STORED AS CSV LOCATION '{dir}/t/' OPTIONS ('format.has_header' 'true'{opt})",
            ),
            (
                "later",
                "CREATE EXTERNAL TABLE later (id BIGINT, k BIGINT, v DOUBLE, s VARCHAR) STORED AS PARQUET LOCATION '{dir}/later/'",
            ),
            (
                "one",
                "CREATE EXTERNAL TABLE one (id BIGINT) STORED AS CSV LOCATION '{dir}/no/such/file.csv'",
            ),
        ];
        for (table, sql) in create {
            let gyre_sql = sql.replace("{opt}", ", 'gyre.partition_by' 'k'");
            c.sql(&gyre.sql(&gyre_sql))
                .await
                .unwrap_or_else(|e| panic!("{table}: {e}"));
            ctx.sql(&df.sql(&sql.replace("{opt}", ""))).await.unwrap();
        }
        let checks = [
            "SELECT count(*), sum(k), min(id), max(id) FROM t",
            "SELECT k % 7 AS r, count(*), sum(v) FROM t GROUP BY k % 7",
            "SELECT count(*), sum(id) FROM later",
        ];
        let mut failures = vec![];
        let steps: Vec<(&str, FileChange)> = vec![
            ("as created", Box::new(|_| {})),
            (
                "a file added",
                Box::new(|s| write_csv(&s.dir.join("t/b.csv"), 150_000, 170_000, true, false)),
            ),
            (
                "a file rewritten",
                Box::new(|s| write_csv(&s.dir.join("t/a.csv"), 0, 90_000, true, false)),
            ),
            (
                "a file removed",
                Box::new(|s| std::fs::remove_file(s.dir.join("t/b.csv")).unwrap()),
            ),
            (
                "files in a location that did not exist",
                Box::new(|s| write_parquet(&s.dir.join("later/x.parquet"), 5, 500, 100)),
            ),
        ];
        for (step, change) in &steps {
            for side in sides {
                change(side);
            }
            for q in checks {
                let (got, want) = on_both(c, &ctx, &gyre, &df, q).await;
                if got != want {
                    failures.push(format!(
                        "{workers} workers, {step}: {q}\n  got  {got:?}\n  want {want:?}"
                    ));
                }
            }
        }
        // An INSERT writes a file, on both; the next query reads it.
        for sql in [
            "INSERT INTO t VALUES (1000000, 1, 0.5, 'new'), (1000001, 2, 1.5, 'new')",
            "SELECT count(*), sum(k), max(id) FROM t",
            "SELECT s, count(*) FROM t WHERE s = 'new' GROUP BY s",
        ] {
            let (got, want) = on_both(c, &ctx, &gyre, &df, sql).await;
            if got != want {
                failures.push(format!(
                    "{workers} workers: {sql}\n  got  {got:?}\n  want {want:?}"
                ));
            }
        }
        // Gyre's workers each write a file of their share.
        let files = |s: &FollowSide| std::fs::read_dir(s.dir.join("t")).unwrap().count();
        if files(&gyre) < 2 {
            failures.push(format!(
                "{workers} workers: {} files after the INSERT",
                files(&gyre)
            ));
        }
        // A file that does not exist reads as no rows, on both; written, it is read.
        for side in sides {
            std::fs::create_dir_all(side.dir.join("no/such")).unwrap();
        }
        for step in ["missing", "written"] {
            let (got, want) = on_both(c, &ctx, &gyre, &df, "SELECT count(*) FROM one").await;
            if got != want {
                failures.push(format!(
                    "{workers} workers, a file {step}: {got:?} / {want:?}"
                ));
            }
            for side in sides {
                std::fs::write(side.dir.join("no/such/file.csv"), "id\n1\n2\n").unwrap();
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
