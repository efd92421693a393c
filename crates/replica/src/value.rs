//! Values of the row store, the column types they belong to, and their checks.
//!
//! A transactional table stores each row as a slice of [`Value`]s, one per column. The
//! column's [`ColumnType`] (derived from its Arrow type) says which variant a value
//! must be and in which range; every row is checked on insert and update, and every
//! row read back from a log or a checkpoint is checked the same way.

use crate::error::{Error, Result};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::sync::Arc;

/// One value of a row. Decimals are unscaled integers (the scale is the column's),
/// dates are days and timestamps units (the column's) since the Unix epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Decimal(i128),
    Date(i32),
    Timestamp(i64),
    /// Shared: copying a row to change one of its columns copies no text. Encoded as
    /// a string is.
    Text(#[serde(with = "shared_str")] Arc<str>),
    /// A list of integers without NULLs (a procedure's item numbers, say).
    IntList(Vec<i64>),
}

/// `Arc<str>` as serde's string, without serde's `rc` feature (which would rebuild
/// every crate that uses serde).
mod shared_str {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v)
    }

    /// Straight from the decoder's bytes into the shared string: one allocation
    /// and copy per text value of a log entry, not a `String`'s and then the `Arc`'s.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        struct Shared;
        impl Visitor<'_> for Shared {
            type Value = Arc<str>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: Error>(self, v: &str) -> Result<Arc<str>, E> {
                Ok(Arc::from(v))
            }
        }
        d.deserialize_str(Shared)
    }
}

/// A shared row (`Arc<[Value]>`) as serde's sequence of values, the encoding of a
/// `Vec<Value>`, so that log entries read the same whichever they hold.
pub(crate) mod shared_row {
    use super::Value;
    use serde::{Deserialize, Deserializer, Serializer};
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(v: &Arc<[Value]>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[Value]>, D::Error> {
        Vec::<Value>::deserialize(d).map(Arc::from)
    }
}

impl Value {
    fn rank(&self) -> u8 {
        match self {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Int(_) => 2,
            Value::Float(_) => 3,
            Value::Decimal(_) => 4,
            Value::Date(_) => 5,
            Value::Timestamp(_) => 6,
            Value::Text(_) => 7,
            Value::IntList(_) => 8,
        }
    }

    /// About the bytes the value takes in a log entry (at most a few more than
    /// postcard's varints need): what sizes a load's pieces.
    pub fn encoded_bytes(&self) -> usize {
        1 + match self {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Int(_) | Value::Timestamp(_) => 9,
            Value::Float(_) => 8,
            Value::Decimal(_) => 17,
            Value::Date(_) => 5,
            Value::Text(t) => t.len() + 2,
            Value::IntList(l) => 9 * l.len() + 2,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_decimal(&self) -> Option<i128> {
        match self {
            Value::Decimal(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_int_list(&self) -> Option<&[i64]> {
        match self {
            Value::IntList(v) => Some(v),
            _ => None,
        }
    }
}

/// A total order, so that values can be index keys: NULL first, then by variant, and
/// floats by `total_cmp` (within one column every non-NULL value has the same variant).
impl Ord for Value {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (Value::Int(a), Value::Int(b)) => a.cmp(b),
            (Value::Float(a), Value::Float(b)) => a.total_cmp(b),
            (Value::Decimal(a), Value::Decimal(b)) => a.cmp(b),
            (Value::Date(a), Value::Date(b)) => a.cmp(b),
            (Value::Timestamp(a), Value::Timestamp(b)) => a.cmp(b),
            (Value::Text(a), Value::Text(b)) => a.cmp(b),
            (Value::IntList(a), Value::IntList(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Value {}

/// Consistent with the order's equality: floats by their bits, as `total_cmp` tells
/// them apart.
impl std::hash::Hash for Value {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.rank().hash(state);
        match self {
            Value::Null => {}
            Value::Bool(v) => v.hash(state),
            Value::Int(v) => v.hash(state),
            Value::Float(v) => v.to_bits().hash(state),
            Value::Decimal(v) => v.hash(state),
            Value::Date(v) => v.hash(state),
            Value::Timestamp(v) => v.hash(state),
            Value::Text(v) => v.hash(state),
            Value::IntList(v) => v.hash(state),
        }
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.into())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v.into())
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// The type of a transactional table's column: the Arrow types the row store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColumnType {
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    Float32,
    Float64,
    Decimal {
        precision: u8,
        scale: i8,
    },
    Date,
    /// Timestamp in the given unit (0 s, 3 ms, 6 µs, 9 ns), with or without time zone.
    Timestamp {
        digits: u8,
        utc: bool,
    },
    Text,
    /// A list of 64-bit integers whose elements are not NULL.
    IntList,
}

impl ColumnType {
    /// The column type for an Arrow type, or an error naming the type.
    pub fn of(data_type: &DataType) -> Result<Self> {
        Ok(match data_type {
            DataType::Boolean => ColumnType::Bool,
            DataType::Int8 => ColumnType::Int8,
            DataType::Int16 => ColumnType::Int16,
            DataType::Int32 => ColumnType::Int32,
            DataType::Int64 => ColumnType::Int64,
            DataType::UInt8 => ColumnType::UInt8,
            DataType::UInt16 => ColumnType::UInt16,
            DataType::UInt32 => ColumnType::UInt32,
            DataType::Float32 => ColumnType::Float32,
            DataType::Float64 => ColumnType::Float64,
            DataType::Decimal128(precision, scale) => ColumnType::Decimal {
                precision: *precision,
                scale: *scale,
            },
            DataType::Date32 => ColumnType::Date,
            DataType::Timestamp(unit, tz) => ColumnType::Timestamp {
                digits: match unit {
                    TimeUnit::Second => 0,
                    TimeUnit::Millisecond => 3,
                    TimeUnit::Microsecond => 6,
                    TimeUnit::Nanosecond => 9,
                },
                utc: tz.is_some(),
            },
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::Text,
            DataType::List(item) if item.data_type() == &DataType::Int64 => ColumnType::IntList,
            other => {
                return Err(Error::Unsupported(format!(
                    "column type {other} in a transactional table (supported: booleans, \
                     integers up to 64 bits, floats, decimals up to 38 digits, dates, \
                     timestamps, strings and lists of BIGINT)"
                )));
            }
        })
    }

    pub fn data_type(&self) -> DataType {
        match *self {
            ColumnType::Bool => DataType::Boolean,
            ColumnType::Int8 => DataType::Int8,
            ColumnType::Int16 => DataType::Int16,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::UInt8 => DataType::UInt8,
            ColumnType::UInt16 => DataType::UInt16,
            ColumnType::UInt32 => DataType::UInt32,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Decimal { precision, scale } => DataType::Decimal128(precision, scale),
            ColumnType::Date => DataType::Date32,
            ColumnType::Timestamp { digits, utc } => DataType::Timestamp(
                match digits {
                    0 => TimeUnit::Second,
                    3 => TimeUnit::Millisecond,
                    6 => TimeUnit::Microsecond,
                    _ => TimeUnit::Nanosecond,
                },
                utc.then(|| "UTC".into()),
            ),
            ColumnType::Text => DataType::Utf8,
            ColumnType::IntList => DataType::new_list(DataType::Int64, true),
        }
    }

    /// Whether `value` (not NULL) belongs to this type: the right variant, in range.
    pub fn check(&self, value: &Value) -> std::result::Result<(), String> {
        let range = |v: i64, lo: i64, hi: i64| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{v} is out of range for {self:?}"))
            }
        };
        match (self, value) {
            (ColumnType::Bool, Value::Bool(_)) => Ok(()),
            (ColumnType::Int8, Value::Int(v)) => range(*v, i8::MIN.into(), i8::MAX.into()),
            (ColumnType::Int16, Value::Int(v)) => range(*v, i16::MIN.into(), i16::MAX.into()),
            (ColumnType::Int32, Value::Int(v)) => range(*v, i32::MIN.into(), i32::MAX.into()),
            (ColumnType::Int64, Value::Int(_)) => Ok(()),
            (ColumnType::UInt8, Value::Int(v)) => range(*v, 0, u8::MAX.into()),
            (ColumnType::UInt16, Value::Int(v)) => range(*v, 0, u16::MAX.into()),
            (ColumnType::UInt32, Value::Int(v)) => range(*v, 0, u32::MAX.into()),
            // A REAL holds only what an f32 can: a checkpoint stores it as one.
            (ColumnType::Float32, Value::Float(v)) => {
                if v.is_nan() || f64::from(*v as f32) == *v {
                    Ok(())
                } else {
                    Err(format!("{v} is not exactly a 32-bit float"))
                }
            }
            (ColumnType::Float64, Value::Float(_)) => Ok(()),
            (ColumnType::Decimal { precision, .. }, Value::Decimal(v)) => {
                let limit = 10i128
                    .checked_pow(u32::from(*precision))
                    .unwrap_or(i128::MAX);
                if v.unsigned_abs() < limit.unsigned_abs() {
                    Ok(())
                } else {
                    Err(format!("{v} has more than {precision} digits"))
                }
            }
            (ColumnType::Date, Value::Date(_)) => Ok(()),
            (ColumnType::Timestamp { .. }, Value::Timestamp(_)) => Ok(()),
            (ColumnType::Text, Value::Text(_)) => Ok(()),
            (ColumnType::IntList, Value::IntList(_)) => Ok(()),
            (t, v) => Err(format!("{v:?} is not a {t:?}")),
        }
    }
}

/// A column of a transactional table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    pub column_type: ColumnType,
    pub nullable: bool,
}

impl Column {
    pub fn new(name: impl Into<String>, column_type: ColumnType, nullable: bool) -> Self {
        Self {
            name: name.into(),
            column_type,
            nullable,
        }
    }
}

impl Column {
    /// Whether `value` may stand in this column: NULL only if it is nullable, anything
    /// else of its type.
    pub fn check(&self, value: &Value) -> std::result::Result<(), String> {
        if value.is_null() {
            if self.nullable {
                Ok(())
            } else {
                Err("NULL, which is NOT NULL".into())
            }
        } else {
            self.column_type.check(value)
        }
    }
}

/// The columns of an Arrow schema, or an error naming the first unsupported one.
pub fn columns_of(schema: &Schema) -> Result<Vec<Column>> {
    schema
        .fields()
        .iter()
        .map(|f| {
            Ok(Column::new(
                f.name().clone(),
                ColumnType::of(f.data_type())?,
                f.is_nullable(),
            ))
        })
        .collect()
}

/// The Arrow schema of a table's columns.
pub fn schema_of(columns: &[Column]) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(&c.name, c.column_type.data_type(), c.nullable))
            .collect::<Vec<_>>(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_total_with_null_first() {
        let mut v = [
            Value::Float(f64::NAN),
            Value::Int(3),
            Value::Null,
            Value::Float(-1.0),
            Value::Int(-7),
        ];
        v.sort();
        assert_eq!(v[0], Value::Null);
        assert_eq!(v[1], Value::Int(-7));
        assert_eq!(v[2], Value::Int(3));
        assert_eq!(v[3], Value::Float(-1.0));
        assert!(matches!(v[4], Value::Float(x) if x.is_nan()));
    }

    #[test]
    fn checks_variant_and_range() {
        assert!(ColumnType::Int8.check(&Value::Int(127)).is_ok());
        assert!(ColumnType::Int8.check(&Value::Int(128)).is_err());
        assert!(ColumnType::UInt32.check(&Value::Int(-1)).is_err());
        assert!(ColumnType::Int64.check(&Value::Text("1".into())).is_err());
        let d = ColumnType::Decimal {
            precision: 4,
            scale: 2,
        };
        assert!(d.check(&Value::Decimal(9999)).is_ok());
        assert!(d.check(&Value::Decimal(-10000)).is_err());
    }

    #[test]
    fn arrow_types_round_trip() {
        for t in [
            DataType::Int32,
            DataType::Decimal128(12, 2),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            DataType::Utf8,
            DataType::Date32,
        ] {
            assert_eq!(ColumnType::of(&t).unwrap().data_type(), t);
        }
        assert!(ColumnType::of(&DataType::UInt64).is_err());
    }

    /// Text decodes from the log's bytes (borrowed) and from a format that hands
    /// over owned strings (JSON with escapes) alike; anything else is refused.
    #[test]
    fn text_decodes_borrowed_and_owned() {
        let text = Value::Text("naïve \"quoted\" text".into());
        let bytes = postcard::to_allocvec(&text).unwrap();
        let Value::Text(back) = postcard::from_bytes::<Value>(&bytes).unwrap() else {
            panic!("not text")
        };
        assert_eq!(&*back, "naïve \"quoted\" text");
        let json = serde_json::to_string(&text).unwrap();
        let Value::Text(back) = serde_json::from_str::<Value>(&json).unwrap() else {
            panic!("not text")
        };
        assert_eq!(&*back, "naïve \"quoted\" text");
        let error = serde_json::from_str::<Value>(r#"{"Text":7}"#).unwrap_err();
        assert!(error.to_string().contains("a string"), "{error}");
    }
}
