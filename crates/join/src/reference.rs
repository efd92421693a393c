//! Reference joins for tests: simple enough to be obviously right, independent of the
//! kernels' code (no partitioning, no sorting of the kernels' tuples, no hashing of our own).

use std::collections::BTreeMap;

/// Nested loops over every pair: `(left_row, right_row)` for which both keys are non-NULL
/// and `pred(left_value, right_value)` holds, sorted.
pub fn naive_join(
    left: &[Option<i128>],
    right: &[Option<i128>],
    pred: impl Fn(i128, i128) -> bool,
) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for (i, l) in left.iter().enumerate() {
        let Some(l) = l else { continue };
        for (j, r) in right.iter().enumerate() {
            if let Some(r) = r
                && pred(*l, *r)
            {
                out.push((i as u32, j as u32));
            }
        }
    }
    out.sort_unstable();
    out
}

/// For larger inputs: `(left_row, right_row)` where the right value lies in the inclusive
/// range `range(left_value)`, found with an ordered map of the right side. Sorted.
pub fn range_join(
    left: &[Option<i128>],
    right: &[Option<i128>],
    range: impl Fn(i128) -> (i128, i128),
) -> Vec<(u32, u32)> {
    let mut map: BTreeMap<i128, Vec<u32>> = BTreeMap::new();
    for (j, r) in right.iter().enumerate() {
        if let Some(r) = r {
            map.entry(*r).or_default().push(j as u32);
        }
    }
    let mut out = Vec::new();
    for (i, l) in left.iter().enumerate() {
        let Some(l) = l else { continue };
        let (lo, hi) = range(*l);
        if lo > hi {
            continue;
        }
        for rows in map.range(lo..=hi).map(|(_, v)| v) {
            out.extend(rows.iter().map(|&j| (i as u32, j)));
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
pub(crate) mod testdata {
    //! Data shapes every kernel is checked on: random and skewed keys, duplicates,
    //! NULLs, empty inputs, all-NULL inputs, single rows, extreme values.

    use arrow_buffer::NullBuffer;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use crate::KeyDomain;
    use crate::keys::Keys;
    use crate::zipf::Zipf;

    pub struct Case {
        pub name: String,
        pub domain: KeyDomain,
        pub left: Vec<u64>,
        pub left_valid: Option<Vec<bool>>,
        pub right: Vec<u64>,
        pub right_valid: Option<Vec<bool>>,
        /// Too large for the quadratic reference or for quadratic outputs.
        pub large: bool,
    }

    fn keys<'a>(v: &'a [u64], valid: &Option<Vec<bool>>, d: KeyDomain) -> Keys<'a> {
        let k = match d {
            KeyDomain::Unsigned => Keys::unsigned(v),
            KeyDomain::Signed => {
                // SAFETY: same size, alignment and validity of all bit patterns.
                let s = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<i64>(), v.len()) };
                Keys::signed(s)
            }
        };
        k.with_nulls(valid.clone().map(NullBuffer::from)).unwrap()
    }

    fn values(v: &[u64], valid: &Option<Vec<bool>>, d: KeyDomain) -> Vec<Option<i128>> {
        v.iter()
            .enumerate()
            .map(|(i, &b)| match valid {
                Some(m) if !m[i] => None,
                _ => Some(d.value(b)),
            })
            .collect()
    }

    impl Case {
        pub fn left_keys(&self) -> Keys<'_> {
            keys(&self.left, &self.left_valid, self.domain)
        }
        pub fn right_keys(&self) -> Keys<'_> {
            keys(&self.right, &self.right_valid, self.domain)
        }
        pub fn left_values(&self) -> Vec<Option<i128>> {
            values(&self.left, &self.left_valid, self.domain)
        }
        pub fn right_values(&self) -> Vec<Option<i128>> {
            values(&self.right, &self.right_valid, self.domain)
        }
        /// The expected pairs for `pred`, which must equal "right value within
        /// `range(left value)`": nested loops on small cases, the ordered-map join on
        /// large ones.
        pub fn expected(
            &self,
            pred: impl Fn(i128, i128) -> bool,
            range: impl Fn(i128) -> (i128, i128),
        ) -> Vec<(u32, u32)> {
            if self.large {
                super::range_join(&self.left_values(), &self.right_values(), range)
            } else {
                super::naive_join(&self.left_values(), &self.right_values(), pred)
            }
        }
    }

    fn random_nulls(rng: &mut SmallRng, n: usize, p: f64) -> Option<Vec<bool>> {
        Some((0..n).map(|_| !rng.random_bool(p)).collect())
    }

    fn case(
        name: &str,
        domain: KeyDomain,
        left: Vec<u64>,
        right: Vec<u64>,
        nulls: (Option<Vec<bool>>, Option<Vec<bool>>),
    ) -> Case {
        Case {
            name: name.into(),
            domain,
            large: left.len() * right.len() > 4_000_000,
            left,
            right,
            left_valid: nulls.0,
            right_valid: nulls.1,
        }
    }

    pub fn cases() -> Vec<Case> {
        use KeyDomain::*;
        let mut rng = SmallRng::seed_from_u64(42);
        let mut v = Vec::new();
        let uniform = |rng: &mut SmallRng, n: usize, range: u64| -> Vec<u64> {
            (0..n).map(|_| rng.random_range(0..range)).collect()
        };
        v.push(case("empty both", Unsigned, vec![], vec![], (None, None)));
        v.push(case(
            "empty left",
            Unsigned,
            vec![],
            vec![1, 2, 3],
            (None, None),
        ));
        v.push(case(
            "empty right",
            Signed,
            vec![1, 2, 3],
            vec![],
            (None, None),
        ));
        v.push(case(
            "single row match",
            Unsigned,
            vec![5],
            vec![5],
            (None, None),
        ));
        v.push(case(
            "single row miss",
            Signed,
            vec![5],
            vec![6],
            (None, None),
        ));
        v.push(case(
            "all null",
            Signed,
            vec![1, 1, 1],
            vec![1, 1],
            (Some(vec![false; 3]), Some(vec![false; 2])),
        ));
        let l = uniform(&mut rng, 300, 50);
        let r = uniform(&mut rng, 400, 50);
        let nl = random_nulls(&mut rng, 300, 0.2);
        let nr = random_nulls(&mut rng, 400, 0.2);
        v.push(case("small dups with nulls", Unsigned, l, r, (nl, nr)));
        let neg: Vec<u64> = (0..500)
            .map(|_| rng.random_range(-40i64..40) as u64)
            .collect();
        let neg2: Vec<u64> = (0..700)
            .map(|_| rng.random_range(-40i64..40) as u64)
            .collect();
        v.push(case("signed negatives", Signed, neg, neg2, (None, None)));
        let ext = vec![
            i64::MIN as u64,
            i64::MAX as u64,
            0,
            (-1i64) as u64,
            1,
            i64::MIN as u64 + 1,
        ];
        v.push(case(
            "signed extremes",
            Signed,
            ext.clone(),
            ext.clone(),
            (None, None),
        ));
        let uext = vec![u64::MAX, 0, u64::MAX - 1, 1, 1 << 63, (1 << 63) - 1];
        v.push(case(
            "unsigned extremes",
            Unsigned,
            uext.clone(),
            uext,
            (None, None),
        ));
        let z = Zipf::new(200, 1.25);
        let zl: Vec<u64> = (0..2000).map(|_| z.sample(&mut rng) * 1_000_003).collect();
        let zr: Vec<u64> = (0..1500).map(|_| z.sample(&mut rng) * 1_000_003).collect();
        v.push(case("zipf skew both sides", Unsigned, zl, zr, (None, None)));
        // Large: enough tuples for several threads and partitions; equality-sized outputs.
        let n = 120_000;
        let wide = uniform(&mut rng, n, 1 << 40);
        let mut probe: Vec<u64> = (0..n)
            .map(|i| wide[rng.random_range(0..n)] + (i % 3 == 0) as u64)
            .collect();
        probe.push(u64::MAX);
        let nl = random_nulls(&mut rng, n, 0.05);
        v.push(case(
            "large fk-ish with nulls",
            Unsigned,
            wide,
            probe,
            (nl, None),
        ));
        let z = Zipf::new(100_000, 1.25);
        let zl: Vec<u64> = (0..60_000)
            .map(|_| (z.sample(&mut rng) as i64 - 50_000) as u64)
            .collect();
        let zr: Vec<u64> = (0..100_000u64)
            .map(|i| (i as i64 - 50_000) as u64)
            .collect();
        v.push(case(
            "large zipf probe signed",
            Signed,
            zr,
            zl,
            (None, None),
        ));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_reference_agrees_with_nested_loops() {
        let l: Vec<Option<i128>> = vec![Some(1), None, Some(5), Some(5), Some(-3)];
        let r: Vec<Option<i128>> = vec![Some(5), Some(2), None, Some(-4), Some(1)];
        assert_eq!(
            naive_join(&l, &r, |a, b| a == b),
            range_join(&l, &r, |a| (a, a))
        );
        assert_eq!(
            naive_join(&l, &r, |a, b| b - 1 <= a && a <= b + 2),
            range_join(&l, &r, |a| (a - 2, a + 1))
        );
        assert_eq!(
            naive_join(&l, &r, |a, b| a < b),
            range_join(&l, &r, |a| (a + 1, i128::MAX))
        );
        assert_eq!(
            naive_join(&l, &r, |a, b| a == b),
            vec![(0, 4), (2, 0), (3, 0)]
        );
    }
}
