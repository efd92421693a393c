//! The local join a cyclo-join runs on its key columns.
//!
//! The planner derives it from the join condition; the full condition is still applied
//! after the kernel (as the residual filter), so the kernel only has to find every pair
//! that can satisfy it, exactly on integer key values.

use gyre_join::MergePredicate;
use gyre_join::cyclo::CycloAlgorithm;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A predicate on `(left key, right key)` the cyclo-join kernels evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CycloKernel {
    /// `left = right`: radix-partitioned hash join.
    Hash,
    /// `left BETWEEN right + lo AND right + hi`: sort-merge band join.
    Band {
        lo: i64,
        hi: i64,
    },
    /// `left < right` (and the others): sort-merge inequality joins.
    Lt,
    Le,
    Gt,
    Ge,
    /// No key condition the kernels know: every pair is a candidate (nested loops over a
    /// cross product: the join's filter, evaluated one row of one side against a block
    /// of the other, alone decides). Keys are not used.
    AllPairs,
}

impl CycloKernel {
    /// The library's algorithm for this kernel.
    pub fn algorithm(self) -> CycloAlgorithm {
        match self {
            CycloKernel::Hash => CycloAlgorithm::Hash,
            // l BETWEEN r + lo AND r + hi  ==  l BETWEEN r - c1 AND r + c2.
            CycloKernel::Band { lo, hi } => CycloAlgorithm::SortMerge(MergePredicate::Band {
                c1: lo.checked_neg().unwrap_or(i64::MAX),
                c2: hi,
            }),
            CycloKernel::Lt => CycloAlgorithm::SortMerge(MergePredicate::Lt),
            CycloKernel::Le => CycloAlgorithm::SortMerge(MergePredicate::Le),
            CycloKernel::Gt => CycloAlgorithm::SortMerge(MergePredicate::Gt),
            CycloKernel::Ge => CycloAlgorithm::SortMerge(MergePredicate::Ge),
            CycloKernel::AllPairs => CycloAlgorithm::CrossProduct,
        }
    }

    /// Whether the kernel compares key columns (else keys are ignored).
    pub fn uses_keys(self) -> bool {
        self != CycloKernel::AllPairs
    }

    /// Whether the result of one fragment may approach fragment rows x stationary rows
    /// (inequalities, all pairs), so fragments must be kept small.
    pub fn may_explode(self) -> bool {
        matches!(
            self,
            CycloKernel::Lt
                | CycloKernel::Le
                | CycloKernel::Gt
                | CycloKernel::Ge
                | CycloKernel::AllPairs
        )
    }
}

impl fmt::Display for CycloKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CycloKernel::Hash => write!(f, "radix hash (l = r)"),
            CycloKernel::Band { lo, hi } => {
                write!(f, "sort-merge band (l BETWEEN r + {lo} AND r + {hi})")
            }
            CycloKernel::Lt => write!(f, "sort-merge (l < r)"),
            CycloKernel::Le => write!(f, "sort-merge (l <= r)"),
            CycloKernel::Gt => write!(f, "sort-merge (l > r)"),
            CycloKernel::Ge => write!(f, "sort-merge (l >= r)"),
            CycloKernel::AllPairs => write!(f, "nested loops (all pairs, filter decides)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_hold_on_the_pairs_they_describe() {
        let cases = [
            (
                CycloKernel::Hash,
                Box::new(|l: i128, r: i128| l == r) as Box<dyn Fn(_, _) -> _>,
            ),
            (
                CycloKernel::Band { lo: -2, hi: 3 },
                Box::new(|l, r| l >= r - 2 && l <= r + 3),
            ),
            (
                CycloKernel::Band { lo: 1, hi: 1 },
                Box::new(|l, r| l == r + 1),
            ),
            (CycloKernel::Lt, Box::new(|l, r| l < r)),
            (CycloKernel::Le, Box::new(|l, r| l <= r)),
            (CycloKernel::Gt, Box::new(|l, r| l > r)),
            (CycloKernel::Ge, Box::new(|l, r| l >= r)),
            (CycloKernel::AllPairs, Box::new(|_, _| true)),
        ];
        for (k, want) in &cases {
            let a = k.algorithm();
            for l in -8i128..8 {
                for r in -8i128..8 {
                    assert_eq!(a.holds(l, r), want(l, r), "{k} {l} {r}");
                }
            }
        }
    }
}
