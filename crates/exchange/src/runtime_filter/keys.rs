//! What a run-time filter knows of a join's build side: the hashes of its keys, and
//! where each worker's filters wait to be picked up.

use crate::key_hash::{hash_keys, keys_valid};
use arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use arrow::buffer::BooleanBuffer;
use datafusion::common::{HashSet, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Distinct build keys a filter holds at most; a larger build side prunes nothing
/// (its filter lets every row through). 2^18 hashes are 4 MiB of set.
pub const MAX_FILTER_KEYS: usize = 1 << 18;

/// The keys of a join's build side, by hash: a probe row whose key hash is not in the
/// set matches no build row. Hash collisions only let rows through.
#[derive(Debug, Default)]
pub struct KeyFilter {
    /// `None` when the build side had more than [`MAX_FILTER_KEYS`] distinct keys.
    hashes: Option<HashSet<u64>>,
}

impl KeyFilter {
    /// A filter that lets every row through (a build side too large, or one that ended
    /// without completing).
    pub fn pass_all() -> Self {
        Self { hashes: None }
    }

    /// A filter holding `hashes` (`None`: one that lets every row through).
    pub fn from_hashes(hashes: Option<HashSet<u64>>) -> Self {
        Self { hashes }
    }

    /// Distinct key hashes held, `None` when the filter lets everything through.
    pub fn keys(&self) -> Option<usize> {
        self.hashes.as_ref().map(HashSet::len)
    }

    /// The key hashes held, `None` when the filter lets everything through.
    pub fn hashes(&self) -> Option<&HashSet<u64>> {
        self.hashes.as_ref()
    }

    /// Which rows of `keys` (the probe key columns) may match; rows with a null key
    /// never match (the joins filtered compare keys with null equal to nothing).
    /// `hashes` is scratch space, kept by the caller from batch to batch.
    pub fn may_match(
        &self,
        keys: &[ArrayRef],
        rows: usize,
        hashes: &mut Vec<u64>,
    ) -> Result<Option<BooleanArray>> {
        let Some(set) = &self.hashes else {
            return Ok(None);
        };
        hash_keys(keys, rows, hashes)?;
        let known = BooleanBuffer::collect_bool(rows, |i| set.contains(&hashes[i]));
        let keep = match keys_valid(keys) {
            Some(valid) => &known & valid.inner(),
            None => known,
        };
        Ok(Some(BooleanArray::new(keep, None)))
    }
}

/// Builds a [`KeyFilter`] from the build side's batches as they pass.
#[derive(Debug, Default)]
pub struct KeyFilterBuilder {
    hashes: HashSet<u64>,
    overflowed: bool,
    buf: Vec<u64>,
}

impl KeyFilterBuilder {
    /// Adds the keys of one batch (nulls never match, so they are not added).
    pub fn add(&mut self, keys: &[ArrayRef], rows: usize) -> Result<()> {
        if self.overflowed || rows == 0 {
            return Ok(());
        }
        hash_keys(keys, rows, &mut self.buf)?;
        match keys_valid(keys) {
            Some(valid) => self
                .hashes
                .extend(valid.valid_indices().map(|i| self.buf[i])),
            None => self.hashes.extend(self.buf.iter().copied()),
        }
        if self.hashes.len() > MAX_FILTER_KEYS {
            self.overflowed = true;
            self.hashes = HashSet::default();
        }
        Ok(())
    }

    pub fn finish(self) -> KeyFilter {
        KeyFilter {
            hashes: (!self.overflowed).then_some(self.hashes),
        }
    }
}

/// The key columns of `batch` at `columns`.
pub fn key_columns(batch: &RecordBatch, columns: &[usize]) -> Vec<ArrayRef> {
    columns
        .iter()
        .map(|&c| Arc::clone(batch.column(c)))
        .collect()
}

/// One filter's slot: empty until its source publishes.
type Slot = watch::Sender<Option<Arc<KeyFilter>>>;

/// Where the filters of one query's stage on this node are published and awaited:
/// one slot per (filter id, partition), created by whichever side comes first.
#[derive(Debug, Default)]
pub struct FilterSlots {
    slots: Mutex<HashMap<(u32, usize), Slot>>,
}

impl FilterSlots {
    fn slot(&self, id: u32, partition: usize) -> Slot {
        self.slots
            .lock()
            .entry((id, partition))
            .or_insert_with(|| watch::channel(None).0)
            .clone()
    }

    /// Publishes filter `id` of `partition` (the first publication stands).
    pub fn publish(&self, id: u32, partition: usize, filter: Arc<KeyFilter>) {
        self.slot(id, partition).send_if_modified(|f| match f {
            Some(_) => false,
            None => {
                *f = Some(filter);
                true
            }
        });
    }

    /// Waits for filter `id` of `partition`.
    pub async fn wait(&self, id: u32, partition: usize) -> Arc<KeyFilter> {
        let mut rx = self.slot(id, partition).subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(f) => f.clone().unwrap_or_default(),
            // Unreachable while `self` holds the sender; let rows through regardless.
            Err(_) => Arc::new(KeyFilter::pass_all()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array};

    fn col(v: Vec<Option<i64>>) -> Vec<ArrayRef> {
        vec![Arc::new(Int64Array::from(v))]
    }

    #[test]
    fn a_filter_keeps_exactly_the_rows_whose_key_the_build_side_has() {
        let mut b = KeyFilterBuilder::default();
        b.add(&col(vec![Some(1), Some(3), None, Some(3)]), 4)
            .unwrap();
        let f = b.finish();
        assert_eq!(f.keys(), Some(2), "the null is not a key");
        let probe = col((0..6).map(Some).chain([None]).collect());
        let keep = f.may_match(&probe, 7, &mut Vec::new()).unwrap().unwrap();
        let kept: Vec<bool> = keep.iter().map(|b| b.unwrap()).collect();
        assert_eq!(kept, [false, true, false, true, false, false, false]);
    }

    #[test]
    fn a_row_with_a_null_in_any_key_column_is_neither_a_key_nor_kept() {
        let two = |a: Vec<Option<i64>>, b: Vec<Option<i64>>| -> Vec<ArrayRef> {
            vec![Arc::new(Int64Array::from(a)), Arc::new(Int64Array::from(b))]
        };
        let mut b = KeyFilterBuilder::default();
        let build = two(vec![Some(1), Some(2), None], vec![Some(10), None, Some(30)]);
        b.add(&build, 3).unwrap();
        let f = b.finish();
        assert_eq!(f.keys(), Some(1));
        let probe = two(
            vec![Some(1), Some(1), Some(2), None, Some(3)],
            vec![Some(10), None, Some(20), Some(30), Some(10)],
        );
        let keep = f.may_match(&probe, 5, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(keep.null_count(), 0);
        let kept: Vec<bool> = keep.iter().map(|b| b.unwrap()).collect();
        assert_eq!(kept, [true, false, false, false, false]);
    }

    #[test]
    fn a_build_side_with_too_many_keys_lets_everything_through() {
        let mut b = KeyFilterBuilder::default();
        let n = MAX_FILTER_KEYS + 1;
        b.add(&col((0..n as i64).map(Some).collect()), n).unwrap();
        let f = b.finish();
        assert_eq!(f.keys(), None);
        assert!(
            f.may_match(&col(vec![Some(-1)]), 1, &mut Vec::new())
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_filter_is_awaited_before_or_after_it_is_published() {
        let slots = Arc::new(FilterSlots::default());
        let s = Arc::clone(&slots);
        let waiter = tokio::spawn(async move { s.wait(7, 2).await.keys() });
        tokio::task::yield_now().await;
        slots.publish(7, 2, Arc::new(KeyFilter::default()));
        assert_eq!(waiter.await.unwrap(), None);
        let mut b = KeyFilterBuilder::default();
        b.add(&col(vec![Some(5)]), 1).unwrap();
        slots.publish(8, 0, Arc::new(b.finish()));
        assert_eq!(slots.wait(8, 0).await.keys(), Some(1));
    }
}
