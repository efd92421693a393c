//! A join's residual condition evaluated on candidate pairs, for the joins Gyre runs
//! itself (cyclo-joins, radix joins): the kernels find the pairs of matching keys, the
//! join's full filter decides which of them are results.

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::BooleanBuffer;
use datafusion::common::Result;
use datafusion::common::cast::as_boolean_array;
use datafusion::physical_plan::joins::utils::JoinFilter;
use std::sync::Arc;

/// Where `filter` holds on `rows` pairs whose filter columns (in the order of
/// `filter.column_indices()`) are `columns`; a NULL result counts as false.
pub(crate) fn holds(
    filter: &JoinFilter,
    columns: Vec<ArrayRef>,
    rows: usize,
) -> Result<BooleanBuffer> {
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    let intermediate =
        RecordBatch::try_new_with_options(Arc::clone(filter.schema()), columns, &options)?;
    let mask = filter
        .expression()
        .evaluate(&intermediate)?
        .into_array(rows)?;
    let mask: &BooleanArray = as_boolean_array(&mask)?;
    Ok(match mask.nulls() {
        Some(nulls) if nulls.null_count() > 0 => mask.values() & nulls.inner(),
        _ => mask.values().clone(),
    })
}
