//! Phase 1 of Neo-Join: which partition a key belongs to, and how many bytes of each
//! partition every node holds.
//!
//! Partitions are ranges of the key's *most significant used bits* (MSB radix
//! partitioning): unlike a hash they keep the order of the keys, so data that is
//! already clustered by key on its node (time-of-creation clustering, a distribution
//! key correlated with the join key, fuzzy co-partitioning) stays where it is. All
//! nodes share one [`RadixDomain`]: the global key range and a fine resolution of
//! `2^fine_bits` buckets. Each node counts the bytes of its rows per fine bucket
//! ([`FineHistogram`]); the assigner sums them and chooses the partitions
//! ([`PartitionMap`]):
//!
//! - [`PartitionMap::radix`]: plain MSB radix with `2^bits` partitions, the
//!   thesis' fixed partitioning;
//! - [`PartitionMap::adaptive`]: adaptive radix partitioning (thesis, section 2.4.1):
//!   adjacent fine buckets are merged until each partition holds about `1/target` of
//!   the bytes, so a skewed key distribution gets narrow partitions where its keys are
//!   dense and wide ones elsewhere, with few partitions for the assignment to weigh.
//!   A bucket heavier than the bound stays a partition of its own (one key can be
//!   heavier than any bound: selective broadcast handles that).

use crate::error::{JoinError, Result};

/// Most fine buckets a domain may have (`2^MAX_FINE_BITS`): the histograms travel
/// to the assigner, so their size is bounded.
pub const MAX_FINE_BITS: u32 = 16;

/// The key range all nodes partition, and its fine resolution.
///
/// Keys are the kernels' *ordered* `u64` values (`KeyDomain::ordered`), so signed
/// keys partition in numeric order too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadixDomain {
    min: u64,
    shift: u32,
    buckets: u32,
}

impl RadixDomain {
    /// The domain `[min, max]` (ordered keys, the union of all nodes' ranges) in
    /// buckets of the `fine_bits` most significant bits that the range uses.
    pub fn new(min: u64, max: u64, fine_bits: u32) -> Result<Self> {
        if min > max {
            return Err(JoinError::InvalidConfig(format!(
                "key range is empty: min {min} > max {max}"
            )));
        }
        if fine_bits == 0 || fine_bits > MAX_FINE_BITS {
            return Err(JoinError::InvalidConfig(format!(
                "fine histogram bits must be 1..={MAX_FINE_BITS}, not {fine_bits}"
            )));
        }
        let span = max - min;
        // Leading zeros of the span are skipped: the bits counted are the ones used.
        let used = u64::BITS - span.leading_zeros();
        let shift = used.saturating_sub(fine_bits);
        let buckets = (span >> shift) as u32 + 1;
        Ok(Self {
            min,
            shift,
            buckets,
        })
    }

    /// Number of fine buckets (at most `2^fine_bits`).
    pub fn buckets(&self) -> usize {
        self.buckets as usize
    }

    /// The fine bucket of an ordered key; keys outside the range go to the nearest end.
    #[inline(always)]
    pub fn bucket(&self, ordered_key: u64) -> usize {
        let offset = ordered_key.saturating_sub(self.min) >> self.shift;
        offset.min(self.buckets as u64 - 1) as usize
    }

    /// The smallest ordered key of a bucket (its range is up to the next bucket's).
    pub fn bucket_start(&self, bucket: usize) -> u64 {
        self.min + ((bucket as u64) << self.shift)
    }
}

/// Bytes per fine bucket on one node, for one side of the join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FineHistogram {
    domain: RadixDomain,
    bytes: Vec<u64>,
}

impl FineHistogram {
    pub fn new(domain: RadixDomain) -> Self {
        Self {
            domain,
            bytes: vec![0; domain.buckets()],
        }
    }

    /// Rebuilt from counts received from a node: their number must match the domain.
    pub fn from_bytes(domain: RadixDomain, bytes: Vec<u64>) -> Result<Self> {
        if bytes.len() != domain.buckets() {
            return Err(JoinError::InvalidConfig(format!(
                "histogram has {} buckets, the domain {}",
                bytes.len(),
                domain.buckets()
            )));
        }
        Ok(Self { domain, bytes })
    }

    pub fn domain(&self) -> &RadixDomain {
        &self.domain
    }

    /// Counts `row_bytes` for each ordered key.
    pub fn add_keys(&mut self, ordered_keys: impl IntoIterator<Item = u64>, row_bytes: u64) {
        for key in ordered_keys {
            let bucket = self.domain.bucket(key);
            self.bytes[bucket] += row_bytes;
        }
    }

    pub fn bytes(&self) -> &[u64] {
        &self.bytes
    }

    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// This node's bytes per partition of `map`.
    pub fn per_partition(&self, map: &PartitionMap) -> Vec<u64> {
        let mut out = vec![0; map.partitions()];
        for (bucket, &bytes) in self.bytes.iter().enumerate() {
            out[map.partition_of_bucket(bucket)] += bytes;
        }
        out
    }
}

/// Which partition each fine bucket belongs to: partitions are runs of adjacent
/// buckets, i.e. key ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMap {
    domain: RadixDomain,
    /// Partition `j` is buckets `starts[j]..starts[j + 1]` (the last one to the end).
    starts: Vec<u32>,
    of_bucket: Vec<u32>,
}

impl PartitionMap {
    /// Plain MSB radix partitioning: `2^bits` partitions of equal key range (fewer
    /// when the domain has fewer buckets).
    pub fn radix(domain: RadixDomain, bits: u32) -> Result<Self> {
        if bits > MAX_FINE_BITS {
            return Err(JoinError::InvalidConfig(format!(
                "radix bits must be at most {MAX_FINE_BITS}, not {bits}"
            )));
        }
        let buckets = domain.buckets();
        let width = buckets.div_ceil(1usize << bits).max(1);
        let starts = (0..buckets).step_by(width).map(|b| b as u32).collect();
        Ok(Self::from_valid_starts(domain, starts))
    }

    /// Partitions starting at these fine buckets (as another node chose them): the
    /// first must be 0, each larger than the last, all inside the domain.
    pub fn from_starts(domain: RadixDomain, starts: Vec<u32>) -> Result<Self> {
        let ordered = starts.first() == Some(&0) && starts.windows(2).all(|w| w[0] < w[1]);
        if !ordered
            || starts
                .last()
                .is_some_and(|&s| s as usize >= domain.buckets())
        {
            return Err(JoinError::InvalidConfig(format!(
                "partition starts must rise from 0 below {} buckets: {starts:?}",
                domain.buckets()
            )));
        }
        Ok(Self::from_valid_starts(domain, starts))
    }

    /// Adaptive radix partitioning over the global fine histogram (every node's and
    /// both sides' bytes summed per bucket): adjacent buckets merged into about
    /// `target` partitions of at most `total / target` bytes each, a heavier bucket
    /// alone.
    pub fn adaptive(domain: RadixDomain, global: &[u64], target: usize) -> Result<Self> {
        if global.len() != domain.buckets() {
            return Err(JoinError::InvalidConfig(format!(
                "global histogram has {} buckets, the domain {}",
                global.len(),
                domain.buckets()
            )));
        }
        if target == 0 {
            return Err(JoinError::InvalidConfig(
                "adaptive partitioning needs at least one partition".into(),
            ));
        }
        let total: u64 = global.iter().sum();
        let bound = total.div_ceil(target as u64).max(1);
        let mut starts = vec![0u32];
        let mut filled = 0u64;
        for (bucket, &bytes) in global.iter().enumerate() {
            if filled > 0 && filled + bytes > bound {
                starts.push(bucket as u32);
                filled = 0;
            }
            filled += bytes;
            if filled >= bound && bucket + 1 < global.len() {
                starts.push(bucket as u32 + 1);
                filled = 0;
            }
        }
        Ok(Self::from_valid_starts(domain, starts))
    }

    fn from_valid_starts(domain: RadixDomain, starts: Vec<u32>) -> Self {
        let mut of_bucket = vec![0u32; domain.buckets()];
        for (j, &start) in starts.iter().enumerate() {
            let end = starts.get(j + 1).map_or(domain.buckets(), |&s| s as usize);
            of_bucket[start as usize..end].fill(j as u32);
        }
        Self {
            domain,
            starts,
            of_bucket,
        }
    }

    pub fn domain(&self) -> &RadixDomain {
        &self.domain
    }

    pub fn partitions(&self) -> usize {
        self.starts.len()
    }

    /// The first fine bucket of each partition.
    pub fn starts(&self) -> &[u32] {
        &self.starts
    }

    #[inline(always)]
    pub fn partition_of_bucket(&self, bucket: usize) -> usize {
        self.of_bucket[bucket] as usize
    }

    /// The partition of an ordered key.
    #[inline(always)]
    pub fn partition(&self, ordered_key: u64) -> usize {
        self.partition_of_bucket(self.domain.bucket(ordered_key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zipf::Zipf;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn msb_radix_uses_the_top_used_bits() {
        // The thesis' example: 5-bit keys, 3 MSBs, 8 partitions.
        let domain = RadixDomain::new(0, 31, 3).unwrap();
        assert_eq!(domain.buckets(), 8);
        for key in 0..32u64 {
            assert_eq!(domain.bucket(key), (key >> 2) as usize);
        }
        // Leading zeros are skipped: keys 1000..1031 use 5 bits above the minimum.
        let offset = RadixDomain::new(1000, 1031, 3).unwrap();
        assert_eq!(offset.bucket(1000), 0);
        assert_eq!(offset.bucket(1031), 7);
        // Out-of-range keys clamp; a one-key domain is one bucket.
        assert_eq!(offset.bucket(0), 0);
        assert_eq!(offset.bucket(u64::MAX), 7);
        let one = RadixDomain::new(5, 5, 8).unwrap();
        assert_eq!((one.buckets(), one.bucket(5)), (1, 0));
        assert!(RadixDomain::new(2, 1, 4).is_err());
        assert!(RadixDomain::new(0, 1, 0).is_err());
        assert!(RadixDomain::new(0, 1, MAX_FINE_BITS + 1).is_err());
    }

    #[test]
    fn order_is_kept_across_partitions() {
        let domain = RadixDomain::new(0, 1 << 40, 12).unwrap();
        let map = PartitionMap::radix(domain, 5).unwrap();
        assert_eq!(map.partitions(), 32);
        let mut last = 0;
        for key in (0..(1u64 << 40)).step_by(1 << 30) {
            let p = map.partition(key);
            assert!(p >= last, "partition of {key} went back");
            last = p;
        }
        assert_eq!(last, 31);
    }

    #[test]
    fn adaptive_partitions_balance_a_zipf_distribution() {
        // Zipf 1 over 2^20 keys, small keys frequent: plain radix with 16 partitions
        // puts most rows in partition 0; adaptive partitioning with the same target
        // bounds every partition but the single heaviest bucket.
        let domain = RadixDomain::new(0, (1 << 20) - 1, 12).unwrap();
        let zipf = Zipf::new(1 << 20, 1.0);
        let mut rng = StdRng::seed_from_u64(7);
        let mut histogram = FineHistogram::new(domain);
        histogram.add_keys((0..200_000).map(|_| zipf.sample(&mut rng) - 1), 16);
        let total = histogram.total();

        let plain = PartitionMap::radix(domain, 4).unwrap();
        let plain_sizes = histogram.per_partition(&plain);
        assert!(*plain_sizes.iter().max().unwrap() > total / 2);

        let adaptive = PartitionMap::adaptive(domain, histogram.bytes(), 16).unwrap();
        let sizes = histogram.per_partition(&adaptive);
        assert_eq!(sizes.iter().sum::<u64>(), total);
        let bound = total.div_ceil(16);
        let heaviest_bucket = *histogram.bytes().iter().max().unwrap();
        for (j, &size) in sizes.iter().enumerate() {
            assert!(
                size <= bound.max(heaviest_bucket),
                "partition {j} holds {size} of {total} bytes"
            );
        }
        assert!(
            adaptive.partitions() <= 32,
            "{} partitions",
            adaptive.partitions()
        );
        // Partitions are contiguous key ranges, in order.
        assert!(adaptive.starts().windows(2).all(|w| w[0] < w[1]));
        for key in 0..(1u64 << 20) {
            let p = adaptive.partition(key);
            assert!(domain.bucket(key) >= adaptive.starts()[p] as usize);
        }
    }

    #[test]
    fn adaptive_partitions_of_uniform_data_are_even() {
        let domain = RadixDomain::new(0, 4095, 12).unwrap();
        let uniform = vec![10u64; 4096];
        let map = PartitionMap::adaptive(domain, &uniform, 16).unwrap();
        assert_eq!(map.partitions(), 16);
        let mut histogram = FineHistogram::from_bytes(domain, uniform).unwrap();
        assert!(histogram.per_partition(&map).iter().all(|&b| b == 2560));
        histogram.add_keys([4095], 1);
        assert_eq!(histogram.per_partition(&map)[15], 2561);
        assert!(FineHistogram::from_bytes(domain, vec![0; 3]).is_err());
        assert!(PartitionMap::adaptive(domain, &[0; 3], 16).is_err());
        assert!(PartitionMap::adaptive(domain, &vec![0; 4096], 0).is_err());
        // Starts from another node are checked.
        let again = PartitionMap::from_starts(domain, map.starts().to_vec()).unwrap();
        assert_eq!(again, map);
        for bad in [vec![], vec![1], vec![0, 5, 5], vec![0, 4096]] {
            assert!(PartitionMap::from_starts(domain, bad).is_err());
        }
        // An empty histogram is one partition.
        assert_eq!(
            PartitionMap::adaptive(domain, &vec![0; 4096], 16)
                .unwrap()
                .partitions(),
            1
        );
    }
}
