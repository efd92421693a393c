//! Row hashes of join keys: the hashes DataFusion's hash repartitioning computes, so a
//! key's hash means the same everywhere in Gyre (which partition it belongs to, which
//! Flow-Join heavy hitter it is, whether a run-time filter holds it).

use arrow::array::ArrayRef;
use arrow::buffer::NullBuffer;
use datafusion::common::Result;
use datafusion::common::hash_utils::create_hashes;
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;

/// Fills `hashes` with the hash of each row of the key columns `keys` (`rows` rows).
pub fn hash_keys(keys: &[ArrayRef], rows: usize, hashes: &mut Vec<u64>) -> Result<()> {
    hashes.clear();
    hashes.resize(rows, 0);
    create_hashes(keys, REPARTITION_RANDOM_STATE.random_state(), hashes)?;
    Ok(())
}

/// The rows where every key column is set, as one validity mask (`None`: no key has a
/// null). Joins that compare keys with null equal to nothing never match the others.
pub fn keys_valid(keys: &[ArrayRef]) -> Option<NullBuffer> {
    keys.iter().fold(None, |acc, k| {
        NullBuffer::union(acc.as_ref(), k.logical_nulls().as_ref())
    })
}
