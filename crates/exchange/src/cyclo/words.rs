//! How the rotating input's rows travel the ring and come back as Arrow arrays.
//!
//! A fragment of the Data Roundabout is raw `u64` arrays joined in place, whole buffers
//! that are never decoded (`gyre_join::cyclo::fragment`). Every column of the rotating
//! input therefore travels as one little-endian word per row, holding the value's bytes
//! (fixed-width types of at most 8 bytes and booleans), plus one validity word per 64
//! columns. On every worker the matching fragment rows are gathered straight from the
//! buffer into Arrow arrays, so nothing is decoded for rows that do not join. Columns of
//! other types (strings, lists, 128-bit decimals) cannot rotate; the planner then
//! rotates the other input or keeps DataFusion's join.

use arrow::array::{Array, ArrayData, ArrayRef, BooleanArray, RecordBatch, make_array};
use arrow::buffer::{BooleanBuffer, MutableBuffer, NullBuffer};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field};
use datafusion::common::{Result, exec_err};

/// Whether a column of type `t` can travel in a fragment as one word per row.
pub fn travels_as_words(t: &DataType) -> bool {
    *t == DataType::Boolean
        || (t.is_primitive() && t.primitive_width().is_some_and(|w| (1..=8).contains(&w)))
}

/// Whether a join key of type `t` maps exactly onto the kernels' 64-bit integer keys,
/// and in which domain: `Some(true)` unsigned (`UInt64`), `Some(false)` signed.
pub fn key_type_supported(t: &DataType) -> Option<bool> {
    match t {
        DataType::UInt64 => Some(true),
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::Date32 => Some(false),
        _ => None,
    }
}

/// A key column as the kernels' `Int64` (signed domain) or `UInt64` (unsigned) array.
pub fn key_array(column: &ArrayRef, unsigned: bool) -> Result<ArrayRef> {
    let target = if unsigned {
        DataType::UInt64
    } else {
        DataType::Int64
    };
    if key_type_supported(column.data_type()) != Some(unsigned) {
        return exec_err!(
            "cyclo-join keys of type {} cannot join in the {} domain",
            column.data_type(),
            if unsigned { "unsigned" } else { "signed" }
        );
    }
    Ok(cast(column, &target)?)
}

/// Validity words per row for `columns` columns.
pub fn validity_words(columns: usize) -> usize {
    columns.div_ceil(64)
}

/// The words of every column of `batch` (column-major), then its validity words.
pub fn encode_batch(batch: &RecordBatch) -> Result<Vec<Vec<u64>>> {
    let n = batch.num_rows();
    let cols = batch.num_columns();
    let mut out = Vec::with_capacity(cols + validity_words(cols));
    for c in batch.columns() {
        out.push(column_words(c)?);
    }
    for g in 0..validity_words(cols) {
        let mut v = vec![0u64; n];
        for (bit, c) in batch.columns().iter().enumerate().skip(g * 64).take(64) {
            let b = 1u64 << (bit - g * 64);
            match c.logical_nulls() {
                None => v.iter_mut().for_each(|w| *w |= b),
                Some(nulls) => {
                    for (w, valid) in v.iter_mut().zip(nulls.iter()) {
                        if valid {
                            *w |= b;
                        }
                    }
                }
            }
        }
        out.push(v);
    }
    Ok(out)
}

fn column_words(a: &ArrayRef) -> Result<Vec<u64>> {
    let n = a.len();
    if let Some(b) = a.as_any().downcast_ref::<BooleanArray>() {
        return Ok(b.values().iter().map(u64::from).collect());
    }
    let Some(w) = a
        .data_type()
        .primitive_width()
        .filter(|_| travels_as_words(a.data_type()))
    else {
        return exec_err!("cyclo-join cannot ship a column of type {}", a.data_type());
    };
    let data = a.to_data();
    let bytes = &data.buffers()[0].as_slice()[data.offset() * w..(data.offset() + n) * w];
    Ok(match w {
        8 => bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        4 => bytes
            .chunks_exact(4)
            .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
            .collect(),
        _ => bytes
            .chunks_exact(w)
            .map(|c| {
                let mut b = [0u8; 8];
                b[..w].copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect(),
    })
}

/// Rebuilds column `column` of type `field` for fragment rows `rows`, from the column's
/// words and the validity words (`validity[column / 64]`).
pub fn decode_column(
    field: &Field,
    column: usize,
    words: &[u64],
    validity: &[&[u64]],
    rows: &[u32],
) -> Result<ArrayRef> {
    let bit = 1u64 << (column % 64);
    let valid = validity[column / 64];
    let nulls = if field.is_nullable() {
        let nb = NullBuffer::new(BooleanBuffer::from_iter(
            rows.iter().map(|&r| valid[r as usize] & bit != 0),
        ));
        (nb.null_count() > 0).then_some(nb)
    } else {
        None
    };
    let t = field.data_type();
    if *t == DataType::Boolean {
        let values = BooleanBuffer::from_iter(rows.iter().map(|&r| words[r as usize] != 0));
        return Ok(std::sync::Arc::new(BooleanArray::new(values, nulls)));
    }
    let Some(w) = t.primitive_width().filter(|_| travels_as_words(t)) else {
        return exec_err!("cyclo-join cannot rebuild a column of type {t}");
    };
    let mut buf = MutableBuffer::with_capacity(rows.len() * w);
    for &r in rows {
        buf.extend_from_slice(&words[r as usize].to_le_bytes()[..w]);
    }
    let data = ArrayData::builder(t.clone())
        .len(rows.len())
        .add_buffer(buf.into())
        .nulls(nulls)
        .build()?;
    Ok(make_array(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        Date32Array, Float32Array, Float64Array, Int8Array, Int16Array, Int64Array, UInt32Array,
    };
    use arrow::datatypes::Schema;
    use std::sync::Arc;

    #[test]
    fn columns_survive_the_round_trip_through_words() {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int8Array::from(vec![Some(-3), None, Some(7), Some(-128)])),
            Arc::new(Int16Array::from(vec![1, -2, 3, i16::MIN])),
            Arc::new(UInt32Array::from(vec![
                Some(u32::MAX),
                Some(0),
                None,
                Some(5),
            ])),
            Arc::new(Int64Array::from(vec![i64::MIN, -1, 0, i64::MAX])),
            Arc::new(Float32Array::from(vec![
                Some(1.5),
                None,
                Some(-0.0),
                Some(2.0),
            ])),
            Arc::new(Float64Array::from(vec![1e300, -2.5, 0.0, f64::INFINITY])),
            Arc::new(Date32Array::from(vec![
                Some(19000),
                None,
                Some(-1),
                Some(0),
            ])),
            Arc::new(BooleanArray::from(vec![
                Some(true),
                Some(false),
                None,
                Some(true),
            ])),
        ];
        let fields: Vec<Field> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields.clone())), cols).unwrap();
        // A sliced batch: offsets must be honoured.
        let batch = batch.slice(1, 3);
        let words = encode_batch(&batch).unwrap();
        assert_eq!(words.len(), 9);
        let validity: Vec<&[u64]> = vec![&words[8]];
        let rows = [2u32, 0, 1, 2];
        for (c, f) in fields.iter().enumerate() {
            let got = decode_column(f, c, &words[c], &validity, &rows).unwrap();
            let idx = UInt32Array::from(rows.to_vec());
            let want = arrow::compute::take(batch.column(c).as_ref(), &idx, None).unwrap();
            assert_eq!(got.to_data(), want.to_data(), "column {c}");
        }
    }

    #[test]
    fn only_fixed_width_columns_travel() {
        assert!(travels_as_words(&DataType::Int32));
        assert!(travels_as_words(&DataType::Float64));
        assert!(travels_as_words(&DataType::Boolean));
        assert!(!travels_as_words(&DataType::Utf8));
        assert!(!travels_as_words(&DataType::Decimal128(10, 2)));
        assert_eq!(key_type_supported(&DataType::Date32), Some(false));
        assert_eq!(key_type_supported(&DataType::UInt64), Some(true));
        assert_eq!(key_type_supported(&DataType::Utf8), None);
    }
}
