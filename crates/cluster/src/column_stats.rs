//! Column statistics of stored tables, for the planner's estimates.
//!
//! DataFusion estimates join and filter cardinalities from each column's
//! minimum, maximum, null count and number of distinct values. Without them a
//! join of two large inputs looks no larger than its smaller input, and the
//! planner builds a hash table on millions of rows to probe it with a dozen
//! (TPC-H Q18's semi join), or broadcasts what it should repartition.
//!
//! Each worker keeps a [`ColumnSketch`] per column of its part of a table,
//! extended with the rows each committed statement adds: the null count, the
//! states of DataFusion's `min` and `max` accumulators (for numbers, times and
//! booleans: a range of strings serves few estimates and costs the most to
//! keep), and the state of its `approx_distinct` accumulator (a HyperLogLog).
//! The coordinator merges the parts' sketches into table-wide figures with the
//! same accumulators. Sketches travel as compressed protobuf scalars and are
//! checked when decoded: one that does not decode or merge leaves its figure
//! unknown and never fails a statement.
//!
//! Every figure is reported as inexact: DataFusion answers `MIN`, `MAX` and
//! `COUNT` from exact statistics without reading the table, and a plan may run
//! after other statements changed it.

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, Result, ScalarValue, internal_datafusion_err};
use datafusion::functions_aggregate::approx_distinct::approx_distinct_udaf;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{Accumulator, AggregateUDF};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion_proto::protobuf;
use prost::Message;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The statistics kept per column, in the order of [`ColumnSketch::states`].
#[derive(Debug, Clone, Copy)]
enum Figure {
    Min,
    Max,
    Distinct,
}

const FIGURES: [Figure; 3] = [Figure::Min, Figure::Max, Figure::Distinct];

impl Figure {
    fn udaf(self) -> Arc<AggregateUDF> {
        match self {
            Figure::Min => min_udaf(),
            Figure::Max => max_udaf(),
            Figure::Distinct => approx_distinct_udaf(),
        }
    }

    /// A fresh accumulator of this figure for values of `data_type`; `None` where
    /// DataFusion has none for that type.
    fn accumulator(self, data_type: &DataType) -> Option<Box<dyn Accumulator>> {
        // Ranges of strings and nested values help few estimates, and comparing
        // every long string costs more than the rest of the sketch.
        if matches!(self, Figure::Min | Figure::Max)
            && !(data_type.is_primitive() || *data_type == DataType::Boolean)
        {
            return None;
        }
        // Types of at most 16 bits count distinct values exactly, in a state whose
        // merge does not check its input; their few values need no estimate.
        if matches!(self, Figure::Distinct)
            && matches!(
                data_type,
                DataType::Boolean
                    | DataType::Int8
                    | DataType::UInt8
                    | DataType::Int16
                    | DataType::UInt16
            )
        {
            return None;
        }
        let field = Arc::new(Field::new("v", data_type.clone(), true));
        let schema = Schema::new(vec![Arc::clone(&field)]);
        let exprs: [Arc<dyn PhysicalExpr>; 1] = [Arc::new(Column::new("v", 0))];
        let udaf = self.udaf();
        let return_field = udaf.return_field(&[Arc::clone(&field)]).ok()?;
        udaf.accumulator(AccumulatorArgs {
            return_field,
            schema: &schema,
            ignore_nulls: false,
            order_bys: &[],
            is_reversed: false,
            name: "v",
            is_distinct: false,
            exprs: &exprs,
            expr_fields: &[field],
        })
        .ok()
    }
}

/// What a worker knows about one column of its part of a table, in a form that
/// merges with other parts' sketches of the same column.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnSketch {
    pub nulls: u64,
    /// The accumulator state of each [`Figure`], each scalar protobuf-encoded and
    /// LZ4-compressed; `None` when the figure is unknown for this column.
    states: [Option<Vec<Vec<u8>>>; 3],
}

/// The largest encoded state value accepted: a HyperLogLog's 2^14 registers plus
/// the protobuf framing. Compressed, a sketch of few values takes some 100 bytes.
const MAX_STATE_VALUE: usize = 20 << 10;

fn encode(state: &[ScalarValue]) -> Option<Vec<Vec<u8>>> {
    state
        .iter()
        .map(|s| {
            let proto = protobuf::ScalarValue::try_from(s).ok()?.encode_to_vec();
            (proto.len() <= MAX_STATE_VALUE).then(|| lz4_flex::block::compress(&proto))
        })
        .collect()
}

/// The highest HyperLogLog register value of DataFusion's `approx_distinct`
/// (64 hash bits, 14 of them the register index, plus one).
const HLL_MAX_REGISTER: u8 = 51;
const HLL_REGISTERS: usize = 1 << 14;

/// Decodes an accumulator state that came over the network, as arrays for
/// `merge_batch`, after checking that it has the shape a fresh accumulator's
/// state has: DataFusion's accumulators index and size by their input unchecked.
fn decode(figure: Figure, data_type: &DataType, state: &[Vec<u8>]) -> Result<Vec<ArrayRef>> {
    let bad = |why: String| internal_datafusion_err!("bad column statistics: {why}");
    let template = figure
        .accumulator(data_type)
        .ok_or_else(|| bad(format!("no {figure:?} for {data_type}")))?
        .state()?;
    if template.len() != state.len() {
        return Err(bad(format!(
            "{} state values, not {}",
            state.len(),
            template.len()
        )));
    }
    state
        .iter()
        .zip(&template)
        .map(|(bytes, expected)| {
            let proto = lz4_flex::block::decompress(bytes, MAX_STATE_VALUE)
                .map_err(|e| bad(e.to_string()))?;
            let proto =
                protobuf::ScalarValue::decode(proto.as_slice()).map_err(|e| bad(e.to_string()))?;
            let scalar = ScalarValue::try_from(&proto).map_err(|e| bad(e.to_string()))?;
            if scalar.data_type() != expected.data_type() {
                return Err(bad(format!(
                    "a {} state value, not {}",
                    scalar.data_type(),
                    expected.data_type()
                )));
            }
            if let (Figure::Distinct, ScalarValue::Binary(registers)) = (figure, &scalar) {
                let registers = registers.as_deref().unwrap_or_default();
                if registers.len() != HLL_REGISTERS
                    || registers.iter().any(|&r| r > HLL_MAX_REGISTER)
                {
                    return Err(bad("not a HyperLogLog of 2^14 registers".into()));
                }
            }
            scalar.to_array()
        })
        .collect()
}

impl ColumnSketch {
    /// The sketch of column `column` (of type `data_type`) over `batches`.
    pub fn of(batches: &[RecordBatch], column: usize, data_type: &DataType) -> Self {
        let mut nulls = 0;
        let mut states = [None, None, None];
        for (slot, figure) in states.iter_mut().zip(FIGURES) {
            let Some(mut acc) = figure.accumulator(data_type) else {
                continue;
            };
            let updated = batches
                .iter()
                .try_for_each(|b| acc.update_batch(&[Arc::clone(b.column(column))]));
            if updated.is_ok() {
                *slot = acc.state().ok().and_then(|s| encode(&s));
            }
        }
        for b in batches {
            nulls += b.column(column).null_count() as u64;
        }
        Self { nulls, states }
    }

    /// Adds `other`'s rows (a sketch of the same column) to this sketch. A figure
    /// either side does not know, or that does not merge, becomes unknown.
    pub fn merge(&mut self, other: &ColumnSketch, data_type: &DataType) {
        self.nulls = self.nulls.saturating_add(other.nulls);
        for (i, figure) in FIGURES.into_iter().enumerate() {
            let merged = match (&self.states[i], &other.states[i]) {
                (Some(a), Some(b)) => merge_states(figure, data_type, a, b),
                _ => None,
            };
            self.states[i] = merged;
        }
    }
}

/// DataFusion's statistics (every figure inexact) of a column over the rows of
/// all `sketches`: each figure's
/// states go into one accumulator, evaluated once. A figure some sketch does not
/// know, or whose state does not decode or merge, is unknown.
fn statistics_of(sketches: &[&ColumnSketch], data_type: &DataType) -> ColumnStatistics {
    let value = |i: usize| -> Option<ScalarValue> {
        let mut acc = FIGURES[i].accumulator(data_type)?;
        for sketch in sketches {
            let state = sketch.states[i].as_ref()?;
            acc.merge_batch(&decode(FIGURES[i], data_type, state).ok()?)
                .ok()?;
        }
        acc.evaluate().ok().filter(|v| !v.is_null())
    };
    let inexact = |v: Option<ScalarValue>| v.map_or(Precision::Absent, Precision::Inexact);
    let distinct = match value(2) {
        Some(ScalarValue::UInt64(Some(n))) => Precision::Inexact(n as usize),
        _ => Precision::Absent,
    };
    let nulls = sketches.iter().fold(0u64, |n, s| n.saturating_add(s.nulls));
    ColumnStatistics {
        null_count: Precision::Inexact(nulls as usize),
        min_value: inexact(value(0)),
        max_value: inexact(value(1)),
        distinct_count: distinct,
        ..ColumnStatistics::new_unknown()
    }
}

fn merge_states(
    figure: Figure,
    data_type: &DataType,
    a: &[Vec<u8>],
    b: &[Vec<u8>],
) -> Option<Vec<Vec<u8>>> {
    let mut acc = figure.accumulator(data_type)?;
    acc.merge_batch(&decode(figure, data_type, a).ok()?).ok()?;
    acc.merge_batch(&decode(figure, data_type, b).ok()?).ok()?;
    encode(&acc.state().ok()?)
}

/// The sketches of every column of `batches` (rows of a table of `schema`).
pub fn sketch_columns(batches: &[RecordBatch], schema: &Schema) -> Vec<ColumnSketch> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| ColumnSketch::of(batches, i, f.data_type()))
        .collect()
}

/// Table-wide column statistics from the sketches of every part; a column whose
/// parts' sketches are missing has unknown statistics.
pub fn merge_parts<'a>(
    parts: impl Iterator<Item = &'a [ColumnSketch]> + Clone,
    schema: &Schema,
) -> Vec<ColumnStatistics> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(
            |(i, f)| match parts.clone().map(|p| p.get(i)).collect::<Option<Vec<_>>>() {
                Some(sketches) if !sketches.is_empty() => statistics_of(&sketches, f.data_type()),
                _ => ColumnStatistics::new_unknown(),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Date32Array, Int64Array, StringArray};

    fn batch(keys: Vec<Option<i64>>, names: Vec<&str>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn parts_merge_into_table_wide_figures() {
        // Two parts with overlapping strings and disjoint keys, one with a null.
        let a = batch((0..1000).map(Some).collect(), vec!["x"; 1000]);
        let b1 = batch((1000..3000).map(Some).collect(), vec!["y"; 2000]);
        let b2 = batch(vec![None, Some(-5)], vec!["x", "z"]);
        let schema = a.schema();
        let part_a = sketch_columns(&[a], &schema);
        // The second part grows by two commits, merged as a worker merges them.
        let mut part_b = sketch_columns(&[b1], &schema);
        for (i, extra) in sketch_columns(&[b2], &schema).iter().enumerate() {
            part_b[i].merge(extra, schema.field(i).data_type());
        }
        let stats = merge_parts([part_a.as_slice(), part_b.as_slice()].into_iter(), &schema);
        let k = &stats[0];
        assert_eq!(k.null_count, Precision::Inexact(1));
        assert_eq!(
            k.min_value,
            Precision::Inexact(ScalarValue::Int64(Some(-5)))
        );
        assert_eq!(
            k.max_value,
            Precision::Inexact(ScalarValue::Int64(Some(2999)))
        );
        let Precision::Inexact(n) = k.distinct_count else {
            panic!("no distinct count: {k:?}");
        };
        assert!(
            (2900..=3100).contains(&n),
            "about 3001 distinct keys, got {n}"
        );
        let s = &stats[1];
        assert_eq!(s.distinct_count, Precision::Inexact(3));
        assert_eq!(s.min_value, Precision::Absent, "strings keep no range");
    }

    #[test]
    fn a_small_parts_sketch_is_small() {
        let schema = Schema::new(vec![Field::new("k", DataType::Int64, false)]);
        let rows = RecordBatch::try_new(
            Arc::new(schema.clone()),
            vec![Arc::new(Int64Array::from(vec![42]))],
        )
        .unwrap();
        let sketch = sketch_columns(&[rows], &schema);
        let bytes = postcard::to_allocvec(&sketch).unwrap().len();
        assert!(bytes < 400, "a one-row sketch takes {bytes} bytes");
    }

    #[test]
    fn an_empty_part_knows_nothing_but_merges() {
        let schema = Schema::new(vec![Field::new("d", DataType::Date32, false)]);
        let empty = sketch_columns(&[], &schema);
        let stats = merge_parts([empty.as_slice()].into_iter(), &schema);
        assert_eq!(stats[0].min_value, Precision::Absent);
        assert_eq!(stats[0].distinct_count, Precision::Inexact(0));
        let rows = RecordBatch::try_new(
            Arc::new(schema.clone()),
            vec![Arc::new(Date32Array::from(vec![10, 20, 10]))],
        )
        .unwrap();
        let full = sketch_columns(&[rows], &schema);
        let stats = merge_parts([empty.as_slice(), full.as_slice()].into_iter(), &schema);
        assert_eq!(
            stats[0].min_value,
            Precision::Inexact(ScalarValue::Date32(Some(10)))
        );
        assert_eq!(stats[0].distinct_count, Precision::Inexact(2));
    }

    /// `encoded` (a protobuf Binary scalar of HyperLogLog registers) with one register
    /// set beyond what any hash yields.
    fn garbled(encoded: &[u8]) -> Vec<u8> {
        let proto = lz4_flex::block::decompress(encoded, MAX_STATE_VALUE).unwrap();
        let proto = protobuf::ScalarValue::decode(proto.as_slice()).unwrap();
        let ScalarValue::Binary(Some(mut registers)) = ScalarValue::try_from(&proto).unwrap()
        else {
            panic!("not a binary state");
        };
        registers[7] = 200;
        let proto = protobuf::ScalarValue::try_from(&ScalarValue::Binary(Some(registers)))
            .unwrap()
            .encode_to_vec();
        lz4_flex::block::compress(&proto)
    }

    #[test]
    fn a_garbled_sketch_leaves_the_figure_unknown() {
        let schema = Schema::new(vec![Field::new("k", DataType::Int64, false)]);
        let rows = RecordBatch::try_new(
            Arc::new(schema.clone()),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let good = sketch_columns(&[rows], &schema);
        let mut bad = good.clone();
        bad[0].states[2] = Some(vec![vec![0xff, 0x01, 0x02]]);
        bad[0].states[0] = Some(vec![]);
        // A state of the right type and length whose registers no hash can produce.
        let mut registers = garbled(&good[0].states[2].as_ref().unwrap()[0]);
        let stats = {
            let mut odd = good.clone();
            odd[0].states[2] = Some(vec![std::mem::take(&mut registers)]);
            merge_parts([odd.as_slice()].into_iter(), &schema)
        };
        assert_eq!(stats[0].distinct_count, Precision::Absent);
        let stats = merge_parts([good.as_slice(), bad.as_slice()].into_iter(), &schema);
        assert_eq!(stats[0].distinct_count, Precision::Absent);
        assert_eq!(stats[0].min_value, Precision::Absent);
        assert_eq!(
            stats[0].max_value,
            Precision::Inexact(ScalarValue::Int64(Some(3)))
        );
        // A part from a worker that reports fewer columns than the table has.
        let stats = merge_parts([good.as_slice(), &[]].into_iter(), &schema);
        assert_eq!(stats[0], ColumnStatistics::new_unknown());
    }
}
