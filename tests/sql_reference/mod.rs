//! Single-node DataFusion as the reference for the SQL end-to-end tests.

use datafusion::prelude::SessionContext;
use gyre_cluster::coordinator::Coordinator;
use gyre_cluster::reference::canonical_rows;
use std::sync::Arc;

/// `sql` without Gyre's placement clauses (`PARTITION BY col`), which DataFusion lacks.
fn without_placement(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find(" PARTITION BY ") {
        out.push_str(&rest[..at]);
        let after = &rest[at + " PARTITION BY ".len()..];
        let end = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// A single-node DataFusion session that ran the same setup statements.
pub async fn reference(setup: &str) -> SessionContext {
    let ctx = SessionContext::new();
    for stmt in setup.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        ctx.sql(&without_placement(stmt))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
    }
    ctx
}

/// Runs `query` on the cluster and on the reference; a description of the difference,
/// if any (rows compared in canonical order).
pub async fn differs(
    c: &Arc<Coordinator>,
    reference: &SessionContext,
    query: &str,
) -> Option<String> {
    let want =
        canonical_rows(&reference.sql(query).await.unwrap().collect().await.unwrap()).unwrap();
    match c.sql_one(query).await {
        Ok(got) => {
            let got = canonical_rows(&got.batches).unwrap();
            (got != want).then(|| {
                format!(
                    "{query}\n  got  {} rows {:?}\n  want {} rows {:?}",
                    got.len(),
                    &got[..got.len().min(8)],
                    want.len(),
                    &want[..want.len().min(8)]
                )
            })
        }
        Err(e) => Some(format!("{query}\n  error: {e}")),
    }
}
