//! [`FileSplitScanExec`]: the workers read a table's files themselves.
//!
//! The node carries DataFusion's scan of the files ([`FileScanConfig`]) with one file
//! group per worker, cut by [`super::splits`]. Partition `i` runs on worker `i` and
//! reads group `i`: each split through DataFusion's reader for the format, as a scan
//! of that one split, several at a time (as many as the worker's runtime has threads;
//! a shared queue hands out the next split to whichever reader is free).
//!
//! A read that fails names the file and the byte range, and ends the stream: the
//! statement fails, and nothing it loaded is committed.

use crate::progress::ReadCounters;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, Statistics};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream, StatisticsArgs,
};
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

/// Reads the splits of worker `i` of a table's files on worker `i`.
#[derive(Debug)]
pub struct FileSplitScanExec {
    /// DataFusion's scan, with file group `i` holding worker `i`'s splits.
    config: FileScanConfig,
    /// Bytes of every file (not only this worker's share), by path.
    file_sizes: Arc<HashMap<String, u64>>,
    props: Arc<PlanProperties>,
}

impl FileSplitScanExec {
    /// `config`'s file groups are the workers' splits, one group per worker.
    pub fn try_new(config: FileScanConfig) -> Result<Self> {
        let schema = config.projected_schema()?;
        let workers = config.file_groups.len().max(1);
        let file_sizes = config
            .file_groups
            .iter()
            .flat_map(|g| g.iter())
            .map(|f| (f.object_meta.location.to_string(), f.object_meta.size))
            .collect();
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(workers),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            config,
            file_sizes: Arc::new(file_sizes),
            props,
        })
    }

    pub fn config(&self) -> &FileScanConfig {
        &self.config
    }

    /// Files the whole scan reads.
    pub fn files(&self) -> u64 {
        self.file_sizes.len() as u64
    }

    /// Bytes of those files.
    pub fn file_bytes(&self) -> u64 {
        self.file_sizes.values().sum()
    }
}

/// Where a file is, as users wrote it: a local path, or the store's URL and the path.
pub fn file_name(store: &ObjectStoreUrl, path: &str) -> String {
    match store.as_str() {
        "file:///" => format!("/{path}"),
        url => format!("{}/{path}", url.trim_end_matches('/')),
    }
}

/// Whether `split`'s file still has the size it was listed with.
async fn unchanged(
    ctx: &TaskContext,
    store_url: &ObjectStoreUrl,
    split: &PartitionedFile,
) -> Result<()> {
    use object_store::ObjectStoreExt;
    let store = ctx.runtime_env().object_store(store_url)?;
    let now = store
        .head(&split.object_meta.location)
        .await
        .map_err(|e| DataFusionError::ObjectStore(Box::new(e)))?;
    if now.size != split.object_meta.size {
        return Err(DataFusionError::Execution(format!(
            "the file changed since it was listed: {} bytes then, {} now",
            split.object_meta.size, now.size
        )));
    }
    Ok(())
}

/// A split and its byte range, for messages.
fn describe(store: &ObjectStoreUrl, split: &PartitionedFile) -> String {
    let path = file_name(store, split.object_meta.location.as_ref());
    match &split.range {
        Some(r) => format!("'{path}' (bytes {}..{})", r.start, r.end),
        None => format!("'{path}'"),
    }
}

fn split_bytes(split: &PartitionedFile) -> u64 {
    match &split.range {
        Some(r) => (r.end - r.start).max(0) as u64,
        None => split.object_meta.size,
    }
}

impl DisplayAs for FileSplitScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let splits: usize = self.config.file_groups.iter().map(FileGroup::len).sum();
        let dirs: BTreeSet<String> = self
            .file_sizes
            .keys()
            .take(3)
            .map(|p| p.to_string())
            .collect();
        write!(
            f,
            "FileSplitScanExec: format={}, files={} ({} bytes), splits={splits} over {} workers, \
             e.g. [{}]",
            self.config.file_source.file_type(),
            self.files(),
            self.file_bytes(),
            self.config.file_groups.len(),
            dirs.into_iter().collect::<Vec<_>>().join(", ")
        )
    }
}

impl ExecutionPlan for FileSplitScanExec {
    fn name(&self) -> &'static str {
        "FileSplitScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let Some(group) = self.config.file_groups.get(partition) else {
            return Err(DataFusionError::Internal(format!(
                "file scan partition {partition} of {}",
                self.config.file_groups.len()
            )));
        };
        let schema = self.schema();
        let readers = tokio::runtime::Handle::current()
            .metrics()
            .num_workers()
            .clamp(1, group.len().max(1));
        let queue = Arc::new(Mutex::new(
            group.iter().cloned().collect::<VecDeque<PartitionedFile>>(),
        ));
        let counters = context.session_config().get_extension::<ReadCounters>();
        let mut builder = RecordBatchReceiverStreamBuilder::new(Arc::clone(&schema), 2 * readers);
        for _ in 0..readers {
            let tx = builder.tx();
            let (queue, config, ctx, sizes, counters) = (
                Arc::clone(&queue),
                self.config.clone(),
                Arc::clone(&context),
                Arc::clone(&self.file_sizes),
                counters.clone(),
            );
            builder.spawn(async move {
                loop {
                    let Some(split) = queue.lock().pop_front() else {
                        return Ok(());
                    };
                    let one = FileScanConfigBuilder::from(config.clone())
                        .with_file_groups(vec![FileGroup::new(vec![split.clone()])])
                        .build();
                    let scan = DataSourceExec::new(Arc::new(one));
                    let fail = |e: DataFusionError| {
                        let what = describe(&config.object_store_url, &split);
                        DataFusionError::Execution(format!("cannot read {what}: {e}"))
                    };
                    // A file that changed since it was listed is not read by its old
                    // byte ranges (DataFusion's local reader never ends a range that
                    // reaches past the end of a file that shrank).
                    if let Err(e) = unchanged(&ctx, &config.object_store_url, &split).await {
                        let _ = tx.send(Err(fail(e))).await;
                        return Ok(());
                    }
                    let mut stream = match scan.execute(0, Arc::clone(&ctx)) {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = tx.send(Err(fail(e))).await;
                            return Ok(());
                        }
                    };
                    while let Some(batch) = stream.next().await {
                        let batch = match batch {
                            Ok(b) => b,
                            Err(e) => {
                                let _ = tx.send(Err(fail(e))).await;
                                return Ok(());
                            }
                        };
                        if let Some(c) = &counters {
                            c.add_rows(batch.num_rows());
                        }
                        if tx.send(Ok(batch)).await.is_err() {
                            return Ok(()); // the consumer went away
                        }
                    }
                    if let Some(c) = &counters {
                        let size = sizes
                            .get(split.object_meta.location.as_ref())
                            .copied()
                            .unwrap_or(split.object_meta.size);
                        c.split_done(split_bytes(&split), size);
                    }
                }
            });
        }
        Ok(builder.build())
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        DataSourceExec::new(Arc::new(self.config.clone())).statistics_from_inputs(&[], args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectMeta;
    use object_store::path::Path;

    #[tokio::test]
    async fn a_file_that_changed_since_it_was_listed_is_not_read() {
        let dir = std::env::temp_dir().join(format!("gyre-unchanged-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f.csv");
        std::fs::write(&file, "a\n1\n2\n").unwrap();
        let split = |size: u64| {
            PartitionedFile::from(ObjectMeta {
                location: Path::from_absolute_path(&file).unwrap(),
                last_modified: "2026-01-01T00:00:00Z".parse().unwrap(),
                size,
                e_tag: None,
                version: None,
            })
        };
        let ctx = TaskContext::default();
        let local = ObjectStoreUrl::local_filesystem();
        assert!(unchanged(&ctx, &local, &split(6)).await.is_ok());
        let err = unchanged(&ctx, &local, &split(600)).await.unwrap_err();
        assert!(err.to_string().contains("600 bytes then, 6 now"), "{err}");
        std::fs::remove_file(&file).unwrap();
        assert!(unchanged(&ctx, &local, &split(6)).await.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
