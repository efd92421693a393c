//! Exchange messages: Arrow IPC with optional LZ4 or ZSTD compression, as
//! `ExchangeReceiverExec` decodes them from another node's stage.

use crate::arrays::{batch, int_list, string_dict, string_map, two_field_struct};
use crate::in_runtime;
use arrow::array::{
    BinaryArray, BooleanArray, Date32Array, Date64Array, Decimal128Array, Decimal256Array,
    Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, LargeStringArray,
    RecordBatch, RecordBatchOptions, StringArray, StringViewArray, TimestampMicrosecondArray,
    UInt64Array,
};
use arrow::datatypes::{Schema, i256};
use bytes::Bytes;
use gyre_exchange::{BatchDecoder, BatchEncoder, Compression};
use gyre_transport::{SendEndpoint, SendSpec, TcpTransport, To, Transport, TransportConfig};
use std::sync::Arc;

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
    buf.to_vec()
}

/// Valid exchange messages: every stream of [`ipc_streams`] with no compression, LZ4
/// and Zstandard, written by `BatchEncoder` into a loopback transport's send buffer.
pub fn seeds() -> Vec<Vec<u8>> {
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
pub fn run(input: &[u8]) {
    let _ = BatchDecoder::default().decode(Bytes::copy_from_slice(input));
}
