//! Tasks an operator spawns for one partition.

/// Aborts a partition's task when the stream that owns it is dropped (the query was
/// cancelled or its consumer is gone), so no task outlives its query.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
