//! Tasks an operator spawns for one partition.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::Result;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Aborts a partition's task when the stream that owns it is dropped (the query was
/// cancelled or its consumer is gone), so no task outlives its query.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Batches a detached operator may run ahead of its consumer.
const AHEAD: usize = 2;

/// Runs `stream` to its end in a task of its own and hands its batches to the returned
/// stream while that is read. An operator that exchanges data with the other workers
/// (a Flow-Join) has to finish its part even when its consumer stops early (a LIMIT
/// above it has its rows): dropping it midway would drop its send endpoints, and its
/// peers would fail with "the sender was cancelled" while they still need its rows,
/// reports or announcements. After the consumer leaves, the batches are discarded. The
/// task ends with the stream or its first error; a released query fails the stream's
/// endpoints, so it ends then at the latest.
pub(crate) fn run_detached(
    schema: SchemaRef,
    stream: BoxStream<'static, Result<RecordBatch>>,
) -> SendableRecordBatchStream {
    let (tx, rx) = mpsc::channel(AHEAD);
    tokio::spawn(async move {
        let mut stream = stream;
        let mut consumer = Some(tx);
        while let Some(item) = stream.next().await {
            // DataFusion streams need not end after an error (a join over a failed
            // input may report it again on every poll): the first one ends the task.
            let failed = item.is_err();
            if let Some(tx) = &consumer
                && tx.send(item).await.is_err()
            {
                consumer = None;
            }
            if failed {
                break;
            }
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        ReceiverStream::new(rx),
    ))
}
