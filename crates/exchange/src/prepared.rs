//! A leaf that feeds a join one stream prepared by a network operator (Flow-Join,
//! Neo-Join).

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions, SendableRecordBatchStream,
};
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;

/// Hands its stream, once, to whichever partition is executed: the hash joins a
/// network operator builds at run time execute only their own worker's partition,
/// but DataFusion checks that both inputs have the join's partition count.
pub(crate) struct PreparedInputExec {
    name: &'static str,
    props: Arc<PlanProperties>,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl PreparedInputExec {
    pub(crate) fn new(
        name: &'static str,
        stream: SendableRecordBatchStream,
        partitions: usize,
    ) -> Arc<Self> {
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(stream.schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Arc::new(Self {
            name,
            props,
            stream: Mutex::new(Some(stream)),
        })
    }
}

impl fmt::Debug for PreparedInputExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PreparedInputExec({})", self.name)
    }
}

impl DisplayAs for PreparedInputExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PreparedInputExec: {}", self.name)
    }
}

impl ExecutionPlan for PreparedInputExec {
    fn name(&self) -> &'static str {
        "PreparedInputExec"
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

    fn execute(&self, _: usize, _: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        match self.stream.lock().take() {
            Some(s) => Ok(s),
            None => internal_err!("the {} input of a join was read twice", self.name),
        }
    }
}
