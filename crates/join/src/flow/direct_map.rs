//! [`DirectMap`]: the per-row question of a Flow-Join router, "is this hash one of the
//! few heavy hitters, and where do its rows go?".
//!
//! A general hash map answers it in a few nanoseconds (a SIMD group probe behind a
//! hash), which on a skewed input was a large share of routing. The heavy list is short (at most a few hundred keys), so a direct-mapped
//! table of slots chosen by the key's multiplicative hash, small enough for L1,
//! answers with one multiply, one load and one compare; keys whose slot is taken go to
//! an ordinary map that is consulted only for keys landing on such a slot.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for 64-bit keys: the splitmix64 finaliser.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Slots of the direct-mapped table.
const SLOT_BITS: u32 = 10;

#[derive(Debug, Clone, Copy, Default)]
struct Slot<V> {
    key: u64,
    value: V,
    used: bool,
    /// Another key with this slot lives in the overflow map.
    overflowed: bool,
}

/// A map from 64-bit keys to small `Copy` values, for few keys read very often.
#[derive(Debug, Clone)]
pub struct DirectMap<V: Copy + Default> {
    slots: Vec<Slot<V>>,
    overflow: KeyMap<V>,
    len: usize,
}

impl<V: Copy + Default> Default for DirectMap<V> {
    fn default() -> Self {
        DirectMap {
            slots: vec![Slot::default(); 1 << SLOT_BITS],
            overflow: KeyMap::default(),
            len: 0,
        }
    }
}

impl<V: Copy + Default> DirectMap<V> {
    /// Fibonacci hashing: the top bits of `key * 2^64 / phi` spread any key set,
    /// dense small integers as well as hashes.
    #[inline(always)]
    fn slot(key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOT_BITS)) as usize
    }

    /// Sets the value of `key` (replacing an earlier one).
    pub fn insert(&mut self, key: u64, value: V) {
        let s = &mut self.slots[Self::slot(key)];
        if !s.used {
            *s = Slot {
                key,
                value,
                used: true,
                overflowed: s.overflowed,
            };
        } else if s.key == key {
            s.value = value;
            return;
        } else {
            s.overflowed = true;
            if self.overflow.insert(key, value).is_some() {
                return;
            }
        }
        self.len += 1;
    }

    /// The value of `key`, if it is in the map.
    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<V> {
        let s = &self.slots[Self::slot(key)];
        if s.used && s.key == key {
            Some(s.value)
        } else if s.overflowed {
            self.overflow.get(&key).copied()
        } else {
            None
        }
    }

    /// Every key and its value, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.used)
            .map(|s| (s.key, s.value))
            .chain(self.overflow.iter().map(|(&k, &v)| (k, v)))
    }

    pub fn contains_key(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Keys sharing a slot, absent keys on taken and free slots, replaced values and
    /// dense small keys, against a plain map.
    #[test]
    fn answers_like_a_map() {
        let mut map = DirectMap::<u32>::default();
        let mut reference = HashMap::new();
        // Keys with the same slot: find some by brute force.
        let target = DirectMap::<u32>::slot(12345);
        let same: Vec<u64> = (0..u64::MAX)
            .filter(|&k| DirectMap::<u32>::slot(k) == target)
            .take(4)
            .collect();
        let keys: Vec<u64> = same
            .iter()
            .copied()
            .chain(0..300)
            .chain([u64::MAX, 1 << 63, same[1]])
            .collect();
        for (i, &k) in keys.iter().enumerate() {
            map.insert(k, i as u32);
            reference.insert(k, i as u32);
        }
        assert_eq!(map.len(), reference.len());
        assert!(!map.is_empty());
        for probe in keys.iter().copied().chain([300, 301, same[0] + 1, 1 << 62]) {
            assert_eq!(map.get(probe), reference.get(&probe).copied(), "{probe}");
            assert_eq!(map.contains_key(probe), reference.contains_key(&probe));
        }
        let mut all: Vec<(u64, u32)> = map.iter().collect();
        let mut expected: Vec<(u64, u32)> = reference.iter().map(|(&k, &v)| (k, v)).collect();
        all.sort_unstable();
        expected.sort_unstable();
        assert_eq!(all, expected);
        // The value inserted last wins, in a slot and in the overflow.
        assert_eq!(map.get(same[1]), Some(keys.len() as u32 - 1));
        assert!(DirectMap::<u8>::default().is_empty());
        assert_eq!(DirectMap::<u8>::default().get(0), None);
    }
}
