//! `DELETE` and `UPDATE` of distributed tables.
//!
//! DataFusion plans both statements down to a call on the table provider with the
//! statement's filters (and assignments); the distributed table answers with a
//! [`GyreModifyExec`], whose partition `i` runs on worker `i` over that worker's part of
//! the table: it keeps the rows the filters do not select (all filters true selects a
//! row, as in SQL's WHERE: false and NULL do not), drops or rewrites the selected ones,
//! and stages the new part, which replaces the old one when the query commits, like an
//! insert's rows. Each partition returns how many rows it changed.
//!
//! A hash-placed table cannot have its placement column updated: the rows would have
//! to move to other workers.

use crate::table::{count_schema, storage_of};
use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use arrow::compute::kernels::zip::zip;
use arrow::compute::{and_kleene, filter_record_batch, is_not_null, not};
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
    SendableRecordBatchStream,
};
use gyre_exchange::QueryContext;
use std::fmt;
use std::sync::Arc;

/// What a [`GyreModifyExec`] does to the rows its filters select.
#[derive(Debug, Clone)]
pub enum Modification {
    Delete,
    /// New values: (column index in the table, expression over the table's columns).
    Update(Vec<(usize, Arc<dyn PhysicalExpr>)>),
}

/// Deletes or updates the rows of one table on every worker.
#[derive(Debug)]
pub struct GyreModifyExec {
    pub table: String,
    pub table_schema: SchemaRef,
    pub partitions: usize,
    /// Every one must be true for a row to be changed; none changes every row.
    pub filters: Vec<Arc<dyn PhysicalExpr>>,
    pub modification: Modification,
    props: Arc<PlanProperties>,
}

impl GyreModifyExec {
    pub fn new(
        table: String,
        table_schema: SchemaRef,
        partitions: usize,
        filters: Vec<Arc<dyn PhysicalExpr>>,
        modification: Modification,
    ) -> Self {
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            table,
            table_schema,
            partitions,
            filters,
            modification,
            props,
        }
    }
}

/// Which rows of `batch` all `filters` select (true only: false and NULL do not).
fn selected(filters: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> Result<BooleanArray> {
    let mut mask = BooleanArray::from(vec![true; batch.num_rows()]);
    for f in filters {
        let value = f.evaluate(batch)?.into_array(batch.num_rows())?;
        let value = value
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| internal_datafusion_err!("a filter that is not a boolean"))?;
        mask = and_kleene(&mask, value)?;
    }
    // NULL counts as not selected.
    Ok(and_kleene(&mask, &is_not_null(&mask)?)?)
}

/// `batch` after `modification` of its `selected` rows, and how many there were.
fn apply(
    batch: &RecordBatch,
    mask: &BooleanArray,
    modification: &Modification,
    schema: &SchemaRef,
) -> Result<(Option<RecordBatch>, u64)> {
    let changed = mask.true_count() as u64;
    if changed == 0 {
        return Ok((Some(batch.clone()), 0));
    }
    match modification {
        Modification::Delete => {
            let keep = not(mask)?;
            let kept = filter_record_batch(batch, &keep)?;
            Ok(((kept.num_rows() > 0).then_some(kept), changed))
        }
        Modification::Update(assignments) => {
            let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
            for (index, expr) in assignments {
                // Evaluated on the selected rows only (a division by zero in a row that
                // is not updated is no error), then merged with the old values.
                let new = expr
                    .evaluate_selection(batch, mask)?
                    .into_array(batch.num_rows())?;
                let old = &batch.columns()[*index];
                let new = if new.data_type() == old.data_type() {
                    new
                } else {
                    arrow::compute::cast(&new, old.data_type())?
                };
                let (new, old): (&dyn Array, &dyn Array) = (new.as_ref(), old.as_ref());
                columns[*index] = zip(mask, &new, &old)?;
            }
            Ok((
                Some(RecordBatch::try_new(Arc::clone(schema), columns)?),
                changed,
            ))
        }
    }
}

impl DisplayAs for GyreModifyExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let what = match self.modification {
            Modification::Delete => "delete",
            Modification::Update(_) => "update",
        };
        write!(f, "GyreModifyExec: {what} table={}", self.table)
    }
}

impl ExecutionPlan for GyreModifyExec {
    fn name(&self) -> &'static str {
        "GyreModifyExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let assigned = match &self.modification {
            Modification::Delete => vec![],
            Modification::Update(a) => a.iter().map(|(_, e)| e).collect(),
        };
        for e in self.filters.iter().chain(assigned) {
            if f(e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
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
        _partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let storage = storage_of(&context)?;
        let qc = QueryContext::of(&context)?;
        let part = storage.part(&self.table)?;
        let (filters, modification) = (self.filters.clone(), self.modification.clone());
        let table = self.table.clone();
        let fut = async move {
            let mut batches = Vec::with_capacity(part.batches.len());
            let mut changed = 0;
            for batch in &part.batches {
                let mask = selected(&filters, batch)?;
                let (new, n) = apply(batch, &mask, &modification, &part.schema)?;
                changed += n;
                batches.extend(new);
            }
            if changed > 0 {
                storage.stage_replace(qc.query_id, &table, part, batches)?;
            }
            RecordBatch::try_new(
                count_schema(),
                vec![Arc::new(UInt64Array::from(vec![changed]))],
            )
            .map_err(DataFusionError::from)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            futures::stream::once(fut),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int32Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
    use datafusion::scalar::ScalarValue;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Int32, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![Some(1), Some(2), None, Some(4)])),
                Arc::new(Int32Array::from(vec![10, 0, 30, 40])),
            ],
        )
        .unwrap()
    }

    fn col(name: &str, i: usize) -> Arc<dyn PhysicalExpr> {
        Arc::new(Column::new(name, i))
    }

    fn lit(v: i32) -> Arc<dyn PhysicalExpr> {
        Arc::new(Literal::new(ScalarValue::Int32(Some(v))))
    }

    #[test]
    fn null_predicates_select_nothing_and_unselected_rows_are_not_evaluated() {
        let b = batch();
        // a > 1: row 3 (a NULL) is not selected.
        let gt = Arc::new(BinaryExpr::new(col("a", 0), Operator::Gt, lit(1)));
        let mask = selected(&[gt], &b).unwrap();
        assert_eq!(mask, BooleanArray::from(vec![false, true, false, true]));
        let (kept, n) = apply(&b, &mask, &Modification::Delete, &b.schema()).unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            kept.unwrap().column(0).as_ref(),
            &Int32Array::from(vec![Some(1), None]) as &dyn Array
        );
        // b = 100 / b where a = 4: row 2's b of 0 is never divided by.
        let a4 = Arc::new(BinaryExpr::new(col("a", 0), Operator::Eq, lit(4)));
        let mask = selected(&[a4], &b).unwrap();
        let div = Arc::new(BinaryExpr::new(lit(100), Operator::Divide, col("b", 1)));
        let update = Modification::Update(vec![(1, div as Arc<dyn PhysicalExpr>)]);
        let (new, n) = apply(&b, &mask, &update, &b.schema()).unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            new.unwrap().column(1).as_ref(),
            &Int32Array::from(vec![10, 0, 30, 2]) as &dyn Array
        );
    }
}
