//! Single-node DataFusion as the reference for the SQL end-to-end tests.

use datafusion::prelude::SessionContext;
use gyre_cluster::LocalCluster;
use gyre_cluster::coordinator::{Coordinator, StatementResult};
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

/// A local cluster of `workers` (one thread each) that ran `setup`, and the reference
/// that ran it too.
pub async fn start(workers: usize, setup: &str) -> (LocalCluster, SessionContext) {
    let cluster = LocalCluster::start(workers, 1, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    cluster.coordinator.sql(setup).await.unwrap();
    (cluster, reference(setup).await)
}

/// A result's rows in canonical order, one line each (for plans and small results).
pub fn text(r: StatementResult) -> String {
    canonical_rows(&r.batches).unwrap().join("\n")
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
