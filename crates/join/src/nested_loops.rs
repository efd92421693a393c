//! Blocked nested-loops join for predicates neither hashing nor sorting can serve
//! (cyclo-join paper Sec. IV-C: "for all other join predicates, our system falls back to
//! the universal but slower nested loops join").
//!
//! Blocking: the right side is walked in blocks small enough to stay in L1 while a whole
//! block of left rows is compared with it, so each right block is loaded from memory once
//! per left block instead of once per left row. Left blocks are spread over threads.

use crate::cache::resolve_threads;
use crate::keys::Keys;
use crate::pairs::JoinPairs;
use crate::partition::split_even;

/// Left rows per block: the outer loop's working set.
const LEFT_BLOCK: usize = 256;
/// Right rows per block: 2048 keys of 8 bytes plus their rows fill about half of a
/// 32 KiB L1 data cache.
const RIGHT_BLOCK: usize = 2048;

/// Pairs below this many comparisons per thread are not worth a thread.
const MIN_PAIRS_PER_THREAD: usize = 1 << 20;

/// `(left_row, right_row)` for every pair of indices with `pred(left_row, right_row)`,
/// ordered by left block, then right block. The predicate sees row indices and reads
/// whatever columns it needs itself.
pub fn nested_loops_join<P>(
    left_rows: usize,
    right_rows: usize,
    threads: usize,
    pred: P,
) -> JoinPairs
where
    P: Fn(usize, usize) -> bool + Sync,
{
    let left: Vec<u32> = (0..left_rows as u32).collect();
    let right: Vec<u32> = (0..right_rows as u32).collect();
    blocked(&left, &left, &right, &right, threads, |&l, &r| {
        pred(l as usize, r as usize)
    })
}

/// Nested loops over two slices of values, `pred(&left[i], &right[j])`.
pub fn nested_loops_join_values<L, R, P>(
    left: &[L],
    right: &[R],
    threads: usize,
    pred: P,
) -> JoinPairs
where
    L: Sync,
    R: Sync,
    P: Fn(&L, &R) -> bool + Sync,
{
    let lrows: Vec<u32> = (0..left.len() as u32).collect();
    let rrows: Vec<u32> = (0..right.len() as u32).collect();
    blocked(left, &lrows, right, &rrows, threads, pred)
}

/// Nested loops over two key columns with a predicate on numeric key values (exact in
/// `i128` for signed and unsigned keys alike); NULL keys match nothing. Valid keys are
/// first compacted into dense arrays so the inner loop touches no validity bits.
pub fn nested_loops_join_keys<P>(left: &Keys, right: &Keys, threads: usize, pred: P) -> JoinPairs
where
    P: Fn(i128, i128) -> bool + Sync,
{
    let compact = |k: &Keys| {
        let (mut vals, mut rows) = (
            Vec::with_capacity(k.valid_count()),
            Vec::with_capacity(k.valid_count()),
        );
        let d = k.domain();
        k.for_each_valid(0..k.len(), |row, bits| {
            vals.push(d.value(bits));
            rows.push(row as u32);
        });
        (vals, rows)
    };
    let (lv, lr) = compact(left);
    let (rv, rr) = compact(right);
    blocked(&lv, &lr, &rv, &rr, threads, |&a, &b| pred(a, b))
}

fn blocked<L, R, P>(
    left: &[L],
    lrows: &[u32],
    right: &[R],
    rrows: &[u32],
    threads: usize,
    pred: P,
) -> JoinPairs
where
    L: Sync,
    R: Sync,
    P: Fn(&L, &R) -> bool + Sync,
{
    let run = |lrange: std::ops::Range<usize>| {
        let mut out = JoinPairs::default();
        let mut lb = lrange.start;
        while lb < lrange.end {
            let le = (lb + LEFT_BLOCK).min(lrange.end);
            for rb in (0..right.len()).step_by(RIGHT_BLOCK) {
                let re = (rb + RIGHT_BLOCK).min(right.len());
                for i in lb..le {
                    let l = &left[i];
                    for j in rb..re {
                        if pred(l, &right[j]) {
                            out.push(lrows[i], rrows[j]);
                        }
                    }
                }
            }
            lb = le;
        }
        out
    };
    let blocks = left.len().div_ceil(LEFT_BLOCK);
    let work = left.len().saturating_mul(right.len());
    let threads = resolve_threads(threads)
        .min(work / MIN_PAIRS_PER_THREAD)
        .min(blocks)
        .max(1);
    if threads == 1 {
        return run(0..left.len());
    }
    // Cut at block boundaries so every thread works on whole blocks.
    let parts = std::thread::scope(|s| {
        let hs: Vec<_> = split_even(blocks, threads)
            .into_iter()
            .map(|b| {
                let run = &run;
                let r = (b.start * LEFT_BLOCK)..(b.end * LEFT_BLOCK).min(left.len());
                s.spawn(move || run(r))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    JoinPairs::concat(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{naive_join, testdata};

    #[test]
    fn matches_naive_join_for_arbitrary_predicates() {
        type Pred = fn(i128, i128) -> bool;
        let preds: Vec<(&str, Pred)> = vec![
            ("eq", |a, b| a == b),
            ("mod", |a, b| (a - b).rem_euclid(7) == 3),
            ("ne", |a, b| a != b),
            ("xor-ish", |a, b| (a ^ b) & 5 == 1),
        ];
        for case in testdata::cases().into_iter().filter(|c| !c.large) {
            let (lk, rk) = (case.left_keys(), case.right_keys());
            let (lv, rv) = (case.left_values(), case.right_values());
            for (name, p) in &preds {
                let expected = naive_join(&lv, &rv, p);
                for threads in [1, 2, 3] {
                    let got = nested_loops_join_keys(&lk, &rk, threads, p);
                    assert_eq!(got.sorted(), expected, "case {} pred {name}", case.name);
                }
            }
        }
    }

    #[test]
    fn index_and_value_forms_agree_across_blocks() {
        // Sizes not multiples of the block sizes, and enough work for two threads.
        let l: Vec<i64> = (0..1_300).map(|i| (i * 31) % 997).collect();
        let r: Vec<i64> = (0..2_500).map(|i| (i * 17) % 1009).collect();
        let p = |a: &i64, b: &i64| (a + b) % 101 == 0;
        let expected = naive_join(
            &l.iter().map(|&v| Some(v as i128)).collect::<Vec<_>>(),
            &r.iter().map(|&v| Some(v as i128)).collect::<Vec<_>>(),
            |a, b| (a + b) % 101 == 0,
        );
        assert_eq!(nested_loops_join_values(&l, &r, 2, p).sorted(), expected);
        assert_eq!(
            nested_loops_join(l.len(), r.len(), 3, |i, j| p(&l[i], &r[j])).sorted(),
            expected
        );
        assert!(nested_loops_join(0, 10, 2, |_, _| true).is_empty());
    }
}
