//! TPC-C's random data (clause 4.3.2): uniform numbers, NURand, random strings and
//! customer last names.
//!
//! The generator is SplitMix64, written here rather than taken from a library because
//! its sequence is part of the redo log's meaning: the loader is a deterministic
//! procedure logged by its arguments, and replaying it after an upgrade must draw the
//! same numbers, which no general-purpose random crate promises across versions.

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators").
#[derive(Debug, Clone)]
pub struct Random {
    state: u64,
}

/// NURand's run-time constants (clause 2.1.6): C for customer last names, customer
/// numbers and item numbers.
#[derive(Debug, Clone, Copy)]
pub struct NuRandC {
    pub last: u64,
    pub c_id: u64,
    pub ol_i_id: u64,
}

/// The constant the loader uses for last names; the run's differs from it by 65..=119
/// (not 96 or 112), as clause 2.1.6.1 asks.
pub const C_LAST_LOAD: u64 = 157;

impl NuRandC {
    pub const RUN: NuRandC = NuRandC {
        last: 223,
        c_id: 259,
        ol_i_id: 7911,
    };
}

const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

impl Random {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one part of the data, from the parts that name it.
    pub fn for_parts(parts: &[u64]) -> Self {
        let mut r = Self::new(0x6779_7265_5450_4343);
        for p in parts {
            r.state ^= *p;
            r.next_u64();
        }
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn uniform(&mut self, lo: i64, hi: i64) -> i64 {
        debug_assert!(lo <= hi);
        let span = (hi - lo) as u64 + 1;
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as i64
    }

    /// NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x.
    pub fn nurand(&mut self, a: i64, c: u64, x: i64, y: i64) -> i64 {
        let r = self.uniform(0, a) | self.uniform(x, y);
        ((r + c as i64) % (y - x + 1)) + x
    }

    /// A random a-string (letters and digits) of `lo..=hi` characters.
    pub fn astring(&mut self, lo: usize, hi: usize) -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let n = self.uniform(lo as i64, hi as i64) as usize;
        (0..n)
            .map(|_| CHARS[self.uniform(0, CHARS.len() as i64 - 1) as usize] as char)
            .collect()
    }

    /// A random n-string (digits) of `n` characters.
    pub fn nstring(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.uniform(0, 9) as u8))
            .collect()
    }

    /// A zip code: four random digits and "11111" (clause 4.3.2.7).
    pub fn zip(&mut self) -> String {
        self.nstring(4) + "11111"
    }

    /// `i_data` or `s_data`: 26 to 50 characters, a tenth of them with "ORIGINAL" at a
    /// random place (clause 4.3.3.1).
    pub fn data_with_original(&mut self) -> String {
        let mut s = self.astring(26, 50);
        if self.uniform(1, 10) == 1 {
            let at = self.uniform(0, s.len() as i64 - 8) as usize;
            s.replace_range(at..at + 8, "ORIGINAL");
        }
        s
    }
}

/// The last name for a number in 0..=999: its three digits as syllables.
pub fn last_name(n: i64) -> String {
    let n = n as usize;
    [n / 100, (n / 10) % 10, n % 10]
        .iter()
        .map(|d| SYLLABLES[*d])
        .collect()
}

/// NURand's A for a range of `n` values: the specification's for its own sizes, and
/// for scaled-down databases the power of two less one nearest a third of the range.
pub fn nurand_a(n: i64) -> i64 {
    match n {
        1000 => 255,
        3000 => 1023,
        100_000 => 8191,
        _ => ((n / 3).max(1) as u64).next_power_of_two() as i64 - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_names_follow_the_syllables() {
        assert_eq!(last_name(0), "BARBARBAR");
        assert_eq!(last_name(371), "PRICALLYOUGHT");
        assert_eq!(last_name(999), "EINGEINGEING");
    }

    #[test]
    fn draws_stay_in_range_and_reach_both_ends() {
        let mut r = Random::new(7);
        let (mut lo, mut hi) = (false, false);
        for _ in 0..10_000 {
            let v = r.uniform(5, 15);
            assert!((5..=15).contains(&v));
            lo |= v == 5;
            hi |= v == 15;
            let n = r.nurand(1023, NuRandC::RUN.c_id, 1, 3000);
            assert!((1..=3000).contains(&n));
        }
        assert!(lo && hi);
        let s = r.astring(26, 50);
        assert!((26..=50).contains(&s.len()));
        assert_eq!(r.zip().len(), 9);
    }

    /// The sequence is fixed: replaying a logged load must draw the same data.
    #[test]
    fn sequence_is_stable() {
        let mut r = Random::for_parts(&[1, 2]);
        let first: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        let mut again = Random::for_parts(&[1, 2]);
        assert_eq!(first, (0..3).map(|_| again.next_u64()).collect::<Vec<_>>());
        assert_eq!(Random::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn nurand_skews() {
        let mut r = Random::new(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..200_000 {
            counts[r.nurand(255, C_LAST_LOAD, 0, 999) as usize] += 1;
        }
        let max = *counts.iter().max().unwrap();
        let min = *counts.iter().min().unwrap();
        assert!(max > 4 * min.max(1), "NURand is not uniform: {min}..{max}");
    }
}
