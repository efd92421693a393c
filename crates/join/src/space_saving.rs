//! SpaceSaving heavy-hitter histogram (Metwally, Agrawal, El Abbadi 2005) in the layout
//! of Flow-Join (Rödiger, *Scalable Distributed Query Processing in Parallel Main-Memory
//! Database Systems*, 4.2.2, Fig. 4.7c): k counters in an array kept sorted by count,
//! plus a small open-addressing hash index from key to array slot.
//!
//! Why this layout (Rödiger, Fig. 4.8): the update needs both access by key (increment)
//! and access by count (replace the minimum). A hash table alone needs an O(k) scan for
//! the minimum; a heap needs O(log k) per update; a sorted array has the minimum at its
//! end (O(1)) and an increment moves an element by at most one *run* of equal counts,
//! which in practice is a single swap. k = 128 with a 2,048-entry index (load <= 1/16)
//! keeps the whole structure in 7 KiB of L1. The sparse index matters on streams of
//! many distinct keys, where every update is a failed lookup plus an eviction's index
//! deletion: with linear probing both walk a cluster, long and unpredictable at load
//! 1/2. Uniform 64-bit keys, one thread: 27 M updates/s at load 1/2, 45 M at 1/4,
//! 59-66 M at 1/8, 66-79 M at 1/16; Zipf 1.25: 58, 82, 92, 98 M
//! (`cargo run --release -p gyre-join --example flow_join`). One private histogram per
//! thread, no locks, merged with [`SpaceSaving::merge`].
//!
//! Increment with a sorted array: the counter at position `p` with count `c` swaps with
//! the *first* position holding count `c` and then becomes `c + 1`; the array stays
//! sorted (descending) after one swap. The start of the run of minimum counts is kept
//! up to date, because that run is where every eviction lands: on streams with many
//! distinct keys (every update a miss) this replaces a binary search per update by a
//! load. Other runs are found by binary search when the neighbour shares the count.
//!
//! Guarantees (Metwally et al., Lemma 3 and Theorem 1), which the tests check:
//! - every monitored key's `count` never underestimates its true frequency, and
//!   `count - error` never overestimates it;
//! - `error <= min_count() <= n / k`;
//! - a key not monitored occurs at most `min_count()` times, so every key with true
//!   frequency above `max(phi * n, min_count())` is among [`SpaceSaving::candidates`].

/// Rödiger's histogram size.
pub const DEFAULT_CAPACITY: usize = 128;

const EMPTY: u16 = u16::MAX;

/// A key reported by [`SpaceSaving::candidates`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub key: u64,
    /// Estimated frequency, never below the true one.
    pub count: u64,
    /// Maximum overestimation: the true frequency is in `count - error ..= count`.
    pub error: u64,
}

impl Candidate {
    /// Occurrences the key is guaranteed to have had.
    pub fn guaranteed(&self) -> u64 {
        self.count - self.error
    }
}

/// SpaceSaving summary of a stream of 64-bit keys.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    len: usize,
    // Counters by position, sorted by count, descending (minimum at `len - 1`).
    keys: Vec<u64>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    /// Index bucket holding each position (updated when entries move), so swapping two
    /// positions fixes the index without a lookup.
    bucket_of: Vec<u16>,
    /// Open addressing, linear probing: bucket -> position or EMPTY.
    index: Vec<u16>,
    shift: u32,
    total: u64,
    /// First position whose count equals the minimum `counts[len - 1]`.
    min_start: usize,
}

#[inline(always)]
fn mix(key: u64) -> u64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Default for SpaceSaving {
    fn default() -> Self {
        SpaceSaving::new(DEFAULT_CAPACITY)
    }
}

impl SpaceSaving {
    /// A histogram with `capacity` counters (1..=16384) and an index of sixteen times as
    /// many buckets, rounded up to a power of two, at most 65,536 (bucket numbers are
    /// `u16`), so at least four times as many.
    pub fn new(capacity: usize) -> Self {
        assert!(
            (1..=16384).contains(&capacity),
            "SpaceSaving capacity must be 1..=16384, got {capacity}"
        );
        // At least two empty buckets always remain, even while an eviction briefly
        // holds k + 1 entries, so every probe and shift loop ends.
        let buckets = (16 * capacity).next_power_of_two().clamp(4, 1 << 16);
        SpaceSaving {
            capacity,
            len: 0,
            keys: vec![0; capacity],
            counts: vec![0; capacity],
            errors: vec![0; capacity],
            bucket_of: vec![0; capacity],
            index: vec![EMPTY; buckets],
            shift: 64 - buckets.trailing_zeros(),
            total: 0,
            min_start: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys currently monitored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stream length seen (updates, plus the totals of merged histograms).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Upper bound on the frequency of any key not monitored: the smallest count when
    /// all counters are in use, else 0 (every key seen so far is monitored exactly).
    pub fn min_count(&self) -> u64 {
        if self.len == self.capacity {
            self.counts[self.len - 1]
        } else {
            0
        }
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (mix(key) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.index.len() - 1
    }

    /// Counts one occurrence of `key`.
    #[inline]
    pub fn update(&mut self, key: u64) {
        self.total += 1;
        let mask = self.mask();
        let mut b = self.home(key);
        loop {
            let p = self.index[b];
            if p == EMPTY {
                break;
            }
            if self.keys[p as usize] == key {
                self.increment(p as usize);
                return;
            }
            b = (b + 1) & mask;
        }
        if self.len < self.capacity {
            // A new key enters with count 1, the smallest possible: it goes last and
            // joins (or starts) the minimum run.
            let p = self.len;
            self.len += 1;
            self.keys[p] = key;
            self.counts[p] = 1;
            self.errors[p] = 0;
            self.index[b] = p as u16;
            self.bucket_of[p] = b as u16;
            if p == 0 || self.counts[p - 1] != 1 {
                self.min_start = p;
            }
        } else {
            // Replace the minimum (the last position); the newcomer inherits its count
            // as error so it is never underestimated (Rödiger, Fig. 4.6). The newcomer
            // takes the empty bucket the failed lookup ended on *before* the old key's
            // bucket is deleted: backward-shift deletion keeps the probe invariant of
            // every entry present, so no second probe for a free bucket is needed.
            let p = self.len - 1;
            let old = self.bucket_of[p] as usize;
            self.keys[p] = key;
            self.errors[p] = self.counts[p];
            self.index[b] = p as u16;
            self.bucket_of[p] = b as u16;
            self.remove_from_index(old);
            self.increment(p);
        }
    }

    /// Raises the count at position `p` by one, keeping the array sorted descending.
    #[inline(always)]
    fn increment(&mut self, p: usize) {
        let c = self.counts[p];
        let last = self.len - 1;
        if c == self.counts[last] {
            // In the minimum run: its first position is known.
            let q = self.min_start;
            if q != p {
                self.swap(p, q);
            }
            self.counts[q] = c + 1;
            self.min_start += 1;
            if self.min_start > last {
                // Run used up: the new minimum is counts[last]; find where its run starts.
                let m = self.counts[last];
                self.min_start = self.counts[..last].partition_point(|&x| x > m);
            }
        } else if p > 0 && self.counts[p - 1] == c {
            // First position of the run of counts equal to c.
            let q = self.counts[..p].partition_point(|&x| x > c);
            self.swap(p, q);
            self.counts[q] = c + 1;
        } else {
            self.counts[p] = c + 1;
        }
    }

    /// Swaps the entries at positions `a` and `b`, which have equal counts.
    #[inline(always)]
    fn swap(&mut self, a: usize, b: usize) {
        self.keys.swap(a, b);
        self.errors.swap(a, b);
        self.bucket_of.swap(a, b);
        self.index[self.bucket_of[a] as usize] = a as u16;
        self.index[self.bucket_of[b] as usize] = b as u16;
    }

    fn free_bucket(&self, key: u64) -> usize {
        let mask = self.mask();
        let mut b = self.home(key);
        while self.index[b] != EMPTY {
            b = (b + 1) & mask;
        }
        b
    }

    /// Deletes bucket `hole` with backward shifting, so lookups never need tombstones.
    /// Only the bucket's position is used, never its content, so the position it named
    /// may already belong to another key.
    fn remove_from_index(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let p = self.index[j];
            if p == EMPTY {
                break;
            }
            let home = self.home(self.keys[p as usize]);
            // The entry at j may move back into the hole unless its home lies
            // cyclically in (hole, j].
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.index[hole] = p;
                self.bucket_of[p as usize] = hole as u16;
                hole = j;
            }
        }
        self.index[hole] = EMPTY;
    }

    /// Monitored keys, highest count first.
    pub fn entries(&self) -> impl Iterator<Item = Candidate> + '_ {
        (0..self.len).map(|p| Candidate {
            key: self.keys[p],
            count: self.counts[p],
            error: self.errors[p],
        })
    }

    /// Estimated count of `key` if it is monitored.
    pub fn get(&self, key: u64) -> Option<Candidate> {
        let mask = self.mask();
        let mut b = self.home(key);
        loop {
            let p = self.index[b];
            if p == EMPTY {
                return None;
            }
            if self.keys[p as usize] == key {
                let p = p as usize;
                return Some(Candidate {
                    key,
                    count: self.counts[p],
                    error: self.errors[p],
                });
            }
            b = (b + 1) & mask;
        }
    }

    /// Keys whose estimated count exceeds `threshold_fraction * total()`, highest first.
    /// Complete for every key whose true frequency exceeds
    /// `max(threshold_fraction * total(), min_count())`; may contain false positives,
    /// whose `guaranteed()` count tells how sure each one is.
    pub fn candidates(&self, threshold_fraction: f64) -> Vec<Candidate> {
        let threshold = threshold_fraction * self.total as f64;
        self.entries()
            .take_while(|c| c.count as f64 > threshold)
            .collect()
    }

    /// Adds `other` (e.g. another thread's histogram) into `self`. A key missing from
    /// one side may have occurred there up to that side's `min_count()` times, so it is
    /// charged that much as count and error (keeps both bounds valid); then the
    /// `capacity` largest counts are kept. Every key dropped or never monitored has at
    /// most the new `min_count()` occurrences, and errors stay below `total / k`.
    pub fn merge(&mut self, other: &SpaceSaving) {
        let (floor_a, floor_b) = (self.min_count(), other.min_count());
        let mut merged: Vec<Candidate> = Vec::with_capacity(self.len + other.len);
        for a in self.entries() {
            match other.get(a.key) {
                Some(b) => merged.push(Candidate {
                    key: a.key,
                    count: a.count + b.count,
                    error: a.error + b.error,
                }),
                None => merged.push(Candidate {
                    key: a.key,
                    count: a.count + floor_b,
                    error: a.error + floor_b,
                }),
            }
        }
        for b in other.entries() {
            if self.get(b.key).is_none() {
                merged.push(Candidate {
                    key: b.key,
                    count: b.count + floor_a,
                    error: b.error + floor_a,
                });
            }
        }
        merged.sort_by(|x, y| y.count.cmp(&x.count).then(x.key.cmp(&y.key)));
        merged.truncate(self.capacity);
        let total = self.total + other.total;
        *self = SpaceSaving::new(self.capacity);
        self.total = total;
        for (p, c) in merged.into_iter().enumerate() {
            let b = self.free_bucket(c.key);
            self.keys[p] = c.key;
            self.counts[p] = c.count;
            self.errors[p] = c.error;
            self.index[b] = p as u16;
            self.bucket_of[p] = b as u16;
            self.len = p + 1;
        }
        if self.len > 0 {
            let m = self.counts[self.len - 1];
            self.min_start = self.counts[..self.len].partition_point(|&x| x > m);
        }
    }

    /// Forgets everything (keeps the allocation), for periodic re-detection.
    pub fn clear(&mut self) {
        self.len = 0;
        self.total = 0;
        self.min_start = 0;
        self.index.fill(EMPTY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zipf::Zipf;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    fn exact(stream: &[u64]) -> HashMap<u64, u64> {
        let mut m = HashMap::new();
        for &k in stream {
            *m.entry(k).or_insert(0) += 1;
        }
        m
    }

    /// Checks the SpaceSaving guarantees of `h` against exact counts of its stream.
    fn check(h: &SpaceSaving, truth: &HashMap<u64, u64>, n: u64) {
        assert_eq!(h.total(), n);
        let k = h.capacity() as u64;
        let floor = h.min_count();
        assert!(floor <= n / k, "min count {floor} above n/k");
        let entries: Vec<Candidate> = h.entries().collect();
        assert!(
            entries.windows(2).all(|w| w[0].count >= w[1].count),
            "sorted"
        );
        if let Some(min) = entries.last() {
            let first_min = entries.iter().position(|c| c.count == min.count).unwrap();
            assert_eq!(h.min_start, first_min, "minimum run start");
        }
        for c in &entries {
            let f = truth.get(&c.key).copied().unwrap_or(0);
            assert!(
                c.count >= f,
                "underestimate of {}: {} < {f}",
                c.key,
                c.count
            );
            assert!(
                c.guaranteed() <= f,
                "guaranteed {} above true {f}",
                c.guaranteed()
            );
            assert!(c.error <= floor.max(n / k), "error bound");
            assert_eq!(h.get(c.key), Some(*c), "index finds every entry");
        }
        for phi in [1.0 / k as f64, 0.01, 0.02, 0.05, 0.2] {
            let reported: Vec<u64> = h.candidates(phi).iter().map(|c| c.key).collect();
            for (&key, &f) in truth {
                if f as f64 > phi * n as f64 && f > floor {
                    assert!(
                        reported.contains(&key),
                        "heavy hitter {key} ({f}/{n}) missing at phi {phi}"
                    );
                }
            }
        }
        for (&key, &f) in truth {
            if h.get(key).is_none() {
                assert!(
                    f <= floor,
                    "unmonitored key {key} occurs {f} > {floor} times"
                );
            }
        }
    }

    fn zipf_stream(n: usize, z: f64, distinct: u64, seed: u64) -> Vec<u64> {
        let zipf = Zipf::new(distinct, z);
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..n)
            .map(|_| zipf.sample(&mut rng).wrapping_mul(0xD6E8_FEB8_6659_FD93))
            .collect()
    }

    #[test]
    fn the_papers_example_replaces_the_minimum() {
        let mut h = SpaceSaving::new(3);
        for k in [17, 17, 17, 5, 5, 22] {
            h.update(k);
        }
        h.update(71);
        let e: Vec<(u64, u64, u64)> = h.entries().map(|c| (c.key, c.count, c.error)).collect();
        assert_eq!(e, vec![(17, 3, 0), (5, 2, 0), (71, 2, 1)]);
        assert!(h.get(22).is_none());
    }

    /// The index is sixteen times the capacity but bucket numbers are `u16`: the
    /// largest capacities get a denser index (load 1/4 at 16,384 counters), never an
    /// overflowing one.
    #[test]
    fn index_stays_addressable_at_the_largest_capacities() {
        for k in [4096, 16_384] {
            let h = SpaceSaving::new(k);
            assert!(h.index.len() <= 1 << 16 && h.index.len() >= 4 * k);
            let s = zipf_stream(100_000, 0.8, 1 << 40, 11);
            let mut h = h;
            s.iter().for_each(|&key| h.update(key));
            check(&h, &exact(&s), s.len() as u64);
        }
        assert_eq!(SpaceSaving::new(128).index.len(), 2048);
    }

    #[test]
    fn guarantees_hold_on_zipf_and_uniform_streams() {
        for (z, distinct) in [(1.25, 1_000_000), (0.8, 100_000), (1.5, 1000)] {
            let s = zipf_stream(200_000, z, distinct, 3);
            let mut h = SpaceSaving::default();
            s.iter().for_each(|&k| h.update(k));
            check(&h, &exact(&s), s.len() as u64);
        }
        let mut rng = SmallRng::seed_from_u64(9);
        for distinct in [50u64, 128, 129, 10_000, 1 << 40] {
            let s: Vec<u64> = (0..100_000)
                .map(|_| rng.random_range(0..distinct))
                .collect();
            for k in [1, 7, 128] {
                let mut h = SpaceSaving::new(k);
                s.iter().for_each(|&x| h.update(x));
                check(&h, &exact(&s), s.len() as u64);
            }
        }
    }

    #[test]
    fn merged_thread_histograms_keep_the_guarantees() {
        let s = zipf_stream(240_000, 1.25, 500_000, 5);
        // A planted heavy hitter spread thinly over the threads.
        let mut s2 = s.clone();
        for i in (0..s2.len()).step_by(40) {
            s2[i] = 424242;
        }
        for stream in [s, s2] {
            for threads in [2, 4, 7] {
                let chunks: Vec<&[u64]> = stream.chunks(stream.len().div_ceil(threads)).collect();
                let mut merged = SpaceSaving::default();
                for c in chunks {
                    let mut h = SpaceSaving::default();
                    c.iter().for_each(|&k| h.update(k));
                    merged.merge(&h);
                }
                check(&merged, &exact(&stream), stream.len() as u64);
            }
        }
    }

    #[test]
    fn skewed_stream_reports_its_top_keys_first() {
        let s = zipf_stream(100_000, 1.25, 100_000, 11);
        let mut h = SpaceSaving::default();
        s.iter().for_each(|&k| h.update(k));
        let truth = exact(&s);
        let mut top: Vec<(u64, u64)> = truth.iter().map(|(&k, &f)| (f, k)).collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        let reported: Vec<u64> = h.candidates(0.01).iter().map(|c| c.key).collect();
        assert_eq!(reported[..3], [top[0].1, top[1].1, top[2].1]);
        h.clear();
        assert!(h.is_empty() && h.candidates(0.0).is_empty());
        h.update(1);
        assert_eq!(h.candidates(0.5)[0].count, 1);
    }
}
