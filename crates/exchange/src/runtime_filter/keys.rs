//! What a run-time filter knows of a join's build side: the hashes of its keys, and
//! where each worker's filters wait to be picked up.

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use datafusion::common::hash_utils::create_hashes;
use datafusion::common::{HashSet, Result};
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;
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

    /// Distinct key hashes held, `None` when the filter lets everything through.
    pub fn keys(&self) -> Option<usize> {
        self.hashes.as_ref().map(HashSet::len)
    }

    /// Which rows of `keys` (the probe key columns) may match; rows with a null key
    /// never match (the joins filtered compare keys with null equal to nothing).
    pub fn may_match(&self, keys: &[ArrayRef], rows: usize) -> Result<Option<BooleanArray>> {
        let Some(set) = &self.hashes else {
            return Ok(None);
        };
        let mut hashes = vec![0; rows];
        create_hashes(keys, REPARTITION_RANDOM_STATE.random_state(), &mut hashes)?;
        let keep: BooleanArray = (0..rows)
            .map(|i| Some(keys.iter().all(|k| k.is_valid(i)) && set.contains(&hashes[i])))
            .collect();
        Ok(Some(keep))
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
        self.buf.clear();
        self.buf.resize(rows, 0);
        create_hashes(keys, REPARTITION_RANDOM_STATE.random_state(), &mut self.buf)?;
        for (i, h) in self.buf.iter().enumerate() {
            if keys.iter().all(|k| k.is_valid(i)) {
                self.hashes.insert(*h);
            }
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
    pub fn publish(&self, id: u32, partition: usize, filter: KeyFilter) {
        self.slot(id, partition).send_if_modified(|f| match f {
            Some(_) => false,
            None => {
                *f = Some(Arc::new(filter));
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
    use arrow::array::Int64Array;

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
        let keep = f.may_match(&probe, 7).unwrap().unwrap();
        let kept: Vec<bool> = keep.iter().map(|b| b.unwrap()).collect();
        assert_eq!(kept, [false, true, false, true, false, false, false]);
    }

    #[test]
    fn a_build_side_with_too_many_keys_lets_everything_through() {
        let mut b = KeyFilterBuilder::default();
        let n = MAX_FILTER_KEYS + 1;
        b.add(&col((0..n as i64).map(Some).collect()), n).unwrap();
        let f = b.finish();
        assert_eq!(f.keys(), None);
        assert!(f.may_match(&col(vec![Some(-1)]), 1).unwrap().is_none());
    }

    #[tokio::test]
    async fn a_filter_is_awaited_before_or_after_it_is_published() {
        let slots = Arc::new(FilterSlots::default());
        let s = Arc::clone(&slots);
        let waiter = tokio::spawn(async move { s.wait(7, 2).await.keys() });
        tokio::task::yield_now().await;
        slots.publish(7, 2, KeyFilter::default());
        assert_eq!(waiter.await.unwrap(), None);
        let mut b = KeyFilterBuilder::default();
        b.add(&col(vec![Some(5)]), 1).unwrap();
        slots.publish(8, 0, b.finish());
        assert_eq!(slots.wait(8, 0).await.keys(), Some(1));
    }
}
