//! Gyre's operators in the worker's memory pool: what they collect counts against
//! it as it arrives, so a query whose state does not fit fails with "Resources
//! exhausted" naming the operator instead of the process running out of memory.

use arrow::array::RecordBatch;
use datafusion::common::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use futures::{Stream, TryStreamExt};

/// Every batch of `stream`, each counted in `reservation` before it is kept.
pub(crate) async fn collect_counted(
    stream: impl Stream<Item = Result<RecordBatch>>,
    reservation: &MemoryReservation,
) -> Result<Vec<RecordBatch>> {
    let mut stream = std::pin::pin!(stream);
    let mut batches = vec![];
    while let Some(b) = stream.try_next().await? {
        reservation.try_grow(b.get_array_memory_size())?;
        batches.push(b);
    }
    Ok(batches)
}
