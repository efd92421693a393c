//! Join output: matching row index pairs, so callers can `take` any payload columns.

use arrow_array::UInt32Array;

/// Matching pairs as two parallel index vectors (`left[i]` joins `right[i]`).
/// Which input is "left" is stated by each kernel (for the hash join: build, probe).
/// `u32` indices are what Arrow's `take` kernel accepts without conversion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinPairs {
    pub left: Vec<u32>,
    pub right: Vec<u32>,
}

impl JoinPairs {
    pub fn with_capacity(n: usize) -> Self {
        JoinPairs {
            left: crate::memory::vec_with_capacity(n),
            right: crate::memory::vec_with_capacity(n),
        }
    }

    #[inline(always)]
    pub fn push(&mut self, left: u32, right: u32) {
        self.left.push(left);
        self.right.push(right);
    }

    /// Every row of `left` paired with every row of `right` (a cross product),
    /// ordered by left row.
    pub fn cross(left: std::ops::Range<u32>, right: &[u32]) -> Self {
        let mut pairs = JoinPairs::with_capacity(left.len() * right.len());
        for l in left {
            for &r in right {
                pairs.push(l, r);
            }
        }
        pairs
    }

    pub fn len(&self) -> usize {
        self.left.len()
    }

    pub fn is_empty(&self) -> bool {
        self.left.is_empty()
    }

    /// Concatenates per-thread outputs in order.
    pub fn concat(parts: Vec<JoinPairs>) -> JoinPairs {
        if parts.len() == 1 {
            return parts.into_iter().next().unwrap();
        }
        let n = parts.iter().map(JoinPairs::len).sum();
        let mut out = JoinPairs::with_capacity(n);
        for p in parts {
            out.left.extend_from_slice(&p.left);
            out.right.extend_from_slice(&p.right);
        }
        out
    }

    /// The pairs as a sorted list (order-independent comparison in tests).
    pub fn sorted(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .left
            .iter()
            .copied()
            .zip(self.right.iter().copied())
            .collect();
        v.sort_unstable();
        v
    }

    /// The index vectors as Arrow arrays, without copying, ready for `take`.
    pub fn into_arrow(self) -> (UInt32Array, UInt32Array) {
        (UInt32Array::from(self.left), UInt32Array::from(self.right))
    }
}
