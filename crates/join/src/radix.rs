//! Radix-partitioned hash equi-join on 64-bit keys (Manegold, Boncz, Kersten, "Optimizing
//! main-memory join on modern hardware", as ported to cyclo-join: paper Sec. IV-C.1).
//!
//! Two phases, split so cyclo-join can reuse the first (paper Sec. IV-D):
//! - **Setup** ([`RadixHashTable::build`]): the build side (the stationary `S_i`) is
//!   partitioned on the top bits of a hash of its key, in as many passes as the fan-out
//!   limit requires, until one partition plus its hash table fits in half the L2 cache.
//!   Each partition is then ordered by its bucket (the next hash bits) with an in-cache
//!   counting sort, so the "hash table" is a bucket directory of offsets into the
//!   partition: no chain pointers, buckets contiguous, one cache line per probe in the
//!   common case.
//! - **Join** ([`RadixHashTable::probe`]): each probe fragment (a passing `R_j`) is
//!   partitioned with the same bits, then partition `k` of the probe side is joined with
//!   partition `k` of the build side, whose directory and tuples stay in L2 while the
//!   probe partition streams past. Partitions are independent, so threads take disjoint
//!   groups of them (paper: "computing the disjoint r_jk ⋈ s_ik on separate CPU cores").
//!
//! A probe fragment can also be partitioned once ([`PartitionedProbe`]) and joined with
//! several prepared build sides, which is the "ship the partitioned form" option of
//! Sec. IV-D.

use arrow_array::Array;

use crate::KeyDomain;
use crate::cache::{l2_cache_bytes, resolve_threads};
use crate::error::{JoinError, Result};
use crate::keys::{Keys, check_domains};
use crate::pairs::JoinPairs;
use crate::partition::{
    KeySource, MIN_TUPLES_PER_THREAD, Tuple, balance_regions, refine, scatter, split_even,
    zeroed_tuples,
};

/// Fibonacci (multiplicative) hashing: one multiply, and its *high* bits are well mixed
/// even for dense or strided keys. Partition and bucket numbers are therefore taken from
/// the top of the product (the low bits of a product only depend on the low key bits).
#[inline(always)]
pub fn hash_key(key: u64) -> u64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Top `bits` bits of `h` (0 when `bits == 0`), without a shift by 64.
#[inline(always)]
fn top_bits(h: u64, bits: u32) -> usize {
    ((h >> 1) >> (63 - bits)) as usize
}

/// Bits `consumed .. consumed + bits` counted from the top of the hash.
#[inline(always)]
fn hash_digit(key: u64, consumed: u32, bits: u32) -> usize {
    ((hash_key(key) << consumed) >> (64 - bits)) as usize
}

/// Bytes a build tuple occupies in its partition: the 16-byte tuple plus its share
/// (one entry on average) of the 4-byte bucket directory.
const BUILD_BYTES_PER_TUPLE: usize = std::mem::size_of::<Tuple>() + 4;

/// How the kernel sizes its partitions and uses threads.
#[derive(Debug, Clone)]
pub struct RadixConfig {
    /// Cache a build partition plus its directory must fit in; half of it is used, the
    /// other half is left to the streaming probe partition and the output buffers.
    pub cache_bytes: usize,
    /// Largest fan-out of one partitioning pass, as bits. Manegold et al. bound a pass
    /// by the TLB entries and cache lines a scatter can keep open; beyond that a second
    /// pass is cheaper than the misses. The scatter buffers use 2 MiB pages
    /// (`memory.rs`), so the TLB is no longer the bound; the default keeps one cache line
    /// per open cursor within half the cache: `log2(cache_bytes / 2 / 64)`, 12 bits for
    /// a 512 KiB L2. (Measured on 2 x 16 M tuples: one 11-bit pass partitions the probe
    /// side in 0.20 s against 0.30 s for two passes of 5 + 6 bits.)
    pub max_bits_per_pass: u32,
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Whether probes are partitioned first (see [`ProbeMode`]).
    pub probe_mode: ProbeMode,
}

impl RadixConfig {
    /// Defaults for a cache of `cache_bytes`.
    pub fn for_cache(cache_bytes: usize) -> Self {
        RadixConfig {
            cache_bytes,
            max_bits_per_pass: (cache_bytes / 2 / 64).max(1).ilog2().clamp(4, 14),
            threads: 0,
            probe_mode: ProbeMode::Auto,
        }
    }

    /// Build rows one partition holds: its tuples and directory fill half the cache.
    pub fn build_rows_per_partition(&self) -> usize {
        (self.cache_bytes / 2 / BUILD_BYTES_PER_TUPLE).max(1)
    }
}

impl Default for RadixConfig {
    fn default() -> Self {
        RadixConfig {
            max_bits_per_pass: RadixConfig::for_cache(l2_cache_bytes()).max_bits_per_pass,
            cache_bytes: l2_cache_bytes(),
            threads: 0,
            probe_mode: ProbeMode::Auto,
        }
    }
}

/// Whether a probe fragment is radix-partitioned before probing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMode {
    /// Partition when the probe side is large enough to fill its partitions
    /// ([`MIN_PROBE_PER_PARTITION`] tuples each); probe directly otherwise, where a
    /// partitioning pass would cost more than the cache misses it saves.
    Auto,
    Partitioned,
    Direct,
}

/// Below this many probe tuples per build partition, [`ProbeMode::Auto`] probes directly.
pub const MIN_PROBE_PER_PARTITION: usize = 4;

/// The bit layout shared by a prepared build side and the probe fragments joined with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadixLayout {
    pass_bits: Vec<u32>,
    bucket_bits: u32,
}

fn ceil_log2(n: usize) -> u32 {
    if n <= 1 {
        0
    } else {
        usize::BITS - (n - 1).leading_zeros()
    }
}

impl RadixLayout {
    /// Plans partitioning for a build side of `build_rows` keys: enough partition bits
    /// that a partition (16-byte tuples plus directory) fits in half of
    /// `config.cache_bytes`, spread evenly over `ceil(bits / max_bits_per_pass)` passes,
    /// then enough bucket bits for about one tuple per bucket.
    pub fn plan(build_rows: usize, config: &RadixConfig) -> Result<Self> {
        if config.max_bits_per_pass == 0 || config.max_bits_per_pass > 16 {
            return Err(JoinError::InvalidConfig(format!(
                "max_bits_per_pass must be 1..=16, got {}",
                config.max_bits_per_pass
            )));
        }
        let partitions = build_rows.div_ceil(config.build_rows_per_partition());
        let total = ceil_log2(partitions);
        let passes = total.div_ceil(config.max_bits_per_pass);
        let pass_bits = (0..passes)
            .map(|i| total * (i + 1) / passes - total * i / passes)
            .collect();
        let bucket_bits = ceil_log2(build_rows.div_ceil(1 << total));
        RadixLayout::new(pass_bits, bucket_bits)
    }

    /// An explicit layout (for tuning experiments and for making all ring members use
    /// the same bits). Zero-bit passes are dropped.
    pub fn new(pass_bits: Vec<u32>, bucket_bits: u32) -> Result<Self> {
        let pass_bits: Vec<u32> = pass_bits.into_iter().filter(|&b| b > 0).collect();
        let total: u32 = pass_bits.iter().sum::<u32>() + bucket_bits;
        if total > 40 || pass_bits.iter().any(|&b| b > 16) {
            return Err(JoinError::InvalidConfig(format!(
                "radix layout {pass_bits:?} + {bucket_bits} bucket bits is too large"
            )));
        }
        Ok(RadixLayout {
            pass_bits,
            bucket_bits,
        })
    }

    /// Bits per partitioning pass, first pass first.
    pub fn pass_bits(&self) -> &[u32] {
        &self.pass_bits
    }

    /// Total partition bits (number of partitions = 2^this).
    pub fn partition_bits(&self) -> u32 {
        self.pass_bits.iter().sum()
    }

    /// Bucket bits per partition in the build side's directory.
    pub fn bucket_bits(&self) -> u32 {
        self.bucket_bits
    }
}

/// Partitions `keys` by successive top hash bits `passes` and returns the tuples and
/// the boundaries of the final regions (`2^sum(passes) + 1` entries).
fn partition_keys(keys: &Keys, passes: &[u32], threads: usize) -> (Vec<Tuple>, Vec<u32>) {
    let mut a = Vec::new();
    let mut consumed = 0;
    let mut bounds = match passes.first() {
        None => scatter(&KeySource { keys, map: |k| k }, &mut a, 1, |_| 0, threads),
        Some(&b) => {
            consumed = b;
            scatter(
                &KeySource { keys, map: |k| k },
                &mut a,
                1 << b,
                move |k| hash_digit(k, 0, b),
                threads,
            )
        }
    };
    if passes.len() > 1 {
        let mut b = zeroed_tuples(a.len());
        for &bits in &passes[1..] {
            let c = consumed;
            bounds = refine(
                &a,
                &mut b,
                &bounds,
                1 << bits,
                move |k| hash_digit(k, c, bits),
                threads,
            );
            std::mem::swap(&mut a, &mut b);
            consumed += bits;
        }
    }
    (a, bounds)
}

/// A prepared build side: partitioned and hashed once, probed any number of times.
#[derive(Debug, Clone)]
pub struct RadixHashTable {
    layout: RadixLayout,
    /// Build tuples ordered by the top `partition_bits + bucket_bits` hash bits.
    tuples: Vec<Tuple>,
    /// `directory[g]..directory[g + 1]` are the tuples of global bucket `g`.
    directory: Vec<u32>,
    total_bits: u32,
    domain: KeyDomain,
    rows: usize,
}

impl RadixHashTable {
    /// Setup phase with a layout planned from the build side's size and the cache.
    pub fn build(keys: &Keys, config: &RadixConfig) -> Result<Self> {
        let layout = RadixLayout::plan(keys.valid_count(), config)?;
        Self::build_with_layout(keys, layout, config.threads)
    }

    /// Setup phase with an explicit layout (shared with remote probe fragments).
    pub fn build_with_layout(keys: &Keys, layout: RadixLayout, threads: usize) -> Result<Self> {
        keys.check_rows()?;
        let threads = resolve_threads(threads);
        let mut all_bits = layout.pass_bits.clone();
        if layout.bucket_bits > 0 {
            all_bits.push(layout.bucket_bits);
        }
        // The bucket level is one more refine pass, run per partition while the
        // partition is cache resident; its boundaries are the directory.
        let (tuples, directory) = partition_keys(keys, &all_bits, threads);
        Ok(RadixHashTable {
            total_bits: layout.partition_bits() + layout.bucket_bits,
            layout,
            tuples,
            directory,
            domain: keys.domain(),
            rows: keys.len(),
        })
    }

    pub fn layout(&self) -> &RadixLayout {
        &self.layout
    }

    /// Non-NULL build keys held.
    pub fn len(&self) -> usize {
        self.tuples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tuples.is_empty()
    }

    /// Rows of the build input, NULLs included.
    pub fn input_rows(&self) -> usize {
        self.rows
    }

    pub fn domain(&self) -> KeyDomain {
        self.domain
    }

    /// Memory held by the prepared side (tuples plus directory).
    pub fn memory_bytes(&self) -> usize {
        self.tuples.len() * std::mem::size_of::<Tuple>() + self.directory.len() * 4
    }

    /// Emits `(build_row, probe_row)` for every build tuple matching `key`.
    ///
    /// Branch-free emission: each bucket tuple's pair is written to the next output slot
    /// unconditionally and the length advances by `(key == t.key) as usize`. Whether a
    /// bucket tuple matches is unpredictable (buckets hold about one tuple, matching or
    /// not), so a branch here would mispredict on most probes.
    #[inline(always)]
    fn lookup(&self, key: u64, probe_row: u32, out: &mut JoinPairs) {
        let g = top_bits(hash_key(key), self.total_bits);
        let (a, b) = (self.directory[g] as usize, self.directory[g + 1] as usize);
        let bucket = &self.tuples[a..b];
        out.left.reserve(bucket.len());
        out.right.reserve(bucket.len());
        let mut len = out.left.len();
        let (lp, rp) = (out.left.as_mut_ptr(), out.right.as_mut_ptr());
        for t in bucket {
            // SAFETY: both vectors have capacity for `bucket.len()` more elements and
            // `len` grows by at most one per bucket tuple, so every write is in bounds;
            // only slots below the final `len` are exposed, and all of those were written.
            unsafe {
                lp.add(len).write(t.row);
                rp.add(len).write(probe_row);
            }
            len += (t.key == key) as usize;
        }
        // SAFETY: see above; `len <= capacity` and slots `..len` are initialised.
        unsafe {
            out.left.set_len(len);
            out.right.set_len(len);
        }
    }

    /// Join phase for one probe fragment: `(build_row, probe_row)` pairs, in no
    /// particular order. NULL keys on either side match nothing.
    pub fn probe(&self, probe: &Keys, config: &RadixConfig) -> Result<JoinPairs> {
        check_domains(self.domain, probe.domain())?;
        probe.check_rows()?;
        let partitions = 1usize << self.layout.partition_bits();
        let partitioned = match config.probe_mode {
            ProbeMode::Partitioned => true,
            ProbeMode::Direct => false,
            ProbeMode::Auto => {
                partitions > 1 && probe.valid_count() >= partitions * MIN_PROBE_PER_PARTITION
            }
        };
        if partitioned {
            let part = PartitionedProbe::new(probe, &self.layout, config.threads)?;
            self.join_partitioned(&part, config.threads)
        } else {
            Ok(self.probe_direct(probe, config.threads))
        }
    }

    /// Probes every key straight into the table, without partitioning. Right for small
    /// fragments and for build sides that fit in cache.
    pub fn probe_direct(&self, probe: &Keys, threads: usize) -> JoinPairs {
        let n = probe.len();
        let threads = resolve_threads(threads)
            .min(n / MIN_TUPLES_PER_THREAD)
            .max(1);
        let run = |r: std::ops::Range<usize>| {
            let mut out = JoinPairs::with_capacity(r.len());
            probe.for_each_valid(r, |row, key| self.lookup(key, row as u32, &mut out));
            out
        };
        let chunks = split_even(n, threads);
        if threads == 1 {
            return run(0..n);
        }
        let parts = std::thread::scope(|s| {
            let hs: Vec<_> = chunks
                .into_iter()
                .map(|r| {
                    let run = &run;
                    s.spawn(move || run(r))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        JoinPairs::concat(parts)
    }

    /// Joins a probe fragment partitioned with this table's layout, partition by
    /// partition; threads take contiguous groups of partitions of similar probe size.
    pub fn join_partitioned(&self, probe: &PartitionedProbe, threads: usize) -> Result<JoinPairs> {
        check_domains(self.domain, probe.domain)?;
        if probe.partition_bits != self.layout.partition_bits() {
            return Err(JoinError::LayoutMismatch);
        }
        let threads = resolve_threads(threads);
        let groups = balance_regions(&probe.bounds, threads);
        let bucket_bits = self.layout.bucket_bits;
        let run = |parts: std::ops::Range<usize>| {
            let (a, b) = (
                probe.bounds[parts.start] as usize,
                probe.bounds[parts.end] as usize,
            );
            let mut out = JoinPairs::with_capacity(b - a);
            for k in parts {
                let probes = &probe.tuples[probe.bounds[k] as usize..probe.bounds[k + 1] as usize];
                if probes.is_empty() {
                    continue;
                }
                let dir = &self.directory[k << bucket_bits..=(k + 1) << bucket_bits];
                let build = &self.tuples[dir[0] as usize..dir[dir.len() - 1] as usize];
                // Load the build partition and its directory into cache with one
                // sequential sweep first. Probes hit random buckets, so without this every
                // cache line of the partition would arrive through a demand miss (about
                // one per four probes in a 1:1 join); a sequential read is served by the
                // hardware prefetcher at memory bandwidth instead.
                if probes.len() >= 16 {
                    warm(build, dir);
                }
                for t in probes {
                    self.lookup(t.key, t.row, &mut out);
                }
            }
            out
        };
        if groups.len() == 2 {
            return Ok(run(0..groups[1]));
        }
        let parts = std::thread::scope(|s| {
            let hs: Vec<_> = groups
                .windows(2)
                .map(|g| {
                    let run = &run;
                    let r = g[0]..g[1];
                    s.spawn(move || run(r))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        Ok(JoinPairs::concat(parts))
    }
}

impl RadixHashTable {
    /// Join phase for a probe fragment whose rows are already grouped by this table's
    /// partitions, e.g. partitioned once at its origin and shipped in that form to every
    /// node of a cyclo-join ring: rows `bounds[k]..bounds[k + 1]` of `probe` belong to
    /// partition `k`. Joins partition by partition like [`Self::join_partitioned`],
    /// without a partitioning pass. Pairs are `(build_row, probe_row)`; a row in the wrong
    /// group still finds its matches (lookups hash every key), only slower.
    pub fn probe_grouped(&self, probe: &Keys, bounds: &[u32], threads: usize) -> Result<JoinPairs> {
        check_domains(self.domain, probe.domain())?;
        probe.check_rows()?;
        let partitions = 1usize << self.layout.partition_bits();
        if bounds.len() != partitions + 1
            || bounds[0] != 0
            || bounds[partitions] as usize != probe.len()
            || bounds.windows(2).any(|w| w[0] > w[1])
        {
            return Err(JoinError::LayoutMismatch);
        }
        let threads = resolve_threads(threads);
        let groups = balance_regions(bounds, threads);
        let bucket_bits = self.layout.bucket_bits;
        let run = |parts: std::ops::Range<usize>| {
            let rows = (bounds[parts.end] - bounds[parts.start]) as usize;
            let mut out = JoinPairs::with_capacity(rows);
            for k in parts {
                let range = bounds[k] as usize..bounds[k + 1] as usize;
                if range.is_empty() {
                    continue;
                }
                let dir = &self.directory[k << bucket_bits..=(k + 1) << bucket_bits];
                let build = &self.tuples[dir[0] as usize..dir[dir.len() - 1] as usize];
                if range.len() >= 16 {
                    warm(build, dir);
                }
                probe.for_each_valid(range, |row, key| self.lookup(key, row as u32, &mut out));
            }
            out
        };
        if groups.len() == 2 {
            return Ok(run(0..groups[1]));
        }
        let parts = std::thread::scope(|s| {
            let hs: Vec<_> = groups
                .windows(2)
                .map(|g| {
                    let run = &run;
                    let r = g[0]..g[1];
                    s.spawn(move || run(r))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        Ok(JoinPairs::concat(parts))
    }
}

/// Reads one word per cache line of a build partition and its directory.
#[inline(never)]
fn warm(build: &[Tuple], dir: &[u32]) {
    let mut acc = 0u64;
    for t in build.iter().step_by(4) {
        acc ^= t.key;
    }
    for d in dir.iter().step_by(16) {
        acc ^= u64::from(*d);
    }
    std::hint::black_box(acc);
}

/// A probe fragment partitioned once with a build side's layout; it can be joined with
/// every prepared build side that uses the same partition bits (e.g. on each ring hop).
#[derive(Debug, Clone)]
pub struct PartitionedProbe {
    tuples: Vec<Tuple>,
    bounds: Vec<u32>,
    partition_bits: u32,
    domain: KeyDomain,
    rows: usize,
}

impl PartitionedProbe {
    pub fn new(keys: &Keys, layout: &RadixLayout, threads: usize) -> Result<Self> {
        keys.check_rows()?;
        let (tuples, bounds) = partition_keys(keys, &layout.pass_bits, resolve_threads(threads));
        Ok(PartitionedProbe {
            tuples,
            bounds,
            partition_bits: layout.partition_bits(),
            domain: keys.domain(),
            rows: keys.len(),
        })
    }

    /// Non-NULL probe keys held.
    pub fn len(&self) -> usize {
        self.tuples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tuples.is_empty()
    }

    /// Rows of the probe input, NULLs included.
    pub fn input_rows(&self) -> usize {
        self.rows
    }
}

/// One-shot radix join of two key columns: `(build_row, probe_row)` pairs.
pub fn radix_join(build: &Keys, probe: &Keys, config: &RadixConfig) -> Result<JoinPairs> {
    check_domains(build.domain(), probe.domain())?;
    RadixHashTable::build(build, config)?.probe(probe, config)
}

/// [`radix_join`] on Arrow integer columns (`UInt64`/`Int64` without copying).
pub fn radix_join_arrays(
    build: &dyn Array,
    probe: &dyn Array,
    config: &RadixConfig,
) -> Result<JoinPairs> {
    radix_join(&Keys::from_array(build)?, &Keys::from_array(probe)?, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{range_join, testdata};
    use arrow_array::{Int64Array, UInt64Array};

    fn configs() -> Vec<RadixConfig> {
        // Tiny caches force several partition bits and passes even on test-sized data.
        let mut v = vec![];
        for (cache, max_bits) in [(1 << 20, 10), (4096, 3), (640, 2), (64, 16)] {
            for mode in [ProbeMode::Auto, ProbeMode::Partitioned, ProbeMode::Direct] {
                for threads in [1, 2, 3] {
                    v.push(RadixConfig {
                        cache_bytes: cache,
                        max_bits_per_pass: max_bits,
                        threads,
                        probe_mode: mode,
                    });
                }
            }
        }
        v
    }

    #[test]
    fn matches_naive_join_on_every_data_shape() {
        for case in testdata::cases() {
            let expected = case.expected(|a, b| a == b, |a| (a, a));
            for config in configs() {
                let got = radix_join(&case.left_keys(), &case.right_keys(), &config)
                    .unwrap_or_else(|e| panic!("{}: {e}", case.name));
                assert_eq!(
                    got.sorted(),
                    expected,
                    "case {} config {config:?}",
                    case.name
                );
            }
        }
    }

    #[test]
    fn prepared_build_serves_many_probe_fragments() {
        let build: Vec<u64> = (0..50_000u64).map(|i| i * 7).collect();
        let config = RadixConfig {
            cache_bytes: 16 * 1024,
            ..RadixConfig::default()
        };
        let table = RadixHashTable::build(&Keys::unsigned(&build), &config).unwrap();
        assert!(table.layout().partition_bits() >= 5, "{:?}", table.layout());
        for f in 0..5u64 {
            let probe: Vec<u64> = (0..20_000u64).map(|i| (i * 13 + f) % 400_000).collect();
            let expected = range_join(
                &build.iter().map(|&k| Some(k as i128)).collect::<Vec<_>>(),
                &probe.iter().map(|&k| Some(k as i128)).collect::<Vec<_>>(),
                |a| (a, a),
            );
            let got = table.probe(&Keys::unsigned(&probe), &config).unwrap();
            assert_eq!(got.sorted(), expected);
            let part = PartitionedProbe::new(&Keys::unsigned(&probe), table.layout(), 2).unwrap();
            assert_eq!(table.join_partitioned(&part, 2).unwrap().sorted(), expected);
        }
    }

    #[test]
    fn arrow_convenience_respects_validity_and_domains() {
        let b = Int64Array::from(vec![Some(1), None, Some(-3), Some(1)]);
        let p = Int64Array::from(vec![None, Some(1), Some(-3), Some(2)]);
        let got = radix_join_arrays(&b, &p, &RadixConfig::default()).unwrap();
        assert_eq!(got.sorted(), vec![(0, 1), (2, 2), (3, 1)]);
        let u = UInt64Array::from(vec![1u64]);
        assert!(matches!(
            radix_join_arrays(&b, &u, &RadixConfig::default()),
            Err(JoinError::DomainMismatch { .. })
        ));
    }

    #[test]
    fn grouped_probes_need_bounds_of_the_tables_layout() {
        let k: Vec<u64> = (0..5000).map(|i| i % 777).collect();
        let layout = RadixLayout::new(vec![2], 5).unwrap();
        let table = RadixHashTable::build_with_layout(&Keys::unsigned(&k), layout, 1).unwrap();
        let mut probe: Vec<u64> = (0..3000).map(|i| (i * 7) % 900).collect();
        probe.sort_by_key(|&x| top_bits(hash_key(x), 2));
        let mut bounds = vec![0u32; 5];
        for &x in &probe {
            bounds[top_bits(hash_key(x), 2) + 1] += 1;
        }
        for i in 0..4 {
            bounds[i + 1] += bounds[i];
        }
        let want = table.probe_direct(&Keys::unsigned(&probe), 1).sorted();
        for threads in [1, 3] {
            let got = table.probe_grouped(&Keys::unsigned(&probe), &bounds, threads);
            assert_eq!(got.unwrap().sorted(), want);
        }
        assert_eq!(
            table
                .probe_grouped(&Keys::unsigned(&probe), &bounds[..4], 1)
                .unwrap_err(),
            JoinError::LayoutMismatch
        );
    }

    #[test]
    fn mismatched_layouts_are_refused() {
        let k: Vec<u64> = (0..1000).collect();
        let table = RadixHashTable::build_with_layout(
            &Keys::unsigned(&k),
            RadixLayout::new(vec![4], 6).unwrap(),
            1,
        )
        .unwrap();
        let part = PartitionedProbe::new(
            &Keys::unsigned(&k),
            &RadixLayout::new(vec![3], 0).unwrap(),
            1,
        )
        .unwrap();
        assert_eq!(
            table.join_partitioned(&part, 1).unwrap_err(),
            JoinError::LayoutMismatch
        );
    }

    #[test]
    fn plan_fits_partitions_in_half_the_cache() {
        let config = RadixConfig {
            cache_bytes: 256 * 1024,
            max_bits_per_pass: 6,
            ..RadixConfig::default()
        };
        let l = RadixLayout::plan(16 << 20, &config).unwrap();
        let parts = 1usize << l.partition_bits();
        assert!(
            (16usize << 20) / parts * BUILD_BYTES_PER_TUPLE <= 128 * 1024,
            "{l:?}"
        );
        assert_eq!(l.pass_bits().len(), 2);
        assert_eq!(RadixLayout::plan(100, &config).unwrap().partition_bits(), 0);
        assert_eq!(RadixConfig::for_cache(512 * 1024).max_bits_per_pass, 12);
        assert_eq!(RadixConfig::for_cache(256 * 1024).max_bits_per_pass, 11);
        assert_eq!(RadixLayout::plan(0, &config).unwrap().bucket_bits(), 0);
    }
}
