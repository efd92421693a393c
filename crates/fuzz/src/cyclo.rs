//! Cyclo-join fragments: the words a rotating fragment carries around the ring, parsed
//! and decoded column by column as the join kernels read them.

use crate::arrays::{batch, int_list, string_dict, string_map, two_field_struct};
use arrow::array::{
    ArrayRef, BinaryArray, BinaryViewArray, BooleanArray, Date32Array, Decimal128Array,
    Decimal256Array, DictionaryArray, FixedSizeBinaryArray, Float32Array, Float64Array, Int8Array,
    Int16Array, Int32Array, Int64Array, LargeStringArray, RecordBatch, StringArray,
    StringViewArray, TimestampMicrosecondArray, UInt32Array,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, i256};
use gyre_exchange::cyclo::words::RotatingLayout;
use gyre_join::KeyDomain;
use gyre_join::cyclo::fragment::encode_with_bytes;
use gyre_join::cyclo::{FragmentForm, FragmentView};
use std::sync::{Arc, LazyLock};

/// Rows of the cyclo seeds: every column of a layout's batch has this many.
const CYCLO_ROWS: usize = 6;

/// The rotating inputs the target knows, each a layout and a batch of it. Their
/// payload/byte column counts differ, so a fragment's header picks its layout.
fn cyclo_batches() -> Vec<RecordBatch> {
    let n = CYCLO_ROWS;
    let strs = |p: &str| -> Vec<Option<String>> {
        (0..n)
            .map(|i| (i != 2).then(|| format!("{p}{}", "x".repeat(i * 3))))
            .collect()
    };
    let wide: Vec<(&str, ArrayRef)> = vec![
        (
            "i8",
            Arc::new(Int8Array::from(vec![
                Some(-3),
                None,
                Some(7),
                Some(-128),
                Some(1),
                Some(0),
            ])),
        ),
        (
            "i16",
            Arc::new(Int16Array::from(vec![1, -2, 3, i16::MIN, 0, 5])),
        ),
        (
            "u32",
            Arc::new(UInt32Array::from(vec![
                Some(u32::MAX),
                Some(0),
                None,
                Some(5),
                None,
                Some(1),
            ])),
        ),
        (
            "i64",
            Arc::new(Int64Array::from(vec![i64::MIN, -1, 0, i64::MAX, 9, 10])),
        ),
        (
            "f32",
            Arc::new(Float32Array::from(vec![
                Some(1.5),
                None,
                Some(-0.0),
                Some(2.0),
                None,
                Some(f32::NAN),
            ])),
        ),
        (
            "f64",
            Arc::new(Float64Array::from(vec![
                1e300,
                -2.5,
                0.0,
                f64::INFINITY,
                1.0,
                3.0,
            ])),
        ),
        (
            "d32",
            Arc::new(Date32Array::from(vec![
                Some(19000),
                None,
                Some(-1),
                Some(0),
                Some(3),
                Some(4),
            ])),
        ),
        (
            "b",
            Arc::new(BooleanArray::from(vec![
                Some(true),
                Some(false),
                None,
                Some(true),
                None,
                Some(false),
            ])),
        ),
        (
            "d128",
            Arc::new(
                Decimal128Array::from(vec![
                    Some(i128::MAX),
                    Some(-12345),
                    None,
                    Some(0),
                    Some(1),
                    Some(2),
                ])
                .with_precision_and_scale(38, 2)
                .expect("decimal128(38, 2)"),
            ),
        ),
        ("s", Arc::new(StringArray::from(strs("s")))),
        (
            "ls",
            Arc::new(LargeStringArray::from(strs("large string "))),
        ),
        (
            "sv",
            Arc::new(StringViewArray::from(strs(
                "a view longer than twelve bytes",
            ))),
        ),
        (
            "bin",
            Arc::new(BinaryArray::from(vec![
                Some(&b"\x00\xff"[..]),
                None,
                Some(b""),
                Some(b"bin"),
                Some(b"\x01"),
                Some(b"z"),
            ])),
        ),
        (
            "fsb",
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    vec![
                        Some(*b"abcdefghijk"),
                        None,
                        Some(*b"ABCDEFGHIJK"),
                        Some([0; 11]),
                        None,
                        Some([9; 11]),
                    ]
                    .into_iter(),
                    11,
                )
                .expect("fixed-size binaries"),
            ),
        ),
        (
            "dict",
            string_dict(&[
                Some("x"),
                None,
                Some("yy"),
                Some("x"),
                Some("zzz"),
                Some("x"),
            ]),
        ),
        (
            "ts",
            Arc::new(
                TimestampMicrosecondArray::from(vec![
                    Some(1),
                    None,
                    Some(-1),
                    Some(0),
                    Some(3),
                    Some(i64::MAX),
                ])
                .with_timezone("UTC"),
            ),
        ),
        (
            "d256",
            Arc::new(
                Decimal256Array::from(vec![
                    Some(i256::from_i128(-7)),
                    None,
                    Some(i256::MAX),
                    Some(i256::ZERO),
                    Some(i256::ONE),
                    None,
                ])
                .with_precision_and_scale(76, 3)
                .expect("decimal256(76, 3)"),
            ),
        ),
        (
            "bv",
            Arc::new(BinaryViewArray::from(vec![
                Some(&b"long binary view value"[..]),
                None,
                Some(b""),
                Some(b"a"),
                Some(b"b"),
                Some(b"c"),
            ])),
        ),
    ];
    let nested: Vec<(&str, ArrayRef)> = vec![
        (
            "l",
            int_list(&[
                Some(vec![Some(1), None, Some(3)]),
                None,
                Some(vec![]),
                Some(vec![Some(-7)]),
                Some(vec![Some(i32::MAX), Some(0)]),
                None,
            ]),
        ),
        ("k", Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5, 6]))),
        ("st", {
            let s = two_field_struct();
            arrow::compute::concat(&[s.as_ref(), s.slice(0, 2).as_ref()]).expect("six structs")
        }),
        ("m", {
            let m = string_map();
            arrow::compute::concat(&[m.as_ref(), m.slice(1, 2).as_ref()]).expect("six maps")
        }),
        ("s", Arc::new(StringArray::from(strs("s")))),
        (
            "di",
            Arc::new(
                DictionaryArray::<Int32Type>::try_new(
                    Int32Array::from(vec![Some(0), None, Some(1), Some(0), Some(2), Some(2)]),
                    Arc::new(Int64Array::from(vec![10, 20, 30])),
                )
                .expect("a dictionary of integers"),
            ),
        ),
    ];
    let narrow = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![10, 20, 30, 40, 50, 60])),
            Arc::new(StringArray::from(strs("n"))),
        ],
    )
    .expect("a narrow batch");
    // More than 64 columns: two validity words per row.
    let many: Vec<(String, ArrayRef)> = (0..70)
        .map(|c| {
            let a: ArrayRef = Arc::new(Int32Array::from_iter(
                (0..n as i32).map(|r| ((r + c) % 5 != 0).then_some(r * c)),
            ));
            (format!("c{c}"), a)
        })
        .collect();
    vec![
        batch(wide),
        batch(nested),
        narrow,
        batch(
            many.iter()
                .map(|(n, a)| (n.as_str(), Arc::clone(a)))
                .collect(),
        ),
    ]
}

/// The rotating layouts the target tries on each fragment, as `CycloJoinExec` builds
/// them from its rotating input's fields.
static LAYOUTS: LazyLock<Vec<RotatingLayout>> = LazyLock::new(|| {
    cyclo_batches()
        .iter()
        .map(|b| RotatingLayout::new(b.schema().fields()).expect("a rotating layout"))
        .collect()
});

/// Words 1 and 2 of a fragment as the roundabout stamps them (`stamp` is crate-private):
/// origin and flags, sequence number.
fn stamp(words: &mut [u64], origin: u32, seq: u64, last: bool) {
    let flags = (words[1] >> 32) | u64::from(last);
    words[1] = (flags << 32) | u64::from(origin);
    words[2] = seq;
}

/// One fragment of `batch`'s rows `order` in `form`, as `CycloJoinExec` injects it:
/// the layout's words, plus row numbers when `row_ids` (full outer joins).
fn fragment(
    layout: &RotatingLayout,
    batch: &RecordBatch,
    order: &[u32],
    form: FragmentForm,
    domain: KeyDomain,
    row_ids: bool,
) -> Vec<u64> {
    let enc = layout.encode(batch).expect("an encodable batch");
    let mut payload: Vec<Vec<u64>> = enc.words.clone();
    if row_ids {
        payload.push((0..batch.num_rows() as u64).collect());
    }
    let payload: Vec<&[u64]> = payload.iter().map(Vec::as_slice).collect();
    let keys: Vec<u64> = (0..batch.num_rows() as i64)
        .map(|k| (k * 7 - 20) as u64)
        .collect();
    let rows = order.len() as u32;
    let bounds: Vec<u32> = match form {
        // Monotone bounds over all rows (the target reads them; it does not rehash).
        FragmentForm::HashPartitioned { bits } => {
            let parts = 1u32 << bits;
            (0..=parts).map(|p| rows * p / parts).collect()
        }
        _ => vec![],
    };
    encode_with_bytes(
        form,
        domain,
        &keys,
        &payload,
        &enc.byte_columns(),
        order,
        &bounds,
    )
}

/// Valid cyclo-join fragments of every layout in [`LAYOUTS`], in every form, as the
/// little-endian bytes of their words.
pub fn seeds() -> Vec<Vec<u8>> {
    let batches = cyclo_batches();
    let forms = [
        FragmentForm::Raw,
        FragmentForm::Sorted,
        FragmentForm::HashPartitioned { bits: 2 },
    ];
    let mut seeds = vec![];
    for (i, (layout, b)) in LAYOUTS.iter().zip(&batches).enumerate() {
        for (j, form) in forms.into_iter().enumerate() {
            let domain = if j % 2 == 0 {
                KeyDomain::Signed
            } else {
                KeyDomain::Unsigned
            };
            let order: Vec<u32> = match form {
                FragmentForm::Sorted => (0..CYCLO_ROWS as u32).collect(),
                _ => vec![3, 1, 0, 5, 2, 4],
            };
            let mut w = fragment(layout, b, &order, form, domain, j == 1);
            stamp(&mut w, i as u32, (j * 0x0003_0002_0001) as u64, j == 2);
            seeds.push(w);
        }
        // A fragment of some rows, one repeated, and an empty last fragment.
        seeds.push(fragment(
            layout,
            b,
            &[4, 4, 0],
            FragmentForm::Raw,
            KeyDomain::Signed,
            false,
        ));
        let mut empty = fragment(layout, b, &[], FragmentForm::Raw, KeyDomain::Signed, false);
        stamp(&mut empty, 1, 9, true);
        seeds.push(empty);
    }
    seeds
        .into_iter()
        .map(|w| {
            assert!(FragmentView::parse(&w).is_ok(), "a seed fragment parses");
            w.iter().flat_map(|x| x.to_le_bytes()).collect()
        })
        .collect()
}

/// What a worker does with a fragment from the ring: `FragmentView::parse` (the
/// roundabout), the kernel's reads (keys, partition bounds), then per layout whose
/// `check` passes (with or without the full-outer row-number column) every column
/// rebuilt for all rows and for a few rows chosen by the input. Those come from the
/// sequence number, a word `parse` does not check; they are taken modulo the row
/// count, as the kernels only ever name rows of the fragment.
pub fn run(input: &[u8]) {
    let words: Vec<u64> = input
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("eight bytes")))
        .collect();
    let Ok(fragment) = FragmentView::parse(&words) else {
        return;
    };
    let rows = fragment.rows();
    std::hint::black_box((
        // Every key is read; wrapping, as keys are any 64-bit words.
        fragment.keys().iter().fold(0u64, |a, k| a.wrapping_add(*k)),
        fragment.partition_bounds(),
        fragment.domain(),
        fragment.form(),
        fragment.origin(),
        fragment.is_last(),
    ));
    if rows == 0 {
        return;
    }
    let all: Vec<u32> = (0..rows as u32).collect();
    let seq = fragment.seq();
    let picked: Vec<u32> = (0..4)
        .map(|i| ((seq >> (16 * i)) & 0xffff) as u32 % rows as u32)
        .collect();
    for layout in LAYOUTS.iter() {
        for extra in 0..=1 {
            if layout.check(&fragment, extra).is_err() {
                continue;
            }
            for c in 0..layout.fields().len() {
                let _ = layout.decode(&fragment, c, &all);
                let _ = layout.decode(&fragment, c, &picked);
            }
        }
    }
}
