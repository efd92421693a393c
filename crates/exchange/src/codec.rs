//! Arrow IPC encoding of the batches of one stream, into pooled message buffers.
//!
//! Each stream is an Arrow IPC stream cut into transport messages: the first
//! message carries the schema, later ones the dictionaries and record batches.
//! Keeping the IPC stream state per stream sends the schema once and lets
//! dictionary-encoded columns work unchanged. The encoder writes straight into
//! the buffer the send endpoint handed out, so a batch is serialised exactly
//! once, even when the message goes to every worker.
//!
//! Batches without columns (what `SELECT count(*)` leaves after a projection) have an
//! empty IPC body, and arrow's stream decoder only completes such a message once more
//! bytes arrive, which at the end of a message or stream they never do: their rows
//! would be lost. They travel as one all-false boolean column under a reserved name
//! instead, dropped again on arrival.

use arrow::array::{BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::{BooleanBuffer, Buffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use bytes::Bytes;
use datafusion::common::{DataFusionError, Result};
use gyre_transport::SendBuffer;
use std::io::Write;
use std::sync::Arc;

/// Below this outgoing link rate (bytes per second), `auto` compresses with LZ4.
///
/// LZ4 compresses Arrow data at several hundred MB/s per core and typically
/// shrinks it by half or more; on a link slower than about 2 Gbit/s the wire
/// is the bottleneck and the saved bytes win, on a faster one the CPU would
/// be, so `auto` sends uncompressed.
pub const AUTO_LZ4_BELOW_BYTES_PER_SEC: f64 = 250e6;

/// Arrow IPC buffer compression of a query's exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
    /// LZ4 when the node's link rate is below [`AUTO_LZ4_BELOW_BYTES_PER_SEC`], else none.
    Auto,
}

impl Compression {
    /// Parses a setting: `none`, `lz4`, `zstd` or `auto` (no setting: none).
    pub fn parse(s: Option<&str>) -> Result<Self> {
        match s.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("none") => Ok(Self::None),
            Some("lz4") => Ok(Self::Lz4),
            Some("zstd") => Ok(Self::Zstd),
            Some("auto") => Ok(Self::Auto),
            Some(other) => Err(DataFusionError::Configuration(format!(
                "unknown compression '{other}' (expected none, lz4, zstd or auto)"
            ))),
        }
    }

    /// The setting's name, as [`Compression::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
            Self::Auto => "auto",
        }
    }

    /// The codec to use on a node whose outgoing link rate is `link_rate` bytes per
    /// second (measured by its multiplexer, or configured; `None`: unknown).
    ///
    /// `auto` picks LZ4 if and only if the rate is known and below
    /// [`AUTO_LZ4_BELOW_BYTES_PER_SEC`]; an unknown rate (nothing measured yet, no
    /// hint) counts as fast.
    pub fn resolve(self, link_rate: Option<f64>) -> Option<CompressionType> {
        match self {
            Self::None => None,
            Self::Lz4 => Some(CompressionType::LZ4_FRAME),
            Self::Zstd => Some(CompressionType::ZSTD),
            Self::Auto => match link_rate {
                Some(r) if r < AUTO_LZ4_BELOW_BYTES_PER_SEC => Some(CompressionType::LZ4_FRAME),
                _ => None,
            },
        }
    }
}

/// Where the IPC writer writes: the buffer of the message being filled.
#[derive(Default)]
struct Target(Option<SendBuffer>);

impl Write for Target {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match &mut self.0 {
            Some(buf) => buf.write(b),
            None => Err(std::io::Error::other("no message buffer to encode into")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Turns the batches of one stream into transport messages.
pub struct BatchEncoder {
    schema: SchemaRef,
    options: IpcWriteOptions,
    writer: Option<StreamWriter<Target>>,
}

/// The column that carries the row count of a batch without columns.
const ROWS_ONLY: &str = "__gyre_rows_only";

fn rows_only_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        ROWS_ONLY,
        DataType::Boolean,
        false,
    )]))
}

impl BatchEncoder {
    pub fn try_new(schema: &SchemaRef, compression: Option<CompressionType>) -> Result<Self> {
        let schema = if schema.fields().is_empty() {
            rows_only_schema()
        } else {
            SchemaRef::clone(schema)
        };
        Ok(Self {
            schema,
            options: IpcWriteOptions::default().try_with_compression(compression)?,
            writer: None,
        })
    }

    /// Appends `batch` to `buf` (preceded by the schema on the first call) and hands the
    /// buffer back.
    pub fn encode_into(&mut self, batch: &RecordBatch, buf: SendBuffer) -> Result<SendBuffer> {
        let writer = match &mut self.writer {
            Some(w) => {
                w.get_mut().0 = Some(buf);
                w
            }
            None => self.writer.insert(StreamWriter::try_new_with_options(
                Target(Some(buf)),
                &self.schema,
                self.options.clone(),
            )?),
        };
        let res = if batch.num_columns() == 0 {
            let rows = BooleanArray::new(BooleanBuffer::new_unset(batch.num_rows()), None);
            let carrier = RecordBatch::try_new(rows_only_schema(), vec![Arc::new(rows)])?;
            writer.write(&carrier)
        } else {
            writer.write(batch)
        };
        let buf = writer.get_mut().0.take().expect("set above");
        res?;
        Ok(buf)
    }
}

/// Turns the messages of one stream back into batches.
#[derive(Default)]
pub struct BatchDecoder {
    decoder: StreamDecoder,
}

impl BatchDecoder {
    /// Decodes every batch contained in one message. The batches may share the
    /// message's memory (no copy); see `gyre_transport::pool` for what that means for
    /// the receive pool.
    pub fn decode(&mut self, message: Bytes) -> Result<Vec<RecordBatch>> {
        check_ipc_sizes(&message)?;
        contain_panics("an exchange message", || self.decode_checked(message))
    }

    fn decode_checked(&mut self, message: Bytes) -> Result<Vec<RecordBatch>> {
        let mut buf = Buffer::from(message);
        let mut out = vec![];
        while !buf.is_empty() {
            if let Some(batch) = self.decoder.decode(&mut buf)? {
                let rows_only =
                    batch.num_columns() == 1 && batch.schema().field(0).name() == ROWS_ONLY;
                out.push(if rows_only {
                    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                    RecordBatch::try_new_with_options(Arc::new(Schema::empty()), vec![], &options)?
                } else {
                    batch
                });
            }
        }
        Ok(out)
    }
}

/// Runs a decoder of bytes from another node, turning a panic into an error that names
/// `what` was malformed. Arrow's IPC and row-format readers and DataFusion's plan
/// decoding assert or index without checking on some malformed inputs (found by
/// `tests/fuzz.rs`); a node answers those with an error instead of losing a thread.
pub fn contain_panics<T>(what: &str, decode: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the decoder failed");
        Err(DataFusionError::Execution(format!(
            "malformed {what}: {why}"
        )))
    })
}

/// Most bytes the compressed buffers of one message may say they decompress to.
/// Arrow allocates what a compressed buffer's length prefix claims before it
/// decompresses, so a forged prefix could make a worker allocate terabytes and abort:
/// the prefixes are summed and checked first. A message is at most the transport's
/// 256 MiB; LZ4 or Zstandard rarely shrinks Arrow data by more than 16 times.
pub const MAX_DECOMPRESSED_BYTES: u64 = 4 << 30;

/// Most rows one batch may claim (a batch of nulls needs no buffers to claim them).
const MAX_BATCH_ROWS: i64 = i32::MAX as i64;

/// Checks the sizes the IPC messages in `message` declare before Arrow acts on them:
/// every message is whole and within the buffer, row counts are bounded, and the
/// decompressed lengths of compressed buffers add up to at most
/// [`MAX_DECOMPRESSED_BYTES`]. Gyre's encoder writes whole messages into each
/// transport message, so a message cut short is an error too.
pub fn check_ipc_sizes(message: &[u8]) -> Result<()> {
    let bad = |what: String| DataFusionError::Execution(format!("bad IPC message: {what}"));
    let mut at = 0usize;
    let mut decompressed = 0u64;
    while at < message.len() {
        let word = |i: usize| -> Result<i32> {
            message
                .get(i..i + 4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| bad(format!("cut short at byte {i}")))
        };
        let mut meta_at = at + 4;
        let mut meta_len = word(at)?;
        if meta_len == -1 {
            meta_len = word(at + 4)?;
            meta_at += 4;
        }
        if meta_len == 0 {
            // End of stream.
            at = meta_at;
            continue;
        }
        let meta_len = usize::try_from(meta_len)
            .map_err(|_| bad(format!("negative metadata length {meta_len}")))?;
        let meta = message
            .get(meta_at..meta_at.saturating_add(meta_len))
            .ok_or_else(|| bad(format!("metadata of {meta_len} bytes cut short")))?;
        let parsed = arrow::ipc::root_as_message(meta)
            .map_err(|e| bad(format!("unreadable metadata: {e}")))?;
        let body_len = usize::try_from(parsed.bodyLength())
            .map_err(|_| bad(format!("negative body length {}", parsed.bodyLength())))?;
        let body_at = meta_at + meta_len;
        let body = message
            .get(body_at..body_at.saturating_add(body_len))
            .ok_or_else(|| bad(format!("body of {body_len} bytes cut short")))?;
        let batch = parsed
            .header_as_record_batch()
            .or_else(|| parsed.header_as_dictionary_batch().and_then(|d| d.data()));
        if let Some(batch) = batch {
            if !(0..=MAX_BATCH_ROWS).contains(&batch.length()) {
                return Err(bad(format!("a batch of {} rows", batch.length())));
            }
            if batch.compression().is_some() {
                for b in batch.buffers().into_iter().flatten() {
                    if b.length() == 0 {
                        continue;
                    }
                    let prefix = usize::try_from(b.offset())
                        .ok()
                        .and_then(|o| body.get(o..o.checked_add(8)?))
                        .ok_or_else(|| bad("a compressed buffer outside its body".into()))?;
                    let claimed = i64::from_le_bytes(prefix.try_into().expect("eight bytes"));
                    // -1: the buffer was left uncompressed.
                    if claimed < -1 {
                        return Err(bad(format!("a decompressed length of {claimed}")));
                    }
                    decompressed = decompressed.saturating_add(claimed.max(0) as u64);
                }
                if decompressed > MAX_DECOMPRESSED_BYTES {
                    return Err(bad(format!(
                        "its buffers claim {decompressed} bytes decompressed, more than \
                         {MAX_DECOMPRESSED_BYTES}"
                    )));
                }
            }
        }
        at = body_at + body_len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{lone_node, stream_to_self};
    use arrow::array::{DictionaryArray, Int64Array, StringArray};
    use arrow::datatypes::Int32Type;
    use gyre_transport::To;
    use std::sync::Arc;

    #[test]
    fn auto_compresses_only_on_slow_links() {
        let auto = Compression::parse(Some("AUTO")).unwrap();
        assert_eq!(auto, Compression::Auto);
        // 1 Gbit/s: the wire is the bottleneck.
        assert_eq!(auto.resolve(Some(125e6)), Some(CompressionType::LZ4_FRAME));
        // The threshold itself and anything faster (10 Gbit/s, loopback) stay plain.
        assert_eq!(auto.resolve(Some(AUTO_LZ4_BELOW_BYTES_PER_SEC)), None);
        assert_eq!(auto.resolve(Some(1.25e9)), None);
        // Nothing measured and no hint: treated as fast.
        assert_eq!(auto.resolve(None), None);
        assert_eq!(
            Compression::Zstd.resolve(Some(1e12)),
            Some(CompressionType::ZSTD)
        );
        assert_eq!(Compression::None.resolve(Some(1.0)), None);
        assert_eq!(Compression::parse(None).unwrap(), Compression::None);
        let e = Compression::parse(Some("gzip")).unwrap_err().to_string();
        assert!(e.contains("gzip") && e.contains("auto"), "{e}");
    }

    #[tokio::test]
    async fn round_trip_through_pooled_buffers_with_dictionaries_and_compression() {
        let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
        let batch = RecordBatch::try_from_iter([
            ("k", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
            ("s", Arc::new(StringArray::from(vec!["x", "y", "z"])) as _),
            ("d", Arc::new(dict) as _),
        ])
        .unwrap();
        let t = lone_node().await;
        for (q, compression) in [
            None,
            Some(CompressionType::LZ4_FRAME),
            Some(CompressionType::ZSTD),
        ]
        .into_iter()
        .enumerate()
        {
            let q = q as u64;
            let (send, recv) = stream_to_self(&t, q);
            let mut enc = BatchEncoder::try_new(&batch.schema(), compression).unwrap();
            let mut dec = BatchDecoder::default();
            for _ in 0..3 {
                let buf = send.acquire(To::Node(1)).await.unwrap();
                // Two batches in one message.
                let buf = enc.encode_into(&batch, buf).unwrap();
                let buf = enc.encode_into(&batch, buf).unwrap();
                send.put(buf, false).unwrap();
                let r = recv.get().await.unwrap().unwrap();
                assert_eq!(dec.decode(r.bytes()).unwrap(), vec![batch.clone(); 2]);
                recv.release(r);
            }
            // Batches without columns keep their row counts, also as the last thing
            // in a message.
            let empty = Arc::new(Schema::empty());
            let mut enc = BatchEncoder::try_new(&empty, compression).unwrap();
            let rows_only = |n| {
                let options = RecordBatchOptions::new().with_row_count(Some(n));
                RecordBatch::try_new_with_options(Arc::clone(&empty), vec![], &options).unwrap()
            };
            let mut dec = BatchDecoder::default();
            let (send2, recv2) = stream_to_self(&t, q + 100);
            let buf = send2.acquire(To::Node(1)).await.unwrap();
            let buf = enc.encode_into(&rows_only(7), buf).unwrap();
            let buf = enc.encode_into(&rows_only(0), buf).unwrap();
            let buf = enc.encode_into(&rows_only(3), buf).unwrap();
            send2.put(buf, false).unwrap();
            let r = recv2.get().await.unwrap().unwrap();
            let got: Vec<(usize, usize)> = dec
                .decode(r.bytes())
                .unwrap()
                .iter()
                .map(|b| (b.num_columns(), b.num_rows()))
                .collect();
            assert_eq!(got, vec![(0, 7), (0, 0), (0, 3)]);
            recv2.release(r);
        }
    }

    /// Where the first non-empty buffer of the first batch in an IPC stream begins.
    fn first_compressed_buffer(bytes: &[u8]) -> usize {
        let mut at = 0;
        loop {
            let len = i32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            let meta = arrow::ipc::root_as_message(&bytes[at + 8..at + 8 + len]).unwrap();
            let body_at = at + 8 + len;
            if let Some(b) = meta.header_as_record_batch() {
                let first = b
                    .buffers()
                    .unwrap()
                    .iter()
                    .find(|b| b.length() > 0)
                    .unwrap();
                return body_at + first.offset() as usize;
            }
            at = body_at + meta.bodyLength() as usize;
        }
    }

    #[test]
    fn forged_sizes_are_refused_before_arrow_allocates() {
        let batch = RecordBatch::try_from_iter([(
            "k",
            Arc::new(Int64Array::from_iter_values(0..1000)) as _,
        )])
        .unwrap();
        let mut bytes = vec![];
        {
            let options = IpcWriteOptions::default()
                .try_with_compression(Some(CompressionType::LZ4_FRAME))
                .unwrap();
            let mut w =
                StreamWriter::try_new_with_options(&mut bytes, &batch.schema(), options).unwrap();
            w.write(&batch).unwrap();
            w.finish().unwrap();
        }
        check_ipc_sizes(&bytes).unwrap();
        let decoded = BatchDecoder::default()
            .decode(Bytes::from(bytes.clone()))
            .unwrap();
        assert_eq!(decoded, vec![batch]);
        let cut = check_ipc_sizes(&bytes[..bytes.len() - 9]).unwrap_err();
        assert!(cut.to_string().contains("cut short"), "{cut}");
        // A compressed buffer that claims a petabyte is refused, not allocated.
        let at = first_compressed_buffer(&bytes);
        bytes[at..at + 8].copy_from_slice(&(1i64 << 50).to_le_bytes());
        let e = BatchDecoder::default()
            .decode(Bytes::from(bytes.clone()))
            .unwrap_err();
        assert!(e.to_string().contains("decompressed"), "{e}");
        bytes[at..at + 8].copy_from_slice(&(-7i64).to_le_bytes());
        assert!(check_ipc_sizes(&bytes).is_err());
        // Garbage is an error, never a panic.
        for n in 0..bytes.len() {
            let mut b = bytes.clone();
            b[n] ^= 0x5a;
            let _ = BatchDecoder::default().decode(Bytes::from(b));
        }
    }
}
