//! Keeping computed filter columns off the ring.
//!
//! DataFusion's projection pushdown evaluates expressions of a join filter once per
//! input row, as extra columns of the join's inputs: a band's bounds `y - 10` and
//! `y + 10` become the columns `join_proj_push_down_1` and `_2`. On a cyclo-join's
//! rotating input such columns would travel the ring with every row (a band join's
//! rotating rows grow from 32 to 48 bytes, and every worker decodes them). [`inline`]
//! takes them out of the rotating input and evaluates them in the filter instead, on
//! the candidate pairs only; [`Inlined::output`] rebuilds the join's original output
//! columns above the cyclo-join, so nothing above it changes.

use arrow::datatypes::{Field, Schema};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{JoinSide, JoinType, Result};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter, build_join_schema};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use std::collections::HashMap;
use std::sync::Arc;

/// Output expressions with their names, as a `ProjectionExec` takes them.
pub(super) type OutputExprs = Vec<(Arc<dyn PhysicalExpr>, String)>;

/// Where a column of the original rotating input comes from after [`inline`].
#[derive(Debug, Clone)]
enum Source {
    /// This column of the new input.
    Kept(usize),
    /// This expression over the new input's columns.
    Computed(Arc<dyn PhysicalExpr>),
}

/// A rotating input without its computed columns, and the filter that computes them.
#[derive(Debug)]
pub(super) struct Inlined {
    /// The rotating input without the computed columns.
    pub input: Arc<dyn ExecutionPlan>,
    /// The join filter, evaluating the computed columns' expressions itself.
    pub filter: JoinFilter,
    side: JoinSide,
    /// Per column of the original rotating input.
    columns: Vec<Source>,
}

/// Takes the computed columns out of `input`, the `side` input of a join with
/// `filter`, if it is a projection that computes some and none of them is the join's
/// key column `key`. `None` when there is nothing to take out.
pub(super) fn inline(
    input: &Arc<dyn ExecutionPlan>,
    side: JoinSide,
    filter: &JoinFilter,
    key: Option<usize>,
) -> Result<Option<Inlined>> {
    let Some(projection) = input.downcast_ref::<ProjectionExec>() else {
        return Ok(None);
    };
    let base = projection.input();
    let mut kept: Vec<ProjectionExpr> = vec![];
    // Column of `base` -> its (first) index in the new input.
    let mut of_base: HashMap<usize, usize> = HashMap::new();
    let mut columns = Vec::with_capacity(projection.expr().len());
    for e in projection.expr() {
        match e.expr.downcast_ref::<Column>() {
            Some(c) => {
                of_base.entry(c.index()).or_insert(kept.len());
                columns.push(Source::Kept(kept.len()));
                kept.push(e.clone());
            }
            None => columns.push(Source::Computed(Arc::clone(&e.expr))),
        }
    }
    if kept.len() == columns.len()
        || key.is_some_and(|k| matches!(columns.get(k), Some(Source::Computed(_))))
    {
        return Ok(None);
    }
    let identity = kept.len() == base.schema().fields().len()
        && kept
            .iter()
            .enumerate()
            .all(|(i, e)| e.expr.downcast_ref::<Column>().map(Column::index) == Some(i));
    let new_input: Arc<dyn ExecutionPlan> = match identity {
        true => Arc::clone(base),
        false => Arc::new(ProjectionExec::try_new(kept, Arc::clone(base))?),
    };
    let schema = new_input.schema();
    for source in &mut columns {
        if let Source::Computed(e) = source {
            // A computed column over a column the projection does not keep stays.
            let Some(over_new) = remap(e, |i| {
                of_base
                    .get(&i)
                    .map(|&n| (n, schema.field(n).name().clone()))
            })?
            else {
                return Ok(None);
            };
            *e = over_new;
        }
    }
    let filter = inline_filter(filter, side, &columns, &schema)?;
    Ok(Some(Inlined {
        input: new_input,
        filter,
        side,
        columns,
    }))
}

/// `expr` with every column `i` replaced by column `to(i)`; `None` if some column
/// has no replacement.
fn remap(
    expr: &Arc<dyn PhysicalExpr>,
    mut to: impl FnMut(usize) -> Option<(usize, String)>,
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let mut complete = true;
    let out = Arc::clone(expr)
        .transform_up(|e| {
            let Some(c) = e.downcast_ref::<Column>() else {
                return Ok(Transformed::no(e));
            };
            Ok(match to(c.index()) {
                Some((i, name)) => Transformed::yes(Arc::new(Column::new(&name, i)) as _),
                None => {
                    complete = false;
                    Transformed::no(e)
                }
            })
        })
        .data()?;
    Ok(complete.then_some(out))
}

/// The filter with the computed columns of `side` replaced by their expressions, whose
/// columns are added to the filter's inputs where needed.
fn inline_filter(
    filter: &JoinFilter,
    side: JoinSide,
    columns: &[Source],
    input: &Schema,
) -> Result<JoinFilter> {
    let old = filter.column_indices();
    let mut entries: Vec<ColumnIndex> = vec![];
    let mut fields: Vec<Field> = vec![];
    // Old filter column -> new filter column, for the columns that stay.
    let mut moved: Vec<Option<usize>> = vec![None; old.len()];
    for (k, ci) in old.iter().enumerate() {
        let index = match (ci.side == side, columns.get(ci.index)) {
            (false, _) => ci.index,
            (true, Some(Source::Kept(i))) => *i,
            _ => continue,
        };
        moved[k] = Some(entries.len());
        entries.push(ColumnIndex {
            index,
            side: ci.side,
        });
        fields.push(filter.schema().field(k).clone());
    }
    // Old filter column -> the expression that replaces it, over new filter columns.
    let mut replaced: HashMap<usize, Arc<dyn PhysicalExpr>> = HashMap::new();
    for (k, ci) in old.iter().enumerate() {
        let (true, Some(Source::Computed(e))) = (ci.side == side, columns.get(ci.index)) else {
            continue;
        };
        let over_filter = remap(e, |c| {
            let at = match entries.iter().position(|x| x.side == side && x.index == c) {
                Some(at) => at,
                None => {
                    entries.push(ColumnIndex { index: c, side });
                    fields.push(input.field(c).clone());
                    entries.len() - 1
                }
            };
            Some((at, fields[at].name().clone()))
        })?
        .expect("every column maps");
        replaced.insert(k, over_filter);
    }
    let expression = Arc::clone(filter.expression())
        .transform_up(|e| {
            let Some(c) = e.downcast_ref::<Column>() else {
                return Ok(Transformed::no(e));
            };
            Ok(match (replaced.get(&c.index()), moved[c.index()]) {
                (Some(r), _) => Transformed::yes(Arc::clone(r)),
                (None, Some(i)) => Transformed::yes(Arc::new(Column::new(c.name(), i)) as _),
                (None, None) => Transformed::no(e),
            })
        })
        .data()?;
    Ok(JoinFilter::new(
        expression,
        entries,
        Arc::new(Schema::new(fields)),
    ))
}

impl Inlined {
    /// The rotating input's key column in the new input.
    pub fn key(&self, key: usize) -> usize {
        match self.columns.get(key) {
            Some(Source::Kept(i)) => *i,
            // `inline` refuses computed keys.
            _ => key,
        }
    }

    /// Expressions over the output of the join of `left` and `right` (the inputs
    /// after [`inline`]) that give the output of the original join of `old_left` and
    /// `old_right`, in its order, or only its columns `projection`. `None` if the
    /// output has a column of neither input (a mark).
    pub fn output(
        &self,
        old: (&Schema, &Schema),
        new: (&Schema, &Schema),
        join_type: JoinType,
        projection: Option<&[usize]>,
    ) -> Result<Option<OutputExprs>> {
        let (old_schema, old_columns) = build_join_schema(old.0, old.1, &join_type);
        let (new_schema, new_columns) = build_join_schema(new.0, new.1, &join_type);
        if old_columns
            .iter()
            .chain(&new_columns)
            .any(|c| c.side == JoinSide::None)
        {
            return Ok(None);
        }
        let position = |side: JoinSide, index: usize| {
            new_columns
                .iter()
                .position(|c| c.side == side && c.index == index)
                .map(|p| (p, new_schema.field(p).name().clone()))
        };
        let all: Vec<usize> = (0..old_columns.len()).collect();
        projection
            .unwrap_or(&all)
            .iter()
            .map(|&o| {
                let ci = &old_columns[o];
                let name = old_schema.field(o).name().clone();
                let source = match ci.side == self.side {
                    true => self.columns[ci.index].clone(),
                    false => Source::Kept(ci.index),
                };
                let side = ci.side;
                let expr = match source {
                    Source::Kept(i) => position(side, i)
                        .map(|(p, n)| Arc::new(Column::new(&n, p)) as Arc<dyn PhysicalExpr>),
                    Source::Computed(e) => remap(&e, |i| position(side, i))?,
                };
                Ok(expr.map(|e| (e, name)))
            })
            .collect::<Result<Option<Vec<_>>>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cyclo::tests::{bin, lit};
    use arrow::datatypes::DataType;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_plan::empty::EmptyExec;

    fn col(name: &str, i: usize) -> Arc<dyn PhysicalExpr> {
        Arc::new(Column::new(name, i))
    }

    /// `s(y, b)` projected to `[y, b, y - 10, y + 10]`, and the band filter
    /// `x >= p1 AND x <= p2` of `r(x) JOIN s` as DataFusion's pushdown leaves it.
    fn band() -> (Arc<dyn ExecutionPlan>, JoinFilter) {
        let int = |n: &str| Field::new(n, DataType::Int64, false);
        let base = Arc::new(EmptyExec::new(Arc::new(Schema::new(vec![
            int("y"),
            int("b"),
        ]))));
        let exprs = vec![
            ProjectionExpr::new(col("y", 0), "y".to_string()),
            ProjectionExpr::new(col("b", 1), "b".to_string()),
            ProjectionExpr::new(bin(col("y", 0), Operator::Minus, lit(10)), "p1".to_string()),
            ProjectionExpr::new(bin(col("y", 0), Operator::Plus, lit(10)), "p2".to_string()),
        ];
        let input = Arc::new(ProjectionExec::try_new(exprs, base).unwrap());
        let filter = JoinFilter::new(
            bin(
                bin(col("x", 0), Operator::GtEq, col("p1", 1)),
                Operator::And,
                bin(col("x", 0), Operator::LtEq, col("p2", 2)),
            ),
            JoinFilter::build_column_indices(vec![0], vec![2, 3]),
            Arc::new(Schema::new(vec![int("x"), int("p1"), int("p2")])),
        );
        (input, filter)
    }

    #[test]
    fn band_bounds_move_into_the_filter() {
        let (input, filter) = band();
        let inlined = inline(&input, JoinSide::Right, &filter, Some(0))
            .unwrap()
            .expect("computed columns");
        // Only y and b remain, straight from the scan (no projection left).
        assert_eq!(inlined.input.name(), "EmptyExec");
        assert_eq!(inlined.filter.to_string(), "x >= y - 10 AND x <= y + 10");
        let cols: Vec<(JoinSide, usize)> = inlined
            .filter
            .column_indices()
            .iter()
            .map(|c| (c.side, c.index))
            .collect();
        assert_eq!(cols, vec![(JoinSide::Left, 0), (JoinSide::Right, 0)]);
        assert_eq!(inlined.key(0), 0);
        // The original output r.x, s.y, s.b, p1, p2 is rebuilt over r.x, s.y, s.b.
        let r = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let output = inlined
            .output(
                (&r, &input.schema()),
                (&r, &inlined.input.schema()),
                JoinType::Inner,
                None,
            )
            .unwrap()
            .unwrap();
        let shown: Vec<String> = output.iter().map(|(e, n)| format!("{n}={e}")).collect();
        assert_eq!(
            shown,
            ["x=x@0", "y=y@1", "b=b@2", "p1=y@1 - 10", "p2=y@1 + 10"]
        );
    }

    #[test]
    fn a_computed_key_stays_a_column() {
        let (input, filter) = band();
        assert!(
            inline(&input, JoinSide::Right, &filter, Some(2))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_computed_column_over_a_dropped_column_stays() {
        let (input, filter) = band();
        let p = input.downcast_ref::<ProjectionExec>().unwrap();
        // [b, p1, p2]: y itself is not kept, so y - 10 cannot be computed later.
        let exprs: Vec<ProjectionExpr> = p.expr()[1..].to_vec();
        let input: Arc<dyn ExecutionPlan> =
            Arc::new(ProjectionExec::try_new(exprs, Arc::clone(p.input())).unwrap());
        let filter = JoinFilter::new(
            Arc::clone(filter.expression()),
            JoinFilter::build_column_indices(vec![0], vec![1, 2]),
            Arc::clone(filter.schema()),
        );
        assert!(
            inline(&input, JoinSide::Right, &filter, None)
                .unwrap()
                .is_none()
        );
    }
}
