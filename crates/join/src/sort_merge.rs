//! Sort-merge join on 64-bit keys with equality, band and inequality predicates
//! (cyclo-join paper Sec. IV-C.2).
//!
//! - **Setup** ([`SortedKeys::sort`]): a relation is sorted once by its ordered key and
//!   can then be merged with any number of fragments (Sec. IV-D: the stationary `S_i` is
//!   sorted once; a rotating `R_j` can travel already sorted). Sorting is an LSD radix
//!   sort with 11-bit digits built on the same parallel, stable scatter pass as the hash
//!   join's partitioning; digits in which all keys agree are skipped (found with one
//!   OR/AND pass), so dense keys need only as many passes as their significant bits.
//!   The paper used `qsort` and names a faster sort as future work; a radix sort is that.
//! - **Join** ([`merge_join`]): one sweep over the sorted left side; for each left key the
//!   matching right keys form a contiguous window whose both ends only move forward as
//!   the left key grows, so the access pattern is strictly sequential, the property the
//!   paper credits for the sort-merge join phase being faster than the hash join phase.
//!   The left side is cut into one contiguous piece per thread (Sec. IV-C.2 splits `R_j`
//!   into one sub-partition per core); each piece finds its window start by binary search.

use arrow_array::Array;

use crate::KeyDomain;
use crate::cache::resolve_threads;
use crate::error::{JoinError, Result};
use crate::keys::{Keys, MAX_ROWS, check_domains};
use crate::pairs::JoinPairs;
use crate::partition::{
    KeySource, MIN_TUPLES_PER_THREAD, Tuple, scatter, split_even, zeroed_tuples,
};

/// Digit width of the LSD radix sort: 2^11 cursors, the same fan-out the hash join's
/// partitioning pass keeps in cache; 64-bit keys need at most 6 passes.
const SORT_DIGIT_BITS: u32 = 11;

/// The predicate between a left key `l` and a right key `r` (numeric values, so signed
/// keys compare as signed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergePredicate {
    /// `l = r`
    Eq,
    /// `l BETWEEN r - c1 AND r + c2`, i.e. `r` in `[l - c2, l + c1]`. Negative constants
    /// are allowed; an empty band matches nothing.
    Band { c1: i64, c2: i64 },
    /// `l < r`
    Lt,
    /// `l <= r`
    Le,
    /// `l > r`
    Gt,
    /// `l >= r`
    Ge,
}

impl MergePredicate {
    /// The inclusive window of ordered right keys matching ordered left key `l`, or
    /// `None` when it is empty. Both ends are non-decreasing in `l`, which is what lets
    /// the merge move its window forward only. The ordered map is a translation of the
    /// numeric value, so offsets are added in ordered space and clamped to `u64`.
    #[inline(always)]
    fn window(self, l: u64) -> Option<(u64, u64)> {
        match self {
            MergePredicate::Eq => Some((l, l)),
            MergePredicate::Band { c1, c2 } => {
                let lo = (l as i128 - c2 as i128).max(0);
                let hi = (l as i128 + c1 as i128).min(u64::MAX as i128);
                (lo <= hi).then_some((lo as u64, hi as u64))
            }
            MergePredicate::Lt => l.checked_add(1).map(|lo| (lo, u64::MAX)),
            MergePredicate::Le => Some((l, u64::MAX)),
            MergePredicate::Gt => l.checked_sub(1).map(|hi| (0, hi)),
            MergePredicate::Ge => Some((0, l)),
        }
    }

    /// The predicate on numeric values (for references and the nested-loops fallback).
    pub fn holds(self, l: i128, r: i128) -> bool {
        match self {
            MergePredicate::Eq => l == r,
            MergePredicate::Band { c1, c2 } => r - c1 as i128 <= l && l <= r + c2 as i128,
            MergePredicate::Lt => l < r,
            MergePredicate::Le => l <= r,
            MergePredicate::Gt => l > r,
            MergePredicate::Ge => l >= r,
        }
    }
}

/// A relation sorted by key (NULLs dropped), rows kept for the output pairs. Ties stay
/// in row order (the radix sort is stable).
#[derive(Debug, Clone)]
pub struct SortedKeys {
    /// Ordered keys ([`KeyDomain::ordered`]) with their rows, ascending.
    tuples: Vec<Tuple>,
    domain: KeyDomain,
    rows: usize,
}

impl SortedKeys {
    /// Setup phase: sorts the non-NULL keys.
    pub fn sort(keys: &Keys, threads: usize) -> Result<Self> {
        keys.check_rows()?;
        let threads = resolve_threads(threads);
        let domain = keys.domain();
        let source = KeySource {
            keys,
            map: move |k| domain.ordered(k),
        };
        let (or, and) = or_and(keys, threads);
        let differing = or ^ and;
        let digits: Vec<(u32, u32)> = (0..64)
            .step_by(SORT_DIGIT_BITS as usize)
            .map(|shift| (shift, SORT_DIGIT_BITS.min(64 - shift)))
            .filter(|&(shift, bits)| (differing >> shift) & ((1u64 << bits) - 1) != 0)
            .collect();
        let mut a = Vec::new();
        match digits.first() {
            None => {
                scatter(&source, &mut a, 1, |_| 0, threads);
            }
            Some(&(shift, bits)) => {
                let mask = (1u64 << bits) - 1;
                scatter(
                    &source,
                    &mut a,
                    1 << bits,
                    move |k| ((k >> shift) & mask) as usize,
                    threads,
                );
            }
        }
        if digits.len() > 1 {
            let mut b = zeroed_tuples(a.len());
            for &(shift, bits) in &digits[1..] {
                let mask = (1u64 << bits) - 1;
                scatter(
                    &a[..],
                    &mut b,
                    1 << bits,
                    move |k| ((k >> shift) & mask) as usize,
                    threads,
                );
                std::mem::swap(&mut a, &mut b);
            }
        }
        Ok(SortedKeys {
            tuples: a,
            domain,
            rows: keys.len(),
        })
    }

    /// Non-NULL keys held.
    pub fn len(&self) -> usize {
        self.tuples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tuples.is_empty()
    }

    /// Rows of the input, NULLs included.
    pub fn input_rows(&self) -> usize {
        self.rows
    }

    pub fn domain(&self) -> KeyDomain {
        self.domain
    }

    /// Rows in ascending key order (ties in row order).
    pub fn rows(&self) -> impl Iterator<Item = u32> + '_ {
        self.tuples.iter().map(|t| t.row)
    }
}

/// OR and AND of all ordered non-NULL keys: their XOR marks the bits that vary.
fn or_and(keys: &Keys, threads: usize) -> (u64, u64) {
    let domain = keys.domain();
    let fold = |r: std::ops::Range<usize>| {
        let (mut or, mut and) = (0u64, u64::MAX);
        keys.for_each_valid(r, |_, k| {
            let k = domain.ordered(k);
            or |= k;
            and &= k;
        });
        (or, and)
    };
    let n = keys.len();
    let threads = threads.min(n / MIN_TUPLES_PER_THREAD).max(1);
    if threads == 1 {
        return fold(0..n);
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = split_even(n, threads)
            .into_iter()
            .map(|r| {
                let fold = &fold;
                s.spawn(move || fold(r))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, u64::MAX), |(o, a), (o2, a2)| (o | o2, a & a2))
    })
}

/// First index `>= from` whose key does not satisfy `before`, by galloping: one
/// comparison when the window moves by a step (the common case), logarithmic when it
/// has to skip far (a small left fragment against a large right side).
#[inline(always)]
fn gallop(t: &[Tuple], from: usize, before: impl Fn(u64) -> bool) -> usize {
    let m = t.len();
    if from >= m || !before(t[from].key) {
        return from;
    }
    let mut lo = from; // before(t[lo]) holds
    let mut step = 1;
    while lo + step < m && before(t[lo + step].key) {
        lo += step;
        step *= 2;
    }
    let end = (lo + step).min(m);
    lo + 1 + t[lo + 1..end].partition_point(|x| before(x.key))
}

/// Join phase: `(left_row, right_row)` for every pair satisfying `predicate`, ordered by
/// left key then right key. NULLs match nothing.
pub fn merge_join(
    left: &SortedKeys,
    right: &SortedKeys,
    predicate: MergePredicate,
    threads: usize,
) -> Result<JoinPairs> {
    check_domains(left.domain, right.domain)?;
    let l = &left.tuples;
    let r = &right.tuples[..];
    let run = |chunk: std::ops::Range<usize>| {
        let expect = if predicate == MergePredicate::Eq {
            chunk.len()
        } else {
            chunk.len() * 2
        };
        let mut out = JoinPairs::with_capacity(expect);
        let (mut lo_p, mut hi_p) = (0usize, 0usize);
        for t in &l[chunk] {
            let Some((lo, hi)) = predicate.window(t.key) else {
                continue;
            };
            lo_p = gallop(r, lo_p, |k| k < lo);
            hi_p = gallop(r, hi_p.max(lo_p), |k| k <= hi);
            for m in &r[lo_p..hi_p] {
                out.push(t.row, m.row);
            }
        }
        out
    };
    let threads = resolve_threads(threads)
        .min(l.len() / MIN_TUPLES_PER_THREAD)
        .max(1);
    if threads == 1 {
        return Ok(run(0..l.len()));
    }
    let parts = std::thread::scope(|s| {
        let hs: Vec<_> = split_even(l.len(), threads)
            .into_iter()
            .map(|c| {
                let run = &run;
                s.spawn(move || run(c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Ok(JoinPairs::concat(parts))
}

/// Join phase for a left run sorted elsewhere, e.g. a cyclo-join fragment that was sorted
/// once at its origin and travels sorted (paper Sec. IV-D): `left[i]` are key bit
/// patterns of `domain`, ascending in key order, and left rows are positions in the run.
/// Output as [`merge_join`]. A run that is not sorted is refused (one sequential check).
pub fn merge_join_run(
    left: &[u64],
    domain: KeyDomain,
    right: &SortedKeys,
    predicate: MergePredicate,
    threads: usize,
) -> Result<JoinPairs> {
    check_domains(domain, right.domain)?;
    if left.len() > MAX_ROWS {
        return Err(JoinError::TooManyRows {
            rows: left.len(),
            max: MAX_ROWS,
        });
    }
    if left
        .windows(2)
        .any(|w| domain.ordered(w[0]) > domain.ordered(w[1]))
    {
        return Err(JoinError::InvalidConfig(
            "merge run is not sorted by key".into(),
        ));
    }
    let r = &right.tuples[..];
    let run = |chunk: std::ops::Range<usize>| {
        let mut out = JoinPairs::with_capacity(chunk.len());
        let (mut lo_p, mut hi_p) = (0usize, 0usize);
        for (i, &bits) in left[chunk.clone()].iter().enumerate() {
            let Some((lo, hi)) = predicate.window(domain.ordered(bits)) else {
                continue;
            };
            lo_p = gallop(r, lo_p, |k| k < lo);
            hi_p = gallop(r, hi_p.max(lo_p), |k| k <= hi);
            let row = (chunk.start + i) as u32;
            for m in &r[lo_p..hi_p] {
                out.push(row, m.row);
            }
        }
        out
    };
    let threads = resolve_threads(threads)
        .min(left.len() / MIN_TUPLES_PER_THREAD)
        .max(1);
    if threads == 1 {
        return Ok(run(0..left.len()));
    }
    let parts = std::thread::scope(|s| {
        let hs: Vec<_> = split_even(left.len(), threads)
            .into_iter()
            .map(|c| {
                let run = &run;
                s.spawn(move || run(c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Ok(JoinPairs::concat(parts))
}

/// One-shot sort-merge join of two key columns: `(left_row, right_row)` pairs.
pub fn sort_merge_join(
    left: &Keys,
    right: &Keys,
    predicate: MergePredicate,
    threads: usize,
) -> Result<JoinPairs> {
    check_domains(left.domain(), right.domain())?;
    let l = SortedKeys::sort(left, threads)?;
    let r = SortedKeys::sort(right, threads)?;
    merge_join(&l, &r, predicate, threads)
}

/// [`sort_merge_join`] on Arrow integer columns.
pub fn sort_merge_join_arrays(
    left: &dyn Array,
    right: &dyn Array,
    predicate: MergePredicate,
    threads: usize,
) -> Result<JoinPairs> {
    sort_merge_join(
        &Keys::from_array(left)?,
        &Keys::from_array(right)?,
        predicate,
        threads,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::testdata;
    use arrow_array::Int64Array;

    fn predicates() -> Vec<MergePredicate> {
        use MergePredicate::*;
        vec![
            Eq,
            Band { c1: 0, c2: 0 },
            Band { c1: 3, c2: 1 },
            Band { c1: 0, c2: 7 },
            Band { c1: -2, c2: 1 },
            Band { c1: -2, c2: 5 },
            Band {
                c1: i64::MAX,
                c2: 2,
            },
            Lt,
            Le,
            Gt,
            Ge,
        ]
    }

    fn range(p: MergePredicate) -> impl Fn(i128) -> (i128, i128) {
        move |l| match p {
            MergePredicate::Eq => (l, l),
            MergePredicate::Band { c1, c2 } => (l - c2 as i128, l + c1 as i128),
            MergePredicate::Lt => (l + 1, i128::MAX),
            MergePredicate::Le => (l, i128::MAX),
            MergePredicate::Gt => (i128::MIN, l - 1),
            MergePredicate::Ge => (i128::MIN, l),
        }
    }

    #[test]
    fn matches_reference_for_every_predicate_and_shape() {
        for case in testdata::cases() {
            let (lk, rk) = (case.left_keys(), case.right_keys());
            let sorted: Vec<(SortedKeys, SortedKeys)> = [1, 2, 3]
                .iter()
                .map(|&t| {
                    (
                        SortedKeys::sort(&lk, t).unwrap(),
                        SortedKeys::sort(&rk, t).unwrap(),
                    )
                })
                .collect();
            for p in predicates() {
                let quadratic = !matches!(p, MergePredicate::Eq | MergePredicate::Band { .. });
                if case.large
                    && (quadratic
                        || p == (MergePredicate::Band {
                            c1: i64::MAX,
                            c2: 2,
                        }))
                {
                    continue;
                }
                let expected = case.expected(|a, b| p.holds(a, b), range(p));
                for (threads, (l, r)) in sorted.iter().enumerate() {
                    let got = merge_join(l, r, p, threads + 1).unwrap();
                    assert_eq!(
                        got.sorted(),
                        expected,
                        "case {} {p:?} threads {}",
                        case.name,
                        threads + 1
                    );
                }
            }
        }
    }

    #[test]
    fn presorted_runs_merge_like_sorted_keys() {
        let s_keys: Vec<i64> = (0..50_000).map(|i| (i * 7919) % 20_011 - 10_000).collect();
        let s = SortedKeys::sort(&Keys::signed(&s_keys), 2).unwrap();
        let mut run: Vec<i64> = (0..70_000)
            .map(|i| (i * 104_729) % 24_001 - 12_000)
            .collect();
        run.sort_unstable();
        let bits: Vec<u64> = run.iter().map(|&v| v as u64).collect();
        let sorted_run = SortedKeys::sort(&Keys::signed(&run), 1).unwrap();
        for p in predicates().into_iter().filter(|p| {
            matches!(p, MergePredicate::Eq)
                || matches!(p, MergePredicate::Band { c1, .. } if *c1 < 10)
        }) {
            let want = merge_join(&sorted_run, &s, p, 1).unwrap().sorted();
            for threads in [1, 3] {
                let got = merge_join_run(&bits, KeyDomain::Signed, &s, p, threads).unwrap();
                assert_eq!(got.sorted(), want, "{p:?}");
            }
        }
        let unsorted = [3u64, 1];
        assert!(matches!(
            merge_join_run(&unsorted, KeyDomain::Unsigned, &s, MergePredicate::Eq, 1),
            Err(JoinError::DomainMismatch { .. })
        ));
        let u = SortedKeys::sort(&Keys::unsigned(&[1, 2]), 1).unwrap();
        assert!(matches!(
            merge_join_run(&unsorted, KeyDomain::Unsigned, &u, MergePredicate::Eq, 1),
            Err(JoinError::InvalidConfig(_))
        ));
    }

    #[test]
    fn sort_orders_keys_stably_and_drops_nulls() {
        let a = Int64Array::from(vec![
            Some(3),
            None,
            Some(-7),
            Some(3),
            Some(i64::MIN),
            Some(0),
        ]);
        let s = SortedKeys::sort(&Keys::from_array(&a).unwrap(), 1).unwrap();
        assert_eq!(s.rows().collect::<Vec<_>>(), vec![4, 2, 5, 0, 3]);
        assert_eq!(s.input_rows(), 6);
        let many: Vec<u64> = (0..100_000u64)
            .map(|i| i.wrapping_mul(0x9E3779B97F4A7C15))
            .collect();
        let s = SortedKeys::sort(&Keys::unsigned(&many), 2).unwrap();
        let keys: Vec<u64> = s.rows().map(|r| many[r as usize]).collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(s.len(), many.len());
    }

    #[test]
    fn sorted_side_serves_many_fragments() {
        let s_keys: Vec<i64> = (0..40_000).map(|i| (i * 37) % 10_007 - 5000).collect();
        let s = SortedKeys::sort(&Keys::signed(&s_keys), 2).unwrap();
        for f in 0..3i64 {
            let r_keys: Vec<i64> = (0..3000)
                .map(|i| (i * 11 + f * 101) % 12_000 - 6000)
                .collect();
            let r = SortedKeys::sort(&Keys::signed(&r_keys), 1).unwrap();
            let p = MergePredicate::Band { c1: 2, c2: 2 };
            let expected = crate::reference::range_join(
                &r_keys.iter().map(|&v| Some(v as i128)).collect::<Vec<_>>(),
                &s_keys.iter().map(|&v| Some(v as i128)).collect::<Vec<_>>(),
                |l| (l - 2, l + 2),
            );
            assert_eq!(merge_join(&r, &s, p, 2).unwrap().sorted(), expected);
        }
    }
}
