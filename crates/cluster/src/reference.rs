//! Single-node DataFusion over the same data, the yardstick for correctness and speed.

use crate::coordinator::Coordinator;
use arrow::array::RecordBatch;
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
    Ok(ctx)
}

/// Renders rows as text lines, sorted, so results can be compared as multisets.
pub fn canonical_rows(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for b in batches {
        let formatters = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            let cells: Vec<String> = formatters.iter().map(|f| f.value(r).to_string()).collect();
            rows.push(cells.join("|"));
        }
    }
    rows.sort();
    Ok(rows)
}
