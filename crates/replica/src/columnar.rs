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

/// One record batch of `rows` (each already checked against `columns`). Each row is
/// read once, all its columns appended: a secondary seals 64K rows at a time, and
/// reading them once per column missed the cache on every value.
pub fn to_batch<'r>(columns: &[Column], rows: impl Iterator<Item = &'r [Value]>) -> RecordBatch {
    let mut batch = RowsToBatch::new(columns, rows.size_hint().0);
    for row in rows {
        batch.append(row);
    }
    batch.finish()
}

/// Rows appended one at a time into Arrow builders, all columns of a row at once, so
/// that a secondary copies a row into its columnar tail while the row is still in
/// the cache rather than reading it back cold when the tail is sealed.
#[derive(Debug)]
pub struct RowsToBatch {
    schema: arrow_schema::SchemaRef,
    builders: Vec<Builder>,
    rows: usize,
}

impl RowsToBatch {
    pub fn new(columns: &[Column], capacity: usize) -> Self {
        Self {
            schema: schema_of(columns),
            builders: columns
                .iter()
                .map(|c| Builder::new(c.column_type, capacity))
                .collect(),
            rows: 0,
        }
    }

    /// Appends a row already checked against the columns.
    pub fn append(&mut self, row: &[Value]) {
        for (b, v) in self.builders.iter_mut().zip(row) {
            b.append(v);
        }
        self.rows += 1;
    }

    /// Rows appended since the last [`RowsToBatch::finish`].
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The rows appended as one batch; the builder starts over empty.
    pub fn finish(&mut self) -> RecordBatch {
        let arrays: Vec<ArrayRef> = self.builders.iter_mut().map(Builder::finish).collect();
        let n = std::mem::take(&mut self.rows);
        RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            arrays,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(n)),
        )
        .expect("columns built from the table's own types")
    }
}

/// One column's Arrow builder, by the column's type.
#[derive(Debug)]
enum Builder {
    Bool(BooleanBuilder),
    Int8(Int8Builder),
    Int16(Int16Builder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    UInt8(UInt8Builder),
    UInt16(UInt16Builder),
    UInt32(UInt32Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Decimal(Decimal128Builder, u8, i8),
    Date(Date32Builder),
    /// Timestamps by unit, with whether they are UTC.
    Seconds(TimestampSecondBuilder, bool),
    Millis(TimestampMillisecondBuilder, bool),
    Micros(TimestampMicrosecondBuilder, bool),
    Nanos(TimestampNanosecondBuilder, bool),
    Text(StringBuilder),
    IntList(ListBuilder<Int64Builder>),
}

/// Appends the value if it is the variant, else NULL (rows are checked before).
macro_rules! put {
    ($b:expr, $v:expr, $variant:ident, $conv:expr) => {
        match $v {
            Value::$variant(x) => $b.append_value($conv(x)),
            _ => $b.append_null(),
        }
    };
}

impl Builder {
    fn new(t: ColumnType, rows: usize) -> Self {
        match t {
            ColumnType::Bool => Builder::Bool(BooleanBuilder::with_capacity(rows)),
            ColumnType::Int8 => Builder::Int8(Int8Builder::with_capacity(rows)),
            ColumnType::Int16 => Builder::Int16(Int16Builder::with_capacity(rows)),
            ColumnType::Int32 => Builder::Int32(Int32Builder::with_capacity(rows)),
            ColumnType::Int64 => Builder::Int64(Int64Builder::with_capacity(rows)),
            ColumnType::UInt8 => Builder::UInt8(UInt8Builder::with_capacity(rows)),
            ColumnType::UInt16 => Builder::UInt16(UInt16Builder::with_capacity(rows)),
            ColumnType::UInt32 => Builder::UInt32(UInt32Builder::with_capacity(rows)),
            ColumnType::Float32 => Builder::Float32(Float32Builder::with_capacity(rows)),
            ColumnType::Float64 => Builder::Float64(Float64Builder::with_capacity(rows)),
            ColumnType::Decimal { precision, scale } => {
                Builder::Decimal(Decimal128Builder::with_capacity(rows), precision, scale)
            }
            ColumnType::Date => Builder::Date(Date32Builder::with_capacity(rows)),
            ColumnType::Timestamp { digits, utc } => match digits {
                0 => Builder::Seconds(TimestampSecondBuilder::with_capacity(rows), utc),
                3 => Builder::Millis(TimestampMillisecondBuilder::with_capacity(rows), utc),
                6 => Builder::Micros(TimestampMicrosecondBuilder::with_capacity(rows), utc),
                _ => Builder::Nanos(TimestampNanosecondBuilder::with_capacity(rows), utc),
            },
            // Text grows as it needs: its size is not known without a pass of its own.
            ColumnType::Text => Builder::Text(StringBuilder::with_capacity(rows, 16 * rows)),
            ColumnType::IntList => {
                Builder::IntList(ListBuilder::with_capacity(Int64Builder::new(), rows))
            }
        }
    }

    fn append(&mut self, v: &Value) {
        match self {
            Builder::Bool(b) => put!(b, v, Bool, |x: &bool| *x),
            Builder::Int8(b) => put!(b, v, Int, |x: &i64| *x as i8),
            Builder::Int16(b) => put!(b, v, Int, |x: &i64| *x as i16),
            Builder::Int32(b) => put!(b, v, Int, |x: &i64| *x as i32),
            Builder::Int64(b) => put!(b, v, Int, |x: &i64| *x),
            Builder::UInt8(b) => put!(b, v, Int, |x: &i64| *x as u8),
            Builder::UInt16(b) => put!(b, v, Int, |x: &i64| *x as u16),
            Builder::UInt32(b) => put!(b, v, Int, |x: &i64| *x as u32),
            Builder::Float32(b) => put!(b, v, Float, |x: &f64| *x as f32),
            Builder::Float64(b) => put!(b, v, Float, |x: &f64| *x),
            Builder::Decimal(b, ..) => put!(b, v, Decimal, |x: &i128| *x),
            Builder::Date(b) => put!(b, v, Date, |x: &i32| *x),
            Builder::Seconds(b, _) => put!(b, v, Timestamp, |x: &i64| *x),
            Builder::Millis(b, _) => put!(b, v, Timestamp, |x: &i64| *x),
            Builder::Micros(b, _) => put!(b, v, Timestamp, |x: &i64| *x),
            Builder::Nanos(b, _) => put!(b, v, Timestamp, |x: &i64| *x),
            Builder::Text(b) => match v {
                Value::Text(x) => b.append_value(x),
                _ => b.append_null(),
            },
            Builder::IntList(b) => match v {
                Value::IntList(x) => b.append_value(x.iter().map(|i| Some(*i))),
                _ => b.append_null(),
            },
        }
    }

    fn finish(&mut self) -> ArrayRef {
        let tz = |utc: bool| -> Option<Arc<str>> { utc.then(|| "UTC".into()) };
        match self {
            Builder::Bool(b) => Arc::new(b.finish()),
            Builder::Int8(b) => Arc::new(b.finish()),
            Builder::Int16(b) => Arc::new(b.finish()),
            Builder::Int32(b) => Arc::new(b.finish()),
            Builder::Int64(b) => Arc::new(b.finish()),
            Builder::UInt8(b) => Arc::new(b.finish()),
            Builder::UInt16(b) => Arc::new(b.finish()),
            Builder::UInt32(b) => Arc::new(b.finish()),
            Builder::Float32(b) => Arc::new(b.finish()),
            Builder::Float64(b) => Arc::new(b.finish()),
            Builder::Decimal(b, precision, scale) => Arc::new(
                b.finish()
                    .with_precision_and_scale(*precision, *scale)
                    .expect("the column's own precision and scale"),
            ),
            Builder::Date(b) => Arc::new(b.finish()),
            Builder::Seconds(b, utc) => retz(Arc::new(b.finish()), tz(*utc)),
            Builder::Millis(b, utc) => retz(Arc::new(b.finish()), tz(*utc)),
            Builder::Micros(b, utc) => retz(Arc::new(b.finish()), tz(*utc)),
            Builder::Nanos(b, utc) => retz(Arc::new(b.finish()), tz(*utc)),
            Builder::Text(b) => Arc::new(b.finish()),
            Builder::IntList(b) => Arc::new(b.finish()),
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
        for (at, v) in row.iter().enumerate() {
            def.check_value(at, v)?;
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
