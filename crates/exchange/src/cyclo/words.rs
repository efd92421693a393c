//! How the rotating input's rows travel the ring and come back as Arrow arrays.
//!
//! A fragment of the Data Roundabout is raw `u64` arrays joined in place, whole buffers
//! that are never decoded (`gyre_join::cyclo::fragment`). Every column of the rotating
//! input therefore travels as little-endian words, row-aligned with the keys:
//!
//! - fixed-width values (integers, floats, dates, decimals, fixed-size binaries,
//!   booleans) as `ceil(width / 8)` words per row holding the value's bytes;
//! - variable-length values (strings, binaries, and dictionaries of either) as one of
//!   the fragment's byte columns: a word pointing into the fragment's heap;
//! - every other type (lists, structs, maps, unions, dictionaries of other values) also
//!   as a byte column, each value in Arrow's row format (`arrow::row`), which encodes
//!   one nested value per row in a self-contained byte string;
//! - validity as one word per 64 columns.
//!
//! On every worker the matching fragment rows are gathered straight from the buffer
//! into Arrow arrays, so nothing is decoded for rows that do not join. Row-format values
//! are decoded by the same converter that encoded them on the sending worker (the row
//! format is deterministic for a type); fragments arrive checksummed by the transport.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayData, ArrayRef, BinaryBuilder, BooleanArray, LargeBinaryArray, RecordBatch,
    StringBuilder, make_array,
};
use arrow::buffer::{BooleanBuffer, MutableBuffer, NullBuffer};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef};
use arrow::row::{RowConverter, SortField};
use datafusion::common::{Result, exec_err, internal_err};
use gyre_join::cyclo::{ByteColumn, FragmentView};

/// How a column of the rotating input travels in a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Travel {
    /// `width` bytes per row in `width.div_ceil(8)` words (booleans: one word, 0 or 1).
    Fixed {
        width: usize,
    },
    Boolean,
    /// A byte column in the fragment's heap; `string` if the values are UTF-8.
    Bytes {
        string: bool,
    },
    /// A byte column holding each value in Arrow's row format (nested types).
    Rows,
}

impl Travel {
    /// How a column of type `t` travels, if it can.
    pub fn of(t: &DataType) -> Option<Travel> {
        match t {
            DataType::Boolean => Some(Travel::Boolean),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                Some(Travel::Bytes { string: true })
            }
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                Some(Travel::Bytes { string: false })
            }
            DataType::FixedSizeBinary(n) if *n > 0 => Some(Travel::Fixed { width: *n as usize }),
            // Dictionaries of strings or binaries travel as their values and are rebuilt
            // on arrival; other dictionaries in the row format.
            DataType::Dictionary(_, v) if matches!(Travel::of(v), Some(Travel::Bytes { .. })) => {
                Travel::of(v)
            }
            t if t.is_primitive() => t.primitive_width().map(|width| Travel::Fixed { width }),
            t => {
                RowConverter::supports_fields(&[SortField::new(t.clone())]).then_some(Travel::Rows)
            }
        }
    }

    /// Payload words per row (byte columns: none, their pointer is the fragment's).
    fn words(self) -> usize {
        match self {
            Travel::Fixed { width } => width.div_ceil(8),
            Travel::Boolean => 1,
            Travel::Bytes { .. } | Travel::Rows => 0,
        }
    }
}

/// Whether a column of type `t` can travel the ring.
pub fn travels(t: &DataType) -> bool {
    Travel::of(t).is_some()
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
fn validity_words(columns: usize) -> usize {
    columns.div_ceil(64)
}

/// Where each rotating column sits in a fragment: its first payload word column, or its
/// byte column. Payload columns are every fixed column's words, then the validity
/// words, then whatever the operator appends (row numbers); byte columns come last.
#[derive(Debug, Clone)]
pub struct RotatingLayout {
    fields: Vec<FieldRef>,
    travel: Vec<Travel>,
    /// Payload word column (fixed) or byte column (bytes, rows) of each column.
    place: Vec<usize>,
    /// The row-format converter of each `Travel::Rows` column.
    row_formats: Vec<Option<Arc<RowConverter>>>,
    fixed_words: usize,
    byte_columns: usize,
}

impl RotatingLayout {
    pub fn new(fields: &[FieldRef]) -> Result<Self> {
        let (mut fixed_words, mut byte_columns) = (0, 0);
        let mut travel = Vec::with_capacity(fields.len());
        let mut place = Vec::with_capacity(fields.len());
        let mut row_formats = Vec::with_capacity(fields.len());
        for f in fields {
            let Some(t) = Travel::of(f.data_type()) else {
                return exec_err!(
                    "cyclo-join cannot ship column {} of type {}",
                    f.name(),
                    f.data_type()
                );
            };
            row_formats.push(match t {
                Travel::Rows => Some(Arc::new(RowConverter::new(vec![SortField::new(
                    f.data_type().clone(),
                )])?)),
                _ => None,
            });
            if let Travel::Bytes { .. } | Travel::Rows = t {
                place.push(byte_columns);
                byte_columns += 1;
            } else {
                place.push(fixed_words);
                fixed_words += t.words();
            }
            travel.push(t);
        }
        Ok(RotatingLayout {
            fields: fields.to_vec(),
            travel,
            place,
            row_formats,
            fixed_words,
            byte_columns,
        })
    }

    pub fn fields(&self) -> &[FieldRef] {
        &self.fields
    }

    /// Payload word columns the layout itself uses (fixed words and validity).
    pub fn payload_words(&self) -> usize {
        self.fixed_words + validity_words(self.fields.len())
    }

    pub fn byte_columns(&self) -> usize {
        self.byte_columns
    }

    /// Checks that `fragment` carries this layout plus `extra` payload word columns.
    pub fn check(&self, fragment: &FragmentView<'_>, extra: usize) -> Result<()> {
        let want = self.payload_words() + extra + self.byte_columns;
        if fragment.payload_columns() != want || fragment.byte_columns() != self.byte_columns {
            return internal_err!(
                "a fragment carries {} payload columns ({} of bytes), expected {want} ({})",
                fragment.payload_columns(),
                fragment.byte_columns(),
                self.byte_columns
            );
        }
        Ok(())
    }

    /// The rows of `batch` as they travel: payload word columns (fixed words, then
    /// validity) and the byte columns' values.
    pub fn encode(&self, batch: &RecordBatch) -> Result<EncodedRotating> {
        let n = batch.num_rows();
        let cols = batch.num_columns();
        let mut words = Vec::with_capacity(self.payload_words());
        let mut bytes = Vec::with_capacity(self.byte_columns);
        for (i, (c, t)) in batch.columns().iter().zip(&self.travel).enumerate() {
            match t {
                Travel::Boolean => {
                    let Some(b) = c.as_any().downcast_ref::<BooleanArray>() else {
                        return internal_err!("a {} column is not boolean", c.data_type());
                    };
                    words.push(b.values().iter().map(u64::from).collect());
                }
                Travel::Fixed { width } => words.extend(fixed_words(c, *width)?),
                Travel::Bytes { .. } => bytes.push(large_binary(c)?),
                Travel::Rows => {
                    let rows = self.converter(i)?.convert_columns(&[Arc::clone(c)])?;
                    bytes.push(large_binary(&rows.try_into_binary()?)?);
                }
            }
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
            words.push(v);
        }
        Ok(EncodedRotating { words, bytes })
    }

    /// Rebuilds column `c` for the rows `rows` of `fragment`.
    pub fn decode(&self, fragment: &FragmentView<'_>, c: usize, rows: &[u32]) -> Result<ArrayRef> {
        crate::codec::contain_panics("a cyclo-join fragment", || {
            self.decode_checked(fragment, c, rows)
        })
    }

    fn decode_checked(
        &self,
        fragment: &FragmentView<'_>,
        c: usize,
        rows: &[u32],
    ) -> Result<ArrayRef> {
        let field = &self.fields[c];
        let bit = 1u64 << (c % 64);
        let valid = fragment.payload(self.fixed_words + c / 64);
        // Row-format values carry their NULLs themselves.
        let nulls = if field.is_nullable() && self.travel[c] != Travel::Rows {
            let nb = NullBuffer::new(BooleanBuffer::from_iter(
                rows.iter().map(|&r| valid[r as usize] & bit != 0),
            ));
            (nb.null_count() > 0).then_some(nb)
        } else {
            None
        };
        let t = field.data_type();
        match self.travel[c] {
            Travel::Boolean => {
                let words = fragment.payload(self.place[c]);
                let values = BooleanBuffer::from_iter(rows.iter().map(|&r| words[r as usize] != 0));
                Ok(Arc::new(BooleanArray::new(values, nulls)))
            }
            Travel::Fixed { width } => {
                let k = width.div_ceil(8);
                let cols: Vec<&[u64]> = (0..k)
                    .map(|j| fragment.payload(self.place[c] + j))
                    .collect();
                let mut buf = MutableBuffer::with_capacity(rows.len() * width);
                for &r in rows {
                    let mut left = width;
                    for col in &cols {
                        let take = left.min(8);
                        buf.extend_from_slice(&col[r as usize].to_le_bytes()[..take]);
                        left -= take;
                    }
                }
                let data = ArrayData::builder(t.clone())
                    .len(rows.len())
                    .add_buffer(buf.into())
                    .nulls(nulls)
                    .build()?;
                Ok(make_array(data))
            }
            Travel::Bytes { string } => {
                let b = self.place[c];
                let valid = |i: usize| nulls.as_ref().is_none_or(|n| n.is_valid(i));
                let built: ArrayRef = if string {
                    let mut out = StringBuilder::with_capacity(rows.len(), 0);
                    for (i, &r) in rows.iter().enumerate() {
                        if valid(i) {
                            match std::str::from_utf8(fragment.byte_value(b, r as usize)) {
                                Ok(s) => out.append_value(s),
                                Err(e) => {
                                    return exec_err!(
                                        "column {} of a fragment is not UTF-8: {e}",
                                        field.name()
                                    );
                                }
                            }
                        } else {
                            out.append_null();
                        }
                    }
                    Arc::new(out.finish())
                } else {
                    let mut out = BinaryBuilder::with_capacity(rows.len(), 0);
                    for (i, &r) in rows.iter().enumerate() {
                        if valid(i) {
                            out.append_value(fragment.byte_value(b, r as usize));
                        } else {
                            out.append_null();
                        }
                    }
                    Arc::new(out.finish())
                };
                as_type(built, t)
            }
            Travel::Rows => {
                let converter = self.converter(c)?;
                let parser = converter.parser();
                let b = self.place[c];
                let mut decoded = converter.convert_rows(
                    rows.iter()
                        .map(|&r| parser.parse(fragment.byte_value(b, r as usize))),
                )?;
                let Some(built) = decoded.pop() else {
                    return internal_err!("the row format gave no column for {}", field.name());
                };
                // Dictionaries come back as their values.
                as_type(built, t)
            }
        }
    }

    fn converter(&self, c: usize) -> Result<&RowConverter> {
        match &self.row_formats[c] {
            Some(r) => Ok(r),
            None => internal_err!("column {} does not travel in the row format", c),
        }
    }
}

/// A batch of the rotating input as it travels (see [`RotatingLayout::encode`]).
#[derive(Debug)]
pub struct EncodedRotating {
    /// Payload word columns; the operator may append its own (row numbers).
    pub words: Vec<Vec<u64>>,
    bytes: Vec<LargeBinaryArray>,
}

impl EncodedRotating {
    pub fn byte_columns(&self) -> Vec<ByteColumn<'_>> {
        self.bytes
            .iter()
            .map(|a| ByteColumn {
                offsets: a.value_offsets(),
                values: a.values().as_slice(),
            })
            .collect()
    }
}

/// A byte column as the `LargeBinary` array its fragment column is written from.
fn large_binary(a: &dyn Array) -> Result<LargeBinaryArray> {
    let large = cast(a, &DataType::LargeBinary)?;
    match large.as_any().downcast_ref::<LargeBinaryArray>() {
        Some(a) => Ok(a.clone()),
        None => internal_err!("a cast to large binary gave {}", large.data_type()),
    }
}

/// A decoded column as the field's type `t` (strings may be views or dictionaries, row
/// format dictionaries come back as their values).
fn as_type(built: ArrayRef, t: &DataType) -> Result<ArrayRef> {
    if built.data_type() == t {
        Ok(built)
    } else {
        Ok(cast(&built, t)?)
    }
}

/// The `width.div_ceil(8)` word columns of a fixed-width column.
fn fixed_words(a: &ArrayRef, width: usize) -> Result<Vec<Vec<u64>>> {
    let n = a.len();
    let data = a.to_data();
    let Some(values) = data.buffers().first() else {
        return internal_err!("a {} column without a values buffer", a.data_type());
    };
    let bytes = &values.as_slice()[data.offset() * width..(data.offset() + n) * width];
    let k = width.div_ceil(8);
    let mut out = vec![Vec::with_capacity(n); k];
    match width {
        8 => out[0].extend(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
        ),
        4 => out[0].extend(
            bytes
                .chunks_exact(4)
                .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes")))),
        ),
        _ => {
            for row in bytes.chunks_exact(width) {
                for (j, col) in out.iter_mut().enumerate() {
                    let part = &row[j * 8..((j + 1) * 8).min(width)];
                    let mut b = [0u8; 8];
                    b[..part.len()].copy_from_slice(part);
                    col.push(u64::from_le_bytes(b));
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        BinaryArray, Date32Array, Decimal128Array, FixedSizeBinaryArray, Float32Array,
        Float64Array, Int8Array, Int16Array, Int64Array, LargeStringArray, StringArray,
        StringViewArray, UInt32Array,
    };
    use arrow::datatypes::{Field, Schema};
    use gyre_join::KeyDomain;
    use gyre_join::cyclo::FragmentForm;
    use gyre_join::cyclo::fragment::encode_with_bytes;

    /// Rows 1..5 of `cols` (a sliced batch: offsets must be honoured), with nullable
    /// fields named c0, c1, ...
    fn sliced_batch(cols: Vec<ArrayRef>) -> (Vec<FieldRef>, RecordBatch) {
        let fields: Vec<FieldRef> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| Arc::new(Field::new(format!("c{i}"), c.data_type().clone(), true)))
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields.clone())), cols).unwrap();
        (fields, batch.slice(1, 4))
    }

    /// The words of a raw fragment holding `batch`'s rows in `order`, as an origin
    /// encodes it for the ring.
    fn fragment_words(layout: &RotatingLayout, batch: &RecordBatch, order: &[u32]) -> Vec<u64> {
        let enc = layout.encode(batch).unwrap();
        assert_eq!(enc.words.len(), layout.payload_words());
        let payload: Vec<&[u64]> = enc.words.iter().map(Vec::as_slice).collect();
        encode_with_bytes(
            FragmentForm::Raw,
            KeyDomain::Unsigned,
            &vec![0u64; batch.num_rows()],
            &payload,
            &enc.byte_columns(),
            order,
            &[],
        )
    }

    /// Fragment rows `rows` as batch rows (fragment row i holds batch row `order[i]`).
    fn batch_rows(rows: &[u32], order: &[u32]) -> UInt32Array {
        UInt32Array::from(rows.iter().map(|&r| order[r as usize]).collect::<Vec<_>>())
    }

    /// Every travelling type survives the trip through a real fragment: encoded at the
    /// origin (rows reordered as a sorted fragment would be), gathered on arrival.
    #[test]
    fn columns_survive_the_round_trip_through_a_fragment() {
        let dict: ArrayRef = Arc::new(
            vec![Some("x"), None, Some("yy"), Some("x"), Some("zzz")]
                .into_iter()
                .collect::<arrow::array::DictionaryArray<arrow::datatypes::Int32Type>>(),
        );
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int8Array::from(vec![
                Some(-3),
                None,
                Some(7),
                Some(-128),
                Some(1),
            ])),
            Arc::new(Int16Array::from(vec![1, -2, 3, i16::MIN, 0])),
            Arc::new(UInt32Array::from(vec![
                Some(u32::MAX),
                Some(0),
                None,
                Some(5),
                None,
            ])),
            Arc::new(Int64Array::from(vec![i64::MIN, -1, 0, i64::MAX, 9])),
            Arc::new(Float32Array::from(vec![
                Some(1.5),
                None,
                Some(-0.0),
                Some(2.0),
                None,
            ])),
            Arc::new(Float64Array::from(vec![
                1e300,
                -2.5,
                0.0,
                f64::INFINITY,
                1.0,
            ])),
            Arc::new(Date32Array::from(vec![
                Some(19000),
                None,
                Some(-1),
                Some(0),
                Some(3),
            ])),
            Arc::new(BooleanArray::from(vec![
                Some(true),
                Some(false),
                None,
                Some(true),
                None,
            ])),
            Arc::new(
                Decimal128Array::from(vec![Some(i128::MAX), Some(-12345), None, Some(0), Some(1)])
                    .with_precision_and_scale(38, 2)
                    .unwrap(),
            ),
            Arc::new(StringArray::from(vec![
                Some("héllo"),
                None,
                Some(""),
                Some("a"),
                Some("bc"),
            ])),
            Arc::new(LargeStringArray::from(vec!["l1", "", "l333", "l4", "l5"])),
            Arc::new(StringViewArray::from(vec![
                Some("a string longer than twelve bytes"),
                Some("short"),
                None,
                Some(""),
                Some("v"),
            ])),
            Arc::new(BinaryArray::from(vec![
                Some(&b"\x00\xff"[..]),
                None,
                Some(&b""[..]),
                Some(&b"bin"[..]),
                Some(&b"\x01"[..]),
            ])),
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    vec![
                        Some(*b"abcdefghijk"),
                        None,
                        Some(*b"ABCDEFGHIJK"),
                        Some([0; 11]),
                        None,
                    ]
                    .into_iter(),
                    11,
                )
                .unwrap(),
            ),
            dict,
        ];
        let (fields, batch) = sliced_batch(cols);
        let layout = RotatingLayout::new(&fields).unwrap();
        assert_eq!(layout.byte_columns(), 5);
        let order = [3u32, 1, 0, 2];
        let words = fragment_words(&layout, &batch, &order);
        let fragment = FragmentView::parse(&words).unwrap();
        layout.check(&fragment, 0).unwrap();
        assert!(layout.check(&fragment, 1).is_err());
        // Fragment rows 0..4 hold batch rows 3, 1, 0, 2.
        let rows = [2u32, 0, 1, 2, 3];
        for c in 0..fields.len() {
            let got = layout.decode(&fragment, c, &rows).unwrap();
            let idx = batch_rows(&rows, &order);
            let want = arrow::compute::take(batch.column(c).as_ref(), &idx, None).unwrap();
            assert_eq!(got.data_type(), want.data_type(), "column {c}");
            assert_eq!(
                arrow::compute::cast(&got, &DataType::Utf8)
                    .ok()
                    .map(|a| a.to_data()),
                arrow::compute::cast(&want, &DataType::Utf8)
                    .ok()
                    .map(|a| a.to_data()),
                "column {c}"
            );
            if !matches!(
                want.data_type(),
                DataType::Dictionary(..) | DataType::Utf8View
            ) {
                assert_eq!(got.to_data(), want.to_data(), "column {c}");
            }
        }
    }

    #[test]
    fn how_each_type_travels() {
        assert_eq!(
            Travel::of(&DataType::Int32),
            Some(Travel::Fixed { width: 4 })
        );
        assert_eq!(
            Travel::of(&DataType::Decimal256(50, 2)),
            Some(Travel::Fixed { width: 32 })
        );
        assert_eq!(Travel::of(&DataType::Boolean), Some(Travel::Boolean));
        assert_eq!(
            Travel::of(&DataType::Utf8),
            Some(Travel::Bytes { string: true })
        );
        let dict = |v| DataType::Dictionary(Box::new(DataType::Int32), Box::new(v));
        assert_eq!(
            Travel::of(&dict(DataType::Utf8)),
            Some(Travel::Bytes { string: true })
        );
        assert_eq!(Travel::of(&dict(DataType::Int64)), Some(Travel::Rows));
        let item = Arc::new(Field::new("item", DataType::Int32, true));
        assert_eq!(Travel::of(&DataType::List(item)), Some(Travel::Rows));
        assert_eq!(key_type_supported(&DataType::Date32), Some(false));
        assert_eq!(key_type_supported(&DataType::UInt64), Some(true));
        assert_eq!(key_type_supported(&DataType::Utf8), None);
    }

    /// Lists, structs, maps and dictionaries of fixed-width values travel in the row
    /// format and come back as the same arrays, NULLs (of the value and inside it)
    /// included, next to fixed and byte columns.
    #[test]
    fn nested_columns_survive_the_round_trip_through_a_fragment() {
        use arrow::array::{Int32Builder, ListBuilder, MapBuilder, StringBuilder, StructArray};
        let mut list = ListBuilder::new(Int32Builder::new());
        for v in [
            Some(vec![Some(1), None, Some(3)]),
            None,
            Some(vec![]),
            Some(vec![Some(-7)]),
            Some(vec![Some(i32::MAX), Some(0)]),
        ] {
            list.append_option(v);
        }
        let list: ArrayRef = Arc::new(list.finish());
        let strukt: ArrayRef = Arc::new(StructArray::from(vec![
            (
                Arc::new(Field::new("a", DataType::Int64, true)),
                Arc::new(Int64Array::from(vec![
                    Some(1),
                    None,
                    Some(3),
                    Some(4),
                    Some(5),
                ])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("b", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec![
                    Some("x"),
                    Some("héllo"),
                    None,
                    Some(""),
                    Some("z"),
                ])) as ArrayRef,
            ),
        ]));
        let mut map = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
        for row in [
            vec![("k1", Some(1)), ("k2", None)],
            vec![],
            vec![("only", Some(9))],
            vec![("a", Some(1)), ("b", Some(2)), ("c", Some(3))],
            vec![("z", Some(-1))],
        ] {
            for (k, v) in row {
                map.keys().append_value(k);
                map.values().append_option(v);
            }
            map.append(true).unwrap();
        }
        let map: ArrayRef = Arc::new(map.finish());
        let dict: ArrayRef = Arc::new(
            arrow::array::DictionaryArray::<arrow::datatypes::Int32Type>::try_new(
                arrow::array::Int32Array::from(vec![Some(0), None, Some(1), Some(0), Some(2)]),
                Arc::new(Int64Array::from(vec![10, 20, 30])),
            )
            .unwrap(),
        );
        let cols: Vec<ArrayRef> = vec![
            list,
            Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])),
            strukt,
            map,
            Arc::new(StringArray::from(vec!["s1", "s2", "s3", "s4", "s5"])),
            dict,
        ];
        let (fields, batch) = sliced_batch(cols);
        let layout = RotatingLayout::new(&fields).unwrap();
        assert_eq!(layout.byte_columns(), 5);
        let order = [2u32, 0, 3, 1];
        let words = fragment_words(&layout, &batch, &order);
        let fragment = FragmentView::parse(&words).unwrap();
        layout.check(&fragment, 0).unwrap();
        for rows in [&[3u32, 0, 0, 2, 1][..], &[][..]] {
            for c in 0..fields.len() {
                let got = layout.decode(&fragment, c, rows).unwrap();
                let idx = batch_rows(rows, &order);
                let want = arrow::compute::take(batch.column(c).as_ref(), &idx, None).unwrap();
                assert_eq!(got.data_type(), want.data_type(), "column {c}");
                assert_eq!(got.as_ref(), want.as_ref(), "column {c}");
            }
        }
    }
}
