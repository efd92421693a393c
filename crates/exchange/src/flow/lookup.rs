//! The router's questions for every probe row: which worker owns this row's hash
//! ([`Modulo`]), and, once heavy hitters are known, is the hash heavy and which
//! detection round found it (`gyre_join::flow::direct_map::DirectMap`, shared with
//! the library's Flow-Join)?

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes are already well mixed: a set of them needs no second hash.
#[derive(Default)]
pub(super) struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub(super) type HashSetU64 = HashSet<u64, BuildHasherDefault<PreHashed>>;

/// `x % n` for a fixed `n` with a multiplication instead of a 64-bit division (which
/// cost as much as the rest of routing a row): the quotient from the reciprocal
/// `floor((2^64 - 1) / n)` is exact or one too small, so one subtraction corrects it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Modulo {
    n: u64,
    reciprocal: u64,
}

impl Modulo {
    pub(super) fn new(n: u64) -> Self {
        assert!(n > 0, "modulo by zero");
        Modulo {
            n,
            reciprocal: u64::MAX / n,
        }
    }

    #[inline(always)]
    pub(super) fn of(self, x: u64) -> u64 {
        // q <= x / n, and x / n - q < 1 + x / 2^64 < 2, so 0 <= r < 2n.
        let q = ((u128::from(x) * u128::from(self.reciprocal)) >> 64) as u64;
        let r = x - q * self.n;
        if r >= self.n { r - self.n } else { r }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modulo_matches_the_remainder_operator() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for n in 1..=70u64 {
            let m = Modulo::new(n);
            for edge in [0, 1, n - 1, n, n + 1, u64::MAX, u64::MAX - 1, u64::MAX - n] {
                assert_eq!(m.of(edge), edge % n, "{edge} % {n}");
            }
            for _ in 0..10_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                assert_eq!(m.of(x), x % n, "{x} % {n}");
            }
        }
        let big = Modulo::new(u64::MAX);
        assert_eq!(big.of(u64::MAX), 0);
        assert_eq!(big.of(u64::MAX - 1), u64::MAX - 1);
    }
}
