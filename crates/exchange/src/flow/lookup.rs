//! The router's questions for every probe row: which worker owns this row's hash
//! ([`Modulo`]), and, once heavy hitters are known, is the hash heavy and which
//! detection round found it ([`HeavyLookup`])?
//!
//! A general hash map answers it in a few nanoseconds, which on a skewed input was the
//! largest share of a Flow-Join's routing cost (a per-row SIMD group probe). The heavy
//! list is short (the coordinator announces at most a few hundred hashes), so a
//! direct-mapped table of slots chosen by the hash's top bits, small enough for L1,
//! answers with one load and one compare; hashes whose slot is taken go to a map that
//! is only consulted for rows landing on such a slot.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
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

/// Slots of the direct-mapped table (16 bytes each: 16 KiB).
const SLOT_BITS: u32 = 10;

#[derive(Clone, Copy, Default)]
struct Slot {
    hash: u64,
    round: u32,
    used: bool,
    /// Another hash with this slot lives in the overflow map.
    overflowed: bool,
}

/// Heavy hash -> the detection round that found it.
pub(super) struct HeavyLookup {
    slots: Vec<Slot>,
    overflow: HashMap<u64, u32, BuildHasherDefault<PreHashed>>,
    len: usize,
}

impl Default for HeavyLookup {
    fn default() -> Self {
        HeavyLookup {
            slots: vec![Slot::default(); 1 << SLOT_BITS],
            overflow: HashMap::default(),
            len: 0,
        }
    }
}

impl HeavyLookup {
    #[inline(always)]
    fn slot(hash: u64) -> usize {
        (hash >> (64 - SLOT_BITS)) as usize
    }

    /// Adds `hash`, found heavy in `round`; a hash already present keeps its round.
    pub(super) fn insert(&mut self, hash: u64, round: u32) {
        let s = &mut self.slots[Self::slot(hash)];
        if !s.used {
            *s = Slot {
                hash,
                round,
                used: true,
                overflowed: s.overflowed,
            };
        } else if s.hash == hash {
            return;
        } else {
            s.overflowed = true;
            match self.overflow.entry(hash) {
                Entry::Occupied(_) => return,
                Entry::Vacant(v) => {
                    v.insert(round);
                }
            }
        }
        self.len += 1;
    }

    /// The round that found `hash` heavy, if it is.
    #[inline(always)]
    pub(super) fn get(&self, hash: u64) -> Option<u32> {
        let s = &self.slots[Self::slot(hash)];
        if s.used && s.hash == hash {
            Some(s.round)
        } else if s.overflowed {
            self.overflow.get(&hash).copied()
        } else {
            None
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

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

    /// Hashes sharing a slot (same top bits), absent hashes on taken and free slots,
    /// and repeated inserts, against a plain map.
    #[test]
    fn answers_like_a_map() {
        let mut lookup = HeavyLookup::default();
        let mut reference = HashMap::new();
        let top = |t: u64, low: u64| (t << (64 - SLOT_BITS)) | low;
        let hashes = [
            top(5, 1),
            top(5, 2),
            top(5, 3),
            top(0, 0),
            top(1023, u64::MAX >> SLOT_BITS),
            top(7, 9),
            top(5, 2),
        ];
        for (round, &h) in hashes.iter().enumerate() {
            lookup.insert(h, round as u32);
            reference.entry(h).or_insert(round as u32);
        }
        assert_eq!(lookup.len(), reference.len());
        assert!(!lookup.is_empty());
        for probe in
            hashes
                .iter()
                .copied()
                .chain([top(5, 4), top(6, 1), top(7, 8), top(0, 1), u64::MAX])
        {
            assert_eq!(
                lookup.get(probe),
                reference.get(&probe).copied(),
                "{probe:x}"
            );
        }
        assert!(HeavyLookup::default().is_empty());
        assert_eq!(HeavyLookup::default().get(0), None);
    }
}
