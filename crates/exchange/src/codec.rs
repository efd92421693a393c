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
}
