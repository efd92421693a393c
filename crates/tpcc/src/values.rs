//! Values in and out of rows: the few conversions every procedure and check makes.

use gyre_replica::Value;

pub(crate) fn int(v: i64) -> Value {
    Value::Int(v)
}

pub(crate) fn text(v: impl Into<std::sync::Arc<str>>) -> Value {
    Value::Text(v.into())
}

/// A decimal from its unscaled value (cents for scale 2).
pub(crate) fn dec(v: i64) -> Value {
    Value::Decimal(v.into())
}

/// An integer column of one of our own rows (the schema makes it one).
pub(crate) fn int_of(row: &[Value], i: usize) -> i64 {
    row[i].as_int().expect("an integer column")
}

pub(crate) fn dec_of(row: &[Value], i: usize) -> i128 {
    row[i].as_decimal().expect("a decimal column")
}

pub(crate) fn text_of(row: &[Value], i: usize) -> &str {
    row[i].as_text().expect("a text column")
}

/// The arguments' integers, in order; the procedure interface has checked their types.
pub(crate) fn ints<const N: usize>(args: &[Value]) -> [i64; N] {
    std::array::from_fn(|i| args[i].as_int().unwrap_or_default())
}
