//! Join order: chains of inner joins reordered so that intermediate results stay small.
//!
//! DataFusion joins tables in the order a query names them and only swaps the two
//! inputs of each join. A query that names a large fact table next to another large
//! table before the small, selective dimensions (TPC-DS q72: `catalog_sales JOIN
//! inventory` on the item, then the date and demographic filters) then builds its
//! largest intermediate first. On one node DataFusion's dynamic filters hide much of
//! that; across workers the intermediate is shipped and joined in full.
//!
//! [`JoinReorder`] is a logical optimiser rule. It takes each maximal group of inner
//! joins (seeing through filters and plain column projections between them), estimates
//! each input's rows from the tables' statistics and its filters' selectivity, and
//! orders the joins greedily: repeatedly join the two connected parts with the
//! smallest estimated result (greedy operator ordering, which may build bushy trees).
//! Join predicates apply at the first join where all their columns are present, and a
//! projection on top restores the group's columns in their original order. The new
//! order replaces the written one only when its estimated sum of intermediate rows is
//! at most two thirds of the written order's: estimates are rough, and a query
//! author's order is a fair default.
//!
//! Estimates: a table's rows and per-column distinct counts, null counts and ranges
//! come from [`TableStatistics`]. `col = literal` keeps `1/distinct` of the rows,
//! `IN` lists their length over it, ranges interpolate between min and max, other
//! predicates keep a quarter. An equi-join keeps `1/max(distinct)` of the cross
//! product (the most selective key pair), other join predicates a third.

use crate::options::GyreOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{
    Column, ColumnStatistics, DFSchemaRef, JoinType, NullEquality, Result, ScalarValue, Statistics,
};
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    Aggregate, Between, BinaryExpr, Expr, Filter, Join, JoinConstraint, LogicalPlan, Operator,
    Projection, TableScan,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use std::fmt;
use std::sync::Arc;

/// A table's statistics as the scan's source reports them, columns in the table's
/// order (not the scan's projection).
pub type TableStatistics = Arc<dyn Fn(&TableScan) -> Option<Statistics> + Send + Sync>;

/// Reorders groups of inner joins by estimated sizes (see the module doc).
pub struct JoinReorder {
    statistics: TableStatistics,
}

impl fmt::Debug for JoinReorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JoinReorder")
    }
}

/// The written order is kept unless the greedy order is this many times cheaper.
const REQUIRED_GAIN: f64 = 1.5;
/// Groups of more inputs are left as written (the search is quadratic per step).
const MAX_INPUTS: usize = 32;
/// What a predicate without better knowledge keeps of its rows.
const DEFAULT_SELECTIVITY: f64 = 0.25;
/// What a join predicate other than a key equality keeps of the cross product.
const JOIN_FILTER_SELECTIVITY: f64 = 1.0 / 3.0;

impl JoinReorder {
    pub fn new(statistics: TableStatistics) -> Self {
        Self { statistics }
    }

    /// `plan` with every inner-join group in it reordered.
    fn visit(&self, plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
        if group_join(&plan).is_none() {
            return plan.map_children(|c| self.visit(c));
        }
        // Taking the group apart visits its inputs (their own groups).
        let (group, written) = Group::of(&plan, self)?;
        // A group that cannot be rebuilt (an error) keeps its written order.
        if let Ok(Some(better)) = group.reordered(&plan, &written, self) {
            return Ok(Transformed::yes(better));
        }
        let transformed = group.inputs_transformed;
        let mut inputs = group.inputs.into_iter();
        let kept = put_back_inputs(plan, &mut inputs)?;
        Ok(Transformed::new_transformed(kept, transformed))
    }

    /// Estimated rows of `plan`, `None` when nothing is known.
    fn rows(&self, plan: &LogicalPlan) -> Option<f64> {
        let rows = match plan {
            LogicalPlan::TableScan(scan) => {
                let stats = (self.statistics)(scan)?;
                let mut rows = *stats.num_rows.get_value()? as f64;
                for f in &scan.filters {
                    rows *= self.selectivity(f, plan, rows);
                }
                match scan.fetch {
                    Some(n) => rows.min(n as f64),
                    None => rows,
                }
            }
            LogicalPlan::Filter(Filter {
                predicate, input, ..
            }) => {
                let rows = self.rows(input)?;
                rows * self.selectivity(predicate, input, rows)
            }
            LogicalPlan::Projection(Projection { input, .. })
            | LogicalPlan::SubqueryAlias(datafusion::logical_expr::SubqueryAlias {
                input, ..
            })
            | LogicalPlan::Sort(datafusion::logical_expr::Sort { input, .. })
            | LogicalPlan::Window(datafusion::logical_expr::Window { input, .. })
            | LogicalPlan::Repartition(datafusion::logical_expr::Repartition { input, .. }) => {
                self.rows(input)?
            }
            LogicalPlan::Limit(limit) => {
                let rows = self.rows(&limit.input)?;
                match limit.get_fetch_type() {
                    Ok(datafusion::logical_expr::logical_plan::FetchType::Literal(Some(n))) => {
                        rows.min(n as f64)
                    }
                    _ => rows,
                }
            }
            LogicalPlan::Aggregate(Aggregate {
                input, group_expr, ..
            }) => {
                let rows = self.rows(input)?;
                if group_expr.is_empty() {
                    return Some(1.0);
                }
                let mut groups = 1.0;
                for g in group_expr {
                    match g {
                        Expr::Column(c) => match self.distinct(input, c, rows) {
                            Some(d) => groups *= d,
                            None => return Some(rows),
                        },
                        _ => return Some(rows),
                    }
                }
                rows.min(groups)
            }
            LogicalPlan::Distinct(_) => self.rows(plan.inputs()[0])?,
            LogicalPlan::Union(u) => {
                let mut sum = 0.0;
                for i in &u.inputs {
                    sum += self.rows(i)?;
                }
                sum
            }
            LogicalPlan::Join(join) => self.join_rows(join)?,
            LogicalPlan::EmptyRelation(e) => {
                if e.produce_one_row {
                    1.0
                } else {
                    0.0
                }
            }
            LogicalPlan::Values(v) => v.values.len() as f64,
            _ => return None,
        };
        Some(rows.max(1.0))
    }

    /// Estimated rows of a join outside a group (its own type's bounds).
    fn join_rows(&self, join: &Join) -> Option<f64> {
        let (l, r) = (self.rows(&join.left)?, self.rows(&join.right)?);
        let mut keep = 1.0_f64;
        let mut strongest = 1.0_f64;
        for (a, b) in &join.on {
            strongest = strongest.min(self.key_selectivity(a, &join.left, l, b, &join.right, r));
        }
        keep *= strongest;
        if join.filter.is_some() {
            keep *= JOIN_FILTER_SELECTIVITY;
        }
        let inner = l * r * keep;
        Some(match join.join_type {
            JoinType::Inner => inner,
            JoinType::Left => inner.max(l),
            JoinType::Right => inner.max(r),
            JoinType::Full => inner.max(l).max(r),
            JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => l,
            JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => r,
        })
    }

    /// What an equality of `a` (over `left`, of `l` rows) and `b` keeps of the pairs.
    fn key_selectivity(
        &self,
        a: &Expr,
        left: &LogicalPlan,
        l: f64,
        b: &Expr,
        right: &LogicalPlan,
        r: f64,
    ) -> f64 {
        let da = match a {
            Expr::Column(c) => self.distinct(left, c, l),
            _ => None,
        };
        let db = match b {
            Expr::Column(c) => self.distinct(right, c, r),
            _ => None,
        };
        // Without distinct counts, a key joins a foreign key: the result is as large
        // as the larger input.
        let d = match (da, db) {
            (Some(x), Some(y)) => x.max(y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => l.max(r),
        };
        1.0 / d.max(1.0)
    }

    /// Distinct values of `column` among the `rows` rows `plan` is estimated to return.
    fn distinct(&self, plan: &LogicalPlan, column: &Column, rows: f64) -> Option<f64> {
        let stats = self.column_statistics(plan, column)?;
        let d = *stats.distinct_count.get_value()? as f64;
        Some(d.min(rows).max(1.0))
    }

    /// The statistics of the table column `column` of `plan` comes from, following it
    /// through aliases, projections, filters and joins.
    fn column_statistics(&self, plan: &LogicalPlan, column: &Column) -> Option<ColumnStatistics> {
        let index = plan.schema().index_of_column(column).ok()?;
        match plan {
            LogicalPlan::TableScan(scan) => {
                let table_index = match &scan.projection {
                    Some(p) => *p.get(index)?,
                    None => index,
                };
                (self.statistics)(scan)?
                    .column_statistics
                    .get(table_index)
                    .cloned()
            }
            LogicalPlan::SubqueryAlias(a) => {
                let (q, f) = a.input.schema().qualified_field(index);
                self.column_statistics(&a.input, &Column::from((q, f.as_ref())))
            }
            LogicalPlan::Projection(p) => match p.expr.get(index)?.clone().unalias() {
                Expr::Column(c) => self.column_statistics(&p.input, &c),
                _ => None,
            },
            LogicalPlan::Aggregate(a) => match a.group_expr.get(index)? {
                Expr::Column(c) => self.column_statistics(&a.input, c),
                _ => None,
            },
            LogicalPlan::Filter(_)
            | LogicalPlan::Sort(_)
            | LogicalPlan::Limit(_)
            | LogicalPlan::Repartition(_)
            | LogicalPlan::Distinct(_) => self.column_statistics(plan.inputs()[0], column),
            LogicalPlan::Join(j) => {
                if j.left.schema().has_column(column) {
                    self.column_statistics(&j.left, column)
                } else {
                    self.column_statistics(&j.right, column)
                }
            }
            _ => None,
        }
    }

    /// The share of `input`'s `rows` rows that `predicate` keeps.
    fn selectivity(&self, predicate: &Expr, input: &LogicalPlan, rows: f64) -> f64 {
        let s = match predicate {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
                Operator::And => {
                    self.selectivity(left, input, rows) * self.selectivity(right, input, rows)
                }
                Operator::Or => {
                    let (a, b) = (
                        self.selectivity(left, input, rows),
                        self.selectivity(right, input, rows),
                    );
                    a + b - a * b
                }
                Operator::Eq => match column_and_literal(left, right) {
                    Some((c, _)) => self
                        .distinct(input, c, rows)
                        .map_or(DEFAULT_SELECTIVITY, |d| 1.0 / d),
                    None => DEFAULT_SELECTIVITY,
                },
                Operator::NotEq => match column_and_literal(left, right) {
                    Some((c, _)) => self
                        .distinct(input, c, rows)
                        .map_or(1.0 - DEFAULT_SELECTIVITY, |d| 1.0 - 1.0 / d),
                    None => 1.0 - DEFAULT_SELECTIVITY,
                },
                Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => {
                    match column_and_literal(left, right) {
                        Some((c, v)) => {
                            // `literal < column` reads as `column > literal`.
                            let below = matches!(op, Operator::Lt | Operator::LtEq)
                                == matches!(left.as_ref(), Expr::Column(_));
                            self.range_share(input, c, v, below)
                                .unwrap_or(DEFAULT_SELECTIVITY)
                        }
                        None => DEFAULT_SELECTIVITY,
                    }
                }
                _ => DEFAULT_SELECTIVITY,
            },
            Expr::Not(e) => 1.0 - self.selectivity(e, input, rows),
            Expr::InList(InList {
                expr,
                list,
                negated,
            }) => {
                let share = match expr.as_ref() {
                    Expr::Column(c) => self
                        .distinct(input, c, rows)
                        .map_or(DEFAULT_SELECTIVITY, |d| (list.len() as f64 / d).min(1.0)),
                    _ => DEFAULT_SELECTIVITY,
                };
                if *negated { 1.0 - share } else { share }
            }
            Expr::Between(Between {
                expr,
                negated,
                low,
                high,
            }) => {
                let share = match (expr.as_ref(), low.as_ref(), high.as_ref()) {
                    (Expr::Column(c), Expr::Literal(lo, _), Expr::Literal(hi, _)) => {
                        match (
                            self.range_share(input, c, lo, false),
                            self.range_share(input, c, hi, true),
                        ) {
                            // Above low and below high: the overlap of the two shares.
                            (Some(a), Some(b)) => (a + b - 1.0).max(0.0),
                            _ => DEFAULT_SELECTIVITY,
                        }
                    }
                    _ => DEFAULT_SELECTIVITY,
                };
                if *negated { 1.0 - share } else { share }
            }
            Expr::IsNull(e) | Expr::IsNotNull(e) => {
                let nulls = match e.as_ref() {
                    Expr::Column(c) => self.column_statistics(input, c).and_then(|s| {
                        let n = *s.null_count.get_value()? as f64;
                        let total = self.rows(input)?;
                        Some((n / total).min(1.0))
                    }),
                    _ => None,
                }
                .unwrap_or(0.1);
                if matches!(predicate, Expr::IsNull(_)) {
                    nulls
                } else {
                    1.0 - nulls
                }
            }
            Expr::Literal(ScalarValue::Boolean(Some(true)), _) => 1.0,
            Expr::Literal(ScalarValue::Boolean(Some(false)), _) => 0.0,
            _ => DEFAULT_SELECTIVITY,
        };
        // Never quite zero: a zero would make every order equally cheap.
        s.clamp(1e-9, 1.0)
    }

    /// The share of `column`'s rows below `value` (`below`) or above it, from the
    /// column's range, for numeric and date columns.
    fn range_share(
        &self,
        input: &LogicalPlan,
        column: &Column,
        value: &ScalarValue,
        below: bool,
    ) -> Option<f64> {
        let stats = self.column_statistics(input, column)?;
        let min = as_number(stats.min_value.get_value()?)?;
        let max = as_number(stats.max_value.get_value()?)?;
        let v = as_number(value)?;
        if max <= min {
            return None;
        }
        let share = ((v - min) / (max - min)).clamp(0.0, 1.0);
        Some(if below { share } else { 1.0 - share })
    }
}

impl OptimizerRule for JoinReorder {
    fn name(&self) -> &str {
        "gyre_join_reorder"
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        if !GyreOptions::of(&config.options()).join_reorder {
            return Ok(Transformed::no(plan));
        }
        self.visit(plan)
    }
}

/// The join, when `plan` is an inner join a group may take apart.
fn group_join(plan: &LogicalPlan) -> Option<&Join> {
    match plan {
        LogicalPlan::Join(j)
            if j.join_type == JoinType::Inner
                && j.join_constraint == JoinConstraint::On
                && j.null_equality == NullEquality::NullEqualsNothing
                && !j.null_aware =>
        {
            Some(j)
        }
        _ => None,
    }
}

/// Whether `plan` is a group's join, or a filter or plain projection over one: a
/// filter over anything else belongs to that input (and to its estimate).
fn leads_to_group_join(plan: &LogicalPlan) -> bool {
    group_join(plan).is_some() || (transparent(plan) && leads_to_group_join(plan.inputs()[0]))
}

/// `plan`, a group as written, with its inputs replaced by `inputs` in the order
/// [`Group::of`] took them out.
fn put_back_inputs(
    plan: LogicalPlan,
    inputs: &mut std::vec::IntoIter<LogicalPlan>,
) -> Result<LogicalPlan> {
    if leads_to_group_join(&plan) {
        return plan
            .map_children(|c| put_back_inputs(c, inputs).map(Transformed::yes))
            .map(|t| t.data);
    }
    inputs
        .next()
        .ok_or_else(|| datafusion::common::internal_datafusion_err!("a group lost an input"))
}

/// A filter or a projection of plain columns: a group sees through it when a join
/// of the group is below.
fn transparent(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Filter(f) => !f.predicate.is_volatile() && !has_subquery(&f.predicate),
        LogicalPlan::Projection(p) => p.expr.iter().all(|e| matches!(e, Expr::Column(_))),
        _ => false,
    }
}

fn has_subquery(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|e| {
        found |= matches!(
            e,
            Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
        );
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

use datafusion::common::tree_node::TreeNode;

fn column_and_literal<'a>(a: &'a Expr, b: &'a Expr) -> Option<(&'a Column, &'a ScalarValue)> {
    match (a, b) {
        (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) => {
            Some((c, v))
        }
        _ => None,
    }
}

fn as_number(v: &ScalarValue) -> Option<f64> {
    if v.is_null() {
        return None;
    }
    Some(match v {
        ScalarValue::Date32(Some(d)) => *d as f64,
        ScalarValue::Date64(Some(d)) => *d as f64,
        ScalarValue::Decimal128(Some(x), _, s) => *x as f64 / 10f64.powi(*s as i32),
        _ => v
            .cast_to(&datafusion::arrow::datatypes::DataType::Float64)
            .ok()
            .and_then(|f| match f {
                ScalarValue::Float64(Some(f)) => Some(f),
                _ => None,
            })?,
    })
}

/// One predicate of a group: its expression, the inputs it reads (a bit each), and
/// whether it was a key pair of a join (then it may key a join again).
struct Predicate {
    expr: Expr,
    inputs: u64,
    key_pair: Option<(Expr, Expr)>,
}

/// The join tree as written: inputs by index.
enum Tree {
    Input(usize),
    Join(Box<Tree>, Box<Tree>),
}

/// A group of inner joins taken apart: its inputs (each with its own groups
/// reordered) and its predicates.
#[derive(Default)]
struct Group {
    inputs: Vec<LogicalPlan>,
    /// Whether reordering changed any input.
    inputs_transformed: bool,
    predicates: Vec<Expr>,
    key_pairs: Vec<(Expr, Expr)>,
    /// Set when something in the group cannot be reordered safely.
    refused: bool,
}

impl Group {
    /// The group whose top join is `plan`, and its shape as written.
    fn of(plan: &LogicalPlan, rule: &JoinReorder) -> Result<(Self, Tree)> {
        let mut group = Self::default();
        let written = group.take_apart(plan, rule)?;
        Ok((group, written))
    }

    fn take_apart(&mut self, plan: &LogicalPlan, rule: &JoinReorder) -> Result<Tree> {
        if let Some(j) = group_join(plan) {
            for (a, b) in &j.on {
                self.key_pairs.push((a.clone(), b.clone()));
            }
            if let Some(f) = &j.filter {
                self.add_predicates(f);
            }
            let left = self.take_apart(&j.left, rule)?;
            let right = self.take_apart(&j.right, rule)?;
            return Ok(Tree::Join(Box::new(left), Box::new(right)));
        }
        if leads_to_group_join(plan) {
            if let LogicalPlan::Filter(f) = plan {
                self.add_predicates(&f.predicate);
            }
            return self.take_apart(plan.inputs()[0], rule);
        }
        // An input: its own joins are reordered on their own.
        let input = rule.visit(plan.clone())?;
        self.inputs_transformed |= input.transformed;
        self.inputs.push(input.data);
        Ok(Tree::Input(self.inputs.len() - 1))
    }

    fn add_predicates(&mut self, e: &Expr) {
        for p in split_conjunction(e) {
            if p.is_volatile() || has_subquery(p) {
                self.refused = true;
            }
            self.predicates.push(p.clone());
        }
    }

    /// The inputs (bits) that read `e`'s columns; `None` when a column is nobody's.
    fn inputs_of(&self, e: &Expr) -> Option<u64> {
        let mut bits = 0u64;
        for c in e.column_refs() {
            let i = self.inputs.iter().position(|p| p.schema().has_column(c))?;
            bits |= 1 << i;
        }
        Some(bits)
    }

    /// The group joined in the greedy order, when that is cheaper enough than the
    /// written order; `None` keeps `plan` as written.
    fn reordered(
        &self,
        plan: &LogicalPlan,
        written: &Tree,
        rule: &JoinReorder,
    ) -> Result<Option<LogicalPlan>> {
        let n = self.inputs.len();
        if self.refused || !(3..=MAX_INPUTS).contains(&n) {
            return Ok(None);
        }
        // Every column must name one input's column only.
        let mut names = std::collections::HashSet::new();
        for input in &self.inputs {
            for (q, f) in input.schema().iter() {
                if !names.insert((q.cloned(), f.name().clone())) {
                    return Ok(None);
                }
            }
        }
        let mut predicates = vec![];
        for (a, b) in &self.key_pairs {
            let expr = a.clone().eq(b.clone());
            let Some(inputs) = self.inputs_of(&expr) else {
                return Ok(None);
            };
            predicates.push(Predicate {
                expr,
                inputs,
                key_pair: Some((a.clone(), b.clone())),
            });
        }
        for e in &self.predicates {
            let Some(inputs) = self.inputs_of(e) else {
                return Ok(None);
            };
            predicates.push(Predicate {
                expr: e.clone(),
                inputs,
                key_pair: None,
            });
        }
        let mut rows = Vec::with_capacity(n);
        for i in &self.inputs {
            match rule.rows(i) {
                Some(r) => rows.push(r),
                None => return Ok(None),
            }
        }
        let estimator = Estimator::new(rule, &self.inputs, &rows, &predicates);
        let written_cost = estimator.cost(written).2;
        let greedy = estimator.greedy();
        let greedy_cost = estimator.cost(&greedy).2;
        tracing::debug!(
            inputs = ?self.inputs.iter().zip(&rows).map(|(p, r)| format!("{} ({r:.0} rows)", describe(p))).collect::<Vec<_>>(),
            written = %estimator.show(written),
            written_cost,
            greedy = %estimator.show(&greedy),
            greedy_cost,
            "join order"
        );
        if greedy_cost * REQUIRED_GAIN > written_cost {
            return Ok(None);
        }
        let mut applied = vec![false; predicates.len()];
        let (joined, _) = self.build(&greedy, &predicates, &mut applied)?;
        // Predicates no join could take (none of the group's columns): on top.
        let rest: Vec<Expr> = predicates
            .iter()
            .zip(&applied)
            .filter(|(_, a)| !**a)
            .map(|(p, _)| p.expr.clone())
            .collect();
        let joined = match conjunction(rest) {
            Some(p) => LogicalPlan::Filter(Filter::try_new(p, Arc::new(joined))?),
            None => joined,
        };
        restore_columns(joined, plan.schema()).map(Some)
    }

    /// `tree` as joins, each join taking the predicates whose inputs it is the first
    /// to hold; returns the plan and its inputs (bits).
    fn build(
        &self,
        tree: &Tree,
        predicates: &[Predicate],
        applied: &mut [bool],
    ) -> Result<(LogicalPlan, u64)> {
        match tree {
            Tree::Input(i) => Ok((self.inputs[*i].clone(), 1 << i)),
            Tree::Join(a, b) => {
                let (left, lbits) = self.build(a, predicates, applied)?;
                let (right, rbits) = self.build(b, predicates, applied)?;
                let both = lbits | rbits;
                let mut on = vec![];
                let mut filters = vec![];
                for (p, done) in predicates.iter().zip(applied.iter_mut()) {
                    if *done || p.inputs & !both != 0 || p.inputs == 0 {
                        continue;
                    }
                    *done = true;
                    let keyed = p.key_pair.as_ref().and_then(|(x, y)| {
                        let (xi, yi) = (self.inputs_of(x)?, self.inputs_of(y)?);
                        let inside = |bits: u64, side: u64| bits != 0 && bits & !side == 0;
                        if inside(xi, lbits) && inside(yi, rbits) {
                            Some((x.clone(), y.clone()))
                        } else if inside(xi, rbits) && inside(yi, lbits) {
                            Some((y.clone(), x.clone()))
                        } else {
                            None
                        }
                    });
                    match keyed {
                        Some(pair) => on.push(pair),
                        None => filters.push(p.expr.clone()),
                    }
                }
                let join = Join::try_new(
                    Arc::new(left),
                    Arc::new(right),
                    on,
                    conjunction(filters),
                    JoinType::Inner,
                    JoinConstraint::On,
                    NullEquality::NullEqualsNothing,
                    false,
                )?;
                Ok((LogicalPlan::Join(join), both))
            }
        }
    }
}

/// Estimates over one group's inputs.
struct Estimator<'a> {
    inputs: &'a [LogicalPlan],
    rows: &'a [f64],
    predicates: &'a [Predicate],
    /// Per predicate: what it keeps as a key equality, `None` for other predicates.
    key_selectivities: Vec<Option<f64>>,
}

impl<'a> Estimator<'a> {
    fn new(
        rule: &JoinReorder,
        inputs: &'a [LogicalPlan],
        rows: &'a [f64],
        predicates: &'a [Predicate],
    ) -> Self {
        let key_selectivities = predicates
            .iter()
            .map(|p| Self::key_selectivity(rule, inputs, rows, p))
            .collect();
        Self {
            inputs,
            rows,
            predicates,
            key_selectivities,
        }
    }

    /// Estimated rows of joining the parts `a` (of `ra` rows) and `b`, and whether a
    /// predicate connects them.
    fn join(&self, a: u64, ra: f64, b: u64, rb: f64) -> (f64, bool) {
        let both = a | b;
        let mut strongest_key = 1.0_f64;
        let mut others = 1.0;
        let mut connected = false;
        for (p, key) in self.predicates.iter().zip(&self.key_selectivities) {
            // Only predicates this join is the first to hold.
            if p.inputs & !both != 0 || p.inputs & !a == 0 || p.inputs & !b == 0 {
                continue;
            }
            connected = true;
            match key {
                Some(s) => strongest_key = strongest_key.min(*s),
                None => others *= JOIN_FILTER_SELECTIVITY,
            }
        }
        ((ra * rb * strongest_key * others).max(1.0), connected)
    }

    /// What `p` keeps when it is an equality of columns of two different inputs.
    fn key_selectivity(
        rule: &JoinReorder,
        inputs: &[LogicalPlan],
        rows: &[f64],
        p: &Predicate,
    ) -> Option<f64> {
        let (x, y) = match &p.key_pair {
            Some((x, y)) => (x, y),
            None => match &p.expr {
                Expr::BinaryExpr(BinaryExpr {
                    left,
                    op: Operator::Eq,
                    right,
                }) => (left.as_ref(), right.as_ref()),
                _ => return None,
            },
        };
        let input = |e: &Expr| match e {
            Expr::Column(c) => inputs.iter().position(|p| p.schema().has_column(c)),
            _ => None,
        };
        let (i, j) = (input(x)?, input(y)?);
        if i == j {
            return None;
        }
        Some(rule.key_selectivity(x, &inputs[i], rows[i], y, &inputs[j], rows[j]))
    }

    /// Estimated rows and sum of intermediate rows (the cost) of `tree`.
    fn cost(&self, tree: &Tree) -> (u64, f64, f64) {
        match tree {
            Tree::Input(i) => (1 << i, self.rows[*i], 0.0),
            Tree::Join(a, b) => {
                let (abits, arows, acost) = self.cost(a);
                let (bbits, brows, bcost) = self.cost(b);
                let (rows, _) = self.join(abits, arows, bbits, brows);
                (abits | bbits, rows, acost + bcost + rows)
            }
        }
    }

    /// `tree` with input numbers and estimated rows, for the debug log.
    fn show(&self, tree: &Tree) -> String {
        match tree {
            Tree::Input(i) => i.to_string(),
            Tree::Join(a, b) => {
                let (_, rows, _) = self.cost(tree);
                format!("({} x {} = {rows:.0})", self.show(a), self.show(b))
            }
        }
    }

    /// Greedy operator ordering: join the connected pair of parts with the smallest
    /// estimated result until one part is left (unconnected parts join last, smallest
    /// first).
    fn greedy(&self) -> Tree {
        let mut parts: Vec<(Tree, u64, f64)> = (0..self.inputs.len())
            .map(|i| (Tree::Input(i), 1 << i, self.rows[i]))
            .collect();
        while parts.len() > 1 {
            let mut best: Option<(usize, usize, f64, bool)> = None;
            for i in 0..parts.len() {
                for j in i + 1..parts.len() {
                    let (rows, connected) =
                        self.join(parts[i].1, parts[i].2, parts[j].1, parts[j].2);
                    let better = match best {
                        None => true,
                        Some((_, _, r, c)) => (connected, -rows) > (c, -r),
                    };
                    if better {
                        best = Some((i, j, rows, connected));
                    }
                }
            }
            let (i, j, rows, _) = best.expect("two parts make a pair");
            let (b, bbits, _) = parts.remove(j);
            let (a, abits, _) = parts.remove(i);
            parts.push((Tree::Join(Box::new(a), Box::new(b)), abits | bbits, rows));
        }
        parts.pop().expect("one part").0
    }
}

/// The tables under `plan`, for the debug log.
fn describe(plan: &LogicalPlan) -> String {
    let mut names = vec![];
    let _ = plan.apply(|p| {
        if let LogicalPlan::TableScan(s) = p {
            names.push(s.table_name.to_string());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    names.join("+")
}

/// `plan` projected onto the columns of `schema`, in its order.
fn restore_columns(plan: LogicalPlan, schema: &DFSchemaRef) -> Result<LogicalPlan> {
    let exprs = schema
        .iter()
        .map(|(q, f)| Expr::Column(Column::from((q, f.as_ref()))))
        .collect::<Vec<_>>();
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(plan),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::stats::Precision;
    use datafusion::logical_expr::{LogicalPlanBuilder, LogicalTableSource, col, lit};
    use datafusion::optimizer::OptimizerContext;
    use std::collections::HashMap;

    /// A table: name, rows, and its columns with their distinct values.
    type TableSpec<'a> = (&'a str, usize, &'a [(&'a str, usize)]);

    fn tables(specs: &[TableSpec<'_>]) -> (HashMap<String, LogicalPlanBuilder>, TableStatistics) {
        let mut scans = HashMap::new();
        let mut stats = HashMap::new();
        for (name, rows, columns) in specs {
            let schema = Schema::new(
                columns
                    .iter()
                    .map(|(c, _)| Field::new(*c, DataType::Int64, false))
                    .collect::<Vec<_>>(),
            );
            let mut s = Statistics::new_unknown(&schema).with_num_rows(Precision::Exact(*rows));
            for (i, (_, distinct)) in columns.iter().enumerate() {
                s.column_statistics[i].distinct_count = Precision::Inexact(*distinct);
            }
            stats.insert(name.to_string(), s);
            let source = Arc::new(LogicalTableSource::new(Arc::new(schema)));
            scans.insert(
                name.to_string(),
                LogicalPlanBuilder::scan(*name, source, None).unwrap(),
            );
        }
        let lookup: TableStatistics =
            Arc::new(move |scan: &TableScan| stats.get(scan.table_name.table()).cloned());
        (scans, lookup)
    }

    fn reorder(plan: LogicalPlan, stats: TableStatistics) -> (LogicalPlan, bool) {
        let t = JoinReorder::new(stats)
            .rewrite(plan, &OptimizerContext::new())
            .unwrap();
        (t.data, t.transformed)
    }

    /// The tables below `plan`.
    fn tables_under(plan: &LogicalPlan) -> Vec<String> {
        let mut names = vec![];
        plan.apply(|p| {
            if let LogicalPlan::TableScan(s) = p {
                names.push(s.table_name.table().to_string());
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .unwrap();
        names.sort();
        names
    }

    /// The tables under both inputs of `join`, sorted.
    fn tables_below(join: &Join) -> Vec<String> {
        let mut names = tables_under(&join.left);
        names.extend(tables_under(&join.right));
        names.sort();
        names
    }

    /// The join whose keys include `column`.
    fn join_on(plan: &LogicalPlan, column: &str) -> Join {
        let mut found = None;
        plan.apply(|p| {
            if let LogicalPlan::Join(j) = p
                && j.on.iter().any(|(a, b)| {
                    [a, b]
                        .iter()
                        .any(|e| e.column_refs().iter().any(|c| c.name == column))
                })
            {
                found = Some(j.clone());
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })
        .unwrap();
        found.unwrap_or_else(|| panic!("no join on {column} in\n{plan}"))
    }

    /// TPC-DS q72's shape: sales joins a large stock table on the item before the
    /// selective dimensions. Reordered, the dimensions come first and stock last.
    #[test]
    fn selective_joins_come_before_the_large_intermediate() {
        let (scans, stats) = tables(&[
            (
                "sales",
                1_400_000,
                &[
                    ("s_item", 18_000),
                    ("s_day", 1800),
                    ("s_cust", 1_900_000),
                    ("s_qty", 100),
                ],
            ),
            (
                "stock",
                11_700_000,
                &[("st_item", 18_000), ("st_qty", 1000)],
            ),
            ("day", 73_000, &[("d_day", 73_000), ("d_year", 200)]),
            ("cust", 1_900_000, &[("c_id", 1_900_000), ("c_flag", 5)]),
        ]);
        let scan = |n: &str| scans[n].clone();
        let written = scan("sales")
            .join(
                scan("stock").build().unwrap(),
                JoinType::Inner,
                (vec!["s_item"], vec!["st_item"]),
                Some(col("st_qty").lt(col("s_qty"))),
            )
            .unwrap()
            .join(
                scan("day")
                    .filter(col("d_year").eq(lit(1999i64)))
                    .unwrap()
                    .build()
                    .unwrap(),
                JoinType::Inner,
                (vec!["s_day"], vec!["d_day"]),
                None,
            )
            .unwrap()
            .join(
                scan("cust")
                    .filter(col("c_flag").eq(lit(3i64)))
                    .unwrap()
                    .build()
                    .unwrap(),
                JoinType::Inner,
                (vec!["s_cust"], vec!["c_id"]),
                None,
            )
            .unwrap()
            .build()
            .unwrap();
        let (plan, changed) = reorder(written.clone(), Arc::clone(&stats));
        assert!(changed, "{plan}");
        assert_eq!(
            plan.schema(),
            written.schema(),
            "the columns stay as written"
        );
        let stock = join_on(&plan, "st_item");
        assert_eq!(
            tables_below(&stock).len(),
            4,
            "stock is joined last:\n{plan}"
        );
        // The join filter of the written stock join stays with it.
        assert!(stock.filter.is_some(), "{plan}");
        // Each pass of the optimiser sees the same order again.
        let (again, _) = reorder(plan.clone(), stats);
        assert_eq!(
            format!("{}", join_on(&again, "st_item").left.display_indent()),
            format!("{}", stock.left.display_indent())
        );
    }

    /// TPC-DS q84's shape: a filter on one input (a city out of a thousand) makes its
    /// join the most selective; the filter stays in that input's estimate.
    #[test]
    fn an_inputs_own_filter_counts_in_its_estimate() {
        let (scans, stats) = tables(&[
            ("c", 100_000, &[("c_addr", 50_000), ("c_demo", 100_000)]),
            ("ca", 50_000, &[("ca_id", 50_000), ("ca_city", 1000)]),
            ("cd", 1_900_000, &[("cd_id", 1_900_000)]),
        ]);
        let scan = |n: &str| scans[n].clone();
        let written = scan("c")
            .join(
                scan("cd").build().unwrap(),
                JoinType::Inner,
                (vec!["c_demo"], vec!["cd_id"]),
                None,
            )
            .unwrap()
            .join(
                scan("ca")
                    .filter(col("ca_city").eq(lit(7i64)))
                    .unwrap()
                    .build()
                    .unwrap(),
                JoinType::Inner,
                (vec!["c_addr"], vec!["ca_id"]),
                None,
            )
            .unwrap()
            .build()
            .unwrap();
        let (plan, changed) = reorder(written, stats);
        assert!(changed, "{plan}");
        let cd = join_on(&plan, "cd_id");
        assert_eq!(
            tables_below(&cd),
            vec!["c", "ca", "cd"],
            "the filtered join first:\n{plan}"
        );
        // The filter stays on its input.
        let ca = join_on(&plan, "ca_id");
        assert!(
            [&ca.left, &ca.right]
                .iter()
                .any(|p| matches!(p.as_ref(), LogicalPlan::Filter(_))),
            "{plan}"
        );
    }

    /// A written order about as cheap as the greedy one is kept, and so is a group
    /// with an input whose size is unknown.
    #[test]
    fn good_or_unknown_orders_stay_as_written() {
        let (scans, stats) = tables(&[
            ("f", 1_000_000, &[("f_a", 1000), ("f_b", 1000)]),
            ("a", 1000, &[("a_id", 1000)]),
            ("b", 1000, &[("b_id", 1000)]),
        ]);
        let scan = |n: &str| scans[n].clone();
        let star = |f: LogicalPlanBuilder| {
            f.join(
                scan("a").build().unwrap(),
                JoinType::Inner,
                (vec!["f_a"], vec!["a_id"]),
                None,
            )
            .unwrap()
            .join(
                scan("b").build().unwrap(),
                JoinType::Inner,
                (vec!["f_b"], vec!["b_id"]),
                None,
            )
            .unwrap()
            .build()
            .unwrap()
        };
        let (_, changed) = reorder(star(scan("f")), Arc::clone(&stats));
        assert!(!changed);
        let unknown = LogicalPlanBuilder::scan(
            "u",
            Arc::new(LogicalTableSource::new(Arc::new(Schema::new(vec![
                Field::new("f_a", DataType::Int64, false),
                Field::new("f_b", DataType::Int64, false),
            ])))),
            None,
        )
        .unwrap();
        let (_, changed) = reorder(star(unknown), stats);
        assert!(!changed);
    }

    #[test]
    fn predicates_estimate_from_distinct_counts_and_ranges() {
        let schema = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let mut s = Statistics::new_unknown(&schema).with_num_rows(Precision::Exact(1000));
        s.column_statistics[0].distinct_count = Precision::Inexact(100);
        s.column_statistics[0].min_value = Precision::Inexact(ScalarValue::Int64(Some(0)));
        s.column_statistics[0].max_value = Precision::Inexact(ScalarValue::Int64(Some(1000)));
        let stats: TableStatistics = Arc::new(move |_: &TableScan| Some(s.clone()));
        let rule = JoinReorder::new(stats);
        let scan = LogicalPlanBuilder::scan(
            "t",
            Arc::new(LogicalTableSource::new(Arc::new(schema))),
            None,
        )
        .unwrap()
        .build()
        .unwrap();
        let rows = |p: Expr| {
            let plan = LogicalPlanBuilder::from(scan.clone())
                .filter(p)
                .unwrap()
                .build()
                .unwrap();
            rule.rows(&plan).unwrap()
        };
        let near = |p: Expr, want: f64| {
            let got = rows(p.clone());
            assert!((got - want).abs() < 1e-6, "{p}: {got} rows, not {want}");
        };
        near(col("x").eq(lit(5i64)), 10.0);
        near(col("x").in_list(vec![lit(1i64), lit(2i64)], false), 20.0);
        near(col("x").lt(lit(250i64)), 250.0);
        near(lit(250i64).lt(col("x")), 750.0);
        near(col("x").between(lit(100i64), lit(300i64)), 200.0);
        near(col("x").eq(lit(5i64)).or(col("x").eq(lit(6i64))), 19.9);
    }
}
