//! Rows to Arrow record batches and back.
//!
//! Checkpoints write tables as Parquet through these batches, queries read the row
//! store through them, and batches read back from a file are checked row by row like
//! any row a transaction writes.

use crate::error::{Error, Result};
use crate::store::TableDef;
use crate::value::{Column, ColumnType, Value, schema_of};
use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder, Float64Builder, Int8Builder,
    Int16Builder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
    TimestampMicrosecondBuilder, TimestampMillisecondBuilder, TimestampNanosecondBuilder,
    TimestampSecondBuilder, UInt8Builder, UInt16Builder, UInt32Builder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use std::sync::Arc;

/// One record batch of `rows` (each already checked against `columns`).
pub fn to_batch<'r>(
    columns: &[Column],
    rows: impl Iterator<Item = &'r [Value]> + Clone,
) -> RecordBatch {
    let schema = schema_of(columns);
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| column(c.column_type, rows.clone().map(|r| &r[i])))
        .collect();
    let n = rows.count();
    RecordBatch::try_new_with_options(
        schema,
        arrays,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(n)),
    )
    .expect("columns built from the table's own types")
}

/// Builders are sized up front: a secondary seals 64K rows at a time, and growing
/// them copied each column several times.
macro_rules! build {
    ($builder:ty, $values:expr, $variant:ident, $conv:expr) => {{
        let mut b = <$builder>::with_capacity($values.size_hint().0);
        for v in $values {
            match v {
                Value::$variant(x) => b.append_value($conv(x)),
                _ => b.append_null(),
            }
        }
        Arc::new(b.finish()) as ArrayRef
    }};
}

fn column<'r>(t: ColumnType, values: impl Iterator<Item = &'r Value>) -> ArrayRef {
    match t {
        ColumnType::Bool => build!(BooleanBuilder, values, Bool, |x: &bool| *x),
        ColumnType::Int8 => build!(Int8Builder, values, Int, |x: &i64| *x as i8),
        ColumnType::Int16 => build!(Int16Builder, values, Int, |x: &i64| *x as i16),
        ColumnType::Int32 => build!(Int32Builder, values, Int, |x: &i64| *x as i32),
        ColumnType::Int64 => build!(Int64Builder, values, Int, |x: &i64| *x),
        ColumnType::UInt8 => build!(UInt8Builder, values, Int, |x: &i64| *x as u8),
        ColumnType::UInt16 => build!(UInt16Builder, values, Int, |x: &i64| *x as u16),
        ColumnType::UInt32 => build!(UInt32Builder, values, Int, |x: &i64| *x as u32),
        ColumnType::Float32 => build!(Float32Builder, values, Float, |x: &f64| *x as f32),
        ColumnType::Float64 => build!(Float64Builder, values, Float, |x: &f64| *x),
        ColumnType::Decimal { precision, scale } => {
            let mut b = Decimal128Builder::with_capacity(values.size_hint().0);
            for v in values {
                match v {
                    Value::Decimal(x) => b.append_value(*x),
                    _ => b.append_null(),
                }
            }
            Arc::new(
                b.finish()
                    .with_precision_and_scale(precision, scale)
                    .expect("the column's own precision and scale"),
            )
        }
        ColumnType::Date => build!(Date32Builder, values, Date, |x: &i32| *x),
        ColumnType::Timestamp { digits, utc } => {
            let tz: Option<Arc<str>> = utc.then(|| "UTC".into());
            match digits {
                0 => {
                    let a = build!(TimestampSecondBuilder, values, Timestamp, |x: &i64| *x);
                    retz(a, tz)
                }
                3 => {
                    let a = build!(TimestampMillisecondBuilder, values, Timestamp, |x: &i64| *x);
                    retz(a, tz)
                }
                6 => {
                    let a = build!(TimestampMicrosecondBuilder, values, Timestamp, |x: &i64| *x);
                    retz(a, tz)
                }
                _ => {
                    let a = build!(TimestampNanosecondBuilder, values, Timestamp, |x: &i64| *x);
                    retz(a, tz)
                }
            }
        }
        ColumnType::Text => {
            let values: Vec<&Value> = values.collect();
            let bytes = values.iter().map(|v| v.as_text().map_or(0, str::len)).sum();
            let mut b = StringBuilder::with_capacity(values.len(), bytes);
            for v in values {
                match v {
                    Value::Text(x) => b.append_value(x),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        ColumnType::IntList => {
            let mut b = ListBuilder::with_capacity(Int64Builder::new(), values.size_hint().0);
            for v in values {
                match v {
                    Value::IntList(x) => b.append_value(x.iter().map(|i| Some(*i))),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
    }
}

/// Gives a timestamp array the column's time zone.
fn retz(array: ArrayRef, tz: Option<Arc<str>>) -> ArrayRef {
    let data_type = match array.data_type() {
        arrow_schema::DataType::Timestamp(unit, _) => arrow_schema::DataType::Timestamp(*unit, tz),
        other => other.clone(),
    };
    let data = array.into_data().into_builder().data_type(data_type);
    arrow_array::make_array(data.build().expect("same layout, other time zone"))
}

/// The rows of a batch whose columns have the table's types, each checked against the
/// table's rules.
pub fn from_batch(def: &TableDef, batch: &RecordBatch) -> Result<Vec<Vec<Value>>> {
    let rows = values_of(&def.name, &def.columns, batch)?;
    for row in &rows {
        def.check_row(row)?;
    }
    Ok(rows)
}

/// The rows of a batch of the columns queries see (all but a row id), each value
/// checked against its column: rows to insert, or rows a statement read back.
pub fn from_visible_batch(def: &TableDef, batch: &RecordBatch) -> Result<Vec<Vec<Value>>> {
    let columns = def.visible_columns();
    let rows = values_of(&def.name, columns, batch)?;
    for row in &rows {
        for (c, v) in columns.iter().zip(row) {
            c.check(v)
                .map_err(|e| Error::Constraint(format!("{}.{}: {e}", def.name, c.name)))?;
        }
    }
    Ok(rows)
}

fn values_of(table: &str, columns: &[Column], batch: &RecordBatch) -> Result<Vec<Vec<Value>>> {
    if batch.num_columns() != columns.len() {
        return Err(Error::Constraint(format!(
            "{table} has {} columns, the data {}",
            columns.len(),
            batch.num_columns()
        )));
    }
    let mut rows: Vec<Vec<Value>> = (0..batch.num_rows())
        .map(|_| Vec::with_capacity(columns.len()))
        .collect();
    for (c, array) in columns.iter().zip(batch.columns()) {
        if array.data_type() != &c.column_type.data_type() {
            return Err(Error::Constraint(format!(
                "{table}.{} is {:?}, the data {}",
                c.name,
                c.column_type,
                array.data_type()
            )));
        }
        for (i, row) in rows.iter_mut().enumerate() {
            row.push(value_at(c.column_type, array.as_ref(), i));
        }
    }
    Ok(rows)
}

/// The value in row `i` of `a`, an array of type `t`'s Arrow type. A list with a NULL
/// element is NULL as a whole: list elements may not be NULL.
pub fn value_at(t: ColumnType, a: &dyn Array, i: usize) -> Value {
    if a.is_null(i) {
        return Value::Null;
    }
    match t {
        ColumnType::Bool => Value::Bool(a.as_boolean().value(i)),
        ColumnType::Int8 => Value::Int(a.as_primitive::<Int8Type>().value(i).into()),
        ColumnType::Int16 => Value::Int(a.as_primitive::<Int16Type>().value(i).into()),
        ColumnType::Int32 => Value::Int(a.as_primitive::<Int32Type>().value(i).into()),
        ColumnType::Int64 => Value::Int(a.as_primitive::<Int64Type>().value(i)),
        ColumnType::UInt8 => Value::Int(a.as_primitive::<UInt8Type>().value(i).into()),
        ColumnType::UInt16 => Value::Int(a.as_primitive::<UInt16Type>().value(i).into()),
        ColumnType::UInt32 => Value::Int(a.as_primitive::<UInt32Type>().value(i).into()),
        ColumnType::Float32 => Value::Float(a.as_primitive::<Float32Type>().value(i).into()),
        ColumnType::Float64 => Value::Float(a.as_primitive::<Float64Type>().value(i)),
        ColumnType::Decimal { .. } => Value::Decimal(a.as_primitive::<Decimal128Type>().value(i)),
        ColumnType::Date => Value::Date(a.as_primitive::<Date32Type>().value(i)),
        ColumnType::Timestamp { digits, .. } => Value::Timestamp(match digits {
            0 => a.as_primitive::<TimestampSecondType>().value(i),
            3 => a.as_primitive::<TimestampMillisecondType>().value(i),
            6 => a.as_primitive::<TimestampMicrosecondType>().value(i),
            _ => a.as_primitive::<TimestampNanosecondType>().value(i),
        }),
        ColumnType::Text => Value::Text(a.as_string::<i32>().value(i).into()),
        ColumnType::IntList => {
            let items = a.as_list::<i32>().value(i);
            if items.null_count() > 0 {
                return Value::Null;
            }
            Value::IntList(items.as_primitive::<Int64Type>().values().to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TableId;

    #[test]
    fn every_type_round_trips() {
        let types = [
            ColumnType::Bool,
            ColumnType::Int8,
            ColumnType::Int16,
            ColumnType::Int32,
            ColumnType::Int64,
            ColumnType::UInt8,
            ColumnType::UInt16,
            ColumnType::UInt32,
            ColumnType::Float32,
            ColumnType::Float64,
            ColumnType::Decimal {
                precision: 12,
                scale: 2,
            },
            ColumnType::Date,
            ColumnType::Timestamp {
                digits: 6,
                utc: true,
            },
            ColumnType::Timestamp {
                digits: 0,
                utc: false,
            },
            ColumnType::Text,
            ColumnType::IntList,
        ];
        let mut columns = vec![Column::new("k", ColumnType::Int64, false)];
        columns.extend(
            types
                .iter()
                .enumerate()
                .map(|(i, t)| Column::new(format!("c{i}"), *t, true)),
        );
        let def = TableDef {
            id: TableId(0),
            name: "t".into(),
            columns,
            key: vec![0],
            placement: Default::default(),
        };
        let sample = |t: ColumnType, k: i64| match t {
            ColumnType::Bool => Value::Bool(k % 2 == 0),
            ColumnType::Float32 | ColumnType::Float64 => Value::Float(k as f64 / 4.0),
            ColumnType::Decimal { .. } => Value::Decimal(k as i128 * 101),
            ColumnType::Date => Value::Date(k as i32),
            ColumnType::Timestamp { .. } => Value::Timestamp(k * 1000),
            ColumnType::Text => Value::Text(format!("v{k}").into()),
            ColumnType::IntList => Value::IntList((0..k % 4).collect()),
            _ => Value::Int(k % 100),
        };
        let rows: Vec<Vec<Value>> = (0..50)
            .map(|k| {
                let mut r = vec![Value::Int(k)];
                r.extend(types.iter().map(|t| {
                    if k % 7 == 3 {
                        Value::Null
                    } else {
                        sample(*t, k)
                    }
                }));
                r
            })
            .collect();
        let batch = to_batch(&def.columns, rows.iter().map(|r| &r[..]));
        assert_eq!(batch.schema(), def.schema());
        assert_eq!(from_batch(&def, &batch).unwrap(), rows);
    }
}
