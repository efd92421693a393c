//! Seeds and fuzz targets for the three decoders that read bytes arriving from other
//! nodes: exchange messages (Arrow IPC), cyclo-join fragments and stage plans.
//!
//! Seeds are made once by Gyre's own encoders (the exchange's `BatchEncoder` writing
//! into real transport buffers, the cyclo-join fragment encoder, the coordinator's
//! planning pipeline over a `LocalCluster`), so they are exactly what a worker receives.
//! Targets hold their one-time state in statics and decode with nothing in the way:
//! a panic in a target is a bug of the decoder it calls.

use arrow::array::{
    ArrayRef, BinaryArray, BinaryViewArray, BooleanArray, Date32Array, Date64Array,
    Decimal128Array, Decimal256Array, DictionaryArray, FixedSizeBinaryArray, Float32Array,
    Float64Array, Int8Array, Int16Array, Int32Array, Int32Builder, Int64Array, LargeStringArray,
    ListBuilder, MapBuilder, RecordBatch, RecordBatchOptions, StringArray, StringBuilder,
    StringViewArray, StructArray, TimestampMicrosecondArray, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, i256};
use bytes::Bytes;
use datafusion::common::ScalarValue;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_plan::ExecutionPlan;
use gyre_cluster::LocalCluster;
use gyre_cluster::codec::GyreCodec;
use gyre_cluster::files::LocalFiles;
use gyre_cluster::modify::{GyreModifyExec, Modification};
use gyre_cluster::progress::ReadCounters;
use gyre_cluster::storage::WorkerStorage;
use gyre_cluster::table::GyreInsertExec;
use gyre_cluster::tpch::TpchGenExec;
use gyre_exchange::cyclo::words::RotatingLayout;
use gyre_exchange::{BatchDecoder, BatchEncoder, Compression};
use gyre_join::KeyDomain;
use gyre_join::cyclo::fragment::encode_with_bytes;
use gyre_join::cyclo::{FragmentForm, FragmentView};
use gyre_transport::{SendEndpoint, SendSpec, TcpTransport, To, Transport, TransportConfig};
use std::sync::{Arc, LazyLock};

/// Runs `f` on a thread of its own with a fresh Tokio runtime, so seed generation works
/// whether or not the caller is inside a runtime already.
fn in_runtime<T: Send + 'static, F>(f: impl FnOnce() -> F + Send + 'static) -> T
where
    F: Future<Output = T>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a Tokio runtime")
            .block_on(f())
    })
    .join()
    .expect("seed generation panicked")
}

// ---------------------------------------------------------------------------------
// 1. Exchange messages
// ---------------------------------------------------------------------------------

/// Nullable fields named after their arrays, for `RecordBatch::try_new`.
fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let arrays = cols.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("a valid batch")
}

fn string_dict(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(
        values
            .iter()
            .copied()
            .collect::<DictionaryArray<Int32Type>>(),
    )
}

fn int_list(rows: &[Option<Vec<Option<i32>>>]) -> ArrayRef {
    let mut b = ListBuilder::new(Int32Builder::new());
    for r in rows {
        b.append_option(r.clone());
    }
    Arc::new(b.finish())
}

fn two_field_struct() -> ArrayRef {
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

fn string_map() -> ArrayRef {
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

/// The streams of the IPC seeds: each is the batches one exchange stream carries in its
/// first message (the schema travels with them, so a fresh decoder reads it).
fn ipc_streams() -> Vec<Vec<RecordBatch>> {
    let ints = batch(vec![
        (
            "i8",
            Arc::new(Int8Array::from(vec![Some(-3), None, Some(127), Some(-128)])),
        ),
        (
            "i16",
            Arc::new(Int16Array::from(vec![None, Some(-2), Some(3), None])),
        ),
        (
            "i32",
            Arc::new(Int32Array::from(vec![
                Some(i32::MIN),
                None,
                Some(0),
                Some(7),
            ])),
        ),
        (
            "i64",
            Arc::new(Int64Array::from(vec![
                Some(i64::MAX),
                Some(-1),
                None,
                Some(9),
            ])),
        ),
        (
            "u64",
            Arc::new(UInt64Array::from(vec![
                Some(u64::MAX),
                None,
                Some(1),
                Some(2),
            ])),
        ),
    ]);
    let floats = batch(vec![
        (
            "f32",
            Arc::new(Float32Array::from(vec![
                Some(1.5),
                None,
                Some(f32::NAN),
                Some(-0.0),
            ])),
        ),
        (
            "f64",
            Arc::new(Float64Array::from(vec![
                Some(1e300),
                Some(f64::INFINITY),
                None,
                Some(2.0),
            ])),
        ),
    ]);
    let strings = batch(vec![
        (
            "utf8",
            Arc::new(StringArray::from(vec![
                Some("héllo"),
                None,
                Some(""),
                Some("a"),
            ])),
        ),
        (
            "large",
            Arc::new(LargeStringArray::from(vec![
                Some("l1"),
                Some(""),
                None,
                Some("l4"),
            ])),
        ),
        (
            "view",
            Arc::new(StringViewArray::from(vec![
                Some("a string longer than twelve bytes"),
                Some("short"),
                None,
                Some(""),
            ])),
        ),
        (
            "bin",
            Arc::new(BinaryArray::from(vec![
                Some(&b"\x00\xff"[..]),
                None,
                Some(b""),
                Some(b"b"),
            ])),
        ),
    ]);
    // Two dictionaries in one stream: the second batch replaces the first's.
    let dict1 = batch(vec![
        ("d", string_dict(&[Some("x"), None, Some("yy"), Some("x")])),
        ("k", Arc::new(Int64Array::from(vec![1, 2, 3, 4]))),
    ]);
    let dict2 = batch(vec![
        (
            "d",
            string_dict(&[Some("zzz"), Some("zzz"), Some("w"), None]),
        ),
        ("k", Arc::new(Int64Array::from(vec![5, 6, 7, 8]))),
    ]);
    let nested = batch(vec![
        ("s", two_field_struct()),
        (
            "l",
            int_list(&[
                Some(vec![Some(1), None, Some(3)]),
                None,
                Some(vec![]),
                Some(vec![Some(-7)]),
            ]),
        ),
        ("m", string_map()),
    ]);
    let decimals = batch(vec![
        (
            "d128",
            Arc::new(
                Decimal128Array::from(vec![Some(i128::MAX), Some(-12345), None, Some(0)])
                    .with_precision_and_scale(38, 2)
                    .expect("decimal128(38, 2)"),
            ),
        ),
        (
            "d256",
            Arc::new(
                Decimal256Array::from(vec![
                    Some(i256::from_i128(-1)),
                    None,
                    Some(i256::from_i128(10_i128.pow(30))),
                    Some(i256::ZERO),
                ])
                .with_precision_and_scale(50, 4)
                .expect("decimal256(50, 4)"),
            ),
        ),
    ]);
    let times = batch(vec![
        (
            "d32",
            Arc::new(Date32Array::from(vec![
                Some(19000),
                None,
                Some(-1),
                Some(0),
            ])),
        ),
        (
            "d64",
            Arc::new(Date64Array::from(vec![
                Some(86_400_000),
                Some(0),
                None,
                Some(-1),
            ])),
        ),
        (
            "ts",
            Arc::new(
                TimestampMicrosecondArray::from(vec![
                    Some(1_700_000_000_000_000),
                    None,
                    Some(0),
                    Some(-5),
                ])
                .with_timezone("UTC"),
            ),
        ),
    ]);
    let booleans = batch(vec![
        (
            "b",
            Arc::new(BooleanArray::from(vec![
                Some(true),
                None,
                Some(false),
                Some(true),
            ])),
        ),
        (
            "nn",
            Arc::new(BooleanArray::from(vec![false, true, true, false])),
        ),
    ]);
    let empty = ints.slice(0, 0);
    // A batch without columns travels as a row count (the encoder's carrier column).
    let options = RecordBatchOptions::new().with_row_count(Some(7));
    let rows_only = RecordBatch::try_new_with_options(Arc::new(Schema::empty()), vec![], &options)
        .expect("a batch without columns");
    let n = 10_000;
    let big = batch(vec![
        ("k", Arc::new(Int64Array::from_iter_values(0..n))),
        (
            "v",
            Arc::new(StringArray::from_iter(
                (0..n).map(|i| (i % 10 != 0).then(|| format!("v{i}"))),
            )),
        ),
    ]);
    let sliced = strings.slice(1, 3);
    vec![
        vec![ints.clone()],
        vec![floats],
        vec![strings, sliced],
        vec![dict1, dict2],
        vec![nested],
        vec![decimals],
        vec![times],
        vec![booleans],
        vec![empty, ints],
        vec![rows_only.clone(), rows_only.slice(0, 0)],
        vec![big],
    ]
}

/// The message `batches` make when one encoder writes them all into one transport
/// buffer, as `ExchangeSenderExec` does.
async fn encode_message(
    send: &SendEndpoint,
    batches: &[RecordBatch],
    compression: Compression,
) -> Vec<u8> {
    let mut enc =
        BatchEncoder::try_new(&batches[0].schema(), compression.resolve(None)).expect("an encoder");
    let mut buf = send.acquire(To::Node(1)).await.expect("a send buffer");
    for b in batches {
        buf = enc.encode_into(b, buf).expect("encodable");
    }
    // Dropping the unsent buffer hands its credit back.
    buf.as_slice().to_vec()
}

/// Valid exchange messages: every stream of [`ipc_streams`] with no compression, LZ4
/// and Zstandard, written by `BatchEncoder` into a loopback transport's send buffer.
pub fn ipc_seeds() -> Vec<Vec<u8>> {
    let seeds = in_runtime(|| async {
        let any = "127.0.0.1:0".parse().expect("an address");
        let t = TcpTransport::bind(1, any, TransportConfig::default())
            .await
            .expect("a loopback transport");
        let send = t
            .open_send(SendSpec {
                query: 0,
                exchange: 0,
                from: 0,
                destinations: vec![1],
                groups: vec![],
            })
            .expect("a send endpoint");
        let mut seeds = vec![];
        for compression in [Compression::None, Compression::Lz4, Compression::Zstd] {
            for stream in ipc_streams() {
                seeds.push(encode_message(&send, &stream, compression).await);
            }
        }
        seeds
    });
    for s in &seeds {
        let got = BatchDecoder::default()
            .decode(Bytes::copy_from_slice(s))
            .expect("a seed decodes");
        assert!(!got.is_empty(), "a seed without batches");
    }
    seeds
}

/// Decodes one exchange message with a fresh decoder (what a receiver does with the
/// first message of a stream). `BatchDecoder::default()` is a few words: no schema to
/// build, and a fresh one per call keeps each input independent of the previous ones.
pub fn ipc_target(input: &[u8]) {
    let _ = BatchDecoder::default().decode(Bytes::copy_from_slice(input));
}

// ---------------------------------------------------------------------------------
// 2. Cyclo-join fragments
// ---------------------------------------------------------------------------------

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
pub fn cyclo_seeds() -> Vec<Vec<u8>> {
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
pub fn cyclo_target(input: &[u8]) {
    let words: Vec<u64> = input
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("eight bytes")))
        .collect();
    let Ok(fragment) = FragmentView::parse(&words) else {
        return;
    };
    let rows = fragment.rows();
    std::hint::black_box((
        fragment.keys().iter().sum::<u64>(),
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

// ---------------------------------------------------------------------------------
// 3. Stage plans
// ---------------------------------------------------------------------------------

/// The worker's decoding context: `worker_session` (its function registries) with the
/// extensions `Worker::task_ctx` adds that can be built without a running worker.
/// The `QueryContext` (a live transport) is left out: decoding never reads it.
static PLAN_CTX: LazyLock<Arc<TaskContext>> = LazyLock::new(|| {
    let mut state = gyre_cluster::session::worker_session(None, &LocalFiles::Anywhere)
        .expect("a worker session");
    let config = state
        .config()
        .clone()
        .with_extension(Arc::new(ReadCounters::default()))
        .with_extension(Arc::new(WorkerStorage::default()));
    *state.config_mut() = config;
    state.task_ctx()
});

/// Settings and statements the plan seeds are planned with: every exchange mode, the
/// join strategies (broadcast, shuffle, Flow-Join, cyclo-join), runtime filters, file
/// scans, window top-k, inserts.
const PLAN_QUERIES: &[(&str, &str)] = &[
    (
        "",
        "SELECT g, count(*), sum(f), avg(d), min(s), max(ts) FROM a GROUP BY g",
    ),
    (
        "",
        "SELECT a.s, b.name FROM a JOIN b ON a.k = b.k WHERE a.f > 10",
    ),
    (
        "",
        "SELECT * FROM a ORDER BY f DESC, s NULLS FIRST LIMIT 10",
    ),
    ("", "SELECT count(*) FROM a"),
    (
        "SET gyre.join_strategy = 'shuffle'",
        "SELECT a.g, count(*) FROM a JOIN b ON a.g = b.h GROUP BY a.g ORDER BY a.g",
    ),
    (
        "SET gyre.join_strategy = 'broadcast'",
        "SELECT * FROM a JOIN b ON a.k = b.k",
    ),
    (
        "SET gyre.join_strategy = 'cyclo'",
        "SELECT a.k, a.s, b.name FROM a JOIN b ON a.k = b.k",
    ),
    (
        "SET gyre.join_strategy = 'cyclo'",
        "SELECT a.s, b.name FROM a JOIN b ON a.k = b.k AND a.f > b.h",
    ),
    (
        "",
        "SELECT count(*) FROM a JOIN b ON a.k BETWEEN b.k AND b.k + 3",
    ),
    (
        "SET gyre.join_strategy = 'cyclo'",
        "SELECT * FROM a FULL JOIN b ON a.k = b.k",
    ),
    (
        "SET gyre.runtime_filters = true",
        "SELECT a.s, b.name FROM a JOIN b ON a.k = b.k WHERE b.h = 3",
    ),
    (
        "SET gyre.skew_detection = false",
        "SELECT a.k, b.h FROM a LEFT JOIN b ON a.g = b.h",
    ),
    (
        "",
        "SELECT * FROM (SELECT k, g, row_number() OVER (PARTITION BY g ORDER BY f DESC) AS rn \
         FROM a) WHERE rn <= 3",
    ),
    (
        "",
        "SELECT k, g, rank() OVER (PARTITION BY g ORDER BY f) AS r, \
         sum(f) OVER (ORDER BY k ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM a",
    ),
    ("", "SELECT DISTINCT g FROM a UNION ALL SELECT h FROM b"),
    (
        "",
        "SELECT * FROM a WHERE k NOT IN (SELECT k FROM b) AND EXISTS (SELECT 1 FROM b WHERE b.h = a.g)",
    ),
    (
        "",
        "SELECT CASE WHEN b THEN upper(s) ELSE lower(s) END, date_trunc('day', ts), \
         regexp_replace(s, 's(\\d)', 'x$1'), coalesce(d, 0), CAST(f AS BIGINT) % 3, \
         k IN (1, 2, 3), s LIKE 's1%', to_char(ts, '%Y') FROM a \
         WHERE ts > TIMESTAMP '1970-01-01 05:00:00' AND g <> 2",
    ),
    (
        "",
        "SELECT g, approx_percentile_cont(0.5) WITHIN GROUP (ORDER BY f), array_agg(k), \
         string_agg(s, ','), count(DISTINCT k) FROM a GROUP BY g HAVING count(*) > 1",
    ),
    (
        "",
        "SELECT name, sum(age), avg(age) FROM people GROUP BY name",
    ),
    ("", "SELECT p.name, a.s FROM people p JOIN a ON p.id = a.k"),
    ("", "INSERT INTO b SELECT k, g, s FROM a WHERE k < 10"),
];

/// Stage plans as the coordinator sends them: every stage of every query in
/// [`PLAN_QUERIES`], planned over a two-worker `LocalCluster` and encoded by
/// `GyreCodec`, plus Gyre nodes that only DML and table loading make (modify, TPC-H
/// generation). Each seed is checked to decode.
pub fn plan_seeds() -> Vec<Vec<u8>> {
    let seeds = in_runtime(|| async {
        let cluster = LocalCluster::start(2, 1, "127.0.0.1:0".parse().expect("an address"))
            .await
            .expect("a local cluster");
        let c = Arc::clone(&cluster.coordinator);
        c.sql(
            "CREATE TABLE a AS SELECT value AS k, value % 7 AS g, CAST(value AS DOUBLE) * 1.5 AS f, \
             concat('s', value) AS s, CAST(value AS DECIMAL(12, 2)) AS d, \
             to_timestamp(value * 3600) AS ts, value % 2 = 0 AS b \
             FROM generate_series(1, 2000) AS t(value)",
        )
        .await
        .expect("table a");
        c.sql(
            "CREATE TABLE b AS SELECT value AS k, value % 13 AS h, concat('b', value) AS name \
             FROM generate_series(1, 500) AS t(value)",
        )
        .await
        .expect("table b");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let csv = dir.path().join("people.csv");
        let rows: String = (0..200)
            .map(|i| format!("{i},name{},{}\n", i % 17, 20 + i % 50))
            .collect();
        std::fs::write(&csv, format!("id,name,age\n{rows}")).expect("a CSV file");
        c.sql(&format!(
            "CREATE EXTERNAL TABLE people STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'true')",
            csv.display()
        ))
        .await
        .expect("a CSV table");
        let workers = c.live_workers();
        let n = workers.len();
        let codec = GyreCodec;
        let mut seeds = vec![];
        for (set, sql) in PLAN_QUERIES {
            let session = c.new_session();
            if !set.is_empty() {
                c.sql_in(&session, set).await.expect("a setting");
            }
            let state = c.query_state(&session, &workers);
            let logical = state.create_logical_plan(sql).await.expect(sql);
            let physical = state.create_physical_plan(&logical).await.expect(sql);
            let dplan = c
                .distribute(state.config_options(), physical, n)
                .expect(sql);
            for stage in &dplan.stages {
                seeds.push(codec.encode_plan(Arc::clone(&stage.plan)).expect(sql));
            }
        }
        // Nodes of DML and loading, built as the coordinator builds them.
        let a = c.table("a").expect("table a").schema.clone();
        let k = || Arc::new(Column::new("k", 0));
        let gt = Arc::new(BinaryExpr::new(
            k(),
            Operator::Gt,
            Arc::new(Literal::new(ScalarValue::Int64(Some(5)))),
        ));
        let doubled = Arc::new(BinaryExpr::new(k(), Operator::Multiply, k()));
        let plans: Vec<Arc<dyn ExecutionPlan>> = vec![
            Arc::new(GyreModifyExec::new(
                "a".into(),
                Arc::clone(&a),
                n,
                vec![gt.clone()],
                Modification::Delete,
            )),
            Arc::new(GyreModifyExec::new(
                "a".into(),
                a,
                n,
                vec![gt],
                Modification::Update(vec![(0, doubled)]),
            )),
            Arc::new(GyreInsertExec::new(
                Arc::new(TpchGenExec::try_new("lineitem", 0.01, n).expect("a TPC-H generator")),
                "lineitem".into(),
                Some(0),
            )),
        ];
        for p in plans {
            seeds.push(codec.encode_plan(p).expect("an encodable node"));
        }
        drop(cluster);
        seeds
    });
    for s in &seeds {
        GyreCodec.decode_plan(s, &PLAN_CTX).expect("a seed decodes");
    }
    seeds
}

/// Decodes one stage plan as `Worker::start_query` does.
pub fn plan_target(input: &[u8]) {
    let _ = GyreCodec.decode_plan(input, &PLAN_CTX);
}
