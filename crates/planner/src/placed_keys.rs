//! Narrows a join on several keys to the keys one of its inputs is placed on.
//!
//! A table hash-placed on one column is partitioned on any set of join keys
//! that contains that column: rows that match on all keys match on it, so they
//! meet on the worker that owns its value. DataFusion asks a partitioned hash
//! join for both inputs hash-partitioned on all its keys (its subset rule does not
//! apply to joins, whose two sides must agree), so a join of `partsupp` (placed on
//! `ps_partkey`) with rows keyed by `(partkey, suppkey)` would shuffle both
//! inputs or broadcast one. Joined on the placed keys alone, with the other key
//! pairs as equalities in the join filter, only the other input moves. The hash
//! table then has fewer distinct keys, so the narrowed join is only used where it
//! saves a shuffle.

use arrow::datatypes::{Field, Schema};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{JoinSide, NullEquality, Result};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::physical_plan::{ExecutionPlanProperties, Partitioning};
use std::sync::Arc;

type KeyPair = (Arc<dyn PhysicalExpr>, Arc<dyn PhysicalExpr>);

/// `join` joined only on the keys that its left or right input is already
/// hash-partitioned on over `n` partitions (a strict, non-empty subset of its
/// keys), the other key pairs moved into its filter; `None` when neither input
/// is placed so, or the join compares NULL keys as equal.
pub fn narrow_to_placed_keys(join: &HashJoinExec, n: usize) -> Result<Option<HashJoinExec>> {
    if join.on().len() < 2
        || join.null_aware
        || join.null_equality() == NullEquality::NullEqualsNull
    {
        return Ok(None);
    }
    for side in [JoinSide::Left, JoinSide::Right] {
        let input = match side {
            JoinSide::Left => join.left(),
            _ => join.right(),
        };
        let Partitioning::Hash(placed, count) = input.output_partitioning() else {
            continue;
        };
        if *count != n || placed.is_empty() || placed.len() >= join.on().len() {
            continue;
        }
        let key_of = |pair: &KeyPair| match side {
            JoinSide::Left => Arc::clone(&pair.0),
            _ => Arc::clone(&pair.1),
        };
        // The kept pairs in the order of the placement, so that the input's
        // partitioning equals the join's keys on that side exactly.
        let Some(kept) = placed
            .iter()
            .map(|p| join.on().iter().find(|pair| key_of(pair).eq(p)).cloned())
            .collect::<Option<Vec<KeyPair>>>()
        else {
            continue;
        };
        let moved: Vec<KeyPair> = join
            .on()
            .iter()
            .filter(|pair| !placed.iter().any(|p| key_of(pair).eq(p)))
            .cloned()
            .collect();
        let filter = with_equalities(join, &moved)?;
        let narrowed = join
            .builder()
            .with_on(kept)
            .with_filter(Some(filter))
            .build()?;
        return Ok(Some(narrowed));
    }
    Ok(None)
}

/// The join's filter (if any) and `l = r` for every pair of `moved`.
fn with_equalities(join: &HashJoinExec, moved: &[KeyPair]) -> Result<JoinFilter> {
    let (mut indices, mut fields, mut expression): (
        Vec<ColumnIndex>,
        Vec<Field>,
        Option<Arc<dyn PhysicalExpr>>,
    ) = match join.filter() {
        Some(f) => (
            f.column_indices().to_vec(),
            f.schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect(),
            Some(Arc::clone(f.expression())),
        ),
        None => (vec![], vec![], None),
    };
    let left_schema = join.left().schema();
    let right_schema = join.right().schema();
    // An input column's place in the filter's intermediate batch, added if new.
    let mut place = |index: usize, side: JoinSide| -> usize {
        if let Some(at) = indices
            .iter()
            .position(|c| c.index == index && c.side == side)
        {
            return at;
        }
        let schema = match side {
            JoinSide::Left => &left_schema,
            _ => &right_schema,
        };
        indices.push(ColumnIndex { index, side });
        fields.push(schema.field(index).clone());
        indices.len() - 1
    };
    for (l, r) in moved {
        let mut rebased = |e: &Arc<dyn PhysicalExpr>, side: JoinSide| {
            Arc::clone(e)
                .transform_up(|node| {
                    let Some(c) = node.downcast_ref::<Column>() else {
                        return Ok(Transformed::no(node));
                    };
                    let at = place(c.index(), side);
                    Ok(Transformed::yes(Arc::new(Column::new(c.name(), at)) as _))
                })
                .data()
        };
        let equal: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            rebased(l, JoinSide::Left)?,
            Operator::Eq,
            rebased(r, JoinSide::Right)?,
        ));
        expression = Some(match expression {
            Some(e) => Arc::new(BinaryExpr::new(e, Operator::And, equal)),
            None => equal,
        });
    }
    let expression = expression.expect("at least one moved pair");
    Ok(JoinFilter::new(
        expression,
        indices,
        Arc::new(Schema::new(fields)),
    ))
}
