//! Small Arrow batches with the data types a stage exchanges (nested and dictionary
//! ones included), from which the IPC and cyclo seeds are encoded.

use arrow::array::{
    ArrayRef, DictionaryArray, Int32Builder, Int64Array, ListBuilder, MapBuilder, RecordBatch,
    StringArray, StringBuilder, StructArray,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use std::sync::Arc;

/// Nullable fields named after their arrays, for `RecordBatch::try_new`.
pub(crate) fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let arrays = cols.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("a valid batch")
}

pub(crate) fn string_dict(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(
        values
            .iter()
            .copied()
            .collect::<DictionaryArray<Int32Type>>(),
    )
}

pub(crate) fn int_list(rows: &[Option<Vec<Option<i32>>>]) -> ArrayRef {
    let mut b = ListBuilder::new(Int32Builder::new());
    for r in rows {
        b.append_option(r.clone());
    }
    Arc::new(b.finish())
}

pub(crate) fn two_field_struct() -> ArrayRef {
    Arc::new(StructArray::from(vec![
        (
            Arc::new(Field::new("a", DataType::Int64, true)),
            Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4)])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("b", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec![
                Some("x"),
                Some("héllo"),
                None,
                Some(""),
            ])) as ArrayRef,
        ),
    ]))
}

pub(crate) fn string_map() -> ArrayRef {
    let mut map = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
    for row in [
        vec![("k1", Some(1)), ("k2", None)],
        vec![],
        vec![("only", Some(9))],
        vec![("a", Some(1)), ("b", Some(2)), ("c", Some(3))],
    ] {
        for (k, v) in row {
            map.keys().append_value(k);
            map.values().append_option(v);
        }
        map.append(true).expect("a map row");
    }
    Arc::new(map.finish())
}
