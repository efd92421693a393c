//! Files as tables: loading them with every worker reading its own share, and
//! `COPY TO` written by every worker.
//!
//! `CREATE EXTERNAL TABLE` lists the files on the coordinator with DataFusion's listing
//! table (schema inference, Hive-style partition columns, compression, format options),
//! then [`WorkerFiles`] turns its scan into a [`FileSplitScanExec`]: the files cut into
//! splits balanced by bytes ([`splits`]), group `i` read by worker `i`. The load is an
//! insert of that scan, so a chunked table keeps rows where they were read and a
//! hash-placed one sends them through the shuffle; no table data passes through the
//! coordinator. The location must be readable by every worker: a shared file system
//! or an object store ([`stores`]).

pub mod copy;
pub mod follow;
pub mod roots;
pub mod scan;
pub mod splits;
pub mod stores;

pub use copy::FileCopyExec;
pub use roots::LocalFiles;
pub use scan::FileSplitScanExec;

use crate::table::QueryWorkers;
use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Result;
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::arrow::ArrowFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::FileGroup;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use futures::TryStreamExt;
use object_store::ObjectMeta;
use object_store::path::Path;
use parking_lot::Mutex;
use splits::{Cut, plan_splits};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Splits per worker: the granularity of balancing within a worker (its readers take
/// the next split when free). Each split opens its file once.
const SPLITS_PER_WORKER: usize = 8;

/// CSV options DataFusion's plan format carries to the workers (with the compression,
/// which Gyre's codec adds); the others (a line terminator, null patterns, ...) it drops.
const CSV_OPTIONS_CARRIED: [&str; 9] = [
    "format.has_header",
    "format.delimiter",
    "format.quote",
    "format.escape",
    "format.comment",
    "format.newlines_in_values",
    "format.truncated_rows",
    "format.compression",
    "format.schema_infer_max_rec",
];

/// Why the coordinator, not the workers, must read files of this type with these
/// options, if it must: the settings would not reach the workers intact.
pub fn coordinator_must_read(
    file_type: &str,
    options: &std::collections::HashMap<String, String>,
) -> Option<String> {
    match file_type.to_ascii_uppercase().as_str() {
        "CSV" => options
            .keys()
            .find(|k| k.starts_with("format.") && !CSV_OPTIONS_CARRIED.contains(&k.as_str()))
            .map(|k| format!("the CSV option '{k}' does not travel in a plan")),
        "JSON"
            if options
                .get("format.newline_delimited")
                .is_some_and(|v| v.eq_ignore_ascii_case("false")) =>
        {
            Some("JSON arrays are read whole and their setting does not travel".into())
        }
        _ => None,
    }
}

/// A table's files as a source that the workers read (see the module doc), or the
/// coordinator when they cannot. Records which files each scan planned, so that the
/// table can follow its files ([`follow`]).
#[derive(Debug)]
pub struct WorkerFiles {
    /// DataFusion's listing table of the files.
    listing: Arc<dyn TableProvider>,
    on_workers: bool,
    /// Only these files, if given (the files added since the table was loaded).
    only: Option<HashSet<Path>>,
    planned: Mutex<Vec<ObjectMeta>>,
}

impl WorkerFiles {
    pub fn new(listing: Arc<dyn TableProvider>, on_workers: bool) -> Self {
        Self {
            listing,
            on_workers,
            only: None,
            planned: Mutex::new(vec![]),
        }
    }

    /// Reads only the files `only` of the listing.
    pub fn only(mut self, only: HashSet<Path>) -> Self {
        self.only = Some(only);
        self
    }

    /// The files the last scan planned to read.
    pub fn planned(&self) -> Vec<ObjectMeta> {
        self.planned.lock().clone()
    }

    fn cut(&self, config: &FileScanConfig) -> Cut {
        let kind = config.file_source.file_type();
        if kind == "parquet" {
            return Cut::RowGroups;
        }
        if config.file_compression_type.is_compressed()
            || !config.file_source.supports_repartitioning()
        {
            return Cut::WholeFiles;
        }
        match kind {
            "csv" | "arrow" => Cut::Bytes,
            "json" => Cut::Bytes,
            _ => Cut::WholeFiles,
        }
    }
}

#[async_trait]
impl TableProvider for WorkerFiles {
    fn schema(&self) -> SchemaRef {
        self.listing.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let workers = QueryWorkers::of(state)?.0.len();
        let plan = self.listing.scan(state, projection, &[], None).await?;
        // No files at all: DataFusion's empty plan (read on the coordinator, nothing to read).
        let Some(config) = plan
            .downcast_ref::<DataSourceExec>()
            .and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
        else {
            self.planned.lock().clear();
            return Ok(plan);
        };
        let mut config = config.clone();
        if let Some(only) = &self.only {
            for group in &mut config.file_groups {
                let kept: Vec<PartitionedFile> = group
                    .iter()
                    .filter(|f| only.contains(&f.object_meta.location))
                    .cloned()
                    .collect();
                *group = FileGroup::new(kept);
            }
            config.file_groups.retain(|g| !g.is_empty());
        }
        *self.planned.lock() = config
            .file_groups
            .iter()
            .flat_map(|g| g.iter().map(|f| f.object_meta.clone()))
            .collect();
        // DataFusion's plan format rebuilds every Arrow scan as one of IPC files: the
        // coordinator reads Arrow streams.
        if !self.on_workers || config.file_source.file_type() == "arrow_stream" {
            if config.file_groups.is_empty() {
                return Ok(Arc::new(EmptyExec::new(plan.schema())));
            }
            return Ok(DataSourceExec::from_data_source(config));
        }
        let store = state.runtime_env().object_store(&config.object_store_url)?;
        let files = config
            .file_groups
            .iter()
            .flat_map(|g| g.iter().cloned())
            .collect();
        let cut = self.cut(&config);
        let plan = plan_splits(files, cut, &store, workers, SPLITS_PER_WORKER).await?;
        config.file_groups = plan.groups;
        Ok(Arc::new(FileSplitScanExec::try_new(config)?))
    }
}

/// When DataFusion cannot merge the schemas of the Parquet or Arrow files at
/// `location`, finds a column that two of them type differently and names both files.
pub async fn schema_conflict(
    state: &dyn Session,
    location: &str,
    file_type: &str,
) -> Option<String> {
    let format: Arc<dyn FileFormat> = match file_type.to_ascii_uppercase().as_str() {
        "PARQUET" => Arc::new(ParquetFormat::default()),
        "ARROW" => Arc::new(ArrowFormat),
        _ => return None,
    };
    let url = ListingTableUrl::parse(location).ok()?;
    let store = state.runtime_env().object_store(&url).ok()?;
    let mut files: Vec<ObjectMeta> = url
        .list_all_files(state, store.as_ref(), &format.get_ext())
        .await
        .ok()?
        .try_collect()
        .await
        .ok()?;
    files.sort_by(|a, b| a.location.cmp(&b.location));
    let mut seen: HashMap<String, (DataType, String)> = HashMap::new();
    for f in files {
        let schema = format
            .infer_schema(state, &store, std::slice::from_ref(&f))
            .await
            .ok()?;
        for field in schema.fields() {
            let path = scan::file_name(&url.object_store(), f.location.as_ref());
            match seen.get(field.name()) {
                Some((t, first)) if t != field.data_type() => {
                    return Some(format!(
                        "column '{}' is {t} in '{first}' but {} in '{path}'",
                        field.name(),
                        field.data_type()
                    ));
                }
                Some(_) => {}
                None => {
                    seen.insert(field.name().clone(), (field.data_type().clone(), path));
                }
            }
        }
    }
    None
}
