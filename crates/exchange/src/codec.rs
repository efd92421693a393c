//! Arrow IPC encoding of the batches of one stream.
//!
//! Each stream is an Arrow IPC stream cut into transport messages: the first
//! message carries the schema, later ones the dictionaries and record batches.
//! Keeping the IPC stream state per stream sends the schema once and lets
//! dictionary-encoded columns work unchanged.

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use bytes::Bytes;
use datafusion::common::Result;

/// Turns the batches of one stream into transport messages.
pub struct BatchEncoder {
    writer: StreamWriter<Vec<u8>>,
}

impl BatchEncoder {
    pub fn try_new(schema: &SchemaRef, compression: Option<CompressionType>) -> Result<Self> {
        let options = IpcWriteOptions::default().try_with_compression(compression)?;
        let writer = StreamWriter::try_new_with_options(Vec::new(), schema, options)?;
        Ok(Self { writer })
    }

    /// Encodes one batch (preceded by the schema on the first call).
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<Bytes> {
        self.writer.write(batch)?;
        Ok(Bytes::from(std::mem::take(self.writer.get_mut())))
    }
}

/// Turns the messages of one stream back into batches.
#[derive(Default)]
pub struct BatchDecoder {
    decoder: StreamDecoder,
}

impl BatchDecoder {
    /// Decodes every batch contained in one message.
    pub fn decode(&mut self, message: Bytes) -> Result<Vec<RecordBatch>> {
        let mut buf = Buffer::from(message);
        let mut out = vec![];
        while !buf.is_empty() {
            if let Some(batch) = self.decoder.decode(&mut buf)? {
                out.push(batch);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{DictionaryArray, Int64Array, StringArray};
    use arrow::datatypes::Int32Type;
    use std::sync::Arc;

    #[test]
    fn round_trip_with_dictionaries_and_compression() {
        let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
        let batch = RecordBatch::try_from_iter([
            ("k", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
            ("s", Arc::new(StringArray::from(vec!["x", "y", "z"])) as _),
            ("d", Arc::new(dict) as _),
        ])
        .unwrap();
        for compression in [
            None,
            Some(CompressionType::LZ4_FRAME),
            Some(CompressionType::ZSTD),
        ] {
            let mut enc = BatchEncoder::try_new(&batch.schema(), compression).unwrap();
            let mut dec = BatchDecoder::default();
            for _ in 0..3 {
                let msg = enc.encode(&batch).unwrap();
                assert_eq!(dec.decode(msg).unwrap(), vec![batch.clone()]);
            }
        }
    }
}
