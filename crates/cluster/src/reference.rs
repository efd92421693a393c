//! Single-node DataFusion over the same data, the yardstick for correctness and speed.

use crate::coordinator::Coordinator;
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::Result;
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use std::sync::Arc;

/// Copies every table of the cluster into an ordinary DataFusion context with
/// `partitions` target partitions (in-memory tables, split evenly).
pub async fn reference_context(
    coordinator: &Arc<Coordinator>,
    partitions: usize,
) -> Result<SessionContext> {
    let ctx = SessionContext::new_with_config(
        SessionConfig::new().with_target_partitions(partitions.max(1)),
    );
    copy_tables(coordinator, &ctx, partitions).await?;
    Ok(ctx)
}

/// Registers every table of the cluster in `ctx` as an in-memory table of
/// `partitions` partitions.
pub async fn copy_tables(
    coordinator: &Arc<Coordinator>,
    ctx: &SessionContext,
    partitions: usize,
) -> Result<()> {
    for name in coordinator.table_names() {
        let result = coordinator
            .sql_one(&format!("SELECT * FROM \"{name}\""))
            .await?;
        let mut parts: Vec<Vec<RecordBatch>> = vec![vec![]; partitions.max(1)];
        let n = parts.len();
        for (i, b) in result.batches.into_iter().enumerate() {
            parts[i % n].push(b);
        }
        let schema = coordinator
            .table(&name)
            .map(|m| m.schema)
            .unwrap_or(result.schema);
        ctx.register_table(name.as_str(), Arc::new(MemTable::try_new(schema, parts)?))?;
    }
    Ok(())
}

/// Renders rows as text lines, sorted, so results can be compared as multisets.
pub fn canonical_rows(batches: &[RecordBatch]) -> Result<Vec<String>> {
    canonical_rows_with(batches, None)
}

/// [`canonical_rows`] with floating-point values rounded to `digits` significant
/// digits: a sum or average of floats depends on the order rows were added in, which
/// differs between a cluster and one node.
pub fn canonical_rows_rounded(batches: &[RecordBatch], digits: usize) -> Result<Vec<String>> {
    canonical_rows_with(batches, Some(digits))
}

fn canonical_rows_with(batches: &[RecordBatch], digits: Option<usize>) -> Result<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for b in batches {
        let mut columns = Vec::with_capacity(b.num_columns());
        for c in b.columns() {
            let float = c.data_type().is_floating();
            columns.push(match digits {
                Some(d) if float => Column::Rounded(cast(c, &DataType::Float64)?, d),
                _ => Column::Formatted(ArrayFormatter::try_new(c.as_ref(), &options)?),
            });
        }
        for r in 0..b.num_rows() {
            let cells: Vec<String> = columns.iter().map(|c| c.cell(r)).collect();
            rows.push(cells.join("|"));
        }
    }
    rows.sort();
    Ok(rows)
}

/// One column of a batch as [`canonical_rows_with`] renders it.
enum Column<'a> {
    Formatted(ArrayFormatter<'a>),
    Rounded(ArrayRef, usize),
}

impl Column<'_> {
    fn cell(&self, row: usize) -> String {
        match self {
            Column::Formatted(f) => f.value(row).to_string(),
            Column::Rounded(a, _) if a.is_null(row) => "NULL".to_string(),
            Column::Rounded(a, digits) => {
                let v = a.as_primitive::<Float64Type>().value(row);
                // -0 and 0 print alike; the exponent form rounds to significant digits.
                let v = if v == 0.0 { 0.0 } else { v };
                format!("{:.*e}", digits.saturating_sub(1), v)
            }
        }
    }
}
