//! Join key columns as the kernels see them: 64-bit values plus Arrow validity.
//!
//! Every kernel works on `u64` bit patterns so that one code path serves signed and
//! unsigned keys. Equality does not care about the domain; ordering does, so sorted
//! kernels map keys to an *ordered* `u64` (signed keys get their sign bit flipped,
//! which turns two's complement order into unsigned order; it is a translation by
//! 2^63, so band offsets can be added in the ordered space directly).

use std::borrow::Cow;
use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use arrow_array::{Array, Int64Array, UInt64Array};
use arrow_buffer::NullBuffer;
use arrow_schema::DataType;

use crate::error::{JoinError, Result};

/// Largest number of rows one kernel input may have: rows are named by `u32` indices.
pub const MAX_ROWS: usize = u32::MAX as usize;

const SIGN_BIT: u64 = 1 << 63;

/// Whether the `u64` bit patterns of a key column are unsigned or two's complement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyDomain {
    Unsigned,
    Signed,
}

impl KeyDomain {
    /// Order-preserving map to `u64`; a translation, so band offsets carry over.
    #[inline(always)]
    pub fn ordered(self, bits: u64) -> u64 {
        match self {
            KeyDomain::Unsigned => bits,
            KeyDomain::Signed => bits ^ SIGN_BIT,
        }
    }

    /// The numeric value of a key's bit pattern, exact in `i128`.
    #[inline(always)]
    pub fn value(self, bits: u64) -> i128 {
        match self {
            KeyDomain::Unsigned => bits as i128,
            KeyDomain::Signed => bits as i64 as i128,
        }
    }
}

/// A key column: values (borrowed when the Arrow type is already 64-bit) and validity.
/// NULL keys never match anything in any kernel.
#[derive(Debug, Clone)]
pub struct Keys<'a> {
    values: Cow<'a, [u64]>,
    nulls: Option<NullBuffer>,
    domain: KeyDomain,
}

impl<'a> Keys<'a> {
    /// Unsigned keys without NULLs.
    pub fn unsigned(values: &'a [u64]) -> Self {
        Keys {
            values: Cow::Borrowed(values),
            nulls: None,
            domain: KeyDomain::Unsigned,
        }
    }

    /// Signed keys without NULLs (borrowed, reinterpreted as bit patterns).
    pub fn signed(values: &'a [i64]) -> Self {
        // SAFETY: i64 and u64 have the same size and alignment and every bit pattern
        // is valid for both, so the slice can be viewed as u64 without copying.
        let bits =
            unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u64>(), values.len()) };
        Keys {
            values: Cow::Borrowed(bits),
            nulls: None,
            domain: KeyDomain::Signed,
        }
    }

    /// Attaches a validity bitmap (must have the column's length).
    pub fn with_nulls(mut self, nulls: Option<NullBuffer>) -> Result<Self> {
        if let Some(n) = &nulls
            && n.len() != self.values.len()
        {
            return Err(JoinError::InvalidConfig(format!(
                "validity has {} entries for {} keys",
                n.len(),
                self.values.len()
            )));
        }
        self.nulls = nulls.filter(|n| n.null_count() > 0);
        Ok(self)
    }

    /// Keys from an Arrow integer (or `Date32`) column. `UInt64` and `Int64` are borrowed
    /// without a copy; narrower types are widened (sign- or zero-extended) into an owned
    /// buffer.
    pub fn from_array(array: &'a dyn Array) -> Result<Self> {
        fn widen<T, F: Fn(T) -> u64>(values: &[T], f: F) -> Cow<'static, [u64]>
        where
            T: Copy,
        {
            Cow::Owned(values.iter().map(|&v| f(v)).collect())
        }
        let (values, domain): (Cow<'a, [u64]>, KeyDomain) = match array.data_type() {
            DataType::UInt64 => (
                Cow::Borrowed(array.as_primitive::<UInt64Type>().values().as_ref()),
                KeyDomain::Unsigned,
            ),
            DataType::Int64 => {
                let v: &[i64] = array.as_primitive::<Int64Type>().values().as_ref();
                (Keys::signed(v).values, KeyDomain::Signed)
            }
            DataType::UInt32 => (
                widen(array.as_primitive::<UInt32Type>().values(), u64::from),
                KeyDomain::Unsigned,
            ),
            DataType::UInt16 => (
                widen(array.as_primitive::<UInt16Type>().values(), u64::from),
                KeyDomain::Unsigned,
            ),
            DataType::UInt8 => (
                widen(array.as_primitive::<UInt8Type>().values(), u64::from),
                KeyDomain::Unsigned,
            ),
            DataType::Int32 => (
                widen(array.as_primitive::<Int32Type>().values(), |v| {
                    v as i64 as u64
                }),
                KeyDomain::Signed,
            ),
            DataType::Int16 => (
                widen(array.as_primitive::<Int16Type>().values(), |v| {
                    v as i64 as u64
                }),
                KeyDomain::Signed,
            ),
            DataType::Int8 => (
                widen(array.as_primitive::<Int8Type>().values(), |v| {
                    v as i64 as u64
                }),
                KeyDomain::Signed,
            ),
            // Days since the epoch, as signed 32-bit integers.
            DataType::Date32 => (
                widen(array.as_primitive::<Date32Type>().values(), |v| {
                    v as i64 as u64
                }),
                KeyDomain::Signed,
            ),
            other => return Err(JoinError::UnsupportedKeyType(other.clone())),
        };
        Keys {
            values,
            nulls: None,
            domain,
        }
        .with_nulls(array.logical_nulls())
    }

    /// Number of rows, NULLs included (row indices refer to these positions).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn domain(&self) -> KeyDomain {
        self.domain
    }

    /// The raw bit patterns, NULL positions included (their values are meaningless).
    pub fn values(&self) -> &[u64] {
        &self.values
    }

    pub fn nulls(&self) -> Option<&NullBuffer> {
        self.nulls.as_ref()
    }

    /// Number of non-NULL keys.
    pub fn valid_count(&self) -> usize {
        self.len() - self.nulls.as_ref().map_or(0, |n| n.null_count())
    }

    pub(crate) fn check_rows(&self) -> Result<()> {
        if self.len() > MAX_ROWS {
            return Err(JoinError::TooManyRows {
                rows: self.len(),
                max: MAX_ROWS,
            });
        }
        Ok(())
    }

    /// Calls `f(row, bits)` for every non-NULL row in `range`, in row order. The
    /// NULL-free case is a plain loop; otherwise the validity bitmap's set bits are
    /// walked word by word instead of testing every row.
    #[inline]
    pub(crate) fn for_each_valid(&self, range: Range<usize>, mut f: impl FnMut(usize, u64)) {
        let values = &self.values[range.clone()];
        match &self.nulls {
            None => {
                for (i, &v) in values.iter().enumerate() {
                    f(range.start + i, v);
                }
            }
            Some(nulls) => {
                let bits = nulls.inner().slice(range.start, range.len());
                for i in bits.set_indices() {
                    f(range.start + i, values[i]);
                }
            }
        }
    }
}

impl<'a> From<&'a UInt64Array> for Keys<'a> {
    fn from(a: &'a UInt64Array) -> Self {
        Keys::unsigned(a.values().as_ref())
            .with_nulls(a.nulls().cloned())
            .expect("an array's validity has the array's length")
    }
}

impl<'a> From<&'a Int64Array> for Keys<'a> {
    fn from(a: &'a Int64Array) -> Self {
        Keys::signed(a.values().as_ref())
            .with_nulls(a.nulls().cloned())
            .expect("an array's validity has the array's length")
    }
}

pub(crate) fn check_domains(left: KeyDomain, right: KeyDomain) -> Result<()> {
    if left != right {
        return Err(JoinError::DomainMismatch { left, right });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int32Array, StringArray};

    #[test]
    fn arrow_columns_become_keys_with_validity() {
        let a = Int64Array::from(vec![Some(-1), None, Some(3)]);
        let k = Keys::from_array(&a).unwrap();
        assert_eq!(k.domain(), KeyDomain::Signed);
        assert_eq!(k.valid_count(), 2);
        let mut seen = vec![];
        k.for_each_valid(0..3, |r, v| seen.push((r, KeyDomain::Signed.value(v))));
        assert_eq!(seen, vec![(0, -1), (2, 3)]);

        let b = Int32Array::from(vec![Some(-5), Some(7), None]);
        let k = Keys::from_array(&b).unwrap();
        let mut seen = vec![];
        k.for_each_valid(1..3, |r, v| seen.push((r, k.domain().value(v))));
        assert_eq!(seen, vec![(1, 7)]);
    }

    #[test]
    fn non_integer_keys_are_refused_by_name() {
        let s = StringArray::from(vec!["a"]);
        let err = Keys::from_array(&s).unwrap_err();
        assert_eq!(err, JoinError::UnsupportedKeyType(DataType::Utf8));
        assert!(err.to_string().contains("Utf8"));
    }

    #[test]
    fn ordered_map_preserves_signed_order() {
        let vals = [i64::MIN, -2, -1, 0, 1, i64::MAX];
        let ord: Vec<u64> = vals
            .iter()
            .map(|&v| KeyDomain::Signed.ordered(v as u64))
            .collect();
        assert!(ord.windows(2).all(|w| w[0] < w[1]));
    }
}
