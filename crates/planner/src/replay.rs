//! Reading an input once and replaying it to every later execution.
//!
//! A recursive query ([`RecursiveQueryExec`]) executes its recursive term again for
//! every iteration. The parts of that term that do not read the work table come from
//! other stages through exchanges, whose streams can be read only once: [`ReplayExec`]
//! reads its input partition on its first execution, keeps the batches, and gives
//! every execution (the first included) the same batches. It shows as a leaf: the
//! recursive query resets the state of every node below it before each iteration,
//! which must not reach the input read once, nor the batches kept.
//!
//! [`RecursiveQueryExec`]: datafusion::physical_plan::recursive_query::RecursiveQueryExec

use arrow::array::RecordBatch;
use datafusion::common::Result;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::common::collect;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use futures::StreamExt;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// Its input's partitions, each read once and replayed.
#[derive(Debug)]
pub struct ReplayExec {
    input: Arc<dyn ExecutionPlan>,
    /// One cell per partition, filled by the first execution of that partition.
    kept: Arc<Vec<OnceCell<Vec<RecordBatch>>>>,
    props: Arc<PlanProperties>,
}

impl ReplayExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let partitions = input.output_partitioning().partition_count();
        let props = Arc::clone(input.properties());
        Self {
            input,
            kept: Arc::new((0..partitions).map(|_| OnceCell::new()).collect()),
            props,
        }
    }
}

impl DisplayAs for ReplayExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "ReplayExec")
    }
}

impl ExecutionPlan for ReplayExec {
    fn name(&self) -> &'static str {
        "ReplayExec"
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
        let (kept, input) = (Arc::clone(&self.kept), Arc::clone(&self.input));
        let Some(_) = kept.get(partition) else {
            return datafusion::common::internal_err!("ReplayExec has no partition {partition}");
        };
        let batches = async move {
            let batches = kept[partition]
                .get_or_try_init(|| async { collect(input.execute(partition, context)?).await })
                .await?;
            Ok::<_, datafusion::common::DataFusionError>(batches.clone())
        };
        let stream = futures::stream::once(batches)
            .map(|r| match r {
                Ok(b) => futures::stream::iter(b.into_iter().map(Ok)).boxed(),
                Err(e) => futures::stream::iter(vec![Err(e)]).boxed(),
            })
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            stream,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
    use datafusion::prelude::SessionContext;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A stream that can be read once, as an exchange's.
    #[derive(Debug)]
    struct Once {
        batch: RecordBatch,
        read: AtomicBool,
    }

    impl PartitionStream for Once {
        fn schema(&self) -> &SchemaRef {
            self.batch.schema_ref()
        }

        fn execute(&self, _: Arc<TaskContext>) -> SendableRecordBatchStream {
            let item = if self.read.swap(true, Ordering::SeqCst) {
                Err(datafusion::common::DataFusionError::Execution(
                    "read twice".into(),
                ))
            } else {
                Ok(self.batch.clone())
            };
            Box::pin(RecordBatchStreamAdapter::new(
                self.batch.schema(),
                futures::stream::iter(vec![item]),
            ))
        }
    }

    #[tokio::test]
    async fn an_input_read_once_is_replayed_to_every_execution() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int32Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let once = Arc::new(Once {
            batch: batch.clone(),
            read: AtomicBool::new(false),
        });
        let source =
            StreamingTableExec::try_new(schema, vec![once], None, [], false, None).unwrap();
        let ctx = SessionContext::new();
        let plain = Arc::new(source);
        assert!(
            collect(plain.execute(0, ctx.task_ctx()).unwrap())
                .await
                .is_ok()
        );
        assert!(
            collect(plain.execute(0, ctx.task_ctx()).unwrap())
                .await
                .is_err()
        );

        let once = Arc::new(Once {
            batch: batch.clone(),
            read: AtomicBool::new(false),
        });
        let schema = batch.schema();
        let source =
            StreamingTableExec::try_new(schema, vec![once], None, [], false, None).unwrap();
        let replay = ReplayExec::new(Arc::new(source));
        let replay: Arc<dyn ExecutionPlan> = Arc::new(replay);
        for _ in 0..3 {
            // As a recursive query does before each iteration.
            let replay =
                datafusion::physical_plan::execution_plan::reset_plan_states(Arc::clone(&replay))
                    .unwrap();
            let got = collect(replay.execute(0, ctx.task_ctx()).unwrap())
                .await
                .unwrap();
            assert_eq!(got, vec![batch.clone()]);
        }
        assert!(replay.execute(1, ctx.task_ctx()).is_err());
    }
}
