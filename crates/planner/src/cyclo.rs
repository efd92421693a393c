//! Where the planner puts cyclo-joins: the rewrite of joins into [`CycloJoinExec`]s over
//! the optimised plan, as `gyre.join_strategy` ([`JoinStrategy`]) or their size asks.
//!
//! - Non-equi joins (DataFusion's `NestedLoopJoinExec`, which Gyre otherwise
//!   broadcasts) become cyclo-joins when both inputs are too large to broadcast
//!   cheaply ([`prefer_cyclo`]), whatever their kernel, or always under
//!   `SET gyre.join_strategy = 'cyclo'`.
//! - Single-key inner equi-joins become radix-hash cyclo-joins only when asked
//!   (`'cyclo'`, which also rewrites their outer, semi and anti forms); `'shuffle'` and `'broadcast'` force the hash join's distribution,
//!   `'auto'` is the size-based choice of [`crate::join_selection`].
//!
//! The kernel comes from the join condition ([`derive_kernel`]): a band
//! (`l BETWEEN r + a AND r + b`, also from `=` with an offset or two inequalities), an
//! inequality (`<`, `<=`, `>`, `>=`), or all pairs for any other predicate. The full
//! condition always remains the operator's filter, so the kernel only narrows the pairs.
//! The smaller input (by estimated bytes) rotates, if its columns can travel as words;
//! else the other one; else the join stays as DataFusion planned it. Outer, semi and
//! anti joins run on the ring too when their preserved (or filtered) input can stay
//! and the other one can rotate; full outer joins with either input rotating; mark and
//! null-aware joins never do.

mod inline;

use crate::join_selection::estimated_bytes;
pub use crate::options::JoinStrategy;
use arrow::datatypes::{DataType, Schema};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{JoinSide, JoinType, NullEquality, Result, ScalarValue};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{HashJoinExec, NestedLoopJoinExec};
use datafusion::physical_plan::limit::LocalLimitExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};
use gyre_exchange::cyclo::{key_type_supported, travels};
use gyre_exchange::{CycloJoinExec, CycloJoinType, CycloKernel, CycloSide};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Below this many bytes the smaller input of a non-equi join is broadcast (every
/// worker holds a copy); above it the join rotates the smaller input instead, so no
/// worker ever holds more than its own parts and a few fragments.
pub const BROADCAST_LIMIT_BYTES: f64 = 64.0 * 1024.0 * 1024.0;

/// Whether a non-equi join of inputs of these sizes should rather be a cyclo-join than
/// a broadcast nested-loop join (only with known sizes and more than one worker).
pub fn prefer_cyclo(left_bytes: Option<f64>, right_bytes: Option<f64>, n: usize) -> bool {
    match (left_bytes, right_bytes) {
        (Some(l), Some(r)) => n > 1 && l.min(r) > BROADCAST_LIMIT_BYTES,
        _ => false,
    }
}

/// Whether a non-equi join runs on the ring: always under `'cyclo'`; under `'auto'`
/// when [`prefer_cyclo`]. Every kernel qualifies: a band or inequality narrows the
/// pairs, and all pairs cost the ring about what they cost DataFusion's broadcast
/// nested-loop join (docs/results.md, "Cyclo-join in SQL") without a copy of the
/// smaller input on every worker.
pub fn non_equi_on_ring(
    strategy: JoinStrategy,
    left_bytes: Option<f64>,
    right_bytes: Option<f64>,
    n: usize,
) -> bool {
    match strategy {
        JoinStrategy::Cyclo => true,
        JoinStrategy::Auto => prefer_cyclo(left_bytes, right_bytes, n),
        JoinStrategy::Shuffle | JoinStrategy::Broadcast | JoinStrategy::Neo => false,
    }
}

/// A key operand of a comparison: a column of one input plus a constant.
struct Operand {
    side: JoinSide,
    column: usize,
    offset: i64,
    unsigned: bool,
}

fn int_literal(e: &Arc<dyn PhysicalExpr>) -> Option<i64> {
    let l = e.downcast_ref::<Literal>()?;
    match l.value() {
        ScalarValue::Int8(Some(v)) => Some(i64::from(*v)),
        ScalarValue::Int16(Some(v)) => Some(i64::from(*v)),
        ScalarValue::Int32(Some(v)) => Some(i64::from(*v)),
        ScalarValue::Int64(Some(v)) => Some(*v),
        ScalarValue::UInt8(Some(v)) => Some(i64::from(*v)),
        ScalarValue::UInt16(Some(v)) => Some(i64::from(*v)),
        ScalarValue::UInt32(Some(v)) => Some(i64::from(*v)),
        _ => None,
    }
}

/// `column`, `CAST(column AS Int64)` (a widening of a signed-domain key), or either
/// plus or minus integer literals: the column's index in `schema` and the offset.
fn linear(e: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<(usize, i64)> {
    if let Some(b) = e.downcast_ref::<BinaryExpr>() {
        let (inner, offset) = match b.op() {
            Operator::Plus => match (int_literal(b.left()), int_literal(b.right())) {
                (None, Some(c)) => (b.left(), c),
                (Some(c), None) => (b.right(), c),
                _ => return None,
            },
            Operator::Minus => (b.left(), int_literal(b.right())?.checked_neg()?),
            _ => return None,
        };
        let (column, o) = linear(inner, schema)?;
        // Arithmetic on an unsigned key would be on unsigned values (and may wrap).
        if key_type_supported(schema.field(column).data_type()) != Some(false) {
            return None;
        }
        return Some((column, o.checked_add(offset)?));
    }
    if let Some(c) = e.downcast_ref::<CastExpr>() {
        let inner_type = c.expr().data_type(schema).ok()?;
        if *c.cast_type() != DataType::Int64 || key_type_supported(&inner_type) != Some(false) {
            return None;
        }
        return linear(c.expr(), schema);
    }
    let col = e.downcast_ref::<Column>()?;
    key_type_supported(schema.fields().get(col.index())?.data_type())?;
    Some((col.index(), 0))
}

/// DataFusion computes `r.y - 3` of a join condition in a projection under the join
/// (`join_proj_push_down_N`); such a column is `y` plus an offset when the projection
/// also passes `y` itself: returns that column's index and the offset.
fn through_projection(child: &Arc<dyn ExecutionPlan>, index: usize) -> Option<(usize, i64)> {
    let child = unwrap_distribution(Arc::clone(child));
    let proj = child.downcast_ref::<ProjectionExec>()?;
    let exprs = proj.expr();
    let (j, offset) = linear(&exprs.get(index)?.expr, &proj.input().schema())?;
    if offset == 0 {
        return None;
    }
    let k = exprs.iter().position(|p| {
        p.expr
            .downcast_ref::<Column>()
            .is_some_and(|c| c.index() == j)
    })?;
    Some((k, offset))
}

/// A key operand of the filter: a column of one input (looked up through a pushed-down
/// projection) plus a constant.
fn operand(
    e: &Arc<dyn PhysicalExpr>,
    filter: &JoinFilter,
    inputs: [&Arc<dyn ExecutionPlan>; 2],
) -> Option<Operand> {
    let (column, offset) = linear(e, filter.schema())?;
    let source = filter.column_indices().get(column)?;
    let child = match source.side {
        JoinSide::Left => inputs[0],
        JoinSide::Right => inputs[1],
        JoinSide::None => return None,
    };
    let (column, offset) = match through_projection(child, source.index) {
        Some((k, o)) => (k, offset.checked_add(o)?),
        None => (source.index, offset),
    };
    let unsigned = key_type_supported(child.schema().fields().get(column)?.data_type())?;
    if unsigned && offset != 0 {
        return None;
    }
    Some(Operand {
        side: source.side,
        column,
        offset,
        unsigned,
    })
}

/// Bounds found for one (left column, right column) pair: `l >= r + lower`, `l <= r + upper`.
#[derive(Default)]
struct Bounds {
    lower: Option<i64>,
    upper: Option<i64>,
}

/// The kernel and key columns `(left, right)` for an inner join of `left` and `right`
/// with this filter.
pub fn derive_kernel(
    filter: &JoinFilter,
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
) -> (CycloKernel, usize, usize) {
    let mut pairs: BTreeMap<(usize, usize), Bounds> = BTreeMap::new();
    for conjunct in split_conjunction(filter.expression()) {
        let Some(b) = conjunct.downcast_ref::<BinaryExpr>() else {
            continue;
        };
        let op = *b.op();
        if !matches!(
            op,
            Operator::Eq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
        ) {
            continue;
        }
        let inputs = [left, right];
        let (Some(x), Some(y)) = (
            operand(b.left(), filter, inputs),
            operand(b.right(), filter, inputs),
        ) else {
            continue;
        };
        if x.unsigned != y.unsigned {
            continue;
        }
        // As `l op r + d`.
        let (l, r, op) = match (x.side, y.side) {
            (JoinSide::Left, JoinSide::Right) => (x, y, op),
            (JoinSide::Right, JoinSide::Left) => (y, x, op.swap().unwrap_or(op)),
            _ => continue,
        };
        let Some(d) = r.offset.checked_sub(l.offset) else {
            continue;
        };
        let (lower, upper) = match op {
            Operator::Eq => (Some(d), Some(d)),
            Operator::GtEq => (Some(d), None),
            Operator::Gt => (d.checked_add(1), None),
            Operator::LtEq => (None, Some(d)),
            Operator::Lt => (None, d.checked_sub(1)),
            _ => continue,
        };
        if lower.is_none() && upper.is_none() {
            continue;
        }
        let entry = pairs.entry((l.column, r.column)).or_default();
        if let Some(lo) = lower {
            entry.lower = Some(entry.lower.map_or(lo, |e| e.max(lo)));
        }
        if let Some(hi) = upper {
            entry.upper = Some(entry.upper.map_or(hi, |e| e.min(hi)));
        }
    }
    // A band narrows most; then an inequality without offset; else all pairs.
    for (&(l, r), b) in &pairs {
        if let (Some(lo), Some(hi)) = (b.lower, b.upper)
            && lo != i64::MIN
        {
            return (CycloKernel::Band { lo, hi }, l, r);
        }
    }
    // `l >= r + d` with d >= 1 implies `l > r` (and `l <= r + d` with d <= -1 implies
    // `l < r`): the plain inequality narrows the pairs, the filter decides.
    for (&(l, r), b) in &pairs {
        match (b.lower, b.upper) {
            (Some(0), _) => return (CycloKernel::Ge, l, r),
            (Some(lo), _) if lo >= 1 => return (CycloKernel::Gt, l, r),
            (_, Some(0)) => return (CycloKernel::Le, l, r),
            (_, Some(hi)) if hi <= -1 => return (CycloKernel::Lt, l, r),
            _ => {}
        }
    }
    (CycloKernel::AllPairs, 0, 0)
}

/// The input as it comes from its producers, without the repartition or merge
/// DataFusion placed for its own join (a cyclo-join takes any partitioning).
fn unwrap_distribution(mut plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    loop {
        let next = if let Some(r) = plan.downcast_ref::<RepartitionExec>() {
            Arc::clone(r.input())
        } else if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
            Arc::clone(c.input())
        } else {
            return plan;
        };
        plan = next;
    }
}

/// One partition per worker: an input with another count is spread round-robin.
fn on_n_partitions(plan: Arc<dyn ExecutionPlan>, n: usize) -> Result<Arc<dyn ExecutionPlan>> {
    if plan.output_partitioning().partition_count() == n {
        return Ok(plan);
    }
    Ok(Arc::new(RepartitionExec::try_new(
        plan,
        Partitioning::RoundRobinBatch(n),
    )?))
}

fn all_travel(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.schema()
        .fields()
        .iter()
        .all(|f| travels(f.data_type()))
}

/// The rotating side: the one the join type requires, else the smaller input whose
/// columns can travel, if any.
fn rotating_side(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    required: Option<CycloSide>,
) -> Option<CycloSide> {
    let (lb, rb) = (estimated_bytes(left), estimated_bytes(right));
    let smaller = match (lb, rb) {
        (Some(l), Some(r)) if r < l => CycloSide::Right,
        _ => CycloSide::Left,
    };
    let ok = |s: CycloSide| match s {
        CycloSide::Left => all_travel(left),
        CycloSide::Right => all_travel(right),
    };
    if let Some(side) = required {
        return ok(side).then_some(side);
    }
    let other = match smaller {
        CycloSide::Left => CycloSide::Right,
        CycloSide::Right => CycloSide::Left,
    };
    [smaller, other].into_iter().find(|&s| ok(s))
}

/// A cyclo-join replacing a join, with the join's own projection and per-partition
/// row limit (`fetch`, pushed into the join from a LIMIT) on top.
#[allow(clippy::too_many_arguments)]
fn cyclo_join(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    join_type: JoinType,
    keys: (usize, usize),
    kernel: CycloKernel,
    filter: Option<JoinFilter>,
    projection: Option<&[usize]>,
    fetch: Option<usize>,
    n: usize,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some((join_type, required)) = CycloJoinType::of(join_type) else {
        return Ok(None);
    };
    let left = unwrap_distribution(Arc::clone(left));
    let right = unwrap_distribution(Arc::clone(right));
    let Some(rotating) = rotating_side(&left, &right, required) else {
        return Ok(None);
    };
    let ring = |left, right, (l, r): (usize, usize), filter| {
        CycloJoinExec::try_new(
            on_n_partitions(left, n)?,
            on_n_partitions(right, n)?,
            l,
            r,
            kernel,
            filter,
            rotating,
            join_type,
            None,
        )
    };
    let inlined = inline_rotating(
        (&left, &right),
        keys,
        kernel,
        filter.as_ref(),
        rotating,
        join_type.join_type(rotating),
        projection,
    )?;
    let projected: Arc<dyn ExecutionPlan> = match inlined {
        // The rotating input without the filter's computed columns, their
        // expressions in the filter, the original output rebuilt above.
        Some(j) => {
            let Ok(join) = ring(j.left, j.right, j.keys, Some(j.filter)) else {
                return Ok(None);
            };
            Arc::new(ProjectionExec::try_new(j.output, Arc::new(join))?)
        }
        None => {
            let Ok(join) = ring(left, right, keys, filter) else {
                return Ok(None);
            };
            match projection {
                Some(projection) => project(Arc::new(join), projection)?,
                None => Arc::new(join),
            }
        }
    };
    Ok(Some(match fetch {
        Some(fetch) => Arc::new(LocalLimitExec::new(projected, fetch)),
        None => projected,
    }))
}

/// A cyclo-join's inputs, keys and filter after [`inline::inline`], with the output
/// expressions that give the original join's (projected) output.
struct InlinedJoin {
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    keys: (usize, usize),
    filter: JoinFilter,
    output: inline::OutputExprs,
}

/// The join with its rotating input no longer computing the filter's expressions as
/// columns ([`inline::inline`]); `None` if nothing is computed there.
fn inline_rotating(
    (left, right): (&Arc<dyn ExecutionPlan>, &Arc<dyn ExecutionPlan>),
    keys: (usize, usize),
    kernel: CycloKernel,
    filter: Option<&JoinFilter>,
    rotating: CycloSide,
    join_type: JoinType,
    projection: Option<&[usize]>,
) -> Result<Option<InlinedJoin>> {
    let Some(filter) = filter else {
        return Ok(None);
    };
    let (input, side, key) = match rotating {
        CycloSide::Left => (left, JoinSide::Left, keys.0),
        CycloSide::Right => (right, JoinSide::Right, keys.1),
    };
    let Some(inlined) = inline::inline(input, side, filter, kernel.uses_keys().then_some(key))?
    else {
        return Ok(None);
    };
    let (new_left, new_right, new_keys) = match rotating {
        CycloSide::Left => (
            Arc::clone(&inlined.input),
            Arc::clone(right),
            (inlined.key(keys.0), keys.1),
        ),
        CycloSide::Right => (
            Arc::clone(left),
            Arc::clone(&inlined.input),
            (keys.0, inlined.key(keys.1)),
        ),
    };
    let Some(output) = inlined.output(
        (&left.schema(), &right.schema()),
        (&new_left.schema(), &new_right.schema()),
        join_type,
        projection,
    )?
    else {
        return Ok(None);
    };
    Ok(Some(InlinedJoin {
        left: new_left,
        right: new_right,
        keys: new_keys,
        filter: inlined.filter,
        output,
    }))
}

/// The columns `projection` of `join`'s output.
fn project(join: Arc<dyn ExecutionPlan>, projection: &[usize]) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = join.schema();
    let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = projection
        .iter()
        .map(|&i| {
            let name = schema.field(i).name().clone();
            (
                Arc::new(Column::new(&name, i)) as Arc<dyn PhysicalExpr>,
                name,
            )
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, join)?))
}

/// Replaces the joins `strategy` sends around the ring by [`CycloJoinExec`]s in a
/// plan optimised for `n` workers. Their exchange ids are assigned when the plan is
/// cut into stages.
/// The physical optimizer rule that places cyclo-joins: [`plan_cyclo_joins`] over one
/// partition per worker (`target_partitions`), as the session's `gyre.join_strategy`
/// asks.
#[derive(Debug, Default)]
pub struct CycloJoinRule;

impl PhysicalOptimizerRule for CycloJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let workers = config.execution.target_partitions;
        plan_cyclo_joins(plan, workers, JoinStrategy::of(config))
    }

    fn name(&self) -> &str {
        "gyre_cyclo_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

pub fn plan_cyclo_joins(
    plan: Arc<dyn ExecutionPlan>,
    n: usize,
    strategy: JoinStrategy,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let replaced = if let Some(j) = node.downcast_ref::<HashJoinExec>() {
            let single_column_key = match j.on() {
                [(l, r)] => l
                    .downcast_ref::<Column>()
                    .zip(r.downcast_ref::<Column>())
                    .map(|(l, r)| (l.index(), r.index())),
                _ => None,
            };
            match single_column_key {
                Some(keys)
                    if strategy == JoinStrategy::Cyclo
                        && !j.null_aware
                        && j.null_equality() == NullEquality::NullEqualsNothing =>
                {
                    cyclo_join(
                        j.left(),
                        j.right(),
                        *j.join_type(),
                        keys,
                        CycloKernel::Hash,
                        j.filter().cloned(),
                        j.projection.as_deref(),
                        ExecutionPlan::fetch(j),
                        n,
                    )?
                }
                _ => None,
            }
        } else if let Some(j) = node.downcast_ref::<NestedLoopJoinExec>() {
            let chosen = j.filter().and_then(|filter| {
                let (kernel, l, r) = derive_kernel(filter, j.left(), j.right());
                let wanted = non_equi_on_ring(
                    strategy,
                    estimated_bytes(j.left()),
                    estimated_bytes(j.right()),
                    n,
                );
                wanted.then_some((filter, kernel, l, r))
            });
            match chosen {
                Some((filter, kernel, l, r)) => cyclo_join(
                    j.left(),
                    j.right(),
                    *j.join_type(),
                    (l, r),
                    kernel,
                    Some(filter.clone()),
                    j.projection().as_deref(),
                    ExecutionPlan::fetch(j),
                    n,
                )?,
                _ => None,
            }
        } else {
            None
        };
        Ok(match replaced {
            Some(new) => Transformed::yes(new),
            None => Transformed::no(node),
        })
    })
    .data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::joins::utils::ColumnIndex;

    /// Inputs: left (a Int32, s Utf8, v UInt64), right (4 unused Int32 columns, b Int32, u UInt64).
    fn kernel_of(f: &JoinFilter) -> (CycloKernel, usize, usize) {
        let left: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::UInt64, true),
        ]))));
        let right: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(Schema::new(vec![
            Field::new("r0", DataType::Int32, true),
            Field::new("r1", DataType::Int32, true),
            Field::new("r2", DataType::Int32, true),
            Field::new("b", DataType::Int32, true),
            Field::new("u", DataType::UInt64, true),
        ]))));
        derive_kernel(f, &left, &right)
    }

    /// A filter over `l.a` (Int32), `l.s` (Utf8), `r.b` (Int32), `r.u` (UInt64), `l.v` (UInt64).
    fn filter(expr: impl Fn(&[Arc<dyn PhysicalExpr>]) -> Arc<dyn PhysicalExpr>) -> JoinFilter {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Int32, true),
            Field::new("u", DataType::UInt64, true),
            Field::new("v", DataType::UInt64, true),
        ]));
        let cols: Vec<Arc<dyn PhysicalExpr>> = (0..5)
            .map(|i| Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>)
            .collect();
        let indices = vec![
            ColumnIndex {
                index: 0,
                side: JoinSide::Left,
            },
            ColumnIndex {
                index: 1,
                side: JoinSide::Left,
            },
            ColumnIndex {
                index: 3,
                side: JoinSide::Right,
            },
            ColumnIndex {
                index: 4,
                side: JoinSide::Right,
            },
            ColumnIndex {
                index: 2,
                side: JoinSide::Left,
            },
        ];
        JoinFilter::new(expr(&cols), indices, schema)
    }

    pub(super) fn bin(
        l: Arc<dyn PhysicalExpr>,
        op: Operator,
        r: Arc<dyn PhysicalExpr>,
    ) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(l, op, r))
    }

    pub(super) fn lit(v: i64) -> Arc<dyn PhysicalExpr> {
        Arc::new(Literal::new(ScalarValue::Int64(Some(v))))
    }

    fn i64_of(e: &Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
        Arc::new(CastExpr::new(Arc::clone(e), DataType::Int64, None))
    }

    #[test]
    fn bands_and_inequalities_are_recognised_in_either_orientation() {
        // l.a BETWEEN r.b - 2 AND r.b + 3, as DataFusion plans it (casts to Int64).
        let f = filter(|c| {
            bin(
                bin(
                    i64_of(&c[0]),
                    Operator::GtEq,
                    bin(i64_of(&c[2]), Operator::Minus, lit(2)),
                ),
                Operator::And,
                bin(
                    i64_of(&c[0]),
                    Operator::LtEq,
                    bin(i64_of(&c[2]), Operator::Plus, lit(3)),
                ),
            )
        });
        assert_eq!(kernel_of(&f), (CycloKernel::Band { lo: -2, hi: 3 }, 0, 3));
        // r.b > l.a  ==  l.a < r.b
        let f = filter(|c| bin(Arc::clone(&c[2]), Operator::Gt, Arc::clone(&c[0])));
        assert_eq!(kernel_of(&f), (CycloKernel::Lt, 0, 3));
        // l.a < r.b - 4 implies l.a < r.b; l.a >= r.b + 2 implies l.a > r.b.
        let f = filter(|c| {
            bin(
                Arc::clone(&c[0]),
                Operator::Lt,
                bin(Arc::clone(&c[2]), Operator::Minus, lit(4)),
            )
        });
        assert_eq!(kernel_of(&f), (CycloKernel::Lt, 0, 3));
        let f = filter(|c| {
            bin(
                Arc::clone(&c[0]),
                Operator::GtEq,
                bin(Arc::clone(&c[2]), Operator::Plus, lit(2)),
            )
        });
        assert_eq!(kernel_of(&f), (CycloKernel::Gt, 0, 3));
        // l.a + 1 = r.b  ==  l.a BETWEEN r.b - 1 AND r.b - 1
        let f = filter(|c| {
            bin(
                bin(Arc::clone(&c[0]), Operator::Plus, lit(1)),
                Operator::Eq,
                Arc::clone(&c[2]),
            )
        });
        assert_eq!(kernel_of(&f), (CycloKernel::Band { lo: -1, hi: -1 }, 0, 3));
        // Strict bounds on both sides: l.a > r.b - 3 AND l.a < r.b + 3 == band [-2, 2].
        let f = filter(|c| {
            bin(
                bin(
                    Arc::clone(&c[0]),
                    Operator::Gt,
                    bin(Arc::clone(&c[2]), Operator::Minus, lit(3)),
                ),
                Operator::And,
                bin(
                    Arc::clone(&c[0]),
                    Operator::Lt,
                    bin(Arc::clone(&c[2]), Operator::Plus, lit(3)),
                ),
            )
        });
        assert_eq!(kernel_of(&f), (CycloKernel::Band { lo: -2, hi: 2 }, 0, 3));
        // Unsigned keys compare without offsets.
        let f = filter(|c| bin(Arc::clone(&c[4]), Operator::GtEq, Arc::clone(&c[3])));
        assert_eq!(kernel_of(&f), (CycloKernel::Ge, 2, 4));
    }

    #[test]
    fn anything_else_joins_all_pairs() {
        // Both columns of one side, a string column, mixed domains, an inequality whose
        // offset widens it (l < r + 4), a disjunction.
        let cases: Vec<JoinFilter> = vec![
            filter(|c| bin(Arc::clone(&c[0]), Operator::Lt, Arc::clone(&c[4]))),
            filter(|c| bin(Arc::clone(&c[1]), Operator::Lt, Arc::clone(&c[2]))),
            filter(|c| bin(Arc::clone(&c[0]), Operator::Lt, Arc::clone(&c[3]))),
            filter(|c| {
                bin(
                    Arc::clone(&c[0]),
                    Operator::Lt,
                    bin(Arc::clone(&c[2]), Operator::Plus, lit(4)),
                )
            }),
            filter(|c| {
                bin(
                    bin(Arc::clone(&c[0]), Operator::Lt, Arc::clone(&c[2])),
                    Operator::Or,
                    bin(Arc::clone(&c[0]), Operator::Gt, lit(5)),
                )
            }),
            filter(|c| bin(Arc::clone(&c[0]), Operator::NotEq, Arc::clone(&c[2]))),
        ];
        for f in &cases {
            assert_eq!(kernel_of(f).0, CycloKernel::AllPairs, "{f}");
        }
    }

    #[test]
    fn only_large_inputs_on_several_workers_rotate() {
        let big = Some(2.0 * BROADCAST_LIMIT_BYTES);
        assert!(prefer_cyclo(big, big, 3));
        assert!(!prefer_cyclo(big, Some(1e6), 3));
        assert!(!prefer_cyclo(big, big, 1));
        assert!(!prefer_cyclo(None, big, 3));
        assert!(non_equi_on_ring(JoinStrategy::Auto, big, big, 3));
        assert!(!non_equi_on_ring(JoinStrategy::Auto, big, Some(1e6), 3));
        assert!(non_equi_on_ring(JoinStrategy::Cyclo, None, None, 1));
        assert!(!non_equi_on_ring(JoinStrategy::Shuffle, big, big, 3));
        assert!(!non_equi_on_ring(JoinStrategy::Broadcast, big, big, 3));
    }

    #[test]
    fn strategies_parse() {
        assert_eq!(JoinStrategy::parse(" Cyclo ").unwrap(), JoinStrategy::Cyclo);
        assert_eq!(JoinStrategy::parse("auto").unwrap(), JoinStrategy::Auto);
        assert!(JoinStrategy::parse("spin").is_err());
    }
}
