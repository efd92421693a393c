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

/// The first batches of `stream` until they hold at least `rows` rows (all of it if
/// it has fewer), each counted in `reservation`, and whether the stream ended.
pub(crate) async fn collect_counted_prefix(
    stream: &mut (impl Stream<Item = Result<RecordBatch>> + Unpin),
    rows: usize,
    reservation: &MemoryReservation,
) -> Result<(Vec<RecordBatch>, bool)> {
    let mut batches = vec![];
    let mut taken = 0;
    while taken < rows {
        let Some(b) = stream.try_next().await? else {
            return Ok((batches, true));
        };
        reservation.try_grow(b.get_array_memory_size())?;
        taken += b.num_rows();
        batches.push(b);
    }
    Ok((batches, false))
}
