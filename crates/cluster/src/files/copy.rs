//! [`FileCopyExec`]: `COPY ... TO 'dir/'` written by every worker at once.
//!
//! DataFusion plans a COPY as one [`DataSinkExec`] over the merged query result. When
//! the target is a directory and no order is asked for, the coordinator replaces it with
//! this node: partition `i` runs on worker `i` and writes its part of the result with
//! DataFusion's own sink for the format. Without `PARTITIONED BY`, each worker writes
//! one file, `<write id>-<worker index>.<extension>`, the write id being the same for the
//! whole statement; with it, each worker writes Hive-style directories with files of its
//! own random names. No row passes through the coordinator; each worker returns how many
//! rows it wrote.

use arrow::array::{RecordBatch, UInt64Array};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, internal_datafusion_err, not_impl_err};
use datafusion::datasource::file_format::csv::CsvSink;
use datafusion::datasource::file_format::json::JsonSink;
use datafusion::datasource::file_format::parquet::ParquetSink;
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::datasource::physical_plan::{FileOutputMode, FileSinkConfig};
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::{
    Boundedness, EmissionType, check_not_null_constraints,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;
use std::fmt;
use std::sync::Arc;

/// Writes partition `i` of its input to files from worker `i`.
#[derive(Debug)]
pub struct FileCopyExec {
    input: Arc<dyn ExecutionPlan>,
    /// DataFusion's single-writer plan of the COPY (a [`DataSinkExec`] over a placeholder
    /// input): its sink says where and how to write.
    template: Arc<dyn ExecutionPlan>,
    /// Names this statement's files (several COPYs into one directory do not collide).
    write_id: String,
    props: Arc<PlanProperties>,
}

/// The file sink of `sink`'s format and options, if Gyre can write it in parallel.
pub(crate) fn file_sink_config(sink: &dyn DataSink) -> Option<&FileSinkConfig> {
    use datafusion::datasource::physical_plan::FileSink;
    if let Some(s) = sink.downcast_ref::<ParquetSink>() {
        Some(s.config())
    } else if let Some(s) = sink.downcast_ref::<CsvSink>() {
        Some(s.config())
    } else if let Some(s) = sink.downcast_ref::<JsonSink>() {
        Some(s.config())
    } else {
        None
    }
}

impl FileCopyExec {
    /// Whether `sink` can be written by every worker: a Parquet, CSV or JSON sink writing a
    /// directory.
    pub fn parallel(sink: &DataSinkExec) -> bool {
        sink.sort_order().is_none()
            && file_sink_config(sink.sink()).is_some_and(|c| {
                !c.table_paths.is_empty()
                    && (!c.table_partition_cols.is_empty()
                        || !c.file_output_mode.single_file_output(&c.table_paths[0]))
            })
    }

    /// `sink` is DataFusion's plan of the COPY; `input` has one partition per worker.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        sink: &DataSinkExec,
        write_id: String,
    ) -> Result<Self> {
        if !Self::parallel(sink) {
            return not_impl_err!("writing this COPY target from every worker");
        }
        let placeholder: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(input.schema()));
        let template = Arc::new(sink.clone()).replace_children(
            vec![placeholder],
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )?;
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(template.schema()),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            template,
            write_id,
            props,
        })
    }

    /// DataFusion's plan of the COPY, over an empty placeholder input.
    pub fn template(&self) -> &Arc<dyn ExecutionPlan> {
        &self.template
    }

    fn sink(&self) -> &dyn DataSink {
        self.template
            .downcast_ref::<DataSinkExec>()
            .expect("the template is a DataSinkExec (checked when made)")
            .sink()
    }

    pub fn write_id(&self) -> &str {
        &self.write_id
    }

    /// The sink worker `index` writes with: the template's, with its own file name.
    fn sink_of(&self, index: usize) -> Result<Arc<dyn DataSink>> {
        let sink = self.sink();
        let mut config = file_sink_config(sink)
            .ok_or_else(|| internal_datafusion_err!("COPY without a file sink"))?
            .clone();
        if config.table_partition_cols.is_empty() {
            let dir = config.table_paths[0].as_str();
            let sep = if dir.ends_with('/') { "" } else { "/" };
            let file = format!(
                "{dir}{sep}{}-{index:04}.{}",
                self.write_id, config.file_extension
            );
            config.table_paths = vec![ListingTableUrl::parse(&file)?];
            config.file_output_mode = FileOutputMode::SingleFile;
        }
        Ok(if let Some(s) = sink.downcast_ref::<ParquetSink>() {
            Arc::new(ParquetSink::new(config, s.parquet_options().clone()))
        } else if let Some(s) = sink.downcast_ref::<CsvSink>() {
            Arc::new(CsvSink::new(config, s.writer_options().clone()))
        } else if let Some(s) = sink.downcast_ref::<JsonSink>() {
            Arc::new(JsonSink::new(config, s.writer_options().clone()))
        } else {
            return not_impl_err!("writing {sink:?} from every worker");
        })
    }
}

impl DisplayAs for FileCopyExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        // A COPY's target as written; an INSERT's, the table's location.
        let target = file_sink_config(self.sink())
            .map(|c| match (c.original_url.as_str(), c.table_paths.first()) {
                ("", Some(path)) => path.to_string(),
                (url, _) => url.to_string(),
            })
            .unwrap_or_default();
        write!(
            f,
            "FileCopyExec: to={target}, one writer per worker, files {}-<worker>",
            self.write_id
        )
    }
}

impl ExecutionPlan for FileCopyExec {
    fn name(&self) -> &'static str {
        "FileCopyExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| internal_datafusion_err!("COPY has one input"))?;
        let sink = self
            .template
            .downcast_ref::<DataSinkExec>()
            .ok_or_else(|| internal_datafusion_err!("COPY without its sink"))?;
        Ok(Arc::new(Self::try_new(input, sink, self.write_id.clone())?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let sink = self.sink_of(partition)?;
        // NOT NULL columns of the target stay so, as DataFusion's DataSinkExec checks.
        let not_null: Vec<usize> = sink
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.is_nullable())
            .map(|(i, _)| i)
            .collect();
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let input: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            input.schema(),
            input.map(move |batch| check_not_null_constraints(batch?, &not_null)),
        ));
        let schema = self.schema();
        let out = Arc::clone(&schema);
        let fut = async move {
            let rows = sink.write_all(input, &context).await?;
            RecordBatch::try_new(out, vec![Arc::new(UInt64Array::from(vec![rows]))])
                .map_err(DataFusionError::from)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(fut),
        )))
    }
}
